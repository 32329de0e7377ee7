#!/usr/bin/env python3
"""Where the time goes between a NIC fault and the moved connections back at full rate (issue 18).

Node 0 sends to node 1 through the plugin (harness: 8 connections, 512 KiB messages, 8 in flight
per connection, every byte checked) on the emulated fabric (2 nodes x 4 NICs, ``tbf`` on both
veth ends). Each round starts a fresh harness pair, lets every connection run for 3 s (the
plugin's rate baseline), then faults node 0's nic1 (the connections 1 and 5 use it): carrier
loss (the node-side veth goes down), a silent blackhole (carrier up, every frame dropped), or
``none``: no fault, the control that shows what the fabric does to the same measures anyway.
"agent" rounds use a railhop agent per node (netlink + eBPF sources) through the run directory;
"alone" rounds a run directory nobody serves.

The queue (``--queues``) is the switch port's; ``--host-queues`` sets the nodes' own NIC queues,
where the sender's packets wait (``same``: as deep as the switch's; the table's queue column
then reads e.g. ``5ms/h100``). A host queue shallower than its TCP sockets may fill drops the
sender's own packets, and TCP waits at least 200 ms before it tries such a socket again; a
real host's NIC pushes back into a deep qdisc instead (docs/BENCHMARKS.md, Resume breakdown).
``--host-qdisc`` sets how that queue is shared: ``fifo`` (one tbf: a new TCP flow waits behind
the standing queue of every other flow on the NIC) or ``flows`` (a queue per flow under one
ceiling, as a real host's fq_codel: the queue column gets ``+fl``).

Marks, in ms after the fault, from the sender's plugin log (the harness's timestamps; each mark
is the LATEST over the hit connections, so a round's row says when every hit connection got
there) and, for the stall, the receiver's per-connection progress (every 20 ms):

  detect     the first sign: NIC marked down / agent SUSPECT or DOWN / a lane's no-progress
             probe started / the lane failed
  decide     the lane declared failed: the move is decided (or, moved on the peer's word, the
             peer's RESUME applied)
  open       the first backup lane's connect started
  handshake  the first backup lane up (its HELLO is the pair's health probe)
  resume     the peer's RESUME record applied: the new path confirmed end to end, the replay
             queued
  rp.sent    every replayed chunk handed to a lane (nothing to replay: at the resume)
  rp.acked   every replayed message acknowledged (nothing to replay: at the resume)
  first      the first request completed after the move (FAILOVER_END, the WARN line)
  fair       the connection's completion rate back within 90 % of its share of the NICs left
  stall      the longest gap between completions on ANY connection after the fault (receiver)

  healthy    the receiver's total Mbit/s over the 2 s before the fault
  1-down     the same from 1 s after the fault to the heal (3 of 4 NICs)

Printed: the median over the rounds of each mark (missing marks are counted, not guessed).
--tcpstat adds a line per round: its marks, the connection with the longest gap and when the
gap began, the longest gap over the 2 s before the fault (what a healthy fabric shows), the
packets the sender's own NIC queues dropped, and the kernel's TCP counter deltas of both nodes
over the faulted interval (sender/receiver: SYN retransmits, RTOs, loss probes, fast and
slow-start retransmits, retransmitted segments, active opens). --logs DIR keeps every round's
plugin logs.

    sudo .venv/bin/python bench/resume_breakdown.py [--rounds 5] [--rates 1000] [--queues 5,50]
         [--host-queues same,100] [--host-qdisc fifo,flows] [--faults none,carrier,blackhole]
         [--agent alone,agent]
         [--full] [--env NAME=VALUE] [--tcpstat] [--logs DIR] [--json out.json]

The default matrix (1 Gbit/s, 5 ms and 50 ms queues, no fault and both faults, with and without
the agent, 5 rounds: 60 rounds) takes ~15 minutes on a 2-core VM; ``--full`` adds 200 Mbit/s
and unlimited NICs (180 rounds).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import _common

_common.setup_import_path()

from agent_bench import Agents, fresh  # noqa: E402
from railhop_lab.fabric import HOST_QDISCS, Fabric, unique_prefix  # noqa: E402
from railhop_lab.harness import (  # noqa: E402
    HarnessConfig,
    HarnessRun,
    longest_gap,
    longest_stall,
    rate_between,
    use_source_tree_build,
    wait_for_bytes,
)

KiB, MiB = 1 << 10, 1 << 20
CONNS = 8
FAULT_NIC = 1
WARM_S = 3.0  # traffic before the fault: the plugin's rate baseline
AFTER_S = {"carrier": 3.0, "blackhole": 4.0, "none": 3.0}
HEALED_S = 3.0  # traffic after the heal: fail-back, which is the agent's evidence the NIC is good
# The shipped default (permissive) with flap damping that forgets within a round: every round
# faults the same NIC, and a growing hold-off would keep it down into the next rounds.
POLICY = (
    (_common.REPO / "policies" / "permissive.yaml")
    .read_text()
    .replace("name: permissive", "name: bench-resume-breakdown")
    .replace("holdoff_initial_ms: 1000", "holdoff_initial_ms: 300")
    .replace("holdoff_max_ms: 60000", "holdoff_max_ms: 300")
    .replace("reset_after_ms: 60000", "reset_after_ms: 1000")
)
AGENT = """
import logging, sys
from pathlib import Path
from railhop import daemon
logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(asctime)s %(name)s %(levelname)s %(message)s")
cfg = daemon.AgentConfig(
    run_dir=Path(sys.argv[1]), nics=("nic0", "nic1", "nic2", "nic3"),
    sources=tuple(x for x in sys.argv[2].split(",") if x), heartbeat_ms=100,
    duration_s=float(sys.argv[3]), policy_path=Path(sys.argv[4]))
