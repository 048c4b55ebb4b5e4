#!/usr/bin/env python3
"""What a reply's wait for its effect on the queue's node costs (issue 32): the latency of
basic.cancel, channel.close (with unacked deliveries), queue.declare (passive, of an x-expires
queue) and connection.close (with an exclusive queue), through node 2 of a 3-node cluster for
a classic queue whose home is node 1, as a client sees it (pika, blocking), for each build
given. Builds are interleaved over rounds (a fresh cluster per build and round); the report is
the median over rounds of each build's median, in microseconds.

    bench/through_any_node.py --bin OLD=/path/to/warren --bin NEW=target/release/warren \
        [--rounds 3] [--reps 200]

Not a test: nothing is asserted. Needs the interop venv (pika): .venv-interop/bin/python.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

OPS = ["cancel", "channel_close_10_unacked", "declare_passive_x_expires", "connection_close_exclusive"]


def measure(reps: int) -> dict:
    """Runs in a child process with WARREN_BIN set: one cluster, every op `reps` times."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "interop", "python"))
    import pika  # noqa: E402
    from cluster_harness import Cluster  # noqa: E402

    c = Cluster("bench")
    c.start()
    try:
        home, client, _ = c.nodes
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            st, rows = client.api("GET", "/api/nodes")
            if st == 200 and all(r.get("running") for r in rows) and len(rows) == 3:
                break
            time.sleep(0.2)
        hc = pika.BlockingConnection(home.params())
        hch = hc.channel()
        args = {"x-queue-master-locator": "client-local"}
        hch.queue_declare("bench.q", arguments=args)
        hch.queue_declare("bench.exp", arguments=dict(args, **{"x-expires": 600_000}))
        for i in range(10):
            hch.basic_publish("", "bench.q", b"x" * 100)
        conn = pika.BlockingConnection(client.params())
        out: dict[str, list[float]] = {k: [] for k in OPS}
        for _ in range(reps):
            ch = conn.channel()
            tag = ch.basic_consume("bench.q", lambda *a: None, auto_ack=False)
            t = time.perf_counter()
            ch.basic_cancel(tag)
            out["cancel"].append(time.perf_counter() - t)
            ch.close()

            ch = conn.channel()
            ch.basic_qos(prefetch_count=10)
            got = []
            ch.basic_consume("bench.q", lambda c_, m, p, b: got.append(m.delivery_tag), auto_ack=False)
            while len(got) < 10:
                conn.process_data_events(time_limit=0.01)
            t = time.perf_counter()
            ch.close()
            out["channel_close_10_unacked"].append(time.perf_counter() - t)

            ch = conn.channel()
            t = time.perf_counter()
            ch.queue_declare("bench.exp", passive=True)
            out["declare_passive_x_expires"].append(time.perf_counter() - t)
            ch.close()

            x = pika.BlockingConnection(client.params())
            x.channel().queue_declare("", exclusive=True)
            t = time.perf_counter()
            x.close()
            out["connection_close_exclusive"].append(time.perf_counter() - t)
        conn.close()
        hc.close()
        return {k: statistics.median(v) * 1e6 for k, v in out.items()}
    finally:
        c.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", action="append", required=True, help="LABEL=PATH")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(measure(a.reps)))
        return 0
    builds = [b.split("=", 1) for b in a.bin]
    results: dict[str, list[dict]] = {label: [] for label, _ in builds}
    for r in range(a.rounds):
        for label, path in builds:
            env = dict(os.environ, WARREN_BIN=os.path.abspath(path))
            p = subprocess.run([sys.executable, __file__, "--child", "--reps", str(a.reps), "--bin", "x=y"],
                               env=env, capture_output=True, text=True, check=True)
            got = json.loads(p.stdout.strip().splitlines()[-1])
            results[label].append(got)
            print(f"round {r + 1} {label}: " + ", ".join(f"{k} {v:.0f} us" for k, v in got.items()), flush=True)
    print()
    print("| operation (median of per-round medians, us) | " + " | ".join(l for l, _ in builds) + " |")
    print("|---|" + "---|" * len(builds))
    for op in OPS:
        cells = [f"{statistics.median(x[op] for x in results[l]):.0f}" for l, _ in builds]
        print(f"| {op} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
