"""ControlPlane: the daemon's one handle on the control plane (health table + event socket).

    async with ControlPlane(run_dir) as cp:
        cp.publish(nics, plans)          # whenever health or plans change
        async for rx in cp.events():     # lane events from the plugins
            ...

``start()`` prepares ``run_dir`` (0700), listens on ``agent.sock`` (0600) and starts the
heartbeat; the table appears at the first ``publish()``. ``close()`` removes the socket, marks the
table "agent gone" (plugins work alone at once instead of waiting for the heartbeat to go stale)
and ends ``events()``; it is bounded by a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from railhop.control.errors import ControlError
from railhop.control.layout import (
    RUN_DIR_DEFAULT,
    RUN_DIR_ENV,
    SOCKET_FILE,
    TABLE_FILE,
    NicHealth,
    Plans,
)
from railhop.control.server import EventServer, PeerCred, ReceivedEvent
from railhop.control.table import TableWriter


def default_run_dir() -> Path:
    return Path(os.environ.get(RUN_DIR_ENV) or RUN_DIR_DEFAULT)


@dataclass(frozen=True)
class ControlCounters:
    """A snapshot of the control plane's counters (for metrics and ``railhop status``)."""

    publishes: int
    heartbeats: int
    truncated_plans: int
    clients: int
    clients_accepted: int
    clients_closed: int
    peers_rejected: int
    clients_refused: int
    events: int
    malformed: int
    queue_dropped: int
    malformed_by_reason: dict[str, int] = field(default_factory=dict)


def prepare_run_dir(run_dir: Path, owner_uid: int | None) -> None:
    """Creates ``run_dir`` 0700 (owned by ``owner_uid`` when given). Refuses a directory
    owned by someone else or a symlink: its owner could swap the socket or the table."""
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(run_dir)
    if not stat.S_ISDIR(st.st_mode):
        raise ControlError(f"run directory {run_dir} is not a directory (symlink?)")
    me = os.geteuid()
    if st.st_uid not in {me, owner_uid}:
        raise ControlError(
            f"run directory {run_dir} is owned by uid {st.st_uid}, not by this agent (uid {me})"
        )
    os.chmod(run_dir, 0o700)
    if owner_uid is not None and st.st_uid != owner_uid:
        os.chown(run_dir, owner_uid, -1)


class ControlPlane:
    def __init__(
        self,
        run_dir: Path | str | None = None,
        *,
        heartbeat_ms: int = 250,
        owner_uid: int | None = None,
        allowed_uids: Iterable[int] = (),
        max_clients: int = 256,
        queue_size: int = 4096,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        """``owner_uid``: the uid the job's processes run as when the agent runs as root; the
        run directory and the socket are given to it. Peers of uid root, the agent's own uid,
        ``owner_uid`` and ``allowed_uids`` may send events; others are rejected."""
        self.run_dir = Path(run_dir) if run_dir is not None else default_run_dir()
        self.owner_uid = owner_uid
        self.heartbeat_ms = heartbeat_ms
        uids = {0, os.geteuid(), *allowed_uids}
        if owner_uid is not None:
            uids.add(owner_uid)
        self.table = TableWriter(self.run_dir / TABLE_FILE, heartbeat_ms=heartbeat_ms, clock=clock)
        self.server = EventServer(
            self.run_dir / SOCKET_FILE,
            allowed_uids=uids,
            owner_uid=owner_uid,
            max_clients=max_clients,
            queue_size=queue_size,
        )
        self._heartbeats = 0
        self._hb_task: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False

    @property
    def table_path(self) -> Path:
        return self.table.path

    @property
    def socket_path(self) -> Path:
        return self.server.path

    async def start(self) -> None:
        if self._started:
            return
        prepare_run_dir(self.run_dir, self.owner_uid)
        self.server.start()
        self._started = True
        if self.heartbeat_ms:
            self._hb_task = asyncio.create_task(self._heartbeat_loop(), name="railhop-heartbeat")

    async def __aenter__(self) -> ControlPlane:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def publish(self, nics: Sequence[NicHealth], plans: Plans) -> int:
        """Publishes health and plans to every plugin; returns the publish count.
        TableError on bad input (the table keeps its previous content)."""
        if self._closed:
            raise ControlError("control plane is closed")
        return self.table.publish(nics, plans)

    def heartbeat(self) -> None:
        self.table.heartbeat()
        self._heartbeats += 1

    async def _heartbeat_loop(self) -> None:
        period = self.heartbeat_ms / 1000
        while True:
            self.heartbeat()
            await asyncio.sleep(period)

    async def events(self) -> AsyncIterator[ReceivedEvent]:
        """Lane events as they arrive; ends when the control plane closes."""
        while True:
            item = await self.server.queue.get()
            if item is None:
                self.server.queue.put_nowait(None)  # let other iterators end too
                return
            yield item

    @property
    def clients(self) -> list[PeerCred]:
        return self.server.clients

    @property
    def counters(self) -> ControlCounters:
        c = self.server.counters
        return ControlCounters(
            publishes=self.table.publish_count,
            heartbeats=self._heartbeats,
            truncated_plans=self.table.truncated_plans,
            clients=len(self.server.clients),
            clients_accepted=c.clients_accepted,
            clients_closed=c.clients_closed,
            peers_rejected=c.peers_rejected,
            clients_refused=c.clients_refused,
            events=c.events,
            malformed=c.malformed,
            queue_dropped=c.queue_dropped,
            malformed_by_reason=dict(c.malformed_by_reason),
        )

    async def close(self, timeout: float = 2.0) -> None:
        """Removes the socket, marks the table 'agent gone', ends events(). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._hb_task is not None:
            self._hb_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._hb_task, timeout)
        self.server.close()
        try:
            self.table.mark_gone()
        finally:
            self.table.close()
