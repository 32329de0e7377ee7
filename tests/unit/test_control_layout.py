"""The Python mirror of railhop/ctl_table.h equals the C header: every offset, size, constant and
enum value, checked by compiling a C program against the header."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import require
from railhop.control import lane_events, layout

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "plugin" / "include" / "railhop" / "ctl_table.h"

STRUCTS: dict[str, layout.Fields] = {
    "rh_ctl_header": layout.HEADER_FIELDS,
    "rh_ctl_body": layout.BODY_FIELDS,
    "rh_ctl_nic": layout.NIC_FIELDS,
    "rh_ctl_backup": layout.BACKUP_FIELDS,
    "rh_ctl_plan": layout.PLAN_FIELDS,
    "rh_lane_event": lane_events.EVENT_FIELDS,
}
INT_CONSTANTS: dict[str, int] = {
    "RH_CTL_MAGIC": layout.MAGIC,
    "RH_CTL_LAYOUT_VERSION": layout.LAYOUT_VERSION,
    "RH_CTL_MAX_NICS": layout.MAX_NICS,
    "RH_CTL_MAX_BACKUPS": layout.MAX_BACKUPS,
    "RH_CTL_IFNAME_LEN": layout.IFNAME_LEN,
    "RH_CTL_PCI_LEN": layout.PCI_LEN,
    "RH_CTL_NO_RAIL": layout.NO_RAIL,
    "RH_CTL_NO_NUMA": layout.NO_NUMA,
    "RH_CTL_NO_DISTANCE": layout.NO_DISTANCE,
    "RH_CTL_F_AGENT_GONE": layout.F_AGENT_GONE,
    "RH_CTL_BODY_OFFSET": layout.BODY_OFFSET,
    "RH_CTL_NICS_OFFSET": layout.NICS_OFFSET,
    "RH_CTL_PLANS_OFFSET": layout.PLANS_OFFSET,
    "RH_CTL_TABLE_SIZE": layout.TABLE_SIZE,
    "RH_EV_MAGIC": lane_events.EV_MAGIC,
    "RH_EV_VERSION": lane_events.EV_VERSION,
    "RH_EV_MAX_PORTS": lane_events.MAX_PORTS,
    "RH_EV_MAX_MSG": lane_events.MAX_MSG,
}
STR_CONSTANTS = {
    "RH_CTL_TABLE_FILE": layout.TABLE_FILE,
    "RH_CTL_SOCKET_FILE": layout.SOCKET_FILE,
    "RH_CTL_RUN_DIR_ENV": layout.RUN_DIR_ENV,
    "RH_CTL_RUN_DIR_DEFAULT": layout.RUN_DIR_DEFAULT,
}
ENUMS = {  # C enum name: (C constant prefix, Python enum)
    "rh_nic_state": ("RH_NIC_", layout.NicState),
    "rh_nic_reason": ("RH_REASON_", layout.Reason),
    "rh_distance": ("RH_DIST_", layout.Distance),
    "rh_lane_event_type": ("RH_EV_", lane_events.EventType),
}


def _c_program() -> str:
    lines = [
        "#include <stdio.h>",
        "#include <stddef.h>",
        '#include "railhop/ctl_table.h"',
        "int main(void)",
        "{",
    ]
    for sname, fields in STRUCTS.items():
        lines.append(f'\tprintf("size {sname} %zu\\n", sizeof(struct {sname}));')
        for fname, _ in fields:
            lines.append(
                f'\tprintf("field {sname}.{fname} %zu %zu\\n", offsetof(struct {sname}, {fname}),'
                f" sizeof(((struct {sname} *)0)->{fname}));"
            )
    for cname in INT_CONSTANTS:
        lines.append(f'\tprintf("int {cname} %lld\\n", (long long)({cname}));')
    for cname in STR_CONSTANTS:
        lines.append(f'\tprintf("str {cname} %s\\n", {cname});')
    for _, (prefix, enum) in ENUMS.items():
        for member in enum:
            c = prefix + member.name
            lines.append(f'\tprintf("int {c} %lld\\n", (long long)({c}));')
    lines += ["\treturn 0;", "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def c_values(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    cc = shutil.which("cc") or shutil.which("gcc")
    require(cc is not None, "no C compiler (make setup installs gcc)")
    d = tmp_path_factory.mktemp("layout")
    (d / "layout.c").write_text(_c_program())
    subprocess.run(
        [
            cc,
            "-std=gnu11",
            "-Wall",
            "-Werror",
            f"-I{REPO / 'plugin' / 'include'}",
            "-o",
            str(d / "layout"),
            str(d / "layout.c"),
        ],
        check=True,
        timeout=120,
    )
    out = subprocess.run([str(d / "layout")], check=True, capture_output=True, text=True).stdout
    values: dict[str, str] = {}
    for line in out.splitlines():
        kind, key, rest = line.split(" ", 2)
        values[f"{kind} {key}"] = rest
    return values


@pytest.mark.parametrize("sname", list(STRUCTS))
def test_struct_offsets_and_sizes_match_c(c_values: dict[str, str], sname: str) -> None:
    import struct

    fields = STRUCTS[sname]
    offsets = layout.offsets_of(fields)
    assert int(c_values[f"size {sname}"]) == layout.struct_of(fields).size
    for fname, code in fields:
        off, size = (int(x) for x in c_values[f"field {sname}.{fname}"].split())
        assert (off, size) == (offsets[fname], struct.calcsize("<" + code)), f"{sname}.{fname}"


def test_constants_match_c(c_values: dict[str, str]) -> None:
    for cname, value in INT_CONSTANTS.items():
        assert int(c_values[f"int {cname}"]) == value, cname
    for cname, s in STR_CONSTANTS.items():
        assert c_values[f"str {cname}"] == s, cname


def test_enums_match_c(c_values: dict[str, str]) -> None:
    text = HEADER.read_text()
    for ename, (prefix, enum) in ENUMS.items():
        body = re.search(rf"enum {ename} \{{(.*?)\}};", text, re.S)
        assert body is not None, ename
        c_names = set(re.findall(rf"\b({prefix}[A-Z_]+)\s*=", body.group(1)))
        assert c_names == {prefix + m.name for m in enum}, ename
        for m in enum:
            assert int(c_values[f"int {prefix}{m.name}"]) == m.value, m


def test_header_static_asserts_cover_every_field() -> None:
    """Every field mirrored in Python has an offset _Static_assert in the C header."""
    text = HEADER.read_text()
    asserted = set(re.findall(r"offsetof\(struct (\w+), (\w+)\)", text))
    for sname, fields in STRUCTS.items():
        if sname == "rh_ctl_plan":
            continue  # its reserved fields are covered by the record size assert
        for fname, _ in fields:
            assert (sname, fname) in asserted, f"{sname}.{fname}"
