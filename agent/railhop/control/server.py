"""The agent's lane-event socket: AF_UNIX SOCK_SEQPACKET, one event per message.

Security and robustness:
- the socket's mode is set before it exists (umask around ``bind``): 0600 (the agent's uid, or
  the job owner's after ``chown``), 0660 with a configured group, 0666 when any uid may send;
- at accept the peer's credentials (SO_PEERCRED, kernel-verified) must name an allowed uid
  (the agent's, root's, the configured job owner), a member of the configured group
  (SO_PEERGROUPS), or any uid when so configured; other peers are closed and counted;
- every event is attributed to its peer's uid and pid and rate-limited per process and per
  group (token buckets): a flood from one job is dropped and counted, and cannot fill the
  daemon's queue for the others. A group is a uid, except for root, whose processes are told
  apart by their cgroup (every root container would otherwise share uid 0's one budget);
- an event's ``t_ns`` is clamped to the receive time: a sender cannot date an event in the
  future (a forged 2**62 would have frozen the NIC's state machine);
- each message is read with a bounded buffer (MAX_MSG + 1); longer messages are truncated by
  the kernel, flagged MSG_TRUNC and dropped; malformed ones are dropped and counted by reason;
- at most ``max_clients`` connections, at most ``max_clients_per_group`` of them from one
  group (one uid cannot take every slot), each read at most ``burst`` messages per wake-up, and
  a bounded queue towards the daemon (overflow counted): a flood cannot starve the loop or grow
  memory.

asyncio has no SOCK_SEQPACKET server, so the sockets are driven with ``loop.add_reader``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import errno
import os
import socket
import stat
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from railhop.control.errors import ControlError, EventDecodeError
from railhop.control.lane_events import MAX_MSG, LaneEvent, decode_event

_UCRED = struct.Struct("3i")
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux 4.13+


class RateLimiter:
    """Token buckets by key: ``rate`` events per second, bursts of ``burst``. Pure: time comes
    in as ``now_ns``. At most ``max_keys`` buckets: when full, full buckets are forgotten."""

    def __init__(self, rate: float, burst: float, *, max_keys: int = 4096) -> None:
        if rate <= 0 or burst < 1:
            raise ControlError(f"rate limit needs rate > 0 and burst >= 1, got {rate}/{burst}")
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: dict[object, tuple[float, int]] = {}

    def allow(self, key: object, now_ns: int) -> bool:
        tokens, last = self._buckets.get(key, (self.burst, now_ns))
        tokens = min(self.burst, tokens + max(0, now_ns - last) * self.rate / 1e9)
        ok = tokens >= 1
        if ok:
            tokens -= 1
        if key not in self._buckets and len(self._buckets) >= self.max_keys:
            self._prune(now_ns)
        self._buckets[key] = (tokens, now_ns)
        return ok

    def _prune(self, now_ns: int) -> None:
        for k, (tokens, last) in list(self._buckets.items()):
            if tokens + max(0, now_ns - last) * self.rate / 1e9 >= self.burst:
                del self._buckets[k]
        while len(self._buckets) >= self.max_keys:  # all busy: drop the oldest
            del self._buckets[min(self._buckets, key=lambda k: self._buckets[k][1])]


@dataclass(frozen=True)
class PeerCred:
    """A connected plugin process as the kernel reports it (pid in the agent's namespace)."""

    pid: int
    uid: int
    gid: int


@dataclass(frozen=True)
class ReceivedEvent:
    event: LaneEvent
    peer: PeerCred
    recv_ns: int  # CLOCK_MONOTONIC when the agent read it


@dataclass
class ServerCounters:
    clients_accepted: int = 0
    clients_closed: int = 0
    peers_rejected: int = 0  # wrong uid (SO_PEERCRED)
    clients_refused: int = 0  # over max_clients or max_clients_per_group
    clients_refused_by_uid: Counter[int] = field(default_factory=Counter)
    events: int = 0  # decoded and queued
    malformed: int = 0  # all drops for bad content, by reason below
    malformed_by_reason: Counter[str] = field(default_factory=Counter)
    queue_dropped: int = 0  # daemon too slow, queue full
    rate_limited: int = 0  # over a per-process or per-uid rate limit
    rate_limited_by_uid: Counter[int] = field(default_factory=Counter)
    clamped: int = 0  # t_ns in the future: set to the receive time


class _Client:
    __slots__ = ("cred", "group", "sock")

    def __init__(self, sock: socket.socket, cred: PeerCred, group: Group) -> None:
        self.sock = sock
        self.cred = cred
        self.group = group


Group = tuple[int, str]  # (uid, cgroup path for root's processes, else "")


def group_of(cred: PeerCred, proc_root: Path = Path("/proc")) -> Group:
    """Whose budget and client slots an event uses: its uid, and for root its cgroup (read from
    ``<proc_root>/<pid>/cgroup``; unreadable: root's shared group)."""
    if cred.uid != 0:
        return (cred.uid, "")
    try:
        text = (proc_root / str(cred.pid) / "cgroup").read_text()
    except OSError:
        return (0, "")
    return (0, text.strip()[:4096])


_NGROUPS_MAX = 65536  # Linux's limit on supplementary groups
_libc = ctypes.CDLL(None, use_errno=True)
_libc.getsockopt.argtypes = [
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_uint32),
]
_libc.getsockopt.restype = ctypes.c_int


