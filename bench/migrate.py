#!/usr/bin/env python3
"""The migration of a live RabbitMQ workload onto Warren with shovels, measured (issue 36,
item 5; docs/shovel.md walks the same steps for an operator).

    bench/migrate.py [--messages 100000] [--queues 10] [--size 1024] [--kill-at 0.5]
                     [--live-rate 200] [--out FILE.md]

1. RabbitMQ 3.10 (../shared/bench/rabbitmq.sh, started if down) holds MESSAGES persistent
   SIZE-byte messages in QUEUES durable queues (each with a unique message_id), published with
   confirms; Warren (WARREN_BIN, default target/release/warren) starts fresh with the same
   queues.
2. The applications switch over while the move runs: a consumer reads every queue on Warren
   (acking each message after recording its id), a publisher keeps publishing to RabbitMQ at
   LIVE_RATE msg/s, then (once KILL_AT of the backlog moved) to Warren instead.
3. A shovel per queue on Warren, RabbitMQ -> Warren, `ack-mode` on-confirm.
4. Warren is killed (-9) once KILL_AT of the backlog has reached it, and restarted on the same
   data directory and ports; the consumer reconnects (not with --no-kill).
5. Done when RabbitMQ's queues are empty and the consumer has every id published. Reported:
   published, received (unique), lost (published, never received), duplicates, the time from
   the shovels' creation to the end, and the shovels' rate.
6. In the same run, with nothing else running, the same backlog (MESSAGES in QUEUES queues)
   moved by Warren's shovels from RabbitMQ to Warren, by Warren's shovels between queues of one
   Warren, and by RabbitMQ's own shovel between queues of the one RabbitMQ node: their times and
   rates beside the migration's.

Loopback only; stops by itself (a 15-minute bound). Exit status 1 if a message was lost.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pika

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
RABBITMQ_SH = os.path.abspath(os.path.join(ROOT, "..", "shared", "bench", "rabbitmq.sh"))
RMQ_URL = "amqp://guest:guest@127.0.0.1:5673/%2F"
RMQ_API = "http://127.0.0.1:15673"
BOUND_S = 900


def api(base: str, method: str, path: str, body=None):
    req = urllib.request.Request(base + path, method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw.strip() else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw.strip() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Warren:
    def __init__(self, binary: str):
        self.binary = binary
        self.dir = tempfile.mkdtemp(prefix="warren-migrate-")
        self.port, self.http = free_port(), free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.http}"

    def start(self) -> None:
        log = open(os.path.join(self.dir, "warren.log"), "ab")
        self.proc = subprocess.Popen([self.binary, "server", "--amqp-port", str(self.port),
                                      "--http-port", str(self.http), "--data-dir",
                                      os.path.join(self.dir, "data")],
                                     stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if api(self.api, "GET", "/api/overview")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"Warren did not start; see {self.dir}/warren.log")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def depth(url: str, queue: str) -> int:
    c = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return c.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        c.close()


def declare(url: str, queues: list[str], purge: bool) -> None:
    c = pika.BlockingConnection(pika.URLParameters(url))
    ch = c.channel()
    for q in queues:
        ch.queue_declare(q, durable=True)
        if purge:
            ch.queue_purge(q)
    c.close()


def preload_all(url: str, queues: list[str], n: int, size: int) -> None:
    """n messages in each queue (ids QUEUE-0..), a publishing thread per queue."""
    threads = [threading.Thread(target=preload, args=(url, q, n, size, q)) for q in queues]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def preload(url: str, queue: str, n: int, size: int, prefix: str) -> None:
    """n persistent messages with ids PREFIX-0.., confirmed in batches (a transaction of 500
    is RabbitMQ's fastest safe path for pika's blocking client)."""
    c = pika.BlockingConnection(pika.URLParameters(url))
    ch = c.channel()
    ch.tx_select()
    body = b"x" * size
    for i in range(n):
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2, message_id=f"{prefix}-{i}"))
        if i % 500 == 499:
            ch.tx_commit()
    ch.tx_commit()
    c.close()


class Consumer(threading.Thread):
    """Consumes every queue on Warren, recording ids; reconnects while Warren is down."""

    def __init__(self, warren: Warren, queues: list[str]):
        super().__init__(daemon=True)
        self.warren, self.queues = warren, queues
        self.seen: dict[str, int] = {}
        self.received = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                c = pika.BlockingConnection(pika.URLParameters(self.warren.url + "?heartbeat=10"))
                ch = c.channel()
                ch.basic_qos(prefetch_count=500)

                def on(ch, m, p, body):
                    with self.lock:
                        self.seen[p.message_id] = self.seen.get(p.message_id, 0) + 1
                        self.received += 1
                    ch.basic_ack(m.delivery_tag)

                for q in self.queues:
                    ch.basic_consume(q, on)
                while not self.stop.is_set():
                    c.process_data_events(time_limit=0.2)
                c.close()
            except Exception:
                time.sleep(0.2)


class LivePublisher(threading.Thread):
    """Publishes at `rate` msg/s round the queues, with confirms, to RabbitMQ, then (once
    `switch` is set) to Warren; an id is counted published only once confirmed."""

    def __init__(self, warren: Warren, queues: list[str], rate: int, size: int):
        super().__init__(daemon=True)
        self.warren, self.queues, self.rate, self.size = warren, queues, rate, size
        self.switch, self.stop = threading.Event(), threading.Event()
        self.published: set[str] = set()
        self.n = 0

    def run(self) -> None:
        body = b"y" * self.size
        while not self.stop.is_set():
            url = self.warren.url if self.switch.is_set() else RMQ_URL
            try:
                c = pika.BlockingConnection(pika.URLParameters(url))
                ch = c.channel()
                ch.confirm_delivery()
                target = self.switch.is_set()
                while not self.stop.is_set() and self.switch.is_set() == target:
                    mid = f"live-{self.n}"
                    ch.basic_publish("", self.queues[self.n % len(self.queues)], body,
                                     pika.BasicProperties(delivery_mode=2, message_id=mid))
                    self.published.add(mid)
                    self.n += 1
                    time.sleep(1.0 / self.rate)
                c.close()
            except Exception:
                # Unconfirmed: this id is not counted (it may still arrive, as a duplicate-free extra).
                time.sleep(0.2)


def rabbitmq_own_shovel(queues: list[str], per_queue: int, size: int) -> tuple[float, int]:
    """RabbitMQ's shovel moving the same backlog between queues of the one RabbitMQ node."""
    srcs = [f"{q}-rmq-src" for q in queues]
    dests = [f"{q}-rmq-dest" for q in queues]
    declare(RMQ_URL, srcs + dests, purge=True)
    preload_all(RMQ_URL, srcs, per_queue, size)
    t0 = time.monotonic()
    for s, d in zip(srcs, dests):
        st, body = api(RMQ_API, "PUT", f"/api/parameters/shovel/%2F/{s}", {"value": {
            "src-uri": "amqp://", "src-queue": s, "dest-uri": "amqp://", "dest-queue": d,
            "ack-mode": "on-confirm"}})
        assert st in (201, 204), body
    total = per_queue * len(queues)
    while sum(depth(RMQ_URL, d) for d in dests) < total:
        assert time.monotonic() - t0 < BOUND_S, "RabbitMQ's shovels did not finish"
        time.sleep(0.2)
    took = time.monotonic() - t0
    for s in srcs:
        api(RMQ_API, "DELETE", f"/api/parameters/shovel/%2F/{s}")
    c = pika.BlockingConnection(pika.URLParameters(RMQ_URL))
    ch = c.channel()
    for q in srcs + dests:
        ch.queue_delete(q)
    c.close()
    return took, total


