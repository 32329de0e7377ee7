#!/usr/bin/env python3
"""eBPF probes, measured side by side in one run (issue 7): carrier-loss timing and probe cost.

  carrier   carrier loss on the emulated veth fabric, ``remote`` end (spine-side peer down) and
            ``local`` end (the NIC set down), N cycles each, for the raw-tracepoint and the
            tracepoint variant: injection -> eBPF kernel timestamp, -> eBPF event delivered,
            -> netlink event delivered (median / p90 / max) and which arrived first; and
            the raw-tracepoint variant once more with the former delivery (a poll thread).
            Target: eBPF event delivered <= 5 ms after the injection, ahead of netlink.
  usdt      cost of one traced USDT hit (uprobe trap + BPF program): a loop of N req_done probes
            in a small library, thread CPU time per call without and with the plugin's USDT
            program attached (the real plugin_usdt.bpf.c), plus the program's own run time.
  overhead  plugin throughput (harness, 2 nodes x 4 unlimited veths, every byte checked),
            interleaved A (no probes) / B (all agent probes attached: carrier, TCP lanes with the
            harness's lane ports registered, plugin USDT) for R rounds: ratio of medians and the
            spread of the per-round ratios, harness CPU per GB, and each BPF program's runs/s,
            ns per run and CPU share while traffic flows (BPF_ENABLE_STATS).
            Target: B/A >= 0.97.

    sudo RAILHOP_PLUGIN_PATH=$PWD/build/h2/plugin/libnccl-net-railhop.so \\
         RAILHOP_HARNESS_PATH=$PWD/build/h2/plugin/railhop-harness \\
         .venv/bin/python bench/probe_bench.py [--only carrier,usdt,overhead] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _common

_common.setup_import_path()

from railhop import paths  # noqa: E402
from railhop.sources.base import Registry  # noqa: E402
from railhop.sources.bpfstats import ProgStats, RunStats  # noqa: E402
from railhop.sources.ebpf.carrier import CarrierSource  # noqa: E402
from railhop.sources.ebpf.source import EbpfSource  # noqa: E402
from railhop.sources.ebpf.tcp import TcpLaneSource  # noqa: E402
from railhop.sources.events import Event  # noqa: E402
from railhop.sources.netlink import NetlinkSource  # noqa: E402
from railhop.sources.timing import Collector, carrier_cycles, summarize  # noqa: E402
from railhop.sources.usdt import UsdtSource  # noqa: E402
from railhop_lab.fabric import End, Fabric, unique_prefix  # noqa: E402
from railhop_lab.harness import (  # noqa: E402
    HarnessConfig,
    HarnessRun,
    use_source_tree_build,
    wait_for_bytes,
)

MiB = 1 << 20

# ----------------------------------------------------------------------------------------------
# carrier


async def _carrier_variant(
    fab: Fabric, allow: frozenset[str] | None, cycles: int, thread: bool = False
) -> tuple[str, dict[str, Any]]:
    """``thread``: deliver eBPF records from a poll thread (the former delivery: the event then
    crosses into the loop with call_soon_threadsafe) instead of on the loop."""
    loop = asyncio.get_running_loop()
    col = Collector(loop)
    node = fab.netns(0)
    carrier = CarrierSource(ifnames={"nic0"}, allow=allow, netns=node)
    nl = NetlinkSource(ifnames={"nic0"}, netns=node)
    reg = Registry([nl] if thread else [carrier, nl], log_capabilities=False)
    caps = await asyncio.to_thread(carrier.start_sync, col) if thread else []
    caps += await reg.start_all(col)
    mech = next((c.mechanism for c in caps if c.source == carrier.name and c.attached), "")
    mech += f", {carrier.delivery} delivery"
    out: dict[str, Any] = {}
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        if not mech or not all(c.attached for c in caps):
            return "not attached: " + "; ".join(c.line() for c in caps), out
        ends: tuple[End, ...] = ("remote", "local")
        for end in ends:

            def flip(up: bool, end: End = end) -> int:
                t0 = time.monotonic_ns()  # just before the netlink request
                if up:
                    fab.heal(0, 0)
                else:
                    fab.carrier_down(0, 0, end=end)
                return t0

            async def inject(up: bool, flip: Callable[[bool], int] = flip) -> int:
                return await loop.run_in_executor(pool, flip, up)

            cs = await carrier_cycles(
                inject,
                col,
                ebpf=carrier.name,
                netlink=nl.name,
                nic="nic0",
                cycles=cycles,
                dedup_window_ns=carrier.dedup_window_ns,
            )
            out[end] = summarize(cs, carrier.name)
    finally:
        pool.shutdown()
        await reg.stop_all()
        if thread:
            await carrier.stop()
    return mech, out


def bench_carrier(cycles: int) -> dict[str, Any]:
    res: dict[str, Any] = {}
    with Fabric(nodes=1, nics=1, prefix=unique_prefix("rhpc")) as fab:
        variants: list[tuple[str, frozenset[str] | None, bool]] = [
            ("best", None, False),
            ("tracepoint", frozenset({"tp"}), False),
            ("best, poll thread", None, True),
        ]
        for label, allow, thread in variants:
            try:
                mech, out = asyncio.run(_carrier_variant(fab, allow, cycles, thread))
            finally:
                fab.heal_all()
            if not out:
                print(f"[carrier] {label}: {mech}")
                continue
            print(f"[carrier] {mech}, {cycles} cycles per end (ms after the injection)")
            print(f"  {'end':7} {'what':24} {'median':>8} {'p90':>8} {'max':>8}")
            for end, s in out.items():
                for what, d in (
                    ("eBPF kernel timestamp", s.ebpf_kernel),
                    ("eBPF event delivered", s.ebpf_seen),
                    ("netlink event delivered", s.netlink),
                    ("netlink - eBPF delivered", s.lead),
                ):
                    print(f"  {end:7} {what:24} {d.median:8.3f} {d.p90:8.3f} {d.max:8.3f}")
                ok = s.ebpf_seen.median <= 5.0 and s.ebpf_first == s.cycles
                print(
                    f"  {end:7} eBPF arrived first in {s.ebpf_first}/{s.cycles} cycles "
                    f"(target: <= 5 ms and before netlink: {'PASS' if ok else 'MISS'})"
                )
                res.setdefault(mech, {})[end] = {
                    "ebpf_kernel_ms": vars_of(s.ebpf_kernel),
                    "ebpf_delivered_ms": vars_of(s.ebpf_seen),
                    "netlink_delivered_ms": vars_of(s.netlink),
                    "lead_ms": vars_of(s.lead),
                    "ebpf_first": s.ebpf_first,
                    "cycles": s.cycles,
                }
    return res


def vars_of(d: Any) -> dict[str, float]:
    return {"median": d.median, "p90": d.p90, "max": d.max, "n": d.n}


# ----------------------------------------------------------------------------------------------
# usdt: cost of one traced probe hit

USDT_LIB = r"""
#include <stdint.h>
#include <sys/sdt.h>

