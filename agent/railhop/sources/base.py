"""What every source shares: the ``Source`` protocol, capability records, the registry.

A source turns one kind of raw signal into typed events (:mod:`railhop.sources.events`) and hands
each one to an ``Emit`` callback, which may be called from any thread. :func:`queue_emitter`
turns an asyncio queue into such a callback. Starting a source returns capability records: one
per hook or device, saying ``attached`` or ``skipped`` and why. A source that cannot start at all
says so in its records and the others carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    mechanism: str = ""  # fentry | kprobe | raw_tp | tp | usdt | netlink | sysfs | verbs
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


@runtime_checkable
class ThreadStarted(Protocol):
    """A source whose start blocks for long (eBPF: trial child + bcc compile, seconds to
    minutes): :class:`Registry` runs ``start_sync`` in a thread of its own and, should the
    registry close meanwhile, undoes the start there with ``stop_sync``."""

    def start_sync(self, emit: Emit) -> list[Capability]: ...

    def stop_sync(self) -> None: ...


@runtime_checkable
class LoopBound(Protocol):
    """A source that delivers its events on the registry's loop (call before starting it)."""

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None: ...


CapabilityWatcher = Callable[[list["Capability"]], None]


@runtime_checkable
class CapabilitiesChange(Protocol):
    """A source whose records can change after its start (hooks that attach later: the
    ``rdma_cma`` tracepoints once ``rdma_cm`` loads). ``watch_capabilities(cb)`` returns the
    records as they are now and calls ``cb`` with all of them, from any thread, whenever they
    change after that."""

    def watch_capabilities(self, cb: CapabilityWatcher) -> list[Capability]: ...


def source_attached(caps: Sequence[Capability]) -> bool:
    """Pure: whether a started source counts as attached (no records, or one attached)."""
    return not caps or any(c.attached for c in caps)


QUICK_TIMEOUT_ENV = "RAILHOP_SOURCE_TIMEOUT_S"
QUICK_TIMEOUT_S = 30.0  # one quick (not eBPF) source's start


