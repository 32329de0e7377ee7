"""The one source catalogue: what the agent builds (a selection of groups, for its NICs and
policy) and what the capability report builds (everything), from the same entries."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from railhop.daemon import AgentConfig, default_sources
from railhop.policy import default_policy, load_policy
from railhop.sources import catalogue
from railhop.sources.ebpf import CarrierSource, TcpLaneSource
from railhop.sources.netlink import NetlinkSource
from railhop.sources.report import default_sources as report_sources
from railhop.sources.sysfs import SysfsCounterSource
from railhop.sources.usdt import UsdtSource
from railhop.topology import read_topology

REPO = Path(__file__).resolve().parents[2]
DGX = REPO / "tests" / "fixtures" / "sys" / "dgx-h100"
POLICY = REPO / "policies" / "rail-optimized-8nic.yaml"


def test_the_report_builds_every_entry_kernel_hooks_first() -> None:
    names = [s.name for s in report_sources(ifnames=["nic0"], plugin_lib="/x/lib.so")]
    assert names == [
        "ebpf.carrier",
        "ebpf.tcp",
        "ebpf.rdma",
        "netlink",
        "sysfs",
        "verbs",
        "usdt.plugin",
    ]
    assert "usdt.plugin" not in [s.name for s in report_sources()]  # no library: no USDT


def test_the_agent_builds_its_groups_for_its_nics() -> None:
    topo = read_topology(DGX)
    policy = load_policy(POLICY)
    assert policy.health.counters
    cfg = AgentConfig(sys_root=DGX, usdt_lib=Path("/x/lib.so"))
    got = {s.name: s for s in default_sources(cfg, topo, policy)}
    assert list(got) == ["ebpf.carrier", "ebpf.tcp", "netlink", "sysfs", "usdt.plugin"]
    ifnames = {n.netdev or n.name for n in topo.nics}
    carrier, tcp = got["ebpf.carrier"], got["ebpf.tcp"]
    assert isinstance(carrier, CarrierSource) and isinstance(tcp, TcpLaneSource)
    # kernel hooks see every netns: the agent keeps its own; they check the real /proc and /sys
    assert carrier.ifnames == ifnames and carrier.netns.netns == "self" == tcp.netns.netns
    assert carrier.netns._root == "/"
    netlink, sysfs = got["netlink"], got["sysfs"]
    assert isinstance(netlink, NetlinkSource) and netlink.netns is None
    assert isinstance(sysfs, SysfsCounterSource)
    assert sysfs.root == str(DGX) and set(sysfs.ifnames) == ifnames  # counters: the sysfs root
    assert isinstance(got["usdt.plugin"], UsdtSource)

    # no counter thresholds in the policy: no sysfs source; --sources picks groups
    cfg = AgentConfig(sys_root=DGX, sources=("netlink", "sysfs"))
    assert [s.name for s in default_sources(cfg, topo, default_policy())] == ["netlink"]
    # the report's other groups are not the agent's to start, nor is USDT without a library
    cfg = AgentConfig(sys_root=DGX, sources=("netlink", "rdma", "verbs", "usdt"))
    assert [s.name for s in default_sources(cfg, topo, default_policy())] == ["netlink"]


def test_an_entry_that_cannot_be_built_is_logged_and_left_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_o: catalogue.SourceOptions) -> catalogue.Source:
        raise ImportError("no module named bcc")

    entries = list(catalogue.CATALOGUE)
    entries[0] = dataclasses.replace(entries[0], build=broken)
    monkeypatch.setattr(catalogue, "CATALOGUE", tuple(entries))
    with caplog.at_level(logging.WARNING, logger="railhop.sources"):
        got = catalogue.build_sources(catalogue.SourceOptions(), {"ebpf", "netlink"})
    assert [s.name for s in got] == ["ebpf.tcp", "netlink"]
    assert "eBPF carrier source unavailable: no module named bcc" in caplog.text


def test_sources_exits_1_when_nothing_attaches_and_2_on_usage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A report where nothing can attach is a finding (1), like every command's findings; a
    bad option is a usage error (2)."""
    from click.testing import CliRunner

    from railhop.cli import cli
    from railhop.sources import cli as sources_cli
    from railhop.sources.base import Reason, attached, skipped

    caps = [skipped("netlink", "link", Reason.NOT_AVAILABLE, "test")]
    monkeypatch.setattr(sources_cli, "capability_report", lambda _s: caps)
    r = CliRunner().invoke(cli, ["sources", "--json"])
    assert r.exit_code == 1 and '"status": "skipped"' in r.stdout
    r = CliRunner().invoke(cli, ["agent", "--check"])
    assert r.exit_code == 1
    caps = [attached("netlink", "link", "rtnetlink", "")]
    assert CliRunner().invoke(cli, ["sources"]).exit_code == 0
    assert CliRunner().invoke(cli, ["sources", "--bogus"]).exit_code == 2
