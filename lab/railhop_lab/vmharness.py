"""Run the ``railhop-harness`` ncclNet driver between two guests of the VM lab (:mod:`vmlab`).

The same driver and contract as :mod:`harness` (one process per node, handles through the
rendezvous directory, every byte checked, JSON lines on stdout): here each side runs in its own
guest through the guest runner, the rendezvous directory and both sides' stdout/stderr live in
the directory every guest shares, and the host reads the progress lines from those files. The
plugin and the harness are the host's builds (the guests see the host's root file system).

:data:`VERBS_ENV` runs the ofi lane over libfabric's ``verbs`` provider on the guests' rxe
devices, with the plugin's time limits raised for emulated time; a run's ``env`` overrides it
(:data:`VERBS_LANE_ENV`, ``RAILHOP_TRANSPORT=verbs``: the plugin's own verbs lane,
tests/vm/test_verbs_lane.py).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Mapping
from pathlib import Path

from railhop import paths
from railhop_lab.harness import (
    HarnessConfig,
    HarnessError,
    HarnessProtocolError,
    HarnessResult,
    Progress,
    Role,
    SideResult,
    Summary,
    build_argv,
    parse_line,
)
from railhop_lab.vmlab import GuestJob, VmLab, VmLabError

# Emulated CPUs run the plugin ~20-50x slower than a host: a chunk's completion and a probe's
# answer get more time before the lane counts as failed (milliseconds).
VERBS_ENV: dict[str, str] = {
    # the ofi lane, named: auto takes the verbs lane here (every NIC is an rxe device)
    "RAILHOP_TRANSPORT": "ofi",
    "FI_PROVIDER": "verbs",
    "RAILHOP_COMPLETION_TIMEOUT": "8000",
    "RAILHOP_PROBE_TIMEOUT": "10000",
}
# The plugin's own verbs lane (plugin/src/lanes/verbs/) with the same emulated-time limits.
VERBS_LANE_ENV: dict[str, str] = {
    "RAILHOP_TRANSPORT": "verbs",
    "RAILHOP_COMPLETION_TIMEOUT": VERBS_ENV["RAILHOP_COMPLETION_TIMEOUT"],
    "RAILHOP_PROBE_TIMEOUT": VERBS_ENV["RAILHOP_PROBE_TIMEOUT"],
}

_runs = itertools.count()


def nics_env(lab: VmLab) -> str:
    """``RAILHOP_NICS`` naming the lab's NICs with their rails (exact names)."""
    return "=" + ",".join(f"{lab.ifname(i)}:{i}" for i in range(lab.nics))


class _VmSide:
    def __init__(self, role: Role, node: int, job: GuestJob, out: Path, err: Path) -> None:
        self.role = role
        self.node = node
        self.job = job
        self.out = out
        self.err = err
        self.progress: list[Progress] = []
        self.summary: Summary | None = None
        self.bad_lines: list[str] = []
        self._offset = 0
        self._partial = ""

    def poll(self) -> None:
        """Parse the lines the side wrote since the last call (a partial line waits)."""
        try:
            with self.out.open("r", errors="replace") as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset = f.tell()
        except OSError:
            return
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()
        now = time.monotonic()
        for line in lines:
            try:
                item = parse_line(line, received_at=now)
            except HarnessProtocolError as e:
                self.bad_lines.append(str(e))
                continue
            if isinstance(item, Progress):
                self.progress.append(item)
            elif isinstance(item, Summary):
                self.summary = item

    def stderr_tail(self, limit: int = 8192) -> str:
        try:
            return self.err.read_text(errors="replace")[-limit:]
        except OSError:
            return ""


