"""The agent's loop: one asyncio process that moves data between the sources, the plugins'
lane events, the health model, the planner and the published table (see :mod:`railhop.daemon`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from railhop import health, tracing
from railhop.control import ControlPlane, EventType, LaneEvent, NicHealth, ReceivedEvent
from railhop.control.rundir import write_file_at
from railhop.control.status import STATUS_FILE, rail_counts
from railhop.daemon.config import AgentConfig, AgentError, with_absolute_paths
from railhop.daemon.lanes import LaneBook, status_bytes
from railhop.daemon.nodestatus import (
    NFD_FEATURE_FILE,
    NODE_STATUS_FILE,
    NodeStatus,
    format_node_status,
    nfd_features,
    node_status,
)
from railhop.daemon.privileges import (
    drop_all_in_this_thread,
    drop_capabilities,
    privileges,
    unprivileged,
)
from railhop.daemon.publish import decisions, node_settings, to_published
from railhop.daemon.sockdiag import Claim, PortChecker
from railhop.daemon.translate import (
    BAD_KINDS,
    BurstGuard,
    UsdtLaneTranslator,
    aliases,
    health_event_from_lane,
    health_event_from_source,
    health_event_from_verbs,
    ifname_of,
)
from railhop.jobs import JobCache
from railhop.metrics import AgentMetrics, MetricsError, MetricsServer
from railhop.policy import Plan, Policy, default_policy, load_policy, plan
from railhop.procs import effective_uid, netns_ino
from railhop.sources.base import (
    CapabilitiesChange,
    Capability,
    Registry,
    Source,
    source_attached,
)
from railhop.sources.catalogue import SourceOptions, build_sources
from railhop.sources.events import Event as SourceEvent
from railhop.sources.events import PluginLaneEvent, VerbsAsync, VerbsWcError
from railhop.topology import Topology, read_topology
from railhop.tracing.export_health import ExportHealth

log = logging.getLogger("railhop.agent")


@runtime_checkable
class PortMapped(Protocol):
    """A source that watches the plugins' lane sockets by local port (the eBPF TCP probe)."""

    def add_port(self, port: int, remote: bool = False) -> None: ...

    def remove_port(self, port: int) -> None: ...


@runtime_checkable
class LaneStatsSource(Protocol):
    """A source with per-lane bytes and latency (the plugin's USDT probes)."""

    def lane_stats(self) -> Sequence[Any]: ...


@runtime_checkable
class CompletionStatsSource(Protocol):
    """A source with per (pid, plugin NIC index) verbs completion totals (USDT verbs_wc)."""

    def completion_stats(self) -> Sequence[Any]: ...


TopologyReader = Callable[[Path, Sequence[str]], Topology]
PolicyLoader = Callable[[Path], Policy]
Planner = Callable[[Topology, Mapping[str, health.NicState], Policy], Plan]
SourceFactory = Callable[[AgentConfig, Topology, Policy], list[Source]]
Inbound = SourceEvent | ReceivedEvent  # what the loop's inbox carries


def _read_topology(root: Path, nics: Sequence[str]) -> Topology:
    return read_topology(root, netdevs=nics)


AGENT_GROUPS = frozenset({"netlink", "sysfs", "ebpf", "rdma", "verbs"})  # ``--sources`` names
RDMA_GROUPS = frozenset({"rdma", "verbs"})  # started only where a managed NIC is an RDMA device


