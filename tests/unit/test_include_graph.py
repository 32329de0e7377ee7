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


# A small plugin that keeps every rule: api -> agent glue, lanes (the choice) and core API;
# core -> core API (the lane contract among it); lanes -> core API.
GOOD = {
    "include/nccl/net.h": "",
    "src/log.h": '#include "nccl/net.h"\n',
    "src/rh.h": "",
    "src/core/health.h": "",
    "src/core/wire.h": '#include "../log.h"\n',
    "src/core/lane_ops.h": '#include "wire.h"\n',
    "src/core/conn.h": '#include "lane_ops.h"\n#include "wire.h"\n',
    "src/core/conn.c": '#include "conn.h"\n#include "health.h"\n#include "../rh.h"\n'
    "/* registered by the assembly point: tcp_lane_ops, lanes_choose() */\n"
    'static const char *s = "ofi_lane_ops";\nint rh_conn_x(void) { return 0; }\n',
    "src/lanes/lanes.h": '#include "../core/lane_ops.h"\n',
    "src/lanes/tcp.c": '#include "lanes.h"\n#include "../log.h"\n',
    "src/agent.h": "",
    "src/agent.c": '#include "agent.h"\n#include "core/health.h"\n',
    "src/api_nccl.c": '#include "agent.h"\n#include "lanes/lanes.h"\n#include "rh.h"\n'
    '#include "nccl/net.h"\n',
}


def test_plugin_keeps_its_layering() -> None:
    graph = ig.scan(REPO / "plugin")
    assert "src/core/conn.h" in graph and "src/core/lane_ops.h" in graph
    assert ig.layer("src/core/lane_ops.h") == "core API"
    assert ig.check(graph) == []


def test_the_core_names_no_transport() -> None:
    assert ig.transport_names(REPO / "plugin") == []


@pytest.mark.parametrize(
    ("code", "name"),
    [
        ("rh_g.ops = rh_lanes_choose();", "rh_lanes_choose"),  # the core choosing
        ("extern const struct lane_ops tcp_lane_ops;", "tcp_lane_ops"),
        ("#ifdef RH_HAVE_OFI", "RH_HAVE_OFI"),
        ("fi_close(&ep->fid);", "fi_close"),  # the libfabric API
    ],
)
def test_a_core_file_naming_a_transport_is_reported(tmp_path: Path, code: str, name: str) -> None:
    conn_c = GOOD["src/core/conn.c"] + code + "\n"
    root = _tree(tmp_path, {**GOOD, "src/core/conn.c": conn_c})
    problems = ig.transport_names(root)
    line = conn_c.count("\n")
    assert problems == [f"src/core/conn.c:{line}: the core names a transport ({name})"]
    assert ig.main(["--root", str(root), "--check"]) == 1


def test_names_in_comments_strings_and_lanes_do_not_count(tmp_path: Path) -> None:
    # GOOD's conn.c names transports only in a comment and a string; lanes may name themselves
    root = _tree(tmp_path, {**GOOD, "src/lanes/tcp.c": "const int tcp_lane_ops = 0;\n"})
    assert ig.transport_names(root) == []


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
    assert "lanes -> core API       lane_ops.h" in block
    assert "api -> lanes          lanes.h" in block
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
                "src/core/lane_ops.h": '#include "../lanes/tcp.h"\n',
                "src/lanes/tcp.h": '#include "../core/lane_ops.h"\n',
            },
            "layer core API -> lanes is not allowed",
        ),
        # the core choosing its transport through the lanes' header
        (
            {"src/core/conn.c": '#include "conn.h"\n#include "../lanes/lanes.h"\n'},
            "layer core -> lanes is not allowed",
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
