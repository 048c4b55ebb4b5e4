#!/usr/bin/env python3
"""Renders docs/benchmarks.md and its SVG charts from the bench scripts' results.

    python3 bench/report.py [--root DIR] [--results DIR ...] [--check] [--sections-only]

Inputs, each from the newest directory under bench/results/ (by name: perf-<UTC stamp>) that holds it:
  perf-*/runs.tsv, header.md, commands.tsv   bench/perf.sh: one row per run, the run's header, the
                                             generator command line per scenario and tool
  perf-*/sweep.tsv                           bench/perf.sh with SWEEP=1: S4 at each attempted rate
  cores-*/runs.tsv                           bench/cores.sh: receive rate by broker and core count
  docs/benchmarks/sections/*.md              hand-written summaries, appended in name order
--results DIR (repeatable) takes what DIR holds from DIR instead; a kind none of the named
directories holds still comes from the newest. --root is the repository (default: this script's
parent). Outputs: docs/benchmarks.md and docs/benchmarks/img/*.svg; that folder is this script's,
so an SVG there that it did not write is removed. --check writes nothing and exits 1 when any output
on disk differs from what would be rendered. --sections-only renders only the hand-written sections
into the page on disk, keeping the measured part above them (a checkout without the bench/results/
the page was made from). Standard library only; same inputs, same bytes.
"""
import argparse
import glob
import math
import os
import posixpath
import re
import statistics
import sys
from xml.sax.saxutils import escape

BROKERS = ["warren", "lavinmq", "rabbitmq"]
BROKER_NAMES = {"warren": "Warren", "lavinmq": "LavinMQ", "rabbitmq": "RabbitMQ"}
TOOLS = ["warren-perf", "lavinmqperf", "perftest"]
# cores.sh names generators by broker family (GENS="warren lavinmq"); perf.sh by tool.
TOOL_NAMES = {"warren-perf": "warren perf", "warren": "warren perf", "lavinmqperf": "lavinmqperf",
              "lavinmq": "lavinmqperf", "perftest": "PerfTest"}
# Okabe-Ito colours: apart for colour-blind readers, readable on the white background.
BROKER_COLOURS = {"warren": "#D55E00", "lavinmq": "#0072B2", "rabbitmq": "#009E73"}
OTHER_COLOURS = ["#E69F00", "#56B4E9", "#CC79A7", "#F0E442", "#999999", "#000000"]
# Core counts: shades of one blue, light to dark, so they do not read as brokers.
CORE_COLOURS = ["#9ECAE1", "#6BAED6", "#3182BD", "#08519C", "#08306B"]
SCENARIOS = {
    "S1": "1 producer, 1 consumer, 16 B transient, autoack, unlimited rate",
    "S2": "10 producers, 10 consumers, one queue, 4,000 B persistent, confirms 100, prefetch 100",
    "S2P": "lavinmqperf's persistent case: 1 producer, 1 consumer, 1 KiB persistent, confirms 100, acks every 100",
    "S3": "10 queues, 10 producers, 10 consumers, 4,000 B persistent, confirms 100, prefetch 100",
    "S5": "100 queues, 200 producers at 50 msg/s, 200 consumers with 10 ms of work, 1 KiB persistent, confirms",
    "S6a": "fill 10 durable queues with 100,000 persistent 1 KB messages each",
    "S6b": "drain the 10 queues S6a filled",
    "S7": "a quorum queue, 10 producers, 10 consumers, 4,000 B, confirms 100, prefetch 100",
    "S8": "1,000 producers at 1 msg/s, 10 queues, 10 consumers",
}
DASH = "–"
PAGE = "docs/benchmarks.md"
IMG = "docs/benchmarks/img"
SECTIONS = "docs/benchmarks/sections"
NOTES_INDEX = "benchmarks/notes/README.md"


# ---- inputs ----------------------------------------------------------------------------------

def read_tsv(path):
    with open(path, encoding="utf-8") as f:
        lines = [ln.rstrip("\r\n") for ln in f if ln.strip()]
    if not lines:
        return [], []
    head = lines[0].split("\t")
    rows = []
    for ln in lines[1:]:
        cells = ln.split("\t")
        rows.append({h: (cells[i].strip() if i < len(cells) else "") for i, h in enumerate(head)})
    return head, rows


def num(s):
    """A TSV field as a float; empty, '-' or anything else unparsable is 'not measured'."""
    try:
        v = float(s)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def has(d, name, column):
    p = os.path.join(d, name)
    if not os.path.isfile(p):
        return False
    head, rows = read_tsv(p)
    return column in head and bool(rows)


def pick(named, all_dirs, name, column):
    """Newest directory (by name) holding NAME with COLUMN: among the named ones if any holds it."""
    for cands in (named, all_dirs):
        hits = [d for d in cands if has(d, name, column)]
        if hits:
            return max(hits, key=lambda d: (os.path.basename(os.path.normpath(d)), d))
    return None


