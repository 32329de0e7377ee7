"""Fault scenarios on the emulated fabric: a timed list of fault actions (:class:`Step`) applied
while the harness moves checked traffic, the bandwidth :class:`Timeline` it records, and its
analysis per fault (pure functions of a timeline). Shared by ``railhop demo`` and the bench
scripts (``bench/failover_timeline.py``, ``bench/agent_bench.py``).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from railhop_lab.fabric import CounterSampler, Fabric, NicCounters
from railhop_lab.harness import (
    HarnessConfig,
    HarnessResult,
    HarnessRun,
    Progress,
    longest_stall,
    wait_for_bytes,
    window_rate,
)

MiB = 1 << 20


class DemoError(Exception):
    """Base error of the demo / scenario runner."""


# ---------------------------------------------------------------------------------------------
# Scenario: a timed list of fault actions applied while the harness runs


@dataclass(frozen=True)
class Step:
    at: float  # scenario seconds (0 = traffic is flowing on every connection)
    action: str  # blackhole | carrier | carrier_remote | flap | heal | heal_all
    node: int = 0
    nic: int = 0
    label: str = ""

    def apply(self, fab: Fabric) -> None:
        if self.action == "blackhole":
            fab.blackhole(self.node, self.nic)
        elif self.action == "carrier":
            fab.carrier_down(self.node, self.nic, end="local")
        elif self.action == "carrier_remote":
            fab.carrier_down(self.node, self.nic, end="remote")
        elif self.action == "flap":
            fab.flap(self.node, self.nic, hz=5, duration=2.0)
        elif self.action == "heal":
            fab.heal(self.node, self.nic)
        elif self.action == "heal_all":
            fab.heal_all()
        else:
            raise DemoError(f"unknown action {self.action!r}")

    @property
    def is_fault(self) -> bool:
        return self.action not in ("heal", "heal_all")


@dataclass
class Timeline:
    """Everything recorded during a scenario. Times are scenario seconds unless noted."""

    nics: int
    conns: int
    t0_mono: float  # time.monotonic() of scenario second 0
    harness_t0: float  # harness clock value at scenario second 0
    progress: list[Progress]  # receiver's progress lines
    samples: list[tuple[float, dict[tuple[int, int], NicCounters]]]  # (scenario s, counters)
    events: list[tuple[float, Step]]  # (scenario s when applied, step)
    result: HarnessResult
    end: float  # scenario second when the traffic ended
    t0_wall_ns: int = 0  # time.time_ns() at scenario second 0 (to place agent traces)

    def wall_ns(self, t: float) -> int:
        """Scenario seconds -> wall clock (ns since the epoch)."""
        return self.t0_wall_ns + int(t * 1e9)

    def h(self, t: float) -> float:
        """Scenario seconds -> harness clock."""
        return t + self.harness_t0

    def rate(self, t0: float, t1: float, conn: int | None = None) -> float | None:
        """Receiver goodput (bytes/s) between scenario times; None if the window is too short."""
        return window_rate(self.progress, self.h(t0), self.h(t1), conn)

    def nic_rate(self, node: int, nic: int, t0: float, t1: float) -> float:
        inside = [(t, c[(node, nic)]) for t, c in self.samples if t0 <= t <= t1]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return 0.0
        (ta, ca), (tb, cb) = inside[0], inside[-1]
        return (cb.tx_bytes - ca.tx_bytes) / (tb - ta)

    def nic_bins(self, node: int = 0, width: float = 0.1) -> list[tuple[float, list[float]]]:
        """(scenario t, [bytes/s sent by each NIC of ``node`` in the bin ending at t]), t >= 0.

        Counters are interpolated at fixed bin edges, so irregular sampling (a busy machine)
        moves bytes between neighbouring bins but never invents or loses any.
        """
        pts = [(t, c) for t, c in self.samples if all((node, i) in c for i in range(self.nics))]
        if len(pts) < 2 or width <= 0:
            return []
        times = [t for t, _ in pts]

        def at(t: float, i: int) -> float:
            k = bisect.bisect_left(times, t)
            if k <= 0:
                return float(pts[0][1][(node, i)].tx_bytes)
            if k >= len(pts):
                return float(pts[-1][1][(node, i)].tx_bytes)
            (ta, ca), (tb, cb) = pts[k - 1], pts[k]
            a, b = ca[(node, i)].tx_bytes, cb[(node, i)].tx_bytes
            return a + (b - a) * (t - ta) / (tb - ta) if tb > ta else float(b)

        out = []
        t = max(0.0, times[0])
        while t + width <= times[-1] + 1e-9:
            out.append(
                (t + width, [(at(t + width, i) - at(t, i)) / width for i in range(self.nics)])
            )
            t += width
        return out


Tick = Callable[[float, Timeline | None, list[float], str], None]


def run_scenario(
    fab: Fabric,
    steps: Sequence[Step],
    duration: float,
    *,
    conns: int | None = None,
    size: int = 4 * MiB,
    env: dict[str, str] | None = None,
    on_tick: Tick | None = None,
    warmup_timeout: float = 30.0,
    workdir: Path | None = None,
) -> Timeline:
    """Run harness traffic node 0 -> node 1 and apply ``steps`` at their times (bounded).

    ``workdir``: the harness's directory (node n's processes get ``workdir/run-node<n>`` as
    ``RAILHOP_RUN_DIR``: start an agent there first to have the plugin use it)."""
    nics = fab.nics
    conns = conns or nics
    # the harness starts its clock before connections are up: give it room for the warm-up
    cfg = HarnessConfig(
        conns=conns,
        sizes=(size, 64 * 1024, size // 2 + 3),
        duration=duration + 4.0,
        deadline=duration + warmup_timeout + 40.0,
        seed=int(time.time()) % 1000,
    )
    events: list[tuple[float, Step]] = []
    with (
        CounterSampler(fab, interval=0.1, max_s=duration + 120) as samp,
        HarnessRun(fab, cfg, env=env, workdir=workdir) as run,
    ):
        wait_for_bytes(run, 4 * MiB, timeout=warmup_timeout)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            prog = run.sides["recv"].progress
            if prog and len(prog[-1].per_conn) == conns and min(prog[-1].per_conn) > 0:
                break
            time.sleep(0.05)
        # scenario second 0: traffic flows on every connection, and at least 1.5 s in
        t0 = max(time.monotonic(), run.started_at + 1.5)
        time.sleep(max(0.0, t0 - time.monotonic()))
        t0_wall_ns = time.time_ns() - int((time.monotonic() - t0) * 1e9)
        harness_t0 = t0 - run.started_at
        pending = sorted(steps, key=lambda s: s.at)
        phase = "healthy"
        while True:
            now = time.monotonic() - t0
            while pending and pending[0].at <= now:
                st = pending.pop(0)
                t_applied = time.monotonic() - t0  # the fault starts during apply()
                st.apply(fab)
                events.append((t_applied, st))
                phase = st.label or st.action
            if on_tick is not None:
                on_tick(now, None, _last_nic_rates(samp, nics), phase)
            if not run.running() or now >= duration + 8.0:
                break
            if not pending and now >= duration:
                break
            time.sleep(0.1)
        fab.heal_all()
        result = run.wait()
    samples = [(t - t0, c) for t, c in samp.samples]
    prog = result.recv.progress
    end = (prog[-1].t - harness_t0) if prog else 0.0
    return Timeline(
        nics=nics,
        conns=conns,
        t0_mono=t0,
        harness_t0=harness_t0,
        progress=prog,
        samples=samples,
        events=events,
        result=result,
        end=end,
        t0_wall_ns=t0_wall_ns,
    )


def _last_nic_rates(samp: CounterSampler, nics: int, node: int = 0) -> list[float]:
    s = samp.samples[-4:]
    if len(s) < 2 or s[-1][0] <= s[0][0]:
        return [0.0] * nics
    (ta, ca), (tb, cb) = s[0], s[-1]
    return [(cb[(node, i)].tx_bytes - ca[(node, i)].tx_bytes) / (tb - ta) for i in range(nics)]


# ---------------------------------------------------------------------------------------------
# Analysis (pure functions of a Timeline)


@dataclass
class FaultReport:
    label: str
    action: str
    node: int
    nic: int
    at: float
    healed_at: float | None
    resume_s: float  # longest stall of the connections on the faulted NIC after the fault
    normal_gap_s: float  # longest stall of the same connections while healthy (reference)
    before: float | None  # share of healthy bandwidth just before the fault
    during: float | None  # share of healthy while the fault holds (after resuming)
    after: float | None  # share of healthy after heal and fail-back
    failback_s: float | None  # heal -> the NIC carries its share again
    expected_during: float  # share expected with the NICs down at that time, e.g. 3/4
    details: dict[str, float] = field(default_factory=dict)

    @property
    def extra_s(self) -> float:
        """Extra time of the step hit by the fault (beyond a normal gap between progress)."""
        return max(0.0, self.resume_s - self.normal_gap_s)


def healthy_rate(tl: Timeline) -> float | None:
    """Goodput before the first fault (up to 3 s of it)."""
    first = min((t for t, s in tl.events if s.is_fault), default=tl.end)
    return tl.rate(max(0.0, first - 3.0), first - 0.05)


def _share(x: float | None, ref: float | None) -> float | None:
    return None if x is None or not ref else x / ref


def fault_report(tl: Timeline, index: int, settle: float = 0.3) -> FaultReport:
    """Report on the ``index``-th fault event of the timeline."""
    faults = [(t, s) for t, s in tl.events if s.is_fault]
    t_f, st = faults[index]
    healthy = healthy_rate(tl)
    later = [t for t, s in tl.events if t > t_f]
    healed_at = next(
        (
            t
            for t, s in tl.events
            if t > t_f
            and (
                s.action == "heal_all"
                or (s.action == "heal" and (s.node, s.nic) == (st.node, st.nic))
            )
        ),
        None,
    )
    nxt = min(later) if later else tl.end
    hit = [c for c in range(tl.conns) if c % tl.nics == st.nic]
    first_fault = faults[0][0]
    normal = max(
        (
            longest_stall(tl.progress, tl.h(max(0.0, first_fault - 3.0)), tl.h(first_fault), c)
            for c in hit
        ),
        default=0.0,
    )
    resume = max((longest_stall(tl.progress, tl.h(t_f), tl.h(nxt), c) for c in hit), default=0.0)
    before = _share(tl.rate(max(0.0, t_f - 2.0), t_f - 0.05), healthy)
    during = _share(tl.rate(t_f + resume + settle, nxt - 0.05), healthy)
    down_now = {(s.node, s.nic) for t, s in tl.events if s.is_fault and t <= t_f}
    healed = {(s.node, s.nic) for t, s in tl.events if s.action == "heal" and t <= t_f}
    rails_down = len({nic for _, nic in down_now - healed})
    expected = (tl.nics - rails_down) / tl.nics
    after: float | None = None
    failback: float | None = None
    if healed_at is not None:
        per_nic_healthy = tl.nic_rate(st.node, st.nic, max(0.0, first_fault - 3.0), first_fault)
        failback = _failback_time(tl, st.node, st.nic, healed_at, 0.5 * per_nic_healthy)
        if failback is not None:
            a0 = healed_at + failback + 0.5
            after_end = min([t for t in later if t > a0] + [tl.end - 0.1])
            if after_end - a0 >= 0.5:
                after = _share(tl.rate(a0, after_end), healthy)
    return FaultReport(
        label=st.label or f"{st.action} node{st.node} nic{st.nic}",
        action=st.action,
        node=st.node,
        nic=st.nic,
        at=t_f,
        healed_at=healed_at,
        resume_s=resume,
        normal_gap_s=normal,
        before=before,
        during=during,
        after=after,
        failback_s=failback,
        expected_during=expected,
        details={"healthy_Bps": healthy or 0.0},
    )


def _failback_time(
    tl: Timeline, node: int, nic: int, t_heal: float, threshold: float
) -> float | None:
    """Heal -> the end of the first 0.3 s window in which the NIC sent >= threshold bytes/s."""
    ts = [t for t, _ in tl.samples if t >= t_heal]
    for t in ts:
        if tl.nic_rate(node, nic, t, t + 0.3) >= threshold > 0:
            return t + 0.3 - t_heal
    return None
