# cli.py: pvisor-bench's command line: flags, subcommands, the run loop, cleanup on any exit.
"""Subcommands: run (default), ksm-patterns, ksm-zeros. Whatever happens (an error, Ctrl-C,
SIGTERM), every process is stopped, every cgroup removed and every KSM knob restored."""
import argparse
import datetime
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from . import VERSION, classic, plot, report
from .guest import stop_process
from .host import host_facts, leftover_groups, mergeable_others
from .ksm import KERNEL_DEFAULTS, Ksm, available as ksm_available
from .run import CONDITIONS, LATER, run_condition

WORKLOADS = ["repeated", "shared-random", "unique-random", "zeros", "patterns"]
DEFAULT_WORKLOADS = "repeated,shared-random,unique-random"
SUBCOMMANDS = {"run": "the side-by-side benchmark (default)",
               "ksm-patterns": "1 GiB of four page patterns: KSM after two full passes, then copy-on-write",
               "ksm-zeros": "512 MiB of zero pages: KSM use_zero_pages=0 and =1 against pvisor's discard"}
EXIT_USAGE = 2


class Parser(argparse.ArgumentParser):
    """Errors name the allowed flags or values and exit 2."""

    def error(self, message):
        if "unrecognized arguments" in message:
            flags = sorted(o for a in self._actions for o in a.option_strings if o.startswith("--"))
            message += "; allowed flags: " + ", ".join(flags)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def csv_list(allowed, what):
    def parse(text):
        items = [x.strip() for x in text.split(",") if x.strip()]
        if text.strip() == "all":
            return list(allowed)
        bad = [x for x in items if x not in allowed]
        if bad or not items:
            later = [x for x in bad if x in LATER]
            hint = f" ({', '.join(f'{x}: {LATER[x]}, not in this version' for x in later)})" if later else ""
            raise argparse.ArgumentTypeError(
                f"unknown {what} '{','.join(bad) or text}'{hint}; allowed: {','.join(allowed)} or all")
        return list(dict.fromkeys(items))
    return parse


def counts(text):
    try:
        v = sorted({int(x) for x in text.split(",")})
    except ValueError:
        v = []
    if not v or v[0] < 1 or v[-1] > 64:
        raise argparse.ArgumentTypeError(f"'{text}' is not a list of instance counts 1..64 such as 1,2,4,8")
    return v


def positive(kind):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            v = -1
        if v <= 0:
            raise argparse.ArgumentTypeError(f"'{text}' is not a positive number")
        return v
    return parse


def nonneg_int(text):
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number >= 0")
    return int(text)


# (flag, type, default, --quick default, help); None defaults are filled per subcommand.
RUN_FLAGS = [
    ("--vms", positive(int), 4, 2, "instances in the group"),
    ("--data", positive(int), 64, 8, "MiB of workload data per instance"),
    ("--mem", positive(int), 256, 32, "MiB of guest RAM per instance"),
    ("--limit", positive(int), 2048, 2048, "MiB memory limit of the group (no swap)"),
    ("--window", positive(float), 60.0, 3.0, "seconds sampled after every instance is ready"),
    ("--reclaim", positive(int), 128, 4, "MiB below the unshared charge that counts as reclaimed"),
]


