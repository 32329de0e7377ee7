"""Pure event translation: a source's event (:mod:`railhop.sources.events`) or a plugin's lane
event as a health-model event, the plugin's USDT lane probes as lane events, and the guard
that keeps one process's burst of lane trouble from taking several NICs down."""

from __future__ import annotations

import errno
from collections.abc import Mapping, Sequence

from railhop import health
from railhop.control import EventFlag, EventType, LaneEvent
from railhop.sources.events import (
    CarrierDown,
    CarrierUp,
    CounterBreach,
    DevlinkHealth,
    LinkRemoved,
    PluginLaneEvent,
    RdmaPortEvent,
    TcpSuspect,
    VerbsWcError,
)
from railhop.sources.events import Event as SourceEvent
from railhop.topology import Nic, Topology

BAD_KINDS = frozenset(
    {"carrier_down", "device_fatal", "admin_down", *health.SOFT_KINDS}
)  # health event kinds that count as a failover's detection signals


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
    ev: SourceEvent, alias: Mapping[str, str], port_nic: Mapping[int, str] | None = None
) -> health.Event | None:
    """A source event as a health-model event, or None when it says nothing about a managed
    NIC's health. ``port_nic``: local TCP port of a plugin lane -> its NIC
    (:class:`railhop.daemon.lanes.LaneBook`), for the TCP probe's signals."""
    t = ev.ts_ns / 1e9
    match ev:
        case TcpSuspect(reason="retransmit"):
            # a plain retransmit is congestion as often as trouble (tbf drops, incast); a
            # blackhole shows as an RTO, i.e. "loss" (TCP_CA_Loss) at the same moment
            return None
        case TcpSuspect():
            ports = port_nic or {}
            nic = ports.get(ev.sport) or ports.get(ev.dport)
            if nic is None or nic not in alias:
                return None
            return health.TcpSuspect(
                alias[nic], t, detail=f"{ev.reason} {ev.sport}->{ev.dport} value {ev.value}"
            )
        case CarrierDown() | CarrierUp() | LinkRemoved():
            nic = alias.get(ev.ifname)
            if nic is None:
                return None
            if isinstance(ev, CarrierUp):
                return health.CarrierUp(nic, t)
            if isinstance(ev, LinkRemoved):
                return health.DeviceFatal(nic, t)
            if not ev.certain:
                return None  # a proxy signal (qdisc reset): netlink will confirm or not
            return health.CarrierDown(nic, t)
        case CounterBreach():
            nic = alias.get(ev.obj)
            if nic is None:
                return None
            return health.CounterBreach(
                nic, t, counter=ev.counter, rate=float(ev.rate), threshold=float(ev.threshold)
            )
        case RdmaPortEvent():
            nic = alias.get(f"{ev.device}/{ev.port}") or alias.get(ev.device)
            if nic is None:
                return None
            if ev.event in _PORT_DOWN:
                return health.CarrierDown(nic, t)
            if ev.event in _PORT_UP:
                return health.CarrierUp(nic, t)
            if ev.event in _FATAL:
                return health.DeviceFatal(nic, t)
            return None
        case DevlinkHealth():
            nic = alias.get(ev.device)
            return health.DeviceFatal(nic, t) if nic is not None else None
        case _:  # RDMA-CM errors, mlx5 command failures, USDT probes: not health signals here
            return None


def health_event_from_lane(
    ev: LaneEvent, alias: Mapping[str, str], source: str = ""
) -> health.Event | None:
    """A plugin's lane event as a health event: timeouts and transport errors are soft signals
    on the lane's local NIC (the state machine decides when they mean DOWN, and needs them
    corroborated by another ``source`` when they have one); a lane coming up or failing back
    on a NIC is a successful probe of it (evidence only once several sources report one).
    Every event made here carries ``source``: nothing a process says is the agent's own
    evidence. ``ev.t_ns`` is already clamped to the receive time."""
    nic = alias.get(ev.nic)
    if nic is None:
        return None
    t = ev.t_ns / 1e9
    if ev.type is EventType.LANE_TIMEOUT and ev.error == errno.EREMOTEIO:
        # the peer timed out on the lane and told this side: the fault may be at the peer's
        # end, and taking this NIC down would move its lanes to every other peer too
        return health.Suspicion(
            nic, t, detail=f"peer-reported lane timeout, pid {ev.pid}", source=source
        )
    if ev.type is EventType.LANE_TIMEOUT:
        return health.LaneTimeout(nic, t, detail=f"pid {ev.pid} conn {ev.conn_id}", source=source)
    if ev.type is EventType.LANE_ERROR:
        return health.LaneError(
            nic, t, detail=f"pid {ev.pid} conn {ev.conn_id} errno {ev.error}", source=source
        )
    if ev.type is EventType.LANE_UP and ev.promoted:
        # a warm standby promoted: nothing crossed the NIC for it now (its handshake, long
        # before, was its LANE_UP then)
        return None
    if ev.type in (EventType.LANE_UP, EventType.FAILBACK):
        # a lane on this NIC completed its handshake / carries traffic again: the positive
        # evidence a NIC that went DOWN with its link up needs before it is offered again
        return health.ProbeOk(nic, t, source=source)
    return None


