"""railhop_lab.demo: fault analysis of a recorded timeline, detections read back from agent
traces, the summary table, the live line and the PNG encoder (pure)."""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from railhop import tracing
from railhop.tracing import SpanDesc
from railhop_lab.demo import (
    PNG_SIZE,
    Detection,
    demo_ok,
    demo_steps,
    detections,
    fault_rows,
    live_printer,
    match_detection,
    merge_otlp,
    parse_metrics,
    root_problem,
    run_demo,
    summary_table,
    timeline_png,
    totals_of,
)
from railhop_lab.fabric import NicCounters
from railhop_lab.harness import HarnessResult, Progress, SideResult, Summary
from railhop_lab.render import PlotUnavailableError, render_timeline_png
from railhop_lab.scenario import Step, Timeline, fault_report

RATE = 100.0  # bytes/s per connection (and per NIC)
T0_WALL = 1_700_000_000 * 10**9  # wall clock of scenario second 0


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
        t0_wall_ns=T0_WALL,
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


def test_nic_bins() -> None:
    tl = synthetic()
    bins = tl.nic_bins(0, 0.5)
    assert bins
    _t, vals = bins[1]
    assert len(vals) == 4
    assert vals[0] == pytest.approx(RATE, rel=0.05)


def test_demo_steps_shape() -> None:
    for quick in (False, True):
        steps, duration = demo_steps(quick)
        assert [s.action for s in steps] == ["blackhole", "carrier", "heal", "heal"]
        assert {s.nic for s in steps} == {1, 2}
        assert duration > steps[-1].at + 3  # room for fail-back after the heal
    assert demo_steps(True)[1] <= 24 < demo_steps(False)[1] <= 60


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    length, tag = struct.unpack(">I4s", png[8:16])
    assert tag == b"IHDR" and length == 13
    w, h = struct.unpack(">II", png[16:24])
    return w, h


