"""Backup planning: a pure function from (topology, health, policy) to ranked, weighted backups.

For every managed NIC (one with a rail) that is not usable, :func:`plan` lists the healthy local
NICs that may carry its traffic, each with the remote network (rail, plane) a lane from it should
use, and a weight. Rules, in order (documented for the C plugin in docs/policy.md):

1. a backup NIC is UP, managed, not excluded, and not the failed NIC;
2. its distance class from the failed NIC is at most ``policy.distance_limit``;
3. the remote end must be a network the rail rule allows from the backup's network; preferred is
   the backup's own network (same rail: no spine hop), then the failed NIC's network (the peer
   keeps its NIC), then the other networks in (rail, plane) order;
4. weights spread the failed NIC's traffic by water-filling: every NIC starts loaded with its own
   traffic (its capacity), failed NICs are handled in (rail, plane, name) order and each one's
   traffic raises the least-utilised eligible NICs to a common level, so earlier moves count.
   ``spreading.max_nics`` keeps only the closest (then least loaded) backups,
   ``spreading.min_weight`` drops tiny shares. Weights of one failed NIC sum to 1.
5. pairs are ranked by distance class, then weight (larger first), then network and name.

DOWN and RECOVERING NICs get ``action="migrate"``; SUSPECT ones get ``"standby"`` (a ready
plan that is not applied unless ``health.migrate_on_suspect``), and their traffic is not counted
as moved. An entry without pairs means: no compatible backup, escalate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from railhop.health import NicState
from railhop.policy.model import Network, Policy
from railhop.policy.rails import resolve_rails
from railhop.topology import DistanceClass, Nic, Topology

__all__ = ["BackupPair", "Plan", "PlanEntry", "plan", "water_fill"]

Action = Literal["migrate", "standby"]


@dataclass(frozen=True)
class BackupPair:
    local: str  # backup NIC on this node
    remote: Network  # preferred remote (rail, plane) for lanes from ``local``
    alternates: tuple[Network, ...]  # other remote networks the rail rule allows, in order
    distance: DistanceClass  # of ``local`` from the failed NIC
    weight: float  # share of the failed NIC's traffic (0 = ranked fallback only)


@dataclass(frozen=True)
class PlanEntry:
    nic: str  # the NIC that is not usable
    network: Network
    state: NicState
    action: Action
    pairs: tuple[BackupPair, ...]  # ranked, best first

    @property
    def escalate(self) -> bool:
        """No compatible backup: requests on this NIC must fail (ncclRemote/SystemError)."""
        return not self.pairs


@dataclass(frozen=True)
class Plan:
    entries: tuple[PlanEntry, ...]
    rails: Mapping[str, Network]  # every managed NIC
    loads: Mapping[str, float]  # expected utilisation of each usable NIC after migrations
    warnings: tuple[str, ...] = ()

    def entry(self, nic: str) -> PlanEntry | None:
        return next((e for e in self.entries if e.nic == nic), None)


def water_fill(loads: Sequence[float], caps: Sequence[float], amount: float) -> list[float]:
    """Split ``amount`` over bins so the least-utilised ones rise to a common level.

    Bin ``i`` holds ``loads[i]`` with capacity ``caps[i]`` (> 0). Returns the share added to
    each bin (summing to ``amount``): the level ``u`` solves ``sum(max(0, u*c - l)) = amount``.
    """
    n = len(loads)
    if n == 0:
        return []
    if amount <= 0:
        return [0.0] * n
    order = sorted(range(n), key=lambda i: loads[i] / caps[i])
    util = [loads[i] / caps[i] for i in order]
    level = 0.0
    sum_l = sum_c = 0.0
    for k, i in enumerate(order):
        sum_l += loads[i]
        sum_c += caps[i]
        level = (amount + sum_l) / sum_c
        if k + 1 == n or level <= util[k + 1]:
            break
    return [max(0.0, level * caps[i] - loads[i]) for i in range(n)]


def plan(topology: Topology, health: Mapping[str, NicState], policy: Policy) -> Plan:
    """Ranked, weighted backup pairs for every managed NIC that is not usable (pure)."""
    assignment = resolve_rails(topology, policy)
    rails = dict(assignment.rails)
    managed = sorted(
        (n for n in topology.nics if n.name in rails), key=lambda n: (rails[n.name], n.name)
    )
    warnings = [
        f"policy names NIC {u!r}, which this node does not have" for u in assignment.unmatched
    ]

    def state(n: Nic) -> NicState:
        for name in (n.name, n.netdev, n.pci.bdf if n.pci else None):
            if name is not None and name in health:
                return health[name]
        return NicState.UP

    # capacities: NIC speeds when every managed NIC reports one, else all equal
    speeds = [n.speed_mbps for n in managed]
    caps = {n.name: float(n.speed_mbps) if all(speeds) and n.speed_mbps else 1.0 for n in managed}
    usable = [n for n in managed if state(n).usable]
    load = {n.name: caps[n.name] for n in usable}
    networks = sorted(set(rails.values()))

    failed = [n for n in managed if not state(n).usable]
    failed.sort(key=lambda n: (state(n) is NicState.SUSPECT, rails[n.name], n.name))
    entries = []
    for f in failed:
        st = state(f)
        action: Action = "standby" if st is NicState.SUSPECT else "migrate"
        pairs = _pairs(
            topo=topology,
            policy=policy,
            failed=f,
            usable=usable,
            rails=rails,
            networks=networks,
            load=load,
            caps=caps,
        )
        if action == "migrate":
            for p in pairs:
                load[p.local] += p.weight * caps[f.name]
        entries.append(PlanEntry(f.name, rails[f.name], st, action, pairs))
        if not pairs:
            warnings.append(f"{f.name} is {st.value} and has no compatible backup: escalate")
    utilisation = {name: load[name] / caps[name] for name in load}
    return Plan(tuple(entries), rails, utilisation, tuple(warnings))


def _pairs(
    *,
    topo: Topology,
    policy: Policy,
    failed: Nic,
    usable: Sequence[Nic],
    rails: Mapping[str, Network],
    networks: Sequence[Network],
    load: Mapping[str, float],
    caps: Mapping[str, float],
) -> tuple[BackupPair, ...]:
    fnet = rails[failed.name]
    cands: list[tuple[Nic, DistanceClass, Network, tuple[Network, ...]]] = []
    for n in usable:
        if n.name == failed.name:
            continue
        dist = topo.nic_distance(failed, n)
        if dist > policy.distance_limit:
            continue
        own = rails[n.name]
        order = [own, fnet, *networks]
        remotes = [r for r in dict.fromkeys(order) if policy.rule.allows(own, r)]
        if not remotes:
            continue
        cands.append((n, dist, remotes[0], tuple(remotes[1:])))
    if not cands:
        return ()
    cands.sort(key=lambda c: (c[1], load[c[0].name] / caps[c[0].name], rails[c[0].name], c[0].name))
    if policy.spreading.max_nics > 0:
        cands = cands[: policy.spreading.max_nics]
    names = [c[0].name for c in cands]
    active = list(names)
    while True:
        shares = water_fill([load[n] for n in active], [caps[n] for n in active], caps[failed.name])
        weights = {n: s / caps[failed.name] for n, s in zip(active, shares, strict=True)}
        small = [n for n in active if 0 < weights[n] < policy.spreading.min_weight]
        if not small or len(active) == 1:
            break
        active.remove(min(small, key=lambda n: (weights[n], n)))
    total = sum(weights.values())
    pairs = [
        BackupPair(
            local=n.name,
            remote=remote,
            alternates=alts,
            distance=dist,
            weight=(weights.get(n.name, 0.0) / total) if total > 0 else 0.0,
        )
        for n, dist, remote, alts in cands
    ]
    pairs.sort(key=lambda p: (p.distance, -p.weight, rails[p.local], p.local))
    return tuple(pairs)
