"""Verbs async events (PORT_ERR / PORT_ACTIVE / DEVICE_FATAL ...) of the node's RDMA devices.

Port state comes from pyverbs (``Context(name=...).query_port(n).state``), read once at start
into the capability report. Async events do not: pyverbs (rdma-core 44) lacks two things the
agent needs, so that one path stays on libibverbs through ctypes:

* ``pyverbs.device.Context`` exposes ``cmd_fd`` but not ``async_fd``: the event fd cannot be
  made non-blocking and watched by the agent's loop (``Context.get_async_event()`` blocks in
  ``ibv_get_async_event``, and a thread blocked there cannot be stopped within the agent's
  bounded shutdown);
* ``pyverbs.device.AsyncEvent`` exposes ``event_type`` only, not ``element.port_num``: a
  PORT_ERR on a dual-port HCA could not say which port (which NIC) went down.

So: one ``ibv_context`` per device through ctypes (``ibv_open_device``; ctypes releases the
GIL), its ``async_fd`` made non-blocking and watched with ``loop.add_reader``; each readable
event is read with ``ibv_get_async_event``, acknowledged, decoded by the pure
:func:`decode_async_event` and emitted. Devices are found under
``<root>/sys/class/infiniband`` (only ``devices`` when given); none -> one ``skipped: no RDMA
devices`` record.
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import os
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from railhop.sources.base import Capability, Emit, Reason, SourceError, attached, skipped
from railhop.sources.decode import IB_EVENTS
from railhop.sources.events import RdmaPortEvent

# offsetof(struct ibv_context, cmd_fd / async_fd), LP64, rdma-core ABI IBVERBS_1.1
CMD_FD_OFF = 264
ASYNC_FD_OFF = 268
PORT_EVENTS = {9, 10, 11, 12, 13, 17, 18, 20}  # events whose element is a port number
ASYNC_EVENT = struct.Struct("<Qi4x")  # struct ibv_async_event: union element; enum event_type


class VerbsError(SourceError):
    """libibverbs is missing or a device could not be opened."""


class _IbvAsyncEvent(ctypes.Structure):
    _fields_ = [("element", ctypes.c_uint64), ("event_type", ctypes.c_int)]


def decode_async_event(raw: bytes, device: str, ts_ns: int, source: str = "verbs") -> RdmaPortEvent:
    """Decode the 16 bytes of a ``struct ibv_async_event``."""
    if len(raw) < ASYNC_EVENT.size:
        raise VerbsError(f"ibv_async_event needs {ASYNC_EVENT.size} bytes, got {len(raw)}")
    element, etype = ASYNC_EVENT.unpack_from(raw)
    port = element & 0xFFFFFFFF if etype in PORT_EVENTS else 0
    return RdmaPortEvent(
        ts_ns=ts_ns,
        source=source,
        hook="verbs",
        device=device,
        event=IB_EVENTS.get(etype, str(etype)),
        code=etype,
        port=port,
    )


def list_devices(root: str = "/") -> list[str]:
    base = Path(root) / "sys/class/infiniband"
    try:
        return sorted(p.name for p in base.iterdir())
    except OSError:
        return []


@dataclass
class _Dev:
    name: str
    ctx: int
    afd: int


class Verbs:
    """Thin ctypes binding of the libibverbs calls used here."""

    def __init__(self, lib: Any = None) -> None:
        if lib is None:
            try:
                lib = ctypes.CDLL("libibverbs.so.1", use_errno=True)
            except OSError as e:
                raise VerbsError(f"libibverbs.so.1: {e}") from e
        self.lib = lib
        lib.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
        lib.ibv_get_device_list.argtypes = [ctypes.POINTER(ctypes.c_int)]
        lib.ibv_free_device_list.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.ibv_get_device_name.restype = ctypes.c_char_p
        lib.ibv_get_device_name.argtypes = [ctypes.c_void_p]
        lib.ibv_open_device.restype = ctypes.c_void_p
        lib.ibv_open_device.argtypes = [ctypes.c_void_p]
        lib.ibv_close_device.argtypes = [ctypes.c_void_p]
        lib.ibv_get_async_event.argtypes = [ctypes.c_void_p, ctypes.POINTER(_IbvAsyncEvent)]
        lib.ibv_ack_async_event.argtypes = [ctypes.POINTER(_IbvAsyncEvent)]

    def open_all(self, names: list[str]) -> tuple[list[_Dev], dict[str, str]]:
        n = ctypes.c_int(0)
        lst = self.lib.ibv_get_device_list(ctypes.byref(n))
        if not lst:
            err = ctypes.get_errno()
            raise VerbsError(f"ibv_get_device_list: {os.strerror(err) if err else 'failed'}")
        opened: list[_Dev] = []
        failed: dict[str, str] = {}
        try:
            for i in range(n.value):
                name = (self.lib.ibv_get_device_name(lst[i]) or b"").decode()
                if name not in names:
                    continue
                ctx = self.lib.ibv_open_device(lst[i])
                if not ctx:
                    failed[name] = os.strerror(ctypes.get_errno() or 19)
                    continue
                cmd_fd = ctypes.c_int.from_address(ctx + CMD_FD_OFF).value
                afd = ctypes.c_int.from_address(ctx + ASYNC_FD_OFF).value
                if cmd_fd < 0 or afd < 0 or afd == cmd_fd:
                    self.lib.ibv_close_device(ctx)
                    failed[name] = "unexpected struct ibv_context layout"
                    continue
                fl = fcntl.fcntl(afd, fcntl.F_GETFL)
                fcntl.fcntl(afd, fcntl.F_SETFL, fl | os.O_NONBLOCK)
                opened.append(_Dev(name, ctx, afd))
        finally:
            self.lib.ibv_free_device_list(lst)
        return opened, failed

    def read_event(self, dev: _Dev) -> bytes | None:
        ev = _IbvAsyncEvent()
        if self.lib.ibv_get_async_event(dev.ctx, ctypes.byref(ev)) != 0:
            return None
        raw = bytes(ev)[: ASYNC_EVENT.size]
        self.lib.ibv_ack_async_event(ctypes.byref(ev))
        return raw

    def close(self, dev: _Dev) -> None:
        self.lib.ibv_close_device(dev.ctx)


PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}

PortReader = Callable[[str, Sequence[int]], dict[int, str]]


def list_ports(root: str, device: str) -> list[int]:
    """The device's port numbers from ``<root>/sys/class/infiniband/<dev>/ports``."""
    base = Path(root) / "sys/class/infiniband" / device / "ports"
    try:
        return sorted(int(p.name) for p in base.iterdir() if p.name.isdigit())
    except OSError:
        return []


