# report.py: what pvisor-bench concludes: comparisons, targets, the sweep slope, table, JSON and CSVs.
"""Only conditions that passed every check are compared; an excluded one shows its reason."""
import json
import os

from .run import SAMPLE_FIELDS

DEFINITIONS = {
    "t_reclaim_s": "seconds from launch to the first sample from which the group stays at least "
                   "--reclaim MiB below the reference charge until the window ends (null: not reached)",
    "reference_charge_mib": "the off condition's charge once all its instances were ready (same workload "
                            "and instance count, same run): memory with nothing shared; a condition's own "
                            "all-ready charge when off was not measured",
    "t_reclaim_own_ready_s": "the same, measured from all-ready against the condition's own all-ready charge "
                             "(a mode that shares while the guests fill has little left to reclaim here)",
    "end_charge_mib": "group charged memory (cgroup memory.usage_in_bytes / memory.current) at window end",
    "end_pss_mib": "sum of the instances' PSS (smaps_rollup) at window end; end_pool_pss_mib is the pool's",
    "group_cpu_total_s": "group CPU seconds from launch to window end (filling included)",
    "group_cpu_window_s": "group CPU seconds inside the window",
    "ksmd_cpu_s": "ksmd's CPU (utime+stime from /proc/PID/stat) in the window: outside the group",
    "ksm_meta_mib": "KSM's rmap_items of the instances (/proc/PID/ksm_stat) x 64 bytes: outside the group",
    "sharing_cpu_s": "group_cpu_total_s + ksmd_cpu_s - the off condition's group_cpu_total_s",
    "readback_s": "wall time of the first complete readback of all instances in parallel",
    "slope_mib_per_vm": "least-squares slope of end memory over the instance counts of --sweep",
}


def ok(results):
    return [r for r in results if not r["excluded"]]


def by_cond(results, workload, n):
    return {r["condition"]: r for r in ok(results) if r["workload"] == workload and r["instances"] == n}


def add_sharing_cpu(results):
    """sharing_cpu_s: the CPU a mode spent beyond the same instances with sharing off."""
    for r in ok(results):
        off = by_cond(results, r["workload"], r["instances"]).get("off")
        r["sharing_cpu_s"] = None if off is None else round(
            r["group_cpu_total_s"] + r["ksmd_cpu_s"] - off["group_cpu_total_s"], 3)


def slope(points):
    """Least-squares (slope, intercept) of [(x, y)], or (None, None) with fewer than 2 x values."""
    if len({x for x, _ in points}) < 2:
        return None, None
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return round(b, 3), round(my - b * mx, 3)


def sweep_summary(results, counts):
    out = {}
    for r in ok(results):
        if r["instances"] in counts:
            out.setdefault(r["workload"], {}).setdefault(r["condition"], {"points": []})["points"].append(
                [r["instances"], r["end_charge_mib"]])
    for wl in out.values():
        for c in wl.values():
            c["points"].sort()
            c["slope_mib_per_vm"], c["intercept_mib"] = slope(c["points"])
    return out


def _target(name, value, limit, met, detail):
    return {"target": name, "value": value, "limit": limit,
            "met": met, "detail": detail}


def targets(results, n, reclaim_mib):
    """The issue's targets, each met, missed, or n/a (a condition missing or excluded)."""
    out = []
    sr, ur = by_cond(results, "shared-random", n), by_cond(results, "unique-random", n)
    p, k = sr.get("physical"), sr.get("ksm")
    name = f"shared-random x{n}: physical reclaims {reclaim_mib} MiB >= 50x sooner than KSM"
    if p and k:
        pt, kt = p["t_reclaim_s"], k["t_reclaim_s"]
        if pt is None:
            out.append(_target(name, None, 50, False, f"physical never reached it (KSM: {kt})"))
        elif kt is None:
            out.append(_target(name, None, 50, True, f"physical {pt:.2f} s, KSM never"))
        else:
            ratio = kt / max(pt, 0.1)
            out.append(_target(name, round(ratio, 1), 50, ratio >= 50,
                               f"physical {pt:.2f} s, KSM {kt:.2f} s (since launch; sample period 0.1 s)"))
        out.append(_target("shared-random: physical ends the window at or below KSM's memory",
                           p["end_charge_mib"], k["end_charge_mib"],
                           p["end_charge_mib"] <= k["end_charge_mib"],
                           f"{p['end_charge_mib']:.1f} vs {k['end_charge_mib']:.1f} MiB"))
        pc, kc = p.get("sharing_cpu_s"), k.get("sharing_cpu_s")
        basis = "sharing CPU (beyond off, ksmd included)"
        if pc is None or kc is None:
            pc, kc = p["group_cpu_total_s"] + p["ksmd_cpu_s"], k["group_cpu_total_s"] + k["ksmd_cpu_s"]
            basis = "total CPU (off missing)"
        out.append(_target("shared-random: physical uses at most half of KSM's CPU incl. ksmd",
                           round(pc, 3), round(kc / 2, 3), pc <= kc / 2,
                           f"{basis}: {pc:.2f} vs {kc:.2f} s"))
    else:
        out.append(_target(name, None, 50, None, "needs physical and ksm on shared-random"))
    p, k, o = ur.get("physical"), ur.get("ksm"), ur.get("off")
    if p and k:
        pc, kc = p["group_cpu_window_s"], k["ksmd_cpu_s"]
        out.append(_target("unique-random: physical's window CPU under a tenth of ksmd's",
                           pc, round(kc / 10, 3), pc < kc / 10,
                           f"group CPU in window {pc:.2f} s vs ksmd {kc:.2f} s"))
    else:
        out.append(_target("unique-random: physical's window CPU under a tenth of ksmd's", None, None,
                           None, "needs physical and ksm on unique-random"))
    if p and o:
        d = (p["end_charge_mib"] - o["end_charge_mib"]) / o["end_charge_mib"]
        out.append(_target("unique-random: physical's memory within 1 % of off", round(100 * d, 2), 1.0,
                           abs(d) <= 0.01, f"{p['end_charge_mib']:.1f} vs {o['end_charge_mib']:.1f} MiB"))
    else:
        out.append(_target("unique-random: physical's memory within 1 % of off", None, 1.0, None,
                           "needs physical and off on unique-random"))
    return out


