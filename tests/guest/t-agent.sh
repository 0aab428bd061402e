#!/bin/bash
# t-agent.sh: pvisor-guest in host mode: start-up fill and digests, console commands, hold, load, bad parameters.
. "$(dirname "$0")/lib.sh"
t_setup
OUT=$T_TMP/out

# --- every workload: written, verified, and its digest is the one --host-digest computes
declare -A DIG
for w in repeated shared-random unique-random zeros patterns; do
	args="pvg.workload=$w pvg.size=2M pvg.seed=5 pvg.instance=3"
	"$AGENT" --cmdline "console=ttyS0 root=/dev/vda $args quiet" </dev/null >"$OUT"; rc=$?
	R=$(pvg ready <"$OUT")
	[ "$rc" = 0 ] || t_bad "$w: exit $rc: $(cat "$OUT")"
	[ "$(jf ok <<<"$R") $(jf pages <<<"$R") $(jf verify_mismatched <<<"$R") $(jf workload <<<"$R")" = \
	  "true 512 0 $w" ] || t_bad "$w: ready line: $R"
	D=$(jf digest <<<"$R")
	H=$("$AGENT" --host-digest --cmdline "$args")
	H128=$("$AGENT" --host-digest --digest128 --cmdline "$args")
	[[ "$D" =~ ^[0-9a-f]{16}$ ]] || t_bad "$w: digest '$D' is not 16 hex digits"
	[ "$D" = "$H" ] && t_ok "$w: digest $D = --host-digest" || t_bad "$w: digest $D, --host-digest $H"
	[ "$(jf digest128 <<<"$R")" = "$H128" ] || t_bad "$w: digest128 $(jf digest128 <<<"$R"), host $H128"
	[ "$(grep -o '"event":"[a-z]*"' "$OUT" | tr '\n' ' ')" = \
	  '"event":"start" "event":"ready" "event":"done" ' ] || t_bad "$w: event order: $(cat "$OUT")"
	[ "$(pvg done <"$OUT" | jf reason)" = no-hold ] || t_bad "$w: done line: $(pvg done <"$OUT")"
	DIG[$w]=$D
done
[ "$(printf '%s\n' "${DIG[@]}" | sort -u | wc -l)" = 5 ] && t_ok "five workloads, five digests" ||
	t_bad "workload digests collide: ${DIG[*]}"
# shared-random is the same in every instance, unique-random is not
a=$("$AGENT" --host-digest --workload shared-random --size 1M --instance 0)
b=$("$AGENT" --host-digest --workload shared-random --size 1M --instance 1)
[ "$a" = "$b" ] || t_bad "shared-random differs between instances: $a $b"
a=$("$AGENT" --host-digest --workload unique-random --size 1M --instance 0)
b=$("$AGENT" --host-digest --workload unique-random --size 1M --instance 1)
[ "$a" != "$b" ] || t_bad "unique-random is the same in two instances: $a"
a=$("$AGENT" --host-digest --workload shared-random --size 1M --seed 1)
b=$("$AGENT" --host-digest --workload shared-random --size 1M --seed 2)
[ "$a" != "$b" ] || t_bad "shared-random ignores the seed: $a"

# --- where parameters come from: $PVG_CMDLINE, then flags (a flag wins)
PVG_CMDLINE="pvg.workload=patterns pvg.size=64K pvg.seed=4" "$AGENT" --seed 9 </dev/null >"$OUT"
R=$(pvg start <"$OUT")
[ "$(jf workload <<<"$R") $(jf pages <<<"$R") $(jf seed <<<"$R")" = "patterns 16 9" ] &&
	t_ok "PVG_CMDLINE read, --seed wins" || t_bad "PVG_CMDLINE + --seed: $R"

# --- console commands: write, verify, poke, digest, load, sleep, unknown, quit
F=$T_TMP/file
head -c 10000 /dev/urandom >"$F"
CMDS="digest
write 9
verify
poke 5
verify
write 9
verify
load $F
frobnicate now
write
sleep 1
quit
digest"
args="pvg.workload=shared-random pvg.size=1M pvg.seed=2 pvg.instance=1 pvg.hold=30"
"$AGENT" --cmdline "$args" <<<"$CMDS" >"$OUT"; rc=$?
[ "$rc" = 0 ] || t_bad "commands: exit $rc"
D0=$(pvg ready <"$OUT" | jf digest)
[ "$(pvg digest <"$OUT" | jf digest)" = "$D0" ] || t_bad "digest command != ready digest: $(cat "$OUT")"
[ "$(grep -c '"event":"digest"' "$OUT")" = 1 ] || t_bad "a command after quit was answered"
W=$(pvg write <"$OUT" | jf digest)
HW=$("$AGENT" --host-digest --cmdline "$args" --write-seed 9)
[ "$W" = "$HW" ] && [ "$W" != "$D0" ] && t_ok "write 9: digest $W = --write-seed 9, not $D0" ||
	t_bad "write 9: digest $W, --write-seed 9 gives $HW, before $D0"
R=$(pvg verify 1 <"$OUT")
[ "$(jf ok <<<"$R") $(jf verify_mismatched <<<"$R") $(jf workload <<<"$R") $(jf seed <<<"$R") $(jf digest <<<"$R")" = \
  "true 0 unique-random 9 $HW" ] && t_ok "verify after write: 0 mismatched" || t_bad "verify after write: $R"
[ "$(pvg poke <"$OUT" | jf ok)" = true ] || t_bad "poke: $(pvg poke <"$OUT")"
R=$(pvg verify 2 <"$OUT")
[ "$(jf ok <<<"$R") $(jf verify_mismatched <<<"$R") $(jf first_bad <<<"$R")" = "false 1 5" ] &&
	t_ok "verify after poke 5: 1 mismatched, first_bad 5" || t_bad "verify after poke: $R"
