#!/usr/bin/env python3
"""GPU all-reduce through the railhop plugin vs NCCL's Socket transport, on the emulated fabric.

For a host with 2 GPUs (torch with NCCL built in), run as root:

    python3 bench/gpu_allreduce.py --plugin /abs/path/libnccl-net-railhop.so
    python3 bench/gpu_allreduce.py --plugin PATH --fault blackhole     # fault mid-run
    python3 bench/gpu_allreduce.py --plugin PATH --quick
    python3 bench/gpu_allreduce.py --plugin PATH --ranks 4 --gpus 0 --transports railhop

--ranks N runs N ranks on an N-node fabric (rank r in node r; ranks may share one GPU, --gpus
lists the GPU of rank r as --gpus[r % len]). --no-destroy ends every rank as a torch script that
never destroys its process group does (the interpreter exits with every communicator open).
Every rank's exit status is reported; --sanitizer-check scans each rank's log for AddressSanitizer
/ ThreadSanitizer reports (a plugin built with a sanitizer, its runtime in --env LD_PRELOAD).

It builds the two-node, four-NIC fabric (railhop_lab.fabric; pyroute2 only, no `ip`/`tc`), then runs
torch.distributed all-reduce with 2 ranks, one per network namespace (rank r on GPU r), forcing
the NET transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0, a distinct
NCCL_HOSTID per rank). Bootstrap and the torch store go over the fabric (node 0's nic0).

Fair comparison, same fabric, same run:
  railhop: NCCL_NET_PLUGIN=<plugin> NCCL_NET=railhop; the plugin uses nic0..nic3 (one ncclNet
           device per NIC); NCCL_SOCKET_IFNAME=nic0 only for bootstrap.
  Socket:  NCCL_NET=Socket NCCL_NET_PLUGIN=none NCCL_SOCKET_IFNAME=nic (a prefix: Socket makes one
           device per matching interface, so the same nic0..nic3), NCCL_SOCKET_NTHREADS x
           NCCL_NSOCKS_PERTHREAD (default 4 x 4, the tuning NCCL's docs suggest).
Every reduced value is checked on the GPU (expected = sum of the ranks' inputs, exact in fp32).
Prints busbw per size and the railhop/Socket ratio; which NICs carried bytes is read from the
fabric's counters. --fault injects a NIC fault (node 1's nic1; carrier-remote: its spine-side
peer loses carrier, the cable pulled at the switch) mid-run with railhop and reports
busbw before/during/after and the step-time spikes. Every wait is bounded; every child process
is killed at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common
import _gpu
from _gpu import MiB, parse_size

# ---------------------------------------------------------------------------------------------
# Worker (one rank, inside a node's netns). Prints JSON lines on stdout.


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def worker(cfg: dict[str, Any]) -> int:
    import torch
    import torch.distributed as dist

    rank = int(cfg["rank"])
    torch.cuda.set_device(0)  # CUDA_VISIBLE_DEVICES selects this rank's GPU
    t_init = time.time()
    _gpu.init_process_group(cfg)
    _emit({"type": "init", "rank": rank, "s": time.time() - t_init, "nccl": _nccl_version()})

    def buffers(size: int) -> tuple[Any, Any, Any]:
        n = max(1, size // 4)
        base = (torch.arange(n, device="cuda", dtype=torch.int32) % 1021).float()
        world = int(cfg.get("world", 2))  # rank r adds (r + 1) x base: the sum is base x w(w+1)/2
        exp = base * (world * (world + 1) // 2)
        return base * (rank + 1), exp, torch.empty(n, device="cuda", dtype=torch.float32)

    bad = torch.zeros((), dtype=torch.int64, device="cuda")

    def step(src: Any, exp: Any, buf: Any) -> None:
        buf.copy_(src)
        dist.all_reduce(buf)
        bad.add_((buf != exp).sum())

    # warm up the communicator (connections) with a small all-reduce
    s, e, b = buffers(MiB)
    step(s, e, b)
    torch.cuda.synchronize()

    if cfg["mode"] == "sweep":
        for size in cfg["sizes"]:
            src, exp, buf = buffers(size)
            for _ in range(cfg["warmup"]):
                step(src, exp, buf)
            torch.cuda.synchronize()
            ev0 = torch.cuda.Event(enable_timing=True)
            ev1 = torch.cuda.Event(enable_timing=True)
            t0 = time.time()
            ev0.record()
            for _ in range(cfg["iters"]):
                step(src, exp, buf)
            ev1.record()
            torch.cuda.synchronize()
            dt = ev0.elapsed_time(ev1) / 1e3 / cfg["iters"]
            _emit(
                {
                    "type": "result",
                    "size": size,
                    "time_s": dt,
                    "bad": int(bad.item()),
                    "wall": time.time() - t0,
                }
            )
            del src, exp, buf
    else:  # fault timeline: per-step times, the parent injects faults by wall clock
        src, exp, buf = buffers(cfg["fault_size"])
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            step(src, exp, buf)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        nsteps = torch.tensor(
            [math.ceil(cfg["fault_total_s"] / statistics.median(times))],
            device="cuda",
            dtype=torch.int64,
        )
        dist.all_reduce(nsteps, op=dist.ReduceOp.MAX)  # both ranks run the same count
        total = int(min(nsteps.item(), 100000))
        _emit({"type": "plan", "steps": total})
        for i in range(total):
            t0 = time.perf_counter()
            step(src, exp, buf)
            torch.cuda.synchronize()
            _emit(
                {
                    "type": "step",
                    "i": i,
                    "t": time.time(),
                    "dt": time.perf_counter() - t0,
                    "bad": int(bad.item()) if i % 20 == 0 else None,
                }
            )
        _emit({"type": "result", "size": cfg["fault_size"], "bad": int(bad.item())})
    if cfg.get("destroy", True):
        dist.destroy_process_group()
    _emit({"type": "done", "bad": int(bad.item())})
    return 0  # without destroy: the interpreter exits with the communicator open (torch's way)


def _nccl_version() -> str:
    try:
        import torch

        v = torch.cuda.nccl.version()
        return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:
        return "?"


# ---------------------------------------------------------------------------------------------
# Parent


def transport_env(args: argparse.Namespace, transport: str, rundir: Path) -> list[dict[str, str]]:
    return _gpu.rank_envs(
        args,
        transport,
        rundir,
        hostid="railhop-bench-node",
        common={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"},
        socket_threads=args.socket_threads,
        socket_nsocks=args.socket_nsocks,
        nranks=args.ranks,
    )


def start_ranks(
    args: argparse.Namespace, fab: Any, transport: str, cfg: dict[str, Any], tmp: Path, name: str
) -> _gpu.Ranks:
    envs = transport_env(args, transport, tmp)
    return _gpu.Ranks(fab, Path(__file__).resolve(), envs, cfg, tmp, name)


SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "WARNING: ThreadSanitizer", "ERROR: LeakSanitizer")


def sanitizer_reports(ranks: _gpu.Ranks) -> list[str]:
    """The sanitizer report lines of every rank's log (rank-prefixed)."""
    out = []
    for r, log in enumerate(ranks.logs):
        try:
            text = log.read_text(errors="replace")
        except OSError:
            continue
        out += [
            f"rank{r}: {ln.strip()}"
            for ln in text.splitlines()
            if any(m in ln for m in SANITIZER_MARKERS)
        ]
    return out


