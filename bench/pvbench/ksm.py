# ksm.py: KSM's knobs (recorded, set, restored byte for byte), its counters and ksmd's CPU.
"""KSM lives outside any cgroup: ksmd's CPU and its metadata (one 64-byte rmap_item per
scanned page) are reported beside a group's figures, never folded into them or dropped.

KSM done right needs two yeses: the VMM's MADV_MERGEABLE (pvisor --dedup ksm) and
run=1. KSM merges nothing before its second full pass (the first pass only fills
the unstable tree), so full_scans is always shown with the figures.
"""
import os

from .host import find_comm, proc_cpu, rd, wr

KSM = "/sys/kernel/mm/ksm"
RMAP_ITEM_BYTES = 64
# The kernel's defaults (mm/ksm.c) for the knobs the bench sets.
KERNEL_DEFAULTS = {"pages_to_scan": 100, "sleep_millisecs": 20, "use_zero_pages": 0}
# Restore order: the advisor first (it rewrites pages_to_scan), knobs that need an
# empty stable tree after run=2, then the plain ones, run last.
ORDER = ["advisor_mode", "advisor_max_cpu", "advisor_min_pages_to_scan",
         "advisor_max_pages_to_scan", "advisor_target_scan_time", "merge_across_nodes",
         "max_page_sharing", "stable_node_chains_prune_millisecs", "smart_scan",
         "use_zero_pages", "sleep_millisecs", "pages_to_scan"]
COUNTERS = ["pages_sharing", "pages_shared", "pages_unshared", "pages_volatile", "full_scans",
            "pages_scanned", "pages_skipped", "general_profit", "ksm_zero_pages"]


def available():
    return os.path.isfile(f"{KSM}/run")


def knob_names():
    """Every writable file under /sys/kernel/mm/ksm: the knobs to record and restore."""
    if not available():
        return []
    return sorted(n for n in os.listdir(KSM) if os.stat(f"{KSM}/{n}").st_mode & 0o200)


def read_knobs():
    """Raw text of every knob (advisor_mode reads '[none] scan-time')."""
    return {k: rd(f"{KSM}/{k}") for k in knob_names()}


def _value(raw):
    """The value to write back for a raw knob text ('[none] scan-time' -> 'none')."""
    if raw and "[" in raw:
        return raw[raw.index("[") + 1:raw.index("]")]
    return raw


def counters():
    out = {}
    for k in COUNTERS:
        v = rd(f"{KSM}/{k}")
        if v is not None:
            out[k] = int(v)
    return out


class Ksm:
    """Records every knob at construction; restore() puts each one back exactly."""

    def __init__(self):
        self.saved = read_knobs()
        pids = find_comm("ksmd")
        self.ksmd_pid = pids[0] if pids else None
        self.errors = []

    def ksmd_cpu(self):
        """ksmd's utime+stime in seconds (0 if there is no ksmd)."""
        if self.ksmd_pid is None:
            return 0.0
        return proc_cpu(self.ksmd_pid) or 0.0

    def set(self, name, value):
        if _value(rd(f"{KSM}/{name}")) != str(value):
            wr(f"{KSM}/{name}", value)

    def settle(self, settings):
        """Stop ksmd and apply the bench's settings (advisor off, so they are used as given)."""
        self.set("run", 0)
        if "advisor_mode" in self.saved:
            self.set("advisor_mode", "none")
        for k, v in settings.items():
            self.set(k, v)

    def start(self):
        self.set("run", 1)

    def stop(self):
        """run=0: ksmd stops scanning; what it merged stays merged."""
        self.set("run", 0)

    def unmerge(self):
        """run=2 unmerges every merged page (synchronously), then run=0."""
        wr(f"{KSM}/run", 2)
        wr(f"{KSM}/run", 0)

    def restore(self):
        """Every knob back to its recorded text; returns the knobs that differ afterwards."""
        try:
            self.unmerge()
        except OSError as e:
            self.errors.append(f"run=2: {e}")
        names = [k for k in ORDER if k in self.saved] + \
            [k for k in self.saved if k not in ORDER and k != "run"] + ["run"]
        for k in names:
            if k not in self.saved or self.saved[k] is None:
                continue
            try:
                if rd(f"{KSM}/{k}") != self.saved[k]:
                    wr(f"{KSM}/{k}", _value(self.saved[k]))
            except OSError as e:
                self.errors.append(f"{k}={self.saved[k]}: {e}")
        now = read_knobs()
        return [k for k in self.saved if now.get(k) != self.saved[k]]

    def settings_now(self):
        return {k: _value(v) for k, v in read_knobs().items()}
