"""basic.* : publish, consume, get, qos, ack/nack/reject, recover, cancel, return."""

from __future__ import annotations

import os
import struct
from datetime import datetime, timezone
from decimal import Decimal

import pika
import pika.exceptions
import pytest

import rawamqp as raw
from helpers import (Collector, assert_broker_alive, assert_connection_usable, channel_closed,
                     get_all, host_port, pump, settle, uname, wait_depth)


def _queue(ch) -> str:
    return ch.queue_declare("", exclusive=True).method.queue


def _publish_n(ch, q, n, start=0):
    for i in range(start, start + n):
        ch.basic_publish("", q, str(i).encode())


# ---------------------------------------------------------------- publish / properties


FULL_HEADERS = {
    "str": "hello é",
    "int": 42,
    "neg": -7,
    "big": 2**40,
    "bool_t": True,
    "bool_f": False,
    "decimal": Decimal("3.14"),
    "timestamp": datetime(2023, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
    "void": None,
    "bytes": b"\x00\x01\xff",
    "array": [1, "two", [3, 4], {"five": 5}, True, None],
    "empty_array": [],
    "empty_table": {},
    "nested": {"a": {"b": {"c": [True, False, {"d": "deep"}]}}},
}


def test_properties_round_trip(conn, ch):
    q = _queue(ch)
    props = pika.BasicProperties(
        content_type="application/json",
        content_encoding="utf-8",
        headers=FULL_HEADERS,
        delivery_mode=2,
        priority=5,
        correlation_id="corr-123",
        reply_to="reply.queue",
        expiration="600000",
        message_id="msg-42",
        timestamp=1700000000,
        type="order.created",
        user_id="guest",
        app_id="interop-tests",
    )
    ch.basic_publish("", q, b'{"k": 1}', props)
    col = Collector()
    ch.basic_consume(q, col, auto_ack=True)
    pump(conn, lambda: len(col) == 1)
    m, p, body = col.deliveries[0]
    assert body == b'{"k": 1}'
    assert m.exchange == "" and m.routing_key == q and m.redelivered is False
    for attr in ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id",
                 "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id"):
        assert getattr(p, attr) == getattr(props, attr), attr
    assert p.headers == FULL_HEADERS


def test_properties_absent_stay_absent(conn, ch):
    q = _queue(ch)
    ch.basic_publish("", q, b"bare")
    (m, p, b), = get_all(ch, q, 1)
    for attr in ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
                 "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
                 "user_id", "app_id", "cluster_id"):
        assert getattr(p, attr) is None, attr


def test_user_id_must_match_authenticated_user(conn):
    ch = conn.channel()
    q = _queue(ch)
    ch.basic_publish("", q, b"x", pika.BasicProperties(user_id="mallory"))
    with channel_closed(406, "PRECONDITION_FAILED - user_id property set to 'mallory' but "
                             "authenticated user was 'guest'"):
        ch.queue_declare(q, passive=True)
    assert_connection_usable(conn)


def test_empty_body(conn, ch):
    q = _queue(ch)
    ch.basic_publish("", q, b"", pika.BasicProperties(message_id="empty"))
    col = Collector()
    ch.basic_consume(q, col, auto_ack=True)
    pump(conn, lambda: len(col) == 1)
    assert col.deliveries[0][2] == b""
    assert col.deliveries[0][1].message_id == "empty"


def test_large_body_spanning_many_frames(conn, ch):
    q = _queue(ch)
    body = os.urandom(1024 * 1024)  # 1 MiB = 9 body frames at frame_max 131072
    ch.basic_publish("", q, body)
    col = Collector()
    ch.basic_consume(q, col, auto_ack=True)
    pump(conn, lambda: len(col) == 1, timeout=20)
    assert col.deliveries[0][2] == body
    ch.basic_cancel(ch.consumer_tags[0])
    ch.basic_publish("", q, body[::-1])
    (_m, _p, b), = get_all(ch, q, 1)
    assert b == body[::-1]


# ---------------------------------------------------------------- get


