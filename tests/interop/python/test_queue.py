"""queue.declare / bind / unbind / purge / delete."""

from __future__ import annotations

import struct
import time

import pika
import pika.exceptions
import pytest

import rawamqp as raw
from helpers import (assert_broker_alive, assert_connection_usable, channel_closed, connect, get_all,
                     host_port, safe_close, settle, uname, wait_depth, wait_until)

LOCKED = ("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{q}' in vhost '/'. "
          "It could be originally declared on another connection or the exclusive property value "
          "does not match that of the original declaration.")


def _exists(conn, q) -> bool:
    ch = conn.channel()
    try:
        ch.queue_declare(q, passive=True)
        ch.close()
        return True
    except pika.exceptions.ChannelClosedByBroker as e:
        if e.reply_code == 405:  # exclusive to another connection: exists
            return True
        assert e.reply_code == 404, e
        return False


def test_declare_named_queue(ch, res):
    q = res.queue()
    ok = ch.queue_declare(q)
    assert ok.method.queue == q
    assert ok.method.message_count == 0
    assert ok.method.consumer_count == 0
    # idempotent
    assert ch.queue_declare(q).method.queue == q
    ch.queue_delete(q)


def test_declare_server_named_queue(ch, res):
    ok = ch.queue_declare("", exclusive=True)
    q = res.track_queue(ok.method.queue)
    assert q.startswith("amq.gen-")
    assert len(q) > len("amq.gen-")
    ok2 = ch.queue_declare("", exclusive=True)
    res.track_queue(ok2.method.queue)
    assert ok2.method.queue != q
    ch.basic_publish("", q, b"x")
    assert get_all(ch, q, 1)[0][2] == b"x"


def test_passive_declare(conn, ch, res):
    q = res.queue()
    ch.queue_declare(q)
    ok = ch.queue_declare(q, passive=True)
    assert ok.method.queue == q
    # passive ignores flags
    ch.queue_declare(q, passive=True, durable=True, auto_delete=True)
    missing = uname("missing")
    with channel_closed(404, f"NOT_FOUND - no queue '{missing}' in vhost '/'"):
        ch.queue_declare(missing, passive=True)
    assert_connection_usable(conn)
    conn.channel().queue_delete(q)


def test_declare_durable_queue(ch, res):
    q = res.queue("durable")
    ch.queue_declare(q, durable=True)
    ch.queue_declare(q, durable=True)
    ch.basic_publish("", q, b"p", pika.BasicProperties(delivery_mode=2))
    wait_depth(ch.connection, q, 1)
    assert ch.queue_delete(q).method.message_count == 1


def test_message_and_consumer_count_in_declare_ok(conn, ch, res):
    q = res.queue()
    ch.queue_declare(q)
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    wait_depth(conn, q, 3)
    ok = ch.queue_declare(q, passive=True)
    assert (ok.method.message_count, ok.method.consumer_count) == (3, 0)
    ch2 = conn.channel()
    ch2.basic_qos(prefetch_count=1)
    ch2.basic_consume(q, lambda *a: None)
    ch2.basic_consume(q, lambda *a: None)
    # message_count counts only ready messages: up to 2 are now unacked at the consumers
    ok = wait_until(lambda: (lambda o: o if o.method.message_count == 1 else None)(
        ch.queue_declare(q, passive=True)), what="ready count 1", conn=conn)
    assert ok.method.consumer_count == 2
    # a non-passive redeclare reports the same counts
    ok = ch.queue_declare(q)
    assert (ok.method.message_count, ok.method.consumer_count) == (1, 2)
    ch2.close()
    ch.queue_delete(q)


