"""The agent's rail gauges (issue 39, item 4: the alert RailhopRailsBelowMinimum):
``railhop_rails``, ``railhop_rails_up`` and ``railhop_rails_up_min`` follow the published table
with the count ``railhop status --check --nics`` makes (``rail_counts``), the policy's
``health.min_rails_up`` included."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import yaml
from agent_fakes import FakeSource, until

from railhop import daemon
from railhop.control import NicHealth, NicState, NodeSettings, read_table
from railhop.control.layout import TableSnapshot
from railhop.control.status import check_nics, rail_counts
from railhop.metrics import AgentMetrics
from railhop.sources import events as sev

REPO = Path(__file__).resolve().parents[2]
DGX = REPO / "tests" / "fixtures" / "sys" / "dgx-h100"
POLICY = REPO / "policies" / "rail-optimized-8nic.yaml"


def _nics(*states: tuple[NicState, int | None]) -> list[NicHealth]:
    return [NicHealth(f"nic{i}", s, 1, rail=r) for i, (s, r) in enumerate(states)]


UP, DOWN, SUSPECT = NicState.UP, NicState.DOWN, NicState.SUSPECT


@pytest.mark.parametrize(
    ("nics", "min_up", "want"),
    [
        (_nics((UP, 0), (UP, 1), (UP, 2), (UP, 3)), 0, (4, 4, 4)),
        (_nics((UP, 0), (DOWN, 1), (UP, 2), (UP, 3)), 0, (3, 4, 4)),
        (_nics((UP, 0), (DOWN, 1), (UP, 2), (UP, 3)), 3, (3, 4, 3)),
        (_nics((UP, 0), (SUSPECT, 1)), 0, (1, 2, 2)),  # SUSPECT is not up
        (_nics((DOWN, 0), (UP, 0), (UP, 1)), 0, (2, 2, 2)),  # a rail with one NIC up is up
        (_nics((UP, None), (DOWN, None)), 0, (1, 2, 2)),  # no rail: a rail of its own
        ([], 0, (0, 0, 0)),
    ],
)
def test_rail_counts_are_what_status_check_nics_counts(
    nics: list[NicHealth], min_up: int, want: tuple[int, int, int]
) -> None:
    assert rail_counts(nics, min_up) == want
    snap = TableSnapshot(
        generation=1, agent_pid=1, agent_start_ticks=1, agent_pidns=1, seq=1, heartbeat_ns=1,
        flags=0, publish_count=1, publish_ns=1, heartbeat_ms=100, nics=tuple(nics),
        changes=(), settings=NodeSettings(min_rails_up=min_up),
    )  # fmt: skip
    r = check_nics(snap)
    assert (r.rails_up, r.rails_total, r.min_rails_up) == want


def test_the_gauges_are_exported_under_the_alerts_names() -> None:
    m = AgentMetrics(nics=["nic0"])
    text = m.render().decode()
    for name in ("railhop_rails", "railhop_rails_up", "railhop_rails_up_min"):
        assert f"# TYPE {name} gauge" in text
        assert m.registry.get_sample_value(name) == 0  # before the first publish: no alert
    m.set_rails(6, 8, 7)
    assert m.registry.get_sample_value("railhop_rails_up") == 6
    assert m.registry.get_sample_value("railhop_rails") == 8
    assert m.registry.get_sample_value("railhop_rails_up_min") == 7
    alerts = (REPO / "deploy/helm/railhop/files/alerts.yaml").read_text()
    assert "railhop_rails_up_min" in alerts and "railhop_rails_up)" in alerts


def test_the_agent_sets_the_gauges_from_what_it_publishes(tmp_path: Path) -> None:
    """A live agent on the DGX fixture with a policy that wants 7 rails: the gauges equal
    `railhop status --check --nics` on the table it publishes, before and after two rails'
    NICs go down."""
    doc = yaml.safe_load(POLICY.read_text())
    doc["health"]["min_rails_up"] = 7
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / "run"
    src = FakeSource()
    metrics = AgentMetrics(nics=[], sys_root=DGX)
    cfg = daemon.AgentConfig(policy_path=policy, run_dir=run_dir, sys_root=DGX, heartbeat_ms=50)
    agent = daemon.Agent(cfg, source_factory=lambda c, t, p: [src], metrics=metrics)

    def gauges() -> tuple[float | None, ...]:
        g = metrics.registry.get_sample_value
        return g("railhop_rails_up"), g("railhop_rails"), g("railhop_rails_up_min")

    def checked() -> tuple[int, int, int]:
        r = check_nics(read_table(run_dir / "health.tbl"))
        return r.rails_up, r.rails_total, r.min_rails_up

    async def body() -> None:
        task = asyncio.create_task(agent.run())
        await until(lambda: src.emit is not None and gauges()[1] not in (None, 0.0))
        total = checked()[1]
        assert total >= 8  # the 8 compute rails, and the NICs without one
        assert gauges() == checked() == (total, total, 7)
        snap = read_table(run_dir / "health.tbl")
        rails = {n.ifname: n.rail for n in snap.nics}
        assert rails["ibp25s0"] is not None and rails["ibp59s0"] is not None
        assert rails["ibp25s0"] != rails["ibp59s0"]
        assert sum(r == rails["ibp25s0"] for r in rails.values()) == 1  # the rail's one NIC
        for nic in ("ibp25s0", "ibp59s0"):
            assert src.emit is not None
            src.emit(sev.CarrierDown(ts_ns=time.monotonic_ns(), source="fake", ifname=nic))
        await until(lambda: gauges()[0] == total - 2)
        assert gauges() == checked() == (total - 2, total, 7)
        agent.request_stop()
        assert await asyncio.wait_for(task, 10) == 0

    asyncio.run(body())