def _getsockopt_raw(fd: int, level: int, name: int, size: int) -> tuple[int, bytes, int]:
    """libc getsockopt with a buffer of ``size`` bytes: (errno or 0, the bytes returned, the
    length the kernel reported). Python's socket.getsockopt refuses buffers over 1024 bytes
    (256 groups)."""
    buf = ctypes.create_string_buffer(size)
    length = ctypes.c_uint32(size)
    rc = _libc.getsockopt(fd, level, name, buf, ctypes.byref(length))
    if rc != 0:
        return ctypes.get_errno(), b"", length.value
    return 0, buf.raw[: length.value], length.value


def peer_groups(sock: socket.socket) -> frozenset[int]:
    """The peer's supplementary groups (SO_PEERGROUPS), however many; empty where the kernel
    lacks the option. When the buffer is too small the kernel answers ERANGE with the length
    it needs: asked once more with that length (the peer's groups are fixed at connect)."""
    size = 64 * 4
    for _ in range(2):
        err, raw, needed = _getsockopt_raw(sock.fileno(), socket.SOL_SOCKET, SO_PEERGROUPS, size)
        if err == errno.ERANGE and size < needed <= _NGROUPS_MAX * 4:
            size = needed
            continue
        if err:
            return frozenset()
        return frozenset(struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4]))
    return frozenset()


def peer_cred(sock: socket.socket) -> PeerCred:
    pid, uid, gid = _UCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    )
    return PeerCred(pid=pid, uid=uid, gid=gid)


