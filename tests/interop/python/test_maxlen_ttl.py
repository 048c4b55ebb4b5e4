"""Length limits after a requeue, as RabbitMQ 3.10's classic queues answer them."""

from __future__ import annotations

import pytest

from helpers import get_all, settle, wait_depth


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