def env_seconds(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """A bound in seconds from the environment variable ``name`` (``default`` where unset or
    empty); a value that is not a positive finite number is an error that names it."""
    env = os.environ if environ is None else environ
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if not 0 < v < float("inf"):
        raise ValueError(f"{name}={raw!r}: want a positive number of seconds")
    return v


def source_timeout_s(environ: Mapping[str, str] | None = None) -> float:
    """The bound on one quick source's start (netlink, sysfs, verbs: imports and first reads):
    ``RAILHOP_SOURCE_TIMEOUT_S`` where set (an emulated CPU needs more than the default 30 s
    to import pyroute2 under load), else ``QUICK_TIMEOUT_S``."""
    return env_seconds(QUICK_TIMEOUT_ENV, QUICK_TIMEOUT_S, environ)


def starts_slowly(source: Source) -> bool:
    """A source whose start blocks (:class:`ThreadStarted`: the kernel hooks ``ebpf.*`` and the
    plugin's USDT probes ``usdt.*``, each a trial child + a bcc compile, seconds to minutes)
    starts in the background, so the loop acts on the quick sources' events meanwhile."""
    return isinstance(source, ThreadStarted)


StartedHook = Callable[[Source, list[Capability]], None]


class Registry:
    """The set of sources of one agent, by unique name, and their one lifecycle.

    Two ways to start them, one way to stop them:

    - :meth:`start_all` starts every source in registration order and reports a source that
      raised as one ``skipped: error`` record (the capability report);
    - :meth:`start` starts the quick sources now and the slow ones (:func:`starts_slowly`) one
      after another in a background task, each in a daemon thread of its own when it is
      :class:`ThreadStarted` (unlike ``asyncio.to_thread``, a stuck compile never delays the
      process's exit); :attr:`ready` is set once every source started or was given up (the
      agent, whose loop serves events and heartbeats meanwhile);
    - :meth:`stop_all` stops the background start-up, then every started source in reverse
      order, within one deadline; a start that finishes after it began is undone in its thread.
    """

    def __init__(self, sources: Iterable[Source] = (), log_capabilities: bool = True) -> None:
        self._log = log_capabilities
        self._sources: dict[str, Source] = {}
        self._started: list[Source] = []
        self._closing = threading.Event()
        self._bg_start: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()  # every source started or given up
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

    def sources(self) -> list[Source]:
        """Every registered source, in registration order."""
        return list(self._sources.values())

    def started(self) -> list[Source]:
        """The sources started so far, in start order."""
        return list(self._started)

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
        self.ready.set()
        return report

    async def start(
        self,
        emit: Emit,
        on_started: StartedHook,
        *,
        quick_timeout_s: float | None = None,
        slow_timeout_s: float = 180.0,
    ) -> None:
        """Start the quick sources now (each within ``quick_timeout_s``) and the slow ones in
        the background (each within ``slow_timeout_s``); ``on_started(source, records)`` runs
        on the loop for each source that started. A source that raises or times out is logged
        and left out; the others carry on. ``quick_timeout_s`` default: :func:`source_timeout_s`."""
        quick_s = source_timeout_s() if quick_timeout_s is None else quick_timeout_s
        slow = [s for s in self._sources.values() if starts_slowly(s)]
        for s in self._sources.values():
            if s in slow:
                continue
            try:
                caps = await asyncio.wait_for(s.start(emit), quick_s)
            except TimeoutError:
                log.warning(
                    "source %s failed to start: not started within %g s (%s)",
                    s.name,
                    quick_s,
                    QUICK_TIMEOUT_ENV,
                )
                continue
            except Exception as e:
                log.warning("source %s failed to start: %s", s.name, e or type(e).__name__)
                continue
            self._up(s, caps, on_started)
        if slow:
            self._bg_start = asyncio.create_task(
                self._start_slow(slow, emit, on_started, slow_timeout_s), name="railhop-ebpf-start"
            )
        else:
            self.ready.set()

    def _up(self, s: Source, caps: list[Capability], on_started: StartedHook) -> None:
        self._started.append(s)
        for c in caps if self._log else ():
            (log.info if c.attached else log.warning)("%s", c.line())
        on_started(s, caps)

    async def _start_slow(
        self, slow: Sequence[Source], emit: Emit, on_started: StartedHook, timeout_s: float
    ) -> None:
        try:
            for s in slow:
                t0 = time.monotonic()
                try:
                    caps = await asyncio.wait_for(self._start_in_thread(s, emit), timeout_s)
                except TimeoutError:
                    log.warning(
                        "source %s failed to start: not started within %g s"
                        " (RAILHOP_EBPF_TIMEOUT_S)",
                        s.name,
                        timeout_s,
                    )
                    continue
                except Exception as e:
                    log.warning("source %s failed to start: %s", s.name, e or type(e).__name__)
                    continue
                if self._closing.is_set():
                    return
                log.info("source %s started in %.1f s", s.name, time.monotonic() - t0)
                self._up(s, caps, on_started)
        finally:
            self.ready.set()

    def _start_in_thread(self, s: Source, emit: Emit) -> asyncio.Future[list[Capability]]:
        """``s.start_sync`` in a daemon thread; a start that finishes after :meth:`stop_all`
        began is undone in that thread."""
        if not isinstance(s, ThreadStarted):
            return asyncio.ensure_future(s.start(emit))
        loop = asyncio.get_running_loop()
        if isinstance(s, LoopBound):  # eBPF: records are read on this loop, next to netlink's
            s.bind_loop(loop)
        fut: asyncio.Future[list[Capability]] = loop.create_future()

        def deliver(res: list[Capability] | None, exc: BaseException | None) -> None:
            if fut.done():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(res or [])

        def work() -> None:
            res: list[Capability] | None = None
            exc: BaseException | None = None
            try:
                res = list(s.start_sync(emit))
            except Exception as e:
                exc = e
            if self._closing.is_set():
                _stop_quietly(s)
                return
            try:
                loop.call_soon_threadsafe(deliver, res, exc)
            except RuntimeError:  # the loop is gone
                _stop_quietly(s)

        threading.Thread(target=work, name=f"rh-start-{s.name}", daemon=True).start()
        return fut

    async def stop_all(self, timeout_s: float = 5.0) -> None:
        """Stop the background start-up (at most 1 s), then the started sources in reverse
        order, all within ``timeout_s`` (each gets what is left, at least 0.1 s); a source that
        fails or hangs is logged and left behind (shutdown must finish)."""
        t0 = time.monotonic()
        self._closing.set()
        if self._bg_start is not None and not self._bg_start.done():
            self._bg_start.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._bg_start, 1.0)
        while self._started:
            s = self._started.pop()
            left = max(0.1, timeout_s - (time.monotonic() - t0))
            try:
                await asyncio.wait_for(s.stop(), left)
            except Exception as e:
                log.warning("source %s did not stop cleanly: %s", s.name, e or type(e).__name__)


def _stop_quietly(s: ThreadStarted) -> None:
    with contextlib.suppress(Exception):
        s.stop_sync()
