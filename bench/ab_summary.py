#!/usr/bin/env python3
"""The A/B of two Warren builds from one bench/perf.sh run with BROKERS="warren warren-base":
per scenario and generator, the medians of each build's receive rate and broker CPU-seconds per
million messages received, and the median (and range) of the per-round ratios new/base.

Usage: python3 bench/ab_summary.py bench/results/perf-<stamp>   (prints markdown)
"""

import csv
import os
import statistics
import sys


def rows(d):
    with open(os.path.join(d, "runs.tsv"), newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def cpu_per_m(r):
    cpu, n = num(r["broker_cpu_s"]), num(r["recv_msgs"])
    return cpu / n * 1e6 if cpu is not None and n else None


def summary(runs, new="warren", base="warren-base"):
    by = {}
    for r in runs:
        by.setdefault((r["scenario"], r["tool"]), {}).setdefault(r["round"], {})[r["broker"]] = r
    out = ["| scenario | generator | rounds | base msg/s | new msg/s | new/base (range) | base CPU-s/M | new CPU-s/M | new/base (range) |",
           "|---|---|---:|---:|---:|---|---:|---:|---|"]
    for (s, tool), rounds in sorted(by.items()):
        pairs = [(v[base], v[new]) for v in rounds.values() if base in v and new in v]
        if not pairs:
            continue
        rate = [(num(b["recv_rate"]), num(n["recv_rate"])) for b, n in pairs]
        cpu = [(cpu_per_m(b), cpu_per_m(n)) for b, n in pairs]

        def cells(xs, fmt):
            ok = [(a, b) for a, b in xs if a and b]
            if not ok:
                return "-", "-", "-"
            ratios = [b / a for a, b in ok]
            return (fmt.format(statistics.median(a for a, _ in ok)),
                    fmt.format(statistics.median(b for _, b in ok)),
                    f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})")
        r1, r2, r3 = cells(rate, "{:,.0f}")
        c1, c2, c3 = cells(cpu, "{:.2f}")
        out.append(f"| {s} | {tool} | {len(pairs)} | {r1} | {r2} | {r3} | {c1} | {c2} | {c3} |")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(summary(rows(sys.argv[1])))
