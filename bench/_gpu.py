"""What the GPU bench scripts (gpu_allreduce.py, gpu_ft.py, gpu_cycle.py) share: the checks a
GPU run needs, the NCCL environment of each rank per transport, the ranks as worker processes
inside the fabric's nodes (JSON lines on stdout; every wait bounded; always killed at the end),
and `railhop agent` in every node."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

MiB = 1 << 20
TRANSPORTS = ("railhop", "socket")


def parse_size(s: str) -> int:
    """``4M`` -> 4 MiB (K, M, G suffixes; a bare number is bytes)."""
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": MiB, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s.rstrip("KMG")) * mult)


def root_problem() -> str | None:
    if os.geteuid() != 0:
        return "needs root: it creates network namespaces, veth pairs and a bridge"
    return None


def write_atomic(p: Path, data: bytes | str) -> None:
    """Write ``p`` whole or not at all (a temp file renamed into place)."""
    tmp = p.with_name(p.name + f".tmp{os.getpid()}")
    if isinstance(data, str):
        tmp.write_text(data)
    else:
        tmp.write_bytes(data)
    os.replace(tmp, p)


def exit_now(code: int) -> None:
    """A worker's exit without torch/NCCL teardown (after a fault it may block)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def emit(obj: dict[str, Any]) -> None:
    """A worker's JSON line on stdout (timestamped), flushed at once."""
    obj.setdefault("t", time.time())
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def bounded(fn: Callable[[], Any], timeout: float) -> tuple[bool, Any, float]:
    """Run a blocking C call in a thread: (returned, value, seconds)."""
    box: list[Any] = []
    t0 = time.monotonic()
    th = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    th.start()
    th.join(timeout)
    return (not th.is_alive(), box[0] if box else None, time.monotonic() - t0)


def torch_problem(gpus: int = 2) -> tuple[str, str | None]:
    """(torch version, why a GPU run cannot go ahead or None)."""
    try:
        import torch

        n = torch.cuda.device_count()
        version = str(torch.__version__)
    except Exception as e:  # report, not crash
        return "?", f"torch with CUDA is needed: {e}"
    return version, (f"needs {gpus} GPUs, found {n}" if n < gpus else None)


def torch_for(fake: bool, gpus: int) -> str | None:
    """The torch version a run reports ("fake" for CPU stand-in ranks), or None after printing
    why a GPU run cannot go ahead."""
    if fake:
        return "fake"
    tv, why = torch_problem(gpus=gpus)
    if why is not None:
        print(why, file=sys.stderr)
        return None
    return tv


