"""`warren ctl` as rabbitmqctl's stand-in, seen from a real client (pika): stop_app closes every
connection with 320 and refuses new ones, start_app serves again with durable queues and their
persistent messages; close_connection gives the client RabbitMQ's 320 text;
set_vm_memory_high_watermark blocks publishers at once.
Warren only: each test runs `warren ctl` against a Warren of its own. rabbitmqctl gives RabbitMQ
3.10's clients the same answers (`CONNECTION_FORCED - broker forced connection closure with
reason 'shutdown'` on stop_app, `CONNECTION_FORCED - <explanation>` on close_connection),
checked by hand: stopping the shared reference broker would disturb everyone using it."""

from __future__ import annotations

import os
import subprocess
import time

import pika
import pika.exceptions
import pytest

from conftest import WarrenProcess
from helpers import connect, connection_closed, safe_close, uname

BIN = os.environ.get("WARREN_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="runs `warren ctl` against its own broker: Warren only")


@pytest.fixture
def warren():
    w = WarrenProcess(BIN)
    w.start()
    yield w
    w.stop()


def ctl(w: WarrenProcess, *args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([BIN, "ctl", "-n", "rabbit@localhost", "--url", f"http://127.0.0.1:{w.http_port}",
                        *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"warren ctl {' '.join(args)}: {r.stderr}"
    return r


def wait_closed(conn: pika.BlockingConnection, timeout: float = 10.0) -> None:
    """Pumps `conn` until the broker's connection.close arrives (raised by pika)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    raise AssertionError("the broker did not close the connection")


def test_stop_app_closes_with_320_and_start_app_keeps_durable_messages(warren):
    q = uname("stop-app")
    c = connect(warren.url)
    ch = c.channel()
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"persistent", properties=pika.BasicProperties(delivery_mode=2))

    ctl(warren, "stop_app")
    with connection_closed(320, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"):
        wait_closed(c)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connect(warren.url)

    ctl(warren, "start_app")
    c = connect(warren.url)
    try:
        ch = c.channel()
        assert ch.queue_declare(q, passive=True).method.message_count == 1
        method, props, body = ch.basic_get(q, auto_ack=True)
        assert body == b"persistent" and props.delivery_mode == 2
        ch.queue_delete(q)
    finally:
        safe_close(c)


def test_close_connection_by_pid_gives_the_explanation(warren):
    p = pika.URLParameters(warren.url)
    name = uname("conn")
    p.client_properties = {"connection_name": name}
    c = pika.BlockingConnection(p)
    out = ctl(warren, "-q", "list_connections", "pid", "client_properties").stdout
    pid = next(line.split("\t")[0] for line in out.splitlines() if f'{{"connection_name","{name}"}}' in line)
    ctl(warren, "close_connection", pid, "going down for maintenance")
    with connection_closed(320, "CONNECTION_FORCED - going down for maintenance"):
        wait_closed(c)


def test_memory_watermark_blocks_publishers_at_once(warren):
    c = connect(warren.url)
    events: list[str] = []
    c.add_on_connection_blocked_callback(lambda _c, m: events.append("blocked:" + m.method.reason))
    c.add_on_connection_unblocked_callback(lambda _c, m: events.append("unblocked"))
    try:
        ch = c.channel()
        ch.basic_publish("", "nowhere", b"x")  # a publisher: the alarm blocks it
        ctl(warren, "set_vm_memory_high_watermark", "0")
        deadline = time.monotonic() + 10
        while not events and time.monotonic() < deadline:
            c.process_data_events(time_limit=0.05)
        assert events == ["blocked:low on memory"]
        ctl(warren, "set_vm_memory_high_watermark", "0.4")
        deadline = time.monotonic() + 10
        while "unblocked" not in events and time.monotonic() < deadline:
            c.process_data_events(time_limit=0.05)
        assert events == ["blocked:low on memory", "unblocked"]
    finally:
        safe_close(c)