def test_exclusive_queue_is_locked_to_other_connections(amqp_url, ch, res):
    q = res.queue("excl")
    ch.queue_declare(q, exclusive=True)
    other = connect(amqp_url)
    try:
        text = LOCKED.format(q=q)
        ops = [
            lambda c: c.queue_declare(q, exclusive=True),
            lambda c: c.queue_declare(q),
            lambda c: c.queue_declare(q, passive=True),
            lambda c: c.basic_consume(q, lambda *a: None),
            lambda c: c.basic_get(q),
            lambda c: c.queue_purge(q),
            lambda c: c.queue_delete(q),
            lambda c: c.queue_bind(q, "amq.fanout"),
        ]
        for op in ops:
            c = other.channel()
            with channel_closed(405, text):
                op(c)
        # publishing to it from another connection is allowed
        c = other.channel()
        c.basic_publish("", q, b"from-other")
        wait_depth(ch.connection, q, 1)
        assert_connection_usable(other)
    finally:
        safe_close(other)


def test_exclusive_queue_deleted_when_owner_closes(amqp_url, conn, res):
    owner = connect(amqp_url)
    q = res.queue("excl")
    owner.channel().queue_declare(q, exclusive=True)
    assert _exists(conn, q)
    owner.close()
    wait_until(lambda: not _exists(conn, q), what="exclusive queue deletion")


def test_redeclare_exclusive_flag_mismatch_is_405(conn, res):
    q = res.queue()
    ch = conn.channel()
    ch.queue_declare(q)
    with channel_closed(405, LOCKED.format(q=q)):
        ch.queue_declare(q, exclusive=True)
    conn.channel().queue_delete(q)


def test_auto_delete_queue_deleted_when_last_consumer_cancels(conn, res):
    ch = conn.channel()
    q = res.queue("ad")
    ch.queue_declare(q, auto_delete=True)
    # never consumed: stays
    settle(conn, 0.1)
    assert _exists(conn, q)
    t1 = ch.basic_consume(q, lambda *a: None)
    t2 = ch.basic_consume(q, lambda *a: None)
    ch.basic_cancel(t1)
    settle(conn, 0.1)
    assert _exists(conn, q)
    ch.basic_cancel(t2)
    wait_until(lambda: not _exists(conn, q), what="auto-delete queue deletion")


def test_auto_delete_queue_deleted_when_consumer_channel_closes(conn, res):
    ch = conn.channel()
    q = res.queue("ad")
    ch.queue_declare(q, auto_delete=True)
    ch.basic_consume(q, lambda *a: None)
    ch.close()
    wait_until(lambda: not _exists(conn, q), what="auto-delete queue deletion")


@pytest.mark.parametrize("first,second,arg,received,current", [
    (dict(), dict(durable=True), "durable", "'true'", "'false'"),
    (dict(durable=True), dict(), "durable", "'false'", "'true'"),
    (dict(), dict(auto_delete=True), "auto_delete", "'true'", "'false'"),
    (dict(arguments={"x-max-length": 5}), dict(arguments={"x-max-length": 6}),
     "x-max-length", "'6'", "'5'"),
    (dict(arguments={"x-max-length": 5}), dict(), "x-max-length",
     "none", "the value '5' of type 'signedint'"),
])
def test_redeclare_with_different_flags_is_406(conn, res, first, second, arg, received, current):
    q = res.queue()
    ch = conn.channel()
    ch.queue_declare(q, **first)
    with channel_closed(406, f"PRECONDITION_FAILED - inequivalent arg '{arg}' for queue '{q}' "
                             f"in vhost '/': received {received} but current is {current}"):
        ch.queue_declare(q, **second)
    assert_connection_usable(conn)
    conn.channel().queue_delete(q)


@pytest.mark.parametrize("first,second", [
    ({}, {"x-queue-type": "classic"}),
    ({"x-queue-type": "classic"}, {}),
])
def test_redeclare_adding_or_dropping_classic_queue_type_is_accepted(ch, res, first, second):
    # RabbitMQ takes a missing x-queue-type as 'classic' when comparing.
    q = res.queue()
    ch.queue_declare(q, arguments=first)
    ch.queue_declare(q, arguments=second)
    ch.queue_delete(q)


