"""Loading and validating policy files; every problem is reported with file, line, field, value.

Validation has three layers, all of which always run so that one pass reports every error:
YAML syntax (and duplicate keys, which PyYAML would silently merge), the JSON Schema in
``policies/schema.json`` (unknown keys are errors), and cross-field rules the schema cannot
express. Line numbers come from PyYAML's composed node tree.
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from railhop import paths
from railhop.policy.model import Policy

__all__ = [
    "PolicyError",
    "PolicyIssue",
    "PolicyValidationError",
    "check_file",
    "check_text",
    "load_policy",
    "parse_policy",
    "schema",
]

PathElem = str | int


class PolicyError(Exception):
    """Base class of every error raised by :mod:`railhop.policy`."""


class PolicyValidationError(PolicyError):
    """A policy file has errors; ``issues`` lists all of them."""

    def __init__(self, issues: Sequence[PolicyIssue]) -> None:
        self.issues = tuple(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


@dataclass(frozen=True)
class PolicyIssue:
    file: str
    line: int | None  # 1-based
    column: int | None  # 1-based
    field: str  # dotted path, e.g. "rails.assign[2].rail"; "" for the whole document
    value: str | None  # the offending value (repr, shortened), when there is one
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        got = f" (got {self.value})" if self.value is not None else ""
        return f"{where}: {self.field or '<document>'}: {self.message}{got}"


@functools.cache
def schema() -> dict[str, Any]:
    """The policy JSON Schema (``policies/schema.json``)."""
    path = paths.policies_dir() / "schema.json"
    try:
        loaded: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PolicyError(f"cannot load the policy schema {path}: {e}") from e
    return loaded


def _field(path: Sequence[PathElem]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Doc:
    """The parsed document plus its node tree, to find where a path is written."""

    def __init__(self, source: str, data: Any, node: yaml.Node | None) -> None:
        self.source = source
        self.data = data
        self.node = node

    def locate(self, path: Sequence[PathElem], key: bool = False) -> tuple[int | None, int | None]:
        """Line/column of the value at ``path`` (of its key when ``key``), else of its parent."""
        node = self.node
        if node is None:
            return (1, 1)
        for i, p in enumerate(path):
            last = i == len(path) - 1
            nxt: yaml.Node | None = None
            if isinstance(node, yaml.MappingNode):
                for k, v in node.value:
                    if isinstance(k, yaml.ScalarNode) and k.value == str(p):
                        nxt = k if (last and key) else v
            elif (
                isinstance(node, yaml.SequenceNode)
                and isinstance(p, int)
                and 0 <= p < len(node.value)
            ):
                nxt = node.value[p]
            if nxt is None:
                break
            node = nxt
        return (node.start_mark.line + 1, node.start_mark.column + 1)

    def value(self, path: Sequence[PathElem]) -> Any:
        cur = self.data
        for p in path:
            in_map = isinstance(cur, Mapping) and p in cur
            in_list = isinstance(cur, list) and isinstance(p, int) and 0 <= p < len(cur)
            if in_map or in_list:
                cur = cur[p]
            else:
                return None
        return cur

    def issue(
        self, path: Sequence[PathElem], message: str, *, value: Any = ..., key: bool = False
    ) -> PolicyIssue:
        line, col = self.locate(path, key=key)
        shown = None if value is ... else _short(value)
        return PolicyIssue(self.source, line, col, _field(path), shown, message)


def _parse(text: str, source: str) -> tuple[_Doc | None, list[PolicyIssue]]:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        issues = list(_duplicates(node, [], source)) if node is not None else []
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        col = mark.column + 1 if mark else None
        msg = f"YAML syntax error: {e.problem or e.context or e}"
        return None, [PolicyIssue(source, line, col, "", None, msg)]
    except yaml.YAMLError as e:
        return None, [PolicyIssue(source, None, None, "", None, f"YAML error: {e}")]
    finally:
        loader.dispose()
    return _Doc(source, data, node), issues


def _duplicates(node: yaml.Node, path: list[PathElem], source: str) -> Iterator[PolicyIssue]:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                if k.value in seen:
                    yield PolicyIssue(
                        source,
                        k.start_mark.line + 1,
                        k.start_mark.column + 1,
                        _field([*path, k.value]),
                        _short(k.value),
                        "duplicate key (an earlier one with this name is silently overridden)",
                    )
                seen.add(k.value)
                yield from _duplicates(v, [*path, k.value], source)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            yield from _duplicates(v, [*path, i], source)


def _items(n: int) -> str:
    return f"{n} item{'s' if n != 1 else ''}"


_PLAIN: dict[str, Callable[[Any], str]] = {
    "minimum": lambda v: f"must be >= {v}",
    "maximum": lambda v: f"must be <= {v}",
    "exclusiveMinimum": lambda v: f"must be > {v}",
    "exclusiveMaximum": lambda v: f"must be < {v}",
    "minItems": lambda v: f"must have at least {_items(v)}",
    "maxItems": lambda v: f"must have at most {_items(v)}",
    "minLength": lambda v: "must not be empty" if v == 1 else f"must be at least {v} characters",
    "maxLength": lambda v: f"must be at most {v} characters",
    "pattern": lambda v: f"must match {v}",
    "uniqueItems": lambda v: "must not repeat items",
}


def _schema_issues(doc: _Doc) -> Iterator[PolicyIssue]:
    validator = jsonschema.Draft202012Validator(schema())
    for err in validator.iter_errors(doc.data):
        path: list[PathElem] = list(err.absolute_path)
        sch = err.schema if isinstance(err.schema, Mapping) else {}
        inst = err.instance
        if err.validator == "additionalProperties" and isinstance(inst, Mapping):
            known = list(sch.get("properties", {}))
            for k in inst:
                if k in known:
                    continue
                hint = difflib.get_close_matches(str(k), known, n=1)
                msg = "unknown key" + (f"; did you mean {hint[0]!r}?" if hint else "")
                if known:
                    msg += f" (allowed: {', '.join(known)})"
                yield doc.issue([*path, k], msg, value=k, key=True)
        elif err.validator == "required" and isinstance(inst, Mapping):
            for k in err.validator_value:
                if k not in inst:
                    yield doc.issue(path, f"missing required key {k!r}")
        elif "propertyNames" in err.relative_schema_path:
            # jsonschema reports the key itself as the instance, at the mapping's path
            msg = f"key must match {sch.get('pattern', '?')}"
            yield doc.issue([*path, str(inst)], msg, value=inst, key=True)
        elif err.validator == "const" and path == ["version"]:
            yield doc.issue(path, "unsupported version (this railhop reads version 1)", value=inst)
        elif err.validator == "enum":
            allowed = ", ".join(str(x) for x in err.validator_value)
            yield doc.issue(path, f"must be one of: {allowed}", value=inst)
        elif err.validator == "type":
            yield doc.issue(path, f"must be of type {err.validator_value}", value=inst)
        elif err.validator in _PLAIN:
            yield doc.issue(path, _PLAIN[err.validator](err.validator_value), value=inst)
        else:
            yield doc.issue(path, err.message, value=inst)


def _get(m: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(m, Mapping) or k not in m:
            return None
        m = m[k]
    return m


def _semantic_issues(doc: _Doc) -> Iterator[PolicyIssue]:
    data = doc.data
    if not isinstance(data, Mapping):
        return
    assign = _get(data, "rails", "assign")
    if isinstance(assign, list):
        seen: dict[str, int] = {}
        for i, a in enumerate(assign):
            if not isinstance(a, Mapping):
                continue
            where: list[PathElem] = ["rails", "assign", i]
            if ("nic" in a) == ("pci" in a):
                yield doc.issue(where, "give exactly one of 'nic' or 'pci'")
                continue
            key = str(a.get("nic") or a.get("pci", "")).lower()
            if key in seen:
                field = "nic" if "nic" in a else "pci"
                yield doc.issue(
                    [*where, field], f"NIC already assigned in entry {seen[key]}", value=key
                )
            seen.setdefault(key, i)
    if _get(data, "rails", "mode") == "explicit" and not assign:
        yield doc.issue(["rails", "mode"], "explicit mode needs at least one rails.assign entry")
    rule = _get(data, "rail_rule")
    if isinstance(rule, Mapping):
        kind = rule.get("kind")
        has = [k for k in ("pairs", "groups") if rule.get(k)]
        if kind == "allowed-pairs" and not has:
            yield doc.issue(["rail_rule", "kind"], "allowed-pairs needs 'pairs' or 'groups'")
        if kind in ("same-rail", "any"):
            for k in has:
                yield doc.issue(
                    ["rail_rule", k], f"only meaningful with kind allowed-pairs (kind is {kind})"
                )
        pairs = rule.get("pairs")
        if isinstance(pairs, list):
            for i, p in enumerate(pairs):
                if isinstance(p, list) and len(p) == 2 and p[0] == p[1]:
                    yield doc.issue(
                        ["rail_rule", "pairs", i], "a pair joins two different rails", value=p
                    )
    flap = _get(data, "flap_damping")
    if isinstance(flap, Mapping):
        lo, hi = flap.get("holdoff_initial_ms", 1000), flap.get("holdoff_max_ms", 60000)
        if isinstance(lo, int) and isinstance(hi, int) and hi < lo:
            yield doc.issue(
                [
                    "flap_damping",
                    "holdoff_max_ms" if "holdoff_max_ms" in flap else "holdoff_initial_ms",
                ],
                f"holdoff_max_ms ({hi}) is below holdoff_initial_ms ({lo})",
                value=hi if "holdoff_max_ms" in flap else lo,
            )
    to = _get(data, "timeouts")
    if isinstance(to, Mapping):
        probe, fb = to.get("probe_ms", 250), to.get("failback_interval_ms", 1000)
        if isinstance(probe, int) and isinstance(fb, int) and probe > fb:
            yield doc.issue(
                ["timeouts", "probe_ms" if "probe_ms" in to else "failback_interval_ms"],
                f"probe_ms ({probe}) exceeds failback_interval_ms ({fb}): probes would overlap",
                value=probe if "probe_ms" in to else fb,
            )


def _check(text: str, source: str) -> tuple[_Doc | None, list[PolicyIssue]]:
    doc, issues = _parse(text, source)
    if doc is not None:
        issues += list(_schema_issues(doc))
        issues += list(_semantic_issues(doc))
    uniq = list(dict.fromkeys(issues))
    uniq.sort(key=lambda i: (i.line or 0, i.column or 0, i.field))
    return doc, uniq


def check_text(text: str, source: str = "<string>") -> list[PolicyIssue]:
    """Every problem in the policy ``text`` (empty when it is valid)."""
    return _check(text, source)[1]


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyError(f"{path}: cannot read: {e}") from e


def check_file(path: str | Path) -> list[PolicyIssue]:
    """Every problem in the policy file ``path``; raises :class:`PolicyError` if unreadable."""
    return check_text(_read(path), str(path))


def parse_policy(text: str, source: str = "<string>") -> Policy:
    """A :class:`Policy` from YAML text; raises :class:`PolicyValidationError` with all issues."""
    doc, issues = _check(text, source)
    if issues or doc is None:
        raise PolicyValidationError(issues)
    return Policy.from_data(doc.data, source=source)


def load_policy(path: str | Path) -> Policy:
    """Load and validate a policy file (see :func:`parse_policy`)."""
    return parse_policy(_read(path), str(path))
