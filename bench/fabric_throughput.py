#!/usr/bin/env python3
"""Plugin throughput over the rate-limited 4-NIC fabric vs the raw TCP ceiling of the same fabric.

Both are measured in one run, the same way: bytes received on node 1's NICs (fabric counters,
wire bytes) over the same steady window, with all NICs busy at once and the same number of TCP
streams per NIC (iperf3 -P = the plugin's RAILHOP_STREAMS_PER_LANE). Rounds alternate
iperf3 / plugin; the medians give the ratio (target >= 0.9).

With --transports tcp,ofi every round runs the plugin once per lane transport (RAILHOP_TRANSPORT;
ofi through libfabric's tcp provider, FI_PROVIDER=tcp), side by side on the same fabric, and the
summary prints each transport's ratio to the TCP lane (issue 11 target: ofi >= 0.8x tcp).
The label tcp+pmac is the TCP lane with RAILHOP_CHECKSUM=1 (a keyed payload MAC, GMAC, on
every DATA frame; frame headers carry their MAC always): run it beside tcp for its cost;
tcp+chunk512k and ofi+chunk512k are the lanes with the 512 KiB chunks of before issue 18 (the
default is 128 KiB). A label may name the ncclNet table
the harness drives (tcp@v8, tcp@v11; default v11): the tables side by side. --rate-mbit 0 leaves
the veths unlimited.

Each round's line ends with the host's 1-minute load average, and each plugin run carries its NIC
spread (slowest NIC's rate / fastest's): a dip with a spread near 1.0 slowed every NIC alike (the
host's CPUs), a low spread means the run settled with a NIC starved. The summary prints every
label's ratio per round, so a bimodal label shows as two clusters.

    sudo python3 bench/fabric_throughput.py [--quick] [--rate-mbit 200] [--json out.json]
    sudo python3 bench/fabric_throughput.py --transports tcp,ofi
    sudo python3 bench/fabric_throughput.py --transports tcp,tcp+pmac --rate-mbit 0
    sudo python3 bench/fabric_throughput.py --transports tcp --baseline /path/to/main/build
    sudo python3 bench/fabric_throughput.py --transports tcp@v8,tcp@v11 --rate-mbit 1000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _common

_common.setup_import_path()

from railhop import paths  # noqa: E402
from railhop_lab.fabric import CounterSampler, Fabric, in_netns, unique_prefix  # noqa: E402
from railhop_lab.harness import HarnessConfig, HarnessRun, rate_between, use_source_tree_build  # noqa: E402

IPERF_PORT = 5201

# The harness environment of each lane transport.
TRANSPORT_ENV = {
    "tcp": {"RAILHOP_TRANSPORT": "tcp"},
    "ofi": {"RAILHOP_TRANSPORT": "ofi", "FI_PROVIDER": "tcp"},
    "tcp+pmac": {"RAILHOP_TRANSPORT": "tcp", "RAILHOP_CHECKSUM": "1"},
    # the chunk size before issue 18 (512 KiB; the default is 128 KiB), for a side-by-side A/B
    "tcp+chunk512k": {"RAILHOP_TRANSPORT": "tcp", "RAILHOP_CHUNK_SIZE": "524288"},
    "ofi+chunk512k": {
        "RAILHOP_TRANSPORT": "ofi",
        "FI_PROVIDER": "tcp",
        "RAILHOP_CHUNK_SIZE": "524288",
    },
}


def listening(fab: Fabric, node: int, port: int) -> bool:
    def body() -> bool:
        text = Path("/proc/thread-self/net/tcp").read_text()
        return any(
            ln.split()[1].endswith(f":{port:04X}") and ln.split()[3] == "0A"
            for ln in text.splitlines()[1:]
        )

    return in_netns(fab.netns(node), body)


def window_rates(samp: CounterSampler, nics: int, t0: float, t1: float) -> list[float]:
    """Bytes/s received on each of node 1's NICs over the window."""
    return [samp.rate(1, i, t0, t1, direction="rx") for i in range(nics)]


