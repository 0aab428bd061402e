# host.py: the host probes pvisor-bench reads: memory cgroups, per-process PSS and CPU, host facts.
"""Everything here reads or writes kernel files; nothing here starts a process."""
import os
import platform
import time

from . import MIB

CG_ROOT = "/sys/fs/cgroup"
PREFIX = "pvisor-bench"


def rd(path, default=None):
    """A kernel file's text without its trailing newline, or default if it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def wr(path, value):
    with open(path, "w") as f:
        f.write(str(value))


def clk_tck():
    return os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    """utime+stime of a process in seconds (all its threads), or None once it has gone."""
    st = rd(f"/proc/{pid}/stat")
    if st is None:
        return None
    fields = st.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / clk_tck()


def find_comm(name):
    """Pids whose /proc/PID/comm is exactly name."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and rd(f"/proc/{p}/comm") == name]


def pss_bytes(pid):
    """Proportional set size from /proc/PID/smaps_rollup (a shared page counts 1/sharers), or 0."""
    txt = rd(f"/proc/{pid}/smaps_rollup", "")
    for line in txt.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def mergeable_bytes(pid):
    """Bytes of the process's VMAs marked MADV_MERGEABLE ('mg' in VmFlags of /proc/PID/smaps)."""
    total, size = 0, 0
    for line in rd(f"/proc/{pid}/smaps", "").splitlines():
        if line.startswith("Size:"):
            size = int(line.split()[1]) * 1024
        elif line.startswith("VmFlags:") and "mg" in line.split()[1:]:
            total += size
    return total


def ksm_stat(pid):
    """/proc/PID/ksm_stat as a dict of ints (ksm_rmap_items, ksm_merging_pages, ...)."""
    out = {}
    for line in rd(f"/proc/{pid}/ksm_stat", "").splitlines():
        k, _, v = line.partition(" ")
        try:
            out[k] = int(v)
        except ValueError:
            pass
    return out


def mergeable_others(exclude=()):
    """Other processes with MADV_MERGEABLE memory: ksmd scans them too, in turn with ours,
    so they slow KSM's passes here and add to its global counters."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) in exclude:
            continue
        st = rd(f"/proc/{p}/ksm_stat", "")
        if "ksm_mergeable: yes" not in st and "ksm_merge_any: yes" not in st:
            continue
        out.append({"pid": int(p), "comm": rd(f"/proc/{p}/comm", "?"),
                    "mergeable_mib": round(mergeable_bytes(int(p)) / MIB, 1),
                    "ksm_rmap_items": ksm_stat(int(p)).get("ksm_rmap_items", 0)})
    return out


def cgroup_v1():
    return os.path.isdir(f"{CG_ROOT}/memory") and os.path.isfile(f"{CG_ROOT}/memory/cgroup.procs")


def leftover_groups(tag=""):
    """Bench cgroups still present (for the tests and for a start-up warning)."""
    dirs = [f"{CG_ROOT}/memory", f"{CG_ROOT}/cpuacct"] if cgroup_v1() else [CG_ROOT]
    return [os.path.join(d, n) for d in dirs if os.path.isdir(d)
            for n in os.listdir(d) if n.startswith(PREFIX + tag)]


class Group:
    """One memory cgroup (plus cpuacct on v1) made for one condition, with a limit and no swap.

    v1 (this host): memory.usage_in_bytes, memory.limit_in_bytes, memory.memsw.limit_in_bytes
    set to the same limit (no swap), cpuacct.usage. v2: memory.current, memory.max,
    memory.swap.max = 0, cpu.stat usage_usec.
    """

    def __init__(self, name, limit_bytes):
        self.name = f"{PREFIX}-{name}"
        self.v1 = cgroup_v1()
        if self.v1:
            self.mem = f"{CG_ROOT}/memory/{self.name}"
            self.cpu = f"{CG_ROOT}/cpuacct/{self.name}"
        else:
            self.mem = self.cpu = f"{CG_ROOT}/{self.name}"
        self.made = []
        for d in dict.fromkeys((self.mem, self.cpu)):
            os.makedirs(d)
            self.made.append(d)
        self.limit = limit_bytes
        if self.v1:
            wr(f"{self.mem}/memory.limit_in_bytes", limit_bytes)
            if os.path.exists(f"{self.mem}/memory.memsw.limit_in_bytes"):
                wr(f"{self.mem}/memory.memsw.limit_in_bytes", limit_bytes)
            wr(f"{self.mem}/memory.swappiness", 0)
        else:
            wr(f"{self.mem}/memory.max", limit_bytes)
            if os.path.exists(f"{self.mem}/memory.swap.max"):
                wr(f"{self.mem}/memory.swap.max", 0)

    def enter(self):
        """Runs in a child before exec, so that every page it touches is charged here."""
        wr(f"{self.mem}/cgroup.procs", os.getpid())
        if self.cpu != self.mem:
            wr(f"{self.cpu}/cgroup.procs", os.getpid())

    def memory(self):
        return int(rd(f"{self.mem}/memory.usage_in_bytes" if self.v1 else f"{self.mem}/memory.current", "0"))

    def cpu_seconds(self):
        if self.v1:
            return int(rd(f"{self.cpu}/cpuacct.usage", "0")) / 1e9
        for line in rd(f"{self.mem}/cpu.stat", "").splitlines():
            k, _, v = line.partition(" ")
            if k == "usage_usec":
                return int(v) / 1e6
        return 0.0

    def failcnt(self):
        """How often the group hit its limit (v1 memory.failcnt, v2 memory.events max)."""
        if self.v1:
            return int(rd(f"{self.mem}/memory.failcnt", "0"))
        for line in rd(f"{self.mem}/memory.events", "").splitlines():
            k, _, v = line.partition(" ")
            if k == "max":
                return int(v)
        return 0

    def pids(self):
        txt = rd(f"{self.mem}/cgroup.procs", "")
        return [int(p) for p in txt.split()]

    def remove(self):
        """Remove the directories; waits up to 5 s for exiting processes to leave."""
        for d in reversed(self.made):
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
        self.made = [d for d in self.made if os.path.isdir(d)]
        return not self.made


def host_facts():
    mem = rd("/proc/meminfo", "").splitlines()
    total = next((int(l.split()[1]) * 1024 for l in mem if l.startswith("MemTotal:")), 0)
    model = next((l.split(":", 1)[1].strip() for l in rd("/proc/cpuinfo", "").splitlines()
                  if l.startswith("model name")), "")
    return {"hostname": platform.node(), "kernel": platform.release(),
            "kernel_version": platform.version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "cpu_model": model, "mem_total_mib": round(total / MIB, 1),
            "cgroup": "v1" if cgroup_v1() else "v2", "kvm": os.path.exists("/dev/kvm"),
            "thp": rd("/sys/kernel/mm/transparent_hugepage/enabled"),
            "vm_max_map_count": rd("/proc/sys/vm/max_map_count"),
            "python": platform.python_version()}
