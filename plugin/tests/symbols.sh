#!/usr/bin/env bash
# Every symbol an archive defines for other files carries its module's prefix: symbols.sh
# ARCHIVE REGEX (an extended regex the names must match, e.g. '^(tcp|ofi|rh_lanes)_').
# The lanes and the core build into one plugin, so an unprefixed name (stream_new, io_main)
# is one collision away from a wrong call.
set -euo pipefail
archive=$1 allowed=$2
[ -f "$archive" ] || { echo "symbols.sh: no archive $archive" >&2; exit 2; }
# nm -g --defined-only prints "VALUE TYPE NAME"; USDT probe bases (_.stapsdt.base) and the
# AddressSanitizer's ODR indicators (__odr_asan.NAME) are the toolchain's, not ours
names=$(nm -g --defined-only "$archive" |
	awk 'NF == 3 && $3 != "_.stapsdt.base" && $3 !~ /^__odr_asan\./ {print $3}' | sort -u)
[ -n "$names" ] || { echo "symbols.sh: $archive defines no global symbol" >&2; exit 2; }
bad=$(grep -Ev "$allowed" <<<"$names" || true)
if [ -n "$bad" ]; then
	echo "$archive: global symbols without a module prefix ($allowed):" >&2
	echo "$bad" >&2
	exit 1
fi
echo "$(wc -l <<<"$names") global symbols of $(basename "$archive"), every one prefixed"
