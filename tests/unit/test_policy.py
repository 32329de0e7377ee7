"""railhop.policy: the file format, validation messages (file/line/field/value) and the model."""

from __future__ import annotations

import textwrap
from pathlib import Path

import jsonschema
import pytest

from railhop.health import HealthParams
from railhop.policy import (
    Policy,
    PolicyError,
    PolicyIssue,
    PolicyValidationError,
    RailMode,
    RailRule,
    RuleKind,
    check_file,
    check_text,
    default_policy,
    load_policy,
    parse_policy,
    schema,
)
from railhop.topology import DistanceClass

POLICIES = Path(__file__).resolve().parents[2] / "policies"
SHIPPED = sorted(POLICIES.glob("*.yaml"))


def issues(text: str) -> list[PolicyIssue]:
    return check_text(textwrap.dedent(text).lstrip("\n"), "p.yaml")


def one(text: str) -> PolicyIssue:
    found = issues(text)
    assert len(found) == 1, found
    return found[0]


# --- shipped files ----------------------------------------------------------------------------


def test_shipped_policies_exist_and_validate() -> None:
    names = {p.stem for p in SHIPPED}
    assert {"rail-optimized-8nic", "multi-plane", "permissive"} <= names
    for p in SHIPPED:
        assert check_file(p) == [], p
        text = p.read_text()
        assert text.startswith("#"), f"{p} starts with a comment explaining it"
        assert "version: 1" in text


def test_schema_is_valid_draft_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(schema())


def test_rail_optimized_policy_model() -> None:
    p = load_policy(POLICIES / "rail-optimized-8nic.yaml")
    assert p.name == "rail-optimized-8nic"
    assert p.source == str(POLICIES / "rail-optimized-8nic.yaml")
    assert p.rails.mode is RailMode.AUTO and p.rails.exclude == ("mlx5_8", "mlx5_9")
    assert p.rule.kind is RuleKind.ALLOWED_PAIRS
    assert p.rule.allows((0, 0), (3, 0)) and not p.rule.allows((0, 0), (4, 0))
    assert p.distance_limit is DistanceClass.NODE
    assert p.timeouts.completion_s == 1.0 and p.timeouts.probe_s == 0.3
    assert p.spreading.min_weight == 0.05
    assert p.health.counters["symbol_error"] == 10.0
    assert p.health.counter_window_s == 10.0
    assert p.health.params.holdoff_max_s == 60.0
    assert p.health.params.down_on == frozenset({"lane_timeout"})


def test_permissive_file_equals_builtin_default() -> None:
    p = load_policy(POLICIES / "permissive.yaml")
    d = default_policy()
    for field in ("rails", "rule", "distance_limit", "timeouts", "spreading", "health"):
        assert getattr(p, field) == getattr(d, field), field


def test_minimal_policy_gets_defaults() -> None:
    p = parse_policy("version: 1\n")
    assert p.rule.kind is RuleKind.ANY and p.distance_limit is DistanceClass.NODE
    assert p.health.params == HealthParams()
    assert p.name == "<string>"


def test_rail_rule_allows() -> None:
    same = RailRule(RuleKind.SAME_RAIL)
    assert same.allows((1, 0), (1, 0))
    assert not same.allows((1, 0), (2, 0)) and not same.allows((1, 0), (1, 1))
    pairs = RailRule(RuleKind.ALLOWED_PAIRS, frozenset({frozenset({1, 2})}))
    assert pairs.allows((1, 0), (2, 0)) and pairs.allows((2, 0), (1, 0))
    assert not pairs.allows((1, 0), (3, 0)) and not pairs.allows((1, 0), (2, 1))
    assert RailRule(RuleKind.ANY).allows((1, 0), (7, 3))


def test_groups_expand_to_pairs() -> None:
    p = parse_policy(
        "version: 1\nrail_rule: {kind: allowed-pairs, groups: [[0, 1, 2]], pairs: [[5, 6]]}\n"
    )
    assert p.rule.pairs == {frozenset(x) for x in ({0, 1}, {0, 2}, {1, 2}, {5, 6})}


# --- errors: file, line, field, value ------------------------------------------------------


def test_unknown_key_with_suggestion() -> None:
    i = one(
        """
        version: 1
        timeouts:
          completion_ms: 1000
          prob_ms: 20
        """
    )
    assert (i.file, i.line, i.column, i.field) == ("p.yaml", 4, 3, "timeouts.prob_ms")
    assert i.value == "'prob_ms'"
    assert "unknown key" in i.message and "did you mean 'probe_ms'" in i.message
    assert str(i).startswith("p.yaml:4:3: timeouts.prob_ms: unknown key")


def test_unknown_top_level_key() -> None:
    i = one("version: 1\nrails_rule: {kind: any}\n")
    assert (i.line, i.field) == (2, "rails_rule") and "did you mean 'rail_rule'" in i.message


