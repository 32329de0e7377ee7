"""USDT: the stapsdt ELF note parser (on a hand-built ELF), argument types, probe planning."""

from __future__ import annotations

import struct

import pytest

from railhop.sources import usdt as U
from railhop.sources.base import Reason


def note(provider: str, name: str, args: str, sema: int = 0, pc: int = 0x1100) -> bytes:
    desc = struct.pack("<QQQ", pc, 0x2000, sema) + f"{provider}\0{name}\0{args}\0".encode()
    pad = (-len(desc)) % 4
    return struct.pack("<III", 8, len(desc), 3) + b"stapsdt\0" + desc + b"\0" * pad


def elf(notes: bytes) -> bytes:
    """ELF64 LE with sections: null, .note.stapsdt, .shstrtab."""
    shstr = b"\0.note.stapsdt\0.shstrtab\0"
    body_off = 64
    notes_off = body_off
    shstr_off = notes_off + len(notes)
    shoff = shstr_off + len(shstr)
    shoff += (-shoff) % 8
    hdr = bytearray(64)
    hdr[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", hdr, 0x28, shoff)
    struct.pack_into("<HHH", hdr, 0x3A, 64, 3, 2)

    def sh(name: int, typ: int, off: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, typ, 0, 0, off, size, 0, 0, 1, 0)

    out = bytes(hdr) + notes + shstr
    out += b"\0" * (shoff - len(out))
    out += sh(0, 0, 0, 0) + sh(1, 7, notes_off, len(notes)) + sh(15, 3, shstr_off, len(shstr))
    return out


LIB = elf(
    note("railhop", "lane_up", "-4@%edi -4@%esi")
    + note("railhop", "req_done", "-4@%edi 8@%rsi 8@%rdx")
    + note("railhop", "failback", "-4@%edi", sema=0x4010)
    + note("other", "lane_down", "8@%rdi")
    + note("railhop", "failover_start", "")
)


def test_stapsdt_notes() -> None:
    notes = U.stapsdt_notes(LIB)
    assert [(n.provider, n.name, n.nargs, n.semaphore) for n in notes] == [
        ("railhop", "lane_up", 2, 0),
        ("railhop", "req_done", 3, 0),
        ("railhop", "failback", 1, 0x4010),
        ("other", "lane_down", 1, 0),
        ("railhop", "failover_start", 0, 0),
    ]
    assert notes[1].arg_types() == ["__s32", "__u64", "__u64"]


def test_not_elf() -> None:
    with pytest.raises(U.UsdtError, match="not an ELF"):
        U.stapsdt_notes(b"#!/bin/sh\n" + bytes(64))
    with pytest.raises(U.UsdtError, match="past the end"):
        U.stapsdt_notes(LIB[:200])


@pytest.mark.parametrize(
    ("spec", "ctype"),
    [
        ("-4@%edi", "__s32"),
        ("8@%rsi", "__u64"),
        ("-8@-16(%rbp)", "__s64"),
        ("1@%al", "__u8"),
        ("-2@%ax", "__s16"),
        ("%rdi", "__u64"),
    ],
)
def test_arg_ctype(spec: str, ctype: str) -> None:
    assert U.arg_ctype(spec) == ctype


@pytest.mark.parametrize("spec", ["3@%edi", "x@%edi"])
def test_bad_arg_spec(spec: str) -> None:
    with pytest.raises(U.UsdtError):
        U.arg_ctype(spec)


def test_plan_probes() -> None:
    usable, caps = U.plan_probes(U.stapsdt_notes(LIB))
    assert sorted(usable) == ["failover_start", "lane_up", "req_done"]
    why = {c.hook: (c.reason, c.detail) for c in caps}
    assert why["failback"] == (Reason.NOT_AVAILABLE, "semaphore probe: needs a pid")
    assert why["lane_down"][0] is Reason.NO_PROBES  # provider "other" is not ours
    assert why["failover_end"][0] is Reason.NO_PROBES


def test_plan_probes_req_done_needs_three_args() -> None:
    lib = elf(note("railhop", "req_done", "-4@%edi 8@%rsi"))
    usable, caps = U.plan_probes(U.stapsdt_notes(lib))
    assert "req_done" not in usable
    assert any(c.hook == "req_done" and "need 3" in c.detail for c in caps)


def test_plan_probes_sites_must_agree_on_argument_sizes() -> None:
    same = note("railhop", "lane_up", "-4@%edi 8@%rsi") + note(
        "railhop", "lane_up", "-4@$-1 8@%r12"
    )
    usable, _ = U.plan_probes(U.stapsdt_notes(elf(same)))
    assert "lane_up" in usable
    mixed = note("railhop", "lane_up", "-4@%edi 8@%rsi") + note(
        "railhop", "lane_up", "8@%rdi 8@%rsi"
    )
    usable, caps = U.plan_probes(U.stapsdt_notes(elf(mixed)))
    assert "lane_up" not in usable
    assert any(c.hook == "lane_up" and "differ" in c.detail for c in caps)


def test_lane_stats_mean() -> None:
    s = U.LaneStats(pid=1, lane=2, reqs=4, bytes=10, lat_sum_ns=400, lat_log2=(0,) * 40)
    assert s.mean_latency_ns == 100.0
    assert U.LaneStats(1, 2, 0, 0, 0, ()).mean_latency_ns == 0.0
