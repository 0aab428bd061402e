# plot.py: the figures of a run as PNG and SVG, drawn by gnuplot from the CSV series.
"""Per workload: group memory and PSS over time, one curve per condition; one bar chart
of time to reclaim, end memory and CPU; per workload of a --sweep, end memory by
instance count. Each figure is one gnuplot script run twice (pngcairo, svg)."""
import os
import shutil
import subprocess

COLORS = {"off": "#7f7f7f", "ksm": "#d62728", "physical": "#1f77b4", "compressed": "#2ca02c",
          "dax": "#9467bd"}
EXTRA = ["#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
TERMS = {"png": "set terminal pngcairo size 1100,650 enhanced font 'DejaVu Sans,11' linewidth 1.5",
         "svg": "set terminal svg size 1100,650 dynamic enhanced font 'DejaVu Sans,11' linewidth 1.5"}


def color(cond, i=0):
    return COLORS.get(cond, EXTRA[i % len(EXTRA)])


def have_gnuplot():
    return shutil.which("gnuplot") is not None


def _render(out, name, body, size=None):
    """Run body under both terminals; returns the files written."""
    made = []
    for ext, term in TERMS.items():
        if size:
            term = term.replace("1100,650", size)
        path = os.path.join(out, f"{name}.{ext}")
        script = f"{term}\nset output '{path}'\n{body}\nunset output\n"
        p = subprocess.run(["gnuplot"], input=script, capture_output=True, text=True)
        if p.returncode != 0 or not os.path.exists(path):
            raise RuntimeError(f"gnuplot failed on {name}.{ext}: {p.stderr.strip()[:300]}")
        made.append(os.path.basename(path))
    return made


def _esc(s):
    return s.replace("_", "\\_")


def time_series(out, wl, rows, column, ylabel, what, name, note):
    """One curve per condition of column (bytes) over t_s, from each row's CSV."""
    curves = []
    for i, r in enumerate(rows):
        csv = os.path.join(out, r["csv"])
        curves.append(f"'{csv}' skip 1 using 1:(${column}/1048576.0) with lines lw 2 "
                      f"lc rgb '{color(r['condition'], i)}' title '{r['condition']}'")
    readies = "\n".join(
        f"set arrow from {r['t_ready_s']},graph 0 to {r['t_ready_s']},graph 1 nohead dt 3 "
        f"lc rgb '{color(r['condition'], i)}'" for i, r in enumerate(rows))
    body = f"""set datafile separator ','
set title "{_esc(wl)}: {what}\\n{{/*0.8 {_esc(note)}}}"
set xlabel 'seconds since launch (dotted: all instances ready)'
set ylabel '{ylabel}'
set grid
set key bottom right box opaque
set yrange [0:*]
{readies}
plot {', '.join(curves)}"""
    return _render(out, name, body)


def bars(out, results, workloads, conds, reclaim_mib):
    """Three panels: time to reclaim, end memory, sharing CPU; a cluster per workload."""
    dat = os.path.join(out, "bars.dat")
    nc = max(1, len(conds))
    width = 0.8 / nc
    with open(dat, "w") as f:
        f.write("# x reclaim_s end_mib cpu_s color reclaim_label reclaim_label_y\n")
        for wi, wl in enumerate(workloads):
            for ci, c in enumerate(conds):
                r = next((r for r in results if r["workload"] == wl and r["condition"] == c), None)
                x = wi + (ci - (nc - 1) / 2) * width
                if r is None or r["excluded"]:
                    f.write(f"{x:.3f} NaN NaN NaN {ci} \"excl.\" 0\n")
                    continue
                t = r["t_reclaim_s"]
                cpu = r.get("sharing_cpu_s")
                cpu = r["group_cpu_total_s"] + r["ksmd_cpu_s"] if cpu is None else cpu
                lab = "never" if t is None else f"{t:.2f}"
                f.write(f"{x:.3f} {'NaN' if t is None else t} {r['end_charge_mib']} {cpu:.3f} {ci} "
                        f"\"{lab}\" {0 if t is None else t}\n")
    pal = ", ".join(f"{i} '{color(c, i)}'" for i, c in enumerate(conds))
    xt = ", ".join(f"'{_esc(wl)}' {i}" for i, wl in enumerate(workloads))
    keys = ", ".join(f"NaN with boxes fs solid 0.8 lc rgb '{color(c, i)}' title '{c}'"
                     for i, c in enumerate(conds))
    body = f"""set palette defined ({pal})
set cbrange [0:{max(1, nc - 1)}]
unset colorbox
set multiplot layout 1,3 title "{' / '.join(conds)}: labels show the values"
set xtics ({xt}) rotate by -20
set xrange [-0.6:{len(workloads) - 0.4}]
set yrange [0:*]
set offsets 0,0,graph 0.15,0
set grid ytics
set key top left opaque
"""
    panels = [(f"time to reclaim {reclaim_mib} MiB (s since launch)", "seconds", 2, "stringcolumn(6)", 7),
              ("group memory at window end", "MiB", 3, "sprintf('%.0f', $3)", 3),
              ("CPU for sharing (beyond off, incl. ksmd)", "CPU seconds", 4, "sprintf('%.2f', $4)", 4)]
    for i, (title, ylab, col, lab, ycol) in enumerate(panels):
        # reclaim labels ("never" on most bars) stand upright so that neighbours never overlap
        rot = "rotate by 90 left offset 0,0.3" if col == 2 else "offset 0,0.7"
        body += f"""set title '{title}'
set ylabel '{ylab}'
plot '{dat}' using 1:{col}:({width * 0.95}):5 with boxes fs solid 0.8 lc palette notitle, \\
     '' using 1:{ycol}:({lab}) with labels {rot} font ',9' notitle\
{(", " + keys) if i == 0 else ""}
"""
    body += "unset multiplot\n"
    return _render(out, "bars", body, size="1500,600")


def sweep_plot(out, wl, conds_data):
    curves = []
    for i, (c, d) in enumerate(conds_data.items()):
        dat = os.path.join(out, f"sweep-{wl}-{c}.dat")
        with open(dat, "w") as f:
            for n, m in d["points"]:
                f.write(f"{n} {m}\n")
        sl = d["slope_mib_per_vm"]
        title = f"{c} ({'-' if sl is None else f'{sl:.1f}'} MiB per VM)"
        curves.append(f"'{dat}' using 1:2 with linespoints lw 2 pt 7 lc rgb '{color(c, i)}' title '{title}'")
    body = f"""set title "{_esc(wl)}: marginal cost of one more VM (group memory at window end)"
set xlabel 'instances'
set ylabel 'MiB'
set grid
set key top left box opaque
set logscale x 2
set xrange [0.8:*]
set yrange [0:*]
plot {', '.join(curves)}"""
    return _render(out, f"sweep-{wl}", body)


def all_plots(out, results, main_n, workloads, conds, sweep, args):
    """Every figure; returns the file names (PNG and SVG)."""
    made = []
    main = [r for r in results if r["instances"] == main_n]
    note = f"{main_n} x {args.data} MiB {'{'}data{'}'} in {args.mem} MiB guests, {args.guest}"
    for wl in workloads:
        rows = [r for r in main if r["workload"] == wl and not r["excluded"] and r.get("csv")]
        if not rows:
            continue
        n = note.replace("{data}", wl)
        made += time_series(out, wl, rows, 3, "MiB", "group charged memory", f"{wl}-memory", n)
        made += time_series(out, wl, rows, 4, "MiB", "sum of the instances' PSS", f"{wl}-pss", n)
    made += bars(out, main, workloads, conds, args.reclaim)
    for wl, cd in (sweep or {}).items():
        made += sweep_plot(out, wl, cd)
    return made
