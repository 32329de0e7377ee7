"""rtnetlink link events (RTM_NEWLINK / RTM_DELLINK) -> carrier events, non-blocking in asyncio.

A raw ``NETLINK_ROUTE`` socket bound to ``RTMGRP_LINK`` (created inside ``netns`` when given) is
read with ``loop.add_reader``; pyroute2 parses the messages. Each message is stamped with
``time.monotonic_ns()`` when read. The per-link state machine (:class:`LinkTracker`) is pure: it
turns a sequence of link snapshots into carrier transitions.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from railhop.sources.base import Capability, Emit, Reason, SourceError, attached, skipped
from railhop.sources.events import CarrierDown, CarrierUp, Event, LinkRemoved

RTMGRP_LINK = 0x1
RTM_NEWLINK = 16
RTM_DELLINK = 17
IFF_UP = 0x1
IFF_RUNNING = 0x40
IFF_LOWER_UP = 0x10000
RCVBUF = 1 << 20


class NetlinkError(SourceError):
    """The netlink socket could not be opened or read."""


@dataclass(frozen=True, slots=True)
class LinkMsg:
    """The fields of one RTM_NEWLINK/RTM_DELLINK railhop cares about."""

    event: str  # RTM_NEWLINK | RTM_DELLINK
    ifindex: int
    ifname: str
    operstate: str
    carrier: bool
    admin_up: bool


def link_msg(msg: Any) -> LinkMsg | None:
    """Extract a :class:`LinkMsg` from a parsed pyroute2 ifinfmsg (None for other messages)."""
    event = msg.get("event")
    if event not in ("RTM_NEWLINK", "RTM_DELLINK"):
        return None
    flags = int(msg["flags"])
    carrier_attr = msg.get_attr("IFLA_CARRIER")
    carrier = bool(carrier_attr) if carrier_attr is not None else bool(flags & IFF_LOWER_UP)
    return LinkMsg(
        event=str(event),
        ifindex=int(msg["index"]),
        ifname=str(msg.get_attr("IFLA_IFNAME") or ""),
        operstate=str(msg.get_attr("IFLA_OPERSTATE") or ""),
        carrier=carrier,
        admin_up=bool(flags & IFF_UP),
    )


def parse(data: bytes) -> list[LinkMsg]:
    """Parse one netlink datagram (may hold several messages) into link messages."""
    from pyroute2.netlink.rtnl.marshal import MarshalRtnl

    out = []
    for m in MarshalRtnl().parse(data):
        lm = link_msg(m)
        if lm is not None:
            out.append(lm)
    return out


class LinkTracker:
    """Carrier state per ifindex; ``update`` returns the event a message implies (or None).
    The first message about a link only records its state (no event) unless ``report_initial``."""

    def __init__(self, source: str, ifnames: set[str] | None = None) -> None:
        self.source = source
        self.ifnames = ifnames
        self._carrier: dict[int, bool] = {}

    def seed(self, m: LinkMsg) -> None:
        if m.event == "RTM_NEWLINK":
            self._carrier[m.ifindex] = m.carrier

    def carrier(self, ifindex: int) -> bool | None:
        return self._carrier.get(ifindex)

    def update(self, m: LinkMsg, ts_ns: int) -> Event | None:
        if self.ifnames is not None and m.ifname not in self.ifnames:
            return None
        if m.event == "RTM_DELLINK":
            known = self._carrier.pop(m.ifindex, None) is not None
            if not known:
                return None
            return LinkRemoved(
                ts_ns=ts_ns, source=self.source, hook="netlink", ifname=m.ifname, ifindex=m.ifindex
            )
        prev = self._carrier.get(m.ifindex)
        self._carrier[m.ifindex] = m.carrier
        if prev is None or prev == m.carrier:
            return None
        if m.carrier:
            return CarrierUp(
                ts_ns=ts_ns,
                source=self.source,
                hook="netlink",
                ifname=m.ifname,
                ifindex=m.ifindex,
                operstate=m.operstate,
            )
        return CarrierDown(
            ts_ns=ts_ns,
            source=self.source,
            hook="netlink",
            ifname=m.ifname,
            ifindex=m.ifindex,
            operstate=m.operstate,
            certain=True,
        )


def _open_socket(netns: str | None) -> socket.socket:
    """A non-blocking rtnetlink socket bound to RTMGRP_LINK, created inside ``netns``."""
    result: list[socket.socket | BaseException] = []

    def make() -> None:
        try:
            if netns is not None:
                from pyroute2 import netns as nsmod

                nsmod.setns(netns, flags=0)  # this short-lived thread only; flags=0: never create
            s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK, 0)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            s.bind((0, RTMGRP_LINK))
            result.append(s)
        except BaseException as e:
            result.append(e)

    if netns is None:
        make()
    else:
        t = threading.Thread(target=make, name="rh-netlink-setns")
        t.start()
        t.join(10.0)
    if not result:
        raise NetlinkError(f"opening a netlink socket in netns {netns} timed out")
    r = result[0]
    if isinstance(r, BaseException):
        raise NetlinkError(f"netlink socket (netns {netns}): {r}") from r
    return r


def dump_links(netns: str | None) -> list[LinkMsg]:
    from pyroute2 import IPRoute

    with IPRoute(netns=netns) if netns else IPRoute() as ipr:
        return [lm for lm in (link_msg(m) for m in ipr.get_links()) if lm is not None]


class NetlinkSource:
    """Carrier up/down of netdevs from rtnetlink. ``ifnames`` limits the report (None = all)."""

    def __init__(
        self, ifnames: set[str] | None = None, netns: str | None = None, name: str = "netlink"
    ) -> None:
        self._name = name
        self.netns = netns
        self.tracker = LinkTracker(name, ifnames)
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._emit: Emit | None = None
        self.resyncs = 0

    @property
    def name(self) -> str:
        return self._name

    async def start(self, emit: Emit) -> list[Capability]:
        where = f"netns {self.netns}" if self.netns else "host"
        try:
            self._sock = _open_socket(self.netns)
            for m in await asyncio.to_thread(dump_links, self.netns):
                self.tracker.seed(m)
        except (NetlinkError, OSError) as e:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            reason = Reason.NO_PRIVILEGE if isinstance(e, PermissionError) else Reason.ERROR
            return [skipped(self.name, "rtnl_link", reason, str(e))]
        self._emit = emit
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._readable)
        return [attached(self.name, "rtnl_link", "netlink", where)]

    def _readable(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno == errno.ENOBUFS:
                    self._resync()
                    continue
                return
            ts = time.monotonic_ns()
            for m in parse(data):
                ev = self.tracker.update(m, ts)
                if ev is not None and self._emit is not None:
                    self._emit(ev)

    def _resync(self) -> None:
        """The socket overflowed: events were lost. Re-read every link and report differences."""
        self.resyncs += 1
        ts = time.monotonic_ns()
        for m in dump_links(self.netns):
            ev = self.tracker.update(m, ts)
            if ev is not None and self._emit is not None:
                self._emit(ev)

    async def stop(self) -> None:
        if self._sock is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
