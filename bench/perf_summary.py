#!/usr/bin/env python3
"""Tables from a bench/perf.sh results directory.

    perf_summary.py --line FILE                    one line for one raw output
    perf_summary.py RESULTS_DIR SCENARIO [...]     markdown tables (medians over rounds)
    perf_summary.py --tsv-row FILE SCENARIO BROKER TOOL ROUND   one runs.tsv row (bench/report.py)
    perf_summary.py --sweep-tsv RESULTS_DIR        sweep.tsv from the S4-<rate> runs

Raw outputs are RESULTS_DIR/<scenario>-<broker>-<tool>-<round>.txt. warren perf and PerfTest
print PerfTest's summary lines, so the shared perftest_summary.py (PERFTEST_SUMMARY, default
../../shared/bench/perftest_summary.py) reads both; lavinmqperf's `-j` summary is JSON, its
per-second lines another format. perf.sh appends the generator's CPU time (`# generator:` from
/usr/bin/time) and the broker's (`# broker:`).

Generator efficiency = messages it handled (sent + received, from the average rates times the run
time) per CPU-second it used (user + system, JVM start-up included for PerfTest).
"""
import glob
import importlib.util
import json
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

TOOL_NAMES = {"warren-perf": "warren perf", "perftest": "PerfTest", "lavinmqperf": "lavinmqperf"}
BROKER_NAMES = {"warren": "Warren", "rabbitmq": "RabbitMQ", "lavinmq": "LavinMQ"}
# PerfTest and warren perf: "time 2.001 s, ... min/median/75th/95th/99th consumer latency: a/b/c/d/e µs"
PT_SECOND = re.compile(r"time:? ([\d.]+) ?s,.*?latency: (\d+)/(\d+)/(\d+)/(\d+)/(\d+) µs")
# lavinmqperf -l: "... | Latency (ms) min/median/75th/95th/99th: a/b/c/d/e", one line a second
LV_SECOND = re.compile(r"Latency \(ms\) min/median/75th/95th/99th: ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+)")


def parse_lavinmqperf(txt):
    """lavinmqperf's `-j` summary (the last JSON object in the output)."""
    r = {"send": None, "recv": None}
    for ln in reversed(txt.splitlines()):
        if ln.startswith("{") and "avg_pub_rate" in ln:
            try:
                j = json.loads(ln)
            except ValueError:
                break
            r["send"], r["recv"] = j.get("avg_pub_rate"), j.get("avg_consume_rate")
            if j.get("latency_p99_ms") is not None:
                r["lat_p50_us"] = round(j["latency_median_ms"] * 1000)
                r["lat_p99_us"] = round(j["latency_p99_ms"] * 1000)
            break
    return r


def per_second_p99_us(txt):
    """Each second's p99 in order, in µs (either generator's per-second lines)."""
    out = [int(m.group(6)) for m in PT_SECOND.finditer(txt)]
    if not out:
        out = [round(float(m.group(5)) * 1000) for m in LV_SECOND.finditer(txt)]
    return out


def parse(path):
    txt = open(path, encoding="utf-8", errors="replace").read()
    r = parse_lavinmqperf(txt) if "avg_pub_rate" in txt else ps.parse(path)
    secs_p99 = per_second_p99_us(txt)[1:]
    # The first second holds the generator's own warm-up on these shared cores: judged without it.
    r["p99_after_first_us"] = round(statistics.median(secs_p99)) if secs_p99 else None
    g = re.search(r"# generator: user_s=([\d.]+) sys_s=([\d.]+) wall_s=([\d.]+) max_rss_kb=(\d+)", txt)
    b = re.search(r"# broker: pid=\S* cpu_s=(\d+)(?: cpu_ticks=(\d+))? secs=(\d+)", txt)
    r["gen_cpu_s"] = float(g.group(1)) + float(g.group(2)) if g else None
    r["gen_rss_mb"] = int(g.group(4)) // 1024 if g else None
    r["broker_cpu_s"] = (int(b.group(2)) / 100 if b.group(2) else int(b.group(1))) if b else None
    secs = int(b.group(3)) if b else None
    if secs == 0 and g:  # a run that ends on its own: its wall time
        secs = float(g.group(3))
    msgs = None
    if secs and r.get("send") is not None and r.get("recv") is not None:
        msgs = (r["send"] + r["recv"]) * secs
    r["msgs"] = msgs
    r["recv_msgs"] = r["recv"] * secs if secs and r.get("recv") is not None else None
    r["secs"] = secs
    r["eff"] = msgs / r["gen_cpu_s"] if msgs and r["gen_cpu_s"] else None
    return r


def cell(v):
    return "" if v is None else (f"{v:.2f}" if isinstance(v, float) and v != int(v) else str(round(v)))


def tsv_row(path, scenario, broker, tool, rnd):
    r = parse(path)
    return "\t".join([scenario, broker, tool, rnd] + [cell(r.get(k)) for k in (
        "send", "recv", "lat_p50_us", "lat_p99_us", "broker_cpu_s", "recv_msgs", "secs")])


