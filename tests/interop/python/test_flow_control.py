"""Credit flow against the real binary: when a queue's consumer cannot take deliveries as fast as
they come (its connection's output is full), a connection that only publishes into that queue is
not read until the queue drains, so TCP pushes back on the publisher and the queue stays short.
A consumer that merely stops acking does not stop publishers (the backlog pages to disk).
Warren only: reads the queue depth while a client is deliberately stuck, with its own config.
"""

from __future__ import annotations

import os
import socket
import time

import pika
import pytest

import rawamqp as raw
from helpers import safe_close
from test_limits import start, url
from test_slow_clients import basic_consume, nodes, raw_open  # noqa: F401  (fixture)

BIN = os.environ.get("WARREN_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="stalls a client on purpose and uses its own config: Warren only (WARREN_BIN)")


def publish_frames(queue: str, body: bytes) -> bytes:
    return (raw.basic_publish(1, "", queue) + raw.header_frame(1, len(body)) + raw.body_frame(1, body))


def flood(port: int, queue: str, seconds: float) -> int:
    """Publishes from a raw publish-only connection without ever blocking; returns the number of
    messages the socket accepted in `seconds`."""
    s = raw_open(port)
    s.setblocking(False)
    one = publish_frames(queue, b"m" * 100)
    batch = one * 100
    sent = 0
    pending = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not pending:
            pending = batch
        try:
            n = s.send(pending)
            pending = pending[n:]
            sent += n
        except BlockingIOError:
            time.sleep(0.01)
    s.close()
    return sent // len(one)


def depth(n, queue: str) -> int:
    c = pika.BlockingConnection(pika.URLParameters(url(n)))
    try:
        return c.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        safe_close(c)


def test_a_consumer_that_cannot_keep_up_holds_back_publish_only_connections(nodes):
    n = start("[limits]\nsend_timeout_ms = 60000\n")
    nodes.append(n)
    c = pika.BlockingConnection(pika.URLParameters(url(n)))
    c.channel().queue_declare("credit")
    safe_close(c)
    consumer = raw_open(n.port)
    consumer.sendall(basic_consume(1, "credit"))  # no prefetch limit, then never reads
    time.sleep(0.3)
    accepted = flood(n.port, "credit", 4.0)
    time.sleep(0.5)
    held = depth(n, "credit")
    # The consumer's connection took what fits in its outbox and socket buffers; past that the
    # queue pressures its publishers at 2,000 ready messages. Without credit flow the queue
    # would hold nearly everything the publisher managed to send.
    assert held < 20_000, f"{held} messages ready of {accepted} sent: the publisher was not held back"
    assert accepted - held > 1_000, "the consumer did receive deliveries"
    consumer.close()


def test_a_consumer_that_stops_acking_does_not_stop_publishers(nodes):
    n = start("")
    nodes.append(n)
    c = pika.BlockingConnection(pika.URLParameters(url(n)))
    ch = c.channel()
    ch.queue_declare("stuck")
    ch.basic_qos(prefetch_count=10)
    ch.basic_consume("stuck", lambda *a: None)  # takes 10, never acks
    c.process_data_events(0.3)
    # The same flood into a queue without consumers (never pressured) is the yardstick: a
    # publisher held back would get only what fits in the socket buffers, a small fraction.
    ch.queue_declare("free")
    control = flood(n.port, "free", 3.0)
    ch.queue_delete("free")
    accepted = flood(n.port, "stuck", 3.0)
    held, prev = depth(n, "stuck"), -1
    deadline = time.monotonic() + 30
    while held != prev and time.monotonic() < deadline:  # let the broker read what was sent
        time.sleep(0.5)
        held, prev = depth(n, "stuck"), held
    assert held >= accepted - 10 - 100, f"{held} ready of {accepted} sent"
    assert accepted > control / 2, (f"only {accepted} publishes went through in 3 s against {control} "
                                    "into a queue without consumers: publishers were held back")
    safe_close(c)
