"""Run-time statistics of loaded BPF programs: how often each ran and for how long.

The kernel counts ``run_cnt`` and ``run_time_ns`` per program while statistics are enabled
(``kernel.bpf_stats_enabled`` = 1, or while a ``BPF_ENABLE_STATS`` fd is open: :class:`RunStats`,
which switches them off again when closed, even if the process dies). They are read with
``BPF_OBJ_GET_INFO_BY_FD`` (:func:`prog_stats`); :func:`parse_prog_info` is the pure part.
Counting costs two clock reads per program run, so it is off unless measuring.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from dataclasses import dataclass

from railhop.sources.base import SourceError

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_ENABLE_STATS = 32
BPF_STATS_RUN_TIME = 0
# struct bpf_prog_info (include/uapi/linux/bpf.h): offsets stable since Linux 5.1 (run_time_ns)
PROG_INFO_SIZE = 232
_ID = struct.Struct("<II")  # type, id at 0
_NAME = struct.Struct("<16s")  # at 64
_RUN = struct.Struct("<QQ")  # run_time_ns, run_cnt at 192
_ATTR_SIZE = 128


class BpfStatsError(SourceError):
    """The bpf() syscall refused (no privilege, old kernel, not a BPF program fd)."""


@dataclass(frozen=True, slots=True)
class ProgStats:
    name: str
    prog_id: int
    prog_type: int
    run_time_ns: int
    run_cnt: int

    @property
    def ns_per_run(self) -> float:
        return self.run_time_ns / self.run_cnt if self.run_cnt else 0.0

    def minus(self, before: ProgStats) -> ProgStats:
        """The runs between ``before`` and this snapshot of the same program."""
        if before.prog_id != self.prog_id:
            raise BpfStatsError(f"program {self.prog_id} is not {before.prog_id}")
        return ProgStats(
            self.name,
            self.prog_id,
            self.prog_type,
            self.run_time_ns - before.run_time_ns,
            self.run_cnt - before.run_cnt,
        )


def parse_prog_info(raw: bytes) -> ProgStats:
    """A ``struct bpf_prog_info`` as the kernel filled it (pure)."""
    if len(raw) < 208:
        raise BpfStatsError(f"bpf_prog_info of {len(raw)} bytes: need 208")
    ptype, pid = _ID.unpack_from(raw, 0)
    (name,) = _NAME.unpack_from(raw, 64)
    rt, cnt = _RUN.unpack_from(raw, 192)
    return ProgStats(name.split(b"\0", 1)[0].decode("ascii", "replace"), pid, ptype, rt, cnt)


def _bpf(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    nr = _SYS_BPF.get(platform.machine())
    if nr is None:
        raise BpfStatsError(f"bpf() syscall number unknown on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    ret = int(libc.syscall(nr, cmd, attr, len(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        raise BpfStatsError(f"bpf(cmd {cmd}): {os.strerror(err)}")
    return ret


def prog_stats(fd: int) -> ProgStats:
    """Run-time statistics of the BPF program behind ``fd`` (zeros while counting is off)."""
    info = ctypes.create_string_buffer(PROG_INFO_SIZE)
    attr = ctypes.create_string_buffer(_ATTR_SIZE)
    struct.pack_into("<IIQ", attr, 0, fd, PROG_INFO_SIZE, ctypes.addressof(info))
    _bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    return parse_prog_info(info.raw)


def stats_enabled(root: str = "/") -> bool:
    """Whether the sysctl kernel.bpf_stats_enabled is on (a RunStats fd does not show here)."""
    try:
        with open(os.path.join(root, "proc/sys/kernel/bpf_stats_enabled")) as f:
            return f.read().strip() == "1"
    except OSError:
        return False


class RunStats:
    """Run-time counting on while open (``BPF_ENABLE_STATS``); a context manager."""

    def __init__(self) -> None:
        self.fd: int | None = None

    def open(self) -> RunStats:
        if self.fd is None:
            attr = ctypes.create_string_buffer(_ATTR_SIZE)
            struct.pack_into("<I", attr, 0, BPF_STATS_RUN_TIME)
            self.fd = _bpf(BPF_ENABLE_STATS, attr)
        return self

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> RunStats:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
