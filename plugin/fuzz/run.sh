#!/usr/bin/env bash
# The fuzz targets' runs (docs/fuzzing.md), for `make fuzz` and ctest:
#   run.sh replay <target binary> <dir>...   every file under the dirs once (dot files skipped)
#   run.sh all <build dir> <seconds>          each target in the build: replay its corpus and
#                                             regressions, then fuzz it for <seconds>
# The committed tree is never written: a fuzz run's working corpus is a fresh temp dir seeded
# from plugin/fuzz/corpus/<t> and regress/<t>; a crash lands in <build dir>/artifacts/<t>/,
# its path printed, and fails the run.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

replay() {
	local bin=$1 log=$2
	shift 2
	local -a files=()
	local d f
	for d in "$@"; do
		[ -d "$d" ] || continue
		while IFS= read -r -d '' f; do files+=("$f"); done \
			< <(find "$d" -type f ! -name '.*' -print0 | sort -z)
	done
	REPLAYED=${#files[@]}
	[ ${#files[@]} -eq 0 ] && return 0
	if ! "$bin" -rss_limit_mb=2048 -timeout=10 "${files[@]}" >"$log" 2>&1; then
		tail -n 25 "$log" >&2
		echo "FAIL $(basename "$bin"): replay crashed on $(grep '^Running: ' "$log" | tail -n 1 | cut -d' ' -f2-)" >&2
		return 1
	fi
}

case "${1:-}" in
replay)
	[ $# -ge 2 ] || { echo "usage: $0 replay <binary> <dir>..." >&2; exit 2; }
	bin=$2
	shift 2
	log=$(mktemp)
	trap 'rm -f "$log"' EXIT
	replay "$bin" "$log" "$@" || exit 1
	echo "$(basename "$bin"): replayed $REPLAYED inputs"
	;;
all)
	[ $# -eq 3 ] || { echo "usage: $0 all <build dir> <seconds>" >&2; exit 2; }
	bdir=$2 secs=$3
	fail=0
	shopt -s nullglob
	bins=("$bdir"/fuzz_*)
	[ ${#bins[@]} -gt 0 ] || { echo "no fuzz targets in $bdir" >&2; exit 1; }
	for bin in "${bins[@]}"; do
		name=$(basename "$bin")
		t=${name#fuzz_}
		[ -x "$bin" ] && [ "$t" != gen_seeds ] || continue
		corpus=$here/corpus/$t regress=$here/regress/$t
		art=$bdir/artifacts/$t logs=$bdir/logs
		mkdir -p "$art" "$logs"
		if ! replay "$bin" "$logs/$t.replay.log" "$corpus" "$regress"; then
			fail=1
			continue
		fi
		work=$(mktemp -d "${TMPDIR:-/tmp}/rh-fuzz-$t.XXXXXX")
		seeds=()
		for d in "$corpus" "$regress"; do [ -d "$d" ] && seeds+=("$d"); done
		start=$(date +%s)
		"$bin" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
			-artifact_prefix="$art/" "$work" "${seeds[@]}" >"$logs/$t.log" 2>&1
		rc=$?
		took=$(($(date +%s) - start))
		runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$t.log" | tail -n 1)
		last=$(grep -E '^#[0-9]+' "$logs/$t.log" | tail -n 1)
		cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
		corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
		rm -rf "$work"
		if [ $rc -ne 0 ]; then
			fail=1
			crash=$(grep -o "Test unit written to .*" "$logs/$t.log" | tail -n 1 | cut -d' ' -f5-)
			tail -n 25 "$logs/$t.log" >&2
			echo "FAIL $name: replayed $REPLAYED inputs; fuzzing crashed after ${took}s:" \
				"${crash:-see $logs/$t.log} (keep it: cp it to plugin/fuzz/regress/$t/)" >&2
			continue
		fi
		echo "ok   $name: replayed $REPLAYED inputs; fuzzed ${took}s: ${runs:-?} runs," \
			"cov ${cov:-?}, corpus ${corp:-?}, no crash"
	done
	exit $fail
	;;
*)
	echo "usage: $0 replay <binary> <dir>... | all <build dir> <seconds>" >&2
	exit 2
	;;
esac
