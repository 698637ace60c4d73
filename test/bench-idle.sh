#!/usr/bin/env bash
# bench-idle.sh: what idle Raft groups cost. For each layout (TABLESxSHARDS)
# and each binary, alternated round by round, it starts a fresh local
# 3-node cluster, creates the tables (dim 16), lets it settle, and prints
# the cores the three servers keep busy (utime+stime from /proc/PID/stat
# over MEASURE seconds), how long creating the tables took, and how long
# one node took to restart and serve again.
#
#   test/bench-idle.sh [-r ROUNDS] [-l "0x0 1x16 4x8 13x8 32x8"] [-a SERVER_ARGS] BIN...
#
# SETTLE (default 10) and MEASURE (default 10) are seconds; BASE_PORT
# (default 7901) the first client port.
set -euo pipefail

rounds=1
layouts="0x0 1x16 4x8 13x8 32x8"
server_args=""
while getopts "r:l:a:" o; do
	case $o in
	r) rounds=$OPTARG ;;
	l) layouts=$OPTARG ;;
	a) server_args=$OPTARG ;;
	*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "usage: $0 [-r ROUNDS] [-l LAYOUTS] [-a SERVER_ARGS] BIN..." >&2; exit 2; }
settle=${SETTLE:-10}
measure=${MEASURE:-10}
port=${BASE_PORT:-7901}
dir=$(mktemp -d /tmp/bench-idle.XXXXXX)
hz=$(getconf CLK_TCK)
current=""
trap '[ -n "$current" ] && "$current" cluster down --dir "$dir/c" >/dev/null 2>&1; rm -rf "$dir"' EXIT

# shellcheck source=test/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"

now() { date +%s.%N; }

printf '%-6s %-8s %-24s %10s %10s %10s\n' round layout binary cores create_s restart_s
for r in $(seq "$rounds"); do
	for layout in $layouts; do
		tables=${layout%x*}
		shards=${layout#*x}
		for bin in "$@"; do
			rm -rf "$dir/c"
			current=$bin
			# shellcheck disable=SC2086
			"$bin" cluster up --dir "$dir/c" --base-port "$port" ${server_args:+--server-args "$server_args"} >/dev/null 2>&1
			. "$dir/c/env"
			t0=$(now)
			failed=""
			for i in $(seq "$tables"); do
				if ! "$bin" table create "t$i" --dim 16 --shards "$shards" --optimizer sgd >/dev/null 2>"$dir/err"; then
					failed="table t$i: $(tail -c 200 "$dir/err")"
					break
				fi
			done
			create=$(echo "$(now) - $t0" | bc)
			if [ -n "$failed" ]; then
				"$bin" cluster down --dir "$dir/c" >/dev/null 2>&1
				current=""
				printf '%-6s %-8s %-24s creating failed after %.1f s: %s\n' "$r" "$layout" "$(basename "$bin")" "$create" "$failed"
				continue
			fi
			sleep "$settle"
			a=$(ticks "$dir/c")
			sleep "$measure"
			b=$(ticks "$dir/c")
			cores=$(echo "scale=3; ($b - $a) / $hz / $measure" | bc)
			t0=$(now)
			"$bin" cluster restart n2 --dir "$dir/c" >/dev/null 2>&1
			restart=$(echo "$(now) - $t0" | bc)
			"$bin" cluster down --dir "$dir/c" >/dev/null
			current=""
			printf '%-6s %-8s %-24s %10s %10.2f %10.2f\n' "$r" "$layout" "$(basename "$bin")" "$cores" "$create" "$restart"
		done
	done
done
