#!/usr/bin/env python3
# t-flags.py: pvisor-bench refuses bad flags and values with exit 2 and names what is allowed.
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import t_bench, t_fail  # noqa: E402

CASES = [  # (arguments, words the error must name)
    (["--no-such-flag"], ["--no-such-flag", "--vms", "--workloads", "--ksm-pages-to-scan"]),
    (["--workloads", "shared-random,bogus"], ["bogus", "repeated", "shared-random", "unique-random",
                                              "zeros", "patterns"]),
    (["--conditions", "dax"], ["dax", "off", "ksm", "physical"]),
    (["--guest", "qemu"], ["qemu", "synthetic", "kvm"]),
    (["--ksm-zero-pages", "2"], ["0", "1"]),
    (["--vms", "0"], ["0", "positive"]),
    (["--sweep", "0,2"], ["1,2,4,8"]),
    (["frobnicate"], ["run", "ksm-patterns", "ksm-zeros"]),
    (["ksm-zeros", "--conditions", "off"], ["ksm", "physical"]),
]


def main():
    prog, env = t_bench()
    for args, words in CASES:
        p = subprocess.run([prog, *args], env=env, capture_output=True, text=True, timeout=30)
        if p.returncode != 2:
            t_fail(f"{args}: exit {p.returncode}, want 2 ({p.stderr.strip()})")
        miss = [w for w in words if w not in p.stderr]
        if miss:
            t_fail(f"{args}: error does not name {miss}: {p.stderr.strip()}")
        print(f"ok {args}: {p.stderr.strip()[:160]}")
    p = subprocess.run([prog, "--help"], env=env, capture_output=True, text=True, timeout=30)
    flags = ["--vms", "--data", "--mem", "--limit", "--window", "--reclaim", "--workloads", "--conditions",
             "--sweep", "--quick", "--guest", "--build", "--out", "--ksm-pages-to-scan", "--ksm-sleep-ms",
             "--ksm-zero-pages", "ksm-patterns", "ksm-zeros"]
    miss = [f for f in flags if f not in p.stdout]
    if p.returncode != 0 or miss or p.stdout.count("default") < 15:
        t_fail(f"--help: exit {p.returncode}, missing {miss}")
    for sub in ("ksm-patterns", "ksm-zeros"):
        p = subprocess.run([prog, sub, "--help"], env=env, capture_output=True, text=True, timeout=30)
        if p.returncode != 0 or "--window" not in p.stdout or "default" not in p.stdout:
            t_fail(f"{sub} --help: exit {p.returncode}")
    if not os.path.exists("/dev/kvm") and os.geteuid() == 0:
        p = subprocess.run([prog, "--guest", "kvm", "--quick"], env=env, capture_output=True, text=True,
                           timeout=30)
        if p.returncode != 2 or "/dev/kvm" not in p.stderr:
            t_fail(f"--guest kvm without /dev/kvm: exit {p.returncode}: {p.stderr.strip()}")
        print(f"ok --guest kvm refused: {p.stderr.strip()}")
    print("PASS: bad flags exit 2 and name the allowed values")


if __name__ == "__main__":
    main()
