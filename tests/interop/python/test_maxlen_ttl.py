"""Length limits after a requeue, and message TTL at the edges (TTL 0, expired messages behind
a live head), as RabbitMQ 3.10's classic queues answer them."""

from __future__ import annotations

import time

import pika
import pytest

from helpers import Collector, get_all, pump, settle, wait_depth


def _dead_letter_queues(ch, args: dict) -> tuple[str, str]:
    """A queue with `args` that dead-letters into a second queue (returned second)."""
    dlq = ch.queue_declare("", exclusive=True).method.queue
    a = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
    a.update(args)
    q = ch.queue_declare("", exclusive=True, arguments=a).method.queue
    return q, dlq


def _death(props) -> tuple[str, str, int]:
    d = props.headers["x-death"][0]
    return d["reason"], d["queue"], d["count"]


def _requeue(conn, ch2, tag: int, how: str) -> None:
    if how == "nack":
        ch2.basic_nack(tag, requeue=True)
    elif how == "reject":
        ch2.basic_reject(tag, requeue=True)
    elif how == "recover":
        ch2.basic_recover(requeue=True)
    else:
        ch2.close()


def _fill_past_limit_by_requeue(conn, ch, args: dict, how: str, body=b"m%d") -> tuple[str, str]:
    """Two messages in a queue limited to two; one is taken unacked, a third published (the
    unacked one does not count), then the taken one is requeued: three ready."""
    q, dlq = _dead_letter_queues(ch, args)
    for i in range(2):
        ch.basic_publish("", q, body % i)
    wait_depth(conn, q, 2)
    ch2 = conn.channel()
    m, _, b = ch2.basic_get(q)
    assert b == body % 0
    ch.basic_publish("", q, body % 2)
    wait_depth(conn, q, 2)
    _requeue(conn, ch2, m.delivery_tag, how)
    return q, dlq


REQUEUES = ["nack", "reject", "recover", "close"]


@pytest.mark.parametrize("how", REQUEUES)
def test_requeue_past_max_length_drops_the_head(conn, ch, how):
    q, dlq = _fill_past_limit_by_requeue(conn, ch, {"x-max-length": 2}, how)
    [(m, p, b)] = get_all(ch, dlq, 1)
    assert b == b"m0"
    assert _death(p) == ("maxlen", q, 1)
    assert not m.redelivered
    wait_depth(conn, q, 2)
    assert [(b, m.redelivered) for m, _, b in get_all(ch, q, 2)] == [(b"m1", False), (b"m2", False)]


@pytest.mark.parametrize("how", ["nack", "close"])
def test_requeue_past_max_length_bytes_drops_the_head(conn, ch, how):
    q, dlq = _fill_past_limit_by_requeue(conn, ch, {"x-max-length-bytes": 10}, how, body=b"body%d")
    [(m, p, b)] = get_all(ch, dlq, 1)
    assert b == b"body0"
    assert _death(p) == ("maxlen", q, 1)
    wait_depth(conn, q, 2)
    assert [b for _, _, b in get_all(ch, q, 2)] == [b"body1", b"body2"]


@pytest.mark.parametrize("overflow", ["reject-publish", "reject-publish-dlx"])
@pytest.mark.parametrize("how", REQUEUES)
def test_requeue_past_max_length_with_reject_overflow_keeps_everything(conn, ch, overflow, how):
    # RabbitMQ drops from the head on a requeue only under drop-head; the reject modes refuse
    # publishes, and a requeue is not one: the queue stays over its limit.
    q, dlq = _fill_past_limit_by_requeue(conn, ch, {"x-max-length": 2, "x-overflow": overflow}, how)
    wait_depth(conn, q, 3)
    settle(conn, 0.3)
    assert ch.queue_declare(dlq, passive=True).method.message_count == 0
    got = [(b, m.redelivered) for m, _, b in get_all(ch, q, 3)]
    assert got == [(b"m0", True), (b"m1", False), (b"m2", False)]


@pytest.mark.parametrize("overflow", ["reject-publish", "reject-publish-dlx"])
def test_an_empty_message_counts_against_max_length(conn, ch, overflow):
    # RabbitMQ's will_overflow counts the message (length + 1 > max) whatever its size; Warren
    # once let an empty body past a full queue.
    q, dlq = _dead_letter_queues(ch, {"x-max-length": 1, "x-overflow": overflow})
    ch.confirm_delivery()
    answers = []
    for _ in range(3):
        try:
            ch.basic_publish("", q, b"")
            answers.append("ack")
        except pika.exceptions.NackError:
            answers.append("nack")
    assert answers == ["ack", "nack", "nack"]
    assert ch.queue_declare(q, passive=True).method.message_count == 1
    if overflow == "reject-publish-dlx":
        wait_depth(conn, dlq, 2)
    else:
        settle(conn, 0.3)
        assert ch.queue_declare(dlq, passive=True).method.message_count == 0


