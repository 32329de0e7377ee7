#!/usr/bin/env bash
# Builds the railhop image (`make image`) from Debian packages and this source tree, with no
# container registry involved:
#   1. a Debian 12 (bookworm) root filesystem made by mmdebstrap from the Debian archive, with the
#      runtime packages below; cached as build/image/base-<hash>.tar, the hash taken over the
#      package list, the archive lines and this step's options (RAILHOP_IMAGE_REFRESH=1 rebuilds);
#   2. the railhop wheel (agent + both plugin names, built by CMake through scikit-build-core) and
#      the wheels of its Python dependencies, installed into /opt/railhop/.venv inside a copy of
#      that root filesystem (chroot), the policies under /etc/railhop/policies;
#   3. `podman import` of the result as localhost/railhop:<version from pyproject.toml>
#      (RAILHOP_IMAGE overrides the whole reference).
# Run as root (mmdebstrap's root mode, chroot, podman's root storage).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)
IMAGE=${RAILHOP_IMAGE:-localhost/railhop:$VERSION}
OUT=build/image
PY=${RAILHOP_VENV:-.venv}/bin/python

# python3-bpfcc: eBPF sources (bcc); python3-pyverbs/rdma-core/libibverbs1: verbs async events;
# libssl3: the plugin's libcrypto (lane handshake HMAC); python3-venv: the agent's venv, which
# sees Debian's bcc and pyverbs; iproute2: diagnostics from `kubectl exec`; util-linux/procps:
# the same.
IMAGE_APT_PKGS=(python3 python3-venv python3-bpfcc python3-pyverbs rdma-core libibverbs1 libssl3
	iproute2 procps ca-certificates)
SUITE=bookworm
MIRRORS=(
	"deb http://deb.debian.org/debian bookworm main"
	"deb http://deb.debian.org/debian bookworm-updates main"
	"deb http://deb.debian.org/debian-security bookworm-security main"
)
MMDEBSTRAP_OPTS=(--mode=root --variant=apt --format=tar --aptopt='Acquire::Retries "3"'
	--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
	--dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright')

if [ "$(id -u)" -ne 0 ]; then
	echo "build-image: must run as root (mmdebstrap --mode=root, chroot, podman)" >&2
	exit 2
fi
for tool in mmdebstrap podman; do
	command -v "$tool" >/dev/null || {
		echo "build-image: $tool is missing; run \`make setup\`" >&2
		exit 2
	}
done
mkdir -p "$OUT"

# ---- 1. the base root filesystem (cached) -------------------------------------------------------
key=$(printf '%s\n' "$SUITE" "${IMAGE_APT_PKGS[@]}" "${MIRRORS[@]}" "${MMDEBSTRAP_OPTS[@]}" |
	sha256sum | cut -c1-16)
base=$OUT/base-$key.tar
if [ ! -s "$base" ] || [ "${RAILHOP_IMAGE_REFRESH:-0}" = 1 ]; then
	echo "build-image: mmdebstrap $SUITE (${IMAGE_APT_PKGS[*]}) -> $base"
	rm -f "$OUT"/base-*.tar.partial
	pkgs=$(
		IFS=,
		echo "${IMAGE_APT_PKGS[*]}"
	)
	mmdebstrap "${MMDEBSTRAP_OPTS[@]}" --include="$pkgs" \
		--customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
		"$SUITE" "$base.partial" "${MIRRORS[@]}"
	mv "$base.partial" "$base"
else
	echo "build-image: reusing $base"
fi

# ---- 2. the wheels: railhop (with both plugin names) and its dependencies -----------------------
wheels=$OUT/wheels
rm -rf "$wheels"
mkdir -p "$wheels"
echo "build-image: building the railhop wheel and collecting its dependencies"
"$PY" -m pip wheel -q --wheel-dir "$wheels" .
ls "$wheels"/railhop-"$VERSION"-*.whl >/dev/null

root=$OUT/rootfs
rm -rf "$root"
mkdir -p "$root"
tar -C "$root" -xf "$base"
mkdir -p "$root/tmp/wheels"
cp "$wheels"/*.whl "$root/tmp/wheels/"
env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin chroot "$root" /usr/bin/python3 -m venv --system-site-packages /opt/railhop/.venv
env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin chroot "$root" /opt/railhop/.venv/bin/pip install -q --no-index --no-cache-dir \
	--disable-pip-version-check --find-links /tmp/wheels railhop=="$VERSION"
rm -rf "$root/tmp/wheels" "$root/root/.cache"
mkdir -p "$root/etc/railhop/policies"
cp policies/*.yaml policies/*.json "$root/etc/railhop/policies/"
# fail here, not in a cluster, if a piece is missing
chroot "$root" /opt/railhop/.venv/bin/railhop plugin-path
chroot "$root" /opt/railhop/.venv/bin/railhop plugin-path --rccl
chroot "$root" /usr/bin/python3 -c 'import bcc, pyverbs'

# ---- 3. the OCI image ----------------------------------------------------------------------------
echo "build-image: podman import -> $IMAGE"
tar -C "$root" --numeric-owner -cf - . | podman import \
	--change 'ENV PATH=/opt/railhop/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
	--change 'ENV RAILHOP_RUN_DIR=/run/railhop' \
	--change 'ENTRYPOINT ["railhop"]' \
	--change 'CMD ["--help"]' \
	--change "LABEL org.opencontainers.image.version=$VERSION" \
	--change 'LABEL org.opencontainers.image.title=railhop' \
	--message "railhop $VERSION from $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
	- "$IMAGE" >/dev/null
rm -rf "$root"
podman image inspect --format '{{.Id}} {{.Size}}' "$IMAGE"
echo "build-image: built $IMAGE"