/* the plugin's req_done(lane, bytes, latency_ns) signature: -4@ 8@ 8@ */
__attribute__((noinline)) void rh_bench_loop(long n)
{
	for (long i = 0; i < n; i++) {
		int lane = (int)(i & 3);
		uint64_t bytes = 4096 + (uint64_t)(i & 7);
		uint64_t lat = 1000 + (uint64_t)i;

		DTRACE_PROBE3(railhop, req_done, lane, bytes, lat);
		__asm__ volatile("" ::: "memory");
	}
}
"""


def build_usdt_lib(tmp: Path) -> Path:
    src, lib = tmp / "rh_usdt_bench.c", tmp / "librh_usdt_bench.so"
    src.write_text(USDT_LIB)
    subprocess.run(["cc", "-O2", "-fPIC", "-shared", "-o", str(lib), str(src)], check=True)
    return lib


def _loop_cpu_ns(fn: Any, n: int) -> float:
    t0 = time.thread_time_ns()  # user + system time of this thread: the uprobe trap included
    fn(n)
    return (time.thread_time_ns() - t0) / n


def bench_usdt(tmp: Path, n: int, reps: int) -> dict[str, Any]:
    lib = build_usdt_lib(tmp)
    fn = ctypes.CDLL(str(lib)).rh_bench_loop
    fn.argtypes = [ctypes.c_long]
    base1 = [_loop_cpu_ns(fn, n) for _ in range(reps)]
    src = UsdtSource(lib)
    caps = src.start_sync(lambda _e: None)
    if not any(c.attached and c.hook == "req_done" for c in caps):
        print("[usdt] req_done not attached: " + "; ".join(c.line() for c in caps))
        src.stop_sync()
        return {}
    try:
        with RunStats():
            before = src.prog_stats()["rh_usdt_req_done"]
            traced = [_loop_cpu_ns(fn, n) for _ in range(reps)]
            prog = src.prog_stats()["rh_usdt_req_done"].minus(before)
        reqs = sum(s.reqs for s in src.lane_stats())
    finally:
        src.stop_sync()
    base2 = [_loop_cpu_ns(fn, n) for _ in range(reps)]
    base = statistics.median(base1 + base2)
    per = statistics.median(traced) - base
    print(
        f"[usdt] {reps} x {n} req_done hits: untraced {base:.1f} ns/call "
        f"(runs {', '.join(f'{x:.1f}' for x in base1 + base2)}), traced "
        f"{statistics.median(traced):.1f} ns/call (runs {', '.join(f'{x:.0f}' for x in traced)})"
    )
    print(
        f"[usdt] one traced hit costs {per:.0f} ns of the calling thread's CPU: BPF program "
        f"{prog.ns_per_run:.0f} ns (BPF_ENABLE_STATS, {prog.run_cnt} runs), uprobe trap and "
        f"return {per - prog.ns_per_run:.0f} ns; in-kernel totals {reqs} requests "
        f"(expected {reps * n}: {'ok' if reqs == reps * n else 'MISMATCH'})"
    )
    return {
        "untraced_ns": base,
        "traced_ns": statistics.median(traced),
        "per_hit_ns": per,
        "bpf_ns": prog.ns_per_run,
        "reqs": reqs,
        "expected": reps * n,
    }


# ----------------------------------------------------------------------------------------------
# overhead: interleaved A/B throughput with every probe attached


class Probes:
    """The agent's probes, loaded in this process, delivering on a loop in a thread."""

    def __init__(self, fab: Fabric, plugin: Path) -> None:
        names = {f"nic{i}" for i in range(fab.nics)}
        self.carrier = CarrierSource(ifnames=names)
        self.tcp = TcpLaneSource()
        self.usdt = UsdtSource(plugin)
        self.sources: list[EbpfSource] = [self.carrier, self.tcp, self.usdt]
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.events: list[Event] = []
        self.caps: list[str] = []

    def start(self) -> bool:
        self._thread.start()
        for s in self.sources:
            s.bind_loop(self.loop)
            caps = s.start_sync(self.events.append)
            self.caps += [c.line() for c in caps]
        return all(any(c.attached for c in s.capabilities) for s in self.sources)

    def stats(self) -> dict[str, ProgStats]:
        return {f"{s.name}:{k}": v for s in self.sources for k, v in s.prog_stats().items()}

    def req_done(self) -> int:
        return sum(x.reqs for x in self.usdt.lane_stats())

    def register_ports(self, pids: Sequence[int]) -> int:
        """Local ports of the harness processes' established TCP sockets (their netns)."""
        ports: set[int] = set()
        for pid in pids:
            try:
                lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
            except OSError:
                continue
            for ln in lines:
                f = ln.split()
                if len(f) > 3 and f[3] == "01":  # ESTABLISHED
                    ports.add(int(f[1].rsplit(":", 1)[1], 16))
        for p in ports:
            self.tcp.add_port(p)
        return len(ports)

    def stop(self) -> None:
        for s in self.sources:
            s.stop_sync()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def one_run(
    fab: Fabric, size: int, seconds: float, probes: Probes | None
) -> tuple[float, float, int, bool]:
    """(Gbit/s, harness CPU s, bytes, ok) of one harness pair on 4 connections."""
    cfg = HarnessConfig(conns=4, sizes=(size,), duration=seconds, deadline=60)
    cpu0 = _children_cpu()
    with HarnessRun(fab, cfg) as run:
        if probes is not None:
            wait_for_bytes(run, 4 * size, timeout=30)
            probes.register_ports([s.proc.pid for s in run.sides.values()])
        res = run.wait()
    s = res.recv.summary
    cpu = _children_cpu() - cpu0
    return (s.gbps if s else 0.0), cpu, (s.bytes if s else 0), res.ok


