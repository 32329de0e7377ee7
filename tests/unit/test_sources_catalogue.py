"""The one source catalogue: what the agent builds (a selection of groups, for its NICs and
policy) and what the capability report builds (everything), from the same entries."""

from __future__ import annotations

import dataclasses
import logging
import struct
from pathlib import Path
from typing import Any

import pytest

from railhop.daemon import AgentConfig, default_sources
from railhop.policy import default_policy, load_policy
from railhop.sources import catalogue
from railhop.sources.ebpf.carrier import CarrierSource
from railhop.sources.ebpf.tcp import TcpLaneSource
from railhop.sources.netlink import NetlinkSource
from railhop.sources.report import default_sources as report_sources
from railhop.sources.sysfs import SysfsCounterSource
from railhop.sources.usdt import UsdtSource
from railhop.sources.verbs_usdt import VerbsUsdtSource
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
        "usdt.verbs",
    ]
    assert "usdt.plugin" not in [s.name for s in report_sources()]  # no library: no USDT


def test_the_agent_builds_its_groups_for_its_nics() -> None:
    topo = read_topology(DGX)
    policy = load_policy(POLICY)
    assert policy.health.counters
    cfg = AgentConfig(sys_root=DGX, usdt_lib=Path("/x/lib.so"))
    got = {s.name: s for s in default_sources(cfg, topo, policy)}
    assert list(got) == [
        "ebpf.carrier",
        "ebpf.tcp",
        "ebpf.rdma",
        "netlink",
        "sysfs",
        "verbs",
        "usdt.plugin",
        "usdt.verbs",
    ]
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
    assert isinstance(got["usdt.verbs"], VerbsUsdtSource)
    assert not isinstance(got["usdt.verbs"], UsdtSource)  # no lane_stats of its own

    # no counter thresholds in the policy: no sysfs source; --sources picks groups
    cfg = AgentConfig(sys_root=DGX, sources=("netlink", "sysfs"))
    assert [s.name for s in default_sources(cfg, topo, default_policy())] == ["netlink"]
    # --sources picks the RDMA groups too; "usdt" is not a --sources name (USDT: --usdt-lib)
    cfg = AgentConfig(sys_root=DGX, sources=("netlink", "rdma", "verbs", "usdt"))
    assert [s.name for s in default_sources(cfg, topo, default_policy())] == [
        "ebpf.rdma",
        "netlink",
        "verbs",
    ]


