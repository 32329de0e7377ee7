#!/usr/bin/env python3
"""The node agent's effect on failover, measured side by side in one run (issues 6 and 7).

Node 0 sends to node 1 through the plugin (harness, every byte checked) on the emulated fabric
(2 nodes x 4 NICs). The agent runs inside each node's netns (its own run dir, which the
plugins of that node use through RAILHOP_RUN_DIR); "no agent" runs use a run dir nobody serves.

  a  carrier loss on node0 nic1: extra time of the hit step, agent vs none      (<= 0.1 s)
  b  4 processes share blackholed nic1; process 0 has the 1 s completion timeout, the others
     RAILHOP_COMPLETION_TIMEOUT=4000: the others' stall after process 0 resumed  (<= 0.1 s)
  c  agent CPU, all sources on, harness traffic flowing, /proc/<pid>/stat over 20 s (< 2 %)
  d  silent blackhole on node0 nic1 with agent + eBPF vs none: extra step time (<= 0.4 s)
  e  plugin throughput (unlimited veths) with every probe attached vs none       (>= 0.97)
     (wall clock, one A/B pair: noisy on a shared VM; bench/probe_bench.py measures the probes'
     CPU cost with BPF run-time statistics and interleaves several A/B rounds)

    sudo RAILHOP_PLUGIN_PATH=build/agent/plugin/libnccl-net-railhop.so \\
         RAILHOP_HARNESS_PATH=build/agent/plugin/railhop-harness \\
         .venv/bin/python bench/agent_bench.py [--only a,b,c,d,e] [--rate-mbit 200|0] \\
         [--repeat N] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _common

_common.setup_import_path()

from railhop import paths  # noqa: E402
from railhop_lab.fabric import Fabric, unique_prefix  # noqa: E402
from railhop_lab.harness import (  # noqa: E402
    HarnessConfig,
    HarnessRun,
    Progress,
    use_source_tree_build,
    wait_for_bytes,
)
from railhop_lab.scenario import Step, fault_report, run_scenario  # noqa: E402

MiB = 1 << 20
NICS = ("nic0", "nic1", "nic2", "nic3")
AGENT = """
import logging, sys
from pathlib import Path
from railhop import daemon
logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(asctime)s %(name)s %(levelname)s %(message)s")
usdt = Path(sys.argv[4]) if sys.argv[4] else None
cfg = daemon.AgentConfig(
    run_dir=Path(sys.argv[1]), nics=("nic0", "nic1", "nic2", "nic3"),
    sources=tuple(x for x in sys.argv[2].split(",") if x), heartbeat_ms=100,
    duration_s=float(sys.argv[3]), usdt_lib=usdt)
sys.exit(daemon.run_agent(cfg))
"""


class Agents:
    """One agent per node, in the node's netns, serving ``workdir/run-node<n>``."""

    def __init__(
        self, fab: Fabric, workdir: Path, sources: str, usdt: bool = False, life: float = 600
    ) -> None:
        self.fab, self.workdir, self.sources = fab, workdir, sources
        env = {**os.environ, "PYTHONPATH": _common.agent_pythonpath()}
        self.procs: list[Any] = []
        self.logs: list[Path] = []
        lib = str(paths.plugin_path()) if usdt else ""
        for node in range(fab.nodes):
            run_dir = workdir / f"run-node{node}"
            run_dir.mkdir(parents=True, exist_ok=True)
            log = workdir / f"agent{node}.log"
            with log.open("w") as err:
                argv = [sys.executable, "-c", AGENT, str(run_dir), sources, f"{life:g}", lib]
                self.procs.append(fab.popen(node, argv, env, stderr=err))
            self.logs.append(log)

    def wait_ready(self, timeout: float = 240.0) -> float:
        """Until every node's table exists and every background (eBPF) source is up."""
        t0 = time.monotonic()
        want = ["ebpf.carrier", "ebpf.tcp"] if "ebpf" in self.sources else []
        for node, (p, log) in enumerate(zip(self.procs, self.logs, strict=True)):
            while True:
                text = log.read_text()
                if p.poll() is not None:
                    raise RuntimeError(f"agent {node} exited: {text[-2000:]}")
                table = self.workdir / f"run-node{node}" / "health.tbl"
                done = all(
                    f"source {w} started" in text or f"source {w} failed" in text for w in want
                )
                if table.exists() and done:
                    break
                if time.monotonic() - t0 > timeout:
                    raise RuntimeError(f"agent {node} not ready: {text[-2000:]}")
                time.sleep(0.2)
        return time.monotonic() - t0

    def capabilities(self) -> list[str]:
        return [
            ln.split(" INFO ", 1)[-1]
            for ln in self.logs[0].read_text().splitlines()
            if "attached" in ln or "skipped" in ln
        ]

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(15)
            except Exception:
                p.kill()


_SEQ = [0]