def round_key(r):
    v = num(r)
    return (0, v, "") if v is not None else (1, 0, r)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def order(keys, known):
    keys = set(keys)
    return [k for k in known if k in keys] + sorted(keys - set(known))


def rate_key(rate):
    v = num(rate)
    return (1, 0) if v is None else (0, v)


# ---- formatting ------------------------------------------------------------------------------

def f_rate(v):
    return DASH if v is None else f"{v:,.0f}"


def f_ratio(v):
    return DASH if v is None else f"{v:.2f}"


def f_cpu(v):
    return DASH if v is None else f"{v:.2f}"


def f_us(v):
    if v is None:
        return DASH
    if v < 1000:
        return f"{v:.0f} µs"
    if v < 10000:
        return f"{v / 1000:.2f} ms"
    if v < 100000:
        return f"{v / 1000:.1f} ms"
    if v < 10000000:
        return f"{v / 1000:,.0f} ms"
    return f"{v / 1e6:,.0f} s"


def f_compact(v):
    if v >= 1e7:
        return f"{v / 1e6:.1f}M"
    if v >= 1e6:
        return f"{v / 1e6:.2f}M"
    if v >= 1e4:
        return f"{v / 1e3:.0f}k"
    if v >= 1e3:
        return f"{v / 1e3:.1f}k"
    return f"{v:.0f}" if v == int(v) or v >= 10 else f"{v:.2g}"


def f_tick(v):
    """An axis label: f_compact without trailing zeros (1M, 1.5M, 250k)."""
    return re.sub(r"\.0+(?=[kM]?$)|(\.\d*?[1-9])0+(?=[kM]?$)", r"\1", f_compact(v))


def f_rounds(counts):
    """'3 rounds', '1 round', '2/3 rounds' (when pairs differ)."""
    counts = sorted(set(counts))
    return f"{'/'.join(str(c) for c in counts) or 'N'} round{'' if counts == [1] else 's'}"


def spread_cell(ratios):
    """Median of the per-round ratios, their min-max on a second, smaller line."""
    if not ratios:
        return DASH
    cell = f_ratio(median(ratios))
    if len(ratios) > 1:
        cell += f"<br><sub>{min(ratios):.2f}{DASH}{max(ratios):.2f}</sub>"
    return cell


def table(head, rows, align):
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


# ---- the model: medians and ratios -----------------------------------------------------------

def run_metrics(row):
    """recv msg/s, broker CPU-s per million received, p99 µs of one run (None: not measured)."""
    recv = num(row.get("recv_rate"))
    cpu = num(row.get("broker_cpu_s"))
    msgs = num(row.get("recv_msgs"))
    if msgs is None and recv is not None and num(row.get("secs")) is not None:
        msgs = recv * num(row.get("secs"))
    cpm = cpu / msgs * 1e6 if cpu is not None and msgs else None
    return {"recv": recv, "cpm": cpm if recv is not None else None, "p99": num(row.get("p99_us"))}


def scenario_model(rows):
    """{scenario: {tool: {broker: {"recv", "cpm", "p99": median, "by_round": {round: recv}}}}},
    plus the scenarios in order of first appearance."""
    model, scenarios = {}, []
    for row in rows:
        s, b, t = row.get("scenario", ""), row.get("broker", ""), row.get("tool", "")
        if not (s and b and t):
            continue
        if s not in model:
            model[s] = {}
            scenarios.append(s)
        cell = model[s].setdefault(t, {}).setdefault(b, {"runs": []})
        cell["runs"].append((row.get("round", ""), run_metrics(row)))
    for s in model.values():
        for t in s.values():
            for cell in t.values():
                runs = cell.pop("runs")
                for k in ("recv", "cpm", "p99"):
                    cell[k] = median([m[k] for _, m in runs])
                by_round = {}
                for r, m in runs:
                    if m["recv"] is not None:
                        by_round.setdefault(r, []).append(m["recv"])
                cell["by_round"] = {r: median(v) for r, v in by_round.items()}
                cell["rounds"] = sum(1 for _, m in runs if m["recv"] is not None)
    return model, scenarios


def round_ratios(a, b):
    """a/b for every round both measured (a round's brokers ran back to back: same machine state)."""
    if not a or not b:
        return []
    return [a["by_round"][r] / b["by_round"][r] for r in sorted(a["by_round"], key=round_key)
            if r in b["by_round"] and b["by_round"][r]]


