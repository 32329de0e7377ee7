"""The agent loop (railhop.daemon) on the DGX H100 fixture: signals and lane events move NICs,
the table follows with plans, a bad policy reload keeps the last good one, SIGTERM stops it."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from railhop import daemon, health
from railhop.control import (
    Distance,
    EventType,
    LaneEvent,
    NicState,
    Reason,
    TableError,
    TableSnapshot,
    encode_event,
    read_table,
)
from railhop.sources import events as sev
from railhop.topology import DistanceClass, read_topology

REPO = Path(__file__).resolve().parents[2]
DGX = REPO / "tests" / "fixtures" / "sys" / "dgx-h100"
POLICY = REPO / "policies" / "rail-optimized-8nic.yaml"


def test_distance_enums_agree() -> None:
    assert {d.name: d.value for d in Distance} == {d.name: d.value for d in DistanceClass}


def test_source_events_translate_to_health_events() -> None:
    topo = read_topology(DGX)
    alias = daemon.aliases(topo)
    assert alias["mlx5_0"] == alias["ibp25s0"] == alias["mlx5_0/1"] == "ibp25s0"
    t = 5_000_000_000
    f = daemon.health_event_from_source
    assert f(sev.CarrierDown(ts_ns=t, source="nl", ifname="ibp25s0"), alias) == (
        health.CarrierDown("ibp25s0", 5.0)
    )
    assert f(sev.CarrierDown(ts_ns=t, source="bpf", ifname="ibp25s0", certain=False), alias) is None
    assert f(sev.CarrierUp(ts_ns=t, source="nl", ifname="ibp59s0"), alias) == health.CarrierUp(
        "ibp59s0", 5.0
    )
    assert f(sev.CarrierDown(ts_ns=t, source="nl", ifname="veth9"), alias) is None
    breach = sev.CounterBreach(
        ts_ns=t, source="sysfs", obj="mlx5_1/1", counter="symbol_error", rate=9.0, threshold=1.0
    )
    assert f(breach, alias) == health.CounterBreach("ibp59s0", 5.0, "symbol_error", 9.0, 1.0)
    port = sev.RdmaPortEvent(
        ts_ns=t, source="verbs", device="mlx5_2", event="PORT_ERR", code=10, port=1
    )
    assert f(port, alias) == health.CarrierDown("ibp76s0", 5.0)
    lane = LaneEvent(EventType.LANE_TIMEOUT, pid=9, nic="ibp93s0", t_ns=t, conn_id=4)
    assert daemon.health_event_from_lane(lane, alias) == health.LaneTimeout(
        "ibp93s0", 5.0, detail="pid 9 conn 4"
    )
    up = LaneEvent(EventType.LANE_UP, pid=9, nic="ibp93s0", t_ns=t)
    assert daemon.health_event_from_lane(up, alias) is None


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("carrier down", Reason.CARRIER),
        ("link down at start", Reason.CARRIER),
        ("lane timeout", Reason.LANE_TIMEOUT),
        ("3 strikes within 2s: lane error", Reason.LANE_ERROR),
        ("counter breach symbol_error 9/s > 1/s", Reason.COUNTERS),
        ("carrier down while recovering", Reason.FLAPPING),
        ("hold-off over", Reason.FLAPPING),
        ("device fatal", Reason.DEVICE_FATAL),
        ("admin down: maintenance", Reason.ADMIN),
        ("initial", Reason.NONE),
        ("something new", Reason.OTHER),
    ],
)
def test_reason_codes(text: str, code: Reason) -> None:
    assert daemon.reason_code(text) == code


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.01)


def snap(path: Path) -> TableSnapshot | None:
    try:
        return read_table(path)
    except TableError:
        return None


class FakeSource:
    """A source the test drives by hand."""

    name = "fake"

    def __init__(self) -> None:
        self.emit: Callable[[Any], None] | None = None
        self.stopped = False

    async def start(self, emit: Callable[[Any], None]) -> list[Any]:
        self.emit = emit
        return []

    async def stop(self) -> None:
        self.stopped = True


def state_of(s: TableSnapshot | None, ifname: str) -> NicState | None:
    if s is None:
        return None
    return next((n.state for n in s.nics if n.ifname == ifname), None)


def test_agent_end_to_end(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.read_text())
    run_dir = tmp_path / "run"
    fake = FakeSource()
    cfg = daemon.AgentConfig(
        policy_path=policy, run_dir=run_dir, sys_root=DGX, heartbeat_ms=50, reload_interval_s=0.05
    )
    agent = daemon.Agent(cfg, source_factory=lambda c, t, p: [fake])
    table = run_dir / "health.tbl"

    async def body() -> None:
        task = asyncio.create_task(agent.run())
        await until(lambda: snap(table) is not None and fake.emit is not None)
        first = snap(table)
        assert first is not None
        assert {n.ifname for n in first.nics} >= {"ibp25s0", "ibp59s0", "ibp76s0"}
        assert all(n.state == NicState.UP for n in first.nics)
        assert first.plans == {}
        rails = {n.ifname: n.rail for n in first.nics}

        # carrier loss on NIC 2 (ibp76s0): DOWN at once, with a plan to same-rail-rule backups
        assert fake.emit is not None
        fake.emit(sev.CarrierDown(ts_ns=time.monotonic_ns(), source="fake", ifname="ibp76s0"))
        await until(lambda: state_of(snap(table), "ibp76s0") == NicState.DOWN)
        s = snap(table)
        assert s is not None
        nic = next(n for n in s.nics if n.ifname == "ibp76s0")
        assert nic.reason == Reason.CARRIER and nic.since_ns > 0
        backups = s.plans["ibp76s0"]
        assert backups and all(b.local_nic != "ibp76s0" for b in backups)
        assert all(state_of(s, b.local_nic) == NicState.UP for b in backups)
        assert all(b.distance is not None and b.distance <= Distance.NODE for b in backups)
        assert all(b.weight > 0 for b in backups)
        assert rails["ibp76s0"] is not None

        # a plugin's lane timeout on NIC 3: DOWN (lane_timeout is in down_on by default)
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as c:
            c.connect(str(run_dir / "agent.sock"))
            c.send(
                encode_event(
                    LaneEvent(
                        EventType.LANE_TIMEOUT,
                        pid=os.getpid(),
                        nic="ibp93s0",
                        t_ns=time.monotonic_ns(),
                    )
                )
            )
            await until(
                lambda: state_of(snap(table), "ibp93s0") in (NicState.DOWN, NicState.SUSPECT)
            )

        # the policy file turns invalid: logged, counted, last good policy kept
        before = agent.policy
        policy.write_text("version: 1\nrail_rule: {kind: nonsense}\n")
        await until(lambda: agent.stats.policy_errors >= 1)
        assert agent.policy is before

        agent.request_stop()
        assert await asyncio.wait_for(task, 10) == 0

    asyncio.run(body())
    assert fake.stopped
    assert not (run_dir / "agent.sock").exists()
    final = read_table(table)
    assert final.agent_gone
    assert agent.stats.transitions >= 2 and agent.stats.lane_events == 1


def test_sigterm_stops_the_agent_cleanly(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    code = (
        "import sys; from pathlib import Path; from railhop import daemon; "
        "sys.exit(daemon.run_agent(daemon.AgentConfig(run_dir=Path(sys.argv[1]), "
        "sys_root=Path(sys.argv[2]), sources=())))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "agent")}
    proc = subprocess.Popen([sys.executable, "-c", code, str(run_dir), str(DGX)], env=env)
    try:
        deadline = time.monotonic() + 30
        while snap(run_dir / "health.tbl") is None:
            assert proc.poll() is None, "agent exited early"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - t0 < 5
    finally:
        proc.kill()
    s = read_table(run_dir / "health.tbl")
    assert s.agent_gone and len(s.nics) > 0
    assert not (run_dir / "agent.sock").exists()