def add_common(p, sub):
    g = p.add_argument_group("host and output")
    g.add_argument("--guest", choices=["synthetic", "kvm"], default="synthetic",
                   help="synthetic: host-driven guests; kvm: pvisor-guest in KVM guests (needs /dev/kvm) "
                        "(default: synthetic)")
    g.add_argument("--kernel", help="guest kernel for --guest kvm (default: out/images/kernel/vmlinuz)")
    g.add_argument("--initrd", help="initrd with pvisor-guest for --guest kvm (default: out/images/initrd.img)")
    g.add_argument("--cmdline", default="console=ttyS0 quiet",
                   help="kernel command line before the pvg.* words (default: 'console=ttyS0 quiet')")
    g.add_argument("--build", help="folder with vmm/pvisor and pool/pvisor-pool (default: $PVISOR_BUILD, "
                                   "else the build folder this program lives in, else <source>/build)")
    g.add_argument("--out", help="results folder (default: ./pvisor-bench-" + sub + "-DATE-TIME)")
    g.add_argument("--no-plots", action="store_true", help="skip the gnuplot figures (default: draw them)")
    g.add_argument("--ready-timeout", type=positive(float), default=300.0,
                   help="seconds an instance may take to write and verify its data (default: 300)")
    k = p.add_argument_group("KSM (the defaults are the kernel's; every knob is restored after the run)")
    k.add_argument("--ksm-pages-to-scan", type=positive(int), default=KERNEL_DEFAULTS["pages_to_scan"],
                   help=f"pages ksmd scans per wake-up (default: {KERNEL_DEFAULTS['pages_to_scan']})")
    k.add_argument("--ksm-sleep-ms", type=nonneg_int, default=KERNEL_DEFAULTS["sleep_millisecs"],
                   help=f"ksmd's sleep between wake-ups (default: {KERNEL_DEFAULTS['sleep_millisecs']})")
    k.add_argument("--ksm-zero-pages", type=int, choices=[0, 1], default=KERNEL_DEFAULTS["use_zero_pages"],
                   help=f"use_zero_pages (default: {KERNEL_DEFAULTS['use_zero_pages']})")


def run_parser(prog):
    p = Parser(prog=prog, description="Side-by-side: how much memory a group of microVMs costs under each "
                                      "memory mode, how fast it is reclaimed, and at what CPU.")
    g = p.add_argument_group("group and window")
    for flag, typ, dflt, quick, hlp in RUN_FLAGS:
        g.add_argument(flag, type=typ, default=None, help=f"{hlp} (default: {dflt}; --quick: {quick})")
    g.add_argument("--workloads", type=csv_list(WORKLOADS, "workload"), default=None,
                   help=f"comma list of {','.join(WORKLOADS)} or all (default: {DEFAULT_WORKLOADS}; "
                        f"--quick: shared-random,unique-random)")
    g.add_argument("--conditions", type=csv_list(list(CONDITIONS), "condition"),
                   default=list(CONDITIONS),
                   help=f"comma list of {','.join(CONDITIONS)} (default: {','.join(CONDITIONS)}; off is "
                        f"always measured: it is the reference)")
    g.add_argument("--sweep", type=counts, nargs="?", const=[1, 2, 4, 8], default=None,
                   help="also run every condition with these instance counts (marginal cost of one more "
                        "VM; default when given without a value: 1,2,4,8; default: no sweep)")
    g.add_argument("--quick", action="store_true",
                   help="a short run (small sizes, 3 s windows) that checks the benchmark end to end")
    add_common(p, "run")
    return p


def classic_parser(prog, sub):
    zeros = sub == "ksm-zeros"
    p = Parser(prog=f"{prog} {sub}", description=SUBCOMMANDS[sub])
    g = p.add_argument_group("experiment")
    g.add_argument("--data", type=positive(int), default=512 if zeros else 1024,
                   help=f"MiB of data (default: {512 if zeros else 1024})")
    g.add_argument("--mem", type=positive(int), default=None, help="MiB of guest RAM (default: --data)")
    g.add_argument("--limit", type=positive(int), default=2048, help="MiB limit of the group (default: 2048)")
    g.add_argument("--window", type=positive(float), default=30.0 if zeros else 10.0,
                   help="seconds sampled after ready" + (" for each setting (default: 30)" if zeros else
                        " in physical mode (default: 10)"))
    if not zeros:
        g.add_argument("--max-wait", type=positive(float), default=600.0,
                       help="most seconds to wait for KSM's two full passes (default: 600)")
        g.add_argument("--after", type=positive(float), default=5.0,
                       help="seconds sampled after the write to every page (default: 5)")
    g.add_argument("--conditions", type=csv_list(["ksm", "physical"], "condition"), default=["ksm", "physical"],
                   help="comma list of ksm,physical (default: ksm,physical)")
    g.add_argument("--reclaim", type=positive(int), default=128, help=argparse.SUPPRESS)
    add_common(p, sub)
    return p