class EventServer:
    """Listens on ``path``; decoded events go to ``queue`` (``None`` marks the end)."""

    def __init__(
        self,
        path: Path,
        *,
        allowed_uids: Iterable[int],
        owner_uid: int | None = None,
        group_gid: int | None = None,
        any_uid: bool = False,
        max_clients: int = 256,
        max_clients_per_group: int = 32,
        queue_size: int = 4096,
        burst: int = 64,
        rate_per_process: tuple[float, float] = (200.0, 1000.0),
        rate_per_uid: tuple[float, float] = (1000.0, 5000.0),
        clock: Callable[[], int] = time.monotonic_ns,
        proc_root: Path = Path("/proc"),
    ) -> None:
        """``rate_per_process`` / ``rate_per_uid``: (events per second, burst); the per-uid
        budget is per group (:func:`group_of`)."""
        self.path = Path(path)
        self.allowed_uids = frozenset(allowed_uids)
        self.owner_uid = owner_uid
        self.group_gid = group_gid
        self.any_uid = any_uid
        self._per_pid = RateLimiter(*rate_per_process)
        self._per_uid = RateLimiter(*rate_per_uid)
        self._clock = clock
        self.max_clients = max_clients
        self.max_clients_per_group = max_clients_per_group
        self.proc_root = proc_root
        self._group_clients: Counter[Group] = Counter()
        self.burst = burst
        self.counters = ServerCounters()
        self.queue: asyncio.Queue[ReceivedEvent | None] = asyncio.Queue(queue_size)
        self._listener: socket.socket | None = None
        self._ino = 0
        self._clients: dict[int, _Client] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def clients(self) -> list[PeerCred]:
        return [c.cred for c in self._clients.values()]

    @property
    def socket_mode(self) -> int:
        if self.any_uid:
            return 0o666
        return 0o660 if self.group_gid is not None else 0o600

    def start(self) -> None:
        """Binds and listens; must run inside the event loop. ControlError if another agent
        already listens on the path."""
        self._loop = asyncio.get_running_loop()
        self._remove_stale()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        mode = self.socket_mode
        try:
            sock.setblocking(False)
            old = os.umask(0o777 & ~mode)  # the socket is born with its mode: no open window
            try:
                sock.bind(str(self.path))
            finally:
                os.umask(old)
            st = os.lstat(self.path)
            if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
                raise OSError(0, "the bound path is not our socket")
            os.chmod(self.path, mode)
            if self.owner_uid is not None or self.group_gid is not None:
                os.chown(
                    self.path,
                    self.owner_uid if self.owner_uid is not None else -1,
                    self.group_gid if self.group_gid is not None else -1,
                )
            self._ino = st.st_ino
            sock.listen(128)
        except OSError as e:
            sock.close()
            raise ControlError(f"cannot listen on {self.path}: {e}") from e
        self._listener = sock
        self._loop.add_reader(sock.fileno(), self._on_accept)

    def _remove_stale(self) -> None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise ControlError(f"{self.path} exists and is not a socket; not touching it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        probe.settimeout(0.5)
        try:
            probe.connect(str(self.path))
        except OSError:
            self.path.unlink(missing_ok=True)  # nobody listens: a dead agent's socket
            return
        finally:
            probe.close()
        raise ControlError(f"another agent is listening on {self.path}")

    def _on_accept(self) -> None:
        assert self._listener is not None and self._loop is not None
        for _ in range(self.burst):
            try:
                conn, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # EMFILE etc.: try again at the next wake-up
            try:
                cred = peer_cred(conn)
            except OSError:
                conn.close()
                self.counters.peers_rejected += 1
                continue
            if not self._peer_allowed(conn, cred):
                self.counters.peers_rejected += 1
                conn.close()
                continue
            group = group_of(cred, self.proc_root)
            if (
                len(self._clients) >= self.max_clients
                or self._group_clients[group] >= self.max_clients_per_group
            ):
                self.counters.clients_refused += 1
                self.counters.clients_refused_by_uid[cred.uid] += 1
                conn.close()
                continue
            conn.setblocking(False)
            client = _Client(conn, cred, group)
            self._group_clients[group] += 1
            self._clients[conn.fileno()] = client
            self.counters.clients_accepted += 1
            self._loop.add_reader(conn.fileno(), self._on_readable, client)

    def _peer_allowed(self, conn: socket.socket, cred: PeerCred) -> bool:
        if self.any_uid or cred.uid in self.allowed_uids:
            return True
        if self.group_gid is None:
            return False
        return cred.gid == self.group_gid or self.group_gid in peer_groups(conn)

    def _drop_client(self, client: _Client) -> None:
        fd = client.sock.fileno()
        if fd >= 0 and self._clients.pop(fd, None) is not None:
            self._group_clients[client.group] -= 1
            if self._group_clients[client.group] <= 0:
                del self._group_clients[client.group]
            assert self._loop is not None
            self._loop.remove_reader(fd)
            self.counters.clients_closed += 1
        client.sock.close()

    def _on_readable(self, client: _Client) -> None:
        for _ in range(self.burst):
            try:
                data, _anc, flags, _addr = client.sock.recvmsg(MAX_MSG + 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._drop_client(client)
                return
            if not data and not flags & socket.MSG_TRUNC:
                self._drop_client(client)  # EOF (a zero-length message reads the same)
                return
            if flags & socket.MSG_TRUNC:
                self._count_malformed("oversize")
                continue
            self.feed(data, client.cred, client.group)

    def _count_malformed(self, reason: str) -> None:
        self.counters.malformed += 1
        self.counters.malformed_by_reason[reason] += 1

    def feed(self, data: bytes, cred: PeerCred, group: Group | None = None) -> None:
        """Decodes one message from ``cred`` and queues it; never raises. Over its process's or
        its group's rate limit (``group``: the uid's by default) the event is dropped and
        counted; a future ``t_ns`` becomes the receive time."""
        try:
            ev = decode_event(data)
        except EventDecodeError as e:
            self._count_malformed(e.reason)
            return
        now = self._clock()
        # the process's bucket first: a process over its own limit does not use up its uid's
        if not self._per_pid.allow(("pid", cred.uid, cred.pid), now) or not self._per_uid.allow(
            group if group is not None else (cred.uid, ""), now
        ):
            self.counters.rate_limited += 1
            self.counters.rate_limited_by_uid[cred.uid] += 1
            return
        if ev.t_ns > now:
            ev = dataclasses.replace(ev, t_ns=now)
            self.counters.clamped += 1
        try:
            self.queue.put_nowait(ReceivedEvent(ev, cred, now))
            self.counters.events += 1
        except asyncio.QueueFull:
            self.counters.queue_dropped += 1

    def close(self) -> None:
        """Stops listening, closes every client, removes the socket file (if still ours),
        and ends the queue."""
        if self._closed:
            return
        self._closed = True
        for client in list(self._clients.values()):
            self._drop_client(client)
        if self._listener is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None
            with contextlib.suppress(OSError):
                if os.lstat(self.path).st_ino == self._ino:
                    self.path.unlink()
        while True:
            try:
                self.queue.put_nowait(None)
                break
            except asyncio.QueueFull:
                self.queue.get_nowait()
                self.counters.queue_dropped += 1
