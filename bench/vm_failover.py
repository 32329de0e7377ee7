#!/usr/bin/env python3
"""The failover timeline of the ofi lane over verbs in the Soft-RoCE guests, with and without the
agent.

One boot of the VM lab (docs/lab.md). Node 0 sends to node 1 over 4 connections (one per rail,
1 MiB messages, every byte checked); after 8 MiB a fault hits rail 0:

* ``carrier``: QMP carrier loss at the remote end (node 1's nic0 goes NO-CARRIER and its rxe
  port DOWN; node 0 sees silence);
* ``blackhole``: tc drops everything on node 1's nic0, carrier and ports up on both ends.

The agent (netlink, sysfs and verbs sources) runs in both guests for the whole run; a round "with
agent" points the plugin at it (``RAILHOP_RUN_DIR``), one "without" does not, so both see the
same guest load. Per round, in the guests' own clock (the application's view):

* stall: the longest gap between two completions of any connection, from the last completion
  before the fault (the harness's progress lines, every 50 ms);
* detection: from the fault to the first lane on nic0 failed, on either side (the plugin's log).

The fault's time in a side's clock is the host's time of the fault less the smallest lag seen
between that side's progress line and the host reading it (the lines are polled every 20 ms
around the fault): it is known to ~0.1 s. Rounds interleave the four variants. Printed: the
medians and the ratios with agent / without. Emulated CPUs: compare the ratios and orders, not
the absolute times with hardware.

    sudo .venv/bin/python bench/vm_failover.py [--rounds 5] [--seconds 50] [--json out.json]
        [--faults carrier,blackhole] [--log-level INFO] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _common import REPO, setup_import_path

setup_import_path()

from railhop_lab.harness import (  # noqa: E402
    HarnessConfig,
    HarnessError,
    Progress,
    use_source_tree_build,
)
from railhop_lab.vmagent import AGENT_RUN_DIR, GuestAgent  # noqa: E402
from railhop_lab.vmharness import VmHarnessRun, wait_for_bytes  # noqa: E402
from railhop_lab.vmlab import VmLab, VmLabError  # noqa: E402

MiB = 1 << 20
FAULTS = ("carrier", "blackhole")
_FAILED = re.compile(r"^\[\s*([0-9.]+)\].*lane \d+ nic0 -> peer NIC \d+ failed: (.*)$", re.M)


def longest_stall(prog: list[Progress], t_fault: float) -> float:
    """The longest gap between two completions of any connection, from the last completion
    before ``t_fault`` on (harness time)."""
    worst = 0.0
    nconn = len(prog[-1].per_conn) if prog else 0
    for k in range(nconn):
        last_t: float | None = None
        last_b = -1
        for p in prog:
            b = p.per_conn[k]
            if b != last_b:
                if last_t is not None and p.t >= t_fault:
                    worst = max(worst, p.t - last_t)
                last_t, last_b = p.t, b
    return worst


def clock_offset(run: VmHarnessRun, role: str, seconds: float) -> float:
    """Host monotonic minus the side's harness time, the smallest lag seen over ``seconds`` of
    polling every 20 ms."""
    best = float("inf")
    end = time.monotonic() + seconds
    seen = 0
    while time.monotonic() < end:
        prog = run.progress(role)  # type: ignore[arg-type]
        for p in prog[seen:]:
            best = min(best, p.received_at - p.t)
        seen = len(prog)
        time.sleep(0.02)
    return best


def first_failure(log: str) -> tuple[float, str] | None:
    m = _FAILED.search(log)
    return (float(m.group(1)), m.group(2).strip()) if m else None


class RoundFailed(RuntimeError):
    """A round that did not come through clean; ``dir``: its harness directory (both logs)."""

    def __init__(self, what: str, rdir: Path) -> None:
        super().__init__(what)
        self.dir = rdir


def one_round(
    lab: VmLab, fault: str, agent: bool, seconds: float, log_level: str
) -> dict[str, Any]:
    cfg = HarnessConfig(
        conns=4, sizes=(MiB,), duration=seconds, inflight=4, interval_ms=50, deadline=seconds + 180
    )
    env = {"RAILHOP_LOG_LEVEL": log_level}
    if agent:
        env["RAILHOP_RUN_DIR"] = AGENT_RUN_DIR
    run = VmHarnessRun(lab, cfg, env=env, verbose=True)
    try:
        with run:
            wait_for_bytes(run, 8 * MiB, 180)
            off = {r: clock_offset(run, r, 1.5) for r in ("send", "recv")}
            t_host = time.monotonic()
            if fault == "carrier":
                lab.carrier_down(0, 0, "remote")
            else:
                lab.blackhole(1, 0)
            res = run.wait()
    except (HarnessError, VmLabError, RuntimeError) as e:
        raise RoundFailed(f"{type(e).__name__}: {e}", run.dir) from e
    finally:
        lab.heal_all()
    if not res.ok or res.data_errors:
        raise RoundFailed(res.describe(), run.dir)
    t_fault = {r: t_host - off[r] for r in off}
    prog = res.recv.progress
    before = [p for p in prog if p.t < t_fault["recv"]]
    if not before or any(
        b <= a for a, b in zip(before[-1].per_conn, prog[-1].per_conn, strict=True)
    ):
        raise RoundFailed(f"a connection did not move on after the fault ({run.dir})", run.dir)
    stall = longest_stall(prog, t_fault["recv"])
    found: list[tuple[float, str, str]] = []
    for r in ("send", "recv"):
        f = first_failure((run.dir / f"{r}.err").read_text(errors="replace"))
        if f is not None:
            found.append((f[0] - t_fault[r], r, f[1]))
    if not found:
        raise RoundFailed(f"no lane on nic0 failed ({run.dir})", run.dir)
    det = min(found)
    return {
        "fault": fault,
        "agent": agent,
        "stall_s": round(stall, 3),
        "detect_s": round(det[0], 3),
        "detected_by": f"{det[1]}: {det[2]}",
        "bytes_checked": res.bytes_checked,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=50.0, help="harness run per round")
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--json", help="write the rounds and the medians here")
    ap.add_argument("--log-level", default="INFO", help="RAILHOP_LOG_LEVEL of both sides")
    ap.add_argument("--keep", default="/tmp/railhop-vm-failover", help="failed rounds' logs")
    a = ap.parse_args()
    faults = [f for f in a.faults.split(",") if f]
    if a.rounds < 1 or a.seconds < 20 or any(f not in FAULTS for f in faults):
        ap.error(f"--rounds >= 1, --seconds >= 20, --faults from {FAULTS}")
    use_source_tree_build(REPO)
    rows: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    with VmLab(nics=4) as lab, GuestAgent(lab, 0) as a0, GuestAgent(lab, 1) as a1:
        a0.wait_up()
        a1.wait_up()
        print(f"guests up (kvm={lab.kvm}), agents up; {a.rounds} rounds", flush=True)
        for k in range(1, a.rounds + 1):
            for fault in faults:
                for agent in (False, True):
                    tag = f"round {k} {fault:9} agent={'yes' if agent else 'no '}"
                    try:
                        r = one_round(lab, fault, agent, a.seconds, a.log_level)
                    except RoundFailed as e:
                        # a round that did not come through clean (an escalation, a
                        # connection that never moved on) is counted, not measured
                        dst = Path(a.keep) / f"round-{k}-{fault}-{'agent' if agent else 'plain'}"
                        shutil.rmtree(dst, ignore_errors=True)
                        if e.dir.is_dir():
                            shutil.copytree(e.dir, dst, ignore=shutil.ignore_patterns("rendezvous"))
                        failed.append({"round": k, "fault": fault, "agent": agent, "error": str(e)})
                        print(f"{tag}: FAILED (logs in {dst}): {str(e)[:300]}", flush=True)
                        continue
                    r["round"] = k
                    rows.append(r)
                    print(
                        f"{tag}: stall {r['stall_s']:.2f} s, detection {r['detect_s']:.2f} s "
                        f"({r['detected_by']})",
                        flush=True,
                    )
                    if a.json:  # after every round: a run cut short keeps what it measured
                        with open(a.json, "w") as f:
                            json.dump({"rounds": rows, "failed": failed}, f, indent=1)
    summary: dict[str, Any] = {}
    for fault in faults:
        med = {}
        for agent in (False, True):
            rs = [r for r in rows if r["fault"] == fault and r["agent"] == agent]
            if not rs:
                med[agent] = (float("nan"), float("nan"))
                continue
            med[agent] = (
                statistics.median(r["stall_s"] for r in rs),
                statistics.median(r["detect_s"] for r in rs),
            )
        ratio = tuple(
            w / wo if wo > 0 else float("nan") for w, wo in zip(med[True], med[False], strict=True)
        )
        summary[fault] = {
            "stall_s": {"without": med[False][0], "with": med[True][0]},
            "detect_s": {"without": med[False][1], "with": med[True][1]},
            "ratio_with_over_without": {"stall": ratio[0], "detect": ratio[1]},
        }
        print(
            f"{fault}: median stall {med[False][0]:.2f} s without the agent, {med[True][0]:.2f} s "
            f"with (ratio {ratio[0]:.2f}); median detection {med[False][1]:.2f} s without, "
            f"{med[True][1]:.2f} s with (ratio {ratio[1]:.2f})"
        )
    print(
        f"{len(failed)} round(s) failed, not measured: {[(f['fault'], f['agent']) for f in failed]}"
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rounds": rows, "failed": failed, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
