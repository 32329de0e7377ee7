"""Prometheus metrics: samples derived from failover spans and lane events, scrape-time samples
from sysfs (fixture tree) and USDT lane stats, and the HTTP endpoint."""

from __future__ import annotations

import itertools
import socket
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from railhop import tracing
from railhop.control import ControlCounters, EventType, LaneEvent
from railhop.metrics import AgentMetrics, MetricsError, MetricsServer
from railhop.tracing import Decision, FailoverAssembler, Pair, StateChange

S, MS = 1_000_000_000, 1_000_000


def value(m: AgentMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_spans_drive_failover_counters_and_histograms() -> None:
    ids = itertools.count(1)
    a = FailoverAssembler(0, rand_bits=lambda b: next(ids))
    m = AgentMetrics(nics=["nic0", "nic1"])
    lane = LaneEvent(EventType.FAILOVER_START, pid=5, nic="nic0", conn_id=1, t_ns=S + MS)
    spans = a.signal(tracing.Signal("nic0", "netlink", "carrier_down", S, S + 40 * MS))
    spans += a.transition(StateChange("nic0", "up", "down", "carrier down", S, S + 40 * MS))
    spans += a.decision(Decision("nic0", "p", "migrate", (Pair("nic1", 1, weight=1.0),), S, S))
    spans += a.lane_event(lane, 5, S)
    end = LaneEvent(EventType.FAILOVER_END, pid=5, nic="nic0", conn_id=1, t_ns=S + 31 * MS)
    spans += a.lane_event(end, 5, S)
    spans += a.transition(StateChange("nic0", "down", "up", "recovered", 3 * S, 3 * S))
    spans += a.lane_event(
        LaneEvent(EventType.FAILBACK, pid=5, nic="nic0", conn_id=1, t_ns=4 * S), 5, 0
    )
    a.transition(StateChange("nic1", "up", "down", "device fatal", 5 * S, 5 * S))
    spans += a.decision(Decision("nic1", "p", "migrate", (), 5 * S, 5 * S))
    m.observe_spans(spans)
    assert value(m, "railhop_failovers_total", device="nic0", cause="carrier_down") == 1
    assert value(m, "railhop_detection_latency_seconds_count", source="netlink") == 1
    assert value(m, "railhop_detection_latency_seconds_sum", source="netlink") == pytest.approx(
        0.040
    )
    assert value(m, "railhop_detection_latency_seconds_bucket", source="netlink", le="0.05") == 1
    assert value(m, "railhop_detection_latency_seconds_bucket", source="netlink", le="0.025") == 0
    completion = value(m, "railhop_failover_completion_seconds_sum", device="nic0")
    assert completion == pytest.approx(0.030)
    assert value(m, "railhop_failbacks_total", device="nic0") == 1
    assert value(m, "railhop_escalations_total", device="nic1", reason="no_backup_pair") == 1


def test_nic_state_and_lanes() -> None:
    alive = {10: True, 11: True}
    m = AgentMetrics(nics=["nic0", "nic1"], pid_alive=lambda p: alive.get(p, False))
    m.transition("nic0", "down")
    assert value(m, "railhop_nic_state", device="nic0", state="down") == 1
    assert value(m, "railhop_nic_state", device="nic0", state="up") == 0
    assert value(m, "railhop_nic_up", device="nic0") == 0
    assert value(m, "railhop_nic_transitions_total", device="nic0", to="down") == 1

    def ev(t: EventType, nic: str, conn: int, lane: int) -> LaneEvent:
        return LaneEvent(t, pid=1, nic=nic, conn_id=conn, lane=lane)

    for conn in range(3):
        m.lane_event(ev(EventType.LANE_UP, "nic0", conn, 0), 10)
    m.lane_event(ev(EventType.LANE_UP, "nic1", 0, 1), 11)
    assert value(m, "railhop_lanes", device="nic0") == 3
    m.lane_event(ev(EventType.LANE_ERROR, "nic0", 0, 0), 10)
    m.lane_event(ev(EventType.LANE_DOWN, "nic0", 1, 0), 10)
    m.lane_event(ev(EventType.LANE_DOWN, "nic0", 7, 7), 10)  # unknown lane: ignored
    assert value(m, "railhop_lanes", device="nic0") == 1
    assert value(m, "railhop_lane_events_total", type="lane_up") == 4
    alive[10] = False  # that process exited without LANE_DOWN
    m.prune()
    assert value(m, "railhop_lanes", device="nic0") == 0
    assert value(m, "railhop_lanes", device="nic1") == 1


@dataclass
class Stats:
    pid: int
    lane: int
    reqs: int
    bytes: int
    lat_sum_ns: int
    lat_log2: tuple[int, ...]


def test_scrape_time_samples(tmp_path: Path) -> None:
    for nic, rx, tx in (("nic0", 100, 200), ("nic1", 7, 9)):
        d = tmp_path / "sys/class/net" / nic / "statistics"
        d.mkdir(parents=True)
        (d / "rx_bytes").write_text(f"{rx}\n")
        (d / "tx_bytes").write_text(f"{tx}\n")
    m = AgentMetrics(nics=["nic0", "nic1", "gone0"], sys_root=tmp_path)
    lat = [0] * 40
    lat[20], lat[21] = 3, 1  # [2^20, 2^21) ns and [2^21, 2^22) ns
    m.set_lane_stats(lambda: [Stats(5, 2, 4, 4096, 5_000_000, tuple(lat))])
    m.set_control(
        lambda: ControlCounters(1, 2, 0, 3, 3, 0, 0, 0, events=42, malformed=1, queue_dropped=0)
    )
    assert value(m, "railhop_nic_bytes_total", device="nic0", direction="tx") == 200
    assert value(m, "railhop_nic_bytes_total", device="nic1", direction="rx") == 7
    assert value(m, "railhop_nic_bytes_total", device="gone0", direction="rx") is None
    assert value(m, "railhop_lane_bytes_total", lane="2") == 4096
    le = repr(2.0**21 / 1e9)
    assert value(m, "railhop_request_completion_seconds_bucket", lane="2", le=le) == 3
    assert value(m, "railhop_request_completion_seconds_count", lane="2") == 4
    assert value(m, "railhop_control_events_total") == 42
    assert value(m, "railhop_control_clients") == 3
    # a provider that fails drops its samples, not the scrape
    m.set_lane_stats(lambda: 1 / 0)  # type: ignore[arg-type,return-value]
    assert b"railhop_nic_bytes_total" in m.render()


def test_endpoint_serves_and_stops() -> None:
    m = AgentMetrics(nics=["nic0"])
    m.transition("nic0", "down")
    srv = MetricsServer(m, 0, "127.0.0.1")
    port = srv.start()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert 'railhop_nic_state{device="nic0",state="down"} 1.0' in text
    busy = MetricsServer(m, port, "127.0.0.1")
    with pytest.raises(MetricsError, match=str(port)):
        busy.start()
    srv.stop()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


def test_lane_series_sum_processes_and_never_go_down() -> None:
    """No pid label (unbounded): per-lane series sum every traced process; a process that
    exits keeps its bytes in the counter, and lane indices past the plugin's are "other"."""
    m = AgentMetrics(nics=["nic0"])
    lat = (0, 1, 0)
    stats = [
        Stats(5, 0, 1, 100, 2, lat),
        Stats(6, 0, 2, 50, 4, (0, 2, 0)),
        Stats(6, 999, 1, 7, 1, lat),
    ]
    m.set_lane_stats(lambda: stats)
    assert value(m, "railhop_lane_bytes_total", lane="0") == 150
    assert value(m, "railhop_lane_bytes_total", lane="other") == 7
    assert value(m, "railhop_request_completion_seconds_count", lane="0") == 3
    stats = [Stats(5, 0, 3, 300, 6, (0, 3, 0))]  # pid 6 exited, pid 5 sent 200 more bytes
    assert value(m, "railhop_lane_bytes_total", lane="0") == 350
    assert value(m, "railhop_request_completion_seconds_count", lane="0") == 5
    assert value(m, "railhop_request_completion_seconds_bucket", lane="0", le=repr(4 / 1e9)) == 5
    text = m.render().decode()
    assert "pid=" not in text


def test_build_info_process_collector_and_no_created_series() -> None:
    from railhop import __version__

    m = AgentMetrics(nics=["nic0"])
    m.transition("nic0", "down")
    m.observe_spans([])
    labels = {"version": __version__}
    samples = {
        s.name: s for fam in m.registry.collect() for s in fam.samples if s.name.endswith("_info")
    }
    assert samples["railhop_build_info"].value == 1
    assert samples["railhop_build_info"].labels["version"] == labels["version"]
    assert (value(m, "process_resident_memory_bytes") or 0) > 0
    assert (value(m, "process_open_fds") or 0) > 0
    text = m.render().decode()
    assert "railhop_nic_transitions_total" in text
    assert "_created" not in text