def window_rate(samp: CounterSampler, nics: int, t0: float, t1: float) -> float:
    return sum(window_rates(samp, nics, t0, t1))


def nic_spread(by_nic: list[float]) -> float:
    """The slowest NIC's rate over the fastest's: 1.0 when the NICs share the load evenly, lower
    when a run settles with one NIC starved (a mode of the run, not of the host's load)."""
    return min(by_nic) / max(by_nic) if by_nic and max(by_nic) > 0 else 0.0


def run_iperf(fab: Fabric, nics: int, streams: int, seconds: float) -> dict[str, Any]:
    servers = []
    for i in range(nics):
        argv = ["iperf3", "-s", "-1", "-B", fab.address(1, i), "-p", str(IPERF_PORT + i)]
        servers.append(fab.popen(1, argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    deadline = time.monotonic() + 10
    while not all(listening(fab, 1, IPERF_PORT + i) for i in range(nics)):
        if time.monotonic() > deadline:
            raise RuntimeError("iperf3 servers did not start listening within 10 s")
        time.sleep(0.05)
    clients = []
    with CounterSampler(fab, interval=0.1) as samp:
        t_start = time.monotonic()
        for i in range(nics):
            argv = ["iperf3", "-c", fab.address(1, i), "-B", fab.address(0, i)]
            argv += ["-p", str(IPERF_PORT + i), "-P", str(streams), "-t", f"{seconds:g}", "-J"]
            clients.append(fab.popen(0, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        outs = [c.communicate(timeout=seconds + 20)[0] for c in clients]
        t_end = time.monotonic()
    for s in servers:
        s.wait(10)
    goodput = 0.0
    for i, out in enumerate(outs):
        try:
            res = json.loads(out)
            goodput += float(res["end"]["sum_received"]["bits_per_second"]) / 8
        except (ValueError, KeyError) as e:
            raise RuntimeError(f"iperf3 on nic{i} gave no result: {out[:300]!r}") from e
    wire = window_rate(samp, nics, t_start + 1.0, t_end - 0.3)
    return {"wire_Bps": wire, "goodput_Bps": goodput, "seconds": t_end - t_start}


def run_plugin(
    fab: Fabric,
    nics: int,
    conns: int,
    seconds: float,
    size: int,
    env: dict[str, str] | None = None,
    build: tuple[Path, Path] | None = None,
    api: int | None = None,
) -> dict[str, Any]:
    cfg = HarnessConfig(
        conns=conns, sizes=(size,), duration=seconds, deadline=seconds + 60, api=api
    )
    plugin, harness = build if build else (None, None)
    with (
        CounterSampler(fab, interval=0.1) as samp,
        HarnessRun(fab, cfg, env=env, plugin=plugin, harness=harness) as run,
    ):
        t_start = time.monotonic()
        res = run.wait()
        t_end = time.monotonic()
    if not res.ok:
        raise RuntimeError(f"plugin run failed:\n{res.describe()}")
    prog = res.recv.progress
    # the window where data moves: from the first progress with bytes > 0
    first = next((p.t for p in prog if p.bytes > 0), 0.0)
    last = prog[-1].t if prog else 0.0
    goodput = rate_between(prog, first + 1.0, last - 0.2)
    t0 = run.started_at + first + 1.0
    t1 = run.started_at + last - 0.2
    by_nic = window_rates(samp, nics, t0, t1)
    return {
        "wire_Bps": sum(by_nic),
        "wire_Bps_by_nic": by_nic,
        "nic_spread": nic_spread(by_nic),
        "goodput_Bps": goodput,
        "bytes_checked": res.bytes_checked,
        "data_errors": res.data_errors,
        "seconds": t_end - t_start,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one round of 3 s each")
    ap.add_argument(
        "--rate-mbit", type=int, default=200, help="tbf ceiling per NIC (default 200, 0 = none)"
    )
    ap.add_argument("--nics", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=6.0, help="per measurement (default 6)")
    ap.add_argument("--rounds", type=int, default=2, help="iperf3/plugin rounds (default 2)")
    ap.add_argument(
        "--streams",
        type=int,
        default=4,
        help="TCP streams per NIC (default 4 = RAILHOP_STREAMS_PER_LANE default)",
    )
    ap.add_argument("--conns-per-nic", type=int, default=1)
    ap.add_argument("--size", type=int, default=4 << 20, help="message size (default 4 MiB)")
    ap.add_argument("--plugin", help="plugin .so (default: railhop.paths / a make ctest build)")
    ap.add_argument("--harness", help="railhop-harness (default: railhop.paths)")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--env", action="append", default=[], help="K=V for the plugin (repeat)")
    ap.add_argument(
        "--baseline",
        help="a build directory of another tree (e.g. main's): its TCP lanes run as label "
        "'baseline' in every round, and each label's ratio to it is printed",
    )
    ap.add_argument(
        "--alternate",
        action="store_true",
        help="run the labels in reverse order every other round (cancels an effect of the "
        "order on a loaded machine; ratios are taken per round either way)",
    )
    ap.add_argument(
        "--transports",
        default="",
        help="lane transports side by side, e.g. tcp,ofi (default: the plugin's own choice)",
    )
    args = ap.parse_args()
    transports = [t for t in args.transports.split(",") if t]
    for t in transports:
        base, _, api = t.partition("@v")
        if base not in TRANSPORT_ENV:
            ap.error(f"--transports: unknown transport {t!r} (known: {', '.join(TRANSPORT_ENV)})")
        if api and not (api.isdigit() and 8 <= int(api) <= 12):
            ap.error(f"--transports: {t!r}: the table is @v8 .. @v12")
    for kv in args.env:
        k, _, v = kv.partition("=")
        os.environ[k] = v
    _common.need_root("bench/fabric_throughput.py")
    if args.quick:
        args.seconds, args.rounds = 3.0, 1
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
    os.environ["RAILHOP_STREAMS_PER_LANE"] = str(args.streams)
    print(f"railhop fabric throughput | {_common.stamp()} | {_common.machine()}")
    print(
        f"  fabric: 2 nodes x {args.nics} NICs, "
        f"{f'tbf {args.rate_mbit} Mbit/s' if args.rate_mbit else 'unlimited'} per NIC per "
        f"direction; {args.streams} TCP streams per NIC; plugin {plugin}"
    )
    rounds: list[dict[str, Any]] = []
    labels = transports or ["plugin"]
    builds: dict[str, tuple[Path, Path]] = {}
    if args.baseline:
        base = Path(args.baseline) / "plugin"
        builds["baseline"] = (base / "libnccl-net-railhop.so", base / "railhop-harness")
        labels = ["baseline", *labels]
    with Fabric(
        nodes=2, nics=args.nics, rate_mbit=args.rate_mbit or None, prefix=unique_prefix("rhbt")
    ) as fab:
        for r in range(args.rounds):
            ip = run_iperf(fab, args.nics, args.streams, args.seconds)
            line = (
                f"  round {r + 1}: iperf3 {_common.mbit(ip['wire_Bps']):8.1f} Mbit/s wire "
                f"({_common.mbit(ip['goodput_Bps']):7.1f} goodput)"
            )
            rnd: dict[str, Any] = {"iperf3": ip}
            order = labels[::-1] if args.alternate and r % 2 else labels
            for label in order:
                pl = run_plugin(
                    fab,
                    args.nics,
                    args.nics * args.conns_per_nic,
                    args.seconds,
                    args.size,
                    TRANSPORT_ENV.get("tcp" if label == "baseline" else label.partition("@v")[0]),
                    builds.get(label),
                    int(label.partition("@v")[2]) if "@v" in label else None,
                )
                ratio = pl["wire_Bps"] / ip["wire_Bps"] if ip["wire_Bps"] else 0.0
                line += (
                    f" | {label} {_common.mbit(pl['wire_Bps']):8.1f} Mbit/s wire "
                    f"({_common.mbit(pl['goodput_Bps']):7.1f} goodput, "
                    f"{pl['bytes_checked'] / 2**20:.0f} MiB checked, NIC spread "
                    f"{pl['nic_spread']:.2f}) ratio {ratio:.3f}"
                )
                rnd[label] = pl
                rnd[f"ratio_{label}"] = ratio
            rnd["loadavg_1m"] = os.getloadavg()[0]
            print(f"{line} | load {rnd['loadavg_1m']:.1f}")
            if len(labels) == 1:
                rnd["plugin"], rnd["ratio"] = rnd[labels[0]], rnd[f"ratio_{labels[0]}"]
            rounds.append(rnd)
    ceiling = args.nics * args.rate_mbit  # 0: unlimited
    ip_med = _common.median([x["iperf3"]["wire_Bps"] for x in rounds])
    med = {lb: _common.median([x[lb]["wire_Bps"] for x in rounds]) for lb in labels}
    ratio = med[labels[0]] / ip_med if ip_med else 0.0
    errors = sum(x[lb]["data_errors"] for x in rounds for lb in labels)
    print("summary:")
    print(f"  configured ceiling          {ceiling:8.1f} Mbit/s")
    print(f"  raw TCP (iperf3), median    {_common.mbit(ip_med):8.1f} Mbit/s")
    for lb in labels:
        name = "plugin (harness)" if lb == "plugin" else f"plugin, {lb} lanes"
        r_lb = med[lb] / ip_med if ip_med else 0.0
        per_round = ", ".join(f"{x[f'ratio_{lb}']:.3f}" for x in rounds)
        print(f"  {name + ' / raw TCP, per round':<28} {per_round}")
        print(f"  {name + ', median':<28}{_common.mbit(med[lb]):8.1f} Mbit/s")
        print(
            f"  {name + ' / raw TCP':<28}{r_lb:8.3f}   (target >= 0.9) "
            f"{'PASS' if r_lb >= 0.9 else 'BELOW TARGET'}"
        )
    side: dict[str, float] = {}
    if "tcp" in labels:
        for lb in labels:
            if lb not in ("tcp", "baseline"):
                side[lb] = med[lb] / med["tcp"] if med["tcp"] else 0.0
                if lb == "tcp+pmac":  # a cost to report, no target
                    print(f"  payload MAC on / off        {side[lb]:8.3f}")
                    continue
                print(
                    f"  {lb} lanes / tcp lanes       {side[lb]:8.3f}   (target >= 0.8) "
                    f"{'PASS' if side[lb] >= 0.8 else 'BELOW TARGET'}"
                )
    if "baseline" in labels:
        for lb in labels:
            if lb != "baseline":
                side[f"{lb}/baseline"] = med[lb] / med["baseline"] if med["baseline"] else 0.0
                per = [
                    x[lb]["wire_Bps"] / x["baseline"]["wire_Bps"]
                    for x in rounds
                    if x["baseline"]["wire_Bps"]
                ]
                print(
                    f"  {lb} / baseline{'':<14}{side[f'{lb}/baseline']:8.3f}   per round "
                    + " ".join(f"{v:.3f}" for v in per)
                    + f" (median {_common.median(per):.3f})"
                )
    print(f"  data errors                 {errors:8d}")
    _common.write_json(
        args.json,
        {
            "bench": "fabric_throughput",
            "date": _common.stamp(),
            "machine": _common.machine(),
            "args": vars(args),
            "rounds": rounds,
            "ratio": ratio,
            "transport_ratio_to_tcp": side,
        },
    )
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
