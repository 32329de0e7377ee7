"""Pure decoders: raw ring-buffer records (``bpf/railhop_events.h``) -> typed events.

The struct formats below mirror the C header field by field; tests/unit/test_sources_layout.py
compiles the header and checks every size and offset against them.
"""

from __future__ import annotations

import ipaddress
import struct

from railhop.sources.base import SourceError
from railhop.sources.events import (
    CarrierDown,
    CarrierUp,
    DevlinkHealth,
    Event,
    Mlx5CmdFailure,
    PluginLaneEvent,
    RdmaCmEvent,
    RdmaPortEvent,
    TcpSuspect,
)

HDR = struct.Struct("<QII")
NETDEV = struct.Struct("<QIIiI16s")
TCP = struct.Struct("<QIIHHHHiI16s16s")
DRV = struct.Struct("<QIIii32s32s64s")
USDT = struct.Struct("<QIIII4q")

EV_CARRIER_DOWN = 1
EV_CARRIER_UP = 2
EV_QDISC_RESET = 3
EV_TCP_RETRANS = 4
EV_TCP_ERROR = 5
EV_TCP_LOSS = 6
EV_DEVLINK_HEALTH = 7
EV_CM_EVENT = 8
EV_CM_REMOVE = 9
EV_MLX5_CMD = 10
EV_IB_EVENT = 11
EV_USDT = 12
EV_DEV_CLOSE = 13

HOOKS = {1: "fentry", 2: "raw_tp", 3: "tp", 4: "usdt", 5: "kprobe"}

USDT_PROBES = {
    1: "lane_up",
    2: "lane_down",
    3: "failover_start",
    4: "failover_end",
    5: "failback",
    6: "req_done",
    7: "fair_share",
    8: "verbs_wc_err",
    9: "verbs_async",
    10: "standby_promoted",
}

# rdma_cm_event_type (librdmacm rdma_cma.h)
CM_EVENTS = {
    0: "ADDR_RESOLVED",
    1: "ADDR_ERROR",
    2: "ROUTE_RESOLVED",
    3: "ROUTE_ERROR",
    4: "CONNECT_REQUEST",
    5: "CONNECT_RESPONSE",
    6: "CONNECT_ERROR",
    7: "UNREACHABLE",
    8: "REJECTED",
    9: "ESTABLISHED",
    10: "DISCONNECTED",
    11: "DEVICE_REMOVAL",
    12: "MULTICAST_JOIN",
    13: "MULTICAST_ERROR",
    14: "ADDR_CHANGE",
    15: "TIMEWAIT_EXIT",
}

# ib_event_type / ibv_event_type (same order)
IB_EVENTS = {
    0: "CQ_ERR",
    1: "QP_FATAL",
    2: "QP_REQ_ERR",
    3: "QP_ACCESS_ERR",
    4: "COMM_EST",
    5: "SQ_DRAINED",
    6: "PATH_MIG",
    7: "PATH_MIG_ERR",
    8: "DEVICE_FATAL",
    9: "PORT_ACTIVE",
    10: "PORT_ERR",
    11: "LID_CHANGE",
    12: "PKEY_CHANGE",
    13: "SM_CHANGE",
    14: "SRQ_ERR",
    15: "SRQ_LIMIT_REACHED",
    16: "QP_LAST_WQE_REACHED",
    17: "CLIENT_REREGISTER",
    18: "GID_CHANGE",
    19: "WQ_FATAL",
    20: "DEVICE_SPEED_CHANGE",
}

TCP_REASONS = {EV_TCP_RETRANS: "retransmit", EV_TCP_ERROR: "error", EV_TCP_LOSS: "loss"}
AF_INET = 2
AF_INET6 = 10


class DecodeError(SourceError):
    """A ring-buffer record is too short or of an unknown kind."""


