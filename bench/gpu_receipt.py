#!/usr/bin/env python3
"""The GPU suite's receipt (bench/gpu_suite.sh writes it last): one JSON file saying which plugin
tree ran, where, and how every run ended.

    python3 bench/gpu_receipt.py --suite-dir DIR --out FILE

DIR holds what the suite's runs wrote: ``side.json``, ``blackhole.json``, ``r4.json``,
``asan.json`` (bench/gpu_allreduce.py --json) and ``cycle/gpu_cycle.json`` (bench/gpu_cycle.py).
The receipt has the plugin's git tree hash, computed from the files that ran (equal to ``git
rev-parse HEAD:plugin`` of the commit they came from; the copy on the GPU host carries no
usable .git), the date, the GPU, the NCCL and
torch versions, every run's exit status by rank, wrong values, sanitizer reports, the
railhop/Socket ratios by size, the cycle's verdicts and one overall ``verdict``: PASS only when
every rank of every run exited 0, no value was wrong, no sanitizer reported, no run hung, the
4-rank blackhole run completed its planned steps and every cycle passed. A missing run is a FAIL
(named under ``missing``). The exit status is 0 for PASS, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ALLREDUCE_RUNS = ("side", "blackhole", "r4", "asan")


def _blob_sha(data: bytes) -> bytes:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).digest()


def git_tree_hash(path: Path) -> str:
    """Git's tree object id of the directory ``path`` as a commit would record it (regular
    files 100644/100755 by the owner's execute bit, symlinks 120000, subdirectories; empty
    directories are not recorded, as in git). Equal to ``git rev-parse HEAD:<path>`` when the
    directory holds exactly the committed files."""

    def tree(d: Path) -> bytes | None:
        entries: list[tuple[bytes, bytes, bytes]] = []  # (sort key, mode, sha)
        for p in d.iterdir():
            st = p.lstat()
            name = p.name.encode()
            if stat.S_ISLNK(st.st_mode):
                entries.append((name, b"120000", _blob_sha(os.readlink(p).encode())))
            elif stat.S_ISDIR(st.st_mode):
                sub = tree(p)
                if sub is not None:
                    entries.append((name + b"/", b"40000", sub))
            elif stat.S_ISREG(st.st_mode):
                mode = b"100755" if st.st_mode & stat.S_IXUSR else b"100644"
                entries.append((name, mode, _blob_sha(p.read_bytes())))
        if not entries:
            return None
        body = b"".join(
            m + b" " + k.rstrip(b"/") + b"\0" + sha
            for k, m, sha in sorted(entries, key=lambda e: e[0])
        )
        return hashlib.sha1(b"tree %d\0" % len(body) + body).digest()

    sha = tree(path)
    if sha is None:
        raise ValueError(f"{path}: no files")
    return sha.hex()


def _load(p: Path) -> dict[str, Any] | None:
    try:
        return json.loads(p.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def _gpu_name() -> str | None:
    try:
        r = subprocess.run(
            ["nvidia-smi", "-L"], check=False, capture_output=True, text=True, timeout=20
        )
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return None


def allreduce_runs(name: str, res: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per process group of a gpu_allreduce.py result (each sweep, each fault run)."""
    runs = []
    for tr, sw in res.get("sweep", {}).items():
        runs.append(
            {
                "run": f"{name}/{tr}",
                "ranks": sw.get("ranks", 2),
                "returncodes": sw.get("returncodes"),
                "wrong_values": sw.get("bad"),
                "sanitizer_reports": len(sw.get("sanitizer_reports", [])),
                "destroyed": sw.get("destroy", True),
                "error": (sw.get("error") or "")[:400] or None,
            }
        )
    for f in res.get("fault", []):
        runs.append(
            {
                "run": f"{name}/{f.get('transport')}-{f.get('fault')}",
                "ranks": f.get("ranks", 2),
                "returncodes": f.get("returncodes"),
                "wrong_values": f.get("bad"),
                "sanitizer_reports": len(f.get("sanitizer_reports", [])),
                "hung": f.get("hung"),
                "steps": f.get("steps"),
                "planned_steps": f.get("planned_steps"),
                "extra_step_s": f.get("extra_s"),
                "busbw_before_during_after_GBs": [
                    f.get("busbw_before_GBs"),
                    f.get("busbw_during_GBs"),
                    f.get("busbw_after_GBs"),
                ],
                "error": (f.get("error") or "")[:400] or None,
            }
        )
    return runs


