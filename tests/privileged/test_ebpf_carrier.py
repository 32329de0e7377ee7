"""Carrier loss on a fabric NIC: the eBPF source's kernel timestamp lies between the injection
and netlink's message, at both ends.

The emulated fabric (railhop_lab.fabric, one node, one NIC) injects the loss the two ways the
benchmarks do: ``remote`` (the spine-side peer goes down: the NIC loses carrier, linkwatch runs
dev_deactivate -> qdisc_reset) and ``local`` (the NIC itself is set down: dev_close runs
qdisc_reset before the RTM_NEWLINK). Both sources run in this process on one asyncio loop, as in
the daemon; every cycle records the injection time t0 (CLOCK_MONOTONIC, just before the netlink
request), the eBPF record's kernel timestamp (``bpf_ktime_get_ns``, CLOCK_MONOTONIC too) and when
each source delivered its event (railhop.sources.timing).

What is asserted is causal, not a race: the kernel runs qdisc_reset (where the eBPF hook stamps
the event) before it sends the RTM_NEWLINK that netlink reads, so t0 <= eBPF kernel ts <= netlink
read time in every cycle, and the eBPF ts lies within a bound of t0. Which event reaches the loop
first (a ~0.5 ms race) is printed, as the benchmark (bench/probe_bench.py) reports it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import require
from railhop.sources.base import Registry
from railhop.sources.ebpf.carrier import CarrierSource
from railhop.sources.netlink import NetlinkSource
from railhop.sources.timing import CarrierCycle, Collector, carrier_cycles, summarize
from railhop_lab.fabric import End, Fabric, unique_prefix

pytestmark = pytest.mark.privileged

CYCLES = int(os.environ.get("RAILHOP_CARRIER_CYCLES", "20"))
NIC = "nic0"


@pytest.fixture(scope="module")
def fab() -> Iterator[Fabric]:
    with Fabric(nodes=1, nics=1, prefix=unique_prefix("rhce")) as f:
        yield f


async def _measure(
    fab: Fabric, allow: frozenset[str] | None
) -> tuple[str, dict[str, list[CarrierCycle]], CarrierSource]:
    loop = asyncio.get_running_loop()
    col = Collector(loop)
    node = fab.netns(0)
    carrier = CarrierSource(ifnames={NIC}, allow=allow, netns=node)
    nl = NetlinkSource(ifnames={NIC}, netns=node)
    reg = Registry([carrier, nl])
    caps = await reg.start_all(col)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rh-inject")
    out: dict[str, list[CarrierCycle]] = {}
    try:
        require(all(c.attached for c in caps), f"not attached: {[c.line() for c in caps]}")
        assert carrier.delivery == "loop"  # records are read on the loop, next to netlink's fd
        ends: tuple[End, ...] = ("remote", "local")
        for end in ends:

            def flip(up: bool, end: End = end) -> int:
                t0 = time.monotonic_ns()
                if up:
                    fab.heal(0, 0)
                else:
                    fab.carrier_down(0, 0, end=end)
                return t0

            async def inject(up: bool, flip: object = flip) -> int:
                assert callable(flip)
                t0: int = await loop.run_in_executor(pool, flip, up)
                return t0

            out[end] = await carrier_cycles(
                inject,
                col,
                ebpf=carrier.name,
                netlink=nl.name,
                nic=NIC,
                cycles=CYCLES,
                dedup_window_ns=carrier.dedup_window_ns,
            )
        mech = next(c.mechanism for c in caps if c.source == carrier.name)
    finally:
        pool.shutdown()
        await reg.stop_all()
    return mech, out, carrier


# linkwatch handles a carrier change at most 1 s (HZ) later (its batching; veth's is urgent)
KERNEL_BOUND_NS = 1_000_000_000


@pytest.mark.parametrize("allow", [None, frozenset({"tp"})], ids=["best", "tracepoint"])
def test_carrier_loss_ebpf_kernel_timestamp_precedes_netlink(
    fab: Fabric, allow: frozenset[str] | None
) -> None:
    try:
        mech, runs, carrier = asyncio.run(_measure(fab, allow))
    finally:
        fab.heal_all()  # pyroute2's sync API runs its own loop: not inside the test's
    for end, cs in runs.items():
        s = summarize(cs, carrier.name)
        print(
            f"\n{mech}, {end} end, {s.cycles} cycles: eBPF first in {s.ebpf_first}/{s.cycles}"
            f"\n  eBPF kernel ts - t0   {s.ebpf_kernel.fmt()}"
            f"\n  eBPF delivered - t0   {s.ebpf_seen.fmt()}"
            f"\n  netlink delivered - t0 {s.netlink.fmt()}"
            f"\n  netlink - eBPF         {s.lead.fmt()}"
        )
        assert s.cycles == CYCLES
        for c in cs:
            # the kernel stamped it through eBPF after the injection, within linkwatch's bound,
            # and before netlink's message could be read (qdisc_reset precedes the RTM_NEWLINK)
            assert c.t0_ns <= c.ebpf_ts_ns <= c.t0_ns + KERNEL_BOUND_NS, (end, c)
            assert c.ebpf_ts_ns <= c.netlink_seen_ns, (end, c)
            # each source delivered its own event after the kernel's change
            assert c.ebpf_ts_ns <= c.ebpf_seen_ns, (end, c)
            assert c.t0_ns <= c.netlink_seen_ns, (end, c)
        # target <= 5 ms (kernel timestamp); generous bound on delivery for 2 shared cores
        assert s.ebpf_kernel.median <= 5.0, (end, s.ebpf_kernel)
        assert s.ebpf_seen.median <= 20.0, (end, s.ebpf_seen)
    hooks = {c.ebpf_hook for cs in runs.values() for c in cs}
    if mech.startswith("raw_tp"):
        assert hooks == {"raw_tp:qdisc_reset"}, hooks
    else:
        assert hooks == {"tp:qdisc_reset"}, hooks
