"""Streams over AMQP 0-9-1 (`x-queue-type=stream`): declare validation, offsets, the
`x-stream-offset` header, prefetch and ack rules, retention, restart. Written against
RabbitMQ 3.10.8; the restart test drives the broker process: Warren only."""

from __future__ import annotations

import base64
import datetime
import json
import os
import signal
import time
import urllib.request

import pika
import pika.exceptions
import pytest

from conftest import WarrenProcess
from helpers import connect, safe_close, uname

S = {"x-queue-type": "stream"}
WAIT = 10.0


def declare(ch, name, **args):
    return ch.queue_declare(name, durable=True, arguments={**S, **args})


def publish(conn, q, bodies):
    ch = conn.channel()
    ch.confirm_delivery()
    for b in bodies:
        ch.basic_publish("", q, b, pika.BasicProperties(headers={"k": "v"}))
    ch.close()


def consume(conn, q, n, offset=None, prefetch=100, settle=True, timeout=WAIT):
    """Up to n deliveries (offset header, body, headers), acking each; stops at n or when
    nothing arrives for a short while after the deadline."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    got = []

    def on(chx, m, p, body):
        got.append((p.headers["x-stream-offset"], body, p.headers, m))
        if settle:
            chx.basic_ack(m.delivery_tag)

    args = {} if offset is None else {"x-stream-offset": offset}
    tag = ch.basic_consume(q, on, arguments=args)
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    ch.basic_cancel(tag)
    ch.close()
    return got


def closed_with(fn, conn):
    """Runs fn; returns (kind, code, text) of the channel or connection error it causes."""
    try:
        fn()
        conn.process_data_events(time_limit=0.3)
    except pika.exceptions.ChannelClosedByBroker as e:
        return "channel", e.reply_code, e.reply_text
    except pika.exceptions.ConnectionClosedByBroker as e:
        return "connection", e.reply_code, e.reply_text
    return None


@pytest.fixture
def sname(amqp_url):
    name = uname("stream")
    yield name
    c = connect(amqp_url)
    try:
        c.channel().queue_delete(name)
    finally:
        safe_close(c)


def test_declare_validation(amqp_url, sname):
    conn = connect(amqp_url)
    try:
        what = f"queue '{sname}' in vhost '/'"
        cases = [
            (dict(durable=False), f"invalid property 'non-durable' for {what}"),
            (dict(durable=True, exclusive=True), f"invalid property 'exclusive-owner' for {what}"),
            (dict(durable=True, auto_delete=True), f"invalid property 'auto-delete' for {what}"),
            (dict(durable=True, arguments={"x-message-ttl": 10}),
             f"invalid arg 'x-message-ttl' for {what} of queue type rabbit_stream_queue"),
            (dict(durable=True, arguments={"x-max-length": 3}),
             f"invalid arg 'x-max-length' for {what} of queue type rabbit_stream_queue"),
            (dict(durable=True, arguments={"x-max-age": "5W"}), f"invalid arg 'x-max-age' for {what}: invalid_max_age"),
            (dict(durable=True, arguments={"x-max-age": "0s"}), f"invalid arg 'x-max-age' for {what}: invalid_max_age"),
            (dict(durable=True, arguments={"x-max-age": 10}),
             f"invalid arg 'x-max-age' for {what}: {{unacceptable_type,signedint}}"),
            (dict(durable=True, arguments={"x-max-length-bytes": -1}),
             f"invalid arg 'x-max-length-bytes' for {what}: {{value_negative,-1}}"),
            (dict(durable=True, arguments={"x-stream-max-segment-size-bytes": "x"}),
             f"invalid arg 'x-stream-max-segment-size-bytes' for {what}: \"expected integer, got longstr\""),
            (dict(durable=True, arguments={"x-initial-cluster-size": 0}),
             f"invalid arg 'x-initial-cluster-size' for {what}: {{value_zero,0}}"),
            (dict(durable=True, arguments={"x-queue-leader-locator": "nope"}),
             f"invalid arg 'x-queue-leader-locator' for {what}: invalid_queue_locator_arg"),
        ]
        for kw, text in cases:
            ch = conn.channel()
            args = {**S, **kw.pop("arguments", {})}
            r = closed_with(lambda: ch.queue_declare(sname, arguments=args, **kw), conn)
            assert r == ("channel", 406, f"PRECONDITION_FAILED - {text}"), kw
        ch = conn.channel()
        r = closed_with(lambda: ch.queue_declare("", durable=True, arguments=S), conn)
        assert r == ("channel", 406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_stream_queue")
        # Every unit RabbitMQ takes.
        ch = conn.channel()
        for age in ["7D", "12h", "30m", "10s", "1Y", "1M"]:
            n = uname("age")
            declare(ch, n, **{"x-max-age": age})
            ch.queue_delete(n)
        ok = declare(ch, sname, **{"x-max-age": "7D", "x-stream-max-segment-size-bytes": 1000,
                                   "x-max-length-bytes": 10**6, "x-queue-leader-locator": "balanced",
                                   "x-initial-cluster-size": 1})
        assert ok.method.message_count == 0
        r = closed_with(lambda: ch.queue_declare(sname, durable=True), conn)
        # RabbitMQ compares the stream's own arguments, in its order (x-max-length-bytes first).
        assert r == ("channel", 406, f"PRECONDITION_FAILED - inequivalent arg 'x-max-length-bytes' for {what}: "
                                     "received none but current is the value '1000000' of type 'signedint'")
        ch = conn.channel()
        r = closed_with(lambda: ch.queue_declare(sname, durable=True, arguments={"x-max-length-bytes": 10**6}), conn)
        assert r == ("channel", 406, f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for {what}: "
                                     "received none but current is the value 'stream' of type 'longstr'")
    finally:
        safe_close(conn)


def test_offsets_and_header(amqp_url, sname):
    conn = connect(amqp_url)
    try:
        declare(conn.channel(), sname)
        publish(conn, sname, [b"m%d" % i for i in range(10)])
        got = consume(conn, sname, 10, "first")
        assert [g[0] for g in got] == list(range(10))
        assert [g[1] for g in got] == [b"m%d" % i for i in range(10)]
        assert all(g[2]["k"] == "v" and not g[3].redelivered for g in got)
        assert [g[0] for g in consume(conn, sname, 4, 6)] == [6, 7, 8, 9]
        assert [g[0] for g in consume(conn, sname, 10, -5)] == list(range(10))
        # Each confirmed publish above was its own chunk: "last" is the last message.
        assert [g[0] for g in consume(conn, sname, 1, "last", timeout=1)] == [9]
        # "next" (and no argument) waits for new messages.
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        late = []
        ch.basic_consume(sname, lambda c, m, p, b: late.append(p.headers["x-stream-offset"]) or c.basic_ack(m.delivery_tag))
        ch2 = conn.channel()
        ch2.basic_qos(prefetch_count=10)
        late2 = []
        ch2.basic_consume(sname, lambda c, m, p, b: late2.append(p.headers["x-stream-offset"]) or c.basic_ack(m.delivery_tag),
                          arguments={"x-stream-offset": "next"})
        conn.process_data_events(time_limit=0.3)
        assert late == [] and late2 == []
        publish(conn, sname, [b"late"])
        deadline = time.monotonic() + WAIT
        while (len(late) < 1 or len(late2) < 1) and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert late == [10] and late2 == [10]
        # By time: an old timestamp is the start, a future one the end; an interval too.
        past = datetime.datetime.now() - datetime.timedelta(seconds=120)
        assert len(consume(conn, sname, 11, past)) == 11
        assert len(consume(conn, sname, 11, "1h")) == 11
        future = datetime.datetime.now() + datetime.timedelta(hours=1)
        assert consume(conn, sname, 1, future, timeout=0.5) == []
    finally:
        safe_close(conn)


def test_prefetch_and_ack_rules(amqp_url, sname):
    conn = connect(amqp_url)
    try:
        declare(conn.channel(), sname)
        publish(conn, sname, [b"a", b"b", b"c", b"d"])
        what = f"queue '{sname}' in vhost '/'"
        ch = conn.channel()
        r = closed_with(lambda: ch.basic_consume(sname, lambda *a: None), conn)
        assert r == ("channel", 406, f"PRECONDITION_FAILED - consumer prefetch count is not set for '{what}'")
        # The prefetch is checked before the ack mode.
        ch = conn.channel()
        r = closed_with(lambda: ch.basic_consume(sname, lambda *a: None, auto_ack=True), conn)
        assert r == ("channel", 406, f"PRECONDITION_FAILED - consumer prefetch count is not set for '{what}'")
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        r = closed_with(lambda: ch.basic_consume(sname, lambda *a: None, auto_ack=True), conn)
        assert r == ("connection", 540, f"NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues {what}")
        conn = connect(amqp_url)
        # Prefetch bounds what is outstanding; acks only return credit.
        ch = conn.channel()
        ch.basic_qos(prefetch_count=2)
        got = []
        ch.basic_consume(sname, lambda c, m, p, b: got.append(m.delivery_tag), arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + WAIT
        while len(got) < 2 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        conn.process_data_events(time_limit=0.3)
        assert len(got) == 2
        ch.basic_ack(got[-1], multiple=True)
        while len(got) < 4 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert len(got) == 4
        ch.basic_ack(got[-1], multiple=True)
        # A second reader from the start still sees everything, and the count is unchanged.
        assert [g[1] for g in consume(conn, sname, 4, "first")] == [b"a", b"b", b"c", b"d"]
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        one = []
        ch.basic_consume(sname, lambda c, m, p, b: one.append(m.delivery_tag), arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + WAIT
        while not one and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        r = closed_with(lambda: ch.basic_reject(one[0], requeue=False), conn)
        assert r == ("connection", 540, f"NOT_IMPLEMENTED - basic.nack and basic.reject not supported by stream queues {what}")
        conn = connect(amqp_url)
        ch = conn.channel()
        r = closed_with(lambda: ch.basic_get(sname), conn)
        assert r == ("connection", 540, f"NOT_IMPLEMENTED - basic.get not supported by stream queues {what}")
        conn = connect(amqp_url)
        ch = conn.channel()
        r = closed_with(lambda: ch.queue_purge(sname), conn)
        assert r == ("connection", 540, f"NOT_IMPLEMENTED - queue.purge not supported by stream queues {what}")
        conn = connect(amqp_url)
        ch = conn.channel()
        assert ch.queue_delete(sname).method.message_count == 0
    finally:
        safe_close(conn)


def test_slow_reader_gets_everything_in_order(amqp_url, sname):
    # More than the connection's output buffer holds: the reader stops while the client does
    # not read, and resumes when it does.
    conn = connect(amqp_url)
    try:
        declare(conn.channel(), sname)
        body = b"z" * 32768
        publish(conn, sname, [body] * 200)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1000)
        got = []
        ch.basic_consume(sname, lambda c, m, p, b: got.append(p.headers["x-stream-offset"]) or c.basic_ack(m.delivery_tag),
                         arguments={"x-stream-offset": "first"})
        time.sleep(1.0)  # nothing read meanwhile: the socket and the broker's buffer fill up
        deadline = time.monotonic() + WAIT
        while len(got) < 200 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert got == list(range(200))
    finally:
        safe_close(conn)


def test_bad_offset_closes_the_connection(amqp_url, sname):
    conn = connect(amqp_url)
    try:
        declare(conn.channel(), sname)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        r = closed_with(lambda: ch.basic_consume(sname, lambda *a: None, arguments={"x-stream-offset": "bogus"}), conn)
        assert r == ("connection", 541, "INTERNAL_ERROR")
    finally:
        safe_close(conn)


def test_retention_by_bytes_with_small_segments(amqp_url, sname):
    conn = connect(amqp_url)
    try:
        declare(conn.channel(), sname, **{"x-max-length-bytes": 20000, "x-stream-max-segment-size-bytes": 5000})
        body = b"x" * 500
        for _ in range(10):
            publish(conn, sname, [body] * 10)
        # Whole old segments went: the stream starts later than 0 and keeps at most about
        # the limit plus a segment.
        deadline = time.monotonic() + WAIT
        while True:
            got = consume(conn, sname, 100, "first", timeout=1)
            if got and got[0][0] > 0:
                break
            assert time.monotonic() < deadline, "retention did not remove old segments"
        offs = [g[0] for g in got]
        # RabbitMQ's offsets may skip (its chunks hold more than messages); Warren's are dense.
        assert offs == sorted(offs) and got[-1][1] == body
        assert 20 <= len(offs) < 100
    finally:
        safe_close(conn)


@pytest.mark.skipif(not os.environ.get("WARREN_BIN"), reason="restarts the broker: Warren only (WARREN_BIN)")
def test_restart_keeps_messages_and_offsets():
    w = WarrenProcess(os.environ["WARREN_BIN"])
    w.start()
    try:
        q = uname("stream")
        conn = connect(w.url)
        declare(conn.channel(), q, **{"x-stream-max-segment-size-bytes": 2000})
        publish(conn, q, [b"before-%d" % i for i in range(30)])
        safe_close(conn)
        w.proc.send_signal(signal.SIGTERM)
        w.proc.wait(10)
        w.start()
        conn = connect(w.url)
        assert declare(conn.channel(), q, **{"x-stream-max-segment-size-bytes": 2000}).method.queue == q
        publish(conn, q, [b"after"])
        got = consume(conn, q, 31, "first")
        assert [g[0] for g in got] == list(range(31))
        assert got[30][1] == b"after" and got[29][1] == b"before-29"
        assert [g[0] for g in consume(conn, q, 2, 29)] == [29, 30]
        safe_close(conn)
    finally:
        w.stop()


def http(mgmt_url, method, path, body=None):
    req = urllib.request.Request(mgmt_url + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("content-type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read()
        return json.loads(text) if text.strip() else None


def test_retention_by_policy(amqp_url, mgmt_url, sname):
    conn = connect(amqp_url)
    pol = uname("spol")
    try:
        declare(conn.channel(), sname, **{"x-stream-max-segment-size-bytes": 5000})
        http(mgmt_url, "PUT", f"/api/policies/%2F/{pol}",
             {"pattern": "^" + sname + "$", "definition": {"max-length-bytes": 20000},
              "apply-to": "queues", "priority": 7})
        body = b"y" * 500
        deadline = time.monotonic() + WAIT
        while True:
            publish(conn, sname, [body] * 20)
            got = consume(conn, sname, 1, "first", timeout=1)
            if got and got[0][0] > 0:
                break
            assert time.monotonic() < deadline, "the policy's max-length-bytes did not apply"
    finally:
        try:
            http(mgmt_url, "DELETE", f"/api/policies/%2F/{pol}")
        finally:
            safe_close(conn)


def test_management_type_and_count(amqp_url, mgmt_url, sname):
    conn = connect(amqp_url)
    try:
        declare(conn.channel(), sname)
        publish(conn, sname, [b"1", b"2", b"3"])
        deadline = time.monotonic() + 15
        while True:
            q = http(mgmt_url, "GET", f"/api/queues/%2f/{sname}")
            # RabbitMQ's stats lag by its collection interval.
            if q.get("messages") == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert q["type"] == "stream"
        assert q["messages"] == 3
    finally:
        safe_close(conn)
