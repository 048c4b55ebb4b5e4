"""Limits from the config file, answered as RabbitMQ 3.10 answers them: connection limits per
node, vhost and user (530 at connection.open), max queues per vhost (406), the handshake timeout,
the per-channel unacked cap, and the delay before a failed login is answered.
Warren only: each test writes the broker's config file (RabbitMQ sets these with rabbitmqctl;
the reply texts here are the ones RabbitMQ 3.10 sends for its vhost and user limits)."""

from __future__ import annotations

import os
import socket
import threading
import time

import pika
import pika.exceptions
import pytest

from helpers import safe_close
from test_durability import Node

BIN = os.environ.get("WARREN_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="writes the broker's config file: Warren only (WARREN_BIN)")


def start(config: str) -> Node:
    n = Node()
    cfg = os.path.join(n.dir, "warren.toml")
    with open(cfg, "w") as f:
        f.write(config)
    n.extra_args = ["--config", cfg]
    n.start()
    return n


@pytest.fixture
def nodes():
    started: list[Node] = []
    yield started
    for n in started:
        n.cleanup()


def url(n: Node, user: str = "guest", password: str = "guest") -> str:
    return f"amqp://{user}:{password}@127.0.0.1:{n.port}/%2f?heartbeat=0&connection_attempts=1"


def refused(u: str) -> str:
    """Connects, expecting the broker to close at connection.open; returns its reply."""
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as e:
        pika.BlockingConnection(pika.URLParameters(u))
    return str(e.value)


USERS = """
[[users]]
name = "guest"
password = "guest"
tags = ["administrator"]

[[users]]
name = "limited"
password = "pw"
"""


def test_vhost_connection_limit(nodes):
    n = start("[limits.vhosts.'/']\nmax_connections = 2\n")
    nodes.append(n)
    a = pika.BlockingConnection(pika.URLParameters(url(n)))
    b = pika.BlockingConnection(pika.URLParameters(url(n)))
    text = refused(url(n))
    assert "530" in text
    assert "NOT_ALLOWED - access to vhost '/' refused for user 'guest': connection limit (2) is reached" in text
    a.close()
    c = pika.BlockingConnection(pika.URLParameters(url(n)))  # a place was given back
    assert c.is_open and b.is_open
    safe_close(b)
    safe_close(c)


def test_user_connection_limit(nodes):
    n = start("loopback_users = []\n" + USERS + "[limits.users.limited]\nmax_connections = 1\n")
    nodes.append(n)
    a = pika.BlockingConnection(pika.URLParameters(url(n, "limited", "pw")))
    text = refused(url(n, "limited", "pw"))
    assert "NOT_ALLOWED - connection refused for user 'limited': user connection limit (1) is reached" in text
    # Other users are not affected.
    g = pika.BlockingConnection(pika.URLParameters(url(n)))
    safe_close(g)
    a.close()
    again = pika.BlockingConnection(pika.URLParameters(url(n, "limited", "pw")))
    safe_close(again)


def test_node_connection_limit(nodes):
    n = start("[limits]\nconnection_max = 2\n")
    nodes.append(n)
    conns = [pika.BlockingConnection(pika.URLParameters(url(n))) for _ in range(2)]
    text = refused(url(n))
    assert "NOT_ALLOWED - connection refused: node connection limit (2) is reached" in text
    assert "connection limit" in n.stderr()
    for c in conns:
        safe_close(c)
    safe_close(pika.BlockingConnection(pika.URLParameters(url(n))))


def test_vhost_queue_limit(nodes):
    n = start("[limits.vhosts.'/']\nmax_queues = 2\n")
    nodes.append(n)
    c = pika.BlockingConnection(pika.URLParameters(url(n)))
    ch = c.channel()
    ch.queue_declare("q1")
    ch.queue_declare("", exclusive=True)  # server-named queues count too
    ch.queue_declare("q1")  # redeclaring an existing queue is not a new one
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.queue_declare("q3")
    assert e.value.reply_code == 406
    assert e.value.reply_text == "PRECONDITION_FAILED - cannot declare queue 'q3': queue limit in vhost '/' (2) is reached"
    ch = c.channel()
    ch.queue_delete("q1")
    ch.queue_declare("q3")
    safe_close(c)


def read_until_closed(s: socket.socket, limit_s: float = 20.0) -> bytes:
    """Everything the broker sends until it closes the socket (the limit only guards a hang)."""
    s.settimeout(limit_s)
    got = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return got
        got += chunk


def test_handshake_timeout_drops_silent_and_stalled_clients(nodes):
    n = start("[limits]\nhandshake_timeout_ms = 300\n")
    nodes.append(n)
    silent = socket.create_connection(("127.0.0.1", n.port))
    assert read_until_closed(silent) == b""
    stalled = socket.create_connection(("127.0.0.1", n.port))
    stalled.sendall(b"AMQP\x00\x00\x09\x01")
    got = read_until_closed(stalled)
    assert got[:1] == b"\x01" and got[7:11] == b"\x00\x0a\x00\x0a", "connection.start, then closed"
    silent.close()
    stalled.close()
    assert "handshake timeout" in n.stderr()
    # A client that completes the handshake in time is unaffected.
    safe_close(pika.BlockingConnection(pika.URLParameters(url(n))))


def test_unacked_cap_per_channel(nodes):
    n = start("[limits]\nunacked_max_per_channel = 5\n")
    nodes.append(n)
    c = pika.BlockingConnection(pika.URLParameters(url(n)))
    ch = c.channel()
    ch.queue_declare("capped")
    for i in range(20):
        ch.basic_publish("", "capped", str(i).encode())
    got: list[int] = []
    ch.basic_consume("capped", lambda _c, m, _p, _b: got.append(m.delivery_tag))  # no prefetch
    deadline = time.monotonic() + 10
    while len(got) < 5 and time.monotonic() < deadline:
        c.process_data_events(time_limit=0.05)
    c.process_data_events(time_limit=0.5)  # room for any delivery past the cap to show up
    assert len(got) == 5
    assert ch.queue_declare("capped", passive=True).method.message_count == 15
    ch.basic_ack(got[-1], multiple=True)
    deadline = time.monotonic() + 10
    while len(got) < 10 and time.monotonic() < deadline:
        c.process_data_events(time_limit=0.05)
    c.process_data_events(time_limit=0.5)
    assert len(got) == 10
    safe_close(c)


def test_failed_login_is_delayed_without_blocking_others(nodes):
    n = start("[limits]\nauth_failure_delay_ms = 2000\n")
    nodes.append(n)
    events: list[str] = []
    errors: list[BaseException] = []

    def bad_login():
        t0 = time.monotonic()
        try:
            pika.BlockingConnection(pika.URLParameters(url(n, "guest", "s3cret-guess")))
        except pika.exceptions.ProbableAuthenticationError as e:
            events.append("refused")
            errors.append(e)
            events.append(f"after {time.monotonic() - t0:.3f}")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=bad_login)
    t.start()
    time.sleep(0.3)
    good = pika.BlockingConnection(pika.URLParameters(url(n)))
    events.append("good opened")
    t.join(30)
    safe_close(good)
    assert events[0] == "good opened", events
    assert events[1] == "refused", (events, errors)
    assert "403" in str(errors[0]) and "ACCESS_REFUSED" in str(errors[0])
    assert float(events[2].split()[1]) >= 1.9  # the broker waited the configured delay
    log = n.stderr()
    assert "authentication failed" in log and "127.0.0.1:" in log
    assert "s3cret-guess" not in log
