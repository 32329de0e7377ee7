"""The plugin's include graph (scripts/include_graph.py): the code keeps its layering, the graph
drawn in docs/architecture.md is the one the code has, and the checker catches each kind of
violation on a small tree built here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "include_graph", REPO / "scripts" / "include_graph.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["include_graph"] = mod
    spec.loader.exec_module(mod)
    return mod


ig = _load()


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


# A small plugin that keeps every rule: api -> agent glue -> core API; core -> lane contract;
# lanes -> lane contract + core API.
GOOD = {
    "include/nccl/net.h": "",
    "src/log.h": '#include "nccl/net.h"\n',
    "src/rh.h": "",
    "src/core/health.h": "",
    "src/core/wire.h": '#include "../log.h"\n',
    "src/core/conn.h": '#include "../lanes/lane_ops.h"\n#include "wire.h"\n',
    "src/core/conn.c": '#include "conn.h"\n#include "health.h"\n#include "../rh.h"\n',
    "src/lanes/lane_ops.h": '#include "../core/wire.h"\n',
    "src/lanes/tcp.c": '#include "lane_ops.h"\n#include "../log.h"\n',
    "src/agent.h": "",
    "src/agent.c": '#include "agent.h"\n#include "core/health.h"\n',
    "src/api_nccl.c": '#include "agent.h"\n#include "rh.h"\n#include "nccl/net.h"\n',
}


def test_plugin_keeps_its_layering() -> None:
    graph = ig.scan(REPO / "plugin")
    assert "src/core/conn.h" in graph and "src/lanes/lane_ops.h" in graph
    assert ig.check(graph) == []


def test_architecture_doc_shows_the_graph_of_the_code() -> None:
    doc = REPO / "docs" / "architecture.md"
    assert ig.main(["--doc", str(doc)]) == 0, (
        "docs/architecture.md: regenerate the include graph with "
        "scripts/include_graph.py --doc docs/architecture.md --write"
    )


def test_good_tree_passes_and_resolves_like_the_compiler(tmp_path: Path) -> None:
    root = _tree(tmp_path, GOOD)
    graph = ig.scan(root)
    assert graph["src/agent.c"] == ["src/agent.h", "src/core/health.h"]  # via src/
    assert graph["src/log.h"] == ["include/nccl/net.h"]  # via include/
    assert ig.check(graph) == []
    block = ig.render(graph)
    assert "lanes -> lane contract  lane_ops.h" in block
    assert "agent glue -> core API       health.h" in block


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        # a lane reaching into the core's private header
        (
            {"src/lanes/tcp.c": '#include "../core/conn.h"\n'},
            "a lane includes src/core/conn.h, private to core/",
        ),
        # the core calling the agent glue back: the five-file loop of issue 16
        (
            {"src/core/conn.c": '#include "conn.h"\n#include "../agent.h"\n'},
            "layer core -> agent glue is not allowed",
        ),
        # two headers including each other
        (
            {
                "src/core/wire.h": '#include "../log.h"\n#include "health.h"\n',
                "src/core/health.h": '#include "wire.h"\n',
            },
            "include cycle between files",
        ),
        # the lane contract naming a concrete lane, whose file includes the contract
        (
            {
                "src/lanes/lane_ops.h": '#include "tcp.h"\n',
                "src/lanes/tcp.h": '#include "lane_ops.h"\n',
            },
            "layer lane contract -> lanes is not allowed",
        ),
        (
            {"src/lanes/tcp.c": '#include "missing.h"\n'},
            '#include "missing.h" resolves to no file',
        ),
    ],
)
def test_checker_reports_each_violation(
    tmp_path: Path, change: dict[str, str], expect: str
) -> None:
    root = _tree(tmp_path, {**GOOD, **change})
    problems = ig.check(ig.scan(root))
    assert any(expect in p for p in problems), problems


def test_layer_cycle_is_reported(tmp_path: Path) -> None:
    # base including the core API while the core API includes base
    root = _tree(tmp_path, {**GOOD, "src/log.h": '#include "core/health.h"\n'})
    problems = ig.check(ig.scan(root))
    assert any(p.startswith("cycle between layers: ") for p in problems), problems
    assert any("layer base -> core API is not allowed" in p for p in problems), problems
