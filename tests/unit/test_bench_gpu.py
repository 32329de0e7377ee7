"""The GPU benches' pure parts: the ranks' environment (bench/_gpu.py) and the verdict of the
4-rank fault-tolerance cycle (bench/gpu_cycle.py), without a GPU or a fabric."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench() -> Iterator[tuple[ModuleType, ModuleType]]:
    sys.path.insert(0, str(BENCH))
    try:
        import _gpu
        import gpu_cycle

        yield _gpu, gpu_cycle
    finally:
        sys.path.remove(str(BENCH))


def _args(**kw: Any) -> argparse.Namespace:
    base = {"plugin": "/opt/x/libnccl-net-railhop.so", "gpus": "0", "nccl_debug": "WARN", "env": []}
    return argparse.Namespace(**{**base, **kw})


def test_four_ranks_share_one_gpu_with_own_host_ids_and_run_dirs(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _gpu, _ = bench
    monkeypatch.setenv("NCCL_ALGO", "Tree")  # the caller's NCCL_* must not leak into the ranks
    dirs = [tmp_path / f"agent-run{r}" for r in range(4)]
    envs = _gpu.rank_envs(
        _args(env=["RAILHOP_COMPLETION_TIMEOUT=500"]),
        "railhop",
        tmp_path,
        hostid="h",
        common={"NVSHMEM_DISABLE_NVLS": "1"},
        railhop={"NCCL_NET_PLUGIN_REF_COUNT": "1"},
        nranks=4,
        run_dirs=dirs,
    )
    assert [e["NCCL_HOSTID"] for e in envs] == ["h0", "h1", "h2", "h3"]
    assert {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {"0"}
    assert [e["RAILHOP_RUN_DIR"] for e in envs] == [str(d) for d in dirs]
    assert all(d.is_dir() for d in dirs)
    for e in envs:
        assert e["NCCL_P2P_DISABLE"] == e["NCCL_SHM_DISABLE"] == "1"
        assert e["NCCL_NVLS_ENABLE"] == "0" and e["NVSHMEM_DISABLE_NVLS"] == "1"
        assert e["NCCL_NET"] == "railhop" and e["NCCL_NET_PLUGIN_REF_COUNT"] == "1"
        assert e["RAILHOP_COMPLETION_TIMEOUT"] == "500"
        assert "NCCL_ALGO" not in e


def test_gpus_are_dealt_round_robin_and_socket_uses_every_nic(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    _gpu, _ = bench
    envs = _gpu.rank_envs(_args(gpus="0,1"), "socket", tmp_path, hostid="s", common={}, nranks=3)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "0"]
    assert all(e["NCCL_NET"] == "Socket" and e["NCCL_SOCKET_IFNAME"] == "nic" for e in envs)
    with pytest.raises(ValueError, match="transport"):
        _gpu.rank_envs(_args(), "ib", tmp_path, hostid="x", common={})


def _cycle(detect: dict[str, float], wrong: int = 0, done: bool = True) -> dict[str, Any]:
    """A run as the parent records it (after a JSON round trip: string keys)."""
    ranks = {r: {"abort": {"returned": True, "s": 0.3}} if r == "3" else {} for r in detect}
    return {
        "variant": "railhop",
        "run": 1,
        "done": done,
        "wrong_values": wrong,
        "rc": [0, 0, 0, 0],
        "wall_s": 23.0,
        "phases": {
            "1": {"windows": []},
            "2": {"detect_s": detect, "detect_via": {}, "ranks": ranks, "how": "re-create"},
            "3": {"full_ready_after_heal_s": 0.1, "init_s": [0.04] * 4},
        },
    }


def test_cycle_verdict(bench: tuple[ModuleType, ModuleType]) -> None:
    _, gpu_cycle = bench
    fast = {"0": 1.37, "1": 1.38, "2": 1.38, "3": 0.01}
    lines, ok = gpu_cycle.summarize({"runs": [_cycle(fast)]})
    assert ok, lines
    # a survivor later than 2 s fails the run; the lost rank's own time does not count
    _, ok = gpu_cycle.summarize({"runs": [_cycle({**fast, "1": 2.2})]})
    assert not ok
    _, ok = gpu_cycle.summarize({"runs": [_cycle({**fast, "3": 9.0})]})
    assert ok
    _, ok = gpu_cycle.summarize({"runs": [_cycle(fast, wrong=1)]})
    assert not ok
    _, ok = gpu_cycle.summarize({"runs": [_cycle(fast, done=False)]})
    assert not ok
    _, ok = gpu_cycle.summarize({"runs": [_cycle({**fast, "2": None})]})
    assert not ok


def test_socket_hang_is_reported_with_the_wait(bench: tuple[ModuleType, ModuleType]) -> None:
    _, gpu_cycle = bench
    rep = {
        "variant": "socket",
        "run": 1,
        "error": "phase 1 hung",
        "phases": {"1": {"hung": True, "silent_s": 21.7, "waited_s": 21.5}},
    }
    lines, ok = gpu_cycle.summarize({"runs": [_cycle({"0": 1.0, "1": 1.0, "2": 1.0}), rep]})
    assert ok  # Socket hanging is the baseline, not a railhop failure
    assert any("no step for 21.7 s" in ln and "waited 21.5 s" in ln for ln in lines)
