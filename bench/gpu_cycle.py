#!/usr/bin/env python3
"""The whole fault-tolerance cycle on real NCCL with 4 ranks (issue 20): failover, escalation,
revoke, shrink, heal, back to full size.

For a host with torch (NCCL >= 2.28.7 built in) and at least one GPU, run as root:

    python3 bench/gpu_cycle.py --plugin /abs/path/libnccl-net-railhop.so [--repeat 2]

Four ranks, one per network namespace of the emulated fabric (4 nodes x 4 NICs); all ranks may
share one GPU (each its own netns and NCCL_HOSTID; NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
NCCL_NVLS_ENABLE=0, so every byte goes through the network transport). Each rank drives a
non-blocking communicator (config.blocking = 0) through the libnccl.so.2 torch loaded (ctypes,
bench/_nccl.py); buffers and the stream are torch's. A step is one of all-reduce, all-gather,
reduce-scatter and an all-pairs send/recv; every result is compared on the GPU with its
expected values after every step (a GPU counter of wrong values, read each round).

  phase 1  carrier loss on node 1 nic1, 2 s later a silent blackhole on node 2 nic2 (both
           faults held together), then heal: collectives keep running, 0 wrong values.
  phase 2  carrier loss on all 4 NICs of node 3. Every survivor polls ncclCommGetAsyncError
           and an out-of-band notice board (the job's store: a survivor that sees an error posts
           it there, since a rank with no connection to rank 3 in the collective in flight has
           nothing that can fail), then ncclCommRevoke (or, with --recovery abort, no revoke
           and NCCL_SHRINK_ABORT), ncclCommShrink excluding rank 3 -> a 3-rank communicator that
           runs checked collectives while node 3's NICs stay down; the parent is destroyed.
           Rank 3 aborts its communicator (bounded) and waits.
  phase 3  node 3's NICs heal; rank 0 makes a fresh unique id and all 4 ranks build a new
           full-size communicator (what ncclCommGrow gives RCCL users; NCCL 2.28.9 has no
           Grow), then the 3-rank one is destroyed and the 4-rank job resumes, 0 wrong values.

Variants (`--variants`): `railhop` (no agent: the plugin alone), `agent` (a `railhop agent`
with netlink+sysfs in every node netns, OTLP/JSON traces per node), `socket` (NCCL's Socket
transport, phase 1 only, killed when no step completes for --socket-hang s). `--repeat N` runs
the variants N times over the same fabric. Every wait is bounded, every child is killed at the
end; a summary table goes to stdout and JSON (+ logs, traces) to --out-dir or $OUT.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _common  # noqa: E402
import _gpu  # noqa: E402

MiB = 1 << 20
OPS = ("all_reduce", "all_gather", "reduce_scatter", "sendrecv")
NRANKS = 4
DEAD = 3  # the rank whose node loses every NIC in phase 2


# ---------------------------------------------------------------------------------------------
# Worker (one rank in its node's netns): JSON lines on stdout


_emit = _gpu.emit


_exit = _gpu.exit_now


_write_atomic = _gpu.write_atomic


def _wait_file(p: Path, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if p.exists():
            return True
        time.sleep(0.01)
    return p.exists()


_bounded = _gpu.bounded


class Failed(Exception):
    """The worker cannot go on; carries what to report."""

    def __init__(self, what: str, **info: Any) -> None:
        super().__init__(what)
        self.info = {"what": what, **{k: v for k, v in info.items() if k not in ("type", "t")}}


class Worker:
    """One rank: communicators, checked steps, the recovery."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        import torch

        sys.path.insert(0, str(HERE))
        import _nccl

        self.cfg, self.torch, self.N = cfg, torch, _nccl
        self.rank = int(cfg["rank"])
        self.d = Path(cfg["dir"])
        self.board = self.d / "board"
        self.bound = float(cfg["call_bound_s"])
        torch.cuda.set_device(0)
        torch.cuda.init()
        self.lib = _nccl.Nccl()
        self.stream = torch.cuda.Stream()
        self.sptr = int(self.stream.cuda_stream)
        self.keep: list[Any] = []  # configs alive for the whole non-blocking init
        self.elems = max(12, int(cfg["size"]) // 4 // 12 * 12)
        self.base = (torch.arange(self.elems, device="cuda", dtype=torch.int32) % 1021).float()
        self.out = torch.empty(self.elems, device="cuda")
        self.flag = torch.zeros(1, device="cuda")
        self.bad = torch.zeros((), dtype=torch.int64, device="cuda")
        self.watch_board = False
        self.exp: dict[tuple[int, int], dict[str, Any]] = {}

    # -- communicators

    def uid(self, tag: str, creator: bool) -> bytes:
        f = self.d / f"uid.{tag}"
        if creator:
            _write_atomic(f, self.lib.unique_id())
        elif not _wait_file(f, float(self.cfg["uid_wait_s"])):
            raise Failed(f"no unique id {tag}")
        return f.read_bytes()

    def wait_ready(self, comm: int, timeout: float) -> int:
        st = self.lib.async_error(comm)
        t_end = time.time() + timeout
        while st == self.N.NCCL_IN_PROGRESS and time.time() < t_end:
            time.sleep(0.001)
            st = self.lib.async_error(comm)
        return st

    def init_comm(self, tag: str, n: int, rank: int, creator_rank: int = 0) -> tuple[int, float]:
        uid = self.uid(tag, rank == creator_rank)
        t0 = time.time()
        conf = self.lib.config(blocking=0)
        self.keep.append(conf)
        rc, comm = self.lib.init_rank(n, uid, rank, conf)
        st = rc
        if rc in (0, self.N.NCCL_IN_PROGRESS) and comm:
            st = self.wait_ready(comm, float(self.cfg["init_bound_s"]))
        if st != 0:
            last = self.lib.last_error(comm)[:300] if comm else ""
            raise Failed(f"init {tag}", rc=st, name=self.N.result_name(st), last=last)
        return comm, time.time() - t0

    # -- checked steps

    def expected(self, n: int, r: int) -> dict[str, Any]:
        """Inputs and expected outputs of rank r of n (small integers: fp32 sums are exact)."""
        key = (n, r)
        if key not in self.exp:
            b, E = self.base, self.elems
            c = E // n
            tot = n * (n + 1) / 2
            send = self.base * (r + 1)
            a2a = self.torch.cat([b[:c] * (r + 1) + 1000 * p for p in range(n)])
            self.exp[key] = {
                "n": n,
                "r": r,
                "c": c,
                "send": send,
                "a2a": a2a,
                "all_reduce": b * tot,
                "all_gather": self.torch.cat([b[:c] * (p + 1) for p in range(n)]),
                "reduce_scatter": b[r * c : (r + 1) * c] * tot,
                "sendrecv": self.torch.cat(
                    [
                        b[:c] * (p + 1) + 1000 * r if p != r else a2a[p * c : (p + 1) * c]
                        for p in range(n)
                    ]
                ),
            }
        return self.exp[key]

    def launch(self, comm: int, x: dict[str, Any], op: str) -> int:
        L, s, out, c, r, n = self.lib, self.sptr, self.out, x["c"], x["r"], x["n"]
        send = x["send"]
        if op == "all_reduce":
            return L.all_reduce(send.data_ptr(), out.data_ptr(), self.elems, comm, s)
        if op == "all_gather":
            return L.all_gather_f32(send.data_ptr(), out.data_ptr(), c, comm, s)
        if op == "reduce_scatter":
            return L.reduce_scatter_f32(send.data_ptr(), out.data_ptr(), c, comm, s)
        with self.torch.cuda.stream(self.stream):  # own slot: what would not move
            out[r * c : (r + 1) * c].copy_(x["a2a"][r * c : (r + 1) * c])
        a2a, sz = x["a2a"], 4
        sends = [(a2a.data_ptr() + p * c * sz, p) for p in range(n) if p != r]
        recvs = [(out.data_ptr() + p * c * sz, p) for p in range(n) if p != r]
        return L.exchange_f32(sends, recvs, c, comm, s)

    def check(self, x: dict[str, Any], op: str) -> None:
        """Queued on the stream after the op: wrong values counted on the GPU."""
        exp = x[op]
        with self.torch.cuda.stream(self.stream):
            self.bad.add_((self.out[: exp.numel()] != exp).sum())

    def noticed(self) -> str | None:
        if not self.watch_board:
            return None
        with contextlib.suppress(OSError):
            for name in os.listdir(self.board):
                if name.startswith("err.") and name != f"err.rank{self.rank}":
                    return name
        return None

    def complete(self, comm: int, until: float) -> tuple[str, int]:
        """Wait for the op on the stream: ("ok", 0) | ("async", rc) | ("notice", 0) |
        ("timeout", 7)."""
        n = 0
        while time.time() < until:
            if self.stream.query():
                st = self.lib.async_error(comm)
                if st == 0:
                    return "ok", 0
                if st != self.N.NCCL_IN_PROGRESS:
                    return "async", st
            st = self.lib.async_error(comm)
            if st not in (0, self.N.NCCL_IN_PROGRESS):
                return "async", st
            n += 1
            if n % 20 == 0 and self.noticed():
                return "notice", 0
            time.sleep(0.0002)
        return "timeout", 7

    def step(self, comm: int, x: dict[str, Any], op: str, until: float) -> tuple[str, int]:
        rc = self.launch(comm, x, op)
        if rc not in (0, self.N.NCCL_IN_PROGRESS):
            return "launch", rc
        kind, rc = self.complete(comm, until)
        if kind == "ok":
            self.check(x, op)
        return kind, rc

    def flag_round(self, comm: int, stop_file: str, until: float) -> tuple[str, int, bool]:
        """All ranks agree on stopping: MAX all-reduce of rank 0's view of the stop file."""
        with self.torch.cuda.stream(self.stream):
            self.flag.fill_(1.0 if (self.rank == 0 and (self.d / stop_file).exists()) else 0.0)
        rc = self.lib.all_reduce(
            self.flag.data_ptr(), self.flag.data_ptr(), 1, comm, self.sptr, self.N.NCCL_MAX
        )
        if rc not in (0, self.N.NCCL_IN_PROGRESS):
            return "launch", rc, False
        kind, rc = self.complete(comm, until)
        if kind != "ok":
            return kind, rc, False
        return "ok", 0, bool(self.flag.item() > 0)

    def rounds(
        self, comm: int, n: int, r: int, phase: str, stop_file: str, limit_s: float
    ) -> dict[str, Any]:
        """Checked steps in rounds of --round steps until the agreed stop, an error or a
        notice: {"end": "stop"|"async"|"launch"|"notice"|"timeout", ...}."""
        x = self.expected(n, r)
        t_limit = time.time() + limit_s
        i = 0
        hang = float(self.cfg["step_bound_s"])
        while time.time() < t_limit:
            steps = []
            for k in range(int(self.cfg["round"])):
                op = OPS[(i + k) % len(OPS)]
                t0 = time.time()
                kind, rc = self.step(comm, x, op, min(t0 + hang, t_limit + hang))
                if kind != "ok":
                    _emit({"type": "steps", "phase": phase, "s": steps})
                    last = self.lib.last_error(comm)[:300]
                    return {"end": kind, "rc": rc, "op": op, "steps": i + k, "last": last}
                steps.append((round(time.time(), 4), round(time.time() - t0, 5), op))
            i += len(steps)
            kind, rc, stop = self.flag_round(comm, stop_file, time.time() + hang)
            badv = int(self.bad.item()) if kind == "ok" else None  # stream idle: no block
            _emit({"type": "steps", "phase": phase, "s": steps, "bad": badv})
            if kind != "ok":
                return {"end": kind, "rc": rc, "op": "flag", "steps": i}
            if stop:
                return {"end": "stop", "steps": i, "bad": badv}
        return {"end": "limit", "steps": i}

    # -- the cycle

    def run(self) -> None:
        N, lib = self.N, self.lib
        r = self.rank
        self.board.mkdir(exist_ok=True)
        comm, init_s = self.init_comm("a", NRANKS, r)
        for op in OPS:  # connections for every op
            kind, rc = self.step(comm, self.expected(NRANKS, r), op, time.time() + 60)
            if kind != "ok":
                raise Failed(f"warm-up {op}: {kind}", rc=rc, name=N.result_name(rc))
        self.stream.synchronize()
        _emit(
            {
                "type": "ready",
                "rank": r,
                "nccl": lib.version(),
                "lib": lib.path,
                "init_s": init_s,
                "revoke": lib.has_revoke,
                "shrink": lib.has_shrink,
                "bad": int(self.bad.item()),
            }
        )
        # phase 1: faults are the parent's business; the job must not notice them
        res = self.rounds(comm, NRANKS, r, "p1", "stop.p1", float(self.cfg["phase_limit_s"]))
        _emit({"type": "p1_end", **res})
        if res["end"] != "stop":
            raise Failed("phase 1 did not end cleanly", **res)
        if self.cfg.get("only_p1"):
            okd, rcd, sd = _bounded(lambda: lib.destroy(comm), self.bound)
            _emit({"type": "done", "destroy": [okd, rcd, sd], "bad": int(self.bad.item())})
            return
        # phase 2: run until the fault shows (own error or a notice), bounded
        self.watch_board = True
        res = self.rounds(comm, NRANKS, r, "p2a", "stop.never", float(self.cfg["phase_limit_s"]))
        t_det = time.time()
        self.watch_board = False
        fault = self.read_fault()
        det = {
            "type": "detect",
            "via": {"async": "ncclCommGetAsyncError", "notice": "notice"}.get(
                res["end"], res["end"]
            ),
            "rc": res.get("rc"),
            "name": N.result_name(res["rc"]) if res["end"] in ("async", "launch") else None,
            "after_fault_s": t_det - fault["t"] if fault else None,
            "op": res.get("op"),
            "notice": self.noticed() if res["end"] == "notice" else None,
            "last": lib.last_error(comm)[:300],
        }
        # the board stands for the job's store: a rank whose node lost every NIC cannot reach it
        dead = fault is not None and r in fault.get("exclude", [])
        if res["end"] in ("async", "launch") and not dead:
            _write_atomic(self.board / f"err.rank{r}", json.dumps({"t": t_det, "rc": res["rc"]}))
        _emit(det)
        if res["end"] not in ("async", "launch", "notice"):
            raise Failed("phase 2: no error and no notice", **res)
        if fault is None:
            raise Failed("phase 2: an error before the fault", **det)
        exclude = [int(e) for e in fault["exclude"]]
        if r in exclude:
            self.dead_rank(comm)
            return
        self.survivor(comm, exclude)

    def read_fault(self) -> dict[str, Any] | None:
        f = self.d / "fault"
        if not _wait_file(f, 5.0):
            return None
        try:
            obj = json.loads(f.read_text())
        except (OSError, ValueError):
            return None
        return obj if isinstance(obj, dict) else None

    def dead_rank(self, comm: int) -> None:
        """Rank 3: abort (bounded), wait for the heal, come back into a new full communicator."""
        lib = self.lib
        ok, rc, s = _bounded(lambda: lib.abort(comm), self.bound)
        _emit(
            {"type": "abort", "returned": ok, "rc": rc, "s": s, "stream_idle": self.stream.query()}
        )
        if not ok:
            raise Failed("ncclCommAbort did not return", s=s)
        if not _wait_file(self.d / "uid.c", float(self.cfg["phase_limit_s"]) + 60):
            raise Failed("no unique id for the new full communicator")
        self.rejoin(None)

    def survivor(self, comm: int, exclude: list[int]) -> None:
        lib, N = self.lib, self.N
        r = self.rank
        revoke = self.cfg["recovery"] == "revoke" and lib.has_revoke
        t0 = time.time()
        rv: dict[str, Any] = {"type": "revoke", "used": revoke}
        if revoke:
            ok, rc, s = _bounded(lambda: lib.revoke(comm), self.bound)
            st = self.wait_ready(comm, self.bound) if ok else -1
            rv.update(
                {
                    "returned": ok,
                    "rc": rc,
                    "call_s": s,
                    "quiesced_s": time.time() - t0,
                    "state": st,
                    "stream_idle": bool(self.stream.query()),
                }
            )
            _emit(rv)
            if not ok:
                raise Failed("ncclCommRevoke did not return", s=s)
        survivors = [x for x in range(NRANKS) if x not in exclude]
        mine = lib.async_error(comm)
        t1 = time.time()
        states = self.agree(survivors, mine)
        _emit({"type": "agree", "states": states, "mine": mine, "s": time.time() - t1})
        flags = N.NCCL_SHRINK_DEFAULT if revoke else N.NCCL_SHRINK_ABORT
        new = 0
        if len(states) == len(survivors) and all(v == 0 for v in states.values()):
            t1 = time.time()
            new, sh = self.shrink(comm, exclude, flags)
            sh["since_detect_s"] = time.time() - t0
            sh["ready_s"] = time.time() - t1
            _emit(sh)
            if not new:
                raise Failed("ncclCommShrink failed", **sh)
            how = "shrink"
        else:
            if mine != 0:  # what NCCL answers: the parent's sticky error (no shrink job starts)
                conf = lib.config(blocking=0)
                _rc, _h = lib.shrink(comm, exclude, conf, flags)
                self.keep += [conf, _h]
                _emit(
                    {
                        "type": "shrink_refused",
                        "rc": _rc,
                        "name": N.result_name(_rc),
                        "last": lib.last_error(comm)[:300],
                    }
                )
            how = "re-create"
        if how == "re-create":
            # a new communicator among the survivors (fresh unique id from the first survivor),
            # made before the parent goes, as ncclCommGrow/Shrink keep the parent until done
            n = NRANKS - len(exclude)
            t1 = time.time()
            new, init_s = self.init_comm("b", n, survivors.index(r))
            _emit(
                {
                    "type": "recreate",
                    "init_s": init_s,
                    "ready_s": time.time() - t1,
                    "since_detect_s": time.time() - t0,
                }
            )
        # ncclCommDestroy returns a parent's sticky error without freeing anything: abort then
        fn = lib.destroy if lib.async_error(comm) == 0 else lib.abort
        okd, rcd, sd = _bounded(lambda: fn(comm), self.bound)
        _emit(
            {
                "type": "destroy_parent",
                "returned": okd,
                "rc": rcd,
                "s": sd,
                "call": "ncclCommDestroy" if fn == lib.destroy else "ncclCommAbort",
            }
        )
        n = NRANKS - len(exclude)
        nr = r - sum(1 for e in exclude if e < r)  # shrink renumbers contiguously
        res = self.rounds(new, n, nr, "p2", "stop.p2", float(self.cfg["phase_limit_s"]))
        _emit({"type": "p2_end", **res})
        if res["end"] != "stop":
            raise Failed("phase 2 (shrunk) did not end cleanly", **res)
        self.rejoin(new)

    def shrink(self, comm: int, exclude: list[int], flags: int) -> tuple[int, dict[str, Any]]:
        """ncclCommShrink with a non-blocking config, waited for (bounded): (comm or 0, report)."""
        lib, N = self.lib, self.N
        conf = lib.config(blocking=0)
        self.keep.append(conf)
        t1 = time.time()
        ok, val, s = _bounded(lambda: lib.shrink(comm, exclude, conf, flags), self.bound)
        rc, holder = val if ok and val else (-1, None)
        self.keep.append(holder)  # NCCL writes the new comm here from its own thread
        st = rc
        new = 0
        if ok and rc in (0, N.NCCL_IN_PROGRESS) and holder is not None:
            t_end = time.time() + float(self.cfg["init_bound_s"])
            while time.time() < t_end:
                pst = lib.async_error(comm)
                if holder.value and pst != N.NCCL_IN_PROGRESS:
                    break
                time.sleep(0.001)
            new = int(holder.value or 0)
            st = self.wait_ready(new, 1.0) if new else N.NCCL_IN_PROGRESS
        rep = {
            "type": "shrink",
            "flags": "NCCL_SHRINK_ABORT" if flags == N.NCCL_SHRINK_ABORT else "NCCL_SHRINK_DEFAULT",
            "returned": ok,
            "rc": rc,
            "name_rc": N.result_name(rc) if isinstance(rc, int) and rc >= 0 else None,
            "state": st,
            "name": N.result_name(st) if isinstance(st, int) and st >= 0 else None,
            "call_s": s,
            "this_s": time.time() - t1,
            "last": (lib.last_error(new) if new else lib.last_error(comm))[:300] if st != 0 else "",
        }
        return (new if ok and st == 0 else 0), rep

    def agree(self, survivors: list[int], mine: int) -> dict[int, int]:
        """Every survivor posts its parent's state on the board and reads the others' (bounded):
        the job's agreement step (NCCL refuses to shrink a parent whose proxy saw an error)."""
        _write_atomic(self.board / f"state.rank{self.rank}", str(mine))
        t_end = time.time() + float(self.cfg["call_bound_s"])
        states: dict[int, int] = {}
        while time.time() < t_end:
            states = {}
            for r in survivors:
                with contextlib.suppress(OSError, ValueError):
                    states[r] = int((self.board / f"state.rank{r}").read_text())
            if len(states) == len(survivors):
                break
            time.sleep(0.005)
        return states

    def rejoin(self, shrunk: int | None) -> None:
        """Phase 3: a new full-size communicator (fresh unique id from rank 0); the shrunk one
        is destroyed once the new one is ready (the order of ncclCommGrow)."""
        lib = self.lib
        t0 = time.time()
        comm, init_s = self.init_comm("c", NRANKS, self.rank)
        _emit({"type": "grow", "init_s": init_s, "wait_s": time.time() - t0 - init_s})
        if shrunk is not None:
            okd, rcd, sd = _bounded(lambda: lib.destroy(shrunk), self.bound)
            _emit({"type": "destroy_shrunk", "returned": okd, "rc": rcd, "s": sd})
        res = self.rounds(
            comm, NRANKS, self.rank, "p3", "stop.p3", float(self.cfg["phase_limit_s"])
        )
        _emit({"type": "p3_end", **res})
        if res["end"] != "stop":
            raise Failed("phase 3 did not end cleanly", **res)
        okd, rcd, sd = _bounded(lambda: lib.destroy(comm), self.bound)
        _emit({"type": "done", "destroy": [okd, rcd, sd], "bad": int(self.bad.item())})


def worker_main(cfg: dict[str, Any]) -> int:
    try:
        Worker(cfg).run()
    except Failed as e:
        _emit({"type": "fatal", **e.info})
        _exit(4)
    except Exception as e:  # report, never hang in teardown
        _emit({"type": "fatal", "what": f"{type(e).__name__}: {e}"})
        _exit(5)
    _exit(0)
    return 0


def fake_main(cfg: dict[str, Any]) -> int:
    """CPU stand-in for a rank (orchestration, fabric and agents without a GPU): the same
    events, no NCCL; stop files read directly, the fault seen from the node's carrier."""
    d, r = Path(cfg["dir"]), int(cfg["rank"])
    (d / "board").mkdir(exist_ok=True)

    def loop(phase: str, stop: str, until_fault: bool = False) -> str:
        t_end = time.time() + float(cfg["phase_limit_s"])
        while time.time() < t_end:
            steps = []
            for k in range(8):
                time.sleep(0.01)
                steps.append((time.time(), 0.01, OPS[k % 4]))
            _emit({"type": "steps", "phase": phase, "s": steps, "bad": 0})
            if (d / stop).exists():
                return "stop"
            if until_fault and (d / "fault").exists():
                state = Path("/sys/class/net/nic0/operstate")
                with contextlib.suppress(OSError):
                    if state.read_text().strip() != "up":
                        return "async"
                if r != DEAD and time.time() > json.loads((d / "fault").read_text())["t"] + 1.2:
                    return "async" if r in (0, 2) else "notice"
        return "limit"

    _emit({"type": "ready", "rank": r, "nccl": 0, "init_s": 0.0, "revoke": True, "shrink": True})
    _emit({"type": "p1_end", "end": loop("p1", "stop.p1")})
    if cfg.get("only_p1"):
        _emit({"type": "done", "bad": 0})
        return 0
    end = loop("p2a", "stop.never", until_fault=True)
    tf = json.loads((d / "fault").read_text())["t"]
    _emit({"type": "detect", "via": end, "after_fault_s": time.time() - tf})
    if r == DEAD:
        _emit({"type": "abort", "returned": True, "rc": 0, "s": 0.1})
        _wait_file(d / "stop.p2", 120)
    else:
        _emit(
            {"type": "revoke", "used": True, "returned": True, "call_s": 0.001, "quiesced_s": 0.5}
        )
        _emit({"type": "shrink", "returned": True, "state": 0, "ready_s": 0.5, "flags": "x"})
        _emit({"type": "p2_end", "end": loop("p2", "stop.p2")})
    _emit({"type": "grow", "init_s": 0.3, "wait_s": 0.0})
    _emit({"type": "p3_end", "end": loop("p3", "stop.p3")})
    _emit({"type": "done", "bad": 0})
    return 0


# ---------------------------------------------------------------------------------------------
# Parent


class Cycle:
    """One run of the cycle (one variant): the ranks, the fault schedule, the measurements."""

    def __init__(self, args: argparse.Namespace, fab: Any, variant: str, tmp: Path, idx: int):
        self.args, self.fab, self.variant = args, fab, variant
        self.d = tmp / f"{variant}-{idx}"
        self.d.mkdir(parents=True)
        (self.d / "board").mkdir()
        self.rep: dict[str, Any] = {"variant": variant, "run": idx, "phases": {}}
        self.events: list[tuple[float, str]] = []
        self.agents: Any = None
        self.ranks: Any = None

    def mark(self, label: str) -> float:
        t = time.time()
        self.events.append((t, label))
        if self.agents is not None:  # what each node's agent says of its NICs at this point
            self.rep.setdefault("agent_health", []).append(
                {"t": t, "at": label, "nics": self.agents.health()}
            )
        print(f"    [{self.variant}] {label}", flush=True)
        return t

    def touch(self, name: str, data: str = "") -> None:
        _write_atomic(self.d / name, data or repr(time.time()))

    def start(self) -> None:
        a = self.args
        transport = "socket" if self.variant == "socket" else "railhop"
        run_dirs = [self.d / f"run-node{r}" for r in range(NRANKS)]
        if self.variant == "agent":
            self.agents = _gpu.NodeAgents(
                self.fab, self.d / "agents", _common.REPO / "agent", sources=a.agent_sources
            )
            self.rep["agent_ready_s"] = self.agents.wait_ready(a.agent_ready_s)
            run_dirs = list(self.agents.run_dirs)
        cfg = {
            "dir": str(self.d),
            "size": a.size,
            "round": a.round,
            "recovery": a.recovery,
            "call_bound_s": a.call_bound,
            "init_bound_s": a.init_bound,
            "step_bound_s": a.step_bound if transport == "railhop" else a.socket_hang + 30,
            "uid_wait_s": a.init_bound + 30,
            "phase_limit_s": a.phase_limit,
            "only_p1": self.variant == "socket",
            "fake": a.fake,
        }
        railhop = {"RAILHOP_NICS": ",".join(f"{n}:{i}" for i, n in enumerate(_gpu.NICS))}
        if a.plugin_pin:
            # NCCL unloads an external net plugin when the process's last communicator goes
            # and cannot load it again ("Failed to initialize any NET plugin")
            railhop["NCCL_NET_PLUGIN_REF_COUNT"] = "1"
        envs = _gpu.rank_envs(
            a,
            transport,
            self.d,
            hostid="railhop-cycle-node",
            common={"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"},
            railhop=railhop,
            nranks=NRANKS,
            run_dirs=run_dirs,
        )
        for r, env in enumerate(envs):  # NCCL logs to stdout, which carries the JSON lines
            env["NCCL_DEBUG_FILE"] = str(self.d / f"nccl.rank{r}.log")
        self.ranks = _gpu.Ranks(self.fab, Path(__file__).resolve(), envs, cfg, self.d, "cycle")

    def all_have(self, kinds: tuple[str, ...], ranks: range | list[int] = range(NRANKS)) -> bool:
        return all(self.ranks.first(kinds, r) for r in ranks)

    def any_fatal(self) -> bool:
        return any(self.ranks.first(("fatal",), r) for r in range(NRANKS))

    def wait(self, cond: Callable[[], bool], timeout: float) -> bool:
        return bool(self.ranks.wait_for(lambda: cond() or self.any_fatal(), timeout)) and cond()

    def last_step_t(self, phase: str, r: int = 0) -> float | None:
        for x in reversed(list(self.ranks.lines[r])):
            if x.get("type") == "steps" and x.get("phase") == phase and x["s"]:
                return float(x["s"][-1][0])
        return None

    def hold(self, seconds: float, phase: str) -> bool:
        """Wait ``seconds`` while rank 0 keeps completing steps; False (hung) when none
        completed for the hang bound (railhop: --step-bound; socket: --socket-hang)."""
        bound = self.args.socket_hang if self.variant == "socket" else self.args.step_bound
        t_end = time.time() + seconds
        t_ref = time.time()
        while time.time() < t_end:
            last = self.last_step_t(phase)
            if time.time() - max(last or 0.0, t_ref) > bound:
                return False
            if self.any_fatal() or not self.ranks.alive():
                return True
            time.sleep(0.05)
        return True

    def run(self) -> dict[str, Any]:
        a, fab, rep = self.args, self.fab, self.rep
        t_start = time.time()
        try:
            self.start()
            if not self.wait(lambda: self.all_have(("ready",)), a.init_bound + 60):
                rep["error"] = "ranks not ready"
                return rep
            self.mark("all 4 ranks ready")
            self.phase1()
            if self.variant != "socket" and not rep.get("error"):
                self.phase2()
                if not rep.get("error"):
                    self.phase3()
        finally:
            if rep.get("error"):
                self.mark(f"error: {rep['error']}")
            fab.heal_all()
            if self.ranks is not None:
                self.ranks.finish(10.0 if not rep.get("error") else 1.0)
            if self.agents is not None:
                rep["agent_rc"] = self.agents.stop()
            rep["wall_s"] = time.time() - t_start
            self.collect()
        return rep

    def phase1(self) -> None:
        a, fab = self.args, self.fab
        p: dict[str, Any] = {}
        self.rep["phases"]["1"] = p
        t0 = time.time()
        if not self.hold(a.healthy, "p1"):
            p["hung"] = "before the faults"
        p["t_carrier"] = self.mark("phase 1: carrier loss node 1 nic1")
        fab.carrier_down(1, 1)
        ok = self.hold(a.gap, "p1")
        p["t_blackhole"] = self.mark("phase 1: + blackhole node 2 nic2 (both held)")
        fab.blackhole(2, 2)
        # Socket: hold the faults long enough to call a stall a hang
        held = a.fault_hold if self.variant != "socket" else max(a.fault_hold, a.socket_hang + 2)
        ok = ok and self.hold(held, "p1")
        if not ok:
            last = self.last_step_t("p1")
            p["hung"] = True
            p["silent_s"] = time.time() - (last or p["t_carrier"])
            p["waited_s"] = time.time() - p["t_carrier"]
            self.mark(f"phase 1: no step for {p['silent_s']:.1f} s: hung, killing")
            self.rep["error"] = "phase 1 hung"
            return
        p["t_heal"] = self.mark("phase 1: heal")
        fab.heal(1, 1)
        fab.heal(2, 2)
        self.hold(a.after_heal, "p1")
        self.touch("stop.p1")
        got = self.wait(lambda: self.all_have(("p1_end",)), a.step_bound * 2 + 10)
        p["s"] = time.time() - t0
        if not got:
            self.rep["error"] = "phase 1 did not end"
        if self.variant == "socket" and got:
            self.wait(lambda: self.all_have(("done",)), a.call_bound + 5)

    def phase2(self) -> None:
        a, fab = self.args, self.fab
        p: dict[str, Any] = {}
        self.rep["phases"]["2"] = p
        t0 = time.time()
        self.wait(lambda: bool(self.last_step_t("p2a")), 30)
        time.sleep(0.3)  # inside the step loop
        tf = time.time()
        for nic in range(4):
            fab.carrier_down(DEAD, nic)
        _write_atomic(self.d / "fault", json.dumps({"t": tf, "exclude": [DEAD]}))
        p["t_fault"] = tf
        self.mark(f"phase 2: carrier loss on all 4 NICs of node {DEAD}")
        surv = [r for r in range(NRANKS) if r != DEAD]
        if self.variant == "controller":  # the job learns of the node's loss outside NCCL
            time.sleep(max(0.0, tf + a.controller_delay - time.time()))
            _write_atomic(self.d / "board" / "err.controller", repr(time.time()))
            p["t_controller"] = time.time()
        got = self.wait(
            lambda: self.all_have(("shrink", "recreate"), surv), a.step_bound + a.init_bound + 30
        )
        if not got:
            self.rep["error"] = "phase 2: no shrink on every survivor"
            return
        self.mark("phase 2: every survivor has the 3-rank communicator")
        got = self.wait(lambda: all(self.last_step_t("p2", r) for r in surv), 30)
        if not got:
            self.rep["error"] = "phase 2: no step on the shrunk communicator"
            return
        p["t_resumed"] = max(float(self.last_step_t("p2", r) or 0) for r in surv)
        ok = self.hold(a.shrunk_hold, "p2")
        if not ok:
            self.rep["error"] = "phase 2: the shrunk communicator hung"
        p["s"] = time.time() - t0

    def phase3(self) -> None:
        a, fab = self.args, self.fab
        p: dict[str, Any] = {}
        self.rep["phases"]["3"] = p
        t0 = time.time()
        self.wait(lambda: bool(self.ranks.first(("abort",), DEAD)), a.call_bound + 5)
        p["t_heal"] = self.mark(f"phase 3: heal node {DEAD}")
        for nic in range(4):
            fab.heal(DEAD, nic)
        p["heal_call_s"] = time.time() - p["t_heal"]
        if self.agents is not None:
            # the recipe's grow step: once every node's agent publishes its NICs up again (its
            # flap damping holds a healed NIC down for a while, and the plugins follow the
            # table: a new connection over a NIC still published down is refused at once)
            def all_up() -> bool:
                h = self.agents.health()
                return all(n.split()[1:2] == ["up"] for nics in h.values() for n in nics)

            up = self.wait(all_up, a.agent_ready_s)
            p["agents_up_after_heal_s"] = time.time() - p["t_heal"] if up else None
            self.mark(
                "phase 3: every agent publishes its NICs up"
                if up
                else "phase 3: not every NIC published up within --agent-ready-s"
            )
        self.touch("stop.p2")
        got = self.wait(lambda: self.all_have(("grow",)), a.init_bound + a.step_bound + 30)
        if not got:
            self.rep["error"] = "phase 3: no new full communicator"
            return
        self.mark("phase 3: new 4-rank communicator ready")
        got = self.wait(lambda: all(self.last_step_t("p3", r) for r in range(NRANKS)), 30)
        if not got:
            self.rep["error"] = "phase 3: no step on the new communicator"
            return
        p["t_resumed"] = max(float(self.last_step_t("p3", r) or 0) for r in range(NRANKS))
        if not self.hold(a.full_hold, "p3"):
            self.rep["error"] = "phase 3 hung"
            return
        self.touch("stop.p3")
        if not self.wait(lambda: self.all_have(("done",)), a.step_bound * 2 + a.call_bound + 10):
            self.rep["error"] = "phase 3 did not finish"
        p["s"] = time.time() - t0

    def collect(self) -> None:
        """Per-phase numbers from the ranks' events."""
        rep, R = self.rep, self.ranks
        if R is None:
            return
        rep["rc"] = [p.returncode for p in R.procs]
        rep["fatal"] = {r: f for r in range(NRANKS) if (f := R.first(("fatal",), r))}
        ready = R.first(("ready",), 0) or {}
        rep["nccl"], rep["lib"] = ready.get("nccl"), ready.get("lib")
        rep["init_s"] = [(R.first(("ready",), r) or {}).get("init_s") for r in range(NRANKS)]
        bads = [x.get("bad") for r in range(NRANKS) for x in R.lines[r] if x.get("bad") is not None]
        rep["wrong_values"] = max(bads) if bads else None
        steps: dict[str, list[tuple[float, float, str]]] = {}
        for x in R.of("steps", 0):
            steps.setdefault(x["phase"], []).extend(tuple(s) for s in x["s"])
        rep["steps"] = {ph: len(v) for ph, v in steps.items()}
        ph = rep["phases"]
        if "1" in ph:
            p1 = ph["1"]
            s1 = steps.get("p1", [])
            windows = [
                ("healthy", 0.0, p1.get("t_carrier", 1e18)),
                ("carrier n1/nic1", p1.get("t_carrier", 1e18), p1.get("t_blackhole", 1e18)),
                ("+ blackhole n2/nic2", p1.get("t_blackhole", 1e18), p1.get("t_heal", 1e18)),
                ("healed", p1.get("t_heal", 1e18), 1e18),
            ]
            p1["windows"] = []
            s1 = sorted(s1)
            for label, w0, w1 in windows:
                dts = [dt for t, dt, _ in s1 if w0 <= t < w1]
                # the longest time between two completed steps (the agreement all-reduce
                # between rounds is in it, not in a step's own time)
                gaps = [b[0] - a[0] for a, b in itertools.pairwise(s1) if w0 <= b[0] < w1]
                p1["windows"].append(
                    {
                        "window": label,
                        "steps": len(dts),
                        "median_step_s": statistics.median(dts) if dts else None,
                        "max_step_s": max(dts) if dts else None,
                        "max_gap_s": max(gaps) if gaps else None,
                    }
                )
        if "2" in ph:
            p2 = ph["2"]
            tf = p2.get("t_fault", 0.0)
            p2["ranks"] = {}
            for r in range(NRANKS):
                e: dict[str, Any] = {}
                for kind in (
                    "detect",
                    "revoke",
                    "agree",
                    "shrink_refused",
                    "destroy_parent",
                    "recreate",
                    "abort",
                ):
                    x = R.first((kind,), r)
                    if x:
                        e[kind] = {k: v for k, v in x.items() if k not in ("_recv", "type")}
                tries = R.of("shrink", r)
                if tries:
                    e["shrink"] = {k: v for k, v in tries[-1].items() if k not in ("_recv", "type")}
                    e["shrink_tries"] = len(tries)
                if e:
                    p2["ranks"][r] = e
            shr = [
                (R.of("shrink", r) or R.of("recreate", r) or [None])[-1]
                for r in range(NRANKS)
                if r != DEAD
            ]
            if all(shr):
                p2["shrunk_ready_after_fault_s"] = max(x["t"] for x in shr if x) - tf
            if p2.get("t_resumed"):
                p2["resumed_after_fault_s"] = p2["t_resumed"] - tf
            p2["detect_s"] = {
                r: (R.first(("detect",), r) or {}).get("after_fault_s") for r in range(NRANKS)
            }
            p2["detect_via"] = {
                r: (R.first(("detect",), r) or {}).get("via") for r in range(NRANKS)
            }
            p2["steps_shrunk"] = len(steps.get("p2", []))
            how = {
                ("shrink" if R.of("shrink", r) else "re-create") for r in range(NRANKS) if r != DEAD
            }
            p2["how"] = ",".join(sorted(how))
        if "3" in ph:
            p3 = ph["3"]
            th = p3.get("t_heal", 0.0)
            gr = [R.first(("grow",), r) for r in range(NRANKS)]
            if all(gr):
                p3["full_ready_after_heal_s"] = max(x["t"] for x in gr if x) - th
                p3["init_s"] = [x["init_s"] for x in gr if x]
            if p3.get("t_resumed"):
                p3["resumed_after_heal_s"] = p3["t_resumed"] - th
            p3["destroy_shrunk"] = [
                (R.first(("destroy_shrunk",), r) or {}).get("s") for r in range(NRANKS)
            ]
            p3["steps_full"] = len(steps.get("p3", []))
        rep["done"] = all(R.first(("done",), r) for r in range(NRANKS))
        rep["events"] = {
            r: [
                {k: v for k, v in x.items() if k != "_recv"}
                for x in R.lines[r]
                if x.get("type") not in ("steps",)
            ]
            for r in range(NRANKS)
        }
        if self.agents is not None:
            self.traces_by_phase()

    def traces_by_phase(self) -> None:
        """The agents' spans, each assigned to the phase its start falls in."""
        ph = self.rep["phases"]
        bounds = [
            ("1", ph.get("1", {}).get("t_carrier", 0.0)),
            ("2", ph.get("2", {}).get("t_fault", 1e18)),
            ("3", ph.get("3", {}).get("t_heal", 1e18)),
        ]
        out: dict[str, list[dict[str, Any]]] = {"1": [], "2": [], "3": [], "before": []}
        for node in range(NRANKS):
            for sp in self.agents.spans(node):
                t = int(sp.get("startTimeUnixNano", 0)) / 1e9
                where = "before"
                for name, t0 in bounds:
                    if t >= t0:
                        where = name
                attrs = {
                    a["key"]: next(iter(a.get("value", {}).values()), None)
                    for a in sp.get("attributes", [])
                }
                out[where].append(
                    {
                        "node": node,
                        "name": sp.get("name"),
                        "start": t,
                        "dur_ms": (
                            int(sp.get("endTimeUnixNano", 0)) - int(sp.get("startTimeUnixNano", 0))
                        )
                        / 1e6,
                        "attrs": {k: v for k, v in attrs.items() if k.startswith("railhop.")},
                    }
                )
        self.rep["spans"] = {k: sorted(v, key=lambda s: s["start"]) for k, v in out.items()}
        self.rep["trace_files"] = [str(p) for p in self.agents.traces]


def fmt(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def summarize(results: dict[str, Any]) -> tuple[list[str], bool]:
    lines, ok = [], True
    for rep in results["runs"]:
        v, i = rep["variant"], rep["run"]
        head = f"[{v} #{i}]"
        ph = rep.get("phases", {})
        if v == "socket":
            p1 = ph.get("1", {})
            if p1.get("hung"):
                lines.append(
                    f"{head} phase 1: no step for {p1['silent_s']:.1f} s after the faults "
                    f"(waited {p1['waited_s']:.1f} s from the carrier loss): hung, killed"
                )
            else:
                lines.append(f"{head} phase 1: {p1.get('windows')} error={rep.get('error')}")
            continue
        good = not rep.get("error") and rep.get("done") and rep.get("wrong_values") == 0
        if rep.get("error"):
            lines.append(f"{head} ERROR: {rep['error']}; fatal: {rep.get('fatal')}")
        p1 = ph.get("1", {})
        for w in p1.get("windows", []):
            lines.append(
                f"{head} phase 1 {w['window']:<22} steps {w['steps']:>5}  median "
                f"{fmt(w['median_step_s'], '.4f')} s  max {fmt(w['max_step_s'], '.3f')} s  "
                f"longest gap {fmt(w.get('max_gap_s'), '.3f')} s"
            )
        p2 = ph.get("2", {})
        if p2:
            det = {int(k): v for k, v in p2.get("detect_s", {}).items()}  # JSON: str keys
            via = {int(k): v for k, v in p2.get("detect_via", {}).items()}
            lines.append(
                f"{head} phase 2 detection after the fault: "
                + ", ".join(f"r{r} {fmt(det.get(r))} s ({via.get(r)})" for r in range(NRANKS))
            )
            for r, e in sorted(p2.get("ranks", {}).items()):
                parts = []
                if "revoke" in e and e["revoke"].get("used"):
                    rv = e["revoke"]
                    parts.append(
                        f"revoke call {fmt(rv.get('call_s'), '.3f')} s quiesced "
                        f"{fmt(rv.get('quiesced_s'), '.3f')} s"
                    )
                if "shrink" in e:
                    sh = e["shrink"]
                    parts.append(
                        f"shrink ({sh.get('flags')}, try {e.get('shrink_tries')}) {sh.get('name')} "
                        f"ready {fmt(sh.get('ready_s'), '.3f')} s"
                    )
                if "agree" in e:
                    parts.append(f"parent states {e['agree'].get('states')}")
                if "shrink_refused" in e:
                    parts.append(f"ncclCommShrink refused: {e['shrink_refused'].get('name')}")
                if "recreate" in e:
                    parts.append(
                        f"re-created 3-rank comm, init {fmt(e['recreate'].get('init_s'), '.3f')} s"
                    )
                if "destroy_parent" in e:
                    dp = e["destroy_parent"]
                    parts.append(
                        f"{dp.get('call', 'ncclCommDestroy')}(parent) {fmt(dp.get('s'), '.3f')} s"
                    )
                if "abort" in e:
                    ab = e["abort"]
                    parts.append(
                        f"abort returned={ab.get('returned')} in {fmt(ab.get('s'), '.3f')} s"
                    )
                lines.append(f"{head}   rank {r}: " + "; ".join(parts))
            lines.append(
                f"{head} phase 2 3-rank communicator ({p2.get('how')}) ready "
                f"{fmt(p2.get('shrunk_ready_after_fault_s'))} s after the fault, first "
                f"checked step done {fmt(p2.get('resumed_after_fault_s'))} s, "
                f"{p2.get('steps_shrunk')} checked steps with node {DEAD} down"
            )
            d = [x for r, x in det.items() if int(r) != DEAD]
            if not d or any(x is None or x > 2.0 for x in d):
                good = False
        p3 = ph.get("3", {})
        if p3:
            lines.append(
                f"{head} phase 3 new 4-rank communicator ready "
                f"{fmt(p3.get('full_ready_after_heal_s'))} s after the heal (init "
                f"{', '.join(fmt(x, '.3f') for x in p3.get('init_s') or [])} s), first step "
                f"{fmt(p3.get('resumed_after_heal_s'))} s, {p3.get('steps_full')} checked steps"
                + (
                    f" (agents published every NIC up {fmt(p3.get('agents_up_after_heal_s'))} s "
                    "after the heal; the grow waited for it)"
                    if "agents_up_after_heal_s" in p3
                    else ""
                )
            )
        lines.append(
            f"{head} wrong values {rep.get('wrong_values')}, completed {rep.get('done')}, "
            f"wall {fmt(rep.get('wall_s'), '.1f')} s, rc {rep.get('rc')}"
            + (f", agent rc {rep['agent_rc']}" if "agent_rc" in rep else "")
        )
        if "spans" in rep:
            cnt = {k: len(v) for k, v in rep["spans"].items()}
            lines.append(f"{head} agent spans by phase: {cnt}")
        ok = ok and bool(good)
    return lines, ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    _gpu.add_rank_options(ap)
    ap.set_defaults(gpus="0")  # rank r on --gpus[r % len]: one GPU can hold all four
    ap.add_argument("--variants", default="railhop,controller,agent,socket")
    ap.add_argument("--repeat", type=int, default=1, help="run the variants this many times")
    ap.add_argument(
        "--recovery",
        choices=("revoke", "abort"),
        default="revoke",
        help="revoke + NCCL_SHRINK_DEFAULT, or no revoke + NCCL_SHRINK_ABORT",
    )
    ap.add_argument("--size", type=_gpu.parse_size, default=2 * MiB, help="buffer per op")
    ap.add_argument("--rate-mbit", type=int, default=None, help="tbf per NIC (default: none)")
    ap.add_argument("--queue-ms", type=int, default=20, help="the tbf queue (default 20 ms)")
    ap.add_argument("--round", type=int, default=8, help="checked steps between stop checks")
    ap.add_argument("--healthy", type=float, default=1.5)
    ap.add_argument("--gap", type=float, default=1.5, help="carrier loss alone (s)")
    ap.add_argument("--fault-hold", type=float, default=3.0, help="both faults held together")
    ap.add_argument("--after-heal", type=float, default=1.5)
    ap.add_argument("--shrunk-hold", type=float, default=3.0, help="3-rank steps, node 3 down")
    ap.add_argument("--full-hold", type=float, default=3.0, help="4-rank steps after the grow")
    ap.add_argument("--step-bound", type=float, default=15.0, help="railhop: one step's bound")
    ap.add_argument("--socket-hang", type=float, default=20.0, help="socket: no step this long")
    ap.add_argument("--call-bound", type=float, default=15.0, help="abort/revoke/destroy bound")
    ap.add_argument("--init-bound", type=float, default=60.0)
    ap.add_argument("--phase-limit", type=float, default=120.0)
    ap.add_argument(
        "--controller-delay",
        type=float,
        default=0.3,
        help="controller variant: the job's notice of node 3's loss, after the fault",
    )
    ap.add_argument(
        "--no-plugin-pin",
        dest="plugin_pin",
        action="store_false",
        help="leave NCCL_NET_PLUGIN_REF_COUNT unset (re-init after the last "
        "communicator then fails in NCCL 2.28.9)",
    )
    ap.add_argument("--socket-runs", type=int, default=1, help="socket variant in the first N runs")
    ap.add_argument("--agent-sources", default="netlink,sysfs")
    ap.add_argument("--agent-ready-s", type=float, default=60.0)
    ap.add_argument("--out-dir", help="JSON, logs, traces (default $OUT)")
    ap.add_argument("--fake", action="store_true", help="CPU stand-in ranks (no GPU, no NCCL)")
    args = ap.parse_args()
    if args.worker:
        cfg = json.loads(args.worker)
        return fake_main(cfg) if cfg.get("fake") else worker_main(cfg)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if args.fake and not args.plugin:
        args.plugin = "/nonexistent/fake-plugin.so"  # only written into the ranks' environment
    need_plugin = any(v != "socket" for v in variants) and not args.fake
    if need_plugin and (not args.plugin or not Path(args.plugin).is_file()):
        ap.error("--plugin /abs/path/libnccl-net-railhop.so is required (an existing file)")
    if (why := _gpu.root_problem()) is not None:
        print(why, file=sys.stderr)
        return 2
    out_dir = Path(args.out_dir or os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu-cycle-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    _common.setup_import_path()
    from railhop_lab.fabric import Fabric, unique_prefix

    tv = _gpu.torch_for(args.fake, gpus=1)
    if tv is None:
        return 2
    print(
        f"railhop 4-rank fault-tolerance cycle | {_common.stamp()} | {_common.machine()} "
        f"| torch {tv}"
    )
    print(
        f"  variants {variants} x{args.repeat}, recovery {args.recovery}, {args.size / MiB:g} MiB",
        flush=True,
    )
    results: dict[str, Any] = {
        "date": _common.stamp(),
        "machine": _common.machine(),
        "torch": tv,
        "args": vars(args),
        "runs": [],
    }
    jpath = str(out_dir / "gpu_cycle.json")
    with (
        tempfile.TemporaryDirectory(prefix="railhop-cycle-") as tmpd,
        Fabric(
            nodes=NRANKS,
            nics=4,
            rate_mbit=args.rate_mbit,
            queue_ms=args.queue_ms,
            prefix=unique_prefix("rhcy"),
            mtu=args.mtu,
        ) as fab,
    ):
        tmp = Path(tmpd)
        logf = (out_dir / "gpu_cycle_logs.txt").open("w")
        for idx in range(1, args.repeat + 1):
            for v in variants:
                if v == "socket" and idx > args.socket_runs:
                    continue
                print(f"  {v} #{idx} ...", flush=True)
                cyc = Cycle(args, fab, v, tmp, idx)
                try:
                    rep = cyc.run()
                except Exception as e:  # report and go on
                    rep = cyc.rep
                    rep["error"] = f"{type(e).__name__}: {e}"
                    fab.heal_all()
                results["runs"].append(rep)
                _common.write_json(jpath, results)
                logf.write(f"######## {v} #{idx}\n")
                for p in sorted(cyc.d.rglob("*.log")):
                    text = p.read_text(errors="replace").splitlines()
                    logf.write(f"===== {p.name}\n")
                    logf.write("\n".join(text[-60:]) + "\n")
                    # the plugin's own lines in full (what `grep railhop` in a job log shows)
                    ours = [x for x in text[:-60] if "NET/railhop" in x and " via NET/" not in x]
                    if ours:
                        logf.write(f"===== {p.name}: earlier railhop lines\n")
                        logf.write("\n".join(ours) + "\n")
                logf.flush()
                if cyc.agents is not None:
                    with (out_dir / f"gpu_cycle_traces.{idx}.jsonl").open("w") as tf:
                        for tr in cyc.agents.traces:
                            with contextlib.suppress(OSError):
                                tf.write(tr.read_text())
        logf.close()
    lines, ok = summarize(results)
    print("\nsummary (every value checked on the GPU after every step):")
    for ln in lines:
        print("  " + ln)
    results["summary"] = lines
    results["ok"] = ok
    _common.write_json(jpath, results)
    print(f"\nrailhop verdict: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
