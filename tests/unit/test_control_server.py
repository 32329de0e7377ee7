"""ControlPlane: run dir and socket permissions, event delivery, garbage, clients, shutdown."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from railhop.control import (
    ControlError,
    ControlPlane,
    EventType,
    LaneEvent,
    NicHealth,
    NicState,
    ReceivedEvent,
    encode_event,
    read_table,
)
from railhop.control.lane_events import MAX_MSG


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        await asyncio.sleep(0.005)


def client(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(str(path))
    return s


async def next_event(cp: ControlPlane, timeout: float = 5.0) -> ReceivedEvent:
    it = cp.events()
    return await asyncio.wait_for(anext(it), timeout)


def ev(i: int) -> LaneEvent:
    return LaneEvent(
        EventType((i % 7) + 1), pid=os.getpid(), nic=f"nic{i % 4}", conn_id=i, epoch=i * 2
    )


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(coro(), 30))


def test_permissions_and_event_delivery(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"

    async def body() -> None:
        async with ControlPlane(run_dir, heartbeat_ms=0) as cp:
            assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o755
            assert stat.S_ISSOCK(os.lstat(cp.socket_path).st_mode)
            assert stat.S_IMODE(os.lstat(cp.socket_path).st_mode) == 0o600
            assert not cp.table_path.exists()  # created at the first publish
            with client(cp.socket_path) as c:
                for i in range(20):
                    c.send(encode_event(ev(i)))
                got = []
                async for rx in cp.events():
                    got.append(rx)
                    if len(got) == 20:
                        break
            assert [rx.event for rx in got] == [ev(i) for i in range(20)]
            assert {rx.peer.pid for rx in got} == {os.getpid()}
            assert {rx.peer.uid for rx in got} == {os.geteuid()}
            assert cp.counters.events == 20 and cp.counters.malformed == 0

    run(body)


def test_garbage_is_dropped_and_counted_and_the_server_carries_on(tmp_path: Path) -> None:
    async def body() -> None:
        async with ControlPlane(tmp_path, heartbeat_ms=0) as cp:
            with client(cp.socket_path) as c:
                good = encode_event(ev(1))
                c.send(b"\x00" * 3)
                c.send(good[:-1])
                c.send(b"x" * 1000)  # > MAX_MSG: truncated by the kernel, dropped
                c.send(b"RHEV" + bytes(156))
                c.send(good)
                rx = await next_event(cp)
                assert rx.event == ev(1)
            c2 = cp.counters
            assert c2.malformed == 4
            assert c2.malformed_by_reason == {"short": 1, "size": 1, "oversize": 1, "version": 1}
            assert c2.events == 1

    run(body)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=MAX_MSG + 40), max_size=20))
def test_fuzz_the_live_server(tmp_path_factory: pytest.TempPathFactory, msgs: list[bytes]) -> None:
    d = tmp_path_factory.mktemp("fuzz")

    async def body() -> None:
        async with ControlPlane(d, heartbeat_ms=0) as cp:
            with client(cp.socket_path) as c:
                for m in msgs:
                    c.send(m)
                c.send(encode_event(ev(3)))
                seen = []
                async for rx in cp.events():
                    seen.append(rx.event)
                    if rx.event == ev(3):
                        break
            counted = cp.counters
            assert counted.events + counted.malformed == len(msgs) + 1
            assert cp.clients  # the garbage did not kill the connection

    run(body)


def test_clients_come_and_go_and_are_bounded(tmp_path: Path) -> None:
    async def body() -> None:
        async with ControlPlane(tmp_path, heartbeat_ms=0, max_clients=2) as cp:
            a = client(cp.socket_path)
            b = client(cp.socket_path)
            await until(lambda: len(cp.clients) == 2)
            c = client(cp.socket_path)  # accepted by the kernel, closed by the agent
            await until(lambda: cp.counters.clients_refused == 1)
            assert c.recv(10) == b""
            a.close()
            await until(lambda: len(cp.clients) == 1)
            assert cp.counters.clients_closed == 1
            b.send(encode_event(ev(2)))
            assert (await next_event(cp)).event == ev(2)
            b.close()
            c.close()
            await until(lambda: not cp.clients)

    run(body)


def test_queue_overflow_is_counted(tmp_path: Path) -> None:
    async def body() -> None:
        async with ControlPlane(tmp_path, heartbeat_ms=0, queue_size=2) as cp:
            with client(cp.socket_path) as c:
                for i in range(5):
                    c.send(encode_event(ev(i)))
                await until(lambda: cp.counters.events + cp.counters.queue_dropped == 5)
            assert cp.counters.events == 2 and cp.counters.queue_dropped == 3
            assert (await next_event(cp)).event == ev(0)

    run(body)


def test_stale_socket_is_replaced_and_a_live_agent_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    dead.bind(str(path))  # bound, never listening: like a killed agent's socket
    dead.close()

    async def body() -> None:
        async with ControlPlane(tmp_path, heartbeat_ms=0) as cp:
            assert cp.socket_path.exists()
            with pytest.raises(ControlError, match="another agent"):
                await ControlPlane(tmp_path, heartbeat_ms=0).start()
            assert cp.socket_path.exists()
        assert not path.exists()
        path.write_text("not a socket")
        with pytest.raises(ControlError, match="not a socket"):
            await ControlPlane(tmp_path, heartbeat_ms=0).start()

    run(body)


def test_run_dir_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")

    async def body() -> None:
        with pytest.raises(ControlError, match="not a directory"):
            await ControlPlane(tmp_path / "link", heartbeat_ms=0).start()

    run(body)


def test_clean_shutdown(tmp_path: Path) -> None:
    async def body() -> None:
        cp = ControlPlane(tmp_path, heartbeat_ms=10)
        await cp.start()
        cp.publish([NicHealth("nic0", NicState.UP)], {})
        hb0 = read_table(cp.table_path).heartbeat_ns
        await until(lambda: read_table(cp.table_path).heartbeat_ns != hb0)

        received: list[ReceivedEvent] = []

        async def consume() -> None:
            async for rx in cp.events():
                received.append(rx)

        task = asyncio.create_task(consume())
        with client(cp.socket_path) as c:
            c.send(encode_event(ev(5)))
            await until(lambda: len(received) == 1)
            await cp.close()
            assert c.recv(10) == b""  # the agent hung up
        await asyncio.wait_for(task, 5)  # events() ended
        assert not cp.socket_path.exists()
        snap = read_table(cp.table_path)
        assert snap.agent_gone and snap.nics == (NicHealth("nic0", NicState.UP),)
        with pytest.raises(ControlError):
            cp.publish([], {})
        await cp.close()  # idempotent

    run(body)


# -- issue 19: forged timestamps, floods, several users


def test_a_future_timestamp_is_clamped_to_the_receive_time(tmp_path: Path) -> None:
    async def body() -> None:
        async with ControlPlane(tmp_path / "run", heartbeat_ms=0) as cp:
            before = time.monotonic_ns()
            with client(cp.socket_path) as c:
                forged = LaneEvent(EventType.LANE_TIMEOUT, pid=1, nic="nic0", t_ns=2**62)
                c.send(encode_event(forged))
                rx = await next_event(cp)
            assert before <= rx.event.t_ns == rx.recv_ns <= time.monotonic_ns()
            assert cp.counters.clamped == 1
            with client(cp.socket_path) as c:  # a past timestamp is kept as it is
                c.send(encode_event(LaneEvent(EventType.LANE_UP, pid=1, nic="nic0", t_ns=5)))
                rx = await next_event(cp)
            assert rx.event.t_ns == 5 and cp.counters.clamped == 1

    run(body)


def test_a_flood_is_rate_limited_per_process_and_per_uid() -> None:
    from railhop.control.server import EventServer, PeerCred

    now = [10**12]
    srv = EventServer(
        Path("/nonexistent/agent.sock"),
        allowed_uids={0},
        any_uid=True,
        queue_size=100000,
        rate_per_process=(10.0, 20.0),
        rate_per_uid=(30.0, 50.0),
        clock=lambda: now[0],
    )
    data = encode_event(LaneEvent(EventType.LANE_TIMEOUT, pid=1, nic="nic0", t_ns=1))
    flood, other = PeerCred(100, 1000, 1000), PeerCred(200, 2000, 2000)
    for _ in range(1000):
        srv.feed(data, flood)
    assert srv.counters.events == 20 and srv.counters.rate_limited == 980  # the burst
    srv.feed(data, other)  # another user is not starved by the flood
    assert srv.counters.events == 21
    # more processes of the flooding uid: the uid's bucket (50) caps them together
    for pid in range(101, 111):
        for _ in range(100):
            srv.feed(data, PeerCred(pid, 1000, 1000))
    assert srv.counters.events == 21 + 30  # 50 for uid 1000: 20 used by pid 100
    assert srv.counters.rate_limited_by_uid[1000] == 980 + 1000 - 30
    now[0] += 10**9  # one second later: 10 more for the first process
    for _ in range(100):
        srv.feed(data, flood)
    assert srv.counters.events == 51 + 10
    assert srv.queue.qsize() == 61


@pytest.mark.privileged  # root: starts a process of another uid
def test_client_slots_are_per_uid() -> None:
    """Issue 29, 5: the 256 client slots were shared by all uids: one job could hold them all
    and lock every other job out of agent.sock. Now one uid (for root: one cgroup) holds at
    most ``max_clients_per_group``; another uid still gets in."""
    import shutil
    import subprocess
    import sys
    import tempfile

    run_dir = Path(tempfile.mkdtemp(prefix="railhop-slots-"))  # reachable by uid 65534
    run_dir.chmod(0o755)

    async def body() -> None:
        async with ControlPlane(
            run_dir, heartbeat_ms=0, any_uid=True, max_clients=8, max_clients_per_group=3
        ) as cp:
            mine = [client(cp.socket_path) for _ in range(3)]
            await until(lambda: len(cp.clients) == 3)
            extra = client(cp.socket_path)
            await until(lambda: cp.counters.clients_refused == 1)
            assert extra.recv(10) == b""
            assert cp.counters.clients_refused_by_uid[os.getuid()] == 1
            # another uid: its own slots
            # the interpreter itself, not the venv's link to it: a checkout under /root
            # (0700) is not reachable by uid 65534; the child needs only the stdlib
            child = subprocess.Popen(
                [
                    os.path.realpath(sys.executable),
                    "-c",
                    "import socket, sys; s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)"
                    "; s.connect(sys.argv[1]); s.recv(1)",
                    str(cp.socket_path),
                ],
                user=65534,
            )
            try:
                await until(lambda: any(c.uid == 65534 for c in cp.clients))
                assert len(cp.clients) == 4 and cp.counters.clients_refused == 1
            finally:
                child.kill()
                child.wait(10)
            for s in (*mine, extra):
                s.close()

    try:
        run(body)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def test_root_processes_are_budgeted_per_cgroup(tmp_path: Path) -> None:
    """Issue 29, 5: every root container shared uid 0's one rate budget, so one container's
    flood starved the others. Root's processes are now told apart by their cgroup."""
    from railhop.control.server import EventServer, PeerCred, group_of

    for pid, cg in ((100, "0::/kubepods/pod-a"), (101, "0::/kubepods/pod-a"), (200, "0::/pod-b")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(cg + "\n")
    assert group_of(PeerCred(100, 0, 0), tmp_path) == group_of(PeerCred(101, 0, 0), tmp_path)
    assert group_of(PeerCred(100, 0, 0), tmp_path) != group_of(PeerCred(200, 0, 0), tmp_path)
    assert group_of(PeerCred(100, 1000, 0), tmp_path) == (1000, "")  # others: by uid
    assert group_of(PeerCred(999, 0, 0), tmp_path) == (0, "")  # unreadable: root's group
    srv = EventServer(
        Path("/nonexistent/agent.sock"),
        allowed_uids={0},
        queue_size=100000,
        rate_per_process=(10.0, 1000.0),
        rate_per_uid=(10.0, 30.0),
        clock=lambda: 10**12,
    )
    data = encode_event(LaneEvent(EventType.LANE_TIMEOUT, pid=1, nic="nic0", t_ns=1))
    for pid in (100, 101):
        cred = PeerCred(pid, 0, 0)
        for _ in range(100):
            srv.feed(data, cred, group_of(cred, tmp_path))
    assert srv.counters.events == 30  # pod-a's budget, both of its processes together
    other = PeerCred(200, 0, 0)
    for _ in range(10):
        srv.feed(data, other, group_of(other, tmp_path))
    assert srv.counters.events == 40  # pod-b is not starved
