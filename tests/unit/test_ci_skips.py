"""The suite's own rules (tests/conftest.py): in CI a skip fails the run (an expected failure
and a marker deselection do not); outside CI a skip stays a skip. And the session's marker finds
every process it started that is still running (the end-of-session survivor check)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import SESSION_MARK_ENV, NoSkipsInCI, processes_marked, until

pytest_plugins = ["pytester"]

INNER = """
import pytest

def test_passes():
    pass

def test_skips():
    pytest.skip("no frobnicator here")

@pytest.mark.skipif(True, reason="never on this machine")
def test_skipif():
    pass

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_expected_failure():
    assert False

@pytest.mark.image
def test_deselected():
    pytest.skip("must never run: deselected by -m 'not image'")
"""

INI = """
[pytest]
markers =
    image: deselected in the default run
addopts = -m "not image"
"""


def run_inner(pytester: pytest.Pytester) -> pytest.RunResult:
    pytester.makeini(INI)
    pytester.makepyfile(test_inner=INNER)
    return pytester.runpytest_inprocess("-rA", plugins=[NoSkipsInCI()])


def test_a_skip_fails_the_run_in_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    res = run_inner(pytester)
    # the skip in the test body fails the test, the skipif fails its setup (an error)
    res.assert_outcomes(passed=1, failed=1, errors=1, xfailed=1, deselected=1)
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.stdout.fnmatch_lines(
        [
            "*skipped in CI (CI='true'), which fails the run: no frobnicator here*",
            "*skipped in CI (CI='true'), which fails the run: never on this machine*",
        ]
    )


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_a_skip_stays_a_skip_outside_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    res = run_inner(pytester)
    res.assert_outcomes(passed=1, skipped=2, xfailed=1, deselected=1)
    assert res.ret == pytest.ExitCode.OK


def test_survivor_scan_finds_a_marked_child_until_it_is_gone() -> None:
    value = f"test-{os.getpid()}-{id(object())}"
    env = {**os.environ, SESSION_MARK_ENV: value}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        # the child's environ is readable once it has exec'd the interpreter
        until(lambda: processes_marked(value), 10, "the marked child is found")
        found = processes_marked(value)
        assert [pid for pid, _ in found] == [child.pid], found
        assert "time.sleep(60)" in found[0][1]
        # this process is excluded by pid, and it does not carry this value
        assert processes_marked(value, frozenset({child.pid})) == []
    finally:
        child.kill()
        child.wait(10)
    assert processes_marked(value) == []


def test_the_session_marker_is_set_and_inherited() -> None:
    """The running session set its marker; a child of a child of this process carries it."""
    value = os.environ.get(SESSION_MARK_ENV)
    assert value, f"{SESSION_MARK_ENV} not set by the session"
    code = (
        "import subprocess, sys; "
        "subprocess.run([sys.executable, '-c', "
        "'import os; print(os.environ[\"" + SESSION_MARK_ENV + "\"])'], check=True)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == value
