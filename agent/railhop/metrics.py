"""Prometheus metrics of the agent (one registry per agent; an HTTP endpoint when asked for).

| metric | type | labels | from |
|---|---|---|---|
| ``railhop_nic_state`` | gauge (1 for the current state) | device, state | health transitions |
| ``railhop_nic_up`` | gauge | device | health transitions |
| ``railhop_nic_transitions_total`` | counter | device, to | health transitions |
| ``railhop_failovers_total`` | counter | device, cause | detection spans |
| ``railhop_detection_latency_seconds`` | histogram | source | first bad signal -> NIC DOWN |
| ``railhop_failover_completion_seconds`` | histogram | device | FAILOVER_START -> _END per conn |
| ``railhop_escalations_total`` | counter | device, reason | escalation spans |
| ``railhop_failbacks_total`` | counter | device | fail-back spans |
| ``railhop_job_failovers_total`` | counter | device, k8s_pod_uid, k8s_qos_class, | migration |
| | | slurm_job_id | spans (the job the process's cgroup names) |
| ``railhop_lanes`` | gauge | device (unmanaged: ``other``) | plugin LANE_UP / LANE_DOWN / errors |
| ``railhop_lane_events_total`` | counter | type | plugin lane events |
| ``railhop_nic_bytes_total`` | counter | device, direction | ``/sys/class/net/<nic>/statistics`` |
| ``railhop_lane_bytes_total`` | counter | lane | plugin USDT ``req_done`` (when traced) |
| ``railhop_request_completion_seconds`` | histogram | lane | plugin USDT ``req_done`` |
| ``railhop_verbs_completions_total`` | counter | device | verbs lane USDT ``verbs_wc`` |
| ``railhop_verbs_completion_bytes_total`` | counter | device | verbs lane USDT ``verbs_wc`` |
| ``railhop_verbs_completion_errors_total`` | counter | device, status | USDT ``verbs_wc_err`` |
| ``railhop_verbs_async_events_total`` | counter | device, event | USDT ``verbs_async`` |
| ``railhop_sources`` | gauge | source | sources that started (readiness) |
| ``railhop_rails``, ``railhop_rails_up`` | gauge | | rails, rails with a managed NIC UP (publish) |
| ``railhop_rails_up_min`` | gauge | | the policy's ``health.min_rails_up`` (0: every rail) |
| ``railhop_trace_spans_total``, ``railhop_trace_errors_total`` | counter | | the tracer |
| ``railhop_control_*`` | counters/gauges | | the control plane's counters |
| ``railhop_build_info`` | gauge (1) | version, python | the package |
| ``process_*`` | | | ``prometheus_client``'s process collector (CPU, memory, fds) |

The NIC label is ``device`` (as node_exporter's ``node_network_*{device=...}``, so the two
join; it was ``nic`` before issue 30). Every label value is bounded: NICs are the managed ones
(else ``other``), lanes are the plugin's lane indices (else ``other``); the per-lane series
sum every traced process (a pid label would grow with every job). Job labels
(``railhop_job_failovers_total``: pod UID, QoS class, Slurm job id, from ``railhop.jobs``;
never a pid or container id) are kept for at most ``MAX_JOBS`` jobs at a time: when one more
job fails over, the series of the job that failed over least recently are removed. No
``*_created`` series (``prometheus_client.disable_created_metrics``).

The translation of spans and lane events into samples is done here (``observe_spans``,
``lane_event``); the daemon only calls it. Reading ``/sys`` takes ``root=``; a missing file
drops that sample, not the scrape.
"""

from __future__ import annotations

import logging
import platform
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from railhop import __version__
from railhop.control.lane_events import EventType, LaneEvent
from railhop.procs import pid_alive as _pid_alive
from railhop.tracing import DETECTION, ESCALATION, FAILBACK, MIGRATION, SpanDesc

log = logging.getLogger("railhop.metrics")