@pytest.mark.parametrize("first,second,received,current", [
    ({}, {"x-queue-type": "quorum"}, "the value 'quorum' of type 'longstr'", "none"),
    ({"x-queue-type": "quorum"}, {}, "none", "the value 'quorum' of type 'longstr'"),
    ({"x-queue-type": "quorum"}, {"x-queue-type": "classic"}, "'classic'", "'quorum'"),
    ({}, {"x-queue-type": "bogus"}, "the value 'bogus' of type 'longstr'", "none"),
])
def test_redeclare_with_other_queue_type_is_406(conn, res, first, second, received, current):
    q = res.queue()
    ch = conn.channel()
    ch.queue_declare(q, durable=True, arguments=first)
    with channel_closed(406, f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{q}' "
                             f"in vhost '/': received {received} but current is {current}"):
        ch.queue_declare(q, durable=True, arguments=second)
    assert_connection_usable(conn)
    conn.channel().queue_delete(q)


@pytest.mark.parametrize("first,second,equal,received,current", [
    ({"x-dead-letter-exchange": "a"}, {"x-dead-letter-exchange": b"a"}, True, None, None),
    ({"x-dead-letter-exchange": "a"}, {"x-dead-letter-exchange": b"b"}, False, "'b'", "'a'"),
    ({"x-max-length": 5}, {"x-max-length": "5"}, False, "'5'", "'5'"),
    ({"x-max-length": 5}, {"x-max-length": True}, False, "'true'", "'5'"),
])
def test_redeclare_compares_argument_values_of_other_types(conn, res, first, second, equal, received, current):
    # With the argument on both sides, RabbitMQ compares the values, not their types.
    q = res.queue()
    ch = conn.channel()
    ch.queue_declare(q, arguments=first)
    if equal:
        ch.queue_declare(q, arguments=second)
    else:
        arg = next(iter(first))
        with channel_closed(406, f"PRECONDITION_FAILED - inequivalent arg '{arg}' for queue '{q}' "
                                 f"in vhost '/': received {received} but current is {current}"):
            ch.queue_declare(q, arguments=second)
    conn.channel().queue_delete(q)


def test_redeclare_with_different_non_x_argument_is_accepted(ch, res):
    # RabbitMQ only checks equivalence of the x-arguments it knows.
    q = res.queue()
    ch.queue_declare(q, arguments={"custom": 1})
    ch.queue_declare(q, arguments={"custom": 2})
    ch.queue_delete(q)


def test_amq_prefixed_queue_name_is_reserved(conn):
    name = "amq." + uname("q")
    ch = conn.channel()
    with channel_closed(403, f"ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.*'"):
        ch.queue_declare(name)
    # passive declare of such a name is just 404
    ch = conn.channel()
    with channel_closed(404, f"NOT_FOUND - no queue '{name}' in vhost '/'"):
        ch.queue_declare(name, passive=True)
    assert_connection_usable(conn)


def test_server_named_queue_redeclared_by_name_is_reserved(conn):
    # RabbitMQ checks the name before the queue: an existing 'amq.gen-' queue declared again by
    # name (even on its own connection, with the same flags) is refused, only passive works.
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    with channel_closed(403, f"ACCESS_REFUSED - queue name '{q}' contains reserved prefix 'amq.*'"):
        ch.queue_declare(q, exclusive=True)
    ch = conn.channel()
    with channel_closed(403, f"ACCESS_REFUSED - queue name '{q}' contains reserved prefix 'amq.*'"):
        ch.queue_declare(q, durable=True)
    ch = conn.channel()
    assert ch.queue_declare(q, passive=True).method.queue == q
    assert_connection_usable(conn)


