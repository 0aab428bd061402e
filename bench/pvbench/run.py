# run.py: one condition of one workload: start the group, wait until ready, sample the window, check.
"""How one condition is measured (the protocol of pvisor-bench):

1. A fresh memory cgroup (limit, no swap) holds the pool (if the mode uses one) and
   N instances. Times are seconds since the first instance was launched.
2. Every 100 ms from launch: the group's charged memory, the sum of the instances'
   PSS (and the pool's), the group's CPU seconds, ksmd's CPU (/proc/PID/stat) and
   KSM's counters, which live outside the group and are kept beside it.
3. "All ready" is the first sample at which every instance has written and verified
   its data. KSM's run=1 starts there and ends with the window (run=0 keeps what it
   merged). The window lasts --window seconds.
4. After the window: the first complete readback of every instance in parallel
   (every byte compared with the workload, then the digest compared with the one
   taken at ready), the private write check (each instance writes its own bytes over
   its first pages; each then reads its own bytes there and the workload elsewhere),
   and a clean exit of every process (exit status 0). A failed step excludes the
   condition, with the reason, from every comparison.
"""
import os
import sys
import threading
import time

from . import MIB
from . import ksm as ksmmod
from .guest import InstanceError, KvmInstance, Pool, Spec, SynthInstance
from .host import Group, ksm_stat, mergeable_bytes, pss_bytes

TICK = 0.1
# Pages each instance overwrites in the private write check (4 MiB, or all data if less).
PRIVATE_PAGES = 1024


class Condition:
    """A memory mode: the VMM's --dedup value, whether it needs the pool and KSM."""

    def __init__(self, name, dedup, pool=False, ksm=False, extra=(), about=""):
        self.name, self.dedup, self.pool, self.ksm = name, dedup, pool, ksm
        self.extra, self.about = list(extra), about


CONDITIONS = {
    "off": Condition("off", "off", about="no sharing: the reference"),
    "ksm": Condition("ksm", "ksm", ksm=True, about="Linux KSM (MADV_MERGEABLE + run=1 for the window)"),
    "physical": Condition("physical", "physical", pool=True, about="pvisor-pool shares physical pages"),
}
# Conditions later issues add; named in errors so a user knows they are coming.
LATER = {"compressed": "64 KiB compressed tiers", "dax": "immutable-file DAX mappings"}

# ksm_pages_sharing, ksm_meta_bytes and ksm_profit_bytes are the instances' own
# (/proc/PID/ksm_stat: merging pages, rmap_items x 64, process profit); the global
# counters also count any other MADV_MERGEABLE process and are kept as ksm_global_*.
SAMPLE_FIELDS = ["t_s", "phase", "group_bytes", "pss_bytes", "pool_pss_bytes", "group_cpu_s",
                 "ksmd_cpu_s", "ksm_pages_sharing", "ksm_full_scans", "ksm_meta_bytes",
                 "ksm_profit_bytes", "ksm_global_pages_sharing", "ksm_global_pages_shared"]


