"""The agent's shell-readable health (railhop.daemon.nodestatus): ``node-status``'s format (the
same rail count as ``railhop status --check --nics``), its parser, the NFD feature file, and the
agent writing both on the DGX H100 fixture: rewritten when a NIC goes down and on its refresh
interval, "gone" (and the NFD file removed) at a clean shutdown. The check script that reads
``node-status`` with busybox: tests/unit/test_npd_check_script.py."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agent_fakes import FakeSource, until

from railhop import daemon
from railhop.control import NicHealth, NicState, NodeSettings, Reason, TableSnapshot
from railhop.control.status import check_nics
from railhop.daemon.nodestatus import (
    NFD_FEATURE_FILE,
    NODE_STATUS_FILE,
    NodeStatusError,
    format_node_status,
    nfd_features,
    node_status,
    parse_node_status,
    stale_bound_s,
)
from railhop.sources import events as sev

REPO = Path(__file__).resolve().parents[2]
DGX = REPO / "tests" / "fixtures" / "sys" / "dgx-h100"

NICS = [
    NicHealth("nic0", NicState.UP, rail=0),
    NicHealth("nic1", NicState.UP, rail=1),
    NicHealth("nic2", NicState.DOWN, reason=Reason.CARRIER, rail=2),
    NicHealth("nic3", NicState.SUSPECT, reason=Reason.LANE_TIMEOUT, rail=3),
]


def test_format_is_versioned_lines_with_the_check_count() -> None:
    st = node_status(NICS, 0, heartbeat_s=1_700_000_000, refresh_s=5, agent_pid=42)
    text = format_node_status(st).decode()
    assert text.endswith("\n") and "\n\n" not in text
    lines = [x for x in text.splitlines() if not x.startswith("#")]
    assert lines == [
        "version 1",
        "heartbeat 1700000000",
        "refresh 5",
        "pid 42",
        "rails_up 2",
        "rails_total 4",
        "min_rails_up 0",
        "verdict degraded",
        "nic nic0 0 up none",
        "nic nic1 1 up none",
        "nic nic2 2 down carrier",
        "nic nic3 3 suspect lane_timeout",
    ]
    assert parse_node_status(text) == st


@pytest.mark.parametrize("min_up", [0, 1, 2, 3, 4])
def test_verdict_agrees_with_status_check_nics(min_up: int) -> None:
    snap = TableSnapshot(
        generation=1,
        agent_pid=1,
        agent_start_ticks=0,
        agent_pidns=0,
        seq=2,
        heartbeat_ns=1,
        flags=0,
        publish_count=1,
        publish_ns=1,
        heartbeat_ms=250,
        nics=tuple(NICS),
        changes=(),
        settings=NodeSettings(min_rails_up=min_up),
    )
    want = check_nics(snap)
    st = node_status(NICS, min_up, heartbeat_s=1, refresh_s=5, agent_pid=1)
    assert (st.verdict == "ok") == want.ok
    assert (st.rails_up, st.rails_total, st.rails_wanted) == (
        want.rails_up,
        want.rails_total,
        want.min_rails_up,
    )


def test_rails_count_nics_on_one_rail_once_and_railless_nics_alone() -> None:
    nics = [
        NicHealth("a", NicState.UP, rail=0),
        NicHealth("b", NicState.DOWN, rail=0),  # rail 0 still has a
        NicHealth("veth9", NicState.UP, rail=None),
    ]
    st = node_status(nics, 0, heartbeat_s=1, refresh_s=5, agent_pid=1)
    assert (st.rails_up, st.rails_total, st.verdict) == (2, 2, "ok")
    assert "nic veth9 - up none" in format_node_status(st).decode()
    back = parse_node_status(format_node_status(st).decode())
    assert back.nics[2] == ("veth9", None, "up", "none")


def test_gone_is_its_own_verdict_and_no_nic_is_degraded() -> None:
    up = [NicHealth("a", NicState.UP, rail=0)]
    st = node_status(up, 0, heartbeat_s=1, refresh_s=5, agent_pid=1, gone=True)
    assert st.verdict == "gone"
    assert node_status([], 0, heartbeat_s=1, refresh_s=5, agent_pid=1).verdict == "degraded"


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda t: t.replace("version 1", "version 2"), "version"),
        (lambda t: re.sub(r"(?m)^heartbeat .*\n", "", t), "heartbeat"),
        (lambda t: t.replace("rails_up 2", "rails_up two"), "two"),
        (lambda t: t.replace("verdict degraded", "verdict fine"), "verdict"),
        (lambda t: t.replace("nic nic0 0 up none", "nic nic0 0 up"), "nic line"),
    ],
)
def test_parser_refuses_what_the_check_calls_unknown(
    edit: Callable[[str], str], match: str
) -> None:
    st = node_status(NICS, 0, heartbeat_s=1_700_000_000, refresh_s=5, agent_pid=42)
    with pytest.raises(NodeStatusError, match=match):
        parse_node_status(edit(format_node_status(st).decode()))


def test_stale_bound() -> None:
    assert stale_bound_s(1) == 10 and stale_bound_s(5) == 15 and stale_bound_s(30) == 90


def test_nfd_feature_file_labels_and_expiry() -> None:
    st = node_status(NICS, 3, heartbeat_s=1_700_000_000, refresh_s=5, agent_pid=42)
    text = nfd_features(st, 1_700_000_060).decode()
    body = [x for x in text.splitlines() if not x.startswith("#")]
    assert body == [
        "railhop.io/rails-up=2",
        "railhop.io/rails-total=4",
        "railhop.io/min-rails-up=3",
        "railhop.io/degraded=true",
    ]
    # NFD's directive, RFC 3339 UTC: the labels of an agent that stops rewriting expire
    assert "# +expiry-time=2023-11-14T22:14:20Z" in text.splitlines()
    # label names and values NFD accepts: a DNS-subdomain prefix outside kubernetes.io, a
    # name and a value of [A-Za-z0-9._-] at most 63 characters, starting/ending alphanumeric
    label = re.compile(r"^[a-z0-9.-]+/[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
    for line in body:
        key, value = line.split("=")
        assert label.match(key) and "kubernetes.io" not in key, key
        assert re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?", value), value
    ok = node_status(NICS[:2], 0, heartbeat_s=1, refresh_s=5, agent_pid=1)
    assert "railhop.io/degraded=false" in nfd_features(ok, 100).decode()


# -- the agent writes them


def read_status(path: Path) -> Any:
    try:
        return parse_node_status(path.read_text())
    except (OSError, NodeStatusError):
        return None


def test_agent_writes_node_status_and_nfd_labels(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    features = tmp_path / "features.d"  # created by the agent
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nhealth:\n  min_rails_up: 10\n")
    fake = FakeSource()
    wall = [1_800_000_000.0]
    cfg = daemon.AgentConfig(
        policy_path=policy,
        run_dir=run_dir,
        sys_root=DGX,
        heartbeat_ms=50,
        node_status_interval_s=0.2,
        nfd_features_dir=features,
    )
    agent = daemon.Agent(cfg, source_factory=lambda c, t, p: [fake], wall_clock=lambda: wall[0])
    path = run_dir / NODE_STATUS_FILE
    nfd = features / NFD_FEATURE_FILE

    async def body() -> None:
        task = asyncio.create_task(agent.run())
        await until(lambda: read_status(path) is not None and fake.emit is not None)
        st = read_status(path)
        assert st.verdict == "ok" and st.rails_up == st.rails_total == 11, st
        assert st.min_rails_up == 10 and st.refresh_s == 1 and st.heartbeat_s == 1_800_000_000
        assert "railhop.io/degraded=false" in nfd.read_text()
        assert f"railhop.io/rails-up={st.rails_up}" in nfd.read_text()
        # the refresh: the heartbeat moves with the wall clock while nothing else changes
        wall[0] += 100
        await until(lambda: read_status(path).heartbeat_s == 1_800_000_100)
        assert "# +expiry-time=2027-01-15T08:02:40Z" in nfd.read_text()  # +100 s +60 s
        # two rails lose carrier: 9 of 11 < 10 -> degraded, in the file and the labels
        assert fake.emit is not None
        for nic in ("ibp76s0", "ibp93s0"):
            fake.emit(sev.CarrierDown(ts_ns=time.monotonic_ns(), source="fake", ifname=nic))
        await until(lambda: read_status(path).verdict == "degraded")
        st = read_status(path)
        assert st.rails_up == st.rails_total - 2
        down = {n[0]: (n[2], n[3]) for n in st.nics if n[2] != "up"}
        assert down == {"ibp76s0": ("down", "carrier"), "ibp93s0": ("down", "carrier")}
        await until(lambda: "railhop.io/degraded=true" in nfd.read_text())
        agent.request_stop()
        assert await asyncio.wait_for(task, 10) == 0

    asyncio.run(body())
    assert read_status(path).verdict == "gone"  # never read as healthy after a clean stop
    assert not nfd.exists()
    assert not [p for p in features.iterdir()]  # no temp file left behind either
    assert agent.stats.node_status_write_errors == 0 and agent.stats.nfd_write_errors == 0
