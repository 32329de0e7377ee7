"""Warm standby lanes (RAILHOP_STANDBY_LANES, issue 27) on the emulated fabric over TCP lanes;
every byte checked (root).

One connection on nic0 (primary pair nic0 -> peer NIC 0) keeps one standby lane on a backup
pair. A carrier loss on nic0 moves the connection onto that standby: the plugin's log says the
move promoted it, its first frame went out on it, and no lane was opened for the move
(RAILHOP_BACKUP_LANES=1: the standby is the one backup wanted). A carrier loss on the standby's
own NIC drops the standby only: no move, no failover line, a replacement standby later, and the
data never stops being checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import fabric_fixture, until
from railhop_lab.fabric import Fabric
from railhop_lab.harness import HarnessConfig, HarnessResult, HarnessRun, wait_for_bytes

pytestmark = pytest.mark.privileged

MiB = 1 << 20
ENV = {
    "RAILHOP_TRANSPORT": "tcp",
    "RAILHOP_STANDBY_LANES": "1",
    "RAILHOP_BACKUP_LANES": "1",
    "NCCL_DEBUG": "INFO",  # the plugin's INFO lines are the evidence
}


fab = fabric_fixture("rhsb", nics=3, rate_mbit=200)


def cfg(seed: int) -> HarnessConfig:
    return HarnessConfig(
        conns=1, sizes=(MiB, 4096, 3 * MiB + 5, 0), duration=6.0, deadline=40.0, seed=seed
    )


def assert_lossless(res: HarnessResult) -> None:
    assert res.ok, res.describe()
    s, r = res.send.summary, res.recv.summary
    assert s is not None and r is not None
    assert s.msgs == r.msgs > 0, res.describe()
    assert s.bytes == r.bytes, res.describe()
    assert r.data_errors == 0 and s.data_errors == 0


def standby_up(stderr_path: Path, timeout: float) -> tuple[str, int, str]:
    """(conn id, lane id, local NIC) of the sender's standby once it is handshaken (bounded)."""
    pat = re.compile(r"conn ([0-9a-f]+) \(send\): lane (\d+) up (\S+) -> peer NIC \d+ \(standby\)")
    found: list[re.Match[str]] = []

    def up() -> bool:
        m = pat.search(stderr_path.read_text(errors="replace") if stderr_path.exists() else "")
        found[:] = [m] if m else []
        return m is not None

    until(up, timeout, lambda: f"no standby lane came up:\n{stderr_path.read_text()[-4000:]}")
    m = found[0]
    return m.group(1), int(m.group(2)), m.group(3)


# the first replacement standby waits one backoff (the fail-back interval, 1 s) after the drop
REPLACEMENT_S = 1.0


def replaced(send_stderr: Path, conn: str, lane: int, sb_nic: str) -> bool:
    """The sender dropped standby ``lane`` on ``sb_nic`` and then opened a standby on another
    NIC."""
    text = send_stderr.read_text(errors="replace")
    dropped = re.search(rf"conn {conn} \(send\): standby lane {lane} {sb_nic} -> .* dropped", text)
    if dropped is None:
        return False
    again = re.search(rf"conn {conn}: opening standby lane \d+ (\S+) ", text[dropped.end() :])
    return again is not None and again.group(1) != sb_nic


def run_with_fault(fab: Fabric, tmp_path: Path, seed: int, nic_of_fault: str | None) -> tuple:
    """Run, wait for the standby, pull the carrier of nic_of_fault ("standby": the standby's
    own NIC, else a NIC name) at the sender; returns the result, both logs and the standby.
    A fault on the standby's NIC also waits (bounded) for its replacement while the run goes on."""
    send_stderr = tmp_path / "send.stderr"
    with HarnessRun(fab, cfg(seed), env=ENV, workdir=tmp_path) as run:
        conn, lane, sb_nic = standby_up(send_stderr, timeout=20)
        wait_for_bytes(run, 8 * MiB, timeout=20)
        nic = sb_nic if nic_of_fault == "standby" else nic_of_fault
        assert nic is not None
        fab.carrier_down(0, int(nic.removeprefix("nic")), end="local")
        if nic_of_fault == "standby":
            # the drop (carrier loss seen, <= 1 s) then the backoff, with slack for 2 busy cores
            until(
                lambda: replaced(send_stderr, conn, lane, sb_nic),
                1.0 + REPLACEMENT_S + 2.0,
                lambda: (
                    f"standby on {sb_nic} dropped and replaced:\n{send_stderr.read_text()[-4000:]}"
                ),
            )
        res = run.wait()
    send = (tmp_path / "send.stderr").read_text(errors="replace")
    recv = (tmp_path / "recv.stderr").read_text(errors="replace")
    return res, send, recv, conn, lane, sb_nic


def test_carrier_loss_moves_onto_the_standby(fab: Fabric, tmp_path: Path) -> None:
    res, send, recv, conn, lane, sb_nic = run_with_fault(fab, tmp_path, 71, "nic0")
    assert_lossless(res)
    assert sb_nic != "nic0"
    # the sender's move promoted the standby and posted its first frame on it
    promoted = re.search(
        rf"conn {conn} \(send\): standby lane {lane} {sb_nic} -> peer NIC \d+ promoted \(a move\)",
        send,
    )
    assert promoted, send[-6000:]
    assert re.search(rf"conn {conn} \(send\): move decision: lane {lane} .*\(warm standby\)", send)
    assert re.search(rf"conn {conn} \(send\): move first post: lane {lane} \(warm standby\)", send)
    # no lane opened for the move (a replacement standby may open afterwards)
    after = send[promoted.end() :]
    assert not re.search(rf"conn {conn}: opening lane ", after), after[:4000]
    assert not re.search(rf"conn {conn} \(send\): move decision: .*\(new lane\)", send)
    # the receiver took the lane as a data lane too (its own move or the sender's frames)
    assert re.search(rf"conn {conn} \(recv\): lane {lane} up \S+ -> peer NIC \d+ \(standby\)", recv)
    assert re.search(
        rf"conn {conn} \(recv\): standby lane {lane} \S+ -> peer NIC \d+ promoted", recv
    )
    # the move's WARN line: traffic now on the standby's NIC
    assert re.search(
        rf"conn {conn} \((send|recv)\): failover: nic0 -> .*now on {sb_nic} ", send + recv
    )


def test_standby_failure_is_not_a_failover(fab: Fabric, tmp_path: Path) -> None:
    res, send, recv, conn, lane, sb_nic = run_with_fault(fab, tmp_path, 72, "standby")
    assert_lossless(res)
    dropped = re.search(rf"conn {conn} \(send\): standby lane {lane} {sb_nic} -> .* dropped", send)
    assert dropped, send[-6000:]
    # the receiver dropped its end when told (the sender's BYE naming it)
    assert re.search(rf"conn {conn}: lane {lane} retired by peer", recv), recv[-4000:]
    for log in (send, recv):
        assert "failover:" not in log, log[-4000:]
        assert "move decision" not in log
        assert "promoted" not in log
    # a replacement standby on another pair, after the backoff (waited for in run_with_fault)
    assert replaced(tmp_path / "send.stderr", conn, lane, sb_nic), send[dropped.end() :][:4000]