STATES = ("up", "suspect", "down", "recovering")
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# The port railhop's deployments serve metrics on (the chart, the systemd unit's example, the
# demo): not 9464, the OpenTelemetry Prometheus exporter's default, nor any other common
# exporter's. The agent itself serves metrics only when given --metrics-port.
DEFAULT_PORT = 18464
MAX_LANE_LABEL = 64  # lane indices 0..63 (and -1, "no lane") are labels; others are "other"

# `*_created` series double the series count and scrapers derive the same from resets
disable_created_metrics()  # type: ignore[no-untyped-call]


def lane_label(lane: int) -> str:
    """A bounded label for a plugin lane index."""
    return str(lane) if -1 <= lane < MAX_LANE_LABEL else "other"


class LaneTotals:
    """Per-lane totals of the plugin's ``req_done`` stats summed over processes, monotonic:
    each (pid, lane) adds what it gained since the last scrape; a process that exits keeps its
    share in the total (a counter never goes down). Pure; the collector feeds it."""

    def __init__(self) -> None:
        self.reqs: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self.lat_sum_ns: dict[str, int] = {}
        self.lat_log2: dict[str, list[int]] = {}
        self._last: dict[tuple[int, int], tuple[int, int, int, tuple[int, ...]]] = {}

    def update(self, stats: Sequence[Any]) -> None:
        seen: dict[tuple[int, int], tuple[int, int, int, tuple[int, ...]]] = {}
        for s in stats:
            key = (int(s.pid), int(s.lane))
            cur = (int(s.reqs), int(s.bytes), int(s.lat_sum_ns), tuple(int(x) for x in s.lat_log2))
            seen[key] = cur
            old = self._last.get(key)
            if old is not None and (cur[0] < old[0] or cur[1] < old[1]):
                old = None  # the map entry was recreated (pid reused): count it afresh
            lab = lane_label(key[1])
            self.reqs[lab] = self.reqs.get(lab, 0) + cur[0] - (old[0] if old else 0)
            self.bytes[lab] = self.bytes.get(lab, 0) + cur[1] - (old[1] if old else 0)
            self.lat_sum_ns[lab] = self.lat_sum_ns.get(lab, 0) + cur[2] - (old[2] if old else 0)
            hist = self.lat_log2.setdefault(lab, [])
            if len(hist) < len(cur[3]):
                hist.extend([0] * (len(cur[3]) - len(hist)))
            for i, n in enumerate(cur[3]):
                hist[i] += n - (old[3][i] if old and i < len(old[3]) else 0)
        self._last = seen


class VerbsTotals:
    """Per-device totals of the verbs lane's ``verbs_wc`` stats (per pid and plugin NIC index,
    ``railhop.sources.verbs_usdt.CompletionStats``-shaped), monotonic like :class:`LaneTotals`.
    Pure; the collector feeds it with each index's device label."""

    def __init__(self) -> None:
        self.wcs: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self._last: dict[tuple[int, int], tuple[int, int]] = {}

    def update(self, stats: Sequence[Any], label: Callable[[int], str]) -> None:
        seen: dict[tuple[int, int], tuple[int, int]] = {}
        for s in stats:
            key = (int(s.pid), int(s.nic))
            cur = (int(s.wcs), int(s.bytes))
            seen[key] = cur
            old = self._last.get(key)
            if old is not None and (cur[0] < old[0] or cur[1] < old[1]):
                old = None  # the map entry was recreated (pid reused): count it afresh
            lab = label(key[1])
            self.wcs[lab] = self.wcs.get(lab, 0) + cur[0] - (old[0] if old else 0)
            self.bytes[lab] = self.bytes.get(lab, 0) + cur[1] - (old[1] if old else 0)
        self._last = seen


class MetricsError(Exception):
    """Base class of metrics errors (the endpoint cannot listen)."""


def _ns(v: object) -> float:
    return float(v) if isinstance(v, int | float) else 0.0


