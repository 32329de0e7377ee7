"""The README's measured results are headlines: every row links the section of
docs/BENCHMARKS.md that holds its command and raw output, and every such link in the docs
names a section that exists (GitHub's heading anchors)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "docs" / "BENCHMARKS.md"
LINK_RE = re.compile(r"BENCHMARKS\.md#([\w-]+)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def bench_anchors() -> set[str]:
    return {anchor(line) for line in BENCH.read_text().splitlines() if line.startswith("#")}


def results_rows() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Measured results", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return rows[1:]  # the header row


def test_anchor_matches_github() -> None:
    assert anchor("## (a) Plugin throughput vs the raw TCP ceiling — `bench/x.py`") == (
        "a-plugin-throughput-vs-the-raw-tcp-ceiling--benchxpy"
    )


def test_every_result_row_links_its_section() -> None:
    rows = results_rows()
    assert 4 <= len(rows) <= 10, "headline rows only: the rest belongs in docs/BENCHMARKS.md"
    known = bench_anchors()
    for row in rows:
        links = LINK_RE.findall(row)
        assert links, f"README result row without a docs/BENCHMARKS.md section: {row[:60]}"
        assert set(links) <= known, f"unknown sections {set(links) - known}"


def test_every_benchmarks_link_in_the_docs_resolves() -> None:
    known = bench_anchors()
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    docs += [REPO / "plugin" / "README.md", REPO / "lab" / "README.md"]
    broken = [
        f"{d.relative_to(REPO)}: #{a}"
        for d in docs
        for a in LINK_RE.findall(d.read_text())
        if a not in known
    ]
    assert not broken, f"links to no section of docs/BENCHMARKS.md: {sorted(broken)}"
