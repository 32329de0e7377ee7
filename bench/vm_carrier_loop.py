#!/usr/bin/env python3
"""The ofi lane over verbs through a remote-end carrier loss, N rounds in a row on one boot.

Each round is the scenario of ``tests/vm/test_rdma_lab.py::
test_ofi_lane_over_verbs_through_a_remote_carrier_loss``: 4 connections node 0 -> node 1 over
the Soft-RoCE VM lab (docs/lab.md), a QMP carrier loss on node 1's nic0 during traffic, every
connection moving on, the heal, every connection moving after the fail-back, both sides exiting
0 with every byte checked. A failed round keeps its harness directory (both sides' stderr at
``RAILHOP_LOG_LEVEL``) and is reported; the loop goes on unless ``--stop``.

    sudo .venv/bin/python bench/vm_carrier_loop.py [--rounds 20] [--log-level INFO] [--stop]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from _common import REPO, setup_import_path

setup_import_path()

from railhop_lab.harness import (  # noqa: E402
    HarnessConfig,
    HarnessError,
    use_source_tree_build,
)
from railhop_lab.vmharness import VmHarnessRun, wait_for_bytes, wait_for_each_conn  # noqa: E402
from railhop_lab.vmlab import VmLab, VmLabError  # noqa: E402

MiB = 1 << 20


def one_round(lab: VmLab, env: dict[str, str], duration: float) -> tuple[bool, str, Path]:
    """One carrier-loss round; (passed, what failed or a summary, the harness directory)."""
    cfg = HarnessConfig(
        conns=4, sizes=(MiB,), duration=duration, inflight=4, deadline=duration + 200
    )
    run = VmHarnessRun(lab, cfg, env=env, verbose=True)
    try:
        with run:
            wait_for_bytes(run, 8 * MiB, 180)
            lab.carrier_down(0, 0, "remote")
            lab.wait_ports(1, {0: "DOWN"}, 30)
            wait_for_each_conn(run, 4 * MiB, 120)
            lab.heal(0)
            wait_for_each_conn(run, 4 * MiB, 120)
            run.finish()  # the round's steps are through: the run ends by what it moved
            res = run.wait()
    except (HarnessError, VmLabError) as e:
        return False, f"{type(e).__name__}: {e}", run.dir
    finally:
        lab.heal_all()
    ok = res.ok and res.data_errors == 0 and res.bytes_checked >= 24 * MiB
    what = (
        f"bytes checked {res.bytes_checked}, data errors {res.data_errors}, wall {res.wall_s:.0f} s"
    )
    return ok, what if ok else res.describe(), run.dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument(
        "--duration",
        type=float,
        default=400.0,
        help="harness seconds per round at most (a round ends once its steps are through)",
    )
    ap.add_argument("--log-level", default="INFO", help="RAILHOP_LOG_LEVEL of both sides")
    ap.add_argument("--keep", default="/tmp/railhop-carrier-loop", help="failed rounds' logs")
    ap.add_argument("--stop", action="store_true", help="stop at the first failed round")
    ap.add_argument("--json", help="write the rounds here")
    a = ap.parse_args()
    if a.rounds < 1 or a.duration <= 0:
        ap.error("--rounds >= 1 and --duration > 0")
    use_source_tree_build(REPO)  # the worktree's `make ctest` build, where there is one
    env = {"RAILHOP_LOG_LEVEL": a.log_level}
    keep = Path(a.keep)
    rows: list[dict[str, object]] = []
    with VmLab(nics=4) as lab:
        print(f"guests up (kvm={lab.kvm}); {a.rounds} rounds", flush=True)
        for k in range(1, a.rounds + 1):
            t0 = time.monotonic()
            ok, what, rdir = one_round(lab, env, a.duration)
            wall = time.monotonic() - t0
            rows.append({"round": k, "ok": ok, "wall_s": round(wall, 1), "what": what})
            if not ok:
                dst = keep / f"round-{k}"
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(rdir, dst, ignore=shutil.ignore_patterns("rendezvous"))
                what += f" (logs in {dst})"
            print(f"round {k}: {'pass' if ok else 'FAIL'} in {wall:.0f} s: {what}", flush=True)
            if not ok and a.stop:
                break
    passed = sum(1 for r in rows if r["ok"])
    print(f"{passed} of {len(rows)} rounds passed")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
