"""Slow and half-open clients against the real binary: a consumer that never reads its socket
cannot make the broker buffer without bound (deliveries stop at the outbox high mark, and
RabbitMQ's send timeout closes it with a logged reason); a client that sends requests but never
reads the replies is held back the same way; clients trickling a byte at a time do not stop
anyone else and are dropped by the handshake timeout.
Warren only: it reads the broker's RSS and log and sets its timeouts in the config file."""

from __future__ import annotations

import os
import socket
import time

import pika
import pytest

import rawamqp as raw
from helpers import safe_close
from test_limits import start, url

BIN = os.environ.get("WARREN_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="reads the broker's RSS and log: Warren only (WARREN_BIN)")

MB = 1024 * 1024


@pytest.fixture
def nodes():
    started = []
    yield started
    for n in started:
        n.cleanup()


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def raw_open(port: int, rcvbuf: int = 4096) -> socket.socket:
    """A raw AMQP connection with channel 1 open, with a small receive buffer."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    s.settimeout(10)
    s.sendall(b"AMQP\x00\x00\x09\x01")
    s.recv(65536)  # connection.start
    s.sendall(raw.start_ok_plain())
    time.sleep(0.2)
    s.recv(65536)  # connection.tune
    s.sendall(raw.tune_ok(2047, 131072, 0) + raw.connection_open() + raw.channel_open(1))
    time.sleep(0.2)
    s.recv(65536)  # open-ok, channel.open-ok
    return s


def basic_consume(channel: int, queue: str) -> bytes:
    # reserved short, queue, consumer tag, no_local/no_ack/exclusive/nowait, arguments
    return raw.method_frame(channel, (60, 20), b"\x00\x00" + raw.shortstr(queue) + raw.shortstr("slow")
                            + raw.bits(False, False, False, False) + raw.table({}))


def log_has(n, text: str, limit_s: float = 60.0) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if text in n.stderr():
            return True
        time.sleep(0.2)
    return False


def test_non_reading_consumer_is_bounded_then_closed(nodes):
    n = start("[limits]\nsend_timeout_ms = 3000\n")
    nodes.append(n)
    p = pika.BlockingConnection(pika.URLParameters(url(n)))
    pch = p.channel()
    # A queue that holds little itself, so what the broker holds is what it buffers for the
    # consumer: without a bound that would be everything published.
    pch.queue_declare("slow", arguments={"x-max-length": 200})
    s = raw_open(n.port)
    s.sendall(basic_consume(1, "slow"))  # no prefetch, never acks, never reads again
    time.sleep(0.3)
    before = rss(n.proc.pid)
    body = b"x" * (64 * 1024)
    total = 0
    while total < 400 * MB:
        pch.basic_publish("", "slow", body)
        total += len(body)
    pch.queue_declare("slow", passive=True)  # a round trip: every publish was handled
    grown = rss(n.proc.pid) - before
    assert grown < 100 * MB, f"broker RSS grew {grown // MB} MiB for {total // MB} MiB sent to a non-reading consumer"
    # The consumer's socket made no progress for the send timeout: the broker lets it go.
    assert log_has(n, "socket write timed out"), n.stderr()
    # The publisher and the broker carry on.
    pch.queue_declare("after-slow")
    safe_close(p)
    s.close()


def test_client_not_reading_replies_is_held_back(nodes):
    n = start("[limits]\nsend_timeout_ms = 3000\n")
    nodes.append(n)
    p = pika.BlockingConnection(pika.URLParameters(url(n)))
    pch = p.channel()
    pch.queue_declare("big")
    big = b"y" * (1024 * 1024)
    pch.basic_publish("", "big", big)
    s = raw_open(n.port)
    s.settimeout(0.5)
    before = rss(n.proc.pid)
    # basic.get of the 1 MiB message, then basic.recover to requeue it, over and over: each
    # pair makes the broker send 1 MiB that this client never reads.
    recover = raw.method_frame(1, (60, 110), raw.bits(True))
    burst = (raw.basic_get(1, "big", no_ack=False) + recover) * 50
    sent = 0
    try:
        for _ in range(40):
            s.sendall(burst)
            sent += 50
    except (socket.timeout, BlockingIOError):
        pass  # TCP pushed back: the broker stopped reading us, as it should
    time.sleep(1)
    grown = rss(n.proc.pid) - before
    assert grown < 100 * MB, f"broker RSS grew {grown // MB} MiB holding replies nobody reads ({sent} requests sent)"
    assert log_has(n, "socket write timed out"), n.stderr()
    pch.queue_declare("big", passive=True)
    safe_close(p)
    s.close()


def test_trickling_clients_do_not_stop_others(nodes):
    n = start("[limits]\nhandshake_timeout_ms = 4000\n")
    nodes.append(n)
    header = b"AMQP\x00\x00\x09\x01"
    slow = [socket.create_connection(("127.0.0.1", n.port)) for _ in range(50)]
    c = pika.BlockingConnection(pika.URLParameters(url(n)))
    ch = c.channel()
    ch.queue_declare("busy")
    for i in range(len(header)):
        for s in slow:
            try:
                s.sendall(header[i:i + 1])
            except OSError:
                pass
        # Everyone else is served while 50 clients send one byte each.
        ch.basic_publish("", "busy", b"m")
        assert ch.basic_get("busy", auto_ack=True)[2] == b"m"
        time.sleep(0.3)
    # They never finish the handshake: each is dropped by the handshake timeout.
    for s in slow:
        s.settimeout(20)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
    assert log_has(n, "handshake timeout")
    safe_close(c)
