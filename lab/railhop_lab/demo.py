"""``railhop demo``: plugin traffic across the emulated fabric through a walk of NIC faults.

Builds the two-node, four-NIC fabric with a ``tbf`` ceiling per NIC, starts one railhop agent
inside each node's network namespace (netlink and eBPF carrier/TCP lane sources, control plane in
its own run directory, failover traces to a file), waits (bounded, with progress) until the eBPF
sources have attached, runs the harness (node 0 sends to node 1 through the plugin's
ncclNet API, every byte checked; each node's plugin talks to its node's agent) and walks:
healthy -> silent blackhole on nic1 -> carrier loss on nic2 -> heal both, with a live line.

A lane timeout from one process takes a NIC DOWN only when corroborated; in the demo (one
harness process per node) the corroboration of the blackhole is the eBPF TCP source's signal on
the lane's sockets. Where eBPF cannot attach (or with ``no_ebpf``) the agents run netlink-only,
the demo says so, and the blackhole leaves nic1 SUSPECT (the plugin still moves its own
connections).

At the end a table gives, per fault: what detected it and how long it took (from the agents'
``railhop.detection`` spans, never guessed), the time to resume (harness progress), bandwidth
before/during/after as a share of healthy, the fail-back time (per-NIC counters), the bytes
checked and errors. The output directory gets ``results.json``, ``timeline.png`` (bandwidth
per NIC, faults and detections marked) and ``traces.otlp.json`` (both agents' failover traces,
one OTLP/JSON document). docs/demo.md explains how to read them.

The scenario machinery (:mod:`railhop_lab.scenario`: ``run_scenario``, ``fault_report``) is
shared with the bench scripts; the PNG is drawn by :mod:`railhop_lab.render`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from railhop import paths, tracing
from railhop_lab.fabric import Fabric, FabricError, unique_prefix
from railhop_lab.harness import (
    HarnessError,
    bytes_interp,
    use_source_tree_build,
)
from railhop_lab.render import PlotUnavailableError, render_timeline_png
from railhop_lab.scenario import (
    DemoError,
    FaultReport,
    MiB,
    Step,
    Tick,
    Timeline,
    fault_report,
    healthy_rate,
    run_scenario,
)

# ---------------------------------------------------------------------------------------------
# The agents' view: detections read back from their failover traces (pure)


@dataclass(frozen=True)
class Detection:
    """One ``railhop.detection`` span of an agent's trace, with its root's outcome."""

    node: int
    nic: str
    trace_id: str
    first_signal_ns: int  # the detection span's start: the first bad signal (wall clock)
    declared_ns: int  # its end: the NIC declared DOWN (or the plugin started failing over)
    source: str  # railhop.detection.source: netlink, plugin, ...
    signal: str  # railhop.detection.signal: carrier_down, lane_timeout, ...
    first_source: str | None = None  # an earlier, softer signal's source, if any
    outcome: str | None = None  # railhop.failover.outcome of the root (None: not exported yet)
    end_ns: int | None = None  # the root's end (fail-back done), when exported

    @property
    def label(self) -> str:
        """What the table shows, e.g. ``node0 netlink carrier_down``."""
        return f"node{self.node} {self.source} {self.signal}".strip()


def _attr_value(v: dict[str, Any]) -> Any:
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [_attr_value(x) for x in v["arrayValue"].get("values", [])]
    return None


def span_attrs(span: Mapping[str, Any]) -> dict[str, Any]:
    """An OTLP/JSON span's attributes as a plain dict."""
    return {a["key"]: _attr_value(a.get("value", {})) for a in span.get("attributes", [])}


def detections(spans: Sequence[Mapping[str, Any]], node: int) -> list[Detection]:
    """The detections in one agent's spans (OTLP/JSON dicts), oldest first."""
    roots = {s["spanId"]: s for s in spans if s.get("name") == tracing.FAILOVER}
    out = []
    for s in spans:
        if s.get("name") != tracing.DETECTION:
            continue
        a = span_attrs(s)
        root = roots.get(s.get("parentSpanId", ""))
        ra = span_attrs(root) if root is not None else {}
        out.append(
            Detection(
                node=node,
                nic=str(a.get("network.interface.name", "")),
                trace_id=str(s.get("traceId", "")),
                first_signal_ns=int(s["startTimeUnixNano"]),
                declared_ns=int(s["endTimeUnixNano"]),
                source=str(a.get("railhop.detection.source", "")),
                signal=str(a.get("railhop.detection.signal", "")),
                first_source=a.get("railhop.detection.first_source"),
                outcome=ra.get("railhop.failover.outcome"),
                end_ns=int(root["endTimeUnixNano"]) if root is not None else None,
            )
        )
    return sorted(out, key=lambda d: d.first_signal_ns)