def test_get_and_get_empty(ch):
    q = _queue(ch)
    assert ch.basic_get(q) == (None, None, None)  # get-empty
    _publish_n(ch, q, 3)
    wait_depth(ch.connection, q, 3)
    counts = []
    for i in range(3):
        m, _p, b = ch.basic_get(q, auto_ack=True)
        assert b == str(i).encode()
        assert m.redelivered is False
        assert m.exchange == "" and m.routing_key == q
        counts.append(m.message_count)
    assert counts == [2, 1, 0]  # message_count in get-ok = messages left after this one
    assert ch.basic_get(q) == (None, None, None)


def test_delivery_tags_start_at_one_and_are_shared_between_get_and_consume(conn):
    ch = conn.channel()
    q = _queue(ch)
    _publish_n(ch, q, 4)
    wait_depth(conn, q, 4)
    m1, _, _ = ch.basic_get(q, auto_ack=False)
    m2, _, _ = ch.basic_get(q, auto_ack=False)
    assert (m1.delivery_tag, m2.delivery_tag) == (1, 2)
    col = Collector()
    ch.basic_consume(q, col)
    pump(conn, lambda: len(col) == 2)
    assert [m.delivery_tag for m, _, _ in col.deliveries] == [3, 4]
    ch.basic_cancel(ch.consumer_tags[0])
    # tags are per channel
    ch2 = conn.channel()
    ch2.basic_publish("", q, b"other")
    m, _, _ = get_all(ch2, q, 1, no_ack=False)[0]
    assert m.delivery_tag == 1
    ch2.basic_ack(1)
    ch.basic_ack(4, multiple=True)


# ---------------------------------------------------------------- consume / qos


def test_consume_no_ack(conn, ch):
    q = _queue(ch)
    _publish_n(ch, q, 20)
    ch.basic_qos(prefetch_count=1)  # does not apply to no-ack consumers
    col = Collector()
    ch.basic_consume(q, col, auto_ack=True)
    pump(conn, lambda: len(col) == 20)
    assert col.bodies == [str(i).encode() for i in range(20)]
    ch.close()
    settle(conn, 0.1)
    # nothing was left unacked to be requeued
    ch2 = conn.channel()
    assert ch2.queue_declare(q, passive=True).method.message_count == 0


def test_qos_prefetch_count_per_consumer(conn, ch):
    q = _queue(ch)
    _publish_n(ch, q, 10)
    wait_depth(conn, q, 10)
    ch.basic_qos(prefetch_count=2)  # global=False: per consumer
    col = Collector()
    ch.basic_consume(q, col)
    pump(conn, lambda: len(col) >= 2)
    settle(conn, 0.3)
    assert len(col) == 2
    ch.basic_ack(col.deliveries[0][0].delivery_tag)
    pump(conn, lambda: len(col) >= 3)
    settle(conn, 0.3)
    assert len(col) == 3
    # a second consumer on the same channel gets its own window of 2
    col2 = Collector()
    ch.basic_consume(q, col2)
    pump(conn, lambda: len(col2) >= 2)
    settle(conn, 0.3)
    assert len(col2) == 2 and len(col) == 3
    ch.basic_ack(0, multiple=True)  # 5 delivered -> ack all -> each consumer gets 2 more (1 left)
    pump(conn, lambda: len(col) + len(col2) >= 9)
    settle(conn, 0.3)
    assert (len(col), len(col2)) == (5, 4)


def test_qos_global_shared_across_channel_consumers(conn, ch):
    q1, q2 = _queue(ch), _queue(ch)
    _publish_n(ch, q1, 5)
    _publish_n(ch, q2, 5)
    wait_depth(conn, q1, 5)
    wait_depth(conn, q2, 5)
    ch.basic_qos(prefetch_count=3, global_qos=True)
    c1, c2 = Collector(), Collector()
    ch.basic_consume(q1, c1)
    ch.basic_consume(q2, c2)
    pump(conn, lambda: len(c1) + len(c2) >= 3)
    settle(conn, 0.3)
    assert len(c1) + len(c2) == 3
    ch.basic_ack(0, multiple=True)
    pump(conn, lambda: len(c1) + len(c2) >= 6)
    settle(conn, 0.3)
    assert len(c1) + len(c2) == 6


