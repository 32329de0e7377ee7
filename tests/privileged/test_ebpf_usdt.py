"""The USDT consumer attaches by library path and sees probes fired by other processes.

The plugin's own probes are used when a built plugin is found (``RAILHOP_PLUGIN_PATH`` or the
``make ctest`` build) and has ``railhop`` notes; otherwise (and always, so the consumer is
covered) a stand-in library with the same probe names and argument lists is compiled here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import require
from railhop.sources.bpfstats import RunStats
from railhop.sources.events import Event, PluginLaneEvent
from railhop.sources.usdt import LANE_PROBES, UsdtSource, stapsdt_notes

pytestmark = pytest.mark.privileged

FAKE_C = r"""
#include <sys/sdt.h>
#include <stdint.h>
void rh_lane_up(int lane, int nic) { DTRACE_PROBE2(railhop, lane_up, lane, nic); }
void rh_lane_down(int lane, int nic, int err) { DTRACE_PROBE3(railhop, lane_down, lane, nic, err); }
void rh_failover_start(int conn, int lane) { DTRACE_PROBE2(railhop, failover_start, conn, lane); }
void rh_failover_end(int conn, int lane, int64_t ns)
{ DTRACE_PROBE3(railhop, failover_end, conn, lane, ns); }
void rh_failback(int conn, int lane) { DTRACE_PROBE2(railhop, failback, conn, lane); }
void rh_fair_share(int conn, int epoch, int64_t ns, uint64_t rate)
{ DTRACE_PROBE4(railhop, fair_share, conn, epoch, ns, rate); }
void rh_standby_promoted(int conn, int lane, int lnic, int rnic)
{ DTRACE_PROBE4(railhop, standby_promoted, conn, lane, lnic, rnic); }
void rh_req_done(int lane, uint64_t bytes, uint64_t lat)
{ DTRACE_PROBE3(railhop, req_done, lane, bytes, lat); }
"""

# a second process maps the library and fires the probes: what a NCCL rank would do
DRIVER = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.rh_req_done.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
lib.rh_failover_end.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64]
lib.rh_fair_share.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_uint64]
lib.rh_lane_up(1, 2)
lib.rh_lane_down(1, 2, -110)
lib.rh_failover_start(7, 1)
lib.rh_failover_end(7, 3, 123456789)
lib.rh_failback(7, 1)
lib.rh_fair_share(7, 3, 234567890, 1000000)
lib.rh_standby_promoted(7, 4, 2, 3)
for k in range(1000):
    lib.rh_req_done(k % 4, 4096 + k, 1000 * (k % 50 + 1))
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(shutil.which("gcc") is not None, "needs gcc")
    require(
        Path("/usr/include/x86_64-linux-gnu/sys/sdt.h").exists()
        or Path("/usr/include/sys/sdt.h").exists(),
        "needs sys/sdt.h (systemtap-sdt-dev)",
    )
    d = tmp_path_factory.mktemp("usdt")
    (d / "fake.c").write_text(FAKE_C)
    lib = d / "librailhop-fake.so"
    subprocess.run(
        ["gcc", "-O2", "-fPIC", "-shared", "-o", str(lib), str(d / "fake.c")], check=True
    )
    return lib


def _wait(pred: object, deadline_s: float) -> bool:
    assert callable(pred)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return bool(pred())


def test_usdt_lane_events_and_completion_totals(fake_lib: Path) -> None:
    events: list[Event] = []
    src = UsdtSource(fake_lib)
    caps = src.start_sync(events.append)
    try:
        assert all(c.attached for c in caps), [c.line() for c in caps]
        assert {c.hook for c in caps} == {*LANE_PROBES, "req_done"}
        with RunStats():  # the kernel counts each program's runs and run time meanwhile
            before = src.prog_stats()
            out = subprocess.run(
                [sys.executable, "-c", DRIVER, str(fake_lib)],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            runs = {k: v.minus(before[k]) for k, v in src.prog_stats().items()}
        # only the driver maps this library: one program run per probe hit, each timed
        assert {k: v.run_cnt for k, v in runs.items()} == {
            **{f"rh_usdt_{p}": 1 for p in LANE_PROBES},
            "rh_usdt_req_done": 1000,
        }
        assert all(v.run_time_ns > 0 for v in runs.values()), runs
        assert out.stdout.strip() == "done"
        assert _wait(lambda: len(events) >= 7, 5.0), events
        lane = [e for e in events if isinstance(e, PluginLaneEvent)]
        got = [(e.probe, e.args) for e in lane]
        assert got == [
            ("lane_up", (1, 2, 0, 0)),
            ("lane_down", (1, 2, -110, 0)),
            ("failover_start", (7, 1, 0, 0)),
            ("failover_end", (7, 3, 123456789, 0)),
            ("failback", (7, 1, 0, 0)),
            ("fair_share", (7, 3, 234567890, 1000000)),
            ("standby_promoted", (7, 4, 2, 3)),
        ]
        assert len({e.pid for e in lane}) == 1 and lane[0].pid != os.getpid()
        ts = [e.ts_ns for e in lane]
        assert ts == sorted(ts)
        stats = src.lane_stats()
        assert [s.lane for s in stats] == [0, 1, 2, 3]
        for s in stats:
            ks = [k for k in range(1000) if k % 4 == s.lane]
            assert s.reqs == len(ks)
            assert s.bytes == sum(4096 + k for k in ks)
            assert s.lat_sum_ns == sum(1000 * (k % 50 + 1) for k in ks)
            assert sum(s.lat_log2) == s.reqs
            for k in ks:
                lat = 1000 * (k % 50 + 1)
                assert s.lat_log2[lat.bit_length() - 1] > 0
    finally:
        src.stop_sync()


def _built(env: str, rel: str) -> Path | None:
    for c in (os.environ.get(env, ""), rel):
        if c and Path(c).is_file():
            return Path(c).resolve()
    return None


def test_usdt_completion_bytes_match_the_harness(tmp_path: Path) -> None:
    """The plugin's req_done probes, summed in the kernel per process, add up to the bytes the
    harness reports it moved (both sides), and every connection reported lane_up."""
    lib = _built("RAILHOP_PLUGIN_PATH", "build/ctest/plugin/libnccl-net-railhop.so")
    harness = _built("RAILHOP_HARNESS_PATH", "build/ctest/plugin/railhop-harness")
    require(
        lib is not None and harness is not None,
        "no built plugin/harness (set RAILHOP_PLUGIN_PATH/RAILHOP_HARNESS_PATH or make ctest)",
    )
    assert lib is not None and harness is not None
    names = {n.name for n in stapsdt_notes(lib.read_bytes()) if n.provider == "railhop"}
    # the plugin has its probes when built with sys/sdt.h (systemtap-sdt-dev, make setup)
    require("req_done" in names, f"{lib} has no railhop:req_done probe (built without sys/sdt.h)")
    events: list[Event] = []
    src = UsdtSource(lib)
    caps = src.start_sync(events.append)
    try:
        assert {c.hook for c in caps if c.attached} == names & {*LANE_PROBES, "req_done"}, [
            c.line() for c in caps
        ]
        common = ["--plugin", str(lib), "--rendezvous", str(tmp_path), "--count", "40"]
        common += ["--sizes", "1048576,0,4096,65536", "--conns", "2", "--deadline", "60"]
        env = dict(os.environ, RAILHOP_NICS="lo")
        recv = subprocess.Popen(
            [str(harness), "--role", "recv", *common], stdout=subprocess.PIPE, env=env, text=True
        )
        send = subprocess.Popen(
            [str(harness), "--role", "send", *common], stdout=subprocess.PIPE, env=env, text=True
        )
        out_s, _ = send.communicate(timeout=90)
        out_r, _ = recv.communicate(timeout=90)
        assert (send.returncode, recv.returncode) == (0, 0), (out_s[-500:], out_r[-500:])
        summary = {}
        for pid, out in ((send.pid, out_s), (recv.pid, out_r)):
            lines = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
            summary[pid] = next(x for x in lines if x.get("type") == "summary")
        stats = src.lane_stats()
        for pid, summ in summary.items():
            mine = [s for s in stats if s.pid == pid]
            assert (
                sum(s.reqs for s in mine) == summ["msgs"] * 2
                or sum(s.reqs for s in mine) == summ["msgs"]
            ), (pid, mine, summ)
            assert sum(s.bytes for s in mine) == summ["bytes"], (pid, mine, summ)
            assert all(sum(s.lat_log2) == s.reqs for s in mine)
        if "lane_up" in names:
            assert _wait(
                lambda: {e.pid for e in events if isinstance(e, PluginLaneEvent)} >= set(summary),
                5.0,
            ), events
    finally:
        src.stop_sync()


def test_usdt_missing_library_is_reported(tmp_path: Path) -> None:
    src = UsdtSource(tmp_path / "nope.so")
    caps = src.start_sync(lambda _e: None)
    assert len(caps) == 1 and not caps[0].attached
    assert caps[0].reason.value == "no library"