def init_process_group(cfg: Mapping[str, Any]) -> None:
    """In a worker: torch's NCCL process group of ``cfg["world"]`` ranks (default 2), rendezvous
    at the master's fabric address (``cfg``: rank, master, port, pg_timeout)."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group(
        "nccl",
        init_method=f"tcp://{cfg['master']}:{cfg['port']}",
        rank=int(cfg["rank"]),
        world_size=int(cfg.get("world", 2)),
        timeout=datetime.timedelta(seconds=float(cfg["pg_timeout"])),
    )


def add_rank_options(ap: argparse.ArgumentParser) -> None:
    """The options every GPU bench has: the plugin, the GPUs, the fabric's MTU, NCCL_DEBUG,
    extra environment, the hidden worker entry."""
    ap.add_argument("--plugin", help="absolute path of libnccl-net-railhop.so (required)")
    ap.add_argument("--gpus", default="0,1", help="GPU of rank 0,1 (default 0,1)")
    ap.add_argument("--mtu", type=int, default=9000, help="veth MTU (default 9000)")
    ap.add_argument("--nccl-debug", default="WARN")
    ap.add_argument("--env", action="append", default=[], help="extra K=V for both ranks")
    ap.add_argument("--worker", help=argparse.SUPPRESS)


def rank_envs(
    args: argparse.Namespace,
    transport: str,
    rundir: Path,
    *,
    hostid: str,
    common: Mapping[str, str],
    railhop: Mapping[str, str] = {},
    socket_threads: int = 4,
    socket_nsocks: int = 4,
    nranks: int = 2,
    run_dirs: Sequence[Path] | None = None,
) -> list[dict[str, str]]:
    """The environment of ranks 0..nranks-1 (``args`` from :func:`add_rank_options`): the NET
    transport forced (no P2P, SHM, NVLS, IB), a distinct NCCL_HOSTID per rank
    (``<hostid><rank>``), GPU ``--gpus[r % len]`` (several ranks may share one), then
    ``common``; for ``railhop`` the plugin (NCCL_NET=railhop, bootstrap on nic0, a run directory
    per node: ``run_dirs[r]`` or ``rundir/node<r>``) and ``railhop``; for ``socket`` NCCL's
    Socket transport on the same NICs (``nic`` prefix) with ``socket_threads`` x
    ``socket_nsocks``; last the ``--env K=V`` overrides. NCCL_* and RAILHOP_* of the caller's
    environment are dropped."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport {transport!r}: want one of {', '.join(TRANSPORTS)}")
    envs = []
    ranks_gpu = [g.strip() for g in args.gpus.split(",")]
    for r in range(nranks):
        rd = run_dirs[r] if run_dirs is not None else rundir / f"node{r}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "RAILHOP_"))}
        env.update(
            {
                "NCCL_P2P_DISABLE": "1",
                "NCCL_SHM_DISABLE": "1",
                "NCCL_NVLS_ENABLE": "0",
                "NCCL_IB_DISABLE": "1",
                "NCCL_HOSTID": f"{hostid}{r}",
                "NCCL_DEBUG": args.nccl_debug,
                "CUDA_VISIBLE_DEVICES": ranks_gpu[r % len(ranks_gpu)],
                "PYTHONUNBUFFERED": "1",
                **common,
            }
        )
        if transport == "railhop":
            env.update(
                {
                    "NCCL_NET_PLUGIN": str(Path(args.plugin).resolve()),
                    "NCCL_NET": "railhop",
                    "NCCL_SOCKET_IFNAME": "nic0",
                    "RAILHOP_RUN_DIR": str(rd),
                    **railhop,
                }
            )
            rd.mkdir(parents=True, exist_ok=True)
        else:
            env.update(
                {
                    "NCCL_NET": "Socket",
                    "NCCL_NET_PLUGIN": "none",
                    "NCCL_SOCKET_IFNAME": "nic",
                    "NCCL_SOCKET_NTHREADS": str(socket_threads),
                    "NCCL_NSOCKS_PERTHREAD": str(socket_nsocks),
                }
            )
        for kv in args.env:
            k, _, v = kv.partition("=")
            env[k] = v
        envs.append(env)
    return envs