sys.exit(daemon.run_agent(cfg))
"""


class PolicyAgents(Agents):
    """agent_bench's agents (one per node, in its netns), with POLICY."""

    def __init__(self, fab: Fabric, workdir: Path, sources: str, life: float = 3600) -> None:
        self.fab, self.workdir, self.sources = fab, workdir, sources
        env = {**os.environ, "PYTHONPATH": _common.agent_pythonpath()}
        self.procs: list[Any] = []
        self.logs: list[Path] = []
        workdir.mkdir(parents=True, exist_ok=True)
        policy = workdir / "policy.yaml"
        policy.write_text(POLICY)
        for node in range(fab.nodes):
            run_dir = workdir / f"run-node{node}"
            run_dir.mkdir(parents=True, exist_ok=True)
            log = workdir / f"agent{node}.log"
            with log.open("w") as err:
                argv = [sys.executable, "-c", AGENT, str(run_dir), sources, f"{life:g}"]
                self.procs.append(fab.popen(node, [*argv, str(policy)], env, stderr=err))
            self.logs.append(log)


MARKS = (
    "detect",
    "decide",
    "open",
    "handshake",
    "resume",
    "rp.sent",
    "rp.acked",
    "first",
    "fair",
)

LINE = re.compile(r"^\[\s*([0-9.]+)\] (.*)$", re.M)
CONN = re.compile(r"conn ([0-9a-f]{16})")


def parse_log(text: str) -> list[tuple[float, str]]:
    return [(float(m.group(1)), m.group(2)) for m in LINE.finditer(text)]


def mark_names(
    s: str, mk: dict[str, float], failed: re.Pattern[str], moved: re.Pattern[str]
) -> list[str]:
    """The marks one log line of a hit connection sets (the first occurrence of each counts)."""
    if "made no progress" in s:
        return ["suspect"]
    if failed.search(s):
        return ["decide"]
    if "opening lane" in s and "decide" in mk:
        return ["open"]
    if re.search(r"\(send\): standby lane \d+ .* promoted", s) and "decide" in mk:
        return ["open", "handshake"]  # a warm standby: opened and handshaken before the move
    if re.search(r"\(send\): lane \d+ up ", s) and "(standby)" not in s and "decide" in mk:
        return ["handshake"]
    if "RESUME applied" in s:
        return ["resume", "decide"]
    if "nothing to replay" in s:
        return ["rp.sent", "rp.acked"]
    if "replay sent" in s:
        return ["rp.sent"]
    if "replay acknowledged" in s:
        return ["rp.acked"]
    if moved.search(s):
        return ["first"]
    if "at fair share" in s and "first" in mk:
        return ["fair"]
    return []