def timed_move(w: Warren, queues: list[str], per_queue: int, size: int, src_uri: str) -> tuple[float, int]:
    """Warren's shovels moving a backlog of PER_QUEUE messages in each queue, with nothing else
    running: from RabbitMQ (SRC_URI RabbitMQ's) or within Warren (SRC_URI `amqp://`)."""
    local = src_uri == "amqp://"
    srcs = [f"{q}-plain-src" for q in queues]
    dests = [f"{q}-plain-dest" for q in queues]
    src_url = w.url if local else RMQ_URL
    declare(src_url, srcs, purge=True)
    declare(w.url, dests, purge=True)
    preload_all(src_url, srcs, per_queue, size)
    t0 = time.monotonic()
    for s_, d in zip(srcs, dests):
        st, body = api(w.api, "PUT", f"/api/parameters/shovel/%2F/{s_}", {"value": {
            "src-uri": src_uri, "src-queue": s_, "dest-uri": "amqp://", "dest-queue": d}})
        assert st == 201, body
    total = per_queue * len(queues)
    while sum(depth(w.url, d) for d in dests) < total:
        assert time.monotonic() - t0 < BOUND_S, "Warren's shovels did not finish"
        time.sleep(0.2)
    took = time.monotonic() - t0
    for s_ in srcs:
        api(w.api, "DELETE", f"/api/parameters/shovel/%2F/{s_}")
    if not local:
        c = pika.BlockingConnection(pika.URLParameters(RMQ_URL))
        ch = c.channel()
        for q in srcs:
            ch.queue_delete(q)
        c.close()
    return took, total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--queues", type=int, default=10)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--kill-at", type=float, default=0.5,
                    help="kill -9 Warren once this fraction of the backlog arrived (the publisher "
                         "switches to Warren then); --no-kill switches it without a kill")
    ap.add_argument("--no-kill", action="store_true")
    ap.add_argument("--live-rate", type=int, default=200)
    ap.add_argument("--out")
    a = ap.parse_args()
    binary = os.environ.get("WARREN_BIN", os.path.join(ROOT, "target", "release", "warren"))
    if subprocess.run([RABBITMQ_SH, "start"], capture_output=True).returncode != 0:
        print("cannot start RabbitMQ (../shared/bench/rabbitmq.sh start)", file=sys.stderr)
        return 2
    queues = [f"migrate-{i}" for i in range(a.queues)]
    per_queue = a.messages // a.queues
    print(f"== preloading RabbitMQ: {per_queue * a.queues} persistent {a.size}-byte messages in {a.queues} queues", flush=True)
    declare(RMQ_URL, queues, purge=True)
    preload_all(RMQ_URL, queues, per_queue, a.size)
    preloaded = {f"{q}-{i}" for q in queues for i in range(per_queue)}
    w = Warren(binary)
    w.start()
    try:
        declare(w.url, queues, purge=False)
        consumer = Consumer(w, queues)
        consumer.start()
        live = LivePublisher(w, queues, a.live_rate, a.size)
        live.start()
        print("== shovels RabbitMQ -> Warren (on-confirm), consumer on Warren, publisher still on RabbitMQ", flush=True)
        t0 = time.monotonic()
        for q in queues:
            st, body = api(w.api, "PUT", f"/api/parameters/shovel/%2F/{q}", {"value": {
                "src-uri": RMQ_URL, "src-queue": q, "dest-uri": "amqp://", "dest-queue": q}})
            assert st == 201, body
        killed = False
        while True:
            assert time.monotonic() - t0 < BOUND_S, "the migration did not finish"
            with consumer.lock:
                got = consumer.received
            if not killed and got >= a.kill_at * len(preloaded):
                if not a.no_kill:
                    print(f"== kill -9 Warren at {got} received; restarting it", flush=True)
                    w.kill9()
                    w.start()
                killed = True
                live.switch.set()
                print("== publisher switched to Warren", flush=True)
            if killed:
                left = sum(depth(RMQ_URL, q) for q in queues)
                with consumer.lock:
                    have = set(consumer.seen)
                if left == 0 and preloaded <= have:
                    break
            time.sleep(0.2)
        took = time.monotonic() - t0
        live.stop.set()
        live.join(10)
        # Whatever was confirmed to the live publisher must arrive too.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with consumer.lock:
                have = set(consumer.seen)
            if live.published <= have:
                break
            time.sleep(0.2)
        consumer.stop.set()
        consumer.join(10)
        published = preloaded | live.published
        with consumer.lock:
            seen = dict(consumer.seen)
        lost = published - set(seen)
        dups = sum(n - 1 for n in seen.values() if n > 1)
        shovel_status = api(w.api, "GET", "/api/shovels")[1]
    finally:
        w.stop()
    print("== the same backlog with nothing else running: Warren's shovels from RabbitMQ, within Warren", flush=True)
    w2 = Warren(binary)
    w2.start()
    try:
        plain_took, plain_n = timed_move(w2, queues, per_queue, a.size, RMQ_URL)
        within_took, within_n = timed_move(w2, queues, per_queue, a.size, "amqp://")
    finally:
        w2.stop()
    print("== RabbitMQ's own shovel, the same backlog within the one RabbitMQ node", flush=True)
    rmq_took, rmq_n = rabbitmq_own_shovel(queues, per_queue, a.size)
    c = pika.BlockingConnection(pika.URLParameters(RMQ_URL))
    ch = c.channel()
    for q in queues:
        ch.queue_delete(q)
    c.close()
    rate = len(preloaded) / took
    lines = [
        f"- command: `bench/migrate.py --messages {a.messages} --queues {a.queues} --size {a.size} "
        f"--kill-at {a.kill_at} --live-rate {a.live_rate}{' --no-kill' if a.no_kill else ''}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {os.cpu_count()} cores, "
        "Warren and RabbitMQ 3.10 on the same host",
        "",
        "| | messages | time (s) | rate (msg/s) |",
        "|---|---:|---:|---:|",
        f"| Warren's shovels, RabbitMQ -> Warren (on-confirm{'' if a.no_kill else ', Warren killed -9 once'}) | {len(preloaded)} | {took:.1f} | {rate:,.0f} |",
        f"| Warren's shovels, RabbitMQ -> Warren (on-confirm), nothing else running | {plain_n} | {plain_took:.1f} | {plain_n / plain_took:,.0f} |",
        f"| Warren's shovels, queue -> queue within Warren (on-confirm) | {within_n} | {within_took:.1f} | {within_n / within_took:,.0f} |",
        f"| RabbitMQ's shovels, queue -> queue within RabbitMQ (on-confirm) | {rmq_n} | {rmq_took:.1f} | {rmq_n / rmq_took:,.0f} |",
        "",
        f"- published: {len(published)} ({len(preloaded)} preloaded, {len(live.published)} by the live publisher); "
        f"received: {len(seen)} distinct; **lost: {len(lost)}**; duplicates: {dups}",
        f"- shovels at the end: {sorted({r['state'] for r in shovel_status or []})}",
    ]
    report = "\n".join(lines)
    print(report)
    if a.out:
        with open(a.out, "w") as f:
            f.write(report + "\n")
    if lost:
        print(f"LOST: {sorted(lost)[:20]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
