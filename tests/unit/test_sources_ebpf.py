"""Pure parts of the eBPF sources: carrier de-duplication, netns filtering, lane port table,
and the trial child's stderr attribution."""

from __future__ import annotations

from pathlib import Path

import pytest

from railhop.sources.bpftrial import MARK
from railhop.sources.ebpf import carrier, loader, netns, tcp
from railhop.sources.events import CarrierDown, CarrierUp, TcpSuspect

MS = 1_000_000


def test_carrier_dedup() -> None:
    d = carrier.CarrierDedup(window_ns=10 * MS)
    assert d.accept("nic0", True, 0)
    assert not d.accept("nic0", True, 1 * MS)  # second queue's qdisc reset
    assert not d.accept("nic0", True, 9 * MS)  # window anchored at the first
    assert d.accept("nic1", True, 9 * MS)  # other device
    assert d.accept("nic0", False, 12 * MS)  # carrier back
    assert d.accept("nic0", True, 13 * MS)  # and lost again: a real flap
    assert d.accept("nic0", True, 30 * MS)  # after the window: reported again
    assert not d.accept("(null)", True, 0)
    assert not d.accept("", True, 0)


def test_netns_filter(tmp_path: Path) -> None:
    (tmp_path / "var/run/netns").mkdir(parents=True)
    (tmp_path / "var/run/netns/node1").write_text("")
    f = netns.NetnsFilter("node1", str(tmp_path))
    f.resolve()
    ino = (tmp_path / "var/run/netns/node1").stat().st_ino
    assert f.ino == ino
    assert f.keep(CarrierDown(ts_ns=1, source="s", ifname="nic0", netns_ino=ino))
    assert not f.keep(CarrierDown(ts_ns=1, source="s", ifname="nic0", netns_ino=ino + 1))
    assert f.keep(CarrierDown(ts_ns=1, source="s", ifname="nic0", netns_ino=0))  # tracepoint
    nofilter = netns.NetnsFilter(None, str(tmp_path))
    nofilter.resolve()
    assert nofilter.keep(CarrierUp(ts_ns=1, source="s", ifname="x", netns_ino=5))
    with pytest.raises(OSError):
        netns.NetnsFilter("missing", str(tmp_path)).resolve()


def test_carrier_source_filters() -> None:
    src = carrier.CarrierSource(ifnames={"nic0"})
    down = CarrierDown(ts_ns=0, source="ebpf.carrier", ifname="nic0")
    assert src.filter_event(down) is down
    assert src.filter_event(CarrierDown(ts_ns=MS, source="ebpf.carrier", ifname="nic0")) is None
    assert src.filter_event(CarrierDown(ts_ns=0, source="ebpf.carrier", ifname="eth0")) is None


def test_lane_ports_before_start() -> None:
    src = tcp.TcpLaneSource()
    src.add_port(5000)
    src.add_port(5000, remote=True)
    src.add_port(6000, remote=True)
    assert src.ports() == {5000: 3, 6000: 2}
    src.remove_port(5000)
    src.remove_port(7000)
    assert src.ports() == {6000: 2}
    for bad in (0, 65536, -1):
        with pytest.raises(loader.EbpfError):
            src.add_port(bad)
    ev = TcpSuspect(ts_ns=0, source="ebpf.tcp", reason="retransmit", sport=1, dport=2)
    assert src.filter_event(ev) is ev


def test_split_diagnostics() -> None:
    err = f"warning before\n{MARK}0\nx.c:3: error: boom\n{MARK}1\nAssertion `!isNull()' failed.\n"
    d = loader.split_diagnostics(err)
    assert d[None] == "warning before"
    assert d[0] == "x.c:3: error: boom"
    assert d[1] == "Assertion `!isNull()' failed."


def test_missing_netns_is_a_skip_not_a_crash(tmp_path: Path) -> None:
    src = tcp.TcpLaneSource(root=str(tmp_path), netns="nope")
    caps = src.start_sync(lambda _e: None)
    assert [c.attached for c in caps] == [False, False, False]
    assert all("netns nope" in c.detail for c in caps)
