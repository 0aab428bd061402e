#!/usr/bin/env python3
# t-interrupt.py: Ctrl-C or SIGTERM during a KSM window: KSM knobs restored, processes and cgroups gone.
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import KSM, t_bench, t_fail, t_knobs, t_leftovers, t_need_root  # noqa: E402

# Settings nobody runs with, so that a knob left behind cannot look restored by chance.
ODD = {"pages_to_scan": "777", "sleep_millisecs": "7"}


def read(name):
    with open(f"{KSM}/{name}") as f:
        return f.read().strip()


def one(prog, env, sig, in_ksm):
    before = t_knobs()
    if before.get("pages_to_scan", b"").strip() == ODD["pages_to_scan"].encode():
        t_fail("pages_to_scan is already 777: pick other odd settings")
    out = tempfile.mkdtemp(prefix="t-bench-int.")
    p = subprocess.Popen([prog, "--quick", "--workloads", "shared-random", "--conditions", "ksm",
                          "--window", "10", "--no-plots", "--ksm-pages-to-scan", ODD["pages_to_scan"],
                          "--ksm-sleep-ms", ODD["sleep_millisecs"], "--out", out],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 60
        # Off runs first (settings already applied, run=0), then the KSM window (run=1).
        while not ((read("run") == "1" or not in_ksm) and read("pages_to_scan") == ODD["pages_to_scan"]):
            if time.monotonic() > end or p.poll() is not None:
                t_fail(f"KSM window never started (exit {p.poll()})")
            time.sleep(0.05)
        time.sleep(0.5)
        p.send_signal(sig)
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:  # a failed wait: let it clean up, as a user's kill would
            p.terminate()
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(out, ignore_errors=True)
    if rc != 130:
        t_fail(f"{sig.name}: exit {rc}, want 130")
    after = t_knobs()
    if after != before:
        t_fail(f"{sig.name}: KSM knobs not restored: "
               f"{ {k: (before[k], after.get(k)) for k in before if before[k] != after.get(k)} }")
    procs, groups = t_leftovers(p.pid)
    if procs or groups:
        t_fail(f"{sig.name}: left behind: processes {procs}, cgroups {groups}")
    print(f"ok {sig.name} {'in the KSM window' if in_ksm else 'before it'}: exit 130, knobs restored, nothing left")


def main():
    t_need_root()
    prog, env = t_bench()
    one(prog, env, signal.SIGTERM, False)
    one(prog, env, signal.SIGINT, True)
    print("PASS: interrupted runs clean up")


if __name__ == "__main__":
    main()
