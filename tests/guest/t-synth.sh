#!/bin/bash
# t-synth.sh: the agent's digest128 equals `pvisor ctl digest` of the host-driven synthetic guest.
. "$(dirname "$0")/lib.sh"
t_setup
[ -x "$PVISOR" ] || t_skip "no pvisor binary at $PVISOR"
SOCK=$T_TMP/vm.sock
ctl() { "$PVISOR" ctl --api-sock "$SOCK" "$@"; }

# 16 MiB (4096 pages) of unique-random, seed 7, instance 3, written by two vCPU threads.
"$PVISOR" run --guest synthetic --dedup off --mem 32M --data-size 16M --vcpus 2 \
	--workload unique-random --seed 7 --instance 3 --api-sock "$SOCK" >"$T_TMP/vm.log" 2>&1 &
T_PIDS+=($!)
ctl wait-ready --timeout 60 >/dev/null || { cat "$T_TMP/vm.log"; t_fail "synthetic guest never became ready"; }
S=$(ctl digest 0 4096 | jf digest)
args="pvg.workload=unique-random pvg.size=16M pvg.seed=7 pvg.instance=3"
H=$("$AGENT" --host-digest --digest128 --cmdline "$args")
A=$("$AGENT" --cmdline "$args" </dev/null | pvg ready | jf digest128)
[[ "$S" =~ ^[0-9a-f]{32}$ ]] || t_bad "pvisor ctl digest gave '$S'"
[ "$S" = "$H" ] && t_ok "pvisor ctl digest $S = pvisor-guest --host-digest --digest128" ||
	t_bad "synthetic guest $S, --host-digest --digest128 $H"
[ "$S" = "$A" ] && t_ok "the agent's ready digest128 is the same" || t_bad "agent digest128 $A, synthetic $S"

# After the same `write`, both still agree: the synthetic guest is told to fill what `write 11` writes.
ctl fill 0 4096 unique-random 11 3 >/dev/null || t_bad "ctl fill failed"
S=$(ctl digest 0 4096 | jf digest)
H=$("$AGENT" --host-digest --digest128 --cmdline "$args" --write-seed 11)
[ "$S" = "$H" ] && t_ok "after write 11: $S on both" || t_bad "after write 11: synthetic $S, agent $H"
ctl quit >/dev/null 2>&1
t_pass