def bench_overhead(
    rounds: int, seconds: float, sizes: Sequence[int], trap_ns: float | None
) -> dict[str, Any]:
    """``trap_ns``: the uprobe trap cost per req_done hit measured by ``usdt`` (None: unknown)."""
    plugin = paths.plugin_path()
    a: dict[int, list[tuple[float, float, int]]] = {sz: [] for sz in sizes}
    b: dict[int, list[tuple[float, float, int]]] = {sz: [] for sz in sizes}
    progs: dict[str, list[ProgStats]] = {}
    reqs = 0
    b_wall = 0.0
    b_cpu = 0.0
    ok = True
    caps: list[str] = []
    with Fabric(nodes=2, nics=4, rate_mbit=None, prefix=unique_prefix("rhpo")) as fab:
        for r in range(rounds):
            for sz in sizes:
                g, cpu, nbytes, k = one_run(fab, sz, seconds, None)
                a[sz].append((g, cpu, nbytes))
                ok &= k
            probes = Probes(fab, plugin)
            t_start = time.monotonic()
            attached = probes.start()
            caps = probes.caps
            print(f"  round {r + 1}: probes loaded in {time.monotonic() - t_start:.1f} s")
            if not attached:
                print("[overhead] probes did not attach:\n  " + "\n  ".join(caps))
                probes.stop()
                return {}
            try:
                with RunStats():
                    for sz in sizes:
                        s0, q0, t0 = probes.stats(), probes.req_done(), time.monotonic()
                        g, cpu, nbytes, k = one_run(fab, sz, seconds, probes)
                        s1, q1 = probes.stats(), probes.req_done()
                        b_wall += time.monotonic() - t0
                        b[sz].append((g, cpu, nbytes))
                        b_cpu += cpu
                        ok &= k
                        reqs += q1 - q0
                        for name, st in s1.items():
                            if name in s0:
                                progs.setdefault(name, []).append(st.minus(s0[name]))
            finally:
                probes.stop()
    print("[overhead] capability report of the B runs:")
    for c in caps:
        print(f"    {c}")
    out: dict[str, Any] = {"sizes": {}}
    for sz in sizes:
        ga, gb = [x[0] for x in a[sz]], [x[0] for x in b[sz]]
        ra = statistics.median(gb) / statistics.median(ga) if statistics.median(ga) else 0.0
        pair = [y / x for x, y in zip(ga, gb, strict=True) if x]
        ca = [x[1] / (x[2] / 1e9) for x in a[sz] if x[2]]  # harness CPU s per GB
        cb = [x[1] / (x[2] / 1e9) for x in b[sz] if x[2]]
        cr = statistics.median(cb) / statistics.median(ca) if ca and cb else 0.0
        print(
            f"[overhead] {sz // 1024} KiB messages, {rounds} rounds ABAB, {seconds:g} s each:\n"
            f"    A no probes   Gbit/s {', '.join(f'{x:.2f}' for x in ga)}\n"
            f"    B all probes  Gbit/s {', '.join(f'{x:.2f}' for x in gb)}\n"
            f"    B/A ratio of medians {ra:.3f} (target >= 0.97: "
            f"{'PASS' if ra >= 0.97 else 'MISS'}); per-round B/A "
            f"{', '.join(f'{x:.2f}' for x in pair)} (min {min(pair):.2f} max {max(pair):.2f})\n"
            f"    harness CPU per GB: A {', '.join(f'{x:.3f}' for x in ca)} s, "
            f"B {', '.join(f'{x:.3f}' for x in cb)} s: ratio of medians {cr:.3f}"
        )
        out["sizes"][sz] = {
            "a_gbps": ga,
            "b_gbps": gb,
            "ratio_of_medians": ra,
            "per_round": pair,
            "a_cpu_s_per_gb": ca,
            "b_cpu_s_per_gb": cb,
            "cpu_ratio": cr,
        }
    total_ns = 0
    print(f"[overhead] BPF programs during the B runs ({b_wall:.1f} s of traffic):")
    print(f"    {'program':52} {'runs/s':>10} {'ns/run':>8} {'CPU %':>8}")
    for name, sts in sorted(progs.items()):
        rt, cnt = sum(s.run_time_ns for s in sts), sum(s.run_cnt for s in sts)
        total_ns += rt
        per = rt / cnt if cnt else 0.0
        print(f"    {name:52} {cnt / b_wall:10.1f} {per:8.0f} {rt / b_wall / 1e7:8.4f}")
    print(
        f"    all programs: {total_ns / b_wall / 1e7:.4f} % of one core; req_done hits "
        f"{reqs / b_wall:.0f}/s (each also pays the uprobe trap: see [usdt])"
    )
    probe_s = total_ns / 1e9 + (reqs * trap_ns / 1e9 if trap_ns is not None else 0.0)
    share = probe_s / b_cpu if b_cpu else 0.0
    print(
        f"    probe CPU (BPF run time{' + uprobe traps' if trap_ns is not None else ''}) "
        f"{probe_s * 1e3:.1f} ms over {b_wall:.1f} s = {probe_s / b_wall * 100:.3f} % of one "
        f"core, {share * 100:.3f} % of the harness's own CPU ({b_cpu:.1f} s): a CPU-bound run "
        f"keeps >= {1 - share:.4f}x of its throughput"
    )
    out.update(
        {
            "programs": {
                k: {"runs": sum(s.run_cnt for s in v), "ns": sum(s.run_time_ns for s in v)}
                for k, v in progs.items()
            },
            "b_wall_s": b_wall,
            "req_done_per_s": reqs / b_wall if b_wall else 0.0,
            "bpf_cpu_share": total_ns / b_wall / 1e9 if b_wall else 0.0,
            "probe_cpu_s": probe_s,
            "harness_cpu_s": b_cpu,
            "probe_share_of_harness_cpu": share,
            "ok": ok,
        }
    )
    if not ok:
        print("[overhead] a harness run reported data or request errors")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", default="carrier,usdt,overhead")
    ap.add_argument("--cycles", type=int, default=30, help="carrier cycles per end and variant")
    ap.add_argument("--usdt-calls", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=4, help="A/B rounds of the throughput runs")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of one throughput run")
    ap.add_argument("--sizes", default="4194304,65536", help="message sizes of the A/B runs")
    ap.add_argument("--json")
    args = ap.parse_args()
    which = set(args.only.split(","))
    _common.need_root("bench/probe_bench.py")
    use_source_tree_build()
    print(f"railhop probe bench | {_common.stamp()} | {_common.machine()}")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rh-probe-bench-") as tmp:
        if "carrier" in which:
            out["carrier"] = bench_carrier(args.cycles)
        if "usdt" in which:
            out["usdt"] = bench_usdt(Path(tmp), args.usdt_calls, 5)
        if "overhead" in which:
            try:
                print(f"  plugin {paths.plugin_path()}")
            except paths.NotInstalledError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            sizes = [int(x) for x in args.sizes.split(",") if x]
            trap = out.get("usdt", {}).get("per_hit_ns")
            bpf = out.get("usdt", {}).get("bpf_ns")
            trap_ns = trap - bpf if trap is not None and bpf is not None else None
            out["overhead"] = bench_overhead(args.rounds, args.seconds, sizes, trap_ns)
    _common.write_json(args.json, {"bench": "probe", "date": _common.stamp(), "results": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
