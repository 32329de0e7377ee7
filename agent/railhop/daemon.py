"""The railhop agent: one asyncio process, sources -> health -> plan -> publish.

    signals (netlink, sysfs counters, eBPF, verbs)  ─┐
    plugin lane events (agent.sock)                 ─┴─► health model ─► plan(policy) ─► health.tbl

Deciding is separate from acting: the translation of signals into health events
(:func:`health_event_from_source`, :func:`health_event_from_lane`) and of health + plan into the
published table (:func:`to_published`) are pure functions; :class:`Agent` only moves data between
them, on one event loop:

- every input goes through one inbox; the health model's timers are driven by its
  ``next_deadline()``; a publish happens only when a NIC changed state or the policy changed;
- the policy file is re-read when its mtime changes; a file that turned invalid is logged and
  the last good policy stays in force;
- SIGTERM/SIGINT (or ``duration_s``) stop the loop; shutdown (sources, then the control plane,
  which marks the table "agent gone" and removes the socket, then trace export) is bounded by
  ``shutdown_timeout_s``.

Observability (docs/tracing.md): the same inputs feed a :class:`railhop.tracing.FailoverTracer`
(one OpenTelemetry trace per failover, timed by the events' own timestamps, exported as the
``OTEL_*`` variables say, never blocking the loop) and :class:`railhop.metrics.AgentMetrics`
(a Prometheus endpoint when ``metrics_port`` is set). Plugin lane events come from
``agent.sock``, or from the plugin's USDT probes (``usdt_lib``, :class:`UsdtLaneTranslator`);
USDT ones feed traces and metrics only, never the health model.

The pieces it plugs together (topology reader, policy loader, planner, sources) are parameters,
so tests and the demo run it on fixture trees and emulated fabrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import logging
import math
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from railhop import health, tracing
from railhop.control import (
    Backup,
    ControlPlane,
    Distance,
    EventType,
    LaneEvent,
    NicHealth,
    NicState,
    Reason,
    ReceivedEvent,
)
from railhop.control.status import STATUS_FILE
from railhop.metrics import AgentMetrics, MetricsError, MetricsServer
from railhop.policy import Plan, Policy, default_policy, load_policy, plan
from railhop.topology import Nic, Topology, read_topology

log = logging.getLogger("railhop.agent")


class AgentError(Exception):
    """Base class of the daemon's errors (bad configuration, nothing to manage)."""


# ---------------------------------------------------------------------------------------------
# configuration and the small protocols the agent depends on


@dataclass(frozen=True)
class AgentConfig:
    policy_path: Path | None = None  # None: the built-in default policy
    run_dir: Path | None = None  # None: $RAILHOP_RUN_DIR or /run/railhop
    sys_root: Path = Path("/")
    nics: tuple[str, ...] = ()  # netdevs to manage; empty: every NIC the topology finds
    heartbeat_ms: int = 250
    owner_uid: int | None = None  # the job's uid when the agent runs as root
    reload_interval_s: float = 2.0
    shutdown_timeout_s: float = 5.0
    duration_s: float | None = None  # stop after this long (tests, demo); None: until a signal
    # which default sources to start; "ebpf": carrier (raw tracepoint / qdisc proxy) and TCP
    # lane probes, started in the background when the capability check allows them
    sources: tuple[str, ...] = ("netlink", "sysfs", "ebpf")
    ebpf_start_timeout_s: float = 180.0  # trial child + bcc compile, on a busy node
    status_interval_s: float = 0.25  # status.json at most this often
    traces: bool = False  # export failover traces as the OTEL_* variables say
    trace_file: Path | None = None  # also append OTLP/JSON lines here
    metrics_port: int | None = None  # Prometheus endpoint; None: off, 0: an ephemeral port
    metrics_addr: str = "0.0.0.0"  # a scrape target listens on every address
    # the plugin library to trace with USDT (lane events for traces/metrics when the plugin does
    # not send them on agent.sock, and per-lane bytes/latency); None: no USDT source
    usdt_lib: Path | None = None
    plugin_nics: tuple[str, ...] = ()  # the plugins' NIC order (RAILHOP_NICS); empty: auto


class SourceLike(Protocol):
    """What the agent needs of a source (railhop.sources.base.Source has this shape)."""

    @property
    def name(self) -> str: ...

    async def start(self, emit: Callable[[Any], None]) -> list[Any]: ...

    async def stop(self) -> None: ...


TopologyReader = Callable[[Path, Sequence[str]], Topology]
PolicyLoader = Callable[[Path], Policy]
Planner = Callable[[Topology, Mapping[str, health.NicState], Policy], Plan]
SourceFactory = Callable[[AgentConfig, Topology, Policy], list[SourceLike]]


def _read_topology(root: Path, nics: Sequence[str]) -> Topology:
    return read_topology(root, netdevs=nics)


def default_sources(config: AgentConfig, topo: Topology, policy: Policy) -> list[SourceLike]:
    """The sources ``config.sources`` names for the managed netdevs (netlink link events, sysfs
    counters, eBPF carrier/TCP-lane probes); a source whose module cannot be imported is logged
    and left out (the others carry on)."""
    ifnames = [ifname_of(n) for n in topo.nics]
    out: list[SourceLike] = []
    if "netlink" in config.sources:
        try:
            from railhop.sources.netlink import NetlinkSource

            out.append(NetlinkSource(set(ifnames)))
        except Exception as e:  # a broken source must not stop the agent
            log.warning("netlink source unavailable: %s", e)
    if "sysfs" in config.sources and policy.health.counters:
        try:
            from railhop.sources.sysfs import SysfsCounterSource

            out.append(
                SysfsCounterSource(
                    dict(policy.health.counters), ifnames=ifnames, root=str(config.sys_root)
                )
            )
        except Exception as e:
            log.warning("sysfs counter source unavailable: %s", e)
    if "ebpf" in config.sources:
        try:
            from railhop.sources.ebpf import CarrierSource, TcpLaneSource

            # kernel hooks see every netns: keep this agent's (the node's) only
            out.append(CarrierSource(ifnames=set(ifnames), netns="self"))
            out.append(TcpLaneSource(netns="self"))
        except Exception as e:
            log.warning("eBPF sources unavailable: %s", e)
    if config.usdt_lib is not None:
        try:
            from railhop.sources.usdt import UsdtSource

            out.append(UsdtSource(config.usdt_lib))
        except Exception as e:
            log.warning("USDT source unavailable: %s", e)
    return out