def busbw_factor(n: int) -> float:
    """All-reduce bus bandwidth over algorithm bandwidth for n ranks (1 for 2 ranks)."""
    return 2 * (n - 1) / n


def all_tails(ranks: _gpu.Ranks) -> str:
    return "\n".join(f"--- rank{r} ---\n{ranks.tail(r)}" for r in range(len(ranks.procs)))


def nic_delta(before: dict[Any, Any], after: dict[Any, Any]) -> list[int]:
    return [after[(0, i)].tx_bytes - before[(0, i)].tx_bytes for i in range(4)]


def run_sweep(
    args: argparse.Namespace, fab: Any, transport: str, port: int, tmp: Path, *, sizes: list[int]
) -> dict[str, Any]:
    cfg = {
        "mode": "sweep",
        "sizes": sizes,
        "iters": args.iters,
        "warmup": args.warmup,
        "master": fab.address(0, 0),
        "port": port,
        "pg_timeout": args.timeout,
        "world": args.ranks,
        "destroy": not args.no_destroy,
    }
    before = fab.counters()
    t0 = time.monotonic()
    ranks = start_ranks(args, fab, transport, cfg, tmp, transport)
    finished = ranks.finish(args.timeout)
    after = fab.counters()
    res = {r["size"]: r for r in ranks.of("result", 0)}
    nr = len(ranks.procs)
    bad = max((x.get("bad", 0) for rr in range(nr) for x in ranks.of("result", rr)), default=0)
    rcs = [p.returncode for p in ranks.procs]
    san = sanitizer_reports(ranks)
    out = {
        "transport": transport,
        "finished": finished,
        "returncodes": rcs,
        "results": res,
        "bad": bad,
        "nic_tx_bytes": nic_delta(before, after),
        "wall_s": time.monotonic() - t0,
        "nccl": next((x.get("nccl") for x in ranks.of("init", 0)), "?"),
        "ranks": nr,
        "destroy": cfg["destroy"],
        "sanitizer_reports": san[:20],
    }
    if not finished or any(rc != 0 for rc in rcs) or len(res) < len(sizes) or san:
        out["error"] = (
            f"{transport}: finished={finished} rc={rcs} results={len(res)}/"
            f"{len(sizes)} sanitizer reports={len(san)}\n{all_tails(ranks)}"
        )
    return out


