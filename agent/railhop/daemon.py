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
import logging
import math
import os
import signal
import socket
import time
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
    sources: tuple[str, ...] = ("netlink", "sysfs")  # which default sources to start
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
    """netlink link events and sysfs counters for the managed netdevs; a source whose module
    cannot be imported is logged and left out (the others carry on)."""
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


def health_event_from_source(ev: object, alias: Mapping[str, str]) -> health.Event | None:
    """A source event (railhop.sources.events) as a health-model event, or None when it says
    nothing about a managed NIC's health. Matched by class name so that this module does not
    need the sources package."""
    kind = type(ev).__name__
    t = getattr(ev, "ts_ns", 0) / 1e9
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
    on the lane's local NIC (the state machine decides when they mean DOWN)."""
    nic = alias.get(ev.nic)
    if nic is None:
        return None
    t = ev.t_ns / 1e9
    if ev.type is EventType.LANE_TIMEOUT:
        return health.LaneTimeout(nic, t, detail=f"pid {ev.pid} conn {ev.conn_id}")
    if ev.type is EventType.LANE_ERROR:
        return health.LaneError(nic, t, detail=f"pid {ev.pid} conn {ev.conn_id} errno {ev.error}")
    return None


def _signed(v: int) -> int:
    """A USDT argument read as unsigned 64-bit back to its signed value."""
    return v - (1 << 64) if v >= 1 << 63 else v


class UsdtLaneTranslator:
    """The plugin's USDT lane probes (``railhop.sources.events.PluginLaneEvent``) as lane
    events, for traces and metrics when the plugin does not report on ``agent.sock``. Pure
    (state: which NIC each lane uses). Probe arguments (plugin/src/probes.h):
    lane_up(conn, lane, lnic, rnic), lane_down(conn, lane, lnic, err),
    failover_start(conn, lane, err), failover_end(conn, epoch, nactive), failback(conn, lane);
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
                state=_STATE[h.state],
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
            hev = health_event_from_source(item, self._alias)
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
        assert self.topology is not None
        self._sources = self._source_factory(self.config, self.topology, self.policy)
        for s in self._sources:
            try:
                caps = await asyncio.wait_for(s.start(self._emit_source), 30)
            except Exception as e:
                log.warning("source %s failed to start: %s", s.name, e)
                continue
            self._started.append(s)
            if self.metrics is not None:
                self.metrics.sources.labels(s.name).set(1)
                stats = getattr(s, "lane_stats", None)
                if callable(stats):
                    self.metrics.set_lane_stats(stats)
            for c in caps:
                line = getattr(c, "line", None)
                log.info("%s", line() if callable(line) else c)

    async def _loop_until_stopped(self) -> None:
        assert self.model is not None
        end = None if self.config.duration_s is None else self._now() + self.config.duration_s
        next_reload = self._now() + self.config.reload_interval_s
        while not self._stop.is_set():
            now = self._now()
            if end is not None and now >= end:
                break
            wake = [next_reload]
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

    async def _shutdown(self, pump: asyncio.Task[None]) -> None:
        budget = self.config.shutdown_timeout_s
        t0 = time.monotonic()
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
