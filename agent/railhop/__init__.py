"""railhop: NIC-failure resilience for NCCL/RCCL collectives (node agent and plugin tools)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("railhop")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+src"

__all__ = ["__version__"]
