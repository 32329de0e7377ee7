"""Typed events produced by the sources (plain frozen dataclasses, no behaviour).

Every event has ``ts_ns``: CLOCK_MONOTONIC nanoseconds taken as close to the signal as the source
can (``bpf_ktime_get_ns()`` in the kernel for eBPF, the moment the message was read for netlink,
the moment of the sample for sysfs), comparable with :func:`time.monotonic_ns`. ``source`` names
the producing source, ``hook`` the mechanism and attach point (``"tp:qdisc:qdisc_reset"``,
``"netlink"``...).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, kw_only=True)
class BaseEvent:
    ts_ns: int
    source: str
    hook: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class CarrierDown(BaseEvent):
    """A netdev lost carrier. ``certain`` is False for proxies (a qdisc reset seen through a plain
    tracepoint also happens on an administrative down)."""

    ifname: str
    ifindex: int = 0
    operstate: str = ""
    certain: bool = True
    netns_ino: int = 0  # the device's netns (stat(...).st_ino); 0 = not known to the hook


@dataclass(frozen=True, slots=True, kw_only=True)
class CarrierUp(BaseEvent):
    ifname: str
    ifindex: int = 0
    operstate: str = ""
    netns_ino: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkRemoved(BaseEvent):
    ifname: str
    ifindex: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class TcpSuspect(BaseEvent):
    """Trouble on a registered lane socket. reason: ``retransmit`` (value = err of the retransmit,
    0 = sent), ``error`` (value = errno reported on the socket), ``loss`` (value = congestion
    state, 4 = TCP_CA_Loss)."""

    reason: str
    sport: int
    dport: int
    saddr: str = ""
    daddr: str = ""
    value: int = 0
    state: int = 0
    netns_ino: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaPortEvent(BaseEvent):
    """An RDMA async event (verbs async fd or ``ib_dispatch_event``). ``port`` is 0 when the
    event is not port-affiliated or the source cannot tell (pyverbs)."""

    device: str
    event: str
    code: int
    port: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RdmaCmEvent(BaseEvent):
    """An RDMA-CM error event (``rdma_cma:cm_event_handler``) or a device removal."""

    event: str
    code: int
    status: int = 0
    device: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class DevlinkHealth(BaseEvent):
    device: str
    reporter: str
    msg: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Mlx5CmdFailure(BaseEvent):
    command: str
    status_str: str
    status: int
    syndrome: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CounterBreach(BaseEvent):
    """A counter's rate over the last sample went past its threshold. ``obj`` is the netdev name
    or ``<rdma-dev>/<port>``; ``rate`` is per second."""

    obj: str
    counter: str
    rate: float
    threshold: float
    delta: int = 0
    interval_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginLaneEvent(BaseEvent):
    """A plugin USDT probe (lane_up, lane_down, failover_start, failover_end, failback,
    fair_share, standby_promoted)."""

    probe: str
    pid: int
    args: tuple[int, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True, kw_only=True)
class VerbsWcError(BaseEvent):
    """A verbs lane's error completion (probe ``verbs_wc_err``): process ``pid``'s queue pair
    ``qp_num`` on the plugin's NIC index ``nic`` (-1: not named) completed a work request
    with ``status`` (enum ibv_wc_status; ``status_name`` its name) and the device's
    ``vendor_err``."""

    pid: int
    qp_num: int
    nic: int
    status: int
    status_name: str
    vendor_err: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class VerbsAsync(BaseEvent):
    """An asynchronous event a verbs lane read (probe ``verbs_async``): ``event`` (enum
    ibv_event_type's name, ``code`` its value) on the plugin's NIC index ``nic``; ``qp_num``
    for queue pair events, ``port`` for port events."""

    pid: int
    nic: int
    event: str
    code: int
    qp_num: int = 0
    port: int = 0


Event = (
    CarrierDown
    | CarrierUp
    | LinkRemoved
    | TcpSuspect
    | RdmaPortEvent
    | RdmaCmEvent
    | DevlinkHealth
    | Mlx5CmdFailure
    | CounterBreach
    | PluginLaneEvent
    | VerbsWcError
    | VerbsAsync
)