# ---------------------------------------------------------------------------------------------
# pure translations


def ifname_of(nic: Nic) -> str:
    """The name plugins know a NIC by: its netdev, else its topology name."""
    return nic.netdev or nic.name


def aliases(topo: Topology) -> dict[str, str]:
    """Every name a signal may use for a NIC (netdev, RDMA device, ``dev/port``, PCI address)
    -> the NIC's ifname (the health model's key)."""
    out: dict[str, str] = {}
    for n in topo.nics:
        key = ifname_of(n)
        for name in n.names:
            out[name] = key
        if n.rdma_device:
            for p in n.ports:
                out[f"{n.rdma_device}/{p.num}"] = key
    return out


_PORT_DOWN = {"PORT_ERR", "IB_EVENT_PORT_ERR", "port_err"}
_PORT_UP = {"PORT_ACTIVE", "IB_EVENT_PORT_ACTIVE", "port_active"}
_FATAL = {"DEVICE_FATAL", "IB_EVENT_DEVICE_FATAL", "device_fatal"}


def health_event_from_source(
    ev: object, alias: Mapping[str, str], port_nic: Mapping[int, str] | None = None
) -> health.Event | None:
    """A source event (railhop.sources.events) as a health-model event, or None when it says
    nothing about a managed NIC's health. Matched by class name so that this module does not
    need the sources package. ``port_nic``: local TCP port of a plugin lane -> its NIC
    (:class:`LaneBook`), for the TCP probe's signals."""
    kind = type(ev).__name__
    t = getattr(ev, "ts_ns", 0) / 1e9
    if kind == "TcpSuspect":
        if getattr(ev, "reason", "") == "retransmit":
            # a plain retransmit is congestion as often as trouble (tbf drops, incast); a
            # blackhole shows as an RTO, i.e. "loss" (TCP_CA_Loss) at the same moment
            return None
        ports = port_nic or {}
        nic = ports.get(int(getattr(ev, "sport", 0))) or ports.get(int(getattr(ev, "dport", 0)))
        if nic is None or nic not in alias:
            return None
        return health.TcpSuspect(
            alias[nic],
            t,
            detail=f"{getattr(ev, 'reason', '')} {getattr(ev, 'sport', 0)}->"
            f"{getattr(ev, 'dport', 0)} value {getattr(ev, 'value', 0)}",
        )
    if kind in ("CarrierDown", "CarrierUp", "LinkRemoved"):
        nic = alias.get(str(getattr(ev, "ifname", "")))
        if nic is None:
            return None
        if kind == "CarrierUp":
            return health.CarrierUp(nic, t)
        if kind == "LinkRemoved":
            return health.DeviceFatal(nic, t)
        if not getattr(ev, "certain", True):
            return None  # a proxy signal (qdisc reset): netlink will confirm or not
        return health.CarrierDown(nic, t)
    if kind == "CounterBreach":
        nic = alias.get(str(getattr(ev, "obj", "")))
        if nic is None:
            return None
        return health.CounterBreach(
            nic,
            t,
            counter=str(getattr(ev, "counter", "")),
            rate=float(getattr(ev, "rate", 0.0)),
            threshold=float(getattr(ev, "threshold", 0.0)),
        )
    if kind == "RdmaPortEvent":
        dev = str(getattr(ev, "device", ""))
        port = getattr(ev, "port", 0)
        nic = alias.get(f"{dev}/{port}") or alias.get(dev)
        what = str(getattr(ev, "event", ""))
        if nic is None:
            return None
        if what in _PORT_DOWN:
            return health.CarrierDown(nic, t)
        if what in _PORT_UP:
            return health.CarrierUp(nic, t)
        if what in _FATAL:
            return health.DeviceFatal(nic, t)
        return None
    if kind == "DevlinkHealth":
        nic = alias.get(str(getattr(ev, "device", "")))
        return health.DeviceFatal(nic, t) if nic is not None else None
    return None


def health_event_from_lane(ev: LaneEvent, alias: Mapping[str, str]) -> health.Event | None:
    """A plugin's lane event as a health event: timeouts and transport errors are soft signals
    on the lane's local NIC (the state machine decides when they mean DOWN); a lane coming up
    or failing back on a NIC is a successful probe of it."""
    nic = alias.get(ev.nic)
    if nic is None:
        return None
    t = ev.t_ns / 1e9
    if ev.type is EventType.LANE_TIMEOUT and ev.error == errno.EREMOTEIO:
        # the peer timed out on the lane and told this side: the fault may be at the peer's
        # end, and taking this NIC down would move its lanes to every other peer too
        return health.Suspicion(nic, t, detail=f"peer-reported lane timeout, pid {ev.pid}")
    if ev.type is EventType.LANE_TIMEOUT:
        return health.LaneTimeout(nic, t, detail=f"pid {ev.pid} conn {ev.conn_id}")
    if ev.type is EventType.LANE_ERROR:
        return health.LaneError(nic, t, detail=f"pid {ev.pid} conn {ev.conn_id} errno {ev.error}")
    if ev.type in (EventType.LANE_UP, EventType.FAILBACK):
        # a lane on this NIC completed its handshake / carries traffic again: the positive
        # evidence a NIC that went DOWN with its link up needs before it is offered again
        return health.ProbeOk(nic, t)
    return None


