"""The agent's privileges as the kernel sees them (``/proc/self/status``), for ``railhop
status``: its uid, effective capabilities, whether NoNewPrivs is set, and which effective
capabilities are beyond the set the agent needs (docs/operations.md, "Least privilege").

What the agent needs, and why:

- ``CAP_BPF``, ``CAP_PERFMON``: load its eBPF programs, attach kprobes/tracepoints/uprobes
  (Linux >= 5.8; before 5.8 only ``CAP_SYS_ADMIN`` allows either);
- ``CAP_NET_ADMIN``: the carrier probe's qdisc proxy (tc) and netlink link events;
- ``CAP_SYS_RESOURCE``: raise RLIMIT_MEMLOCK for BPF maps (Linux < 5.11 only; later kernels
  charge maps to the cgroup);
- ``CAP_CHOWN``: give the socket to ``--owner-uid`` / ``--socket-group``;
- ``CAP_SYS_PTRACE``: only with ``--usdt-lib`` (reads ``/proc/<pid>/ns/net`` and the maps of
  job processes of other uids).

Once every source has started (its probes attached), the agent's loop thread keeps only
``CAP_SYS_PTRACE`` with ``--usdt-lib`` and nothing otherwise (:func:`drop_capabilities`): what
it still does (read ring buffers and maps through descriptors it holds, update the TCP probe's
port map, write its run directory as uid 0, read job processes' ``/proc`` entries) needs no
capability beyond that.

Capabilities are per thread, and a thread inherits its creator's at creation: dropping them in
the loop thread left the metrics endpoint's threads (started before) with every capability
(issue 29, 8). So threads that never need one are started from :func:`unprivileged` (a
short-lived thread that drops everything first: what it starts inherits nothing), the loop's
worker threads are replaced by ones that drop at their start, and :func:`privileges` reports
every thread of the process (``/proc/<pid>/task``), not only the caller.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# bit numbers from linux/capability.h
CAP_NAMES = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
]

NEEDED = frozenset(
    {"CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN", "CAP_SYS_RESOURCE", "CAP_CHOWN", "CAP_SYS_PTRACE"}
)


def cap_names(mask: int) -> list[str]:
    names = []
    for bit in range(mask.bit_length()):
        if mask >> bit & 1:
            names.append(f"CAP_{CAP_NAMES[bit]}" if bit < len(CAP_NAMES) else f"cap_{bit}")
    return names


_CAP_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def cap_bits(names: Iterable[str]) -> int:
    mask = 0
    for n in names:
        short = n.removeprefix("CAP_")
        if short not in CAP_NAMES:
            raise ValueError(f"unknown capability {n!r}")
        mask |= 1 << CAP_NAMES.index(short)
    return mask


def drop_capabilities(keep: Iterable[str]) -> list[str]:
    """Keeps only ``keep`` (of what it has) in the calling thread's effective and permitted
    sets, clears the inheritable set (capset(2), irreversible) and returns the names dropped.
    Capabilities are per thread: threads started before this call keep theirs, threads started
    after inherit the reduced sets. OSError if the kernel refuses."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    hdr = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(hdr), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capget: {os.strerror(err)}")
    permitted = data[0].permitted | data[1].permitted << 32
    want = permitted & cap_bits(keep)
    for i in range(2):
        data[i].effective = data[i].permitted = (want >> (32 * i)) & 0xFFFFFFFF
        data[i].inheritable = 0
    if libc.capset(ctypes.byref(hdr), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")
    return cap_names(permitted & ~want)


def drop_all_in_this_thread() -> None:
    """Drops every capability of the calling thread; quietly does nothing where it has none or
    the kernel refuses (the process-wide report still shows such a thread)."""
    with contextlib.suppress(OSError):
        drop_capabilities(())


def unprivileged(fn: Callable[[], T], timeout_s: float = 30.0) -> T:
    """Runs ``fn`` in a new thread that first drops every capability, and returns its result
    (or raises its exception): the threads ``fn`` starts inherit no capability."""
    out: list[Any] = []

    def body() -> None:
        drop_all_in_this_thread()
        try:
            out.append((True, fn()))
        except BaseException as e:  # handed to the caller
            out.append((False, e))

    t = threading.Thread(target=body, name="railhop-unprivileged", daemon=True)
    t.start()
    t.join(timeout_s)
    if not out:
        raise TimeoutError(f"unprivileged start did not finish within {timeout_s:g} s")
    ok, value = out[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _task_status(status: Path) -> dict[str, str] | None:
    try:
        text = status.read_text()
    except OSError:
        return None
    return dict(
        (k, v.strip()) for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)
    )


def privileges(task_root: Path = Path("/proc/self/task")) -> dict[str, Any]:
    """{uid, effective, permitted, bounding, no_new_privs, beyond_needed, threads,
    threads_with_capabilities} of the whole process: the capability sets are the union over
    every thread of ``task_root`` (``/proc/<pid>/task``), and each thread that holds any
    effective or permitted capability is listed (tid, name, its effective set); {} where
    unreadable."""
    eff = prm = bnd = 0
    uid = -1
    nnp = False
    holders: list[dict[str, Any]] = []
    threads = 0
    try:
        tids = sorted(os.listdir(task_root), key=lambda x: int(x) if x.isdigit() else 0)
    except OSError:
        return {}
    for tid in tids:
        fields = _task_status(task_root / tid / "status")
        if fields is None:
            continue  # the thread exited meanwhile
        try:
            t_eff = int(fields["CapEff"], 16)
            t_prm = int(fields["CapPrm"], 16)
            bnd |= int(fields["CapBnd"], 16)
            uid = int(fields["Uid"].split()[1])  # effective uid
        except (KeyError, ValueError, IndexError):
            continue
        threads += 1
        nnp = nnp or fields.get("NoNewPrivs", "0") == "1"
        eff |= t_eff
        prm |= t_prm
        if t_eff or t_prm:
            holders.append(
                {"tid": int(tid), "name": fields.get("Name", ""), "effective": cap_names(t_eff)}
            )
    if not threads:
        return {}
    effective = cap_names(eff)
    return {
        "uid": uid,
        "effective": effective,
        "permitted": cap_names(prm),
        "bounding": len(cap_names(bnd)),
        "no_new_privs": nnp,
        "beyond_needed": [c for c in effective if c not in NEEDED],
        "threads": threads,
        "threads_with_capabilities": holders,
    }
