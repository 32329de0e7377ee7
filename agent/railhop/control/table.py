"""The agent's side of the health table: the seqlock writer, and a reader for tools and tests.

The writer creates ``health.tbl`` at its first publish (a temp file renamed into place, so a
reader never maps a half-initialised file) and then updates it in place with ``pwrite(2)``:

1. store ``seq + 1`` (odd: "writing"),
2. write the body, NIC and plan arrays,
3. store ``seq + 2`` (even: "stable").

No shared mapping on the writer's side either: root (any job that mounts the run directory
read-write as root) can ``truncate -s 0 health.tbl``, and a store through a mapping of a
truncated file raises SIGBUS, which killed the agent silently (issue 29, 7). A write to a
truncated file cannot fault; the writer checks the file's size at every heartbeat and
publish, and a table found short is re-extended and rewritten whole (header and the last
publish; counted in ``restored``). Readers in between see a short or zeroed file and refuse
it, as they refuse a missing table.

A reader accepts a copy only when it read the same even ``seq`` before and after copying *and*
the CRC over the copy matches. On x86-64 (TSO) stores become visible in program order, so the
seqlock alone already excludes torn copies; on weakly ordered CPUs CPython cannot emit a release
fence, and the CRC is what rejects a copy that mixes two publishes. Either way a torn record is
never acted upon. ``heartbeat_ns`` lives outside the seqlock and is one aligned 8-byte store.
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from railhop.control.errors import TableError
from railhop.control.layout import (
    BODY_OFFSET,
    F_AGENT_GONE,
    HEARTBEAT_OFFSET,
    MAGIC,
    MAX_BACKUPS,
    NICS_OFFSET,
    PLANS_OFFSET,
    SEQ_OFFSET,
    TABLE_SIZE,
    Backup,
    NicHealth,
    NicState,
    NodeSettings,
    Payload,
    Plans,
    TableSnapshot,
    check_header,
    decode_table,
    encode_header,
    encode_payload,
)
from railhop.control.rundir import create_temp, install

_U64 = struct.Struct("<Q")


def proc_identity(pid: int, proc_root: Path = Path("/proc")) -> tuple[int, int]:
    """(start time in clock ticks, pid-namespace inode) of ``pid``; 0 for what cannot be read."""
    ticks = 0
    try:
        stat = (proc_root / str(pid) / "stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22: starttime
    except (OSError, ValueError, IndexError):
        pass
    try:
        pidns = os.stat(proc_root / str(pid) / "ns" / "pid").st_ino
    except OSError:
        pidns = 0
    return ticks, pidns


def previous_generation(path: Path) -> int:
    """Generation of the table a previous agent left at ``path`` (0 when none is readable)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            image = os.pread(fd, TABLE_SIZE, 0)
        finally:
            os.close(fd)
        return int(check_header(image)[11])
    except (OSError, TableError):
        return 0


