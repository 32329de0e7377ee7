"""Lane-event codec: captured bytes from the C struct, every malformed shape, and fuzzing."""

from __future__ import annotations

import contextlib
import ipaddress
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from railhop.control.errors import EventDecodeError
from railhop.control.lane_events import (
    EVENT_SIZE,
    MAX_MSG,
    EventFlag,
    EventType,
    LaneEvent,
    decode_event,
    encode_event,
)

# bytes of a struct rh_lane_event filled by a C program compiled against ctl_table.h
GOLDEN = bytes.fromhex(
    "524845560100a000060002009210000008070605040302010900000002000000"
    "07ca9a3b0000000015cd5b07000000006e000000000000006e69633200000000"
    "00000000000000006e6963330000000000000000000000000000000000000000"
    "0000ffff0a4d020100000000000000000000ffff0a4d0302409c419c00000000"
    "0000000000000000881389130000000000000000000000000000000000000000"
)
GOLDEN_EVENT = LaneEvent(
    type=EventType.FAILOVER_END,
    pid=4242,
    nic="nic2",
    conn_id=0x0102030405060708,
    epoch=9,
    lane=2,
    t_ns=1000000007,
    duration_ns=123456789,
    error=110,
    remote_nic="nic3",
    local_addr=ipaddress.IPv4Address("10.77.2.1"),
    remote_addr=ipaddress.IPv4Address("10.77.3.2"),
    local_ports=(40000, 40001),
    remote_ports=(5000, 5001),
)


def test_golden_bytes_decode_to_expected_values() -> None:
    assert len(GOLDEN) == EVENT_SIZE == 160
    assert decode_event(GOLDEN) == GOLDEN_EVENT


def test_encode_matches_the_c_bytes() -> None:
    assert encode_event(GOLDEN_EVENT) == GOLDEN


def test_standby_flags_round_trip_and_unknown_bits_are_kept() -> None:
    """A warm standby's LANE_UPs: idle (STANDBY), then its promotion (STANDBY | PROMOTED);
    a bit this agent does not know decodes (kept in flags, meaning nothing here)."""
    idle = LaneEvent(EventType.LANE_UP, 7, "nic2", lane=4, flags=int(EventFlag.STANDBY))
    promoted = LaneEvent(
        EventType.LANE_UP, 7, "nic2", lane=4, flags=int(EventFlag.STANDBY | EventFlag.PROMOTED)
    )
    raw = encode_event(promoted)
    assert struct.unpack_from("<I", raw, 52) == (3,)  # ctl_table.h: flags at offset 52
    for ev in (idle, promoted):
        back = decode_event(encode_event(ev))
        assert back == ev and back.standby
    assert not decode_event(encode_event(idle)).promoted
    assert decode_event(raw).promoted
    plain = LaneEvent(EventType.LANE_UP, 7, "nic2", flags=0x80)
    back = decode_event(encode_event(plain))
    assert back.flags == 0x80 and not back.standby and not back.promoted


def test_ipv6_and_missing_addresses() -> None:
    ev = LaneEvent(EventType.LANE_UP, 1, "eth0", local_addr=ipaddress.IPv6Address("fd00::1"))
    back = decode_event(encode_event(ev))
    assert back.local_addr == ipaddress.IPv6Address("fd00::1") and back.remote_addr is None


def _patch(fmt: str, offset: int, *values: int) -> bytes:
    b = bytearray(GOLDEN)
    struct.pack_into(fmt, b, offset, *values)
    return bytes(b)


def _set(offset: int, raw: bytes) -> bytes:
    b = bytearray(GOLDEN)
    b[offset : offset + len(raw)] = raw
    return bytes(b)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "short"),
        (GOLDEN[:7], "short"),
        (GOLDEN[:100], "size"),
        (GOLDEN + b"\0", "size"),
        (GOLDEN + bytes(MAX_MSG), "oversize"),
        (_patch("<I", 0, 0x12345678), "magic"),
        (_patch("<H", 4, 2), "version"),
        (_patch("<H", 6, 161), "size"),
        (_patch("<H", 8, 0), "type"),
        (_patch("<H", 8, 9), "type"),
        (_patch("<H", 10, 9), "nports"),
        (_patch("<H", 10, 1), "ports"),  # port 2 set beyond nports
        (_patch("<H", 120 + 2 * 7, 1), "ports"),
        (_patch("<I", 12, 0), "pid"),
        (_set(56, b"\0" * 16), "name"),  # empty nic
        (_set(56, b"n" * 16), "name"),  # not NUL-terminated
        (_set(56, b"ni c\0" + bytes(11)), "name"),
        (_set(56, b"a/b\0" + bytes(12)), "name"),
        (_set(56, b"nic\0x" + bytes(11)), "name"),  # junk after the NUL
        (_set(72, b"\xff\0" + bytes(14)), "name"),
    ],
)
def test_malformed_messages_raise_with_reason(data: bytes, reason: str) -> None:
    with pytest.raises(EventDecodeError) as ei:
        decode_event(data)
    assert ei.value.reason == reason


def test_encode_refuses_bad_events() -> None:
    with pytest.raises(EventDecodeError):
        encode_event(LaneEvent(EventType.LANE_UP, 1, "nic0", local_ports=(1,)))
    with pytest.raises(EventDecodeError):
        encode_event(LaneEvent(EventType.LANE_UP, 1, ""))
    with pytest.raises(EventDecodeError):
        encode_event(LaneEvent(EventType.LANE_UP, -1, "nic0"))


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=MAX_MSG + 64))
def test_fuzz_arbitrary_bytes_only_raise_decode_error(data: bytes) -> None:
    with contextlib.suppress(EventDecodeError):  # anything else fails the test
        decode_event(data)


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.tuples(st.integers(0, EVENT_SIZE - 1), st.integers(0, 255)), max_size=8))
def test_fuzz_mutated_events_decode_or_raise_decode_error(muts: list[tuple[int, int]]) -> None:
    b = bytearray(GOLDEN)
    for off, val in muts:
        b[off] = val
    try:
        ev = decode_event(bytes(b))
    except EventDecodeError:
        return
    assert encode_event(ev) == bytes(b)  # the encoding is canonical: nothing is lost


names = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters="/"),
    min_size=1,
    max_size=15,
)


@st.composite
def lane_events(draw: st.DrawFn) -> LaneEvent:
    n = draw(st.integers(0, 8))
    addr = st.none() | st.builds(ipaddress.IPv4Address, st.integers(1, 2**32 - 1))
    return LaneEvent(
        type=draw(st.sampled_from(EventType)),
        pid=draw(st.integers(1, 2**32 - 1)),
        nic=draw(names),
        conn_id=draw(st.integers(0, 2**64 - 1)),
        epoch=draw(st.integers(0, 2**32 - 1)),
        lane=draw(st.integers(0, 2**32 - 1)),
        t_ns=draw(st.integers(0, 2**64 - 1)),
        duration_ns=draw(st.integers(0, 2**64 - 1)),
        error=draw(st.integers(-(2**31), 2**31 - 1)),
        flags=draw(st.integers(0, 2**32 - 1)),
        remote_nic=draw(st.just("") | names),
        local_addr=draw(addr),
        remote_addr=draw(addr),
        local_ports=tuple(draw(st.lists(st.integers(0, 65535), min_size=n, max_size=n))),
        remote_ports=tuple(draw(st.lists(st.integers(0, 65535), min_size=n, max_size=n))),
    )


@settings(max_examples=300, deadline=None)
@given(lane_events())
def test_roundtrip(ev: LaneEvent) -> None:
    assert decode_event(encode_event(ev)) == ev
