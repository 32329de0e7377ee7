"""Who holds a TCP port: the kernel's answer (``NETLINK_SOCK_DIAG``), so that a port a plugin
names in its ``LANE_UP`` enters the TCP probe's port map only when a socket of the reporter's
uid, bound to the lane's NIC, holds it (issue 29, 4: a job could map its own sockets, or any
port, to another NIC, or fill the map).

The request carries a filter (inet_diag bytecode) for the ports asked about, so the kernel
walks its socket tables once and returns only those sockets. Building the request and
reading the reply are pure (:func:`request`, :func:`parse`, :func:`owned`); :func:`lookup`
does the I/O. Needs no capability: any process may ask sock_diag about TCP sockets of its
network namespace.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_REQ_BYTECODE = 1
INET_DIAG_BC_JMP, INET_DIAG_BC_S_EQ = 1, 11
TCP_STATES_NOT_LISTEN = 0xFFF & ~(1 << 10)  # every state but LISTEN (lanes are connected)
MAX_PORTS_PER_REQUEST = 1024  # 12 bytes each: the filter stays well below a netlink attribute

_NLH = struct.Struct("=IHHII")
_REQ = struct.Struct("=BBBBI48s")  # inet_diag_req_v2 (family, protocol, ext, pad, states, id)
_MSG = struct.Struct("=BBBB2H16s16sI8sIIIII")  # inet_diag_msg
_BC_OP = struct.Struct("=BBH")


class SockDiagError(OSError):
    """The kernel refused the request or answered something unreadable."""


@dataclass(frozen=True)
class TcpSock:
    """One TCP socket as sock_diag reports it."""

    sport: int
    src: str  # IPv4 dotted quad
    ifindex: int  # the device the socket is bound to (SO_BINDTODEVICE), 0 if none
    uid: int
    inode: int


def bytecode(ports: Sequence[int]) -> bytes:
    """An inet_diag filter that accepts a socket whose local port is one of ``ports``: an OR
    chain of ``S_EQ`` tests, each followed by a jump to the end (accept) when it matched; the
    last test's "no" jumps 4 bytes past the end (reject)."""
    if not ports:
        raise ValueError("no port to ask about")
    *rest, last = ports
    out = _BC_OP.pack(INET_DIAG_BC_S_EQ, 8, 12) + _BC_OP.pack(0, 0, last)
    for port in reversed(rest):
        test = _BC_OP.pack(INET_DIAG_BC_S_EQ, 8, 12) + _BC_OP.pack(0, 0, port)
        out = test + _BC_OP.pack(INET_DIAG_BC_JMP, 4, len(out) + 4) + out
    return out


def request(ports: Sequence[int], seq: int = 1) -> bytes:
    """One SOCK_DIAG_BY_FAMILY dump request for IPv4 TCP sockets on ``ports``."""
    bc = bytecode(ports)
    attr = struct.pack("=HH", 4 + len(bc), INET_DIAG_REQ_BYTECODE) + bc
    body = (
        _REQ.pack(socket.AF_INET, socket.IPPROTO_TCP, 0, 0, TCP_STATES_NOT_LISTEN, bytes(48)) + attr
    )
    return (
        _NLH.pack(_NLH.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0)
        + body
    )


def parse(data: bytes) -> tuple[list[TcpSock], bool]:
    """The sockets in one buffer of netlink replies, and whether the dump ended in it.
    SockDiagError on an error reply or a truncated message."""
    out: list[TcpSock] = []
    off = 0
    while off + _NLH.size <= len(data):
        length, mtype, _flags, _seq, _pid = _NLH.unpack_from(data, off)
        if length < _NLH.size or off + length > len(data):
            raise SockDiagError(0, f"truncated sock_diag reply at byte {off}")
        if mtype == NLMSG_DONE:
            return out, True
        if mtype == NLMSG_ERROR:
            (err,) = struct.unpack_from("=i", data, off + _NLH.size)
            if err:
                raise SockDiagError(-err, f"sock_diag: {os.strerror(-err)}")
            return out, True
        if mtype == SOCK_DIAG_BY_FAMILY and length >= _NLH.size + _MSG.size:
            f = _MSG.unpack_from(data, off + _NLH.size)
            sport = socket.ntohs(f[4])
            src = socket.inet_ntoa(f[6][:4])
            out.append(TcpSock(sport, src, f[8], uid=f[13], inode=f[14]))
        off += (length + 3) & ~3
    return out, False


