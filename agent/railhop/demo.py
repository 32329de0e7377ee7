"""``railhop demo``: plugin traffic across the emulated fabric through a walk of NIC faults.

Builds the two-node, four-NIC fabric with a ``tbf`` ceiling per NIC, starts one railhop agent
inside each node's network namespace (netlink source, control plane in its own run directory,
failover traces to a file), runs the harness (node 0 sends to node 1 through the plugin's
ncclNet API, every byte checked; each node's plugin talks to its node's agent) and walks:
healthy -> silent blackhole on nic1 -> carrier loss on nic2 -> heal both, with a live line.

At the end a table gives, per fault: what detected it and how long it took (from the agents'
``railhop.detection`` spans, never guessed), the time to resume (harness progress), bandwidth
before/during/after as a share of healthy, the fail-back time (per-NIC counters), the bytes
checked and errors. The output directory gets ``results.json``, ``timeline.png`` (bandwidth
per NIC, faults and detections marked) and ``traces.otlp.json`` (both agents' failover traces,
one OTLP/JSON document). docs/demo.md explains how to read them.

The scenario machinery (``run_scenario``, ``fault_report``) is shared with
``bench/failover_timeline.py``.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from railhop import paths, tracing
from railhop.fabric import CounterSampler, Fabric, FabricError, NicCounters, unique_prefix
from railhop.harness import (
    HarnessConfig,
    HarnessError,
    HarnessResult,
    HarnessRun,
    Progress,
    bytes_interp,
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
    "+": "000010111010000", "_": "000000000000111", "q": "000011101011001",
    "j": "001000001001110", "z": "000111001100111",
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

    def tint(self, x0: int, y0: int, x1: int, y1: int, c: tuple[int, int, int]) -> None:
        """Blend ``c`` at 25 % over what is there (overlapping tints stay visible)."""
        for y in range(max(0, y0), min(self.h, y1)):
            for x in range(max(0, x0), min(self.w, x1)):
                i = (y * self.w + x) * 3
                for k in range(3):
                    self.px[i + k] = (self.px[i + k] * 3 + c[k]) // 4

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
    *,
    bands: Sequence[tuple[float, float, int]] = (),
    detections: Sequence[tuple[float, str]] = (),
) -> bytes:
    """Bandwidth per NIC (Mbit/s) over time with vertical marks; returns PNG bytes.

    ``bands``: (start, end, nic) shaded in that NIC's colour, lightened (a fault holding);
    ``detections``: (t, label) dashed dark red marks (an agent declared a NIC down)."""
    cv = _Canvas(width, height)
    left, right, top, bottom = 70, width - 20, 40, height - 50
    t_max = max((t for t, _ in bins), default=1.0) or 1.0
    # the scale ignores the top 1 % of the samples (a bin catching up after a sampling gap)
    ys = sorted(v * 8 / 1e6 for _, vals in bins for v in vals)
    y_max = (ys[min(len(ys) - 1, int(len(ys) * 0.99))] if ys else 1.0) * 1.3 or 1.0
    grey, black = (200, 200, 200), (0, 0, 0)

    def xy(t: float, mbit: float) -> tuple[int, int]:
        x = left + int((right - left) * min(max(t, 0.0), t_max) / t_max)
        y = bottom - int((bottom - top) * min(mbit, y_max) / y_max)
        return x, y

    for t0, t1, nic in bands:
        cv.tint(xy(t0, 0)[0], top, xy(t1, 0)[0], bottom, _COLORS[nic % len(_COLORS)])

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
    red = (170, 20, 20)
    for k, (t, label) in enumerate(detections):
        x, _ = xy(t, 0)
        for y in range(top, bottom, 8):
            cv.line(x, y, x, min(y + 4, bottom), red)
        cv.text(x + 3, bottom - 14 - 12 * (k % 3), label[:30], red)
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
# The agents' view: detections read back from their failover traces (pure)


@dataclass(frozen=True)
class Detection:
    """One ``railhop.detection`` span of an agent's trace, with its root's outcome."""

    node: int
    nic: str
    trace_id: str
    first_signal_ns: int  # the detection span's start: the first bad signal (wall clock)
    declared_ns: int  # its end: the NIC declared DOWN (or the plugin started failing over)
    source: str  # railhop.detection.source: netlink, plugin, ...
    signal: str  # railhop.detection.signal: carrier_down, lane_timeout, ...
    first_source: str | None = None  # an earlier, softer signal's source, if any
    outcome: str | None = None  # railhop.failover.outcome of the root (None: not exported yet)
    end_ns: int | None = None  # the root's end (fail-back done), when exported

    @property
    def label(self) -> str:
        """What the table shows, e.g. ``node0 netlink carrier_down``."""
        return f"node{self.node} {self.source} {self.signal}".strip()


def _attr_value(v: dict[str, Any]) -> Any:
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [_attr_value(x) for x in v["arrayValue"].get("values", [])]
    return None


def span_attrs(span: Mapping[str, Any]) -> dict[str, Any]:
    """An OTLP/JSON span's attributes as a plain dict."""
    return {a["key"]: _attr_value(a.get("value", {})) for a in span.get("attributes", [])}


