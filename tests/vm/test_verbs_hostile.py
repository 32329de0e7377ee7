"""Hostile peers against the verbs lane's listeners (issue 27, 5) in the VM lab: a
``railhop-harness`` receiver on node 1 (RAILHOP_TRANSPORT=verbs) listens; before its sender
exists, a stranger on node 0 (:mod:`railhop_lab.verbs_stranger`, the frames of
:mod:`railhop_lab.peerwire`, which the TCP lane's suite tests/privileged/test_hostile_peer.py
uses too) sends garbage, a truncated hello, a 4 GiB length, a hello with a wrong MAC, a hello
one byte at a time, 300 idle connections, and, holding the handle's secret (a valid MAC), hellos
whose queue pair address is bad (QPN 0, QPN above 24 bits, MTU 9, a GID that is not the
handshake peer's). Each one gets its WARN in the receiver's log and no answer; afterwards node
1 holds no queue pair of a user process (none was left, in any state, towards the stranger).
Then the genuine sender on node 0 connects to the same listeners and moves data with every byte
checked; its lanes' hellos, captured on node 1 and replayed, are refused as replays and open no
lane, no queue pair in RTR/RTS has the stranger's QPN, and both sides exit 0. Needs root, QEMU,
virtme-ng, a kernel with rxe and the plugin and harness (``make ctest``); in CI a missing
prerequisite fails instead of skipping.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from conftest import REPO, check_clean, until
from railhop_lab.harness import HarnessConfig
from railhop_lab.peerwire import parse_handle
from railhop_lab.verbs_stranger import QPN
from railhop_lab.vmharness import VERBS_LANE_ENV, VmHarnessRun, wait_for_bytes, wait_for_each_conn
from railhop_lab.vmlab import VmLab

pytestmark = [pytest.mark.privileged, pytest.mark.vm, pytest.mark.timeout(900)]

MiB = 1 << 20
# the stranger runs under the guest's system Python with the tree's lab/ (standard library only)
STRANGER_ENV = {"PYTHONPATH": str(REPO / "lab")}
STRANGER = ["/usr/bin/python3", "-m", "railhop_lab.verbs_stranger"]
NIC = 1  # the listener attacked (the genuine connection's first lane is on NIC 0's)
# refused handshakes: "refused a handshake ... : <why>" (lanes/verbs/ep.c), refused hellos:
# "refused a connection hello ... : <why>" (core/handshake.c), refused queue pair addresses
# (lanes/verbs/ep.c, not rate-limited)
BAD_ADDR = r"verbs: refused the queue pair address of the peer at {src}: malformed transport bytes"
ATTACKS = (
    ("garbage", r"refused a handshake on the lane listener of \S+ from {src}: not a hello frame"),
    ("truncated", r"refused a handshake .* from {src}: closed before a whole hello"),
    ("oversize", r"refused a handshake .* from {src}: a hello length above"),
    ("badmac", r"refused a connection hello naming conn \w+ lane 1: no proof of the connection"),
    ("qpn0", BAD_ADDR),
    ("qpnbig", BAD_ADDR),
    ("mtu", BAD_ADDR),
    ("gid", r"refused the queue pair address of the peer at {src}: its GID is not the IPv4-"),
    ("flood", r"refused a handshake .*: too many handshakes wait for their hello"),
    ("drip", r"refused a handshake .* from {src}: no whole hello before the handshake deadline"),
)
# refusal lines are rate-limited to one a second (a stranger can send many): the next attack
# goes once that much passed since its predecessor's line was seen
RATE_LIMIT_S = 1.1


def _log(run: VmHarnessRun, role: str = "recv") -> str:
    try:
        return (run.dir / f"{role}.err").read_text(errors="replace")
    except OSError:
        return ""


def wait_log(run: VmHarnessRun, pattern: str, pos: int, what: str) -> None:
    """Wait (bounded) for a line matching pattern in the receiver's log past offset pos."""
    want = re.compile(pattern)
    until(lambda: want.search(_log(run)[pos:]) is not None, 60, what, poll=0.2)


def pass_rate_limit() -> None:
    """Let the refusal lines' rate limit pass (its second counts from the line just seen)."""
    t_seen = time.monotonic()
    until(lambda: time.monotonic() - t_seen > RATE_LIMIT_S, 5, "the rate limit's second")


