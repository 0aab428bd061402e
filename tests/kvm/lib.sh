# lib.sh: helpers for the KVM tests that nested.sh runs inside the outer guest (busybox sh).
K=/images/vmlinuz
I=/images/initrd.img
POOL_SOCK=/run/pvisor-pool.sock
fails=0

say() { echo "[$T] $*"; }
fail() { echo "[$T] FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "[$T] ok: $*"; }
check() { # check DESCRIPTION COMMAND...: ok if the command succeeds
	local d=$1; shift
	if "$@"; then ok "$d"; else fail "$d"; fi
}
finish() {
	killall -9 pvisor pvisor-pool 2>/dev/null
	[ "$fails" = 0 ] && { say "PASS"; exit 0; }
	say "$fails check(s) failed"; exit 1
}
uptime_s() { cut -d' ' -f1 /proc/uptime; }
# deadline SECONDS / before DEADLINE: waits count the clock, not loop turns (under TCG a
# turn of grep and sleep can take far longer than its 0.1 s)
deadline() { echo $(($(cut -d. -f1 /proc/uptime) + $1)); }
before() { [ "$(cut -d. -f1 /proc/uptime)" -lt "$1" ]; }

start_pool() {
	pvisor-pool --socket "$POOL_SOCK" --log-level warn >/tmp/pool.log 2>&1 &
	POOL_PID=$!
	local i=0
	while [ ! -S "$POOL_SOCK" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
	[ -S "$POOL_SOCK" ] || { cat /tmp/pool.log; fail "pool did not start"; finish; }
}

# start_vm NAME ARGS...: a KVM guest in the background, console in /tmp/NAME.out, log in
# /tmp/NAME.err, commands written to fd of /tmp/NAME.in (see vm_cmd).
start_vm() {
	local n=$1; shift
	rm -f /tmp/$n.in; mkfifo /tmp/$n.in
	pvisor run --guest kvm --kernel $K --initrd $I --name $n --api-sock /run/$n.api "$@" \
		</tmp/$n.in >/tmp/$n.out 2>/tmp/$n.err &
	eval "VM_$n=$!"
	# keep the console's input open for the VM's whole life
	eval "exec $(vm_fd $n)>/tmp/$n.in"
}
vm_fd() { case $1 in vm0) echo 5;; vm1) echo 6;; vm2) echo 7;; *) echo 8;; esac; }
vm_cmd() { echo "$2" >&$(vm_fd $1); }
vm_pid() { eval "echo \$VM_$1"; }

# wait_line FILE PATTERN SECONDS: wait until FILE has a line matching PATTERN; prints it.
wait_line() {
	local end=$(deadline $3)
	while before $end; do
		if grep -q -- "$2" "$1" 2>/dev/null; then grep -- "$2" "$1" | tail -1; return 0; fi
		sleep 0.1
	done
	return 1
}
# pvg_event NAME EVENT SECONDS [NTH]: the NTH (default last) `PVG {...}` line of an event.
pvg_event() {
	local end=$(deadline $3) nth=${4:-1}
	while before $end; do
		if [ "$(grep -c "^PVG .*\"event\":\"$2\"" /tmp/$1.out 2>/dev/null)" -ge "$nth" ]; then
			grep "^PVG .*\"event\":\"$2\"" /tmp/$1.out | sed -n "${nth}p"; return 0
		fi
		sleep 0.1
	done
	return 1
}
# json_field LINE KEY: a number or string member of a flat JSON line.
json_field() {
	echo "$1" | tr -d '\n' | grep -o "\"$2\": *\"\{0,1\}[^\",} ]*" | head -1 |
		sed "s/^\"$2\": *\"\{0,1\}//"
}
# wait_exit NAME SECONDS: wait for the VM's process; sets RC (124 on timeout, then killed).
wait_exit() {
	local pid=$(vm_pid $1) end=$(deadline $2)
	while kill -0 $pid 2>/dev/null && before $end; do sleep 0.1; done
	if kill -0 $pid 2>/dev/null; then kill -9 $pid; wait $pid; RC=124; return; fi
	wait $pid; RC=$?
}
# wait_ready NAME SECONDS: pvg_event NAME ready, with a progress line every 20 s (the
# console's last line and the plane's counters) so a slow boot shows where it is.
wait_ready() {
	local waited=0 step
	while [ $waited -lt $2 ]; do
		step=20; [ $((waited + step)) -gt $2 ] && step=$(($2 - waited))
		pvg_event $1 ready $step && return 0
		waited=$((waited + step))
		local st=$(pvisor ctl --api-sock /run/$1.api stats 2>/dev/null)
		say >&2 "$1 after ${waited} s: console '$(tail -n 1 /tmp/$1.out | tr -d '\r' | cut -c1-100)'"
		say >&2 "$1 plane: wp_faults $(json_field "$st" wp_faults) merges $(json_field "$st" merges) pages_shared $(json_field "$st" pages_shared) pinned $(json_field "$st" pages_pinned) zero $(json_field "$st" pages_zero)"
	done
	return 1
}
dump_vm() { say "--- $1 console (tail)"; tail -n ${2:-25} /tmp/$1.out; say "--- $1 log"; tail -n 15 /tmp/$1.err; }