def test_bind_unbind_direct(ch, res):
    x = res.exchange()
    ch.exchange_declare(x, "direct")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, x, "k1")
    ch.basic_publish(x, "k1", b"bound")
    assert get_all(ch, q, 1)[0][2] == b"bound"
    ch.queue_unbind(q, x, "k1")
    ch.basic_publish(x, "k1", b"unbound")
    settle(ch.connection, 0.2)
    assert ch.basic_get(q)[0] is None
    ch.exchange_delete(x)


def test_bind_unbind_fanout(ch, res):
    x = res.exchange()
    ch.exchange_declare(x, "fanout")
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q1, x)
    ch.queue_bind(q2, x, "ignored")
    ch.basic_publish(x, "rk", b"1")
    assert get_all(ch, q1, 1)[0][2] == b"1"
    assert get_all(ch, q2, 1)[0][2] == b"1"
    ch.queue_unbind(q2, x, "ignored")
    ch.basic_publish(x, "rk", b"2")
    assert get_all(ch, q1, 1)[0][2] == b"2"
    settle(ch.connection, 0.2)
    assert ch.basic_get(q2)[0] is None
    ch.exchange_delete(x)


# routing key -> which patterns match; recorded from RabbitMQ 3.10.
TOPIC_KEYS = ["a.b.c", "a.b.b.c", "a.c", "a", "a.b", "c", "", "b", "x.b.y.z", "a..c", ".", "a.b.c.d"]
TOPIC_CASES = {
    "a.*.c": ["a.b.c", "a..c"],
    "a.#": ["a.b.c", "a.b.b.c", "a.c", "a", "a.b", "a..c", "a.b.c.d"],
    "#": TOPIC_KEYS,
    "*": ["a", "c", "b"],  # '*' does not match the empty routing key
    "#.c": ["a.b.c", "a.b.b.c", "a.c", "c", "a..c"],
    "a.#.c": ["a.b.c", "a.b.b.c", "a.c", "a..c"],
    "*.b.#": ["a.b.c", "a.b.b.c", "a.b", "x.b.y.z", "a.b.c.d"],
    "a.*": ["a.c", "a.b"],
    "*.*": ["a.c", "a.b", "."],  # '.' is two empty words
    "": [""],
    "a.b.c": ["a.b.c"],
    "#.#": TOPIC_KEYS,
    "a.*.#": ["a.b.c", "a.b.b.c", "a.c", "a.b", "a..c", "a.b.c.d"],
    "*.#": [k for k in TOPIC_KEYS if k != ""],
}


def test_topic_bindings_with_star_and_hash(ch, res):
    x = res.exchange("topic")
    ch.exchange_declare(x, "topic")
    queues = {}
    for pattern in TOPIC_CASES:
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, x, pattern)
        queues[pattern] = q
    for k in TOPIC_KEYS:
        ch.basic_publish(x, k, k.encode())
    for pattern, expected in TOPIC_CASES.items():
        got = [b.decode() for _, _, b in get_all(ch, queues[pattern], len(expected))]
        assert sorted(got) == sorted(expected), pattern
    settle(ch.connection, 0.2)
    for pattern, q in queues.items():
        assert ch.basic_get(q)[0] is None, f"extra message for {pattern!r}"
    # unbind one pattern
    ch.queue_unbind(queues["a.#"], x, "a.#")
    ch.basic_publish(x, "a.b", b"after")
    assert get_all(ch, queues["*.b.#"], 1)[0][2] == b"after"
    settle(ch.connection, 0.2)
    assert ch.basic_get(queues["a.#"])[0] is None
    ch.exchange_delete(x)


