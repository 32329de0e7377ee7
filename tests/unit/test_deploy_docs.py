"""docs/parameters.md stays true to the code: every plugin parameter with its default, and
every ``railhop`` command with its options."""

from __future__ import annotations

import re
from pathlib import Path

import click

from railhop.cli import cli

REPO = Path(__file__).resolve().parents[2]
PARAMS_DOC = REPO / "docs" / "parameters.md"


def _x_table() -> dict[str, str]:
    """NAME -> default, from the X-macro table in plugin/src/param.h."""
    header = (REPO / "plugin" / "src" / "param.h").read_text(encoding="utf-8")
    rows = re.findall(r"^\s*X\((\w+),\s*(\w+),\s*(\"[^\"]*\"|[-\w]+),", header, re.M)
    assert rows, "param.h: X-macro table not found"
    return {name: default.strip('"') for name, _type, default in rows}


def _doc_rows() -> dict[str, str]:
    """RAILHOP_NAME -> default cell, from the plugin parameter table of parameters.md."""
    out = {}
    for line in PARAMS_DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)]  # "\|" inside a cell
        if len(cells) > 4 and (m := re.fullmatch(r"`RAILHOP_(\w+)`", cells[1])):
            out[m.group(1)] = cells[3]
    return out


def test_every_plugin_parameter_documented_with_its_default() -> None:
    code, doc = _x_table(), _doc_rows()
    missing, extra = sorted(set(code) - set(doc)), sorted(set(doc) - set(code))
    assert not missing and not extra, f"undocumented: {missing}, not in param.h: {extra}"
    for name, default in code.items():
        cell = doc[name]
        if default == "":
            assert cell == "*(empty)*", f"RAILHOP_{name}: default is empty, doc says {cell}"
        else:
            assert cell == f"`{default}`", f"RAILHOP_{name}: default {default}, doc says {cell}"


def _commands(group: click.Group, prefix: str) -> dict[str, click.Command]:
    out: dict[str, click.Command] = {}
    for name, cmd in group.commands.items():
        full = f"{prefix} {name}"
        if isinstance(cmd, click.Group):
            out |= _commands(cmd, full)
        else:
            out[full] = cmd
    return out


def test_every_cli_command_and_option_documented() -> None:
    text = PARAMS_DOC.read_text(encoding="utf-8")
    for full, cmd in _commands(cli, "railhop").items():
        row = next((ln for ln in text.splitlines() if ln.startswith(f"| `{full}`")), None)
        assert row is not None, f"parameters.md has no row for `{full}`"
        for p in cmd.params:
            if isinstance(p, click.Option) and p.name != "help":
                longest = max(p.opts, key=len)
                assert f"`{longest}" in row, f"`{full}`: option {longest} not documented"