def fresh(tmp: Path, served: Path | None, nodes: int = 2) -> Path:
    """A new harness work dir (its own rendezvous) whose run-node<n> are the agents' run dirs
    (``served``) or empty ones nobody serves (``None``)."""
    _SEQ[0] += 1
    wd = tmp / f"w{_SEQ[0]}"
    wd.mkdir(parents=True)
    for n in range(nodes):
        if served is None:
            (wd / f"run-node{n}").mkdir()
        else:
            (wd / f"run-node{n}").symlink_to(served / f"run-node{n}")
    return wd


def scenario(fab: Fabric, action: str, workdir: Path) -> tuple[float, bool, str]:
    steps = [Step(2.0, action, 0, 1, f"{action} nic1"), Step(4.5, "heal", 0, 1, "heal nic1")]
    tl = run_scenario(fab, steps, 6.5, workdir=workdir)
    rep = fault_report(tl, 0)
    return rep.extra_s, tl.result.ok, tl.result.describe() if not tl.result.ok else ""


def resume_after(prog: Sequence[Progress], t_fault: float, conn: int) -> float | None:
    """Harness time at which ``conn`` moved bytes again after the stall that follows t_fault."""
    before = [p for p in prog if p.t <= t_fault]
    if not before:
        return None
    base = before[-1].per_conn[conn]
    # skip bytes still in the pipe: the stall starts at the first sample without progress
    last, stalled = base, False
    for p in prog:
        if p.t <= t_fault:
            continue
        v = p.per_conn[conn]
        if v == last:
            stalled = True
        elif stalled:
            return p.t
        last = v
    return None