MATCH_SLACK_NS = 20_000_000  # clock offsets between the demo and the agents (both ~us)


def match_detection(
    dets: Sequence[Detection],
    nic: str,
    fault_ns: int,
    until_ns: int | None = None,
    node: int | None = None,
) -> Detection | None:
    """The agents' detection of a fault on ``nic`` injected at ``fault_ns``: the one that
    declared the NIC down first after the fault (and whose first signal came before
    ``until_ns``). ``node`` None: either node (both ends of a rail see a silent blackhole, the
    first to notice may be either); else only that node's agent."""
    found = [
        d
        for d in dets
        if d.nic == nic
        and (node is None or d.node == node)
        and d.declared_ns >= fault_ns - MATCH_SLACK_NS
        and (until_ns is None or d.first_signal_ns <= until_ns)
    ]
    return min(found, key=lambda d: d.declared_ns, default=None)


# ---------------------------------------------------------------------------------------------
# The summary (pure)


@dataclass
class FaultRow:
    """One line of the summary table: a fault, what the agent saw, what the traffic did."""

    report: FaultReport
    detection: Detection | None
    detect_s: float | None  # fault injected -> the agent declared the NIC down (its trace)
    bytes_checked: int  # bytes the receiver verified while the fault held
    errors: int  # harness errors first seen while the fault held

    @property
    def survived(self) -> bool:
        """Traffic moved on while the fault held, with no error."""
        return self.errors == 0 and self.report.during is not None and self.report.during > 0


@dataclass(frozen=True)
class Totals:
    bytes_checked: int
    msgs_received: int
    msgs_sent: int
    data_errors: int
    request_errors: int
    healthy_mbit: float  # receiver goodput before the first fault (all NICs)


def fault_rows(tl: Timeline, dets: Sequence[Detection]) -> list[FaultRow]:
    """A row per fault of the timeline, its detection taken from the agents' traces."""
    faults = [(t, s) for t, s in tl.events if s.is_fault]
    rows = []
    summ = tl.result.recv.summary
    first_err = summ.first_error if summ is not None else None
    nerr = (summ.data_errors + summ.request_errors) if summ is not None else 0
    for i, (t_f, st) in enumerate(faults):
        rep = fault_report(tl, i)
        end = rep.healed_at if rep.healed_at is not None else tl.end
        nxt = [t for t, _ in faults if t > t_f]
        det = match_detection(
            dets, f"nic{st.nic}", tl.wall_ns(t_f), tl.wall_ns(min(nxt)) if nxt else None
        )
        detect_s = (det.declared_ns - tl.wall_ns(t_f)) / 1e9 if det is not None else None
        checked = int(
            bytes_interp(tl.progress, tl.h(min(end, tl.end))) - bytes_interp(tl.progress, tl.h(t_f))
        )
        errs = nerr if first_err is not None and t_f <= first_err.t - tl.harness_t0 <= end else 0
        rows.append(FaultRow(rep, det, detect_s, max(0, checked), errs))
    return rows


def totals_of(tl: Timeline) -> Totals:
    r, s = tl.result.recv.summary, tl.result.send.summary
    h = healthy_rate(tl)
    return Totals(
        bytes_checked=r.bytes if r else 0,
        msgs_received=r.msgs if r else 0,
        msgs_sent=s.msgs if s else 0,
        data_errors=sum(x.data_errors for x in (r, s) if x is not None),
        request_errors=sum(x.request_errors for x in (r, s) if x is not None),
        healthy_mbit=(h or 0.0) * 8 / 1e6,
    )


def _fmt_share(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}s"