def default_sources(config: AgentConfig, topo: Topology, policy: Policy) -> list[Source]:
    """The catalogue's sources (:mod:`railhop.sources.catalogue`) of the groups
    ``config.sources`` names, for the managed netdevs: netlink link events, sysfs counters (when
    the policy sets thresholds), the eBPF carrier and TCP-lane probes (kept to this agent's
    netns: kernel hooks see every netns), and, where a managed NIC is an RDMA device, the
    RDMA/driver eBPF probes (started in the background with the same trial and capability
    report as the other eBPF sources) and the verbs async events of those devices; the
    plugin's USDT probes when ``usdt_lib`` is set. A source whose module cannot be imported is
    logged and left out."""
    groups = set(config.sources) & AGENT_GROUPS
    if not policy.health.counters:
        groups.discard("sysfs")
    rdma_devices = sorted({n.rdma_device for n in topo.nics if n.rdma_device})
    if not rdma_devices and groups & RDMA_GROUPS:
        log.info("no managed NIC is an RDMA device: RDMA driver and verbs sources not started")
        groups -= RDMA_GROUPS
    if config.usdt_lib is not None:
        groups.add("usdt")
    options = SourceOptions(
        ifnames=[ifname_of(n) for n in topo.nics],
        thresholds=dict(policy.health.counters),
        counters_root=str(config.sys_root),
        hooks_netns="self",
        plugin_lib=config.usdt_lib,
        rdma_devices=rdma_devices,
    )
    return build_sources(options, groups)


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
    status_write_errors: int = 0
    node_status_writes: int = 0
    node_status_write_errors: int = 0
    nfd_write_errors: int = 0
    metrics_bind_failures: int = 0
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
        wall_clock: Callable[[], float] = time.time,
        tracer: tracing.FailoverTracer | None = None,
        metrics: AgentMetrics | None = None,
        port_check: Callable[[Collection[Claim]], set[Claim]] | None = None,
    ) -> None:
        """``tracer``/``metrics``: given ones are used as they are; otherwise they are built
        from ``config`` (``traces``/``trace_file``, ``metrics_port``) and the process's
        ``OTEL_*`` environment variables (the OTLP exporters read theirs themselves).
        ``port_check``: which lane-port claims ``(uid, nic, port)`` the kernel backs; by
        default sock_diag over the managed NICs (:class:`railhop.daemon.sockdiag.PortChecker`)."""
        self.config = with_absolute_paths(config)  # libbcc changes the cwd while it compiles
        self._read_topology = topology_reader
        self._load_policy = policy_loader
        self._plan = planner
        self._source_factory = source_factory
        self._clock = clock
        self._wall = wall_clock  # CLOCK_REALTIME: node-status's heartbeat, NFD's expiry
        self.stats = AgentStats()
        self.policy = default_policy()
        self._policy_mtime: float | None = None
        self.topology: Topology | None = None
        self.model: health.HealthModel | None = None
        self.control: ControlPlane | None = None
        self.sources = Registry(log_capabilities=False)  # logged at INFO by _source_up
        self._inbox: asyncio.Queue[Inbound] = asyncio.Queue(8192)
        self._stop = asyncio.Event()
        self._alias: dict[str, str] = {}
        self._dirty = True
        self._loop: asyncio.AbstractEventLoop | None = None
        self.tracer = tracer
        self.metrics = metrics
        self.metrics_server: MetricsServer | None = None
        self._usdt: UsdtLaneTranslator | None = None
        self._socket_lane_pids: set[int] = set()  # plugins that report on agent.sock
        self._peer_uid: dict[int, int] = {}  # pid -> uid, as SO_PEERCRED gave it on agent.sock
        self._netns_ino = netns_ino(os.getpid())
        self._same_netns: dict[int, bool] = {}
        self.lanes = LaneBook()
        self._port_check = port_check
        self._claims: dict[int, Claim] = {}  # lane ports waiting for the kernel's word
        self._claims_next = 0.0
        self.port_check_errors = 0
        self._burst = BurstGuard()
        self._status_dirty = True
        self._status_next = 0.0
        self._reload_now = False
        self.export_health: list[ExportHealth] = []  # one per OTLP exporter
        # pid -> job (pod UID, QoS, container, Slurm job) of the plugins' processes
        self.jobs = JobCache()
        self._export_seen: tuple[tuple[int, int], ...] = ()
        self._wake = asyncio.Event()
        self._metrics_retry: asyncio.Task[None] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._published: list[NicHealth] = []  # the table's NICs as last published
        self._node_status_next = 0.0  # monotonic seconds: rewrite node-status by then

    def _now(self) -> float:
        return self._clock() / 1e9

    def request_stop(self) -> None:
        self._stop.set()

    def request_reload(self) -> None:
        """SIGHUP: re-read the policy file now (even when its mtime did not change)."""
        self._policy_mtime = None
        self._reload_now = True
        self._wake.set()

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
        source = self.config.nics_from or ("--nic" if self.config.nics else "auto-detection")
        if not topo.nics:
            raise AgentError(
                f"no NIC to manage (NICs from {source}: "
                f"{','.join(self.config.nics) or 'none found'}; check --nic / RAILHOP_NICS / "
                "the sysfs root)"
            )
        log.info("managing NICs %s (from %s)", ",".join(ifname_of(n) for n in topo.nics), source)
        self.topology = topo
        self._alias = aliases(topo)
        names = [ifname_of(n) for n in topo.nics]
        if self._port_check is None:
            self._port_check = PortChecker.for_nics(names, self.config.sys_root)
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
            env = os.environ if cfg.traces else {**os.environ, "OTEL_TRACES_EXPORTER": "none"}

            def make_sinks() -> Any:
                return tracing.sinks_from_env(
                    env, trace_file=cfg.trace_file, health=self.export_health
                )

            try:
                # the exporters' threads never need a capability: started without any
                sinks, _res = unprivileged(make_sinks) if cfg.drop_capabilities else make_sinks()
            except tracing.TracingError as e:
                raise AgentError(str(e)) from e
            topo = self.topology
            hw_ids = {ifname_of(n): n.pci.bdf for n in topo.nics if n.pci} if topo else {}
            self.tracer = tracing.FailoverTracer(
                sinks,
                offset_ns=tracing.epoch_offset_ns(mono=self._clock),
                config=tracing.AssemblerConfig(hw_ids=hw_ids),
            )
        if self.tracer is not None:
            self.tracer.enrich = self.jobs.enrich  # failovers attributed to the job
        if self.tracer is not None and self.metrics is not None:
            self.tracer.observers.append(self.metrics.observe_spans)
            self.metrics.set_tracer(self.tracer)
        if self.metrics is not None and cfg.metrics_port is not None:
            self.metrics_server = MetricsServer(self.metrics, cfg.metrics_port, cfg.metrics_addr)
            if not self._start_metrics_server():
                # a busy port (another agent, a stale scrape proxy) must not stop the node's
                # failover: keep running and try again in the background
                self._metrics_retry = asyncio.ensure_future(self._retry_metrics_server())

    def _start_metrics_server(self) -> bool:
        assert self.metrics_server is not None
        cfg = self.config
        server = self.metrics_server
        try:
            # its serving and request threads never need a capability: started without any
            port = unprivileged(server.start) if cfg.drop_capabilities else server.start()
        except MetricsError as e:
            self.stats.metrics_bind_failures += 1
            if self.stats.metrics_bind_failures == 1:
                log.warning(
                    "%s: running without metrics, retrying every %.0f s",
                    e,
                    cfg.metrics_retry_s,
                )
            return False
        log.info("metrics on http://%s:%d/metrics", cfg.metrics_addr, port)
        return True

    async def _retry_metrics_server(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.config.metrics_retry_s)
            if self._stop.is_set() or self._start_metrics_server():
                return

    # -- the work

    def _publish(self) -> None:
        assert self.model is not None and self.topology is not None and self.control is not None
        t0 = self._clock()
        result = self._plan(self.topology, self.model.states, self.policy)
        nics, plans = to_published(self.model, self.topology, result)
        settings = node_settings(self.policy)
        self.control.publish(nics, plans, settings)
        self.stats.publishes += 1
        if self.metrics is not None:
            self.metrics.set_rails(*rail_counts(nics, settings.min_rails_up))
        self._dirty = False
        self._published = list(nics)
        self._node_status_next = 0.0  # health (or the policy's minimum) changed: now
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

    def _handle(self, item: Inbound) -> None:
        match item:
            case ReceivedEvent():
                hev = self._lane_event(item)
            case PluginLaneEvent():
                self.stats.source_events += 1
                self._usdt_lane_event(item)
                return
            case VerbsWcError() | VerbsAsync():
                self.stats.source_events += 1
                hev = self._verbs_event(item)
            case _:
                self.stats.source_events += 1
                hev = self._source_event(item)
        if hev is None:
            self.stats.ignored_events += 1
        else:
            self._apply(hev)

    def _source_event(self, ev: SourceEvent) -> health.Event | None:
        hev = health_event_from_source(ev, self._alias, self.lanes.port_nic)
        if hev is not None and hev.kind in ("carrier_down", "carrier_up"):
            # rare: which source saw it first is worth a line (eBPF runs ahead of netlink)
            log.info(
                "%s: %s from %s (%s) ts_ns %d, %.3f ms ago",
                hev.nic,
                hev.kind,
                ev.source,
                ev.hook or "-",
                ev.ts_ns,
                (self._clock() - ev.ts_ns) / 1e6,
            )
        if hev is not None and hev.kind in BAD_KINDS and self.tracer is not None:
            self.tracer.signal(
                tracing.Signal(
                    hev.nic,
                    ev.source or type(ev).__name__,
                    hev.kind,
                    ev.ts_ns,
                    self._clock(),
                    ev.hook,
                )
            )
        return hev

    def _lane_event(self, rx: ReceivedEvent) -> health.Event | None:
        self.stats.lane_events += 1
        pid = rx.peer.pid
        if len(self._peer_uid) > 4096:
            self._peer_uid.clear()
        self._peer_uid[pid] = rx.peer.uid
        # the reporter, as the kernel names it (SO_PEERCRED): the health model wants two of
        # them (or a kernel signal) before a lane signal takes a NIC down node-wide
        hev = health_event_from_lane(
            rx.event, self._alias, source=f"uid {rx.peer.uid} pid {rx.peer.pid}"
        )
        if hev is not None:
            hev = self._burst.filter(hev, pid)
        self._book_lane(rx.event, pid, rx.peer.uid)
        if rx.event.type is not EventType.LANE_TIMEOUT:
            self._socket_lane_pids.add(pid)
        if self.tracer is not None:
            self.jobs.remember(pid)  # while the process lives: its spans may end after it
        if self.metrics is not None:
            self.metrics.lane_event(rx.event, pid)
        if self.tracer is not None:  # before the health model: the signal opens the span
            self.tracer.lane_event(rx.event, pid, self._clock())
        return hev

    MAX_CLAIMS = 65536
    CLAIM_CHECK_S = 0.05  # claims are checked in batches: one kernel walk per batch

    def _book_lane(self, ev: LaneEvent, pid: int, uid: int) -> None:
        """Lane bookkeeping for status.json; the lane's ports become claims that
        :meth:`_check_claims` verifies before they enter the TCP probe's port map."""
        added, removed = self.lanes.update(ev, pid, uid)
        if ev.type is not EventType.LANE_TIMEOUT or removed:
            self._status_dirty = True
        for port in added:
            if len(self._claims) < self.MAX_CLAIMS:
                self._claims[port] = (uid, ev.nic, port)
        for port in removed:
            self._claims.pop(port, None)
        self._update_port_maps([], removed)

    def _check_claims(self, now: float) -> None:
        """Asks the kernel (sock_diag) who holds the claimed ports: a port enters the port map
        only when a socket of the claimant's uid bound to that NIC holds it, within the uid's
        quota (:meth:`LaneBook.confirm`)."""
        if not self._claims or now < self._claims_next or self._port_check is None:
            return
        self._claims_next = now + self.CLAIM_CHECK_S
        batch = list(self._claims.values())
        self._claims.clear()
        try:
            owned = self._port_check(batch)
        except OSError as e:
            self.port_check_errors += 1
            if self.port_check_errors == 1:
                log.warning("cannot check lane ports with sock_diag (not mapped): %s", e)
            return
        mapped = self.lanes.confirm([c for c in batch if c in owned])
        if len(owned) < len(batch):
            log.debug(
                "lane ports not held by their claimant on that NIC: %d", len(batch) - len(owned)
            )
        self._update_port_maps(mapped, [])

    def _update_port_maps(self, added: Sequence[int], removed: Sequence[int]) -> None:
        if not added and not removed:
            return
        for src in self.sources.sources():
            if not isinstance(src, PortMapped):
                continue
            try:
                for port in added:
                    src.add_port(port)
                for port in removed:
                    src.remove_port(port)
            except Exception as e:  # a map update must not stop the loop
                log.debug("TCP probe port map: %s", e)

    def _status_doc(self) -> dict[str, Any]:
        doc = self.lanes.status(agent_pid=os.getpid(), now_ns=self._clock())
        doc["export"] = [h.as_dict() for h in self.export_health]
        doc["privileges"] = privileges()
        return doc

    def _maybe_write_status(self, now: float) -> None:
        seen = tuple((h.ok_batches, h.failed_batches) for h in self.export_health)
        if seen != self._export_seen:
            self._export_seen = seen
            self._status_dirty = True
        if not self._status_dirty or now < self._status_next or self.control is None:
            return
        self._status_dirty = False
        self._status_next = now + self.config.status_interval_s
        try:
            self.control.write_file(STATUS_FILE, status_bytes(self._status_doc()))
        except OSError as e:  # counted by the control plane (railhop_control_file_write_errors)
            self.stats.status_write_errors += 1
            log.warning("cannot write %s in %s: %s", STATUS_FILE, self.control.run_dir, e)

    def _write_node_status(self, now: float, gone: bool = False) -> None:
        """``node-status`` (and the NFD feature file when configured): after every publish,
        at least every ``node_status_interval_s``, and once with ``gone`` at shutdown (the
        NFD file is then removed). A failed write is logged and counted, never fatal."""
        cfg = self.config
        self._node_status_next = now + max(0.05, cfg.node_status_interval_s)
        if self.control is None or not self._published:
            return
        wall = self._wall()
        refresh_s = max(1, round(cfg.node_status_interval_s + 0.499))  # whole seconds, up
        st = node_status(
            self._published,
            self.policy.health.min_rails_up,
            heartbeat_s=int(wall),
            refresh_s=refresh_s,
            agent_pid=os.getpid(),
            gone=gone,
        )
        try:
            self.control.write_file(NODE_STATUS_FILE, format_node_status(st))
            self.stats.node_status_writes += 1
        except OSError as e:
            self.stats.node_status_write_errors += 1
            if self.stats.node_status_write_errors == 1:
                log.warning("cannot write %s in %s: %s", NODE_STATUS_FILE, self.control.run_dir, e)
        if cfg.nfd_features_dir is not None:
            self._write_nfd(cfg.nfd_features_dir, st, int(wall), refresh_s, gone)

    NFD_EXPIRY_REFRESHES = 12  # a dead agent's labels expire after 12 missed rewrites (60 s)
    NFD_EXPIRY_MIN_S = 60

    def _write_nfd(self, d: Path, st: NodeStatus, wall: int, refresh_s: int, gone: bool) -> None:
        path = d / NFD_FEATURE_FILE
        try:
            if gone:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                return
            d.mkdir(mode=0o755, parents=True, exist_ok=True)
            ttl = max(self.NFD_EXPIRY_MIN_S, self.NFD_EXPIRY_REFRESHES * refresh_s)
            write_file_at(path, nfd_features(st, wall + ttl))
        except OSError as e:
            self.stats.nfd_write_errors += 1
            if self.stats.nfd_write_errors == 1:
                log.warning("cannot write the NFD feature file %s: %s", path, e)

    def _usdt_lane_event(self, ev: PluginLaneEvent) -> None:
        """A plugin USDT probe: a lane event for traces and metrics (not for the health
        model), from plugins of this node's netns that do not report on agent.sock."""
        if self.tracer is None and self.metrics is None:
            return
        pid = ev.pid
        if pid in self._socket_lane_pids or not self._in_my_netns(pid):
            return
        if self._usdt is None:
            self._usdt = UsdtLaneTranslator(self.config.plugin_nics)
        le = self._usdt.translate(ev)
        if le is None:
            return
        if self.tracer is not None:
            self.jobs.remember(pid)
        if self.metrics is not None:
            self.metrics.lane_event(le, pid)
        if self.tracer is not None:
            self.tracer.lane_event(le, pid, self._clock())

    def _plugin_nics(self) -> Sequence[str]:
        return self._usdt.nics if self._usdt is not None else self.config.plugin_nics

    def _reporter(self, pid: int) -> str:
        """The health model's name for process ``pid``, the same string its reports on
        agent.sock carry (``uid U pid P``): one process must never count as two reporters."""
        uid = self._peer_uid.get(pid)
        if uid is None:
            uid = effective_uid(pid)
        return f"uid {uid if uid is not None else '?'} pid {pid}"

    def _verbs_event(self, ev: VerbsWcError | VerbsAsync) -> health.Event | None:
        """A verbs lane's error completion or async event (USDT ``usdt.verbs``), from a process
        of this node's netns: counted in the metrics; an error completion whose status says
        something about the NIC is evidence for the health model, weighed like a lane error the
        process reported itself (:func:`health_event_from_verbs`, then the burst guard)."""
        if not self._in_my_netns(ev.pid):
            return None
        nics = self._plugin_nics()
        name = nics[ev.nic] if 0 <= ev.nic < len(nics) else None
        device = self._alias.get(name, name) if name is not None else None
        if self.metrics is not None:
            if isinstance(ev, VerbsWcError):
                self.metrics.verbs_error(device or "unknown", ev.status_name)
            else:
                self.metrics.verbs_async(device or "unknown", ev.event)
        if not isinstance(ev, VerbsWcError):
            return None  # port and device events: the agent's own verbs source hears them
        hev = health_event_from_verbs(ev, nics, self._alias, self._reporter(ev.pid))
        if hev is None:
            return None
        return self._burst.filter(hev, ev.pid)

    def _in_my_netns(self, pid: int) -> bool:
        same = self._same_netns.get(pid)
        if same is None:
            ino = netns_ino(pid)
            same = ino is None or self._netns_ino is None or ino == self._netns_ino
            if len(self._same_netns) > 4096:
                self._same_netns.clear()
            self._same_netns[pid] = same
        return same

    def _emit_source(self, ev: SourceEvent) -> None:
        """Emit callback for sources: safe from any thread; a full inbox drops (counted)."""
        loop = self._loop
        if loop is None:
            return

        def put() -> None:
            try:
                self._inbox.put_nowait(ev)
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
                self._inbox.put_nowait(rx)

    async def run(self) -> int:
        """Runs until a stop request, a signal or ``duration_s``; returns the exit status."""
        self._loop = asyncio.get_running_loop()
        # first: a SIGTERM/SIGINT/SIGHUP during start-up must reach the clean-up below, not
        # kill the process with the table still reading "alive"
        installed = _install_signals(self._loop, self.request_stop, self.request_reload)
        try:
            return await self._run()
        finally:
            for sig in installed:
                self._loop.remove_signal_handler(sig)

    async def _run(self) -> int:
        assert self._loop is not None
        self._load_initial_policy()
        self._setup_model()
        cfg = self.config
        if cfg.drop_capabilities:
            # the loop's worker threads (to_thread): replaced by capability-less ones once the
            # sources have started (:meth:`_drop_capabilities`)
            self._executor = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="rh-io")
            self._loop.set_default_executor(self._executor)
        self.control = ControlPlane(
            cfg.run_dir,
            heartbeat_ms=cfg.heartbeat_ms,
            owner_uid=cfg.owner_uid,
            group_gid=cfg.socket_gid,
            any_uid=cfg.socket_any_uid,
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
        pump = asyncio.create_task(self._pump_lane_events(), name="railhop-lane-events")
        dropper: asyncio.Task[None] | None = None
        try:
            self._publish()
            await self._start_sources()
            if cfg.drop_capabilities:
                dropper = asyncio.create_task(self._drop_capabilities(), name="railhop-caps")
            await self._loop_until_stopped()
        finally:
            if dropper is not None:
                dropper.cancel()
            await self._shutdown(pump)  # marks the table gone, whatever ended the loop
        return 0

    CAPS_SETTLE_S = 5.0  # how long threads that started with capabilities get to exit

    async def _drop_capabilities(self) -> None:
        """Once every source has started (probes attached or given up), the loop thread keeps
        only what it still needs (:mod:`railhop.daemon.privileges`), the loop's worker threads
        are replaced by ones that drop every capability at their start, and the whole process
        is checked: a thread still holding a capability is logged (and shown by ``railhop
        status``)."""
        await self.sources.ready.wait()
        keep = {"CAP_SYS_PTRACE"} if self.config.usdt_lib is not None else set()
        try:
            dropped = drop_capabilities(keep)
        except OSError as e:
            log.warning("cannot drop capabilities: %s", e)
            return
        old = self._executor
        if old is not None and self._loop is not None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                thread_name_prefix="rh-io", initializer=drop_all_in_this_thread
            )
            self._loop.set_default_executor(self._executor)
            old.shutdown(wait=False)  # its idle threads exit now, busy ones after their task
        if dropped:
            log.info(
                "probes attached: dropped %s; keeping %s",
                " ".join(dropped),
                " ".join(sorted(keep)) or "no capability",
            )
        me = threading.get_native_id()
        deadline = time.monotonic() + self.CAPS_SETTLE_S
        while True:
            left = [
                t
                for t in privileges().get("threads_with_capabilities", [])
                if t["tid"] != me or not set(t["effective"]) <= keep
            ]
            if not left or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        for t in left:
            log.warning(
                "thread %s (%d) still holds %s", t["name"], t["tid"], " ".join(t["effective"])
            )
        self._status_dirty = True

    @property
    def sources_ready(self) -> asyncio.Event:
        """Set once every source started or was given up."""
        return self.sources.ready

    async def _start_sources(self) -> None:
        """Starts the quick sources now; eBPF ones (trial child + bcc compile: seconds to
        minutes) start in the background while the loop already serves events and heartbeats."""
        assert self.topology is not None
        for s in self._source_factory(self.config, self.topology, self.policy):
            self.sources.add(s)
        await self.sources.start(
            self._emit_source, self._source_up, slow_timeout_s=self.config.ebpf_start_timeout_s
        )

    def _source_up(self, s: Source, caps: Sequence[Capability]) -> None:
        if isinstance(s, CapabilitiesChange):  # hooks that attach later flip the gauge then
            loop = asyncio.get_running_loop()

            def changed(now: list[Capability], src: Source = s) -> None:
                with contextlib.suppress(RuntimeError):  # the loop closed: nothing to update
                    loop.call_soon_threadsafe(self._source_caps, src, now)

            current = s.watch_capabilities(changed)
            caps = current or caps
        self._source_caps(s, caps)
        if self.metrics is not None:
            if isinstance(s, LaneStatsSource):
                self.metrics.set_lane_stats(s.lane_stats)
            if isinstance(s, CompletionStatsSource):
                self.metrics.set_verbs_stats(s.completion_stats, self._plugin_nics)
        for c in caps:  # the capability report, logged once (late hooks: by the source)
            log.info("%s", c.line())

    def _source_caps(self, s: Source, caps: Sequence[Capability]) -> None:
        """On the loop: a source's records, at its start or changed later."""
        if self.metrics is not None:
            self.metrics.sources.labels(s.name).set(1 if source_attached(caps) else 0)

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
            if self._claims:
                wake.append(self._claims_next)
            wake.append(self._node_status_next)
            timeout = max(0.0, min(wake) - now)
            get = asyncio.ensure_future(self._inbox.get())
            stop = asyncio.ensure_future(self._stop.wait())
            hup = asyncio.ensure_future(self._wake.wait())
            done, _ = await asyncio.wait(
                {get, stop, hup}, timeout=timeout, return_when="FIRST_COMPLETED"
            )
            stop.cancel()
            hup.cancel()
            self._wake.clear()
            if get in done:
                self._handle(get.result())
                while not self._inbox.empty():  # drain a burst before publishing once
                    self._handle(self._inbox.get_nowait())
            else:
                get.cancel()
            now = self._now()
            self._check_claims(now)
            self.model, trs = self.model.tick(now)
            for tr in trs:
                self._transition(tr)
            if self.tracer is not None:
                self.tracer.tick(self._clock())
            if now >= next_reload or self._reload_now:
                if self._reload_now:
                    log.info("SIGHUP: reloading the policy")
                self._reload_now = False
                next_reload = now + self.config.reload_interval_s
                self._maybe_reload_policy()
                if self.metrics is not None:
                    self.metrics.prune()
            if self._dirty:
                self._publish()
            self._maybe_write_status(now)
            if now >= self._node_status_next:
                self._write_node_status(now)

    async def _shutdown(self, pump: asyncio.Task[None]) -> None:
        budget = self.config.shutdown_timeout_s
        t0 = time.monotonic()
        await self.sources.stop_all(budget)  # shutdown must finish: bounded, never raises
        if self.control is not None:
            # before the run directory's descriptor closes: a stopped agent's last word must
            # never read as healthy (node-status says "gone", the NFD labels go)
            self._write_node_status(self._now(), gone=True)
            await self.control.close(timeout=max(0.1, budget - (time.monotonic() - t0)))
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(pump, 1.0)
        if self.tracer is not None:  # open failovers end now; export bounded by what is left
            left = max(0.1, budget - (time.monotonic() - t0))
            tracer = self.tracer
            await asyncio.to_thread(tracer.shutdown, self._clock(), left)
        if self._metrics_retry is not None:
            self._metrics_retry.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._metrics_retry, 1.0)
        if self.metrics_server is not None:
            self.metrics_server.stop(1.0)


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


def _mtime(path: Path) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _only(topo: Topology, wanted: set[str]) -> Topology:
    return dataclasses.replace(topo, nics=tuple(n for n in topo.nics if n.names & wanted))


def _install_signals(
    loop: asyncio.AbstractEventLoop, stop: Callable[[], None], reload: Callable[[], None]
) -> list[signal.Signals]:
    """SIGTERM/SIGINT: stop cleanly; SIGHUP: reload the policy (an operator's habit; the
    default action would kill the agent without clean-up)."""
    installed = []
    for sig, fn in ((signal.SIGTERM, stop), (signal.SIGINT, stop), (signal.SIGHUP, reload)):
        try:
            loop.add_signal_handler(sig, fn)
        except (NotImplementedError, RuntimeError, ValueError):
            continue  # not the main thread: the caller stops us with request_stop()
        installed.append(sig)
    return installed


def run_agent(config: AgentConfig, **kw: Any) -> int:
    """Blocking entry point for the CLI."""
    return asyncio.run(Agent(config, **kw).run())