# Error completions that say something about the path through this NIC: the device got no ACK
# (or no response) from the peer after its retries, a malformed response, or the device failed.
# The others are not evidence about the NIC: a flush only follows an error (or the lane's own
# move to ERROR, its receiver's fence), local length/protection/access errors and the peer's
# refusals (access, invalid request, operation) are the application's or the peer's, and an
# RNR retry exhaustion is the peer not posting receive buffers.
VERBS_NIC_EVIDENCE = frozenset({"RETRY_EXC_ERR", "RESP_TIMEOUT_ERR", "BAD_RESP_ERR", "FATAL_ERR"})


def health_event_from_verbs(
    ev: VerbsWcError, nics: Sequence[str], alias: Mapping[str, str], source: str
) -> health.Event | None:
    """A verbs lane's error completion (USDT ``verbs_wc_err``) as evidence against its NIC:
    a :class:`health.LaneError` carrying ``source`` (the process, as the kernel names it), so
    it weighs exactly as a lane error the process reports on agent.sock: alone it makes the NIC
    SUSPECT, it takes the NIC DOWN only when ``corroborate_sources`` processes (or a kernel
    signal) agree. ``nics``: the plugin's NIC order (``ev.nic`` indexes it). None when the
    status is not evidence (:data:`VERBS_NIC_EVIDENCE`) or the NIC is not managed. Pure."""
    if ev.status_name not in VERBS_NIC_EVIDENCE or not 0 <= ev.nic < len(nics):
        return None
    nic = alias.get(nics[ev.nic])
    if nic is None:
        return None
    return health.LaneError(
        nic,
        ev.ts_ns / 1e9,
        detail=f"verbs {ev.status_name} qp {ev.qp_num} pid {ev.pid}",
        source=source,
    )


def _signed(v: int) -> int:
    """A USDT argument read as unsigned 64-bit back to its signed value."""
    return v - (1 << 64) if v >= 1 << 63 else v


class UsdtLaneTranslator:
    """The plugin's USDT lane probes (:class:`PluginLaneEvent`) as lane
    events, for traces and metrics when the plugin does not report on ``agent.sock``. Pure
    (state: which NIC each lane uses). Probe arguments (plugin/src/probes.h):
    lane_up(conn, lane, lnic, rnic), lane_down(conn, lane, lnic, err),
    failover_start(conn, lane, err), failover_end(conn, epoch, nactive, duration_ns) at the first
    completion after the move, failback(conn, lane), fair_share(conn, epoch, duration_ns, rate),
    standby_promoted(conn, lane, lnic, rnic) (a LANE_UP flagged standby and promoted: the
    standby's own lane_up, when it was handshaken, says nothing of its role);
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

    def translate(self, ev: PluginLaneEvent) -> LaneEvent | None:
        probe, pid, t = ev.probe, ev.pid, ev.ts_ns
        a = [_signed(int(x)) for x in ev.args] + [0, 0, 0, 0]
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
            if len(self._conn_nic) >= self.MAX_LANES:  # fair_share may never come
                self._conn_nic.clear()
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
        if probe == "failover_end":  # the NIC stays known: fair_share follows
            nic = self._name(self._conn_nic.get((pid, conn)))
            if nic is None:
                return None
            return LaneEvent(
                EventType.FAILOVER_END,
                pid,
                nic,
                conn_id=conn,
                epoch=second & 0xFFFFFFFF,
                t_ns=t,
                duration_ns=max(0, a[3]),
            )
        if probe == "fair_share":
            nic = self._name(self._conn_nic.pop((pid, conn), None))
            if nic is None:
                return None
            return LaneEvent(
                EventType.FAIR_SHARE,
                pid,
                nic,
                conn_id=conn,
                epoch=second & 0xFFFFFFFF,
                t_ns=t,
                duration_ns=max(0, a[2]),
            )
        if probe == "standby_promoted":
            nic = self._name(a[2])
            if nic is None:
                return None
            if len(self._lane_nic) >= self.MAX_LANES:
                self._lane_nic.clear()
            self._lane_nic[(pid, conn, second)] = a[2]
            return LaneEvent(
                EventType.LANE_UP,
                pid,
                nic,
                conn_id=conn,
                lane=second,
                t_ns=t,
                flags=int(EventFlag.STANDBY | EventFlag.PROMOTED),
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
            source=ev.source,
        )
