"""railhop.sources.bpfstats: struct bpf_prog_info decoding (pure) and differences."""

from __future__ import annotations

import struct

import pytest

from railhop.sources.bpfstats import PROG_INFO_SIZE, BpfStatsError, ProgStats, parse_prog_info


def info(ptype: int, pid: int, name: bytes, rt: int, cnt: int) -> bytes:
    raw = bytearray(PROG_INFO_SIZE)
    struct.pack_into("<II", raw, 0, ptype, pid)
    raw[64 : 64 + len(name)] = name
    struct.pack_into("<QQ", raw, 192, rt, cnt)
    return bytes(raw)


def test_parse_prog_info() -> None:
    # prog type 17 = BPF_PROG_TYPE_RAW_TRACEPOINT; names are cut to 15 characters by the kernel
    st = parse_prog_info(info(17, 3241, b"tcp_retransmit_", 7_000, 20))
    assert st == ProgStats("tcp_retransmit_", 3241, 17, 7_000, 20)
    assert st.ns_per_run == 350.0
    assert ProgStats("x", 1, 17, 0, 0).ns_per_run == 0.0
    with pytest.raises(BpfStatsError):
        parse_prog_info(b"\0" * 100)


def test_minus() -> None:
    a = parse_prog_info(info(17, 9, b"p", 1_000, 4))
    b = parse_prog_info(info(17, 9, b"p", 4_000, 10))
    d = b.minus(a)
    assert (d.run_time_ns, d.run_cnt, d.ns_per_run) == (3_000, 6, 500.0)
    with pytest.raises(BpfStatsError):
        b.minus(parse_prog_info(info(17, 8, b"p", 0, 0)))
