"""Verbs async-event source: decoding of struct ibv_async_event, and the non-blocking plumbing
with a fake libibverbs (no RDMA hardware here)."""

from __future__ import annotations

import asyncio
import os
import struct
from pathlib import Path

import pytest

from railhop.sources import verbs as V
from railhop.sources.base import Reason
from railhop.sources.events import Event, RdmaPortEvent


def raw(element: int, etype: int) -> bytes:
    return struct.pack("<Qi4x", element, etype)


@pytest.mark.parametrize(
    ("element", "etype", "event", "port"),
    [
        (1, 10, "PORT_ERR", 1),
        (2, 9, "PORT_ACTIVE", 2),
        (0x7F0012345678, 8, "DEVICE_FATAL", 0),  # not port-affiliated: element is a pointer
        (0x7F0012345678, 1, "QP_FATAL", 0),
        (1, 20, "DEVICE_SPEED_CHANGE", 1),
        (1, 99, "99", 0),
    ],
)
def test_decode_async_event(element: int, etype: int, event: str, port: int) -> None:
    ev = V.decode_async_event(raw(element, etype), "mlx5_0", 5)
    assert ev == RdmaPortEvent(
        ts_ns=5, source="verbs", hook="verbs", device="mlx5_0", event=event, code=etype, port=port
    )


def test_decode_short() -> None:
    with pytest.raises(V.VerbsError):
        V.decode_async_event(b"\0" * 8, "x", 0)


def test_no_rdma_devices_is_a_clean_skip(tmp_path: Path) -> None:
    async def run() -> None:
        src = V.VerbsSource(root=str(tmp_path))
        caps = await src.start(lambda _e: None)
        assert [(c.hook, c.reason) for c in caps] == [("async_events", Reason.NO_RDMA_DEVICES)]
        assert caps[0].line().endswith("skipped: no RDMA devices")
        await src.stop()

    asyncio.run(run())


class FakeVerbs(V.Verbs):
    """Each device's async_fd is a pipe; a byte written to it stands for one queued event."""

    def __init__(self, queued: dict[str, list[bytes]], broken: set[str]) -> None:
        self.queued = queued
        self.broken = broken
        self.pipes: dict[str, tuple[int, int]] = {}
        self.closed: list[str] = []

    def open_all(self, names: list[str]) -> tuple[list[V._Dev], dict[str, str]]:
        devs, failed = [], {}
        for n in names:
            if n in self.broken:
                failed[n] = "No such device"
                continue
            r, w = os.pipe()
            os.set_blocking(r, False)
            self.pipes[n] = (r, w)
            devs.append(V._Dev(n, 0, r))
        return devs, failed

    def fire(self, name: str) -> None:
        os.write(self.pipes[name][1], b"x")

    def read_event(self, dev: V._Dev) -> bytes | None:
        try:
            os.read(dev.afd, 1)
        except BlockingIOError:
            return None
        return self.queued[dev.name].pop(0)

    def close(self, dev: V._Dev) -> None:
        self.closed.append(dev.name)
        for fd in self.pipes.pop(dev.name):
            os.close(fd)


def test_events_flow_through_the_loop(tmp_path: Path) -> None:
    for d in ("mlx5_0", "mlx5_1", "mlx5_9"):
        (tmp_path / "sys/class/infiniband" / d).mkdir(parents=True)
    fake = FakeVerbs({"mlx5_0": [raw(1, 10), raw(1, 9)], "mlx5_1": [raw(0, 8)]}, {"mlx5_9"})

    async def run() -> list[Event]:
        q: asyncio.Queue[Event] = asyncio.Queue()
        src = V.VerbsSource(root=str(tmp_path), verbs=fake)
        caps = await src.start(q.put_nowait)
        assert [(c.hook, c.attached) for c in caps] == [
            ("mlx5_0", True),
            ("mlx5_1", True),
            ("mlx5_9", False),
        ]
        fake.fire("mlx5_0")
        fake.fire("mlx5_1")
        fake.fire("mlx5_0")
        got = [await asyncio.wait_for(q.get(), 5) for _ in range(3)]
        await src.stop()
        return got

    got = asyncio.run(run())
    assert sorted((e.device, e.event, e.port) for e in got if isinstance(e, RdmaPortEvent)) == [
        ("mlx5_0", "PORT_ACTIVE", 1),
        ("mlx5_0", "PORT_ERR", 1),
        ("mlx5_1", "DEVICE_FATAL", 0),
    ]
    assert sorted(fake.closed) == ["mlx5_0", "mlx5_1"]


def test_pyverbs_port_state_of_a_missing_device_is_a_clear_error() -> None:
    """The real pyverbs call (python3-pyverbs is installed by setup): no such device here, so
    the reader says why and the capability report carries it instead of a state."""
    with pytest.raises(V.VerbsError, match=r"pyverbs"):
        V.pyverbs_port_states("mlx5_nonexistent", [1])


def test_port_numbers_come_from_sysfs(tmp_path: Path) -> None:
    for p in ("1", "2"):
        (tmp_path / "sys/class/infiniband/mlx5_0/ports" / p).mkdir(parents=True)
    assert V.list_ports(str(tmp_path), "mlx5_0") == [1, 2]
    assert V.list_ports(str(tmp_path), "mlx5_9") == []
