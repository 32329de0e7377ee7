"""The verbs lane's completion probes, traced by the agent's ``usdt.verbs`` source.

``plugin/tests/verbs_usdt_drive.c`` drives lanes/verbs/poll.c on the fake libibverbs device
(no RDMA device is needed): NOK successful writes (byte_len 1000 + i, each polled >= 2 ms after
its post), NERR queue pairs failing one write each with STATUS plus a flushed one, a QP_FATAL
and a PORT_ERR, all on the plugin's NIC index NIC. The source attaches by the program's path,
like it does to the plugin library. Then the real agent loop: one process's error completions
make the NIC SUSPECT only; a second process's corroborate them and the NIC goes DOWN.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from conftest import require
from railhop import daemon, health
from railhop.metrics import AgentMetrics
from railhop.sources.events import Event, VerbsAsync, VerbsWcError
from railhop.sources.usdt import stapsdt_notes
from railhop.sources.verbs_usdt import VERBS_PROBES, VerbsUsdtSource

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[2]
DGX = REPO / "tests" / "fixtures" / "sys" / "dgx-h100"
POLICY = REPO / "policies" / "rail-optimized-8nic.yaml"
RETRY_EXC_ERR = 12


def _drive() -> Path:
    p = Path(os.environ.get("RAILHOP_VERBS_DRIVE", REPO / "build/ctest/plugin/verbs_usdt_drive"))
    require(
        p.is_file(),
        f"{p} not built (make ctest, or cmake --build build/ctest --target verbs_usdt_drive; "
        "needs libibverbs-dev and systemtap-sdt-dev)",
    )
    names = {n.name for n in stapsdt_notes(p.read_bytes()) if n.provider == "railhop"}
    require(set(VERBS_PROBES) <= names, f"{p} has no verbs probes (built without sys/sdt.h?)")
    return p


class Driven:
    """One run of the drive program, held alive (stdin open) until closed."""

    def __init__(self, drive: Path, nic: int, nok: int, nerr: int, status: int) -> None:
        self.proc = subprocess.Popen(
            [str(drive), "--hold", str(nic), str(nok), str(nerr), str(status)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()  # written once every probe has fired
        f = dict(zip(line[::2], line[1::2], strict=False))
        assert int(f["pid"]) == self.proc.pid, line
        self.pid = self.proc.pid
        self.qpn = int(f["qpn"])
        self.err_qpns = [int(x) for x in f["err_qpns"].split(",") if x]

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=30)


def _until(cond: Callable[[], object], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"{what}: not within {timeout} s"
        time.sleep(0.01)


def test_verbs_probes_fields() -> None:
    drive = _drive()
    events: list[Event] = []
    src = VerbsUsdtSource(drive)
    caps = src.start_sync(events.append)
    try:
        assert {c.hook for c in caps if c.attached} == set(VERBS_PROBES), [c.line() for c in caps]
        run = Driven(drive, nic=2, nok=3, nerr=2, status=RETRY_EXC_ERR)
        try:

            def mine() -> list[Event]:
                return [e for e in events if getattr(e, "pid", None) == run.pid]

            _until(lambda: len(mine()) >= 6, 10, "the 6 records of the drive")
            mine_ = mine()
            errs = [e for e in mine_ if isinstance(e, VerbsWcError)]
            # per failed queue pair: its failed write, then the write behind it flushed
            assert [(e.qp_num, e.nic, e.status_name) for e in errs] == [
                (q, 2, s) for q in run.err_qpns for s in ("RETRY_EXC_ERR", "WR_FLUSH_ERR")
            ]
            assert [e.status for e in errs] == [RETRY_EXC_ERR, 5] * 2
            asy = [e for e in mine_ if isinstance(e, VerbsAsync)]
            assert [(e.nic, e.event, e.qp_num, e.port) for e in asy] == [
                (2, "QP_FATAL", run.err_qpns[0], 0),
                (2, "PORT_ERR", 0, 1),
            ]
            assert len(mine_) == 6, mine_
            ts = [e.ts_ns for e in mine_]
            assert ts == sorted(ts)
            # verbs_wc, aggregated in the kernel per (pid, NIC index)
            st = [s for s in src.completion_stats() if s.pid == run.pid]
            assert len(st) == 1, st
            s = st[0]
            assert (s.nic, s.wcs, s.errs, s.flushes) == (2, 3 + 2 * 2, 4, 2)
            assert s.bytes == 1000 + 1001 + 1002  # byte_len of the successful writes only
            assert s.timed == s.wcs  # the drive gives every post time
            assert s.post_ns_sum >= 3 * 2_000_000  # each successful write waited >= 2 ms
            assert s.post_ns_sum < 60 * 1_000_000_000
        finally:
            assert run.close() == 0
    finally:
        src.stop_sync()


def _policy(tmp: Path) -> Path:
    """The shipped policy with a window long enough that a loaded CI machine's process start
    stays inside it, and a SUSPECT that does not clear during the test."""
    text = POLICY.read_text()
    text = text.replace("suspect_window_ms: 2000", "suspect_window_ms: 60000")
    text = text.replace("suspect_clear_ms: 5000", "suspect_clear_ms: 120000")
    assert "suspect_window_ms: 60000" in text and "suspect_clear_ms: 120000" in text
    p = tmp / "policy.yaml"
    p.write_text(text)
    return p


def _sample(reg: CollectorRegistry, name: str, **labels: str) -> float:
    v = reg.get_sample_value(name, labels)
    return 0.0 if v is None else v


def test_verbs_error_completions_are_evidence_one_process_cannot_take_a_nic_down(
    tmp_path: Path,
) -> None:
    drive = _drive()
    nics = ("ibp25s0", "ibp59s0", "ibp76s0", "ibp93s0")  # the plugins' NIC order (index 2: ibp76s0)
    reg = CollectorRegistry()
    metrics = AgentMetrics(reg)
    cfg = daemon.AgentConfig(
        policy_path=_policy(tmp_path),
        run_dir=tmp_path / "run",
        sys_root=DGX,
        heartbeat_ms=50,
        reload_interval_s=0.05,
        usdt_lib=drive,
        plugin_nics=nics,
    )
    src = VerbsUsdtSource(drive)
    agent = daemon.Agent(cfg, source_factory=lambda c, t, p: [src], metrics=metrics)

    def state(nic: str) -> health.NicState:
        assert agent.model is not None
        return agent.model[nic].state

    def errors(status: str) -> float:
        return _sample(
            reg, "railhop_verbs_completion_errors_total", device="ibp76s0", status=status
        )

    async def body() -> dict[str, Any]:
        task = asyncio.create_task(agent.run())
        out: dict[str, Any] = {}
        try:
            await asyncio.wait_for(agent.sources.ready.wait(), 120)
            caps = [c for c in src.capabilities if c.attached]
            assert {c.hook for c in caps} == set(VERBS_PROBES), src.capabilities
            # one process: two retry-exhausted completions (and their flushes) on ibp76s0
            a = await asyncio.to_thread(Driven, drive, 2, 3, 2, RETRY_EXC_ERR)
            await _aw(lambda: errors("WR_FLUSH_ERR") == 2 and errors("RETRY_EXC_ERR") == 2)
            await _aw(
                lambda: (
                    _sample(
                        reg, "railhop_verbs_async_events_total", device="ibp76s0", event="PORT_ERR"
                    )
                    == 1
                )
            )
            # every record of it handled: evidence, but one process's word: SUSPECT, not DOWN
            assert agent.model is not None
            assert state("ibp76s0") is health.NicState.SUSPECT
            assert "uncorroborated" in agent.model["ibp76s0"].reason
            out["alone"] = agent.model["ibp76s0"].reason
            assert all(state(n) is health.NicState.UP for n in nics if n != "ibp76s0")
            # its queue pair's async events are counted, not evidence (the agent's own verbs
            # source hears a port's events itself)
            out["completions"] = _sample(reg, "railhop_verbs_completions_total", device="ibp76s0")
            # a second process fails on the same NIC: corroborated, DOWN
            b = await asyncio.to_thread(Driven, drive, 2, 0, 3, RETRY_EXC_ERR)
            await _aw(lambda: state("ibp76s0") is health.NicState.DOWN)
            out["down"] = agent.model["ibp76s0"].reason
            assert all(state(n) is health.NicState.UP for n in nics if n != "ibp76s0")
            assert await asyncio.to_thread(a.close) == 0
            assert await asyncio.to_thread(b.close) == 0
        finally:
            agent.request_stop()
            assert await asyncio.wait_for(task, 30) == 0
        return out

    out = asyncio.run(body())
    assert out["completions"] == 3 + 2 * 2  # the kernel map, scraped: the first process's
    assert "lane error" in out["down"], out


async def _aw(cond: Callable[[], object], timeout: float = 15.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not met before the deadline"
        await asyncio.sleep(0.01)


def test_the_plugin_library_carries_the_verbs_probes() -> None:
    """The verbs lane drains its queues through poll.c, so the plugin itself (not only the test
    driver) carries every verbs probe with its arguments: verbs_wc's 5, the others' 4."""
    from conftest import require_built
    from railhop import paths

    require_built()
    notes = stapsdt_notes(Path(paths.plugin_path()).read_bytes())
    nargs = {n.name: n.nargs for n in notes if n.name in VERBS_PROBES}
    assert nargs == {"verbs_wc": 5, "verbs_wc_err": 4, "verbs_async": 4}, nargs
