"""Registry, capability records and the thread-safe queue emitter."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from railhop.sources.base import (
    Capability,
    DuplicateSourceError,
    Emit,
    Reason,
    Registry,
    Source,
    Status,
    attached,
    queue_emitter,
    skipped,
)
from railhop.sources.events import CarrierDown, Event


class Fake:
    def __init__(self, name: str, fail: bool = False, hang: bool = False) -> None:
        self._name = name
        self.fail = fail
        self.hang = hang
        self.log: list[str] = []

    @property
    def name(self) -> str:
        return self._name

    async def start(self, emit: Emit) -> list[Capability]:
        if self.fail:
            raise RuntimeError("boom")
        emit(CarrierDown(ts_ns=1, source=self.name, ifname="nic0"))
        return [attached(self.name, "h", "fake")]

    async def stop(self) -> None:
        self.log.append("stop")
        if self.hang:
            await asyncio.Event().wait()


def test_fake_is_a_source() -> None:
    assert isinstance(Fake("a"), Source)


def test_registry_refuses_duplicates() -> None:
    reg = Registry([Fake("a")])
    with pytest.raises(DuplicateSourceError, match="'a'"):
        reg.add(Fake("a"))
    reg.add(Fake("b"))
    assert reg.names() == ["a", "b"] and len(reg) == 2 and "b" in reg


def test_a_failing_source_does_not_stop_the_others() -> None:
    a, bad, c = Fake("a"), Fake("bad", fail=True), Fake("c")
    got: list[Event] = []

    async def run() -> list[Capability]:
        reg = Registry([a, bad, c])
        caps = await reg.start_all(got.append)
        await reg.stop_all()
        return caps

    caps = asyncio.run(run())
    assert [(x.source, x.status) for x in caps] == [
        ("a", Status.ATTACHED),
        ("bad", Status.SKIPPED),
        ("c", Status.ATTACHED),
    ]
    assert caps[1].reason is Reason.ERROR and "RuntimeError: boom" in caps[1].detail
    assert [e.source for e in got] == ["a", "c"]
    assert a.log == ["stop"] and c.log == ["stop"] and bad.log == []


def test_stop_all_has_a_deadline() -> None:
    slow, b = Fake("slow", hang=True), Fake("b")

    async def run() -> None:
        reg = Registry([slow, b])
        await reg.start_all(lambda _e: None)
        await asyncio.wait_for(reg.stop_all(timeout_s=0.05), 5)

    asyncio.run(run())
    assert slow.log == ["stop"] and b.log == ["stop"]


def test_queue_emitter_from_another_thread() -> None:
    async def run() -> list[Event]:
        q: asyncio.Queue[Event] = asyncio.Queue()
        emit = queue_emitter(asyncio.get_running_loop(), q)
        th = threading.Thread(
            target=lambda: [emit(CarrierDown(ts_ns=i, source="t", ifname="x")) for i in range(100)]
        )
        th.start()
        out = [await asyncio.wait_for(q.get(), 5) for _ in range(100)]
        th.join()
        emit(CarrierDown(ts_ns=100, source="loop", ifname="x"))  # same-loop path
        out.append(await asyncio.wait_for(q.get(), 5))
        return out

    out = asyncio.run(run())
    assert [e.ts_ns for e in out] == list(range(101))


def test_capability_lines() -> None:
    assert (
        attached("ebpf.carrier", "carrier", "raw_tp:qdisc_reset")
        .line()
        .endswith("attached (raw_tp:qdisc_reset)")
    )
    line = skipped("verbs", "async_events", Reason.NO_RDMA_DEVICES).line()
    assert line.endswith("skipped: no RDMA devices")
    line = skipped("ebpf.rdma", "mlx5_cmd", Reason.NO_TRACEPOINT, "tp: no mlx5:mlx5_cmd").line()
    assert "skipped: no tracepoint (tp: no mlx5:mlx5_cmd)" in line


def test_check_async_starts_and_stops_everything() -> None:
    from railhop.sources.report import check_async

    a, bad = Fake("a"), Fake("bad", fail=True)
    caps = asyncio.run(check_async([a, bad]))
    assert [(c.source, c.attached) for c in caps] == [("a", True), ("bad", False)]
    assert a.log == ["stop"]


class SlowFake(Fake):
    """A kernel-hook-like source: its start blocks (compile) until released, in a thread."""

    def __init__(self, name: str = "ebpf.slow") -> None:
        super().__init__(name)
        self.release = threading.Event()
        self.thread = ""

    def start_sync(self, emit: Emit) -> list[Capability]:
        assert self.release.wait(30)
        self.thread = threading.current_thread().name
        return [attached(self.name, "h", "fake")]

    def stop_sync(self) -> None:
        self.log.append("stop_sync")


def test_start_runs_slow_sources_in_a_thread_in_the_background() -> None:
    quick, bad, slow = Fake("quick"), Fake("bad", fail=True), SlowFake()
    up: list[str] = []

    async def run() -> None:
        reg = Registry([slow, bad, quick], log_capabilities=False)
        await reg.start(lambda _e: None, lambda s, _caps: up.append(s.name))
        assert up == ["quick"] and not reg.ready.is_set()  # the loop goes on meanwhile
        slow.release.set()
        await asyncio.wait_for(reg.ready.wait(), 5)
        assert up == ["quick", "ebpf.slow"] and slow.thread == "rh-start-ebpf.slow"
        assert [s.name for s in reg.started()] == ["quick", "ebpf.slow"]
        await reg.stop_all(1.0)

    asyncio.run(run())
    assert slow.log == ["stop"] and quick.log == ["stop"] and bad.log == []


def test_a_slow_start_that_ends_after_stop_all_is_undone_in_its_thread() -> None:
    slow = SlowFake()

    async def run() -> None:
        reg = Registry([slow], log_capabilities=False)
        await reg.start(lambda _e: None, lambda _s, _c: pytest.fail("started after stop"))
        await asyncio.wait_for(reg.stop_all(1.0), 5)
        assert reg.started() == []

    asyncio.run(run())
    slow.release.set()
    deadline = time.monotonic() + 5
    while slow.log != ["stop_sync"]:
        assert time.monotonic() < deadline, slow.log
        time.sleep(0.01)
