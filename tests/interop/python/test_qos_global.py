"""basic.qos global=true (a limit shared by a channel's consumers), as RabbitMQ 3.10 applies it:
the limit holds back no-ack consumers too, and blocked queues resume in random order."""

from __future__ import annotations

import pytest

from helpers import Collector, pump, settle, wait_depth


def _queue(ch) -> str:
    return ch.queue_declare("", exclusive=True).method.queue


def test_global_prefetch_holds_back_no_ack_consumers(conn, ch):
    # RabbitMQ's limiter refuses every delivery while the channel's limit is reached, not only
    # those that need an ack; a no-ack delivery just does not count towards the limit.
    q1, q2 = _queue(ch), _queue(ch)
    ch.basic_publish("", q1, b"acked")
    for i in range(3):
        ch.basic_publish("", q2, b"free%d" % i)
    wait_depth(conn, q1, 1)
    wait_depth(conn, q2, 3)
    ch.basic_qos(prefetch_count=1, global_qos=True)
    acked, free = Collector(), Collector()
    ch.basic_consume(q1, acked)
    pump(conn, lambda: len(acked) == 1)
    ch.basic_consume(q2, free, auto_ack=True)
    settle(conn, 0.5)
    assert len(free) == 0, "a no-ack consumer was served past the channel's full global limit"
    ch.basic_ack(acked.deliveries[0][0].delivery_tag)
    pump(conn, lambda: len(free) == 3, what="the no-ack consumer to be served once room opened")
    assert free.bodies == [b"free0", b"free1", b"free2"]


@pytest.mark.parametrize("tx", [False, True])
def test_global_prefetch_serves_the_channels_queues_fairly(conn, ch, tx):
    # Prefetch 1 shared by consumers of two queues, each ack (or each committed ack) making room
    # for one delivery: the next one must not always come from the same queue.
    q1, q2 = _queue(ch), _queue(ch)
    n = 100
    for q in (q1, q2):
        for i in range(n + 20):
            ch.basic_publish("", q, b"%s" % q.encode())
    wait_depth(conn, q1, n + 20)
    wait_depth(conn, q2, n + 20)
    ch.basic_qos(prefetch_count=1, global_qos=True)
    if tx:
        ch.tx_select()
    got: list[bytes] = []

    def on_message(chan, method, props, body):
        got.append(body)
        if len(got) <= n:
            chan.basic_ack(method.delivery_tag)
            if tx:
                chan.tx_commit()

    ch.basic_consume(q1, on_message)
    ch.basic_consume(q2, on_message)
    pump(conn, lambda: len(got) > n, timeout=20, what=f"{n + 1} deliveries")
    first = got[:n]
    from_q1 = first.count(q1.encode())
    from_q2 = first.count(q2.encode())
    assert from_q1 + from_q2 == n
    assert min(from_q1, from_q2) >= n // 5, f"unfair: {from_q1} from one queue, {from_q2} from the other"