def lookup(ports: Collection[int], timeout_s: float = 1.0) -> list[TcpSock]:
    """Every IPv4 TCP socket (not listening) of this network namespace whose local port is
    in ``ports``. SockDiagError / OSError when the kernel cannot answer."""
    wanted = sorted({p for p in ports if 0 < p < 65536})
    out: list[TcpSock] = []
    with socket.socket(
        socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG
    ) as s:
        s.settimeout(timeout_s)
        for i in range(0, len(wanted), MAX_PORTS_PER_REQUEST):
            s.sendto(request(wanted[i : i + MAX_PORTS_PER_REQUEST], seq=i + 1), (0, 0))
            while True:
                socks, done = parse(s.recv(1 << 16))
                out += socks
                if done:
                    break
    return out


def owned(
    claims: Iterable[tuple[int, str, int]],
    socks: Iterable[TcpSock],
    ifindex: Mapping[str, int],
    addrs: Mapping[str, Collection[str]] | None = None,
) -> set[tuple[int, str, int]]:
    """Pure: the claims ``(uid, nic, port)`` the kernel backs: a socket of that uid holds the
    port and is bound to the NIC (its device, or, unbound, one of the NIC's addresses)."""
    by_port: dict[int, list[TcpSock]] = {}
    for s in socks:
        by_port.setdefault(s.sport, []).append(s)
    ok = set()
    for uid, nic, port in claims:
        idx = ifindex.get(nic, -1)
        mine = (addrs or {}).get(nic, ())
        for s in by_port.get(port, ()):
            if s.uid == uid and (s.ifindex == idx or (s.ifindex == 0 and s.src in mine)):
                ok.add((uid, nic, port))
                break
    return ok


def read_ifindex(names: Iterable[str], root: Path = Path("/")) -> dict[str, int]:
    """Interface name -> ifindex from ``<root>/sys/class/net/<name>/ifindex``; a NIC whose file
    is missing or unreadable is left out (its ports are then never mapped)."""
    out = {}
    for name in names:
        try:
            out[name] = int((root / "sys" / "class" / "net" / name / "ifindex").read_text())
        except (OSError, ValueError):
            continue
    return out


def read_addrs(names: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Interface name -> its primary IPv4 address (SIOCGIFADDR), for sockets not bound to a
    device; a NIC without one is left out."""
    import fcntl

    out: dict[str, tuple[str, ...]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        for name in names:
            try:
                req = struct.pack("16s16x", name.encode()[:15])
                res = fcntl.ioctl(s.fileno(), 0x8915, req)  # SIOCGIFADDR
            except OSError:
                continue
            out[name] = (socket.inet_ntoa(res[20:24]),)
    return out


Claim = tuple[int, str, int]  # (uid, nic, port)


class PortChecker:
    """Which claims ``(uid, nic, port)`` the kernel backs now (:func:`owned` over
    :func:`lookup`); NIC devices and addresses as read at start."""

    def __init__(
        self,
        ifindex: Mapping[str, int],
        addrs: Mapping[str, Collection[str]],
        lookup_fn: Callable[[Collection[int]], list[TcpSock]] = lookup,
    ) -> None:
        self.ifindex = dict(ifindex)
        self.addrs = {k: tuple(v) for k, v in addrs.items()}
        self._lookup = lookup_fn

    @classmethod
    def for_nics(cls, names: Iterable[str], root: Path = Path("/")) -> PortChecker:
        names = list(names)
        return cls(read_ifindex(names, root), read_addrs(names))

    def __call__(self, claims: Collection[Claim]) -> set[Claim]:
        if not claims:
            return set()
        return owned(claims, self._lookup({p for _, _, p in claims}), self.ifindex, self.addrs)
