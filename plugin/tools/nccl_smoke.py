#!/usr/bin/env python3
"""Real-NCCL smoke test of the plugin ABI: 2-rank all-reduce through NET only (one host,
loopback NIC), railhop vs NCCL's Socket transport (4 threads x 4 sockets), results checked.

    python3 plugin/tools/nccl_smoke.py build/ctest/plugin/libnccl-net-railhop.so

Needs 2 GPUs and torch with NCCL. SMOKE_BYTES / SMOKE_ITERS change the size / iterations.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZE = int(os.environ.get("SMOKE_BYTES", str(256 << 20)))
ITERS = int(os.environ.get("SMOKE_ITERS", "10"))


def worker(rank: int, port: int, q: Any, extra: dict[str, str]) -> None:
    os.environ.update(extra)
    os.environ["NCCL_HOSTID"] = f"smokehost{rank}"  # two "hosts": NET between the GPUs
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    x = torch.full((SIZE // 4,), float(rank + 1), device="cuda")
    for _ in range(3):
        x.fill_(float(rank + 1))
        dist.all_reduce(x)
    torch.cuda.synchronize()
    ok = bool(torch.all(x == 3.0).item())
    dist.barrier()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(ITERS):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / ITERS
    x.fill_(float(rank + 1))
    dist.all_reduce(x)
    torch.cuda.synchronize()
    ok = ok and bool(torch.all(x == 3.0).item())
    if rank == 0:
        q.put((SIZE / dt / 1e9, ok))  # busbw = algbw for 2 ranks
    dist.destroy_process_group()


def run(name: str, extra: dict[str, str], port: int) -> float:
    q = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(port, q, extra), nprocs=2, join=True)
    bw, ok = q.get()
    print(f"{name}: busbw {bw:.2f} GB/s, results {'OK' if ok else 'WRONG'}", flush=True)
    if not ok:
        sys.exit(1)
    return float(bw)


def main() -> None:
    plugin = os.path.abspath(sys.argv[1])
    base = {
        "NCCL_P2P_DISABLE": "1",
        "NCCL_SHM_DISABLE": "1",
        "NCCL_IB_DISABLE": "1",
        "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"),
    }
    rh = dict(base, NCCL_NET_PLUGIN=plugin, NCCL_NET="railhop", RAILHOP_NICS="lo")
    rh["RAILHOP_NTHREADS"] = os.environ.get("RAILHOP_NTHREADS", "8")
    so = dict(base, NCCL_NET_PLUGIN="none", NCCL_NET="Socket", NCCL_SOCKET_IFNAME="lo")
    so.update(NCCL_SOCKET_NTHREADS="4", NCCL_NSOCKS_PERTHREAD="4")
    a = run("railhop", rh, 29511)
    b = run("socket-4x4", so, 29512)
    print(f"ratio railhop/socket = {a / b:.2f}")


if __name__ == "__main__":
    main()
