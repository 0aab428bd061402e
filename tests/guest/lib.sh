# lib.sh: helpers for the pvisor-guest tests: run the agent in host mode and read its PVG lines.
#
# A test sources this, calls t_setup, and leaves through t_pass, t_fail or t_skip
# (exit 0, 1, 77); t_bad records a failed check and lets the test go on.
set -u

AGENT=${PVISOR_BUILD:-$(dirname "${BASH_SOURCE[0]}")/../../build}/guest/pvisor-guest
PVISOR=${PVISOR_BIN:-${PVISOR_BUILD:-$(dirname "${BASH_SOURCE[0]}")/../../build}/vmm/pvisor}
T_NAME=$(basename "$0" .sh)
. "$(dirname "${BASH_SOURCE[0]}")/../t-common.sh"

t_ok() { echo "  ok: $*"; }
# t_check DESCRIPTION COMMAND...: ok if the command succeeds.
t_check() { local d=$1; shift; if "$@"; then t_ok "$d"; else t_bad "$d"; fi; }

t_setup() { t_setup_tmp "$AGENT" pvisor-guest; }

# pvg EVENT [NTH] <FILE: the NTH (default 1st) `PVG {...}` line of an event.
pvg() { grep "^PVG {\"event\":\"$1\"" | sed -n "${2:-1}p" | sed 's/^PVG //'; }
# jf KEY <LINE: one string, number or boolean member of a flat JSON line (no python:
# starting it costs most of a second here). Fails if the key is absent.
jf() {
	local l v
	l=$(cat)
	case $l in *"\"$1\":"*) ;; *) return 1 ;; esac
	v=${l#*\"$1\":}
	v=${v# }
	if [ "${v:0:1}" = '"' ]; then v=${v:1}; v=${v%%\"*}; else v=${v%%[,\} ]*}; fi
	echo "$v"
}
