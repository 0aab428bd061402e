#!/usr/bin/env python3
# compare.py: the old quick comparison's name, kept for old scripts; it now runs bench/pvisor-bench.
"""compare.py: runs bench/pvisor-bench with the same flags (--vms, --data, --mem, --window,
--reclaim, --workloads, --conditions, --build, --out all mean what they meant here) and
compare.py's old default workloads (shared-random,unique-random). Use pvisor-bench."""
import os
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
args = sys.argv[1:]
if not any(a == "--workloads" or a.startswith("--workloads=") for a in args):
    args = ["--workloads", "shared-random,unique-random"] + args
if not any(a == "--build" or a.startswith("--build=") for a in args) and "PVISOR_BUILD" not in os.environ:
    args = ["--build", os.path.join(os.path.dirname(HERE), "build")] + args
os.execv(sys.executable, [sys.executable, os.path.join(HERE, "pvisor-bench"), *args])
