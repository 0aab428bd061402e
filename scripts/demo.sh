#!/usr/bin/env bash
# demo.sh: install what is missing, build, then run a pool and four microVMs under each memory
# mode (off, KSM at the kernel's defaults, pvisor's physical pool) and show memory saved against KSM.
#
# The VMs are host-driven synthetic guests (--guest synthetic): this host has no /dev/kvm, and the
# memory plane is the same one a KVM guest uses. Each VM holds the same 64 MiB of random data.
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null
[ "$(id -u)" = 0 ] || { echo "demo: run as root (memory cgroups, KSM knobs)" >&2; exit 1; }
window=${DEMO_WINDOW:-40}
echo "demo: 4 VMs x 64 MiB shared-random, each mode sampled for $window s after the VMs are ready"
bench/pvisor-bench --build build --vms 4 --data 64 --mem 256 --window "$window" \
	--workloads shared-random --conditions off,ksm,physical --out "${DEMO_OUT:-out/demo}"
echo "demo: numbers, time series and plots in ${DEMO_OUT:-out/demo}/ (summary.json, one CSV per mode,"
echo "      shared-random-memory.png, shared-random-pss.png, bars.png)"
