"""Lane events, plugin -> agent: ``struct rh_lane_event`` of ``railhop/ctl_table.h``.

Pure codecs. :func:`decode_event` accepts exactly one well-formed v1 message and raises
:class:`EventDecodeError` (with a stable ``reason`` code used in the agent's counters) for
anything else; it never raises another exception, whatever the bytes.
"""

from __future__ import annotations

import enum
import ipaddress
import struct
from dataclasses import dataclass

from railhop.control.errors import EventDecodeError
from railhop.control.layout import IFNAME_LEN, Fields, struct_of, valid_name

EV_MAGIC = 0x56454852  # bytes "RHEV"
EV_VERSION = 1
MAX_PORTS = 8
MAX_MSG = 512  # the agent never reads more than this from one message

EVENT_FIELDS: Fields = (
    ("magic", "I"),
    ("version", "H"),
    ("size", "H"),
    ("type", "H"),
    ("nports", "H"),
    ("pid", "I"),
    ("conn_id", "Q"),
    ("epoch", "I"),
    ("lane", "I"),
    ("t_ns", "Q"),
    ("duration_ns", "Q"),
    ("error", "i"),
    ("flags", "I"),
    ("nic", f"{IFNAME_LEN}s"),
    ("remote_nic", f"{IFNAME_LEN}s"),
    ("local_addr", "16s"),
    ("remote_addr", "16s"),
    ("local_ports", f"{MAX_PORTS}H"),
    ("remote_ports", f"{MAX_PORTS}H"),
    ("bytes_replayed", "Q"),
)
EVENT = struct_of(EVENT_FIELDS)
EVENT_SIZE = EVENT.size
assert EVENT_SIZE == 160

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class EventFlag(enum.IntFlag):
    """``RH_EV_F_*``: what a ``LANE_UP`` says of the lane beyond its ids. Unknown bits are kept
    in :attr:`LaneEvent.flags` and mean nothing here (a newer plugin's)."""

    STANDBY = 0x1  # a warm standby: handshaken, carries nothing yet
    PROMOTED = 0x2  # a warm standby a move (or the peer) promoted: it carries from now on


class EventType(enum.IntEnum):
    """``enum rh_lane_event_type``."""

    LANE_UP = 1
    LANE_DOWN = 2
    LANE_TIMEOUT = 3
    LANE_ERROR = 4
    FAILOVER_START = 5
    FAILOVER_END = 6
    FAILBACK = 7
    FAIR_SHARE = 8


@dataclass(frozen=True)
class LaneEvent:
    """One decoded lane event. ``pid`` is the sender's own view (its pid namespace)."""

    type: EventType
    pid: int
    nic: str
    conn_id: int = 0
    epoch: int = 0
    lane: int = 0
    t_ns: int = 0  # CLOCK_MONOTONIC of the sender
    duration_ns: int = 0
    error: int = 0
    flags: int = 0
    remote_nic: str = ""
    local_addr: Address | None = None
    remote_addr: Address | None = None
    local_ports: tuple[int, ...] = ()
    remote_ports: tuple[int, ...] = ()
    bytes_replayed: int = 0  # FAILOVER_END (sender side): bytes queued again for replay

    @property
    def standby(self) -> bool:
        """A ``LANE_UP`` of a warm standby (idle, or promoted: :attr:`promoted`)."""
        return bool(self.flags & EventFlag.STANDBY)

    @property
    def promoted(self) -> bool:
        """A ``LANE_UP`` of a warm standby's promotion (no handshake: it came up earlier)."""
        return bool(self.flags & EventFlag.PROMOTED)


def _addr_bytes(a: Address | None) -> bytes:
    if a is None:
        return bytes(16)
    if isinstance(a, ipaddress.IPv4Address):
        return ipaddress.IPv6Address("::ffff:" + str(a)).packed
    return a.packed


def _addr(raw: bytes) -> Address | None:
    if raw == bytes(16):
        return None
    a = ipaddress.IPv6Address(raw)
    return a.ipv4_mapped or a


