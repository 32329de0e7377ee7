"""Shared bits of the bench scripts: import path, root check, small numeric helpers."""

from __future__ import annotations

import glob
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def setup_import_path() -> None:
    """Make `import railhop` and `import railhop_lab` (source tree) and `import pyroute2` (a
    carried wheel) work."""
    try:
        import railhop  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO / "agent"))
    try:
        import railhop_lab  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO / "lab"))
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        # pyroute2 is pure Python: a wheel on sys.path imports as a zip
        wheels = sorted(glob.glob(str(REPO / ".whl" / "pyroute2-*.whl")))
        wheels += sorted(glob.glob(str(Path.cwd() / "pyroute2-*.whl")))
        if not wheels:
            sys.exit("pyroute2 is needed: pip install pyroute2 (or put its wheel in .whl/)")
        sys.path.insert(0, wheels[-1])


def agent_pythonpath() -> str:
    """PYTHONPATH for an agent started from the source tree: the tree's agent/ first, then what
    this process was given (a host without the venv carries the agent's dependencies there)."""
    extra = os.environ.get("PYTHONPATH")
    return str(REPO / "agent") + (os.pathsep + extra if extra else "")


def need_root(what: str) -> None:
    if os.geteuid() != 0:
        sys.exit(f"{what} needs root: it creates network namespaces, veth pairs and tc qdiscs")


def mbit(bytes_per_s: float) -> float:
    return bytes_per_s * 8 / 1e6


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def machine() -> str:
    cpus = os.cpu_count() or 0
    return f"{platform.node()} ({platform.machine()}, {cpus} CPUs, Linux {platform.release()})"


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def write_json(path: str | None, obj: Any) -> None:
    if not path:
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)
    print(f"results written to {path}")