def test_headers_bindings_all_and_any(ch, res):
    x = res.exchange("headers")
    ch.exchange_declare(x, "headers")
    q_all = ch.queue_declare("", exclusive=True).method.queue
    q_any = ch.queue_declare("", exclusive=True).method.queue
    q_default = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q_all, x, "", arguments={"x-match": "all", "a": 1, "b": "two"})
    ch.queue_bind(q_any, x, "", arguments={"x-match": "any", "a": 1, "b": "two"})
    ch.queue_bind(q_default, x, "", arguments={"a": 1, "b": "two"})  # default is all
    msgs = {
        "both": {"a": 1, "b": "two", "c": True},
        "only-a": {"a": 1},
        "only-b": {"b": "two"},
        "wrong-b": {"a": 1, "b": "three"},
        "none": {"c": 1},
        "no-headers": None,
    }
    for name, headers in msgs.items():
        ch.basic_publish(x, "ignored", name.encode(), pika.BasicProperties(headers=headers))
    expect = {
        q_all: ["both"],
        q_default: ["both"],
        q_any: ["both", "only-a", "only-b", "wrong-b"],
    }
    for q, names in expect.items():
        got = [b.decode() for _, _, b in get_all(ch, q, len(names))]
        assert sorted(got) == sorted(names)
    settle(ch.connection, 0.2)
    for q in expect:
        assert ch.basic_get(q)[0] is None
    ch.queue_unbind(q_any, x, "", arguments={"x-match": "any", "a": 1, "b": "two"})
    ch.basic_publish(x, "", b"after", pika.BasicProperties(headers={"a": 1}))
    settle(ch.connection, 0.2)
    assert ch.basic_get(q_any)[0] is None
    ch.exchange_delete(x)


def test_headers_bad_x_match_is_406(conn, res):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    with channel_closed(406, 'PRECONDITION_FAILED - Invalid x-match field value <<"bad">>; '
                             'expected all, any, all-with-x, or any-with-x'):
        ch.queue_bind(q, "amq.headers", "", arguments={"x-match": "bad", "a": 1})


def test_purge_returns_count(conn, ch, res):
    q = res.queue()
    ch.queue_declare(q)
    for i in range(5):
        ch.basic_publish("", q, b"m")
    wait_depth(conn, q, 5)
    assert ch.queue_purge(q).method.message_count == 5
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    assert ch.queue_purge(q).method.message_count == 0
    ch.queue_delete(q)


def test_purge_does_not_touch_unacked(conn, ch, res):
    q = res.queue()
    ch.queue_declare(q)
    for _ in range(3):
        ch.basic_publish("", q, b"m")
    wait_depth(conn, q, 3)
    m, _p, _b = ch.basic_get(q, auto_ack=False)
    assert ch.queue_purge(q).method.message_count == 2
    ch.basic_reject(m.delivery_tag, requeue=True)
    wait_depth(conn, q, 1)
    ch.queue_delete(q)


def test_purge_missing_queue_is_404(conn):
    ch = conn.channel()
    missing = uname("missing")
    with channel_closed(404, f"NOT_FOUND - no queue '{missing}' in vhost '/'"):
        ch.queue_purge(missing)


def test_delete_returns_count(conn, ch, res):
    q = res.queue()
    ch.queue_declare(q)
    for _ in range(4):
        ch.basic_publish("", q, b"m")
    wait_depth(conn, q, 4)
    assert ch.queue_delete(q).method.message_count == 4
    assert not _exists(conn, q)


def test_delete_missing_queue_is_ok(ch):
    # RabbitMQ 3.10: queue.delete of a missing queue replies delete-ok with message_count 0 (no 404).
    ok = ch.queue_delete(uname("missing"))
    assert ok.method.message_count == 0


def test_delete_if_unused_with_consumer_is_406(conn, res):
    q = res.queue()
    ch = conn.channel()
    ch.queue_declare(q)
    tag = ch.basic_consume(q, lambda *a: None)
    ch2 = conn.channel()
    with channel_closed(406, f"PRECONDITION_FAILED - queue '{q}' in vhost '/' in use"):
        ch2.queue_delete(q, if_unused=True)
    ch.basic_cancel(tag)
    ch3 = conn.channel()
    ch3.queue_delete(q, if_unused=True)
    assert not _exists(conn, q)


