"""The plugin's lane handshake as a peer, or a stranger, writes it (plugin/src/core/wire.h).

Used by the hostile-peer suites (tests/privileged/test_hostile_peer.py over the TCP lane,
tests/vm/test_verbs_hostile.py over the verbs lane through :mod:`verbs_stranger`): the 48-byte
frame header, hellos (with a random MAC, as a stranger without the secret sends them, or signed
with the connection secret of a connect handle, as only a holder of the handle can), the NIC
table entries, the connect handle, and the verbs lane's queue pair address (the 25 transport
bytes of its hellos, plugin/src/lanes/verbs/proto.h), and the TCP segment of a captured
Ethernet frame (:func:`tcp_segment`, for the suites' captures). Standard library only: it
also runs in the VM lab's guests under the system Python.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
from dataclasses import dataclass, field

CHUNK = 131072  # RAILHOP_CHUNK_SIZE default
HDR = struct.Struct("<BBHIQIIQQQ")  # type slot flags len conn_id epoch aux seq off total
F_DATA, F_CTS, F_ACK, F_FAILREQ, F_BYE, F_HELLO, F_HELLO_ACK = 1, 2, 3, 5, 6, 7, 8
TAG = 16  # RHH4: the tag after every frame header after the hello
HELLO_CONN, HELLO_LANE, HELLO_PROBE = 1, 2, 3
U32_MAX = 0xFFFFFFFF
MAGIC = b"RHH4"
SECRET_LEN = 16
HANDLE_SECRET_OFF = 104
VERBS_QP_INFO_LEN = 25
# enum ibv_mtu: 1 = 256 .. 5 = 4096 bytes
IBV_MTU_1024 = 3


def frame(ftype: int, payload: bytes = b"", **f: int) -> bytes:
    """A frame header (fields by name, ``length`` defaults to the payload's) and the payload."""
    return (
        HDR.pack(
            ftype,
            f.get("slot", 0),
            f.get("flags", 0),
            f.get("length", len(payload)),
            f.get("conn_id", 0),
            f.get("epoch", 1),
            f.get("aux", 0),
            f.get("seq", 0),
            f.get("off", 0),
            f.get("total", 0),
        )
        + payload
    )


def nic_entry(ip: str, port: int, rail: int = 0) -> bytes:
    """One NIC of a hello's table: address, port (network order), rail, NUMA -1, up, no PCI."""
    return socket.inet_aton(ip) + struct.pack(">H", port) + struct.pack("<hhBB", rail, -1, 1, 0)


def hello(
    magic: bytes,
    kind: int,
    from_sender: int,
    lane_id: int,
    *,
    listen_id: int = 0,
    src_nic: int = 0,
    dst_nic: int = 0,
    nics: tuple[bytes, ...] = (),
) -> bytes:
    """A hello of the listener's protocol; under RHH3 with a nonce and a MAC made without the
    secret (random bytes: the stranger has nothing better), under RHH4 a stream nonce and flags
    too."""
    b = magic + bytes((kind, from_sender, 1, 0))
    b += struct.pack("<IQIhh", lane_id, listen_id, CHUNK, src_nic, dst_nic)
    if magic in (b"RHH3", b"RHH4"):
        b += os.urandom(16 + 32)
    if magic == b"RHH4":
        b += os.urandom(16) + b"\0"  # stream nonce, flags
    return b + bytes((len(nics),)) + b"".join(nics)


@dataclass
class Hello:
    """An RHH4 hello field by field (struct rh_hello); :meth:`encode` with its MAC as is (random
    unless set), :meth:`signed` with the MAC a holder of the connection secret computes."""

    kind: int
    from_sender: int
    lane_id: int
    listen_id: int = 0
    chunk: int = CHUNK
    src_nic: int = 0
    dst_nic: int = 0
    nstreams: int = 1
    stream: int = 0
    flags: int = 0
    nics: tuple[bytes, ...] = ()
    tp: bytes = b""  # the transport's bytes (a verbs lane's queue pair address)
    nonce: bytes = field(default_factory=lambda: os.urandom(16))
    snonce: bytes = field(default_factory=lambda: os.urandom(16))
    mac: bytes = field(default_factory=lambda: os.urandom(32))

    def encode(self, mac: bytes | None = None) -> bytes:
        b = MAGIC + bytes((self.kind, self.from_sender, self.nstreams, self.stream))
        b += struct.pack(
            "<IQIhh", self.lane_id, self.listen_id, self.chunk, self.src_nic, self.dst_nic
        )
        b += self.nonce + (self.mac if mac is None else mac) + self.snonce + bytes((self.flags,))
        b += bytes((len(self.nics),)) + b"".join(self.nics)
        if self.tp:
            b += bytes((len(self.tp),)) + self.tp
        return b

    def signed(
        self,
        secret: bytes,
        conn_id: int,
        epoch: int,
        bind1: bytes | None = None,
        bind2: bytes | None = None,
    ) -> bytes:
        """The hello under its request MAC (rh_hello_mac_input: label, the encoding with the
        MAC zeroed, connection id, epoch, the two bind nonces or zeros)."""
        data = b"railhop hello".ljust(16, b"\0") + self.encode(mac=bytes(32))
        data += struct.pack("<QI", conn_id, epoch)
        data += (bind1 or bytes(16)) + (bind2 or bytes(16))
        self.mac = hmac.new(secret, data, hashlib.sha256).digest()
        return self.encode()


@dataclass
class Handle:
    magic: bytes
    listen_id: int
    nics: list[tuple[str, int]]  # the receiver's lane listeners, by NIC index
    secret: bytes = b""


def parse_handle(b: bytes) -> Handle:
    """A connect handle (rh_handle_put): magic, NIC count, listen id, NICs, secret."""
    n = b[4]
    nics = []
    for i in range(n):
        p = 16 + 8 * i
        nics.append((socket.inet_ntoa(b[p : p + 4]), struct.unpack(">H", b[p + 4 : p + 6])[0]))
    return Handle(
        magic=b[:4],
        listen_id=struct.unpack("<Q", b[8:16])[0],
        nics=nics,
        secret=b[HANDLE_SECRET_OFF : HANDLE_SECRET_OFF + SECRET_LEN],
    )


def ipv4_gid(ip: str) -> bytes:
    """The IPv4-mapped (RoCE v2) GID of an address: ::ffff:a.b.c.d."""
    return bytes(10) + b"\xff\xff" + socket.inet_aton(ip)


def verbs_qp_info(qpn: int, psn: int, gid: bytes, mtu: int = IBV_MTU_1024) -> bytes:
    """A verbs lane's queue pair address (verbs_qp_info_put: QPN, PSN little-endian, GID, MTU);
    values are not checked here, so a stranger can write out-of-range ones."""
    return struct.pack("<II", qpn & U32_MAX, psn & U32_MAX) + gid + bytes((mtu & 0xFF,))


@dataclass(frozen=True)
class TcpSegment:
    src: str
    sport: int
    dst: str
    dport: int
    payload: bytes


def tcp_segment(pkt: bytes) -> TcpSegment | None:
    """The IPv4 TCP segment of an Ethernet frame from an AF_PACKET socket, or None for any other
    frame."""
    if len(pkt) < 34 or pkt[12:14] != b"\x08\x00" or pkt[23] != 6:
        return None
    tcp = 14 + (pkt[14] & 15) * 4
    if len(pkt) < tcp + 20:
        return None
    sport, dport = struct.unpack(">HH", pkt[tcp : tcp + 4])
    doff = (pkt[tcp + 12] >> 4) * 4
    total = struct.unpack(">H", pkt[16:18])[0]
    return TcpSegment(
        socket.inet_ntoa(pkt[26:30]),
        sport,
        socket.inet_ntoa(pkt[30:34]),
        dport,
        bytes(pkt[tcp + doff : 14 + total]),
    )
