"""A real failover on the emulated fabric, traced (root).

The agent runs inside node 0 (its netlink source sees node 0's NICs), with an OTLP/HTTP receiver
(tests/unit/test_tracing_otlp.py --serve) in the same netns, configured only by OTEL_* variables.
The harness moves checked data over 4 connections through the plugin; NIC 1 of node 0 loses
carrier at the switch side; the test scrapes the metrics endpoint during the failover, heals the
link, and checks the trace the receiver decoded: span tree, attributes, timings.

The plugin's lane events reach the agent two ways, one test each: on agent.sock (the plugin
shares the agent's RAILHOP_RUN_DIR), or, for a plugin that cannot reach the agent, through its
USDT probes (the USDT source on the plugin library, railhop.daemon.UsdtLaneTranslator). Either
way the trace has the migration of the connection that used nic1 and its fail-back. Those run
without a warm standby (the move opens its lanes); two more run with one, each way: the move
promotes it (the plugin's LANE_UP flagged promoted, or its standby_promoted probe), and the
migration lists the promoted lane and says standby.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import require_built, until
from railhop import paths, tracing
from railhop_lab.demo import scrape
from railhop_lab.fabric import Fabric, unique_prefix
from railhop_lab.harness import HarnessConfig, HarnessRun, wait_for_bytes

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[2]
RECEIVER = REPO / "tests" / "unit" / "test_tracing_otlp.py"
MiB = 1 << 20
METRICS_PORT = 18464  # railhop.metrics.DEFAULT_PORT
FAILED_NIC = 1

AGENT = """
import logging, sys
from pathlib import Path
from railhop import daemon
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
cfg = daemon.AgentConfig(
    run_dir=Path(sys.argv[1]), nics=("nic0", "nic1", "nic2", "nic3"), sources=("netlink",),
    traces=True, trace_file=Path(sys.argv[2]), metrics_port=int(sys.argv[3]),
    metrics_addr="127.0.0.1", heartbeat_ms=100,
    usdt_lib=Path(sys.argv[4]) if sys.argv[4] else None)
