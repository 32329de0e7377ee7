"""The verbs lane's device phases on Soft-RoCE (plugin/src/lanes/verbs/, issue 27).

``railhop-verbs-check`` (plugin/tools/verbs_check.c) runs the lane's own shim, GID choice, queue
pair set-up, registration cache and completion verdicts between the two guests of the VM lab
(railhop_lab.vmlab): RC queue pairs, RDMA writes with immediates naming (advert, chunk), every
byte checked by the receiver. A carrier loss during the writes must end in an error completion
whose verdict fails the lane, with no bad byte delivered, and a queue pair created afterwards on
the healed rail must carry data again (the fail-back path re-creates queue pairs). This is the
device level only: the lane_ops table over these phases (and so RAILHOP_TRANSPORT=verbs) is not
built yet. Needs root, QEMU, virtme-ng and a kernel with rxe (``make setup``) and the tool
(``make ctest``); in CI a missing prerequisite fails instead of skipping.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import verbs_check_path
from railhop_lab.vmlab import End, GuestJob, VmLab

# the lab's boot may fall in this module's first test when it runs alone (see test_rdma_lab.py)
pytestmark = [pytest.mark.privileged, pytest.mark.vm, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
IBV_WC_RETRY_EXC_ERR = 12
IBV_EVENT_PORT_ERR = 10
ETIMEDOUT = 110
ENETDOWN = 100
VERBS_FAIL_LANE = 1
VERBS_FAIL_NIC = 2


@pytest.fixture(scope="module", autouse=True)
def _tool() -> None:
    verbs_check_path()


def _json(out: str, who: str) -> dict[str, Any]:
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    assert lines, f"{who}: no result line in {out!r}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


class Pair:
    """A receiver on node 1 and a sender on node 0 over rail ``nic``."""

    def __init__(
        self,
        lab: VmLab,
        nic: int,
        port: int,
        size: int,
        rounds: int,
        idle_s: int,
        env: dict[str, str] | None = None,
    ) -> None:
        tool = str(verbs_check_path())
        self.progress = lab.shared / f"verbs-recv-{nic}-{port}.err"
        self.progress.unlink(missing_ok=True)
        dev, n, sz = f"rxe{nic}", str(rounds), str(size)
        self.recv: GuestJob = lab.guests[1].start(
            [tool, "recv", dev, lab.address(1, nic), str(port), sz, n, str(idle_s)],
            env=env,
            stderr=self.progress,
            timeout=240,
        )
        self.send: GuestJob = lab.guests[0].start(
            [tool, "send", dev, lab.address(0, nic), lab.address(1, nic), str(port), sz, n],
            env=env,
            timeout=240,
        )

    def rounds_seen(self) -> int:
        try:
            text = self.progress.read_text()
        except OSError:
            return 0
        return sum(1 for ln in text.splitlines() if ln.startswith("round "))

    def results(self) -> tuple[int | None, dict[str, Any], int | None, dict[str, Any]]:
        s = self.send.wait()
        r = self.recv.wait()
        assert not s.timed_out and not r.timed_out, (s, r)
        return s.rc, _json(s.stdout, f"send {s}"), r.rc, _json(r.stdout, f"recv {r}")


def test_verbs_writes_with_immediate_every_byte_checked(lab: VmLab) -> None:
    p = Pair(lab, nic=1, port=18601, size=4 * MiB + 12345, rounds=6, idle_s=30)
    src, sent, rrc, got = p.results()
    assert src == 0 and rrc == 0, (sent, got)
    assert got["rounds"] == 6 and got["bad_bytes"] == 0 and got["partial"] == 0, got
    assert sent["bytes"] == 6 * (4 * MiB + 12345), sent
    assert sent["mtu"] == got["mtu"] == 1024, (sent, got)  # the active MTU of rxe on virtio
    assert sent["gid_index"] >= 0 and got["gid_index"] >= 0


@pytest.mark.parametrize("end", ["remote", "local"])
def test_carrier_loss_fails_the_queue_pair_then_a_new_one_carries(lab: VmLab, end: End) -> None:
    """Carrier loss at either end of rail 2 while the sender writes: the sender's queue pair
    exhausts its retries (RAILHOP_IB_TIMEOUT=18: 1.07 s a try, RAILHOP_IB_RETRY_CNT=3; 14,
    67 ms a try, failed spontaneously under the lab's emulated CPU), the
    completion's verdict fails the lane with ETIMEDOUT, the receiver holds no bad byte, the side
    that lost its carrier reads IBV_EVENT_PORT_ERR (a failure of the NIC); after
    the heal a queue pair created afresh on the rail carries checked data again."""
    nic, env = 2, {"RAILHOP_IB_TIMEOUT": "18", "RAILHOP_IB_RETRY_CNT": "3"}
    p = Pair(lab, nic=nic, port=18602, size=1 * MiB, rounds=1_000_000, idle_s=8, env=env)
    deadline = time.monotonic() + 90
    while p.rounds_seen() < 3:
        assert not p.send.done() and not p.recv.done(), (p.send.wait(), p.recv.wait())
        assert time.monotonic() < deadline, "no traffic over verbs"
        time.sleep(0.2)
    lab.carrier_down(0, nic, end)
    t0 = time.monotonic()
    src, sent, rrc, got = p.results()
    took = time.monotonic() - t0
    assert src == 3, sent
    fail = sent["fail"]
    assert fail["status"] == IBV_WC_RETRY_EXC_ERR, fail
    assert fail["scope"] == VERBS_FAIL_LANE and fail["err"] == -ETIMEDOUT, fail
    assert rrc == 0 and got["bad_bytes"] == 0 and got["rounds"] >= 3, got
    # the side whose NIC lost its carrier read IBV_EVENT_PORT_ERR, judged a failure of the NIC
    seer = sent if end == "local" else got
    port_errs = [a for a in seer["async"] if a["type"] == IBV_EVENT_PORT_ERR]
    assert port_errs, seer
    assert port_errs[0]["scope"] == VERBS_FAIL_NIC and port_errs[0]["err"] == -ENETDOWN, seer
    assert port_errs[0]["port"] == 1, seer
    # 4 tries of 1.07 s on the device, plus the receiver's 8 s idle rule and the job round trip
    assert took < 60, took
    lab.heal(nic)
    again = Pair(lab, nic=nic, port=18603, size=1 * MiB, rounds=3, idle_s=30, env=env)
    src, sent, rrc, got = again.results()
    assert src == 0 and rrc == 0 and got["bad_bytes"] == 0 and got["rounds"] == 3, (sent, got)