def sweep_model(rows):
    """{tool: {broker: {rate: {"p99", "whole" (p99 is the whole run's), "recv", "rounds"}}}}."""
    raw = {}
    for row in rows:
        t, b, rate = row.get("tool", ""), row.get("broker", ""), row.get("rate_attempted", "")
        if t and b and rate:
            raw.setdefault(t, {}).setdefault(b, {}).setdefault(rate, []).append(row)
    out = {}
    for t, bs in raw.items():
        for b, rates in bs.items():
            for rate, rs in rates.items():
                after = median([num(r.get("p99_after_first_us")) for r in rs])
                whole = median([num(r.get("p99_us")) for r in rs])
                out.setdefault(t, {}).setdefault(b, {})[rate] = {
                    "p99": after if after is not None else whole, "whole": after is None and whole is not None,
                    "recv": median([num(r.get("recv_rate")) for r in rs]),
                    "rounds": sum(1 for r in rs if num(r.get("recv_rate")) is not None)}
    return out


def cores_model(rows):
    """{(generator, broker): {cores: {"recv", "cpm", "by_round", "gen_cores"}}}."""
    raw = {}
    for row in rows:
        g, b, c = row.get("generator", ""), row.get("broker", ""), num(row.get("broker_cores"))
        if g and b and c is not None:
            raw.setdefault((g, b), {}).setdefault(int(c), []).append(row)
    out = {}
    for key, cs in raw.items():
        for c, rs in cs.items():
            by_round = {}
            for r in rs:
                if num(r.get("recv_rate")) is not None:
                    by_round.setdefault(r.get("round", ""), []).append(num(r.get("recv_rate")))
            out.setdefault(key, {})[c] = {
                "recv": median([num(r.get("recv_rate")) for r in rs]),
                "cpm": median([num(r.get("cpu_s_per_M")) for r in rs]),
                "by_round": {r: median(v) for r, v in by_round.items()},
                "gen_cores": sorted({r.get("generator_cores", "") for r in rs} - {""}),
                "rounds": sum(1 for r in rs if num(r.get("recv_rate")) is not None)}
    return out


# ---- targets ---------------------------------------------------------------------------------

def keeps_up(cell, rate):
    """A broker kept up with an attempted rate: it received at least 95% of it."""
    r = num(rate)
    return r is not None and cell is not None and cell.get("recv") is not None and cell["recv"] >= 0.95 * r


def targets_md(model, sw, tname):
    """Issue 34's targets that this run measures, one line each: the figure and met or not."""
    rows = []
    yes = lambda ok: "**met**" if ok else "not met"  # noqa: E731
    for s, limit in (("S1", 0.6), ("S2P", 1.0)):
        for t in order(model.get(s, {}), TOOLS):
            w, lv = model[s][t].get("warren"), model[s][t].get("lavinmq")
            if not w or not lv:
                continue
            if w.get("cpm") is not None and lv.get("cpm"):
                r = w["cpm"] / lv["cpm"]
                rows.append([f"{s}: Warren's CPU-s/M ≤ {limit:.1f}x LavinMQ's", tname(t),
                             f"{r:.2f}x ({f_cpu(w['cpm'])} against {f_cpu(lv['cpm'])})", yes(r <= limit)])
            ratios = round_ratios(w, lv)
            if ratios:
                m = median(ratios)
                # Three decimals where two would round a miss up to 1.00.
                fig = f"{m:.3f}x" if 0.995 <= m < 1.0 else f"{m:.2f}x"
                rows.append([f"{s}: Warren's rate ≥ LavinMQ's", tname(t), fig, yes(m >= 1.0)])
    for t in order(sw, TOOLS):
        w = sw[t].get("warren", {})
        for b in order(set(sw[t]) - {"warren"}, BROKERS):
            rates = [r for r in sorted(sw[t][b], key=rate_key)
                     if keeps_up(sw[t][b][r], r) and w.get(r, {}).get("p99") is not None
                     and sw[t][b][r].get("p99") is not None]
            if not rates:
                continue
            worse = [r for r in rates if w[r]["p99"] >= sw[t][b][r]["p99"]]
            fig = (f"lower at {len(rates) - len(worse)} of {len(rates)} rates {BROKER_NAMES.get(b, b)} kept up with"
                   + (f" (not at {', '.join(f_rate(num(r)) for r in worse)})" if worse else ""))
            rows.append([f"S4: Warren's p99 below {BROKER_NAMES.get(b, b)}'s at every rate it keeps up with",
                         tname(t), fig, yes(not worse)])
    w = sw.get("warren-perf", {}).get("warren", {})
    top = w.get("unlimited", {}).get("recv")
    if top:
        upto = 0.8 * top
        swept = [r for r in sorted(w, key=rate_key) if num(r) is not None and num(r) <= upto]
        over = [r for r in swept if w[r].get("p99") is None or w[r]["p99"] >= 1000]
        reach = max((num(r) for r in swept), default=0)
        fig = (f"highest rate {f_rate(top)}; p99 under 1 ms at {len(swept) - len(over)} of {len(swept)} rates up to"
               f" {f_rate(upto)}" + (f" (not at {', '.join(f_rate(num(r)) for r in over)})" if over else "")
               + (f"; swept only to {f_rate(reach)}" if reach < 0.9 * upto else ""))
        rows.append(["S4: p99 under 1 ms up to 80% of Warren's highest rate", tname("warren-perf"), fig,
                     yes(bool(swept) and not over and reach >= 0.9 * upto)])
    if not rows:
        return []
    return (["## Targets of issue 34 that this run measures", "",
             "Medians from the tables below; the CPU ratio is of the median CPU-s/M. The targets this run does"
             " not measure (persistent confirms' latency, idle connections, forwarding) are in the sections"
             " further down and in the notes.", ""]
            + table(["target", "generator", "this run", ""], rows, ["l", "l", "l", "l"]) + [""])


