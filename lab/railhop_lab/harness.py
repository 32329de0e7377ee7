"""Drive the ``railhop-harness`` C program (an ncclNet driver) on two nodes of the emulated fabric.

The harness (``plugin/tools/harness.c``; its options: ``railhop-harness`` without arguments
prints them): the receiver listens and writes connection handles into a rendezvous directory,
the sender connects, both move messages whose every byte is checked, and both print JSON lines
(``progress`` every ``--interval-ms``, one ``summary`` at the end); the exit status is 0 on
success, :data:`EXIT_DEADLINE` when ``--deadline`` passed. :func:`build_argv` builds the command
line, :class:`Progress` and :class:`Summary` are the JSON lines as this module reads them.

This module builds the command lines (pure), parses the JSON lines into dataclasses (pure), and
runs a send/recv pair inside fabric nodes with a deadline on every wait.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from railhop import paths

if TYPE_CHECKING:
    from railhop_lab.fabric import Fabric

Role = Literal["send", "recv"]

# ncclResult_t values (NCCL's nccl.h); the harness reports these in first_error.code
NCCL_RESULTS = {
    0: "ncclSuccess",
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
}
CLEAN_ERRORS = frozenset({2, 6})  # what --expect-error accepts
EXIT_DEADLINE = 3
WHERES = frozenset({"test", "isend", "irecv", "connect", "accept"})


class HarnessError(Exception):
    """Base error of the harness driver."""


class HarnessProtocolError(HarnessError):
    """A line on the harness's stdout does not follow the JSON-lines contract."""


# ---------------------------------------------------------------------------------------------
# JSON lines


@dataclass(frozen=True)
class Progress:
    t: float  # seconds since the harness started
    bytes: int  # total moved so far (all connections)
    per_conn: tuple[int, ...]
    msgs: int
    received_at: float = 0.0  # time.monotonic() when the line was read (0 when parsed offline)


@dataclass(frozen=True)
class FirstError:
    code: int
    t: float
    where: str

    @property
    def name(self) -> str:
        return NCCL_RESULTS.get(self.code, f"ncclResult({self.code})")

    @property
    def clean(self) -> bool:
        return self.code in CLEAN_ERRORS


@dataclass(frozen=True)
class Summary:
    role: str
    msgs: int
    bytes: int
    elapsed_s: float
    data_errors: int
    request_errors: int
    first_error: FirstError | None
    gbps: float


Line = Progress | Summary


def _field(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], line: str) -> Any:
    if key not in obj:
        raise HarnessProtocolError(f"missing {key!r} in {line!r}")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, kind):
        raise HarnessProtocolError(f"{key!r} has bad value {v!r} in {line!r}")
    return v


def parse_line(line: str, received_at: float = 0.0) -> Line | None:
    """Parse one stdout line; None for a blank line. Unknown ``type`` values are ignored (None)."""
    text = line.strip()
    if not text:
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise HarnessProtocolError(f"not JSON: {text[:200]!r} ({e.msg})") from None
    if not isinstance(obj, dict):
        raise HarnessProtocolError(f"not a JSON object: {text[:200]!r}")
    kind = obj.get("type")
    num = (int, float)
    if kind == "progress":
        per_conn = obj.get("per_conn", [])
        if not isinstance(per_conn, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in per_conn
        ):
            raise HarnessProtocolError(f"'per_conn' is not a list of integers in {text[:200]!r}")
        return Progress(
            t=float(_field(obj, "t", num, text)),
            bytes=_field(obj, "bytes", int, text),
            per_conn=tuple(per_conn),
            msgs=_field(obj, "msgs", int, text),
            received_at=received_at,
        )
    if kind == "summary":
        fe = obj.get("first_error")
        first: FirstError | None = None
        if fe is not None:
            if not isinstance(fe, dict):
                raise HarnessProtocolError(f"'first_error' is not an object in {text[:200]!r}")
            first = FirstError(
                code=_field(fe, "code", int, text),
                t=float(_field(fe, "t", num, text)),
                where=str(_field(fe, "where", str, text)),
            )
        return Summary(
            role=_field(obj, "role", str, text),
            msgs=_field(obj, "msgs", int, text),
            bytes=_field(obj, "bytes", int, text),
            elapsed_s=float(_field(obj, "elapsed_s", num, text)),
            data_errors=_field(obj, "data_errors", int, text),
            request_errors=_field(obj, "request_errors", int, text),
            first_error=first,
            gbps=float(_field(obj, "gbps", num, text)),
        )
    if not isinstance(kind, str):
        raise HarnessProtocolError(f"no 'type' in {text[:200]!r}")
    return None


