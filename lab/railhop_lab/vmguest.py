"""The command runner inside a lab guest (``vmlab``): runs command files, writes result files.

It runs under the guest's ``/usr/bin/python3`` (the host's root file system, shared read-only),
so it uses the standard library only and imports nothing from railhop.

Protocol, all inside the node's directory ``DIR`` (a host directory the guest mounts read-write;
every file is written to a temporary name and renamed, so a reader never sees half a file):

* ``DIR/ready`` (written once at start): ``{"pid": ..., "kernel": ...}``;
* ``DIR/cmd/<id>.json``: a job, ``{"argv": [...], "env": {...}, "cwd": ..., "timeout": s,
  "stdout": path or null, "stderr": path or null}`` (with a path the output goes to that file as
  it comes, else it is collected), or ``{"kill": "<id>"}`` (SIGKILL to that job's process group);
* ``DIR/res/<id>.json``: the job's end, ``{"rc": ..., "stdout": ..., "stderr": ...,
  "timed_out": bool, "error": str or null, "elapsed_s": ...}``; ``rc`` is the exit status,
  negative for a signal, null when the job could not start (``error`` says why);
* ``DIR/stop``: kill every job and exit (the guest then powers off).

Every job runs in its own process group with the timeout it was given (default 600 s).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

POLL_S = 0.05
DEFAULT_TIMEOUT_S = 600.0
OUTPUT_LIMIT = 1 << 20


def write_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Runner:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.cmd = root / "cmd"
        self.res = root / "res"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.lock = threading.Lock()

    def _kill(self, job_id: str) -> None:
        with self.lock:
            proc = self.procs.get(job_id)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def _run(self, job_id: str, job: dict[str, Any]) -> None:
        t0 = time.monotonic()
        result: dict[str, Any] = {"rc": None, "stdout": "", "stderr": "", "timed_out": False}
        result["error"] = None
        out_file = err_file = None
        try:
            env = dict(os.environ)
            env.update({str(k): str(v) for k, v in (job.get("env") or {}).items()})
            if job.get("stdout"):
                out_file = open(job["stdout"], "wb", buffering=0)  # noqa: SIM115
            if job.get("stderr"):
                err_file = open(job["stderr"], "wb", buffering=0)  # noqa: SIM115
            proc = subprocess.Popen(
                [str(a) for a in job["argv"]],
                env=env,
                cwd=job.get("cwd") or "/",
                stdin=subprocess.DEVNULL,
                stdout=out_file if out_file is not None else subprocess.PIPE,
                stderr=err_file if err_file is not None else subprocess.PIPE,
                start_new_session=True,
            )
            with self.lock:
                self.procs[job_id] = proc
            try:
                out, err = proc.communicate(timeout=float(job.get("timeout") or DEFAULT_TIMEOUT_S))
            except subprocess.TimeoutExpired:
                result["timed_out"] = True
                self._kill(job_id)
                out, err = proc.communicate()
            result["rc"] = proc.returncode
            result["stdout"] = (out or b"")[-OUTPUT_LIMIT:].decode(errors="replace")
            result["stderr"] = (err or b"")[-OUTPUT_LIMIT:].decode(errors="replace")
        except Exception as e:  # a job that cannot start is reported, never fatal to the runner
            result["error"] = f"{type(e).__name__}: {e}"
        finally:
            for f in (out_file, err_file):
                if f is not None:
                    f.close()
            with self.lock:
                self.procs.pop(job_id, None)
        result["elapsed_s"] = time.monotonic() - t0
        write_atomic(self.res / f"{job_id}.json", result)

    def _take(self, path: Path) -> None:
        job_id = path.stem
        try:
            job = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            write_atomic(self.res / f"{job_id}.json", {"rc": None, "error": f"bad job: {e}"})
            path.unlink(missing_ok=True)
            return
        path.unlink(missing_ok=True)
        if "kill" in job:
            self._kill(str(job["kill"]))
            write_atomic(self.res / f"{job_id}.json", {"rc": 0, "error": None})
            return
        threading.Thread(target=self._run, args=(job_id, job), daemon=True).start()

    def serve(self) -> int:
        self.cmd.mkdir(parents=True, exist_ok=True)
        self.res.mkdir(parents=True, exist_ok=True)
        write_atomic(self.root / "ready", {"pid": os.getpid(), "kernel": os.uname().release})
        while not (self.root / "stop").exists():
            for path in sorted(self.cmd.glob("*.json")):
                self._take(path)
            time.sleep(POLL_S)
        with self.lock:
            ids = list(self.procs)
        for job_id in ids:
            self._kill(job_id)
        return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: vmguest.py DIR", file=sys.stderr)
        return 2
    return Runner(Path(argv[1])).serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
