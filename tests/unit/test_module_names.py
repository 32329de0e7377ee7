"""No two modules of the agent share a name unless they do the same job: a reader who meets
``events.py`` or ``health.py`` must know which one is meant. A shared basename under
agent/railhop fails here unless it is listed below with the reason it is the same job."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

AGENT = Path(__file__).parents[2] / "agent" / "railhop"

# Package markers, not modules with a job.
MARKERS = {"__init__.py", "__main__.py"}

# The same job under the same name, each group with its reason (paths relative to agent/railhop).
SAME_JOB = {
    frozenset({"cli.py", "sources/cli.py"}): "click commands: the railhop group, and the "
    "`railhop sources` / `agent --check` command the group adds",
}


def shared_names(root: Path) -> dict[frozenset[str], str]:
    """Groups of modules under ``root`` that share a basename, keyed by their relative paths."""
    by_name: dict[str, set[str]] = defaultdict(set)
    for p in root.rglob("*.py"):
        if p.name not in MARKERS and "__pycache__" not in p.parts:
            by_name[p.name].add(p.relative_to(root).as_posix())
    return {frozenset(paths): name for name, paths in by_name.items() if len(paths) > 1}


def test_no_shared_module_names_with_different_jobs() -> None:
    unexplained = sorted(sorted(g) for g in shared_names(AGENT) if g not in SAME_JOB)
    assert not unexplained, (
        "modules under agent/railhop share a name; rename one for its job, or list the group "
        f"in SAME_JOB with the reason it is the same job: {unexplained}"
    )


def test_same_job_list_is_current() -> None:
    stale = sorted(sorted(g) for g in SAME_JOB if g not in shared_names(AGENT))
    assert not stale, f"SAME_JOB lists groups that no longer exist: {stale}"


def test_shared_names_finds_nested_duplicates(tmp_path: Path) -> None:
    for rel in ("events.py", "control/events.py", "sources/ebpf/tcp.py", "a/__init__.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    (tmp_path / "__init__.py").write_text("")
    assert shared_names(tmp_path) == {frozenset({"events.py", "control/events.py"}): "events.py"}
