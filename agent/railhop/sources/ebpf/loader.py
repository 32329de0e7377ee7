"""Start-up of an eBPF source, before anything is loaded in this process: the checks every
source shares (privilege -> bcc importable -> kernel headers -> tracefs, mounted when missing ->
BTF), cached per process, and the trial child that compiles, loads and attaches each hook variant
of a :func:`railhop.sources.hooks.plan` (fentry first; a crash costs only the child)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from railhop import paths
from railhop.sources import btf as btfmod
from railhop.sources import hooks as H
from railhop.sources import kernel
from railhop.sources.base import Reason, SourceError, env_seconds
from railhop.sources.bpftrial import TOGETHER

TIMEOUT_ENV = "RAILHOP_EBPF_TIMEOUT_S"
START_TIMEOUT_S = 180.0  # one eBPF source's start (trial children + load), on a busy node
TRIAL_SHARE = 2 / 3  # of the start's bound, for its trial children (120 s of 180 s)


def start_timeout_s(environ: Mapping[str, str] | None = None) -> float:
    """The bound on one eBPF source's start: ``RAILHOP_EBPF_TIMEOUT_S`` (seconds) where set,
    for nodes whose bcc compiles are slow (an emulated CPU takes about 95 s per program), else
    ``START_TIMEOUT_S``. A value that is not a positive number is an error that says so."""
    return env_seconds(TIMEOUT_ENV, START_TIMEOUT_S, environ)


def trial_timeout_s(environ: Mapping[str, str] | None = None) -> float:
    """The trial children's share of :func:`start_timeout_s`."""
    return start_timeout_s(environ) * TRIAL_SHARE


class EbpfError(SourceError):
    """Loading or running a BPF program failed."""


@dataclass(frozen=True, slots=True)
class Precheck:
    """Result of the checks every eBPF source shares (cached per process)."""

    reason: Reason
    detail: str
    env: H.KernelEnv | None


_PRECHECK: dict[str, Precheck] = {}
_PRECHECK_LOCK = threading.Lock()


def precheck(root: str = "/", refresh: bool = False) -> Precheck:
    """Privilege, bcc, headers, tracefs and BTF, checked once per process and root."""
    with _PRECHECK_LOCK:
        if refresh or root not in _PRECHECK:
            _PRECHECK[root] = _precheck(root)
        return _PRECHECK[root]


def _precheck(root: str) -> Precheck:
    if not kernel.bpf_privileged(kernel.cap_eff(root)):
        return Precheck(Reason.NO_PRIVILEGE, "needs CAP_SYS_ADMIN or CAP_BPF+CAP_PERFMON", None)
    try:
        import bcc  # noqa: F401
    except ImportError as e:
        return Precheck(Reason.NO_BCC, f"import bcc: {e} (Debian: python3-bpfcc)", None)
    if kernel.kernel_headers(root=root) is None:
        rel = os.uname().release
        return Precheck(
            Reason.NO_HEADERS, f"no kernel headers for {rel} (see scripts/setup.sh)", None
        )
    tracefs, note = kernel.ensure_tracefs(root)
    try:
        b: btfmod.Btf | None = btfmod.load(root)
        berr = ""
    except btfmod.BTFError as e:
        b, berr = None, str(e)

    def fields(cat: str, ev: str) -> list[str]:
        return kernel.tracepoint_fields(tracefs, cat, ev)

    def ksym(name: str) -> bool:
        return kernel.kallsyms_has(name, root)

    env = H.KernelEnv(b, berr, tracefs, note, fields, kernel.kprobes_available(tracefs), ksym)
    return Precheck(Reason.NONE, note, env)


def run_trials(
    src: str,
    base: list[str],
    p: H.Plan,
    usdt: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    text: str | None = None,
) -> H.TrialOutcome:
    """Try the plan's candidates in child processes; a child that dies on a candidate marks it
    failed and a fresh child goes on with the rest. ``text``: the composed program (else the
    file ``src`` is compiled as it is); ``timeout_s``: all children together (default
    :func:`trial_timeout_s`)."""
    if timeout_s is None:
        timeout_s = trial_timeout_s()
    out = H.TrialOutcome()
    together = True  # first: every hook's first choice in one compile (bpftrial's docstring)
    deadline = time.monotonic() + timeout_s
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(paths.PKG_DIR.parent)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    while True:
        todo, winners = H.pending(p, out)
        if not todo and not winners:
            return out
        req = {
            "src": src,
            "base": base,
            "chosen": [list(w.cflags) for w in winners],
            "hooks": [[{"i": c.index, "cflags": list(c.cflags)} for c in hc] for hc in todo],
            "usdt": usdt,
            "text": text,
            "together": together,
        }
        together = False
        left = deadline - time.monotonic()
        if left <= 0:
            out.combined_err = "trial deadline passed"
            return out
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "railhop.sources.bpftrial"],
                input=json.dumps(req),
                capture_output=True,
                text=True,
                timeout=left,
                env=env,
                check=False,
            )
            stdout, rc, stderr = proc.stdout, proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as e:
            raw = e.stdout or b""
            stdout = raw.decode() if isinstance(raw, bytes) else raw
            rc, stderr = -9, "trial child timed out"
        diag = split_diagnostics(stderr)
        in_flight: int | None = None
        finished = False
        for line in stdout.splitlines():
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "start" in msg:
                in_flight = int(msg["start"])
            elif "together" in msg:  # failed together: the child goes on one by one
                in_flight = None
            elif "done" in msg:
                i = int(msg["done"])
                err = str(msg["err"])
                out.results[i] = (bool(msg["ok"]), _with_diag(err, diag.get(i, "")))
                in_flight = None
            elif "combined" in msg:
                out.combined_ok = bool(msg["combined"])
                out.combined_err = _with_diag(str(msg["err"]), diag.get(-1, ""))
                finished = True
        if finished:
            return out
        why = _with_diag(f"trial child died (rc {rc})", diag.get(in_flight, stderr))
        if in_flight == TOGETHER:  # died on all of them together: a fresh child, one by one
            continue
        if in_flight is None or in_flight < 0:
            out.combined_ok = False
            out.combined_err = why
            return out
        out.results[in_flight] = (False, why)


def split_diagnostics(stderr: str) -> dict[int | None, str]:
    """Split the trial child's stderr by its ``@@railhop-trial <i>`` markers (pure)."""
    from railhop.sources.bpftrial import MARK

    out: dict[int | None, str] = {}
    key: int | None = None
    buf: list[str] = []
    for line in stderr.splitlines():
        if line.startswith(MARK):
            out[key] = "\n".join(buf)
            buf = []
            try:
                key = int(line[len(MARK) :])
            except ValueError:
                key = None
            continue
        buf.append(line)
    out[key] = "\n".join(buf)
    return out


def _with_diag(err: str, diag: str, lines: int = 4) -> str:
    if not err:
        return err
    tail = [ln.strip() for ln in diag.splitlines() if ln.strip()][-lines:]
    return err + (" | " + " / ".join(tail) if tail else "")
