"""Which rail (and plane) each NIC of a node is on: from the policy, or derived automatically."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from railhop.policy.model import Network, Policy, RailMode
from railhop.topology import Topology, auto_rails

__all__ = ["RailAssignment", "resolve_rails"]


@dataclass(frozen=True)
class RailAssignment:
    rails: Mapping[str, Network]  # NIC name -> (rail, plane)
    unmatched: tuple[str, ...] = ()  # policy entries naming no NIC of this node

    def apply(self, topo: Topology) -> Topology:
        """``topo`` with every NIC's ``rail``/``plane`` set from this assignment."""
        return topo.with_rails(self.rails)


def resolve_rails(topo: Topology, policy: Policy) -> RailAssignment:
    """Rails for ``topo`` under ``policy.rails``.

    ``auto``: :func:`railhop.topology.auto_rails` (compute NICs numbered in nearest-GPU order),
    then ``assign`` entries override or add NICs. ``explicit``: only ``assign`` entries.
    ``exclude`` removes NICs in both modes. NICs are matched by RDMA device name, netdev name or
    PCI address; entries that match nothing are reported in ``unmatched`` (a site policy may
    name NICs a given node lacks).
    """
    rails: dict[str, Network] = dict(auto_rails(topo)) if policy.rails.mode is RailMode.AUTO else {}
    unmatched: list[str] = []
    for a in policy.rails.assign:
        nic = topo.find_nic(a.key)
        if nic is None:
            unmatched.append(a.key)
            continue
        rails[nic.name] = (a.rail, a.plane)
    for name in policy.rails.exclude:
        nic = topo.find_nic(name)
        if nic is None:
            unmatched.append(name)
            continue
        rails.pop(nic.name, None)
    return RailAssignment(rails, tuple(unmatched))
