#!/usr/bin/env bash
# t-pool-kill.sh: issue test 4 - kill -9 of the pool in the middle of merging: every VM keeps running
# and reads back its exact bytes; a restarted pool serves them again.
. "$(dirname "$0")/lib.sh"
t_setup
t_cgroup
t_pool_start
for i in 0 1 2 3; do
	t_vm_start vm$i --mem 128M --workload shared-random --data-size 64M --seed 21 --instance $i
done
# Kill as soon as merging has begun, while most pages are still in flight.
begun() { [ "$(t_pool_stat | t_json 'j["pages_sharing"]' 2>/dev/null || echo 0)" -gt 0 ]; }
T_WAIT=60 t_until begun || t_fail "merging never began"
kill -9 "$T_POOL_PID"
wait "$T_POOL_PID" 2>/dev/null
t_log "pool killed at the start of merging"
t_wait_ready vm0 vm1 vm2 vm3
for i in 0 1 2 3; do
	kill -0 "$(eval echo \$T_VM_PID_vm$i)" 2>/dev/null || t_fail "vm$i died with the pool"
	t_ctl vm$i verify 0 16384 shared-random 21 >/dev/null || t_fail "vm$i lost bytes when the pool died"
done
rm -f "$T_TMP/pool.sock"
t_pool_start
# New content after the restart must be shared by the new pool.
for i in 0 1 2 3; do t_ctl vm$i fill 20000 4096 shared-random 22 >/dev/null || t_fail "fill vm$i"; done
reconnected() { [ "$(t_pool_stat | t_json 'j["pages_sharing"]')" -ge 3000 ]; }
T_WAIT=40 t_until reconnected || { t_pool_stat; t_fail "the restarted pool shares nothing"; }
for i in 0 1 2 3; do
	t_ctl vm$i verify 0 16384 shared-random 21 >/dev/null || t_fail "vm$i old bytes wrong after restart"
	t_ctl vm$i verify 20000 4096 shared-random 22 >/dev/null || t_fail "vm$i new bytes wrong after restart"
done
t_pass