class Ranks:
    """The worker processes of one run (one per rank, ``len(envs)`` of them): ``python <script>
    --worker <cfg as JSON>`` in fabric node r (rank r), stdout read as JSON lines (each stamped
    ``_recv``), stderr to a log per rank. Every wait is bounded; :meth:`finish` always kills
    what is left."""

    def __init__(
        self,
        fab: Any,
        script: Path,
        envs: list[dict[str, str]],
        cfg: dict[str, Any],
        logdir: Path,
        name: str,
    ) -> None:
        n = len(envs)
        self.lines: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        self.procs: list[subprocess.Popen[str]] = []
        self.logs = [logdir / f"{name}.rank{r}.log" for r in range(n)]
        self.t_start = time.time()
        self.t_exit: list[float | None] = [None] * n
        self.readers = []
        for r in range(n):
            argv = [sys.executable, str(script), "--worker", json.dumps({**cfg, "rank": r})]
            with self.logs[r].open("w") as err:
                p = fab.popen(
                    r, argv, env=envs[r], stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1
                )
            self.procs.append(p)
            th = threading.Thread(target=self._read, args=(r,), daemon=True)
            th.start()
            self.readers.append(th)

    def _read(self, r: int) -> None:
        out = self.procs[r].stdout
        assert out is not None
        for line in out:
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                obj["_recv"] = time.time()
                self.lines[r].append(obj)
        self.t_exit[r] = time.time()

    def of(self, kind: str, r: int = 0) -> list[dict[str, Any]]:
        return [x for x in list(self.lines[r]) if x.get("type") == kind]

    def first(self, kinds: tuple[str, ...], r: int) -> dict[str, Any] | None:
        return next((x for x in list(self.lines[r]) if x.get("type") in kinds), None)

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def first_all(self, kinds: tuple[str, ...], ranks: Sequence[int] | None = None) -> bool:
        """Every rank (of ``ranks``) has emitted one of ``kinds``."""
        rs = range(len(self.procs)) if ranks is None else ranks
        return all(self.first(kinds, r) for r in rs)

    def wait_for(self, cond: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return True
            time.sleep(0.02)
        return cond()

    def finish(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for both to exit (True if they did), then kill what is left
        and collect the output."""
        deadline = time.monotonic() + timeout
        ok = True
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                ok = False
        self.kill()
        for th in self.readers:
            th.join(5)
        return ok

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(5)

    def tail(self, r: int, n: int = 12) -> str:
        try:
            return "\n".join(self.logs[r].read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


NICS = ("nic0", "nic1", "nic2", "nic3")  # the fabric's NIC names, RAILHOP_NICS order


class NodeAgents:
    """`railhop agent` (through its CLI) in every node's netns, each with its own run dir (which
    that node's ranks use through RAILHOP_RUN_DIR) and OTLP/JSON traces in
    ``workdir/traces-node<n>.jsonl``; no OTEL exporter. SIGTERM at :meth:`stop`, bounded."""

    def __init__(
        self,
        fab: Any,
        workdir: Path,
        agent_path: Path,
        sources: str = "netlink,sysfs",
        heartbeat_ms: int = 100,
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.run_dirs: list[Path] = []
        self.traces: list[Path] = []
        extra = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
        pypath = os.pathsep.join([str(agent_path), *extra])
        plugin_nics = ",".join(f"{n}:{i}" for i, n in enumerate(NICS))
        for node in range(fab.nodes):
            rd = workdir / f"run-node{node}"
            rd.mkdir(parents=True, exist_ok=True)
            tr = workdir / f"traces-node{node}.jsonl"
            log = workdir / f"agent{node}.log"
            env = {
                **os.environ,
                "PYTHONPATH": pypath,
                "OTEL_TRACES_EXPORTER": "none",
                "OTEL_RESOURCE_ATTRIBUTES": f"railhop.node=node{node}",
            }
            argv = [sys.executable, "-m", "railhop", "agent", "--run-dir", str(rd)]
            argv += ["--nic", ",".join(NICS), "--sources", sources, "--no-traces"]
            argv += ["--trace-file", str(tr), "--heartbeat-ms", str(heartbeat_ms)]
            argv += ["--plugin-nics", plugin_nics]
            with log.open("w") as err:
                self.procs.append(fab.popen(node, argv, env, stderr=err))
            self.logs.append(log)
            self.run_dirs.append(rd)
            self.traces.append(tr)

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Until every node's health table exists (bounded); RuntimeError with the log tail."""
        t0 = time.monotonic()
        for node, (p, log) in enumerate(zip(self.procs, self.logs, strict=True)):
            while not (self.run_dirs[node] / "health.tbl").exists():
                if p.poll() is not None:
                    raise RuntimeError(f"agent {node} exited: {log.read_text()[-2000:]}")
                if time.monotonic() - t0 > timeout:
                    raise RuntimeError(f"agent {node} not ready: {log.read_text()[-2000:]}")
                time.sleep(0.05)
        return time.monotonic() - t0

    def health(self) -> dict[int, list[str]]:
        """Each node's NICs as its agent publishes them: "nic1 down (lane_timeout)"."""
        from railhop.control.table import read_table

        out: dict[int, list[str]] = {}
        for node, rd in enumerate(self.run_dirs):
            try:
                snap = read_table(rd / "health.tbl")
            except Exception as e:  # a table being rewritten, or gone
                out[node] = [f"unreadable: {e}"]
                continue
            out[node] = [
                f"{n.ifname} {n.state.name.lower()} ({n.reason.name.lower()})" for n in snap.nics
            ]
        return out

    def stop(self, timeout: float = 10.0) -> list[int | None]:
        """SIGTERM, then SIGKILL after ``timeout``; the exit codes."""
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        return [p.returncode for p in self.procs]

    def spans(self, node: int) -> list[dict[str, Any]]:
        """The spans of node ``node``'s trace file (OTLP/JSON lines), flattened."""
        out: list[dict[str, Any]] = []
        try:
            text = self.traces[node].read_text()
        except OSError:
            return out
        for line in text.splitlines():
            try:
                req = json.loads(line)
            except ValueError:
                continue
            for rs in req.get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    out.extend(ss.get("spans", []))
        return out