def _fmt_bytes(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n >= MiB else f"{n / 1024:.0f} KiB"


TABLE_HEAD = (
    "fault",
    "detected by",
    "detect",
    "resume",
    "before",
    "during (expected)",
    "after",
    "fail-back",
    "checked",
    "errors",
)


def summary_table(rows: Sequence[FaultRow], totals: Totals) -> str:
    """The end-of-demo table (plain text, aligned columns) and a totals line."""
    body = []
    for r in rows:
        f = r.report
        body.append(
            (
                f.label,
                r.detection.label if r.detection is not None else "not detected",
                _fmt_s(r.detect_s),
                _fmt_s(f.resume_s),
                _fmt_share(f.before),
                f"{_fmt_share(f.during)} ({_fmt_share(f.expected_during)})",
                _fmt_share(f.after),
                _fmt_s(f.failback_s),
                _fmt_bytes(r.bytes_checked),
                str(r.errors),
            )
        )
    widths = [max(len(x[i]) for x in (TABLE_HEAD, *body)) for i in range(len(TABLE_HEAD))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [line(TABLE_HEAD), line(["-" * w for w in widths])]
    out += [line(b) for b in body]
    errs = totals.data_errors + totals.request_errors
    out.append(
        f"healthy {totals.healthy_mbit:.0f} Mbit/s; every byte checked: "
        f"{_fmt_bytes(totals.bytes_checked)} in {totals.msgs_received} messages "
        f"(sent {totals.msgs_sent}); data errors {totals.data_errors}, request errors "
        f"{totals.request_errors}{'' if errs == 0 else '  <-- FAILED'}"
    )
    return "\n".join(out)


def demo_ok(result_ok: bool, rows: Sequence[FaultRow], totals: Totals) -> bool:
    """Exit 0 only if every byte was checked with zero errors and every fault was survived."""
    return (
        result_ok
        and totals.data_errors == 0
        and totals.request_errors == 0
        and totals.bytes_checked > 0
        and bool(rows)
        and all(r.survived for r in rows)
    )


# ---------------------------------------------------------------------------------------------
# The demo


def demo_steps(quick: bool = False) -> tuple[list[Step], float]:
    """healthy -> blackhole nic1 -> carrier loss nic2 -> heal both (scenario seconds).

    A quick phase is 6 s, not less: after a silent blackhole the hit connection needs the 1 s
    completion timeout plus the replay of its unconfirmed messages (several seconds on 200 Mbit/s
    NICs shared with the other connections) before it moves again, and a phase shorter than that
    ends before the fault can be shown to be survived.
    """
    p = 6.0 if quick else 8.0
    steps = [
        Step(p, "blackhole", 0, 1, "blackhole nic1"),
        Step(2 * p, "carrier", 0, 2, "carrier loss nic2"),
        Step(3 * p, "heal", 0, 1, "heal nic1"),
        Step(3 * p, "heal", 0, 2, "heal nic2"),
    ]
    return steps, 3 * p + (6.0 if quick else 8.0)


def root_problem() -> str | None:
    if os.geteuid() != 0:
        return (
            "railhop demo needs root (it runs as uid "
            f"{os.geteuid()}): it creates network namespaces (CAP_SYS_ADMIN), veth pairs, a "
            "bridge and tbf qdiscs (CAP_NET_ADMIN), writes sysctls inside them and starts one "
            "railhop agent per emulated node (netlink, control socket, shared memory). "
            "Run it as root, e.g. `sudo railhop demo` (or `sudo make demo`)."
        )
    return None


AGENT_SCRIPT = """
import logging, sys
from pathlib import Path
from railhop import daemon
logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(asctime)s %(name)s %(levelname)s %(message)s")
cfg = daemon.AgentConfig(
    run_dir=Path(sys.argv[1]), nics=("nic0", "nic1", "nic2", "nic3"), policy_path=Path(sys.argv[7]),
    sources=tuple(x for x in sys.argv[5].split(",") if x),
    trace_file=Path(sys.argv[2]), metrics_port=int(sys.argv[3]), metrics_addr="127.0.0.1",
    heartbeat_ms=100, duration_s=float(sys.argv[4]), ebpf_start_timeout_s=float(sys.argv[6]))
sys.exit(daemon.run_agent(cfg))
"""
METRICS_PORT = 18464  # railhop.metrics.DEFAULT_PORT
# the agents' sources: netlink (carrier) and the eBPF carrier and TCP lane probes; the TCP
# probe's signal on the blackholed lane's sockets is the kernel evidence that corroborates one
# process's lane timeout (without it the blackhole leaves the NIC SUSPECT)
AGENT_SOURCES = ("netlink", "ebpf")
# one process per node uses the NICs here: its fail-back is the only recovery evidence there is
# (the default asks for two processes' before a NIC that went DOWN with its link up is UP again)
AGENT_POLICY = "version: 1\nname: demo\nhealth:\n  recover_sources: 1\n"
EBPF_SOURCES = ("ebpf.carrier", "ebpf.tcp")
EBPF_START_TIMEOUT_S = 90.0  # per source, in the agent (trial child + bcc compile)


@dataclass
class AgentProc:
    node: int
    proc: subprocess.Popen[Any]
    run_dir: Path
    trace_file: Path
    log: Path

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(5.0)
        return self.proc.returncode


def scrape(
    fab: Fabric, node: int, port: int = METRICS_PORT, *, timeout: float = 2.0
) -> dict[str, float]:
    """GET /metrics inside a node's netns (the agent listens on that netns's loopback): sample
    name with labels -> value (a line that does not parse is left out)."""
    s = fab.socket(node)
    try:
        s.settimeout(timeout)
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    finally:
        s.close()
    return parse_metrics(data.partition(b"\r\n\r\n")[2].decode(errors="replace"))


def _escape(v: str) -> str:
    """A label value as the exposition format writes it."""
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> ``name{label="value",...}`` (labels in exposition order;
    the bare name without labels) -> value, parsed by prometheus_client's parser. A scrape
    that does not parse gives what parsed before the bad line."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                labels = ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels.items())
                out[f"{s.name}{{{labels}}}" if labels else s.name] = float(s.value)
    except ValueError:
        pass  # a truncated or garbled scrape: keep what parsed
    return out


def start_agent(
    fab: Fabric,
    node: int,
    run_dir: Path,
    trace_file: Path,
    log: Path,
    lifetime_s: float,
    sources: Sequence[str] = AGENT_SOURCES,
    ebpf_timeout_s: float = EBPF_START_TIMEOUT_S,
) -> AgentProc:
    """One agent inside node ``node``'s netns (its netlink and eBPF sources see that node's
    NICs and sockets); each eBPF source gets ``ebpf_timeout_s`` to start."""
    run_dir.mkdir(parents=True, exist_ok=True)
    policy = run_dir.parent / f"policy-node{node}.yaml"
    policy.write_text(AGENT_POLICY)
    pkg_root = str(Path(__file__).resolve().parents[1])
    pp = os.environ.get("PYTHONPATH")
    env = {
        **os.environ,
        "PYTHONPATH": pkg_root + (os.pathsep + pp if pp else ""),
        "NODE_NAME": f"demo-node{node}",
        "OTEL_SERVICE_NAME": "railhop-demo",
        "OTEL_TRACES_EXPORTER": "none",
    }
    argv = [
        sys.executable,
        "-c",
        AGENT_SCRIPT,
        str(run_dir),
        str(trace_file),
        str(METRICS_PORT),
        f"{lifetime_s:g}",
        ",".join(sources),
        f"{ebpf_timeout_s:g}",
        str(policy),
    ]
    with log.open("w") as err:
        proc = fab.popen(node, argv, env, stdout=subprocess.DEVNULL, stderr=err)
    return AgentProc(node, proc, run_dir, trace_file, log)


def wait_agents_ready(fab: Fabric, agents: Sequence[AgentProc], timeout: float) -> None:
    """Until every agent serves metrics with its netlink source started (bounded)."""
    deadline = time.monotonic() + timeout
    for a in agents:
        while True:
            _check_alive(a)
            with contextlib.suppress(OSError):
                if scrape(fab, a.node).get('railhop_sources{source="netlink"}') == 1:
                    break
            if time.monotonic() > deadline:
                raise DemoError(f"the agent of node {a.node} not ready in {timeout:g} s")
            time.sleep(0.2)


EBPF_WAIT_S = 2 * EBPF_START_TIMEOUT_S + 10.0  # the agents start their eBPF sources in turn
NETLINK_ONLY_SHORT = (
    "a silent blackhole stays SUSPECT: one process's lane timeout without a kernel signal is "
    "not corroborated, so no agent takes the NIC down; the plugin still moves its own "
    "connections"
)
NETLINK_ONLY_NOTE = "the agents run netlink-only: " + NETLINK_ONLY_SHORT


def ebpf_corroborates(outcomes: Sequence[EbpfOutcome]) -> bool:
    """Every agent attached its eBPF TCP lane source (the kernel signal of a blackhole)."""
    tcp = [o for o in outcomes if o.source == "ebpf.tcp"]
    return bool(tcp) and all(o.attached for o in tcp)


def ebpf_summary(outcomes: Sequence[EbpfOutcome]) -> str:
    """One line per agent and eBPF source: how it fared and why."""
    return "\n".join(
        f"  node{o.node} {o.source}: {o.status}" + (f" ({o.detail})" if o.detail else "")
        for o in outcomes
    )


def _check_alive(a: AgentProc) -> None:
    if a.proc.poll() is not None:
        raise DemoError(
            f"the agent of node {a.node} exited ({a.proc.returncode}): " + _tail_text(a.log)
        )


@dataclass(frozen=True)
class EbpfOutcome:
    """How one eBPF source of one agent fared: ``attached`` (at least one hook attached),
    ``skipped`` (started, no hook attached) or ``failed`` (did not start); ``detail``: the
    hooks' capability lines or the start error."""

    node: int
    source: str
    status: str
    detail: str

    @property
    def attached(self) -> bool:
        return self.status == "attached"


def ebpf_outcomes(node: int, metrics: Mapping[str, float], log_text: str) -> list[EbpfOutcome]:
    """The outcome of each of :data:`EBPF_SOURCES` decided so far (pure): the agent sets
    ``railhop_sources{source=...}`` once a source started (1: a hook attached, 0: none did) and
    logs ``source ... failed to start`` for one it gave up; the detail comes from its log."""
    out = []
    for src in EBPF_SOURCES:
        failed = re.search(rf"source {re.escape(src)} failed to start: (.*)", log_text)
        gauge = metrics.get(f'railhop_sources{{source="{src}"}}')
        caps = "; ".join(
            " ".join(m.group(1).split())
            for m in re.finditer(rf"({re.escape(src)}:\S+\s+(?:attached|skipped).*)", log_text)
        )
        if gauge is not None:
            out.append(EbpfOutcome(node, src, "attached" if gauge == 1 else "skipped", caps))
        elif failed:
            out.append(EbpfOutcome(node, src, "failed", failed.group(1).strip()))
    return out


def wait_ebpf(
    fab: Fabric, agents: Sequence[AgentProc], timeout: float, stream: TextIO, every: float = 5.0
) -> list[EbpfOutcome]:
    """Until each agent's eBPF sources have attached or been given up (bounded by ``timeout``;
    the agents give each source ``EBPF_START_TIMEOUT_S``), a progress line every ``every``
    seconds. A source still undecided at the deadline counts as ``failed``."""
    t0 = time.monotonic()
    next_note = t0 + every
    done: dict[int, list[EbpfOutcome]] = {}
    while True:
        for a in agents:
            _check_alive(a)
            if a.node in done:
                continue
            metrics: dict[str, float] = {}
            with contextlib.suppress(OSError):
                metrics = scrape(fab, a.node)
            got = ebpf_outcomes(a.node, metrics, _tail_text(a.log, 1 << 20))
            if len(got) == len(EBPF_SOURCES):
                done[a.node] = got
        now = time.monotonic()
        if len(done) == len(agents):
            return [o for n in sorted(done) for o in done[n]]
        if now - t0 > timeout:
            late = [
                EbpfOutcome(a.node, src, "failed", f"not attached within {timeout:g} s")
                for a in agents
                if a.node not in done
                for src in EBPF_SOURCES
            ]
            return [o for n in sorted(done) for o in done[n]] + late
        if now >= next_note:
            next_note = now + every
            left = [f"node{a.node}" for a in agents if a.node not in done]
            print(
                f"  ... {now - t0:3.0f} s: eBPF sources of {', '.join(left)} still compiling "
                f"(at most {timeout:g} s)",
                file=stream,
                flush=True,
            )
        time.sleep(0.5)


def _tail_text(path: Path, n: int = 1500) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-n:]
    return ""


def read_spans(path: Path) -> list[dict[str, Any]]:
    """The spans of an agent's trace file so far ([] when none yet)."""
    if not path.exists():
        return []
    try:
        return tracing.read_otlp_json(path)
    except (ValueError, OSError):  # a line being written
        return []


def merge_otlp(files: Sequence[Path], out: Path) -> int:
    """One OTLP/JSON document (``ExportTraceServiceRequest``) with every batch of ``files``;
    returns the number of spans."""
    rs: list[Any] = []
    for f in files:
        if not f.exists():
            continue
        for ln in f.read_text().splitlines():
            if ln.strip():
                with contextlib.suppress(json.JSONDecodeError):
                    rs += json.loads(ln).get("resourceSpans", [])
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps({"resourceSpans": rs}, indent=1) + "\n")
    tmp.replace(out)
    return sum(len(ss.get("spans", [])) for r in rs for ss in r.get("scopeSpans", []))