def detections(spans: Sequence[Mapping[str, Any]], node: int) -> list[Detection]:
    """The detections in one agent's spans (OTLP/JSON dicts), oldest first."""
    roots = {s["spanId"]: s for s in spans if s.get("name") == tracing.FAILOVER}
    out = []
    for s in spans:
        if s.get("name") != tracing.DETECTION:
            continue
        a = span_attrs(s)
        root = roots.get(s.get("parentSpanId", ""))
        ra = span_attrs(root) if root is not None else {}
        out.append(
            Detection(
                node=node,
                nic=str(a.get("network.interface.name", "")),
                trace_id=str(s.get("traceId", "")),
                first_signal_ns=int(s["startTimeUnixNano"]),
                declared_ns=int(s["endTimeUnixNano"]),
                source=str(a.get("railhop.detection.source", "")),
                signal=str(a.get("railhop.detection.signal", "")),
                first_source=a.get("railhop.detection.first_source"),
                outcome=ra.get("railhop.failover.outcome"),
                end_ns=int(root["endTimeUnixNano"]) if root is not None else None,
            )
        )
    return sorted(out, key=lambda d: d.first_signal_ns)


MATCH_SLACK_NS = 20_000_000  # clock offsets between the demo and the agents (both ~us)


def match_detection(
    dets: Sequence[Detection],
    nic: str,
    fault_ns: int,
    until_ns: int | None = None,
    node: int | None = None,
) -> Detection | None:
    """The agents' detection of a fault on ``nic`` injected at ``fault_ns``: the one that
    declared the NIC down first after the fault (and whose first signal came before
    ``until_ns``). ``node`` None: either node (both ends of a rail see a silent blackhole, the
    first to notice may be either); else only that node's agent."""
    found = [
        d
        for d in dets
        if d.nic == nic
        and (node is None or d.node == node)
        and d.declared_ns >= fault_ns - MATCH_SLACK_NS
        and (until_ns is None or d.first_signal_ns <= until_ns)
    ]
    return min(found, key=lambda d: d.declared_ns, default=None)


# ---------------------------------------------------------------------------------------------
# The summary (pure)


@dataclass
class FaultRow:
    """One line of the summary table: a fault, what the agent saw, what the traffic did."""

    report: FaultReport
    detection: Detection | None
    detect_s: float | None  # fault injected -> the agent declared the NIC down (its trace)
    bytes_checked: int  # bytes the receiver verified while the fault held
    errors: int  # harness errors first seen while the fault held

    @property
    def survived(self) -> bool:
        """Traffic moved on while the fault held, with no error."""
        return self.errors == 0 and self.report.during is not None and self.report.during > 0


@dataclass(frozen=True)
class Totals:
    bytes_checked: int
    msgs_received: int
    msgs_sent: int
    data_errors: int
    request_errors: int
    healthy_mbit: float  # receiver goodput before the first fault (all NICs)


