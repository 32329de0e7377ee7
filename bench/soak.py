#!/usr/bin/env python3
"""Long randomized fault soak (issue 17): every fault kind, both lane transports, bytes checked.

For each lane transport (tcp, then ofi through libfabric's tcp provider) one harness pair runs
for --minutes on the rate-limited 2-node x 4-NIC fabric (4 connections, messages of 1 MiB, 4 KiB,
3 MiB + 5 and 0 bytes, every byte checked at the receiver) while a random schedule
(railhop_lab.soak: carrier loss at either veth end, silent blackhole, 5 Hz carrier flapping,
several NICs at once) faults both nodes' NICs, each fault held 0.5-3 s then healed. One rail is
never faulted, so no connection may give up. A line every --every seconds shows the progress;
the summary per transport: faults applied by kind, messages and bytes on both sides (they must
be equal), data and request errors (must be 0), the longest gap between completions on any
connection, and the harness processes' descriptors, RSS and CPU at start and end (bounded: no
leak across hundreds of failovers).

    sudo .venv/bin/python bench/soak.py                      # 10 min per transport, clock seed
    sudo .venv/bin/python bench/soak.py --minutes 1 --transports tcp --seed 30855
    sudo .venv/bin/python bench/soak.py --json out.json

Exit status 0 when every transport's run was lossless and error-free, 1 otherwise, 2 for bad
arguments. Every wait is bounded (the harness deadline is the run + 60 s).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path
from typing import Any

import _common

_common.setup_import_path()

from railhop_lab import soak  # noqa: E402
from railhop_lab.fabric import Fabric, unique_prefix  # noqa: E402
from railhop_lab.harness import (  # noqa: E402
    HarnessConfig,
    HarnessRun,
    longest_gap,
    use_source_tree_build,
    wait_for_bytes,
)

MiB = 1 << 20
TRANSPORTS = {
    "tcp": {"RAILHOP_TRANSPORT": "tcp"},
    "ofi": {"RAILHOP_TRANSPORT": "ofi", "FI_PROVIDER": "tcp"},
}


def proc_stats(pid: int) -> dict[str, float]:
    """Descriptors, resident MiB and CPU seconds of a live process (empty when it is gone)."""
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        status = Path(f"/proc/{pid}/status").read_text()
        rss = next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmRSS:"))
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, IndexError, ValueError):
        return {}
    return {"fds": fds, "rss_mib": rss / 1024, "cpu_s": cpu}


def sides_stats(run: HarnessRun) -> dict[str, dict[str, float]]:
    return {role: proc_stats(side.proc.pid) for role, side in run.sides.items()}


def fmt_stats(st: dict[str, dict[str, float]]) -> str:
    return ", ".join(
        f"{role} {s['fds']:.0f} fds {s['rss_mib']:.0f} MiB {s['cpu_s']:.0f} s cpu"
        for role, s in st.items()
        if s
    )


def soak_one(
    fab: Fabric,
    transport: str,
    seed: int,
    seconds: float,
    every: float,
    logs: Path | None = None,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    plan = soak.soak_plan(seed, seconds)
    cfg = HarnessConfig(
        conns=4,
        sizes=(MiB, 4096, 3 * MiB + 5, 0),
        duration=seconds,
        deadline=seconds + 60,
        seed=seed,
    )
    applied: collections.Counter[str] = collections.Counter()
    steps: list[tuple[float, str, int, int]] = []
    fab.heal_all()
    workdir = None
    if logs is not None:
        workdir = logs / transport
        workdir.mkdir(parents=True, exist_ok=True)
    env = {**TRANSPORTS[transport], **(extra_env or {})}
    with HarnessRun(fab, cfg, env=env, workdir=workdir) as run:
        wait_for_bytes(run, 16 * MiB, timeout=30)
        t_base = time.monotonic() - run.started_at
        first = sides_stats(run)
        next_line = time.monotonic() + every
        for t, action, node, nic in plan:
            while True:
                now = time.monotonic()
                due = run.started_at + t_base + t
                if now >= due:
                    break
                if now >= next_line:
                    prog = run.progress("recv")
                    moved = prog[-1].bytes / MiB if prog else 0.0
                    print(
                        f"  [{transport}] {now - run.started_at - t_base:5.0f}/{seconds:.0f} s: "
                        f"{sum(applied.values())} faults, {moved:.0f} MiB received, "
                        f"{fmt_stats(sides_stats(run))}",
                        flush=True,
                    )
                    next_line = now + every
                time.sleep(min(0.2, due - now))
            soak.apply(fab, action, node, nic)
            steps.append((round(time.monotonic() - run.started_at - t_base, 2), action, node, nic))
            if action != "heal":
                applied[action] += 1
        fab.heal_all()
        last = sides_stats(run)
        res = run.wait()
    s, r = res.send.summary, res.recv.summary
    prog = res.recv.progress
    gaps = [longest_gap(prog, t_base, t_base + seconds - 1.0, c) for c in range(4)]
    worst = max(range(4), key=lambda c: gaps[c][0])
    stall, stall_at = gaps[worst][0], gaps[worst][1] - t_base
    around = [st for st in steps if stall_at - 6.0 <= st[0] <= stall_at + stall]
    ok = bool(
        res.ok
        and s is not None
        and r is not None
        and s.msgs == r.msgs > 0
        and s.bytes == r.bytes
        and s.data_errors == 0
        and r.data_errors == 0
    )
    return {
        "transport": transport,
        "seed": seed,
        "seconds": seconds,
        "ok": ok,
        "faults": dict(applied),
        "kept_rail": sorted(soak.kept_rail(plan)),
        "send_msgs": s.msgs if s else None,
        "recv_msgs": r.msgs if r else None,
        "send_bytes": s.bytes if s else None,
        "recv_bytes": r.bytes if r else None,
        "data_errors": (s.data_errors if s else None, r.data_errors if r else None),
        "longest_stall_s": stall,
        "longest_stall_conn": worst,
        "longest_stall_at_s": stall_at,
        "faults_around_it": around,
        "steps": steps,
        "start": first,
        "end": last,
        "describe": "" if ok else res.describe(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="per transport (default 10)")
    ap.add_argument("--transports", default="tcp,ofi")
    ap.add_argument("--seed", type=int, help="the schedule's seed (default: from the clock)")
    ap.add_argument("--rate-mbit", type=int, default=200, help="tbf per NIC (default 200)")
    ap.add_argument("--every", type=float, default=30.0, help="progress line interval (s)")
    ap.add_argument("--logs", help="keep the harness work dirs (plugin logs) here, per transport")
    ap.add_argument(
        "--env", action="append", default=[], help="NAME=VALUE for both plugins (repeatable)"
    )
    ap.add_argument("--json")
    args = ap.parse_args()
    extra = dict(kv.split("=", 1) for kv in args.env if "=" in kv)
    transports = [t for t in args.transports.split(",") if t]
    bad = [t for t in transports if t not in TRANSPORTS]
    if bad or not transports or not 0.2 <= args.minutes <= 240:
        ap.error(f"want --transports from {','.join(TRANSPORTS)} and 0.2 <= --minutes <= 240")
    _common.need_root("soak")
    use_source_tree_build()
    seed = args.seed if args.seed is not None else int(time.time()) % 100000
    seconds = args.minutes * 60
    print(f"soak on {_common.machine()}, {_common.stamp()}")
    print(
        f"seed {seed}, {args.minutes:g} min per transport ({', '.join(transports)}), "
        f"4 NICs x {args.rate_mbit} Mbit/s, 4 connections, every byte checked"
    )
    results = []
    with Fabric(nodes=2, nics=4, rate_mbit=args.rate_mbit, prefix=unique_prefix("rhsk")) as fab:
        for tr in transports:
            logs = Path(args.logs) if args.logs else None
            r = soak_one(fab, tr, seed, seconds, args.every, logs, extra)
            results.append(r)
            faults = ", ".join(f"{k} {v}" for k, v in sorted(r["faults"].items()))
            print(
                f"[{tr}] {'PASS' if r['ok'] else 'FAIL'}: {sum(r['faults'].values())} faults "
                f"({faults}); rail {r['kept_rail']} never faulted; messages {r['send_msgs']} "
                f"sent / {r['recv_msgs']} received, bytes {r['send_bytes']} / "
                f"{r['recv_bytes']}, data errors {r['data_errors']}; longest gap on a "
                f"connection {r['longest_stall_s']:.2f} s (conn {r['longest_stall_conn']}, from "
                f"{r['longest_stall_at_s']:.1f} s)",
                flush=True,
            )
            print(f"[{tr}]   faults from 6 s before that gap to its end: {r['faults_around_it']}")
            print(f"[{tr}]   start: {fmt_stats(r['start'])}")
            print(f"[{tr}]   end:   {fmt_stats(r['end'])}")
            if not r["ok"]:
                print(r["describe"])
    _common.write_json(args.json, {"bench": "soak", "date": _common.stamp(), "results": results})
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
