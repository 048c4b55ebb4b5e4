#!/usr/bin/env python3
"""Time paged management listings with many queues (issue 33: "100,000 queues stay usable").

    bench/mgmt_paging.py [--queues 100000] [--amqp 5672] [--http 15672] [--rounds 5]
    bench/mgmt_paging.py --queues 100000 --write-definitions defs.json   # then:
    warren server --definitions defs.json ... ; bench/mgmt_paging.py --declared --http ...

Declares N non-durable queues on a running Warren (or RabbitMQ) over AMQP (slow: one round trip
each), or with --declared uses those a definitions file made by --write-definitions loaded
(fast), then times GET /api/queues as the web UI asks for it (page 1 and the last page of 100,
sorted by name reversed, by a rate, filtered by a regex) and the whole unpaged list, ROUNDS
times each, and prints the median and max in ms and the response sizes. Needs pika
(tests/interop/python's venv has it). Queues it declared are deleted afterwards."""

import argparse
import base64
import json
import statistics
import time
import urllib.request

import pika


def get(url: str) -> bytes:
    req = urllib.request.Request(url)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.read()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queues", type=int, default=100000)
    ap.add_argument("--amqp", type=int, default=5672)
    ap.add_argument("--http", type=int, default=15672)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--declared", action="store_true", help="the queues are there already")
    ap.add_argument("--write-definitions", metavar="FILE", help="write a definitions file and exit")
    a = ap.parse_args()
    names = [f"paging-{i:06}" for i in range(a.queues)]
    if a.write_definitions:
        with open(a.write_definitions, "w") as f:
            json.dump({"queues": [{"name": n, "vhost": "/", "durable": False, "auto_delete": False,
                                   "arguments": {}} for n in names]}, f)
        return
    ch = c = None
    if not a.declared:
        c = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{a.amqp}/%2f"))
        ch = c.channel()
        t = time.monotonic()
        for n in names:
            ch.queue_declare(n, durable=False)
        print(f"declared {a.queues} queues in {time.monotonic() - t:.1f} s")
    base = f"http://127.0.0.1:{a.http}/api/queues"
    last = (a.queues + 99) // 100
    cases = [
        ("page 1 of 100", "?page=1&page_size=100"),
        (f"page {last} of 100, sort=name reversed", f"?page={last}&page_size=100&sort=name&sort_reverse=true"),
        ("page 1, sort by publish rate", "?page=1&page_size=100&sort=message_stats.publish_details.rate"),
        ("page 1, name regex", "?page=1&page_size=100&name=" + urllib.request.quote("-0[0-4]9") + "&use_regex=true"),
        ("unpaged (the whole list)", ""),
    ]
    try:
        for label, query in cases:
            times, size = [], 0
            for _ in range(a.rounds):
                t = time.monotonic()
                size = len(get(base + query))
                times.append((time.monotonic() - t) * 1000)
            print(f"{label:45} median {statistics.median(times):8.1f} ms  max {max(times):8.1f} ms  "
                  f"{size / 1024:10.1f} KiB")
    finally:
        if c is not None:
            for n in names:
                ch.queue_delete(n)
            c.close()


if __name__ == "__main__":
    main()
