"""sysfs counters -> rates -> threshold breaches.

Reads (under ``root=``) netdev ``statistics/*`` plus ``carrier_changes`` /
``carrier_{up,down}_count``, and RDMA port ``counters/*`` and ``hw_counters/*``. A missing or
unreadable file drops that value, not the source. Rates are computed by the pure
:func:`rates`, compared with thresholds (counter name -> events per second; a plain mapping or a
dataclass whose fields are counter names) by the pure :func:`breaches`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from railhop.sources.base import Capability, Emit, Reason, attached, skipped
from railhop.sources.events import CounterBreach

NETDEV_EXTRA = ("carrier_changes", "carrier_up_count", "carrier_down_count")

# IBTA PortCounters that saturate instead of wrapping (bits); a value at the maximum stays there.
SATURATING_BITS = {
    "link_downed": 8,
    "link_error_recovery": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "symbol_error": 16,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_xmit_discards": 16,
}


@dataclass(frozen=True, slots=True)
class Sample:
    """Counter values of one object (netdev name or ``<rdma-dev>/<port>``) at ``ts_ns``."""

    obj: str
    ts_ns: int
    values: Mapping[str, int]


def _read_int(p: Path) -> int | None:
    try:
        text = p.read_text().strip()
    except OSError:
        return None
    try:
        return int(text.split()[0], 0) if text else None
    except ValueError:
        return None


def _read_dir(d: Path, prefix: str = "") -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        entries = sorted(d.iterdir())
    except OSError:
        return out
    for f in entries:
        v = _read_int(f)
        if v is not None:
            out[prefix + f.name] = v
    return out


def read_netdev(ifname: str, root: str = "/") -> dict[str, int]:
    base = Path(root) / "sys/class/net" / ifname
    vals = _read_dir(base / "statistics")
    for name in NETDEV_EXTRA:
        v = _read_int(base / name)
        if v is not None:
            vals[name] = v
    return vals


def read_rdma_port(device: str, port: int, root: str = "/") -> dict[str, int]:
    base = Path(root) / "sys/class/infiniband" / device / "ports" / str(port)
    vals = _read_dir(base / "counters")
    vals.update(_read_dir(base / "hw_counters"))
    return vals


def rdma_ports(root: str = "/") -> list[tuple[str, int]]:
    base = Path(root) / "sys/class/infiniband"
    out: list[tuple[str, int]] = []
    try:
        devs = sorted(p.name for p in base.iterdir())
    except OSError:
        return out
    for d in devs:
        try:
            ports = sorted(int(p.name) for p in (base / d / "ports").iterdir() if p.name.isdigit())
        except OSError:
            continue
        out += [(d, p) for p in ports]
    return out


def rates(prev: Sample, cur: Sample) -> dict[str, tuple[float, int]]:
    """Per-second rate and delta of every counter present in both samples. A counter that went
    backwards (reset, device re-created) is skipped for this interval; a saturated IBTA counter
    yields 0 (its rate can no longer be known)."""
    dt = (cur.ts_ns - prev.ts_ns) / 1e9
    if dt <= 0:
        return {}
    out: dict[str, tuple[float, int]] = {}
    for name, v in cur.values.items():
        p = prev.values.get(name)
        if p is None or v < p:
            continue
        bits = SATURATING_BITS.get(name)
        if bits is not None and p == (1 << bits) - 1:
            out[name] = (0.0, 0)
            continue
        out[name] = ((v - p) / dt, v - p)
    return out


def as_thresholds(obj: Mapping[str, float] | Any) -> dict[str, float]:
    """Accept a mapping counter -> per-second threshold, or a dataclass with such fields
    (``None`` values are ignored)."""
    if isinstance(obj, Mapping):
        items = obj.items()
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        items = dataclasses.asdict(obj).items()
    else:
        raise TypeError(f"thresholds must be a mapping or a dataclass, not {type(obj).__name__}")
    out: dict[str, float] = {}
    for k, v in items:
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise TypeError(f"threshold {k!r} must be a number, not {v!r}")
        out[str(k)] = float(v)
    return out


def breaches(
    obj: str,
    *,
    r: Mapping[str, tuple[float, int]],
    thresholds: Mapping[str, float],
    ts_ns: int,
    interval_s: float,
    source: str = "sysfs",
) -> list[CounterBreach]:
    """Counters whose rate is above their threshold (strictly; a threshold of 0 means any
    increase)."""
    out = []
    for name, limit in sorted(thresholds.items()):
        got = r.get(name)
        if got is None:
            continue
        rate, delta = got
        if delta > 0 and rate > limit:
            out.append(
                CounterBreach(
                    ts_ns=ts_ns,
                    source=source,
                    hook="sysfs",
                    obj=obj,
                    counter=name,
                    rate=rate,
                    threshold=limit,
                    delta=delta,
                    interval_s=interval_s,
                )
            )
    return out


class SysfsCounterSource:
    """Samples counters every ``interval_s`` and emits a :class:`CounterBreach` per counter whose
    rate exceeds its threshold. ``ifnames``: netdevs to watch; RDMA ports are found under
    ``root``. ``latest`` keeps the last rates per object for metrics."""

    def __init__(
        self,
        thresholds: Mapping[str, float] | Any,
        *,
        ifnames: list[str] | None = None,
        interval_s: float = 0.2,
        root: str = "/",
        rdma: bool = True,
        name: str = "sysfs",
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self._name = name
        self.thresholds = as_thresholds(thresholds)
        self.ifnames = list(ifnames or [])
        self.interval_s = interval_s
        self.root = root
        self.rdma = rdma
        self._prev: dict[str, Sample] = {}
        self.latest: dict[str, dict[str, tuple[float, int]]] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self._name

    def objects(self) -> list[tuple[str, str, int]]:
        """(kind, name, port) of everything sampled: ("net", ifname, 0) / ("rdma", dev, port)."""
        objs: list[tuple[str, str, int]] = [("net", n, 0) for n in self.ifnames]
        if self.rdma:
            objs += [("rdma", d, p) for d, p in rdma_ports(self.root)]
        return objs

    def sample_once(self, now_ns: int | None = None) -> list[CounterBreach]:
        """Read every object once and return the breaches against the previous sample."""
        out: list[CounterBreach] = []
        for kind, n, port in self.objects():
            ts = now_ns if now_ns is not None else time.monotonic_ns()
            if kind == "net":
                obj, vals = n, read_netdev(n, self.root)
            else:
                obj, vals = f"{n}/{port}", read_rdma_port(n, port, self.root)
            if not vals:
                continue
            cur = Sample(obj, ts, vals)
            prev = self._prev.get(obj)
            self._prev[obj] = cur
            if prev is None:
                continue
            r = rates(prev, cur)
            self.latest[obj] = r
            dt = (cur.ts_ns - prev.ts_ns) / 1e9
            out += breaches(
                obj, r=r, thresholds=self.thresholds, ts_ns=ts, interval_s=dt, source=self.name
            )
        return out

    async def start(self, emit: Emit) -> list[Capability]:
        objs = self.objects()
        caps: list[Capability] = []
        for kind, n, port in objs:
            hook = n if kind == "net" else f"{n}/{port}"
            vals = (
                read_netdev(n, self.root) if kind == "net" else read_rdma_port(n, port, self.root)
            )
            if vals:
                caps.append(attached(self.name, hook, "sysfs", f"{len(vals)} counters"))
            else:
                caps.append(skipped(self.name, hook, Reason.NOT_AVAILABLE, "no readable counters"))
        if self.rdma and not any(k == "rdma" for k, _n, _p in objs):
            caps.append(skipped(self.name, "rdma", Reason.NO_RDMA_DEVICES))
        self.sample_once()
        self._task = asyncio.create_task(self._run(emit), name=f"rh-{self.name}")
        return caps

    async def _run(self, emit: Emit) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            for b in await asyncio.to_thread(self.sample_once):
                emit(b)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._task, 2.0)
            self._task = None
