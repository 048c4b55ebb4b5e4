#!/usr/bin/env python3
"""Time to declare N queues and bind each to one exchange, one call after another (pika).

    bench/declarations.py PORT N [--durable]

Prints the elapsed time at every quarter of N. Declares exchange `bench-decl[-d]` (direct) and
queues `bench-decl[-d]-<i>`, bound by their names; deletes them all at the end (not timed). Run
it against Warren and RabbitMQ (127.0.0.1:5673) one after the other, each alone on the machine.
Needs pika (the interop suite's venv: .venv-interop/bin/python).
"""
import sys
import time

import pika


def main() -> None:
    port, n, durable = int(sys.argv[1]), int(sys.argv[2]), "--durable" in sys.argv[3:]
    x = "bench-decl-d" if durable else "bench-decl"
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = c.channel()
    ch.exchange_declare(x, "direct", durable=durable)
    t0, marks = time.monotonic(), []
    for i in range(n):
        q = f"{x}-{i}"
        ch.queue_declare(q, durable=durable)
        ch.queue_bind(q, x, routing_key=q)
        if (i + 1) % max(1, n // 4) == 0:
            marks.append(f"{i + 1}: {time.monotonic() - t0:.1f} s")
    print(("durable" if durable else "transient"), "queues and bindings,", ", ".join(marks))
    for i in range(n):
        ch.queue_delete(f"{x}-{i}")
    ch.exchange_delete(x)
    c.close()


if __name__ == "__main__":
    main()
