#!/usr/bin/env bash
# run-tests.sh: build pvisor twice (plain, then ASan+UBSan) and run the whole suite in each.
#
# Usage: tests/run-tests.sh [--quick]   (--quick: plain build only)
# Prints one closing line "N passed, N failed, N skipped" over both builds and
# exits non-zero if anything failed. Tests that need something absent (root,
# KVM, QEMU) skip with exit 77 and say why in their log.
set -u
cd "$(dirname "$0")/.."
top=$PWD
quick=0
[ "${1:-}" = "--quick" ] && quick=1

passed=0 failed=0 skipped=0
summarise() { # $1 = build dir; adds its results to the totals
	local log=$1/meson-logs/testlog.json p f s
	if [ ! -s "$log" ]; then
		echo "run-tests: no test log in $1" >&2
		failed=$((failed + 1))
		return
	fi
	read -r p f s < <(python3 - "$log" <<'PY'
import json, sys
p = f = s = 0
for line in open(sys.argv[1]):
    r = json.loads(line)["result"]
    if r in ("OK", "EXPECTEDFAIL"): p += 1
    elif r == "SKIP": s += 1
    else: f += 1
print(p, f, s)
PY
)
	passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
	echo "run-tests: $1: $p passed, $f failed, $s skipped"
}

run_build() { # $1 = build dir, rest = meson setup options
	local dir=$1; shift
	if [ ! -d "$dir" ]; then
		meson setup "$dir" "$@" >/dev/null || { echo "run-tests: meson setup $dir failed"; failed=$((failed + 1)); return; }
	fi
	if ! ninja -C "$dir" >"$dir/build-output.log" 2>&1; then
		cat "$dir/build-output.log"
		echo "run-tests: build in $dir failed"
		failed=$((failed + 1))
		return
	fi
	rm -f "$dir/meson-logs/testlog.json"
	meson test -C "$dir" --print-errorlogs --num-processes 1 ${PVISOR_TEST_ARGS:-}
	summarise "$dir"
}

# A fresh machine has nothing: install what is missing and build (idempotent).
scripts/setup.sh >/dev/null || { echo "run-tests: scripts/setup.sh failed"; echo "0 passed, 1 failed"; exit 1; }
run_build "$top/build"
if [ "$quick" = 0 ]; then
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		run_build "$top/build-asan" -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