def _signed(v: int) -> int:
    """A USDT argument read as unsigned 64-bit back to its signed value."""
    return v - (1 << 64) if v >= 1 << 63 else v


class UsdtLaneTranslator:
    """The plugin's USDT lane probes (``railhop.sources.events.PluginLaneEvent``) as lane
    events, for traces and metrics when the plugin does not report on ``agent.sock``. Pure
    (state: which NIC each lane uses). Probe arguments (plugin/src/probes.h):
    lane_up(conn, lane, lnic, rnic), lane_down(conn, lane, lnic, err),
    failover_start(conn, lane, err), failover_end(conn, epoch, nactive, bytes_replayed),
    failback(conn, lane);
    ``lnic`` indexes the plugin's NIC list ``nics`` (sorted auto-detected names or RAILHOP_NICS).
    """

    MAX_LANES = 65536

    def __init__(self, nics: Sequence[str]) -> None:
        self.nics = list(nics)
        self._lane_nic: dict[tuple[int, int, int], int] = {}
        self._conn_nic: dict[tuple[int, int], int] = {}

    def _name(self, idx: int | None) -> str | None:
        if idx is None or not 0 <= idx < len(self.nics):
            return None
        return self.nics[idx]

    def translate(self, ev: object) -> LaneEvent | None:
        probe = str(getattr(ev, "probe", ""))
        pid = int(getattr(ev, "pid", 0))
        t = int(getattr(ev, "ts_ns", 0))
        a = [_signed(int(x)) for x in getattr(ev, "args", ())] + [0, 0, 0, 0]
        conn, second = a[0] & 0xFFFFFFFFFFFFFFFF, a[1]
        if pid <= 0:
            return None
        if probe == "lane_up":
            if len(self._lane_nic) >= self.MAX_LANES:
                self._lane_nic.clear()
            self._lane_nic[(pid, conn, second)] = a[2]
            nic = self._name(a[2])
            if nic is None:
                return None
            return LaneEvent(EventType.LANE_UP, pid, nic, conn_id=conn, lane=second, t_ns=t)
        if probe == "lane_down":  # the lane's NIC stays known: failover_start follows
            nic = self._name(a[2])
            if nic is None:
                return None
            err = abs(a[3])
            etype = EventType.LANE_ERROR if err else EventType.LANE_DOWN
            return LaneEvent(etype, pid, nic, conn_id=conn, lane=second, t_ns=t, error=err)
        if probe == "failover_start":
            idx = self._lane_nic.get((pid, conn, second))
            nic = self._name(idx)
            if nic is None or idx is None:
                return None
            self._conn_nic[(pid, conn)] = idx
            return LaneEvent(
                EventType.FAILOVER_START,
                pid,
                nic,
                conn_id=conn,
                lane=second,
                t_ns=t,
                error=abs(a[2]),
            )
        if probe == "failover_end":
            nic = self._name(self._conn_nic.pop((pid, conn), None))
            if nic is None:
                return None
            return LaneEvent(
                EventType.FAILOVER_END, pid, nic, conn_id=conn, epoch=second & 0xFFFFFFFF, t_ns=t
            )
        if probe == "failback":
            nic = self._name(self._lane_nic.get((pid, conn, second)))
            if nic is None:
                return None
            return LaneEvent(EventType.FAILBACK, pid, nic, conn_id=conn, lane=second, t_ns=t)
        return None


class BurstGuard:
    """Pure: one process reporting lane timeouts/errors on several NICs within ``window_s`` is
    more likely overloaded, or losing its peer, than seeing several local NICs fail at once
    (seen on the fabric: right after a carrier loss, the backup lanes' probes of one process
    timed out on all three other NICs within 1 ms, and taking them DOWN took the whole node's
    traffic down). The first NIC's signal stands; the others' become suspicion only."""

    def __init__(self, window_s: float = 0.5) -> None:
        self.window_s = window_s
        self._recent: dict[int, list[tuple[float, str]]] = {}

    def filter(self, ev: health.Event, pid: int) -> health.Event:
        if not isinstance(ev, health.LaneTimeout | health.LaneError):
            return ev
        if len(self._recent) > 4096:
            self._recent.clear()
        seen = [(t, n) for t, n in self._recent.get(pid, []) if ev.t - t < self.window_s]
        others = {n for _, n in seen if n != ev.nic}
        self._recent[pid] = [*seen[-31:], (ev.t, ev.nic)]
        if not others:
            return ev
        return health.Suspicion(
            ev.nic,
            ev.t,
            detail=f"{ev.kind.replace('_', ' ')} of pid {pid} also on {','.join(sorted(others))}",
        )


@dataclass
class _Lane:
    nic: str
    conn: tuple[int, int]  # (pid, conn_id)
    ports: tuple[int, ...]


