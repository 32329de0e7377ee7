"""railhop.demo: fault analysis of a recorded timeline and the PNG encoder (pure)."""

from __future__ import annotations

import struct
import zlib

import pytest

from railhop.demo import (
    Step,
    Timeline,
    demo_steps,
    fault_report,
    render_timeline_png,
    summary_table,
)
from railhop.fabric import NicCounters
from railhop.harness import HarnessResult, Progress, SideResult, Summary

RATE = 100.0  # bytes/s per connection (and per NIC)


def synthetic() -> Timeline:
    """4 conns on 4 NICs; NIC 1 blackholed at t=2, conn 1 resumes at t=3 over the others,
    NIC 1 healed at t=5 and carries traffic again from t=5.5."""
    progress, samples = [], []
    per = [0.0] * 4
    nic = [0.0] * 4
    t, dt = 0.0, 0.1
    while t <= 8.0 + 1e-9:
        for c in range(4):
            if c == 1 and 2.0 <= t < 3.0:
                continue  # stalled
            per[c] += RATE * dt * (0.75 if 3.0 <= t < 5.5 else 1.0)
        for i in range(4):
            if i == 1 and 2.0 <= t < 5.5:
                continue
            nic[i] += RATE * dt * (4 / 3 if 3.0 <= t < 5.5 and i != 1 else 1.0)
        progress.append(
            Progress(t=t + 10.0, bytes=int(sum(per)), per_conn=tuple(int(x) for x in per), msgs=0)
        )
        samples.append((t, {(0, i): NicCounters(0, int(nic[i]), 0, 0) for i in range(4)}))
        t = round(t + dt, 6)
    summ = Summary("recv", 10, int(sum(per)), 8.0, 0, 0, None, 0.0)
    side = SideResult(role="recv", node=1, returncode=0, summary=summ, progress=progress)
    send = SideResult(role="send", node=0, returncode=0, summary=summ)
    return Timeline(
        nics=4,
        conns=4,
        t0_mono=0.0,
        harness_t0=10.0,
        progress=progress,
        samples=samples,
        events=[(2.0, Step(2.0, "blackhole", 0, 1, "bh nic1")), (5.0, Step(5.0, "heal", 0, 1))],
        result=HarnessResult(send=send, recv=side, wall_s=8.0),
        end=8.0,
    )


def test_fault_report_on_a_synthetic_timeline() -> None:
    tl = synthetic()
    rep = fault_report(tl, 0)
    assert rep.label == "bh nic1"
    assert rep.resume_s == pytest.approx(1.0, abs=0.15)
    assert rep.normal_gap_s <= 0.15
    assert rep.extra_s == pytest.approx(0.9, abs=0.2)
    assert rep.before == pytest.approx(1.0, abs=0.05)
    assert rep.during is not None and 0.7 <= rep.during <= 1.0
    assert rep.expected_during == 0.75
    assert rep.failback_s is not None and 0.5 <= rep.failback_s <= 0.9
    assert rep.after == pytest.approx(1.0, abs=0.05)
    text = summary_table([rep], tl)
    assert "bh nic1" in text and "errors: 0" in text


def test_nic_bins() -> None:
    tl = synthetic()
    bins = tl.nic_bins(0, 0.5)
    assert bins
    _t, vals = bins[1]
    assert len(vals) == 4
    assert vals[0] == pytest.approx(RATE, rel=0.05)


def test_demo_steps_shape() -> None:
    steps, duration = demo_steps()
    assert [s.action for s in steps] == ["blackhole", "carrier", "heal", "heal"]
    assert {s.nic for s in steps} == {1, 2}
    assert duration > steps[-1].at


def test_png_is_valid() -> None:
    bins = [(i * 0.1, [1e6 * (i % 7), 2e6, 0.0, 5e5]) for i in range(100)]
    png = render_timeline_png(bins, [(3.0, "blackhole nic1"), (6.0, "heal")], "test", 400, 200)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    length, tag = struct.unpack(">I4s", png[8:16])
    assert tag == b"IHDR" and length == 13
    w, h, depth, ctype = struct.unpack(">IIBB", png[16:26])
    assert (w, h, depth, ctype) == (400, 200, 8, 2)
    idat_len = struct.unpack(">I", png[33:37])[0]
    assert png[37:41] == b"IDAT"
    raw = zlib.decompress(png[41 : 41 + idat_len])
    assert len(raw) == h * (1 + 3 * w)
    assert png.endswith(b"IEND\xaeB`\x82")
    assert raw.count(b"\xff") < len(raw)  # something was drawn