sys.exit(daemon.run_agent(cfg))
"""


@pytest.fixture(scope="module")
def fab() -> Iterator[Fabric]:
    require_built()
    with Fabric(nodes=2, nics=4, rate_mbit=200, prefix=unique_prefix("rhtr")) as f:
        yield f


def metrics0(fab: Fabric) -> dict[str, float]:
    """Node 0's agent's metrics (its endpoint listens on the node's loopback)."""
    return scrape(fab, 0, METRICS_PORT, timeout=5.0)


def try_scrape(fab: Fabric) -> dict[str, float] | None:
    try:
        return metrics0(fab)
    except OSError:
        return None


def spans_of(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in out.read_text().splitlines() if x.strip()]


@pytest.mark.parametrize(
    ("lanes_from", "standby"),
    [("socket", False), ("usdt", False), ("socket", True), ("usdt", True)],
    ids=["socket", "usdt", "socket-standby", "usdt-standby"],
)
def test_real_failover_is_traced_and_measured(
    fab: Fabric, tmp_path: Path, lanes_from: str, standby: bool
) -> None:
    work = tmp_path / "work"
    # socket: node 0's processes get work/run-node0 as RAILHOP_RUN_DIR (HarnessRun), the
    # agent's; usdt: the plugin cannot reach this agent
    run_dir = work / "run-node0" if lanes_from == "socket" else tmp_path / "agent-run"
    run_dir.mkdir(parents=True)
    usdt = lanes_from == "usdt"
    port_file, received = tmp_path / "otlp.port", tmp_path / "otlp.jsonl"
    received.touch()
    trace_file = tmp_path / "traces.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO / "agent")}
    receiver = fab.popen(
        0, [sys.executable, str(RECEIVER), "--serve", "http", str(port_file), str(received)], env
    )
    until(lambda: port_file.exists() and port_file.read_text(), 30, "receiver listening")
    agent_env = {
        **env,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port_file.read_text()}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "railhop-fabric",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "NODE_NAME": "emulated-node-0",
    }
    agent_log = tmp_path / "agent.log"
    with agent_log.open("w") as log:
        agent = fab.popen(
            0,
            [
                sys.executable,
                "-c",
                AGENT,
                str(run_dir),
                str(trace_file),
                str(METRICS_PORT),
                str(paths.plugin_path()) if usdt else "",
            ],
            agent_env,
            stderr=log,
        )
    try:

        def ready() -> bool:  # the endpoint is up and both sources started
            m = try_scrape(fab) or {}
            return agent.poll() is not None or (
                m.get('railhop_sources{source="netlink"}') == 1
                and (not usdt or m.get('railhop_sources{source="usdt.plugin"}') == 1)
            )

        until(ready, 90, "agent up")
        assert agent.poll() is None, agent_log.read_text()
        m0 = metrics0(fab)
        assert m0['railhop_nic_state{device="nic1",state="up"}'] == 1

        cfg = HarnessConfig(conns=4, sizes=(MiB, 4096), duration=9.0, deadline=40.0, seed=8)
        # without a warm standby the move opens its lanes; with one it promotes the standby
        # (no handshake), which the plugin reports as a LANE_UP flagged promoted
        lanes_env = {"RAILHOP_STANDBY_LANES": "1" if standby else "0"}
        with HarnessRun(fab, cfg, workdir=work, env=lanes_env) as run:
            wait_for_bytes(run, 16 * MiB, timeout=20)
            wall0 = time.time_ns()
            fab.carrier_down(0, FAILED_NIC, end="remote")
            wall1 = time.time_ns()
            until(
                lambda: metrics0(fab).get('railhop_nic_state{device="nic1",state="down"}') == 1,
                10,
                "nic1 down in the metrics",
            )
            seen_down = time.time_ns()  # the test saw DOWN: the agent decided before this
            during = metrics0(fab)
            time.sleep(1.0)  # a measured window: traffic must have moved off nic1
            later = metrics0(fab)
            fab.heal(0, FAILED_NIC)
            res = run.wait()
        assert res.ok, res.describe()
        assert res.recv.summary is not None and res.recv.summary.data_errors == 0

        # ---- metrics during the failover
        assert during['railhop_failovers_total{cause="carrier_down",device="nic1"}'] == 1
        assert during['railhop_detection_latency_seconds_count{source="netlink"}'] == 1
        # first bad signal -> DOWN: positive, and no longer than the window from the fault to
        # the scrape that showed DOWN (holds however loaded the host is; how short it is, is a
        # benchmark: bench/failover_timeline.py)
        latency = during['railhop_detection_latency_seconds_sum{source="netlink"}']
        print(f"netlink: first bad signal -> DOWN {latency:.3f} s")
        assert 0 < latency <= (seen_down - wall0) / 1e9, (latency, (seen_down - wall0) / 1e9)
        assert during['railhop_nic_up{device="nic1"}'] == 0
        ups = {i: during[f'railhop_nic_up{{device="nic{i}"}}'] for i in range(4)}
        assert ups == {0: 1, 1: 0, 2: 1, 3: 1}, (ups, agent_log.read_text()[-2000:])

        def delta(nic: int) -> float:
            k = f'railhop_nic_bytes_total{{device="nic{nic}",direction="tx"}}'
            return later[k] - during[k]

        deltas = {i: delta(i) for i in range(4)}
        assert deltas[FAILED_NIC] < 64 * 1024, f"bytes still leave the failed NIC: {deltas}"
        assert sum(deltas.values()) > 4 * MiB, f"the others do not carry the traffic: {deltas}"

        # ---- the trace: over when the NIC is back up (hold-off 1 s + 0.5 s stable)
        def root() -> dict[str, Any] | None:
            return next(
                (
                    s
                    for s in spans_of(received)
                    if s["name"] == tracing.FAILOVER
                    and s["attributes"]["network.interface.name"] == "nic1"
                ),
                None,
            )

        until(root, 40, "root span received")
        r = root()
        assert r is not None
        tree = [s for s in spans_of(received) if s["trace_id"] == r["trace_id"]]
        names = [s["name"] for s in tree]
        for n in (tracing.DETECTION, tracing.FAILBACK):
            assert names.count(n) == 1, names
        # one decision span per distinct plan for nic1: one, unless another NIC's health changed
        # while nic1 was down (a loaded host can make a lane on it late); numbered in order
        decs = sorted(
            (s for s in tree if s["name"] == tracing.DECISION),
            key=lambda s: s["attributes"]["railhop.decision.seq"],
        )
        assert [d["attributes"]["railhop.decision.seq"] for d in decs] == list(
            range(1, len(decs) + 1)
        ), names
        # every span is a child of the root, but the fair-share mark, a child of its migration
        migrations = {s["span_id"] for s in tree if s["name"] == tracing.MIGRATION}
        for s in tree:
            if s["span_id"] != r["span_id"]:
                want = migrations if s["name"] == tracing.FAIR_SHARE else {r["span_id"]}
                assert s["parent_id"] in want, (s["name"], names)
        assert r["resource"]["service.name"] == "railhop-fabric"
        assert r["resource"]["k8s.node.name"] == "emulated-node-0"
        ra = r["attributes"]
        assert ra["railhop.failover.cause"] == "carrier_down"
        assert ra["railhop.failover.source"] == "netlink"
        assert ra["railhop.failover.outcome"] == "failed_back"
        # timed by the netlink message, not by the agent: starts within the fault window
        assert wall0 - 50_000_000 <= r["start"] <= wall1 + 500_000_000
        # the agent decided `latency` after the message's time, before the test saw DOWN
        assert r["start"] + latency * 1e9 <= seen_down + 50_000_000
        det = next(s for s in tree if s["name"] == tracing.DETECTION)
        assert det["start"] == r["start"]
        assert det["attributes"]["railhop.detection.signal"] == "carrier_down"
        for dec in decs:
            pairs = dec["attributes"]["railhop.decision.pairs"]
            assert pairs and not any(p.startswith("nic1->") for p in pairs), pairs
        assert decs[0]["start"] >= det["start"]  # planned after the first sign
        fb = next(s for s in tree if s["name"] == tracing.FAILBACK)
        assert fb["end"] == r["end"] and fb["start"] > r["start"]
        assert fb["end"] - r["start"] >= 1_000_000_000  # the hold-off
        # the connection on nic1 (harness connection 1) moved and came back
        migrations = [s for s in tree if s["name"] == tracing.MIGRATION]
        assert len(migrations) == 1, (names, agent_log.read_text()[-3000:])
        mig = migrations[0]
        ma = mig["attributes"]
        assert ma["railhop.migration.outcome"] == "resumed"
        assert ma["railhop.migration.new_lanes"], ma
        assert not any(x.startswith("nic1") for x in ma["railhop.migration.new_lanes"])
        # the sender moved onto its warm standby (promoted, listed), or opened its lanes
        assert ma["railhop.migration.standby"] is standby, ma
        promoted = [e for e in mig.get("events", []) if e["name"] == "standby promoted"]
        assert bool(promoted) is standby, mig.get("events")
        assert wall0 - 50_000_000 <= mig["start"] <= mig["end"] < fb["start"]
        assert ra["railhop.failover.connections"] == 1
        assert fb["attributes"]["railhop.failback.connections"] == 1
        # 1 s into the failover: the connection resumed, its lanes moved off nic1
        assert later['railhop_failover_completion_seconds_count{device="nic1"}'] == 1
        assert later['railhop_lanes{device="nic1"}'] == 0
        # (>= 1: the plugin drops the LANE_UPs it makes before its control plane is open)
        assert sum(later[f'railhop_lanes{{device="nic{i}"}}'] for i in (0, 2, 3)) >= 1
        if usdt:
            assert any(k.startswith("railhop_lane_bytes_total") for k in later)
            assert later["railhop_control_events_total"] == 0
        else:
            assert later["railhop_control_events_total"] >= 4
        # the file sink has the same trace
        filed = {s["spanId"] for s in tracing.read_otlp_json(trace_file)}
        assert {s["span_id"] for s in tree} <= filed
    finally:
        agent.terminate()
        try:
            agent.wait(15)
        except subprocess.TimeoutExpired:
            agent.kill()
        receiver.kill()
        receiver.wait(10)
    assert agent.returncode == 0, agent_log.read_text()[-3000:]
