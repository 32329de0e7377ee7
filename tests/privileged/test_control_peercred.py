"""Only the agent's uid, root and the configured job owner (or group, or any uid when so
configured) can send lane events (root: setuid children). Layer 1: the socket's mode (0600 /
0660 / 0666, set before bind) in a run directory only the agent can write; layer 2: SO_PEERCRED
at accept; every event attributed and rate-limited per uid and process."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from uid_client import client_argv

from railhop.control import (
    Backup,
    ControlError,
    ControlPlane,
    Distance,
    EventType,
    LaneEvent,
    NicHealth,
    NicState,
    Reason,
    encode_event,
)

REPO = Path(__file__).resolve().parents[2]

NOBODY = 65534

pytestmark = pytest.mark.privileged


@pytest.fixture
def base() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="rh_peercred."))
    os.chmod(d, 0o711)  # nobody may traverse it, the run dir inside decides the rest
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


async def as_nobody(sock: Path, payload: bytes, mode: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        *client_argv(sock, payload, mode),
        user=NOBODY,
        group=NOBODY,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0
    return out.decode().strip()


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.01)


def ev(pid: int) -> LaneEvent:
    return LaneEvent(EventType.LANE_TIMEOUT, pid=pid, nic="nic0", conn_id=7)


def test_other_uid_cannot_connect_through_the_permissions(base: Path) -> None:
    async def body() -> None:
        async with ControlPlane(base / "run", heartbeat_ms=0) as cp:
            out = await as_nobody(cp.socket_path, encode_event(ev(1)), "wait")
            assert out == "refused 13"  # EACCES: the 0600 socket stops it
            assert cp.counters.clients_accepted == 0 and cp.counters.events == 0

    asyncio.run(body())


def test_other_uid_is_rejected_by_peer_credentials(base: Path) -> None:
    async def body() -> None:
        async with ControlPlane(base / "run", heartbeat_ms=0) as cp:
            os.chmod(cp.run_dir, 0o777)  # a mistake by an operator: only SO_PEERCRED is left
            os.chmod(cp.socket_path, 0o777)
            out = await as_nobody(cp.socket_path, encode_event(ev(2)), "wait")
            assert out == "closed"
            assert cp.counters.peers_rejected == 1
            assert cp.counters.events == 0 and cp.counters.clients_accepted == 0
            # our own event is the first one to arrive: the rejected one never made it
            import socket

            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
                s.connect(str(cp.socket_path))
                s.send(encode_event(ev(os.getpid())))
                rx = await asyncio.wait_for(anext(cp.events()), 10)
            assert rx.event == ev(os.getpid()) and rx.peer.uid == 0

    asyncio.run(body())


def test_job_owner_uid_may_send(base: Path) -> None:
    async def body() -> None:
        async with ControlPlane(base / "run", heartbeat_ms=0, owner_uid=NOBODY) as cp:
            # the run directory stays root's (issue 19: the job could plant symlinks in it)
            assert os.stat(cp.run_dir).st_uid == 0
            assert stat.S_IMODE(os.stat(cp.run_dir).st_mode) == 0o755
            assert os.lstat(cp.socket_path).st_uid == NOBODY
            out = await as_nobody(cp.socket_path, encode_event(ev(3)), "send")
            assert out == "sent"
            rx = await asyncio.wait_for(anext(cp.events()), 10)
            assert rx.event == ev(3) and rx.peer.uid == NOBODY
            await until(lambda: not cp.clients)

    asyncio.run(body())


def test_run_dir_of_another_user_is_refused(base: Path) -> None:
    run = base / "run"
    run.mkdir()
    os.chown(run, NOBODY, NOBODY)

    async def body() -> None:
        with pytest.raises(ControlError, match="owned by uid 65534"):
            await ControlPlane(run, heartbeat_ms=0).start()

    asyncio.run(body())


def test_a_run_dir_given_to_the_job_earlier_is_taken_back(base: Path) -> None:
    run = base / "run"
    run.mkdir()
    os.chown(run, NOBODY, NOBODY)  # what main did with --owner-uid

    async def body() -> None:
        async with ControlPlane(run, heartbeat_ms=0, owner_uid=NOBODY) as cp:
            assert os.stat(cp.run_dir).st_uid == 0

    asyncio.run(body())


SECOND = 65533  # a second job user


def test_two_users_jobs_side_by_side(base: Path) -> None:
    """Issue 19: jobs of several users on one node. With a group, members of both uids send;
    a uid outside it is refused; with any uid, both send and a flood of one does not starve
    the other: it is rate-limited and counted against its own uid."""
    gid = 4242

    async def as_user(uid: int, gid_: int, sock: Path, payload: bytes, n: int = 1) -> str:
        proc = await asyncio.create_subprocess_exec(
            *client_argv(sock, payload, "linger", count=n),
            user=uid,
            group=gid_,
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0
        return out.decode().strip()

    async def body() -> None:
        async with ControlPlane(base / "g", heartbeat_ms=0, group_gid=gid) as cp:
            assert stat.S_IMODE(os.lstat(cp.socket_path).st_mode) == 0o660
            assert os.lstat(cp.socket_path).st_gid == gid
            got: list[int] = []

            async def collect(k: int) -> None:
                async for rx in cp.events():
                    got.append(rx.peer.uid)
                    if len(got) == k:
                        return

            t = asyncio.create_task(collect(2))
            a = asyncio.create_task(as_user(NOBODY, gid, cp.socket_path, encode_event(ev(1))))
            b = asyncio.create_task(as_user(SECOND, gid, cp.socket_path, encode_event(ev(2))))
            await asyncio.wait_for(t, 30)
            assert sorted(got) == sorted([NOBODY, SECOND])
            await a, await b
            # a uid outside the group: the 0660 socket refuses it
            out = await as_user(SECOND, SECOND, cp.socket_path, encode_event(ev(3)))
            assert out == "refused 13"
        async with ControlPlane(
            base / "any", heartbeat_ms=0, any_uid=True, rate_per_process=(1.0, 50.0)
        ) as cp:
            assert stat.S_IMODE(os.lstat(cp.socket_path).st_mode) == 0o666
            flood = await as_user(NOBODY, NOBODY, cp.socket_path, encode_event(ev(4)), 2000)
            assert flood in ("sent", "closed")
            await until(lambda: cp.counters.events + cp.counters.rate_limited >= 2000, 30)
            calm = await as_user(SECOND, SECOND, cp.socket_path, encode_event(ev(5)))
            assert calm in ("sent", "closed")
            uids: list[int] = []
            async for rx in cp.events():
                uids.append(rx.peer.uid)
                if rx.peer.uid == SECOND:
                    break
            assert uids.count(NOBODY) == 50  # the burst; the rest was dropped at the door
            c = cp.counters
            assert c.rate_limited == 1950 and c.rate_limited_by_uid == {NOBODY: 1950}
            assert c.queue_dropped == 0

    asyncio.run(body())


def pattern(k: int) -> tuple[list[NicHealth], dict[str, list[Backup]]]:
    """Publish k of the hammer pattern of plugin/tests/test_ctl.c (as in test_control_interop)."""
    n = 4 + k % 5
    nics = [
        NicHealth(
            f"nic{i}",
            NicState(1 + (k + i) % 4),
            k * 1000 + i,
            Reason((k + i) % 11),
            i,
            f"{k % 10000:04d}:00:{i:02x}.0",
            i % 2,
            k % 100000,
        )
        for i in range(n)
    ]
    plans = {
        f"nic{i}": [
            Backup(f"nic{(i + j + 1) % n}", j, (k + j) & 0xFFFF, Distance(j % 5))
            for j in range((k + i) % 16)
        ]
        for i in range(n)
    }
    return nics, plans


def test_c_plugin_running_as_the_job_owner(base: Path) -> None:
    """The plugin code (plugin/src/ctl.c) in a process of the job's uid reads the root agent's
    table and its events are accepted."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc is not None, "no C compiler"
    binary = base / "test_ctl"
    subprocess.run(
        [
            cc,
            "-std=gnu11",
            "-O2",
            f"-I{REPO / 'plugin/include'}",
            f"-I{REPO / 'plugin/src'}",
            str(REPO / "plugin/src/ctl.c"),
            str(REPO / "plugin/tests/test_ctl.c"),
            "-o",
            str(binary),
            "-pthread",
        ],
        check=True,
        timeout=120,
    )
    os.chmod(binary, 0o755)

    async def body() -> None:
        async with ControlPlane(base / "run", heartbeat_ms=100, owner_uid=NOBODY) as cp:
            cp.publish(*pattern(1))
            reader = await asyncio.create_subprocess_exec(
                str(binary),
                "--reader",
                str(cp.run_dir),
                "0.3",
                user=NOBODY,
                group=NOBODY,
                stdout=asyncio.subprocess.PIPE,
            )
            out, _ = await asyncio.wait_for(reader.communicate(), 30)
            res = json.loads(out)
            assert reader.returncode == 0 and res["bad"] == 0 and res["proto"] == 0
            assert res["accepted"] > 0 and res["last_publish"] == 1
            sender = await asyncio.create_subprocess_exec(
                str(binary),
                "--send",
                str(cp.run_dir),
                "5",
                user=NOBODY,
                group=NOBODY,
                stdout=asyncio.subprocess.PIPE,
            )
            got = []
            async for rx in cp.events():
                got.append(rx)
                if len(got) == 5:
                    break
            out, _ = await asyncio.wait_for(sender.communicate(), 30)
            assert sender.returncode == 0 and json.loads(out)["sent"] == 5
            assert {rx.peer.uid for rx in got} == {NOBODY}
            assert [rx.event.conn_id for rx in got] == [1000, 1001, 1002, 1003, 1004]

    asyncio.run(body())