class LaneBook:
    """The plugins' lanes as their lane events describe them (pure: no I/O, no clock):
    which NIC each lane uses (connections per NIC for ``railhop status``), which local TCP
    ports belong to which NIC (the TCP probe's port map: :meth:`update` says which ports to
    add to / remove from it) and the recent failovers and fail-backs. Lanes are keyed by
    (peer pid as the agent sees it, connection id, lane index); bounded in size."""

    MAX_LANES = 65536
    MAX_FAILOVERS = 32

    def __init__(self) -> None:
        self._lanes: dict[tuple[int, int, int], _Lane] = {}
        self._refs: dict[int, int] = {}
        self.port_nic: dict[int, str] = {}
        self._open: dict[tuple[int, int], dict[str, Any]] = {}
        self.failovers: deque[dict[str, Any]] = deque(maxlen=self.MAX_FAILOVERS)
        self.failover_count = 0
        self.failback_count = 0

    def update(self, ev: LaneEvent, pid: int) -> tuple[list[int], list[int]]:
        """Apply one lane event from process ``pid``; returns (ports added, ports removed)."""
        added: list[int] = []
        removed: list[int] = []
        key = (pid, ev.conn_id, ev.lane)
        if ev.type is EventType.LANE_UP:
            old = self._lanes.pop(key, None)
            if old is not None:
                removed += self._release(old)
            if len(self._lanes) >= self.MAX_LANES:  # bounded: forget the oldest
                removed += self._release(self._lanes.pop(next(iter(self._lanes))))
            ports = tuple(p for p in ev.local_ports if 0 < p < 65536)
            self._lanes[key] = _Lane(ev.nic, (pid, ev.conn_id), ports)
            for port in ports:
                self._refs[port] = self._refs.get(port, 0) + 1
                if self._refs[port] == 1:
                    self.port_nic[port] = ev.nic
                    added.append(port)
        elif ev.type in (EventType.LANE_DOWN, EventType.LANE_ERROR, EventType.LANE_TIMEOUT):
            old = self._lanes.pop(key, None)
            if old is not None:
                removed += self._release(old)
        elif ev.type is EventType.FAILOVER_START:
            self.failover_count += 1
            rec: dict[str, Any] = {
                "kind": "failover",
                "pid": pid,
                "conn": ev.conn_id,
                "nic": ev.nic,
                "t_ns": ev.t_ns,
                "error": ev.error,
                "duration_ms": None,
            }
            if len(self._open) >= self.MAX_LANES:
                self._open.clear()
            self._open[(pid, ev.conn_id)] = rec
            self.failovers.append(rec)
        elif ev.type is EventType.FAILOVER_END:
            done = self._open.pop((pid, ev.conn_id), None)
            if done is not None:
                done["duration_ms"] = round(ev.duration_ns / 1e6, 3)
                # (sender side; the field is new in the plugin's events: absent -> 0)
                done["bytes_replayed"] = int(getattr(ev, "bytes_replayed", 0))
        elif ev.type is EventType.FAILBACK:
            self.failback_count += 1
            self.failovers.append(
                {
                    "kind": "failback",
                    "pid": pid,
                    "conn": ev.conn_id,
                    "nic": ev.nic,
                    "t_ns": ev.t_ns,
                    "error": 0,
                    "duration_ms": None,
                }
            )
        return added, [p for p in removed if p not in added]

    def _release(self, lane: _Lane) -> list[int]:
        out = []
        for port in lane.ports:
            n = self._refs.get(port, 0) - 1
            if n <= 0:
                self._refs.pop(port, None)
                self.port_nic.pop(port, None)
                out.append(port)
            else:
                self._refs[port] = n
        return out

    def per_nic(self) -> dict[str, dict[str, int]]:
        """NIC -> lanes, connections and processes using it now."""
        lanes: dict[str, int] = {}
        conns: dict[str, set[tuple[int, int]]] = {}
        for lane in self._lanes.values():
            lanes[lane.nic] = lanes.get(lane.nic, 0) + 1
            conns.setdefault(lane.nic, set()).add(lane.conn)
        return {
            nic: {
                "lanes": lanes[nic],
                "connections": len(conns[nic]),
                "processes": len({c[0] for c in conns[nic]}),
            }
            for nic in sorted(lanes)
        }

    def status(self, *, agent_pid: int, now_ns: int) -> dict[str, Any]:
        """The content of ``status.json`` (what ``railhop status`` shows under the NIC table)."""
        return {
            "version": 1,
            "agent_pid": agent_pid,
            "written_ns": now_ns,
            "nics": self.per_nic(),
            "failovers_total": self.failover_count,
            "failbacks_total": self.failback_count,
            "recent": list(self.failovers),
        }


