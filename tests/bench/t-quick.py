#!/usr/bin/env python3
# t-quick.py: pvisor-bench --quick end to end on synthetic guests: valid output, KSM restored, nothing left.
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import t_bench, t_fail, t_knobs, t_leftovers, t_need_root, t_skip  # noqa: E402

WORKLOADS = ["shared-random", "unique-random"]
CONDITIONS = ["off", "ksm", "physical"]
SWEEP = [1, 2]
FIGURES = ["t_ready_s", "ready_charge_mib", "reference_charge_mib", "t_reclaim_s", "t_reclaim_after_ready_s",
           "t_reclaim_own_ready_s", "end_charge_mib", "end_pss_mib", "group_cpu_total_s", "group_cpu_window_s",
           "ksmd_cpu_s", "ksm_full_scans", "ksm_pages_sharing", "ksm_meta_mib", "readback_s", "sharing_cpu_s"]


def check_summary(out, s):
    for k in ("command", "host", "kernel", "ksm", "pvisor_version", "params", "results", "sweep",
              "targets", "definitions", "plots"):
        if k not in s:
            t_fail(f"summary.json has no '{k}'")
    if not s["pvisor_version"].startswith("pvisor"):
        t_fail(f"pvisor_version is '{s['pvisor_version']}'")
    if not s["ksm"]["restored"] or s["ksm"]["before"].get("run") is None:
        t_fail(f"ksm section: {s['ksm']}")
    by = {(r["workload"], r["condition"], r["instances"]): r for r in s["results"]}
    for wl in WORKLOADS:
        for c in CONDITIONS:
            for n in SWEEP:
                r = by.get((wl, c, n))
                if r is None:
                    t_fail(f"no result for {wl}/{c}/x{n}")
                if r["excluded"]:
                    t_fail(f"{wl}/{c}/x{n} excluded: {r['excluded']}")
                miss = [f for f in FIGURES if f not in r]
                if miss:
                    t_fail(f"{wl}/{c}/x{n} lacks {miss}")
                for chk in ("ready", "readback", "private_write", "clean_exit"):
                    if not str(r["checks"].get(chk, "")).startswith("ok"):
                        t_fail(f"{wl}/{c}/x{n} check {chk}: {r['checks'].get(chk)}")
                check_csv(out, r)
        for c in CONDITIONS:
            sw = s["sweep"][wl][c]
            if [p[0] for p in sw["points"]] != SWEEP or sw["slope_mib_per_vm"] is None:
                t_fail(f"sweep {wl}/{c}: {sw}")
    off, phys = by[("shared-random", "off", 2)], by[("shared-random", "physical", 2)]
    # 2 x 8 MiB of the same data: sharing must show in the instances' PSS, and in the
    # group's charge too, except in a sanitizer build, where the pool's own shadow
    # memory (it is in the group) is as large as what sharing saves.
    if not phys["end_pss_mib"] < off["end_pss_mib"] - 4:
        t_fail(f"physical did not share: PSS {phys['end_pss_mib']} MiB vs off {off['end_pss_mib']} MiB")
    if "ASAN_OPTIONS" not in os.environ and not phys["end_charge_mib"] < off["end_charge_mib"] - 4:
        t_fail(f"physical did not share: {phys['end_charge_mib']} MiB vs off {off['end_charge_mib']} MiB")
    if not off["end_charge_mib"] > 16:
        t_fail(f"off holds {off['end_charge_mib']} MiB for 2 x 8 MiB of data")
    if len(s["targets"]) < 5 or any(t["met"] not in (True, False, None) for t in s["targets"]):
        t_fail(f"targets: {s['targets']}")


def check_csv(out, r):
    path = os.path.join(out, r["csv"])
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if len(rows) < 10:
        t_fail(f"{path}: {len(rows)} rows")
    ts = [float(x["t_s"]) for x in rows]
    if any(b <= a for a, b in zip(ts, ts[1:])):
        t_fail(f"{path}: time does not increase")
    if min(int(x["group_bytes"]) for x in rows) <= 0 or not any(x["phase"] == "window" for x in rows):
        t_fail(f"{path}: empty charge or no window rows")


def check_plots(out, plots):
    want = {f"{wl}-{k}.{e}" for wl in WORKLOADS for k in ("memory", "pss") for e in ("png", "svg")}
    want |= {f"bars.{e}" for e in ("png", "svg")} | {f"sweep-{wl}.{e}" for wl in WORKLOADS for e in ("png", "svg")}
    if not want <= set(plots):
        t_fail(f"plots missing: {sorted(want - set(plots))}")
    for p in plots:
        with open(os.path.join(out, p), "rb") as f:
            data = f.read()
        if len(data) < 4000:
            t_fail(f"{p} has only {len(data)} bytes")
        if p.endswith(".png") and not data.startswith(b"\x89PNG\r\n\x1a\n"):
            t_fail(f"{p} is not a PNG")
        if p.endswith(".svg") and b"<svg" not in data:
            t_fail(f"{p} has no <svg tag")


def main():
    t_need_root()
    if not shutil.which("gnuplot"):
        t_skip("gnuplot is not installed (scripts/setup.sh installs gnuplot-nox)")
    prog, env = t_bench()
    before = t_knobs()
    out = tempfile.mkdtemp(prefix="t-bench-quick.")
    try:
        p = subprocess.Popen([prog, "--quick", "--sweep", ",".join(map(str, SWEEP)), "--out", out],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        text, _ = p.communicate(timeout=280)
        print(text[-3000:])
        if p.returncode != 0:
            t_fail(f"pvisor-bench --quick exited with {p.returncode}")
        after = t_knobs()
        if after != before:
            t_fail(f"KSM knobs changed: {[k for k in before if before[k] != after.get(k)]}")
        procs, groups = t_leftovers(p.pid)
        if procs or groups:
            t_fail(f"left behind: processes {procs}, cgroups {groups}")
        with open(os.path.join(out, "summary.json")) as f:
            s = json.load(f)
        check_summary(out, s)
        check_plots(out, s["plots"])
        if "targets (reported, not asserted)" not in text or "MiB" not in text:
            t_fail("no table or targets on the terminal")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print("PASS: quick run wrote valid output, KSM knobs restored, nothing left behind")


if __name__ == "__main__":
    main()