def ratios(side: dict[str, Any]) -> dict[str, float]:
    """railhop/Socket bus-bandwidth ratio by size (MiB) of the side-by-side sweep."""
    sw = side.get("sweep", {})
    rh, so = sw.get("railhop", {}).get("results", {}), sw.get("socket", {}).get("results", {})
    out = {}
    for size, r in rh.items():
        s = so.get(size)
        if s and r.get("time_s") and s.get("time_s"):
            out[f"{int(size) >> 20}MiB"] = round(s["time_s"] / r["time_s"], 3)
    return out


def cycle_runs(cyc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for rep in cyc.get("runs", []):
        ok = bool(not rep.get("error") and rep.get("done") and rep.get("wrong_values") == 0)
        if rep.get("variant") == "socket":
            ok = True  # Socket's phase 1 is the comparison (it hangs), not a railhop verdict
        out.append(
            {
                "variant": rep.get("variant"),
                "run": rep.get("run"),
                "returncodes": rep.get("rc"),
                "wrong_values": rep.get("wrong_values"),
                "pass": ok,
                "error": rep.get("error"),
            }
        )
    return out


def verdict(receipt: dict[str, Any]) -> tuple[bool, list[str]]:
    """PASS or not, and why not."""
    why = [f"missing: {m}" for m in receipt["missing"]]
    for r in receipt["runs"]:
        tag = r["run"]
        rcs = r.get("returncodes")
        if not rcs or any(rc != 0 for rc in rcs):
            why.append(f"{tag}: exit status {rcs}")
        if r.get("wrong_values"):
            why.append(f"{tag}: {r['wrong_values']} wrong values")
        if r.get("sanitizer_reports"):
            why.append(f"{tag}: {r['sanitizer_reports']} sanitizer reports")
        if r.get("hung"):
            why.append(f"{tag}: hung")
        if r.get("planned_steps") is not None and r.get("steps") != r["planned_steps"]:
            why.append(f"{tag}: {r.get('steps')} of {r['planned_steps']} steps")
    cyc = receipt["cycle"]
    railhop_cycles = [c for c in cyc if c["variant"] != "socket"]
    if len(railhop_cycles) < 2:
        why.append(f"cycle: {len(railhop_cycles)} railhop cycles (want 2 or more)")
    for c in cyc:
        if not c["pass"]:
            why.append(f"cycle {c['variant']} #{c['run']}: {c.get('error')}")
        if c["variant"] != "socket" and c.get("returncodes") and any(c["returncodes"]):
            why.append(f"cycle {c['variant']} #{c['run']}: exit status {c['returncodes']}")
    return not why, why


def build(suite: Path, repo: Path = REPO) -> dict[str, Any]:
    receipt: dict[str, Any] = {
        "plugin_tree": git_tree_hash(repo / "plugin"),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gpu": _gpu_name(),
        "nccl": None,
        "torch": None,
        "runs": [],
        "ratios_railhop_over_socket": {},
        "cycle": [],
        "missing": [],
    }
    for name in ALLREDUCE_RUNS:
        res = _load(suite / f"{name}.json")
        if res is None:
            receipt["missing"].append(name)
            continue
        receipt["torch"] = receipt["torch"] or res.get("torch")
        for sw in res.get("sweep", {}).values():
            receipt["nccl"] = receipt["nccl"] or sw.get("nccl")
        receipt["runs"] += allreduce_runs(name, res)
        if name == "side":
            receipt["ratios_railhop_over_socket"] = ratios(res)
    cyc = _load(suite / "cycle" / "gpu_cycle.json")
    if cyc is None:
        receipt["missing"].append("cycle")
    else:
        receipt["cycle"] = cycle_runs(cyc)
    ok, why = verdict(receipt)
    receipt["verdict"] = "PASS" if ok else "FAIL"
    receipt["failures"] = why
    return receipt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--suite-dir", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    receipt = build(args.suite_dir)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(receipt, indent=1, sort_keys=True) + "\n")
    print(json.dumps({k: receipt[k] for k in ("plugin_tree", "gpu", "nccl", "verdict")}))
    for w in receipt["failures"]:
        print(f"  FAIL: {w}")
    return 0 if receipt["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
