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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def privileges(status: Path = Path("/proc/self/status")) -> dict[str, Any]:
    """{uid, effective, bounding, no_new_privs, beyond_needed}; {} where unreadable."""
    try:
        fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        eff = int(fields["CapEff"].strip(), 16)
        bnd = int(fields["CapBnd"].strip(), 16)
        uid = int(fields["Uid"].split()[1])  # effective uid
        nnp = fields.get("NoNewPrivs", "0").strip() == "1"
    except (OSError, KeyError, ValueError, IndexError):
        return {}
    effective = cap_names(eff)
    return {
        "uid": uid,
        "effective": effective,
        "bounding": len(cap_names(bnd)),
        "no_new_privs": nnp,
        "beyond_needed": [c for c in effective if c not in NEEDED],
    }
