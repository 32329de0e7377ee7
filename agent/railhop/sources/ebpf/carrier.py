"""The netdev carrier source: carrier loss (and, with fentry, carrier up) of netdevs from
``bpf/carrier.bpf.c``, filtered by device and netns and deduplicated."""

from __future__ import annotations

from pathlib import Path

from railhop.sources import hooks as H
from railhop.sources.base import Capability, Emit, Reason
from railhop.sources.ebpf.netns import NetnsFilter, netns_of
from railhop.sources.ebpf.source import RINGBUF, EbpfSource
from railhop.sources.events import CarrierDown, Event

NETDEV_OFFSETS = H.offsets(
    RH_OFF_NETDEV_NAME=("net_device", "name"), RH_OFF_NETDEV_IFINDEX=("net_device", "ifindex")
)
NETDEV_NETNS = netns_of("RH_OFF_NETDEV_NET", "net_device", "nd_net")

CARRIER = H.ProbeSpec(
    source="ebpf.carrier",
    file="carrier.bpf.c",
    preludes=RINGBUF,
    hooks=(
        H.Hook(
            "carrier",
            (
                H.Variant(
                    "fentry",
                    "netif_carrier_off+on",
                    "RH_CARRIER_FENTRY",
                    (
                        H.funcs("netif_carrier_off", "netif_carrier_on"),
                        NETDEV_OFFSETS,
                        NETDEV_NETNS,
                    ),
                ),
                H.Variant(
                    "raw_tp",
                    "qdisc_reset",
                    "RH_CARRIER_RAW_TP",
                    (
                        H.raw_tp("qdisc_reset"),
                        NETDEV_OFFSETS,
                        NETDEV_NETNS,
                        H.offsets(
                            RH_OFF_NETDEV_STATE=("net_device", "state"),
                            RH_OFF_QDISC_DEV_QUEUE=("Qdisc", "dev_queue"),
                            RH_OFF_NETDEV_QUEUE_DEV=("netdev_queue", "dev"),
                        ),
                        H.enum_value(
                            "RH_NOCARRIER_BIT", "netdev_state_t", "__LINK_STATE_NOCARRIER"
                        ),
                        H.enum_value("RH_START_BIT", "netdev_state_t", "__LINK_STATE_START"),
                    ),
                ),
                H.Variant(
                    "tp", "qdisc:qdisc_reset", "RH_CARRIER_TP", (H.tp("qdisc", "qdisc_reset"),)
                ),
            ),
        ),
    ),
)


class CarrierDedup:
    """Collapses repeats: the qdisc proxies fire once per queue (several per device) and
    netif_carrier_off() is called again while carrier is already off. Pure; keyed by ifname."""

    def __init__(self, window_ns: int = 10_000_000) -> None:
        self.window_ns = window_ns
        self._last: dict[str, tuple[bool, int]] = {}

    def accept(self, ifname: str, down: bool, ts_ns: int) -> bool:
        if not ifname or ifname == "(null)":
            return False
        prev = self._last.get(ifname)
        self._last[ifname] = (down, ts_ns)
        if prev is None:
            return True
        pdown, pts = prev
        if pdown != down:
            return True
        if ts_ns - pts < self.window_ns:
            self._last[ifname] = prev  # keep the window anchored at the first one
            return False
        return True


class CarrierSource(EbpfSource):
    """Carrier loss (and, with fentry, carrier up) of netdevs, deduplicated.
    ``ifnames``: report only these devices (None = all); ``netns``: see :class:`NetnsFilter`."""

    def __init__(
        self,
        ifnames: set[str] | None = None,
        bpf_dir: Path | None = None,
        root: str = "/",
        allow: frozenset[str] | None = None,
        netns: str | None = None,
    ) -> None:
        super().__init__(CARRIER, bpf_dir, root, allow)
        self.ifnames = ifnames
        self.netns = NetnsFilter(netns, root)
        self._dedup = CarrierDedup()

    @property
    def dedup_window_ns(self) -> int:
        return self._dedup.window_ns

    def start_sync(self, emit: Emit) -> list[Capability]:
        try:
            self.netns.resolve()
        except OSError as e:
            return H.all_skipped(self.spec, Reason.NOT_AVAILABLE, f"netns {self.netns.netns}: {e}")
        return super().start_sync(emit)

    def filter_event(self, ev: Event) -> Event | None:
        name = getattr(ev, "ifname", "")
        if self.ifnames is not None and name not in self.ifnames:
            return None
        if not self.netns.keep(ev):
            return None
        if not self._dedup.accept(name, isinstance(ev, CarrierDown), ev.ts_ns):
            return None
        return ev
