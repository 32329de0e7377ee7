"""A small ctypes binding to the libnccl.so.2 that torch loaded (what torch does not expose).

Used by bench/gpu_ft.py and bench/gpu_cycle.py for non-blocking communicators
(`config.blocking = 0`), ncclCommGetAsyncError, ncclCommAbort, ncclCommRevoke (2.28.7+),
ncclCommShrink (2.27+), and the collectives and point-to-point calls on such communicators.

ncclConfig_t follows the 2.28 public header (src/nccl.h.in at v2.28.9-1): size_t size, unsigned
magic (0xcafebeef), unsigned version (NCCL_VERSION(2,28,9) = 22809), then the user fields in
order; every user field starts "undefined" (INT_MIN / NULL) so NCCL applies its defaults.
The layout differs in older releases: `Nccl.config()` refuses a library older than 2.28.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import _common

_common.setup_import_path()

from railhop_lab.harness import NCCL_RESULTS  # noqa: E402

NCCL_SUCCESS = 0
NCCL_SYSTEM_ERROR = 2
NCCL_INVALID_ARGUMENT = 4
NCCL_INVALID_USAGE = 5
NCCL_REMOTE_ERROR = 6
NCCL_IN_PROGRESS = 7
RESULT_NAMES = NCCL_RESULTS  # ncclResult_t names, one table (the lab's harness driver)
NCCL_FLOAT32 = 7
NCCL_SUM = 0
NCCL_MAX = 2
NCCL_SHRINK_DEFAULT = 0  # the parent has no work in flight (or it was revoked)
NCCL_SHRINK_ABORT = 1  # abort the parent's in-flight work first, then shrink
CONFIG_MAGIC = 0xCAFEBEEF
UNDEF_INT = -(2**31)  # INT_MIN
UNIQUE_ID_BYTES = 128


class NcclError(Exception):
    """The library could not be found or loaded, or it is too old for this binding."""


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


class Config(ctypes.Structure):
    """ncclConfig_t of NCCL 2.28 (ncclConfig_v22800)."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("blocking", ctypes.c_int),
        ("cgaClusterSize", ctypes.c_int),
        ("minCTAs", ctypes.c_int),
        ("maxCTAs", ctypes.c_int),
        ("netName", ctypes.c_char_p),
        ("splitShare", ctypes.c_int),
        ("trafficClass", ctypes.c_int),
        ("commName", ctypes.c_char_p),
        ("collnetEnable", ctypes.c_int),
        ("CTAPolicy", ctypes.c_int),
        ("shrinkShare", ctypes.c_int),
        ("nvlsCTAs", ctypes.c_int),
        ("nChannelsPerNetPeer", ctypes.c_int),
        ("nvlinkCentricSched", ctypes.c_int),
    ]


def nccl_version_code(major: int, minor: int, patch: int) -> int:
    """NCCL_VERSION(X,Y,Z) of nccl.h."""
    if major <= 2 and minor <= 8:
        return major * 1000 + minor * 100 + patch
    return major * 10000 + minor * 100 + patch


def default_config(version: int) -> Config:
    """NCCL_CONFIG_INITIALIZER for a library of ``version`` (>= 2.28)."""
    if version < nccl_version_code(2, 28, 0):
        raise NcclError(f"NCCL {version}: this ncclConfig_t layout needs NCCL >= 2.28")
    c = Config()
    c.size = ctypes.sizeof(Config)
    c.magic = CONFIG_MAGIC
    c.version = version
    for name, typ in Config._fields_[3:]:
        if typ is ctypes.c_int:
            setattr(c, name, UNDEF_INT)
        else:
            setattr(c, name, None)
    return c


def find_libnccl(maps: Path = Path("/proc/self/maps")) -> str:
    """The libnccl.so.2 loaded in this process (torch's), else the nvidia-nccl package's copy."""
    try:
        for line in maps.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 6 and os.path.basename(parts[5]).startswith("libnccl.so"):
                return parts[5]
    except OSError:
        pass
    try:
        import nvidia.nccl  # type: ignore[import-not-found]

        for d in nvidia.nccl.__path__:
            p = Path(d) / "lib" / "libnccl.so.2"
            if p.is_file():
                return str(p)
    except ImportError:
        pass
    raise NcclError("libnccl.so.2 not found (not loaded by torch, no nvidia-nccl package)")


