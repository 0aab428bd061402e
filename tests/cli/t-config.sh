#!/bin/bash
# t-config.sh: a config file sets `pvisor run` keys, flags win over it, SIGTERM stops the VM with status 0.
. "$(dirname "$0")/lib.sh"
t_setup

SOCK=$T_TMP/vm.sock
LOG=$T_TMP/vm.log
cat >"$T_TMP/vm.conf" <<CONF
# a synthetic guest for the CLI test
guest = synthetic
dedup = off
mem = 16M          # overridden below
name = from-file
workload = patterns
data-size = 4M
api-sock = $SOCK
CONF

"$PVISOR" run --config "$T_TMP/vm.conf" --mem 24M --name from-flag >"$LOG" 2>&1 &
VM=$!
T_PIDS+=("$VM")
R=$("$PVISOR" ctl --api-sock "$SOCK" wait-ready --timeout 30) || { cat "$LOG"; t_fail "never ready"; }
GOT=$(t_json 'j["name"], j["pages"], j["workload"], j["data_pages"], j["dedup"]' <<<"$R")
[ "$GOT" = "from-flag 6144 patterns 1024 off" ] || t_bad "settings: got '$GOT' from $R"
"$PVISOR" ctl --api-sock "$SOCK" verify 0 1024 patterns 0 >/dev/null || t_bad "patterns do not verify"

# A second VM on the same live socket is refused, and leaves the socket alone.
"$PVISOR" run --config "$T_TMP/vm.conf" --name second >"$T_TMP/second.log" 2>&1
RC=$?
[ "$RC" = 1 ] && grep -q "another process is listening" "$T_TMP/second.log" ||
	t_bad "second VM on a live socket: exit $RC: $(cat "$T_TMP/second.log")"
"$PVISOR" ctl --api-sock "$SOCK" stats >/dev/null || t_bad "socket broken by the second VM"

kill -TERM "$VM"
wait "$VM"; RC=$?
T_PIDS=()
[ "$RC" = 0 ] || t_bad "exit status $RC after SIGTERM"
grep -q "Terminated: stopping" "$LOG" || t_bad "SIGTERM not logged"
grep -q "exit: pages 6144" "$LOG" || t_bad "no exit figures: $(cat "$LOG")"

# A stale socket file (its VM was killed) is replaced on the next start.
"$PVISOR" run --config "$T_TMP/vm.conf" >"$LOG" 2>&1 &
VM=$!
T_PIDS+=("$VM")
"$PVISOR" ctl --api-sock "$SOCK" wait-ready --timeout 30 >/dev/null || t_fail "third VM never ready"
kill -9 "$VM"; wait "$VM" 2>/dev/null
[ -S "$SOCK" ] || t_bad "expected a stale socket after kill -9"
"$PVISOR" run --config "$T_TMP/vm.conf" >"$LOG" 2>&1 &
VM=$!
T_PIDS+=("$VM")
"$PVISOR" ctl --api-sock "$SOCK" wait-ready --timeout 30 >/dev/null || t_bad "no start over a stale socket: $(cat "$LOG")"
"$PVISOR" ctl --api-sock "$SOCK" quit >/dev/null || t_bad "quit refused"
wait "$VM" || t_bad "exit status $? after quit"
T_PIDS=()

t_pass
