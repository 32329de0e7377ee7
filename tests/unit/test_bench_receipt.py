"""The GPU receipt (bench/gpu_receipt.py): the plugin tree hash it records and its verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"


@pytest.fixture(scope="module")
def gr() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCH))
    try:
        import gpu_receipt

        yield gpu_receipt
    finally:
        sys.path.remove(str(BENCH))


def _git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
    }
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_tree_hash_is_gits(gr: ModuleType, tmp_path: Path) -> None:
    d = tmp_path / "plugin"
    (d / "src" / "core").mkdir(parents=True)
    (d / "src" / "core" / "a.c").write_text("int a;\n")
    (d / "src" / "b.h").write_bytes(b"\x00binary\xff")
    (d / "run.sh").write_text("#!/bin/sh\n")
    (d / "run.sh").chmod(0o755)
    (d / "z-last").write_text("z")
    (d / "src.txt").write_text("sorts before src/ in git's order")
    (d / "empty").mkdir()  # git records no empty directory
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "t")
    assert gr.git_tree_hash(d) == _git(tmp_path, "rev-parse", "HEAD:plugin")
    (d / "src" / "core" / "a.c").write_text("int b;\n")
    assert gr.git_tree_hash(d) != _git(tmp_path, "rev-parse", "HEAD:plugin")


def _allreduce(
    rcs: list[int], bad: int = 0, *, fault: bool = False, san: int = 0, steps: int = 10
) -> dict[str, Any]:
    run = {"returncodes": rcs, "bad": bad, "sanitizer_reports": ["x"] * san, "ranks": len(rcs)}
    if fault:
        return {"fault": [{**run, "transport": "railhop", "fault": "blackhole", "hung": False,
                           "steps": steps, "planned_steps": 10}]}  # fmt: skip
    sweep = {"railhop": {**run, "nccl": "2.28.9", "results": {str(64 << 20): {"time_s": 0.5}}}}
    sweep["socket"] = {**run, "results": {str(64 << 20): {"time_s": 1.0}}}
    return {"torch": "2.x", "sweep": sweep}


def _suite(tmp_path: Path, **over: Any) -> Path:
    runs = {
        "side": _allreduce([0, 0]),
        "blackhole": _allreduce([0, 0], fault=True),
        "r4": _allreduce([0, 0, 0, 0], fault=True),
        "asan": _allreduce([0, 0]),
    }
    runs.update(over)
    for name, res in runs.items():
        if res is not None:
            (tmp_path / f"{name}.json").write_text(json.dumps(res))
    cyc = over.get("cycle_runs") or [
        {"variant": v, "run": i, "done": True, "wrong_values": 0, "rc": [0, 0, 0, 0]}
        for i in (1, 2)
        for v in ("railhop", "agent")
    ]
    (tmp_path / "cycle").mkdir(exist_ok=True)
    (tmp_path / "cycle" / "gpu_cycle.json").write_text(json.dumps({"runs": cyc}))
    return tmp_path


def test_a_clean_suite_passes(gr: ModuleType, tmp_path: Path) -> None:
    r = gr.build(_suite(tmp_path))
    assert r["verdict"] == "PASS", r["failures"]
    assert r["ratios_railhop_over_socket"] == {"64MiB": 2.0}
    assert r["nccl"] == "2.28.9" and len(r["runs"]) == 2 + 1 + 1 + 2
    assert r["plugin_tree"] == gr.git_tree_hash(REPO / "plugin")


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({"side": _allreduce([0, -6])}, "exit status"),
        ({"asan": _allreduce([0, 0], san=2)}, "sanitizer"),
        ({"r4": _allreduce([0, 0, 0, 0], bad=3, fault=True)}, "wrong values"),
        ({"r4": _allreduce([0, 0, 0, 0], fault=True, steps=4)}, "4 of 10 steps"),
        ({"blackhole": None}, "missing: blackhole"),
        ({"cycle_runs": [{"variant": "railhop", "run": 1, "done": True, "wrong_values": 0}]},
         "railhop cycles"),
        ({"cycle_runs": [{"variant": "railhop", "run": i, "done": True, "wrong_values": 0,
                          "rc": [0, 0, 134, 0]} for i in (1, 2)]}, "exit status"),
    ],
)  # fmt: skip
def test_any_failure_fails_the_receipt(
    gr: ModuleType, tmp_path: Path, over: dict[str, Any], why: str
) -> None:
    r = gr.build(_suite(tmp_path, **over))
    assert r["verdict"] == "FAIL"
    assert any(why in f for f in r["failures"]), r["failures"]
