"""Network namespaces in the kernel hooks: the offset chain a probe uses to read the netns
inode of a ``struct net``, and the filter that keeps one namespace's events."""

from __future__ import annotations

from railhop.sources import hooks as H
from railhop.sources import kernel
from railhop.sources.events import Event

# netns inode of a struct net: net.ns.inum (what stat(/proc/<pid>/ns/net).st_ino shows)
NET_INUM = H.offset_chain("RH_OFF_NET_INUM", ("net", "ns"), ("ns_common", "inum"))


def netns_of(macro: str, struct: str, field: str) -> H.Requirement:
    """The offsets a probe needs to read the netns inode from ``struct.field`` (a
    ``possible_net_t``), under ``macro``; optional: where the kernel's BTF lacks them the
    program is built with ``-DRH_NO_NETNS`` and its events carry no netns (they pass the
    filter)."""
    return H.optional(
        H.compose(NET_INUM, H.offset_chain(macro, (struct, field), ("possible_net_t", "net"))),
        ["-DRH_NO_NETNS"],
    )


class NetnsFilter:
    """Keeps events of one network namespace (by inode). Events whose hook cannot see the netns
    (``netns_ino == 0``: plain tracepoints) pass. ``netns``: None = no filter, ``"self"``, or a
    name under /var/run/netns; resolved at ``start``."""

    def __init__(self, netns: str | None, root: str) -> None:
        self.netns = netns
        self._root = root
        self.ino = 0

    def resolve(self) -> None:
        self.ino = kernel.netns_inode(self.netns, self._root) if self.netns else 0

    def keep(self, ev: Event) -> bool:
        ino = getattr(ev, "netns_ino", 0)
        return not self.ino or not ino or ino == self.ino
