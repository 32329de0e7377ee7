#!/usr/bin/env bash
# One-time, idempotent setup for a Debian 12 machine (run as root): apt packages, kernel headers for
# bcc, a virtualenv that sees Debian's bcc and pyverbs, and the railhop package itself.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${RAILHOP_VENV:-.venv}
APT_PKGS=(build-essential cmake ninja-build pkg-config git python3 python3-venv python3-dev
	python3-bpfcc bpfcc-tools python3-pyverbs rdma-core libibverbs-dev systemtap-sdt-dev
	iproute2 iperf3 libfabric-dev libfabric-bin libssl-dev linux-headers-amd64 clang-format
	systemd)

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
	# installed after the agent it drives; a node needs only the agent
	echo "setup: installing railhop-lab into $VENV"
	"$VENV/bin/pip" install -q ./lab
	touch "$stamp"
fi