# ---- SVG -------------------------------------------------------------------------------------

def colour(broker, i=0):
    return BROKER_COLOURS.get(broker, OTHER_COLOURS[i % len(OTHER_COLOURS)])


class Svg:
    def __init__(self, w, h):
        self.w, self.h, self.el = w, h, []

    def add(self, s):
        self.el.append(s)

    def text(self, x, y, s, anchor="start", size=12, weight="normal", fill="#222222", rotate=None):
        tr = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate is not None else ""
        bold = ' font-weight="bold"' if weight != "normal" else ""
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}"{bold} '
                 f'fill="{fill}"{tr}>{escape(s)}</text>')

    def line(self, x1, y1, x2, y2, stroke="#222222", width=1, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}" '
                 f'stroke-width="{width}"{d}/>')

    def rect(self, x, y, w, h, fill):
        self.add(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}"/>')

    def render(self):
        # An explicit white background: GitHub's dark theme would otherwise put dark text on dark.
        return "\n".join([
            '<?xml version="1.0" encoding="UTF-8"?>',
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.w}" height="{self.h}" '
            f'viewBox="0 0 {self.w} {self.h}" font-family="Helvetica, Arial, sans-serif">',
            f'<rect x="0" y="0" width="{self.w}" height="{self.h}" fill="#ffffff"/>',
            *self.el, "</svg>", ""])


def legend(svg, x, y, items):
    """items: (label, colour); one row from (x, y)."""
    for label, col in items:
        svg.rect(x, y - 9, 12, 12, col)
        svg.text(x + 16, y + 1, label, size=12)
        x += 28 + 7 * len(label)


def nice_step(vmax, n=5):
    raw = vmax / n if vmax > 0 else 1
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def bar_panels(title, panels, series, y_label):
    """panels: [(panel title, [(group label, {series key: value})])]; series: [(key, label, colour)].
    Each panel has its own linear y axis (scenarios differ by orders of magnitude)."""
    bar_w, gap, ph, top, left, below = 24, 18, 230, 70, 62, 48
    widths = [max(left + 20 + len(gs) * (len(series) * bar_w + gap), left + 10 + 8 * len(t)) for t, gs in panels]
    rows, row, used = [], [], 0
    for i, w in enumerate(widths):  # wrap panels into rows of at most 1,100 px
        if row and used + w > 1100:
            rows.append(row)
            row, used = [], 0
        row.append(i)
        used += w
    if row:
        rows.append(row)
    width = max([sum(widths[i] for i in r) for r in rows] + [400]) + 20
    height = top + len(rows) * (ph + below) + 10
    svg = Svg(width, height)
    svg.text(10, 22, title, size=15, weight="bold")
    legend(svg, 10, 46, [(lab, col) for _, lab, col in series])
    for ri, r in enumerate(rows):
        x0, y0 = 10, top + ri * (ph + below)
        for i in r:
            ptitle, groups = panels[i]
            vals = [v for _, gv in groups for v in gv.values() if v is not None]
            top_v = max(vals) * 1.08 if vals and max(vals) > 0 else 1  # room for the value labels
            step = nice_step(top_v)
            ymax = step * max(1, math.ceil(top_v / step))
            base = y0 + ph
            sy = lambda v: base - (v / ymax) * (ph - 20)  # noqa: E731
            svg.text(x0 + left, y0 + 10, ptitle, size=13, weight="bold")
            t = 0.0
            while t <= ymax + step / 2:
                svg.line(x0 + left, sy(t), x0 + widths[i] - 10, sy(t), stroke="#dddddd")
                svg.text(x0 + left - 6, sy(t) + 4, f_tick(t), anchor="end", size=11)
                t += step
            svg.text(x0 + 14, y0 + ph / 2 + 10, y_label, anchor="middle", size=11, rotate=-90)
            svg.line(x0 + left, y0 + 20, x0 + left, base)
            svg.line(x0 + left, base, x0 + widths[i] - 10, base)
            gx = x0 + left + gap / 2
            for glabel, gv in groups:
                for si, (key, _, col) in enumerate(series):
                    v = gv.get(key)
                    bx = gx + si * bar_w
                    if v is None:
                        svg.text(bx + bar_w / 2, base - 3, DASH, anchor="middle", size=10, fill="#666666")
                        continue
                    svg.rect(bx + 1, sy(v), bar_w - 2, base - sy(v), col)
                    svg.text(bx + bar_w / 2, sy(v) - 4, f_compact(v), anchor="middle", size=8.5)
                cx = gx + len(series) * bar_w / 2
                for li, part in enumerate(glabel.split("\n")):
                    svg.text(cx, base + 16 + 13 * li, part, anchor="middle", size=11)
                gx += len(series) * bar_w + gap
            x0 += widths[i]
    return svg.render()


