#!/usr/bin/env python3
"""Bandwidth per 100 ms through healthy -> 1 of 4 NICs down -> healed, on the rate-limited fabric.

Two variants in one run: carrier loss (node 0's NIC goes down) and a silent blackhole (carrier
stays up, every frame dropped). Node 0 sends to node 1 through the plugin (harness, every byte
checked), one connection per NIC. Printed per variant (targets: README.md, "Why"):

  bandwidth with 1 of 4 down / (3/4 of healthy)   >= 0.95
  extra time of the step hit by the fault         <= 1.5 s (blackhole), <= 0.1 s (carrier, agent)
  time back on the original pair after heal       <= 2 s
  bandwidth after heal / healthy                  >= 0.95

    sudo python3 bench/failover_timeline.py [--quick] [--rate-mbit 200] [--json out.json]
    sudo python3 bench/failover_timeline.py --transport ofi   # libfabric lanes (tcp provider)
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import _common

_common.setup_import_path()

from railhop import paths  # noqa: E402
from railhop_lab.fabric import Fabric, unique_prefix  # noqa: E402
from railhop_lab.harness import use_source_tree_build  # noqa: E402
from railhop_lab.scenario import FaultReport, Step, Timeline, fault_report, run_scenario  # noqa: E402


def verdict(ok: bool | None) -> str:
    return "  -  " if ok is None else ("PASS" if ok else "MISS")


def show(variant: str, tl: Timeline, rep: FaultReport, timeline: bool) -> dict[str, Any]:
    healthy = rep.details["healthy_Bps"]
    down_ratio = rep.during / 0.75 if rep.during is not None else 0.0
    print(f"[{variant}] fault at {rep.at:.2f}s, healed at {rep.healed_at or 0:.2f}s")
    if timeline:
        print("    t(s)  total  " + " ".join(f"nic{i:<3}" for i in range(tl.nics)) + " (Mbit/s)")
        for t, vals in tl.nic_bins(0, 0.1):
            mark = ""
            for te, st in tl.events:
                if t - 0.1 < te <= t:
                    mark = f"  <- {st.label or st.action}"
            row = " ".join(f"{v * 8 / 1e6:6.0f}" for v in vals)
            print(f"  {t:6.1f} {sum(vals) * 8 / 1e6:6.0f}  {row}{mark}")
    res = tl.result
    r = res.recv.summary
    extra_target = 1.5 if variant == "blackhole" else 0.1
    rows = [
        ("healthy bandwidth", f"{_common.mbit(healthy):7.1f} Mbit/s", None),
        ("1 of 4 down / (3/4 healthy)", f"{down_ratio:7.3f}", down_ratio >= 0.95),
        ("stall of the hit connection", f"{rep.resume_s:7.2f} s", None),
        (
            f"extra step time (target <= {extra_target} s)",
            f"{rep.extra_s:7.2f} s",
            rep.extra_s <= extra_target,
        ),
        (
            "back on the original pair",
            "    n/a" if rep.failback_s is None else f"{rep.failback_s:7.2f} s",
            None if rep.failback_s is None else rep.failback_s <= 2.0,
        ),
        (
            "after heal / healthy",
            "    n/a" if rep.after is None else f"{rep.after:7.3f}",
            None if rep.after is None else rep.after >= 0.95,
        ),
        (
            "bytes checked, errors",
            f"{(r.bytes if r else 0) / 2**20:.0f} MiB, {res.data_errors} data errors, ok={res.ok}",
            res.ok,
        ),
    ]
    for name, value, ok in rows:
        print(f"    {name:42} {value:>28}  {verdict(ok)}")
    if not res.ok:
        print(res.describe())
    return {
        "variant": variant,
        "healthy_Bps": healthy,
        "down_ratio": down_ratio,
        "resume_s": rep.resume_s,
        "extra_s": rep.extra_s,
        "failback_s": rep.failback_s,
        "after_ratio": rep.after,
        "bytes_checked": r.bytes if r else 0,
        "ok": res.ok,
        "bins": [{"t": t, "nics": v} for t, v in tl.nic_bins(0, 0.1)],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter phases (3 s / 4 s / 4 s)")
    ap.add_argument("--rate-mbit", type=int, default=200, help="tbf ceiling per NIC (default 200)")
    ap.add_argument("--variants", default="carrier,blackhole")
    ap.add_argument("--timeline", action="store_true", help="print the per-100 ms table")
    ap.add_argument("--plugin")
    ap.add_argument("--harness")
    ap.add_argument("--json")
    ap.add_argument("--env", action="append", default=[], help="K=V for the plugin (repeat)")
    ap.add_argument(
        "--transport",
        choices=["tcp", "ofi"],
        help="lane transport (ofi: libfabric through its tcp provider); default: the plugin's",
    )
    args = ap.parse_args()
    plugin_env = {}
    if args.transport:
        plugin_env["RAILHOP_TRANSPORT"] = args.transport
        if args.transport == "ofi":
            plugin_env["FI_PROVIDER"] = "tcp"
    plugin_env.update(dict(kv.partition("=")[::2] for kv in args.env))
    _common.need_root("bench/failover_timeline.py")
    if args.plugin:
        os.environ["RAILHOP_PLUGIN_PATH"] = args.plugin
    if args.harness:
        os.environ["RAILHOP_HARNESS_PATH"] = args.harness
    use_source_tree_build()
    try:
        plugin = paths.plugin_path()
        paths.harness_path()
    except paths.NotInstalledError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    healthy_s, down_s, healed_s = (3.0, 4.0, 4.0) if args.quick else (4.0, 6.0, 6.0)
    print(f"railhop failover timeline | {_common.stamp()} | {_common.machine()}")
    print(f"  fabric: 2 nodes x 4 NICs, tbf {args.rate_mbit} Mbit/s per NIC; plugin {plugin}")
    if plugin_env:
        print(f"  plugin environment: {plugin_env}")
    print(f"  phases: healthy {healthy_s}s -> node0 nic1 down {down_s}s -> healed {healed_s}s")
    out = []
    with Fabric(nodes=2, nics=4, rate_mbit=args.rate_mbit, prefix=unique_prefix("rhbf")) as fab:
        for variant in args.variants.split(","):
            action = {"carrier": "carrier", "blackhole": "blackhole"}[variant]
            steps = [
                Step(healthy_s, action, 0, 1, f"{variant} nic1"),
                Step(healthy_s + down_s, "heal", 0, 1, "heal nic1"),
            ]
            tl = run_scenario(fab, steps, healthy_s + down_s + healed_s, env=plugin_env)
            out.append(show(variant, tl, fault_report(tl, 0), args.timeline))
            fab.heal_all()
    _common.write_json(
        args.json,
        {
            "bench": "failover_timeline",
            "date": _common.stamp(),
            "machine": _common.machine(),
            "args": vars(args),
            "variants": out,
        },
    )
    return 0 if all(v["ok"] for v in out) else 1


if __name__ == "__main__":
    sys.exit(main())