def test_qos_zero_means_unlimited(conn, ch):
    q = _queue(ch)
    _publish_n(ch, q, 50)
    ch.basic_qos(prefetch_count=0)
    col = Collector()
    ch.basic_consume(q, col)
    pump(conn, lambda: len(col) == 50)
    ch.basic_ack(col.deliveries[-1][0].delivery_tag, multiple=True)


def test_exclusive_consumer_blocks_others(conn):
    ch = conn.channel()
    q = _queue(ch)
    ch.basic_consume(q, lambda *a: None, exclusive=True)
    ch2 = conn.channel()
    with channel_closed(403, f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use"):
        ch2.basic_consume(q, lambda *a: None)
    assert ch.is_open
    assert_connection_usable(conn)


def test_exclusive_consume_refused_when_queue_has_consumers(conn):
    ch = conn.channel()
    q = _queue(ch)
    ch.basic_consume(q, lambda *a: None)
    ch2 = conn.channel()
    with channel_closed(403, f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use"):
        ch2.basic_consume(q, lambda *a: None, exclusive=True)


def _basic_consume(channel, queue, tag="", no_ack=False, exclusive=False):
    return raw.method_frame(channel, (60, 20), struct.pack(">H", 0) + raw.shortstr(queue)
                            + raw.shortstr(tag) + raw.bits(False, no_ack, exclusive, False) + raw.table({}))


def test_server_generated_consumer_tag(amqp_url):
    with raw.RawConnection(*host_port(amqp_url)) as c:
        c.handshake()
        c.open_channel(1)
        c.send(raw.queue_declare(1, "", exclusive=True))
        q = c.expect(raw.QUEUE_DECLARE_OK).args["queue"]
        c.send(_basic_consume(1, q, ""))
        ok = c.expect((60, 21))
        tag = raw.Reader(ok.payload[4:]).shortstr()
        assert tag.startswith("amq.ctag-") and len(tag) > len("amq.ctag-")
        c.send(_basic_consume(1, q, ""))
        tag2 = raw.Reader(c.expect((60, 21)).payload[4:]).shortstr()
        assert tag2.startswith("amq.ctag-") and tag2 != tag
        c.send(raw.connection_close())
        c.expect(raw.CONNECTION_CLOSE_OK)


def test_duplicate_consumer_tag_is_connection_error(amqp_url):
    # RabbitMQ: 530 "NOT_ALLOWED - attempt to reuse consumer tag '<tag>'" as a *connection* error.
    with raw.RawConnection(*host_port(amqp_url)) as c:
        c.handshake()
        c.open_channel(1)
        c.send(raw.queue_declare(1, "", exclusive=True))
        q = c.expect(raw.QUEUE_DECLARE_OK).args["queue"]
        c.send(_basic_consume(1, q, "dup-tag"))
        c.expect((60, 21))
        c.send(_basic_consume(1, q, "dup-tag"))
        f = c.expect_connection_close()
        assert f.args["reply_code"] == 530
        assert f.args["reply_text"] == "NOT_ALLOWED - attempt to reuse consumer tag 'dup-tag'"
        assert (f.args["class_id"], f.args["method_id"]) == (60, 20)
        assert c.wait_closed()
    assert_broker_alive(amqp_url)


def test_cancel_of_unknown_consumer_tag_is_ok(amqp_url):
    # RabbitMQ replies cancel-ok (echoing the tag) for a tag it does not know.
    with raw.RawConnection(*host_port(amqp_url)) as c:
        c.handshake()
        c.open_channel(1)
        c.send(raw.method_frame(1, (60, 30), raw.shortstr("no-such-tag") + raw.bits(False)))
        ok = c.expect((60, 31))
        assert raw.Reader(ok.payload[4:]).shortstr() == "no-such-tag"
        c.send(raw.connection_close())
        c.expect(raw.CONNECTION_CLOSE_OK)


def test_same_consumer_tag_on_different_channels_is_fine(conn):
    ch1, ch2 = conn.channel(), conn.channel()
    q = _queue(ch1)
    ch1.basic_consume(q, lambda *a: None, consumer_tag="shared-tag")
    ch2.basic_consume(q, lambda *a: None, consumer_tag="shared-tag")
    assert ch1.queue_declare(q, passive=True).method.consumer_count == 2


def test_cancel_stops_deliveries(conn, ch):
    q = _queue(ch)
    col = Collector()
    tag = ch.basic_consume(q, col, auto_ack=True)
    _publish_n(ch, q, 3)
    pump(conn, lambda: len(col) == 3)
    ch.basic_cancel(tag)
    assert tag not in ch.consumer_tags
    _publish_n(ch, q, 2, start=3)
    wait_depth(conn, q, 2)
    assert len(col) == 3
    assert ch.queue_declare(q, passive=True).method.consumer_count == 0


def test_unacked_stay_unacked_after_cancel(conn, ch):
    q = _queue(ch)
    _publish_n(ch, q, 2)
    col = Collector()
    tag = ch.basic_consume(q, col)
    pump(conn, lambda: len(col) == 2)
    ch.basic_cancel(tag)
    settle(conn, 0.1)
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    ch.basic_ack(col.deliveries[1][0].delivery_tag, multiple=True)
    ch.close()
    settle(conn, 0.1)
    assert conn.channel().queue_declare(q, passive=True).method.message_count == 0


def test_server_sends_cancel_when_queue_deleted(conn):
    ch = conn.channel()
    cancels = []
    ch.add_on_cancel_callback(cancels.append)
    q = _queue(ch)
    tag = ch.basic_consume(q, lambda *a: None)
    conn.channel().queue_delete(q)
    pump(conn, lambda: cancels, what="server basic.cancel")
    cancel = cancels[0].method
    assert isinstance(cancel, pika.spec.Basic.Cancel)
    assert cancel.consumer_tag == tag
    assert cancel.nowait is True  # RabbitMQ sends the notification with no-wait set
    assert tag not in ch.consumer_tags
    assert ch.is_open
    assert_connection_usable(conn)


# ---------------------------------------------------------------- mandatory / return


def test_mandatory_unroutable_is_returned(conn, ch):
    returns = []
    ch.add_on_return_callback(lambda _ch, m, p, b: returns.append((m, p, b)))
    key = uname("nowhere")
    ch.basic_publish("amq.direct", key, b"bounce", pika.BasicProperties(message_id="r-1"), mandatory=True)
    pump(conn, lambda: returns, what="basic.return")
    m, p, b = returns[0]
    assert (m.reply_code, m.reply_text) == (312, "NO_ROUTE")
    assert (m.exchange, m.routing_key) == ("amq.direct", key)
    assert p.message_id == "r-1"
    assert b == b"bounce"


def test_mandatory_routed_is_not_returned(conn, ch):
    returns = []
    ch.add_on_return_callback(lambda *a: returns.append(a))
    q = _queue(ch)
    ch.basic_publish("", q, b"ok", mandatory=True)
    get_all(ch, q, 1)
    settle(conn, 0.2)
    assert returns == []


def test_non_mandatory_unroutable_is_dropped_silently(conn, ch):
    returns = []
    ch.add_on_return_callback(lambda *a: returns.append(a))
    ch.basic_publish("amq.direct", uname("nowhere"), b"drop")
    settle(conn, 0.2)
    assert returns == []
    assert_connection_usable(conn)


def test_mandatory_to_default_exchange_missing_queue_is_returned(conn, ch):
    returns = []
    ch.add_on_return_callback(lambda _ch, m, p, b: returns.append(m))
    missing = uname("missing")
    ch.basic_publish("", missing, b"x", mandatory=True)
    pump(conn, lambda: returns)
    assert (returns[0].reply_code, returns[0].reply_text, returns[0].routing_key) == (312, "NO_ROUTE", missing)


# ---------------------------------------------------------------- ack / nack / reject


def _consume_all(conn, ch, q, n):
    col = Collector()
    ch.basic_consume(q, col)
    pump(conn, lambda: len(col) == n)
    return col


def test_ack_and_ack_multiple(conn, ch):
    q = _queue(ch)
    _publish_n(ch, q, 5)
    col = _consume_all(conn, ch, q, 5)
    tags = [m.delivery_tag for m, _, _ in col.deliveries]
    assert tags == [1, 2, 3, 4, 5]
    ch.basic_ack(1)
    ch.basic_ack(3, multiple=True)  # acks 2 and 3
    ch.close()  # 4 and 5 go back
    c2 = conn.channel()
    wait_depth(conn, q, 2)
    got = get_all(c2, q, 2)
    assert [b for _, _, b in got] == [b"3", b"4"]
    assert all(m.redelivered for m, _, _ in got)


def test_nack_requeue_and_no_requeue(conn, ch):
    q = _queue(ch)
    _publish_n(ch, q, 2)
    m0, _, b0 = get_all(ch, q, 1, no_ack=False)[0]
    m1, _, b1 = get_all(ch, q, 1, no_ack=False)[0]
    ch.basic_nack(m0.delivery_tag, requeue=False)  # dropped (no DLX)
    ch.basic_nack(m1.delivery_tag, requeue=True)
    (m, _, b), = get_all(ch, q, 1)
    assert b == b"1" and m.redelivered is True
    settle(conn, 0.1)
    assert ch.basic_get(q)[0] is None


def test_nack_multiple(conn, ch):
    q = _queue(ch)
    _publish_n(ch, q, 4)
    col = _consume_all(conn, ch, q, 4)
    ch.basic_cancel(ch.consumer_tags[0])
    ch.basic_nack(3, multiple=True, requeue=True)  # 1..3 back, 4 stays unacked
    wait_depth(conn, q, 3)
    got = get_all(ch, q, 3)
    assert [b for _, _, b in got] == [b"0", b"1", b"2"]
    assert all(m.redelivered for m, _, _ in got)
    ch.basic_nack(col.deliveries[3][0].delivery_tag, multiple=True, requeue=False)
    settle(conn, 0.1)
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_reject_requeue_and_no_requeue(conn, ch):
    q = _queue(ch)
    _publish_n(ch, q, 2)
    m0, _, _ = get_all(ch, q, 1, no_ack=False)[0]
    m1, _, _ = get_all(ch, q, 1, no_ack=False)[0]
    ch.basic_reject(m0.delivery_tag, requeue=True)
    ch.basic_reject(m1.delivery_tag, requeue=False)
    (m, _, b), = get_all(ch, q, 1)
    assert b == b"0" and m.redelivered is True
    settle(conn, 0.1)
    assert ch.basic_get(q)[0] is None


def test_requeued_messages_keep_original_order(conn, ch):
    q = _queue(ch)
    _publish_n(ch, q, 6)
    got = get_all(ch, q, 4, no_ack=False)
    # reject in reverse order; RabbitMQ still puts them back in their original positions
    for m, _, _ in reversed(got):
        ch.basic_reject(m.delivery_tag, requeue=True)
    again = get_all(ch, q, 6)
    assert [b for _, _, b in again] == [str(i).encode() for i in range(6)]
    assert [m.redelivered for m, _, _ in again] == [True] * 4 + [False] * 2


def test_requeue_middle_message_goes_back_to_its_place(conn, ch):
    q = _queue(ch)
    _publish_n(ch, q, 5)
    got = get_all(ch, q, 3, no_ack=False)
    ch.basic_reject(got[1][0].delivery_tag, requeue=True)
    rest = get_all(ch, q, 3)
    assert [b for _, _, b in rest] == [b"1", b"3", b"4"]
    assert [m.redelivered for m, _, _ in rest] == [True, False, False]
    ch.basic_ack(0, multiple=True)


def test_ack_unknown_delivery_tag_is_406(conn):
    ch = conn.channel()
    ch.basic_ack(42)
    with channel_closed(406, "PRECONDITION_FAILED - unknown delivery tag 42"):
        ch.queue_declare("", exclusive=True)
    assert_connection_usable(conn)


@pytest.mark.parametrize("op", ["nack", "reject"])
def test_nack_reject_unknown_delivery_tag_is_406(conn, op):
    ch = conn.channel()
    getattr(ch, f"basic_{op}")(7)
    with channel_closed(406, "PRECONDITION_FAILED - unknown delivery tag 7"):
        ch.queue_declare("", exclusive=True)


def test_double_ack_is_406(conn):
    ch = conn.channel()
    q = _queue(ch)
    ch.basic_publish("", q, b"x")
    m, _, _ = get_all(ch, q, 1, no_ack=False)[0]
    ch.basic_ack(m.delivery_tag)
    ch.basic_ack(m.delivery_tag)
    with channel_closed(406, f"PRECONDITION_FAILED - unknown delivery tag {m.delivery_tag}"):
        ch.queue_declare("", exclusive=True)
    assert_connection_usable(conn)


def test_ack_of_no_ack_delivery_is_406(conn):
    ch = conn.channel()
    q = _queue(ch)
    ch.basic_publish("", q, b"x")
    m, _, _ = get_all(ch, q, 1, no_ack=True)[0]
    ch.basic_ack(m.delivery_tag)
    with channel_closed(406, f"PRECONDITION_FAILED - unknown delivery tag {m.delivery_tag}"):
        ch.queue_declare("", exclusive=True)


def test_ack_multiple_zero_acks_everything(conn, ch):
    q = _queue(ch)
    _publish_n(ch, q, 3)
    get_all(ch, q, 3, no_ack=False)
    ch.basic_ack(0, multiple=True)
    ch.close()
    settle(conn, 0.1)
    assert conn.channel().queue_declare(q, passive=True).method.message_count == 0


# ---------------------------------------------------------------- recover / channel close


def test_recover_requeue_redelivers_unacked(conn, ch):
    q = _queue(ch)
    _publish_n(ch, q, 3)
    col = _consume_all(conn, ch, q, 3)
    ch.basic_recover(requeue=True)
    pump(conn, lambda: len(col) == 6)
    first, again = col.deliveries[:3], col.deliveries[3:]
    assert [b for _, _, b in again] == [b"0", b"1", b"2"]
    assert all(m.redelivered for m, _, _ in again)
    assert not any(m.redelivered for m, _, _ in first)
    assert [m.delivery_tag for m, _, _ in again] == [4, 5, 6]
    ch.basic_ack(6, multiple=True)


def test_unacked_messages_requeued_when_channel_closes(conn):
    ch = conn.channel()
    q = _queue(ch)
    _publish_n(ch, q, 3)
    col = _consume_all(conn, ch, q, 3)
    ch.basic_ack(col.deliveries[0][0].delivery_tag)
    ch.close()
    ch2 = conn.channel()
    wait_depth(conn, q, 2)
    got = get_all(ch2, q, 2)
    assert [b for _, _, b in got] == [b"1", b"2"]
    assert all(m.redelivered for m, _, _ in got)


def test_unacked_messages_requeued_when_connection_closes(amqp_url, conn, res):
    from helpers import connect
    q = res.queue()
    conn.channel().queue_declare(q)
    other = connect(amqp_url)
    och = other.channel()
    _publish_n(och, q, 2)
    get_all(och, q, 2, no_ack=False)
    other.close()
    wait_depth(conn, q, 2)
    ch = conn.channel()
    got = get_all(ch, q, 2)
    assert [b for _, _, b in got] == [b"0", b"1"]
    assert all(m.redelivered for m, _, _ in got)
    ch.queue_delete(q)


# ---------------------------------------------------------------- ordering


def test_ordering_of_thousands_of_messages(conn, ch):
    n = 3000
    q = _queue(ch)
    for i in range(n):
        ch.basic_publish("", q, i.to_bytes(4, "big"))
    ch.basic_qos(prefetch_count=500)
    received = []

    def on_msg(c, m, p, b):
        received.append(int.from_bytes(b, "big"))
        if m.delivery_tag % 100 == 0:
            c.basic_ack(m.delivery_tag, multiple=True)

    ch.basic_consume(q, on_msg)
    pump(conn, lambda: len(received) == n, timeout=25)
    assert received == list(range(n))
    ch.basic_ack(0, multiple=True)


def test_round_robin_between_consumers(conn, ch):
    q = _queue(ch)
    ch.basic_qos(prefetch_count=1)
    c1, c2 = Collector(), Collector()
    ch.basic_consume(q, c1, auto_ack=True)
    ch.basic_consume(q, c2, auto_ack=True)
    _publish_n(ch, q, 10)
    pump(conn, lambda: len(c1) + len(c2) == 10)
    assert len(c1) > 0 and len(c2) > 0
    assert sorted(c1.bodies + c2.bodies, key=int) == [str(i).encode() for i in range(10)]
