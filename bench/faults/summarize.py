#!/usr/bin/env python3
"""Summary table (Markdown, for docs/reliability.md) of checker.py's JSON lines.

  summarize.py RESULTS.jsonl [--batch ID]    only the runs of one run.sh invocation with --batch
"""
from __future__ import annotations

import argparse
import json
import sys

ROLE_SHOWN = {"pause", "partition", "torn", "stall"}


def torn_target(f: dict) -> str | None:
    """What a torn fault damaged, for a stream run: the stream's segment file ("seg"), its Raft
    group's log ("group"), or another file (the cluster's Raft log: "raft")."""
    path = (f.get("torn") or {}).get("file") or ""
    if not path:
        return None
    if path.startswith("vhosts/"):
        return "group" if "/group/" in path else "seg"
    return path.split("/")[0]


def fault_text(f: dict, run: dict) -> str:
    k = f["kind"]
    if k == "torn" and str(run.get("torn", "")).startswith("append"):
        k = "torn-append"
    if f["kind"] == "torn" and run.get("workload") == "stream" and torn_target(f):
        k = f"{k}[{torn_target(f)}]"
    if f.get("skipped"):
        return f"{k}(skipped)"
    if f["kind"] in ROLE_SHOWN and f.get("role"):
        return f"{k}({f['role'][0].upper()})"
    return k


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("results")
    p.add_argument("--batch")
    a = p.parse_args()
    runs = []
    with open(a.results) as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if a.batch and r.get("batch") != a.batch:
                continue
            runs.append(r)
    if not runs:
        print("no runs", file=sys.stderr)
        return 1
    # one table per workload (checker.py --workload; a line without the key is a quorum queue's)
    groups: dict[str, list] = {}
    for r in runs:
        groups.setdefault(r.get("workload", "quorum"), []).append(r)
    rc = 0
    for i, (w, rs) in enumerate(groups.items()):
        if len(groups) > 1:
            print(("\n" if i else "") + f"### {'quorum queue' if w == 'quorum' else w} ({len(rs)} runs)\n")
        rc |= table(rs, w)
    return rc


def table(runs: list, workload: str) -> int:
    stream = workload == "stream"
    # a stream's violations are its consumers' (order, skipped offsets, start), not redelivered flags
    print("| seed | faults (L: on the leader, F: on a follower) | published | confirmed | lost | duplicates "
          f"| {'consumer violations' if stream else 'flag violations'} | max unavailable (s) | failover (ms) "
          "| wall (s) | result |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---|")
    tot = {"published": 0, "confirmed": 0, "lost": 0, "duplicates": 0, "violations": 0}
    failovers = []
    failed = []
    for r in runs:
        c = r.get("counts") or {}
        faults = ", ".join(fault_text(f, r) for f in r.get("faults", [])) or "-"
        fo = [x for x in c.get("failover_ms", []) if x is not None]
        failovers += fo
        for k in tot:
            tot[k] += c.get(k, 0) or 0
        tot["lost"] += c.get("lost_after_delivery", 0) or 0
        if r.get("error"):
            result = "ERROR"
        else:
            result = "ok" if r.get("ok") else "FAIL"
        if result != "ok":
            failed.append(r)
        lost = c.get("lost", "-")
        if c.get("lost_after_delivery"):
            lost = f"{lost} (+{c['lost_after_delivery']} after delivery)"
        if stream and c.get("lost_on_some_node", 0) > (c.get("lost") or 0):
            lost = f"{lost} ({c['lost_on_some_node']} missing from a copy)"
        if stream and (c.get("offset_conflicts") or c.get("copy_problem_count")):
            lost = f"{lost}; copies differ"
        print(f"| {r['seed']}{' (short)' if r.get('short') else ''} | {faults} | {c.get('published', '-')} "
              f"| {c.get('confirmed', '-')} | {lost} | {c.get('duplicates', '-')} "
              f"| {c.get('violations', '-')} | {c.get('max_unavailable_s', '-')} "
              f"| {', '.join(str(x) for x in fo) or '-'} | {r.get('wall_s', '-')} | {result} |")
    print(f"| **{len(runs)} runs** | | {tot['published']} | {tot['confirmed']} | {tot['lost']} "
          f"| {tot['duplicates']} | {tot['violations']} | "
          f"{max((r.get('counts') or {}).get('max_unavailable_s', 0) for r in runs)} "
          f"| {'median ' + str(sorted(failovers)[len(failovers) // 2]) if failovers else '-'} "
          f"| | {len(runs) - len(failed)} ok |")
    for r in failed:
        print(f"\nseed {r['seed']}: {'harness error: ' + r['error'].splitlines()[-1] if r.get('error') else 'FAIL'}"
              f" (run dir {r.get('dir')})", file=sys.stderr)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
