# t-share.sh: two KVM guests with the same data share pages through the pool (issue 4, tests 2 and 3).
# Usage (inside the outer guest): t-share.sh [write]
#   write: after merging, vm0 overwrites its data; its bytes change, vm1's do not.
#
# What made this hard, kept here because a regression would look the same:
# - KVM writes kvm-clock through its own mapping of the page: the plane keeps the
#   pages the vCPUs' paravirtual MSRs name out of dedup (pages_pinned, checked below);
# - a vCPU that sleeps in a userfaultfd fault inside KVM's nested-paging fault handler
#   crashed the outer guest's kernel (Debian 6.1 under QEMU's emulated SVM): the plane
#   tracks KVM guests' writes with KVM's dirty log instead (vmm/track.c).
# OPEN: with kvm_amd npt=1 (QEMU's emulated nested paging) one of the two guests
# triple-faults in early boot in most runs while pages merge: a #PF on an address
# mapped a moment before, once with a reserved-bit error (a page table holding wrong
# bytes). Not seen with npt=0 (shadow paging), with merging off, or with one guest.
# Whether TCG's nested paging or the plane is at fault is not known; the suite runs
# this test with `nested.sh --npt 0`.
T=kvm-share
[ "${1:-}" = write ] && T=kvm-private-write
. /tests/lib.sh
SIZE=32M PAGES=8192
args="pvg.workload=shared-random pvg.size=$SIZE pvg.seed=7 pvg.hold=400 pvg.exit=poweroff"
want=$(pvisor-guest --host-digest --workload shared-random --size $SIZE --seed 7 --instance 0)
say "expected digest $want"

start_pool
start_vm vm0 --mem 192M --pool $POOL_SOCK --dedup physical --cmdline "$args pvg.instance=0"
start_vm vm1 --mem 192M --pool $POOL_SOCK --dedup physical --cmdline "$args pvg.instance=1"
for v in vm0 vm1; do
	line=$(wait_ready $v 240) || { fail "$v never reported ready"; dump_vm $v 40; finish; }
	say "$v: $line"
	check "$v: readback digest right" [ "$(json_field "$line" digest)" = "$want" ]
	# a kernel message can split the console line: then ask again
	[ -n "$(json_field "$line" verify_mismatched)" ] || { vm_cmd $v verify; line=$(pvg_event $v verify 120); }
	check "$v: 0 pages mismatched" [ "$(json_field "$line" verify_mismatched)" = 0 ]
done

# Sharing: the pool holds one copy of each data page for both guests.
i=0 shared=0
while [ $i -lt 60 ]; do
	st=$(pvisor-pool stat --socket $POOL_SOCK --json)
	shared=$(json_field "$st" pages_shared)
	[ "${shared:-0}" -ge $((PAGES * 9 / 10)) ] && break
	sleep 1; i=$((i + 1))
done
say "pool: pages_shared $shared after ${i} s; $(json_field "$st" pages_sharing) sharing"
check "pool shares at least 90% of the $PAGES data pages" [ "${shared:-0}" -ge $((PAGES * 9 / 10)) ]
s0=$(pvisor ctl --api-sock /run/vm0.api stats)
say "vm0 stats: pages_shared $(json_field "$s0" pages_shared), merges $(json_field "$s0" merges)"
check "vm0's memory plane mapped shared pages" [ "$(json_field "$s0" pages_shared)" -gt 0 ]
check "vm0: the kvm-clock page is kept out of dedup (pinned $(json_field "$s0" pages_pinned))" \
	[ "$(json_field "$s0" pages_pinned)" -ge 1 ]

if [ "$T" = kvm-private-write ]; then
	# vm0 writes private bytes over every data page after the merge.
	want_w=$(pvisor-guest --host-digest --workload shared-random --size $SIZE --seed 7 --instance 0 --write-seed 99)
	vm_cmd vm0 "write 99"
	line=$(pvg_event vm0 write 120) || fail "vm0 did not answer write"
	say "vm0: $line"
	n=$(($(grep -c '"event":"verify"' /tmp/vm0.out) + 1))
	vm_cmd vm0 "verify"
	line=$(pvg_event vm0 verify 120 $n) ||
		fail "vm0 did not answer verify"
	say "vm0: $line"
	check "vm0: its own bytes changed (digest of seed 99)" [ "$(json_field "$line" digest)" = "$want_w" ]
	check "vm0: verify found 0 mismatches" [ "$(json_field "$line" verify_mismatched)" = 0 ]
	s0=$(pvisor ctl --api-sock /run/vm0.api stats)
	say "vm0 stats after write: cow_breaks $(json_field "$s0" cow_breaks), pages_shared $(json_field "$s0" pages_shared)"
	check "vm0: copy-on-write breaks counted" [ "$(json_field "$s0" cow_breaks)" -gt $((PAGES / 2)) ]
fi
n=$(($(grep -c '"event":"verify"' /tmp/vm1.out) + 1))
vm_cmd vm1 "verify"
line=$(pvg_event vm1 verify 120 $n) ||
	fail "vm1 did not answer verify"
say "vm1: $line"
check "vm1: its bytes are unchanged" [ "$(json_field "$line" digest)" = "$want" ]
check "vm1: verify found 0 mismatches" [ "$(json_field "$line" verify_mismatched)" = 0 ]

for v in vm0 vm1; do
	vm_cmd $v quit
	wait_exit $v 60
	check "$v: exit code 0 (got $RC)" [ "$RC" = 0 ]
done
[ "$fails" = 0 ] || { dump_vm vm0; dump_vm vm1; cat /tmp/pool.log; }
finish
