"""eBPF event delivery without a kernel: a source bound to an asyncio loop reads its ring buffer
on the loop (``add_reader`` on the map fd, drained with ``ring_buffer_consume``), in fd-readiness
order next to the loop's other sources; without a loop it falls back to a poll thread. The
"ring buffer" here is a pipe whose bytes are records of ``bpf/railhop_events.h``."""

from __future__ import annotations

import asyncio
import ctypes
import os
import struct
import threading
from typing import Any

import pytest

from railhop.sources import decode as D
from railhop.sources import hooks as H
from railhop.sources.base import Capability, attached
from railhop.sources.ebpf.source import EbpfSource
from railhop.sources.events import CarrierDown, Event

SPEC = H.ProbeSpec(source="ebpf.fake", file="fake.bpf.c", hooks=(H.Hook("carrier", ()),))


def record(ts: int, name: str) -> bytes:
    return D.NETDEV.pack(ts, D.EV_CARRIER_DOWN, 2, 7, 0, name.encode())


class PipeRing:
    """What EbpfSource uses of a bcc BPF object, backed by a non-blocking pipe."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        self.cb: Any = None
        self.consumed_on: list[int] = []
        self.polled_on: list[int] = []
        self.cleaned = False

    # bcc: b[b"rh_events"]
    def __getitem__(self, key: bytes) -> PipeRing:
        assert key == b"rh_events"
        return self

    @property
    def map_fd(self) -> int:
        return self.r

    def open_ring_buffer(self, cb: Any) -> None:
        self.cb = cb

    def _drain(self) -> None:
        try:
            data = os.read(self.r, 1 << 16)
        except BlockingIOError:
            return
        for off in range(0, len(data), D.NETDEV.size):
            buf = ctypes.create_string_buffer(data[off : off + D.NETDEV.size])
            self.cb(None, ctypes.addressof(buf), D.NETDEV.size)

    def ring_buffer_consume(self) -> None:
        self.consumed_on.append(threading.get_ident())
        self._drain()

    def ring_buffer_poll(self, timeout_ms: int) -> None:
        self.polled_on.append(threading.get_ident())
        import select

        if select.select([self.r], [], [], timeout_ms / 1000)[0]:
            self._drain()

    def cleanup(self) -> None:
        self.cleaned = True
        os.close(self.r)
        os.close(self.w)


class FakeSource(EbpfSource):
    def __init__(self) -> None:
        super().__init__(SPEC)
        self.ring = PipeRing()

    def probe(self) -> tuple[list[Capability], list[str]]:
        return [attached(SPEC.source, "carrier", "raw_tp")], []

    def _construct(self, cflags: list[str]) -> Any:
        return self.ring


def test_records_are_read_on_the_loop_in_readiness_order() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        me = threading.get_ident()
        got: list[tuple[str, int]] = []
        src = FakeSource()

        def emit(ev: Event) -> None:
            assert threading.get_ident() == me  # no thread hop: emitted on the loop itself
            got.append((ev.source, ev.ts_ns))

        caps = await src.start(emit)
        assert [c.attached for c in caps] == [True]
        assert src.delivery == "loop"
        assert src._thread is None
        ring = src.ring
        # a record written before the reader is registered is delivered too (level-triggered)
        os.write(ring.w, record(1, "nic0"))
        # another fd of the loop that becomes readable after the ring buffer (netlink's socket)
        other_r, other_w = os.pipe()
        os.set_blocking(other_r, False)
        loop.add_reader(other_r, lambda: got.append(("other", len(os.read(other_r, 64)))))
        try:
            while len(got) < 1:
                await asyncio.sleep(0.001)
            os.write(ring.w, record(2, "nic0") + record(3, "nic1"))
            os.write(other_w, b"x")
            deadline = loop.time() + 5
            while len(got) < 4 and loop.time() < deadline:
                await asyncio.sleep(0.001)
        finally:
            loop.remove_reader(other_r)
            os.close(other_r)
            os.close(other_w)
        assert got == [("ebpf.fake", 1), ("ebpf.fake", 2), ("ebpf.fake", 3), ("other", 1)]
        assert set(ring.consumed_on) == {me} and ring.polled_on == []
        fd = ring.r
        await src.stop()
        assert ring.cleaned
        with pytest.raises(KeyError):
            loop._selector.get_key(fd)  # type: ignore[attr-defined]

    asyncio.run(main())


def test_a_bad_record_is_counted_and_delivery_goes_on() -> None:
    async def main() -> None:
        got: list[Event] = []
        src = FakeSource()
        await src.start(got.append)
        os.write(src.ring.w, b"\x00" * D.NETDEV.size)  # kind 0: unknown
        os.write(src.ring.w, record(5, "nic2"))
        deadline = asyncio.get_running_loop().time() + 5
        while not got and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.001)
        await src.stop()
        assert src.decode_errors == 1
        assert [(type(e), e.ts_ns) for e in got] == [(CarrierDown, 5)]

    asyncio.run(main())


def test_without_a_loop_a_thread_polls() -> None:
    src = FakeSource()
    got: list[Event] = []
    done = threading.Event()

    def emit(ev: Event) -> None:
        got.append(ev)
        done.set()

    src.start_sync(emit)
    assert src.delivery == "thread" and src._thread is not None
    os.write(src.ring.w, record(9, "nic0"))
    assert done.wait(5)
    assert src.ring.polled_on and threading.get_ident() not in src.ring.polled_on
    src.stop_sync()
    assert src._thread is None and src.ring.cleaned
    assert [e.ts_ns for e in got] == [9]


def test_stop_from_another_thread_removes_the_reader_on_the_loop() -> None:
    """The daemon undoes a start that finished during shutdown from the start-up thread."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        src = FakeSource()
        src.bind_loop(loop)
        await asyncio.to_thread(src.start_sync, lambda _e: None)  # as the daemon does
        deadline = loop.time() + 5
        while src._reader_fd is None and loop.time() < deadline:
            await asyncio.sleep(0.001)
        fd = src.ring.r
        assert loop._selector.get_key(fd) is not None  # type: ignore[attr-defined]
        await asyncio.to_thread(src.stop_sync)
        with pytest.raises(KeyError):
            loop._selector.get_key(fd)  # type: ignore[attr-defined]
        assert src.ring.cleaned

    asyncio.run(main())


def test_record_helper_matches_the_decoder() -> None:
    ev = D.decode(record(4, "nicX"), "s")
    assert isinstance(ev, CarrierDown) and (ev.ifname, ev.ifindex) == ("nicX", 7)
    assert struct.calcsize(D.NETDEV.format) == 40


def test_a_closed_loop_falls_back_to_the_poll_thread() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    src = FakeSource()
    src.bind_loop(loop)
    src.start_sync(lambda _e: None)
    try:
        assert src.delivery == "thread" and src._thread is not None
    finally:
        src.stop_sync()
    assert src.ring.cleaned
