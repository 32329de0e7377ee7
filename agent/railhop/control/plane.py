"""ControlPlane: the daemon's one handle on the control plane (health table + event socket).

    async with ControlPlane(run_dir) as cp:
        cp.publish(nics, plans)          # whenever health or plans change
        async for rx in cp.events():     # lane events from the plugins
            ...

``start()`` prepares ``run_dir`` (the agent's, 0755, see :mod:`railhop.control.rundir`),
listens on ``agent.sock`` (0600 for the agent's or the job owner's uid, 0660 for a configured
group, 0666 for any uid) and starts the heartbeat; the table appears at the first
``publish()``. Files the agent writes there go through :meth:`ControlPlane.write_file`.
``close()`` removes the socket, marks the table "agent gone" (plugins work alone at once
instead of waiting for the heartbeat to go stale) and ends ``events()``; it is bounded by a
deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
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
    NodeSettings,
    Plans,
)
from railhop.control.rundir import open_run_dir, write_file
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
    rate_limited: int = 0
    rate_limited_by_uid: dict[int, int] = field(default_factory=dict)
    clamped: int = 0
    clients_refused_by_uid: dict[int, int] = field(default_factory=dict)
    table_restored: int = 0  # health.tbl found truncated and rewritten
    table_write_errors: int = 0
    file_write_errors: int = 0  # status.json and other run-directory files not written


class ControlPlane:
    def __init__(
        self,
        run_dir: Path | str | None = None,
        *,
        heartbeat_ms: int = 250,
        owner_uid: int | None = None,
        allowed_uids: Iterable[int] = (),
        group_gid: int | None = None,
        any_uid: bool = False,
        max_clients: int = 256,
        max_clients_per_group: int = 32,
        queue_size: int = 4096,
        rate_per_process: tuple[float, float] = (200.0, 1000.0),
        rate_per_uid: tuple[float, float] = (1000.0, 5000.0),
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        """Who may send events: root, the agent's own uid, ``owner_uid`` (the socket is given
        to it), ``allowed_uids``, members of ``group_gid`` (the socket is 0660 of that group),
        or, with ``any_uid``, everyone (0666). Events are attributed to the sender's uid and pid
        and rate-limited per process and per uid (events per second, burst; root's processes
        per cgroup); one uid holds at most ``max_clients_per_group`` of the ``max_clients``."""
        self.run_dir = Path(run_dir) if run_dir is not None else default_run_dir()
        self.owner_uid = owner_uid
        self.heartbeat_ms = heartbeat_ms
        uids = {0, os.geteuid(), *allowed_uids}
        if owner_uid is not None:
            uids.add(owner_uid)
        self._dir_fd: int | None = None
        self._clock = clock
        self.file_write_errors = 0
        self.settings = NodeSettings()
        self.table = TableWriter(self.run_dir / TABLE_FILE, heartbeat_ms=heartbeat_ms, clock=clock)
        self.server = EventServer(
            self.run_dir / SOCKET_FILE,
            allowed_uids=uids,
            owner_uid=owner_uid,
            group_gid=group_gid,
            any_uid=any_uid,
            max_clients=max_clients,
            max_clients_per_group=max_clients_per_group,
            queue_size=queue_size,
            rate_per_process=rate_per_process,
            rate_per_uid=rate_per_uid,
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
        self._dir_fd = open_run_dir(self.run_dir, owner_uid=self.owner_uid)
        self.table = TableWriter(
            self.run_dir / TABLE_FILE,
            heartbeat_ms=self.heartbeat_ms,
            clock=self._clock,
            dir_fd=self._dir_fd,
            settings=self.settings,
        )
        try:
            self.server.start()
        except BaseException:
            os.close(self._dir_fd)
            self._dir_fd = None
            raise
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

    def publish(
        self, nics: Sequence[NicHealth], plans: Plans, settings: NodeSettings | None = None
    ) -> int:
        """Publishes health, plans and (when given) the policy's settings to every plugin;
        returns the publish count. TableError on bad input (the table keeps its previous
        content)."""
        if self._closed:
            raise ControlError("control plane is closed")
        if settings is not None:
            settings.check()
            self.settings = settings
            self.table.settings = settings
        return self.table.publish(nics, plans)

    def write_file(self, name: str, data: bytes) -> None:
        """Writes ``data`` as ``name`` in the run directory (O_EXCL|O_NOFOLLOW temp file through
        the directory's descriptor, every byte, renamed into place); OSError on failure."""
        try:
            if self._dir_fd is None:
                raise OSError(9, "control plane not started")
            write_file(self._dir_fd, name, data)
        except OSError:
            self.file_write_errors += 1
            raise

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
            rate_limited=c.rate_limited,
            rate_limited_by_uid=dict(c.rate_limited_by_uid),
            clamped=c.clamped,
            clients_refused_by_uid=dict(c.clients_refused_by_uid),
            table_restored=self.table.restored,
            table_write_errors=self.table.write_errors,
            file_write_errors=self.file_write_errors,
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
            if self._dir_fd is not None:
                os.close(self._dir_fd)
                self._dir_fd = None
