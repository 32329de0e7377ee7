#!/usr/bin/env python3
"""Real NCCL end to end on the emulated fabric: live failover, escalation, revoke + re-init.

For a host with 2 GPUs (torch with NCCL >= 2.28.7 built in), run as root:

    python3 bench/gpu_ft.py --plugin /abs/path/libnccl-net-railhop.so [--quick]

Two ranks, one per network namespace of railhop_lab.fabric (rank r on GPU r), NET transport forced
(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0, distinct NCCL_HOSTID). Scenarios
(each a fresh pair of processes; `--scenarios` picks a subset):

  live      torch all-reduce, all-gather, reduce-scatter and send/recv in a loop, every result
            checked on the GPU, while node 1 gets: blackhole nic1, heal, carrier loss nic2, heal,
            2 of 4 NICs (blackhole nic1 + carrier loss nic3), heal. busbw per op and window,
            step-time spikes. railhop and (same faults, bounded by --hang-s) Socket.
  abort     all 4 NICs of node 1 down under a non-blocking communicator (ctypes, blocking=0):
            time until ncclCommGetAsyncError reports an error, then ncclCommAbort's duration.
  torch     the same fault under torch's process group (TORCH_NCCL_BLOCKING_WAIT=1,
            TORCH_NCCL_ASYNC_ERROR_HANDLING=2, pg timeout --pg-timeout): does the error reach
            Python, and when.
  revoke    the same fault; after the error node 1's nic0 and nic1 are healed (nic2, nic3 stay
            down); ncclCommRevoke on the communicator whose all-reduce is still in flight, then a
            new communicator (fresh unique id) runs checked all-reduces through the plugin.
  Socket (NCCL_NET=Socket, same NICs) runs live/abort/torch with the same faults: time until
  anything is reported, bounded by --socket-bound, then killed.

Every wait is bounded, every child is killed at the end; prints a summary table and writes
JSON to --json, or to $OUT/gpu_ft.json when OUT is set.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common
import _gpu
from _gpu import MiB, Ranks, parse_size

OPS = ("all_reduce", "all_gather", "reduce_scatter", "sendrecv")


# ---------------------------------------------------------------------------------------------
# Worker side (one rank, inside a node's netns). JSON lines on stdout.


_emit = _gpu.emit


def _wait_file(p: Path, deadline: float) -> bool:
    """Wait (bounded) until ``p`` exists (written by rename: complete once visible)."""
    while time.time() < deadline:
        if p.exists():
            return True
        time.sleep(0.01)
    return p.exists()


_write_atomic = _gpu.write_atomic


_bounded = _gpu.bounded


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # never run torch/NCCL teardown after a fault: it may block


def _fault_time(d: Path) -> float | None:
    with contextlib.suppress(OSError, ValueError):
        return float((d / "fault").read_text())
    return None


def worker_torch(cfg: dict[str, Any]) -> int:
    """live: the op loop; torch: all-reduce loop until the error reaches Python."""
    import torch
    import torch.distributed as dist

    rank, peer, d = int(cfg["rank"]), 1 - int(cfg["rank"]), Path(cfg["dir"])
    torch.cuda.set_device(0)
    _gpu.init_process_group(cfg)
    n = max(2, cfg["size"] // 4) // 2 * 2
    half = n // 2
    base = (torch.arange(n, device="cuda", dtype=torch.int32) % 1021).float()
    mine, theirs = base * (rank + 1), base * (peer + 1)
    exp_ar = base * 3
    exp_ag = torch.cat([base[:half] * 1, base[:half] * 2])
    exp_rs = exp_ar[rank * half : (rank + 1) * half]
    out = torch.empty(n, device="cuda")
    out_h = torch.empty(half, device="cuda")
    bad = torch.zeros((), dtype=torch.int64, device="cuda")

    def run_op(op: str) -> None:
        if op == "all_reduce":
            out.copy_(mine)
            dist.all_reduce(out)
            bad.add_((out != exp_ar).sum())
        elif op == "all_gather":
            dist.all_gather_into_tensor(out, mine[:half])
            bad.add_((out != exp_ag).sum())
        elif op == "reduce_scatter":
            dist.reduce_scatter_tensor(out_h, mine)
            bad.add_((out_h != exp_rs).sum())
        else:
            ops = [dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, out, peer)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            bad.add_((out != theirs).sum())

    for op in OPS:  # warm up every op (connections)
        run_op(op)
    torch.cuda.synchronize()
    _emit({"type": "ready", "rank": rank, "nccl": ".".join(map(str, torch.cuda.nccl.version()))})
    if cfg["scenario"] == "live":
        t_end = time.time() + float(cfg["total_s"])
        i = 0
        # both ranks must run the same op sequence: rank 0 decides when to stop by a count
        # agreed at the start (steps/s measured in a short probe)
        t0 = time.perf_counter()
        for op in OPS * 3:
            run_op(op)
        torch.cuda.synchronize()
        per = (time.perf_counter() - t0) / (3 * len(OPS))
        nsteps = torch.tensor([int(float(cfg["total_s"]) / max(per, 1e-4))], device="cuda")
        dist.all_reduce(nsteps, op=dist.ReduceOp.MAX)
        total = int(min(nsteps.item(), 200000))
        _emit({"type": "plan", "steps": total, "t_end_est": t_end})
        for i in range(total):
            op = OPS[i % len(OPS)]
            t0 = time.perf_counter()
            run_op(op)
            torch.cuda.synchronize()
            _emit(
                {
                    "type": "step",
                    "i": i,
                    "op": op,
                    "dt": time.perf_counter() - t0,
                    "bad": int(bad.item()) if i % 50 == 0 else None,
                }
            )
        _emit({"type": "done", "bad": int(bad.item())})
        dist.destroy_process_group()
        _exit(0)
    # scenario "torch": loop all-reduce (blocking wait) until an exception reaches Python
    deadline = time.time() + float(cfg["bound_s"]) + 60
    i = 0
    while time.time() < deadline:
        tf = _fault_time(d)
        if tf is not None and time.time() > tf + float(cfg["bound_s"]):
            _emit({"type": "no_error", "after_s": time.time() - tf})
            _exit(3)
        try:
            out.copy_(mine)
            w = dist.all_reduce(out, async_op=True)
            assert w is not None
            w.wait()
            bad.add_((out != exp_ar).sum())
            if i % 20 == 0:
                torch.cuda.synchronize()
            i += 1
        except Exception as e:  # the point of the scenario: which exception, when
            _emit({"type": "error", "exc": type(e).__name__, "msg": str(e)[:400], "steps": i})
            _exit(0)
    _emit({"type": "no_error", "after_s": None})
    _exit(3)
    return 3


def worker_nb(cfg: dict[str, Any]) -> int:
    """abort / revoke: a non-blocking communicator through the ctypes binding."""
    import torch

    import _nccl

    rank, d = int(cfg["rank"]), Path(cfg["dir"])
    torch.cuda.set_device(0)
    torch.cuda.init()
    lib = _nccl.Nccl()
    ver = lib.version()
    stream = torch.cuda.Stream()  # NCCL's stream (not the legacy default stream)
    sptr = int(stream.cuda_stream)
    t_limit = time.time() + float(cfg["bound_s"]) + 90

    keep: list[Any] = []

    def make_comm(tag: str) -> tuple[int, int, float]:
        uidf = d / f"uid.{tag}"
        if rank == 0:
            _write_atomic(uidf, lib.unique_id())
            uid = uidf.read_bytes()
        else:
            if not _wait_file(uidf, time.time() + 60):
                _emit({"type": "fatal", "what": f"no unique id {tag}"})
                _exit(4)
            uid = uidf.read_bytes()
        t0 = time.time()
        conf = lib.config(blocking=0)
        keep.append(conf)  # alive for the whole non-blocking init
        rc, comm = lib.init_rank(2, uid, rank, conf)
        st = rc
        if rc in (0, _nccl.NCCL_IN_PROGRESS) and comm:
            st = lib.async_error(comm)
            while st == _nccl.NCCL_IN_PROGRESS and time.time() < t0 + 60:
                time.sleep(0.001)
                st = lib.async_error(comm)
        return st, comm, time.time() - t0

    n = max(1, cfg["size"] // 4)
    base = (torch.arange(n, device="cuda", dtype=torch.int32) % 1021).float()
    src = base * (rank + 1)
    exp = base * 3
    out = torch.empty(n, device="cuda")
    bad = torch.zeros((), dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()

    def allreduce(comm: int, until: float) -> tuple[str, int]:
        """("ok", 0) | ("launch"|"async", rc) | ("timeout", 7)."""
        rc = lib.all_reduce_f32(src.data_ptr(), out.data_ptr(), n, comm, sptr)
        if rc not in (0, 7):
            return "launch", rc
        while time.time() < until:
            if stream.query():
                st = lib.async_error(comm)
                if st == _nccl.NCCL_SUCCESS:  # enqueued (not InProgress) and the stream is idle
                    with torch.cuda.stream(stream):  # ordered before the next collective
                        bad.add_((out != exp).sum())
                    return "ok", 0
                if st != _nccl.NCCL_IN_PROGRESS:
                    return "async", st
            st = lib.async_error(comm)
            if st not in (0, 7):
                return "async", st
            time.sleep(0.0002)
        return "timeout", 7

    rc, comm, init_s = make_comm("a")
    if rc != 0:
        _emit({"type": "fatal", "what": "init", "rc": rc, "last": lib.last_error(comm)})
        _exit(4)
    for _ in range(3):
        kind, rc = allreduce(comm, time.time() + 30)
        if kind != "ok":
            _emit({"type": "fatal", "what": f"warmup {kind}", "rc": rc})
            _exit(4)
    stream.synchronize()
    _emit({"type": "ready", "rank": rank, "nccl": ver, "init_s": init_s, "lib": lib.path})
    i = 0
    badv = 0  # read only while the stream is idle (a stuck stream would block .item())
    err: dict[str, Any] | None = None
    while time.time() < t_limit:
        tf = _fault_time(d)
        until = (tf + float(cfg["bound_s"])) if tf is not None else t_limit
        t0 = time.time()
        kind, rc = allreduce(comm, min(until, t_limit))
        if kind == "ok":
            i += 1
            if i % 10 == 0:
                stream.synchronize()
                badv = int(bad.item())
                _emit({"type": "step", "i": i, "dt": time.time() - t0, "bad": badv})
            continue
        if kind == "timeout":
            _emit({"type": "no_error", "after_s": time.time() - tf if tf else None, "steps": i})
        else:
            err = {"type": "error", "where": kind, "rc": rc, "name": _nccl.result_name(rc)}
            err["last"] = lib.last_error(comm)[:300]
            _emit({**err, "steps": i, "bad": badv})
        break
    in_flight = not stream.query()
    if cfg["scenario"] == "abort" or err is None:
        ok, val, s = _bounded(lambda: lib.abort(comm), float(cfg["abort_bound_s"]))
        _emit({"type": "abort", "returned": ok, "rc": val, "s": s, "in_flight": in_flight})
        _exit(0 if ok else 5)
    # revoke: wait until the parent healed part of the fabric
    if not _wait_file(d / "healed", time.time() + 60):
        _emit({"type": "fatal", "what": "no healed signal"})
        _exit(4)
    t0 = time.time()
    ok, val, s = _bounded(lambda: lib.revoke(comm), float(cfg["abort_bound_s"]))
    st = lib.async_error(comm) if ok else -1
    while ok and st == _nccl.NCCL_IN_PROGRESS and time.time() < t0 + float(cfg["abort_bound_s"]):
        time.sleep(0.001)
        st = lib.async_error(comm)
    _emit(
        {
            "type": "revoke",
            "returned": ok,
            "rc": val,
            "call_s": s,
            "quiesced_s": time.time() - t0,
            "state": st,
            "in_flight": in_flight,
            "stream_idle_after": bool(stream.query()),
        }
    )
    if not ok:
        _exit(5)
    # the revoked parent is valid for destroy; a fresh communicator runs the recovery
    okd, vald, sd = _bounded(lambda: lib.destroy(comm), float(cfg["abort_bound_s"]))
    _emit({"type": "destroy_parent", "returned": okd, "rc": vald, "s": sd})
    with torch.cuda.stream(stream):
        bad.zero_()
    rc, comm2, init_s = make_comm("b")
    if rc != 0:
        _emit({"type": "reinit", "rc": rc, "s": init_s, "last": lib.last_error(comm2)[:300]})
        _exit(6)
    times = []
    res = "ok"
    for _ in range(int(cfg["recover_iters"])):
        t0 = time.perf_counter()
        kind, rc = allreduce(comm2, time.time() + 30)
        if kind != "ok":
            res = f"{kind} {_nccl.result_name(rc)}"
            break
        times.append(time.perf_counter() - t0)
    if res == "ok":
        stream.synchronize()
    _emit(
        {
            "type": "reinit",
            "rc": 0,
            "s": init_s,
            "result": res,
            "iters": len(times),
            "bad": int(bad.item()) if res == "ok" else None,
            "busbw_GBs": cfg["size"] / statistics.median(times) / 1e9 if times else None,
        }
    )
    oka, vala, sa = _bounded(lambda: lib.destroy(comm2), float(cfg["abort_bound_s"]))
    _emit({"type": "destroy_new", "returned": oka, "rc": vala, "s": sa})
    _exit(0)
    return 0


# ---------------------------------------------------------------------------------------------
# Parent


def make_envs(
    args: argparse.Namespace, transport: str, rundir: Path, scenario: str
) -> list[dict[str, str]]:
    common = {
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
    }
    if scenario == "torch":  # wait() polls and raises the communicator's error in Python
        common["TORCH_NCCL_BLOCKING_WAIT"] = "1"
    return _gpu.rank_envs(
        args,
        transport,
        rundir,
        hostid="railhop-ft-node",
        common=common,
        railhop={"RAILHOP_NICS": "nic0:0,nic1:1,nic2:2,nic3:3"},
    )


def _start(
    args: argparse.Namespace, fab: Any, tr: str, scen: str, tmp: Path, port: int, **extra: Any
) -> tuple[Ranks, Path]:
    d = tmp / f"{tr}-{scen}"
    d.mkdir(parents=True, exist_ok=True)
    cfg = {
        "scenario": scen,
        "dir": str(d),
        "master": fab.address(0, 0),
        "port": port,
        "size": args.size,
        "pg_timeout": args.pg_timeout,
        "bound_s": args.bound if tr == "railhop" else args.socket_bound,
        "abort_bound_s": args.abort_bound,
        "recover_iters": args.recover_iters,
        "fake": args.fake,
        **extra,
    }
    envs = make_envs(args, tr, tmp, scen)
    return Ranks(fab, Path(__file__).resolve(), envs, cfg, tmp, f"{tr}-{scen}"), d


def _ready(ranks: Ranks, timeout: float) -> bool:
    return ranks.wait_for(
        lambda: (
            all(ranks.first(("ready",), r) for r in range(2))
            or any(ranks.first(("fatal",), r) for r in range(2))
            or any(p.poll() is not None for p in ranks.procs)
        ),
        timeout,
    ) and all(ranks.first(("ready",), r) for r in range(2))


LIVE_PLAN = [  # (fraction of the run, action, label)
    (0.15, "blackhole:1", "blackhole nic1"),
    (0.30, "heal", "healed"),
    (0.40, "carrier:2", "carrier nic2"),
    (0.55, "heal", "healed"),
    (0.65, "blackhole:1,carrier:3", "2 of 4 (bh nic1, carrier nic3)"),
    (0.82, "heal", "healed"),
]


def _apply(fab: Any, action: str) -> None:
    if action == "heal":
        fab.heal_all()
        return
    for part in action.split(","):
        kind, _, nic = part.partition(":")
        if kind == "blackhole":
            fab.blackhole(1, int(nic))
        else:
            fab.carrier_down(1, int(nic))


def run_live(args: argparse.Namespace, fab: Any, tr: str, tmp: Path, port: int) -> dict[str, Any]:
    total = args.live_total
    plan = LIVE_PLAN if tr == "railhop" else [(0.3, "blackhole:1", "blackhole nic1")]
    ranks, _ = _start(args, fab, tr, "live", tmp, port, total_s=total)
    rep: dict[str, Any] = {"transport": tr, "scenario": "live"}
    events: list[tuple[float, str]] = []
    hung = False
    try:
        if not _ready(ranks, args.init_timeout):
            rep["error"] = f"not ready\n{ranks.tail(0)}\n{ranks.tail(1)}"
            return rep
        ranks.wait_for(lambda: bool(ranks.of("step", 0)) or not ranks.alive(), 30)
        steps0 = ranks.of("step", 0)
        if not steps0:
            rep["error"] = f"no steps\n{ranks.tail(0)}\n{ranks.tail(1)}"
            return rep
        t_first = steps0[0]["t"]
        k = 0
        deadline = time.time() + total * 2 + args.hang_s + 30
        while ranks.alive() and time.time() < deadline:
            now = time.time()
            if k < len(plan) and now - t_first >= plan[k][0] * total:
                _apply(fab, plan[k][1])
                events.append((time.time(), plan[k][2]))
                print(f"    [{tr}] t={now - t_first:5.1f}s {plan[k][2]}", flush=True)
                k += 1
            steps = ranks.of("step", 0)
            last = steps[-1]["_recv"] if steps else now
            if events and now - max(last, events[0][0]) > args.hang_s:
                hung = True
                print(f"    [{tr}] no step for {args.hang_s:.0f} s: hung, killing", flush=True)
                break
            time.sleep(0.02)
    finally:
        fab.heal_all()
        ranks.finish(0.0 if hung else 30.0)
    steps = ranks.of("step", 0)
    rcs = [p.returncode for p in ranks.procs]
    bad = max((x.get("bad") or 0 for r in range(2) for x in ranks.lines[r]), default=0)
    done = all(ranks.of("done", r) for r in range(2))
    rep.update({"hung": hung, "done": done, "rc": rcs, "steps": len(steps), "bad": bad})
    rep["events"] = [(t - steps[0]["t"] if steps else 0.0, lbl) for t, lbl in events]
    if hung:
        last_t = steps[-1]["t"] if steps else None
        rep["silent_s"] = time.time() - (last_t or time.time())
    rep["windows"] = windows(steps, events, args.size)
    return rep


def busbw(op: str, size: int, dt: float) -> float:
    """GB/s per the nccl-tests convention for 2 ranks (size = bytes of the full buffer)."""
    factor = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "sendrecv": 1.0}
    return size * factor[op] / dt / 1e9


def windows(
    steps: list[dict[str, Any]], events: list[tuple[float, str]], size: int
) -> list[dict[str, Any]]:
    """Split steps by the fault timeline: healthy, then one window per event."""
    bounds = [(0.0, "healthy"), *list(events), (float("inf"), "")]
    healthy: dict[str, float] = {}
    out = []
    for (t0, label), (t1, _) in itertools.pairwise(bounds):
        w = [s for s in steps if t0 <= s["t"] < t1]
        row: dict[str, Any] = {"window": label, "steps": len(w)}
        for op in OPS:
            dts = [s["dt"] for s in w if s["op"] == op]
            if not dts:
                continue
            med = statistics.median(dts)
            if label == "healthy":
                healthy[op] = med
            row[op] = {
                "busbw_GBs": busbw(op, size, med),
                "max_step_s": max(dts),
                "spike_s": max(dts) - healthy.get(op, med),
            }
        out.append(row)
    return out


def run_escalation(
    args: argparse.Namespace, fab: Any, tr: str, scen: str, tmp: Path, port: int
) -> dict[str, Any]:
    ranks, d = _start(args, fab, tr, scen, tmp, port)
    rep: dict[str, Any] = {"transport": tr, "scenario": scen}
    bound = args.bound if tr == "railhop" else args.socket_bound
    c0 = c1 = None
    try:
        if not _ready(ranks, args.init_timeout):
            rep["error"] = f"not ready\n{ranks.tail(0)}\n{ranks.tail(1)}"
            return rep
        time.sleep(1.0)  # some healthy steps
        t_fault = time.time()
        for nic in range(4):
            fab.carrier_down(1, nic)
        _write_atomic(d / "fault", repr(t_fault))
        rep["fault"] = "carrier loss on all 4 NICs of node 1"
        print(f"    [{tr}/{scen}] all 4 NICs of node 1 down", flush=True)
        got = ranks.wait_for(
            lambda: (
                all(ranks.first(("error", "no_error", "fatal"), r) for r in range(2))
                or not ranks.alive()
            ),
            bound + 15,
        )
        rep["reported_in_time"] = got
        rep["report_wait_s"] = bound + 15
        for r in range(2):
            e = ranks.first(("error", "no_error", "fatal"), r)
            rep[f"rank{r}"] = {k: v for k, v in (e or {}).items() if k != "_recv"}
            if e and e["type"] == "error":
                rep[f"rank{r}"]["after_fault_s"] = e["t"] - t_fault
            elif not e and ranks.t_exit[r]:
                rep[f"rank{r}"]["exited_after_s"] = (ranks.t_exit[r] or 0) - t_fault
        if scen == "revoke":
            fab.heal(1, 0)
            fab.heal(1, 1)
            c0 = fab.counters()
            _write_atomic(d / "healed", repr(time.time()))
            print(f"    [{tr}/{scen}] node 1 nic0, nic1 healed (nic2, nic3 stay down)", flush=True)
        ranks.wait_for(lambda: not ranks.alive(), args.abort_bound + (90 if c0 else 10))
        if c0 is not None:
            c1 = fab.counters()
    finally:
        fab.heal_all()
        ranks.finish(1.0)
    rep["rc"] = [p.returncode for p in ranks.procs]
    for r in range(2):
        for kind in ("abort", "revoke", "destroy_parent", "reinit", "destroy_new"):
            x = ranks.first((kind,), r)
            if x:
                rep.setdefault(f"rank{r}", {})[kind] = {k: v for k, v in x.items() if k != "_recv"}
    if c0 is not None and c1 is not None:
        rep["recovery_node1_nic_bytes"] = [
            (c1[(1, i)].tx_bytes - c0[(1, i)].tx_bytes)
            + (c1[(1, i)].rx_bytes - c0[(1, i)].rx_bytes)
            for i in range(4)
        ]
    if any(not ranks.first(("ready",), r) for r in range(2)):
        rep["error"] = f"{ranks.tail(0)}\n{ranks.tail(1)}"
    return rep


# ---------------------------------------------------------------------------------------------


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _rname(rc: Any) -> str:
    import _nccl

    return _nccl.result_name(rc) if isinstance(rc, int) else str(rc)


def summary(results: dict[str, Any]) -> tuple[list[str], bool]:
    lines = []
    ok = True
    for rep in results["runs"]:
        tr, sc = rep["transport"], rep["scenario"]
        head = f"[{tr}/{sc}]"
        if "error" in rep:
            lines.append(f"{head} FAILED TO RUN: {rep['error'].splitlines()[0:1]}")
            ok = ok and tr != "railhop"
            if "windows" not in rep and "rank0" not in rep:
                continue
        if sc == "live":
            lines.append(
                f"{head} steps {rep.get('steps')} hung {rep.get('hung')} completed "
                f"{rep.get('done')} wrong values {rep.get('bad')}"
                + (f" (silent {rep['silent_s']:.1f} s, killed)" if rep.get("hung") else "")
            )
            lines.append(
                "   window                              "
                + "".join(f"{op:>22}" for op in OPS)
                + "   (busbw GB/s / max step s)"
            )
            for w in rep.get("windows", []):
                row = f"   {w['window'][:34]:34} {w['steps']:>4}"
                for op in OPS:
                    c = w.get(op)
                    row += (
                        f"{_fmt(c['busbw_GBs'], '9.2f')} /{_fmt(c['max_step_s'], '8.3f')}  "
                        if c
                        else f"{'-':>22}"
                    )
                lines.append(row)
            if tr == "railhop" and (rep.get("hung") or rep.get("bad") or not rep.get("done")):
                ok = False
            continue
        for r in range(2):
            x = rep.get(f"rank{r}", {})
            t = x.get("type")
            if t == "error":
                what = f"{x.get('name') or x.get('exc')} after {x.get('after_fault_s', 0):.2f} s"
                if x.get("msg"):
                    what += f" ({x['msg'][:90]!r})"
            elif t == "no_error":
                what = f"NOTHING reported within the bound ({_fmt(x.get('after_s'), '.1f')} s)"
            elif x.get("exited_after_s"):
                what = f"no report, the process exited {x['exited_after_s']:.1f} s after the fault"
            else:
                what = (
                    f"NOTHING reported in {_fmt(rep.get('report_wait_s'), '.0f')} s (the rank's "
                    "own bound did not fire either: blocked inside a CUDA/NCCL call); killed"
                )
            line = f"{head} rank{r}: {what}"
            if "abort" in x:
                a = x["abort"]
                line += f"; ncclCommAbort returned={a['returned']} in {a['s']:.3f} s"
            if "revoke" in x:
                v = x["revoke"]
                line += (
                    f"; ncclCommRevoke returned={v['returned']} ({_rname(v['rc'])}) in "
                    f"{v['call_s']:.3f} s, "
                    f"quiesced {v['quiesced_s']:.3f} s (in flight before: {v.get('in_flight')})"
                )
            if "reinit" in x:
                v = x["reinit"]
                line += (
                    f"; new comm init {v['s']:.2f} s, {v.get('result')} x{v.get('iters')}, "
                    f"wrong {v.get('bad')}, busbw {_fmt(v.get('busbw_GBs'), '.2f')} GB/s"
                )
            lines.append(line)
            if tr == "railhop":
                in_time = (
                    t == "error" and x.get("after_fault_s", 1e9) <= 2 * results["completion_s"]
                )
                if sc in ("abort", "revoke") and not in_time:
                    ok = False
                if sc == "torch" and t != "error":
                    ok = False
                if sc == "abort" and not x.get("abort", {}).get("returned"):
                    ok = False
                rv = x.get("reinit", {})
                if sc == "revoke" and (rv.get("result") != "ok" or rv.get("bad")):
                    ok = False
        if "recovery_node1_nic_bytes" in rep:
            lines.append(
                f"{head} node 1 bytes per NIC during recovery: {rep['recovery_node1_nic_bytes']}"
            )
    return lines, ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    _gpu.add_rank_options(ap)
    ap.add_argument("--scenarios", default="live,abort,torch,revoke")
    ap.add_argument("--transports", default="railhop,socket")
    ap.add_argument("--size", type=parse_size, default=16 * MiB, help="buffer per op")
    ap.add_argument("--live-total", type=float, default=40.0, help="seconds of the live loop")
    ap.add_argument("--hang-s", type=float, default=20.0, help="live: no step this long = hung")
    ap.add_argument("--bound", type=float, default=10.0, help="railhop: error wait bound (s)")
    ap.add_argument("--socket-bound", type=float, default=30.0, help="Socket: wait bound (s)")
    ap.add_argument("--abort-bound", type=float, default=15.0, help="abort/revoke bound (s)")
    ap.add_argument("--pg-timeout", type=float, default=30.0, help="torch pg timeout (s)")
    ap.add_argument("--init-timeout", type=float, default=90.0)
    ap.add_argument("--recover-iters", type=int, default=20)
    ap.add_argument("--completion-ms", type=int, default=1000, help="RAILHOP_COMPLETION_TIMEOUT")
    ap.add_argument("--quick", action="store_true", help="shorter live loop and bounds")
    ap.add_argument("--json", help="write results here (default $OUT/gpu_ft.json if OUT set)")
    ap.add_argument("--fake", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        cfg = json.loads(args.worker)
        if cfg.get("fake"):
            return fake_worker(cfg)
        if cfg["scenario"] in ("live", "torch"):
            return worker_torch(cfg)
        return worker_nb(cfg)
    trs = [t.strip() for t in args.transports.split(",") if t.strip()]
    if "railhop" in trs and (not args.plugin or not Path(args.plugin).is_file()):
        ap.error("--plugin /abs/path/libnccl-net-railhop.so is required (an existing file)")
    if (why := _gpu.root_problem()) is not None:
        print(why, file=sys.stderr)
        return 2
    if args.quick:
        args.live_total = min(args.live_total, 20.0)
        args.hang_s = min(args.hang_s, 10.0)
        args.socket_bound = min(args.socket_bound, 10.0)
        args.abort_bound = min(args.abort_bound, 10.0)
        args.pg_timeout = min(args.pg_timeout, 15.0)
        args.recover_iters = min(args.recover_iters, 10)
    if args.completion_ms != 1000:
        args.env.append(f"RAILHOP_COMPLETION_TIMEOUT={args.completion_ms}")
    if args.json is None and os.environ.get("OUT"):
        args.json = str(Path(os.environ["OUT"]) / "gpu_ft.json")
    _common.setup_import_path()
    from railhop_lab.fabric import Fabric, unique_prefix

    tv = _gpu.torch_for(args.fake, gpus=2)
    if tv is None:
        return 2
    scens = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    print(f"railhop GPU fault tolerance | {_common.stamp()} | {_common.machine()} | torch {tv}")
    print(f"  scenarios {scens}, transports {trs}, size {args.size / MiB:.0f} MiB", flush=True)
    results: dict[str, Any] = {
        "date": _common.stamp(),
        "machine": _common.machine(),
        "torch": tv,
        "args": vars(args),
        "completion_s": args.completion_ms / 1000,
        "runs": [],
    }
    port = 29600 + os.getpid() % 1000
    logdir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    with (
        tempfile.TemporaryDirectory(prefix="railhop-ft-") as tmpd,
        Fabric(nodes=2, nics=4, prefix=unique_prefix("rhft"), mtu=args.mtu) as fab,
    ):
        tmp = Path(tmpd)
        for tr, sc in [(tr, sc) for tr in trs for sc in scens]:
            if tr == "socket" and sc == "revoke":
                continue  # nothing to compare: Socket never reports the error (see abort)
            port += 1
            print(f"  {tr}/{sc} ...", flush=True)
            t0 = time.monotonic()
            try:
                if sc == "live":
                    rep = run_live(args, fab, tr, tmp, port)
                else:
                    rep = run_escalation(args, fab, tr, sc, tmp, port)
            except Exception as e:  # keep going: report it
                rep = {"transport": tr, "scenario": sc, "error": f"{type(e).__name__}: {e}"}
                fab.heal_all()
            rep["wall_s"] = time.monotonic() - t0
            results["runs"].append(rep)
            _common.write_json(args.json, results)
            if logdir is not None:  # the ranks' stderr (few files come back from a GPU host)
                save_logs(tmp, logdir / "gpu_ft_logs.txt")
    lines, ok = summary(results)
    print("\nsummary (busbw GB/s per nccl-tests convention for 2 ranks; every value checked):")
    for ln in lines:
        print("  " + ln)
    results["ok"] = ok
    _common.write_json(args.json, results)
    print(f"\nrailhop verdict: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def save_logs(tmp: Path, dest: Path) -> None:
    with dest.open("w") as f:
        for p in sorted(tmp.glob("*.log")):
            f.write(f"===== {p.name}\n")
            f.write("\n".join(p.read_text(errors="replace").splitlines()[-80:]) + "\n")


def fake_worker(cfg: dict[str, Any]) -> int:
    """CPU-only stand-in (tests the orchestration and the fabric, no GPU): --fake."""
    d = Path(cfg["dir"])
    _emit({"type": "ready", "rank": cfg["rank"]})
    if cfg["scenario"] == "live":
        for i in range(int(cfg["total_s"] / 0.02)):
            time.sleep(0.02)
            _emit({"type": "step", "i": i, "op": OPS[i % 4], "dt": 0.02, "bad": 0})
        _emit({"type": "done", "bad": 0})
        return 0
    tf = None
    while tf is None:
        time.sleep(0.05)
        tf = _fault_time(d)
    time.sleep(1.2)
    _emit({"type": "error", "where": "async", "rc": 6, "name": "ncclRemoteError", "last": ""})
    if cfg["scenario"] == "revoke":
        _wait_file(d / "healed", time.time() + 30)
        _emit({"type": "revoke", "returned": True, "rc": 0, "call_s": 0.01, "quiesced_s": 0.1})
        _emit({"type": "reinit", "s": 1.0, "result": "ok", "iters": 10, "bad": 0})
    elif cfg["scenario"] == "abort":
        _emit({"type": "abort", "returned": True, "rc": 0, "s": 0.01, "in_flight": True})
    return 0


if __name__ == "__main__":
    sys.exit(main())