def result_name(rc: int) -> str:
    return RESULT_NAMES.get(rc, f"ncclResult({rc})")


class Nccl:
    """Thin wrappers; every call returns the raw ncclResult_t (int), never raises on it."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or find_libnccl()
        lib = ctypes.CDLL(self.path)
        self.lib = lib
        vp = ctypes.c_void_p
        i = ctypes.c_int
        sig: dict[str, tuple[Any, list[Any]]] = {
            "ncclGetVersion": (i, [ctypes.POINTER(i)]),
            "ncclGetUniqueId": (i, [ctypes.POINTER(UniqueId)]),
            "ncclCommInitRankConfig": (
                i,
                [ctypes.POINTER(vp), i, UniqueId, i, ctypes.POINTER(Config)],
            ),
            "ncclCommGetAsyncError": (i, [vp, ctypes.POINTER(i)]),
            "ncclCommAbort": (i, [vp]),
            "ncclCommDestroy": (i, [vp]),
            "ncclGetErrorString": (ctypes.c_char_p, [i]),
            "ncclGetLastError": (ctypes.c_char_p, [vp]),
            "ncclAllReduce": (i, [vp, vp, ctypes.c_size_t, i, i, vp, vp]),
            "ncclAllGather": (i, [vp, vp, ctypes.c_size_t, i, vp, vp]),
            "ncclReduceScatter": (i, [vp, vp, ctypes.c_size_t, i, i, vp, vp]),
            "ncclSend": (i, [vp, ctypes.c_size_t, i, i, vp, vp]),
            "ncclRecv": (i, [vp, ctypes.c_size_t, i, i, vp, vp]),
            "ncclGroupStart": (i, []),
            "ncclGroupEnd": (i, []),
        }
        for name, (res, args) in sig.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        self.has_revoke = hasattr(lib, "ncclCommRevoke")
        if self.has_revoke:
            lib.ncclCommRevoke.restype, lib.ncclCommRevoke.argtypes = i, [vp, i]
        self.has_shrink = hasattr(lib, "ncclCommShrink")
        if self.has_shrink:
            lib.ncclCommShrink.restype = i
            lib.ncclCommShrink.argtypes = [
                vp,
                ctypes.POINTER(i),
                i,
                ctypes.POINTER(vp),
                ctypes.POINTER(Config),
                i,
            ]

    def version(self) -> int:
        v = ctypes.c_int(0)
        self.lib.ncclGetVersion(ctypes.byref(v))
        return v.value

    def config(self, *, blocking: int) -> Config:
        c = default_config(self.version())
        c.blocking = blocking
        return c

    def unique_id(self) -> bytes:
        uid = UniqueId()
        rc = self.lib.ncclGetUniqueId(ctypes.byref(uid))
        if rc != NCCL_SUCCESS:
            raise NcclError(f"ncclGetUniqueId: {result_name(rc)}")
        return bytes(ctypes.string_at(ctypes.addressof(uid), UNIQUE_ID_BYTES))

    def init_rank(self, nranks: int, uid: bytes, rank: int, cfg: Config) -> tuple[int, int]:
        """(rc, comm); with a non-blocking config rc may be ncclInProgress: poll async_error."""
        u = UniqueId()
        ctypes.memmove(ctypes.addressof(u), uid, UNIQUE_ID_BYTES)
        comm = ctypes.c_void_p(0)
        rc = self.lib.ncclCommInitRankConfig(ctypes.byref(comm), nranks, u, rank, ctypes.byref(cfg))
        return rc, int(comm.value or 0)

    def async_error(self, comm: int) -> int:
        st = ctypes.c_int(NCCL_IN_PROGRESS)
        rc = self.lib.ncclCommGetAsyncError(ctypes.c_void_p(comm), ctypes.byref(st))
        return int(st.value) if rc == NCCL_SUCCESS else int(rc)

    def all_reduce_f32(self, send: int, recv: int, count: int, comm: int, stream: int) -> int:
        return int(
            self.lib.ncclAllReduce(
                ctypes.c_void_p(send),
                ctypes.c_void_p(recv),
                count,
                NCCL_FLOAT32,
                NCCL_SUM,
                ctypes.c_void_p(comm),
                ctypes.c_void_p(stream),
            )
        )

    def all_reduce(
        self, send: int, recv: int, count: int, comm: int, stream: int, op: int = NCCL_SUM
    ) -> int:
        """float32 all-reduce (``op``: NCCL_SUM, NCCL_MAX)."""
        vp = ctypes.c_void_p
        return int(
            self.lib.ncclAllReduce(
                vp(send), vp(recv), count, NCCL_FLOAT32, op, vp(comm), vp(stream)
            )
        )

    def all_gather_f32(self, send: int, recv: int, sendcount: int, comm: int, stream: int) -> int:
        vp = ctypes.c_void_p
        return int(
            self.lib.ncclAllGather(
                vp(send), vp(recv), sendcount, NCCL_FLOAT32, vp(comm), vp(stream)
            )
        )

    def reduce_scatter_f32(
        self, send: int, recv: int, recvcount: int, comm: int, stream: int
    ) -> int:
        vp = ctypes.c_void_p
        return int(
            self.lib.ncclReduceScatter(
                vp(send), vp(recv), recvcount, NCCL_FLOAT32, NCCL_SUM, vp(comm), vp(stream)
            )
        )

    def exchange_f32(
        self,
        sends: list[tuple[int, int]],
        recvs: list[tuple[int, int]],
        count: int,
        comm: int,
        stream: int,
    ) -> int:
        """One group of ncclSend (ptr, peer) and ncclRecv (ptr, peer) of ``count`` floats each;
        the first non-success result (ncclInProgress from the group end included)."""
        vp = ctypes.c_void_p
        rc = int(self.lib.ncclGroupStart())
        if rc != NCCL_SUCCESS:
            return rc
        first = NCCL_SUCCESS
        for ptr, peer in sends:
            r = int(self.lib.ncclSend(vp(ptr), count, NCCL_FLOAT32, peer, vp(comm), vp(stream)))
            first = first or r
        for ptr, peer in recvs:
            r = int(self.lib.ncclRecv(vp(ptr), count, NCCL_FLOAT32, peer, vp(comm), vp(stream)))
            first = first or r
        end = int(self.lib.ncclGroupEnd())  # always closes the group
        return first if first not in (NCCL_SUCCESS, NCCL_IN_PROGRESS) else (end or first)

    def abort(self, comm: int) -> int:
        return int(self.lib.ncclCommAbort(ctypes.c_void_p(comm)))

    def destroy(self, comm: int) -> int:
        return int(self.lib.ncclCommDestroy(ctypes.c_void_p(comm)))

    def revoke(self, comm: int) -> int:
        if not self.has_revoke:
            raise NcclError("ncclCommRevoke is not in this libnccl (needs 2.28.7+)")
        return int(self.lib.ncclCommRevoke(ctypes.c_void_p(comm), 0))

    def shrink(
        self, comm: int, exclude: list[int], cfg: Config | None, flags: int = NCCL_SHRINK_DEFAULT
    ) -> tuple[int, ctypes.c_void_p]:
        """(rc, holder). NCCL stores the new communicator into ``holder`` when the shrink
        completes (with a non-blocking config: later, from its own thread), so the caller keeps
        ``holder`` alive until ``holder.value`` is set and ncclCommGetAsyncError(parent) has
        left ncclInProgress."""
        if not self.has_shrink:
            raise NcclError("ncclCommShrink is not in this libnccl (needs 2.27.3+)")
        arr = (ctypes.c_int * max(1, len(exclude)))(*exclude)
        holder = ctypes.c_void_p(0)
        rc = self.lib.ncclCommShrink(
            ctypes.c_void_p(comm),
            arr if exclude else None,
            len(exclude),
            ctypes.byref(holder),
            ctypes.byref(cfg) if cfg is not None else None,
            flags,
        )
        return int(rc), holder

    def last_error(self, comm: int) -> str:
        s = self.lib.ncclGetLastError(ctypes.c_void_p(comm))
        return s.decode(errors="replace") if s else ""