class VmHarnessRun:
    """One send/recv pair between two guests. ``start()``, then ``wait()``; a context manager."""

    def __init__(
        self,
        lab: VmLab,
        cfg: HarnessConfig,
        *,
        send_node: int = 0,
        recv_node: int = 1,
        env: Mapping[str, str] | None = None,
        harness: Path | None = None,
        plugin: Path | None = None,
        grace_s: float = 60.0,
        verbose: bool = False,
    ) -> None:
        cfg.validate()
        self.lab = lab
        self.cfg = cfg
        self.send_node = send_node
        self.recv_node = recv_node
        self.env = {**VERBS_ENV, "RAILHOP_NICS": nics_env(lab), **dict(env or {})}
        self.harness = Path(harness).resolve() if harness else paths.harness_path()
        self.plugin = Path(plugin).resolve() if plugin else paths.plugin_path()
        self.grace_s = grace_s
        self.verbose = verbose
        self.dir = lab.shared / f"harness-{next(_runs)}"
        self.sides: dict[str, _VmSide] = {}
        self.started_at = 0.0

    def start(self, *, sender: bool = True) -> VmHarnessRun:
        """Start the receiver, then the sender (``sender=False``: later, :meth:`start_sender`;
        the receiver's listeners wait for it meanwhile)."""
        if self.sides:
            raise HarnessError("already started")
        rdv = self.dir / "rendezvous"
        rdv.mkdir(parents=True)
        self.started_at = time.monotonic()
        self._start_side("recv", self.recv_node)
        if sender:
            self._start_side("send", self.send_node)
        return self

    def start_sender(self) -> VmHarnessRun:
        """Start the sender of a run started with ``sender=False``."""
        if "recv" not in self.sides or "send" in self.sides:
            raise HarnessError("start_sender() follows start(sender=False), once")
        self._start_side("send", self.send_node)
        return self

    @property
    def handle_file(self) -> Path:
        """The receiver's first connect handle (there once its listener is up)."""
        return self.dir / "rendezvous" / "handle.0"

    def _start_side(self, role: Role, node: int) -> None:
        rdv = self.dir / "rendezvous"
        argv = build_argv(self.harness, self.plugin, role, rdv, self.cfg)
        if self.cfg.duration is not None:  # finish(): the run's end by what it moved
            argv += ["--stop-file", str(self.stop_file)]
        if self.verbose:
            argv.append("--verbose")
        run_dir = self.dir / f"run-{role}"
        run_dir.mkdir()
        out, err = self.dir / f"{role}.out", self.dir / f"{role}.err"
        job = self.lab.guests[node].start(
            argv,
            # a run directory in env wins (an agent's, in the guest's own /tmp)
            env={"RAILHOP_RUN_DIR": str(run_dir), **self.env},
            timeout=self.cfg.deadline + self.grace_s,
            stdout=out,
            stderr=err,
            cwd=str(self.dir),
        )
        self.sides[role] = _VmSide(role, node, job, out, err)

    @property
    def stop_file(self) -> Path:
        return self.dir / "stop"

    def finish(self) -> None:
        """End a ``duration`` run early: the sender stops posting within one progress interval
        and both sides exit as at the end of the duration. A test sizes the duration far above
        what its steps need and calls this once they are done: on a loaded host the steps
        (guest commands, fail-backs) take longer, and the run still covers them."""
        if self.cfg.duration is None:
            raise HarnessError("finish() ends a duration run; this one has a message count")
        self.stop_file.touch()

    def running(self) -> bool:
        return any(not s.job.done() for s in self.sides.values())

    def progress(self, role: Role = "recv") -> list[Progress]:
        side = self.sides[role]
        side.poll()
        return list(side.progress)

    def wait(self, timeout: float | None = None) -> HarnessResult:
        """Wait for both sides (default bound: the harness deadline + grace)."""
        if not self.sides:
            raise HarnessError("not started")
        limit = timeout if timeout is not None else self.cfg.deadline + self.grace_s
        deadline = self.started_at + limit
        results: dict[str, SideResult] = {}
        for role, side in self.sides.items():
            timed_out = False
            rc: int | None = None
            try:
                r = side.job.wait(max(1.0, deadline - time.monotonic()))
                rc, timed_out = r.rc, r.timed_out
                if r.error is not None:
                    raise HarnessError(f"{role} on node {side.node} did not start: {r.error}")
            except VmLabError:
                timed_out = True
            side.poll()
            results[role] = SideResult(
                role=role,
                node=side.node,
                returncode=None if timed_out else rc,
                summary=side.summary,
                progress=list(side.progress),
                stderr_tail=side.stderr_tail(),
                bad_lines=list(side.bad_lines),
                timed_out=timed_out,
            )
        return HarnessResult(
            send=results["send"], recv=results["recv"], wall_s=time.monotonic() - self.started_at
        )

    def kill(self) -> None:
        for side in self.sides.values():
            if not side.job.done():
                side.job.kill()

    def __enter__(self) -> VmHarnessRun:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(VmLabError, OSError):
            self.kill()


def wait_for_bytes(run: VmHarnessRun, nbytes: int, timeout: float, role: Role = "recv") -> float:
    """Wait until ``role`` reported at least ``nbytes``; returns the time waited (bounded)."""
    t0 = time.monotonic()
    while True:
        prog = run.progress(role)
        if prog and prog[-1].bytes >= nbytes:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            got = prog[-1].bytes if prog else 0
            raise HarnessError(f"{role} moved {got} < {nbytes} bytes within {timeout} s")
        if not run.running():
            raise HarnessError(f"harness exited before {role} moved {nbytes} bytes")
        time.sleep(0.1)


def wait_for_each_conn(run: VmHarnessRun, grow: int, timeout: float, role: Role = "recv") -> float:
    """Wait until every connection of ``role`` moved ``grow`` more bytes than it had at the call
    (a stalled connection fails this even while the others carry the total); bounded."""
    t0 = time.monotonic()
    prog = run.progress(role)
    base = list(prog[-1].per_conn) if prog else []
    while True:
        prog = run.progress(role)
        now = list(prog[-1].per_conn) if prog else []
        if len(now) == run.cfg.conns and all(
            b - (base[i] if i < len(base) else 0) >= grow for i, b in enumerate(now)
        ):
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise HarnessError(
                f"{role}: not every connection moved {grow} more bytes within {timeout} s "
                f"(per connection: {base} -> {now})"
            )
        if not run.running():
            raise HarnessError(f"harness exited before every {role} connection moved {grow}")
        time.sleep(0.1)
