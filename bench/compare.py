#!/usr/bin/env python3
"""compare.py: quick side-by-side of pvisor's memory modes against KSM on one host, in one run.

For each condition (off, ksm, physical) and workload, it starts N synthetic VMs
(and the pool, for physical) inside one fresh memory+cpuacct cgroup, then
samples every 100 ms for a window:
  - group charged memory (cgroup v1 memory.usage_in_bytes, v2 memory.current)
  - group CPU seconds (cpuacct.usage), and ksmd's CPU from /proc/PID/stat,
    which is outside any group and is reported beside it, never dropped
  - KSM's pages_sharing and full_scans
CPU counts from launch to the end of the window; 'dedup CPU' is the group's
plus ksmd's CPU minus what the same VMs used with dedup off (writing and
verifying the data is the same work in every condition).
Time to reclaim is the first sample from which the group stays at least
--reclaim MiB below the reference charge (the 'off' condition's charge once
all VMs were ready, measured in the same run) until the window ends. Times
are seconds since the VMs were launched; 'after ready' subtracts the moment
every VM had written and verified its data. Each VM's data is read back in
full and verified after the window; a condition that fails is marked
excluded and its numbers are not compared.

KSM is run at the kernel's defaults unless flags say otherwise; every knob is
recorded before and restored after (run=2 unmerges, then run=0).

Usage: bench/compare.py [--vms 4] [--data 64] [--mem 256] [--window 60]
                        [--workloads shared-random,unique-random]
                        [--conditions off,ksm,physical] [--out DIR]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20
KSM = "/sys/kernel/mm/ksm"
KSM_KNOBS = ["run", "pages_to_scan", "sleep_millisecs", "use_zero_pages", "merge_across_nodes",
             "max_page_sharing"]
TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rd(path, default=None):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def wr(path, value):
    with open(path, "w") as f:
        f.write(str(value))


def ksmd_cpu():
    """ksmd's utime+stime in seconds, or 0 if there is no ksmd."""
    for pid in os.listdir("/proc"):
        if pid.isdigit() and rd(f"/proc/{pid}/comm") == "ksmd":
            fields = rd(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


class Group:
    """A memory and a cpuacct cgroup with the same name; v1 layout (this host), v2 fallback."""

    def __init__(self, name):
        self.v1 = os.path.isdir("/sys/fs/cgroup/memory")
        if self.v1:
            self.mem = f"/sys/fs/cgroup/memory/{name}"
            self.cpu = f"/sys/fs/cgroup/cpuacct/{name}"
            for d in (self.mem, self.cpu):
                os.makedirs(d, exist_ok=True)
        else:
            self.mem = self.cpu = f"/sys/fs/cgroup/{name}"
            os.makedirs(self.mem, exist_ok=True)

    def enter(self):
        """Called in a child before exec, so that every page it touches is charged here."""
        wr(f"{self.mem}/cgroup.procs", os.getpid())
        if self.cpu != self.mem:
            wr(f"{self.cpu}/cgroup.procs", os.getpid())

    def memory(self):
        return int(rd(f"{self.mem}/memory.usage_in_bytes" if self.v1 else f"{self.mem}/memory.current"))

    def cpu_seconds(self):
        if self.v1:
            return int(rd(f"{self.cpu}/cpuacct.usage")) / 1e9
        for line in rd(f"{self.mem}/cpu.stat").splitlines():
            k, v = line.split()
            if k == "usage_usec":
                return int(v) / 1e6
        return 0.0

    def remove(self):
        for d in {self.mem, self.cpu}:
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except OSError:
                    time.sleep(0.1)


class Run:
    def __init__(self, args, tmp):
        self.args, self.tmp = args, tmp
        self.pool_bin = os.path.join(args.build, "pool", "pvisor-pool")
        self.vmm_bin = os.path.join(args.build, "vmm", "pvisor")

    def ctl(self, vm, *words, timeout=120):
        p = subprocess.run([self.vmm_bin, "ctl", "--api-sock", f"{self.tmp}/{vm}.sock", *words],
                           capture_output=True, text=True, timeout=timeout)
        try:
            return p.returncode, json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return p.returncode or 1, {"error": p.stdout + p.stderr}

    def condition(self, cond, workload, reference):
        a, names = self.args, [f"vm{i}" for i in range(self.args.vms)]
        group = Group(f"pvisor-bench-{os.getpid()}-{cond}")
        procs, logs, res = [], [], {"condition": cond, "workload": workload, "excluded": None}
        try:
            sock = f"{self.tmp}/pool.sock"
            if cond == "physical":
                conf = f"{self.tmp}/pool.conf"
                open(conf, "w").close()
                logs.append(open(f"{self.tmp}/pool-{workload}.log", "w"))
                procs.append(subprocess.Popen([self.pool_bin, "--config", conf, "--socket", sock],
                                              stdout=logs[-1], stderr=subprocess.STDOUT,
                                              preexec_fn=group.enter))
                self.wait_for(lambda: subprocess.run([self.pool_bin, "stat", "--socket", sock],
                                                     capture_output=True).returncode == 0, 10, "pool")
            if cond == "ksm":
                wr(f"{KSM}/run", 1)
            cpu0, ksmd0, t0 = group.cpu_seconds(), ksmd_cpu(), time.monotonic()
            full0 = int(rd(f"{KSM}/full_scans", "0"))
            for i, vm in enumerate(names):
                logs.append(open(f"{self.tmp}/{vm}-{cond}-{workload}.log", "w"))
                procs.append(subprocess.Popen(
                    [self.vmm_bin, "run", "--guest", "synthetic", "--name", vm, "--dedup", cond,
                     "--pool", sock, "--api-sock", f"{self.tmp}/{vm}.sock", "--mem", f"{a.mem}M",
                     "--workload", workload, "--data-size", f"{a.data}M", "--seed", "42",
                     "--instance", str(i)],
                    stdout=logs[-1], stderr=subprocess.STDOUT, preexec_fn=group.enter))
            samples, t_ready = [], None
            while True:
                now = time.monotonic() - t0
                samples.append((now, group.memory(), group.cpu_seconds() - cpu0,
                                ksmd_cpu() - ksmd0, int(rd(f"{KSM}/pages_sharing", "0"))))
                if t_ready is None and all(self.ready(vm) for vm in names):
                    t_ready = now
                    res["ready_charge_mib"] = samples[-1][1] / MIB
                if t_ready is None and now > 120:
                    raise RuntimeError("VMs not ready after 120 s")
                if t_ready is not None and now >= t_ready + a.window:
                    break
                self.progress(cond, workload, t_ready, now, samples[-1][1])
                time.sleep(0.1)
            sys.stderr.write("\n")
            res.update(self.figures(samples, t_ready, reference))
            res["ksm_full_scans"] = int(rd(f"{KSM}/full_scans", "0")) - full0
            res["readback_s"] = self.readback(names, workload)
            res["samples"] = samples
        except Exception as e:  # a failed condition is reported, never mixed in
            res["excluded"] = str(e)
        finally:
            for p in reversed(procs):
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
            for f in logs:
                f.close()
            if cond == "ksm":
                wr(f"{KSM}/run", 2)
                wr(f"{KSM}/run", 0)
            group.remove()
        return res

    def ready(self, vm):
        rc, j = self.ctl(vm, "stats", timeout=10)
        return rc == 0 and j.get("ready", False)

    def readback(self, names, workload):
        t = time.monotonic()
        for i, vm in enumerate(names):
            rc, j = self.ctl(vm, "verify", "0", str(self.args.data * 256), workload, "42", str(i))
            if rc != 0:
                raise RuntimeError(f"{vm} read back wrong bytes: {j}")
        return time.monotonic() - t

    def figures(self, samples, t_ready, reference):
        end = samples[-1]
        out = {"t_ready_s": t_ready, "end_charge_mib": end[1] / MIB, "group_cpu_s": end[2],
               "ksmd_cpu_s": end[3], "ksm_pages_sharing": end[4], "t_reclaim_s": None}
        if reference is not None:
            ref_mib, ref_cpu = reference
            out["dedup_cpu_s"] = end[2] + end[3] - ref_cpu
            limit = ref_mib * MIB - self.args.reclaim * MIB
            t = None
            for s in samples:  # first sample from which it stays below the limit
                if s[1] <= limit:
                    t = s[0] if t is None else t
                else:
                    t = None
            out["t_reclaim_s"] = t
            out["saved_mib"] = ref_mib - end[1] / MIB
        return out

    def progress(self, cond, workload, t_ready, now, mem):
        left = "filling" if t_ready is None else f"{t_ready + self.args.window - now:5.1f} s left"
        line = f"  {cond:9} {workload:14} {left:14} group {mem / MIB:7.1f} MiB"
        if sys.stderr.isatty():
            sys.stderr.write("\r" + line)
        elif int(now / 5) != int((now - 0.1) / 5):  # a line every 5 s in a log
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def wait_for(self, pred, secs, what):
        end = time.monotonic() + secs
        while time.monotonic() < end:
            if pred():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{what} did not start")


def table(results):
    head = f"{'workload':14} {'condition':9} {'ready s':>8} {'reclaim s':>10} {'after ready':>11} " \
           f"{'end MiB':>8} {'saved MiB':>9} {'group CPU s':>11} {'ksmd CPU s':>10} {'dedup CPU s':>11} " \
           f"{'readback s':>10}"
    lines = [head, "-" * len(head)]
    for r in results:
        if r["excluded"]:
            lines.append(f"{r['workload']:14} {r['condition']:9} EXCLUDED: {r['excluded']}")
            continue
        rec = r["t_reclaim_s"]
        rec_s = "not reached" if rec is None else f"{rec:.2f}"
        aft = "-" if rec is None else f"{max(0.0, rec - r['t_ready_s']):.2f}"
        lines.append(f"{r['workload']:14} {r['condition']:9} {r['t_ready_s']:8.2f} {rec_s:>10} {aft:>11} "
                     f"{r['end_charge_mib']:8.1f} {r.get('saved_mib', 0.0):9.1f} {r['group_cpu_s']:11.2f} "
                     f"{r['ksmd_cpu_s']:10.2f} {r.get('dedup_cpu_s', 0.0):11.2f} {r['readback_s']:10.2f}")
    lines.append("")
    for wl in dict.fromkeys(r["workload"] for r in results):
        by = {r["condition"]: r for r in results if r["workload"] == wl and not r["excluded"]}
        k, p = by.get("ksm"), by.get("physical")
        if not k or not p:
            continue
        kt, pt = k["t_reclaim_s"], p["t_reclaim_s"]
        if kt is not None and pt is not None:
            when = f"reclaimed {pt:.2f} s vs {kt:.2f} s ({kt / max(pt, 0.1):.0f}x sooner)"
        else:
            when = f"reclaimed {'-' if pt is None else f'{pt:.2f} s'} vs {'-' if kt is None else f'{kt:.2f} s'}"
        lines.append(f"{wl}: physical against KSM: {when}, end memory {p['end_charge_mib']:.1f} vs "
                     f"{k['end_charge_mib']:.1f} MiB ({p['end_charge_mib'] - k['end_charge_mib']:+.1f}), "
                     f"dedup CPU {p.get('dedup_cpu_s', 0):.2f} vs {k.get('dedup_cpu_s', 0):.2f} s")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vms", type=int, default=4)
    ap.add_argument("--data", type=int, default=64, help="MiB of workload data per VM")
    ap.add_argument("--mem", type=int, default=256, help="MiB of guest RAM per VM")
    ap.add_argument("--window", type=float, default=60.0, help="seconds sampled after all VMs are ready")
    ap.add_argument("--reclaim", type=int, default=128, help="MiB below the off charge that counts as reclaimed")
    ap.add_argument("--workloads", default="shared-random,unique-random")
    ap.add_argument("--conditions", default="off,ksm,physical")
    ap.add_argument("--build", default=os.path.join(TOP, "build"))
    ap.add_argument("--out", default=None, help="folder for summary.json and CSV series")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("compare.py: needs root (cgroups and KSM knobs)")
    conds = a.conditions.split(",")
    if conds[0] != "off":
        conds.insert(0, "off")  # the reference charge comes from off
    knobs = {k: rd(f"{KSM}/{k}") for k in KSM_KNOBS if rd(f"{KSM}/{k}") is not None}
    tmp = tempfile.mkdtemp(prefix="pvisor-bench.")
    run, results = Run(a, tmp), []
    try:
        for wl in a.workloads.split(","):
            ref = None
            for c in conds:
                print(f"== {wl} / {c}", file=sys.stderr)
                r = run.condition(c, wl, ref)
                if c == "off" and not r["excluded"]:
                    ref = (r["ready_charge_mib"], r["group_cpu_s"])
                    r["t_reclaim_s"], r["dedup_cpu_s"], r["saved_mib"] = None, 0.0, 0.0
                results.append(r)
    finally:
        for k, v in knobs.items():
            if k != "run":
                try:
                    wr(f"{KSM}/{k}", v)
                except OSError:
                    pass
        wr(f"{KSM}/run", knobs.get("run", "0"))
    print(table(results))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        for r in results:
            with open(os.path.join(a.out, f"{r['workload']}-{r['condition']}.csv"), "w") as f:
                f.write("t_s,group_bytes,group_cpu_s,ksmd_cpu_s,ksm_pages_sharing\n")
                for s in r.pop("samples", []):
                    f.write(",".join(str(x) for x in s) + "\n")
        with open(os.path.join(a.out, "summary.json"), "w") as f:
            json.dump({"command": sys.argv, "kernel": os.uname().release, "ksm_knobs": knobs,
                       "results": results}, f, indent=1)
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if any(r["excluded"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