def _f(v, fmt, none="-"):
    return none if v is None else format(v, fmt)


def table(results, reclaim_mib):
    cols = [("workload", 14), ("n", 2), ("condition", 9), ("ready s", 7), ("reclaim s", 11),
            ("aft.ready", 9), ("end MiB", 8), ("PSS MiB", 8), ("grp CPU s", 9), ("win CPU s", 9),
            ("ksmd s", 6), ("share CPU", 9), ("scans", 5), ("KSM meta", 8), ("readback", 8)]
    head = " ".join(f"{c:>{w}}" if i > 2 else f"{c:{w}}" for i, (c, w) in enumerate(cols))
    lines = [f"reclaim s: seconds from launch until the group stays {reclaim_mib} MiB below the "
             f"unshared charge ('never': not reached)", head, "-" * len(head)]
    for r in results:
        pre = f"{r['workload']:14} {r['instances']:2} {r['condition']:9}"
        if r["excluded"]:
            lines.append(f"{pre} EXCLUDED: {r['excluded']}")
            continue
        lines.append(f"{pre} {r['t_ready_s']:7.2f} {_f(r['t_reclaim_s'], '.2f', 'never'):>11} "
                     f"{_f(r['t_reclaim_after_ready_s'], '.2f'):>9} {r['end_charge_mib']:8.1f} "
                     f"{r['end_pss_mib']:8.1f} {r['group_cpu_total_s']:9.2f} {r['group_cpu_window_s']:9.2f} "
                     f"{r['ksmd_cpu_s']:6.2f} {_f(r.get('sharing_cpu_s'), '.2f'):>9} "
                     f"{r['ksm_full_scans']:5d} {r['ksm_meta_mib']:8.2f} {r['readback_s']:8.2f}")
    return "\n".join(lines)


def sweep_table(sweep):
    lines = []
    for wl, conds in sweep.items():
        for c, d in conds.items():
            pts = "  ".join(f"{n}: {m:.1f}" for n, m in d["points"])
            sl = _f(d["slope_mib_per_vm"], ".1f")
            lines.append(f"sweep {wl:14} {c:9} end MiB by instances  {pts}   slope {sl} MiB per VM")
    return "\n".join(lines)


def targets_table(tg):
    lines = ["targets (reported, not asserted):"]
    for t in tg:
        state = {True: "met   ", False: "MISSED", None: "n/a   "}[t["met"]]
        lines.append(f"  {state} {t['target']}: {t['detail']}")
    return "\n".join(lines)


def csv_name(r, main_n):
    base = f"{r['workload']}-{r['condition']}"
    return f"{base}.csv" if r["instances"] == main_n else os.path.join("sweep", f"{base}-n{r['instances']}.csv")


def write_csvs(out, results, main_n):
    for r in results:
        path = os.path.join(out, csv_name(r, main_n))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(",".join(SAMPLE_FIELDS) + "\n")
            for s in r["samples"]:
                f.write(",".join(str(s[k]) for k in SAMPLE_FIELDS) + "\n")
        r["csv"] = csv_name(r, main_n)


def write_summary(out, summary):
    res = [{k: v for k, v in r.items() if k != "samples"} for r in summary["results"]]
    doc = dict(summary, results=res, definitions=DEFINITIONS)
    tmp = os.path.join(out, "summary.json.tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, os.path.join(out, "summary.json"))