def write_status(path: Path, doc: Mapping[str, Any]) -> None:
    """Write ``doc`` as JSON to ``path`` atomically (temp file + rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def plugin_nic_order() -> list[str]:
    """What the plugin's auto-detection picks in this netns: up, non-loopback interfaces
    with an IPv4 address, sorted by name (plugin/src/nic.c)."""
    from pyroute2 import IPRoute

    iff_up, iff_loopback = 0x1, 0x8
    with IPRoute() as ipr:
        up = {
            str(link.get_attr("IFLA_IFNAME"))
            for link in ipr.get_links()
            if link["flags"] & iff_up and not link["flags"] & iff_loopback
        }
        v4 = {str(a.get_attr("IFA_LABEL")) for a in ipr.get_addr(family=socket.AF_INET)}
    return sorted(up & v4)


_STATE = {
    health.NicState.UP: NicState.UP,
    health.NicState.SUSPECT: NicState.SUSPECT,
    health.NicState.DOWN: NicState.DOWN,
    health.NicState.RECOVERING: NicState.RECOVERING,
}


def published_state(h: health.NicHealth, params: health.HealthParams) -> NicState:
    """The table state of a NIC. A NIC that went DOWN with its link up and is past its hold-off
    waits in RECOVERING for evidence (a lane of a plugin up or failed back on it); plugins treat
    a RECOVERING NIC as down and would never try it, so it is published as SUSPECT ("probe
    before you trust it"): plugins may fail back onto it and run their confirming probe, while
    the agent's plans still never offer it as a backup (the model keeps it not usable)."""
    if (
        h.state is health.NicState.RECOVERING
        and h.need_evidence
        and h.probes_ok < health.probes_needed(h, params)
    ):
        return NicState.SUSPECT
    return _STATE[h.state]


def reason_code(reason: str) -> Reason:
    """The table's reason code for a health-model reason text (first match wins)."""
    r = reason.lower()
    for words, code in (
        (("while recovering", "hold-off"), Reason.FLAPPING),
        (("carrier", "link down"), Reason.CARRIER),
        (("device fatal",), Reason.DEVICE_FATAL),
        (("admin",), Reason.ADMIN),
        (("lane timeout",), Reason.LANE_TIMEOUT),
        (("lane error",), Reason.LANE_ERROR),
        (("counter",), Reason.COUNTERS),
        (("tcp",), Reason.TCP),
        (("initial", "recovered", "quiet", "probe ok"), Reason.NONE),
    ):
        if any(w in r for w in words):
            return code
    return Reason.OTHER


def _weight(w: float) -> int:
    if w <= 0 or math.isnan(w):
        return 0
    return max(1, min(0xFFFF, round(w * 10000)))


def to_published(
    model: health.HealthModel, topo: Topology, result: Plan
) -> tuple[list[NicHealth], dict[str, list[Backup]]]:
    """Pure: the health table's content for this health model and plan."""
    by_name = {n.name: n for n in topo.nics}
    nics: list[NicHealth] = []
    for n in topo.nics:
        key = ifname_of(n)
        h = model.nics.get(key)
        if h is None:
            continue
        rail = result.rails.get(n.name)
        nics.append(
            NicHealth(
                ifname=key,
                state=published_state(h, model.params),
                since_ns=max(0, int(h.since * 1e9)),
                reason=reason_code(h.reason),
                rail=rail[0] if rail is not None else n.rail,
                pci=n.pci.bdf if n.pci is not None else "",
                numa=n.numa_node if n.numa_node is not None and n.numa_node >= 0 else None,
                speed_mbps=n.speed_mbps or 0,
            )
        )
    published = {x.ifname for x in nics}
    plans: dict[str, list[Backup]] = {}
    for entry in result.entries:
        owner = by_name.get(entry.nic)
        if owner is None or ifname_of(owner) not in published:
            continue
        backups = []
        for p in entry.pairs:
            local = by_name.get(p.local)
            if local is None or ifname_of(local) not in published:
                continue
            backups.append(
                Backup(
                    local_nic=ifname_of(local),
                    remote_rail=p.remote[0],
                    weight=_weight(p.weight),
                    distance=Distance[p.distance.name],
                )
            )
        if backups:
            plans[ifname_of(owner)] = backups
    return nics, plans


# ---------------------------------------------------------------------------------------------
# the loop


@dataclass
class AgentStats:
    source_events: int = 0
    lane_events: int = 0
    transitions: int = 0
    publishes: int = 0
    policy_reloads: int = 0
    policy_errors: int = 0
    ignored_events: int = 0
    last_transitions: list[health.Transition] = field(default_factory=list)


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        *,
        topology_reader: TopologyReader = _read_topology,
        policy_loader: PolicyLoader = load_policy,
        planner: Planner = plan,
        source_factory: SourceFactory = default_sources,
        clock: Callable[[], int] = time.monotonic_ns,
        tracer: tracing.FailoverTracer | None = None,
        metrics: AgentMetrics | None = None,
    ) -> None:
        """``tracer``/``metrics``: given ones are used as they are; otherwise they are built
        from ``config`` (``traces``/``trace_file``, ``metrics_port``) and the process's
        ``OTEL_*`` environment variables (the OTLP exporters read theirs themselves)."""
        self.config = config
        self._read_topology = topology_reader
        self._load_policy = policy_loader
        self._plan = planner
        self._source_factory = source_factory
        self._clock = clock
        self.stats = AgentStats()
        self.policy = default_policy()
        self._policy_mtime: float | None = None
        self.topology: Topology | None = None
        self.model: health.HealthModel | None = None
        self.control: ControlPlane | None = None
        self._sources: list[SourceLike] = []
        self._started: list[SourceLike] = []
        self._inbox: asyncio.Queue[tuple[str, object]] = asyncio.Queue(8192)
        self._stop = asyncio.Event()
        self._alias: dict[str, str] = {}
        self._dirty = True
        self._loop: asyncio.AbstractEventLoop | None = None
        self.tracer = tracer
        self.metrics = metrics
        self.metrics_server: MetricsServer | None = None
        self._usdt: UsdtLaneTranslator | None = None
        self._socket_lane_pids: set[int] = set()  # plugins that report on agent.sock
        self._netns_ino = _netns_ino(os.getpid())
        self._same_netns: dict[int, bool] = {}
        self.lanes = LaneBook()
        self._burst = BurstGuard()
        self._status_dirty = True
        self._status_next = 0.0
        self._closing = threading.Event()  # background source start-ups undo themselves
        self._bg_start: asyncio.Task[None] | None = None
        self.sources_ready = asyncio.Event()  # every source started or given up

    def _now(self) -> float:
        return self._clock() / 1e9

    def request_stop(self) -> None:
        self._stop.set()

    # -- setup

    def _load_initial_policy(self) -> None:
        path = self.config.policy_path
        if path is None:
            return
        self.policy = self._load_policy(path)  # invalid at start: the caller exits 2
        self._policy_mtime = _mtime(path)
        log.info("policy %s loaded from %s", self.policy.name, path)

    def _maybe_reload_policy(self) -> None:
        path = self.config.policy_path
        if path is None:
            return
        mtime = _mtime(path)
        if mtime == self._policy_mtime:
            return
        self._policy_mtime = mtime
        try:
            new = self._load_policy(path)
        except Exception as e:  # keep the last good policy
            self.stats.policy_errors += 1
            log.warning("policy %s is invalid, keeping %s: %s", path, self.policy.name, e)
            return
        self.policy = new
        self.stats.policy_reloads += 1
        self._dirty = True
        if self.model is not None:
            self.model = health.HealthModel(new.health.params, self.model.nics)
        log.info("policy reloaded from %s", path)

    def _setup_model(self) -> None:
        topo = self._read_topology(self.config.sys_root, self.config.nics)
        if self.config.nics:
            wanted = set(self.config.nics)
            topo = _only(topo, wanted)
        if not topo.nics:
            raise AgentError("no NIC to manage (check --nic / the sysfs root)")
        self.topology = topo
        self._alias = aliases(topo)
        names = [ifname_of(n) for n in topo.nics]
        self.model = health.HealthModel.create(
            names,
            self._now(),
            self.policy.health.params,
            link_up={ifname_of(n): n.link_up for n in topo.nics},
        )

    def _setup_telemetry(self) -> None:
        """Metrics registry + endpoint and the failover tracer, as configured. A bad OTEL_*
        configuration or a busy port is an AgentError (exit 2); export failures later are not."""
        assert self.model is not None
        cfg = self.config
        names = list(self.model.nics)
        if self.metrics is None and cfg.metrics_port is not None:
            self.metrics = AgentMetrics(nics=names, sys_root=cfg.sys_root)
        if self.metrics is not None:
            self.metrics.set_nics(names)
            for nic, h in self.model.nics.items():
                self.metrics.nic_state_changed(nic, h.state.value)
        if self.tracer is None and (cfg.traces or cfg.trace_file is not None):
            try:
                sinks, _res = tracing.sinks_from_env(
                    os.environ if cfg.traces else {**os.environ, "OTEL_TRACES_EXPORTER": "none"},
                    trace_file=cfg.trace_file,
                )
            except tracing.TracingError as e:
                raise AgentError(str(e)) from e
            self.tracer = tracing.FailoverTracer(
                sinks, offset_ns=tracing.epoch_offset_ns(mono=self._clock)
            )
        if self.tracer is not None and self.metrics is not None:
            self.tracer.observers.append(self.metrics.observe_spans)
            self.metrics.set_tracer(self.tracer)
        if self.metrics is not None and cfg.metrics_port is not None:
            self.metrics_server = MetricsServer(self.metrics, cfg.metrics_port, cfg.metrics_addr)
            try:
                port = self.metrics_server.start()
            except MetricsError as e:
                raise AgentError(str(e)) from e
            log.info("metrics on http://%s:%d/metrics", cfg.metrics_addr, port)

    # -- the work

    def _publish(self) -> None:
        assert self.model is not None and self.topology is not None and self.control is not None
        t0 = self._clock()
        result = self._plan(self.topology, self.model.states, self.policy)
        nics, plans = to_published(self.model, self.topology, result)
        self.control.publish(nics, plans)
        self.stats.publishes += 1
        self._dirty = False
        for w in result.warnings:
            log.debug("plan: %s", w)
        if self.tracer is not None:
            for d in decisions(self.topology, result, self.policy.name, t0, self._clock()):
                self.tracer.decision(d)

    def _apply(self, ev: health.Event) -> None:
        assert self.model is not None
        try:
            self.model, tr = self.model.apply(ev)
        except health.HealthError as e:
            self.stats.ignored_events += 1
            log.debug("ignored %s: %s", ev, e)
            return
        if tr is not None:
            self._transition(tr)

    def _transition(self, tr: health.Transition) -> None:
        self.stats.transitions += 1
        self.stats.last_transitions = [*self.stats.last_transitions[-31:], tr]
        self._dirty = True
        log.info("%s: %s -> %s (%s)", tr.nic, tr.old.value, tr.new.value, tr.reason)
        if self.metrics is not None:
            self.metrics.transition(tr.nic, tr.new.value)
        if self.tracer is not None:
            t_ns = round(tr.t * 1e9)
            self.tracer.transition(
                tracing.StateChange(
                    tr.nic, tr.old.value, tr.new.value, tr.reason, t_ns, max(t_ns, self._clock())
                )
            )

    def _handle(self, kind: str, item: object) -> None:
        if kind == "source" and type(item).__name__ == "PluginLaneEvent":
            self.stats.source_events += 1
            self._usdt_lane_event(item)
            return
        if kind == "source":
            self.stats.source_events += 1
            hev = health_event_from_source(item, self._alias, self.lanes.port_nic)
            if hev is not None and hev.kind in ("carrier_down", "carrier_up"):
                # rare: which source saw it first is worth a line (eBPF runs ahead of netlink)
                log.info(
                    "%s: %s from %s (%s) ts_ns %d, %.3f ms ago",
                    hev.nic,
                    hev.kind,
                    getattr(item, "source", "?"),
                    getattr(item, "hook", "") or "-",
                    int(getattr(item, "ts_ns", 0)),
                    (self._clock() - int(getattr(item, "ts_ns", 0))) / 1e6,
                )
            if hev is not None and hev.kind in BAD_KINDS and self.tracer is not None:
                self.tracer.signal(
                    tracing.Signal(
                        hev.nic,
                        str(getattr(item, "source", "") or type(item).__name__),
                        hev.kind,
                        int(getattr(item, "ts_ns", 0)),
                        self._clock(),
                        str(getattr(item, "hook", "")),
                    )
                )
        else:
            assert isinstance(item, ReceivedEvent)
            self.stats.lane_events += 1
            hev = health_event_from_lane(item.event, self._alias)
            if hev is not None:
                hev = self._burst.filter(hev, item.peer.pid)
            self._book_lane(item.event, item.peer.pid)
            if item.event.type is not EventType.LANE_TIMEOUT:
                self._socket_lane_pids.add(item.peer.pid)
            if self.metrics is not None:
                self.metrics.lane_event(item.event, item.peer.pid)
            if self.tracer is not None:  # before the health model: the signal opens the span
                self.tracer.lane_event(item.event, item.peer.pid, self._clock())
        if hev is None:
            self.stats.ignored_events += 1
        else:
            self._apply(hev)

    def _book_lane(self, ev: LaneEvent, pid: int) -> None:
        """Lane bookkeeping for status.json and the TCP probe's port map."""
        added, removed = self.lanes.update(ev, pid)
        if ev.type is not EventType.LANE_TIMEOUT or removed:
            self._status_dirty = True
        if not added and not removed:
            return
        for src in self._sources:
            add, rm = getattr(src, "add_port", None), getattr(src, "remove_port", None)
            if not callable(add) or not callable(rm):
                continue
            try:
                for port in added:
                    add(port)
                for port in removed:
                    rm(port)
            except Exception as e:  # a map update must not stop the loop
                log.debug("TCP probe port map: %s", e)

    def _maybe_write_status(self, now: float) -> None:
        if not self._status_dirty or now < self._status_next or self.control is None:
            return
        self._status_dirty = False
        self._status_next = now + self.config.status_interval_s
        try:
            write_status(
                self.control.run_dir / STATUS_FILE,
                self.lanes.status(agent_pid=os.getpid(), now_ns=self._clock()),
            )
        except OSError as e:
            log.debug("status.json: %s", e)

    def _usdt_lane_event(self, ev: object) -> None:
        """A plugin USDT probe: a lane event for traces and metrics (not for the health
        model), from plugins of this node's netns that do not report on agent.sock."""
        if self.tracer is None and self.metrics is None:
            return
        pid = int(getattr(ev, "pid", 0))
        if pid in self._socket_lane_pids or not self._in_my_netns(pid):
            return
        if self._usdt is None:
            self._usdt = UsdtLaneTranslator(self.config.plugin_nics)
        le = self._usdt.translate(ev)
        if le is None:
            return
        if self.metrics is not None:
            self.metrics.lane_event(le, pid)
        if self.tracer is not None:
            self.tracer.lane_event(le, pid, self._clock())

    def _in_my_netns(self, pid: int) -> bool:
        same = self._same_netns.get(pid)
        if same is None:
            ino = _netns_ino(pid)
            same = ino is None or self._netns_ino is None or ino == self._netns_ino
            if len(self._same_netns) > 4096:
                self._same_netns.clear()
            self._same_netns[pid] = same
        return same

    def _emit_source(self, ev: object) -> None:
        """Emit callback for sources: safe from any thread; a full inbox drops (counted)."""
        loop = self._loop
        if loop is None:
            return

        def put() -> None:
            try:
                self._inbox.put_nowait(("source", ev))
            except asyncio.QueueFull:
                self.stats.ignored_events += 1

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            put()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(put)

    async def _pump_lane_events(self) -> None:
        assert self.control is not None
        async for rx in self.control.events():
            with contextlib.suppress(asyncio.QueueFull):
                self._inbox.put_nowait(("lane", rx))

    async def run(self) -> int:
        """Runs until a stop request, a signal or ``duration_s``; returns the exit status."""
        self._loop = asyncio.get_running_loop()
        self._load_initial_policy()
        self._setup_model()
        self.control = ControlPlane(
            self.config.run_dir,
            heartbeat_ms=self.config.heartbeat_ms,
            owner_uid=self.config.owner_uid,
        )
        await self.control.start()
        try:
            self._setup_telemetry()
        except BaseException:
            await self.control.close(timeout=1.0)
            raise
        if self.metrics is not None:
            self.metrics.set_control(lambda: self.control.counters if self.control else None)
        if self.config.usdt_lib is not None:
            nics = list(self.config.plugin_nics)
            if not nics:
                try:  # pyroute2's sync API runs its own loop: not on this one
                    nics = await asyncio.to_thread(plugin_nic_order)
                except Exception as e:
                    log.warning("cannot list this netns's NICs for USDT lane events: %s", e)
            self._usdt = UsdtLaneTranslator(nics)
            log.info("USDT lane events: plugin NIC order %s", ",".join(nics) or "unknown")
        installed = _install_signals(self._loop, self.request_stop)
        pump = asyncio.create_task(self._pump_lane_events(), name="railhop-lane-events")
        try:
            self._publish()
            await self._start_sources()
            await self._loop_until_stopped()
        finally:
            for sig in installed:
                self._loop.remove_signal_handler(sig)
            await self._shutdown(pump)
        return 0

    async def _start_sources(self) -> None:
        """Starts the quick sources now; eBPF ones (trial child + bcc compile: seconds to
        minutes) start in the background while the loop already serves events and heartbeats."""
        assert self.topology is not None
        self._sources = self._source_factory(self.config, self.topology, self.policy)
        slow = [s for s in self._sources if _slow_start(s)]
        for s in self._sources:
            if s in slow:
                continue
            try:
                caps = await asyncio.wait_for(s.start(self._emit_source), 30)
            except Exception as e:
                log.warning("source %s failed to start: %s", s.name, e)
                continue
            self._source_up(s, caps)
        if slow:
            self._bg_start = asyncio.create_task(self._start_slow(slow), name="railhop-ebpf-start")
        else:
            self.sources_ready.set()

    def _source_up(self, s: SourceLike, caps: Sequence[Any]) -> None:
        self._started.append(s)
        attached = not caps or any(getattr(c, "attached", True) for c in caps)
        if self.metrics is not None:
            self.metrics.sources.labels(s.name).set(1 if attached else 0)
            stats = getattr(s, "lane_stats", None)
            if callable(stats):
                self.metrics.set_lane_stats(stats)
        for c in caps:  # the capability report, logged once
            line = getattr(c, "line", None)
            log.info("%s", line() if callable(line) else c)

    async def _start_slow(self, slow: Sequence[SourceLike]) -> None:
        try:
            for s in slow:
                t0 = time.monotonic()
                try:
                    caps = await asyncio.wait_for(
                        self._start_in_thread(s), self.config.ebpf_start_timeout_s
                    )
                except Exception as e:
                    log.warning("source %s failed to start: %s", s.name, e or type(e).__name__)
                    continue
                if self._closing.is_set():
                    return
                log.info("source %s started in %.1f s", s.name, time.monotonic() - t0)
                self._source_up(s, caps)
        finally:
            self.sources_ready.set()

    def _start_in_thread(self, s: SourceLike) -> asyncio.Future[list[Any]]:
        """``s.start_sync`` in a daemon thread (unlike asyncio.to_thread, a stuck compile
        never delays the agent's exit); a start that finishes after shutdown began is undone
        in that thread."""
        start_sync = getattr(s, "start_sync", None)
        if not callable(start_sync):
            return asyncio.ensure_future(s.start(self._emit_source))
        loop = asyncio.get_running_loop()
        bind = getattr(s, "bind_loop", None)
        if callable(bind):  # eBPF: records are read on this loop, next to netlink's socket
            bind(loop)
        fut: asyncio.Future[list[Any]] = loop.create_future()

        def deliver(res: list[Any] | None, exc: BaseException | None) -> None:
            if fut.done():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(res or [])

        def work() -> None:
            res: list[Any] | None = None
            exc: BaseException | None = None
            try:
                res = list(start_sync(self._emit_source))
            except Exception as e:
                exc = e
            if self._closing.is_set():
                _stop_quietly(s)
                return
            try:
                loop.call_soon_threadsafe(deliver, res, exc)
            except RuntimeError:  # the loop is gone
                _stop_quietly(s)

        threading.Thread(target=work, name=f"rh-start-{s.name}", daemon=True).start()
        return fut

    async def _loop_until_stopped(self) -> None:
        assert self.model is not None
        end = None if self.config.duration_s is None else self._now() + self.config.duration_s
        next_reload = self._now() + self.config.reload_interval_s
        while not self._stop.is_set():
            now = self._now()
            if end is not None and now >= end:
                break
            wake = [next_reload]
            if self._status_dirty:
                wake.append(self._status_next)
            if self.tracer is not None and self.tracer.assembler.open_failovers:
                wake.append(now + 1.0)  # tracing timers (fail-back grace, escalation)
            if end is not None:
                wake.append(end)
            deadline = self.model.next_deadline()
            if deadline is not None:
                wake.append(deadline)
            timeout = max(0.0, min(wake) - now)
            get = asyncio.ensure_future(self._inbox.get())
            stop = asyncio.ensure_future(self._stop.wait())
            done, _ = await asyncio.wait(
                {get, stop}, timeout=timeout, return_when="FIRST_COMPLETED"
            )
            stop.cancel()
            if get in done:
                self._handle(*get.result())
                while not self._inbox.empty():  # drain a burst before publishing once
                    self._handle(*self._inbox.get_nowait())
            else:
                get.cancel()
            now = self._now()
            self.model, trs = self.model.tick(now)
            for tr in trs:
                self._transition(tr)
            if self.tracer is not None:
                self.tracer.tick(self._clock())
            if now >= next_reload:
                next_reload = now + self.config.reload_interval_s
                self._maybe_reload_policy()
                if self.metrics is not None:
                    self.metrics.prune()
            if self._dirty:
                self._publish()
            self._maybe_write_status(now)

    async def _shutdown(self, pump: asyncio.Task[None]) -> None:
        budget = self.config.shutdown_timeout_s
        t0 = time.monotonic()
        self._closing.set()
        if self._bg_start is not None and not self._bg_start.done():
            self._bg_start.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._bg_start, 1.0)
        for s in reversed(self._started):
            left = max(0.1, budget - (time.monotonic() - t0))
            try:
                await asyncio.wait_for(s.stop(), left)
            except Exception as e:  # shutdown must finish
                log.warning("source %s did not stop cleanly: %s", s.name, e)
        self._started.clear()
        if self.control is not None:
            await self.control.close(timeout=max(0.1, budget - (time.monotonic() - t0)))
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(pump, 1.0)
        if self.tracer is not None:  # open failovers end now; export bounded by what is left
            left = max(0.1, budget - (time.monotonic() - t0))
            tracer = self.tracer
            await asyncio.to_thread(tracer.shutdown, self._clock(), left)
        if self.metrics_server is not None:
            self.metrics_server.stop(1.0)


