"""Consumer timeouts of quorum queues on the replicated queue machine
(`quorum_queues_on_machine`): the timeout is in the queue's replicated state, as RabbitMQ 4.3's
quorum queues keep it (issue 31, item 3). Each held delivery carries when it was made; the
leader's tick times out a consumer that held one too long, returns what it held (redelivered,
`x-delivery-count` one more) and tells the consumer's channel, which cancels it (basic.cancel)
or, for a client without `consumer_cancel_notify`, closes with RabbitMQ's 406. A lease
extension through `amq.warren.lease` becomes a command of the group.

The behaviour is the classic queue's (test_consumer_timeout.py), through another path: these
tests run the same checks against quorum queues on a node with the setting on.

Warren only (WARREN_BIN): starts its own broker with the setting on.
"""

from __future__ import annotations

import time

import pika
import pytest

from helpers import safe_close, settle, uname
from test_consumer_timeout import (Watch, cancelled_with_both_back_and_late_settles_ignored, depth,
                                   lease_by_body_for_every_delivery,
                                   lease_keeps_a_slow_consumer,
                                   without_cancel_notify_the_channel_is_closed)
from test_durability import BIN, Node
from test_quorum_on_machine import on_machine

pytestmark = pytest.mark.skipif(not BIN, reason="starts its own broker: Warren only (WARREN_BIN)")

QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture(scope="module")
def node():
    n = on_machine(Node())
    n.start()
    yield n
    n.cleanup()


@pytest.fixture
def conn(node):
    c = pika.BlockingConnection(pika.URLParameters(node.url))
    yield c
    safe_close(c)


def declare(ch, arguments=None) -> str:
    name = uname("ctm")
    ch.queue_declare(name, durable=True, arguments={**QUORUM, **(arguments or {})})
    return name


def publish(ch, queue: str, *bodies: bytes) -> None:
    for b in bodies:
        ch.basic_publish("", queue, b)


def test_the_queue_times_a_consumer_out_returns_what_it_held_and_the_channel_stays(conn):
    ch = conn.channel()
    qn = declare(ch)
    publish(ch, qn, b"a", b"b")
    w = Watch(conn, qn, arguments={"x-consumer-timeout": 1000})
    w.wait_deliveries(2)
    cancelled_with_both_back_and_late_settles_ignored(ch, w, qn)


def test_the_queue_argument_applies_and_the_message_counts_the_return(conn):
    ch = conn.channel()
    qn = declare(ch, {"x-consumer-timeout": 800})
    publish(ch, qn, b"m")
    w = Watch(conn, qn)
    w.wait_deliveries(1)
    w.wait_cancel()
    m, props, body = ch.basic_get(qn, auto_ack=True)
    assert body == b"m" and m.redelivered
    # The timeout's return counts, as any return to a quorum queue.
    assert props.headers["x-delivery-count"] == 1


def test_a_consumer_that_acks_in_time_is_not_timed_out(conn):
    ch = conn.channel()
    qn = declare(ch)
    w = Watch(conn, qn, arguments={"x-consumer-timeout": 800})
    start = time.monotonic()
    n = 0
    # Past three timeouts, each delivery acked at once.
    while time.monotonic() - start < 2.5:
        publish(ch, qn, b"x%d" % n)
        n += 1
        w.wait_deliveries(n)
        w.ch.basic_ack(w.deliveries[-1][0].delivery_tag)
        settle(conn, 0.1)
    settle(conn, 1.2)
    assert w.cancelled == [] and w.tag in w.ch.consumer_tags
    assert depth(ch, qn) == (0, 1)


def test_a_client_without_cancel_notify_gets_the_channel_closed(node):
    without_cancel_notify_the_channel_is_closed(node.url, declare)


def test_a_lease_extension_keeps_a_slow_consumer(conn):
    lease_keeps_a_slow_consumer(conn, declare)


def test_a_lease_by_body_for_every_delivery(conn):
    lease_by_body_for_every_delivery(conn, declare)
