#!/bin/sh
# config.sh: pvisor-pool rejects bad settings with exit 2 and a message naming the culprit.
BIN=${PVISOR_POOL_BIN:-build/pool/pvisor-pool}
[ -x "$BIN" ] || { echo "SKIP: $BIN not built"; exit 77; }
D=$(mktemp -d /tmp/pvpool-conf-XXXXXX)
trap 'rm -rf "$D"' EXIT
fail=0

# expect STATUS PATTERN -- ARGS...: run the pool, check exit status and stderr.
expect() {
	want=$1 pat=$2
	shift 3
	out=$(timeout 10 "$BIN" "$@" 2>&1)
	got=$?
	if [ "$got" != "$want" ] || ! printf '%s' "$out" | grep -q -- "$pat"; then
		echo "FAIL: $* -> status $got (want $want), output: $out"
		fail=1
	fi
}

S="--socket $D/sock"
printf 'socket = %s/s\nbogus-key = 1\n' "$D" > "$D/unknown.conf"
expect 2 "unknown.conf:2: unknown key 'bogus-key'" -- --config "$D/unknown.conf"
printf '# comment\nshare = sometimes\n' > "$D/badval.conf"
expect 2 "badval.conf:2: bad value 'sometimes' for 'share' (allowed: domain|none)" -- --config "$D/badval.conf"
printf 'store-limit = lots\n' > "$D/badsize.conf"
expect 2 "badsize.conf:1: .*store-limit" -- --config "$D/badsize.conf"
printf 'this is not a setting\n' > "$D/badline.conf"
expect 2 "badline.conf:1: expected 'key = value'" -- --config "$D/badline.conf"
printf 'config = /etc/x\n' > "$D/cli.conf"
expect 2 "cli.conf:1: 'config' can only be given on the command line" -- --config "$D/cli.conf"
: > "$D/empty.conf"
expect 2 "unknown flag '--no-such-flag'" -- --config "$D/empty.conf" $S --no-such-flag 1
expect 2 "bad value 'maybe' for 'physical'" -- --config "$D/empty.conf" $S --physical=maybe
expect 2 "segment-size" -- --config "$D/empty.conf" $S --segment-size 100000
expect 2 "$D/missing.conf: cannot open config file" -- --config "$D/missing.conf"
expect 0 "--store-limit" -- --help
expect 0 "default: 64M" -- --help
expect 1 "no pool running at $D/nothing" -- stat --socket "$D/nothing"

# physical = off: the daemon runs but refuses HELLO with a message naming the key.
"$BIN" --config "$D/empty.conf" --socket "$D/p.sock" --physical off 2>"$D/p.log" &
pid=$!
for i in $(seq 100); do [ -S "$D/p.sock" ] && break; sleep 0.05; done
"$BIN" stat --socket "$D/p.sock" >/dev/null || { echo "FAIL: pool with physical=off not up"; fail=1; }
kill $pid; wait $pid || { echo "FAIL: pool did not exit 0 on SIGTERM"; fail=1; }
[ -e "$D/p.sock" ] && { echo "FAIL: socket left behind"; fail=1; }

# vm-max-map-count raises the sysctl (root only) and never lowers it; restored afterwards.
if [ "$(id -u)" = 0 ] && [ -w /proc/sys/vm/max_map_count ]; then
	old=$(cat /proc/sys/vm/max_map_count)
	trap 'echo "$old" > /proc/sys/vm/max_map_count' EXIT
	for want in $((old + 1000)) $((old - 1000)); do
		"$BIN" --config "$D/empty.conf" --socket "$D/m.sock" --vm-max-map-count $want 2>"$D/m.log" &
		pid=$!
		for i in $(seq 100); do [ -S "$D/m.sock" ] && break; sleep 0.05; done
		kill $pid; wait $pid
		now=$(cat /proc/sys/vm/max_map_count)
		[ $want -gt $old ] && [ "$now" != $want ] && { echo "FAIL: vm.max_map_count is $now, not $want"; fail=1; }
		[ $want -lt $old ] && [ "$now" != $((old + 1000)) ] && { echo "FAIL: vm.max_map_count was lowered to $now"; fail=1; }
	done
	echo "$old" > /proc/sys/vm/max_map_count
else
	echo "vm-max-map-count: not root, sysctl part skipped"
fi

[ $fail = 0 ] && echo PASS
exit $fail
