"""Where the installed pieces of railhop live: plugin libraries, harness, bpf sources, policies.

The CMake part of the build installs them inside the package (``railhop/lib``, ``railhop/data``).
``RAILHOP_PLUGIN_PATH`` / ``RAILHOP_HARNESS_PATH`` override the lookup (used when running from a
source tree against a plain CMake build).
"""

from __future__ import annotations

import os
from pathlib import Path

PKG_DIR = Path(__file__).resolve().parent
LIB_DIR = PKG_DIR / "lib"
DATA_DIR = PKG_DIR / "data"

NCCL_PLUGIN_NAME = "libnccl-net-railhop.so"
RCCL_PLUGIN_NAME = "librccl-net-railhop.so"
HARNESS_NAME = "railhop-harness"


class NotInstalledError(FileNotFoundError):
    """A built artefact (plugin, harness) is not where the install should have put it."""


def _find(env: str, name: str) -> Path:
    override = os.environ.get(env)
    if override:
        p = Path(override).resolve()
        if not p.is_file():
            raise NotInstalledError(f"{env}={override} does not name a file")
        return p
    p = LIB_DIR / name
    if not p.is_file():
        raise NotInstalledError(
            f"{name} is not installed at {p}; run `make setup` (or `pip install .`) first"
        )
    return p


def plugin_path(rccl: bool = False) -> Path:
    """Absolute path of the installed NCCL (or RCCL) network plugin."""
    return _find("RAILHOP_PLUGIN_PATH", RCCL_PLUGIN_NAME if rccl else NCCL_PLUGIN_NAME)


def harness_path() -> Path:
    """Absolute path of the ncclNet driver program used by tests, benchmarks and the demo."""
    return _find("RAILHOP_HARNESS_PATH", HARNESS_NAME)


def bpf_dir() -> Path:
    """Directory of the shipped eBPF C sources (falls back to the source tree's bpf/)."""
    installed = DATA_DIR / "bpf"
    if installed.is_dir():
        return installed
    return PKG_DIR.parent.parent / "bpf"


def policies_dir() -> Path:
    """Directory of the shipped policy files and their JSON Schema."""
    installed = DATA_DIR / "policies"
    if installed.is_dir():
        return installed
    return PKG_DIR.parent.parent / "policies"
