"""docs/parameters.md stays true to the code: every plugin parameter with its default, and
every ``railhop`` command with its options; plugin/README.md's table of defaults too."""

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


def _readme_defaults(text: str) -> dict[str, str]:
    """NAME -> default, from plugin/README.md's parameter table (`NAME` | `default`, strings
    quoted, two parameters per row)."""
    section = text.split("## Parameters (`RAILHOP_*`, defaults)", 1)[1].split("\n## ", 1)[0]
    return {
        name: cell.strip('"')
        for name, cell in re.findall(r"\|\s*`([A-Z][A-Z0-9_]*)`\s*\|\s*`([^`]*)`", section)
    }


def test_plugin_readme_gives_every_default_of_param_h() -> None:
    code = _x_table()
    readme = _readme_defaults((REPO / "plugin" / "README.md").read_text(encoding="utf-8"))
    missing, extra = sorted(set(code) - set(readme)), sorted(set(readme) - set(code))
    assert not missing and not extra, f"plugin/README.md lacks {missing}, has unknown {extra}"
    wrong = {n: (readme[n], d) for n, d in code.items() if readme[n] != d}
    assert not wrong, f"plugin/README.md: defaults (README, param.h) that differ: {wrong}"


def test_readme_reader_sees_a_wrong_default() -> None:
    # the README once gave CHUNK_SIZE 524288 where param.h says 131072
    old = '## Parameters (`RAILHOP_*`, defaults)\n| `CHUNK_SIZE` | `524288` | | `TCP_CC` | `""` |\n'
    assert _readme_defaults(old) == {"CHUNK_SIZE": "524288", "TCP_CC": ""}
    assert _x_table()["CHUNK_SIZE"] == "131072"


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
