#!/usr/bin/env bash
# t-vmm-kill.sh: issue test 5 - kill -9 of a VMM: the pool drops its references once the process
# is gone and no slot leaks; when every VMM is gone the store is empty.
. "$(dirname "$0")/lib.sh"
t_setup
t_cgroup
t_pool_start
for i in 0 1 2; do
	t_vm_start vm$i --mem 64M --workload shared-random --data-size 16M --seed 31 --instance $i
done
t_wait_ready vm0 vm1 vm2
merged() { [ "$(t_pool_stat | t_json 'j["pages_sharing"]')" -ge $((2 * 4096 * 9 / 10)) ]; }
T_WAIT=30 t_until merged || { t_pool_stat; t_fail "pages never merged"; }
sharing=$(t_pool_stat | t_json 'j["pages_sharing"]')
shared=$(t_pool_stat | t_json 'j["pages_shared"]')
t_log "before: pages_shared $shared pages_sharing $sharing"

kill -9 "$T_VM_PID_vm0"
dropped() { [ "$(t_pool_stat | t_json 'j["pages_sharing"]')" -le $((sharing - 4096 * 9 / 10)) ]; }
T_WAIT=10 t_until dropped || { t_pool_stat; t_fail "vm0's references survived its death"; }
t_pool_stat | t_json '[c["pid"] for c in j["clients"]]' | grep -q "$T_VM_PID_vm0" &&
	t_fail "the dead client is still listed"
t_ctl vm1 verify 0 4096 shared-random 31 >/dev/null || t_fail "vm1's bytes changed when vm0 died"

kill -9 "$T_VM_PID_vm1" "$T_VM_PID_vm2"
empty() { [ "$(t_pool_stat | t_json 'j["pages_shared"] + j["candidates"]')" = 0 ]; }
T_WAIT=10 t_until empty || { t_pool_stat; t_fail "slots or candidates leaked after every client died"; }
t_pass
