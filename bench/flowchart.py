#!/usr/bin/env python3
"""Renders bench/flowchart.sh's outputs: per-second rates, latency and RSS of Warren and RabbitMQ
as SVG charts (no dependencies) in OUT/flowchart.html and OUT/*.svg, and OUT/summary.md with the
checks of issue 4 (no second with zero sends, RSS flat after warm-up, p99 and throughput ratios).

    bench/flowchart.py OUTDIR
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import statistics
import sys

LINE = re.compile(r"time (\d+(?:\.\d+)?) s, sent: (\d+) msg/s, received: (\d+) msg/s, "
                  r"min/median/75th/95th/99th consumer latency: (\d+)/(\d+)/(\d+)/(\d+)/(\d+) µs")
WARMUP_S = 30
COLORS = {"warren": "#1f77b4", "rabbitmq": "#ff7f0e"}


def load(out: str, name: str) -> list[dict]:
    rows = []
    with open(os.path.join(out, f"{name}-perftest.txt"), encoding="utf-8", errors="replace") as f:
        for line in f:
            m = LINE.search(line)
            if m:
                t, sent, recv, lmin, p50, p75, p95, p99 = m.groups()
                rows.append({"t": float(t), "sent": int(sent), "received": int(recv),
                             "p50_ms": int(p50) / 1000, "p99_ms": int(p99) / 1000})
    rss = []
    with open(os.path.join(out, f"{name}-rss.csv")) as f:
        for r in csv.DictReader(f):
            if r["rss_kb"]:
                rss.append((float(r["t_s"]), int(r["rss_kb"]) / 1024))
    for row in rows:
        near = min(rss, key=lambda x: abs(x[0] - row["t"]), default=(0, 0))
        row["rss_mb"] = near[1]
    return rows


def stats(rows: list[dict]) -> dict:
    steady = [r for r in rows if r["t"] > WARMUP_S] or rows
    rss = [r["rss_mb"] for r in steady]
    med_rss = statistics.median(rss) if rss else 0
    return {
        "seconds": len(rows),
        "zero_send_seconds": sum(1 for r in rows if r["sent"] == 0),
        "median_sent": statistics.median(r["sent"] for r in rows) if rows else 0,
        "median_received": statistics.median(r["received"] for r in rows) if rows else 0,
        "median_p99_ms": statistics.median(r["p99_ms"] for r in steady) if steady else 0,
        "max_p99_ms": max((r["p99_ms"] for r in steady), default=0),
        "rss_median_mb": med_rss,
        "rss_spread_after_warmup": (max(rss) - min(rss)) / med_rss if med_rss else 0,
    }


def chart(title: str, series: dict[str, list[tuple[float, float]]], unit: str, log: bool = False,
          w: int = 900, h: int = 260) -> str:
    pad_l, pad_r, pad_t, pad_b = 70, 20, 30, 35
    pts = [p for s in series.values() for p in s]
    if not pts:
        return f"<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}'><text x='10' y='20'>{title}: no data</text></svg>"
    xmax = max(p[0] for p in pts) or 1
    ys = [p[1] for p in pts]
    if log:
        lo = max(min(y for y in ys if y > 0) if any(y > 0 for y in ys) else 0.001, 0.001)
        ymin, ymax = math.log10(lo), math.log10(max(ys) if max(ys) > 0 else 1)
        if ymax - ymin < 1:
            ymax = ymin + 1
        fy = lambda y: math.log10(max(y, lo))  # noqa: E731
    else:
        ymin, ymax = 0.0, (max(ys) * 1.1) or 1
        fy = lambda y: y  # noqa: E731
    sx = lambda x: pad_l + x / xmax * (w - pad_l - pad_r)  # noqa: E731
    sy = lambda y: h - pad_b - (fy(y) - ymin) / (ymax - ymin) * (h - pad_t - pad_b)  # noqa: E731
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='11'>",
           f"<rect width='{w}' height='{h}' fill='white'/>",
           f"<text x='{pad_l}' y='18' font-size='13' font-weight='bold'>{title}</text>",
           f"<line x1='{pad_l}' y1='{h - pad_b}' x2='{w - pad_r}' y2='{h - pad_b}' stroke='#888'/>",
           f"<line x1='{pad_l}' y1='{pad_t}' x2='{pad_l}' y2='{h - pad_b}' stroke='#888'/>"]
    for i in range(5):
        v = ymin + (ymax - ymin) * i / 4
        label = 10 ** v if log else v
        y = h - pad_b - (v - ymin) / (ymax - ymin) * (h - pad_t - pad_b)
        txt = f"{label:,.3g}" if label < 1000 else f"{label:,.0f}"
        out.append(f"<text x='{pad_l - 5}' y='{y + 4:.1f}' text-anchor='end'>{txt}</text>")
        out.append(f"<line x1='{pad_l}' y1='{y:.1f}' x2='{w - pad_r}' y2='{y:.1f}' stroke='#eee'/>")
    for i in range(6):
        x = xmax * i / 5
        out.append(f"<text x='{sx(x):.1f}' y='{h - pad_b + 15}' text-anchor='middle'>{x:.0f} s</text>")
    out.append(f"<text x='12' y='{pad_t - 8}'>{unit}</text>")
    lx = w - pad_r - 10
    for k, (name, s) in enumerate(series.items()):
        color = COLORS.get(name.split()[0], "#2ca02c")
        dash = " stroke-dasharray='4 3'" if "sent" in name else ""
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
        out.append(f"<polyline class='series' data-name='{name}' data-points='{len(s)}' fill='none' "
                   f"stroke='{color}' stroke-width='1.3'{dash} points='{path}'/>")
        out.append(f"<text x='{lx}' y='{pad_t + 14 * k}' text-anchor='end' fill='{color}'>{name}</text>")
    out.append("</svg>")
    return "\n".join(out)


def main() -> int:
    out = sys.argv[1]
    data = {n: load(out, n) for n in ("warren", "rabbitmq") if os.path.exists(os.path.join(out, f"{n}-perftest.txt"))}
    st = {n: stats(rows) for n, rows in data.items()}
    charts = {
        "rates": chart("Send and receive rate (1 producer -> 1 consumer, 16 B, autoack)",
                       {f"{n} {k}": [(r["t"], r[k]) for r in rows] for n, rows in data.items() for k in ("sent", "received")},
                       "msg/s"),
        "p99": chart("Consumer latency p99 (log scale)",
                     {f"{n} p99": [(r["t"], r["p99_ms"]) for r in rows] for n, rows in data.items()}, "ms", log=True),
        "rss": chart("Broker RSS", {f"{n} RSS": [(r["t"], r["rss_mb"]) for r in rows] for n, rows in data.items()}, "MiB"),
    }
    for k, svg in charts.items():
        with open(os.path.join(out, f"flowchart-{k}.svg"), "w") as f:
            f.write(svg)
    meta = open(os.path.join(out, "meta.txt")).read() if os.path.exists(os.path.join(out, "meta.txt")) else ""
    lines = ["| figure | " + " | ".join(st) + " |", "|---|" + "---|" * len(st)]
    for key in ("seconds", "zero_send_seconds", "median_sent", "median_received", "median_p99_ms", "max_p99_ms",
                "rss_median_mb", "rss_spread_after_warmup"):
        lines.append(f"| {key} | " + " | ".join(f"{st[n][key]:,.2f}" if isinstance(st[n][key], float) else f"{st[n][key]:,}" for n in st) + " |")
    if "warren" in st and "rabbitmq" in st:
        w, r = st["warren"], st["rabbitmq"]
        lines += ["", f"- receive rate Warren/RabbitMQ: {w['median_received'] / max(r['median_received'], 1):.2f}x",
                  f"- steady p99 RabbitMQ/Warren: {r['median_p99_ms'] / max(w['median_p99_ms'], 0.001):.1f}x lower on Warren",
                  f"- Warren seconds with zero sends: {w['zero_send_seconds']}; RSS spread after {WARMUP_S} s warm-up: "
                  f"{w['rss_spread_after_warmup'] * 100:.0f}% of its median"]
    summary = "\n".join(lines)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(meta + "\n" + summary + "\n")
    with open(os.path.join(out, "flowchart.json"), "w") as f:
        json.dump({"meta": meta, "stats": st, "samples": data}, f)
    html = ["<!doctype html><html><head><meta charset='utf-8'><title>Warren vs RabbitMQ: flow-control chart</title>",
            "<style>body{font-family:sans-serif;max-width:960px;margin:20px auto}pre{background:#f6f6f6;padding:8px}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}</style></head><body>",
            "<h1>Flow-control chart: Warren vs RabbitMQ 3.10</h1>", f"<pre>{meta}</pre>"]
    html += [charts["rates"], charts["p99"], charts["rss"]]
    html.append("<pre>" + summary.replace("<", "&lt;") + "</pre></body></html>")
    with open(os.path.join(out, "flowchart.html"), "w") as f:
        f.write("\n".join(html))
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