def fault_rows(tl: Timeline, dets: Sequence[Detection]) -> list[FaultRow]:
    """A row per fault of the timeline, its detection taken from the agents' traces."""
    faults = [(t, s) for t, s in tl.events if s.is_fault]
    rows = []
    summ = tl.result.recv.summary
    first_err = summ.first_error if summ is not None else None
    nerr = (summ.data_errors + summ.request_errors) if summ is not None else 0
    for i, (t_f, st) in enumerate(faults):
        rep = fault_report(tl, i)
        end = rep.healed_at if rep.healed_at is not None else tl.end
        nxt = [t for t, _ in faults if t > t_f]
        det = match_detection(
            dets, f"nic{st.nic}", tl.wall_ns(t_f), tl.wall_ns(min(nxt)) if nxt else None
        )
        detect_s = (det.declared_ns - tl.wall_ns(t_f)) / 1e9 if det is not None else None
        checked = int(
            bytes_interp(tl.progress, tl.h(min(end, tl.end))) - bytes_interp(tl.progress, tl.h(t_f))
        )
        errs = nerr if first_err is not None and t_f <= first_err.t - tl.harness_t0 <= end else 0
        rows.append(FaultRow(rep, det, detect_s, max(0, checked), errs))
    return rows


def totals_of(tl: Timeline) -> Totals:
    r, s = tl.result.recv.summary, tl.result.send.summary
    h = healthy_rate(tl)
    return Totals(
        bytes_checked=r.bytes if r else 0,
        msgs_received=r.msgs if r else 0,
        msgs_sent=s.msgs if s else 0,
        data_errors=sum(x.data_errors for x in (r, s) if x is not None),
        request_errors=sum(x.request_errors for x in (r, s) if x is not None),
        healthy_mbit=(h or 0.0) * 8 / 1e6,
    )


def _fmt_share(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}s"