def test_wrong_type_and_range() -> None:
    found = issues(
        """
        version: 1
        timeouts:
          completion_ms: "1s"
          probe_ms: 0
        """
    )
    assert [(i.line, i.field, i.value) for i in found] == [
        (3, "timeouts.completion_ms", "'1s'"),
        (4, "timeouts.probe_ms", "0"),
    ]
    assert found[0].message == "must be of type integer"
    assert found[1].message == "must be >= 1"


def test_enum_error_lists_choices() -> None:
    i = one("version: 1\ndistance_limit: NUMA\n")
    assert (i.line, i.field, i.value) == (2, "distance_limit", "'NUMA'")
    assert "PIX, PXB, PHB, NODE, SYS" in i.message


def test_version() -> None:
    i = one("version: 2\n")
    assert (i.line, i.field, i.value) == (1, "version", "2") and "version 1" in i.message
    i = one("name: x\n")
    assert (i.line, i.field) == (1, "") and "missing required key 'version'" in i.message


def test_nested_list_positions() -> None:
    i = one(
        """
        version: 1
        rails:
          assign:
            - {nic: mlx5_0, rail: 0}
            - {nic: mlx5_1, rail: -1}
        """
    )
    assert (i.line, i.field, i.value) == (5, "rails.assign[1].rail", "-1")


def test_missing_required_in_nested_object() -> None:
    i = one("version: 1\nrail_rule:\n  pairs: [[0, 1]]\n")
    assert i.field == "rail_rule" and i.line == 3 and "missing required key 'kind'" in i.message


def test_counter_names_and_rates() -> None:
    found = issues(
        """
        version: 1
        health:
          counters:
            symbol_error: -1
            "bad name": 3
        """
    )
    fields = {(i.line, i.field) for i in found}
    assert (4, "health.counters.symbol_error") in fields
    assert (5, "health.counters.bad name") in fields


def test_duplicate_keys_are_errors() -> None:
    i = one("version: 1\ndistance_limit: PIX\ndistance_limit: SYS\n")
    assert (i.line, i.field) == (3, "distance_limit") and "duplicate key" in i.message


def test_yaml_syntax_error_has_line() -> None:
    i = one("version: 1\nrails:\n  mode: [auto\n")
    assert i.line is not None and i.line >= 3 and "YAML syntax error" in i.message


def test_not_a_mapping() -> None:
    i = one("- version: 1\n")
    assert i.field == "" and "object" in i.message


def test_semantic_rules() -> None:
    found = issues(
        """
        version: 1
        rails:
          mode: explicit
          assign:
            - {nic: mlx5_0, pci: "0000:19:00.0", rail: 0}
            - {rail: 1}
            - {nic: mlx5_2, rail: 2}
            - {nic: mlx5_2, rail: 3}
        rail_rule:
          kind: same-rail
          pairs: [[1, 1]]
        flap_damping:
          holdoff_initial_ms: 5000
          holdoff_max_ms: 100
        timeouts:
          probe_ms: 2000
          failback_interval_ms: 1000
        """
    )
    got = [(i.line, i.field) for i in found]
    assert got == [
        (5, "rails.assign[0]"),
        (6, "rails.assign[1]"),
        (8, "rails.assign[3].nic"),
        (11, "rail_rule.pairs"),
        (11, "rail_rule.pairs[0]"),
        (14, "flap_damping.holdoff_max_ms"),
        (16, "timeouts.probe_ms"),
    ]
    msgs = " | ".join(i.message for i in found)
    assert "exactly one of 'nic' or 'pci'" in msgs
    assert "already assigned in entry 2" in msgs
    assert "only meaningful with kind allowed-pairs" in msgs
    assert "two different rails" in msgs
    assert "below holdoff_initial_ms" in msgs
    assert "probes would overlap" in msgs


def test_allowed_pairs_needs_pairs_and_explicit_needs_assign() -> None:
    found = issues("version: 1\nrails: {mode: explicit}\nrail_rule: {kind: allowed-pairs}\n")
    assert [i.field for i in found] == ["rails.mode", "rail_rule.kind"]


def test_every_error_reported_in_one_pass() -> None:
    found = issues(
        """
        version: 1
        colour: blue
        distance_limit: FAR
        timeouts: {completion_ms: 1, probe_ms: x}
        spreading: {max_nics: -3}
        health: {suspect_strikes: 0, down_on: [carrier_down]}
        flap_damping: {multiplier: 0.5}
        """
    )
    assert [i.line for i in found] == [2, 3, 4, 4, 5, 6, 6, 7]
    assert len({i.field for i in found}) == 8


def test_parse_raises_with_all_issues(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("version: 1\ncolour: blue\ndistance_limit: FAR\n")
    with pytest.raises(PolicyValidationError) as ei:
        load_policy(f)
    assert len(ei.value.issues) == 2
    assert f"{f}:2:1: colour" in str(ei.value) and f"{f}:3:" in str(ei.value)
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "missing.yaml")
    assert isinstance(Policy.from_data({"version": 1}), Policy)