def shared_nic(
    fab: Fabric, tmp: Path, served: Path | None, procs: int = 4
) -> tuple[list[float], bool]:
    """``procs`` send/recv pairs, connection 0 of each on nic1 (devs 1,0); process 0 has the
    default completion timeout, the others 4 s. Blackhole nic1; returns each process's resume
    time (s after the fault) and whether every byte checked out."""
    runs = []
    for i in range(procs):
        cfg = HarnessConfig(
            conns=2, devs=(1, 0), sizes=(256 * 1024,), duration=9.0, deadline=60, interval_ms=10
        )
        env = {} if i == 0 else {"RAILHOP_COMPLETION_TIMEOUT": "4000"}
        runs.append(HarnessRun(fab, cfg, env=env, workdir=fresh(tmp, served)))
    for r in runs:
        r.start()
    try:
        for r in runs:
            wait_for_bytes(r, 2 * MiB, timeout=40)
        time.sleep(1.0)
        t_fault = time.monotonic()
        fab.blackhole(0, 1)
        time.sleep(5.5)
        fab.heal(0, 1)
        results = [r.wait() for r in runs]
    finally:
        for r in runs:
            r.kill()
    out = []
    for r, res in zip(runs, results, strict=True):
        t = resume_after(res.recv.progress, t_fault - r.started_at, 0)
        out.append(float("nan") if t is None else t - (t_fault - r.started_at))
    return out, all(res.ok for res in results)


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def throughput(
    fab: Fabric, tmp: Path, served: Path | None, seconds: float = 4.0
) -> tuple[float, bool]:
    cfg = HarnessConfig(conns=4, sizes=(4 * MiB,), duration=seconds, deadline=60)
    with HarnessRun(fab, cfg, workdir=fresh(tmp, served)) as run:
        res = run.wait()
    s = res.recv.summary
    return (s.gbps if s is not None else 0.0), res.ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", default="a,b,c,d,e")
    ap.add_argument(
        "--rate-mbit", type=int, default=200, help="tbf per NIC; 0 = unlimited veths (a-d)"
    )
    ap.add_argument("--repeat", type=int, default=1, help="rounds of (a) and (d), interleaved")
    ap.add_argument("--json")
    args = ap.parse_args()
    which = set(args.only.split(","))
    if args.repeat < 1 or args.rate_mbit < 0:
        ap.error("--repeat >= 1 and --rate-mbit >= 0")
    _common.need_root("bench/agent_bench.py")
    use_source_tree_build()
    try:
        plugin = paths.plugin_path()
        paths.harness_path()
    except paths.NotInstalledError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"railhop agent bench | {_common.stamp()} | {_common.machine()}")
    print(f"  plugin {plugin}; 2 shared cores: expect noise")
    out: dict[str, Any] = {}
    ok = True
    tmp = Path(tempfile.mkdtemp(prefix="rh-agent-bench-"))
    served = tmp / "agent"
    if which & {"a", "b", "c", "d"}:
        rate = args.rate_mbit or None
        with Fabric(nodes=2, nics=4, rate_mbit=rate, prefix=unique_prefix("rhab")) as fab:
            agents = Agents(fab, served, "netlink,sysfs,ebpf", usdt="c" in which)
            try:
                took = agents.wait_ready()
                print(f"  agents up (eBPF compiled) in {took:.1f} s; capability report, node 0:")
                for line in agents.capabilities():
                    print(f"    {line}")
                for rnd in range(args.repeat if "a" in which else 0):
                    none, ok0, why0 = scenario(fab, "carrier", fresh(tmp, None))
                    fab.heal_all()
                    with_, ok1, why1 = scenario(fab, "carrier", fresh(tmp, served))
                    fab.heal_all()
                    ok &= ok0 and ok1
                    ratio = with_ / none if none else float("nan")
                    print(
                        f"[a] round {rnd + 1}: carrier loss, extra step time: no agent "
                        f"{none * 1e3:.0f} ms, agent {with_ * 1e3:.0f} ms (ratio {ratio:.2f}; "
                        f"target <= 100 ms: {'PASS' if with_ <= 0.1 else 'MISS'}) "
                        f"bytes ok={ok0 and ok1}"
                    )
                    for why in (why0, why1):
                        if why:
                            print(why)
                    out.setdefault("a", []).append(
                        {"no_agent_s": none, "agent_s": with_, "ok": ok0 and ok1}
                    )
                    time.sleep(2.0)  # hold-off + stability: nic1 back UP in the agent
                if "c" in which:
                    pid = agents.procs[0].pid
                    cfg = HarnessConfig(conns=4, sizes=(MiB,), duration=24.0, deadline=90)
                    with HarnessRun(fab, cfg, workdir=fresh(tmp, served)) as run:
                        wait_for_bytes(run, 4 * MiB, timeout=40)
                        c0, t0 = proc_cpu(pid), time.monotonic()
                        time.sleep(20.0)
                        c1, t1 = proc_cpu(pid), time.monotonic()
                        res = run.wait()
                    share = (c1 - c0) / (t1 - t0)
                    ok &= res.ok
                    print(
                        f"[c] agent CPU over {t1 - t0:.1f} s with traffic, all sources: "
                        f"{share * 100:.2f} % of one core (target < 2 %: "
                        f"{'PASS' if share < 0.02 else 'MISS'})"
                    )
                    out["c"] = {"cpu_share": share, "seconds": t1 - t0}
                if "b" in which:
                    for label, srv in (("no agent", None), ("agent", served)):
                        res_s, okb = shared_nic(fab, tmp, srv)
                        fab.heal_all()
                        ok &= okb
                        first = min(res_s)
                        others = sorted(x - first for x in res_s if x != first)
                        print(
                            f"[b] 4 processes on blackholed nic1, {label}: resume after fault "
                            + ", ".join(f"{x * 1e3:.0f}" for x in res_s)
                            + f" ms; others' extra stall after the first: max "
                            f"{max(others) * 1e3:.0f} ms; bytes ok={okb}"
                        )
                        out.setdefault("b", {})[label] = {"resume_s": res_s, "ok": okb}
                        time.sleep(1.0)
                for rnd in range(args.repeat if "d" in which else 0):
                    none, ok0, why0 = scenario(fab, "blackhole", fresh(tmp, None))
                    fab.heal_all()
                    with_, ok1, why1 = scenario(fab, "blackhole", fresh(tmp, served))
                    fab.heal_all()
                    ok &= ok0 and ok1
                    print(
                        f"[d] round {rnd + 1}: silent blackhole, extra step time: no agent "
                        f"{none * 1e3:.0f} ms, agent+eBPF {with_ * 1e3:.0f} ms (ratio "
                        f"{with_ / none if none else float('nan'):.2f}; target <= 400 ms: "
                        f"{'PASS' if with_ <= 0.4 else 'MISS'}) bytes ok={ok0 and ok1}"
                    )
                    for why in (why0, why1):
                        if why:
                            print(why)
                    out.setdefault("d", []).append(
                        {"no_agent_s": none, "agent_s": with_, "ok": ok0 and ok1}
                    )
                    time.sleep(2.0)
            finally:
                agents.stop()
    if "e" in which:
        with Fabric(nodes=2, nics=4, rate_mbit=None, prefix=unique_prefix("rhae")) as fab:
            base: list[float] = []
            probed: list[float] = []
            g, okx = throughput(fab, tmp, None)
            base.append(g)
            agents = Agents(fab, tmp / "e", "netlink,sysfs,ebpf", usdt=True)
            try:
                agents.wait_ready()
                for _ in range(2):
                    g, oky = throughput(fab, tmp, tmp / "e")
                    probed.append(g)
                    okx &= oky
            finally:
                agents.stop()
            g, okz = throughput(fab, tmp, None)
            base.append(g)
            ok &= okx and okz
            ratio = _common.median(probed) / _common.median(base)
            print(
                f"[e] throughput, unlimited veths: no probes {base} Gbit/s, all probes attached "
                f"{probed} Gbit/s: ratio {ratio:.3f} (target >= 0.97: "
                f"{'PASS' if ratio >= 0.97 else 'MISS'})"
            )
            out["e"] = {"no_probes_gbps": base, "probes_gbps": probed, "ratio": ratio}
    _common.write_json(args.json, {"bench": "agent", "date": _common.stamp(), "results": out})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
