#!/usr/bin/env bash
# t-private-write.sh: issue test 2 - after merging, one VM writes its shared pages: its new bytes
# read back, the other VMs' bytes and the pool's store stay unchanged, and its references drop.
. "$(dirname "$0")/lib.sh"
t_setup
t_cgroup
t_pool_start
for i in 0 1 2; do
	t_vm_start vm$i --mem 64M --workload shared-random --data-size 32M --seed 5 --instance $i
done
t_wait_ready vm0 vm1 vm2
merged() { [ "$(t_ctl vm0 stats | t_json 'j["pages_shared"]')" -ge 8000 ]; }
T_WAIT=30 t_until merged || { t_ctl vm0 stats; t_fail "vm0 never shared its pages"; }
before=$(t_pool_stat | t_json 'j["pages_sharing"]')

# vm0 overwrites half its data with its own bytes, and pokes one byte into the rest.
t_ctl vm0 fill 0 2048 unique-random 99 0 >/dev/null || t_fail "fill failed"
t_ctl vm0 poke 2048 2048 100 165 >/dev/null || t_fail "poke failed"
t_ctl vm0 verify 0 2048 unique-random 99 0 >/dev/null || t_fail "vm0 lost its private write"
# The poked pages: every byte but the poked one is the shared content.
t_ctl vm0 verify 4096 4096 shared-random 5 >/dev/null || t_fail "vm0's untouched pages changed"
d0=$(t_ctl vm0 digest 2048 2048 | t_json 'j["digest"]')
d1=$(t_ctl vm1 digest 2048 2048 | t_json 'j["digest"]')
[ "$d0" != "$d1" ] || t_fail "vm0's poked pages read back like vm1's: the poke was lost"
for vm in vm1 vm2; do
	t_ctl $vm verify 0 8192 shared-random 5 >/dev/null || t_fail "$vm's bytes changed after vm0 wrote"
done
read -r checked bad < <(t_pool_stat --audit | t_json 'j["audit_checked"], j["audit_mismatches"]' | tr -d '(),')
[ "$checked" -ge 8000 ] || t_fail "the audit checked only $checked slots"
[ "$bad" = 0 ] || t_fail "pool store changed: $bad slots no longer match their hash"
dropped() { [ "$(t_pool_stat | t_json 'j["pages_sharing"]')" -le $((before - 3500)) ]; }
T_WAIT=20 t_until dropped || t_fail "vm0's references were not dropped after its writes (pages_sharing was $before)"
t_pass