class Session:
    """The processes, group and samples of one condition; close() always cleans up."""

    def __init__(self, ctx, cond, workload, n, tag, data_mib=None, mem_mib=None):
        a = ctx.args
        self.ctx, self.cond, self.workload, self.n = ctx, cond, workload, n
        self.tag = tag
        self.data_mib = data_mib or a.data
        self.mem_mib = mem_mib or a.mem
        self.group = Group(f"{ctx.pid}-{tag}", a.limit * MIB)
        ctx.live.append(self)
        self.pool, self.vms, self.samples = None, [], []
        self.t0 = self.t_ready = self.cpu0 = self.ksmd0 = None
        self.full0 = 0
        self.closed = False

    # -- start and sample --
    def launch(self):
        ctx, c = self.ctx, self.cond
        pool_sock = f"{ctx.tmp}/{self.tag}-pool.sock"
        if c.pool:
            self.pool = Pool(ctx.bins, ctx.tmp, self.tag)
            self.pool.start(self.group)
            pool_sock = self.pool.sock
        self.cpu0, self.ksmd0 = self.group.cpu_seconds(), ctx.ksm.ksmd_cpu()
        self.full0 = ksmmod.counters().get("full_scans", 0)
        self.t0 = time.monotonic()
        for i in range(self.n):
            spec = Spec(self.workload, self.data_mib, self.mem_mib, i, c.dedup, c.extra)
            if ctx.args.guest == "kvm":
                vm = KvmInstance(ctx.bins, ctx.tmp, spec, pool_sock, self.tag, ctx.kvm)
            else:
                vm = SynthInstance(ctx.bins, ctx.tmp, spec, pool_sock, self.tag)
            vm.start(self.group)
            self.vms.append(vm)

    def now(self):
        return time.monotonic() - self.t0

    def sample(self, phase):
        k = ksmmod.counters() if self.cond.ksm else {}
        own = {"ksm_rmap_items": 0, "ksm_merging_pages": 0, "ksm_process_profit": 0}
        if self.cond.ksm:
            for vm in self.vms:
                st = ksm_stat(vm.pid)
                for key in own:
                    own[key] += st.get(key, 0)
        s = {"t_s": round(self.now(), 3), "phase": phase, "group_bytes": self.group.memory(),
             "pss_bytes": sum(pss_bytes(vm.pid) for vm in self.vms),
             "pool_pss_bytes": pss_bytes(self.pool.pid) if self.pool else 0,
             "group_cpu_s": round(self.group.cpu_seconds() - self.cpu0, 4),
             "ksmd_cpu_s": round(self.ctx.ksm.ksmd_cpu() - self.ksmd0, 3),
             "ksm_pages_sharing": own["ksm_merging_pages"],
             "ksm_full_scans": k.get("full_scans", self.full0) - self.full0,
             "ksm_meta_bytes": own["ksm_rmap_items"] * ksmmod.RMAP_ITEM_BYTES,
             "ksm_profit_bytes": own["ksm_process_profit"],
             "ksm_global_pages_sharing": k.get("pages_sharing", 0),
             "ksm_global_pages_shared": k.get("pages_shared", 0)}
        self.samples.append(s)
        return s

    def _tick(self, deadline):
        time.sleep(max(0.0, deadline - time.monotonic()))
        return deadline + TICK

    def wait_ready(self):
        """Sample until every instance is ready; KSM's window starts there."""
        waiting, nxt = list(self.vms), time.monotonic()
        while True:
            s = self.sample("fill")
            waiting = [vm for vm in waiting if not vm.poll_ready()]
            if not waiting:
                break
            if self.now() > self.ctx.args.ready_timeout:
                raise InstanceError(f"{len(waiting)} instance(s) not ready after "
                                    f"{self.ctx.args.ready_timeout} s (--ready-timeout)")
            self.progress("filling", s)
            nxt = self._tick(nxt)
        self.t_ready = self.now()
        if self.cond.ksm:
            self.check_mergeable()
            self.ctx.ksm.start()
            if ksmmod.read_knobs().get("run") != "1":
                raise InstanceError("KSM's run knob did not take 1")
        s = self.sample("window")
        self.ready_charge = s["group_bytes"]

    def check_mergeable(self):
        """KSM's first yes: the VMM madvised its guest RAM MADV_MERGEABLE (else KSM cannot help)."""
        for vm in self.vms:
            mg = mergeable_bytes(vm.pid)
            if mg < vm.spec.data_mib * MIB:
                raise InstanceError(f"{vm.name}: only {mg // MIB} MiB is MADV_MERGEABLE "
                                    f"(want its {vm.spec.data_mib} MiB of data at least)")

    def window(self, secs, until=None, phase="window"):
        """Sample for secs seconds (or until until(sample) is true); returns the last sample."""
        end, nxt = time.monotonic() + secs, time.monotonic() + TICK
        while True:
            nxt = self._tick(nxt)
            s = self.sample(phase)
            left = end - time.monotonic()
            self.progress(f"{max(0.0, left):5.1f} s left", s)
            if left <= 0 or (until and until(s)):
                break
        self.progress_end()
        if self.cond.ksm:
            self.ctx.ksm.stop()
        return s

    def progress(self, state, s):
        line = (f"  {self.cond.name:9} {self.workload:14} x{self.n:<2} {state:14} group "
                f"{s['group_bytes'] / MIB:7.1f} MiB  PSS {s['pss_bytes'] / MIB:7.1f} MiB")
        if self.cond.ksm:
            line += f"  full scans {s['ksm_full_scans']}"
        self.ctx.progress(line)

    def progress_end(self):
        self.ctx.progress(None)

    # -- checks after the window --
    def readback(self):
        """All instances read back in parallel; wall time of the slowest, and each one's."""
        res, errs = {}, []

        def one(vm):
            try:
                res[vm.name] = vm.readback()
            except (InstanceError, OSError) as e:
                errs.append(str(e))
        t = time.monotonic()
        ths = [threading.Thread(target=one, args=(vm,)) for vm in self.vms]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        if errs:
            raise InstanceError("readback: " + "; ".join(errs))
        return time.monotonic() - t, res

    def private_check(self):
        count = min(PRIVATE_PAGES, self.vms[0].spec.pages)
        for vm in self.vms:
            vm.private_write(count)
        for vm in self.vms:
            vm.private_check(count)
        return count

    def close(self):
        """Stop every process (clean exit expected), remove the group; returns problems."""
        if self.closed:
            return []
        self.closed = True
        bad = []
        for vm in self.vms:
            rc = vm.quit()
            if rc != 0:
                bad.append(f"{vm.name} exited with {rc}")
        if self.pool:
            rc = self.pool.stop()
            if rc != 0:
                bad.append(f"pool exited with {rc}")
        if self.cond.ksm:
            try:
                self.ctx.ksm.stop()
            except OSError as e:
                bad.append(f"ksm run=0: {e}")
        if not self.group.remove():
            bad.append(f"cgroup {self.group.name} still has processes: {self.group.pids()}")
        if self in self.ctx.live:
            self.ctx.live.remove(self)
        return bad


