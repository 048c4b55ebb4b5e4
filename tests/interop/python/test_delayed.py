"""The `x-delayed-message` exchange, as clients of RabbitMQ's rabbitmq_delayed_message_exchange
plugin use it: declared with `x-delayed-type`, messages delayed by their `x-delay` header (ms).

The reference RabbitMQ 3.10 here has no such plugin, so these tests run against Warren only.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
import base64

import pika
import pytest

from conftest import _free_port
from helpers import channel_closed, connect, connection_closed, safe_close, uname

BIN = os.environ.get("WARREN_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="the reference RabbitMQ has no delayed-message plugin: Warren only (WARREN_BIN)")

WAIT = 15.0


def _props(delay, persistent=False, **headers):
    h = dict(headers)
    if delay is not None:
        h["x-delay"] = delay
    return pika.BasicProperties(headers=h, delivery_mode=2 if persistent else 1)


def _delayed(ch, name, kind="direct", durable=False):
    ch.exchange_declare(name, "x-delayed-message", durable=durable, arguments={"x-delayed-type": kind})


def _collect(conn, ch, queue, n, timeout=WAIT):
    """Consumes `n` messages (auto-ack), returning (arrival monotonic time, body, props)."""
    got = []

    def on(c, m, p, b):
        got.append((time.monotonic(), b, p))

    tag = ch.basic_consume(queue, on, auto_ack=True)
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    ch.basic_cancel(tag)
    return got


def test_delays_by_header_and_orders_by_due_time(conn, ch, res):
    x = res.exchange("dx")
    _delayed(ch, x)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, x, routing_key="k")
    t0 = time.monotonic()
    ch.basic_publish(x, "k", b"late", _props(1200))
    ch.basic_publish(x, "k", b"early", _props(400))
    ch.basic_publish(x, "k", b"now", _props(None))
    ch.basic_publish(x, "k", b"zero", _props(0))
    ch.basic_publish(x, "k", b"negative", _props(-50))
    got = _collect(conn, ch, q, 5)
    bodies = [b for _, b, _ in got]
    assert sorted(bodies[:3]) == sorted([b"now", b"zero", b"negative"])
    assert bodies[3:] == [b"early", b"late"]
    by = {b: t - t0 for t, b, _ in got}
    assert by[b"early"] >= 0.38 and by[b"late"] >= 1.18, by
    # The plugin negates x-delay on delivery.
    late = next(p for _, b, p in got if b == b"late")
    assert late.headers["x-delay"] == -1200


def test_routes_by_delayed_type_when_due(conn, ch, res):
    x = res.exchange("dtopic")
    _delayed(ch, x, "topic")
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q1, x, routing_key="a.*")
    ch.queue_bind(q2, x, routing_key="#")
    ch.basic_publish(x, "a.b", b"m", _props(300))
    # Bound while the message waits: routing happens when it is due.
    q3 = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q3, x, routing_key="a.b")
    for q in (q1, q2, q3):
        got = _collect(conn, ch, q, 1)
        assert [b for _, b, _ in got] == [b"m"], q


def test_declare_errors(amqp_url):
    conn = connect(amqp_url)
    ch = conn.channel()
    with channel_closed(406, "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type"):
        ch.exchange_declare(uname("dx"), "x-delayed-message")
    ch = conn.channel()
    with channel_closed(406, "PRECONDITION_FAILED - Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'"):
        ch.exchange_declare(uname("dx"), "x-delayed-message", arguments={"x-delayed-type": "x-delayed-message"})
    # Redeclared with another type: the usual inequivalent-arg 406.
    ch = conn.channel()
    name = uname("dx")
    _delayed(ch, name)
    try:
        with channel_closed(406, "PRECONDITION_FAILED - inequivalent arg 'type'"):
            ch.exchange_declare(name, "direct")
    finally:
        c2 = conn.channel()
        c2.exchange_delete(name)
        c2.close()
    # An unknown x-delayed-type is an unknown exchange type: a connection error, as RabbitMQ's.
    ch = conn.channel()
    with connection_closed(503, "COMMAND_INVALID - unknown exchange type 'nope'"):
        ch.exchange_declare(uname("dx"), "x-delayed-message", arguments={"x-delayed-type": "nope"})


def test_confirms_and_management_count(conn, ch, res, mgmt_url):
    x = res.exchange("dx")
    _delayed(ch, x)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, x, routing_key="k")
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish(x, "k", b"%d" % i, _props(1500, persistent=True))
    info = _api(mgmt_url, f"/api/exchanges/%2f/{x}")
    assert info["type"] == "x-delayed-message"
    assert info["arguments"] == {"x-delayed-type": "direct"}
    assert info["messages_delayed"] == 5
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    got = _collect(conn, ch, q, 5)
    assert sorted(b for _, b, _ in got) == [b"%d" % i for i in range(5)]
    assert _api(mgmt_url, f"/api/exchanges/%2f/{x}")["messages_delayed"] == 0


def test_mandatory_unroutable_is_returned_not_held(conn, ch, res, mgmt_url):
    x = res.exchange("dx")
    _delayed(ch, x)
    returned = []
    ch.add_on_return_callback(lambda c, m, p, b: returned.append(b))
    ch.basic_publish(x, "nowhere", b"r", _props(200), mandatory=True)
    deadline = time.monotonic() + WAIT
    while not returned and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert returned == [b"r"]
    assert _api(mgmt_url, f"/api/exchanges/%2f/{x}")["messages_delayed"] == 0


def test_deleting_the_exchange_drops_its_messages(conn, ch, mgmt_url):
    x = uname("dx")
    _delayed(ch, x)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, x, routing_key="k")
    ch.basic_publish(x, "k", b"gone", _props(500))
    ch.exchange_delete(x)
    _delayed(ch, x)
    ch.queue_bind(q, x, routing_key="k")
    time.sleep(0.8)
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    ch.exchange_delete(x)


def _api(base, path):
    req = urllib.request.Request(base + path)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


class _Node:
    """A broker on a data dir of its own that survives kill -9 and restarts."""

    def __init__(self, tmp_path):
        from test_durability import Node  # the same process handling as the durability tests

        self.node = Node()

    def __enter__(self):
        self.node.start()
        return self.node

    def __exit__(self, *exc):
        self.node.stop()
        shutil.rmtree(self.node.dir, ignore_errors=True)


def test_persistent_delayed_messages_survive_kill_9(tmp_path):
    """Confirmed persistent delayed messages are never lost: kill -9 while they wait, restart,
    and each arrives (once its time has come); transient ones do not outlive the process."""
    with _Node(tmp_path) as node:
        c = connect(node.url)
        ch = c.channel()
        x = uname("dx")
        _delayed(ch, x, durable=True)
        q = uname("dq")
        ch.queue_declare(q, durable=True)
        ch.queue_bind(q, x, routing_key="k")
        ch.confirm_delivery()
        n = 200
        for i in range(n):
            # Due between 1.5 s and 3.5 s from now: some come due while the broker is down.
            ch.basic_publish(x, "k", b"p%d" % i, _props(1500 + 10 * i, persistent=True))
        ch.basic_publish(x, "k", b"transient", _props(1500))
        safe_close(c)
        node.kill9()
        time.sleep(2.0)
        node.start()
        c = connect(node.url)
        ch = c.channel()
        got = _collect(c, ch, q, n, timeout=WAIT)
        bodies = [b for _, b, _ in got]
        assert sorted(bodies) == sorted(b"p%d" % i for i in range(n))
        c.process_data_events(time_limit=0.5)
        assert ch.queue_declare(q, passive=True).method.message_count == 0
        safe_close(c)


def test_a_held_dead_letter_keeps_its_mark_through_kill_9(tmp_path):
    """A persistent message expires from a durable queue into a durable delayed exchange that
    routes back to that queue and to an observer, and waits there while the broker is killed.
    After the restart it comes due: the observer gets it once and the queue does not (the cycle
    rule of a dead letter, kept on disk with it)."""
    with _Node(tmp_path) as node:
        c = connect(node.url)
        ch = c.channel()
        x, q, observer = uname("dlx-d"), uname("dl-q"), uname("dl-obs")
        _delayed(ch, x, kind="fanout", durable=True)
        ch.queue_declare(q, durable=True, arguments={"x-message-ttl": 50, "x-dead-letter-exchange": x})
        ch.queue_declare(observer, durable=True)
        ch.queue_bind(q, x)
        ch.queue_bind(observer, x)
        ch.confirm_delivery()
        ch.basic_publish("", q, b"dead", _props(1000, persistent=True))
        deadline = time.monotonic() + WAIT
        while ch.queue_declare(q, passive=True).method.message_count and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # dead-lettered into the store and written (group commit)
        safe_close(c)
        node.kill9()
        node.start()
        c = connect(node.url)
        ch = c.channel()
        got = _collect(c, ch, observer, 1, timeout=WAIT)
        assert [b for _, b, _ in got] == [b"dead"]
        # Had the mark been lost, the queue would have taken it back, expired it into the store
        # again, and the observer would get a second copy one delay later.
        c.process_data_events(time_limit=1.5)
        ch = c.channel()
        assert ch.queue_declare(observer, passive=True).method.message_count == 0
        assert ch.queue_declare(q, passive=True).method.message_count == 0
        safe_close(c)


def test_many_pending_spill_to_disk_and_come_back_in_order(conn, ch, res, mgmt_url):
    """More delayed bytes than the store keeps in memory (64 MiB): the later ones go to spill
    files and are read back in due order."""
    x = res.exchange("dx")
    _delayed(ch, x)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, x, routing_key="k")
    body = b"x" * (256 * 1024)
    n = 300  # 75 MiB
    ch.confirm_delivery()
    # Due times 15 ms apart, latest first, whatever the publishing takes.
    start = time.monotonic()
    for i in range(n):
        due = 3.0 + 0.015 * (n - i)
        delay = int((start + due - time.monotonic()) * 1000)
        ch.basic_publish(x, "k", body[:-8] + b"%08d" % i, _props(delay))
    assert _api(mgmt_url, f"/api/exchanges/%2f/{x}")["messages_delayed"] == n
    got = _collect(conn, ch, q, n, timeout=WAIT + 10)
    order = [int(b[-8:]) for _, b, _ in got]
    assert order == list(range(n - 1, -1, -1))


# ---- retry with back-off: x-delayed-retry-* (RabbitMQ 4.3's names; LavinMQ's multiplier) ----


def _attempts(conn, ch, q, settle, n, timeout=WAIT):
    """Consumes from `q` with manual acks; `settle(ch, method)` handles each of the first `n`
    deliveries (nack, reject), then the next is acked. Returns [(monotonic time, props)]."""
    seen = []

    def on(c, m, p, b):
        seen.append((time.monotonic(), p, m))
        if len(seen) <= n:
            settle(c, m)
        else:
            c.basic_ack(m.delivery_tag)

    tag = ch.basic_consume(q, on)
    deadline = time.monotonic() + timeout
    while len(seen) <= n and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.02)
    ch.basic_cancel(tag)
    return seen


def _nack(c, m):
    c.basic_nack(m.delivery_tag, requeue=True)


def _reject(c, m):
    c.basic_reject(m.delivery_tag, requeue=True)


def _gaps(seen):
    return [b[0] - a[0] for a, b in zip(seen, seen[1:])]


def test_requeue_comes_back_after_a_linear_delay(conn, ch):
    q = ch.queue_declare("", exclusive=True, arguments={
        "x-delayed-retry-type": "all", "x-delayed-retry-min": 300}).method.queue
    ch.basic_publish("", q, b"job")
    seen = _attempts(conn, ch, q, _nack, 2)
    assert len(seen) == 3
    gaps = _gaps(seen)
    assert gaps[0] >= 0.28 and gaps[1] >= 0.58, gaps  # 300 ms, then 600 ms
    assert [(p.headers or {}).get("x-delivery-count") for _, p, _ in seen] == [None, 1, 2]
    # While it waits it is not in the queue.
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_exponential_back_off_is_capped_by_max(conn, ch):
    q = ch.queue_declare("", exclusive=True, arguments={
        "x-delayed-retry-min": 100, "x-delayed-retry-multiplier": 10,
        "x-delayed-retry-max": 400}).method.queue
    ch.basic_publish("", q, b"job")
    seen = _attempts(conn, ch, q, _reject, 3, timeout=6.0)
    # 100 ms, then 1 s and 10 s capped to 400 ms (0.9 s in all): uncapped, the last attempt
    # would come 11 s after the first, past the 6 s wait.
    assert len(seen) == 4, _gaps(seen)
    gaps = _gaps(seen)
    assert gaps[0] >= 0.08 and gaps[1] >= 0.38 and gaps[2] >= 0.38, gaps


def test_failed_delays_rejects_only(conn, ch):
    q = ch.queue_declare("", exclusive=True, arguments={
        "x-delayed-retry-type": "failed", "x-delayed-retry-min": 1500}).method.queue
    ch.basic_publish("", q, b"job")
    # A nack is a return, not a failure: it comes back at once, undelayed.
    seen = _attempts(conn, ch, q, _nack, 1)
    assert len(seen) == 2 and seen[1][2].redelivered
    assert "x-delivery-count" not in (seen[1][1].headers or {})
    ch.basic_publish("", q, b"job2")
    seen = _attempts(conn, ch, q, _reject, 1)
    assert _gaps(seen)[0] >= 1.45


def test_retry_argument_errors(conn):
    for args, key in (({"x-delayed-retry-type": "sometimes"}, "x-delayed-retry-type"),
                      ({"x-delayed-retry-min": 0}, "x-delayed-retry-min"),
                      ({"x-delayed-retry-min": "5"}, "x-delayed-retry-min"),
                      ({"x-delayed-retry-min": 500, "x-delayed-retry-max": 100}, "x-delayed-retry-max")):
        ch = conn.channel()
        with channel_closed(406, f"PRECONDITION_FAILED - invalid arg '{key}'"):
            ch.queue_declare(uname("rq"), arguments=args)


def test_retry_set_by_policy(conn, ch, mgmt_url):
    from test_access import Api, q as quote

    api = Api(mgmt_url)
    name = uname("retrypol")
    pol = uname("p")
    st, body = api.call("PUT", f"/api/policies/%2F/{quote(pol)}", {
        "pattern": f"^{name}$", "apply-to": "queues",
        "definition": {"delayed-retry-type": "all", "delayed-retry-min": 400}})
    assert st in (201, 204), body
    try:
        st, body = api.call("PUT", f"/api/policies/%2F/{quote(uname('bad'))}", {
            "pattern": "^nothing$", "definition": {"delayed-retry-type": "sometimes"}})
        assert st == 400, body
        ch.queue_declare(name, exclusive=True)
        ch.basic_publish("", name, b"job")
        seen = _attempts(conn, ch, name, _nack, 1)
        assert _gaps(seen)[0] >= 0.38
    finally:
        api.call("DELETE", f"/api/policies/%2F/{quote(pol)}")


def test_retried_persistent_message_survives_kill_9(tmp_path):
    with _Node(tmp_path) as node:
        c = connect(node.url)
        ch = c.channel()
        q = uname("rq")
        ch.queue_declare(q, durable=True, arguments={"x-delayed-retry-min": 1500})
        ch.confirm_delivery()
        ch.basic_publish("", q, b"job", pika.BasicProperties(delivery_mode=2))
        seen = []
        ch.basic_consume(q, lambda c2, m, p, b: (seen.append(p), c2.basic_nack(m.delivery_tag, requeue=True)))
        deadline = time.monotonic() + WAIT
        while not seen and time.monotonic() < deadline:
            c.process_data_events(time_limit=0.05)
        assert len(seen) == 1
        c.process_data_events(time_limit=0.3)  # the nack is written with the next group
        node.kill9()
        node.start()
        c = connect(node.url)
        ch = c.channel()
        got = _collect(c, ch, q, 1)
        assert [b for _, b, _ in got] == [b"job"]
        assert got[0][2].headers["x-delivery-count"] == 1
        safe_close(c)
