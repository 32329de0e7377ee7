"""Shared bits of the bench scripts: import path, root check, small numeric helpers."""

from __future__ import annotations

import glob
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def setup_import_path() -> None:
    """Make `import railhop` and `import railhop_lab` (source tree) and `import pyroute2` (a
    carried wheel) work."""
    try:
        import railhop  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO / "agent"))
    try:
        import railhop_lab  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO / "lab"))
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        # pyroute2 is pure Python: a wheel on sys.path imports as a zip
        wheels = sorted(glob.glob(str(REPO / ".whl" / "pyroute2-*.whl")))
        wheels += sorted(glob.glob(str(Path.cwd() / "pyroute2-*.whl")))
        if not wheels:
            sys.exit("pyroute2 is needed: pip install pyroute2 (or put its wheel in .whl/)")
        sys.path.insert(0, wheels[-1])


def need_root(what: str) -> None:
    if os.geteuid() != 0:
        sys.exit(f"{what} needs root: it creates network namespaces, veth pairs and tc qdiscs")


def mbit(bytes_per_s: float) -> float:
    return bytes_per_s * 8 / 1e6


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def machine() -> str:
    cpus = os.cpu_count() or 0
    return f"{platform.node()} ({platform.machine()}, {cpus} CPUs, Linux {platform.release()})"


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def write_json(path: str | None, obj: Any) -> None:
    if not path:
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)
    print(f"results written to {path}")


# ---------------------------------------------------------------------------------------------
# Real NCCL ranks on the emulated fabric (bench/gpu_cycle.py; the same settings as gpu_ft.py)

NICS = ("nic0", "nic1", "nic2", "nic3")
NO_MULTICAST = {  # NVLink multicast stays off on shared GPU hosts
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def nccl_env(
    rank: int,
    transport: str,
    *,
    plugin: str | None,
    run_dir: Path | None,
    hostid: str,
    gpu: str = "0",
    nccl_debug: str = "WARN",
    extra: Sequence[str] = (),
) -> dict[str, str]:
    """The environment of one rank in its own netns: NET transport forced (no P2P, no SHM, no
    NVLS), its own NCCL_HOSTID; ``transport`` "railhop" (the plugin over nic0..nic3, bootstrap
    on nic0) or "socket" (NCCL's Socket transport on the same four NICs, 4 threads x 4 sockets).
    ``extra``: K=V overrides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "RAILHOP_"))}
    env.update(NO_MULTICAST)
    env.update(
        {
            "NCCL_P2P_DISABLE": "1",
            "NCCL_SHM_DISABLE": "1",
            "NCCL_IB_DISABLE": "1",
            "NCCL_HOSTID": f"{hostid}{rank}",
            "NCCL_DEBUG": nccl_debug,
            "CUDA_VISIBLE_DEVICES": gpu,
            "PYTHONUNBUFFERED": "1",
        }
    )
    if transport == "railhop":
        if not plugin or run_dir is None:
            raise ValueError("railhop ranks need the plugin path and a run dir")
        run_dir.mkdir(parents=True, exist_ok=True)
        env.update(
            {
                "NCCL_NET_PLUGIN": str(Path(plugin).resolve()),
                "NCCL_NET": "railhop",
                "NCCL_SOCKET_IFNAME": "nic0",
                "RAILHOP_NICS": ",".join(f"{n}:{i}" for i, n in enumerate(NICS)),
                "RAILHOP_RUN_DIR": str(run_dir),
            }
        )
    elif transport == "socket":
        env.update(
            {
                "NCCL_NET": "Socket",
                "NCCL_NET_PLUGIN": "none",
                "NCCL_SOCKET_IFNAME": "nic",
                "NCCL_SOCKET_NTHREADS": "4",
                "NCCL_NSOCKS_PERTHREAD": "4",
            }
        )
    else:
        raise ValueError(f"unknown transport {transport!r}")
    for kv in extra:
        k, _, v = kv.partition("=")
        env[k] = v
    return env


class RankProcs:
    """Worker processes, one per node netns, each writing JSON lines on stdout (stderr to a log).
    Every wait is bounded; ``finish`` kills what is left (the whole process group)."""

    def __init__(
        self,
        fab: Any,
        argvs: Sequence[Sequence[str]],
        envs: Sequence[dict[str, str]],
        logs: Sequence[Path],
    ) -> None:
        import subprocess
        import threading

        self.n = len(argvs)
        self.lines: list[list[dict[str, Any]]] = [[] for _ in range(self.n)]
        self.logs = list(logs)
        self.t_exit: list[float | None] = [None] * self.n
        self.procs: list[Any] = []
        self.readers: list[threading.Thread] = []
        for r in range(self.n):
            with self.logs[r].open("w") as err:
                p = fab.popen(
                    r,
                    list(argvs[r]),
                    env=envs[r],
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                    bufsize=1,
                )
            self.procs.append(p)
            th = threading.Thread(target=self._read, args=(r,), daemon=True)
            th.start()
            self.readers.append(th)

    def _read(self, r: int) -> None:
        out = self.procs[r].stdout
        assert out is not None
        for line in out:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                obj["_recv"] = time.time()
                self.lines[r].append(obj)
        self.t_exit[r] = time.time()

    def of(self, kind: str, r: int) -> list[dict[str, Any]]:
        return [x for x in list(self.lines[r]) if x.get("type") == kind]

    def first(self, kinds: tuple[str, ...], r: int) -> dict[str, Any] | None:
        return next((x for x in list(self.lines[r]) if x.get("type") in kinds), None)

    def alive(self, r: int | None = None) -> bool:
        ps = self.procs if r is None else [self.procs[r]]
        return any(p.poll() is None for p in ps)

    def wait_for(self, cond: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return True
            time.sleep(0.02)
        return bool(cond())

    def finish(self, timeout: float) -> bool:
        ok = self.wait_for(lambda: not self.alive(), timeout)
        self.kill()
        for th in self.readers:
            th.join(5)
        return ok

    def kill(self) -> None:
        import contextlib
        import signal
        import subprocess

        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(5)

    def tail(self, r: int, n: int = 8) -> str:
        try:
            return "\n".join(self.logs[r].read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class NodeAgents:
    """`railhop agent` in every node's netns (its own run dir, which that node's ranks use
    through RAILHOP_RUN_DIR), OTLP/JSON traces to ``workdir/traces-node<n>.jsonl``."""

    def __init__(
        self, fab: Any, workdir: Path, sources: str = "netlink,sysfs", heartbeat_ms: int = 100
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.fab, self.workdir = fab, workdir
        self.procs: list[Any] = []
        self.logs: list[Path] = []
        self.run_dirs: list[Path] = []
        self.traces: list[Path] = []
        pypath = os.pathsep.join(
            [
                str(REPO / "agent"),
                *([os.environ["PYTHONPATH"]] if "PYTHONPATH" in os.environ else []),
            ]
        )
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
            argv += ["--plugin-nics", ",".join(f"{n}:{i}" for i, n in enumerate(NICS))]
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

    def alive(self) -> list[bool]:
        return [p.poll() is None for p in self.procs]

    def stop(self, timeout: float = 10.0) -> list[int | None]:
        """SIGTERM, then SIGKILL after ``timeout``; the exit codes."""
        import subprocess

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


def import_fabric() -> tuple[Any, Any]:
    """(Fabric, unique_prefix) from wherever the emulated fabric lives in this tree."""
    setup_import_path()
    try:
        from railhop_lab.fabric import Fabric, unique_prefix  # type: ignore[import-not-found]
    except ImportError:
        from railhop.fabric import Fabric, unique_prefix
    return Fabric, unique_prefix
