"""What the tests that run an in-process agent share: a source the test drives by hand, and a
bounded wait inside the agent's event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


class FakeSource:
    """An agent source that attaches nothing; the test emits its events through ``emit``."""

    name = "fake"

    def __init__(self) -> None:
        self.emit: Callable[[Any], None] | None = None

    async def start(self, emit: Callable[[Any], None]) -> list[Any]:
        self.emit = emit
        return []

    async def stop(self) -> None:
        pass


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait (in the loop) until ``cond()``; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.01)