def sweep_tsv(d):
    out = ["broker\ttool\tround\trate_attempted\tsend_rate\trecv_rate\tp50_us\tp99_us\tp99_after_first_us"]
    rows = []
    for path in glob.glob(f"{d}/S4-*-*-*-*.txt"):
        m = re.match(r"S4-(\w+)-(warren|rabbitmq|lavinmq)-(warren-perf|perftest|lavinmqperf)-(\d+)\.txt$",
                     os.path.basename(path))
        if not m:
            continue
        rate, broker, tool, rnd = m.groups()
        r = parse(path)
        key = (float("inf") if rate == "unlimited" else int(rate), broker, tool, int(rnd))
        rows.append((key, "\t".join([broker, tool, rnd, rate] + [cell(r.get(k)) for k in (
            "send", "recv", "lat_p50_us", "lat_p99_us", "p99_after_first_us")])))
    return "\n".join(out + [row for _, row in sorted(rows)])


def fmt(v, unit=""):
    return "-" if v is None else f"{v:,.0f}{unit}"


def ms(us):
    if us is None:
        return "-"
    return f"{us / 1000:.2f} ms" if us < 10_000 else f"{us / 1000:,.0f} ms"


def ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b not in (None, 0) else "-"


def med(rs, k):
    v = [r[k] for r in rs if r.get(k) is not None]
    return statistics.median(v) if v else None


def line(path):
    r = parse(path)
    return (f"{os.path.basename(path)[:-4]}: send={fmt(r['send'])} recv={fmt(r['recv'])} msg/s "
            f"p50={ms(r.get('lat_p50_us'))} p99={ms(r.get('lat_p99_us'))} | generator cpu={'-' if r['gen_cpu_s'] is None else round(r['gen_cpu_s'], 2)} s "
            f"rss={r['gen_rss_mb']} MB msgs/cpu-s={fmt(r['eff'])} | broker cpu={r['broker_cpu_s']} s")


def tables(d, scenarios):
    out = []
    out.append("| scenario | broker | generator | send msg/s | recv msg/s | latency p50 | latency p99 "
               "| generator CPU s | generator RSS | msgs per generator CPU-s | broker CPU s |")
    out.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    meds = {}
    for s in scenarios:
        for broker in ("warren", "lavinmq", "rabbitmq"):
            for tool in ("warren-perf", "lavinmqperf", "perftest"):
                paths = sorted(glob.glob(f"{d}/{s}-{broker}-{tool}-*.txt"))
                if not paths:
                    continue
                rs = [parse(p) for p in paths]
                m = {k: med(rs, k) for k in ("send", "recv", "lat_p50_us", "lat_p99_us", "gen_cpu_s",
                                             "gen_rss_mb", "eff", "broker_cpu_s")}
                meds[(s, broker, tool)] = m
                cpu = "-" if m["gen_cpu_s"] is None else f"{m['gen_cpu_s']:.1f}"
                out.append(f"| {s} | {BROKER_NAMES[broker]} | {TOOL_NAMES[tool]} | {fmt(m['send'])} "
                           f"| {fmt(m['recv'])} | {ms(m['lat_p50_us'])} | {ms(m['lat_p99_us'])} "
                           f"| {cpu} "
                           f"| {fmt(m['gen_rss_mb'], ' MB')} | {fmt(m['eff'])} | {fmt(m['broker_cpu_s'])} |")
    out.append("")
    out.append("Generator cost, same broker, same scenario: messages handled (sent + received) per "
               "CPU-second of the generator, and the ratio warren perf / PerfTest (above 1: warren perf "
               "is cheaper per message). Throughput ratio: messages received per second, Warren / RabbitMQ, "
               "as each generator measures it.")
    out.append("")
    out.append("| scenario | msgs/CPU-s ratio on Warren | msgs/CPU-s ratio on RabbitMQ "
               "| recv Warren/RabbitMQ (warren perf) | recv Warren/RabbitMQ (PerfTest) |")
    out.append("|---|---:|---:|---:|---:|")
    for s in scenarios:
        g = lambda b, t, k: meds.get((s, b, t), {}).get(k)
        out.append(f"| {s} | {ratio(g('warren', 'warren-perf', 'eff'), g('warren', 'perftest', 'eff'))} "
                   f"| {ratio(g('rabbitmq', 'warren-perf', 'eff'), g('rabbitmq', 'perftest', 'eff'))} "
                   f"| {ratio(g('warren', 'warren-perf', 'recv'), g('rabbitmq', 'warren-perf', 'recv'))} "
                   f"| {ratio(g('warren', 'perftest', 'recv'), g('rabbitmq', 'perftest', 'recv'))} |")
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1] == "--line":
        print(line(sys.argv[2]))
    elif sys.argv[1] == "--tsv-row":
        print(tsv_row(*sys.argv[2:7]))
    elif sys.argv[1] == "--sweep-tsv":
        print(sweep_tsv(sys.argv[2]))
    else:
        print(tables(sys.argv[1], sys.argv[2:]))
