# benchlib.py: helpers shared by the bench tests (t_ prefix): KSM knobs, leftovers, the program.
import fcntl
import os
import sys

SKIP = 77
KSM = "/sys/kernel/mm/ksm"


def t_skip(why):
    print(f"SKIP: {why}")
    sys.exit(SKIP)


def t_fail(why):
    print(f"FAIL: {why}")
    sys.exit(1)


def t_bench():
    """The build folder's pvisor-bench and the environment that points it at the binaries."""
    build = os.environ.get("PVISOR_BUILD")
    if not build:
        t_skip("PVISOR_BUILD is not set (run through meson test)")
    prog = os.path.join(build, "bench", "pvisor-bench")
    if not os.access(prog, os.X_OK):
        t_fail(f"{prog} is missing or not executable")
    return prog, dict(os.environ, PVISOR_BUILD=build)


def t_need_root():
    if os.geteuid() != 0:
        t_skip("needs root (memory cgroups, KSM knobs)")
    if not os.path.isfile(f"{KSM}/run"):
        t_skip("no /sys/kernel/mm/ksm in this kernel")
    try:
        with open("/run/lock/pvisor-bench.lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        t_skip("another pvisor-bench run holds /run/lock/pvisor-bench.lock (KSM is host-wide)")


def t_knobs():
    """Raw bytes of every writable KSM knob (by mode bits: root may write anything)."""
    out = {}
    for n in sorted(os.listdir(KSM)):
        p = f"{KSM}/{n}"
        if os.stat(p).st_mode & 0o200:
            with open(p, "rb") as f:
                out[n] = f.read()
    return out


def t_leftovers(bench_pid):
    """Processes and cgroups a pvisor-bench run with this pid left behind."""
    procs, groups = [], []
    tag = f"pvisor-bench.{bench_pid}.".encode()
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if comm in ("pvisor", "pvisor-pool") and tag in cmd:
            procs.append(f"{p} {comm}")
    for d in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup"):
        if os.path.isdir(d):
            groups += [f"{d}/{n}" for n in os.listdir(d) if n.startswith(f"pvisor-bench-{bench_pid}-")]
    return procs, groups