def cstr(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode("utf-8", "replace")


def ip_str(family: int, raw: bytes) -> str:
    if family == AF_INET:
        return str(ipaddress.IPv4Address(raw[:4]))
    if family == AF_INET6:
        return str(ipaddress.IPv6Address(raw[:16]))
    return ""


def _need(raw: bytes, st: struct.Struct, kind: int) -> None:
    if len(raw) < st.size:
        raise DecodeError(f"record of kind {kind}: {len(raw)} bytes, need {st.size}")


def decode(raw: bytes, source: str) -> Event:
    """Decode one ring-buffer record; :class:`DecodeError` on a short or unknown record."""
    if len(raw) < HDR.size:
        raise DecodeError(f"record of {len(raw)} bytes is shorter than the header")
    ts, kind, hook_id = HDR.unpack_from(raw)
    hook = HOOKS.get(hook_id, str(hook_id))
    if kind in (EV_CARRIER_DOWN, EV_CARRIER_UP, EV_QDISC_RESET, EV_DEV_CLOSE):
        _need(raw, NETDEV, kind)
        _, _, _, ifindex, netns_ino, name = NETDEV.unpack_from(raw)
        where = {
            EV_CARRIER_DOWN: "netif_carrier_off",
            EV_CARRIER_UP: "netif_carrier_on",
            EV_QDISC_RESET: "qdisc_reset",
            EV_DEV_CLOSE: "qdisc_reset",
        }[kind]
        if hook == "raw_tp":
            where = "qdisc_reset"
        label = f"{hook}:{where}"
        if kind == EV_CARRIER_UP:
            return CarrierUp(
                ts_ns=ts,
                source=source,
                hook=label,
                ifname=cstr(name),
                ifindex=ifindex,
                netns_ino=netns_ino,
            )
        return CarrierDown(
            ts_ns=ts,
            source=source,
            hook=label,
            ifname=cstr(name),
            ifindex=ifindex,
            netns_ino=netns_ino,
            # an administrative down (dev_close) takes the link away as surely as carrier loss
            operstate="DOWN" if kind == EV_DEV_CLOSE else "",
            certain=kind in (EV_CARRIER_DOWN, EV_DEV_CLOSE),
        )
    if kind in TCP_REASONS:
        _need(raw, TCP, kind)
        _, _, _, sport, dport, family, state, value, netns_ino, sa, da = TCP.unpack_from(raw)
        return TcpSuspect(
            ts_ns=ts,
            source=source,
            hook=hook,
            reason=TCP_REASONS[kind],
            sport=sport,
            dport=dport,
            saddr=ip_str(family, sa),
            daddr=ip_str(family, da),
            value=value,
            state=state,
            netns_ino=netns_ino,
        )
    if kind in (EV_DEVLINK_HEALTH, EV_CM_EVENT, EV_CM_REMOVE, EV_MLX5_CMD, EV_IB_EVENT):
        _need(raw, DRV, kind)
        _, _, _, a, b, dev, name, msg = DRV.unpack_from(raw)
        if kind == EV_DEVLINK_HEALTH:
            return DevlinkHealth(
                ts_ns=ts,
                source=source,
                hook=hook,
                device=cstr(dev),
                reporter=cstr(name),
                msg=cstr(msg),
            )
        if kind == EV_CM_EVENT:
            return RdmaCmEvent(
                ts_ns=ts, source=source, hook=hook, event=CM_EVENTS.get(a, str(a)), code=a, status=b
            )
        if kind == EV_CM_REMOVE:
            return RdmaCmEvent(
                ts_ns=ts,
                source=source,
                hook=hook,
                event="DEVICE_REMOVED",
                code=-1,
                device=cstr(dev),
            )
        if kind == EV_MLX5_CMD:
            return Mlx5CmdFailure(
                ts_ns=ts,
                source=source,
                hook=hook,
                command=cstr(name),
                status_str=cstr(msg),
                status=a,
                syndrome=b & 0xFFFFFFFF,
            )
        return RdmaPortEvent(
            ts_ns=ts,
            source=source,
            hook=hook,
            device=cstr(dev),
            event=IB_EVENTS.get(a, str(a)),
            code=a,
            port=b,
        )
    if kind == EV_USDT:
        _need(raw, USDT, kind)
        _, _, _, probe, pid, a0, a1, a2, a3 = USDT.unpack_from(raw)
        return PluginLaneEvent(
            ts_ns=ts,
            source=source,
            hook=hook,
            probe=USDT_PROBES.get(probe, str(probe)),
            pid=pid,
            args=(a0, a1, a2, a3),
        )
    raise DecodeError(f"unknown record kind {kind}")
