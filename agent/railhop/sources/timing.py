"""Carrier-loss timing: which source reports a carrier loss first, and how long after the fault.

Used by the privileged test (tests/privileged/test_ebpf_carrier.py) and the benchmark
(bench/probe_bench.py). A :class:`Collector` is the sources' ``Emit``: it stamps every event with
the moment its source handed it over (``time.monotonic_ns()``) and keeps them in arrival order,
as the daemon's inbox would. :func:`carrier_cycles` injects a carrier loss and its heal
``cycles`` times through an ``inject(up) -> t0_ns`` callable (t0 taken just before the netlink
request that causes it) and records, per cycle, the injection time, the eBPF record's kernel
timestamp, when each source delivered its event, and which one arrived first. The summaries are
pure.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from railhop.sources.base import SourceError
from railhop.sources.events import CarrierDown, CarrierUp, Event


class TimingError(SourceError):
    """A cycle did not produce the events it must (a source stayed silent past the deadline)."""


@dataclass(frozen=True, slots=True)
class Stamped:
    seen_ns: int  # when the source emitted it (CLOCK_MONOTONIC)
    event: Event


class Collector:
    """An ``Emit`` for any thread; events are appended on ``loop`` in the order they arrive."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.events: list[Stamped] = []
        self._changed = asyncio.Event()

    def __call__(self, ev: Event) -> None:
        item = Stamped(time.monotonic_ns(), ev)
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._add(item)
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._add, item)

    def _add(self, item: Stamped) -> None:
        self.events.append(item)
        self._changed.set()

    async def wait(self, pred: Callable[[list[Stamped]], bool], timeout_s: float) -> bool:
        """Until ``pred(events)`` holds (True) or ``timeout_s`` passes (False)."""
        end = time.monotonic() + timeout_s
        while not pred(self.events):
            left = end - time.monotonic()
            if left <= 0:
                return False
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return pred(self.events)
        return True


@dataclass(frozen=True, slots=True)
class CarrierCycle:
    t0_ns: int  # injection: just before the netlink request that took the link down
    ebpf_ts_ns: int  # the eBPF record's kernel timestamp (bpf_ktime_get_ns)
    ebpf_seen_ns: int  # when the eBPF source emitted it
    netlink_seen_ns: int  # when the netlink source read its message (= its ts_ns)
    first: str  # source of the first carrier-down event that arrived
    ebpf_hook: str

    @property
    def ebpf_kernel_ms(self) -> float:
        return (self.ebpf_ts_ns - self.t0_ns) / 1e6

    @property
    def ebpf_seen_ms(self) -> float:
        return (self.ebpf_seen_ns - self.t0_ns) / 1e6

    @property
    def netlink_ms(self) -> float:
        return (self.netlink_seen_ns - self.t0_ns) / 1e6


def _downs(evs: Sequence[Stamped], source: str, nic: str) -> list[Stamped]:
    return [
        s
        for s in evs
        if isinstance(s.event, CarrierDown) and s.event.source == source and s.event.ifname == nic
    ]


async def carrier_cycles(
    inject: Callable[[bool], Awaitable[int]],
    col: Collector,
    *,
    ebpf: str,
    netlink: str,
    nic: str,
    cycles: int,
    dedup_window_ns: int,
    deadline_s: float = 5.0,
) -> list[CarrierCycle]:
    """``cycles`` x (inject a loss, wait for both sources' CarrierDown on ``nic``, heal, wait for
    netlink's CarrierUp, let the eBPF de-duplication window pass). Every wait has a deadline:
    a source that stays silent raises :class:`TimingError`."""
    out: list[CarrierCycle] = []
    for i in range(cycles):
        start = len(col.events)
        t0 = await inject(False)

        def both(evs: list[Stamped], start: int = start) -> bool:
            new = evs[start:]
            return bool(_downs(new, ebpf, nic)) and bool(_downs(new, netlink, nic))

        if not await col.wait(both, deadline_s):
            raise TimingError(
                f"cycle {i}: no carrier loss on {nic} from both {ebpf} and {netlink} within "
                f"{deadline_s} s: {[s.event for s in col.events[start:]]}"
            )
        new = col.events[start:]
        b, n = _downs(new, ebpf, nic)[0], _downs(new, netlink, nic)[0]
        first = next(s for s in new if s is b or s is n)
        out.append(
            CarrierCycle(
                t0_ns=t0,
                ebpf_ts_ns=b.event.ts_ns,
                ebpf_seen_ns=b.seen_ns,
                netlink_seen_ns=n.seen_ns,
                first=first.event.source,
                ebpf_hook=b.event.hook,
            )
        )
        mark = len(col.events)
        await inject(True)

        def up(evs: list[Stamped], mark: int = mark) -> bool:
            return any(
                isinstance(s.event, CarrierUp) and s.event.source == netlink for s in evs[mark:]
            )

        if not await col.wait(up, deadline_s):
            raise TimingError(f"cycle {i}: {nic} did not come back within {deadline_s} s")
        # the eBPF source drops repeats within its de-duplication window: let it pass
        end = b.event.ts_ns + 2 * dedup_window_ns
        while (left := end - time.monotonic_ns()) > 0:
            await asyncio.sleep(left / 1e9)
    return out


# ----------------------------------------------------------------------------------------------
# pure summaries


@dataclass(frozen=True, slots=True)
class Dist:
    n: int
    median: float
    p90: float
    max: float

    def fmt(self, unit: str = "ms") -> str:
        return f"median {self.median:.3f} p90 {self.p90:.3f} max {self.max:.3f} {unit}"


def quantile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (``q`` in [0, 1]) of a non-empty sequence."""
    if not xs:
        raise ValueError("quantile of an empty sequence")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q={q}: want [0, 1]")
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def dist(xs: Sequence[float]) -> Dist:
    return Dist(len(xs), quantile(xs, 0.5), quantile(xs, 0.9), max(xs))


@dataclass(frozen=True, slots=True)
class CarrierSummary:
    ebpf_kernel: Dist  # injection -> eBPF record's kernel timestamp
    ebpf_seen: Dist  # injection -> eBPF event emitted by the source
    netlink: Dist  # injection -> netlink event emitted by the source
    lead: Dist  # netlink seen - eBPF seen (positive: eBPF delivered first)
    ebpf_first: int  # cycles in which the eBPF event arrived first
    cycles: int


def summarize(cs: Sequence[CarrierCycle], ebpf: str) -> CarrierSummary:
    if not cs:
        raise ValueError("no cycles")
    return CarrierSummary(
        ebpf_kernel=dist([c.ebpf_kernel_ms for c in cs]),
        ebpf_seen=dist([c.ebpf_seen_ms for c in cs]),
        netlink=dist([c.netlink_ms for c in cs]),
        lead=dist([c.netlink_ms - c.ebpf_seen_ms for c in cs]),
        ebpf_first=sum(1 for c in cs if c.first == ebpf),
        cycles=len(cs),
    )
