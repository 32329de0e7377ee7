"""The one catalogue of the agent's sources: which exist, which group each belongs to, how each
is built. The agent (``railhop agent --sources``: a selection of groups) and the capability
report (``railhop sources``, ``railhop agent --check``: every group) both build theirs here.

Entries are in start order for the report (kernel hooks first); the agent starts the quick ones
first and the kernel hooks in the background (:meth:`railhop.sources.base.Registry.start`).
Each module is imported only when its entry is built: a source whose module cannot be imported
is logged and left out, the others carry on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from railhop.sources.base import Source

log = logging.getLogger("railhop.sources")


@dataclass(frozen=True)
class SourceOptions:
    """What the sources are built for."""

    ifnames: Sequence[str] | None = None  # netdevs to watch; None or empty: every netdev
    thresholds: Mapping[str, float] = field(default_factory=dict)  # sysfs counter -> per second
    root: str = "/"  # where the hooks' checks read /proc and /sys (a fixture tree in tests)
    counters_root: str | None = None  # sysfs root of counters and RDMA devices; None: ``root``
    hooks_netns: str | None = None  # kernel hooks keep this netns's events only ("self")
    netlink_netns: str | None = None  # the netns netlink listens in; None: this one
    plugin_lib: str | Path | None = None  # the plugin library for USDT; None: no USDT source
    rdma_devices: Sequence[str] | None = None  # verbs: these devices only; None: every one


def _names(o: SourceOptions) -> set[str] | None:
    return set(o.ifnames) if o.ifnames else None


def _carrier(o: SourceOptions) -> Source:
    from railhop.sources.ebpf.carrier import CarrierSource

    return CarrierSource(ifnames=_names(o), root=o.root, netns=o.hooks_netns)


def _tcp_lane(o: SourceOptions) -> Source:
    from railhop.sources.ebpf.tcp import TcpLaneSource

    return TcpLaneSource(root=o.root, netns=o.hooks_netns)


def _rdma_driver(o: SourceOptions) -> Source:
    from railhop.sources.ebpf.rdma import RdmaDriverSource

    return RdmaDriverSource(root=o.root)


def _netlink(o: SourceOptions) -> Source:
    from railhop.sources.netlink import NetlinkSource

    return NetlinkSource(ifnames=_names(o), netns=o.netlink_netns)


def _sysfs(o: SourceOptions) -> Source:
    from railhop.sources.sysfs import SysfsCounterSource

    root = o.counters_root if o.counters_root is not None else o.root
    return SysfsCounterSource(dict(o.thresholds), ifnames=list(o.ifnames or []), root=root)


def _verbs(o: SourceOptions) -> Source:
    from railhop.sources.verbs import VerbsSource

    root = o.counters_root if o.counters_root is not None else o.root
    return VerbsSource(root=root, devices=o.rdma_devices)


def _usdt(o: SourceOptions) -> Source | None:
    if o.plugin_lib is None:
        return None
    from railhop.sources.usdt import UsdtSource

    return UsdtSource(o.plugin_lib, root=o.root)


def _verbs_usdt(o: SourceOptions) -> Source | None:
    if o.plugin_lib is None:
        return None
    from railhop.sources.verbs_usdt import VerbsUsdtSource

    return VerbsUsdtSource(o.plugin_lib, root=o.root)


@dataclass(frozen=True)
class Entry:
    group: str  # what ``--sources`` names
    what: str  # for messages
    build: Callable[[SourceOptions], Source | None]  # None: not applicable to these options


CATALOGUE: tuple[Entry, ...] = (
    Entry("ebpf", "eBPF carrier", _carrier),  # carrier loss (raw tracepoint / qdisc proxy)
    Entry("ebpf", "eBPF TCP lane", _tcp_lane),  # retransmits, errors, loss on lane sockets
    Entry("rdma", "eBPF RDMA driver", _rdma_driver),  # ib_dispatch_event, rdma_cm, mlx5 cmds
    Entry("netlink", "netlink", _netlink),  # link events
    Entry("sysfs", "sysfs counter", _sysfs),  # error counters past their thresholds
    Entry("verbs", "verbs", _verbs),  # verbs async events
    Entry("usdt", "USDT", _usdt),  # the plugin's own probes (lane events, bytes, latency)
    Entry("usdt", "USDT verbs", _verbs_usdt),  # the verbs lane's completions and async events
)
GROUPS: tuple[str, ...] = tuple(dict.fromkeys(e.group for e in CATALOGUE))


def build_sources(options: SourceOptions, groups: Collection[str] = GROUPS) -> list[Source]:
    """The sources of ``groups`` for ``options``, in catalogue order; one whose module cannot
    be imported or built is logged and left out."""
    out: list[Source] = []
    for e in CATALOGUE:
        if e.group not in groups:
            continue
        try:
            s = e.build(options)
        except Exception as ex:  # a broken source must not stop the agent
            log.warning("%s source unavailable: %s", e.what, ex)
            continue
        if s is not None:
            out.append(s)
    return out