def parse_lines(lines: Iterable[str]) -> tuple[list[Progress], Summary | None]:
    """Parse a whole stdout; returns the progress lines and the (last) summary."""
    progress: list[Progress] = []
    summary: Summary | None = None
    for line in lines:
        item = parse_line(line)
        if isinstance(item, Progress):
            progress.append(item)
        elif isinstance(item, Summary):
            summary = item
    return progress, summary


# ---------------------------------------------------------------------------------------------
# Command lines


@dataclass(frozen=True)
class HarnessConfig:
    """Options shared by both sides (see the harness contract)."""

    conns: int = 4
    devs: tuple[int, ...] | None = None
    sizes: tuple[int, ...] = (1 << 20,)
    count: int | None = None
    duration: float | None = None
    inflight: int = 8
    grouped: int | None = None
    interval_ms: int = 100
    deadline: float = 120.0
    expect_error: bool = False
    seed: int | None = None
    api: int | None = None
    # "nccl": NCCL's call order (closeListen right after accept, regMr per buffer, deregMr then
    # close then finalize); exit_open: exit with every comm open, as torch does
    order: str = "harness"
    exit_open: bool = False
    # the receiver checks against another pattern seed (the byte checker's self-test: every
    # message must then count as a data error)
    recv_seed: int | None = None
    # channels per comm (NCCL's shared comms): conns // share comms, each carrying share
    # connections' messages, told apart by tag
    share: int = 1

    def validate(self) -> None:
        if self.conns < 1:
            raise HarnessError(f"conns={self.conns}: want >= 1")
        if (self.count is None) == (self.duration is None):
            raise HarnessError("give exactly one of count and duration")
        if self.count is not None and self.count < 0:
            raise HarnessError(f"count={self.count}: want >= 0")
        if self.duration is not None and self.duration <= 0:
            raise HarnessError(f"duration={self.duration}: want > 0")
        if not 1 <= self.inflight <= 32:
            raise HarnessError(f"inflight={self.inflight}: want 1..32")
        if not self.sizes or any(s < 0 for s in self.sizes):
            raise HarnessError(f"sizes={self.sizes}: want a non-empty list of sizes >= 0")
        if self.devs is not None and (not self.devs or any(d < 0 for d in self.devs)):
            raise HarnessError(f"devs={self.devs}: want a non-empty list of devices >= 0")
        if self.grouped is not None and not 1 <= self.grouped <= 8:
            raise HarnessError(f"grouped={self.grouped}: want 1..8")
        if self.interval_ms < 1:
            raise HarnessError(f"interval_ms={self.interval_ms}: want >= 1")
        if self.deadline <= 0:
            raise HarnessError(f"deadline={self.deadline}: want > 0")
        if self.duration is not None and self.duration >= self.deadline:
            raise HarnessError(f"duration={self.duration} must be below deadline={self.deadline}")
        if self.api is not None and not 8 <= self.api <= 12:
            raise HarnessError(f"api={self.api}: want 8..12")
        if self.share < 1 or self.share > 8 or self.conns % self.share:
            raise HarnessError(f"share={self.share}: want 1..8 dividing conns={self.conns}")
        if self.share > 1 and (self.grouped not in (None, 1) or self.count is None):
            # a shared comm matches in posting order: a duration receiver's receives past its
            # end marker would hold the other channels' sends forever
            raise HarnessError("share > 1 needs grouped 1 and a count")
        if self.order not in ("harness", "nccl"):
            raise HarnessError(f"order={self.order!r}: want 'harness' or 'nccl'")


def build_argv(
    harness: Path | str, plugin: Path | str, role: Role, rendezvous: Path | str, cfg: HarnessConfig
) -> list[str]:
    """The harness command line of one side."""
    cfg.validate()
    if role not in ("send", "recv"):
        raise HarnessError(f"role={role!r}: want 'send' or 'recv'")
    argv = [str(harness), "--plugin", str(plugin), "--role", role, "--rendezvous", str(rendezvous)]
    argv += ["--conns", str(cfg.conns)]
    if cfg.devs is not None:
        argv += ["--devs", ",".join(str(d) for d in cfg.devs)]
    argv += ["--sizes", ",".join(str(s) for s in cfg.sizes)]
    if cfg.count is not None:
        argv += ["--count", str(cfg.count)]
    else:
        argv += ["--duration", f"{cfg.duration:g}"]
    argv += ["--inflight", str(cfg.inflight)]
    if cfg.grouped is not None:
        argv += ["--grouped", str(cfg.grouped)]
    argv += ["--interval-ms", str(cfg.interval_ms), "--deadline", f"{cfg.deadline:g}"]
    if cfg.expect_error:
        argv.append("--expect-error")
    seed = cfg.recv_seed if role == "recv" and cfg.recv_seed is not None else cfg.seed
    if seed is not None:
        argv += ["--seed", str(seed)]
    if cfg.api is not None:
        argv += ["--api", str(cfg.api)]
    if cfg.order != "harness":
        argv += ["--order", cfg.order]
    if cfg.exit_open:
        argv.append("--exit-open")
    if cfg.share != 1:
        argv += ["--share", str(cfg.share)]
    return argv