def _fmt_bytes(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n >= MiB else f"{n / 1024:.0f} KiB"


TABLE_HEAD = (
    "fault",
    "detected by",
    "detect",
    "resume",
    "before",
    "during (expected)",
    "after",
    "fail-back",
    "checked",
    "errors",
)


def summary_table(rows: Sequence[FaultRow], totals: Totals) -> str:
    """The end-of-demo table (plain text, aligned columns) and a totals line."""
    body = []
    for r in rows:
        f = r.report
        body.append(
            (
                f.label,
                r.detection.label if r.detection is not None else "not detected",
                _fmt_s(r.detect_s),
                _fmt_s(f.resume_s),
                _fmt_share(f.before),
                f"{_fmt_share(f.during)} ({_fmt_share(f.expected_during)})",
                _fmt_share(f.after),
                _fmt_s(f.failback_s),
                _fmt_bytes(r.bytes_checked),
                str(r.errors),
            )
        )
    widths = [max(len(x[i]) for x in (TABLE_HEAD, *body)) for i in range(len(TABLE_HEAD))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [line(TABLE_HEAD), line(["-" * w for w in widths])]
    out += [line(b) for b in body]
    errs = totals.data_errors + totals.request_errors
    out.append(
        f"healthy {totals.healthy_mbit:.0f} Mbit/s; every byte checked: "
        f"{_fmt_bytes(totals.bytes_checked)} in {totals.msgs_received} messages "
        f"(sent {totals.msgs_sent}); data errors {totals.data_errors}, request errors "
        f"{totals.request_errors}{'' if errs == 0 else '  <-- FAILED'}"
    )
    return "\n".join(out)


def demo_ok(result_ok: bool, rows: Sequence[FaultRow], totals: Totals) -> bool:
    """Exit 0 only if every byte was checked with zero errors and every fault was survived."""
    return (
        result_ok
        and totals.data_errors == 0
        and totals.request_errors == 0
        and totals.bytes_checked > 0
        and bool(rows)
        and all(r.survived for r in rows)
    )


# ---------------------------------------------------------------------------------------------
# The demo


def demo_steps(quick: bool = False) -> tuple[list[Step], float]:
    """healthy -> blackhole nic1 -> carrier loss nic2 -> heal both (scenario seconds).

    A quick phase is 6 s, not less: after a silent blackhole the hit connection needs the 1 s
    completion timeout plus the replay of its unconfirmed messages (several seconds on 200 Mbit/s
    NICs shared with the other connections) before it moves again, and a phase shorter than that
    ends before the fault can be shown to be survived.
    """
    p = 6.0 if quick else 8.0
    steps = [
        Step(p, "blackhole", 0, 1, "blackhole nic1"),
        Step(2 * p, "carrier", 0, 2, "carrier loss nic2"),
        Step(3 * p, "heal", 0, 1, "heal nic1"),
        Step(3 * p, "heal", 0, 2, "heal nic2"),
    ]
    return steps, 3 * p + (6.0 if quick else 8.0)


def root_problem() -> str | None:
    if os.geteuid() != 0:
        return (
            "railhop demo needs root (it runs as uid "
            f"{os.geteuid()}): it creates network namespaces (CAP_SYS_ADMIN), veth pairs, a "
            "bridge and tbf qdiscs (CAP_NET_ADMIN), writes sysctls inside them and starts one "
            "railhop agent per emulated node (netlink, control socket, shared memory). "
            "Run it as root, e.g. `sudo railhop demo` (or `sudo make demo`)."
        )
    return None


AGENT_SCRIPT = """
import logging, sys
from pathlib import Path
from railhop import daemon
logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(asctime)s %(name)s %(levelname)s %(message)s")
cfg = daemon.AgentConfig(
    run_dir=Path(sys.argv[1]), nics=("nic0", "nic1", "nic2", "nic3"), sources=("netlink",),
    trace_file=Path(sys.argv[2]), metrics_port=int(sys.argv[3]), metrics_addr="127.0.0.1",
    heartbeat_ms=100, duration_s=float(sys.argv[4]))
sys.exit(daemon.run_agent(cfg))
"""
METRICS_PORT = 9464


@dataclass
class AgentProc:
    node: int
    proc: subprocess.Popen[Any]
    run_dir: Path
    trace_file: Path
    log: Path

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(5.0)
        return self.proc.returncode


def scrape(fab: Fabric, node: int, port: int = METRICS_PORT) -> dict[str, float]:
    """GET /metrics inside a node's netns (the agent listens on that netns's loopback)."""
    s = fab.socket(node)
    try:
        s.settimeout(2)
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    finally:
        s.close()
    out: dict[str, float] = {}
    for ln in data.partition(b"\r\n\r\n")[2].decode(errors="replace").splitlines():
        if ln and not ln.startswith("#"):
            key, _, val = ln.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[key] = float(val)
    return out


def start_agent(
    fab: Fabric, node: int, run_dir: Path, trace_file: Path, log: Path, lifetime_s: float
) -> AgentProc:
    """One agent inside node ``node``'s netns (its netlink source sees that node's NICs)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    pkg_root = str(Path(__file__).resolve().parents[1])
    pp = os.environ.get("PYTHONPATH")
    env = {
        **os.environ,
        "PYTHONPATH": pkg_root + (os.pathsep + pp if pp else ""),
        "NODE_NAME": f"demo-node{node}",
        "OTEL_SERVICE_NAME": "railhop-demo",
        "OTEL_TRACES_EXPORTER": "none",
    }
    argv = [
        sys.executable,
        "-c",
        AGENT_SCRIPT,
        str(run_dir),
        str(trace_file),
        str(METRICS_PORT),
        f"{lifetime_s:g}",
    ]
    with log.open("w") as err:
        proc = fab.popen(node, argv, env, stdout=subprocess.DEVNULL, stderr=err)
    return AgentProc(node, proc, run_dir, trace_file, log)


def wait_agents_ready(fab: Fabric, agents: Sequence[AgentProc], timeout: float) -> None:
    """Until every agent serves metrics with its netlink source started (bounded)."""
    deadline = time.monotonic() + timeout
    for a in agents:
        while True:
            if a.proc.poll() is not None:
                raise DemoError(
                    f"the agent of node {a.node} exited ({a.proc.returncode}): " + _tail_text(a.log)
                )
            with contextlib.suppress(OSError):
                if scrape(fab, a.node).get('railhop_sources{source="netlink"}') == 1:
                    break
            if time.monotonic() > deadline:
                raise DemoError(f"the agent of node {a.node} not ready in {timeout:g} s")
            time.sleep(0.2)


def _tail_text(path: Path, n: int = 1500) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-n:]
    return ""


def read_spans(path: Path) -> list[dict[str, Any]]:
    """The spans of an agent's trace file so far ([] when none yet)."""
    if not path.exists():
        return []
    try:
        return tracing.read_otlp_json(path)
    except (ValueError, OSError):  # a line being written
        return []


def merge_otlp(files: Sequence[Path], out: Path) -> int:
    """One OTLP/JSON document (``ExportTraceServiceRequest``) with every batch of ``files``;
    returns the number of spans."""
    rs: list[Any] = []
    for f in files:
        if not f.exists():
            continue
        for ln in f.read_text().splitlines():
            if ln.strip():
                with contextlib.suppress(json.JSONDecodeError):
                    rs += json.loads(ln).get("resourceSpans", [])
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps({"resourceSpans": rs}, indent=1) + "\n")
    tmp.replace(out)
    return sum(len(ss.get("spans", [])) for r in rs for ss in r.get("scopeSpans", []))


def nic_states(run_dirs: Sequence[Path]) -> list[tuple[int, str, str]]:
    """(node, nic, state) for every NIC an agent does not have UP (from its health table)."""
    from railhop.control.table import read_table

    out = []
    for node, d in enumerate(run_dirs):
        try:
            snap = read_table(d / "health.tbl", tries=4)
        except Exception:  # not there yet / being written: skip this tick
            continue
        for n in snap.nics:
            if n.state.name != "UP":
                out.append((node, n.ifname, n.state.name))
    return out


def live_printer(stream: TextIO, nics: int, run_dirs: Sequence[Path]) -> Tick:
    """The live line: one line rewritten in place on a TTY (4/s), plain lines otherwise (1/s)."""
    tty = stream.isatty()
    period = 0.25 if tty else 1.0
    last = [-1e9]

    def tick(now: float, _tl: Timeline | None, rates: list[float], phase: str) -> None:
        if now - last[0] < period:
            return
        last[0] = now
        per = " ".join(f"nic{i} {r * 8 / 1e6:4.0f}" for i, r in enumerate(rates[:nics]))
        total = sum(rates) * 8 / 1e6
        bad = nic_states(run_dirs)
        agents = ", ".join(f"n{n}:{i} {s.lower()}" for n, i, s in bad) or "all up"
        line = f"t={now:5.1f}s {phase:<18} tx {total:4.0f} Mbit/s [{per}] agents: {agents}"
        if tty:
            stream.write("\r" + line[:160] + "\x1b[K")
        else:
            stream.write(line + "\n")
        stream.flush()

    return tick


def wait_traces(agents: Sequence[AgentProc], nics: Sequence[str], timeout: float) -> None:
    """Until some agent has a finished failover (root span) of each of ``nics`` and every
    detection exported so far has its root, i.e. fail-back is done (bounded: agents end the
    failovers still open when they stop)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        spans = [s for a in agents for s in read_spans(a.trace_file)]
        roots = {s["spanId"]: s for s in spans if s.get("name") == tracing.FAILOVER}
        done = {span_attrs(s).get("network.interface.name") for s in roots.values()}
        open_ = [
            s
            for s in spans
            if s.get("name") == tracing.DETECTION and s.get("parentSpanId") not in roots
        ]
        if set(nics) <= done and not open_:
            return
        time.sleep(0.2)


def results_dict(
    tl: Timeline,
    rows: Sequence[FaultRow],
    totals: Totals,
    dets: Sequence[Detection],
    *,
    rate_mbit: int,
    quick: bool,
    ok: bool,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """What results.json holds (times in scenario seconds; shares of healthy bandwidth)."""
    bins = tl.nic_bins(0, 0.1)
    return {
        "ok": ok,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "quick": quick,
        "rate_mbit_per_nic": rate_mbit,
        "t0_wall_ns": tl.t0_wall_ns,
        **extra,
        "events": [{"t": t, **asdict(s)} for t, s in tl.events],
        "faults": [
            {
                **asdict(r.report),
                "extra_s": r.report.extra_s,
                "detect_s": r.detect_s,
                "detection": asdict(r.detection) if r.detection is not None else None,
                "bytes_checked": r.bytes_checked,
                "errors": r.errors,
                "survived": r.survived,
            }
            for r in rows
        ],
        "totals": asdict(totals),
        "detections": [{**asdict(d), "t": (d.declared_ns - tl.t0_wall_ns) / 1e9} for d in dets],
        "send": asdict(tl.result.send.summary) if tl.result.send.summary else None,
        "recv": asdict(tl.result.recv.summary) if tl.result.recv.summary else None,
        "timeline_node0_tx_Bps": [{"t": t, "nics": v} for t, v in bins],
        "recv_progress": [
            {"t": p.t - tl.harness_t0, "bytes": p.bytes, "per_conn": list(p.per_conn)}
            for p in tl.progress
        ],
    }


def _write_json(path: Path, obj: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str) + "\n")
    tmp.replace(path)


PNG_SIZE = (1000, 420)


def timeline_png(tl: Timeline, rows: Sequence[FaultRow], rate_mbit: int) -> bytes:
    """The demo's plot: node 0's tx per NIC, fault events marked, each fault's span shaded in
    its NIC's colour, the agents' detections as dashed red marks."""
    marks: list[tuple[float, str]] = []
    for t, s in tl.events:  # one label per instant ("heal nic1+nic2")
        label = s.label or s.action
        if marks and abs(marks[-1][0] - t) < 0.2 and s.action == "heal":
            marks[-1] = (marks[-1][0], marks[-1][1] + f"+nic{s.nic}")
        else:
            marks.append((t, label))
    bands = [
        (
            r.report.at,
            r.report.healed_at if r.report.healed_at is not None else tl.end,
            r.report.nic,
        )
        for r in rows
    ]
    dets = [
        (
            (r.detection.declared_ns - tl.t0_wall_ns) / 1e9,
            f"down n{r.detection.node}: {r.detection.source}",
        )
        for r in rows
        if r.detection is not None
    ]
    return render_timeline_png(
        tl.nic_bins(0, 0.1),
        marks,
        title=f"railhop demo: node 0 tx per nic, tbf {rate_mbit} mbit/s per nic",
        width=PNG_SIZE[0],
        height=PNG_SIZE[1],
        bands=bands,
        detections=dets,
    )


def run_demo(
    out_dir: Path = Path("railhop-demo"),
    *,
    rate_mbit: int = 200,
    quick: bool = False,
    plugin: Path | None = None,
    harness: Path | None = None,
    stream: TextIO = sys.stdout,
) -> int:
    """Run the demo; returns the exit status (0: every byte checked with zero errors and every
    fault survived; 1: not so, or the run failed; 2: cannot run here; 130: interrupted)."""
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
    for stale in ("traces-node0.otlp.jsonl", "traces-node1.otlp.jsonl"):
        (out_dir / stale).unlink(missing_ok=True)
    # run dirs (agent.sock, health.tbl) in a short tmp path: a unix socket path has 108 bytes
    work = Path(tempfile.mkdtemp(prefix="rhdemo-"))
    print(
        f"railhop demo: 2 nodes x 4 NICs, tbf {rate_mbit} Mbit/s per NIC, one railhop agent "
        f"per node; node 0 sends to node 1 through the plugin ({plugin_p.name}), every byte "
        "checked",
        file=stream,
    )
    for st in steps:
        print(f"  at {st.at:4.1f}s: {st.label}", file=stream)
    agents: list[AgentProc] = []
    wall0 = time.monotonic()
    try:
        with Fabric(nodes=2, nics=4, rate_mbit=rate_mbit, prefix=unique_prefix("rhdemo")) as fab:
            try:
                print("starting the agents ...", file=stream, flush=True)
                for n in range(2):
                    agents.append(
                        start_agent(
                            fab,
                            n,
                            work / f"run-node{n}",
                            out_dir / f"traces-node{n}.otlp.jsonl",
                            out_dir / f"agent-node{n}.log",
                            lifetime_s=duration + 180.0,
                        )
                    )
                wait_agents_ready(fab, agents, 60.0)
                print("agents up; traffic ...", file=stream, flush=True)
                tick = live_printer(stream, 4, [a.run_dir for a in agents])
                tl = run_scenario(fab, steps, duration, on_tick=tick, workdir=work)
                print("", file=stream)
                faulted = sorted({f"nic{s.nic}" for s in steps if s.is_fault and s.node == 0})
                wait_traces(agents, faulted, 15.0)
                agent_metrics: dict[int, dict[str, float]] = {}
                for a in agents:
                    with contextlib.suppress(OSError):
                        agent_metrics[a.node] = {
                            k: v
                            for k, v in scrape(fab, a.node).items()
                            if k.startswith(
                                (
                                    "railhop_failovers_total",
                                    "railhop_detection_latency_seconds_count",
                                    "railhop_detection_latency_seconds_sum",
                                )
                            )
                        }
            finally:
                codes = {a.node: a.stop() for a in agents}
    except KeyboardInterrupt:
        print("\nrailhop demo interrupted: agents stopped, fabric removed", file=sys.stderr)
        return 130
    except (FabricError, HarnessError, DemoError, OSError) as e:
        print(f"\nrailhop demo failed: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)

    dets: list[Detection] = []
    for a in agents:
        dets += detections(read_spans(a.trace_file), a.node)
    trace_path = out_dir / "traces.otlp.json"
    nspans = merge_otlp([a.trace_file for a in agents], trace_path)
    for a in agents:
        a.trace_file.unlink(missing_ok=True)
    rows = fault_rows(tl, dets)
    totals = totals_of(tl)
    ok = demo_ok(tl.result.ok, rows, totals)
    print(summary_table(rows, totals), file=stream)
    other = [d for d in dets if not any(r.detection is not None and r.detection == d for r in rows)]
    for d in other:
        print(
            f"  also: {d.nic} declared down at {(d.declared_ns - tl.t0_wall_ns) / 1e9:.2f}s by "
            f"{d.label}",
            file=stream,
        )
    extra = {
        "plugin": str(plugin_p),
        "harness": str(harness_p),
        "agents_exit": codes,
        "agent_metrics": agent_metrics,
        "trace_spans": nspans,
        "wall_s": time.monotonic() - wall0,
    }
    _write_json(
        out_dir / "results.json",
        results_dict(tl, rows, totals, dets, rate_mbit=rate_mbit, quick=quick, ok=ok, extra=extra),
    )
    png_path = out_dir / "timeline.png"
    png_path.write_bytes(timeline_png(tl, rows, rate_mbit))
    print(
        f"results: {out_dir / 'results.json'}  plot: {png_path}  traces: {trace_path} "
        f"({nspans} spans)",
        file=stream,
    )
    if not ok:
        print(
            "railhop demo: NOT every byte checked with zero errors / every fault survived",
            file=sys.stderr,
        )
        print(tl.result.describe(), file=sys.stderr)
    elif any(c not in (0, None) for c in codes.values()):
        print(f"railhop demo: an agent exited with {codes}", file=sys.stderr)
    return 0 if ok else 1