def _caps_of_self() -> list[str]:
    fields = dict(
        ln.split(":", 1) for ln in Path("/proc/self/status").read_text().splitlines() if ":" in ln
    )
    return [fields["CapEff"].strip(), fields["CapPrm"].strip()]


def test_agent_drops_capabilities_once_its_sources_started(base: Path) -> None:
    """Issue 19, 8: the agent kept every capability it started with. `railhop agent` (root,
    every capability) drops them once its sources have started (none is needed after that
    without --usdt-lib), and status.json / `railhop status` show what it keeps."""
    run = base / "run"
    dgx = REPO / "tests" / "fixtures" / "sys" / "dgx-h100"
    assert any(int(x, 16) for x in _caps_of_self()), "the test must run with capabilities"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "railhop",
            "agent",
            *("--root", str(dgx), "--run-dir", str(run), "--sources", "", "--no-traces"),
            *("--duration", "20"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        doc: dict[str, object] | None = None
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no status.json with dropped capabilities"
            try:
                doc = json.loads((run / "status.json").read_text())
            except (OSError, ValueError):
                doc = None
            if doc and doc.get("privileges", {}).get("effective") == []:  # type: ignore[union-attr]
                break
            time.sleep(0.05)
        priv = doc["privileges"]  # type: ignore[index]
        assert priv["uid"] == 0 and priv["permitted"] == [] and priv["beyond_needed"] == []
        out = subprocess.run(
            [sys.executable, "-m", "railhop", "status", "--run-dir", str(run)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert "privileges: uid 0" in out.stdout and "capabilities none" in out.stdout, out
    finally:
        proc.terminate()
        proc.wait(timeout=15)