SOURCE_TREE_BUILD = {
    "RAILHOP_PLUGIN_PATH": "build/ctest/plugin/libnccl-net-railhop.so",
    "RAILHOP_HARNESS_PATH": "build/ctest/plugin/railhop-harness",
}


def use_source_tree_build(repo: Path | None = None) -> dict[str, str]:
    """Point RAILHOP_PLUGIN_PATH/RAILHOP_HARNESS_PATH at a `make ctest` build when unset.

    Only fills variables that are unset and whose file exists; returns what it set.
    """
    root = repo if repo is not None else Path(__file__).resolve().parents[2]
    done = {}
    for env, rel in SOURCE_TREE_BUILD.items():
        if not os.environ.get(env) and (root / rel).is_file():
            os.environ[env] = done[env] = str(root / rel)
    return done


# ---------------------------------------------------------------------------------------------
# Results


@dataclass
class SideResult:
    role: str
    node: int
    returncode: int | None  # None: killed by us at the deadline
    summary: Summary | None
    progress: list[Progress] = field(default_factory=list)
    stderr_tail: str = ""
    bad_lines: list[str] = field(default_factory=list)
    timed_out: bool = False

    @property
    def clean_success(self) -> bool:
        s = self.summary
        return (
            self.returncode == 0
            and s is not None
            and s.data_errors == 0
            and s.request_errors == 0
            and not self.bad_lines
        )

    def describe(self) -> str:
        s = self.summary
        head = f"{self.role}@node{self.node}: rc={self.returncode}"
        if self.timed_out:
            head += " (killed at the deadline)"
        if s is None:
            head += ", no summary"
        else:
            fe = s.first_error
            head += (
                f", msgs={s.msgs} bytes={s.bytes} elapsed={s.elapsed_s:.2f}s gbps={s.gbps:.3f}"
                f" data_errors={s.data_errors} request_errors={s.request_errors}"
                f" first_error={None if fe is None else (fe.name, fe.where, fe.t)}"
            )
        if self.bad_lines:
            head += f", {len(self.bad_lines)} bad stdout lines (first: {self.bad_lines[0]!r})"
        tail = self.stderr_tail.strip().splitlines()[-15:]
        return head + ("\n    " + "\n    ".join(tail) if tail else "")


@dataclass
class HarnessResult:
    send: SideResult
    recv: SideResult
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.send.clean_success and self.recv.clean_success

    @property
    def data_errors(self) -> int:
        return sum(s.summary.data_errors for s in (self.send, self.recv) if s.summary is not None)

    @property
    def bytes_checked(self) -> int:
        """Bytes the receiver verified."""
        return self.recv.summary.bytes if self.recv.summary is not None else 0

    def describe(self) -> str:
        sides = f"{self.send.describe()}\n  {self.recv.describe()}"
        return f"harness pair ({self.wall_s:.2f}s):\n  {sides}"


# ---------------------------------------------------------------------------------------------
# Analysis of progress series (pure)


def _count(p: Progress, conn: int | None) -> int:
    if conn is None:
        return p.bytes
    return p.per_conn[conn] if conn < len(p.per_conn) else 0


def longest_gap(
    progress: Sequence[Progress], start: float = 0.0, end: float = 1e18, conn: int | None = None
) -> tuple[float, float]:
    """The longest time (s, harness clock) within [start, end] during which the byte count did
    not grow, and where it began: ``(length, start of the gap)``.

    ``conn`` selects one connection's count (``per_conn``), else the total. Measured between
    progress samples: a stall of one interval or less means none was seen.
    """
    worst, at = 0.0, start
    last_t: float | None = None
    last_b = -1
    for p in progress:
        b = _count(p, conn)
        if b != last_b:
            if last_t is not None and p.t >= start and last_t <= end:
                gap = min(p.t, end) - max(last_t, start)
                if gap > worst:
                    worst, at = gap, max(last_t, start)
            last_t, last_b = p.t, b
    if last_t is not None and progress and last_t < end:
        gap = min(progress[-1].t, end) - max(last_t, start)
        if gap > worst:
            worst, at = gap, max(last_t, start)
    return worst, at