def stranger(lab: VmLab, *args: str, timeout: float = 150.0) -> dict[str, object]:
    r = lab.guests[0].run(
        [*STRANGER, *args],
        env=STRANGER_ENV,
        timeout=timeout,
    )
    assert r.ok, f"stranger {args[0]}: {r}"
    out: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def user_qps(lab: VmLab, node: int) -> list[dict[str, object]]:
    """Queue pairs of user processes on node's RDMA devices (``rdma -j resource show qp``)."""
    r = lab.guests[node].sh("rdma -j resource show qp", timeout=60)
    return [q for q in json.loads(r.stdout or "[]") if "pid" in q]


def test_verbs_listener_refuses_strangers(lab: VmLab, built: None) -> None:
    cfg = HarnessConfig(conns=1, sizes=(256 * 1024,), duration=500, inflight=4, deadline=600)
    run = VmHarnessRun(lab, cfg, env=VERBS_LANE_ENV, verbose=True)
    run.start(sender=False)
    try:
        until(run.handle_file.is_file, 120, "the receiver's connect handle", poll=0.2)
        handle = parse_handle(run.handle_file.read_bytes())
        assert len(handle.nics) == lab.nics, handle
        src = lab.address(0, NIC)
        common = ["--handle", str(run.handle_file), "--src", src, "--nic", str(NIC)]
        results: dict[str, dict[str, object]] = {}
        for name, pattern in ATTACKS:
            pos = len(_log(run))
            results[name] = res = stranger(lab, name, *common)
            wait_log(run, pattern.format(src=re.escape(src)), pos, f"the WARN for {name} ({res})")
            pass_rate_limit()
        # no answer to any of them: the listener closed each (a hello it took would be answered)
        for name in ("garbage", "oversize", "badmac", "qpn0", "qpnbig", "mtu", "gid"):
            assert results[name]["answer"] == "closed", results
        assert results["drip"]["closed"] is True, results
        assert int(results["flood"]["opened"]) == 300, results  # type: ignore[call-overload]
        assert int(results["flood"]["closed_by_listener"]) >= 1, results  # type: ignore[call-overload]
        # nothing of the strangers' is left: the receiver has no connection yet, so any queue
        # pair of a user process on node 1 would be one made for a stranger
        until(lambda: not user_qps(lab, 1), 60, "no queue pair on node 1", poll=0.5)

        # the genuine sender, its lanes' hellos captured on node 1
        cap, stop, ready = (run.dir / n for n in ("hellos.cap", "capture.stop", "capture.ready"))
        ports = ",".join(str(p) for _, p in handle.nics)
        argv = [*STRANGER, "capture", str(cap), "--ports", ports, "--stop", str(stop)]
        capture = lab.guests[1].start(
            [*argv, "--ready", str(ready)],
            env=STRANGER_ENV,
            timeout=400,
        )
        until(ready.is_file, 60, "the capture on node 1", poll=0.2)
        run.start_sender()
        wait_for_bytes(run, 4 * MiB, 240)
        lanes_up = re.compile(r"\(recv\): lane \d+ up")
        until(lambda: len(lanes_up.findall(_log(run))) >= 2, 120, "the standby lane up", 0.2)
        stop.touch()
        got = capture.wait(60)
        assert got.ok, got
        assert json.loads(got.stdout.strip().splitlines()[-1])["hellos"] >= 2, got
        nlanes = len(lanes_up.findall(_log(run)))
        pos = len(_log(run))
        results["replay"] = res = stranger(lab, "replay", str(cap), *common)
        wait_log(run, r"refused a \w+ hello naming conn .*a replayed hello", pos, f"replay {res}")
        assert all(a == "closed" for a in res["answers"]), res  # type: ignore[attr-defined]
        # the connection goes on, on the lanes it had
        wait_for_each_conn(run, 2 * MiB, 200)
        assert len(lanes_up.findall(_log(run))) == nlanes, _log(run)[-3000:]
        # no queue pair of node 1 connected towards the stranger's values
        qps = user_qps(lab, 1)
        assert qps, "the receiver's queue pairs are listed"
        for q in qps:
            if q.get("state") in ("RTR", "RTS"):
                assert q.get("rqpn") not in (0, QPN, 1 << 24 | QPN), qps
        run.finish()
        res_run = run.wait()
    finally:
        run.kill()
    check_clean(res_run, 4 * MiB)