def marks(lines: Sequence[tuple[float, str]], nic: str, t_fault: float) -> dict[str, Any]:
    """The marks of one round (ms after the fault; None: not reached by every hit connection)."""
    after = [(t, s) for t, s in lines if t >= t_fault - 0.01]
    node = [
        t
        for t, s in after
        if f"NIC {nic} marked down" in s
        or f"agent marks {nic} suspect" in s
        or f"agent marks {nic} down" in s
    ]
    failed = re.compile(rf"\(send\): lane \d+ {nic} -> peer NIC \d+ failed")
    moved = re.compile(rf"\(send\): failover off {nic} ")
    hits: dict[str, dict[str, float]] = {}
    for _t, s in after:
        m = CONN.search(s)
        if m is None:
            continue
        cid = m.group(1)
        if failed.search(s) or moved.search(s):
            hits.setdefault(cid, {})
    for cid, mk in hits.items():
        for t, s in after:
            if cid in s:
                for name in mark_names(s, mk, failed, moved):
                    mk.setdefault(name, t)
        mk["detect"] = min([mk.get("suspect", 1e9), mk.get("decide", 1e9), *node])
    out: dict[str, Any] = {"hit": len(hits)}
    for name in MARKS:
        vals = [mk.get(name) for mk in hits.values()]
        ok = bool(vals) and all(v is not None and v < 1e8 for v in vals)
        out[name] = (max(v for v in vals if v is not None) - t_fault) * 1e3 if ok else None
    return out


def agents_settled(agents: Agents, nic: str, timeout: float = 10.0) -> bool:
    """Until every agent's last word on ``nic`` is that it is up (bounded)."""
    pat = re.compile(rf"{nic}: (\w+) -> (\w+)")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = [pat.findall(log.read_text()) for log in agents.logs]
        if all(not x or x[-1][1] == "up" for x in last):
            return True
        time.sleep(0.2)
    return False


TCP_COUNTERS = (
    "TcpExt:TCPSynRetrans",
    "TcpExt:TCPTimeouts",
    "TcpExt:TCPLossProbes",
    "TcpExt:TCPFastRetrans",
    "TcpExt:TCPSlowStartRetrans",
    "Tcp:RetransSegs",
    "Tcp:ActiveOpens",
)


def tcp_counters(fab: Fabric, node: int) -> dict[str, int]:
    """The node's kernel TCP counters (/proc/net/netstat and /proc/net/snmp in its netns)."""
    out = fab.run(node, ["cat", "/proc/net/netstat", "/proc/net/snmp"], timeout=5).stdout
    got: dict[str, int] = {}
    lines = out.splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        keys, vals = names.split(), values.split()
        if not keys or keys[0] != vals[0]:
            continue
        for k, v in zip(keys[1:], vals[1:], strict=False):
            if v.lstrip("-").isdigit():
                got[f"{keys[0]}{k}"] = int(v)
    return {k: got.get(k, 0) for k in TCP_COUNTERS}


