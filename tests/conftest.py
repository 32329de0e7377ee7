"""Shared pytest configuration.

Tests marked ``privileged`` need root (network namespaces, veth, tc, eBPF). Outside CI they are
skipped without root; in CI (``CI`` set) a missing prerequisite is a failure, never a skip: a
prerequisite goes through :func:`require`, and any other skip (``pytest.skip``, ``skipif``,
``importorskip``) is turned into a failure in CI by :class:`NoSkipsInCI`. Deselection by marker
(``-m 'not image'``) is not a skip. An expected failure (``xfail``) is not a skip either.

Every process the session starts must be gone when it ends (:class:`NoSurvivors`): the session
puts a marker in ``os.environ``, which every child inherits (netns helpers, QEMU guests, the
harness), and at its end looks for that marker in ``/proc/*/environ``; a survivor is listed,
killed, and fails the run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
import uuid
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


class NoSkipsInCI:
    """In CI a skipped test is a failed test: a run that skips something tested less than it
    says. Locally a skip stays a skip. ``xfail`` outcomes are not skips."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Iterator[None]:
        outcome = yield
        rep: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
        if not rep.skipped or hasattr(rep, "wasxfail") or not in_ci():
            return
        lr = rep.longrepr
        why = str(lr[2]) if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
        why = why.removeprefix("Skipped: ")
        rep.outcome = "failed"
        rep.longrepr = (
            f"skipped in CI (CI={os.environ.get('CI')!r}), which fails the run: {why}\n"
            "a prerequisite belongs in conftest.require(), which fails in CI with the reason"
        )


SESSION_MARK_ENV = "RH_PYTEST_SESSION"


def processes_marked(value: str, exclude: frozenset[int] = frozenset()) -> list[tuple[int, str]]:
    """``(pid, command line)`` of every process whose environment has
    ``RH_PYTEST_SESSION=<value>`` (root reads every ``/proc/<pid>/environ``; a process that
    exits meanwhile, or a zombie, has none), less ``exclude``."""
    want = f"{SESSION_MARK_ENV}={value}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in exclude:
            continue
        try:
            if want not in (d / "environ").read_bytes().split(b"\0"):
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out.append((int(d.name), cmd.strip()))
    return sorted(out)


class NoSurvivors:
    """Fails the session when a process it started (its environment carries the session's
    marker) is still running at its end; the survivors are listed and killed."""

    def __init__(self) -> None:
        self.value = f"{os.getpid()}-{uuid.uuid4().hex}"

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        os.environ[SESSION_MARK_ENV] = self.value

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        me = frozenset({os.getpid()})
        # one that a test killed may still be exiting: a second's grace before it counts
        grace = time.monotonic() + 1.0
        while processes_marked(self.value, me) and time.monotonic() < grace:
            time.sleep(0.05)
        found: dict[int, str] = {}
        # a survivor may still be forking (a shell that has not yet started its children):
        # kill, look again, until a scan finds none (bounded)
        for _ in range(20):
            survivors = processes_marked(self.value, me)
            if not survivors:
                break
            for pid, cmd in survivors:
                found.setdefault(pid, cmd)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        if not found:
            return
        lines = [f"  pid {pid}: {cmd[:300]}" for pid, cmd in sorted(found.items())]
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        title = f"{len(found)} process(es) started by this session outlived it (killed)"
        if tr is not None:
            tr.write("\n")
            tr.write_sep("=", title, red=True)
            for line in lines:
                tr.write_line(line, red=True)
        else:
            print("\n".join([title, *lines]))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(NoSkipsInCI(), "railhop-no-skips-in-ci")
    if not hasattr(config, "workerinput"):  # one check per session (xdist: the controller)
        config.pluginmanager.register(NoSurvivors(), "railhop-no-survivors")


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


def until(
    cond: Callable[[], object], timeout: float, what: str | Callable[[], str], poll: float = 0.02
) -> None:
    """Wait for ``cond()`` to be true, failing the test after ``timeout`` seconds; ``what`` names
    the event (a callable: called at the failure, to say what was seen meanwhile)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what() if callable(what) else what}: not within {timeout} s")
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
