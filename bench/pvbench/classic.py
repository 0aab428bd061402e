# classic.py: the classic KSM experiments built into pvisor-bench: ksm-patterns and ksm-zeros.
"""ksm-patterns: one guest of 1 GiB whose every 4 KiB page is one of four patterns.
KSM runs until it has finished two full passes (it merges nothing before its second);
then PSS, the group's charge and KSM's profit are taken, KSM is stopped (run=0 keeps
the merge) and one byte is written to every page: copy-on-write undoes every merge,
and the memory and the time it took are shown. pvisor's physical mode runs the same.

ksm-zeros: one guest with 512 MiB of touched zero pages, KSM with use_zero_pages=0
and =1 for a 30 s window each (ksmd's CPU as percent of one core), against pvisor's
zero-page discard (physical mode: zero pages are dropped, not shared).
"""
from . import MIB
from .guest import InstanceError
from .ksm import counters
from .run import CONDITIONS, Condition, Session, figures


def _close(ses, res):
    ses.progress_end()
    bad = ses.close()
    res["checks"]["clean_exit"] = "ok" if not bad else "; ".join(bad)
    if bad and not res["excluded"]:
        res["excluded"] = "unclean exit: " + "; ".join(bad)


def _new(cond, workload, n=1):
    return {"condition": cond.name, "workload": workload, "instances": n, "excluded": None,
            "checks": {}, "samples": []}


def patterns(ctx):
    a, results = ctx.args, []
    for name in a.conditions:
        cond = CONDITIONS[name]
        res, ses = _new(cond, "patterns"), None
        try:
            ctx.ksm.settle(ctx.ksm_settings)
            ses = Session(ctx, cond, "patterns", 1, f"patterns-{name}", a.data, a.mem)
            res["samples"] = ses.samples
            ses.launch()
            ses.wait_ready()
            if cond.ksm:
                s = ses.window(a.max_wait, until=lambda s: s["ksm_full_scans"] >= 2)
                if s["ksm_full_scans"] < 2:
                    raise InstanceError(f"KSM finished {s['ksm_full_scans']} full passes in "
                                        f"{a.max_wait} s (--max-wait)")
            else:
                ses.window(a.window)
            res.update(figures(ses, None))
            s = ses.samples[-1]
            res["merged"] = {"t_s": s["t_s"], "after_ready_s": round(s["t_s"] - ses.t_ready, 2),
                             "group_mib": round(s["group_bytes"] / MIB, 2),
                             "pss_mib": round(s["pss_bytes"] / MIB, 2),
                             "ksm_profit_mib": round(s["ksm_profit_bytes"] / MIB, 2),
                             "ksm_pages_sharing": s["ksm_pages_sharing"],
                             "ksm_global_pages_sharing": s["ksm_global_pages_sharing"],
                             "ksm_meta_mib": round(s["ksm_meta_bytes"] / MIB, 3)}
            t_poke = ses.vms[0].poke_all()
            s = ses.window(a.after, phase="after-write")
            res["after_write"] = {"write_s": round(t_poke, 3), "group_mib": round(s["group_bytes"] / MIB, 2),
                                  "pss_mib": round(s["pss_bytes"] / MIB, 2),
                                  "ksm_pages_sharing": s["ksm_pages_sharing"]}
            res["readback_s"] = 0.0
            res["checks"]["ready"] = "ok"
        except (InstanceError, OSError) as e:
            res["excluded"] = str(e)
        finally:
            if ses is not None:
                _close(ses, res)
        results.append(res)
    return results


def patterns_table(results):
    lines = ["ksm-patterns: every page one of four patterns; merged = after KSM's two full passes "
             "(pvisor: after the window); then one byte written to every page",
             f"{'condition':9} {'merged after':>12} {'group MiB':>9} {'PSS MiB':>8} {'KSM profit':>10} "
             f"{'sharing':>8} {'write s':>7} {'group MiB':>9} {'PSS MiB':>8}"]
    for r in results:
        if r["excluded"]:
            lines.append(f"{r['condition']:9} EXCLUDED: {r['excluded']}")
            continue
        m, w = r["merged"], r["after_write"]
        lines.append(f"{r['condition']:9} {m['after_ready_s']:10.1f} s {m['group_mib']:9.1f} {m['pss_mib']:8.1f} "
                     f"{m['ksm_profit_mib']:10.1f} {m['ksm_pages_sharing']:8d} {w['write_s']:7.2f} "
                     f"{w['group_mib']:9.1f} {w['pss_mib']:8.1f}")
    return "\n".join(lines)


def zeros(ctx):
    a, results = ctx.args, []
    runs = []
    for name in a.conditions:
        if name == "ksm":
            runs += [(Condition(f"ksm-uzp{z}", "ksm", ksm=True), {"use_zero_pages": z}) for z in (0, 1)]
        else:
            runs.append((CONDITIONS[name], {}))
    for cond, extra in runs:
        res, ses = _new(cond, "zeros"), None
        res["ksm_settings"] = dict(ctx.ksm_settings, **extra) if cond.ksm else None
        try:
            ctx.ksm.settle(dict(ctx.ksm_settings, **extra))
            ses = Session(ctx, cond, "zeros", 1, f"zeros-{cond.name}", a.data, a.mem)
            res["samples"] = ses.samples
            ses.launch()
            ses.wait_ready()
            ses.window(a.window)
            res.update(figures(ses, None))
            res["ksmd_cpu_percent"] = round(100 * res["ksmd_cpu_s"] / max(res["window_s"], 0.1), 2)
            res["group_cpu_window_percent"] = round(100 * res["group_cpu_window_s"] / max(res["window_s"], 0.1), 2)
            res["ksm_zero_pages"] = counters().get("ksm_zero_pages", 0) if cond.ksm else 0
            res["readback_s"], _ = ses.readback()
            res["checks"]["readback"] = "ok"
        except (InstanceError, OSError) as e:
            res["excluded"] = str(e)
        finally:
            if ses is not None:
                _close(ses, res)
        results.append(res)
    return results


def zeros_table(results, reclaim):
    lines = ["ksm-zeros: touched zero pages; CPU in percent of one core over the window",
             f"{'condition':10} {'ready MiB':>9} {'end MiB':>8} {'PSS MiB':>8} {'ksmd %':>7} {'group %':>7} "
             f"{'scans':>5} {'sharing':>8} {'zero pgs':>8} {'KSM meta':>8}"]
    for r in results:
        if r["excluded"]:
            lines.append(f"{r['condition']:10} EXCLUDED: {r['excluded']}")
            continue
        lines.append(f"{r['condition']:10} {r['ready_charge_mib']:9.1f} {r['end_charge_mib']:8.1f} "
                     f"{r['end_pss_mib']:8.1f} {r['ksmd_cpu_percent']:7.2f} {r['group_cpu_window_percent']:7.2f} "
                     f"{r['ksm_full_scans']:5d} {r['ksm_pages_sharing']:8d} {r.get('ksm_zero_pages') or 0:8d} "
                     f"{r['ksm_meta_mib']:8.2f}")
    return "\n".join(lines)

