"""Fault suites of the ofi lane over libfabric's verbs provider between the two Soft-RoCE guests.

The netns fabric's failover suites (tests/privileged/test_failover.py) over real RDMA queue pairs:
a silent blackhole on a rail (and the healthy rails kept moving while the failed lane closes),
2 of 4 rails down at once with heal and fail-back, a carrier loss at the sender's own end,
escalation when every rail is down, and the agent in both guests moving a lane with its own
"down". Every byte is checked by the
harness; 0 data errors everywhere. Runs on the session's shared boot of the guests
(tests/conftest.py). Needs root, QEMU, virtme-ng, a kernel with rxe and a built plugin and
harness (``make ctest``); in CI a missing prerequisite fails.
"""

from __future__ import annotations

import re
import time

import pytest

from conftest import check_clean
from railhop_lab.harness import HarnessConfig, Progress
from railhop_lab.vmagent import AGENT_RUN_DIR, GuestAgent
from railhop_lab.vmharness import VERBS_ENV, VmHarnessRun, wait_for_bytes, wait_for_each_conn
from railhop_lab.vmlab import VmLab

# emulated guests on shared cores: every wait inside has its own bound (the harness runs for a
# fixed duration; on a loaded host its set-up alone took 30 s of it). The cases with a heal and
# a fail-back outlasted a 150 s run on a loaded host (several labs at once): they run for up to
# OPEN_S and end the run themselves (VmHarnessRun.finish) once every step moved its bytes.
pytestmark = [pytest.mark.privileged, pytest.mark.vm, pytest.mark.timeout(900)]

MiB = 1 << 20
COMPLETION_S = int(VERBS_ENV["RAILHOP_COMPLETION_TIMEOUT"]) / 1000
PROBE_S = int(VERBS_ENV["RAILHOP_PROBE_TIMEOUT"]) / 1000
OPEN_S = 420.0
# the agent's state as `railhop status` in a guest shows it (a run once failed "nic0 not up in
# 60 s: {}": no status answered for 60 s, while the plugin had seen the agent's "up")
AGENT_STATE_S = 150.0


def _cfg(duration: float = 80.0, expect_error: bool = False) -> HarnessConfig:
    return HarnessConfig(
        conns=4,
        sizes=(MiB,),
        duration=duration,
        inflight=4,
        deadline=duration + 180,
        expect_error=expect_error,
    )


def _log(run: VmHarnessRun, role: str) -> str:
    return (run.dir / f"{role}.err").read_text(errors="replace")


def _lane_failures(log: str, nic: int) -> list[str]:
    """The reasons given for failed lanes on local NIC ``nic`` (INFO lines of the core)."""
    return re.findall(rf"lane \d+ nic{nic} -> peer NIC \d+ failed: ([^(]+) \(", log)


def test_blackhole_on_a_rail_is_found_by_the_lane(lab: VmLab, built: None) -> None:
    """tc drops everything on node 1's nic0 with carrier and rxe ports up on both ends: no NIC
    event tells anyone. The lane itself finds it (its completion deadline, then the confirming
    probe, or the queue pair's retry limit), traffic moves to the other rails, heals, and every
    byte arrives."""
    with VmHarnessRun(lab, _cfg(), verbose=True) as run:
        wait_for_bytes(run, 8 * MiB, 180)
        lab.blackhole(1, 0)
        wait_for_each_conn(run, 4 * MiB, 150)
        for node in range(2):
            assert lab.port_states(node)[0] == ("ACTIVE", True), "a blackhole keeps the port up"
        lab.heal(0)
        res = run.wait()
    check_clean(res, 24 * MiB)
    send, recv = _log(run, "send"), _log(run, "recv")
    found = _lane_failures(send, 0) + _lane_failures(recv, 0)
    assert found, send[-4000:]
    assert "local NIC down" not in " ".join(found), found  # no carrier event: the lane found it
    assert "marked down" not in send + recv


def _wait_failbacks(run: VmHarnessRun, nics: tuple[int, ...], timeout: float) -> None:
    """Wait until the sender logged the fail-back of a connection to each of ``nics`` (bounded)."""
    deadline = time.monotonic() + timeout
    while not all(f"fail-back: nic{i} -> peer NIC {i} " in _log(run, "send") for i in nics):
        assert run.running(), f"harness exited before the fail-backs\n{_log(run, 'send')[-4000:]}"
        assert time.monotonic() < deadline, (
            f"no fail-back in {timeout} s\n{_log(run, 'send')[-4000:]}"
        )
        time.sleep(0.5)


