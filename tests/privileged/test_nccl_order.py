"""The plugin driven in NCCL's call order, on sanitizer builds (root; every byte checked).

NCCL's net transport and proxy thread use a plugin in an order the other
suites do not: the receiver's proxy closes a listen comm as soon as its accept returned a comm
(``recvProxyConnect``), while the peer still opens the connection's other lanes (standby lanes,
on by default, say hello on that listener's NIC); one proxy thread polls connect/accept and
``test()``; every buffer is registered on its own; at destroy ``deregMr``, then
``closeSend``/``closeRecv``, then ``finalize`` (v11+); and torch never destroys its process
group: the process exits with every comm open and the plugin's threads running.

The harness's ``--order nccl`` (and ``--exit-open``) do exactly that (plugin/tools/harness.c).
Each case runs 16 comms over 2 NICs with the default standby lanes, each comm shared by two
channels (their own buffers and tags, interleaved), on an ASan and a
TSan build of the plugin and the harness: without a fault (closing as NCCL does, and exiting
with everything open), through a carrier loss at the switch side of a NIC, and through a silent
blackhole. Both processes must exit 0 with every byte checked and no sanitizer report.
Before the listener fix (b5f445f) the ASan build reports a heap-use-after-free in
``listen_rec`` on every run: a standby lane's hello read the freed listen comm.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import fabric_fixture, require_built
from railhop_lab.fabric import Fabric
from railhop_lab.harness import HarnessConfig, HarnessResult, HarnessRun, bytes_at, wait_for_bytes
from sanbuild import SANITIZER_ENV, sanitizer_build, sanitizer_reports

pytestmark = pytest.mark.privileged

KiB, MiB = 1 << 10, 1 << 20
COMMS = 16
SHARE = 2  # two channels per comm (NCCL's shared comms), told apart by tag
CONNS = COMMS * SHARE
NICS = 2
SIZES = (256 * KiB, 4 * KiB, 0, 64 * KiB + 1)
COUNT = 32
FAULT_COUNT = 320  # about 830 MB: 8 s on both NICs at 400 Mbit/s, longer on one
FAULT_NIC = 1  # comm k (connections 2k, 2k + 1) starts on NIC k % 2: half are on the faulted NIC

fab = fabric_fixture("rhno", nics=NICS, rate_mbit=400, plugin=False)  # sanitizer builds


@pytest.fixture(scope="module", params=["address", "thread"])
def build(request: pytest.FixtureRequest) -> Iterator[tuple[str, Path, Path]]:
    kind = str(request.param)
    plugin, harness = sanitizer_build(kind)
    yield kind, plugin, harness


def run_case(
    fab: Fabric,
    build: tuple[str, Path, Path],
    tmp_path: Path,
    *,
    fault: str | None = None,
    exit_open: bool = False,
    seed: int,
) -> tuple[HarnessResult, float]:
    kind, plugin, harness = build
    t_fault = 0.0
    if fault is None:
        cfg = HarnessConfig(
            conns=CONNS, sizes=SIZES, count=COUNT, inflight=8, deadline=90, seed=seed, api=12,
            order="nccl", exit_open=exit_open, share=SHARE,
        )  # fmt: skip
    else:
        # a count, not a duration: long enough to outlast the fault's detection and move
        cfg = HarnessConfig(
            conns=CONNS, sizes=SIZES, count=FAULT_COUNT, inflight=8, deadline=90, seed=seed,
            api=12, order="nccl", share=SHARE,
        )  # fmt: skip
    env = {"RAILHOP_TRANSPORT": "tcp", **SANITIZER_ENV[kind]}
    if kind == "thread":
        # TSan slows every thread 5-15x: on two busy cores a healthy lane can then miss the 1 s
        # completion timeout and its probe, and with both NICs taken for failed the run ends in
        # a (correct) ncclRemoteError. The race checks need the paths, not the default timing.
        env |= {"RAILHOP_COMPLETION_TIMEOUT": "3000", "RAILHOP_PROBE_TIMEOUT": "1000"}
    with HarnessRun(
        fab, cfg, env=env, workdir=tmp_path, harness=harness, plugin=plugin, grace_s=30
    ) as run:
        if fault is not None:
            wait_for_bytes(run, 8 * MiB, timeout=60)
            t_fault = time.monotonic() - run.started_at
            if fault == "carrier":
                fab.carrier_down(0, FAULT_NIC, end="remote")  # the cable pulled at the switch
            else:
                fab.blackhole(0, FAULT_NIC)
        res = run.wait()
    where = f"{kind} build, {fault or ('exit-open' if exit_open else 'close')}"
    for role in ("send", "recv"):
        reports = sanitizer_reports((tmp_path / f"{role}.stderr").read_text(errors="replace"))
        assert not reports, f"{where}: {role} sanitizer report: {reports[:3]}\n{res.describe()}"
    for side in (res.send, res.recv):
        assert side.returncode == 0, f"{where}: {res.describe()}"
        assert side.clean_success, f"{where}: {res.describe()}"
    s, r = res.send.summary, res.recv.summary
    assert s is not None and r is not None
    assert s.msgs == r.msgs > 0 and s.bytes == r.bytes, f"{where}: {res.describe()}"
    assert r.msgs == CONNS * (COUNT if fault is None else FAULT_COUNT), f"{where}: {res.describe()}"
    return res, t_fault


def test_nccl_order_closes_cleanly(
    fab: Fabric, build: tuple[str, Path, Path], tmp_path: Path
) -> None:
    run_case(fab, build, tmp_path, seed=21)


def test_nccl_order_exit_with_everything_open(
    fab: Fabric, build: tuple[str, Path, Path], tmp_path: Path
) -> None:
    run_case(fab, build, tmp_path, exit_open=True, seed=22)


@pytest.mark.parametrize("fault", ["carrier", "blackhole"])
def test_nccl_order_through_a_fault(
    fab: Fabric, build: tuple[str, Path, Path], tmp_path: Path, fault: str
) -> None:
    res, t_fault = run_case(
        fab, build, tmp_path, fault=fault, seed=23 if fault == "carrier" else 24
    )
    # the connections that started on the faulted NIC moved data after the fault
    prog = res.recv.progress
    on_nic = [c for c in range(CONNS) if (c // SHARE) % NICS == FAULT_NIC]
    after = [prog[-1].per_conn[c] - bytes_at(prog, t_fault, c) for c in on_nic]
    assert min(after) > 0, f"{fault} at t={t_fault:.2f} s: bytes after it {after}"


def test_the_byte_checker_reports_a_mismatched_pattern(fab: Fabric, tmp_path: Path) -> None:
    """Every end-to-end test trusts the harness's byte checker: with the receiver checking
    against another pattern seed, every non-empty message must count as a data error and the
    receiver must exit 1 (the sender, which checks nothing, exits 0)."""
    cfg = HarnessConfig(
        conns=4, sizes=(64 * KiB, 4 * KiB + 3), count=8, inflight=4, deadline=60, seed=31,
        recv_seed=32,
    )  # fmt: skip
    require_built()
    with HarnessRun(fab, cfg, env={"RAILHOP_TRANSPORT": "tcp"}, workdir=tmp_path) as run:
        res = run.wait()
    r = res.recv.summary
    assert r is not None, res.describe()
    assert res.send.returncode == 0, res.describe()
    assert res.recv.returncode == 1, res.describe()
    assert r.msgs == 4 * 8 and r.data_errors == r.msgs, res.describe()