def reclaim_time(samples, ref_bytes, margin_bytes, t_from=0.0):
    """First sample time (>= t_from) from which the group stays <= ref - margin to the end."""
    limit, t = ref_bytes - margin_bytes, None
    for s in samples:
        if s["t_s"] < t_from:
            continue
        if s["group_bytes"] <= limit:
            t = s["t_s"] if t is None else t
        else:
            t = None
    return t


def figures(ses, ref):
    """The condition's figures from its samples; ref is the off charge at ready (or None)."""
    a, smp = ses.ctx.args, ses.samples
    end = smp[-1]
    at_ready = next(s for s in smp if s["phase"] == "window")
    margin = a.reclaim * MIB
    ref_bytes = ref if ref is not None else ses.ready_charge
    t_rec = reclaim_time(smp, ref_bytes, margin)
    t_own = reclaim_time(smp, ses.ready_charge, margin, ses.t_ready)
    return {
        "t_ready_s": round(ses.t_ready, 3),
        "ready_charge_mib": round(ses.ready_charge / MIB, 2),
        "reference_charge_mib": round(ref_bytes / MIB, 2),
        "reference": "off" if ref is not None else "own",
        "t_reclaim_s": t_rec,
        "t_reclaim_after_ready_s": None if t_rec is None else round(max(0.0, t_rec - ses.t_ready), 3),
        "t_reclaim_own_ready_s": None if t_own is None else round(t_own - ses.t_ready, 3),
        "end_charge_mib": round(end["group_bytes"] / MIB, 2),
        "peak_charge_mib": round(max(s["group_bytes"] for s in smp) / MIB, 2),
        "end_pss_mib": round(end["pss_bytes"] / MIB, 2),
        "end_pool_pss_mib": round(end["pool_pss_bytes"] / MIB, 2),
        "group_cpu_total_s": end["group_cpu_s"],
        "group_cpu_window_s": round(end["group_cpu_s"] - at_ready["group_cpu_s"], 4),
        "ksmd_cpu_s": end["ksmd_cpu_s"],
        "ksm_full_scans": end["ksm_full_scans"],
        "ksm_pages_sharing": end["ksm_pages_sharing"],
        "ksm_global_pages_sharing": end["ksm_global_pages_sharing"],
        "ksm_meta_mib": round(end["ksm_meta_bytes"] / MIB, 3),
        "window_s": round(end["t_s"] - ses.t_ready, 2),
        "n_samples": len(smp),
    }


def run_condition(ctx, cond, workload, n, ref):
    """Measure one condition; the result dict holds figures, checks and the samples."""
    tag = f"{workload}-{cond.name}-n{n}"
    res = {"condition": cond.name, "workload": workload, "instances": n, "excluded": None,
           "checks": {}, "samples": []}
    ses = None
    try:
        ses = Session(ctx, cond, workload, n, tag)
        res["samples"] = ses.samples
        ses.launch()
        ses.wait_ready()
        res["checks"]["ready"] = "ok"
        if cond.ksm:
            res["checks"]["ksm_two_yeses"] = "ok (MADV_MERGEABLE on guest RAM, run=1 in the window)"
        ses.window(ctx.args.window)
        res.update(figures(ses, ref))
        res["readback_s"], per = ses.readback()
        res["readback_each_s"] = {k: round(v, 3) for k, v in per.items()}
        res["checks"]["readback"] = "ok"
        res["checks"]["private_write"] = f"ok ({ses.private_check()} pages each)"
        res["limit_hits"] = ses.group.failcnt()
    except (InstanceError, OSError, StopIteration) as e:
        res["excluded"] = str(e) or type(e).__name__
    finally:
        if ses is not None:
            ses.progress_end()
            bad = ses.close()
            if bad and not res["excluded"]:
                res["excluded"] = "unclean exit: " + "; ".join(bad)
            res["checks"]["clean_exit"] = "ok" if not bad else "; ".join(bad)
    if res["excluded"]:
        print(f"  {cond.name} {workload} x{n}: EXCLUDED: {res['excluded']}", file=sys.stderr)
    return res
