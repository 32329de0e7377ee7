#!/bin/sh
# railhop's node-problem-detector check: POSIX sh and `date` only (no Python, no railhop).
#
#   railhop-check.sh [NODE_STATUS_FILE]     (default $RAILHOP_NODE_STATUS, else
#                                             /run/railhop/node-status)
#
# Reads the file the railhop agent rewrites in its run directory (agent/railhop/daemon/
# nodestatus.py) and answers in NPD's custom-plugin protocol, one line on stdout:
#   exit 0  ok: enough rails up (the policy's health.min_rails_up; 0 = every rail)
#   exit 1  degraded: too few rails up (the line names the NICs that are not up)
#   exit 3  unknown: no file, another format version, a missing or malformed field, the agent
#           shut down ("gone"), or a heartbeat older than the bound (3 x the file's refresh,
#           at least 10 s; RAILHOP_STALE_S overrides it) or in the future by more than that
# docs/operations.md, "Node health to scheduling".

file=${1:-${RAILHOP_NODE_STATUS:-/run/railhop/node-status}}

unknown() {
    echo "unknown: $*"
    exit 3
}

[ -f "$file" ] && [ -r "$file" ] || unknown "no railhop node status at $file (is the railhop agent running on this node?)"

version='' heartbeat='' refresh='' pid='' up='' total='' min='' verdict='' notup=''
while read -r key a b c d rest; do
    case $key in
        version) version=$a ;;
        heartbeat) heartbeat=$a ;;
        refresh) refresh=$a ;;
        pid) pid=$a ;;
        rails_up) up=$a ;;
        rails_total) total=$a ;;
        min_rails_up) min=$a ;;
        verdict) verdict=$a ;;
        nic)
            [ -n "$d" ] && [ -z "$rest" ] || unknown "$file: bad nic line: $key $a $b $c $d $rest"
            [ "$c" = up ] || notup="${notup:+$notup, }$a $c ($d)"
            ;;
    esac
done <"$file"

[ "$version" = 1 ] || unknown "$file: format version '${version}', this check reads 1"

number() { # NAME VALUE: a decimal number, or unknown
    case $2 in
        '' | *[!0-9]*) unknown "$file: field $1 missing or not a number ('$2')" ;;
    esac
}
number heartbeat "$heartbeat"
number refresh "$refresh"
number pid "$pid"
number rails_up "$up"
number rails_total "$total"
number min_rails_up "$min"

case $verdict in
    ok | degraded) ;;
    gone) unknown "the railhop agent (pid $pid) shut down at $heartbeat (date +%s); $file is its last word" ;;
    *) unknown "$file: verdict '${verdict}' is none of ok, degraded, gone" ;;
esac

now=$(date +%s)
number "now (date +%s)" "$now"
bound=${RAILHOP_STALE_S:-$((3 * refresh))}
number RAILHOP_STALE_S "$bound"
[ -n "$RAILHOP_STALE_S" ] || [ "$bound" -ge 10 ] || bound=10
age=$((now - heartbeat))
[ "$age" -le "$bound" ] || unknown "railhop agent heartbeat is ${age} s old (bound ${bound} s): agent pid $pid hung or gone"
[ "$age" -ge $((0 - bound)) ] || unknown "railhop agent heartbeat is $((0 - age)) s in the future (bound ${bound} s): clock stepped?"

want=$min
[ "$want" -gt 0 ] || want=$total
line="$up of $total rails up (policy wants $want); NICs not up: ${notup:-none}"
if [ "$total" -gt 0 ] && [ "$up" -ge "$want" ]; then
    echo "ok: $line"
    exit 0
fi
echo "degraded: $line"
exit 1