def test_delete_if_empty_with_messages_is_406(conn, res):
    q = res.queue()
    ch = conn.channel()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"m")
    wait_depth(conn, q, 1)
    with channel_closed(406, f"PRECONDITION_FAILED - queue '{q}' in vhost '/' not empty"):
        ch.queue_delete(q, if_empty=True)
    ch = conn.channel()
    ch.queue_purge(q)
    assert ch.queue_delete(q, if_empty=True).method.message_count == 0
    assert not _exists(conn, q)


def test_max_length_drop_head(conn, ch, res):
    q = res.queue()
    ch.queue_declare(q, arguments={"x-max-length": 2})
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    wait_depth(conn, q, 2)
    assert [b for _, _, b in get_all(ch, q, 2)] == [b"3", b"4"]
    ch.queue_delete(q)


def _queue_bind(channel, queue, exchange, key):
    return raw.method_frame(channel, (50, 20), struct.pack(">H", 0) + raw.shortstr(queue) + raw.shortstr(exchange)
                            + raw.shortstr(key) + raw.bits(False) + raw.table({}))


def test_empty_queue_name_means_last_declared_queue(amqp_url):
    # AMQP 0-9-1 (and RabbitMQ): queue "" in bind/get/... refers to the channel's last declared queue.
    with raw.RawConnection(*host_port(amqp_url)) as c:
        c.handshake()
        c.open_channel(1)
        c.send(raw.queue_declare(1, "", exclusive=True))
        q = c.expect(raw.QUEUE_DECLARE_OK).args["queue"]
        key = uname("k")
        c.send(_queue_bind(1, "", "amq.direct", key))
        c.expect((50, 21))
        c.send(raw.basic_publish(1, "amq.direct", key) + raw.header_frame(1, 1) + raw.body_frame(1, b"z"))
        deadline = time.monotonic() + 10
        while True:
            c.send(raw.basic_get(1, ""))
            f = c.recv_frame()
            if f.method == raw.BASIC_GET_OK:
                break
            assert f.method == raw.BASIC_GET_EMPTY and time.monotonic() < deadline
            time.sleep(0.02)
        assert f.args["routing_key"] == key and f.args["exchange"] == "amq.direct"
        # passive declare of "" is not covered by that rule
        c.send(raw.queue_declare(1, "", passive=True))
        while f.method != raw.CHANNEL_CLOSE:
            f = c.recv_frame()
        assert f.args["reply_code"] == 404
        assert f.args["reply_text"] == "NOT_FOUND - no queue '' in vhost '/'"
        c.send(raw.channel_close_ok(1))
        assert q.startswith("amq.gen-")


def test_empty_queue_name_without_prior_declare_is_404(amqp_url):
    with raw.RawConnection(*host_port(amqp_url)) as c:
        c.handshake()
        c.open_channel(1)
        c.send(raw.basic_get(1, ""))
        f = c.expect(raw.CHANNEL_CLOSE)
        assert f.args["reply_code"] == 404
        assert f.args["reply_text"] == "NOT_FOUND - no previously declared queue"
        assert (f.args["class_id"], f.args["method_id"]) == raw.BASIC_GET
        c.send(raw.channel_close_ok(1))
    assert_broker_alive(amqp_url)


@pytest.mark.parametrize("kwargs", [dict(passive=True), dict(), dict(durable=True, exclusive=True, arguments={"x-max-length": "a"})])
def test_declare_of_direct_reply_to_pseudo_queue(ch, kwargs):
    # RabbitMQ 3.10: any declare of 'amq.rabbitmq.reply-to', passive or not, whatever its flags and
    # arguments, is answered declare-ok with 0 messages and 1 consumer (no reserved-prefix refusal).
    ok = ch.queue_declare("amq.rabbitmq.reply-to", **kwargs).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == ("amq.rabbitmq.reply-to", 0, 1)
    assert ch.is_open
