"""railhop.policy.plan: concrete plans on the fixture nodes and properties (hypothesis)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from railhop.health import NicState
from railhop.policy import (
    Plan,
    Policy,
    RailAssign,
    RailMode,
    RailRule,
    Rails,
    RuleKind,
    Spreading,
    load_policy,
    parse_policy,
    plan,
    resolve_rails,
    water_fill,
)
from railhop.topology import DistanceClass, Topology, read_topology

ROOT = Path(__file__).resolve().parents[2]
SYS = ROOT / "tests/fixtures/sys"
DGX = read_topology(SYS / "dgx-h100")
MULTI = read_topology(SYS / "multiplane")
ETH = read_topology(SYS / "ethernet")
RAIL_OPT = load_policy(ROOT / "policies/rail-optimized-8nic.yaml")
MULTI_POL = load_policy(ROOT / "policies/multi-plane.yaml")
PERMISSIVE = load_policy(ROOT / "policies/permissive.yaml")
DOWN, UP, SUSPECT, RECOVERING = NicState.DOWN, NicState.UP, NicState.SUSPECT, NicState.RECOVERING


def weights(p: Plan, nic: str) -> dict[str, float]:
    e = p.entry(nic)
    assert e is not None
    return {x.local: x.weight for x in e.pairs}


# --- concrete plans on the DGX fixture ----------------------------------------------------


def test_dgx_lose_nic2_spreads_over_same_socket() -> None:
    p = plan(DGX, {"mlx5_2": DOWN}, RAIL_OPT)
    assert [e.nic for e in p.entries] == ["mlx5_2"]
    e = p.entries[0]
    assert e.action == "migrate" and e.network == (2, 0) and not e.escalate
    assert weights(p, "mlx5_2") == pytest.approx(
        {"mlx5_0": 1 / 3, "mlx5_1": 1 / 3, "mlx5_3": 1 / 3}
    )
    for pair in e.pairs:
        assert pair.distance is DistanceClass.NODE
        own = p.rails[pair.local]
        assert pair.remote == own  # same rail first: no spine hop
        assert pair.alternates[0] == (2, 0)  # then the failed NIC's rail (peer keeps its NIC)
        assert all(r[0] < 4 for r in pair.alternates)  # cross-rail only within the socket group
    assert p.loads == pytest.approx(
        {"mlx5_0": 4 / 3, "mlx5_1": 4 / 3, "mlx5_3": 4 / 3}
        | {f"mlx5_{i}": 1.0 for i in range(4, 8)}
    )
    assert p.warnings == ()


def test_dgx_two_failures_on_one_socket() -> None:
    p = plan(DGX, {"mlx5_2": DOWN, "ibp93s0": DOWN}, RAIL_OPT)  # health keyed by netdev works
    assert [e.nic for e in p.entries] == ["mlx5_2", "mlx5_3"]
    assert weights(p, "mlx5_2") == pytest.approx({"mlx5_0": 0.5, "mlx5_1": 0.5})
    assert weights(p, "mlx5_3") == pytest.approx({"mlx5_0": 0.5, "mlx5_1": 0.5})
    assert p.loads["mlx5_0"] == pytest.approx(2.0) and p.loads["mlx5_4"] == 1.0


def test_dgx_socket_lost_escalates_under_node_limit() -> None:
    health = {f"mlx5_{i}": DOWN for i in range(4)}
    p = plan(DGX, health, RAIL_OPT)
    assert all(e.escalate for e in p.entries)
    assert len(p.warnings) == 4 and "escalate" in p.warnings[0]
    # a SYS distance limit with any rail pair crosses the socket instead
    wide = dataclasses.replace(PERMISSIVE, distance_limit=DistanceClass.SYS)
    p = plan(DGX, health, wide)
    for i in range(4):
        assert weights(p, f"mlx5_{i}") == pytest.approx({f"mlx5_{j}": 0.25 for j in range(4, 8)})
    assert p.loads == pytest.approx({f"mlx5_{j}": 2.0 for j in range(4, 8)})


def test_storage_and_management_nics_never_used() -> None:
    wide = dataclasses.replace(PERMISSIVE, distance_limit=DistanceClass.SYS)
    p = plan(DGX, {"mlx5_0": DOWN}, wide)
    assert set(weights(p, "mlx5_0")) == {f"mlx5_{i}" for i in range(1, 8)}
    assert set(p.rails) == {f"mlx5_{i}" for i in range(8)}
    # NICs with no rail get no plan entry, even when down
    assert plan(DGX, {"mlx5_8": DOWN, "eno1": DOWN}, wide).entries == ()


def test_same_rail_rule_pins_remote_to_own_rail() -> None:
    same = dataclasses.replace(RAIL_OPT, rule=RailRule(RuleKind.SAME_RAIL))
    p = plan(DGX, {"mlx5_2": DOWN}, same)
    for pair in p.entries[0].pairs:
        assert pair.remote == p.rails[pair.local] and pair.alternates == ()


def test_suspect_is_standby_and_not_counted() -> None:
    p = plan(DGX, {"mlx5_2": SUSPECT, "mlx5_1": RECOVERING}, RAIL_OPT)
    assert [(e.nic, e.action) for e in p.entries] == [("mlx5_1", "migrate"), ("mlx5_2", "standby")]
    assert weights(p, "mlx5_1") == pytest.approx({"mlx5_0": 0.5, "mlx5_3": 0.5})
    # the standby plan sees the load that really moved: mlx5_0 and mlx5_3 are at 1.5
    assert weights(p, "mlx5_2") == pytest.approx({"mlx5_0": 0.5, "mlx5_3": 0.5})
    assert p.loads["mlx5_0"] == pytest.approx(1.5)  # standby traffic not added


def test_load_already_moved_is_considered() -> None:
    wide = dataclasses.replace(
        PERMISSIVE, distance_limit=DistanceClass.SYS, spreading=Spreading(max_nics=5)
    )
    p = plan(DGX, {"mlx5_0": DOWN, "mlx5_4": DOWN}, wide)
    # mlx5_0: its 3 socket peers (NODE) first, then the 2 least loaded SYS NICs (rail order)
    assert weights(p, "mlx5_0") == pytest.approx({f"mlx5_{i}": 0.2 for i in (1, 2, 3, 5, 6)})
    # mlx5_4: mlx5_7 has received nothing yet, so it takes more
    w = weights(p, "mlx5_4")
    assert w == pytest.approx(
        {"mlx5_5": 0.16, "mlx5_6": 0.16, "mlx5_7": 0.36, "mlx5_1": 0.16, "mlx5_2": 0.16}
    )
    assert p.loads["mlx5_7"] == pytest.approx(p.loads["mlx5_5"]) == pytest.approx(1.36)


def test_capacity_weighted() -> None:
    nics = tuple(
        dataclasses.replace(n, speed_mbps=800000) if n.name == "mlx5_1" else n for n in DGX.nics
    )
    topo = dataclasses.replace(DGX, nics=nics)
    p = plan(topo, {"mlx5_2": DOWN}, RAIL_OPT)
    assert weights(p, "mlx5_2") == pytest.approx({"mlx5_0": 0.25, "mlx5_1": 0.5, "mlx5_3": 0.25})
    assert p.loads["mlx5_1"] == pytest.approx(1.25) == pytest.approx(p.loads["mlx5_0"])


def test_max_nics_prefers_closest_and_min_weight_drops_tiny_shares() -> None:
    p = plan(MULTI, {"mlx5_0": DOWN}, dataclasses.replace(MULTI_POL, spreading=Spreading(1)))
    assert weights(p, "mlx5_0") == {"mlx5_1": 1.0}  # the other plane behind the same switch
    pol = dataclasses.replace(MULTI_POL, spreading=Spreading(0, 0.3))
    p = plan(MULTI, {"mlx5_0": DOWN}, pol)
    # 1/3 each is above 0.3: kept
    assert weights(p, "mlx5_0") == pytest.approx(
        {"mlx5_1": 1 / 3, "mlx5_2": 1 / 3, "mlx5_3": 1 / 3}
    )
    p = plan(
        MULTI,
        {"mlx5_0": DOWN, "mlx5_4": DOWN},
        dataclasses.replace(pol, distance_limit=DistanceClass.SYS),
    )
    for e in p.entries:
        assert all(x.weight == 0 or x.weight >= 0.3 for x in e.pairs)
        assert sum(x.weight for x in e.pairs) == pytest.approx(1.0)
        assert any(x.weight == 0 for x in e.pairs)  # dropped ones stay as ranked fallbacks


def test_multiplane_plan_ranks_other_plane_first() -> None:
    p = plan(MULTI, {"mlx5_0": DOWN}, MULTI_POL)
    pairs = p.entries[0].pairs
    assert pairs[0].local == "mlx5_1" and pairs[0].distance is DistanceClass.PIX
    assert pairs[0].remote == (0, 1)  # rail 0, plane 1: planes never meet
    assert {x.local for x in pairs} == {"mlx5_1", "mlx5_2", "mlx5_3"}
    for x in pairs:
        assert x.remote == p.rails[x.local] and x.alternates == ()


def test_ethernet_host_with_permissive_policy() -> None:
    p = plan(ETH, {"ens1f1": DOWN}, PERMISSIVE)
    assert weights(p, "ens1f1") == pytest.approx({"eth0": 0.5, "ens1f0": 0.5})
    pairs = p.entries[0].pairs
    assert pairs[0].local == "ens1f0" and pairs[0].distance is DistanceClass.PIX
    assert pairs[1].distance is DistanceClass.PHB


def test_explicit_rails_by_pci_and_unmatched_warning() -> None:
    pol = parse_policy(
        """
