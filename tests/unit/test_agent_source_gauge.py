"""The agent's ``railhop_sources`` gauge follows a source's records after its start: a source
whose hooks all wait at start (0) and attach later (the ``rdma_cma`` tracepoints once
``rdma_cm`` loads) reads 1 then (issue 26: it was set once, at start)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from railhop import daemon
from railhop.metrics import AgentMetrics
from railhop.sources.base import (
    CapabilitiesChange,
    Capability,
    CapabilityWatcher,
    Reason,
    attached,
    skipped,
    source_attached,
)

REPO = Path(__file__).resolve().parents[2]
DGX = REPO / "tests" / "fixtures" / "sys" / "dgx-h100"


class LateSource:
    """Starts with every hook waiting; ``attach()`` (from another thread, as the late-hook
    watcher does) attaches one."""

    name = "late-fake"

    def __init__(self) -> None:
        self.caps = [skipped(self.name, "cm_event", Reason.NO_TRACEPOINT)]
        self.watchers: list[CapabilityWatcher] = []
        self.stopped = False

    async def start(self, emit: Callable[[Any], None]) -> list[Capability]:
        return list(self.caps)

    async def stop(self) -> None:
        self.stopped = True

    def watch_capabilities(self, cb: CapabilityWatcher) -> list[Capability]:
        self.watchers.append(cb)
        return list(self.caps)

    def attach(self) -> None:
        self.caps = [attached(self.name, "cm_event", "tp:rdma_cma:cm_event_handler")]
        for cb in self.watchers:
            cb(list(self.caps))


def test_source_attached_is_pure() -> None:
    assert source_attached([])  # a source without records (netlink) counts as started
    assert not source_attached([skipped("s", "h", Reason.NO_TRACEPOINT)])
    assert source_attached([skipped("s", "a", Reason.NO_TRACEPOINT), attached("s", "b", "tp")])


def test_a_late_attach_flips_the_sources_gauge(tmp_path: Path) -> None:
    src = LateSource()
    assert isinstance(src, CapabilitiesChange)
    metrics = AgentMetrics(nics=[], sys_root=DGX)
    cfg = daemon.AgentConfig(run_dir=tmp_path / "run", sys_root=DGX, heartbeat_ms=50)
    agent = daemon.Agent(cfg, source_factory=lambda c, t, p: [src], metrics=metrics)

    def gauge() -> float | None:
        return metrics.registry.get_sample_value("railhop_sources", {"source": src.name})

    async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, "condition not met before the deadline"
            await asyncio.sleep(0.01)

    async def body() -> None:
        task = asyncio.create_task(agent.run())
        await until(lambda: gauge() is not None and bool(src.watchers))
        assert gauge() == 0.0  # nothing attached at start
        t = threading.Thread(target=src.attach)  # the late-hook watcher's thread
        t.start()
        t.join(5)
        await until(lambda: gauge() == 1.0)
        agent.request_stop()
        assert await asyncio.wait_for(task, 10) == 0

    asyncio.run(body())
    assert src.stopped
