"""Processes that drove the plugin exit cleanly (root; every byte checked).

Two harness processes per run tear down as NCCL 2.23+ does: deregister, close every comm and
listener, finalize the context (v12; the v10 table has no finalize, its last close stops the
plugin), dlclose. The harness exits 4 when a plugin thread survived that or the plugin logged
after finalize; a plugin thread left running in unmapped code ends the process with SIGSEGV.
Every run must exit 0 on both sides and leave no crash file (core*, libpsm2's *.btr) in the
processes' working directory. Six runs per transport, alternating the two table versions.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import require, require_built
from railhop_lab.fabric import Fabric, unique_prefix
from railhop_lab.harness import HarnessConfig, HarnessRun

pytestmark = pytest.mark.privileged

RUNS = 6
TRANSPORTS = {
    "tcp": {"RAILHOP_TRANSPORT": "tcp"},
    "ofi": {"RAILHOP_TRANSPORT": "ofi", "FI_PROVIDER": "tcp"},
    # auto loads libfabric to look for an RDMA provider (and with Debian's libfabric, libpsm2
    # and its crash handler), then runs TCP lanes here
    "auto": {"RAILHOP_TRANSPORT": "auto"},
}


@pytest.fixture(scope="module")
def fab() -> Iterator[Fabric]:
    require(os.geteuid() == 0, "needs root (netns, veth)")
    require_built()
    with Fabric(nodes=2, nics=2, prefix=unique_prefix("rhtt")) as f:
        yield f


@pytest.fixture
def cores_kept() -> Iterator[None]:
    """Let a crashing process leave its core file (core_pattern permitting)."""
    old = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (old[1], old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, old)


def crash_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("core") or p.suffix == ".btr")


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_every_process_exits_cleanly(
    fab: Fabric, transport: str, tmp_path: Path, cores_kept: None
) -> None:
    for k in range(RUNS):
        api = 12 if k % 2 == 0 else 10
        workdir = tmp_path / f"run{k}"
        workdir.mkdir()
        cfg = HarnessConfig(
            conns=2, sizes=(1 << 20, 0, 4097), count=60, inflight=4, deadline=60, seed=k, api=api
        )
        with HarnessRun(fab, cfg, env=TRANSPORTS[transport], workdir=workdir) as run:
            res = run.wait()
        where = f"{transport} run {k} (api v{api})"
        for side in (res.send, res.recv):
            assert side.returncode == 0, f"{where}: {res.describe()}"
            assert side.clean_success, f"{where}: {res.describe()}"
        assert crash_files(workdir) == [], f"{where}: crash files {crash_files(workdir)}"
