#!/usr/bin/env python3
"""The switchover timeline of a move over the verbs lane in the Soft-RoCE guests, with a warm
standby lane (RAILHOP_STANDBY_LANES=1) and without (0), side by side in one run (issue 27).

One boot of the VM lab (docs/lab.md). Node 0 sends to node 1 over one connection on rail 0 (1 MiB
messages, every byte checked, RAILHOP_TRANSPORT=verbs, RAILHOP_BACKUP_LANES=1); after 4 MiB
node 0's nic0 loses carrier (QMP, local end), so the sender finds the failure (carrier poll)
and decides the move. Per round and variant, from the sender's core marks (the INFO lines of
the USDT marks move_decision, move_first_post and the move's WARN line; core/marks.c), each
measured from the detection (the core's t_detect, when the failure was found):

* decision: the move chose its lane (a standby promoted, or a new lane opened) and the
  deciding thread's CPU time for that step (a new lane: the transport's open(), its queue
  pairs created);
* first post: the first frame handed to the chosen lane's transport (the FAILREQ: a send posted
  on the lane's queue pair), and its wall time after the decision (CPU time across the
  deciding thread and the lane's I/O thread is not measured: wall time, labelled);
* first completion: the first request acknowledged after the move (the move's WARN line, ms).

Variants alternate within each round. Printed: the medians side by side and the ratios
standby / none. Emulated CPUs: compare ratios and orders, not absolute times with hardware.

    sudo .venv/bin/python bench/vm_switchover.py [--rounds 5] [--seconds 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _common import REPO, setup_import_path

setup_import_path()

from railhop_lab.harness import HarnessConfig, use_source_tree_build  # noqa: E402
from railhop_lab.vmharness import VERBS_LANE_ENV, VmHarnessRun, wait_for_bytes, wait_for_each_conn  # noqa: E402
from railhop_lab.vmlab import VmLab  # noqa: E402

MiB = 1 << 20
VARIANTS = {"standby": "1", "none": "0"}
ENV = {
    **VERBS_LANE_ENV,
    "RAILHOP_BACKUP_LANES": "1",
}
_DECISION = re.compile(
    r"\(send\): move decision: lane \d+ \S+ -> peer NIC \d+ \((warm standby|new lane)\), "
    r"([0-9.]+) ms after detection, ([0-9.]+) us of CPU"
)
_POST = re.compile(
    r"\(send\): move first post: lane \d+ \((warm standby|new lane)\) (\w+), ([0-9.]+) ms after "
    r"detection, ([0-9.]+) ms after the decision"
)
_DONE = re.compile(
    r"\(send\): failover: nic0 -> .* (\d+) ms from detection to the first completion"
)
_STANDBY_UP = re.compile(r"\(send\): lane \d+ up \S+ -> peer NIC \d+ \(standby\)")


def wait_standby(err: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if err.exists() and _STANDBY_UP.search(err.read_text(errors="replace")):
            return
        time.sleep(0.2)
    raise RuntimeError(f"no standby lane came up within {timeout} s ({err})")


def parse(log: str) -> dict[str, Any]:
    """The move's marks from the sender's log (its first decision and first post)."""
    d, p, f = _DECISION.search(log), _POST.search(log), _DONE.search(log)
    if not (d and p and f):
        raise RuntimeError(f"marks missing: decision={bool(d)} post={bool(p)} completion={bool(f)}")
    return {
        "lane": d.group(1),
        "decision_ms": float(d.group(2)),
        "decision_cpu_us": float(d.group(3)),
        "post_kind": p.group(2),
        "post_ms": float(p.group(3)),
        "post_after_decision_ms": float(p.group(4)),
        "first_completion_ms": float(f.group(1)),
    }


def one_round(lab: VmLab, variant: str, seconds: float) -> dict[str, Any]:
    cfg = HarnessConfig(conns=1, sizes=(MiB,), duration=seconds, inflight=4, deadline=seconds + 180)
    env = {**ENV, "RAILHOP_STANDBY_LANES": VARIANTS[variant]}
    try:
        with VmHarnessRun(lab, cfg, env=env, verbose=True) as run:
            if variant == "standby":
                wait_standby(run.dir / "send.err", 120)
            wait_for_bytes(run, 4 * MiB, 180)
            lab.carrier_down(0, 0, "local")
            wait_for_each_conn(run, 2 * MiB, 180)
            res = run.wait()
    finally:
        lab.heal_all()
    if not res.ok or res.data_errors:
        raise RuntimeError(res.describe())
    r = parse((run.dir / "send.err").read_text(errors="replace"))
    want = "warm standby" if variant == "standby" else "new lane"
    if r["lane"] != want:
        raise RuntimeError(f"{variant}: the move chose a {r['lane']} ({run.dir})")
    r["bytes_checked"] = res.bytes_checked
    return r


METRICS = (
    ("decision_ms", "detection -> decision, ms"),
    ("decision_cpu_us", "decision step, CPU us (deciding thread)"),
    ("post_after_decision_ms", "decision -> first post, ms (wall)"),
    ("post_ms", "detection -> first post, ms"),
    ("first_completion_ms", "detection -> first completion, ms"),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=20.0, help="harness run per round")
    ap.add_argument("--json", help="write the rounds and the medians here")
    a = ap.parse_args()
    if a.rounds < 1 or a.seconds < 10:
        ap.error("--rounds >= 1, --seconds >= 10")
    use_source_tree_build(REPO)
    rows: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    with VmLab(nics=4) as lab:
        print(f"guests up (kvm={lab.kvm}); {a.rounds} rounds", flush=True)
        for k in range(1, a.rounds + 1):
            for variant in VARIANTS:
                tag = f"round {k} {variant:8}"
                try:
                    r = one_round(lab, variant, a.seconds)
                except RuntimeError as e:
                    failed.append({"round": k, "variant": variant, "error": str(e)})
                    print(f"{tag}: FAILED: {str(e)[:300]}", flush=True)
                    continue
                r.update(round=k, variant=variant)
                rows.append(r)
                print(
                    f"{tag}: decision +{r['decision_ms']:.3f} ms ({r['decision_cpu_us']:.0f} us "
                    f"CPU), first post +{r['post_ms']:.3f} ms "
                    f"({r['post_after_decision_ms']:.3f} ms after the decision, {r['post_kind']}), "
                    f"first completion "
                    f"+{r['first_completion_ms']:.0f} ms",
                    flush=True,
                )
                if a.json:
                    Path(a.json).write_text(
                        json.dumps({"rounds": rows, "failed": failed}, indent=1)
                    )
    summary: dict[str, Any] = {}
    print(f"\nmedians over {a.rounds} rounds (verbs lane, emulated rxe)")
    print(f"{'':42} {'standby':>10} {'none':>10} {'standby/none':>13}")
    for key, label in METRICS:
        med = {}
        for v in VARIANTS:
            vals = [r[key] for r in rows if r["variant"] == v]
            med[v] = statistics.median(vals) if vals else float("nan")
        ratio = med["standby"] / med["none"] if med["none"] > 0 else float("nan")
        summary[key] = {**med, "ratio": ratio}
        print(f"{label:42} {med['standby']:10.3f} {med['none']:10.3f} {ratio:13.3f}")
    print(
        f"{len(failed)} run(s) failed, not measured: {[(f['round'], f['variant']) for f in failed]}"
    )
    if a.json:
        Path(a.json).write_text(
            json.dumps({"rounds": rows, "failed": failed, "summary": summary}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
