#!/usr/bin/env bash
# bench-ab.sh: the make bench-cluster push and pull, binaries alternated
# round by round on one machine, so that their ratio means something on a
# shared host. Each run is a fresh local 3-node cluster, one 16-shard dim-64
# sgd table, then
#
#   raftps bench --workload push --keys 1000000 --batch 4096 --zipf 1.1 --clients 4
#   raftps bench --workload pull (the same keys, --load=false)
#
# and the cores the three servers used (utime+stime from /proc) during each.
# Rounds alternate the order (given, then reversed), so use an even number
# of them. It ends with each binary's totals and their ratio to the first
# binary's.
#
#   test/bench-ab.sh [-r ROUNDS] [-d DURATION] [-i] [-a SERVER_ARGS] BIN...
#
# -i runs every cluster without TLS (--insecure); builds from before TLS
# (b492129 and older) have none, so compare them only with -i. BASE_PORT
# (default 7601) is the first client port.
set -euo pipefail

rounds=4
dur=15s
insecure=0
server_args=""
while getopts "r:d:ia:" o; do
	case $o in
	r) rounds=$OPTARG ;;
	d) dur=$OPTARG ;;
	i) insecure=1 ;;
	a) server_args=$OPTARG ;;
	*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "usage: $0 [-r ROUNDS] [-d DURATION] [-i] [-a SERVER_ARGS] BIN..." >&2; exit 2; }
[[ $dur =~ ^[0-9]+s$ ]] || { echo "$0: -d takes whole seconds (15s), not $dur" >&2; exit 2; }
port=${BASE_PORT:-7601}
dir=$(mktemp -d /tmp/bench-ab.XXXXXX)
hz=$(getconf CLK_TCK)
current=""
trap '[ -n "$current" ] && "$current" cluster down --dir "$dir/c" >/dev/null 2>&1; rm -rf "$dir"' EXIT

for b in "$@"; do
	[ -x "$b" ] || { echo "$0: $b is not an executable" >&2; exit 2; }
	if [ $insecure = 0 ] && ! "$b" server --help 2>&1 | grep -q -- -insecure; then
		echo "$0: $b has no TLS; compare it with -i (every cluster --insecure)" >&2
		exit 2
	fi
done

# shellcheck source=test/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"

div() { awk -v a="$1" -v b="$2" 'BEGIN { print (b > 0 ? a / b : 0) }'; }

# rate prints the rows/s and the p99 of a bench summary line.
rate() { sed -n 's/.*: \([0-9]*\) rows\/s .*p99 \([0-9.]* [mµ]*s\).*/\1 \2/p' | tail -1; }

declare -A push_sum pull_sum
printf '%-5s %-28s %12s %11s %6s %12s %11s %6s\n' round binary "push rows/s" "push p99" cores "pull rows/s" "pull p99" cores
bins=("$@")
for r in $(seq 1 "$rounds"); do
	# Odd rounds run the binaries in the order given, even rounds in the
	# reverse order: on this project's VM the build run second in a round
	# did up to 10 % better whichever it was (docs/BENCHMARKS.md).
	order=("${bins[@]}")
	if ((r % 2 == 0)); then
		order=()
		for ((i = ${#bins[@]} - 1; i >= 0; i--)); do order+=("${bins[i]}"); done
	fi
	for b in "${order[@]}"; do
		args=$server_args
		if [ $insecure = 1 ] && "$b" server --help 2>&1 | grep -q -- -insecure; then
			args="$args --insecure"
		fi
		rm -rf "$dir/c"
		current=$b
		if ! "$b" cluster up --dir "$dir/c" --base-port "$port" ${args:+--server-args "$args"} >"$dir/up.log" 2>&1; then
			cat "$dir/up.log" >&2
			exit 1
		fi
		if [ -f "$dir/c/env" ]; then
			# shellcheck disable=SC1091
			. "$dir/c/env"
		else # builds before TLS wrote only the addresses
			export RAFTPS_CLUSTER=$(cat "$dir/c/addrs")
		fi
		"$b" table create bench --dim 64 --shards 16 --optimizer sgd >/dev/null
		common="--table bench --keys 1000000 --batch 4096 --zipf 1.1 --clients 4 --duration $dur"
		# The push's first run loads the keys; the servers' cores are counted
		# from after the load.
		"$b" bench $common --workload push --duration 1s >/dev/null 2>&1
		t0=$(ticks "$dir/c")
		"$b" bench $common --load=false --workload push >"$dir/push.txt" 2>&1 || true
		t1=$(ticks "$dir/c")
		"$b" bench $common --load=false --workload pull >"$dir/pull.txt" 2>&1 || true
		t2=$(ticks "$dir/c")
		push=$(rate <"$dir/push.txt")
		pull=$(rate <"$dir/pull.txt")
		if [ -z "$push" ] || [ -z "$pull" ]; then
			echo "$0: round $r, $b: a bench printed no summary:" >&2
			tail -5 "$dir/push.txt" "$dir/pull.txt" >&2
			exit 1
		fi
		"$b" cluster down --dir "$dir/c" >/dev/null
		current=""
		secs=${dur%s}
		printf '%-5s %-28s %12s %11s %6.2f %12s %11s %6.2f\n' "$r" "$(basename "$b")" \
			"${push%% *}" "${push#* }" "$(div $((t1 - t0)) $((hz * secs)))" \
			"${pull%% *}" "${pull#* }" "$(div $((t2 - t1)) $((hz * secs)))"
		push_sum[$b]=$(( ${push_sum[$b]:-0} + ${push%% *} ))
		pull_sum[$b]=$(( ${pull_sum[$b]:-0} + ${pull%% *} ))
	done
done
echo
first=$1
for b in "$@"; do
	printf 'total %-28s push %10d (%.2fx)   pull %10d (%.2fx)\n' "$(basename "$b")" \
		"${push_sum[$b]}" "$(div "${push_sum[$b]}" "${push_sum[$first]}")" \
		"${pull_sum[$b]}" "$(div "${pull_sum[$b]}" "${pull_sum[$first]}")"
done
