# lib.sh: shared helpers for the integration tests: a memory cgroup, the pool, synthetic VMs, checks.
#
# Every test sources this, calls t_setup, and leaves through t_pass, t_fail or
# t_skip (exit 0, 1, 77). The EXIT trap kills everything the test started and
# removes its cgroup, whatever path the test took.
set -u

POOL=${PVISOR_POOL_BIN:-$(dirname "${BASH_SOURCE[0]}")/../../build/pool/pvisor-pool}
PVISOR=${PVISOR_BIN:-$(dirname "${BASH_SOURCE[0]}")/../../build/vmm/pvisor}
T_NAME=$(basename "$0" .sh)
T_PIDS=()
T_CG=""

t_log() { echo "[$T_NAME $(date +%T.%N | cut -c1-12)] $*"; }
t_skip() { echo "SKIP: $T_NAME: $*"; exit 77; }
t_fail() { echo "FAIL: $T_NAME: $*"; exit 1; }
t_pass() { echo "PASS: $T_NAME${1:+: $*}"; exit 0; }

t_cleanup() {
	local p
	for p in "${T_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
	for p in "${T_PIDS[@]}"; do wait "$p" 2>/dev/null; done
	if [ -n "$T_CG" ] && [ -d "$T_CG" ]; then
		# Anything still in the group (a pool started by the test) goes first.
		for p in $(cat "$T_CG/cgroup.procs" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
		for _ in $(seq 50); do [ -s "$T_CG/cgroup.procs" ] || break; sleep 0.1; done
		rmdir "$T_CG" 2>/dev/null
	fi
	[ -n "${T_TMP:-}" ] && rm -rf "$T_TMP"
}

t_setup() {
	[ "$(id -u)" = 0 ] || t_skip "needs root (memory cgroups, userfaultfd on all pages)"
	[ -x "$POOL" ] || t_skip "no pool binary at $POOL"
	[ -x "$PVISOR" ] || t_skip "no pvisor binary at $PVISOR"
	T_TMP=$(mktemp -d /tmp/pvisor-it.XXXXXX)
	: >"$T_TMP/pool.conf"
	trap t_cleanup EXIT
}

# A fresh cgroup v1 memory group (v2 memory.current where v1 is absent).
t_cgroup() {
	local base=/sys/fs/cgroup/memory
	[ -d "$base" ] || base=/sys/fs/cgroup
	T_CG=$base/pvisor-test-$$-$RANDOM
	mkdir "$T_CG" || t_skip "cannot create a memory cgroup under $base"
}

# Charged bytes of the test's group.
t_cg_bytes() {
	if [ -f "$T_CG/memory.usage_in_bytes" ]; then cat "$T_CG/memory.usage_in_bytes"; else cat "$T_CG/memory.current"; fi
}

# Run "$@" in the background inside the group (if any); its pid lands in T_LAST.
t_spawn() {
	local log=$1; shift
	(
		[ -n "$T_CG" ] && echo "$BASHPID" >"$T_CG/cgroup.procs"
		exec "$@"
	) >>"$log" 2>&1 &
	T_LAST=$!
	T_PIDS+=("$T_LAST")
}

t_pool_start() { # extra pool flags
	t_spawn "$T_TMP/pool.log" "$POOL" --config "$T_TMP/pool.conf" --socket "$T_TMP/pool.sock" "$@"
	T_POOL_PID=$T_LAST
	for _ in $(seq 100); do
		"$POOL" stat --socket "$T_TMP/pool.sock" --json >/dev/null 2>&1 && return 0
		sleep 0.05
	done
	cat "$T_TMP/pool.log"
	t_fail "pool did not come up"
}

t_pool_stat() { "$POOL" stat --socket "$T_TMP/pool.sock" --json "$@"; }

# Read one number out of JSON on stdin: t_json 'expr' where expr is python on `j`.
t_json() { python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"; }

t_vm_start() { # name, then extra pvisor run flags
	local name=$1; shift
	t_spawn "$T_TMP/$name.log" "$PVISOR" run --guest synthetic --name "$name" \
		--api-sock "$T_TMP/$name.sock" --pool "$T_TMP/pool.sock" "$@"
	eval "T_VM_PID_${name//-/_}=$T_LAST"
}

t_ctl() { local name=$1; shift; "$PVISOR" ctl --api-sock "$T_TMP/$name.sock" "$@"; }

t_wait_ready() { # names...
	local n
	for n in "$@"; do
		t_ctl "$n" wait-ready --timeout 60 >/dev/null || { cat "$T_TMP/$n.log"; t_fail "$n never became ready"; }
	done
}

# Poll "$@" (a command) until it succeeds or $T_WAIT seconds pass.
t_until() {
	local deadline=$((SECONDS + ${T_WAIT:-30}))
	while [ $SECONDS -lt $deadline ]; do
		"$@" && return 0
		sleep 0.2
	done
	return 1
}
