"""Fault suites of the ofi lane over libfabric's verbs provider between the two Soft-RoCE guests.

The netns fabric's failover suites (tests/privileged/test_failover.py) over real RDMA queue pairs:
a silent blackhole on a rail, and escalation when every rail is down. Every byte is checked by
the harness; 0 data errors everywhere. Runs on the session's shared boot of the
guests (tests/vm/conftest.py). Needs root, QEMU, virtme-ng, a kernel with rxe and a built plugin
and harness (``make ctest``); in CI a missing prerequisite fails.
"""

from __future__ import annotations

import re
import time

import pytest

from conftest import check_clean
from railhop_lab.harness import HarnessConfig
from railhop_lab.vmharness import VERBS_ENV, VmHarnessRun, wait_for_bytes, wait_for_each_conn
from railhop_lab.vmlab import VmLab

# emulated guests on shared cores: every wait inside has its own bound (the harness runs for a
# fixed duration; on a loaded host its set-up alone took 30 s of it)
pytestmark = [pytest.mark.privileged, pytest.mark.vm, pytest.mark.timeout(900)]

MiB = 1 << 20
COMPLETION_S = int(VERBS_ENV["RAILHOP_COMPLETION_TIMEOUT"]) / 1000
PROBE_S = int(VERBS_ENV["RAILHOP_PROBE_TIMEOUT"]) / 1000


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


def test_every_rail_down_is_a_prompt_clean_error(lab: VmLab, built: None) -> None:
    """Node 1 (the receiver) loses carrier on all four rails: no pair is left. Both processes
    report a clean request error (no data error), neither hangs, both exit 0 (--expect-error):
    the receiver at once (every local NIC down), the sender once its lanes' completion deadline,
    probe and handshakes have run out."""
    cfg = _cfg(120.0, expect_error=True)
    with VmHarnessRun(lab, cfg, verbose=True) as run:
        wait_for_bytes(run, 8 * MiB, 180)
        t_fault = time.monotonic()
        for nic in range(4):
            lab.carrier_down(0, nic, "remote")
        # the sender's bound: completion timeout + escalation grace (2 probe timeouts), with
        # slack for emulated time; far below the harness's own deadline
        bound = COMPLETION_S + 2 * PROBE_S + COMPLETION_S + 30
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
