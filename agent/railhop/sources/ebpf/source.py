"""The base of the eBPF sources (bcc): load a ``bpf/<probe>.bpf.c`` with the hook variants that
work on this kernel (:mod:`railhop.sources.ebpf.loader` decides them), and turn its ring-buffer
records into events.

Delivery: when the source is bound to an asyncio loop (``bind_loop``; ``start`` binds the running
loop), the ring buffer's map fd is watched with ``loop.add_reader`` and drained with
``ring_buffer_consume()`` on the loop itself, so a record is decoded and emitted in the same
``epoll_wait`` round that sees it, in kernel order relative to the loop's other fds (netlink):
no thread, no GIL hand-over. Without a loop, a thread polls the ring buffer instead.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
from pathlib import Path
from typing import Any

from railhop import paths
from railhop.sources import hooks as H
from railhop.sources.base import Capability, CapabilityWatcher, Emit, Reason, log
from railhop.sources.bpfstats import ProgStats, prog_stats
from railhop.sources.compose import ComposeError, compose
from railhop.sources.decode import DecodeError, decode
from railhop.sources.ebpf.loader import precheck, run_trials
from railhop.sources.events import Event

POLL_MS = 50

# the prelude of every probe: ring buffer, drop counter, RH_RESERVE (bpf/rh_ringbuf.c)
RINGBUF = ("rh_ringbuf.c",)


class EbpfSource:
    """A source backed by one probe file. ``filter_event`` may drop or rewrite decoded events."""

    def __init__(
        self,
        spec: H.ProbeSpec,
        bpf_dir: Path | None = None,
        root: str = "/",
        allow: frozenset[str] | None = None,
    ) -> None:
        self.spec = spec
        self.allow = allow
        self._bpf_dir = bpf_dir or paths.bpf_dir()
        self._root = root
        self._bpf: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._emit: Emit | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader_fd: int | None = None
        self.delivery = ""  # "loop" (add_reader on the ring buffer) | "thread" (poll thread)
        self.capabilities: list[Capability] = []
        self.decode_errors = 0
        self.poll_errors = 0
        self.chosen: list[H.Variant | None] = []
        self._watchers: list[CapabilityWatcher] = []
        self._watch_lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.spec.source

    @property
    def root(self) -> str:
        return self._root

    def _src(self) -> Path:
        return self._bpf_dir / self.spec.file

    def base_cflags(self) -> list[str]:
        return [f"-I{self._bpf_dir}", *self.spec.cflags]

    def text(self) -> str:
        """The program as bcc compiles it: preludes + probe file (:mod:`sources.compose`)."""
        return compose(self._bpf_dir, self.spec.file, self.spec.preludes)

    def usdt_request(self) -> dict[str, Any] | None:
        return None

    def _construct(self, cflags: list[str]) -> Any:
        from bcc import BPF

        return BPF(text=self.text().encode(), cflags=cflags)

    def probe(self) -> tuple[list[Capability], list[str]]:
        """Decide the variants (runs the trial child); returns records and the final cflags."""
        pre = precheck(self._root)
        if pre.env is None:
            return H.all_skipped(self.spec, pre.reason, pre.detail), []
        if not self._src().is_file():
            return H.all_skipped(self.spec, Reason.NOT_AVAILABLE, f"missing {self._src()}"), []
        try:
            text = self.text()
        except ComposeError as e:
            return H.all_skipped(self.spec, Reason.NOT_AVAILABLE, str(e)), []
        p = H.plan(self.spec, pre.env, self.allow)
        if not any(p.candidates):
            caps, _f, self.chosen = H.resolve(self.spec, p, H.TrialOutcome())
            return caps, []
        outcome = run_trials(
            str(self._src()), self.base_cflags(), p, self.usdt_request(), text=text
        )
        caps, flags, self.chosen = H.resolve(self.spec, p, outcome)
        return caps, flags

    def watch_capabilities(self, cb: CapabilityWatcher) -> list[Capability]:
        """Call ``cb`` with every record whenever hooks attach or fail after the start
        (:class:`railhop.sources.base.CapabilitiesChange`); returns the records now."""
        with self._watch_lock:
            self._watchers.append(cb)
            return list(self.capabilities)

    def capabilities_changed(self) -> None:
        """Tell the watchers (from the thread that changed ``capabilities``)."""
        with self._watch_lock:
            caps, watchers = list(self.capabilities), list(self._watchers)
        for cb in watchers:
            try:
                cb(caps)
            except Exception as e:  # a watcher's trouble is its own
                log.warning("%s: capability watcher: %s: %s", self.name, type(e).__name__, e)

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver events on ``loop`` (call before ``start_sync``, from any thread)."""
        self._loop = loop

    def start_sync(self, emit: Emit) -> list[Capability]:
        caps, flags = self.probe()
        self.capabilities = caps
        if not any(c.attached for c in caps):
            return caps
        try:
            self._bpf = self._construct(self.base_cflags() + flags)
            self.after_load(self._bpf)
            self._bpf[b"rh_events"].open_ring_buffer(self._on_record)
            fd = int(self._bpf[b"rh_events"].map_fd)
        except Exception as e:
            self._bpf = None
            self.capabilities = H.all_skipped(
                self.spec, Reason.LOAD_FAILED, f"{type(e).__name__}: {e}"
            )
            return self.capabilities
        self._emit = emit
        self._stop.clear()
        loop = self._loop
        if loop is not None and _running_loop() is loop:
            self.delivery = "loop"
            self._add_reader(fd)
            return caps
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._add_reader, fd)
                self.delivery = "loop"
                return caps
            except RuntimeError:  # the loop was closed meanwhile: poll instead
                pass
        self.delivery = "thread"
        self._thread = threading.Thread(target=self._poll, name=f"rh-{self.name}", daemon=True)
        self._thread.start()
        return caps

    async def start(self, emit: Emit) -> list[Capability]:
        if self._loop is None:
            self.bind_loop(asyncio.get_running_loop())
        return await asyncio.to_thread(self.start_sync, emit)

    def after_load(self, bpf: Any) -> None:
        """Subclass hook: fill maps after the program is loaded."""

    def _add_reader(self, fd: int) -> None:
        """On the loop: watch the ring buffer (level-triggered: records already there count)."""
        if self._bpf is None or self._stop.is_set() or self._loop is None:
            return
        self._loop.add_reader(fd, self._readable)
        self._reader_fd = fd

    def _readable(self) -> None:
        b = self._bpf
        if b is None:
            return
        try:
            b.ring_buffer_consume()  # non-blocking; runs _on_record for every pending record
        except Exception:  # one bad record must not stop the loop
            self.poll_errors += 1

    def _remove_reader(self) -> None:
        fd, self._reader_fd = self._reader_fd, None
        loop = self._loop
        if fd is not None and loop is not None and not loop.is_closed():
            loop.remove_reader(fd)

    def _detach(self, timeout_s: float) -> None:
        """Stop watching the ring buffer, on the loop's thread when the loop runs elsewhere."""
        loop = self._loop
        if self._reader_fd is None or loop is None or loop.is_closed():
            self._reader_fd = None
            return
        if _running_loop() is loop or not loop.is_running():
            self._remove_reader()
            return
        done = threading.Event()

        def rm() -> None:
            try:
                self._remove_reader()
            finally:
                done.set()

        try:
            loop.call_soon_threadsafe(rm)
        except RuntimeError:  # closed meanwhile
            return
        done.wait(timeout_s)

    def _poll(self) -> None:
        b = self._bpf
        while not self._stop.is_set() and b is not None:
            try:
                b.ring_buffer_poll(POLL_MS)
            except Exception:  # keep polling: one bad callback must not end the source
                self.poll_errors += 1
                self._stop.wait(POLL_MS / 1000)

    def _on_record(self, _ctx: Any, data: Any, size: int) -> int:
        raw = ctypes.string_at(data, size)
        try:
            ev = decode(raw, self.name)
        except DecodeError:
            self.decode_errors += 1
            return 0
        out = self.filter_event(ev)
        if out is not None and self._emit is not None:
            try:
                self._emit(out)
            except Exception:  # never raise into bcc's C callback
                self.poll_errors += 1
        return 0

    def filter_event(self, ev: Event) -> Event | None:
        return ev

    def prog_stats(self) -> dict[str, ProgStats]:
        """Run count and run time of each loaded program, by function name (counted only while
        BPF statistics are enabled: :class:`railhop.sources.bpfstats.RunStats`)."""
        if self._bpf is None:
            return {}
        out: dict[str, ProgStats] = {}
        for name, fn in list(self._bpf.funcs.items()):
            key = name.decode() if isinstance(name, bytes) else str(name)
            out[key] = prog_stats(int(fn.fd))
        return out

    def drops(self) -> int:
        if self._bpf is None:
            return 0
        return sum(int(v.value) for v in self._bpf[b"rh_drops"].values())

    def stop_sync(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._detach(timeout_s)
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None

    async def stop(self) -> None:
        self._stop.set()
        if _running_loop() is self._loop:
            self._remove_reader()
        await asyncio.to_thread(self.stop_sync)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
