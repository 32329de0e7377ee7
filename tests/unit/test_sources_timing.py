"""railhop.sources.timing: nearest-rank quantiles, per-cycle records and arrival order, with a
fake injection whose 'sources' emit from the loop and from another thread."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from railhop.sources.events import CarrierDown, CarrierUp
from railhop.sources.timing import (
    CarrierCycle,
    Collector,
    TimingError,
    carrier_cycles,
    dist,
    quantile,
    summarize,
)

MS = 1_000_000


def test_quantile_nearest_rank() -> None:
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert quantile(xs, 0.5) == 3.0
    assert quantile(xs, 0.9) == 5.0
    assert quantile(xs, 0.0) == 1.0
    assert quantile(list(range(1, 21)), 0.9) == 18
    d = dist([float(x) for x in range(1, 21)])
    assert (d.n, d.median, d.p90, d.max) == (20, 10.0, 18.0, 20.0)
    with pytest.raises(ValueError):
        quantile([], 0.5)
    with pytest.raises(ValueError):
        quantile([1.0], 1.5)


def test_summarize() -> None:
    cs = [
        CarrierCycle(0, 1 * MS, 2 * MS, 3 * MS, "ebpf.carrier", "raw_tp:qdisc_reset"),
        CarrierCycle(10 * MS, 11 * MS, 15 * MS, 14 * MS, "netlink", "raw_tp:qdisc_reset"),
        CarrierCycle(20 * MS, 22 * MS, 23 * MS, 26 * MS, "ebpf.carrier", "raw_tp:qdisc_reset"),
    ]
    s = summarize(cs, "ebpf.carrier")
    assert (s.cycles, s.ebpf_first) == (3, 2)
    assert (s.ebpf_kernel.median, s.ebpf_kernel.max) == (1.0, 2.0)
    assert (s.ebpf_seen.median, s.netlink.median) == (3.0, 4.0)
    assert sorted([s.lead.median, s.lead.max]) == [1.0, 3.0]
    with pytest.raises(ValueError):
        summarize([], "x")


def test_cycles_record_arrival_order_and_times() -> None:
    async def main() -> list[CarrierCycle]:
        loop = asyncio.get_running_loop()
        col = Collector(loop)
        n = [0]

        async def inject(up: bool) -> int:
            t0 = time.monotonic_ns()
            if up:
                col(CarrierUp(ts_ns=t0 + 1, source="netlink", ifname="nic0"))
                return t0
            n[0] += 1
            other = CarrierDown(ts_ns=t0, source="ebpf.carrier", ifname="nic9")  # not ours
            bpf = CarrierDown(ts_ns=t0 + 100, source="ebpf.carrier", ifname="nic0")
            nl = CarrierDown(ts_ns=t0 + 200, source="netlink", ifname="nic0")
            col(other)
            if n[0] == 2:  # cycle 2: netlink first, eBPF from a thread, later
                col(nl)
                th = threading.Thread(target=col, args=(bpf,))
                th.start()
                th.join()
            else:
                col(bpf)
                col(nl)
            return t0

        return await carrier_cycles(
            inject,
            col,
            ebpf="ebpf.carrier",
            netlink="netlink",
            nic="nic0",
            cycles=3,
            dedup_window_ns=MS,
        )

    cs = asyncio.run(main())
    assert [c.first for c in cs] == ["ebpf.carrier", "netlink", "ebpf.carrier"]
    for c in cs:
        assert c.ebpf_ts_ns == c.t0_ns + 100
        assert c.ebpf_seen_ns >= c.t0_ns and c.netlink_seen_ns >= c.t0_ns
    assert cs[1].ebpf_seen_ns >= cs[1].netlink_seen_ns
    assert cs[2].t0_ns >= cs[1].ebpf_ts_ns + 2 * MS  # the de-duplication window passed


def test_a_silent_source_fails_the_cycle_at_the_deadline() -> None:
    async def main() -> None:
        col = Collector(asyncio.get_running_loop())

        async def inject(up: bool) -> int:
            t0 = time.monotonic_ns()
            col(CarrierDown(ts_ns=t0, source="netlink", ifname="nic0"))
            return t0

        await carrier_cycles(
            inject,
            col,
            ebpf="ebpf.carrier",
            netlink="netlink",
            nic="nic0",
            cycles=1,
            dedup_window_ns=MS,
            deadline_s=0.05,
        )

    t = time.monotonic()
    with pytest.raises(TimingError, match="cycle 0"):
        asyncio.run(main())
    assert time.monotonic() - t < 2.0
