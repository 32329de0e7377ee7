"""The trial children of an eBPF source (railhop.sources.ebpf.loader.run_trials and
railhop.sources.bpftrial): every hook's first choice is tried in one compile first, one by one
only when that fails; and the start bound a slow (emulated) node sets."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from typing import Any

import pytest

from railhop.sources import bpftrial
from railhop.sources import hooks as H
from railhop.sources.ebpf import loader


class _Died(Exception):
    """The fake child dies on this compile (an LLVM abort in the real one)."""


def _plan() -> H.Plan:
    """Two hooks: A (variants a1, a2), B (variant b1)."""
    c = [
        [H.Candidate(0, 0, 0, ("-Da1",)), H.Candidate(1, 0, 1, ("-Da2",))],
        [H.Candidate(2, 1, 0, ("-Db1",))],
    ]
    return H.Plan(c, [[], []])


def _fake_children(
    monkeypatch: pytest.MonkeyPatch,
    bad: set[str],
    die: set[str] = frozenset(),  # type: ignore[assignment]
) -> list[list[str]]:
    """Run the real child's main() in-process for each subprocess.run, with a compile that
    fails for any flag in ``bad`` and dies for any flag in ``die``. Returns every compile's
    flags, in order."""
    compiles: list[list[str]] = []

    def fake_try(_req: dict[str, Any], cflags: list[str]) -> str:
        compiles.append(list(cflags))
        if set(cflags) & die:
            raise _Died
        hit = sorted(set(cflags) & bad)
        return f"Exception: cannot attach {hit[0]}" if hit else ""

    def fake_run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        out = io.StringIO()
        monkeypatch.setattr("sys.stdin", io.StringIO(kw["input"]))
        rc = 0
        with contextlib.redirect_stdout(out):
            try:
                bpftrial.main()
            except _Died:
                rc = -6
        return subprocess.CompletedProcess(argv, rc, out.getvalue(), "")

    monkeypatch.setattr(bpftrial, "_try", fake_try)
    monkeypatch.setattr(bpftrial, "_mark", lambda _i: None)
    monkeypatch.setattr(loader.subprocess, "run", fake_run)
    return compiles


def test_every_first_choice_together_is_one_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    compiles = _fake_children(monkeypatch, bad=set())
    out = loader.run_trials("/x.bpf.c", ["-I/b"], _plan(), timeout_s=60)
    assert compiles == [["-I/b", "-Da1", "-Db1"]]  # one compile, not one per hook + combined
    assert out.results == {0: (True, ""), 2: (True, "")}
    assert out.combined_ok
    caps, flags, _chosen = H.resolve(
        H.ProbeSpec(
            "t",
            "t.bpf.c",
            (
                H.Hook("A", (H.Variant("fentry", "a", "RH_A1"), H.Variant("kprobe", "a", "RH_A2"))),
                H.Hook("B", (H.Variant("tp", "b", "RH_B1"),)),
            ),
        ),
        _plan(),
        out,
    )
    assert [c.attached for c in caps] == [True, True] and flags == ["-Da1", "-Db1"]


def test_a_failing_first_choice_falls_back_to_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    compiles = _fake_children(monkeypatch, bad={"-Da1"})
    out = loader.run_trials("/x.bpf.c", [], _plan(), timeout_s=60)
    assert compiles == [
        ["-Da1", "-Db1"],  # together: fails on a1
        ["-Da1"],  # one by one: a1 fails, a2 loads
        ["-Da2"],
        ["-Db1"],
        ["-Da2", "-Db1"],  # the winners combined
    ]
    assert out.results[0][0] is False and "a1" in out.results[0][1]
    assert out.results[1] == (True, "") and out.results[2] == (True, "")
    assert out.combined_ok


def test_a_child_that_dies_together_is_followed_by_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compiles = _fake_children(monkeypatch, bad=set(), die={"-Da1"})
    out = loader.run_trials("/x.bpf.c", [], _plan(), timeout_s=60)
    # the first child died on all together; a fresh one tries a1 (dies again), the next one a2
    assert compiles[0] == ["-Da1", "-Db1"]
    assert ["-Da1"] in compiles[1:] and compiles[-1] == ["-Da2", "-Db1"]
    assert out.results[0][0] is False and "died" in out.results[0][1]
    assert out.results[1] == (True, "") and out.combined_ok


def test_the_request_asks_for_together_only_once(monkeypatch: pytest.MonkeyPatch) -> None:
    reqs: list[dict[str, Any]] = []

    def fake_run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        reqs.append(json.loads(kw["input"]))
        # dies at once, on the attempt the request starts with
        first = -2 if reqs[-1]["together"] else reqs[-1]["hooks"][0][0]["i"]
        return subprocess.CompletedProcess(argv, -6, json.dumps({"start": first}) + "\n", "")

    monkeypatch.setattr(loader.subprocess, "run", fake_run)
    out = loader.run_trials("/x.bpf.c", [], _plan(), timeout_s=60)
    assert [r["together"] for r in reqs] == [True, False, False, False]
    assert not out.combined_ok and set(out.results) == {0, 1, 2}


def test_start_bound_from_the_environment() -> None:
    assert loader.start_timeout_s({}) == loader.START_TIMEOUT_S == 180.0
    assert loader.trial_timeout_s({}) == pytest.approx(120.0)
    env = {loader.TIMEOUT_ENV: "600"}
    assert loader.start_timeout_s(env) == 600.0
    assert loader.trial_timeout_s(env) == pytest.approx(400.0)
    for bad in ("soon", "0", "-5", "inf", "nan"):
        with pytest.raises(ValueError, match="RAILHOP_EBPF_TIMEOUT_S"):
            loader.start_timeout_s({loader.TIMEOUT_ENV: bad})


def test_agent_config_takes_the_bound_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from railhop.daemon.config import AgentConfig

    monkeypatch.setenv(loader.TIMEOUT_ENV, "700")
    assert AgentConfig().ebpf_start_timeout_s == 700.0
    monkeypatch.delenv(loader.TIMEOUT_ENV)
    assert AgentConfig().ebpf_start_timeout_s == 180.0


def test_quick_sources_bound_from_the_environment() -> None:
    from railhop.sources.base import QUICK_TIMEOUT_ENV, source_timeout_s

    assert source_timeout_s({}) == 30.0
    assert source_timeout_s({QUICK_TIMEOUT_ENV: " 240 "}) == 240.0
    with pytest.raises(ValueError, match=QUICK_TIMEOUT_ENV):
        source_timeout_s({QUICK_TIMEOUT_ENV: "-1"})


def test_a_quick_source_past_its_bound_is_left_out_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio

    from railhop.sources.base import QUICK_TIMEOUT_ENV, Capability, Registry

    class Slow:
        name = "netlink"

        async def start(self, emit: Any) -> list[Capability]:
            await asyncio.sleep(5)
            return []

        async def stop(self) -> None:
            return None

    started: list[str] = []
    monkeypatch.setenv(QUICK_TIMEOUT_ENV, "0.05")
    reg = Registry([Slow()])

    async def body() -> None:
        await reg.start(lambda _e: None, lambda s, _c: started.append(s.name))
        await reg.stop_all()

    asyncio.run(body())
    assert started == []
    assert "netlink failed to start: not started within 0.05 s (RAILHOP_SOURCE_TIMEOUT_S)" in (
        caplog.text
    )
