#!/usr/bin/env python3
"""Time Prometheus scrapes and management listings with many queues (issue 17: "a scrape of
10,000 queues stays fast").

    bench/metrics_scrape.py [--queues 10000] [--amqp 5672] [--http 15672] [--rounds 5]

Declares N non-durable queues (one message in each) on a running Warren, then times GET
/metrics, /metrics/per-object, /api/overview and /api/queues, ROUNDS times each, and prints the
median and max in ms, and the response sizes. Needs pika (tests/interop/python's venv has it).
The queues are deleted afterwards."""

import argparse
import base64
import statistics
import time
import urllib.request

import pika


def get(url: str, auth: bool) -> bytes:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queues", type=int, default=10000)
    ap.add_argument("--amqp", type=int, default=5672)
    ap.add_argument("--http", type=int, default=15672)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    c = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{a.amqp}/%2f"))
    ch = c.channel()
    names = [f"scrape-{i}" for i in range(a.queues)]
    t = time.monotonic()
    for n in names:
        ch.queue_declare(n, auto_delete=False)
        ch.basic_publish("", n, b"x")
    print(f"declared {a.queues} queues in {time.monotonic() - t:.1f} s")
    base = f"http://127.0.0.1:{a.http}"
    for path, auth in [("/metrics", False), ("/metrics/per-object", False),
                       ("/api/overview", True), ("/api/queues", True)]:
        times, size = [], 0
        for _ in range(a.rounds):
            t = time.monotonic()
            size = len(get(base + path, auth))
            times.append((time.monotonic() - t) * 1000)
        print(f"{path:22} median {statistics.median(times):8.1f} ms  max {max(times):8.1f} ms  "
              f"{size / 1024:8.0f} KiB")
    for n in names:
        ch.queue_delete(n)
    c.close()


if __name__ == "__main__":
    main()