def _joint_stall(prog: list[Progress], conns: range, t0: float, t1: float) -> float:
    """The longest time within which none of ``conns`` completed anything, from their last
    completion up to ``t0`` until ``t1`` (the harness's clock; still waiting at ``t1`` counts
    until then): a stall of the whole process shows here, one connection's slow link does not
    while the others move."""
    last_t, last_b = prog[0].t, [prog[0].per_conn[k] for k in conns]
    worst = 0.0
    for p in prog:
        if p.t > t1:
            break
        now = [p.per_conn[k] for k in conns]
        if now != last_b:
            if p.t > t0:
                worst = max(worst, p.t - last_t)
            last_t, last_b = p.t, now
    return max(worst, t1 - last_t)


def test_closing_a_blackholed_lane_keeps_the_healthy_rails_moving(lab: VmLab, built: None) -> None:
    """Connection k rides rail k; tc drops everything on node 1's nic0. The verbs provider's
    fi_close of an endpoint towards the dead pair (the failed lane's, the confirming probe's
    still connecting) blocks until rdma_cm gives up on the peer: 9-36 s measured. The ofi lane
    closes them on closer threads, so its one I/O thread keeps every other endpoint of the
    process moving: from the fault until connection 0 has moved on, the connections on the
    healthy rails never all stand still for a completion timeout at once (with the closes on
    the I/O thread they all stood still 10-15 s, and some moves escalated: "no NIC pair left
    to try"). Every byte checked."""
    with VmHarnessRun(lab, _cfg(OPEN_S), verbose=True) as run:
        wait_for_bytes(run, 8 * MiB, 180)
        t_fault = run.progress()[-1].t  # the receiver's clock: its last report before the fault
        lab.blackhole(1, 0)
        wait_for_each_conn(run, 4 * MiB, 240)  # connection 0 too: it moved
        t_end = run.progress()[-1].t
        lab.heal(0)
        run.finish()
        res = run.wait()
    check_clean(res, 24 * MiB)
    stall = _joint_stall(res.recv.progress, range(1, 4), t_fault, t_end)
    print(f"healthy rails: longest time with no completion on any of them {stall:.2f} s")
    recv = _log(run, "recv")
    assert _lane_failures(recv, 0) + _lane_failures(_log(run, "send"), 0), recv[-4000:]
    assert stall < COMPLETION_S, (
        f"every healthy rail's connection stood still {stall:.1f} s at once (>= the completion "
        f"timeout, {COMPLETION_S} s) while the failed lane closed\n{recv[-4000:]}"
    )


def test_two_of_four_rails_down_then_heal_and_fail_back(lab: VmLab, built: None) -> None:
    """Carrier loss at the remote end of rails 0 and 1 at once: the connections on them move to
    rails 2 and 3, every connection moves on; after the heal both fail back to their own rails
    and traffic moves after the fail-backs; every byte checked, both exit 0."""
    with VmHarnessRun(lab, _cfg(OPEN_S), verbose=True) as run:
        wait_for_bytes(run, 8 * MiB, 180)
        lab.carrier_down(0, 0, "remote")
        lab.carrier_down(0, 1, "remote")
        lab.wait_ports(1, {0: "DOWN", 1: "DOWN"}, 30)
        wait_for_each_conn(run, 4 * MiB, 150)
        lab.heal(0)
        lab.heal(1)
        _wait_failbacks(run, (0, 1), 150)
        wait_for_each_conn(run, 4 * MiB, 120)  # traffic moves after the fail-backs
        run.finish()
        res = run.wait()
    check_clean(res, 32 * MiB)
    recv = _log(run, "recv")
    for nic in (0, 1):  # the receiver lost both NICs: each lane on them failed for that
        assert "local NIC down" in " ".join(_lane_failures(recv, nic)), recv[-4000:]