def encode_event(ev: LaneEvent) -> bytes:
    """The wire bytes of an event (what the plugin's rh_ctl_send_event() sends)."""
    if len(ev.local_ports) != len(ev.remote_ports) or len(ev.local_ports) > MAX_PORTS:
        raise EventDecodeError("nports", "local and remote ports: same count, at most 8")
    if not valid_name(ev.nic, IFNAME_LEN, may_be_empty=False) or not valid_name(
        ev.remote_nic, IFNAME_LEN, may_be_empty=True
    ):
        raise EventDecodeError("name", f"bad NIC name {ev.nic!r} / {ev.remote_nic!r}")
    pad = MAX_PORTS - len(ev.local_ports)
    try:
        return EVENT.pack(
            EV_MAGIC,
            EV_VERSION,
            EVENT_SIZE,
            int(ev.type),
            len(ev.local_ports),
            ev.pid,
            ev.conn_id,
            ev.epoch,
            ev.lane,
            ev.t_ns,
            ev.duration_ns,
            ev.error,
            ev.flags,
            ev.nic.encode("ascii"),
            ev.remote_nic.encode("ascii"),
            _addr_bytes(ev.local_addr),
            _addr_bytes(ev.remote_addr),
            *ev.local_ports,
            *([0] * pad),
            *ev.remote_ports,
            *([0] * pad),
            ev.bytes_replayed,
        )
    except struct.error as e:
        raise EventDecodeError("range", str(e)) from e


def _name(raw: bytes, field: str, *, may_be_empty: bool) -> str:
    head, sep, tail = raw.partition(b"\0")
    if not sep or tail.strip(b"\0"):
        raise EventDecodeError("name", f"{field} is not NUL-terminated and NUL-padded")
    name = head.decode("ascii", "replace")
    if not valid_name(name, IFNAME_LEN, may_be_empty=may_be_empty):
        raise EventDecodeError("name", f"{field} {head!r} is not a NIC name")
    return name


def decode_event(data: bytes) -> LaneEvent:
    """Decodes one message; EventDecodeError for anything but a well-formed v1 event."""
    if len(data) > MAX_MSG:
        raise EventDecodeError("oversize", f"{len(data)} bytes > {MAX_MSG}")
    if len(data) < 8:
        raise EventDecodeError("short", f"{len(data)} bytes")
    magic, version, size = struct.unpack_from("<IHH", data, 0)
    if magic != EV_MAGIC:
        raise EventDecodeError("magic", f"{magic:#x}")
    if version != EV_VERSION:
        raise EventDecodeError("version", f"version {version}, this agent speaks {EV_VERSION}")
    if size != EVENT_SIZE or len(data) != EVENT_SIZE:
        raise EventDecodeError("size", f"size field {size}, message {len(data)}, want {EVENT_SIZE}")
    f = EVENT.unpack(data)
    (_m, _v, _s, etype, nports, pid, conn_id, epoch, lane, t_ns, duration, error, flags) = f[:13]
    nic_raw, rnic_raw, laddr, raddr = f[13:17]
    lports = f[17 : 17 + MAX_PORTS]
    rports = f[17 + MAX_PORTS : 17 + 2 * MAX_PORTS]
    bytes_replayed = f[-1]
    if etype not in EventType._value2member_map_:
        raise EventDecodeError("type", f"type {etype}")
    if nports > MAX_PORTS:
        raise EventDecodeError("nports", f"nports {nports} > {MAX_PORTS}")
    if any(lports[nports:]) or any(rports[nports:]):
        raise EventDecodeError("ports", "ports beyond nports are not zero")
    if pid == 0:
        raise EventDecodeError("pid", "pid 0")
    return LaneEvent(
        type=EventType(etype),
        pid=pid,
        nic=_name(nic_raw, "nic", may_be_empty=False),
        conn_id=conn_id,
        epoch=epoch,
        lane=lane,
        t_ns=t_ns,
        duration_ns=duration,
        error=error,
        flags=flags,
        remote_nic=_name(rnic_raw, "remote_nic", may_be_empty=True),
        local_addr=_addr(laddr),
        remote_addr=_addr(raddr),
        local_ports=tuple(lports[:nports]),
        remote_ports=tuple(rports[:nports]),
        bytes_replayed=bytes_replayed,
    )
