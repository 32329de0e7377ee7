#!/usr/bin/env python3
"""The plugin's include graph, read from the code, and the layering rules it must keep.

Every ``#include "..."`` under plugin/src and plugin/include is resolved the way the compiler
does (next to the including file, then plugin/src, then plugin/include). Each file belongs to
one layer; the layers and the edges allowed between them are the architecture of
docs/architecture.md:

    api_nccl.c -> agent glue, lanes (the transport choice) and core API;  core -> core API;
    lanes -> core API (the lane contract, core/lane_ops.h, is part of it);  everything may use
    base (log, param, nic, probes) and the ABI headers.

``check()`` reports: a cycle between files, a cycle between layers, an edge between layers
that the rules do not allow, a lane that includes a core header private to core/, and an
include that resolves to nothing. ``transport_names()`` reports each place where the core (its
code, comments and strings left out) names a transport: a lane's symbol (``tcp_``, ``ofi_``,
``verbs_``, ``rh_lanes_``), the libfabric or verbs API, or a transport's build switch. The
assembly point registers the transport; the core only sees ``struct lane_ops``. ``render()``
draws the layer graph (with the headers that carry each edge) for docs/architecture.md,
between the markers below.

Usage: include_graph.py [--root DIR] [--check] [--markdown] [--doc FILE [--write]]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
BEGIN = "<!-- include-graph:begin (scripts/include_graph.py --doc docs/architecture.md --write) -->"
END = "<!-- include-graph:end -->"

# Core headers that other layers may include; every other header under src/core is private.
CORE_API = {
    "src/rh.h",
    "src/core/health.h",
    "src/core/wire.h",
    "src/core/sched.h",
    "src/core/lane_state.h",
    "src/core/lane_ops.h",
    "src/core/fmac.h",
}

LAYERS = ["api", "agent glue", "core", "core API", "lanes", "base", "ABI"]

ALLOWED = {
    "api": {"agent glue", "lanes", "core API", "base", "ABI"},
    "agent glue": {"core API", "base", "ABI"},
    "core": {"core API", "base", "ABI"},
    "core API": {"base", "ABI"},
    "lanes": {"core API", "base", "ABI"},
    "base": {"ABI"},
    "ABI": set(),
}

# What naming a transport looks like in C: a lane module's symbol, the libfabric or verbs API,
# a transport's build switch.
TRANSPORT_RE = re.compile(
    r"\b(?:rh_)?(?:tcp|ofi|verbs|lanes)_\w+|\b(?:TCP|OFI|VERBS)_\w+|\bRH_HAVE_(?:OFI|VERBS)\b"
    r"|\b(?:fi|fid|ibv|lf)_\w+"
)
# Comments, string and character literals (removed before looking for names).
CODE_NOISE_RE = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def layer(rel: str) -> str:
    """The layer of a file, by its path relative to plugin/."""
    if rel.startswith("include/"):
        return "ABI"
    if rel in CORE_API:
        return "core API"
    if rel.startswith("src/core/"):
        return "core"
    if rel.startswith("src/lanes/"):
        return "lanes"
    if rel == "src/api_nccl.c":
        return "api"
    if Path(rel).stem in ("agent", "ctl"):
        return "agent glue"
    return "base"


def scan(root: Path) -> dict[str, list[str]]:
    """File -> the files it includes (paths relative to root; '?name' when unresolved)."""
    graph: dict[str, list[str]] = {}
    search = [root / "src", root / "include"]
    files = sorted(
        p for d in search if d.is_dir() for p in d.rglob("*") if p.suffix in (".c", ".h")
    )
    for f in files:
        rel = f.relative_to(root).as_posix()
        graph[rel] = []
        for name in INCLUDE_RE.findall(f.read_text(errors="replace")):
            for base in [f.parent, *search]:
                cand = (base / name).resolve()
                if cand.is_file():
                    graph[rel].append(cand.relative_to(root.resolve()).as_posix())
                    break
            else:
                graph[rel].append("?" + name)
    return graph


def transport_names(root: Path) -> list[str]:
    """Each place where a core file (layers core and core API) names a transport in code."""
    problems = []
    for f in sorted((root / "src").rglob("*")):
        rel = f.relative_to(root).as_posix()
        if f.suffix not in (".c", ".h") or layer(rel) not in ("core", "core API"):
            continue
        text = f.read_text(errors="replace")
        # blank out the noise but keep the line breaks, so line numbers stay true
        code = CODE_NOISE_RE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)
        for m in TRANSPORT_RE.finditer(code):
            line = code.count("\n", 0, m.start()) + 1
            problems.append(f"{rel}:{line}: the core names a transport ({m.group()})")
    return problems


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph (as a closed path), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def layer_edges(graph: dict[str, list[str]]) -> dict[tuple[str, str], set[str]]:
    """(from layer, to layer) -> the included files that make the edge (self-edges left out)."""
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for f, incs in graph.items():
        for inc in incs:
            if inc.startswith("?"):
                continue
            a, b = layer(f), layer(inc)
            if a != b:
                out[(a, b)].add(inc)
    return out


def check(graph: dict[str, list[str]]) -> list[str]:
    problems = []
    for f, incs in sorted(graph.items()):
        for inc in incs:
            if inc.startswith("?"):
                problems.append(f'{f}: #include "{inc[1:]}" resolves to no file')
            elif layer(f) == "lanes" and layer(inc) == "core":
                problems.append(f"{f}: a lane includes {inc}, private to core/")
    cyc = find_cycle({f: {i for i in incs if not i.startswith("?")} for f, incs in graph.items()})
    if cyc:
        problems.append("include cycle between files: " + " -> ".join(cyc))
    edges = layer_edges(graph)
    ledges: dict[str, set[str]] = defaultdict(set)
    for (a, b), via in sorted(edges.items()):
        ledges[a].add(b)
        if b not in ALLOWED[a]:
            problems.append(f"layer {a} -> {b} is not allowed (via {', '.join(sorted(via))})")
    cyc = find_cycle(ledges)
    if cyc:
        problems.append("cycle between layers: " + " -> ".join(cyc))
    return problems


def render(graph: dict[str, list[str]]) -> str:
    """The layer graph as a Markdown block: members of each layer, then each edge."""
    members: dict[str, list[str]] = defaultdict(list)
    for f in graph:
        members[layer(f)].append(f)
    lines = [BEGIN, "", "| layer | files (plugin/) |", "|---|---|"]
    for name in LAYERS:
        files = members.get(name, [])
        if name == "ABI":
            shown = sorted({str(Path(f).parent) + "/" for f in files})
        else:
            shown = sorted(files)
        lines.append(f"| {name} | {', '.join(f'`{s}`' for s in shown)} |")
    lines += ["", "```"]
    edges = layer_edges(graph)
    for a in LAYERS:
        for b in LAYERS:
            via = edges.get((a, b))
            if via:
                names = ", ".join(sorted(Path(v).name for v in via if layer(v) != "ABI"))
                if any(layer(v) == "ABI" for v in via):
                    names = ", ".join(x for x in (names, "include/...") if x)
                lines.append(f"{a:>14} -> {b:<14} {names}")
    lines += ["```", "", END]
    return "\n".join(lines)


def splice(doc: str, block: str) -> str:
    a, b = doc.index(BEGIN), doc.index(END) + len(END)
    return doc[:a] + block + doc[b:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent / "plugin")
    ap.add_argument("--check", action="store_true", help="exit 1 on any layering problem")
    ap.add_argument("--markdown", action="store_true", help="print the graph block")
    ap.add_argument("--doc", type=Path, help="the document holding the graph block")
    ap.add_argument("--write", action="store_true", help="with --doc: rewrite its block")
    args = ap.parse_args(argv)
    graph = scan(args.root)
    rc = 0
    if args.check:
        for p in check(graph) + transport_names(args.root):
            print(p, file=sys.stderr)
            rc = 1
    if args.markdown:
        print(render(graph))
    if args.doc:
        doc = args.doc.read_text()
        if BEGIN not in doc or END not in doc:
            print(f"{args.doc}: no include-graph markers ({BEGIN} ... {END})", file=sys.stderr)
            return 1
        new = splice(doc, render(graph))
        if args.write:
            args.doc.write_text(new)
        elif new != doc:
            print(f"{args.doc}: the include graph is out of date (--write)", file=sys.stderr)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