def run_fault(
    args: argparse.Namespace, fab: Any, transport: str, port: int, tmp: Path
) -> dict[str, Any]:
    total = args.fault_total
    fault_at, heal_at = total * 0.3, total * 0.6
    cfg = {
        "mode": "fault",
        "fault_size": args.fault_size,
        "fault_total_s": total,
        "master": fab.address(0, 0),
        "port": port,
        "pg_timeout": args.timeout,
        "world": args.ranks,
        "destroy": not args.no_destroy,
    }
    ranks = start_ranks(args, fab, transport, cfg, tmp, f"{transport}-fault")
    deadline = time.monotonic() + args.timeout
    t_first = None
    t_fault = t_heal = None
    hung = False
    try:
        while time.monotonic() < deadline and any(p.poll() is None for p in ranks.procs):
            steps = ranks.of("step", 0)
            if steps and t_first is None:
                t_first = steps[0]["t"]
            now = time.time()
            if t_first is not None and t_fault is None and now - t_first >= fault_at:
                t_fault = time.time()
                inject(fab, args.fault)
                print(f"  [{transport}] fault injected: {args.fault} on node 1 nic1", flush=True)
            if t_fault is not None and t_heal is None and now - t_first >= heal_at:  # type: ignore[operator]
                t_heal = time.time()
                fab.heal_all()
                print(f"  [{transport}] healed")
            last = steps[-1]["_recv"] if steps else None
            if t_fault is not None and last is not None and now - max(last, t_fault) > args.hang_s:
                hung = True
                print(f"  [{transport}] no step completed for {args.hang_s:.0f} s: hung, killing")
                break
            time.sleep(0.05)
    finally:
        fab.heal_all()
        finished = ranks.finish(0.0 if hung else max(1.0, deadline - time.monotonic()))
    steps = ranks.of("step", 0)
    nr = len(ranks.procs)
    bad = max((x.get("bad") or 0 for rr in range(nr) for x in ranks.lines[rr]), default=0)
    san = sanitizer_reports(ranks)
    plan = ranks.of("plan", 0)
    rep: dict[str, Any] = {
        "transport": transport,
        "fault": args.fault,
        "ranks": nr,
        "hung": hung,
        "finished": finished,
        "returncodes": [p.returncode for p in ranks.procs],
        "bad": bad,
        "steps": len(steps),
        "planned_steps": plan[0]["steps"] if plan else None,
        "sanitizer_reports": san[:20],
    }
    if t_fault is None or not steps:
        rep["error"] = f"no fault window ({len(steps)} steps)\n{all_tails(ranks)}"
        return rep
    if not finished or any(rc != 0 for rc in rep["returncodes"]) or san or hung:
        rep["error"] = (
            f"finished={finished} rc={rep['returncodes']} hung={hung} sanitizer reports="
            f"{len(san)}\n{all_tails(ranks)}"
        )
    size = args.fault_size

    def phase(t0: float, t1: float) -> list[float]:
        return [s["dt"] for s in steps if t0 <= s["t"] < t1]

    end_t = steps[-1]["t"]
    before = phase(0, t_fault)
    during = phase(t_fault, t_heal or end_t + 1)
    after = phase((t_heal or end_t) + 2.0, end_t + 1)
    healthy = statistics.median(before) if before else float("nan")

    def bw(xs: list[float]) -> float | None:
        return size / statistics.median(xs) / 1e9 * busbw_factor(nr) if xs else None

    rep.update(
        {
            "busbw_before_GBs": bw(before),
            "busbw_during_GBs": bw(during),
            "busbw_after_GBs": bw(after),
            "step_healthy_s": healthy,
            "step_max_during_s": max(during) if during else None,
            "extra_s": (max(during) - healthy) if during else None,
            "step_max_after_heal_s": max(phase(t_heal or end_t, end_t + 1), default=None),
        }
    )
    return rep


