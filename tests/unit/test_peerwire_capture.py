"""peerwire.tcp_segment: the TCP segment of a captured Ethernet frame (the hostile-peer suites'
captures of hellos on the wire)."""

from __future__ import annotations

import socket
import struct

from railhop_lab.peerwire import tcp_segment


def _frame(payload: bytes, proto: int = 6, ethertype: bytes = b"\x08\x00", pad: int = 0) -> bytes:
    tcp = struct.pack(">HHIIBBHHH", 40001, 5201, 1, 0, 5 << 4, 0x18, 65535, 0, 0)
    ip = struct.pack(
        ">BBHHHBBH4s4s",
        0x45,
        0,
        20 + len(tcp) + len(payload),
        0,
        0,
        64,
        proto,
        0,
        socket.inet_aton("10.1.0.1"),
        socket.inet_aton("10.1.1.2"),
    )
    # Ethernet pads short frames: the payload ends where the IP total length says
    return b"\x02" * 6 + b"\x04" * 6 + ethertype + ip + tcp + payload + b"\x00" * pad


def test_a_tcp_segment_is_read_with_its_addresses_and_payload() -> None:
    seg = tcp_segment(_frame(b"RHH4hello", pad=7))
    assert seg is not None
    assert (seg.src, seg.sport, seg.dst, seg.dport) == ("10.1.0.1", 40001, "10.1.1.2", 5201)
    assert seg.payload == b"RHH4hello"


def test_other_frames_are_not_segments() -> None:
    assert tcp_segment(_frame(b"x", proto=17)) is None  # UDP
    assert tcp_segment(_frame(b"x", ethertype=b"\x86\xdd")) is None  # IPv6
    assert tcp_segment(_frame(b"x")[:40]) is None  # cut inside the TCP header
    assert tcp_segment(b"") is None
