# lib.sh: helpers for the CLI tests: run pvisor, check exit status and message, clean up.
#
# A test sources this, calls t_setup, and leaves through t_pass, t_fail or
# t_skip (exit 0, 1, 77). The EXIT trap kills every VM the test started.
set -u

PVISOR=${PVISOR_BIN:-$(dirname "${BASH_SOURCE[0]}")/../../build/vmm/pvisor}
T_NAME=$(basename "$0" .sh)
. "$(dirname "${BASH_SOURCE[0]}")/../t-common.sh"

t_setup() { t_setup_tmp "$PVISOR" pvisor-cli; }

# t_expect STATUS 'regex' ARGS...: run pvisor ARGS, want exit STATUS (or "nonzero")
# and stderr+stdout matching every |-free extended regex given as 'a&&b'.
t_expect() {
	local want=$1 pat=$2 out rc p; shift 2
	out=$("$PVISOR" "$@" 2>&1); rc=$?
	if [ "$want" = nonzero ]; then
		[ "$rc" != 0 ] || { t_bad "pvisor $*: exit 0, want non-zero"; return; }
	elif [ "$rc" != "$want" ]; then
		t_bad "pvisor $*: exit $rc, want $want; output: $out"; return
	fi
	local pats
	IFS=$'\x01' read -r -a pats <<<"${pat//&&/$'\x01'}"
	for p in "${pats[@]}"; do
		grep -qE -- "$p" <<<"$out" || { t_bad "pvisor $*: output lacks /$p/: $out"; return; }
	done
	echo "  ok: pvisor $* -> $rc"
}

# One JSON field of stdin: t_json 'expr' where expr is python on `j`.
t_json() { python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"; }
