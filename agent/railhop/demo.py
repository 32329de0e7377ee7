"""``railhop demo``: plugin traffic across the emulated fabric through a walk of NIC faults.

Builds the two-node, four-NIC fabric with a ``tbf`` ceiling per NIC, runs the harness (node 0
sends to node 1, every byte checked) and walks: healthy -> silent blackhole on one NIC ->
carrier loss on a second -> heal both. A live line shows the bandwidth per NIC; at the end a
table gives, per fault, the time to resume, bandwidth before/during/after as a share of healthy,
the fail-back time, the bytes checked and errors. Results go to ``results.json`` and a PNG
timeline (``timeline.png``: bandwidth per NIC, faults marked) in the output directory.

The scenario machinery (``run_scenario``, ``fault_report``) is shared with
``bench/failover_timeline.py``.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import struct
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from railhop import paths
from railhop.fabric import CounterSampler, Fabric, FabricError, NicCounters, unique_prefix
from railhop.harness import (
    HarnessConfig,
    HarnessError,
    HarnessResult,
    HarnessRun,
    Progress,
    longest_stall,
    use_source_tree_build,
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
) -> Timeline:
    """Run harness traffic node 0 -> node 1 and apply ``steps`` at their times (bounded)."""
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
        HarnessRun(fab, cfg, env=env) as run,
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
        harness_t0 = t0 - run.started_at
        pending = sorted(steps, key=lambda s: s.at)
        phase = "healthy"
        while True:
            now = time.monotonic() - t0
            while pending and pending[0].at <= now:
                st = pending.pop(0)
                st.apply(fab)
                events.append((time.monotonic() - t0, st))
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


# ---------------------------------------------------------------------------------------------
# PNG timeline (tiny encoder: no plotting dependency)

_FONT = {  # 3x5 glyphs, rows top to bottom, 3 bits each
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111",
    "3": "111001111001111", "4": "101101111001001", "5": "111100111001111",
    "6": "111100111101111", "7": "111001010010010", "8": "111101111101111",
    "9": "111101111001111", "a": "000011101101011", "b": "100110101101110",
    "c": "000011100100011", "d": "001011101101011", "e": "000111111100011",
    "f": "011100110100100", "g": "011101011001110", "h": "100110101101101",
    "i": "010000010010010", "k": "100101110101101", "l": "110010010010111",
    "m": "000111111101101", "n": "000110101101101", "o": "000010101101010",
    "p": "000110101110100", "r": "000011100100100", "s": "000011110011110",
    "t": "010111010010011", "u": "000101101101011", "v": "000101101101010",
    "w": "000101101111111", "x": "000101010101101", "y": "000101011001110",
    "/": "001001010100100", ".": "000000000000010", ":": "000010000010000",
    "-": "000000111000000", " ": "000000000000000", "%": "101001010100101",
}  # fmt: skip

_COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
           (140, 86, 75), (227, 119, 194), (127, 127, 127)]  # fmt: skip


class _Canvas:
    def __init__(self, w: int, h: int) -> None:
        self.w, self.h = w, h
        self.px = bytearray(b"\xff" * (w * h * 3))

    def dot(self, x: int, y: int, c: tuple[int, int, int]) -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            i = (y * self.w + x) * 3
            self.px[i : i + 3] = bytes(c)

    def line(
        self, x0: int, y0: int, x1: int, y1: int, c: tuple[int, int, int], *, w: int = 1
    ) -> None:
        n = max(abs(x1 - x0), abs(y1 - y0), 1)
        for k in range(n + 1):
            x = x0 + (x1 - x0) * k // n
            y = y0 + (y1 - y0) * k // n
            for dx in range(w):
                for dy in range(w):
                    self.dot(x + dx, y + dy, c)

    def rect(self, x0: int, y0: int, x1: int, y1: int, c: tuple[int, int, int]) -> None:
        for y in range(y0, y1):
            for x in range(x0, x1):
                self.dot(x, y, c)

    def text(self, x: int, y: int, s: str, c: tuple[int, int, int] = (0, 0, 0), k: int = 2) -> None:
        for ch in s.lower():
            g = _FONT.get(ch, _FONT[" "])
            for r in range(5):
                for col in range(3):
                    if g[r * 3 + col] == "1":
                        self.rect(x + col * k, y + r * k, x + (col + 1) * k, y + (r + 1) * k, c)
            x += 4 * k

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.px[y * self.w * 3 : (y + 1) * self.w * 3]) for y in range(self.h)
        )

        def chunk(tag: bytes, data: bytes) -> bytes:
            body = tag + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        ihdr = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(raw, 6))
            + chunk(b"IEND", b"")
        )


def render_timeline_png(
    bins: Sequence[tuple[float, Sequence[float]]],
    marks: Sequence[tuple[float, str]],
    title: str = "",
    width: int = 1000,
    height: int = 420,
) -> bytes:
    """Bandwidth per NIC (Mbit/s) over time with vertical marks; returns PNG bytes."""
    cv = _Canvas(width, height)
    left, right, top, bottom = 70, width - 20, 40, height - 50
    t_max = max((t for t, _ in bins), default=1.0) or 1.0
    y_max = max((v * 8 / 1e6 for _, vals in bins for v in vals), default=1.0) * 1.1 or 1.0
    grey, black = (200, 200, 200), (0, 0, 0)

    def xy(t: float, mbit: float) -> tuple[int, int]:
        x = left + int((right - left) * t / t_max)
        y = bottom - int((bottom - top) * min(mbit, y_max) / y_max)
        return x, y

    for k in range(6):  # grid and y labels
        v = y_max * k / 5
        _, y = xy(0, v)
        cv.line(left, y, right, y, grey)
        cv.text(5, y - 5, f"{v:.0f}")
    step = max(1, int(t_max / 10))
    for s in range(0, int(t_max) + 1, step):
        x, _ = xy(s, 0)
        cv.line(x, bottom, x, bottom + 5, black)
        cv.text(x - 4, bottom + 10, str(s))
    cv.line(left, top, left, bottom, black)
    cv.line(left, bottom, right, bottom, black)
    cv.text(right - 60, bottom + 30, "time s")
    cv.text(5, 15, "mbit/s")
    cv.text(left + 10, 10, title[:100])
    for t, label in marks:
        x, _ = xy(t, 0)
        cv.line(x, top, x, bottom, (120, 120, 120))
        cv.text(x + 3, top + 2 + 12 * (marks.index((t, label)) % 3), label[:30], (90, 90, 90))
    nics = len(bins[0][1]) if bins else 0
    for i in range(nics):
        c = _COLORS[i % len(_COLORS)]
        pts = [xy(t, vals[i] * 8 / 1e6) for t, vals in bins]
        for (x0, y0), (x1, y1) in itertools.pairwise(pts):
            cv.line(x0, y0, x1, y1, c, w=2)
        lx = right - 90
        ly = top + 10 + 14 * i
        cv.rect(lx, ly, lx + 12, ly + 10, c)
        cv.text(lx + 16, ly, f"nic{i}")
    return cv.png()


# ---------------------------------------------------------------------------------------------
# The demo


def demo_steps(quick: bool = False) -> tuple[list[Step], float]:
    """healthy -> blackhole nic1 -> carrier loss nic2 -> heal both (scenario seconds)."""
    p = 3.0 if quick else 5.0
    steps = [
        Step(p, "blackhole", 0, 1, "blackhole nic1"),
        Step(2 * p, "carrier", 0, 2, "carrier loss nic2"),
        Step(3 * p, "heal", 0, 1, "heal nic1"),
        Step(3 * p, "heal", 0, 2, "heal nic2"),
    ]
    return steps, 4 * p + 1.0


def root_problem() -> str | None:
    if os.geteuid() != 0:
        return (
            "railhop demo needs root: it creates network namespaces (CAP_SYS_ADMIN), veth "
            "pairs, a bridge and tbf qdiscs (CAP_NET_ADMIN) and writes sysctls inside them. "
            "Run it as root, e.g. `sudo railhop demo` (or `sudo make demo`)."
        )
    return None


def _fmt_share(x: float | None) -> str:
    return "  -  " if x is None else f"{100 * x:4.0f}%"


def _fmt_s(x: float | None) -> str:
    return "  -  " if x is None else f"{x:5.2f}s"


def summary_table(reports: Sequence[FaultReport], tl: Timeline) -> str:
    r = tl.result.recv.summary
    s = tl.result.send.summary
    rows = [
        "fault               resume  extra   before during(expected) after  fail-back",
        "------------------- ------ ------- ------ ---------------- ------ ---------",
    ]
    for f in reports:
        rows.append(
            f"{f.label[:19]:19} {_fmt_s(f.resume_s)} {_fmt_s(f.extra_s)} "
            f"{_fmt_share(f.before)}  {_fmt_share(f.during)} ({_fmt_share(f.expected_during)})"
            f"     {_fmt_share(f.after)}  {_fmt_s(f.failback_s)}"
        )
    checked = r.bytes if r else 0
    errs = (r.data_errors + r.request_errors) if r else -1
    sent = s.msgs if s else -1
    got = r.msgs if r else -1
    rows.append(
        f"bytes checked: {checked / MiB:.0f} MiB in {got} messages (sent {sent}); "
        f"data+request errors: {errs}"
    )
    return "\n".join(rows)


def _live_printer(stream: TextIO, nics: int) -> Tick:
    tty = stream.isatty()
    last = [0.0]

    def tick(now: float, _tl: Timeline | None, rates: list[float], phase: str) -> None:
        if not tty and now - last[0] < 1.0:
            return
        last[0] = now
        per = " ".join(f"nic{i} {r * 8 / 1e6:6.0f}" for i, r in enumerate(rates))
        total = sum(rates) * 8 / 1e6
        line = f"t={now:5.1f}s  total {total:6.0f} Mbit/s | {per} | {phase}"
        if tty:
            stream.write("\r" + line[:150] + "\x1b[K")
        else:
            stream.write(line + "\n")
        stream.flush()

    return tick


def run_demo(
    out_dir: Path = Path("railhop-demo"),
    *,
    rate_mbit: int = 200,
    quick: bool = False,
    plugin: Path | None = None,
    harness: Path | None = None,
    stream: TextIO = sys.stdout,
) -> int:
    """Run the demo; returns the process exit status (0 = every byte checked, no error)."""
    problem = root_problem()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if plugin is not None:
        os.environ["RAILHOP_PLUGIN_PATH"] = str(plugin)
    if harness is not None:
        os.environ["RAILHOP_HARNESS_PATH"] = str(harness)
    use_source_tree_build()
    try:
        plugin_p, harness_p = paths.plugin_path(), paths.harness_path()
    except paths.NotInstalledError as e:
        print(f"railhop demo: {e}", file=sys.stderr)
        return 2
    steps, duration = demo_steps(quick)
    out_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"railhop demo: 2 nodes x 4 NICs, tbf {rate_mbit} Mbit/s per NIC; node 0 sends to node 1 "
        f"through the plugin ({plugin_p.name}), every byte checked",
        file=stream,
    )
    for st in steps:
        print(f"  at {st.at:4.1f}s: {st.label}", file=stream)
    try:
        with Fabric(nodes=2, nics=4, rate_mbit=rate_mbit, prefix=unique_prefix("rhdemo")) as fab:
            tl = run_scenario(fab, steps, duration, on_tick=_live_printer(stream, 4))
    except (FabricError, HarnessError, DemoError, OSError) as e:
        print(f"\nrailhop demo failed: {e}", file=sys.stderr)
        return 1
    print("", file=stream)
    nfaults = sum(1 for _, s in tl.events if s.is_fault)
    reports = [fault_report(tl, i) for i in range(nfaults)]
    print(summary_table(reports, tl), file=stream)
    bins = tl.nic_bins(0, 0.1)
    results = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rate_mbit_per_nic": rate_mbit,
        "plugin": str(plugin_p),
        "harness": str(harness_p),
        "events": [{"t": t, **asdict(s)} for t, s in tl.events],
        "faults": [{**asdict(f), "extra_s": f.extra_s} for f in reports],
        "send": asdict(tl.result.send.summary) if tl.result.send.summary else None,
        "recv": asdict(tl.result.recv.summary) if tl.result.recv.summary else None,
        "timeline_node0_tx_Bps": [{"t": t, "nics": v} for t, v in bins],
        "recv_progress": [
            {"t": p.t - tl.harness_t0, "bytes": p.bytes, "per_conn": p.per_conn}
            for p in tl.progress
        ],
    }
    res_path = out_dir / "results.json"
    tmp = res_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1, default=str))
    tmp.replace(res_path)
    png_path = out_dir / "timeline.png"
    marks = [(t, s.label or s.action) for t, s in tl.events]
    png_path.write_bytes(
        render_timeline_png(
            bins, marks, title=f"railhop demo: node 0 tx per nic, {rate_mbit} mbit/s"
        )
    )
    print(f"results: {res_path}   timeline: {png_path}", file=stream)
    ok = tl.result.ok and tl.result.data_errors == 0
    if not ok:
        print(tl.result.describe(), file=sys.stderr)
    return 0 if ok else 1