class TableWriter:
    """Owns one ``health.tbl``. Not thread-safe: one writer (the agent's loop) only."""

    def __init__(
        self,
        path: Path,
        *,
        heartbeat_ms: int = 250,
        clock: Callable[[], int] = time.monotonic_ns,
        proc_root: Path = Path("/proc"),
        dir_fd: int | None = None,
        settings: NodeSettings | None = None,
    ) -> None:
        """``dir_fd``: a descriptor of the table's directory (the run directory) to create the
        file through; None: the directory is opened (O_NOFOLLOW) at creation."""
        if not 0 <= heartbeat_ms <= 0xFFFFFFFF:
            raise TableError(f"heartbeat_ms {heartbeat_ms} out of range")
        self.path = Path(path)
        self.heartbeat_ms = heartbeat_ms
        self.settings = settings or NodeSettings()  # published with every write
        self.settings.check()
        self._clock = clock
        self._proc_root = proc_root
        self._dir_fd = dir_fd
        self._fd = -1
        self._header = b""
        self._payload: Payload | None = None
        self._seq = 0
        self.restored = 0  # times the table was found truncated and rewritten
        self.write_errors = 0  # writes that failed (ENOSPC...): retried at the next heartbeat
        self.generation = 0
        self.publish_count = 0
        self.truncated_plans = 0  # plans cut to MAX_BACKUPS entries
        self._flags = 0
        self._state: dict[str, NicState] = {}
        self._changes: dict[str, int] = {}
        self._plan: dict[str, tuple[Backup, ...]] = {}
        self._plan_version: dict[str, int] = {}
        self._last: tuple[tuple[NicHealth, ...], dict[str, tuple[Backup, ...]]] = ((), {})

    @property
    def created(self) -> bool:
        return self._fd >= 0

    def publish(self, nics: Sequence[NicHealth], plans: Plans) -> int:
        """Publishes NIC health and plans; returns the publish count. Bad input: TableError,
        and the table is left as it was."""
        cut: dict[str, tuple[Backup, ...]] = {}
        for name, backups in plans.items():
            if len(backups) > MAX_BACKUPS:
                self.truncated_plans += 1
            if backups:
                cut[name] = tuple(backups[:MAX_BACKUPS])
        count = self.publish_count + 1
        changes = []
        versions = []
        for nic in nics:
            prev = self._state.get(nic.ifname)
            changes.append(
                self._changes.get(nic.ifname, 0) + (prev is not None and prev != nic.state)
            )
            plan = cut.get(nic.ifname, ())
            same = nic.ifname in self._plan_version and self._plan.get(nic.ifname, ()) == plan
            versions.append(self._plan_version[nic.ifname] if same else count)
        payload = encode_payload(
            nics,
            cut,
            changes=changes,
            plan_versions=versions,
            publish_count=count,
            publish_ns=self._clock(),
            flags=self._flags,
            heartbeat_ms=self.heartbeat_ms,
            settings=self.settings,
        )
        if self._fd < 0:
            self._create()
        self._write(payload)
        self.publish_count = count
        for nic, chg, ver in zip(nics, changes, versions, strict=True):
            self._state[nic.ifname] = nic.state
            self._changes[nic.ifname] = chg
            self._plan[nic.ifname] = cut.get(nic.ifname, ())
            self._plan_version[nic.ifname] = ver
        self._last = (tuple(nics), cut)
        return count

    def heartbeat(self) -> None:
        """One aligned 8-byte write of CLOCK_MONOTONIC; readers go stale without it. Restores
        a truncated table first. Never raises: a failed write is counted and retried."""
        if self._fd < 0:
            return
        try:
            self._restore_if_short()
            os.pwrite(self._fd, _U64.pack(self._clock()), HEARTBEAT_OFFSET)
        except OSError:
            self.write_errors += 1

    def mark_gone(self) -> None:
        """Clean shutdown: re-publish the last content with the AGENT_GONE flag set."""
        if self._fd < 0:
            return
        self._flags |= F_AGENT_GONE
        nics, plans = self._last
        payload = encode_payload(
            nics,
            plans,
            changes=[self._changes.get(n.ifname, 0) for n in nics],
            plan_versions=[self._plan_version.get(n.ifname, 0) for n in nics],
            publish_count=self.publish_count,
            publish_ns=self._clock(),
            flags=self._flags,
            heartbeat_ms=self.heartbeat_ms,
            settings=self.settings,
        )
        self._write(payload)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _create(self) -> None:
        pid = os.getpid()
        ticks, pidns = proc_identity(pid, self._proc_root)
        self.generation = previous_generation(self.path) + 1
        dfd = self._dir_fd
        if dfd is None:
            dfd = os.open(
                self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            )
        try:
            # a new file of a random name (O_EXCL | O_NOFOLLOW), renamed into place: never a
            # file or symlink someone else put there
            fd, tmp = create_temp(dfd, self.path.name, 0o644)
            try:
                os.ftruncate(fd, TABLE_SIZE)
                header = encode_header(
                    agent_pid=pid,
                    agent_start_ticks=ticks,
                    agent_pidns=pidns,
                    generation=self.generation,
                    heartbeat_ns=self._clock(),
                )
                _pwrite_all(fd, header, 0)
                install(dfd, tmp, self.path.name)
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
                raise
        finally:
            if dfd != self._dir_fd:
                os.close(dfd)
        self._fd = fd
        self._header = header

    def _restore_if_short(self) -> None:
        """A table someone truncated (or cut short) is extended back and rewritten whole."""
        if os.fstat(self._fd).st_size >= TABLE_SIZE:
            return
        self.restored += 1
        os.ftruncate(self._fd, TABLE_SIZE)
        header = bytearray(self._header)
        _U64.pack_into(header, HEARTBEAT_OFFSET, self._clock())
        _pwrite_all(self._fd, bytes(header), 0)
        if self._payload is not None:
            self._write_payload(self._payload)

    def _write(self, payload: Payload) -> None:
        """Publishes ``payload``; a failed write is counted (the next heartbeat restores a
        short table, the next publish rewrites the payload), never raised into the loop."""
        try:
            self._restore_if_short()
            self._write_payload(payload)
        except OSError:
            self.write_errors += 1
        self._payload = payload

    def _write_payload(self, payload: Payload) -> None:
        if (len(payload.body), len(payload.nics), len(payload.plans)) != (
            NICS_OFFSET - BODY_OFFSET,
            PLANS_OFFSET - NICS_OFFSET,
            TABLE_SIZE - PLANS_OFFSET,
        ):
            raise TableError("payload does not match the table layout")
        seq = self._seq & ~1
        os.pwrite(self._fd, _U64.pack(seq + 1), SEQ_OFFSET)
        self._seq = seq + 1
        try:
            _pwrite_all(self._fd, payload.body + payload.nics + payload.plans, BODY_OFFSET)
        finally:
            # even if interrupted half-way: an even seq over a torn payload fails the CRC
            os.pwrite(self._fd, _U64.pack(seq + 2), SEQ_OFFSET)
            self._seq = seq + 2


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """Writes every byte of ``data`` at ``offset`` (a short write is continued)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(0, f"pwrite wrote {n} bytes")
        view = view[n:]
        offset += n


def read_table(path: Path, *, tries: int = 64) -> TableSnapshot:
    """A consistent copy of the table at ``path`` (seqlock + CRC); TableError if there is no
    readable table, it is corrupt or truncated, or the writer kept it busy through every try.
    Reads with pread, never a shared mapping: a table truncated under a mapping raises SIGBUS."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise TableError(f"cannot read the health table {path}: {e.strerror}") from e
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TableError(f"{path}: not a regular file")
        last: TableError | None = None
        for _ in range(tries):
            image = os.pread(fd, TABLE_SIZE, 0)
            if len(image) < TABLE_SIZE:
                raise TableError(
                    f"{path}: {len(image)} bytes, want at least {TABLE_SIZE} (truncated?)"
                )
            if _U64.unpack_from(image, 0)[0] & 0xFFFFFFFF != MAGIC:
                raise TableError(f"{path}: bad magic, not a railhop table")
            s1 = _U64.unpack_from(image, SEQ_OFFSET)[0]
            if s1 & 1 or _U64.unpack(os.pread(fd, 8, SEQ_OFFSET))[0] != s1:
                continue
            try:
                return decode_table(image)
            except TableError as e:
                last = e
        raise TableError(f"{path}: no consistent copy in {tries} tries ({last})")
    except OSError as e:
        raise TableError(f"cannot read the health table {path}: {e.strerror}") from e
    finally:
        os.close(fd)