def top_help(prog):
    lines = [f"usage: {prog} [run] [--flags]   |   {prog} ksm-patterns [--flags]   |   {prog} ksm-zeros [--flags]",
             "", "subcommands:"]
    lines += [f"  {k:13} {v}" for k, v in SUBCOMMANDS.items()]
    lines += ["", f"'{prog} SUBCOMMAND --help' lists the subcommand's flags. Flags of run:", ""]
    return "\n".join(lines) + "\n" + run_parser(prog).format_help()


def resolve(a, sub):
    """Fill run's defaults (plain or --quick); off first, since it is the reference."""
    if sub != "run":
        a.mem = a.mem or a.data
        a.vms = 1
        return a
    for flag, _, dflt, quick, _ in RUN_FLAGS:
        key = flag[2:].replace("-", "_")
        if getattr(a, key) is None:
            setattr(a, key, quick if a.quick else dflt)
    if a.workloads is None:
        a.workloads = ["shared-random", "unique-random"] if a.quick else DEFAULT_WORKLOADS.split(",")
    if "off" not in a.conditions:
        a.conditions.insert(0, "off")
    a.conditions.sort(key=lambda c: c != "off")
    return a


LOCK = "/run/lock/pvisor-bench.lock"


def host_lock():
    """One run per host: an flock held until exit; None if another run holds it."""
    os.makedirs(os.path.dirname(LOCK), exist_ok=True)
    f = open(LOCK, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


class Bins:
    def __init__(self, build):
        self.build = build
        self.vmm = os.path.join(build, "vmm", "pvisor")
        self.pool = os.path.join(build, "pool", "pvisor-pool")

    def missing(self):
        return [b for b in (self.vmm, self.pool) if not os.access(b, os.X_OK)]

    def version(self):
        p = subprocess.run([self.vmm, "--version"], capture_output=True, text=True)
        return (p.stdout or p.stderr).strip()


def find_build(a, here):
    if a.build:
        return a.build
    if os.environ.get("PVISOR_BUILD"):
        return os.environ["PVISOR_BUILD"]
    up = os.path.dirname(here)
    if os.path.exists(os.path.join(up, "vmm", "pvisor")):
        return up
    return os.path.join(up, "build")


class Ctx:
    """What every condition shares: flags, binaries, temp folder, KSM, live sessions."""

    def __init__(self, a, bins, tmp, ksm):
        self.args, self.bins, self.tmp, self.ksm = a, bins, tmp, ksm
        self.pid = os.getpid()
        self.live = []
        self.kvm = None
        self.tty = sys.stderr.isatty()
        self._last = 0.0
        self.ksm_settings = {"pages_to_scan": a.ksm_pages_to_scan, "sleep_millisecs": a.ksm_sleep_ms,
                             "use_zero_pages": a.ksm_zero_pages}

    def progress(self, line):
        """A line that rewrites itself on a terminal, one line every 5 s in a log; None ends it."""
        import time
        if line is None:
            if self.tty:
                sys.stderr.write("\n")
            return
        if self.tty:
            sys.stderr.write("\r" + line[:150].ljust(150))
        elif time.monotonic() - self._last >= 5:
            self._last = time.monotonic()
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


class Interrupted(BaseException):
    pass


def on_signal(signum, frame):
    raise Interrupted(f"signal {signal.Signals(signum).name}")


def kvm_config(a, src):
    if not os.path.exists("/dev/kvm"):
        return None, ("--guest kvm needs /dev/kvm, which this host does not have; "
                      "use --guest synthetic (the default) or run inside a KVM-capable host")
    kernel = a.kernel or os.path.join(src, "out", "images", "kernel", "vmlinuz")
    initrd = a.initrd or os.path.join(src, "out", "images", "initrd.img")
    for f in (kernel, initrd):
        if not os.path.exists(f):
            return None, f"--guest kvm: {f} does not exist (--kernel / --initrd)"
    hold = a.window + a.ready_timeout + 120
    return {"kernel": kernel, "initrd": initrd, "cmdline": a.cmdline, "hold": hold}, None


def measure_run(ctx):
    a, results = ctx.args, []
    counts_ = sorted(set([a.vms] + (a.sweep or [])))
    for wl in a.workloads:
        for n in counts_:
            ref = None
            for c in a.conditions:
                print(f"== {wl} / {c} / {n} instance{'s' if n > 1 else ''}", file=sys.stderr)
                ctx.ksm.settle(ctx.ksm_settings)
                r = run_condition(ctx, CONDITIONS[c], wl, n, ref)
                if c == "off" and not r["excluded"]:
                    ref = r["ready_charge_mib"] * (1 << 20)
                results.append(r)
    return results


def cleanup(ctx, ksm):
    """Stop what is still running; restore KSM. Signals are held off meanwhile."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
    problems = []
    try:
        for ses in list(ctx.live if ctx else []):
            problems += ses.close()
        if ksm is not None:
            diff = ksm.restore()
            if diff:
                problems.append(f"KSM knobs not restored: {diff} ({ksm.errors}); "
                                f"recorded values: {ksm.saved}")
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return problems


def main(argv, here):
    prog = "pvisor-bench"
    sub = "run"
    if argv and argv[0] in SUBCOMMANDS:
        sub, argv = argv[0], argv[1:]
    elif argv and argv[0] in ("-h", "--help"):
        sys.stdout.write(top_help(prog))
        return 0
    elif argv and not argv[0].startswith("-"):
        sys.stderr.write(f"{prog}: unknown subcommand '{argv[0]}'; allowed: {', '.join(SUBCOMMANDS)}\n")
        return EXIT_USAGE
    a = (run_parser(prog) if sub == "run" else classic_parser(prog, sub)).parse_args(argv)
    a = resolve(a, sub)
    if os.geteuid() != 0:
        sys.stderr.write(f"{prog}: needs root (memory cgroups and KSM knobs)\n")
        return EXIT_USAGE
    bins = Bins(find_build(a, here))
    if bins.missing():
        sys.stderr.write(f"{prog}: {', '.join(bins.missing())} not found; build pvisor (ninja -C build) "
                         f"or point --build / PVISOR_BUILD at a build folder\n")
        return EXIT_USAGE
    if not ksm_available() and any(c == "ksm" for c in a.conditions):
        sys.stderr.write(f"{prog}: this kernel has no /sys/kernel/mm/ksm; drop ksm from --conditions\n")
        return EXIT_USAGE
    src = os.path.dirname(os.path.dirname(here)) if os.path.basename(here) == "bench" else here
    kvm = None
    if a.guest == "kvm":
        kvm, why = kvm_config(a, os.path.dirname(here))
        if why:
            sys.stderr.write(f"{prog}: {why}\n")
            return EXIT_USAGE
    if not a.no_plots and not plot.have_gnuplot():
        sys.stderr.write(f"{prog}: gnuplot not found (apt-get install gnuplot-nox), or pass --no-plots\n")
        return EXIT_USAGE
    lock = host_lock()
    if lock is None:
        sys.stderr.write(f"{prog}: another pvisor-bench is running ({LOCK}); KSM and the host's memory are "
                         f"shared, so runs cannot overlap: wait for it to end\n")
        return EXIT_USAGE
    out = a.out or f"pvisor-bench-{sub}-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    os.makedirs(out, exist_ok=True)
    stale = leftover_groups()
    if stale:
        sys.stderr.write(f"{prog}: note: cgroups of an earlier run are still there: {stale}\n")
    return execute(sub, a, bins, out, kvm, src)


def execute(sub, a, bins, out, kvm, src):
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    tmp = tempfile.mkdtemp(prefix=f"pvisor-bench.{os.getpid()}.")
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    ksm = ctx = None
    results, problems, interrupted = [], [], None
    others = mergeable_others({os.getpid()})
    if others:
        sys.stderr.write("pvisor-bench: WARNING: other processes have MADV_MERGEABLE memory; ksmd scans "
                         "them in turn with the benchmark's, so KSM's passes here are slower than on a "
                         "quiet host: " + ", ".join(f"{o['comm']} (pid {o['pid']}, {o['mergeable_mib']} MiB)"
                                                     for o in others) + "\n")
    try:
        ksm = Ksm()
        ctx = Ctx(a, bins, tmp, ksm)
        ctx.kvm = kvm
        if sub == "run":
            results = measure_run(ctx)
        elif sub == "ksm-patterns":
            results = classic.patterns(ctx)
        else:
            results = classic.zeros(ctx)
    except (KeyboardInterrupt, Interrupted) as e:
        interrupted = str(e) or "Ctrl-C"
    finally:
        problems = cleanup(ctx, ksm)
        shutil.rmtree(tmp, ignore_errors=True)
    if interrupted:
        sys.stderr.write(f"pvisor-bench: interrupted ({interrupted}); processes stopped, cgroups removed, "
                         f"KSM knobs {'NOT restored: ' + '; '.join(problems) if problems else 'restored'}\n")
        return 130
    return finish(sub, a, bins, out, results, ksm, started, problems, others)


def finish(sub, a, bins, out, results, ksm, started, problems, others):
    report.write_csvs(out, results, a.vms)
    report.add_sharing_cpu(results)
    sweep = report.sweep_summary(results, a.sweep) if getattr(a, "sweep", None) else None
    tg = report.targets(results, a.vms, a.reclaim) if sub == "run" else None
    summary = {"tool": "pvisor-bench", "tool_version": VERSION, "subcommand": sub,
               "command": sys.argv, "cwd": os.getcwd(), "started": started,
               "finished": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
               "pvisor_version": bins.version(), "build": os.path.abspath(bins.build),
               "host": dict(host_facts(), ksm_other_mergeable=others,
                            loadavg=open("/proc/loadavg").read().split()[:3]),
               "kernel": os.uname().release,
               "params": {k: v for k, v in vars(a).items()},
               "ksm": {"before": ksm.saved, "used": {**{"advisor_mode": "none"}, **_used(a)},
                       "after": ksm.saved if not problems else None, "restored": not problems,
                       "kernel_defaults": KERNEL_DEFAULTS},
               "results": results, "sweep": sweep, "targets": tg, "problems": problems, "plots": []}
    if sub == "run":
        text = report.table(results, a.reclaim)
        if sweep:
            text += "\n\n" + report.sweep_table(sweep)
        text += "\n\n" + report.targets_table(tg)
    elif sub == "ksm-patterns":
        text = classic.patterns_table(results)
    else:
        text = classic.zeros_table(results, a.reclaim)
    if not a.no_plots:
        try:
            conds = a.conditions if sub == "run" else list(dict.fromkeys(r["condition"] for r in results))
            wls = a.workloads if sub == "run" else [results[0]["workload"]] if results else []
            summary["plots"] = plot.all_plots(out, results, a.vms, wls, conds, sweep, a)
        except (RuntimeError, OSError) as e:
            problems.append(f"plots: {e}")
    report.write_summary(out, summary)
    print(text)
    print(f"\nresults: {os.path.abspath(out)}/ (summary.json, CSV series, {len(summary['plots'])} plot files)")
    if others:
        print(f"note: KSM shared ksmd with {len(others)} other MADV_MERGEABLE process(es) "
              f"({', '.join(o['comm'] for o in others)}): see host.ksm_other_mergeable in summary.json")
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    excluded = [r for r in results if r["excluded"]]
    return 1 if problems or excluded else 0


def _used(a):
    return {"pages_to_scan": a.ksm_pages_to_scan, "sleep_millisecs": a.ksm_sleep_ms,
            "use_zero_pages": a.ksm_zero_pages, "run": "1 during each ksm window only"}


__all__ = ["main", "json", "stop_process"]