version: 1
rails:
  mode: explicit
  assign:
    - {pci: "0000:3B:00.0", rail: 7}
    - {nic: eth0, rail: 3}
    - {nic: nic9, rail: 1}
"""
    )
    ra = resolve_rails(ETH, pol)
    assert dict(ra.rails) == {"ens1f0": (7, 0), "eth0": (3, 0)} and ra.unmatched == ("nic9",)
    assert ra.apply(ETH).nic("ens1f0").rail == 7
    p = plan(ETH, {"eth0": DOWN}, pol)
    assert weights(p, "eth0") == {"ens1f0": 1.0}  # ens1f1 has no rail
    assert any("nic9" in w for w in p.warnings)


def test_exclude_removes_auto_rail() -> None:
    pol = dataclasses.replace(PERMISSIVE, rails=Rails(RailMode.AUTO, (), ("ens1f0",)))
    p = plan(ETH, {"ens1f1": DOWN}, pol)
    assert weights(p, "ens1f1") == {"eth0": 1.0}
    pol = dataclasses.replace(
        PERMISSIVE, rails=Rails(RailMode.AUTO, (RailAssign(rail=9, nic="veth0"),), ())
    )
    assert "veth0" not in plan(ETH, {}, pol).rails  # not a NIC of this topology


def test_virtual_nics_plan() -> None:
    """The emulated fabric: veth NICs (no PCI) named explicitly; distance NODE on one socket."""
    topo = read_topology(SYS / "ethernet", netdevs=["veth0", "br0"])
    assign = "[{nic: veth0, rail: 0}, {nic: br0, rail: 1}]"
    pol = parse_policy(f"version: 1\nrails: {{mode: explicit, assign: {assign}}}\n")
    p = plan(topo, {"veth0": DOWN}, pol)
    assert weights(p, "veth0") == {"br0": 1.0}
    assert p.entries[0].pairs[0].distance is DistanceClass.NODE


def test_water_fill() -> None:
    assert water_fill([], [], 1.0) == []
    assert water_fill([1, 1, 1], [1, 1, 1], 0) == [0, 0, 0]
    assert water_fill([1, 1, 1], [1, 1, 1], 3) == pytest.approx([1, 1, 1])
    assert water_fill([0, 2], [1, 1], 1) == pytest.approx([1, 0])
    assert water_fill([0, 2], [1, 1], 4) == pytest.approx([3, 1])
    assert water_fill([1, 2], [1, 2], 3) == pytest.approx([1, 2])


# --- properties ---------------------------------------------------------------------------

TOPOS = {"dgx": DGX, "multi": MULTI, "eth": ETH}
STATES = [UP, UP, UP, SUSPECT, DOWN, RECOVERING]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Topology, dict[str, NicState], Policy]:
    topo = TOPOS[draw(st.sampled_from(sorted(TOPOS)))]
    kind = draw(st.sampled_from(list(RuleKind)))
    pairs: frozenset[frozenset[int]] = frozenset()
    if kind is RuleKind.ALLOWED_PAIRS:
        raw = draw(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=10))
        pairs = frozenset(frozenset(x) for x in raw if x[0] != x[1])
    pol = Policy(
        rule=RailRule(kind, pairs),
        distance_limit=draw(st.sampled_from(list(DistanceClass)[1:])),
        spreading=Spreading(draw(st.integers(0, 4)), draw(st.sampled_from([0.0, 0.1, 0.3]))),
    )
    names = [n.name for n in topo.nics]
    health = {n: draw(st.sampled_from(STATES)) for n in names}
    return topo, health, pol


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_plan_properties(sc: tuple[Topology, dict[str, NicState], Policy]) -> None:
    topo, health, pol = sc
    p = plan(topo, health, pol)
    assert plan(topo, health, pol) == p  # pure and deterministic
    managed = set(p.rails)
    failed = {n for n in managed if health.get(n, UP) is not UP}
    assert {e.nic for e in p.entries} == failed
    for e in p.entries:
        f = topo.nic(e.nic)
        assert e.state is health[e.nic] and e.network == p.rails[e.nic]
        assert e.action == ("standby" if e.state is SUSPECT else "migrate")
        if pol.spreading.max_nics:
            assert len(e.pairs) <= pol.spreading.max_nics
        eligible = {
            n
            for n in managed
            if n != e.nic
            and health.get(n, UP) is UP
            and topo.nic_distance(f, topo.nic(n)) <= pol.distance_limit
        }
        if pol.spreading.max_nics == 0:
            assert {x.local for x in e.pairs} == eligible  # no eligible NIC is missed
        for x in e.pairs:
            assert health.get(x.local, UP) is UP  # never an unhealthy NIC
            assert x.local in managed and x.local != e.nic
            assert x.distance == topo.nic_distance(f, topo.nic(x.local))
            assert x.distance <= pol.distance_limit  # never beyond the distance limit
            own = p.rails[x.local]
            for remote in (x.remote, *x.alternates):
                assert pol.rule.allows(own, remote)  # never breaks the rail rule
            assert x.weight >= 0
            assert x.weight == 0 or x.weight >= pol.spreading.min_weight - 1e-9 or len(e.pairs) == 1
        if e.pairs:
            assert sum(x.weight for x in e.pairs) == pytest.approx(1.0)
        ranks = [(x.distance, -x.weight) for x in e.pairs]
        assert ranks == sorted(ranks)
    for name, u in p.loads.items():
        assert health.get(name, UP) is UP and u >= 1.0 - 1e-9


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(TOPOS)), st.data())
def test_single_failure_spreads_evenly(topo_name: str, data: st.DataObject) -> None:
    topo = TOPOS[topo_name]
    pol = Policy(distance_limit=DistanceClass.SYS)
    names = sorted(plan(topo, {}, pol).rails)
    victim = data.draw(st.sampled_from(names))
    p = plan(topo, {victim: DOWN}, pol)
    ws = [x.weight for x in p.entries[0].pairs]
    assert len(ws) == len(names) - 1
    assert ws == pytest.approx([1 / len(ws)] * len(ws))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["dgx", "multi"]), st.data())
def test_many_failures_balance_load(topo_name: str, data: st.DataObject) -> None:
    """With every healthy NIC eligible for every failed one, all end up equally loaded."""
    topo = TOPOS[topo_name]
    pol = Policy(distance_limit=DistanceClass.SYS)
    names = sorted(plan(topo, {}, pol).rails)
    down = data.draw(st.sets(st.sampled_from(names), min_size=1, max_size=len(names) - 1))
    p = plan(topo, dict.fromkeys(down, DOWN), pol)
    loads = list(p.loads.values())
    assert len(loads) == len(names) - len(down)
    assert loads == pytest.approx([len(names) / len(loads)] * len(loads))
