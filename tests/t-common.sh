# t-common.sh: the exits and clean-up every shell test library shares (cli, guest).
#
# The sourcing library sets T_NAME; tests leave through t_pass, t_fail or t_skip
# (exit 0, 1, 77); t_bad records a failed check and lets the test go on; the EXIT
# trap set by t_setup_tmp kills every process in T_PIDS and removes T_TMP.
T_PIDS=()
T_FAILS=0

t_skip() { echo "SKIP: $T_NAME: $*"; exit 77; }
t_fail() { echo "FAIL: $T_NAME: $*"; exit 1; }
t_pass() { [ "$T_FAILS" = 0 ] || t_fail "$T_FAILS check(s) failed"; echo "PASS: $T_NAME${1:+: $*}"; exit 0; }
t_bad() { echo "  not ok: $*"; T_FAILS=$((T_FAILS + 1)); }

t_cleanup() {
	local p
	for p in "${T_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
	for p in "${T_PIDS[@]}"; do wait "$p" 2>/dev/null; done
	[ -n "${T_TMP:-}" ] && rm -rf "$T_TMP"
}

# t_setup_tmp BINARY PREFIX: skip without BINARY; a temp folder /tmp/PREFIX.XXXXXX in T_TMP.
t_setup_tmp() {
	[ -x "$1" ] || t_skip "no $(basename "$1") at $1"
	T_TMP=$(mktemp -d "/tmp/$2.XXXXXX")
	trap t_cleanup EXIT
}
