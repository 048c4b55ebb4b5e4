#!/usr/bin/env python3
"""Markdown tables from a bench/compare.sh results directory.

    summarize.py RESULTS_DIR SCENARIO [SCENARIO ...]

Reads RESULTS_DIR/<scenario>-A-<round>.txt (Warren) and -B- (RabbitMQ), parses them with the
shared perftest_summary.py (PERFTEST_SUMMARY, default ../../shared/bench/perftest_summary.py),
and prints the medians over rounds, the Warren/RabbitMQ ratios, and every sign of trouble in the
raw PerfTest output (exceptions, no receive rate, intervals where the consumer stalled).
"""
import glob
import importlib.util
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PS_PATH = os.environ.get("PERFTEST_SUMMARY",
                         os.path.join(HERE, "..", "..", "shared", "bench", "perftest_summary.py"))
spec = importlib.util.spec_from_file_location("perftest_summary", PS_PATH)
ps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ps)

KEYS = ["send", "recv", "lat_p50_us", "lat_p99_us", "confirm_p99_us", "rss_mb", "broker_cpu_s"]
INTERVAL = re.compile(r"time ([\d.]+) s, sent: (\d+) msg/s, received: (\d+) msg/s"
                      r"(?:, min/median/75th/95th/99th consumer latency: \d+/(\d+)/)?")
P99S = re.compile(r"time [\d.]+ s, sent: \d+ msg/s, received: \d+ msg/s, "
                  r"min/median/75th/95th/99th consumer latency: \d+/\d+/\d+/\d+/(\d+)")


def runs(d, s, side):
    paths = sorted(glob.glob(f"{d}/{s}-{side}-*.txt"))
    return paths, [ps.parse(p) for p in paths]


def median(rs, k):
    v = [r[k] for r in rs if r.get(k) is not None]
    return statistics.median(v) if v else None


def n(v):
    return "-" if v is None else f"{v:,.0f}"


def ms(us):
    if us is None:
        return "-"
    return f"{us / 1000:.2f} ms" if us < 10_000 else f"{us / 1000:,.0f} ms"


def ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b not in (None, 0) else "-"


def troubles(path):
    """Lines of a raw output that show PerfTest failing or the consumer stalling."""
    txt = open(path, encoding="utf-8", errors="replace").read()
    out = []
    for line in txt.splitlines():
        if re.search(r"(?i)exception|error|refused|timeout|closed|shutdown", line) and "Reached time limit" not in line:
            out.append(line.strip())
    r = ps.parse(path)
    if r["recv"] is None or r["recv"] == 0:
        out.append(f"receiving rate avg: {r['recv']}")
    stalls, late = [], []
    body = txt.split("test stopped")[0]
    for m in INTERVAL.finditer(body):
        t, sent, recv = float(m.group(1)), int(m.group(2)), int(m.group(3))
        p50 = int(m.group(4)) if m.group(4) else None
        if sent >= 1000 and recv < 0.05 * sent:
            stalls.append(f"t={t:.0f}s sent={sent} recv={recv}")
        if p50 is not None and p50 >= 1_000_000:
            late.append((t, sent, recv, p50))
    if stalls:
        out.append(f"consumer stalled (received < 5% of sent) in {len(stalls)} interval(s): " + "; ".join(stalls))
    if late:
        first, last = late[0], late[-1]
        out.append(f"median consumer latency >= 1 s in {len(late)} interval(s), from t={first[0]:.0f}s "
                   f"(sent={first[1]} recv={first[2]} p50={first[3] / 1e6:.1f} s) to t={last[0]:.0f}s "
                   f"(sent={last[1]} recv={last[2]} p50={last[3] / 1e6:.1f} s)")
    return out


def start_up(path, target):
    """For a fixed-rate run: how far the average send rate exceeds the target (PerfTest's rate
    limiter banks the permits of its start-up wait and spends them at once), the first second's
    p99, and the median of the later seconds' p99s."""
    txt = open(path, encoding="utf-8", errors="replace").read().split("test stopped")[0]
    p99s = [int(x) for x in P99S.findall(txt)]
    send = ps.parse(path)["send"]
    above = f"{100 * (send - target) / target:+.0f}%" if send else "-"
    later = ms(statistics.median(p99s[1:])) if len(p99s) > 1 else "-"
    return f"{above}, {ms(p99s[0]) if p99s else '-'}, {later}"


def main():
    d, scenarios = sys.argv[1], sys.argv[2:]
    print("| scenario | Warren send | Warren recv | Warren p50 | Warren p99 | Warren RSS "
          "| RabbitMQ send | RabbitMQ recv | RabbitMQ p50 | RabbitMQ p99 | RabbitMQ RSS "
          "| recv W/R | p99 W/R |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    meds, counts, problems = {}, {}, []
    for s in scenarios:
        pa, ra = runs(d, s, "A")
        pb, rb = runs(d, s, "B")
        a = {k: median(ra, k) for k in KEYS}
        b = {k: median(rb, k) for k in KEYS}
        meds[s], counts[s] = (a, b), (len(ra), len(rb))
        print(f"| {s} | {n(a['send'])} | {n(a['recv'])} | {ms(a['lat_p50_us'])} | {ms(a['lat_p99_us'])} "
              f"| {n(a['rss_mb'])} MB | {n(b['send'])} | {n(b['recv'])} | {ms(b['lat_p50_us'])} "
              f"| {ms(b['lat_p99_us'])} | {n(b['rss_mb'])} MB | {ratio(a['recv'], b['recv'])} "
              f"| {ratio(a['lat_p99_us'], b['lat_p99_us'])} |")
        for side, paths in (("Warren", pa), ("RabbitMQ", pb)):
            for p in paths:
                for t in troubles(p):
                    problems.append(f"- {side} `{os.path.basename(p)}`: {t}")
    print()
    print("Send/recv in msg/s; p50/p99 = PerfTest consumer latency; RSS = broker peak RSS during the run; "
          "each figure is the median over rounds (Warren and RabbitMQ alternate within a round).")
    print()
    print("| scenario | rounds W/R | Warren confirm p99 | RabbitMQ confirm p99 | Warren CPU s | RabbitMQ CPU s | CPU W/R |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for s in scenarios:
        a, b = meds[s]
        print(f"| {s} | {counts[s][0]}/{counts[s][1]} | {ms(a['confirm_p99_us'])} | {ms(b['confirm_p99_us'])} "
              f"| {n(a['broker_cpu_s'])} | {n(b['broker_cpu_s'])} | {ratio(a['broker_cpu_s'], b['broker_cpu_s'])} |")
    print()
    fixed = [s for s in scenarios if re.fullmatch(r"S4-\d+", s)]
    if fixed:
        print("Per round at fixed rates: send rate above the target (PerfTest's start-up burst), "
              "first second's p99, median p99 of the later seconds:")
        print()
        print("| scenario | round | Warren | RabbitMQ |")
        print("|---|---:|---|---|")
        for s in fixed:
            target = int(s.split("-")[1])
            pa, _ = runs(d, s, "A")
            pb, _ = runs(d, s, "B")
            for i, (x, y) in enumerate(zip(pa, pb), 1):
                print(f"| {s} | {i} | {start_up(x, target)} | {start_up(y, target)} |")
        print()
    print("Trouble in the raw outputs (exceptions, no receive rate, 1 s intervals where the consumer "
          "received under 5% of what was sent or where its median latency reached 1 s):")
    print()
    print("\n".join(problems) if problems else "- none")


if __name__ == "__main__":
    main()
