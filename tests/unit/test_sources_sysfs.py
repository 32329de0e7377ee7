"""sysfs counters: reading under root=, the pure rate and threshold functions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from railhop.sources import sysfs as S

SEC = 1_000_000_000


def tree(root: Path, net: dict[str, dict[str, str]], rdma: dict[str, dict[str, str]]) -> None:
    for ifname, vals in net.items():
        d = root / "sys/class/net" / ifname
        (d / "statistics").mkdir(parents=True, exist_ok=True)
        for k, v in vals.items():
            (d / k if k.startswith("carrier") else d / "statistics" / k).write_text(v + "\n")
    for devport, vals in rdma.items():
        dev, port = devport.split("/")
        base = root / "sys/class/infiniband" / dev / "ports" / port
        for k, v in vals.items():
            sub, name = k.split("/")
            (base / sub).mkdir(parents=True, exist_ok=True)
            (base / sub / name).write_text(v + "\n")


def test_read_netdev_and_rdma(tmp_path: Path) -> None:
    tree(
        tmp_path,
        {"nic0": {"rx_errors": "3", "tx_packets": "100", "carrier_changes": "4", "bad": "x"}},
        {"mlx5_0/1": {"counters/link_downed": "2", "hw_counters/local_ack_timeout_err": "7"}},
    )
    assert S.read_netdev("nic0", str(tmp_path)) == {
        "rx_errors": 3,
        "tx_packets": 100,
        "carrier_changes": 4,
    }
    assert S.read_netdev("nope", str(tmp_path)) == {}
    assert S.rdma_ports(str(tmp_path)) == [("mlx5_0", 1)]
    assert S.read_rdma_port("mlx5_0", 1, str(tmp_path)) == {
        "link_downed": 2,
        "local_ack_timeout_err": 7,
    }


def test_rates() -> None:
    a = S.Sample("nic0", 0, {"x": 10, "y": 5, "gone": 1, "link_downed": 255, "symbol_error": 9})
    b = S.Sample(
        "nic0", SEC // 2, {"x": 20, "y": 4, "new": 3, "link_downed": 255, "symbol_error": 19}
    )
    r = S.rates(a, b)
    assert r == {"x": (20.0, 10), "link_downed": (0.0, 0), "symbol_error": (20.0, 10)}
    assert S.rates(b, a) == {}  # time going backwards: nothing


def test_breaches() -> None:
    r = {"local_ack_timeout_err": (4.0, 2), "rx_errors": (0.5, 1), "tx_packets": (1e6, 10)}
    out = S.breaches(
        "mlx5_0/1",
        r=r,
        thresholds={"local_ack_timeout_err": 0, "rx_errors": 1.0, "missing": 0},
        ts_ns=7,
        interval_s=0.5,
    )
    assert [(b.obj, b.counter, b.rate, b.threshold, b.delta) for b in out] == [
        ("mlx5_0/1", "local_ack_timeout_err", 4.0, 0.0, 2)
    ]


@dataclass
class Thresholds:
    rx_errors: float = 1.0
    carrier_changes: int = 0
    link_downed: float | None = None


def test_as_thresholds() -> None:
    assert S.as_thresholds({"a": 1}) == {"a": 1.0}
    assert S.as_thresholds(Thresholds()) == {"rx_errors": 1.0, "carrier_changes": 0.0}
    with pytest.raises(TypeError):
        S.as_thresholds(["rx_errors"])
    with pytest.raises(TypeError, match="must be a number"):
        S.as_thresholds({"a": "1"})
    with pytest.raises(TypeError):
        S.as_thresholds({"a": True})


def test_sample_once_reports_breaches(tmp_path: Path) -> None:
    tree(tmp_path, {"nic0": {"rx_errors": "0", "carrier_changes": "2"}}, {})
    src = S.SysfsCounterSource(
        Thresholds(), ifnames=["nic0", "nic9"], root=str(tmp_path), rdma=True
    )
    assert src.sample_once(now_ns=0) == []
    tree(tmp_path, {"nic0": {"rx_errors": "5", "carrier_changes": "4"}}, {})
    out = src.sample_once(now_ns=SEC)
    assert [(b.counter, b.rate, b.delta, b.interval_s) for b in out] == [
        ("carrier_changes", 2.0, 2, 1.0),
        ("rx_errors", 5.0, 5, 1.0),
    ]
    assert src.latest["nic0"]["rx_errors"] == (5.0, 5)


def test_start_reports_what_it_can_read(tmp_path: Path) -> None:
    import asyncio

    tree(tmp_path, {"nic0": {"rx_errors": "0"}}, {})
    src = S.SysfsCounterSource({}, ifnames=["nic0", "nic9"], root=str(tmp_path))

    async def run() -> list[str]:
        caps = await src.start(lambda _e: None)
        await src.stop()
        return [c.line() for c in caps]

    lines = asyncio.run(run())
    assert "attached (sysfs)" in lines[0]
    assert "nic9" in lines[1] and "skipped" in lines[1]
    assert lines[2].endswith("skipped: no RDMA devices")


def test_bad_interval() -> None:
    with pytest.raises(ValueError):
        S.SysfsCounterSource({}, interval_s=0)
