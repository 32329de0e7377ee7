"""A job running as a non-root uid (no hostNetwork needed: agent.sock is a Unix socket on the
run directory's hostPath) reaches the agent through the chart's socket group
(``agent.socketGroup`` -> ``railhop agent --socket-group``): a process whose SUPPLEMENTARY groups
hold that group (Kubernetes: ``securityContext.supplementalGroups``) connects and its lane
events are taken; a process without it is refused.

Before issue 30 the supplementary groups were read with a buffer Python refuses (over 1024
bytes), so only the primary gid was ever seen and such a job was closed at accept."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from uid_client import PY_ANY_USER, client_argv

from railhop.control import EventType, LaneEvent, encode_event
from railhop.control.server import peer_cred, peer_groups

REPO = Path(__file__).resolve().parents[2]
DGX = REPO / "tests" / "fixtures" / "sys" / "dgx-h100"
JOB_UID = 65533
JOB_GID = 65533
SOCKET_GID = 4243
pytestmark = pytest.mark.privileged


@pytest.fixture
def base() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="rh_sockgroup."))
    os.chmod(d, 0o711)  # any uid may traverse it; the run directory decides the rest
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def wait_for(cond: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def status(run: Path) -> dict[str, object] | None:
    try:
        doc = json.loads((run / "status.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def job(sock: Path, groups: list[int], nic: str) -> subprocess.Popen[str]:
    ev = LaneEvent(EventType.LANE_UP, pid=1, nic=nic, conn_id=7, t_ns=time.monotonic_ns())
    return subprocess.Popen(
        client_argv(sock, encode_event(ev), "hold", wait_s=60),
        user=JOB_UID,
        group=JOB_GID,
        extra_groups=groups,
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
    )


def first_line(p: subprocess.Popen[str]) -> str:
    assert p.stdout is not None
    return p.stdout.readline().strip()


def connections(run: Path, nic: str) -> int:
    doc = status(run) or {}
    nics = doc.get("nics", {})
    assert isinstance(nics, dict)
    return int(nics.get(nic, {}).get("connections", 0))


def test_supplementary_group_member_is_accepted_and_others_refused(base: Path) -> None:
    run = base / "run"
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "railhop",
            "agent",
            *("--root", str(DGX), "--run-dir", str(run), "--sources", "", "--no-traces"),
            *("--socket-group", str(SOCKET_GID), "--duration", "120"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    jobs: list[subprocess.Popen[str]] = []
    try:
        sock = run / "agent.sock"
        wait_for(lambda: sock.exists() and status(run) is not None, 30, "the agent's socket")
        st = os.lstat(sock)
        assert (st.st_mode & 0o777, st.st_gid) == (0o660, SOCKET_GID)

        # the group only as a supplementary group, as Kubernetes' supplementalGroups gives it
        member = job(sock, [SOCKET_GID], "ibp25s0")
        jobs.append(member)
        assert first_line(member) == "connected"
        wait_for(lambda: connections(run, "ibp25s0") == 1, 30, "the member's lane in status")
        assert member.poll() is None  # still connected: not closed at accept

        # without the group: the 0660 socket refuses the connection
        stranger = job(sock, [], "ibp59s0")
        jobs.append(stranger)
        assert first_line(stranger) == "refused 13"
        assert stranger.wait(timeout=30) == 0
        assert connections(run, "ibp59s0") == 0
        assert agent.poll() is None
    finally:
        for p in jobs:
            if p.stdin:
                p.stdin.close()
            p.kill()
            p.wait(timeout=10)
        agent.terminate()
        try:
            agent.wait(timeout=15)
        finally:
            agent.kill()


def test_peer_groups_reads_hundreds_of_groups() -> None:
    """More groups than Python's getsockopt buffer (1024 bytes = 256 groups) can hold."""
    groups = [SOCKET_GID, *range(20000, 20300)]
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        path = Path(tempfile.mkdtemp(prefix="rh_pg.")) / "s"
        try:
            srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            with srv:
                srv.bind(str(path))
                os.chmod(path, 0o666)
                os.chmod(path.parent, 0o755)
                srv.listen(1)
                child = subprocess.Popen(
                    [
                        PY_ANY_USER,
                        "-c",
                        "import socket, sys; s = socket.socket(socket.AF_UNIX, "
                        "socket.SOCK_SEQPACKET); s.connect(sys.argv[1]); sys.stdin.read()",
                        str(path),
                    ],
                    user=JOB_UID,
                    group=JOB_GID,
                    extra_groups=groups,
                    stdin=subprocess.PIPE,
                )
                try:
                    srv.settimeout(30)
                    conn, _ = srv.accept()
                    with conn:
                        assert peer_cred(conn).uid == JOB_UID
                        assert peer_groups(conn) == frozenset(groups)
                finally:
                    assert child.stdin is not None
                    child.stdin.close()
                    child.wait(timeout=10)
        finally:
            shutil.rmtree(path.parent, ignore_errors=True)
