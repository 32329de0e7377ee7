"""The real agent daemon inside an emulated node (root): carrier loss moves every connection on
the NIC before any timeout, the eBPF carrier signal reaches the daemon with a kernel timestamp
ahead of netlink's (arrival order at the daemon is a ~0.2 ms race: printed, not asserted), and
the plugins keep moving checked data when the agent is SIGKILLed, restarted, or its table is
overwritten with garbage. (A policy file that turns invalid on reload is covered without root
in tests/unit/test_control_daemon.py.)

The agent runs in node 0's netns serving ``work/run-node0``, the RAILHOP_RUN_DIR the harness
gives node 0's plugin processes (railhop_lab.harness.HarnessRun). Every byte is checked by the
harness receiver (``res.ok``: no data error, no request error).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import require, require_built, until
from railhop.control import NicState, Reason, TableError, read_table
from railhop_lab.fabric import Fabric, unique_prefix
from railhop_lab.harness import HarnessConfig, HarnessRun, wait_for_bytes

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
# the capability report line of the eBPF carrier hook (or the source's start failure)
CARRIER_CAP = (
    r"ebpf\.carrier:carrier\s+(attached \(\S+\)|skipped.*)|source ebpf\.carrier (failed.*)"
)
AGENT = """
import logging, sys
from pathlib import Path
from railhop import daemon
logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(asctime)s %(name)s %(levelname)s %(message)s")
cfg = daemon.AgentConfig(
    run_dir=Path(sys.argv[1]), nics=("nic0", "nic1", "nic2", "nic3"),
    sources=tuple(x for x in sys.argv[2].split(",") if x), heartbeat_ms=100, duration_s=300)
