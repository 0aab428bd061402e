# t-bootcost.sh: time to the guest's init and VMM memory overhead, pvisor against QEMU -M microvm, same kernel.
# Run by nested.sh --qemu-inside; reports numbers, asserts only that every boot reached init.
# Each VMM is stopped (SIGTERM) once its guest's init has spoken: only the way there is timed.
T=kvm-bootcost
. /tests/lib.sh
TINY=/images/tiny-initrd.img
N=${1:-2}
command -v qemu-system-x86_64 >/dev/null || { say "SKIP: no qemu inside (nested.sh --qemu-inside)"; exit 77; }
[ -f $TINY ] || { fail "no $TINY (scripts/guest-image.sh --tiny)"; finish; }
i=0
while [ $i -lt $N ]; do
	kvm-bootmeter --marker PVG-INIT --guest-mem 256 --timeout 120 --name pvisor --stop -- \
		pvisor run --guest kvm --kernel $K --initrd $TINY --mem 256M --vcpus 1 --dedup off \
		</dev/null >/tmp/bm.out 2>/tmp/bm.err
	check "pvisor run $i reached init" grep -q '^BOOTMETER.*"init_s":[0-9]' /tmp/bm.out
	grep '^BOOTMETER' /tmp/bm.out | tee -a /tmp/bm.all
	kvm-bootmeter --marker PVG-INIT --guest-mem 256 --timeout 120 --name qemu-microvm --stop -- \
		qemu-system-x86_64 -M microvm,x-option-roms=off,rtc=off -accel kvm -cpu host -m 256M \
		-smp 1 -nodefaults -no-user-config -nographic -no-reboot -serial stdio -monitor none \
		-kernel $K -initrd $TINY -append "console=ttyS0 reboot=t panic=-1" \
		</dev/null >/tmp/bm.out 2>/tmp/bm.err
	check "qemu run $i reached init" grep -q '^BOOTMETER.*"init_s":[0-9]' /tmp/bm.out
	grep '^BOOTMETER' /tmp/bm.out | tee -a /tmp/bm.all
	[ "$fails" = 0 ] || { tail -30 /tmp/bm.out; cat /tmp/bm.err; break; }
	i=$((i + 1))
done
# medians (N is small: sort and take the middle)
med() { grep "\"name\":\"$1\"" /tmp/bm.all | sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p" | sort -n |
	awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print 0 }'; }
pi=$(med pvisor init_s) qi=$(med qemu-microvm init_s)
po=$(med pvisor overhead_kib) qo=$(med qemu-microvm overhead_kib)
echo "BOOTCOST {\"runs\":$N,\"pvisor_init_s\":$pi,\"qemu_init_s\":$qi,\"pvisor_overhead_kib\":$po,\"qemu_overhead_kib\":$qo}"
awk -v pi=$pi -v qi=$qi -v po=$po -v qo=$qo 'BEGIN {
	printf "[kvm-bootcost] time to init: pvisor %.2f s, qemu microvm %.2f s (ratio %.2f)\n", pi, qi, qi ? pi / qi : 0
	printf "[kvm-bootcost] VMM overhead (RSS - guest RAM): pvisor %.1f MiB, qemu microvm %.1f MiB (ratio %.2f)\n", po / 1024, qo / 1024, qo ? po / qo : 0 }'
finish