TTL0 = [
    pytest.param({"x-message-ttl": 0}, None, id="queue-ttl"),
    pytest.param({}, pika.BasicProperties(expiration="0"), id="message-expiration"),
]


@pytest.mark.parametrize("qargs,props", TTL0)
@pytest.mark.parametrize("auto_ack", [False, True], ids=["ack", "no-ack"])
def test_ttl_zero_is_delivered_to_a_consumer_that_can_take_it(conn, ch, qargs, props, auto_ack):
    q, dlq = _dead_letter_queues(ch, qargs)
    col = Collector()
    ch.basic_consume(q, col, auto_ack=auto_ack)
    for i in range(5):
        ch.basic_publish("", q, b"t%d" % i, properties=props)
    pump(conn, lambda: len(col) == 5, what="5 deliveries of TTL 0 messages")
    assert col.bodies == [b"t%d" % i for i in range(5)]
    settle(conn, 0.2)
    assert ch.queue_declare(dlq, passive=True).method.message_count == 0


@pytest.mark.parametrize("qargs,props", TTL0)
def test_ttl_zero_expires_when_no_consumer_can_take_it(conn, ch, qargs, props):
    q, dlq = _dead_letter_queues(ch, qargs)
    ch.basic_publish("", q, b"alone", properties=props)
    [(_, p, b)] = get_all(ch, dlq, 1)
    assert b == b"alone" and _death(p) == ("expired", q, 1)
    # A consumer out of prefetch cannot take it at once either.
    cch = conn.channel()
    cch.basic_qos(prefetch_count=1)
    col = Collector()
    cch.basic_consume(q, col)
    ch.basic_publish("", q, b"taken", properties=props)
    pump(conn, lambda: len(col) == 1)
    ch.basic_publish("", q, b"blocked", properties=props)
    [(_, p, b)] = get_all(ch, dlq, 1)
    assert b == b"blocked" and _death(p) == ("expired", q, 1)
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    cch.basic_ack(col.deliveries[0][0].delivery_tag)
    settle(conn, 0.3)
    assert col.bodies == [b"taken"]


def _live_head_then_expired(conn, ch) -> tuple[str, str]:
    """A queue holding: a message without TTL, two that expire, one without TTL."""
    q, dlq = _dead_letter_queues(ch, {})
    ch.basic_publish("", q, b"live")
    ch.basic_publish("", q, b"short", properties=pika.BasicProperties(expiration="50"))
    ch.basic_publish("", q, b"zero", properties=pika.BasicProperties(expiration="0"))
    ch.basic_publish("", q, b"live2")
    wait_depth(conn, q, 4)
    time.sleep(0.3)  # well past the 50 ms TTL
    # Classic queues expire from the head only: both still count while "live" is ahead of them.
    assert ch.queue_declare(q, passive=True).method.message_count == 4
    assert ch.queue_declare(dlq, passive=True).method.message_count == 0
    return q, dlq


def test_expired_message_behind_a_live_head_is_never_got(conn, ch):
    q, dlq = _live_head_then_expired(conn, ch)
    m, _, b = ch.basic_get(q, auto_ack=True)
    # Taking the head drops the expired messages now at the head, before the count is given.
    assert (b, m.message_count) == (b"live", 1)
    dead = get_all(ch, dlq, 2)
    assert [(b, _death(p)) for _, p, b in dead] == [
        (b"short", ("expired", q, 1)), (b"zero", ("expired", q, 1))]
    m, _, b = ch.basic_get(q, auto_ack=True)
    assert (b, m.message_count) == (b"live2", 0)


def test_expired_message_behind_a_live_head_is_never_delivered(conn, ch):
    q, dlq = _live_head_then_expired(conn, ch)
    col = Collector()
    ch.basic_consume(q, col, auto_ack=True)
    pump(conn, lambda: len(col) == 2)
    dead = get_all(ch, dlq, 2)
    assert [(b, _death(p)) for _, p, b in dead] == [
        (b"short", ("expired", q, 1)), (b"zero", ("expired", q, 1))]
    settle(conn, 0.2)
    assert col.bodies == [b"live", b"live2"]