BAD_KINDS = frozenset(
    {"carrier_down", "device_fatal", "admin_down", *health.SOFT_KINDS}
)  # health event kinds that count as a failover's detection signals


def decisions(
    topo: Topology, result: Plan, policy: str, start_ns: int, end_ns: int
) -> list[tracing.Decision]:
    """Pure: the plan entries of not-usable NICs as tracing decisions (keyed by ifname)."""
    by_name = {n.name: n for n in topo.nics}
    out = []
    for e in result.entries:
        owner = by_name.get(e.nic)
        if owner is None:
            continue
        pairs = []
        for p in e.pairs:
            local = by_name.get(p.local)
            pairs.append(
                tracing.Pair(
                    local=ifname_of(local) if local is not None else p.local,
                    rail=p.remote[0],
                    plane=p.remote[1],
                    weight=p.weight,
                    distance=p.distance.name,
                )
            )
        out.append(
            tracing.Decision(
                ifname_of(owner), policy, e.action, tuple(pairs), start_ns, max(start_ns, end_ns)
            )
        )
    return out


def _slow_start(s: SourceLike) -> bool:
    """eBPF sources (kernel hooks: trial child + compile) start in the background."""
    return s.name.startswith("ebpf.")


def _stop_quietly(s: object) -> None:
    stop_sync = getattr(s, "stop_sync", None)
    if callable(stop_sync):
        with contextlib.suppress(Exception):
            stop_sync()


def _netns_ino(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _mtime(path: Path) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _only(topo: Topology, wanted: set[str]) -> Topology:
    return dataclasses.replace(topo, nics=tuple(n for n in topo.nics if n.names & wanted))


def _install_signals(
    loop: asyncio.AbstractEventLoop, stop: Callable[[], None]
) -> list[signal.Signals]:
    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop)
        except (NotImplementedError, RuntimeError, ValueError):
            continue  # not the main thread: the caller stops us with request_stop()
        installed.append(sig)
    return installed


def run_agent(config: AgentConfig, **kw: Any) -> int:
    """Blocking entry point for the CLI."""
    return asyncio.run(Agent(config, **kw).run())


def parse_nics(values: Iterable[str]) -> tuple[str, ...]:
    """``--nic a,b --nic c`` -> ("a", "b", "c")."""
    return tuple(x for v in values for x in v.split(",") if x)