def longest_stall(
    progress: Sequence[Progress], start: float = 0.0, end: float = 1e18, conn: int | None = None
) -> float:
    """Longest time (s, harness clock) within [start, end] during which the byte count did not grow
    (``longest_gap`` without where it began)."""
    return longest_gap(progress, start, end, conn)[0]


def rate_between(
    progress: Sequence[Progress], start: float, end: float, conn: int | None = None
) -> float:
    """Bytes per second moved between harness times ``start`` and ``end`` (nearest samples)."""
    inside = [p for p in progress if start <= p.t <= end]
    if len(inside) < 2:
        return 0.0
    dt = inside[-1].t - inside[0].t
    return (_count(inside[-1], conn) - _count(inside[0], conn)) / dt if dt > 0 else 0.0


def bytes_interp(progress: Sequence[Progress], t: float, conn: int | None = None) -> float:
    """The byte count at harness time ``t``, linearly interpolated between progress lines."""
    prev: Progress | None = None
    for p in progress:
        if p.t >= t:
            if prev is None or p.t <= prev.t:
                return float(_count(p, conn))
            a, b = _count(prev, conn), _count(p, conn)
            return a + (b - a) * (t - prev.t) / (p.t - prev.t)
        prev = p
    return float(_count(prev, conn)) if prev is not None else 0.0


def window_rate(
    progress: Sequence[Progress], start: float, end: float, conn: int | None = None
) -> float | None:
    """Bytes/s between harness times (interpolated edges); None for windows under 0.3 s."""
    if end - start < 0.3 or not progress or start < progress[0].t or end > progress[-1].t:
        return None
    return (bytes_interp(progress, end, conn) - bytes_interp(progress, start, conn)) / (end - start)


def bytes_at(progress: Sequence[Progress], t: float, conn: int | None = None) -> int:
    """The byte count of the last progress line at or before harness time ``t`` (0 if none)."""
    best = 0
    for p in progress:
        if p.t > t:
            break
        best = _count(p, conn)
    return best


def series(progress: Sequence[Progress]) -> list[tuple[float, float]]:
    """(t, bytes/s over the preceding interval) for each progress line after the first."""
    out = []
    for a, b in itertools.pairwise(progress):
        dt = b.t - a.t
        if dt > 0:
            out.append((b.t, (b.bytes - a.bytes) / dt))
    return out


# ---------------------------------------------------------------------------------------------
# Running a pair on the fabric


def _tail(path: Path, limit: int = 8192) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


ProgressCallback = Callable[[str, Progress], None]


