#!/usr/bin/env python3
"""Totals of a batch of checker runs, for docs/reliability.md: runs, faults by kind and role,
messages, losses, duplicates, redelivered-flag violations, failover and unavailability
(median and max), and the builds the runs used.

  stats.py RESULTS.jsonl [--batch ID]
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("results")
    p.add_argument("--batch")
    a = p.parse_args()
    runs = []
    with open(a.results) as fh:
        for line in fh:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if a.batch is None or r.get("batch") == a.batch:
                runs.append(r)
    if not runs:
        print("no runs")
        return 1
    kinds = collections.Counter()
    torn_files = collections.Counter()
    for r in runs:
        for f in r.get("faults", []):
            if not f.get("skipped"):
                kinds[f"{f['kind']} ({f.get('role', '?')})"] += 1
            if f["kind"] == "torn" and r.get("workload") == "stream" and not f.get("skipped"):
                path = (f.get("torn") or {}).get("file") or ""
                torn_files[("stream group log" if "/group/" in path else "stream segment")
                           if path.startswith("vhosts/") else (path.split("/")[0] or "none")] += 1
    workloads = collections.Counter(r.get("workload", "quorum") for r in runs)
    c = [r.get("counts", {}) for r in runs]
    failover = [ms for x in c for ms in x.get("failover_ms", [])]
    unavail = [x.get("max_unavailable_s", 0) for x in c]
    ok = sum(1 for r in runs if r.get("ok"))
    seeds = sorted(r["seed"] for r in runs)
    builds = collections.Counter(r.get("binary", {}).get("mtime", "?") for r in runs)
    print(f"runs: {len(runs)} (seeds {seeds[0]}-{seeds[-1]}), passed {ok}, failed {len(runs) - ok}")
    print("builds (binary mtime: runs): " + ", ".join(f"{k}: {v}" for k, v in sorted(builds.items())))
    if set(workloads) != {"quorum"}:
        print("workloads: " + ", ".join(f"{k} {v}" for k, v in sorted(workloads.items())))
    print("faults applied: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + f"; total {sum(kinds.values())}")
    if torn_files:
        print("torn, on a stream run, damaged: " + ", ".join(f"{k} {v}" for k, v in sorted(torn_files.items())))
    for k in ("published", "confirmed", "nacked", "unknown", "received", "lost", "lost_after_delivery",
              "duplicates", "violations", "acked_then_redelivered", "phantom"):
        print(f"{k}: {sum(x.get(k, 0) for x in c)}")
    if "stream" in workloads:
        # the stream workload's own checks (checker.py --workload stream)
        for k in ("lost_on_some_node", "offset_conflicts", "copy_problem_count", "duplicates_confirmed",
                  "stream_messages"):
            print(f"stream {k}: {sum(x.get(k, 0) or 0 for x in c)}")
    if failover:
        print(f"failover ms (leader kill -> next confirm), {len(failover)} kills: median "
              f"{statistics.median(failover):.0f}, p90 {sorted(failover)[int(len(failover) * 0.9) - 1] if len(failover) >= 10 else max(failover)}, "
              f"max {max(failover)}, min {min(failover)}")
    print(f"max unavailable per run (s): median {statistics.median(unavail):.2f}, max {max(unavail):.2f}")
    print(f"wall per run (s): median {statistics.median(r.get('wall_s', 0) for r in runs):.1f}")
    for r in runs:
        if not r.get("ok"):
            print(f"FAILED seed {r['seed']}: {r.get('failures')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