sys.exit(daemon.run_agent(cfg))
"""


@pytest.fixture(scope="module")
def fab() -> Iterator[Fabric]:
    require_built()
    with Fabric(nodes=2, nics=4, rate_mbit=200, prefix=unique_prefix("rhag")) as f:
        yield f


class Agent:
    def __init__(self, fab: Fabric, run_dir: Path, log: Path, sources: str) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(REPO / "agent")}
        self.log = log
        with log.open("a") as err:
            self.proc: subprocess.Popen[Any] = fab.popen(
                0, [sys.executable, "-c", AGENT, str(run_dir), sources], env, stderr=err
            )
        self.table = run_dir / "health.tbl"

    def ready(self, ebpf: bool = False, timeout: float = 240.0, tcp: bool = False) -> None:
        def ok() -> bool:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            text = self.log.read_text()
            # the capability lines come after "source ... started": wait for them, so a test
            # never reads the report half written
            if ebpf and not re.search(CARRIER_CAP, text):
                return False
            if tcp and not re.search(
                r"source ebpf\.tcp failed|ebpf\.tcp:\S+\s+(attached|skipped)", text
            ):
                return False
            return _snap_pid(self.table) == self.proc.pid

        until(ok, timeout, "agent up")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _snap_pid(table: Path) -> int | None:
    try:
        return read_table(table).agent_pid
    except (TableError, OSError):
        return None


def state(table: Path, nic: str) -> tuple[NicState, Reason] | None:
    try:
        snap = read_table(table)
    except (TableError, OSError):
        return None
    return next(((n.state, n.reason) for n in snap.nics if n.ifname == nic), None)


def conn_bytes(run: HarnessRun, conn: int) -> int:
    prog = run.sides["recv"].progress
    return prog[-1].per_conn[conn] if prog else 0


def test_carrier_loss_moves_every_connection_before_any_timeout(
    fab: Fabric, tmp_path: Path
) -> None:
    """nic1 of node 0 loses carrier; the completion timeout is 10 s, so only a carrier signal
    (the agent's table, or the plugin's own carrier check) can move connections 1 and 5 (both
    on nic1): they must carry data again well before it (< 5 s, replay of in-flight messages
    at the 200 Mbit/s tbf rate included), and the agent marks nic1 DOWN (carrier)."""
    work = tmp_path / "work"
    agent = Agent(fab, work / "run-node0", tmp_path / "agent.log", "netlink,ebpf")
    try:
        agent.ready(ebpf=True)
        cfg = HarnessConfig(
            conns=8, sizes=(256 * 1024, 4096), inflight=2, duration=7.0, deadline=60.0, seed=3
        )
        env = {"RAILHOP_COMPLETION_TIMEOUT": "10000"}
        with HarnessRun(fab, cfg, env=env, workdir=work) as run:
            wait_for_bytes(run, 16 * MiB, timeout=30)
            until(lambda: min(conn_bytes(run, c) for c in (1, 5)) > 0, 10, "lanes on nic1")
            t0 = time.monotonic()
            fab.carrier_down(0, 1, end="remote")
            until(
                lambda: state(agent.table, "nic1") == (NicState.DOWN, Reason.CARRIER),
                2,
                "agent: nic1 down",
            )
            marks = {c: conn_bytes(run, c) for c in (1, 5)}
            until(
                lambda: all(conn_bytes(run, c) > marks[c] + 256 * 1024 for c in (1, 5)),
                5,
                "connections on nic1 moving again",
            )
            moved_s = time.monotonic() - t0
            assert moved_s < 5.0, moved_s  # at half the 10 s completion timeout, at most
            fab.heal(0, 1)
            res = run.wait()
        assert res.ok, res.describe()
        assert res.recv.summary is not None and res.recv.summary.data_errors == 0
        log = agent.log.read_text()
        assert "nic1: up -> down (carrier down)" in log, log[-3000:]
    finally:
        agent.stop()
        fab.heal_all()


LOST_NIC1 = re.compile(r"\[\s*([0-9.]+)\].*lane \d+ nic1 -> .* failed: transport lost the path")


def test_blackhole_tcp_signal_moves_the_lane_before_the_timeout(
    fab: Fabric, tmp_path: Path
) -> None:
    """nic1 of node 0 is blackholed (carrier stays up). With a 4 s completion timeout and a 2 s
    probe deadline in the plugin, only the agent's eBPF TCP signal (an RTO on the lane's own
    sockets -> nic1 SUSPECT) confirmed by the lane's TCP loss state can fail the lane within a
    second; the agent's log shows the TCP suspicion and the plugin's the transport's verdict,
    and connection 1 carries checked data again."""
    work = tmp_path / "work"
    agent = Agent(fab, work / "run-node0", tmp_path / "agent.log", "netlink,ebpf")
    try:
        agent.ready(ebpf=True, tcp=True)
        assert re.search(r"source ebpf\.tcp started", agent.log.read_text()), agent.log.read_text()
        cfg = HarnessConfig(conns=4, sizes=(1 << 20,), duration=7.0, deadline=60.0, seed=5)
        env = {
            "RAILHOP_COMPLETION_TIMEOUT": "4000",
            "RAILHOP_PROBE_TIMEOUT": "2000",
            "RAILHOP_HARNESS_VERBOSE": "1",  # a lane's failure is an INFO line
        }
        with HarnessRun(fab, cfg, env=env, workdir=work) as run:
            wait_for_bytes(run, 16 * MiB, timeout=30)
            until(lambda: conn_bytes(run, 1) > 0, 10, "a lane on nic1")
            t_fault = time.monotonic() - run.started_at
            fab.blackhole(0, 1)
            # Bytes already past the bridge keep arriving for a while, so progress alone does
            # not show the move (a CI run healed before anything failed): wait for the
            # plugin's verdict first (bounded), then for connection 1 to move again.
            until(
                lambda: LOST_NIC1.search((work / "send.stderr").read_text()),
                6.0,
                "the lane on nic1 failing",
            )
            mark = conn_bytes(run, 1)
            # the data itself then waits for the backup lanes' TCP ramp on the loaded NICs
            until(lambda: conn_bytes(run, 1) > mark + 2 * MiB, 6.0, "connection 1 moving again")
            fab.heal(0, 1)
            res = run.wait()
        assert res.ok, res.describe()
        m = LOST_NIC1.search((work / "send.stderr").read_text())
        assert m, res.describe()
        moved = float(m.group(1)) - t_fault
        print(f"blackhole: lane on nic1 failed {moved:.3f} s after the fault")
        log = agent.log.read_text()
        assert re.search(r"nic1: up -> suspect \(tcp", log), log[-3000:]
        # before the lane's own 4 s completion timeout could have failed it (how early is a
        # benchmark: bench/failover_timeline.py); a bound that a loaded host does not break
        assert moved < 4.0, moved
    finally:
        agent.stop()
        fab.heal_all()


def test_ebpf_carrier_signal_reaches_the_daemon_before_netlink(fab: Fabric, tmp_path: Path) -> None:
    agent = Agent(fab, tmp_path / "run", tmp_path / "agent.log", "netlink,ebpf")
    try:
        agent.ready(ebpf=True)
        text = agent.log.read_text()
        cap = re.search(CARRIER_CAP, text)
        # raw tracepoints and BTF work on every CI machine: a missing hook there is a failure
        require(
            cap is not None and "attached (" in cap.group(0),
            f"eBPF carrier hook not attached here: {cap.group(0) if cap else text[-2000:]}",
        )

        def downs() -> list[tuple[str, int]]:
            pat = r"nic2: carrier_down from (\S+) \(\S+\) ts_ns (\d+)"
            return [(m[0], int(m[1])) for m in re.findall(pat, agent.log.read_text())]

        def ups() -> int:
            return agent.log.read_text().count("nic2: carrier_up from")

        def more_downs(n: int) -> Callable[[], bool]:
            return lambda: len(downs()) >= n

        def more_ups(n: int) -> Callable[[], bool]:
            return lambda: ups() > n

        order: list[str] = []
        both = 0
        for cycle in range(5):
            n_down, n_up = len(downs()), ups()
            fab.carrier_down(0, 2, end="remote")
            until(lambda n=n_down: "netlink" in dict(downs()[n:]), 5, "netlink reported the loss")
            # the eBPF proxy (qdisc_reset in linkwatch's dev_deactivate) can miss a loss that
            # follows a carrier-up within milliseconds (seen once in a CI-style run: 5th cycle,
            # 8 ms after the heal): give it the same bound, then count, do not demand
            with contextlib.suppress(AssertionError):
                until(more_downs(n_down + 2), 2, "the eBPF source reported the loss")
            seen = dict(downs()[n_down:])
            until(lambda: state(agent.table, "nic2") == (NicState.DOWN, Reason.CARRIER), 2, "DOWN")
            if seen.keys() == {"ebpf.carrier", "netlink"}:
                both += 1
                # the kernel saw it first through eBPF (qdisc_reset runs in linkwatch before
                # the RTM_NEWLINK is sent); the NIC is DOWN since the first signal's time
                assert seen["ebpf.carrier"] < seen["netlink"], (cycle, seen)
                first = downs()[n_down][0]
                order.append(first)
                snap = read_table(agent.table)
                since = next(n.since_ns for n in snap.nics if n.ifname == "nic2")
                if first == "ebpf.carrier":
                    # the health model keeps times as float seconds: ns survive to ~1 us
                    assert abs(since - seen["ebpf.carrier"]) <= 1000, (since, seen)
            fab.heal(0, 2)
            until(more_ups(n_up), 5, "carrier back up")
            # a cable pulled, not a flap: the next loss comes at least linkwatch's batching
            # interval (1 s, HZ) after the carrier came back. A loss a few ms after the
            # carrier-up can find the queues not yet re-activated, so dev_deactivate() resets
            # no qdisc and the raw-tracepoint proxy sees nothing (netlink still reports it):
            # seen here in 2 of 5 cycles whose loss followed the up by 4 ms.
            time.sleep(1.0)
        assert both >= 4, f"the eBPF source reported only {both} of 5 losses"
        # arrival order at the daemon: the eBPF record crosses a ring buffer, a poll thread
        # and the GIL, netlink's message is read on the loop itself; eBPF leads by ~0.2 ms
        # here, so the arrival order is a race (reported, not asserted)
        print(f"first at the daemon per cycle: {order}")
    finally:
        agent.stop()
        fab.heal_all()


def test_plugins_survive_agent_kill_restart_and_a_corrupt_table(
    fab: Fabric, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    run_dir = work / "run-node0"
    log = tmp_path / "agent.log"
    agent = Agent(fab, run_dir, log, "netlink")
    agent.ready()
    cfg = HarnessConfig(conns=4, sizes=(MiB, 4096, 65537), duration=9.0, deadline=60.0, seed=5)
    try:
        with HarnessRun(fab, cfg, workdir=work) as run:
            wait_for_bytes(run, 8 * MiB, timeout=30)

            def flowing(what: str) -> None:
                mark = run.sides["recv"].progress[-1].bytes
                until(lambda: run.sides["recv"].progress[-1].bytes > mark + 4 * MiB, 5, what)

            agent.proc.send_signal(signal.SIGKILL)  # no AGENT_GONE: the heartbeat goes stale
            agent.proc.wait(10)
            flowing("data after SIGKILL")
            agent = Agent(fab, run_dir, log, "netlink")  # a restart: new table, generation + 1
            agent.ready()
            flowing("data after the restart")
            with agent.table.open("r+b") as f:  # garbage over the body, NICs and plans
                f.seek(64)
                f.write(os.urandom(4096))
            with pytest.raises(TableError):
                read_table(agent.table)
            flowing("data with a corrupt table")
            res = run.wait()
        assert res.ok, res.describe()
        s = res.recv.summary
        assert s is not None and s.data_errors == 0 and s.bytes > 24 * MiB
        assert agent.proc.poll() is None, log.read_text()[-2000:]  # the agent is unharmed
    finally:
        agent.stop()
