"""What every source shares: the ``Source`` protocol, capability records, the registry.

A source turns one kind of raw signal into typed events (:mod:`railhop.sources.events`) and hands
each one to an ``Emit`` callback, which may be called from any thread. :func:`queue_emitter`
turns an asyncio queue into such a callback. Starting a source returns capability records: one
per hook or device, saying ``attached`` or ``skipped`` and why. A source that cannot start at all
says so in its records and the others carry on.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from railhop.sources.events import Event

Emit = Callable[[Event], None]
log = logging.getLogger("railhop.sources")


class SourceError(Exception):
    """Base class of every error raised by railhop.sources."""


class DuplicateSourceError(SourceError):
    """A source with this name is already registered."""


class Status(enum.StrEnum):
    ATTACHED = "attached"
    SKIPPED = "skipped"


class Reason(enum.StrEnum):
    """Why a hook or source was skipped (the fixed vocabulary of ``railhop agent --check``)."""

    NONE = ""
    NO_TRACEPOINT = "no tracepoint"
    NO_BTF = "no BTF"
    FENTRY_REFUSED = "fentry refused"
    NO_HEADERS = "no headers"
    NO_PRIVILEGE = "no privilege"
    NO_BCC = "no bcc"
    NO_RDMA_DEVICES = "no RDMA devices"
    NO_LIBRARY = "no library"
    NO_PROBES = "no probes"
    LOAD_FAILED = "load failed"
    NOT_AVAILABLE = "not available"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Capability:
    """One line of the capability report: a hook (or a whole source) and how it fared."""

    source: str
    hook: str
    status: Status
    mechanism: str = ""  # fentry | raw_tp | tp | usdt | netlink | sysfs | verbs
    reason: Reason = Reason.NONE
    detail: str = ""

    @property
    def attached(self) -> bool:
        return self.status is Status.ATTACHED

    def line(self) -> str:
        what = f"{self.source}:{self.hook}"
        if self.attached:
            return f"{what:40} attached ({self.mechanism})"
        why = self.reason.value or "skipped"
        return f"{what:40} skipped: {why}" + (f" ({self.detail})" if self.detail else "")


def attached(source: str, hook: str, mechanism: str, detail: str = "") -> Capability:
    return Capability(source, hook, Status.ATTACHED, mechanism, Reason.NONE, detail)


def skipped(source: str, hook: str, reason: Reason, detail: str = "") -> Capability:
    return Capability(source, hook, Status.SKIPPED, "", reason, detail)


@runtime_checkable
class Source(Protocol):
    """A producer of typed events. ``start`` must not raise for a missing capability: it returns
    ``skipped`` records instead (and stays inert); ``stop`` is idempotent and bounded in time."""

    @property
    def name(self) -> str: ...

    async def start(self, emit: Emit) -> list[Capability]: ...

    async def stop(self) -> None: ...


def queue_emitter(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Event]) -> Emit:
    """An ``Emit`` callable safe to call from any thread: events land on ``queue`` in ``loop``."""

    def emit(ev: Event) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            queue.put_nowait(ev)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(queue.put_nowait, ev)

    return emit


class Registry:
    """The set of sources of one agent, by unique name; starts and stops them together."""

    def __init__(self, sources: Iterable[Source] = (), log_capabilities: bool = True) -> None:
        self._log = log_capabilities
        self._sources: dict[str, Source] = {}
        self._started: list[Source] = []
        for s in sources:
            self.add(s)

    def add(self, source: Source) -> None:
        if source.name in self._sources:
            raise DuplicateSourceError(f"source {source.name!r} is already registered")
        self._sources[source.name] = source

    def __contains__(self, name: object) -> bool:
        return name in self._sources

    def __len__(self) -> int:
        return len(self._sources)

    def names(self) -> list[str]:
        return list(self._sources)

    def get(self, name: str) -> Source:
        return self._sources[name]

    async def start_all(self, emit: Emit) -> list[Capability]:
        """Start every source in registration order. A source that raises is reported as one
        ``skipped: error`` record; the others still start."""
        report: list[Capability] = []
        for s in self._sources.values():
            try:
                caps = await s.start(emit)
            except Exception as e:  # one broken source must not stop the agent
                caps = [skipped(s.name, "*", Reason.ERROR, f"{type(e).__name__}: {e}")]
            else:
                self._started.append(s)
            for c in caps if self._log else ():  # each hook says once how it fared
                (log.info if c.attached else log.warning)("%s", c.line())
            report.extend(caps)
        return report

    async def stop_all(self, timeout_s: float = 5.0) -> None:
        """Stop started sources in reverse order, each within ``timeout_s``; errors are swallowed
        (shutdown must finish)."""
        while self._started:
            s = self._started.pop()
            try:
                await asyncio.wait_for(s.stop(), timeout_s)
            except Exception:
                continue