class AgentMetrics:
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        nics: Iterable[str] = (),
        sys_root: Path | str = "/",
        pid_alive: Callable[[int], bool] | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.nics = list(nics)
        self.sys_root = Path(sys_root)
        self._pid_alive = pid_alive or _pid_alive
        self.nic_state = Gauge(
            "railhop_nic_state",
            "1 for the NIC's current health state",
            ["device", "state"],
            registry=r,
        )
        self.nic_up = Gauge(
            "railhop_nic_up", "1 when the NIC is UP (usable)", ["device"], registry=r
        )
        self.transitions = Counter(
            "railhop_nic_transitions", "Health state changes", ["device", "to"], registry=r
        )
        self.failovers = Counter(
            "railhop_failovers",
            "Failovers started, by NIC and cause",
            ["device", "cause"],
            registry=r,
        )
        self.detection = Histogram(
            "railhop_detection_latency_seconds",
            "First bad signal -> the agent declared the NIC down (or the plugin failed over)",
            ["source"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.completion = Histogram(
            "railhop_failover_completion_seconds",
            "Per connection: the plugin's FAILOVER_START -> FAILOVER_END (first completion after)",
            ["device"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.escalations = Counter(
            "railhop_escalations", "Failovers that escalated", ["device", "reason"], registry=r
        )
        self.failbacks = Counter(
            "railhop_failbacks", "Failovers that ended back on the NIC", ["device"], registry=r
        )
        self.job_failovers = Counter(
            "railhop_job_failovers",
            "Connections moved off a failed NIC, by the job (pod or Slurm job) of the process",
            ["device", "k8s_pod_uid", "k8s_qos_class", "slurm_job_id"],
            registry=r,
        )
        self._jobs: OrderedDict[tuple[str, str, str], set[str]] = OrderedDict()
        self.sources = Gauge(
            "railhop_sources", "1 for each signal source the agent started", ["source"], registry=r
        )
        self.lanes = Gauge("railhop_lanes", "Plugin lanes up on the NIC", ["device"], registry=r)
        self.rails = Gauge(
            "railhop_rails", "Rails of the managed NICs (a NIC without a rail is one)", registry=r
        )
        self.rails_up = Gauge(
            "railhop_rails_up", "Rails with at least one managed NIC UP", registry=r
        )
        self.rails_up_min = Gauge(
            "railhop_rails_up_min",
            "Rails the policy wants up (health.min_rails_up; every rail when it says 0)",
            registry=r,
        )
        self.lane_events = Counter(
            "railhop_lane_events", "Plugin lane events received", ["type"], registry=r
        )
        self.verbs_errors = Counter(
            "railhop_verbs_completion_errors",
            "verbs lane error completions (USDT verbs_wc_err), by ibv_wc_status",
            ["device", "status"],
            registry=r,
        )
        self.verbs_async_events = Counter(
            "railhop_verbs_async_events",
            "Async events the verbs lanes read (USDT verbs_async), by ibv_event_type",
            ["device", "event"],
            registry=r,
        )
        self._verbs_stats: Callable[[], Sequence[Any]] | None = None
        self._verbs_nics: Callable[[], Sequence[str]] = lambda: ()
        self._verbs_totals = VerbsTotals()
        self._lanes: dict[tuple[int, int, int], str] = {}  # (peer pid, conn, lane) -> nic
        self._per_nic: dict[str, int] = {}  # lanes per NIC label, kept with _lanes
        self._lock = threading.Lock()
        self._lane_stats: Callable[[], Sequence[Any]] | None = None
        self._control: Callable[[], Any] | None = None
        self._tracer: Any = None
        self._lane_totals = LaneTotals()
        Info("railhop_build", "railhop's version (value 1)", registry=r).info(
            {"version": __version__, "python": platform.python_version()}
        )
        ProcessCollector(registry=r)
        r.register(_Dynamic(self))
        for n in self.nics:
            self.lanes.labels(n).set(0)

    # -- inputs

    def set_nics(self, nics: Iterable[str]) -> None:
        self.nics = list(nics)
        for n in self.nics:
            self.lanes.labels(n).set(self._count(n))

    def nic_state_changed(self, nic: str, state: str) -> None:
        for s in STATES:
            self.nic_state.labels(nic, s).set(1 if s == state else 0)
        self.nic_up.labels(nic).set(1 if state == "up" else 0)

    def set_rails(self, up: int, total: int, wanted: int) -> None:
        """The published table's rail count (``railhop.control.status.rail_counts``)."""
        self.rails_up.set(up)
        self.rails.set(total)
        self.rails_up_min.set(wanted)

    def transition(self, nic: str, state: str) -> None:
        self.transitions.labels(nic, state).inc()
        self.nic_state_changed(nic, state)

    def observe_spans(self, spans: Sequence[SpanDesc]) -> None:
        """Counters and histograms that follow from finished failover spans."""
        for s in spans:
            a = s.attributes
            nic = str(a.get("network.interface.name", ""))
            if s.name == DETECTION:
                self.failovers.labels(nic, str(a.get("railhop.detection.signal", ""))).inc()
                src = str(a.get("railhop.detection.source", ""))
                self.detection.labels(src).observe(_ns(a.get("railhop.detection.latency_ms")) / 1e3)
            elif s.name == MIGRATION:
                if a.get("railhop.migration.outcome") == "resumed":
                    self.completion.labels(nic).observe(max(0, s.end_ns - s.start_ns) / 1e9)
                self._job_failover(nic, a)
            elif s.name == ESCALATION:
                self.escalations.labels(nic, str(a.get("error.type", ""))).inc()
            elif s.name == FAILBACK:
                self.failbacks.labels(nic).inc()

    MAX_JOBS = 64  # jobs with series in railhop_job_failovers_total at a time

    def _job_failover(self, nic: str, a: Mapping[str, object]) -> None:
        """One connection of a job moved (its span carries the job: railhop.jobs)."""
        job = (
            str(a.get("k8s.pod.uid", "")),
            str(a.get("railhop.k8s.qos_class", "")),
            str(a.get("railhop.slurm.job_id", "")),
        )
        if job == ("", "", ""):
            return  # not attributed: the node-level railhop_failovers_total has it
        nics = self._jobs.pop(job, set())
        self._jobs[job] = nics  # most recent last
        nics.add(nic)
        self.job_failovers.labels(nic, *job).inc()
        while len(self._jobs) > self.MAX_JOBS:
            old, old_nics = self._jobs.popitem(last=False)
            for n in old_nics:
                self.job_failovers.remove(n, *old)

    MAX_LANES = 65536  # lanes remembered; beyond, the oldest is forgotten

    def lane_event(self, ev: LaneEvent, peer_pid: int) -> None:
        """O(1) whatever the number of lanes (issue 29, 5: the gauge was recounted over every
        lane on every event, 1.36 ms per event at 30k lanes)."""
        self.lane_events.labels(ev.type.name.lower()).inc()
        key = (peer_pid, ev.conn_id, ev.lane)
        nic = ev.nic if not self.nics or ev.nic in self.nics else "other"  # bounded labels
        touched: dict[str, int] = {}
        with self._lock:
            if ev.type is EventType.LANE_UP:
                old = self._lanes.pop(key, None)
                if old is not None:
                    touched[old] = self._uncount(old)
                if len(self._lanes) >= self.MAX_LANES:
                    gone = self._lanes.pop(next(iter(self._lanes)))
                    touched[gone] = self._uncount(gone)
                self._lanes[key] = nic
                self._per_nic[nic] = self._per_nic.get(nic, 0) + 1
                touched[nic] = self._per_nic[nic]
            elif ev.type in (EventType.LANE_DOWN, EventType.LANE_ERROR, EventType.LANE_TIMEOUT):
                old = self._lanes.pop(key, None)
                if old is not None:
                    touched[old] = self._uncount(old)
        for n, count in touched.items():
            self.lanes.labels(n).set(count)

    def _uncount(self, nic: str) -> int:
        left = self._per_nic.get(nic, 0) - 1
        if left > 0:
            self._per_nic[nic] = left
        else:
            self._per_nic.pop(nic, None)
        return max(0, left)

    def prune(self) -> None:
        """Forgets the lanes of processes that exited (they cannot say LANE_DOWN)."""
        with self._lock:
            pids = {k[0] for k in self._lanes}
            dead = {p for p in pids if not self._pid_alive(p)}
            if not dead:
                return
            touched = {n for k, n in self._lanes.items() if k[0] in dead}
            self._lanes = {k: n for k, n in self._lanes.items() if k[0] not in dead}
            self._per_nic = {}
            for n in self._lanes.values():
                self._per_nic[n] = self._per_nic.get(n, 0) + 1
        for n in touched:
            self.lanes.labels(n).set(self._count(n))

    def _count(self, nic: str) -> int:
        with self._lock:
            return self._per_nic.get(nic, 0)

    def set_lane_stats(self, fn: Callable[[], Sequence[Any]] | None) -> None:
        """A provider of per-lane stats (``railhop.sources.usdt.LaneStats``-shaped objects)."""
        self._lane_stats = fn

    def set_verbs_stats(
        self, fn: Callable[[], Sequence[Any]] | None, nics: Callable[[], Sequence[str]]
    ) -> None:
        """A provider of per (pid, plugin NIC index) verbs completion totals
        (``railhop.sources.verbs_usdt.CompletionStats``-shaped), and of the plugin's NIC order
        (the index's device)."""
        self._verbs_stats = fn
        self._verbs_nics = nics

    def _device(self, name: str | None) -> str:
        """A NIC name as a bounded label: a managed NIC, else ``other``."""
        return name if name is not None and (not self.nics or name in self.nics) else "other"

    def verbs_error(self, device: str | None, status: str) -> None:
        self.verbs_errors.labels(self._device(device), status).inc()

    def verbs_async(self, device: str | None, event: str) -> None:
        self.verbs_async_events.labels(self._device(device), event).inc()

    def set_control(self, fn: Callable[[], Any] | None) -> None:
        """A provider of ``railhop.control.ControlCounters``."""
        self._control = fn

    def set_tracer(self, tracer: Any) -> None:
        """A ``railhop.tracing.FailoverTracer`` (its ``spans`` and ``errors`` counts)."""
        self._tracer = tracer

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Dynamic(Collector):
    """Samples read at scrape time: NIC byte counters, USDT lane stats, control counters."""

    def __init__(self, m: AgentMetrics) -> None:
        self.m = m

    def describe(self) -> list[Metric]:
        return []  # unchecked collector (values only exist at scrape time)

    def collect(self) -> Iterator[Metric]:
        yield from self._nic_bytes()
        yield from self._lanes()
        yield from self._verbs()
        yield from self._control()
        t = self.m._tracer
        if t is not None:
            for name, doc, v in (
                ("railhop_trace_spans", "Failover spans produced", t.spans),
                ("railhop_trace_errors", "Tracing errors caught (sinks, observers)", t.errors),
            ):
                fam = CounterMetricFamily(name, doc)
                fam.add_metric([], int(v))
                yield fam

    def _nic_bytes(self) -> Iterator[Metric]:
        fam = CounterMetricFamily(
            "railhop_nic_bytes",
            "Bytes through the NIC (sysfs statistics)",
            labels=["device", "direction"],
        )
        for nic in self.m.nics:
            base = self.m.sys_root / "sys/class/net" / nic / "statistics"
            for d in ("rx", "tx"):
                try:
                    v = int((base / f"{d}_bytes").read_text().strip())
                except (OSError, ValueError):
                    continue
                fam.add_metric([nic, d], v)
        yield fam

    def _lanes(self) -> Iterator[Metric]:
        fn = self.m._lane_stats
        if fn is None:
            return
        try:
            stats = list(fn())
        except Exception as e:
            log.debug("lane stats unavailable: %s", e)
            return
        b = CounterMetricFamily(
            "railhop_lane_bytes",
            "Bytes completed per plugin lane index, all traced processes (USDT req_done)",
            labels=["lane"],
        )
        h = HistogramMetricFamily(
            "railhop_request_completion_seconds",
            "Request completion latency per plugin lane index (USDT req_done, log2 buckets)",
            labels=["lane"],
        )
        t = self.m._lane_totals
        with self.m._lock:
            t.update(stats)
            for lab in sorted(t.bytes):
                b.add_metric([lab], t.bytes[lab])
                acc = 0
                buckets: list[tuple[str, float]] = []
                for i, n in enumerate(t.lat_log2[lab]):
                    acc += n
                    buckets.append((repr(2.0 ** (i + 1) / 1e9), float(acc)))
                buckets.append(("+Inf", float(t.reqs[lab])))
                h.add_metric([lab], buckets, float(t.lat_sum_ns[lab]) / 1e9)
        yield b
        yield h

    def _verbs(self) -> Iterator[Metric]:
        fn = self.m._verbs_stats
        if fn is None:
            return
        try:
            stats = list(fn())
            order = list(self.m._verbs_nics())
        except Exception as e:
            log.debug("verbs completion stats unavailable: %s", e)
            return

        def label(idx: int) -> str:
            return self.m._device(order[idx] if 0 <= idx < len(order) else None)

        c = CounterMetricFamily(
            "railhop_verbs_completions",
            "verbs lane work completions per device, all traced processes (USDT verbs_wc)",
            labels=["device"],
        )
        b = CounterMetricFamily(
            "railhop_verbs_completion_bytes",
            "byte_len of successful verbs lane completions per device (USDT verbs_wc)",
            labels=["device"],
        )
        t = self.m._verbs_totals
        with self.m._lock:
            t.update(stats, label)
            for lab in sorted(t.wcs):
                c.add_metric([lab], t.wcs[lab])
                b.add_metric([lab], t.bytes[lab])
        yield c
        yield b

    def _control(self) -> Iterator[Metric]:
        fn = self.m._control
        if fn is None:
            return
        try:
            c = fn()
        except Exception as e:
            log.debug("control counters unavailable: %s", e)
            return
        for name, doc in (
            ("publishes", "Health table publishes"),
            ("events", "Lane events decoded"),
            ("malformed", "Lane event messages dropped as malformed"),
            ("queue_dropped", "Lane events dropped: agent queue full"),
            ("peers_rejected", "Event socket peers rejected (uid)"),
            ("rate_limited", "Lane events dropped: over a per-process or per-uid rate limit"),
            ("clamped", "Lane events dated in the future, clamped to the receive time"),
            ("file_write_errors", "Run-directory files (status.json) that could not be written"),
        ):
            fam = CounterMetricFamily(f"railhop_control_{name}", doc)
            fam.add_metric([], int(getattr(c, name, 0)))
            yield fam
        g = GaugeMetricFamily("railhop_control_clients", "Plugins connected to the event socket")
        g.add_metric([], int(getattr(c, "clients", 0)))
        yield g


class MetricsServer:
    """The /metrics HTTP endpoint (a daemon thread; :meth:`stop` is bounded)."""

    def __init__(self, metrics: AgentMetrics, port: int, addr: str = "127.0.0.1") -> None:
        self.metrics = metrics
        self.addr = addr
        self.port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        """Listens; returns the bound port (``port=0``: an ephemeral one)."""
        from prometheus_client import start_http_server

        try:
            server, thread = start_http_server(self.port, self.addr, registry=self.metrics.registry)
        except OSError as e:
            raise MetricsError(f"metrics endpoint {self.addr}:{self.port}: {e}") from e
        self._server, self._thread = server, thread
        self.port = int(server.server_address[1])
        return self.port

    def stop(self, timeout_s: float = 2.0) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None
        t = threading.Thread(target=server.shutdown, daemon=True)
        t.start()
        t.join(timeout_s)
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout_s)