def pyverbs_port_states(device: str, ports: Sequence[int]) -> dict[int, str]:
    """Each port's state (``ibv_query_port``) through pyverbs; VerbsError when pyverbs is
    missing or the device cannot be opened."""
    try:
        from pyverbs.device import Context
    except ImportError as e:
        raise VerbsError(f"pyverbs: {e} (Debian: python3-pyverbs)") from e
    try:
        ctx = Context(name=device)
    except Exception as e:  # PyverbsRDMAError and friends
        raise VerbsError(f"pyverbs Context({device}): {e}") from e
    try:
        out = {}
        for p in ports:
            state = int(ctx.query_port(p).state)
            out[p] = PORT_STATES.get(state, str(state))
        return out
    except Exception as e:
        raise VerbsError(f"pyverbs query_port({device}): {e}") from e
    finally:
        ctx.close()


class VerbsSource:
    def __init__(
        self,
        root: str = "/",
        name: str = "verbs",
        verbs: Verbs | None = None,
        *,
        devices: Sequence[str] | None = None,
        port_states: PortReader | None = pyverbs_port_states,
    ) -> None:
        self._name = name
        self.root = root
        self.devices = None if devices is None else sorted(set(devices))
        self._verbs = verbs
        self._port_states = port_states
        self._devs: list[_Dev] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def name(self) -> str:
        return self._name

    def _ports(self, dev: str) -> str:
        """``port 1 ACTIVE`` for the capability report (pyverbs); why not, when it fails."""
        if self._port_states is None:
            return ""
        ports = list_ports(self.root, dev) or [1]
        try:
            states = self._port_states(dev, ports)
        except VerbsError as e:
            return f"; port state unknown ({e})"
        return "; " + ", ".join(f"port {p} {st}" for p, st in sorted(states.items()))

    async def start(self, emit: Emit) -> list[Capability]:
        names = list_devices(self.root)
        if self.devices is not None:
            names = [n for n in names if n in self.devices]
        if not names:
            return [skipped(self.name, "async_events", Reason.NO_RDMA_DEVICES)]
        try:
            v = self._verbs or Verbs()
            self._verbs = v
            self._devs, failed = v.open_all(names)
        except VerbsError as e:
            return [skipped(self.name, "async_events", Reason.NOT_AVAILABLE, str(e))]
        loop = asyncio.get_running_loop()
        self._loop = loop
        caps = []
        for d in self._devs:
            loop.add_reader(d.afd, self._readable, d, emit)
            caps.append(
                attached(self.name, d.name, "verbs", f"async_fd {d.afd}{self._ports(d.name)}")
            )
        for n, why in failed.items():
            caps.append(skipped(self.name, n, Reason.NOT_AVAILABLE, why))
        for n in names:
            if n not in failed and all(d.name != n for d in self._devs):
                caps.append(skipped(self.name, n, Reason.NOT_AVAILABLE, "not listed by libibverbs"))
        return caps

    def _readable(self, dev: _Dev, emit: Emit) -> None:
        assert self._verbs is not None
        for _ in range(64):  # bounded: never starve the loop
            raw = self._verbs.read_event(dev)
            if raw is None:
                return
            emit(decode_async_event(raw, dev.name, time.monotonic_ns(), self.name))

    async def stop(self) -> None:
        for d in self._devs:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(d.afd)
            if self._verbs is not None:
                self._verbs.close(d)
        self._devs = []
