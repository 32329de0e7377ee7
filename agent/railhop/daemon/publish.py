"""Pure: the health model and a plan as the published health table (:func:`to_published`)
and as failover-trace decisions (:func:`decisions`)."""

from __future__ import annotations

import math

from railhop import health, tracing
from railhop.control import Backup, Distance, NicHealth, NicState, NodeSettings, Reason
from railhop.daemon.translate import ifname_of
from railhop.policy import Plan, Policy
from railhop.topology import Topology

_STATE = {
    health.NicState.UP: NicState.UP,
    health.NicState.SUSPECT: NicState.SUSPECT,
    health.NicState.DOWN: NicState.DOWN,
    health.NicState.RECOVERING: NicState.RECOVERING,
}


def published_state(h: health.NicHealth, params: health.HealthParams) -> NicState:
    """The table state of a NIC. A NIC that went DOWN with its link up and is past its hold-off
    waits in RECOVERING for evidence (a lane of a plugin up or failed back on it); plugins treat
    a RECOVERING NIC as down and would never try it, so it is published as SUSPECT ("probe
    before you trust it"): plugins may fail back onto it and run their confirming probe, while
    the agent's plans still never offer it as a backup (the model keeps it not usable)."""
    if (
        h.state is health.NicState.RECOVERING
        and h.need_evidence
        and h.probes_ok < health.probes_needed(h, params)
    ):
        return NicState.SUSPECT
    return _STATE[h.state]


def reason_code(reason: str) -> Reason:
    """The table's reason code for a health-model reason text (first match wins)."""
    r = reason.lower()
    for words, code in (
        (("while recovering", "hold-off"), Reason.FLAPPING),
        (("carrier", "link down"), Reason.CARRIER),
        (("device fatal",), Reason.DEVICE_FATAL),
        (("admin",), Reason.ADMIN),
        (("lane timeout",), Reason.LANE_TIMEOUT),
        (("lane error",), Reason.LANE_ERROR),
        (("counter",), Reason.COUNTERS),
        (("tcp",), Reason.TCP),
        (("initial", "recovered", "quiet", "probe ok"), Reason.NONE),
    ):
        if any(w in r for w in words):
            return code
    return Reason.OTHER


def _weight(w: float) -> int:
    if w <= 0 or math.isnan(w):
        return 0
    return max(1, min(0xFFFF, round(w * 10000)))


MAX_PLUGIN_BACKUP_LANES = 8  # RAILHOP_BACKUP_LANES' range is 1..8


def node_settings(policy: Policy) -> NodeSettings:
    """Pure: the policy's settings every plugin on the node applies (unless a job sets the
    RAILHOP_* variable): ``timeouts``, ``health.migrate_on_suspect``, ``rail_rule`` and
    ``distance_limit`` (when the file sets them), ``spreading.max_nics`` (as the plugins'
    backup lanes, at most 8); and ``health.min_rails_up`` for ``railhop status --check``."""
    t = policy.timeouts

    def ms(s: float | None) -> int:
        return 0 if s is None else max(1, round(s * 1000))  # 0: not set by the policy

    return NodeSettings(
        completion_ms=ms(t.completion_s),
        probe_ms=ms(t.probe_s),
        failback_interval_ms=ms(t.failback_interval_s),
        migrate_on_suspect=policy.health.migrate_on_suspect,
        rail_rule=policy.rule.kind.value if "rail_rule" in policy.explicit else None,
        rail_pairs=policy.rule.pairs,
        distance_limit=(
            Distance(policy.distance_limit.value) if "distance_limit" in policy.explicit else None
        ),
        backup_lanes=min(policy.spreading.max_nics, MAX_PLUGIN_BACKUP_LANES),
        min_rails_up=policy.health.min_rails_up,
    )


def to_published(
    model: health.HealthModel, topo: Topology, result: Plan
) -> tuple[list[NicHealth], dict[str, list[Backup]]]:
    """Pure: the health table's content for this health model and plan."""
    by_name = {n.name: n for n in topo.nics}
    nics: list[NicHealth] = []
    for n in topo.nics:
        key = ifname_of(n)
        h = model.nics.get(key)
        if h is None:
            continue
        rail = result.rails.get(n.name)
        nics.append(
            NicHealth(
                ifname=key,
                state=published_state(h, model.params),
                since_ns=max(0, int(h.since * 1e9)),
                reason=reason_code(h.reason),
                rail=rail[0] if rail is not None else n.rail,
                pci=n.pci.bdf if n.pci is not None else "",
                numa=n.numa_node if n.numa_node is not None and n.numa_node >= 0 else None,
                speed_mbps=n.speed_mbps or 0,
            )
        )
    published = {x.ifname for x in nics}
    plans: dict[str, list[Backup]] = {}
    for entry in result.entries:
        owner = by_name.get(entry.nic)
        if owner is None or ifname_of(owner) not in published:
            continue
        backups = []
        for p in entry.pairs:
            local = by_name.get(p.local)
            if local is None or ifname_of(local) not in published:
                continue
            backups.append(
                Backup(
                    local_nic=ifname_of(local),
                    remote_rail=p.remote[0],
                    weight=_weight(p.weight),
                    distance=Distance[p.distance.name],
                )
            )
        if backups:
            plans[ifname_of(owner)] = backups
    return nics, plans


def decisions(
    topo: Topology, result: Plan, policy: str, start_ns: int, end_ns: int
) -> list[tracing.Decision]:
    """Pure: the plan entries of not-usable NICs as tracing decisions (keyed by ifname)."""
    by_name = {n.name: n for n in topo.nics}
    out = []
    for e in result.entries:
        owner = by_name.get(e.nic)
        if owner is None:
            continue
        pairs = []
        for p in e.pairs:
            local = by_name.get(p.local)
            pairs.append(
                tracing.Pair(
                    local=ifname_of(local) if local is not None else p.local,
                    rail=p.remote[0],
                    plane=p.remote[1],
                    weight=p.weight,
                    distance=p.distance.name,
                )
            )
        out.append(
            tracing.Decision(
                ifname_of(owner), policy, e.action, tuple(pairs), start_ns, max(start_ns, end_ns)
            )
        )
    return out
