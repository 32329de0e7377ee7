"""The TCP lane source: retransmits, socket errors and loss-state changes of lane sockets
(matched by port) from ``bpf/tcp_lane.bpf.c``."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

from railhop.sources import hooks as H
from railhop.sources.base import Capability, Emit, Reason
from railhop.sources.ebpf.loader import EbpfError
from railhop.sources.ebpf.netns import NetnsFilter, netns_of
from railhop.sources.ebpf.source import RINGBUF, EbpfSource
from railhop.sources.events import Event

SOCK_OFFSETS = H.offsets(
    RH_OFF_SKC_DADDR=("sock_common", "skc_daddr"),
    RH_OFF_SKC_RCV_SADDR=("sock_common", "skc_rcv_saddr"),
    RH_OFF_SKC_DPORT=("sock_common", "skc_dport"),
    RH_OFF_INET_SPORT=("inet_sock", "inet_sport"),
    RH_OFF_SKC_FAMILY=("sock_common", "skc_family"),
    RH_OFF_SKC_STATE=("sock_common", "skc_state"),
    RH_OFF_SKC_V6_DADDR=("sock_common", "skc_v6_daddr"),
    RH_OFF_SKC_V6_RCV_SADDR=("sock_common", "skc_v6_rcv_saddr"),
)
SOCK_NETNS = netns_of("RH_OFF_SKC_NET", "sock_common", "skc_net")

TCP_LANE = H.ProbeSpec(
    source="ebpf.tcp",
    file="tcp_lane.bpf.c",
    preludes=RINGBUF,
    hooks=(
        H.Hook(
            "retransmit",
            (
                H.Variant(
                    "raw_tp",
                    "tcp_retransmit_skb",
                    "RH_RETRANS_RAW_TP",
                    (
                        H.raw_tp("tcp_retransmit_skb"),
                        SOCK_OFFSETS,
                        SOCK_NETNS,
                        H.raw_tp_nargs_flag("tcp_retransmit_skb", 3, "RH_RAW_RETRANS_HAS_ERR"),
                    ),
                ),
                H.Variant(
                    "tp",
                    "tcp:tcp_retransmit_skb",
                    "RH_RETRANS_TP",
                    (
                        H.tp("tcp", "tcp_retransmit_skb"),
                        H.tp_field_flag(
                            "tcp", "tcp_retransmit_skb", "err", "RH_TP_RETRANS_HAS_ERR"
                        ),
                    ),
                ),
            ),
        ),
        H.Hook(
            "sk_error",
            (
                H.Variant(
                    "raw_tp",
                    "inet_sk_error_report",
                    "RH_SKERR_RAW_TP",
                    (
                        H.raw_tp("inet_sk_error_report"),
                        SOCK_OFFSETS,
                        SOCK_NETNS,
                        H.offsets(
                            RH_OFF_SK_ERR=("sock", "sk_err"),
                            RH_OFF_SK_PROTOCOL=("sock", "sk_protocol"),
                        ),
                    ),
                ),
                H.Variant(
                    "tp",
                    "sock:inet_sk_error_report",
                    "RH_SKERR_TP",
                    (H.tp("sock", "inet_sk_error_report"),),
                ),
            ),
        ),
        H.Hook(
            "loss",
            (
                H.Variant(
                    "raw_tp",
                    "tcp_cong_state_set",
                    "RH_LOSS_RAW_TP",
                    (H.raw_tp("tcp_cong_state_set"), SOCK_OFFSETS, SOCK_NETNS),
                ),
                H.Variant(
                    "tp",
                    "tcp:tcp_cong_state_set",
                    "RH_LOSS_TP",
                    (H.tp("tcp", "tcp_cong_state_set"),),
                ),
            ),
        ),
    ),
)


class TcpLaneSource(EbpfSource):
    """TCP trouble on lane sockets, matched by port: ``add_port(p)`` (local port of a lane socket)
    or ``add_port(p, remote=True)`` (its peer's port). Works before and after ``start``.
    ``netns``: see :class:`NetnsFilter` (ports are per netns)."""

    LOCAL = 1
    REMOTE = 2

    def __init__(
        self,
        bpf_dir: Path | None = None,
        root: str = "/",
        allow: frozenset[str] | None = None,
        netns: str | None = None,
    ) -> None:
        super().__init__(TCP_LANE, bpf_dir, root, allow)
        self.netns = NetnsFilter(netns, root)
        self._ports: dict[int, int] = {}
        self._lock = threading.Lock()

    def add_port(self, port: int, remote: bool = False) -> None:
        if not 0 < port < 65536:
            raise EbpfError(f"bad port {port}")
        with self._lock:
            self._ports[port] = self._ports.get(port, 0) | (self.REMOTE if remote else self.LOCAL)
            self._sync(port)

    def remove_port(self, port: int) -> None:
        with self._lock:
            self._ports.pop(port, None)
            self._sync(port)

    def ports(self) -> dict[int, int]:
        with self._lock:
            return dict(self._ports)

    def _sync(self, port: int) -> None:
        if self._bpf is None:
            return
        table = self._bpf[b"rh_lane_ports"]
        key = table.Key(port)
        flags = self._ports.get(port)
        if flags is None:
            with contextlib.suppress(KeyError):
                del table[key]
        else:
            table[key] = table.Leaf(flags)

    def start_sync(self, emit: Emit) -> list[Capability]:
        try:
            self.netns.resolve()
        except OSError as e:
            return H.all_skipped(self.spec, Reason.NOT_AVAILABLE, f"netns {self.netns.netns}: {e}")
        return super().start_sync(emit)

    def filter_event(self, ev: Event) -> Event | None:
        return ev if self.netns.keep(ev) else None

    def after_load(self, bpf: Any) -> None:
        with self._lock:
            for port in self._ports:
                self._sync(port)
