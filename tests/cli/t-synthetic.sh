#!/bin/bash
# t-synthetic.sh: a synthetic guest without dedup: start, wait-ready, the API commands, bad requests, quit.
. "$(dirname "$0")/lib.sh"
t_setup

SOCK=$T_TMP/vm.sock
LOG=$T_TMP/vm.log
ctl() { "$PVISOR" ctl --api-sock "$SOCK" "$@"; }
# ctl_ok CMD...: the reply must say ok:true (exit 0); prints the reply.
ctl_ok() { local r; r=$(ctl "$@") || { t_bad "ctl $*: exit $?: $r"; return 1; }; echo "$r"; }
# ctl_refused CMD...: the reply must say ok:false with an error (exit 1).
ctl_refused() {
	local r rc
	r=$(ctl "$@" 2>&1); rc=$?
	if [ "$rc" != 1 ] || ! grep -q '"ok":false,"error":' <<<"$r"; then
		t_bad "ctl $*: exit $rc, want 1 and an error reply: $r"
	else
		echo "  ok: refused: $r"
	fi
}

# 32 MiB guest, 16 MiB (4096 pages) of shared-random at start, two vCPU threads.
"$PVISOR" run --guest synthetic --dedup off --mem 32M --data-size 16M --vcpus 2 \
	--workload shared-random --seed 7 --name cli-vm --api-sock "$SOCK" >"$LOG" 2>&1 &
VM=$!
T_PIDS+=("$VM")

R=$(ctl wait-ready --timeout 30) || { cat "$LOG"; t_fail "guest never became ready"; }
[ "$(t_json 'j["ready"], j["workload"], j["data_pages"], j["name"], j["pid"]' <<<"$R")" = \
  "True shared-random 4096 cli-vm $VM" ] || t_bad "stats after wait-ready: $R"
grep -q "ready: 4096 pages of shared-random written and verified in" "$LOG" || t_bad "no ready line in log"
grep -q "benchmarks and tests of the memory plane" "$LOG" || t_bad "no synthetic-guest line in log"

# The start-up workload reads back; a wrong seed or instance does not.
ctl_ok verify 0 4096 shared-random 7 >/dev/null
R=$(ctl verify 0 4096 shared-random 8); [ $? = 1 ] || t_bad "verify with the wrong seed passed: $R"
[ "$(t_json 'j["mismatched"], j["first_bad"]' <<<"$R")" = "4096 0" ] || t_bad "wrong-seed verify: $R"
# The pages past the workload are untouched zeros.
ctl_ok verify 4096 4096 zeros 0 >/dev/null

# poke makes exactly the poked pages differ; fill repairs them.
D0=$(ctl_ok digest 0 4096 | t_json 'j["digest"]')
ctl_ok poke 100 3 4095 171 >/dev/null
R=$(ctl verify 0 4096 shared-random 7)
[ "$(t_json 'j["ok"], j["mismatched"], j["first_bad"]' <<<"$R")" = "False 3 100" ] || t_bad "verify after poke: $R"
D1=$(ctl_ok digest 0 4096 | t_json 'j["digest"]')
[ "$D0" != "$D1" ] || t_bad "digest unchanged by poke"
ctl_ok fill 100 3 shared-random 7 >/dev/null
ctl_ok verify 0 4096 shared-random 7 >/dev/null
D2=$(ctl_ok digest 0 4096 | t_json 'j["digest"]')
[ "$D0" = "$D2" ] || t_bad "digest after repair $D2, before poke $D0"
[[ "$D0" =~ ^[0-9a-f]{32}$ ]] || t_bad "digest '$D0' is not 32 hex digits"

# fill with instances: unique-random differs per instance; repeated pages hash alike.
ctl_ok fill 4096 64 unique-random 3 5 >/dev/null
ctl_ok verify 4096 64 unique-random 3 5 >/dev/null
R=$(ctl verify 4096 64 unique-random 3 6); [ $? = 1 ] || t_bad "other instance verified: $R"
ctl_ok fill 8000 32 repeated 9 >/dev/null
A=$(ctl_ok digest 8000 16 | t_json 'j["digest"]')
B=$(ctl_ok digest 8016 16 | t_json 'j["digest"]')
[ "$A" = "$B" ] || t_bad "repeated pages hash differently: $A $B"
ctl_ok fill 8191 1 patterns 0 >/dev/null   # the last page of guest RAM
ctl_ok poke 8191 1 0 0 >/dev/null

# Bad requests are refused and the VM keeps running.
ctl_refused fill 0 0 zeros 1
ctl_refused fill 8192 1 zeros 1
ctl_refused fill 8191 2 zeros 1
ctl_refused verify 0 18446744073709551615 zeros 1
ctl_refused verify 0 99999999999999999999999 zeros 1
ctl_refused digest 18446744073709551615 2
ctl_refused digest -1 2
ctl_refused digest 0x 1
ctl_refused poke 0 1 4096 1
ctl_refused poke 0 1 0 256
ctl_refused poke 0 1 0 -1
ctl_refused fill 0 1 nonsense 1
ctl_refused fill 0 1 zeros 1x
ctl_refused fill 0 1 zeros
ctl_refused fill 0 1 zeros 1 2 3
ctl_refused stats now
ctl_refused launch
ctl_refused quit please
ctl_refused "$(printf 'a%.0s' $(seq 300))"
# Raw bytes straight to the socket: garbage, a line longer than the limit, a half line.
python3 - "$SOCK" <<'PY' || t_bad "raw garbage: the VM answered wrongly"
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(10)
s.sendall(b"\n\x00\xff\xfe garbage\nstats\n" + b"y" * 4000)
buf = b""
while buf.count(b"\n") < 4:
    d = s.recv(65536)
    if not d: break
    buf += d
lines = [json.loads(l) for l in buf.split(b"\n") if l]
assert [l["ok"] for l in lines] == [False, False, True, False], lines
s2 = socket.socket(socket.AF_UNIX); s2.connect(sys.argv[1]); s2.sendall(b"sta"); s2.close()
PY
kill -0 "$VM" 2>/dev/null || t_fail "the VM died on bad requests: $(cat "$LOG")"
ctl_ok verify 0 4096 shared-random 7 >/dev/null

R=$(ctl_ok quit) && echo "  ok: quit: $R"
wait "$VM"; RC=$?
T_PIDS=()
[ "$RC" = 0 ] || t_bad "VM exit status $RC after quit"
grep -q "exit: pages 8192: private" "$LOG" || t_bad "no exit figures in log: $(cat "$LOG")"
grep -q "dedup CPU" "$LOG" || t_bad "no dedup CPU in exit log"
[ ! -e "$SOCK" ] || t_bad "API socket $SOCK left behind"

t_pass
