"""railhop.daemon.sockdiag: the inet_diag filter, the reply decoder, the ownership rule, and
the kernel's answer about real sockets on lo."""

from __future__ import annotations

import os
import socket
import struct

import pytest

from railhop.daemon import sockdiag as sd


def test_bytecode_is_an_or_chain_of_port_tests() -> None:
    # S_EQ 5001 (yes: next op, no: skip test + jump), JMP to the end, S_EQ 5002 (no: reject)
    assert sd.bytecode([5001, 5002]) == bytes.fromhex("0b080c000000891301040c000b080c0000008a13")
    assert sd.bytecode([7]) == bytes.fromhex("0b080c0000000700")
    with pytest.raises(ValueError):
        sd.bytecode([])


def _msg(sport: int, src: str, ifindex: int, uid: int, inode: int) -> bytes:
    body = struct.pack(
        "=BBBB2H16s16sI8sIIIII",
        socket.AF_INET,
        1,
        0,
        0,
        socket.htons(sport),
        socket.htons(40000),
        socket.inet_aton(src) + bytes(12),
        bytes(16),
        ifindex,
        bytes(8),
        0,
        0,
        0,
        uid,
        inode,
    )
    return struct.pack("=IHHII", 16 + len(body), 20, 2, 1, 0) + body


def test_parse_reads_sockets_until_done_and_reports_errors() -> None:
    done = struct.pack("=IHHII", 20, 3, 2, 1, 0) + bytes(4)
    socks, end = sd.parse(_msg(5001, "10.0.0.1", 7, 1000, 42) + done)
    assert end and socks == [sd.TcpSock(5001, "10.0.0.1", 7, 1000, 42)]
    assert sd.parse(_msg(5001, "10.0.0.1", 7, 1000, 42)) == (socks, False)
    err = struct.pack("=IHHIIi", 36, 2, 0, 1, 0, -22) + bytes(16)
    with pytest.raises(sd.SockDiagError, match="Invalid argument"):
        sd.parse(err)
    with pytest.raises(sd.SockDiagError, match="truncated"):
        sd.parse(_msg(5001, "10.0.0.1", 7, 1000, 42)[:-8])


def test_owned_needs_the_uid_and_the_nic() -> None:
    socks = [
        sd.TcpSock(5001, "10.0.0.1", 7, 1000, 1),  # bound to nic0's device
        sd.TcpSock(5002, "10.0.1.1", 0, 1000, 2),  # unbound, nic1's address
        sd.TcpSock(5003, "10.0.1.1", 0, 0, 3),  # root's
    ]
    idx = {"nic0": 7, "nic1": 8}
    addrs = {"nic0": ("10.0.0.1",), "nic1": ("10.0.1.1",)}
    claims = [
        (1000, "nic0", 5001),
        (1000, "nic1", 5001),  # held, but on nic0
        (1000, "nic1", 5002),
        (1000, "nic0", 5002),  # unbound socket of nic1's address
        (1000, "nic1", 5003),  # root's socket
        (1000, "nic0", 5999),  # nobody's
    ]
    assert sd.owned(claims, socks, idx, addrs) == {(1000, "nic0", 5001), (1000, "nic1", 5002)}


def test_lookup_asks_the_kernel() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    served, _ = listener.accept()
    try:
        port = client.getsockname()[1]
        got = sd.lookup([port, listener.getsockname()[1]])
        assert {s.sport for s in got} == {port, listener.getsockname()[1]}  # not the listener
        assert len(got) == 2 and all(s.uid == os.getuid() and s.src == "127.0.0.1" for s in got)
        check = sd.PortChecker({"lo0": 99}, {"lo0": ("127.0.0.1",)})
        me = os.getuid()
        assert check([(me, "lo0", port), (me + 1, "lo0", port), (me, "lo9", port)]) == {
            (me, "lo0", port)
        }
    finally:
        for s in (listener, client, served):
            s.close()