def nic_states(run_dirs: Sequence[Path]) -> list[tuple[int, str, str]]:
    """(node, nic, state) for every NIC an agent does not have UP (from its health table)."""
    from railhop.control.table import read_table

    out = []
    for node, d in enumerate(run_dirs):
        try:
            snap = read_table(d / "health.tbl", tries=4)
        except Exception:  # not there yet / being written: skip this tick
            continue
        for n in snap.nics:
            if n.state.name != "UP":
                out.append((node, n.ifname, n.state.name))
    return out


def live_printer(stream: TextIO, nics: int, run_dirs: Sequence[Path]) -> Tick:
    """The live line: one line rewritten in place on a TTY (4/s), plain lines otherwise (1/s)."""
    tty = stream.isatty()
    period = 0.25 if tty else 1.0
    last = [-1e9]

    def tick(now: float, _tl: Timeline | None, rates: list[float], phase: str) -> None:
        if now - last[0] < period:
            return
        last[0] = now
        per = " ".join(f"nic{i} {r * 8 / 1e6:4.0f}" for i, r in enumerate(rates[:nics]))
        total = sum(rates) * 8 / 1e6
        bad = nic_states(run_dirs)
        agents = ", ".join(f"n{n}:{i} {s.lower()}" for n, i, s in bad) or "all up"
        line = f"t={now:5.1f}s {phase:<18} tx {total:4.0f} Mbit/s [{per}] agents: {agents}"
        if tty:
            stream.write("\r" + line[:160] + "\x1b[K")
        else:
            stream.write(line + "\n")
        stream.flush()

    return tick


