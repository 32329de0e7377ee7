"""The plugin's whole lifecycle over the verbs lane (issue 27, 5) between the two Soft-RoCE guests
of the VM lab: ``verbs_lifecycle`` (plugin/tests/verbs_lifecycle.c) on node 0 loads the plugin,
initialises it, connects to a ``railhop-harness`` receiver on node 1 (a new one per round),
sends checked messages over real RC queue pairs, closes, finalizes and unloads it, ROUNDS times
in one process. After each round the driver itself asserts that the process has no thread and
no descriptor more than before it, and that node 0's rxe devices hold no queue pair, completion
queue, memory region or protection domain of a user process more than before the round (while
they held more during it: the count sees the plugin's objects). Every receiver checks every
byte and exits 0; the driver exits 0. Needs root, QEMU, virtme-ng, a kernel with rxe and
``make ctest``; in CI a missing prerequisite fails instead of skipping.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from conftest import REPO, require
from railhop import paths
from railhop_lab.harness import HarnessConfig, build_argv, parse_lines
from railhop_lab.vmharness import VERBS_LANE_ENV, nics_env
from railhop_lab.vmlab import GuestJob, VmLab

pytestmark = [pytest.mark.privileged, pytest.mark.vm, pytest.mark.timeout(900)]

ROUNDS = 5
MSGS = 4
SIZE = 256 * 1024
SEED = 2705
ROUND_S = 200.0  # one round's bound under emulation on a loaded host (a round takes seconds)

_runs = itertools.count()


def driver_path() -> Path:
    p = REPO / "build" / "ctest" / "plugin" / "verbs_lifecycle"
    require(p.is_file(), f"{p} not built (make ctest)")
    return p


def _text(p: Path) -> str:
    try:
        return p.read_text(errors="replace")
    except OSError:
        return ""


def _wait_receiver(recv: GuestJob, driver: GuestJob, what: str, logs: list[Path]) -> None:
    """Wait for a round's receiver; the driver ending first (a failed round) ends the wait."""
    deadline = time.monotonic() + ROUND_S
    while not recv.done():
        why = ""
        if driver.done():
            why = "the driver exited while the receiver waited"
        elif time.monotonic() > deadline:
            why = f"the receiver did not finish within {ROUND_S} s"
        if why:
            recv.kill()
            tails = "\n".join(f"--- {p.name}:\n{_text(p)[-3000:]}" for p in logs)
            pytest.fail(f"{what}: {why}\n{tails}")
        time.sleep(0.1)


def test_verbs_lifecycle_leaves_nothing(lab: VmLab, built: None) -> None:
    """ROUNDS rounds of dlopen, init, connect, checked transfer over the verbs lane, close,
    finalize, dlclose in one process: each round clean (no thread, descriptor, QP, CQ, MR or
    PD left), each receiver checked every byte, the driver exits 0."""
    driver, plugin, harness = driver_path(), paths.plugin_path(), paths.harness_path()
    d = lab.shared / f"verbs-lifecycle-{next(_runs)}"
    d.mkdir(parents=True)
    env = {**VERBS_LANE_ENV, "RAILHOP_NICS": nics_env(lab)}
    out, err = d / "driver.out", d / "driver.err"
    argv = [driver, plugin, d, ROUNDS, MSGS, SIZE, SEED]
    (d / "run-driver").mkdir()
    job = lab.guests[0].start(
        [str(a) for a in argv],
        env={**env, "RAILHOP_RUN_DIR": str(d / "run-driver")},
        timeout=ROUNDS * ROUND_S,
        stdout=out,
        stderr=err,
        cwd=str(d),
    )
    try:
        for r in range(ROUNDS):
            rdv = d / f"round-{r}"
            rdv.mkdir()
            (rdv / "run").mkdir()
            cfg = HarnessConfig(
                conns=1, sizes=(SIZE,), count=MSGS, inflight=4, deadline=ROUND_S - 20, seed=SEED
            )
            rout, rerr = rdv / "recv.out", rdv / "recv.err"
            recv = lab.guests[1].start(
                build_argv(harness, plugin, "recv", rdv, cfg),
                env={**env, "RAILHOP_RUN_DIR": str(rdv / "run")},
                timeout=ROUND_S,
                stdout=rout,
                stderr=rerr,
                cwd=str(rdv),
            )
            what = f"round {r}"
            try:
                _wait_receiver(recv, job, what, [out, err, rout, rerr])
            finally:
                if not recv.done():
                    recv.kill()
            res = recv.wait(30)
            _, summary = parse_lines(_text(rout).splitlines())
            detail = f"{what}: receiver {res}\n{_text(rerr)[-3000:]}\ndriver:\n{_text(err)[-3000:]}"
            assert res.ok, detail
            assert summary is not None and summary.data_errors == 0, detail
            assert summary.msgs == MSGS and summary.bytes == MSGS * SIZE, detail
        dres = job.wait(ROUND_S)
    finally:
        if not job.done():
            job.kill()
    lines = _text(out).splitlines()
    detail = f"driver {dres}\n{_text(out)}\n{_text(err)[-4000:]}"
    assert dres.ok, detail
    rounds = [ln for ln in lines if ln.startswith("round ")]
    assert len(rounds) == ROUNDS and all(ln.endswith(" ok") for ln in rounds), detail
