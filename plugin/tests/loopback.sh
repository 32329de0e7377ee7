#!/bin/sh
# End-to-end over the loopback NIC: receiver and sender harness processes, every byte checked.
# usage: loopback.sh HARNESS PLUGIN
# RECV_ENV / SEND_ENV (optional): K=V words for one side only (e.g. RAILHOP_CHECKSUM=1).
set -eu
H=$1
P=$2
export RAILHOP_NICS=${RAILHOP_NICS:-lo}
run() {
	dir=$(mktemp -d)
	env ${RECV_ENV:-} "$H" --plugin "$P" --role recv --rendezvous "$dir" --deadline 60 "$@" >"$dir/recv.json" &
	rpid=$!
	if ! env ${SEND_ENV:-} "$H" --plugin "$P" --role send --rendezvous "$dir" --deadline 60 "$@" >"$dir/send.json"; then
		echo "sender failed: $*"; tail -n 2 "$dir/send.json"; kill "$rpid" 2>/dev/null || true
		exit 1
	fi
	if ! wait "$rpid"; then
		echo "receiver failed: $*"; tail -n 2 "$dir/recv.json"; exit 1
	fi
	echo "ok: $* :: $(tail -n 1 "$dir/recv.json")"
	rm -rf "$dir"
}
run --conns 2 --sizes 1048576,0,4096,1,65537 --count 200
run --conns 3 --sizes 65536,0,100 --count 96 --grouped 4 --api 8
run --conns 1 --sizes 33554432,0 --count 8 --inflight 2 --api 12
run --conns 8 --sizes 131072 --count 100 --api 10
run --conns 2 --sizes 262144 --duration 1 --api 9
# --stop-file ends a --duration run once the file exists (here from the start): without it this
# 300 s run would pass the 60 s deadline and fail
stop=$(mktemp)
run --conns 2 --sizes 65536 --duration 300 --stop-file "$stop"
rm -f "$stop"
