"""Carrier loss on a veth is seen by the eBPF carrier source before the netlink source.

Topology (own namespaces, removed afterwards): netns ``node`` holds NIC ``rhn<pid>``; its veth
peer ``rhp<pid>`` is a port of bridge ``rhb<pid>`` in netns ``spine``. The fault is the remote
end going down (the switch port), so the node's NIC loses carrier without any admin change.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from conftest import require

pyroute2 = pytest.importorskip("pyroute2")

from railhop.sources import kernel  # noqa: E402
from railhop.sources.base import Capability, Registry, queue_emitter  # noqa: E402
from railhop.sources.ebpf import CarrierSource  # noqa: E402
from railhop.sources.events import CarrierDown, CarrierUp, Event  # noqa: E402
from railhop.sources.netlink import NetlinkSource  # noqa: E402

pytestmark = pytest.mark.privileged

CYCLES = int(os.environ.get("RAILHOP_CARRIER_CYCLES", "5"))


@dataclass(frozen=True)
class Topo:
    node: str
    spine: str
    nic: str
    port: str


@pytest.fixture
def topo() -> Iterator[Topo]:
    from pyroute2 import IPRoute, netns

    tag = os.getpid() % 100000
    t = Topo(f"rhcn{tag}", f"rhcs{tag}", f"rhn{tag}", f"rhp{tag}")
    for ns in (t.node, t.spine):
        if ns in netns.listnetns():
            netns.remove(ns)
        netns.create(ns)
    try:
        with IPRoute() as ipr:
            ipr.link(
                "add", ifname=t.nic, kind="veth", peer={"ifname": t.port, "net_ns_fd": t.spine}
            )
            ipr.link("set", index=ipr.link_lookup(ifname=t.nic)[0], net_ns_fd=t.node)
        with IPRoute(netns=t.spine) as sp:
            sp.link("add", ifname=f"rhb{tag}", kind="bridge")
            br = sp.link_lookup(ifname=f"rhb{tag}")[0]
            sp.link("set", index=br, state="up")
            p = sp.link_lookup(ifname=t.port)[0]
            sp.link("set", index=p, master=br, state="up")
        with IPRoute(netns=t.node) as nd:
            nd.link("set", index=nd.link_lookup(ifname=t.nic)[0], state="up")
        yield t
    finally:
        for ns in (t.node, t.spine):
            if ns in netns.listnetns():
                netns.remove(ns)


class Injector:
    """Flips the spine-side port from one worker thread holding one open netlink handle, so the
    injection time ``t0`` is taken right before the single netlink request."""

    def __init__(self, t: Topo) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rh-inject")
        self._t = t
        self._ipr: Any = None
        self._index = 0

    def _open(self) -> None:
        from pyroute2 import IPRoute

        self._ipr = IPRoute(netns=self._t.spine)
        self._index = self._ipr.link_lookup(ifname=self._t.port)[0]

    def _set(self, up: bool) -> int:
        if self._ipr is None:
            self._open()
        t0 = time.monotonic_ns()
        self._ipr.link("set", index=self._index, state="up" if up else "down")
        return t0

    async def set(self, up: bool) -> int:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._set, up)

    def close(self) -> None:
        def _close() -> None:
            if self._ipr is not None:
                self._ipr.close()

        self._pool.submit(_close).result(10)
        self._pool.shutdown()


async def _wait(
    q: asyncio.Queue[Event], seen: list[Event], pred: object, deadline_s: float
) -> list[Event]:
    """Collect events until ``pred(seen)`` holds or the deadline passes."""
    assert callable(pred)
    end = time.monotonic() + deadline_s
    while not pred(seen):
        left = end - time.monotonic()
        if left <= 0:
            break
        try:
            seen.append(await asyncio.wait_for(q.get(), left))
        except TimeoutError:
            break
    return seen


def _downs(evs: list[Event], source: str, nic: str) -> list[CarrierDown]:
    return [e for e in evs if isinstance(e, CarrierDown) and e.source == source and e.ifname == nic]


async def _run(
    t: Topo, allow: frozenset[str] | None
) -> tuple[list[Capability], list[float], list[float]]:
    q: asyncio.Queue[Event] = asyncio.Queue()
    emit = queue_emitter(asyncio.get_running_loop(), q)
    carrier = CarrierSource(ifnames={t.nic}, allow=allow, netns=t.node)
    node_ino = kernel.netns_inode(t.node)
    nl = NetlinkSource(ifnames={t.nic}, netns=t.node)
    reg = Registry([carrier, nl])
    caps = await reg.start_all(emit)
    bpf_ms: list[float] = []
    nl_ms: list[float] = []
    inj = Injector(t)
    await inj.set(True)  # opens the handle outside the measured region
    try:
        require(
            all(c.attached for c in caps), f"sources did not attach: {[c.line() for c in caps]}"
        )
        for _ in range(CYCLES):
            seen: list[Event] = []
            t0 = await inj.set(False)
            await _wait(
                q,
                seen,
                lambda s: _downs(s, carrier.name, t.nic) and _downs(s, nl.name, t.nic),
                5.0,
            )
            b = _downs(seen, carrier.name, t.nic)
            n = _downs(seen, nl.name, t.nic)
            assert b, f"eBPF saw no carrier loss on {t.nic}: {seen}"
            assert n, f"netlink saw no carrier loss on {t.nic}: {seen}"
            assert b[0].ts_ns < n[0].ts_ns, (b[0], n[0])
            assert b[0].ts_ns >= t0
            # tracepoint proxies cannot see the netns; the other hooks name it
            assert b[0].netns_ino in ((0,) if b[0].hook.startswith("tp:") else (node_ino,))
            bpf_ms.append((b[0].ts_ns - t0) / 1e6)
            nl_ms.append((n[0].ts_ns - t0) / 1e6)
            # heal, and let the proxy's de-duplication window pass before the next cycle
            up: list[Event] = []
            await inj.set(True)
            await _wait(
                q,
                up,
                lambda s: any(isinstance(e, CarrierUp) and e.source == nl.name for e in s),
                5.0,
            )
            assert any(isinstance(e, CarrierUp) for e in up), up
            end = b[0].ts_ns + 2 * carrier.dedup_window_ns
            while time.monotonic_ns() < end:
                await asyncio.sleep(0.005)
    finally:
        inj.close()
        await reg.stop_all()
    return caps, bpf_ms, nl_ms


@pytest.mark.parametrize("allow", [None, frozenset({"tp"})], ids=["best", "tracepoint"])
def test_carrier_loss_seen_by_ebpf_before_netlink(topo: Topo, allow: frozenset[str] | None) -> None:
    caps, bpf_ms, nl_ms = asyncio.run(_run(topo, allow))
    mech = next(c.mechanism for c in caps if c.source == "ebpf.carrier")
    print(
        f"\ncarrier loss via {mech}: eBPF median {statistics.median(bpf_ms):.3f} ms "
        f"(max {max(bpf_ms):.3f}), netlink median {statistics.median(nl_ms):.3f} ms "
        f"(max {max(nl_ms):.3f}) after injection, eBPF ahead by median "
        f"{statistics.median(n - b for b, n in zip(bpf_ms, nl_ms, strict=True)):.3f} ms, "
        f"{len(bpf_ms)} cycles"
    )
    assert len(bpf_ms) == CYCLES
    # generous bound (2 shared cores): the target is <= 5 ms, measured numbers are printed
    assert statistics.median(bpf_ms) < 100.0
