# pvbench: the modules of pvisor-bench, the side-by-side benchmark of pvisor's memory modes against KSM.
"""pvbench: host probes (host), KSM knobs (ksm), instances (guest), one run (run),
figures and output (report, plot), the classic KSM experiments (classic), the CLI (cli)."""

VERSION = "1.0"
MIB = 1 << 20
PAGE = 4096
