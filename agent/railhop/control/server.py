"""The agent's lane-event socket: AF_UNIX SOCK_SEQPACKET, one event per message.

Security and robustness:
- the socket file is 0600 inside a 0700 run directory: only its owner (and root) can connect;
- at accept the peer's credentials (SO_PEERCRED, kernel-verified) must name an allowed uid
  (the agent's, root's, or the configured job owner); other peers are closed and counted;
- each message is read with a bounded buffer (MAX_MSG + 1); longer messages are truncated by
  the kernel, flagged MSG_TRUNC and dropped; malformed ones are dropped and counted by reason;
- at most ``max_clients`` connections, each read at most ``burst`` messages per wake-up, and a
  bounded queue towards the daemon (overflow counted): a flood cannot starve the loop or grow
  memory.

asyncio has no SOCK_SEQPACKET server, so the sockets are driven with ``loop.add_reader``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import struct
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from railhop.control.errors import ControlError, EventDecodeError
from railhop.control.events import MAX_MSG, LaneEvent, decode_event

_UCRED = struct.Struct("3i")


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
    clients_refused: int = 0  # over max_clients
    events: int = 0  # decoded and queued
    malformed: int = 0  # all drops for bad content, by reason below
    malformed_by_reason: Counter[str] = field(default_factory=Counter)
    queue_dropped: int = 0  # daemon too slow, queue full


class _Client:
    __slots__ = ("cred", "sock")

    def __init__(self, sock: socket.socket, cred: PeerCred) -> None:
        self.sock = sock
        self.cred = cred


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
        max_clients: int = 256,
        queue_size: int = 4096,
        burst: int = 64,
    ) -> None:
        self.path = Path(path)
        self.allowed_uids = frozenset(allowed_uids)
        self.owner_uid = owner_uid
        self.max_clients = max_clients
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

    def start(self) -> None:
        """Binds and listens; must run inside the event loop. ControlError if another agent
        already listens on the path."""
        self._loop = asyncio.get_running_loop()
        self._remove_stale()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.setblocking(False)
            sock.bind(str(self.path))
            os.chmod(self.path, 0o600)
            if self.owner_uid is not None:
                os.chown(self.path, self.owner_uid, -1)
            self._ino = os.lstat(self.path).st_ino
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
            if cred.uid not in self.allowed_uids:
                self.counters.peers_rejected += 1
                conn.close()
                continue
            if len(self._clients) >= self.max_clients:
                self.counters.clients_refused += 1
                conn.close()
                continue
            conn.setblocking(False)
            client = _Client(conn, cred)
            self._clients[conn.fileno()] = client
            self.counters.clients_accepted += 1
            self._loop.add_reader(conn.fileno(), self._on_readable, client)

    def _drop_client(self, client: _Client) -> None:
        fd = client.sock.fileno()
        if fd >= 0 and self._clients.pop(fd, None) is not None:
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
            self.feed(data, client.cred)

    def _count_malformed(self, reason: str) -> None:
        self.counters.malformed += 1
        self.counters.malformed_by_reason[reason] += 1

    def feed(self, data: bytes, cred: PeerCred) -> None:
        """Decodes one message from ``cred`` and queues it; never raises."""
        try:
            ev = decode_event(data)
        except EventDecodeError as e:
            self._count_malformed(e.reason)
            return
        try:
            self.queue.put_nowait(ReceivedEvent(ev, cred, time.monotonic_ns()))
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