def test_png_is_drawn_by_matplotlib_with_round_ticks_and_labels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The figure the PNG is made of: labelled axes, x and y ticks at round numbers, one line
    per NIC, the fault band, the detection mark, and a legend naming them."""
    from matplotlib.figure import Figure

    figs: list[Figure] = []
    real = Figure.savefig

    def keep(self: Figure, *a: object, **kw: object) -> None:
        figs.append(self)
        real(self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Figure, "savefig", keep)
    bins = [(i * 0.1, [1e6 * (i % 7), 2e6, 0.0, 5e5]) for i in range(100)]
    png = render_timeline_png(
        bins,
        [(3.0, "blackhole nic1"), (6.0, "heal")],
        "test",
        400,
        200,
        bands=[(3.0, 6.0, 1)],
        detections=[(3.2, "down n0: netlink")],
    )
    assert _png_size(png) == (400, 200)
    (fig,) = figs
    (ax,) = fig.axes
    assert ax.get_xlabel() == "time since start (s)"
    assert ax.get_ylabel() == "transmit rate (Mbit/s)"
    for ticks in (ax.get_xticks(), ax.get_yticks()):
        assert len(ticks) >= 3
        steps = {round(b - a, 9) for a, b in itertools.pairwise(ticks)}
        assert len(steps) == 1, ticks
        (step,) = steps
        mant = round(step / 10 ** math.floor(math.log10(step)), 6)
        assert mant in (1, 2, 5), ticks  # the step is 1, 2 or 5 times 10^n
        assert all(abs(t / step - round(t / step)) < 1e-6 for t in ticks), ticks
    legend = ax.get_legend()
    assert legend is not None
    names = [t.get_text() for t in legend.get_texts()]
    assert names == ["nic0", "nic1", "nic2", "nic3", "agent declared NIC down", "fault on nic1"]
    assert min(t.get_fontsize() for t in legend.get_texts()) >= 9
    assert ax.xaxis.label.get_fontsize() >= 10


def test_without_matplotlib_the_plot_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_mpl(name: str, *a: object, **kw: object) -> object:
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    with pytest.raises(PlotUnavailableError, match=r"railhop-lab\[plot\]"):
        render_timeline_png([(0.0, [1.0])], [], "t")


def test_metrics_are_parsed_with_prometheus_clients_parser() -> None:
    text = (
        "# HELP railhop_sources x\n# TYPE railhop_sources gauge\n"
        'railhop_sources{source="netlink"} 1.0\n'
        "# TYPE railhop_failovers counter\n"
        'railhop_failovers_total{device="nic1",cause="carrier_down"} 2.0\n'
        "# TYPE railhop_detection_latency_seconds histogram\n"
        'railhop_detection_latency_seconds_bucket{source="netlink",le="0.1"} 1.0\n'
        'railhop_detection_latency_seconds_count{source="netlink"} 1.0\n'
        "railhop_control_clients 3\n"
        'odd{v="a\\"b"} 4\n'
    )
    got = parse_metrics(text)
    assert got['railhop_sources{source="netlink"}'] == 1.0
    assert got['railhop_failovers_total{device="nic1",cause="carrier_down"}'] == 2.0
    assert got['railhop_detection_latency_seconds_count{source="netlink"}'] == 1.0
    assert got["railhop_control_clients"] == 3.0
    assert got['odd{v="a\\"b"}'] == 4.0
    # a garbled scrape keeps what parsed before the bad line
    assert parse_metrics('a 1\nb{x="1"} notanumber\n') == {"a": 1.0}


# ---------------------------------------------------------------------------------------------
# detections from the agents' traces


def ms(t: float) -> int:
    """Scenario seconds -> wall ns."""
    return T0_WALL + int(t * 1e9)


def trace(
    nic: str, first: float, declared: float, source: str, signal: str, *, done: bool = True
) -> list[SpanDesc]:
    """A failover trace as the agent makes it: root, detection, (fail-back)."""
    tid = hash((nic, first)) & (2**128 - 1) or 1
    root = SpanDesc(
        name=tracing.FAILOVER,
        trace_id=tid,
        span_id=1 + (tid & 0xFFFF),
        parent_id=None,
        start_ns=ms(first),
        end_ns=ms(first + 3.0),
        attributes={
            "network.interface.name": nic,
            "railhop.failover.outcome": "failed_back",
            "railhop.failover.source": source,
        },
    )
    det = SpanDesc(
        name=tracing.DETECTION,
        trace_id=tid,
        span_id=2 + (tid & 0xFFFF),
        parent_id=root.span_id,
        start_ns=ms(first),
        end_ns=ms(declared),
        attributes={
            "network.interface.name": nic,
            "railhop.detection.source": source,
            "railhop.detection.signal": signal,
        },
    )
    return [root, det] if done else [det]


def otlp_spans(tmp_path: Path, spans: list[SpanDesc], name: str = "t.json") -> list[dict[str, Any]]:
    p = tmp_path / name
    tracing.write_otlp_json(spans, p, {"k8s.node.name": "n"})
    return tracing.read_otlp_json(p)


def test_detections_read_back_from_otlp(tmp_path: Path) -> None:
    spans = otlp_spans(
        tmp_path,
        trace("nic2", 6.001, 6.002, "netlink", "carrier_down")
        + trace("nic1", 3.9, 4.0, "plugin", "lane_timeout", done=False),
    )
    dets = detections(spans, node=0)
    assert [(d.nic, d.source, d.signal) for d in dets] == [
        ("nic1", "plugin", "lane_timeout"),
        ("nic2", "netlink", "carrier_down"),
    ]
    assert dets[0].outcome is None and dets[0].end_ns is None  # root not exported yet
    assert dets[1].outcome == "failed_back" and dets[1].end_ns == ms(9.001)
    assert dets[1].declared_ns == ms(6.002) and dets[1].label == "node0 netlink carrier_down"


def det(node: int, nic: str, declared: float, source: str = "plugin") -> Detection:
    return Detection(node, nic, "t", ms(declared - 0.1), ms(declared), source, "lane_timeout")


def test_match_detection_takes_the_first_after_the_fault_on_either_node() -> None:
    dets = [det(0, "nic1", 1.0), det(1, "nic1", 3.2), det(0, "nic1", 3.5), det(0, "nic2", 3.1)]
    assert match_detection(dets, "nic1", ms(3.0)) == dets[1]
    assert match_detection(dets, "nic1", ms(3.0), node=0) == dets[2]
    assert match_detection(dets, "nic3", ms(3.0)) is None
    assert match_detection(dets, "nic1", ms(3.0), until_ns=ms(3.0)) is None
    # a detection a few ms "before" the fault (netlink fires while the fault is applied)
    assert match_detection(dets, "nic2", ms(3.105)) == dets[3]


def test_fault_rows_and_table() -> None:
    tl = synthetic()
    dets = [det(1, "nic1", 3.05), det(0, "nic1", 3.4, "netlink")]
    rows = fault_rows(tl, dets)
    assert len(rows) == 1
    r = rows[0]
    assert r.detection == dets[0]
    assert r.detect_s == pytest.approx(1.05, abs=1e-6)
    # bytes the receiver checked between the fault (t=2) and the heal (t=5)
    want = tl.progress[50].bytes - tl.progress[20].bytes
    assert r.bytes_checked == pytest.approx(want, rel=0.05)
    assert r.errors == 0 and r.survived
    totals = totals_of(tl)
    assert totals.bytes_checked == tl.result.recv.summary.bytes  # type: ignore[union-attr]
    assert totals.healthy_mbit == pytest.approx(4 * RATE * 8 / 1e6, rel=0.05)
    assert demo_ok(True, rows, totals)
    text = summary_table(rows, totals)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["fault", "detected", "by"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert "bh nic1" in lines[2] and "node1 plugin lane_timeout" in lines[2]
    assert "1.05s" in lines[2] and "(75%)" in lines[2]
    # columns line up: each header cell starts where the row's cell starts
    col = lines[0].index("detect ")
    assert lines[2][col - 2 : col] == "  " and lines[2][col] != " "
    assert "data errors 0, request errors 0" in lines[-1] and "FAILED" not in text


def test_table_without_detection_and_failure_verdicts() -> None:
    tl = synthetic()
    rows = fault_rows(tl, [])
    assert rows[0].detection is None and rows[0].detect_s is None
    totals = totals_of(tl)
    assert "not detected" in summary_table(rows, totals)
    assert demo_ok(True, rows, totals)  # a fault the agent missed but the plugin survived
    assert not demo_ok(False, rows, totals)
    assert not demo_ok(True, [], totals)
    bad = totals.__class__(**{**totals.__dict__, "data_errors": 1})
    assert not demo_ok(True, rows, bad)
    assert "FAILED" in summary_table(rows, bad)
    rows[0].errors = 2
    assert not rows[0].survived and not demo_ok(True, rows, totals)
    rows[0].errors = 0
    rows[0].report.during = None  # no traffic while the fault held
    assert not demo_ok(True, rows, totals)


def test_merge_otlp(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path, node, spans in (
        (a, "n0", trace("nic1", 1, 2, "plugin", "lane_timeout")),
        (b, "n1", trace("nic2", 1, 2, "netlink", "carrier_down")),
    ):
        sink = tracing.OtlpJsonFileSink(path, {"k8s.node.name": node})
        sink.emit(spans[:1])
        sink.emit(spans[1:])
    out = tmp_path / "traces.otlp.json"
    assert merge_otlp([a, b, tmp_path / "missing"], out) == 4
    doc = json.loads(out.read_text())
    assert len(doc["resourceSpans"]) == 4
    assert {s["name"] for s in tracing.read_otlp_json(out)} == {
        tracing.FAILOVER,
        tracing.DETECTION,
    }


class FakeTty(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_live_line_is_throttled_and_in_place_on_a_tty(tmp_path: Path) -> None:
    rates = [25e6, 0.0, 25e6, 25e6]
    plain = FakeTty(False)
    tick = live_printer(plain, 4, [tmp_path / "none"])
    for k in range(31):  # 3 s at 10 ticks/s
        tick(k / 10, None, rates, "blackhole nic1")
    lines = plain.getvalue().splitlines()
    assert len(lines) == 4  # one a second
    assert "tx  600 Mbit/s" in lines[0] and "nic1    0" in lines[0] and "all up" in lines[0]
    tty = FakeTty(True)
    tick = live_printer(tty, 4, [])
    for k in range(11):
        tick(k / 10, None, rates, "healthy")
    text = tty.getvalue()
    assert (
        "\n" not in text and text.count("\r") == 4
    )  # 0, 0.3, 0.6, 0.9 s: 4 a second and text.endswith("\x1b[K")


def test_without_root_it_says_what_it_needs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    why = root_problem()
    assert why is not None
    for word in ("root", "CAP_NET_ADMIN", "CAP_SYS_ADMIN", "network namespaces", "sudo"):
        assert word in why
    assert run_demo(tmp_path / "out", quick=True) == 2
    assert "needs root" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_timeline_png_of_the_synthetic_run() -> None:
    tl = synthetic()
    rows = fault_rows(tl, [det(0, "nic1", 3.0)])
    png = timeline_png(tl, rows, 200)
    assert _png_size(png) == PNG_SIZE
