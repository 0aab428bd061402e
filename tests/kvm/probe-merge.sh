# probe-merge.sh: not a test: two guests booting together under plane settings, with KVM tracing.
#
# Usage: tests/kvm/nested.sh [--npt 0|1] probe-merge.sh STEP...   (steps run in order)
#   trace     turn on KVM tracepoints in the outer guest; after a triple fault the
#             crashed vCPU's last events are printed
#   base      two guests, --dedup physical       off      the same, --dedup off
#   nomerge   physical, no remaps (PVISOR_TEST_NO_MERGE=1)
#   nozero    physical, no zero-page discards (PVISOR_TEST_NO_ZERO=1)
#   hashonly  physical, neither
# Each run waits up to 100 s for both guests' ready line and prints the planes' counters.
# Written to chase the emulated-NPT crash (see t-share.sh); runs seen so far:
#   npt=1: base crashed 4 of 7 (early boot, #PF, once a reserved-bit #PF);
#   npt=0: base 0 of 3; npt=1 nomerge: 0 of 1.
T=probe
. /tests/lib.sh
args="pvg.workload=shared-random pvg.size=16M pvg.seed=7 pvg.hold=400"
run() { # NAME DEDUP ENV...: two guests, 100 s, report
	local name=$1 dd=$2; shift 2
	start_pool
	env "$@" pvisor run --guest kvm --kernel $K --initrd $I --name vm0 --api-sock /run/vm0.api --mem 128M --pool $POOL_SOCK --dedup $dd --cmdline "$args pvg.instance=0" </dev/null >/tmp/vm0.out 2>/tmp/vm0.err &
	p0=$!
	env "$@" pvisor run --guest kvm --kernel $K --initrd $I --name vm1 --api-sock /run/vm1.api --mem 128M --pool $POOL_SOCK --dedup $dd --cmdline "$args pvg.instance=1" </dev/null >/tmp/vm1.out 2>/tmp/vm1.err &
	p1=$!
	local end=$(deadline 100) t0=$(cut -d. -f1 /proc/uptime)
	while before $end; do
		r0=$(grep -c '"event":"ready"' /tmp/vm0.out); r1=$(grep -c '"event":"ready"' /tmp/vm1.out)
		[ "$r0" -ge 1 ] && [ "$r1" -ge 1 ] && break
		kill -0 $p0 2>/dev/null || break
		kill -0 $p1 2>/dev/null || break
		sleep 1
	done
	say "$name: after $(($(cut -d. -f1 /proc/uptime) - t0)) s: ready vm0=$r0 vm1=$r1"
	for v in vm0 vm1; do
		st=$(pvisor ctl --api-sock /run/$v.api stats 2>/dev/null)
		say "$name $v: merges $(json_field "$st" merges) shared $(json_field "$st" pages_shared) pinned $(json_field "$st" pages_pinned) zero $(json_field "$st" pages_zero) cow $(json_field "$st" cow_breaks)"
		grep -i "triple\|error\|exit:" /tmp/$v.err | head -3
		tail -n 2 /tmp/$v.out
	done
	killall -9 pvisor pvisor-pool 2>/dev/null; sleep 1; rm -f $POOL_SOCK
	if grep -q "triple" /tmp/vm0.err /tmp/vm1.err && [ -d /sys/kernel/tracing/events/kvm ]; then
		cd /sys/kernel/tracing; echo 0 > tracing_on
		local line=$(grep "reason KVM_EXIT_SHUTDOWN\|reason shutdown\|userspace_exit: reason 8\|SHUTDOWN" trace | head -1)
		say "shutdown line: $line"
		local tid=$(echo "$line" | sed 's/^ *[^ ]*-\([0-9]*\) .*/\1/')
		say "--- last events of thread $tid"
		grep -- "-$tid " trace | grep -B 70 "SHUTDOWN\|shutdown" | head -80
		grep -- "-$tid " trace | grep "kvm_inj_exception\|emulate" | tail -10
		echo > trace; echo 1 > tracing_on; cd /
	fi
}
trace_on() {
	mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null
	cd /sys/kernel/tracing || return
	echo 16384 > buffer_size_kb
	for e in kvm/kvm_inj_exception kvm/kvm_emulate_insn kvm/kvm_userspace_exit kvm/kvm_msr kvm/kvm_exit kvm/kvm_page_fault kvm/kvm_entry; do
		echo 1 > events/$e/enable || say "no event $e"
	done
	echo > trace; echo 1 > tracing_on; cd /
}
trace_dump() {
	cd /sys/kernel/tracing || return
	echo 0 > tracing_on
	say "--- trace: exceptions and emulation"
	grep -E "kvm_inj_exception|kvm_emulate_insn|kvm_userspace_exit" trace | tail -n 30
	say "--- trace: last 60 lines"
	tail -n 60 trace
	cd /
}
for c in "$@"; do
	case $c in
	base) run base physical X=1 ;;
	off) run off off X=1 ;;
	nomerge) run nomerge physical PVISOR_TEST_NO_MERGE=1 ;;
	nozero) run nozero physical PVISOR_TEST_NO_ZERO=1 ;;
	hashonly) run hashonly physical PVISOR_TEST_NO_MERGE=1 PVISOR_TEST_NO_ZERO=1 ;;
	trace) trace_on ;;
	dump) trace_dump ;;
	*) say "unknown step $c (see the header)"; exit 2 ;;
	esac
done
exit 0
