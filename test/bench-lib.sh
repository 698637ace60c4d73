# bench-lib.sh: helpers the benchmark scripts source (bench-idle.sh,
# bench-ab.sh).

# ticks DIR prints the utime+stime, in clock ticks, of the servers of the
# local cluster in DIR (raftps cluster up --dir DIR).
ticks() {
	local sum=0 pid
	for pid in $(cat "$1"/n*/pid); do
		# Fields 14 and 15, counted after the command name's closing paren.
		set -- $(sed 's/^.*) //' "/proc/$pid/stat")
		sum=$((sum + ${12} + ${13}))
	done
	echo $sum
}