class _Side:
    def __init__(
        self,
        role: Role,
        node: int,
        proc: subprocess.Popen[str],
        stderr_path: Path,
        on_progress: ProgressCallback | None,
    ) -> None:
        self.role = role
        self.node = node
        self.proc = proc
        self.stderr_path = stderr_path
        self.progress: list[Progress] = []
        self.summary: Summary | None = None
        self.bad_lines: list[str] = []
        self.timed_out = False
        self._on_progress = on_progress
        self.reader = threading.Thread(target=self._read, name=f"harness-{role}", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        out: IO[str] | None = self.proc.stdout
        if out is None:
            return
        for line in out:
            try:
                item = parse_line(line, received_at=time.monotonic())
            except HarnessProtocolError as e:
                self.bad_lines.append(str(e))
                continue
            if isinstance(item, Progress):
                self.progress.append(item)
                if self._on_progress is not None:
                    with contextlib.suppress(Exception):
                        self._on_progress(self.role, item)
            elif isinstance(item, Summary):
                self.summary = item

    def result(self) -> SideResult:
        return SideResult(
            role=self.role,
            node=self.node,
            returncode=None if self.timed_out else self.proc.returncode,
            summary=self.summary,
            progress=list(self.progress),
            stderr_tail=_tail(self.stderr_path),
            bad_lines=list(self.bad_lines),
            timed_out=self.timed_out,
        )


class HarnessRun:
    """One send/recv pair on the fabric. ``start()``, then ``wait()``; a context manager."""

    def __init__(
        self,
        fabric: Fabric,
        cfg: HarnessConfig,
        *,
        send_node: int = 0,
        recv_node: int = 1,
        env: Mapping[str, str] | None = None,
        on_progress: ProgressCallback | None = None,
        workdir: Path | None = None,
        harness: Path | None = None,
        plugin: Path | None = None,
        grace_s: float = 15.0,
    ) -> None:
        cfg.validate()
        self.fabric = fabric
        self.cfg = cfg
        self.send_node = send_node
        self.recv_node = recv_node
        self.env = dict(env or {})
        self.on_progress = on_progress
        # absolute: both sides run in workdir
        self.harness = Path(harness).resolve() if harness else paths.harness_path()
        self.plugin = Path(plugin).resolve() if plugin else paths.plugin_path()
        self.grace_s = grace_s
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="railhop-harness-")
            workdir = Path(self._tmp.name)
        self.workdir = workdir
        self.sides: dict[str, _Side] = {}
        self.started_at = 0.0

    def node_env(self, node: int) -> dict[str, str]:
        env = dict(os.environ)
        run_dir = self.workdir / f"run-node{node}"
        run_dir.mkdir(parents=True, exist_ok=True)
        env["RAILHOP_RUN_DIR"] = str(run_dir)
        env.update(self.env)
        return env

    def start(self) -> HarnessRun:
        if self.sides:
            raise HarnessError("already started")
        rdv = self.workdir / "rendezvous"
        rdv.mkdir(parents=True, exist_ok=True)
        self.started_at = time.monotonic()
        order: tuple[tuple[Role, int], ...] = (("recv", self.recv_node), ("send", self.send_node))
        for role, node in order:
            argv = build_argv(self.harness, self.plugin, role, rdv, self.cfg)
            err_path = self.workdir / f"{role}.stderr"
            with err_path.open("w") as err:
                proc = self.fabric.popen(
                    node,
                    argv,
                    env=self.node_env(node),
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                    bufsize=1,
                    cwd=self.workdir,  # crash files (core, *.btr) land here, not in the caller's
                )
            self.sides[role] = _Side(role, node, proc, err_path, self.on_progress)
        return self

    def running(self) -> bool:
        return any(s.proc.poll() is None for s in self.sides.values())

    def progress(self, role: Role = "recv") -> list[Progress]:
        return list(self.sides[role].progress)

    def wait(self, timeout: float | None = None) -> HarnessResult:
        """Wait for both sides (default bound: the harness deadline + grace), killing on overrun."""
        if not self.sides:
            raise HarnessError("not started")
        limit = timeout if timeout is not None else self.cfg.deadline + self.grace_s
        deadline = self.started_at + limit
        for side in self.sides.values():
            try:
                side.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                side.timed_out = True
        if any(s.timed_out for s in self.sides.values()):
            self.kill()
        for side in self.sides.values():
            side.reader.join(5.0)
            if side.proc.stdout is not None:
                side.proc.stdout.close()
        return HarnessResult(
            send=self.sides["send"].result(),
            recv=self.sides["recv"].result(),
            wall_s=time.monotonic() - self.started_at,
        )

    def kill(self) -> None:
        for side in self.sides.values():
            if side.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(side.proc.pid, 9)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    side.proc.wait(5.0)

    def close(self) -> None:
        self.kill()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> HarnessRun:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_pair(
    fabric: Fabric,
    cfg: HarnessConfig,
    *,
    send_node: int = 0,
    recv_node: int = 1,
    env: Mapping[str, str] | None = None,
    during: Callable[[HarnessRun], None] | None = None,
    timeout: float | None = None,
) -> HarnessResult:
    """Run a pair to completion; ``during(run)`` runs after both sides started (fault injection)."""
    with HarnessRun(fabric, cfg, send_node=send_node, recv_node=recv_node, env=env) as run:
        if during is not None:
            try:
                during(run)
            except BaseException:
                run.kill()
                raise
        return run.wait(timeout)


def wait_for_bytes(run: HarnessRun, nbytes: int, timeout: float, role: Role = "recv") -> float:
    """Wait until ``role`` reported at least ``nbytes``; returns the time waited (bounded)."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while True:
        prog = run.sides[role].progress
        if prog and prog[-1].bytes >= nbytes:
            return time.monotonic() - t0
        if time.monotonic() >= deadline:
            got = prog[-1].bytes if prog else 0
            raise HarnessError(f"{role} moved {got} < {nbytes} bytes within {timeout} s")
        if not run.running():
            raise HarnessError(f"harness exited before {role} moved {nbytes} bytes")
        time.sleep(0.02)