class HostQueueSampler:
    """Samples node 0's NIC queues (bytes waiting) every ``every`` s in a thread, from start to
    stop: the standing queue a new TCP flow on that NIC waits behind (``on``: --tcpstat only,
    as the sampling costs CPU on a small host)."""

    def __init__(self, fab: Fabric, every: float = 0.1, on: bool = True) -> None:
        self.fab, self.every, self.on = fab, every, on
        self.samples: list[tuple[float, list[int]]] = []  # (monotonic, backlog per NIC)
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._body, name="host-queue-sampler", daemon=True)

    def _body(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append((time.monotonic(), [q.backlog for q in self.fab.host_queues(0)]))

    def __enter__(self) -> HostQueueSampler:
        if self.on:
            self._th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.on:
            self._th.join(5.0)

    def median_ms(
        self, t0: float, t1: float, nics: Sequence[int], rate_mbit: int | None
    ) -> float | None:
        """The median over [t0, t1) (monotonic) of the mean backlog of ``nics``, in ms at the
        rate (None without a rate or samples)."""
        vals = [sum(b[i] for i in nics) / len(nics) for t, b in self.samples if t0 <= t < t1]
        if not vals or not rate_mbit:
            return None
        return _common.median(vals) / (rate_mbit * 125.0)  # bytes / (bytes per ms)


def one_round(
    fab: Fabric,
    fault: str,
    workdir: Path,
    seed: int,
    extra_env: dict[str, str],
    tcpstat: bool = False,
) -> dict[str, Any]:
    cfg = HarnessConfig(
        conns=CONNS,
        sizes=(512 * KiB,),
        inflight=8,
        duration=WARM_S + AFTER_S[fault] + HEALED_S + 1.0,
        deadline=60.0,
        interval_ms=20,
        seed=seed,
    )
    env = {"RAILHOP_HARNESS_VERBOSE": "1", **extra_env}
    with (
        HarnessRun(fab, cfg, env=env, workdir=workdir) as run,
        HostQueueSampler(fab, on=tcpstat) as hq,
    ):
        wait_for_bytes(run, 8 * MiB, timeout=30)
        time.sleep(max(0.0, run.started_at + 1.0 + WARM_S - time.monotonic()))
        before = [tcp_counters(fab, n) for n in range(2)] if tcpstat else []
        drops0 = [q.drops for q in fab.host_queues(0)]
        t_fault = time.monotonic() - run.started_at
        if fault == "carrier":
            fab.carrier_down(0, FAULT_NIC)
        elif fault == "blackhole":
            fab.blackhole(0, FAULT_NIC)
        time.sleep(max(0.0, run.started_at + t_fault + AFTER_S[fault] - time.monotonic()))
        after = [tcp_counters(fab, n) for n in range(2)] if tcpstat else []
        drops1 = [q.drops for q in fab.host_queues(0)]
        fab.heal_all()
        res = run.wait()
        send_log = (workdir / "send.stderr").read_text()
    fab.heal_all()
    out = marks(parse_log(send_log), fab.ifname(FAULT_NIC), t_fault)
    prog = res.recv.progress
    end = t_fault + AFTER_S[fault] - 0.2
    gaps = [longest_gap(prog, start=t_fault, end=end, conn=c) for c in range(CONNS)]
    worst = max(range(CONNS), key=lambda c: gaps[c][0])
    out["stall"] = gaps[worst][0] * 1e3
    out["stall_conn"] = worst
    out["stall_at"] = (gaps[worst][1] - t_fault) * 1e3
    # the same measure over the 2 s before the fault: what a healthy fabric shows anyway
    out["healthy_gap"] = 1e3 * max(
        longest_stall(prog, start=t_fault - 2.0, end=t_fault, conn=c) for c in range(CONNS)
    )
    # the receiver's total rate (Mbit/s): healthy before the fault, degraded from 1 s after it
    out["healthy"] = rate_between(prog, t_fault - 2.0, t_fault) * 8e-6
    out["degraded"] = rate_between(prog, t_fault + 1.0, end) * 8e-6
    out["ok"] = res.ok and res.data_errors == 0
    # packets the sender's own NIC queues dropped during the faulted interval (never sent)
    out["host_drops"] = sum(drops1) - sum(drops0)
    # the standing queue at the NICs the moved traffic goes to, before and during the fault
    left = [i for i in range(fab.nics) if i != FAULT_NIC]
    t0 = run.started_at + t_fault
    out["host_queue_ms"] = [
        hq.median_ms(t0 - 1.0, t0, left, fab.rate_mbit),
        hq.median_ms(t0 + 0.1, t0 + AFTER_S[fault], left, fab.rate_mbit),
    ]
    if tcpstat:
        # counter deltas over the faulted interval, sender (node 0) and receiver (node 1)
        pairs = zip(before, after, strict=True)
        out["tcp"] = [{k: a[k] - b[k] for k in TCP_COUNTERS} for b, a in pairs]
    return out


def keep_logs(wd: Path, dest: Path, tag: str) -> None:
    """Copy a round's harness logs (both plugins' lines, progress) to ``dest`` (--logs)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("send.stderr", "recv.stderr"):
        if (wd / name).is_file():
            shutil.copyfile(wd / name, dest / f"{tag}-{name.replace('.stderr', '.log')}")


def tcp_line(r: dict[str, Any]) -> str:
    """One round's marks and TCP counter deltas (sender / receiver), for --tcpstat."""
    mk = " ".join(f"{m}={fmt(r.get(m)).strip()}" for m in ("resume", "first", "fair", "stall"))
    mk += f" (conn {r['stall_conn']} from {r['stall_at']:.0f}; healthy {r['healthy_gap']:.0f})"
    short = {k: k.split(":")[1].replace("TCP", "") for k in TCP_COUNTERS}
    tcp = " ".join(f"{short[k]}={r['tcp'][0][k]}/{r['tcp'][1][k]}" for k in TCP_COUNTERS)
    q = "/".join("-" if v is None else f"{v:.1f}" for v in r["host_queue_ms"])
    return f"{mk} | host queue {q} ms, drops {r['host_drops']} | {tcp}"


def fmt(v: float | None) -> str:
    return "       -" if v is None else f"{v:8.0f}"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    s: dict[str, Any] = {"rounds": len(rows), "ok": sum(bool(r["ok"]) for r in rows)}
    for name in (*MARKS, "stall"):
        vals = [r[name] for r in rows if r.get(name) is not None]
        s[name] = _common.median(vals) if vals else None
        s[f"{name}_n"] = len(vals)
    s["stall_max"] = max((r["stall"] for r in rows), default=None)
    for name in ("healthy", "degraded"):
        s[name] = _common.median([r[name] for r in rows])
    return s


def header() -> str:
    cols = " ".join(f"{m:>8}" for m in (*MARKS, "stall", "max", "healthy", "1-down"))
    return f"{'rate':>6} {'queue':>12} {'fault':>9} {'agent':>6} {'ok':>4} | {cols}"


def row(
    rate: int | None,
    queue: int,
    fault: str,
    agent: str,
    s: dict[str, Any],
    host: int | None = None,
    qdisc: str = "fifo",
) -> str:
    r = "unlim" if rate is None else f"{rate}M"
    q = "-" if rate is None else f"{queue}ms" + (f"/h{host}" if host else "")
    q += "+fl" if rate is not None and qdisc == "flows" else ""
    vals = " ".join(fmt(s[m]) for m in (*MARKS, "stall"))
    misses = [m for m in MARKS if s[f"{m}_n"] < s["rounds"]] if fault != "none" else []
    note = f"  (missing in some rounds: {','.join(misses)})" if misses else ""
    return (
        f"{r:>6} {q:>12} {fault:>9} {agent:>6} {s['ok']}/{s['rounds']} | {vals} "
        f"{fmt(s['stall_max'])} {fmt(s['healthy'])} {fmt(s['degraded'])}{note}"
    )


def cells(
    rates: list[int | None],
    queues: list[int],
    hosts: list[int | None],
    faults: list[str],
    modes: list[str],
    qdiscs: Sequence[str] = ("fifo",),
) -> Iterator[tuple[int | None, int, int | None, str, str, str]]:
    """The matrix in run order: (rate, switch queue, host queue, fault, agent mode, host qdisc).
    Unlimited NICs have no queue, so they run once whatever the queue lists say."""
    for rate in rates:
        for queue in queues if rate is not None else queues[:1]:
            for host in hosts if rate is not None else hosts[:1]:
                for qdisc in qdiscs if rate is not None else qdiscs[:1]:
                    for fault in faults:
                        for mode in modes:
                            yield rate, queue, host, fault, mode, qdisc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rates", default="1000", help="Mbit/s per NIC, 0 = unlimited")
    ap.add_argument("--queues", default="5,50", help="tbf queue (latency) in ms")
    ap.add_argument(
        "--faults",
        default="none,carrier,blackhole",
        help="carrier, blackhole, none (no fault: what the fabric shows anyway)",
    )
    ap.add_argument(
        "--host-queues",
        default="same",
        help="the nodes' own NIC queues in ms, or 'same' as --queues (the switch side keeps"
        " --queues); a shallow one drops the sender's own packets, which real hosts rarely do",
    )
    ap.add_argument(
        "--host-qdisc",
        default="fifo",
        help="how the nodes' NIC queues are shared: fifo (one queue), flows (a queue per flow,"
        " as a real host's fq_codel), or both: fifo,flows",
    )
    ap.add_argument("--agent", default="alone,agent")
    ap.add_argument("--full", action="store_true", help="rates 200,1000,0")
    ap.add_argument(
        "--env", action="append", default=[], help="NAME=VALUE for both plugins (repeatable)"
    )
    ap.add_argument(
        "--tcpstat", action="store_true", help="also print kernel TCP counter deltas per round"
    )
    ap.add_argument("--logs", help="keep every round's plugin logs in this directory")
    ap.add_argument("--json")
    args = ap.parse_args()
    _common.need_root("resume_breakdown")
    use_source_tree_build()
    rates = [int(x) or None for x in ("200,1000,0" if args.full else args.rates).split(",")]
    queues = [int(x) for x in args.queues.split(",")]
    hosts = [None if x == "same" else int(x) for x in args.host_queues.split(",") if x]
    qdiscs = [q for q in args.host_qdisc.split(",") if q]
    if not qdiscs or any(q not in HOST_QDISCS for q in qdiscs):
        ap.error(f"--host-qdisc: want one or more of {','.join(HOST_QDISCS)}")
    faults = [f for f in args.faults.split(",") if f]
    bad = [f for f in faults if f not in AFTER_S]
    if bad:
        ap.error(f"--faults: unknown {','.join(bad)} (carrier, blackhole, none)")
    modes = [m for m in args.agent.split(",") if m]
    extra = dict(kv.split("=", 1) for kv in args.env)
    print(f"resume breakdown on {_common.machine()}, {_common.stamp()}")
    print(f"{CONNS} connections, 512 KiB messages, 8 in flight; fault on node 0 nic1; ms after it")
    if extra:
        print("plugin environment: " + " ".join(f"{k}={v}" for k, v in extra.items()))
    results: list[dict[str, Any]] = []
    lines = [header()]
    seed = 1
    with tempfile.TemporaryDirectory(prefix="rh-breakdown-") as tmpd:
        tmp = Path(tmpd)
        first = rates[0]
        with Fabric(
            nodes=2,
            nics=4,
            rate_mbit=first,
            queue_ms=queues[0],
            prefix=unique_prefix("rhbd"),
        ) as fab:
            agents = None
            served = tmp / "agent"
            if "agent" in modes:
                agents = PolicyAgents(fab, served, "netlink,ebpf")
                print(f"agents ready in {agents.wait_ready():.1f} s")
            try:
                shaped: tuple[int | None, int, int | None, str] | None = None
                matrix = cells(rates, queues, hosts, faults, modes, qdiscs)
                for rate, queue, host, fault, mode, qdisc in matrix:
                    if shaped != (rate, queue, host, qdisc):
                        fab.set_rate(rate, queue, host, qdisc)
                        shaped = (rate, queue, host, qdisc)
                    rows = []
                    for _ in range(args.rounds):
                        nic = fab.ifname(FAULT_NIC)
                        if agents is not None and not agents_settled(agents, nic):
                            # held (e.g. blackholed with no traffic to prove it good): start
                            # fresh agents
                            print(f"  (restarting the agents: {nic} held)")
                            agents.stop()
                            agents = PolicyAgents(fab, served, "netlink,ebpf")
                            agents.wait_ready()
                        wd = fresh(tmp, served if mode == "agent" else None)
                        seed += 1
                        r = one_round(fab, fault, wd, seed, extra, args.tcpstat)
                        rows.append(r)
                        if args.logs:
                            keep_logs(wd, Path(args.logs), f"{fault}-{mode}-{seed}")
                        if args.tcpstat:
                            print(f"    round: {tcp_line(r)}", flush=True)
                    s = summarize(rows)
                    line = row(rate, queue, fault, mode, s, host, qdisc)
                    print(line, flush=True)
                    lines.append(line)
                    results.append(
                        {
                            "rate_mbit": rate,
                            "queue_ms": queue,
                            "host_queue_ms": host,
                            "host_qdisc": qdisc,
                            "fault": fault,
                            "agent": mode,
                            "summary": s,
                            "rounds": rows,
                        }
                    )
            finally:
                if agents is not None:
                    agents.stop()
    print(
        "\nmedian ms after the fault (stall, max: longest gap on any connection); healthy and"
        " 1-down: the receiver's total Mbit/s in the 2 s before the fault and from 1 s after it"
    )
    print("\n".join(lines))
    _common.write_json(
        args.json, {"bench": "resume_breakdown", "date": _common.stamp(), "results": results}
    )
    return 0 if all(r["summary"]["ok"] == r["summary"]["rounds"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
