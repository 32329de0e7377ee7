"""The netlink source reports carrier transitions of links in a netns, and link removal."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import pytest

from railhop.sources.base import queue_emitter
from railhop.sources.events import CarrierDown, CarrierUp, Event, LinkRemoved
from railhop.sources.netlink import NetlinkSource

pytestmark = pytest.mark.privileged


@pytest.fixture
def veth_ns() -> Iterator[tuple[str, str, str]]:
    """netns with a veth pair a<->b, both up."""
    from pyroute2 import IPRoute, netns

    tag = os.getpid() % 100000
    ns, a, b = f"rhnl{tag}", f"rhla{tag}", f"rhlb{tag}"
    if ns in netns.listnetns():
        netns.remove(ns)
    netns.create(ns)
    try:
        with IPRoute(netns=ns) as ip:
            ip.link("add", ifname=a, kind="veth", peer=b)
            for n in (a, b):
                ip.link("set", index=ip.link_lookup(ifname=n)[0], state="up")
        yield ns, a, b
    finally:
        if ns in netns.listnetns():
            netns.remove(ns)


def _ip(ns: str, op: str, name: str, **kw: object) -> None:
    from pyroute2 import IPRoute

    with IPRoute(netns=ns) as ip:
        ip.link(op, index=ip.link_lookup(ifname=name)[0], **kw)


async def _next(q: asyncio.Queue[Event], deadline_s: float = 5.0) -> Event:
    return await asyncio.wait_for(q.get(), deadline_s)


async def _run(ns: str, a: str, b: str) -> None:
    q: asyncio.Queue[Event] = asyncio.Queue()
    src = NetlinkSource(ifnames={a}, netns=ns)
    caps = await src.start(queue_emitter(asyncio.get_running_loop(), q))
    try:
        assert [c.attached for c in caps] == [True], caps
        assert src.tracker.carrier(0) is None
        t0 = time.monotonic_ns()
        await asyncio.to_thread(_ip, ns, "set", b, state="down")  # peer down: a loses carrier
        ev = await _next(q)
        assert isinstance(ev, CarrierDown), ev
        assert (ev.ifname, ev.source, ev.hook, ev.certain) == (a, "netlink", "netlink", True)
        assert ev.operstate == "LOWERLAYERDOWN"
        assert ev.ifindex > 0
        assert ev.ts_ns > t0
        await asyncio.to_thread(_ip, ns, "set", b, state="up")
        ev = await _next(q)
        assert isinstance(ev, CarrierUp), ev
        assert (ev.ifname, ev.operstate) == (a, "UP")
        await asyncio.to_thread(_ip, ns, "del", a)
        gone = [await _next(q)]
        while not isinstance(gone[-1], LinkRemoved):
            gone.append(await _next(q))
        # deleting an up veth first takes it down, then removes it
        assert [type(e) for e in gone] in ([LinkRemoved], [CarrierDown, LinkRemoved]), gone
        assert all(getattr(e, "ifname", "") == a for e in gone)
        assert q.empty()  # b was never reported: not in ifnames
    finally:
        await src.stop()


def test_netlink_carrier_transitions_in_netns(veth_ns: tuple[str, str, str]) -> None:
    asyncio.run(_run(*veth_ns))


def test_netlink_missing_netns_is_skipped() -> None:
    async def run() -> None:
        src = NetlinkSource(netns="rh-no-such-netns")
        caps = await src.start(lambda _e: None)
        assert len(caps) == 1 and not caps[0].attached
        assert "rh-no-such-netns" in caps[0].detail
        await src.stop()

    asyncio.run(run())
