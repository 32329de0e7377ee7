"""Shared pytest configuration.

Tests marked ``privileged`` need root (network namespaces, veth, tc, eBPF). Outside CI they are
skipped without root; in CI (``CI`` set) a missing prerequisite is a failure, never a skip.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from railhop_lab.fabric import Fabric
    from railhop_lab.harness import HarnessResult
    from railhop_lab.vmlab import VmLab

REPO = Path(__file__).resolve().parents[1]


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def require(condition: bool, why: str) -> None:
    """Skip (locally) or fail (in CI) when a prerequisite of a privileged test is missing."""
    if condition:
        return
    if in_ci():
        pytest.fail(f"prerequisite missing in CI: {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(autouse=True)
def _privileged_gate(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("privileged") is not None:
        require(os.geteuid() == 0, "needs root (netns, veth, tc, eBPF)")


def require_built() -> None:
    """The plugin and the harness must exist (a `make ctest` build or the installed package)."""
    from railhop import paths
    from railhop_lab.harness import use_source_tree_build

    use_source_tree_build()
    for what, fn in (("plugin", paths.plugin_path), ("harness", paths.harness_path)):
        try:
            fn()
        except paths.NotInstalledError as e:
            require(False, f"{what} not built ({e}); run `make ctest` and set RAILHOP_*_PATH")


def until(cond: Callable[[], object], timeout: float, what: str, poll: float = 0.02) -> None:
    """Wait for ``cond()`` to be true, failing the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(poll)


@pytest.fixture(scope="session")
def lab() -> Iterator[VmLab]:
    """The Soft-RoCE VM lab (tests/vm): one boot of the two guests, shared by every VM test of the
    session (a boot under emulation takes about a minute on two busy cores); each test leaves the
    rails healed for the next (``_healed``)."""
    from railhop_lab.vmlab import VmLab, VmLabError, find_guest_kernel, find_vng

    require(os.geteuid() == 0, "needs root")
    require(shutil.which("qemu-system-x86_64") is not None, "no qemu-system-x86_64 (make setup)")
    try:
        find_vng()
        find_guest_kernel()
    except VmLabError as e:
        require(False, str(e))
    with VmLab(nics=4) as vm:
        yield vm


def fabric_fixture(
    prefix: str, *, nodes: int = 2, nics: int = 4, rate_mbit: int, plugin: bool = True
) -> Callable[[], Iterator[Fabric]]:
    """A module's netns fabric (:class:`railhop_lab.fabric.Fabric`) as a module-scoped fixture,
    named ``fab`` where the module binds it: ``fab = fabric_fixture("rhxx", rate_mbit=200)``.
    Root is required first (module fixtures run before the per-test gate); ``plugin`` also
    requires the plugin and harness builds (``require_built``). Each test leaves the fabric
    healed for the next (``_healed``)."""
    from railhop_lab.fabric import Fabric, unique_prefix

    def fab() -> Iterator[Fabric]:
        require(os.geteuid() == 0, "needs root (netns, veth, tc)")
        if plugin:
            require_built()
        with Fabric(nodes=nodes, nics=nics, rate_mbit=rate_mbit, prefix=unique_prefix(prefix)) as f:
            yield f

    return pytest.fixture(scope="module", name="fab")(fab)


@pytest.fixture(autouse=True)
def _healed(request: pytest.FixtureRequest) -> Iterator[None]:
    """Heal every fault of the test's netns fabric (``fab``) or VM lab (``lab``) after it; the
    lab's rails must then pass frames end to end (a rail left dead is named at the test that left
    it, not at the next one that needs it)."""
    yield
    for name in ("fab", "lab"):
        if name in request.fixturenames:
            request.getfixturevalue(name).heal_all()
    if "lab" in request.fixturenames:
        request.getfixturevalue("lab").check_rails()


@pytest.fixture(scope="module")
def built() -> None:
    """The plugin and the harness are built (``require_built``)."""
    require_built()


def check_clean(res: HarnessResult, at_least: int) -> None:
    """A harness run that ended well: both sides ok, no bad byte, at least that many checked."""
    assert res.ok, res.describe()
    assert res.data_errors == 0, res.describe()
    assert res.bytes_checked >= at_least, res.describe()


def verbs_check_path() -> Path:
    """``railhop-verbs-check`` (plugin/tools/verbs_check.c) from ``make ctest``, or
    ``$RAILHOP_VERBS_CHECK_PATH``."""
    default = REPO / "build" / "ctest" / "plugin" / "railhop-verbs-check"
    p = Path(os.environ.get("RAILHOP_VERBS_CHECK_PATH", default))
    require(p.is_file(), f"{p} not built (make ctest)")
    return p
