"""Warm standby queue pairs (RAILHOP_STANDBY_LANES, issue 27) over the verbs lane between the two
Soft-RoCE guests of the VM lab: a connection keeps a standby lane (its RC queue pairs brought to
RTS ahead of time) on a backup rail; a carrier loss at the remote end of its rail moves it onto
that standby, with no lane (so no queue pair) opened or accepted for the move on either side,
and every byte checked. Needs root, QEMU, virtme-ng and a kernel with rxe (``make setup``) and
the plugin and harness (``make ctest``); in CI a missing prerequisite fails instead of skipping.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from conftest import check_clean
from railhop_lab.harness import HarnessConfig
from railhop_lab.vmharness import VERBS_LANE_ENV, VmHarnessRun, wait_for_bytes, wait_for_each_conn
from railhop_lab.vmlab import VmLab

# the lab's boot may fall in this module's first test when it runs alone
pytestmark = [pytest.mark.privileged, pytest.mark.vm, pytest.mark.timeout(900)]

MiB = 1 << 20
LANE_ENV = {
    **VERBS_LANE_ENV,
    "RAILHOP_STANDBY_LANES": "1",
    # the one backup a move wants is the standby: any lane the move opened would show
    "RAILHOP_BACKUP_LANES": "1",
}
STANDBY_UP = re.compile(
    r"conn ([0-9a-f]+) \(send\): lane (\d+) up (\S+) -> peer NIC \d+ \(standby\)"
)


def wait_standby(err: Path, timeout: float) -> tuple[str, int, str]:
    """(conn, lane, local NIC) of the sender's standby once handshaken (bounded poll)."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = err.read_text(errors="replace") if err.exists() else ""
        m = STANDBY_UP.search(text)
        if m:
            return m.group(1), int(m.group(2)), m.group(3)
        time.sleep(0.2)
    raise AssertionError(f"no standby lane came up within {timeout} s:\n{text[-4000:]}")


def test_verbs_remote_carrier_loss_moves_onto_the_standby(lab: VmLab, built: None) -> None:
    cfg = HarnessConfig(conns=1, sizes=(1 * MiB,), duration=45, inflight=4, deadline=300)
    with VmHarnessRun(lab, cfg, env=LANE_ENV, verbose=True) as run:
        conn, lane, sb_nic = wait_standby(run.dir / "send.err", 120)
        wait_for_bytes(run, 4 * MiB, 240)
        lab.carrier_down(0, 0, "remote")
        lab.wait_ports(1, {0: "DOWN"}, 30)
        wait_for_each_conn(run, 2 * MiB, 200)
        res = run.wait()
    check_clean(res, 8 * MiB)
    send = (run.dir / "send.err").read_text(errors="replace")
    recv = (run.dir / "recv.err").read_text(errors="replace")
    assert sb_nic != lab.ifname(0)
    both = send + recv
    # the standby was promoted on both sides (whichever side moved first, the other when the
    # peer's first frame came on it)
    for role, log in (("send", send), ("recv", recv)):
        assert re.search(
            rf"conn {conn} \({role}\): standby lane {lane} \S+ -> peer NIC \d+ promoted", log
        ), (
            role,
            log[-4000:],
        )
    # the side that decided chose the standby, never a new lane
    assert re.search(
        rf"conn {conn} \((send|recv)\): move decision: lane {lane} .*\(warm standby\)", both
    ), both[-4000:]
    assert not re.search(rf"conn {conn} \((send|recv)\): move decision: .*\(new lane\)", both)
    # no queue pair created for the move: no lane opened on either side (a replacement standby
    # opens afterwards, named as one) and none accepted except standbys
    assert not re.search(rf"conn {conn}: opening lane (?!0 )", both), both[-4000:]
    ups = re.findall(
        rf"conn {conn} \((?:send|recv)\): lane (\d+) up \S+ -> peer NIC \d+( \(\w+\))?", both
    )
    assert all(u[1] in (" (primary)", " (standby)") for u in ups), ups
    # the move's line: off nic0, onto the standby's rail
    assert re.search(
        rf"conn {conn} \((send|recv)\): failover: {lab.ifname(0)} -> .*now on {sb_nic} ", both
    ), both[-4000:]
