"""Fault suites of the verbs lane (RAILHOP_TRANSPORT=verbs, plugin/src/lanes/verbs/, issue 27)
between the two Soft-RoCE guests of the VM lab: a silent blackhole on a rail, two of four rails
down then healed (fail-back onto both), a quick flap then healed, and carrier loss at the local
end. The ``railhop-harness`` ncclNet driver on each guest (node 0 sends, node 1 receives), every
byte checked by the receiver, 0 bad bytes and clean exits everywhere. Runs on the session's shared
boot of the guests (the ``lab`` fixture of tests/conftest.py). Needs root, QEMU, virtme-ng, a
kernel with rxe and the plugin and harness (``make ctest``); in CI a missing prerequisite fails.
"""

from __future__ import annotations

import re
import time

import pytest

from conftest import check_clean
from railhop_lab.harness import HarnessConfig
from railhop_lab.vmharness import VERBS_LANE_ENV, VmHarnessRun, wait_for_bytes, wait_for_each_conn
from railhop_lab.vmlab import VmLab

# emulated guests on shared cores: every wait inside has its own bound
pytestmark = [pytest.mark.privileged, pytest.mark.vm, pytest.mark.timeout(900)]

MiB = 1 << 20
SEND, RECV = 0, 1  # the guests the harness's roles run on (VmHarnessRun's defaults)


def _cfg(duration: float) -> HarnessConfig:
    return HarnessConfig(
        conns=4, sizes=(MiB,), duration=duration, inflight=4, deadline=duration + 180
    )


def _log(run: VmHarnessRun, role: str) -> str:
    return (run.dir / f"{role}.err").read_text(errors="replace")


def _move_logged(run: VmHarnessRun, nic: int) -> None:
    """The move's one WARN line names the failed pair. The side that detected the failure logs
    it: for a fault at the receiver's end that is often the receiver alone (its port event moves
    the connection onto the warm standby at once; the sender follows its RESUME)."""
    line = f"failover: nic{nic} -> peer NIC {nic} failed"
    send, recv = _log(run, "send"), _log(run, "recv")
    assert line in send or line in recv, send[-4000:] + recv[-4000:]


def _lane_failures(log: str, nic: int) -> list[str]:
    """The reasons given for failed lanes on local NIC ``nic`` (INFO lines of the core)."""
    return re.findall(rf"lane \d+ nic{nic} -> peer NIC \d+ failed: ([^(]+) \(", log)


def _wait_log(run: VmHarnessRun, role: str, needle: str, timeout: float) -> None:
    """Wait until ``role``'s log has ``needle`` (bounded; the run must still be going)."""
    deadline = time.monotonic() + timeout
    while needle not in _log(run, role):
        assert run.running(), f"the run ended before {needle!r}\n{_log(run, role)[-3000:]}"
        assert time.monotonic() < deadline, (
            f"no {needle!r} within {timeout} s\n{_log(run, role)[-3000:]}"
        )
        time.sleep(0.2)


def _verbs_only(run: VmHarnessRun) -> None:
    for role in ("send", "recv"):
        log = _log(run, role)
        assert "transport verbs (RAILHOP_TRANSPORT=verbs)" in log, (role, log[-3000:])


def test_verbs_blackhole_on_a_rail_is_found_by_the_lane(lab: VmLab, built: None) -> None:
    """tc drops everything on the receiver's nic0 with carrier and rxe ports up on both ends: no
    NIC event tells anyone. The lane's completion deadline (or the queue pair's retry limit)
    fails it, the connection moves to another rail and keeps moving, the rail heals; every byte
    checked, both exit 0."""
    with VmHarnessRun(lab, _cfg(60.0), env=VERBS_LANE_ENV, verbose=True) as run:
        wait_for_bytes(run, 4 * MiB, 240)
        lab.blackhole(RECV, 0)
        wait_for_each_conn(run, 2 * MiB, 150)
        for node in range(2):
            assert lab.port_states(node)[0] == ("ACTIVE", True), "a blackhole keeps the port up"
        lab.heal(0)
        res = run.wait()
    check_clean(res, 16 * MiB)
    _verbs_only(run)
    send, recv = _log(run, "send"), _log(run, "recv")
    found = _lane_failures(send, 0) + _lane_failures(recv, 0)
    assert found, send[-4000:]
    assert "local NIC down" not in " ".join(found), found  # no carrier event: the lane found it


def test_verbs_two_of_four_rails_down_then_fail_back(lab: VmLab, built: None) -> None:
    """The receiver's end of rails 0 and 1 loses carrier during traffic: the two connections
    there move onto rails 2 and 3 and every connection keeps moving; both rails heal and the
    sender fails back onto each (new queue pairs) while traffic goes on; every byte checked."""
    with VmHarnessRun(lab, _cfg(90.0), env=VERBS_LANE_ENV, verbose=True) as run:
        wait_for_bytes(run, 4 * MiB, 240)
        lab.carrier_down(SEND, 0, "remote")
        lab.carrier_down(SEND, 1, "remote")
        lab.wait_ports(RECV, {0: "DOWN", 1: "DOWN"}, 30)
        wait_for_each_conn(run, 2 * MiB, 150)
        lab.heal(0)
        lab.heal(1)
        for nic in (0, 1):
            _wait_log(run, "send", f"fail-back: nic{nic} -> peer NIC {nic} is healthy again", 120)
        wait_for_each_conn(run, 2 * MiB, 150)
        res = run.wait()
    check_clean(res, 16 * MiB)
    _verbs_only(run)
    for nic in (0, 1):
        _move_logged(run, nic)


def test_verbs_flap_then_heal(lab: VmLab, built: None) -> None:
    """The receiver's nic2 goes down, up and down again in quick succession (each state reached
    by its rxe port before the next toggle), then heals: the connection there moves, the
    others never stop, and it keeps moving after the heal; every byte checked, both exit 0."""
    with VmHarnessRun(lab, _cfg(60.0), env=VERBS_LANE_ENV, verbose=True) as run:
        wait_for_bytes(run, 4 * MiB, 240)
        for up in (False, True, False):
            lab.set_link(RECV, 2, up)
            lab.wait_ports(RECV, {2: "ACTIVE" if up else "DOWN"}, 30)
        wait_for_each_conn(run, 2 * MiB, 150)
        lab.heal(2)
        wait_for_each_conn(run, 2 * MiB, 150)
        res = run.wait()
    check_clean(res, 16 * MiB)
    _verbs_only(run)
    _move_logged(run, 2)


def test_verbs_local_carrier_loss(lab: VmLab, built: None) -> None:
    """The sender's own nic3 loses carrier (its rxe port goes down, a port event on the local
    device): the lane on it fails at once, the connection moves and keeps moving, the rail heals
    and the sender fails back onto it; every byte checked, both exit 0."""
    with VmHarnessRun(lab, _cfg(60.0), env=VERBS_LANE_ENV, verbose=True) as run:
        wait_for_bytes(run, 4 * MiB, 240)
        lab.carrier_down(SEND, 3, "local")
        lab.wait_ports(SEND, {3: "DOWN"}, 30)
        wait_for_each_conn(run, 2 * MiB, 150)
        lab.heal(3)
        _wait_log(run, "send", "fail-back: nic3 -> peer NIC 3 is healthy again", 120)
        res = run.wait()
    check_clean(res, 16 * MiB)
    _verbs_only(run)
    send = _log(run, "send")
    assert "failover: nic3 -> peer NIC 3 failed" in send, send[-4000:]
    # the port event or the core's carrier poll, whichever comes first: either names the NIC
    assert _lane_failures(send, 3), send[-4000:]
