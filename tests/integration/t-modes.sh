#!/usr/bin/env bash
# t-modes.sh: --dedup ksm marks guest RAM mergeable and says when KSM is off; --dedup off does
# nothing; --dedup physical never hashes an unchanged page twice.
. "$(dirname "$0")/lib.sh"
t_setup

# VmFlags of the 64 MiB guest RAM mapping of process $1 (the one VMA of exactly that size).
ram_flags() {
	local range big=0 lo hi
	while read -r range rest; do
		if [[ $range =~ ^([0-9a-f]+)-([0-9a-f]+)$ ]]; then
			lo=$((16#${BASH_REMATCH[1]})) hi=$((16#${BASH_REMATCH[2]}))
			big=$(( hi - lo == 64 * 1048576 ))
		elif [ "$big" = 1 ] && [ "$range" = VmFlags: ]; then
			echo "$rest"
			return
		fi
	done <"/proc/$1/smaps"
}

ksm_run=$(cat /sys/kernel/mm/ksm/run 2>/dev/null || echo absent)
t_vm_start ksm --dedup ksm --mem 64M --workload repeated --data-size 16M
t_vm_start off --dedup off --mem 64M --workload repeated --data-size 16M
t_wait_ready ksm off
ram_flags "$T_VM_PID_ksm" | grep -qw mg || t_fail "--dedup ksm: guest RAM is not MADV_MERGEABLE ($(ram_flags "$T_VM_PID_ksm"))"
ram_flags "$T_VM_PID_off" | grep -qw mg && t_fail "--dedup off: guest RAM is mergeable"
if [ "$ksm_run" = 0 ]; then
	n=$(grep -c "/sys/kernel/mm/ksm/run" "$T_TMP/ksm.log")
	[ "$n" = 1 ] || t_fail "--dedup ksm with KSM off: want one warning naming /sys/kernel/mm/ksm/run, got $n"
fi
grep -qi pool "$T_TMP/off.log" && t_fail "--dedup off talked about a pool: $(grep -i pool "$T_TMP/off.log")"

# physical: once merged, an idle guest is never hashed again.
t_pool_start
t_vm_start p0 --mem 64M --workload unique-random --data-size 16M --instance 0
t_vm_start p1 --mem 64M --workload shared-random --data-size 16M
t_wait_ready p0 p1
settled() { [ "$(t_ctl p1 stats | t_json 'j["pages_hashed"] >= 4096')" = True ] &&
	[ "$(t_ctl p0 stats | t_json 'j["pages_hashed"] >= 4096')" = True ]; }
T_WAIT=30 t_until settled || t_fail "pages were not hashed"
sleep 1
h0=$(t_ctl p0 stats | t_json 'j["pages_hashed"]')
c0=$(t_ctl p0 stats | t_json 'j["dedup_cpu_ns"] // 1000000')
sleep 4
h1=$(t_ctl p0 stats | t_json 'j["pages_hashed"]')
c1=$(t_ctl p0 stats | t_json 'j["dedup_cpu_ns"] // 1000000')
t_log "unique-random guest idle for 4 s: pages hashed $h0 -> $h1, dedup CPU $c0 -> $c1 ms"
[ "$h0" = "$h1" ] || t_fail "an idle guest was hashed again: $h0 -> $h1 pages"
# A write makes exactly the written pages hashable again.
t_ctl p0 poke 0 8 0 1 >/dev/null || t_fail "poke"
again() { [ "$(t_ctl p0 stats | t_json 'j["pages_hashed"]')" -ge $((h1 + 8)) ]; }
T_WAIT=10 t_until again || t_fail "written pages were not hashed again"
t_pass
