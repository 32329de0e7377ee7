"""bpf/railhop_events.h and the Python decoders agree on every struct size and field offset
(compiles a tiny C program against the header with the host compiler)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from conftest import require
from railhop.sources import decode as D

BPF = Path(__file__).parents[2] / "bpf"

FIELDS = {
    "rh_hdr": ["ts_ns", "kind", "hook"],
    "rh_netdev_ev": ["h", "ifindex", "netns_ino", "ifname"],
    "rh_tcp_ev": ["h", "sport", "dport", "family", "state", "value", "netns_ino", "saddr", "daddr"],
    "rh_drv_ev": ["h", "a", "b", "dev", "name", "msg"],
    "rh_usdt_ev": ["h", "probe", "pid", "arg"],
}
STRUCTS = {
    "rh_hdr": D.HDR,
    "rh_netdev_ev": D.NETDEV,
    "rh_tcp_ev": D.TCP,
    "rh_drv_ev": D.DRV,
    "rh_usdt_ev": D.USDT,
}


def python_offsets(fmt: str) -> list[int]:
    """Offsets of the C fields given the Python format (the header is folded into 3 items)."""
    import struct

    items = [c for c in _expand(fmt.lstrip("<"))]
    offs, pos = [], 0
    for code in items:
        offs.append(pos)
        pos += struct.calcsize("<" + code)
    return offs


def _expand(fmt: str) -> list[str]:
    out, num = [], ""
    for ch in fmt:
        if ch.isdigit():
            num += ch
            continue
        if ch == "s":
            out.append(f"{num}s")
        else:
            out += [ch] * int(num or "1")
        num = ""
    return out


def test_header_matches_decoders(tmp_path: Path) -> None:
    cc = shutil.which("gcc") or shutil.which("cc")
    require(cc is not None, "no C compiler (make setup installs gcc)")
    lines = [
        "#include <stdio.h>",
        "#include <stddef.h>",
        "#include <linux/types.h>",
        '#include "railhop_events.h"',
        "int main(void) {",
    ]
    for st, fields in FIELDS.items():
        lines.append(f'printf("{st} %zu\\n", sizeof(struct {st}));')
        for f in fields:
            lines.append(f'printf("{st}.{f} %zu\\n", offsetof(struct {st}, {f}));')
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run(
        [cc, "-std=gnu11", "-Wall", "-Werror", f"-I{BPF}", "-o", str(exe), str(src)], check=True
    )
    got = dict(
        line.split()
        for line in subprocess.run(
            [str(exe)], capture_output=True, text=True, check=True
        ).stdout.splitlines()
    )
    for st, pyst in STRUCTS.items():
        assert int(got[st]) == pyst.size, st
    # field offsets: python formats start with the 3 header items (ts, kind, hook)
    for st in ("rh_netdev_ev", "rh_tcp_ev", "rh_drv_ev", "rh_usdt_ev"):
        py = python_offsets(STRUCTS[st].format)[3:]
        c = [int(got[f"{st}.{f}"]) for f in FIELDS[st][1:]]
        if st == "rh_usdt_ev":
            py = py[:3]  # arg[4] is 4 python items, one C array
        assert c == py, st
    assert [int(got[f"rh_hdr.{f}"]) for f in FIELDS["rh_hdr"]] == python_offsets(D.HDR.format)


def test_event_kinds_match_header() -> None:
    text = (BPF / "railhop_events.h").read_text()
    defs = dict(
        (parts[1], int(parts[2]))
        for parts in (ln.split() for ln in text.splitlines())
        if len(parts) >= 3
        and parts[0] == "#define"
        and parts[1].startswith(("RH_EV_", "RH_USDT_", "RH_HOOK_"))
    )
    assert defs["RH_EV_CARRIER_DOWN"] == D.EV_CARRIER_DOWN
    assert defs["RH_EV_USDT"] == D.EV_USDT
    for k, v in D.USDT_PROBES.items():
        assert defs[f"RH_USDT_{v.upper()}"] == k
    for k, v in D.HOOKS.items():
        assert defs[f"RH_HOOK_{v.upper()}"] == k
    for name in (
        "QDISC_RESET",
        "TCP_RETRANS",
        "TCP_ERROR",
        "TCP_LOSS",
        "DEVLINK_HEALTH",
        "CM_EVENT",
        "CM_REMOVE",
        "MLX5_CMD",
        "IB_EVENT",
        "DEV_CLOSE",
    ):
        assert defs[f"RH_EV_{name}"] == getattr(D, f"EV_{name}")