def sweep_chart(title, lines):
    """lines: [(label, colour, [(rate string, p99 µs or None)])]; x = attempted rate, y = p99, both log.
    'unlimited' sits one step right of the highest rate."""
    w, h, left, right, top, bottom = 680, 400, 78, 24, 62, 56
    numeric = sorted({num(r) for _, _, pts in lines for r, _ in pts if num(r) is not None and num(r) > 0})
    unl = any(num(r) is None for _, _, pts in lines for r, _ in pts)
    xmax_num = numeric[-1] if numeric else 1.0
    xpos = lambda r: num(r) if num(r) is not None else xmax_num * 2  # noqa: E731
    xs = numeric + ([xmax_num * 2] if unl else [])
    lx0, lx1 = math.log10(min(xs) / 1.4), math.log10(max(xs) * 1.4)
    ys = [v for _, _, pts in lines for _, v in pts if v is not None and v > 0]
    d0 = math.floor(math.log10(min(ys))) if ys else 1
    d1 = math.ceil(math.log10(max(ys))) if ys else 3
    if d1 <= d0:
        d1 = d0 + 1
    px = lambda x: left + (math.log10(x) - lx0) / (lx1 - lx0) * (w - left - right)  # noqa: E731
    py = lambda y: h - bottom - (math.log10(y) - d0) / (d1 - d0) * (h - top - bottom)  # noqa: E731
    svg = Svg(w, h)
    svg.text(10, 22, title, size=15, weight="bold")
    legend(svg, 10, 46, [(lab, col) for lab, col, _ in lines])
    for d in range(d0, d1 + 1):
        y = py(10 ** d)
        svg.line(left, y, w - right, y, stroke="#dddddd")
        svg.text(left - 6, y + 4, f_us(10 ** d), anchor="end", size=11)
    ticks = [(x, f_tick(x)) for x in numeric] + ([(xmax_num * 2, "unlimited")] if unl else [])
    for x, lab in ticks:
        svg.line(px(x), h - bottom, px(x), h - bottom + 5)
        svg.line(px(x), top, px(x), h - bottom, stroke="#eeeeee")
        svg.text(px(x), h - bottom + 18, lab, anchor="middle", size=11)
    svg.line(left, top - 6, left, h - bottom)
    svg.line(left, h - bottom, w - right, h - bottom)
    svg.text((left + w - right) / 2, h - 12, "attempted msg/s (log scale)", anchor="middle", size=12)
    svg.text(18, (top + h - bottom) / 2, "p99 after the first second (log scale)", anchor="middle", size=12,
             rotate=-90)
    for _, col, pts in lines:
        seg = []
        pts = sorted(((xpos(r), v) for r, v in pts), key=lambda p: p[0])
        for x, v in pts + [(None, None)]:  # a missing point breaks the line
            if v is not None and v > 0:
                seg.append((px(x), py(v)))
                continue
            if len(seg) > 1:
                svg.add(f'<polyline points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in seg)}" fill="none" '
                        f'stroke="{col}" stroke-width="2"/>')
            for a, b in seg:
                svg.add(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3.5" fill="{col}"/>')
            seg = []
    return svg.render()


# ---- the page --------------------------------------------------------------------------------

def rel_links(md, from_dir, to_dir):
    """Rewrites relative Markdown link targets written from FROM_DIR so they resolve from TO_DIR."""
    def fix(m):
        target = m.group(2)
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:|#|/", target):
            return m.group(0)
        path, hash_, frag = target.partition("#")
        new = posixpath.relpath(posixpath.normpath(posixpath.join(from_dir, path)), to_dir)
        return m.group(1) + new + hash_ + frag + m.group(3)
    out, code = [], False
    for ln in md.split("\n"):
        if ln.lstrip().startswith("```"):
            code = not code
        out.append(ln if code else re.sub(r"(\]\()([^)\s]+)(\))", fix, ln))
    return "\n".join(out)


def name(d):
    return os.path.basename(os.path.normpath(d)) if d else None


def render(root, named):
    """{relative path: text} of every output."""
    all_dirs = sorted(d for d in glob.glob(os.path.join(root, "bench", "results", "*")) if os.path.isdir(d))
    perf = pick(named, all_dirs, "runs.tsv", "scenario")
    sweep = pick(named, all_dirs, "sweep.tsv", "rate_attempted")
    cores = pick(named, all_dirs, "runs.tsv", "broker_cores")
    runs = read_tsv(os.path.join(perf, "runs.tsv"))[1] if perf else []
    model, scenarios = scenario_model(runs)
    sw = sweep_model(read_tsv(os.path.join(sweep, "sweep.tsv"))[1]) if sweep else {}
    co = cores_model(read_tsv(os.path.join(cores, "runs.tsv"))[1]) if cores else {}
    if sw:  # the sweep section covers S4 at each rate
        scenarios = [s for s in scenarios if not s.startswith("S4-")]
    commands = {}
    if perf and os.path.isfile(os.path.join(perf, "commands.tsv")):
        for r in read_tsv(os.path.join(perf, "commands.tsv"))[1]:
            commands.setdefault(r.get("scenario", ""), {})[r.get("tool", "")] = r.get("command", "")
    brokers = order({r.get("broker", "") for r in runs} - {""}, BROKERS) or list(BROKERS)
    others = [b for b in brokers if b != "warren"]
    bname = lambda b: BROKER_NAMES.get(b, b)  # noqa: E731
    tname = lambda t: TOOL_NAMES.get(t, t)  # noqa: E731
    files, md = {}, []
    rounds = sorted({c["rounds"] for s in scenarios for t in model[s].values() for c in t.values()})

    md += ["# Benchmarks: Warren vs RabbitMQ 3.10 and LavinMQ 2.8.2", "",
           "<!-- Generated by bench/report.py from bench/results/; edit docs/benchmarks/sections/ or the"
           " script, not this page. -->", "",
           "**How to read this.**", "",
           "- The machine has 2 vCPUs shared by broker and load generator, so absolute rates move by up to 2x"
           " between runs: **only ratios measured in the same run mean anything.**",
           f"- Each figure is the median of {f_rounds(rounds)}, alternating:"
           " in a round every broker runs every generator in turn, and the broker that goes first rotates.",
           f"- Warren / X is the median of the per-round ratios; the small line under it is their min{DASH}max.",
           "- CPU-s/M: the broker's CPU seconds (user + system) per million messages received, lower is"
           " cheaper; p99: the generator's consumer latency.",
           f"- Rows are generators, which cost different CPU on the shared cores: compare brokers within a row."
           f" {DASH} means not measured or no result.", ""]
    md += ["## How to reproduce", "", "```sh",
           "bench/report.sh                # measure (bench/perf.sh, 3 rounds; bench/cores.sh), then render this page",
           "bench/report.sh --render-only  # render this page again from the newest bench/results/",
           "```", "", "The steps it runs:", "", "```sh",
           'BROKERS="warren lavinmq rabbitmq" TOOLS="warren-perf lavinmqperf perftest" ROUNDS=3 bench/perf.sh S1 S2P S2',
           "bench/cores.sh",
           "python3 bench/report.py       # --results DIR to pick a run, --check to compare with this page",
           "```", "",
           "RabbitMQ 3.10 comes from `../shared/bench/rabbitmq.sh` and LavinMQ 2.8.2 from"
           " `../shared/bench/lavinmq.sh` (started if down); Warren is started fresh by each script. Raw"
           " outputs stay in `bench/results/` (not committed).", ""]
    md += ["## Machine and run", ""]
    if perf and os.path.isfile(os.path.join(perf, "header.md")):
        md += [open(os.path.join(perf, "header.md"), encoding="utf-8").read().rstrip("\n"), ""]
    used = [f"`{name(d)}` ({what})" for d, what in ((perf, "scenarios"), (sweep, "latency sweep"), (cores, "cores"))
            if d]
    md += ["Results: " + (", ".join(used) if used else "none found under `bench/results/`") + ".", ""]

    md += targets_md(model, sw, tname)
    md += ["## Throughput by scenario", ""]
    if not scenarios:
        md += ["No `bench/perf.sh` results yet.", ""]
    for s in scenarios:
        tools = order(model[s], TOOLS)
        n = sorted({c["rounds"] for t in model[s].values() for c in t.values()})
        what = SCENARIOS.get(s) or (f"1 producer, 1 consumer, 16 B, autoack, {s[3:]} msg/s" if s.startswith("S4-") else "")
        md += [f"### {s}" + (f": {what}" if what else ""), ""]
        p99 = any(model[s][t].get(b, {}).get("p99") is not None for t in tools for b in brokers)
        head = ["generator"] + [f"{bname(b)} msg/s" for b in brokers] + \
               [f"Warren / {bname(b)}" for b in others] + [f"CPU-s/M {bname(b)}" for b in brokers] + \
               ([f"p99 {bname(b)}" for b in brokers] if p99 else [])
        rows = []
        for t in tools:
            c = model[s][t]
            rows.append([tname(t)] + [f_rate(c.get(b, {}).get("recv")) for b in brokers] +
                        [spread_cell(round_ratios(c.get("warren"), c.get(b))) for b in others] +
                        [f_cpu(c.get(b, {}).get("cpm")) for b in brokers] +
                        ([f_us(c.get(b, {}).get("p99")) for b in brokers] if p99 else []))
        md += table(head, rows, ["l"] + ["r"] * (len(head) - 1))
        md += ["", f"Received msg/s, median of {f_rounds(n)}. Commands (`$URI`: the broker's"
               " AMQP URI):", ""]
        md += [f"- {tname(t)}: `{commands[s][t]}`" for t in tools if commands.get(s, {}).get(t)] or \
              ["- (no commands.tsv row)"]
        md += [""]

    md += ["## Latency against rate (S4 sweep)", ""]
    if not sw:
        md += ["No sweep in these results (`bench/perf.sh` with `SWEEP=1`).", ""]
    else:
        md += [f"S4 (1 producer, 1 consumer, 16 B, autoack) at each attempted rate, from `{name(sweep)}`. The p99"
               " leaves out each run's first second, which holds the generator's own warm-up on these shared"
               " cores (†: no per-second figures, the whole run's p99).", ""]
    for t in order(sw, TOOLS):
        bs = order(sw[t], brokers)
        rates = sorted({r for b in bs for r in sw[t][b]}, key=rate_key)
        head = ["attempted msg/s"]
        for b in bs:
            head += [f"{bname(b)} p99", f"{bname(b)} received msg/s"]
        rows = []
        for r in rates:
            row = [f_rate(num(r)) if num(r) is not None else r]
            for b in bs:
                c = sw[t][b].get(r)
                row += [DASH, DASH] if not c else [f_us(c["p99"]) + (" †" if c["whole"] else ""), f_rate(c["recv"])]
            rows.append(row)
        n = sorted({c["rounds"] for b in bs for c in sw[t][b].values()})
        md += [f"### Generator: {tname(t)}", ""] + table(head, rows, ["r"] * len(head))
        md += ["", f"Median of {f_rounds(n)}."]
        s4 = [(k, v) for k, v in sorted(commands.items(), key=lambda kv: rate_key(kv[0][3:]))
              if k.startswith("S4-") and v.get(t)]
        md += ["Each rate is `bench/perf.sh`'s scenario S4-<rate> with this generator" +
               (":" if s4 else "."), ""] + [f"- `{v[t]}`" for _, v in s4] + ([""] if s4 else [])
        img = f"sweep-{t}.svg"
        files[f"{IMG}/{img}"] = sweep_chart(
            f"S4 sweep, generator {tname(t)}: p99 against attempted rate",
            [(bname(b), colour(b, i), [(r, sw[t][b][r]["p99"]) for r in rates if r in sw[t][b]])
             for i, b in enumerate(bs)])
        md += [f"![S4 sweep, {tname(t)}](benchmarks/img/{img})", ""]

    md += ["## Cores", ""]
    if not co:
        md += ["No `bench/cores.sh` results yet.", ""]
    else:
        cs = sorted({c for v in co.values() for c in v})
        lo, hi = cs[0], cs[-1]
        md += [f"10 queues, 10 producers, 10 consumers, 16 B transient, autoack (`bench/cores.sh`, from"
               f" `{name(cores)}`); the broker pinned to the first N cores. Received msg/s, median of"
               f" {f_rounds(c['rounds'] for v in co.values() for c in v.values())}.", ""]
        gens = order({g for g, _ in co}, TOOLS + ["warren", "lavinmq"])
        head = ["generator", "broker"] + [f"{c} core{'s' if c > 1 else ''}" for c in cs] + \
               ([f"{hi} / {lo} cores"] if hi != lo else []) + [f"CPU-s/M, {c} core{'s' if c > 1 else ''}" for c in cs]
        rows = []
        for g in gens:
            for b in order({b for gg, b in co if gg == g}, BROKERS):
                v = co[(g, b)]
                ratios = []
                if lo in v and hi in v:
                    ratios = [v[hi]["by_round"][r] / v[lo]["by_round"][r] for r in sorted(v[lo]["by_round"], key=round_key)
                              if r in v[hi]["by_round"] and v[lo]["by_round"][r]]
                rows.append([tname(g), bname(b)] + [f_rate(v.get(c, {}).get("recv")) for c in cs] +
                            ([spread_cell(ratios)] if hi != lo else []) + [f_cpu(v.get(c, {}).get("cpm")) for c in cs])
        md += table(head, rows, ["l", "l"] + ["r"] * (len(head) - 2)) + [""]
        gc = {}
        for v in co.values():
            for c, cell in v.items():
                gc.setdefault(c, set()).update(cell["gen_cores"])
        if any(gc.values()):
            md += ["Generator's cores by broker core count: " + "; ".join(
                f"{c}: {', '.join(sorted(gc[c]))}" for c in cs if gc.get(c)) +
                ". On this 2-core machine they overlap the broker's.", ""]
        files[f"{IMG}/cores.svg"] = bar_panels(
            "Received msg/s by broker cores (bench/cores.sh)",
            [(f"generator: {tname(g)}", [(bname(b), {c: co[(g, b)].get(c, {}).get("recv") for c in cs})
                                         for b in order({b for gg, b in co if gg == g}, BROKERS)]) for g in gens],
            [(c, f"{c} core{'s' if c > 1 else ''}", CORE_COLOURS[min(i, len(CORE_COLOURS) - 1)])
             for i, c in enumerate(cs)],
            "received msg/s")
        md += ["![received msg/s by broker cores](benchmarks/img/cores.svg)", ""]

    if scenarios:
        files[f"{IMG}/throughput.svg"] = bar_panels(
            "Received msg/s by scenario and generator (medians)",
            [(s, [(tname(t), {b: model[s][t].get(b, {}).get("recv") for b in brokers}) for t in order(model[s], TOOLS)])
             for s in scenarios],
            [(b, bname(b), colour(b, i)) for i, b in enumerate(brokers)], "received msg/s")
        md += ["## Throughput at a glance", "",
               "Each panel has its own scale; the tables above have the figures.", "",
               "![received msg/s by scenario, generator and broker](benchmarks/img/throughput.svg)", ""]

    md += sections_md(root)
    files[PAGE] = "\n".join(md)
    return files


def section_texts(root):
    """The hand-written sections, in name order, as they read on the page."""
    sec_dir = os.path.join(root, SECTIONS)
    return [rel_links(open(p, encoding="utf-8").read().strip("\n"), SECTIONS, posixpath.dirname(PAGE))
            for p in sorted(glob.glob(os.path.join(sec_dir, "*.md")))]


def sections_md(root):
    """The page's tail: the hand-written sections, then the link to the notes."""
    md = []
    for text in section_texts(root):
        md += [text, ""]
    md += [f"Older runs and the investigations behind these figures: [benchmark notes]({NOTES_INDEX}).", ""]
    return md


def splice_sections(root):
    """The page on disk with its hand-written sections rendered again and the measured part
    above them kept as it is: for a checkout without the bench/results/ the page was made from."""
    page = open(os.path.join(root, PAGE), encoding="utf-8", newline="").read()
    lines = page.split("\n")
    heads = {t.split("\n", 1)[0] for t in section_texts(root)}
    starts = [i for i, ln in enumerate(lines) if ln in heads]
    if not starts:
        raise SystemExit(f"report.py: no hand-written section's heading found in {PAGE}")
    return {PAGE: "\n".join(lines[:starts[0]] + sections_md(root))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--results", action="append", default=[], metavar="DIR",
                    help="a perf-* or cores-* results directory to use (repeatable)")
    ap.add_argument("--check", action="store_true", help="exit 1 if the files on disk differ; write nothing")
    ap.add_argument("--sections-only", action="store_true",
                    help="render only the hand-written sections into the page on disk, keeping its measured part")
    a = ap.parse_args(argv)
    for d in a.results:
        if not os.path.isdir(d):
            ap.error(f"--results {d}: not a directory")
    files = splice_sections(a.root) if a.sections_only else render(a.root, a.results)
    img_dir = os.path.join(a.root, IMG)
    stale = [os.path.relpath(p, a.root).replace(os.sep, "/") for p in sorted(glob.glob(os.path.join(img_dir, "*.svg")))]
    stale = [] if a.sections_only else [p for p in stale if p not in files]
    if a.check:
        bad = list(stale)
        for rel, text in sorted(files.items()):
            p = os.path.join(a.root, rel)
            if not os.path.isfile(p) or open(p, encoding="utf-8", newline="").read() != text:
                bad.append(rel)
        for rel in bad:
            print(f"report.py: {rel} differs from what bench/report.py renders", file=sys.stderr)
        return 1 if bad else 0
    os.makedirs(img_dir, exist_ok=True)
    for rel in stale:
        os.remove(os.path.join(a.root, rel))
    for rel, text in sorted(files.items()):
        with open(os.path.join(a.root, rel), "w", encoding="utf-8", newline="") as f:
            f.write(text)
        print(f"report.py: wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
