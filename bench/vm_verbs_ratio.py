#!/usr/bin/env python3
"""The verbs lane and the ofi lane over libfabric's verbs, against ``ib_write_bw`` on one rxe rail.

All run in one boot of the Soft-RoCE VM lab (docs/lab.md): node 0 sends to node 1 over rail 0
only; each round runs ``ib_write_bw`` (RDMA writes, one QP, 1 MiB messages), then the plugin
(``railhop-harness``, one connection on device 0, 1 MiB messages, every byte checked) with the
ofi lane over libfabric's verbs provider (``RAILHOP_TRANSPORT=ofi``) and with the native verbs
lane (``RAILHOP_TRANSPORT=verbs``), each for the same duration. The guests' CPUs are emulated:
the absolute numbers say nothing about hardware; the ratios of the medians are the result
(verbs lane / ib_write_bw, verbs lane / ofi lane, ofi lane / ib_write_bw).

    sudo .venv/bin/python bench/vm_verbs_ratio.py [--rounds 5] [--seconds 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time

from _common import setup_import_path

setup_import_path()

from railhop_lab.harness import HarnessConfig  # noqa: E402
from railhop_lab.vmharness import VmHarnessRun  # noqa: E402
from railhop_lab.vmlab import VmLab  # noqa: E402

PORT = 18515
MiB = 1 << 20
# ib_write_bw's result row: #bytes #iterations BW-peak BW-average MsgRate
_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")


def parse_ib_write_bw(out: str) -> float:
    """The average bandwidth (Gbit/s) of an ``ib_write_bw --report_gbits`` run."""
    for line in out.splitlines():
        m = _ROW.match(line)
        if m:
            return float(m.group(4))
    raise ValueError(f"no result row in ib_write_bw output: {out[-1500:]!r}")


def ib_write_bw(lab: VmLab, seconds: float) -> float:
    args = ["ib_write_bw", "-d", "rxe0", "-x", "1", "-s", str(MiB), "-D", f"{seconds:g}"]
    args += ["-F", "--report_gbits", "-p", str(PORT)]
    server = lab.guests[1].start(args, timeout=seconds + 120)
    deadline = time.monotonic() + 60
    probe = f"grep -qi ':{PORT:04X} 00000000:0000 0A' /proc/net/tcp"
    while lab.guests[1].sh(probe, check=False).rc != 0:
        if server.done() or time.monotonic() > deadline:
            raise RuntimeError(f"ib_write_bw server did not listen: {server.wait()}")
        time.sleep(0.2)
    client = lab.guests[0].run([*args, lab.address(1, 0)], timeout=seconds + 120)
    srv = server.wait()
    if not (client.ok and srv.ok):
        raise RuntimeError(f"ib_write_bw failed: client {client} server {srv}")
    return parse_ib_write_bw(client.stdout)


LANES = {
    "ofi": {"RAILHOP_TRANSPORT": "ofi", "FI_PROVIDER": "verbs"},
    "verbs": {"RAILHOP_TRANSPORT": "verbs"},
}


def lane(lab: VmLab, seconds: float, transport: str) -> float:
    cfg = HarnessConfig(
        conns=1, devs=(0,), sizes=(MiB,), duration=seconds, inflight=8, deadline=seconds + 120
    )
    # one NIC for the plugin too: no other rail to spread over
    env = {"RAILHOP_NICS": f"={lab.ifname(0)}:0", **LANES[transport]}
    with VmHarnessRun(lab, cfg, env=env) as run:
        res = run.wait()
    if not res.ok or res.recv.summary is None:
        raise RuntimeError(res.describe())
    return res.recv.summary.gbps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--json", help="write the rounds and the ratio here")
    a = ap.parse_args()
    if a.rounds < 1 or a.seconds <= 0:
        ap.error("--rounds >= 1 and --seconds > 0")
    rows: list[dict[str, float]] = []
    with VmLab(nics=1) as lab:
        print(
            f"guests up (kvm={lab.kvm}); rail 0, {a.rounds} rounds of {a.seconds:g} s", flush=True
        )
        for k in range(a.rounds):
            row = {"ib_write_bw_gbps": ib_write_bw(lab, a.seconds)}
            for t in LANES:
                row[f"{t}_gbps"] = lane(lab, a.seconds, t)
            rows.append(row)
            print(
                f"round {k + 1}: ib_write_bw {row['ib_write_bw_gbps']:.4f} Gbit/s, "
                f"ofi lane {row['ofi_gbps']:.4f}, verbs lane {row['verbs_gbps']:.4f}",
                flush=True,
            )
    med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}

    def ratio(x: str, y: str) -> float:
        return med[x] / med[y] if med[y] > 0 else float("nan")

    ratios = {
        "verbs_lane/ib_write_bw": ratio("verbs_gbps", "ib_write_bw_gbps"),
        "verbs_lane/ofi_lane": ratio("verbs_gbps", "ofi_gbps"),
        "ofi_lane/ib_write_bw": ratio("ofi_gbps", "ib_write_bw_gbps"),
    }
    print(
        f"median: ib_write_bw {med['ib_write_bw_gbps']:.4f} Gbit/s, "
        f"ofi lane {med['ofi_gbps']:.4f}, verbs lane {med['verbs_gbps']:.4f}"
    )
    for name, r in ratios.items():
        print(f"{name}: {r:.2f}x (emulated CPUs: compare ratios only)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rounds": rows, "medians": med, "ratios": ratios}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