def test_rdma_sources_start_only_where_a_managed_nic_is_an_rdma_device(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """DGX fixture (mlx5 HCAs): the RDMA/driver eBPF probes and the verbs source are built, the
    verbs source for the managed NICs' devices only (the policy excludes the storage NICs
    mlx5_8 and mlx5_9); the Ethernet fixture (no RDMA device): neither, and the log says why."""
    from railhop.sources.ebpf.rdma import RdmaDriverSource
    from railhop.sources.verbs import VerbsSource

    policy = load_policy(POLICY)
    topo = read_topology(DGX)
    managed = [n for n in topo.nics if n.name not in ("mlx5_8", "mlx5_9")]
    topo = dataclasses.replace(topo, nics=tuple(managed))
    got = {s.name: s for s in default_sources(AgentConfig(sys_root=DGX), topo, policy)}
    assert isinstance(got["ebpf.rdma"], RdmaDriverSource)
    verbs = got["verbs"]
    assert isinstance(verbs, VerbsSource)
    assert verbs.root == str(DGX)
    assert verbs.devices == [f"mlx5_{i}" for i in range(8)]

    eth = REPO / "tests" / "fixtures" / "sys" / "ethernet"
    with caplog.at_level(logging.INFO, logger="railhop.agent"):
        names = [
            s.name for s in default_sources(AgentConfig(sys_root=eth), read_topology(eth), policy)
        ]
    assert "ebpf.rdma" not in names and "verbs" not in names
    assert names[:2] == ["ebpf.carrier", "ebpf.tcp"]
    assert "RDMA driver and verbs sources not started" in caplog.text


def test_the_agents_verbs_source_starts_on_the_fixture_tree() -> None:
    """The start path of the verbs source the agent builds for the DGX fixture: the managed
    devices' async fds are watched (a fake libibverbs: no HCA here), each port's state is in the
    capability report (a fake pyverbs reader), and a PORT_ERR reaches the agent's emit."""
    import asyncio
    import os

    from railhop.sources import verbs as V
    from railhop.sources.events import RdmaPortEvent

    topo = read_topology(DGX)
    got = {s.name: s for s in default_sources(AgentConfig(sys_root=DGX), topo, load_policy(POLICY))}
    src = got["verbs"]
    assert isinstance(src, V.VerbsSource)
    pipes: dict[str, tuple[int, int]] = {}

    class Fake(V.Verbs):
        def __init__(self) -> None:
            pass

        def open_all(self, names: list[str]) -> tuple[list[V._Dev], dict[str, str]]:
            devs = []
            for n in names:
                r, w = os.pipe()
                os.set_blocking(r, False)
                pipes[n] = (r, w)
                devs.append(V._Dev(n, 0, r))
            return devs, {}

        def read_event(self, dev: V._Dev) -> bytes | None:
            try:
                os.read(dev.afd, 1)
            except BlockingIOError:
                return None
            return struct.pack("<Qi4x", 1, 10)  # PORT_ERR, port 1

        def close(self, dev: V._Dev) -> None:
            for fd in pipes.pop(dev.name):
                os.close(fd)

    src._verbs = Fake()
    src._port_states = lambda dev, ports: {
        p: "DOWN" if dev == "mlx5_3" else "ACTIVE" for p in ports
    }

    async def run() -> tuple[list[object], object]:
        q: asyncio.Queue[object] = asyncio.Queue()
        caps = await src.start(q.put_nowait)
        os.write(pipes["mlx5_3"][1], b"x")
        ev = await asyncio.wait_for(q.get(), 5)
        await src.stop()
        return list(caps), ev

    caps, ev = asyncio.run(run())
    details = {c.hook: (c.attached, c.detail) for c in caps}  # type: ignore[attr-defined]
    assert sorted(details) == src.devices == [f"mlx5_{i}" for i in range(10)]
    assert all(
        ok and d.endswith("; port 1 ACTIVE") for n, (ok, d) in details.items() if n != "mlx5_3"
    )
    assert details["mlx5_3"][1].endswith("; port 1 DOWN")
    assert ev == RdmaPortEvent(
        ts_ns=ev.ts_ns,  # type: ignore[attr-defined]
        source="verbs",
        hook="verbs",
        device="mlx5_3",
        event="PORT_ERR",
        code=10,
        port=1,
    )
    assert pipes == {}


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


def test_sources_checks_the_groups_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """``railhop sources --sources rdma,sysfs,verbs`` builds those groups only (each eBPF group
    compiles its programs: minutes on an emulated CPU); an unknown group is a usage error."""
    from click.testing import CliRunner

    from railhop.cli import cli
    from railhop.sources import cli as sources_cli
    from railhop.sources.base import Source, attached

    built: list[list[str]] = []

    def report(srcs: list[Source]) -> list[Any]:
        built.append([s.name for s in srcs])
        return [attached("sysfs", "x", "sysfs")]

    monkeypatch.setattr(sources_cli, "capability_report", report)
    r = CliRunner().invoke(cli, ["sources", "--sources", "netlink,sysfs", "--nic", "lo"])
    assert r.exit_code == 0, r.output
    assert built == [["netlink", "sysfs"]]
    r = CliRunner().invoke(cli, ["sources", "--sources", "netlink,bogus"])
    assert r.exit_code == 2 and "unknown group(s) bogus" in r.output
    assert len(built) == 1