[ "$(pvg verify 3 <"$OUT" | jf verify_mismatched)" = 0 ] || t_bad "verify after rewrite: $(pvg verify 3 <"$OUT")"
R=$(pvg load <"$OUT")
[ "$(jf ok <<<"$R") $(jf bytes <<<"$R") $(jf digest <<<"$R")" = \
  "true 10000 $("$AGENT" --file-digest "$F")" ] && t_ok "load: 10000 bytes, digest = --file-digest" ||
	t_bad "load: $R"
R=$(pvg error <"$OUT")
[ "$(jf command <<<"$R")" = frobnicate ] || t_bad "unknown command: $R"
[ "$(pvg write 3 <"$OUT" | jf ok)" = false ] || t_bad "write without a seed: $(pvg write 3 <"$OUT")"
[ "$(pvg sleep <"$OUT" | jf ok)" = true ] || t_bad "sleep: $(pvg sleep <"$OUT")"
R=$(pvg done <"$OUT")
[ "$(jf reason <<<"$R") $(jf commands <<<"$R") $(jf ok <<<"$R")" = "quit 12 true" ] ||
	t_bad "done after quit: $R"

# --- hold: ends when the time is up (stdin still open), or at EOF
t0=$(date +%s%N)
exec 3< <(exec sleep 5 2>/dev/null)   # stdin that stays open, with nothing to read
T_PIDS+=($!)
"$AGENT" --cmdline "pvg.workload=zeros pvg.size=4K pvg.hold=1" <&3 >"$OUT"
exec 3<&-
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$(pvg done <"$OUT" | jf reason)" = hold-expired ] && [ $ms -ge 900 ] && [ $ms -lt 4500 ] &&
	t_ok "pvg.hold=1 ended after $ms ms" || t_bad "hold=1: $ms ms, $(pvg done <"$OUT")"
"$AGENT" --cmdline "pvg.hold=30" </dev/null >"$OUT"
[ "$(pvg done <"$OUT" | jf reason)" = eof ] || t_bad "hold with stdin at EOF: $(pvg done <"$OUT")"

# --- pvg.load at start; one changed byte changes the digest; a missing file fails the start-up
"$AGENT" --cmdline "pvg.load=$F" </dev/null >"$OUT"; rc=$?
R=$(pvg load <"$OUT")
[ "$rc $(jf bytes <<<"$R") $(jf digest <<<"$R")" = "0 10000 $("$AGENT" --file-digest "$F")" ] ||
	t_bad "pvg.load: exit $rc, $R"
cp "$F" "$F.2"
printf '\x55' | dd of="$F.2" bs=1 seek=4321 conv=notrunc status=none
cmp -s "$F" "$F.2" && printf '\xaa' | dd of="$F.2" bs=1 seek=4321 conv=notrunc status=none
[ "$("$AGENT" --file-digest "$F")" != "$("$AGENT" --file-digest "$F.2")" ] &&
	t_ok "one changed byte changes the file digest" || t_bad "file digest blind to a changed byte"
"$AGENT" --cmdline "pvg.load=$T_TMP/missing pvg.workload=zeros pvg.size=4K" </dev/null >"$OUT"; rc=$?
[ "$rc $(pvg load <"$OUT" | jf ok) $(pvg done <"$OUT" | jf ok)" = "1 false false" ] &&
	t_ok "missing pvg.load file: exit 1" || t_bad "missing pvg.load: exit $rc, $(cat "$OUT")"

# --- bad parameters: one PVG error line naming the problem, exit 2
bad() { # bad 'regex' ARGS...
	local pat=$1 rc; shift
	"$AGENT" "$@" </dev/null >"$OUT" 2>&1; rc=$?
	if [ "$rc" = 2 ] && [ "$(wc -l <"$OUT")" = 1 ] && grep -q '^PVG {"event":"error","ok":false' "$OUT" &&
	   grep -qE -- "$pat" "$OUT"; then t_ok "refused: $*"
	else t_bad "$*: exit $rc, want 2 and /$pat/: $(cat "$OUT")"; fi
}
bad 'pvg.workload: bad value .bogus.*shared-random' --cmdline "pvg.workload=bogus"
bad 'pvg.size: bad value .12Q' --cmdline "pvg.size=12Q"
bad 'pvg.size: bad value .1000.' --cmdline "pvg.size=1000"
bad 'pvg.size: bad value .0.' --cmdline "pvg.size=0"
bad 'pvg.size: bad value .2T.' --cmdline "pvg.size=2T"
bad 'pvg.seed: bad value .-1.' --cmdline "pvg.seed=-1"
bad 'pvg.instance: bad value .1x.' --cmdline "pvg.instance=1x"
bad 'pvg.seed: bad value .99999999999999999999.' --cmdline "pvg.seed=99999999999999999999"
bad 'pvg.hold: bad value .86401.' --cmdline "pvg.hold=86401"
bad 'pvg.exit: bad value .halt.*poweroff.reboot.none' --cmdline "pvg.exit=halt"
bad 'pvg.load: bad value .vda.*absolute' --cmdline "pvg.load=vda"
bad 'pvg.size needs a value' --cmdline "pvg.size"
bad "unknown parameter 'pvg.sise'" --cmdline "quiet pvg.sise=1"
bad 'pvg.workload: bad value .nope.' --workload nope
bad '--write-seed needs --host-digest' --write-seed 3
bad '--write-seed needs a decimal number' --host-digest --write-seed x
bad '"option":"--frobnicate".*unknown option' --frobnicate
bad 'unexpected argument' stray
"$AGENT" --help | grep -q 'pvg.workload=' || t_bad "--help lacks the parameters"

t_pass
