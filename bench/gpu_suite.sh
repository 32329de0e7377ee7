#!/bin/bash
# The GPU runs recorded in docs/BENCHMARKS.md, in one call on a 2-GPU host (root, torch with
# NCCL): build the plugin, then the all-reduce side by side with Socket and with a carrier loss
# and a silent blackhole mid-run, the 4-rank fault-tolerance cycle, then over the libfabric
# lane. Results JSON goes to ${OUT:-/tmp}/ar.json.
#   bash bench/gpu_suite.sh
# pyroute2: installed, or taken from .whl/pyroute2-*.whl by the bench scripts.
set -u
cd "$(dirname "$0")/.."
B=${BUILD:-/tmp/railhop-gpu-build}
cmake -S . -B "$B" -G Ninja -DRAILHOP_BUILD_TESTS=OFF >/dev/null && cmake --build "$B" >/dev/null ||
	{ echo "gpu_suite: plugin build failed" >&2; exit 1; }
P=$B/plugin/libnccl-net-railhop.so
uname -r
nvidia-smi -L
echo "=== side by side"
timeout 200 python3 bench/gpu_allreduce.py --plugin "$P" --transports socket,railhop \
	--sizes 4M,64M,256M --iters 10 --json "${OUT:-/tmp}/ar.json" 2>&1 | tail -25
for f in carrier blackhole; do
	echo "=== $f"
	timeout 100 python3 bench/gpu_allreduce.py --plugin "$P" --transports railhop --sizes 64M \
		--iters 3 --fault $f --fault-total 15 2>&1 | tail -12
done
# The 4-rank fault-tolerance cycle (4 ranks may share one GPU), twice, with Socket's phase 1.
echo "=== 4-rank fault-tolerance cycle"
timeout 300 python3 bench/gpu_cycle.py --plugin "$P" --variants railhop,controller,socket \
	--repeat 2 --out-dir "${OUT:-/tmp}" 2>&1 | tail -45
# The same all-reduce over the libfabric lane (tcp provider: no RDMA hardware on the host).
if ! pkg-config --exists libfabric 2>/dev/null; then
	echo "=== ofi lane: skipped (no libfabric headers on this host: plugin built without it)"
	exit 0
fi
echo "=== ofi lane (RAILHOP_TRANSPORT=ofi FI_PROVIDER=tcp)"
timeout 150 python3 bench/gpu_allreduce.py --plugin "$P" --transports railhop --sizes 4M,64M,256M \
	--iters 10 --env RAILHOP_TRANSPORT=ofi --env FI_PROVIDER=tcp 2>&1 | tail -8
for f in carrier blackhole; do
	echo "=== ofi lane, $f"
	timeout 100 python3 bench/gpu_allreduce.py --plugin "$P" --transports railhop --sizes 64M \
		--iters 3 --fault $f --fault-total 15 --env RAILHOP_TRANSPORT=ofi \
		--env FI_PROVIDER=tcp 2>&1 | tail -4
done