def inject(fab: Any, fault: str) -> None:
    if fault == "blackhole":
        fab.blackhole(1, 1)
    elif fault == "carrier":
        fab.carrier_down(1, 1)
    elif fault == "carrier-remote":
        fab.carrier_down(1, 1, end="remote")  # the cable pulled at the switch
    elif fault == "two":
        fab.blackhole(1, 1)
        fab.carrier_down(1, 2)
    else:
        raise SystemExit(f"unknown fault {fault}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    _gpu.add_rank_options(ap)
    ap.add_argument("--sizes", default="1M,4M,16M,64M,256M")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--transports", default="railhop,socket")
    ap.add_argument("--socket-threads", type=int, default=4)
    ap.add_argument("--socket-nsocks", type=int, default=4)
    ap.add_argument("--rate-mbit", type=int, default=None, help="tbf per NIC (default: none)")
    ap.add_argument(
        "--fault",
        choices=["blackhole", "carrier", "carrier-remote", "two"],
        default=None,
        help="also run a fault timeline (railhop; socket: --fault-transports)",
    )
    ap.add_argument("--fault-transports", default="railhop")
    ap.add_argument("--fault-size", type=parse_size, default=64 * MiB)
    ap.add_argument("--fault-total", type=float, default=30.0, help="seconds of fault timeline")
    ap.add_argument("--hang-s", type=float, default=30.0, help="no step for this long = hung")
    ap.add_argument("--timeout", type=float, default=600.0, help="bound per transport run (s)")
    ap.add_argument("--quick", action="store_true", help="sizes 4M,64M,256M, 5 iters")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--ranks", type=int, default=2, help="ranks, one per fabric node (default 2)")
    ap.add_argument("--no-destroy", action="store_true", help="exit without destroying the group")
    args = ap.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    if not args.plugin and "railhop" in args.transports:
        ap.error("--plugin PATH is required (absolute path of libnccl-net-railhop.so)")
    if args.plugin and not Path(args.plugin).is_file():
        ap.error(f"--plugin {args.plugin}: no such file")
    if (why := _gpu.root_problem()) is not None:
        print(why, file=sys.stderr)
        return 2
    if args.quick:
        args.sizes, args.iters, args.warmup = "4M,64M,256M", 5, 2
        args.fault_total = min(args.fault_total, 20.0)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    _common.setup_import_path()
    from railhop_lab.fabric import Fabric, unique_prefix

    if args.ranks < 2:
        ap.error("--ranks: want >= 2")
    tv, why = _gpu.torch_problem(gpus=len({g.strip() for g in args.gpus.split(",")}))
    if why is not None:
        print(why, file=sys.stderr)
        return 2
    print(f"railhop GPU all-reduce | {_common.stamp()} | {_common.machine()} | torch {tv}")
    print(
        f"  {args.ranks} ranks, GPUs {args.gpus}, fabric {args.ranks} nodes x 4 NICs (veth, "
        f"MTU {args.mtu}, "
        f"tbf {args.rate_mbit or 'none'}), sizes {args.sizes}, iters {args.iters}"
    )
    results: dict[str, Any] = {
        "date": _common.stamp(),
        "machine": _common.machine(),
        "torch": tv,
        "args": vars(args),
        "sweep": {},
        "fault": [],
    }
    rc = 0
    port = 29500 + os.getpid() % 1000
    with (
        tempfile.TemporaryDirectory(prefix="railhop-gpu-") as tmpd,
        Fabric(
            nodes=args.ranks,
            nics=4,
            rate_mbit=args.rate_mbit,
            prefix=unique_prefix("rhgpu"),
            mtu=args.mtu,
        ) as fab,
    ):
        tmp = Path(tmpd)
        for tr in [t.strip() for t in args.transports.split(",") if t.strip()]:
            port += 1
            print(f"  running {tr} ...", flush=True)
            out = run_sweep(args, fab, tr, port, tmp, sizes=sizes)
            results["sweep"][tr] = out
            if "error" in out:
                print(f"  {tr} FAILED: {out['error']}")
                rc = 1
        if args.fault:
            for tr in args.fault_transports.split(","):
                port += 1
                print(
                    f"  fault timeline with {tr}: {args.fault} at 30% of "
                    f"{args.fault_total:.0f}s, heal at 60% ...",
                    flush=True,
                )
                rep = run_fault(args, fab, tr, port, tmp)
                results["fault"].append(rep)
                if "error" in rep:
                    print(f"  {tr} fault run: {rep['error']}")
                    rc = rc or (1 if tr == "railhop" else 0)
    for out in results["sweep"].values():
        print(f"  {out['transport']:8} exit status by rank: {out['returncodes']}")
    for rep in results["fault"]:
        print(
            f"  fault [{rep['transport']}/{rep['fault']}] exit status by rank: {rep['returncodes']}"
        )
    # summary
    print(f"\nsummary ({args.ranks} ranks, busbw = algbw x 2(n-1)/n, GB/s; values checked):")
    sw = results["sweep"]
    trs = list(sw)
    print(
        "  size      "
        + "".join(f"{t:>12}" for t in trs)
        + ("   railhop/socket" if {"railhop", "socket"} <= set(trs) else "")
    )
    for size in sizes:
        row = f"  {size / MiB:6.0f}MiB "
        bws = {}
        for t in trs:
            r = sw[t]["results"].get(size)
            bws[t] = size / r["time_s"] / 1e9 * busbw_factor(args.ranks) if r else None
            row += f"{bws[t]:12.3f}" if bws[t] is not None else f"{'-':>12}"
        if bws.get("railhop") and bws.get("socket"):
            row += f"   {bws['railhop'] / bws['socket']:8.3f}x"
        print(row)
    for t in trs:
        nic = sw[t]["nic_tx_bytes"]
        tot = sum(nic) or 1
        shares = " ".join(f"nic{i} {100 * b / tot:3.0f}%" for i, b in enumerate(nic))
        print(
            f"  {t:8} NCCL {sw[t]['nccl']}, wrong values: {sw[t]['bad']}, node0 tx by NIC: {shares}"
        )
        if sw[t]["bad"]:
            rc = 1
    for rep in results["fault"]:
        print(
            f"  fault [{rep['transport']}/{rep['fault']}]: steps {rep['steps']}, hung "
            f"{rep['hung']}, wrong values {rep['bad']}"
        )
        if "busbw_before_GBs" in rep:

            def f(x: float | None) -> str:
                return "-" if x is None else f"{x:.3f}"

            print(
                f"     busbw before {f(rep['busbw_before_GBs'])} during "
                f"{f(rep['busbw_during_GBs'])} after {f(rep['busbw_after_GBs'])} GB/s; "
                f"healthy step {f(rep['step_healthy_s'])} s, max during "
                f"{f(rep['step_max_during_s'])} s (extra {f(rep['extra_s'])} s), max after "
                f"heal {f(rep['step_max_after_heal_s'])} s"
            )
        if rep["bad"] and rep["transport"] == "railhop":
            rc = 1
    _common.write_json(args.json, results)
    return rc


if __name__ == "__main__":
    sys.exit(main())