def test_local_carrier_loss_moves_the_lane(lab: VmLab, built: None) -> None:
    """Carrier loss at the sender's own end of rail 0 (QMP on node 0; test_rdma_lab.py has the
    remote end): the sender's lanes on nic0 fail at once for their NIC, traffic moves to the
    other rails, the rail heals, the connection fails back and moves on; every byte checked."""
    with VmHarnessRun(lab, _cfg(OPEN_S), verbose=True) as run:
        wait_for_bytes(run, 8 * MiB, 180)
        lab.carrier_down(0, 0, "local")
        lab.wait_ports(0, {0: "DOWN"}, 30)
        wait_for_each_conn(run, 4 * MiB, 150)
        lab.heal(0)
        _wait_failbacks(run, (0,), 150)
        wait_for_each_conn(run, 4 * MiB, 120)
        run.finish()
        res = run.wait()
    check_clean(res, 24 * MiB)
    send = _log(run, "send")
    assert "local NIC down" in " ".join(_lane_failures(send, 0)), send[-4000:]
    assert "NIC nic0 marked down (carrier)" in send, send[-4000:]


def test_every_rail_down_is_a_prompt_clean_error(lab: VmLab, built: None) -> None:
    """Node 1 (the receiver) loses carrier on all four rails: no pair is left. Both processes
    report a clean request error (no data error), neither hangs, both exit 0 (--expect-error):
    the receiver at once (every local NIC down), the sender once its lanes' completion deadline,
    probe and handshakes have run out."""
    cfg = _cfg(200.0, expect_error=True)
    with VmHarnessRun(lab, cfg, verbose=True) as run:
        wait_for_bytes(run, 8 * MiB, 180)
        t_fault = time.monotonic()
        for nic in range(4):
            lab.carrier_down(0, nic, "remote")
        # the sender's bound: completion timeout, its confirming probe, the escalation bound
        # (a round of handshakes and the start of one re-probe: 3 probe timeouts) and the hard
        # cap behind it for lanes in flight (2 probe timeouts), with slack for emulated time;
        # far below the harness's own deadline
        bound = COMPLETION_S + PROBE_S + 3 * PROBE_S + 2 * PROBE_S + 30
        deadline = t_fault + bound
        while run.running():
            assert time.monotonic() < deadline, (
                f"hang: still running {bound:.0f} s after the fault\n{_log(run, 'send')[-3000:]}"
            )
            time.sleep(0.5)
        took = time.monotonic() - t_fault
        res = run.wait()
    print(f"every rail down: both sides exited {took:.1f} s after the fault")
    for side in (res.send, res.recv):
        assert not side.timed_out and side.returncode == 0, res.describe()
        s = side.summary
        assert s is not None and s.data_errors == 0, res.describe()
        assert s.first_error is not None and s.first_error.clean, res.describe()
    assert "no compatible NIC pair left" in _log(run, "send") + _log(run, "recv")


def test_agent_down_moves_the_lane(lab: VmLab, built: None) -> None:
    """The agent (netlink, sysfs, verbs) runs in both guests and the plugin reads it
    (RAILHOP_RUN_DIR) with its own carrier polling off (RAILHOP_CARRIER_POLL=0): a carrier loss
    at node 1's nic0 reaches the receiver's plugin only as the agent's "down", which fails the
    lane there at once; the connection moves, the rail heals (the agent's "up"), the connection
    fails back and moves on; every byte checked."""
    env = {"RAILHOP_RUN_DIR": AGENT_RUN_DIR, "RAILHOP_CARRIER_POLL": "0"}
    with GuestAgent(lab, 0) as a0, GuestAgent(lab, 1) as a1:
        a0.wait_up()
        a1.wait_up()
        with VmHarnessRun(lab, _cfg(OPEN_S), env=env, verbose=True) as run:
            wait_for_bytes(run, 8 * MiB, 180)
            lab.carrier_down(0, 0, "remote")
            # each status query is a Python start in the emulated guest: slow on a loaded host
            a1.wait_state(lab.ifname(0), "down", AGENT_STATE_S)
            wait_for_each_conn(run, 4 * MiB, 150)
            lab.heal(0)
            a1.wait_state(lab.ifname(0), "up", AGENT_STATE_S)
            _wait_failbacks(run, (0,), 150)
            wait_for_each_conn(run, 4 * MiB, 120)
            run.finish()
            res = run.wait()
        agent_log = a1.log_text()
    check_clean(res, 24 * MiB)
    recv = _log(run, "recv")
    assert "NIC nic0 marked down (agent)" in recv, recv[-4000:]
    assert "marked down (carrier)" not in recv, recv[-4000:]
    assert "local NIC down" in " ".join(_lane_failures(recv, 0)), recv[-4000:]
    assert f"{lab.ifname(0)}: carrier_down from" in agent_log, agent_log[-3000:]
