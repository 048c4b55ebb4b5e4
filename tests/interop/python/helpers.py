"""Shared helpers for the interop tests (no fixtures here; see conftest.py)."""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any, Callable
from urllib.parse import quote, urlparse

import pika
import pika.exceptions
import pytest

DEFAULT_WAIT = 10.0

def uname(prefix: str = "t") -> str:
    """A name unique to this run, so tests never collide on a shared broker."""
    return f"interop-{prefix}-{uuid.uuid4().hex[:12]}"


def host_port(url: str) -> tuple[str, int]:
    u = urlparse(url)
    return u.hostname or "127.0.0.1", u.port or 5672


def url_with(url: str, user: str | None = None, password: str | None = None,
             vhost: str | None = None, query: str | None = None) -> str:
    """Rebuild an amqp:// URL changing credentials, vhost or query string."""
    u = urlparse(url)
    user = u.username if user is None else user
    password = u.password if password is None else password
    path = u.path if vhost is None else "/" + quote(vhost, safe="")
    netloc = f"{quote(user or '', safe='')}:{quote(password or '', safe='')}@{u.hostname}:{u.port or 5672}"
    q = u.query if query is None else query
    return f"{u.scheme}://{netloc}{path}" + (f"?{q}" if q else "")


def params(url: str, **overrides: Any) -> pika.URLParameters:
    p = pika.URLParameters(url)
    p.connection_attempts = 1
    p.socket_timeout = 10
    p.blocked_connection_timeout = 20
    for k, v in overrides.items():
        setattr(p, k, v)
    return p


def connect(url: str, **overrides: Any) -> pika.BlockingConnection:
    return pika.BlockingConnection(params(url, **overrides))


def wait_until(pred: Callable[[], Any], timeout: float = DEFAULT_WAIT, interval: float = 0.02,
               what: str = "condition", conn: pika.BlockingConnection | None = None) -> Any:
    """Poll pred() until truthy (bounded). With conn, pump pika's I/O between polls."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        if conn is not None:
            conn.process_data_events(time_limit=interval)
        else:
            time.sleep(interval)


def queue_depth(conn: pika.BlockingConnection, queue: str) -> int:
    ch = conn.channel()
    try:
        return ch.queue_declare(queue, passive=True).method.message_count
    finally:
        if ch.is_open:
            ch.close()


def wait_depth(conn: pika.BlockingConnection, queue: str, n: int, timeout: float = DEFAULT_WAIT) -> None:
    wait_until(lambda: queue_depth(conn, queue) == n, timeout, interval=0.02,
               what=f"queue {queue} to hold {n} messages")


def get_all(ch, queue: str, n: int, no_ack: bool = True, timeout: float = DEFAULT_WAIT) -> list:
    """basic.get n messages (bounded poll), return list of (method, props, body)."""
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        m, p, b = ch.basic_get(queue, auto_ack=no_ack)
        if m is None:
            if time.monotonic() >= deadline:
                raise AssertionError(f"got only {len(out)} of {n} messages from {queue}")
            time.sleep(0.01)
            continue
        out.append((m, p, b))
    return out


class Collector:
    """on_message_callback that records deliveries."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[Any, Any, bytes]] = []

    def __call__(self, ch, method, props, body) -> None:
        self.deliveries.append((method, props, body))

    def __len__(self) -> int:
        return len(self.deliveries)

    @property
    def bodies(self) -> list[bytes]:
        return [b for _, _, b in self.deliveries]


def pump(conn: pika.BlockingConnection, pred: Callable[[], Any], timeout: float = DEFAULT_WAIT,
         what: str = "deliveries") -> Any:
    return wait_until(pred, timeout=timeout, interval=0.02, what=what, conn=conn)


def settle(conn: pika.BlockingConnection, duration: float = 0.3) -> None:
    """Give the broker a short chance to send something it should NOT send (negative checks)."""
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)


@contextlib.contextmanager
def channel_closed(code: int, text_prefix: str):
    """Expect the broker to close the channel with code and a reply text starting with prefix."""
    with _raises(pika.exceptions.ChannelClosedByBroker, code, text_prefix) as info:
        yield info


@contextlib.contextmanager
def connection_closed(code: int, text_prefix: str):
    with _raises(pika.exceptions.ConnectionClosedByBroker, code, text_prefix) as info:
        yield info


class _Info:
    exc: Any = None


@contextlib.contextmanager
def _raises(exc_type, code: int, text_prefix: str):
    info = _Info()
    try:
        yield info
    except exc_type as e:
        info.exc = e
        assert e.reply_code == code, f"expected {code}, got {e.reply_code} {e.reply_text!r}"
        assert e.reply_text.startswith(text_prefix), \
            f"reply text {e.reply_text!r} does not start with {text_prefix!r}"
        return
    raise AssertionError(f"expected {exc_type.__name__} {code} {text_prefix!r}, nothing raised")


def assert_connection_usable(conn: pika.BlockingConnection) -> None:
    """After a soft (channel) error the connection must keep working: new channel, round trip."""
    assert conn.is_open
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"still-alive")
    m = wait_until(lambda: ch.basic_get(q, auto_ack=True)[0] is not None or None, what="probe message")
    assert m
    ch.queue_delete(q)
    ch.close()


def assert_broker_alive(url: str) -> None:
    """A separate, normal connection can still do a round trip."""
    conn = connect(url)
    try:
        assert_connection_usable(conn)
    finally:
        conn.close()


def safe_close(conn) -> None:
    try:
        if conn is not None and conn.is_open:
            conn.close()
    except Exception:
        pass