def wait_traces(agents: Sequence[AgentProc], nics: Sequence[str], timeout: float) -> None:
    """Until some agent has a finished failover (root span) of each of ``nics`` and every
    detection exported so far has its root, i.e. fail-back is done (bounded: agents end the
    failovers still open when they stop)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        spans = [s for a in agents for s in read_spans(a.trace_file)]
        roots = {s["spanId"]: s for s in spans if s.get("name") == tracing.FAILOVER}
        done = {span_attrs(s).get("network.interface.name") for s in roots.values()}
        open_ = [
            s
            for s in spans
            if s.get("name") == tracing.DETECTION and s.get("parentSpanId") not in roots
        ]
        if set(nics) <= done and not open_:
            return
        time.sleep(0.2)


def results_dict(
    tl: Timeline,
    rows: Sequence[FaultRow],
    totals: Totals,
    dets: Sequence[Detection],
    *,
    rate_mbit: int,
    quick: bool,
    ok: bool,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """What results.json holds (times in scenario seconds; shares of healthy bandwidth)."""
    bins = tl.nic_bins(0, 0.1)
    return {
        "ok": ok,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "quick": quick,
        "rate_mbit_per_nic": rate_mbit,
        "t0_wall_ns": tl.t0_wall_ns,
        **extra,
        "events": [{"t": t, **asdict(s)} for t, s in tl.events],
        "faults": [
            {
                **asdict(r.report),
                "extra_s": r.report.extra_s,
                "detect_s": r.detect_s,
                "detection": asdict(r.detection) if r.detection is not None else None,
                "bytes_checked": r.bytes_checked,
                "errors": r.errors,
                "survived": r.survived,
            }
            for r in rows
        ],
        "totals": asdict(totals),
        "detections": [{**asdict(d), "t": (d.declared_ns - tl.t0_wall_ns) / 1e9} for d in dets],
        "send": asdict(tl.result.send.summary) if tl.result.send.summary else None,
        "recv": asdict(tl.result.recv.summary) if tl.result.recv.summary else None,
        "timeline_node0_tx_Bps": [{"t": t, "nics": v} for t, v in bins],
        "recv_progress": [
            {"t": p.t - tl.harness_t0, "bytes": p.bytes, "per_conn": list(p.per_conn)}
            for p in tl.progress
        ],
    }


def _write_json(path: Path, obj: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str) + "\n")
    tmp.replace(path)


PNG_SIZE = (1000, 420)


def timeline_png(tl: Timeline, rows: Sequence[FaultRow], rate_mbit: int) -> bytes:
    """The demo's plot: node 0's tx per NIC, fault events marked, each fault's span shaded in
    its NIC's colour, the agents' detections as dashed red marks."""
    marks: list[tuple[float, str]] = []
    for t, s in tl.events:  # one label per instant ("heal nic1+nic2")
        label = s.label or s.action
        if marks and abs(marks[-1][0] - t) < 0.2 and s.action == "heal":
            marks[-1] = (marks[-1][0], marks[-1][1] + f"+nic{s.nic}")
        else:
            marks.append((t, label))
    bands = [
        (
            r.report.at,
            r.report.healed_at if r.report.healed_at is not None else tl.end,
            r.report.nic,
        )
        for r in rows
    ]
    dets = [
        (
            (r.detection.declared_ns - tl.t0_wall_ns) / 1e9,
            f"down n{r.detection.node}: {r.detection.source}",
        )
        for r in rows
        if r.detection is not None
    ]
    return render_timeline_png(
        tl.nic_bins(0, 0.1),
        marks,
        title=f"railhop demo: node 0 tx per nic, tbf {rate_mbit} mbit/s per nic",
        width=PNG_SIZE[0],
        height=PNG_SIZE[1],
        bands=bands,
        detections=dets,
    )


def run_demo(
    out_dir: Path = Path("railhop-demo"),
    *,
    rate_mbit: int = 200,
    quick: bool = False,
    no_ebpf: bool = False,
    plugin: Path | None = None,
    harness: Path | None = None,
    stream: TextIO = sys.stdout,
) -> int:
    """Run the demo; returns the exit status (0: every byte checked with zero errors and every
    fault survived; 1: not so, or the run failed; 2: cannot run here; 130: interrupted).
    ``no_ebpf``: the agents run netlink-only (no eBPF compile; the blackhole stays SUSPECT)."""
    problem = root_problem()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if plugin is not None:
        os.environ["RAILHOP_PLUGIN_PATH"] = str(plugin)
    if harness is not None:
        os.environ["RAILHOP_HARNESS_PATH"] = str(harness)
    use_source_tree_build()
    try:
        plugin_p, harness_p = paths.plugin_path(), paths.harness_path()
    except paths.NotInstalledError as e:
        print(f"railhop demo: {e}", file=sys.stderr)
        return 2
    steps, duration = demo_steps(quick)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("traces-node0.otlp.jsonl", "traces-node1.otlp.jsonl"):
        (out_dir / stale).unlink(missing_ok=True)
    # run dirs (agent.sock, health.tbl) in a short tmp path: a unix socket path has 108 bytes
    work = Path(tempfile.mkdtemp(prefix="rhdemo-"))
    print(
        f"railhop demo: 2 nodes x 4 NICs, tbf {rate_mbit} Mbit/s per NIC, one railhop agent "
        f"per node; node 0 sends to node 1 through the plugin ({plugin_p.name}), every byte "
        "checked",
        file=stream,
    )
    for st in steps:
        print(f"  at {st.at:4.1f}s: {st.label}", file=stream)
    agents: list[AgentProc] = []
    wall0 = time.monotonic()
    try:
        with Fabric(nodes=2, nics=4, rate_mbit=rate_mbit, prefix=unique_prefix("rhdemo")) as fab:
            try:
                print("starting the agents ...", file=stream, flush=True)
                for n in range(2):
                    agents.append(
                        start_agent(
                            fab,
                            n,
                            work / f"run-node{n}",
                            out_dir / f"traces-node{n}.otlp.jsonl",
                            out_dir / f"agent-node{n}.log",
                            lifetime_s=duration + EBPF_WAIT_S + 180.0,
                            sources=("netlink",) if no_ebpf else AGENT_SOURCES,
                        )
                    )
                wait_agents_ready(fab, agents, 60.0)
                ebpf: list[EbpfOutcome] = []
                if not no_ebpf:
                    print(
                        "agents up (netlink); waiting for their eBPF sources to attach "
                        f"(bcc compiles them; at most {EBPF_WAIT_S:g} s) ...",
                        file=stream,
                        flush=True,
                    )
                    ebpf = wait_ebpf(fab, agents, EBPF_WAIT_S, stream)
                    print(ebpf_summary(ebpf), file=stream)
                ebpf_ok = ebpf_corroborates(ebpf)
                if not ebpf_ok:
                    why = "--no-ebpf" if no_ebpf else "eBPF TCP lane source not attached"
                    print(f"railhop demo: {why}: {NETLINK_ONLY_NOTE}", file=stream, flush=True)
                print("traffic ...", file=stream, flush=True)
                tick = live_printer(stream, 4, [a.run_dir for a in agents])
                tl = run_scenario(fab, steps, duration, on_tick=tick, workdir=work)
                print("", file=stream)
                faulted = sorted({f"nic{s.nic}" for s in steps if s.is_fault and s.node == 0})
                wait_traces(agents, faulted, 15.0)
                agent_metrics: dict[int, dict[str, float]] = {}
                for a in agents:
                    with contextlib.suppress(OSError):
                        agent_metrics[a.node] = {
                            k: v
                            for k, v in scrape(fab, a.node).items()
                            if k.startswith(
                                (
                                    "railhop_failovers_total",
                                    "railhop_detection_latency_seconds_count",
                                    "railhop_detection_latency_seconds_sum",
                                )
                            )
                        }
            finally:
                codes = {a.node: a.stop() for a in agents}
    except KeyboardInterrupt:
        print("\nrailhop demo interrupted: agents stopped, fabric removed", file=sys.stderr)
        return 130
    except (FabricError, HarnessError, DemoError, OSError) as e:
        print(f"\nrailhop demo failed: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)

    dets: list[Detection] = []
    for a in agents:
        dets += detections(read_spans(a.trace_file), a.node)
    trace_path = out_dir / "traces.otlp.json"
    nspans = merge_otlp([a.trace_file for a in agents], trace_path)
    for a in agents:
        a.trace_file.unlink(missing_ok=True)
    rows = fault_rows(tl, dets)
    totals = totals_of(tl)
    ok = demo_ok(tl.result.ok, rows, totals)
    print(summary_table(rows, totals), file=stream)
    if not ebpf_ok:
        print(f"  (agents ran netlink-only: {NETLINK_ONLY_SHORT})", file=stream)
    other = [d for d in dets if not any(r.detection is not None and r.detection == d for r in rows)]
    for d in other:
        print(
            f"  also: {d.nic} declared down at {(d.declared_ns - tl.t0_wall_ns) / 1e9:.2f}s by "
            f"{d.label}",
            file=stream,
        )
    extra = {
        "plugin": str(plugin_p),
        "harness": str(harness_p),
        "agents_exit": codes,
        "agent_sources": "netlink+ebpf" if ebpf_ok else "netlink-only",
        "ebpf": [asdict(o) for o in ebpf],
        "agent_metrics": agent_metrics,
        "trace_spans": nspans,
        "wall_s": time.monotonic() - wall0,
    }
    _write_json(
        out_dir / "results.json",
        results_dict(tl, rows, totals, dets, rate_mbit=rate_mbit, quick=quick, ok=ok, extra=extra),
    )
    png_path = out_dir / "timeline.png"
    try:
        png_path.write_bytes(timeline_png(tl, rows, rate_mbit))
        plot = str(png_path)
    except PlotUnavailableError as e:  # the lab without its plot extra: the rest still counts
        plot = f"none ({e})"
    print(
        f"results: {out_dir / 'results.json'}  plot: {plot}  traces: {trace_path} ({nspans} spans)",
        file=stream,
    )
    if not ok:
        print(
            "railhop demo: NOT every byte checked with zero errors / every fault survived",
            file=sys.stderr,
        )
        print(tl.result.describe(), file=sys.stderr)
    elif any(c not in (0, None) for c in codes.values()):
        print(f"railhop demo: an agent exited with {codes}", file=sys.stderr)
    return 0 if ok else 1
