"""Facts about the running kernel that decide which eBPF hooks can load: privilege, kernel headers
for bcc, tracefs (mounted when missing), tracepoint formats.

Pure helpers (:func:`bpf_privileged`, :func:`parse_format_fields`) are separate from the ones
that look at the machine; everything that reads the file system takes ``root=``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
from pathlib import Path

CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39

TRACEFS_CANDIDATES = ("sys/kernel/tracing", "sys/kernel/debug/tracing")


def bpf_privileged(cap_eff: int) -> bool:
    """Whether an effective capability mask allows loading tracing BPF programs."""
    if cap_eff & (1 << CAP_SYS_ADMIN):
        return True
    return bool(cap_eff & (1 << CAP_BPF)) and bool(cap_eff & (1 << CAP_PERFMON))


def cap_eff(root: str = "/") -> int:
    """``CapEff`` of this process from ``<root>/proc/self/status`` (0 when unreadable)."""
    try:
        text = (Path(root) / "proc/self/status").read_text()
    except OSError:
        return 0
    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", text, re.M)
    return int(m.group(1), 16) if m else 0


def kernel_headers(release: str | None = None, root: str = "/") -> str | None:
    """The kernel header tree bcc will compile against, or None (bcc's own lookup order:
    ``BCC_KERNEL_SOURCE``, ``/lib/modules/<release>/{source,build}``, IKHEADERS)."""
    release = release or os.uname().release
    env = os.environ.get("BCC_KERNEL_SOURCE")
    cands = [env] if env else []
    mod = Path(root) / "lib/modules" / release
    cands += [str(mod / "source"), str(mod / "build")]
    for c in cands:
        if c and (Path(c) / "include/linux/kconfig.h").is_file():
            return c
    # bcc compiles against the `build` tree when `source` lacks generated headers
    build = mod / "build"
    if (build / "include/generated/autoconf.h").is_file():
        return str(build)
    kheaders = Path(root) / "sys/kernel/kheaders.tar.xz"
    if kheaders.is_file():
        return str(kheaders)
    return None


def find_tracefs(root: str = "/") -> str | None:
    """Mounted tracefs directory (one with ``events/``), or None."""
    for rel in TRACEFS_CANDIDATES:
        p = Path(root) / rel
        if (p / "events").is_dir():
            return str(p)
    return None


def ensure_tracefs(root: str = "/") -> tuple[str | None, str]:
    """Return (tracefs path, note). Mounts tracefs at ``<root>/sys/kernel/tracing`` when no
    tracefs is mounted (needs CAP_SYS_ADMIN); on failure the path is None and note says why."""
    found = find_tracefs(root)
    if found:
        return found, ""
    target = Path(root) / "sys/kernel/tracing"
    if not target.is_dir():
        return None, f"{target} does not exist"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    rc = libc.mount(b"nodev", str(target).encode(), b"tracefs", ctypes.c_ulong(0), None)
    if rc != 0:
        err = ctypes.get_errno()
        return None, f"mount -t tracefs nodev {target}: {os.strerror(err)}"
    found = find_tracefs(root)
    if not found:
        return None, f"mounted tracefs at {target} but it has no events/"
    return found, f"mounted tracefs at {target}"


def tracepoint_exists(tracefs: str | None, category: str, event: str) -> bool:
    return tracefs is not None and (Path(tracefs) / "events" / category / event).is_dir()


def kprobes_available(tracefs: str | None) -> bool:
    """Whether the kernel creates kprobe events (CONFIG_KPROBE_EVENTS): tracefs has the file."""
    return tracefs is not None and (Path(tracefs) / "kprobe_events").is_file()


def kallsyms_has(name: str, root: str = "/") -> bool:
    """Whether ``name`` is a kernel symbol now (a module's symbols only while it is loaded)."""
    try:
        text = (Path(root) / "proc/kallsyms").read_text()
    except OSError:
        return False
    return kallsyms_lookup(text, name)


def kallsyms_lookup(text: str, name: str) -> bool:
    """Whether ``/proc/kallsyms`` text (``addr type name [module]`` lines) names ``name``."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] == name:
            return True
    return False


_FIELD = re.compile(r"field:([^;]*?)\s+([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?;")


def parse_format_fields(text: str) -> list[str]:
    """Field names (without ``common_*``) of a tracefs ``format`` file's text."""
    names: list[str] = []
    for m in _FIELD.finditer(text):
        name = m.group(2)
        if not name.startswith("common_"):
            names.append(name)
    return names


def tracepoint_fields(tracefs: str | None, category: str, event: str) -> list[str]:
    if tracefs is None:
        return []
    try:
        text = (Path(tracefs) / "events" / category / event / "format").read_text()
    except OSError:
        return []
    return parse_format_fields(text)


def netns_inode(netns: str, root: str = "/") -> int:
    """Inode of a network namespace: ``"self"`` (this process's) or a name under
    ``/var/run/netns`` (as ``ip netns``/pyroute2 create them). Raises OSError when absent."""
    if netns == "self":
        return os.stat(Path(root) / "proc/self/ns/net").st_ino
    return os.stat(Path(root) / "var/run/netns" / netns).st_ino
