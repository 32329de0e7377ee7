"""The verbs lane (RAILHOP_TRANSPORT=verbs, plugin/src/lanes/verbs/, issue 27) between the two
Soft-RoCE guests of the VM lab: the ``railhop-harness`` ncclNet driver on each guest, one RC
queue pair per lane, DATA as RDMA writes with immediate into the receiver's posted buffers,
every byte checked by the receiver. Needs root, QEMU, virtme-ng and a kernel with rxe
(``make setup``) and the plugin and harness (``make ctest``); in CI a missing prerequisite fails
instead of skipping.
"""

from __future__ import annotations

import time

import pytest

from conftest import check_clean
from railhop_lab.harness import HarnessConfig
from railhop_lab.vmharness import VERBS_LANE_ENV, VmHarnessRun, wait_for_bytes, wait_for_each_conn
from railhop_lab.vmlab import VmLab

# the lab's boot may fall in this module's first test when it runs alone
pytestmark = [pytest.mark.privileged, pytest.mark.vm, pytest.mark.timeout(900)]

MiB = 1 << 20


def _logs(run: VmHarnessRun) -> dict[str, str]:
    return {r: (run.dir / f"{r}.err").read_text(errors="replace") for r in ("send", "recv")}


def test_verbs_lane_data_path(lab: VmLab, built: None) -> None:
    """Four connections over the four rails, every byte checked, both sides exit 0, and the
    lanes really are the verbs lane's (its listeners on every NIC, no other transport)."""
    # emulated rxe under a loaded host moves 1-10 MB/s in all: a generous deadline
    cfg = HarnessConfig(conns=4, sizes=(1 * MiB,), count=16, inflight=4, deadline=400)
    with VmHarnessRun(lab, cfg, env=VERBS_LANE_ENV, verbose=True) as run:
        res = run.wait()
    check_clean(res, 4 * 16 * MiB)
    for role, log in _logs(run).items():
        assert "transport verbs (RAILHOP_TRANSPORT=verbs)" in log, (role, log[-3000:])
        for nic in range(lab.nics):
            assert f"verbs: lane listener on {lab.ifname(nic)}" in log, (role, log[-3000:])


def test_verbs_lane_through_a_remote_carrier_loss(lab: VmLab, built: None) -> None:
    """Carrier loss at the remote end of rail 0 (QMP on the receiver's guest) during traffic: the
    sender's queue pair gets no ACKs, the receiver's port goes down. The connection on rail 0
    fails over (the core replays what the receiver lacks) and every connection keeps moving; the
    rail heals, the connection fails back onto a new queue pair there and traffic keeps moving;
    every byte checked, both exit 0."""
    cfg = HarnessConfig(conns=4, sizes=(1 * MiB,), duration=150, inflight=4, deadline=400)
    with VmHarnessRun(lab, cfg, env=VERBS_LANE_ENV, verbose=True) as run:
        wait_for_bytes(run, 4 * MiB, 240)
        lab.carrier_down(0, 0, "remote")
        lab.wait_ports(1, {0: "DOWN"}, 30)
        wait_for_each_conn(run, 2 * MiB, 200)
        lab.heal(0)
        wait_for_each_conn(run, 2 * MiB, 200)
        res = run.wait()
    check_clean(res, 16 * MiB)
    logs = _logs(run)
    send = logs["send"]
    # the move off rail 0 and the return to it (the run goes on 150 s, long past the heal). The
    # move's WARN line is the detecting side's: the receiver, whose port went down, often moves
    # first (onto the warm standby at once) and the sender follows its RESUME without a line
    move = "failover: nic0 -> peer NIC 0 failed"
    assert move in send or move in logs["recv"], send[-4000:] + logs["recv"][-4000:]
    assert "fail-back: nic0 -> peer NIC 0 is healthy again" in send, send[-4000:]


def test_verbs_lane_every_rail_down_is_a_clean_error(lab: VmLab, built: None) -> None:
    """Every rail loses carrier at the receiver's end during traffic: no NIC pair is left, so
    both sides end with a clean request error (ncclRemoteError / a failed request, no data
    error, no hang) instead of waiting for the harness's deadline."""
    cfg = HarnessConfig(
        conns=2, sizes=(1 * MiB,), duration=200, inflight=4, deadline=300, expect_error=True
    )
    with VmHarnessRun(lab, cfg, env=VERBS_LANE_ENV, verbose=True, grace_s=10) as run:
        wait_for_bytes(run, 4 * MiB, 240)
        t_fault = time.monotonic() - run.started_at
        for nic in range(lab.nics):
            lab.carrier_down(0, nic, "remote")
        # detection (8 s completion timeout) and the probes (10 s each) under emulation: the
        # error must come long before the 200 s run or the 300 s deadline would end it
        res = run.wait(timeout=t_fault + 150)
    for side in (res.send, res.recv):
        assert not side.timed_out, res.describe()
        assert side.returncode == 0, res.describe()  # --expect-error: a clean error only
        s = side.summary
        assert s is not None and s.data_errors == 0, res.describe()
        assert s.first_error is not None and s.first_error.clean, res.describe()
        assert s.first_error.t < t_fault + 150, res.describe()
