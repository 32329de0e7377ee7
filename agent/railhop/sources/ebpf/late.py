"""Hooks whose tracepoint appears after the source started: the ``rdma_cma`` tracepoints exist
only once the ``rdma_cm`` module is loaded, often by the first job that uses it.

A thread looks every ``interval_s`` whether a hook skipped for a missing tracepoint
(:func:`railhop.sources.hooks.late_spec`) can be tried now; those that can are loaded as a
source of their own (an :class:`EbpfSource` over a spec of just those hooks: trial child, then
load), delivering to the same ``emit`` on the same loop. Nothing already attached is reloaded,
so no event is lost or repeated. A hook whose late load fails is reported and not tried again.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from railhop.sources import hooks as H
from railhop.sources.base import Capability, Emit, log
from railhop.sources.bpfstats import ProgStats
from railhop.sources.ebpf.loader import precheck
from railhop.sources.ebpf.source import EbpfSource

INTERVAL_S = 2.0  # two stat() calls per waiting hook and interval while the module is absent

MakeSource = Callable[[H.ProbeSpec], EbpfSource]
Env = Callable[[], H.KernelEnv | None]


class LateHooks:
    """The late-loaded part of ``owner``: the watcher thread and the sources it started.
    ``make`` builds the source for a spec of late hooks; ``env`` gives the kernel's facts
    (None: the shared pre-checks failed, nothing can load)."""

    def __init__(
        self,
        owner: EbpfSource,
        make: MakeSource,
        env: Env | None = None,
        interval_s: float = INTERVAL_S,
    ) -> None:
        self.owner = owner
        self.interval_s = interval_s
        self._make = make
        self._env = env or (lambda: precheck(owner.root).env)
        self._emit: Emit | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.sources: list[EbpfSource] = []

    def start(self, emit: Emit, loop: asyncio.AbstractEventLoop | None) -> None:
        """Watch in a thread, when a hook of the owner waits for its tracepoint."""
        if not H.awaiting(self.owner.capabilities) or self._thread is not None:
            return
        self._emit, self._loop = emit, loop
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"rh-{self.owner.name}-late", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check_once()
            except Exception as e:  # keep watching: one failed attempt must not end it
                log.warning("%s: late hooks: %s: %s", self.owner.name, type(e).__name__, e)
            if not H.awaiting(self.owner.capabilities):
                return

    def check_once(self) -> list[Capability]:
        """One look: start the hooks that can be tried now; their records (empty: none)."""
        env = self._env()
        if env is None or self._emit is None:
            return []
        spec = H.late_spec(self.owner.spec, self.owner.capabilities, env, self.owner.allow)
        if spec is None:
            return []
        src = self._make(spec)
        if self._loop is not None:
            src.bind_loop(self._loop)
        caps = src.start_sync(self._emit)
        with self._lock:
            if self._stop.is_set():  # stopped meanwhile: undo here
                src.stop_sync()
                return []
            self.sources.append(src)
            self.owner.capabilities = H.merge_caps(self.owner.capabilities, caps)
        self.owner.capabilities_changed()  # e.g. the agent's railhop_sources gauge
        for c in caps:
            (log.info if c.attached else log.warning)("late: %s", c.line())
        return caps

    def drops(self) -> int:
        with self._lock:
            return sum(s.drops() for s in self.sources)

    def prog_stats(self) -> dict[str, ProgStats]:
        out: dict[str, ProgStats] = {}
        with self._lock:
            for s in self.sources:
                out.update(s.prog_stats())
        return out

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop watching (the thread is joined within ``timeout_s``), then the late sources."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        with self._lock:
            sources, self.sources = self.sources, []
        for s in sources:
            s.stop_sync(timeout_s)
