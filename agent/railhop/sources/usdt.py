"""The plugin's USDT probes (provider ``railhop``), attached by library path with bcc.

Probes are read from the library's ``.note.stapsdt`` ELF notes by the pure :func:`stapsdt_notes`
(name, argument count, semaphore). Attaching by path needs probes without semaphores (bcc can
only bump a semaphore for a given pid); such probes are reported ``skipped``. Lane probes
(lane_up, lane_down, failover_start, failover_end, failback, fair_share, standby_promoted) become
:class:`PluginLaneEvent`s;
``req_done(lane, bytes, latency_ns)`` is aggregated in the kernel per (pid, lane) and read with
:meth:`UsdtSource.lane_stats` (the completion tracing of the design).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from railhop.sources import hooks as H
from railhop.sources.base import Capability, Reason, SourceError, attached, skipped
from railhop.sources.compose import ComposeError
from railhop.sources.ebpf.loader import precheck, run_trials
from railhop.sources.ebpf.source import RINGBUF, EbpfSource

PROVIDER = "railhop"
LANE_PROBES = (
    "lane_up",
    "lane_down",
    "failover_start",
    "failover_end",
    "failback",
    "fair_share",
    "standby_promoted",
)
ALL_PROBES = (*LANE_PROBES, "req_done")
MAX_ARGS = 4
LAT_BUCKETS = 40

# the USDT programs' preludes: the ring buffer, then rh_usdt_reserve() and RH_CAT()
USDT_PRELUDES = (*RINGBUF, "rh_usdt_ev.c")

SPEC = H.ProbeSpec(source="usdt.plugin", file="plugin_usdt.bpf.c", hooks=(), preludes=USDT_PRELUDES)


class UsdtError(SourceError):
    """The library is not an ELF file we can read, or its notes are malformed."""


@dataclass(frozen=True, slots=True)
class UsdtNote:
    provider: str
    name: str
    pc: int
    semaphore: int
    args: str

    @property
    def nargs(self) -> int:
        return len(self.args.split()) if self.args.strip() else 0

    def arg_types(self) -> list[str]:
        return [arg_ctype(a) for a in self.args.split()]


_CTYPES = {1: "__u8", -1: "__s8", 2: "__u16", -2: "__s16", 4: "__u32", -4: "__s32", 8: "__u64"}


def arg_ctype(spec: str) -> str:
    """C type of one stapsdt argument spec (``-4@%edi`` -> ``__s32``; no size prefix -> u64)."""
    size, at, _loc = spec.partition("@")
    if not at:
        return "__u64"
    try:
        n = int(size)
    except ValueError as e:
        raise UsdtError(f"bad USDT argument spec {spec!r}") from e
    if n == -8:
        return "__s64"
    if n not in _CTYPES:
        raise UsdtError(f"bad USDT argument size in {spec!r}")
    return _CTYPES[n]


def _cstrs(b: bytes, n: int) -> list[str]:
    parts = b.split(b"\0")
    if len(parts) < n:
        raise UsdtError("truncated stapsdt note")
    return [p.decode("utf-8", "replace") for p in parts[:n]]


def stapsdt_notes(elf: bytes) -> list[UsdtNote]:
    """Parse the ``.note.stapsdt`` section of a little-endian ELF64 file."""
    if elf[:4] != b"\x7fELF" or len(elf) < 64:
        raise UsdtError("not an ELF file")
    if elf[4] != 2 or elf[5] != 1:
        raise UsdtError("only little-endian ELF64 is supported")
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    if shoff == 0 or shnum == 0:
        return []
    if shoff + shnum * shentsize > len(elf) or shstrndx >= shnum:
        raise UsdtError("section headers run past the end of the file")

    def sh(i: int) -> tuple[int, int, int]:
        name, _type, _flags, _addr, off, size = struct.unpack_from(
            "<IIQQQQ", elf, shoff + i * shentsize
        )
        return name, off, size

    _n, str_off, str_size = sh(shstrndx)
    names = elf[str_off : str_off + str_size]
    out: list[UsdtNote] = []
    for i in range(shnum):
        name_off, off, size = sh(i)
        end = names.find(b"\0", name_off)
        if names[name_off:end] != b".note.stapsdt":
            continue
        pos, stop = off, off + size
        while pos + 12 <= stop:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, pos)
            pos += 12
            nname = elf[pos : pos + namesz]
            pos += (namesz + 3) & ~3
            desc = elf[pos : pos + descsz]
            pos += (descsz + 3) & ~3
            if ntype != 3 or not nname.startswith(b"stapsdt") or len(desc) < 24:
                continue
            pc, _base, sema = struct.unpack_from("<QQQ", desc)
            prov, pname, args = _cstrs(desc[24:], 3)
            out.append(UsdtNote(prov, pname, pc, sema, args))
    return out


def _s32(v: int) -> int:
    return v - (1 << 32) if v >= 1 << 31 else v


@dataclass(frozen=True, slots=True)
class LaneStats:
    pid: int
    lane: int  # as the plugin passed it (-1: not tied to one lane)
    reqs: int
    bytes: int
    lat_sum_ns: int
    lat_log2: tuple[int, ...]  # bucket i: [2^i, 2^(i+1)) ns

    @property
    def mean_latency_ns(self) -> float:
        return self.lat_sum_ns / self.reqs if self.reqs else 0.0


def plan_probes(
    notes: list[UsdtNote],
    probes: tuple[str, ...] = ALL_PROBES,
    source: str = SPEC.source,
    min_args: dict[str, int] | None = None,
) -> tuple[dict[str, UsdtNote], list[Capability]]:
    """Which railhop probes of ``probes`` can be attached by path; records (of ``source``) for
    the others. ``min_args``: probe -> the arguments it must have (default: req_done 3). Pure."""
    need = {"req_done": 3} if min_args is None else min_args
    usable: dict[str, UsdtNote] = {}
    caps: list[Capability] = []
    ours: dict[str, UsdtNote] = {}
    mixed: set[str] = set()
    for site in notes:
        if site.provider != PROVIDER:
            continue
        prev = ours.setdefault(site.name, site)
        if [a.partition("@")[0] for a in prev.args.split()] != [
            a.partition("@")[0] for a in site.args.split()
        ]:
            mixed.add(site.name)
    for p in probes:
        n = ours.get(p)
        if p in mixed:
            caps.append(
                skipped(source, p, Reason.NOT_AVAILABLE, "argument sizes differ between sites")
            )
        elif n is None:
            caps.append(skipped(source, p, Reason.NO_PROBES, "not in the library"))
        elif n.semaphore:
            caps.append(skipped(source, p, Reason.NOT_AVAILABLE, "semaphore probe: needs a pid"))
        elif n.nargs < need.get(p, 0):
            caps.append(skipped(source, p, Reason.NOT_AVAILABLE, f"{n.nargs} args, need {need[p]}"))
        else:
            try:
                n.arg_types()
            except UsdtError as e:
                caps.append(skipped(source, p, Reason.NOT_AVAILABLE, str(e)))
                continue
            usable[p] = n
    return usable, caps


class UsdtProbes(EbpfSource):
    """USDT probes of the plugin library ``lib`` (every process mapping it, now or later), by one
    program: which probes and which program are class attributes (:class:`UsdtSource`: the lane
    probes; :class:`railhop.sources.verbs_usdt.VerbsUsdtSource`: the verbs completions)."""

    PROBE_SPEC: ClassVar[H.ProbeSpec] = SPEC
    PROBES: ClassVar[tuple[str, ...]] = ALL_PROBES
    ARG_LIMIT: ClassVar[int] = MAX_ARGS  # arguments the program reads at most
    MIN_ARGS: ClassVar[dict[str, int]] = {"req_done": 3}

    def __init__(self, lib: str | Path, bpf_dir: Path | None = None, root: str = "/") -> None:
        super().__init__(self.PROBE_SPEC, bpf_dir, root)
        self.lib = str(Path(lib).resolve())
        self._usable: dict[str, UsdtNote] = {}

    def _flags(self) -> list[str]:
        out: list[str] = []
        for p, n in self._usable.items():
            out.append(f"-DRH_USE_{p}")
            out.append(f"-DRH_NA_{p}={min(n.nargs, self.ARG_LIMIT)}")
            for i, t in enumerate(n.arg_types()[: self.ARG_LIMIT], start=1):
                out.append(f"-DRH_AT_{p}_{i}={t}")
        return out

    def usdt_request(self) -> dict[str, Any] | None:
        return {"path": self.lib, "probes": [[p, f"rh_usdt_{p}"] for p in self._usable]}

    def _usdt(self) -> Any:
        from bcc import USDT

        u = USDT(path=self.lib)
        for p in self._usable:
            u.enable_probe(probe=p, fn_name=f"rh_usdt_{p}")
        return u

    def _construct(self, cflags: list[str]) -> Any:
        from bcc import BPF

        return BPF(text=self.text().encode(), cflags=cflags, usdt_contexts=[self._usdt()])

    def probe(self) -> tuple[list[Capability], list[str]]:
        try:
            notes = stapsdt_notes(Path(self.lib).read_bytes())
        except OSError as e:
            return [skipped(self.name, "*", Reason.NO_LIBRARY, f"{self.lib}: {e.strerror}")], []
        except UsdtError as e:
            return [skipped(self.name, "*", Reason.NO_LIBRARY, f"{self.lib}: {e}")], []
        self._usable, caps = plan_probes(notes, self.PROBES, self.name, self.MIN_ARGS)
        if not self._usable:
            return caps, []
        pre = precheck(self._root)
        if pre.env is None:
            return caps + [skipped(self.name, p, pre.reason, pre.detail) for p in self._usable], []
        # one candidate with all probes: the probes share the program, so they load together
        plan = H.Plan([[H.Candidate(0, 0, 0, tuple(self._flags()))]], [[]])
        try:
            text = self.text()
        except ComposeError as e:
            return caps + [
                skipped(self.name, p, Reason.NOT_AVAILABLE, str(e)) for p in self._usable
            ], []
        outcome = run_trials(
            str(self._src()), self.base_cflags(), plan, self.usdt_request(), text=text
        )
        ok = outcome.results.get(0, (False, ""))[0] and outcome.combined_ok
        err = outcome.results.get(0, (False, outcome.combined_err))[1] or outcome.combined_err
        for p in self._usable:
            if ok:
                caps.append(attached(self.name, p, "usdt", self.lib))
            else:
                caps.append(skipped(self.name, p, H.classify("usdt", err), err[:160]))
        return caps, self._flags() if ok else []


class UsdtSource(UsdtProbes):
    """The plugin's lane probes and req_done (source ``usdt.plugin``)."""

    def lane_stats(self) -> list[LaneStats]:
        """Per (pid, lane) totals of req_done since start (empty when req_done is not attached)."""
        if self._bpf is None or "req_done" not in self._usable:
            return []
        out = []
        for k, v in self._bpf[b"rh_lane_stats"].items():
            out.append(
                LaneStats(
                    pid=int(k.pid),
                    lane=_s32(int(k.lane)),
                    reqs=int(v.reqs),
                    bytes=int(v.bytes),
                    lat_sum_ns=int(v.lat_sum_ns),
                    lat_log2=tuple(int(x) for x in v.lat_log2),
                )
            )
        return sorted(out, key=lambda s: (s.pid, s.lane))
