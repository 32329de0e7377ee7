#!/bin/bash
# The GPU check of every plugin change, in one call of at most 10 minutes on one lent GPU (root,
# torch with NCCL built in; ranks in network namespaces of the emulated fabric, several ranks
# sharing the GPU, every value checked on the GPU):
#   1. 2 ranks, all-reduce side by side with NCCL's Socket (4M, 64M, 256M), then railhop through
#      a carrier loss at the remote end (node 1's nic1 spine-side peer: the cable pulled at the
#      switch);
#   2. 2 ranks through a silent blackhole;
#   3. 4 ranks without a fault (the ranks exit without destroying their process group, as torch
#      scripts do), then 4 ranks through a blackhole;
#   4. the 4-rank fault-tolerance cycle (failover, escalation, revoke, shrink, re-init), the
#      plugin alone and with the agent, twice each;
#   5. 2 ranks on an ASan build of the plugin (libasan preloaded into the ranks).
# Every rank's exit status is kept. bench/gpu_receipt.py then writes the receipt,
# ${OUT:-/tmp/railhop-gpu-suite}/gpu.json, which is committed as bench/receipts/gpu.json:
#   bash bench/gpu_suite.sh     (exit status 0 when the receipt's verdict is PASS)
# pyroute2 and the agent's dependencies: installed, or pure/binary wheels unpacked under
# .whl/py312 (pip install --target .whl/py312 --python-version 3.12 --only-binary=:all: ...).
set -u
cd "$(dirname "$0")/.."
OUTD=${OUT:-/tmp/railhop-gpu-suite}
W=$OUTD/suite
mkdir -p "$W"
B=${BUILD:-/tmp/railhop-gpu-build}
BA=${BUILD_ASAN:-/tmp/railhop-gpu-build-asan}
GPUS=${GPUS:-0}
if [ -d .whl/py312 ]; then
	export PYTHONPATH=$PWD/.whl/py312${PYTHONPATH:+:$PYTHONPATH}
fi
t0=$(date +%s)
step() { echo "=== [$(($(date +%s) - t0)) s] $*"; }

step "build (plain and ASan, side by side)"
cmake -S . -B "$B" -G Ninja -DRAILHOP_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
	cmake --build "$B" >"$W/build.log" 2>&1 &
pb=$!
cmake -S . -B "$BA" -G Ninja -DRAILHOP_BUILD_TESTS=OFF -DRAILHOP_SANITIZE=address \
	-DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
	cmake --build "$BA" >"$W/build-asan.log" 2>&1 &
pa=$!
if ! wait $pb || ! wait $pa; then
	echo "gpu_suite: plugin build failed" >&2
	tail -20 "$W/build.log" "$W/build-asan.log" >&2
	exit 1
fi
P=$B/plugin/libnccl-net-railhop.so
PA=$BA/plugin/libnccl-net-railhop.so
uname -r
nvidia-smi -L

AR="python3 bench/gpu_allreduce.py --gpus $GPUS"
step "1. 2 ranks side by side with Socket, then a remote carrier loss"
timeout 150 $AR --plugin "$P" --transports socket,railhop --sizes 4M,64M,256M --iters 10 \
	--fault carrier-remote --fault-total 12 --json "$W/side.json" 2>&1 | tail -22
step "2. 2 ranks through a silent blackhole"
timeout 70 $AR --plugin "$P" --transports '' --fault blackhole --fault-total 12 \
	--json "$W/blackhole.json" 2>&1 | tail -6
step "3. 4 ranks, no fault (exit without destroy), then through a blackhole"
timeout 110 $AR --plugin "$P" --ranks 4 --transports railhop --sizes 4M,64M --iters 5 \
	--no-destroy --fault blackhole --fault-total 12 --json "$W/r4.json" 2>&1 | tail -10
step "4. the 4-rank fault-tolerance cycle, twice (plugin alone, with the agent)"
timeout 200 python3 bench/gpu_cycle.py --plugin "$P" --gpus "$GPUS" --variants railhop,agent \
	--repeat 2 --out-dir "$W/cycle" 2>&1 | tail -40
step "5. 2 ranks on an ASan build"
asan=$(gcc -print-file-name=libasan.so)
timeout 90 $AR --plugin "$PA" --transports railhop --sizes 4M,64M --iters 5 \
	--env "LD_PRELOAD=$asan" \
	--env ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=0:replace_intrin=0 \
	--json "$W/asan.json" 2>&1 | tail -8
step "receipt"
python3 bench/gpu_receipt.py --suite-dir "$W" --out "$OUTD/gpu.json"
