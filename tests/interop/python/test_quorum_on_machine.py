"""A single node's quorum queues on the replicated queue machine (`quorum_queues_on_machine`):
a Raft group of one member whose state machine is the queue core (issue 31's first step; see
docs/design/replicated-queues.md), driven through pika against the real binary.

* Publishes with confirms are acked once applied; consumers get messages in order within
  their prefetch; a reject with requeue brings a message back flagged redelivered, its
  `x-delivery-count` one more; past `x-delivery-limit` it is dead-lettered; `x-message-ttl`
  expires messages through the leader's ticks, dead-lettering them.
* basic.get and queue.purge go through the group; queue.delete removes its files.
* kill -9 keeps every confirmed message: what a consumer held comes back redelivered, what was
  never delivered does not.
* (A quorum queue an earlier release made, as a classic queue's log, is carried over to the
  machine at boot: test_quorum_upgrade.py.)

Warren only (WARREN_BIN): these tests start, kill and restart their own broker.
"""

from __future__ import annotations

import glob
import json
import os
import time
import urllib.request

import pika
import pytest

from helpers import safe_close, uname, wait_until
from test_durability import BIN, PERSISTENT, Node

pytestmark = pytest.mark.skipif(not BIN, reason="starts and kills its own broker: Warren only (WARREN_BIN)")

QUORUM = {"x-queue-type": "quorum"}


def on_machine(n: Node) -> Node:
    """The setting written out, as a configuration of the releases that had it (it is the only
    behaviour now: `false` is refused)."""
    path = os.path.join(n.dir, "warren.toml")
    with open(path, "w") as f:
        f.write("quorum_queues_on_machine = true\n")
    n.extra_args = ["--config", path]
    return n


@pytest.fixture
def node():
    n = on_machine(Node())
    n.start()
    yield n
    n.cleanup()


def connect(n: Node) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(n.url))


def publish_confirmed(n: Node, queue: str, bodies: list[bytes], props=PERSISTENT) -> None:
    c = connect(n)
    try:
        ch = c.channel()
        ch.confirm_delivery()
        for b in bodies:
            # Raises on a nack (pika's BlockingChannel with confirms).
            ch.basic_publish("", queue, b, props, mandatory=True)
    finally:
        safe_close(c)


def api(n: Node, path: str) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{n.http_port}/api/{path}")
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def take(ch, queue: str, n: int, timeout: float = 10.0) -> list:
    """Consumes `n` deliveries (manual ack) and returns (method, properties, body) of each."""
    got = []
    deadline = time.monotonic() + timeout
    for m, p, b in ch.consume(queue, inactivity_timeout=0.2):
        if m is not None:
            got.append((m, p, b))
            if len(got) == n:
                break
        if time.monotonic() > deadline:
            break
    return got


def declare_dead_lettering(ch, q: str, dlq: str, args: dict) -> None:
    """Quorum queue `q` with `args`, dead-lettering to queue `dlq` (declared) through the
    default exchange."""
    ch.queue_declare(dlq)
    ch.queue_declare(q, durable=True, arguments={**QUORUM, **args, "x-dead-letter-exchange": "",
                                                 "x-dead-letter-routing-key": dlq})


def test_confirms_order_prefetch_and_the_api_type(node):
    q = uname("qm")
    c = connect(node)
    try:
        ch = c.channel()
        ch.queue_declare(q, durable=True, arguments=QUORUM)
        publish_confirmed(node, q, [b"m%d" % i for i in range(100)])
        assert ch.queue_declare(q, passive=True).method.message_count == 100
        ch.basic_qos(prefetch_count=10)
        got = []
        # Within its prefetch: ten, and no more until one is acked.
        got += take(ch, q, 11, timeout=1.0)
        assert len(got) == 10
        assert api(node, f"queues/%2F/{q}")["messages_unacknowledged"] in (0, 10)  # stats lag
        for _ in range(9):
            ch.basic_ack(got[-1][0].delivery_tag, multiple=True)
            got += take(ch, q, 10)
        ch.basic_ack(got[-1][0].delivery_tag, multiple=True)
        assert [b for _, _, b in got] == [b"m%d" % i for i in range(100)]
        assert not any(m.redelivered for m, _, _ in got)
        ch.cancel()
        wait_until(lambda: ch.queue_declare(q, passive=True).method.message_count == 0, 5)
        view = api(node, f"queues/%2F/{q}")
        assert view["type"] == "quorum"
        assert view["durable"] is True
    finally:
        safe_close(c)


def test_requeue_redelivers_with_a_count_and_the_limit_dead_letters(node):
    q, dlq = uname("qm"), uname("dlq")
    c = connect(node)
    try:
        ch = c.channel()
        declare_dead_lettering(ch, q, dlq, {"x-delivery-limit": 1})
        publish_confirmed(node, q, [b"once"])
        ch.basic_qos(prefetch_count=1)
        (m1, p1, _), = take(ch, q, 1)
        assert not m1.redelivered
        ch.basic_reject(m1.delivery_tag, requeue=True)
        (m2, p2, b2), = take(ch, q, 1)
        assert b2 == b"once" and m2.redelivered
        assert p2.headers["x-delivery-count"] == 1
        ch.basic_reject(m2.delivery_tag, requeue=True)
        ch.cancel()
        # Returned more often than the limit: dead-lettered, with RabbitMQ's reason.
        wait_until(lambda: ch.queue_declare(dlq, passive=True).method.message_count == 1, 10)
        m, props, body = ch.basic_get(dlq, auto_ack=True)
        assert body == b"once"
        assert props.headers["x-death"][0]["reason"] == "delivery_limit"
        assert ch.queue_declare(q, passive=True).method.message_count == 0
    finally:
        safe_close(c)


def test_message_ttl_expires_through_ticks_and_dead_letters(node):
    q, dlq = uname("qm"), uname("dlq")
    c = connect(node)
    try:
        ch = c.channel()
        declare_dead_lettering(ch, q, dlq, {"x-message-ttl": 300})
        publish_confirmed(node, q, [b"short-lived"])
        wait_until(lambda: ch.queue_declare(dlq, passive=True).method.message_count == 1, 10)
        assert ch.queue_declare(q, passive=True).method.message_count == 0
        _, props, body = ch.basic_get(dlq, auto_ack=True)
        assert body == b"short-lived"
        assert props.headers["x-death"][0]["reason"] == "expired"
    finally:
        safe_close(c)


def test_get_purge_and_delete_go_through_the_group(node):
    q = uname("qm")
    c = connect(node)
    try:
        ch = c.channel()
        ch.queue_declare(q, durable=True, arguments=QUORUM)
        publish_confirmed(node, q, [b"1", b"2", b"3", b"4"])
        m, _, body = ch.basic_get(q, auto_ack=False)
        assert body == b"1" and m.message_count == 3
        # Unacked, then the channel closes: back to the queue, redelivered.
        safe_close(c)
        c = connect(node)
        ch = c.channel()
        m, _, body = ch.basic_get(q, auto_ack=True)
        assert body == b"1" and m.redelivered
        assert ch.queue_purge(q).method.message_count == 3
        assert ch.basic_get(q, auto_ack=True)[0] is None
        groups = glob.glob(os.path.join(node.data, "**", "group"), recursive=True)
        assert groups, "the queue's group directory"
        ch.queue_delete(q)
        wait_until(lambda: not any(os.path.exists(g) for g in groups), 10)
    finally:
        safe_close(c)


def test_kill_9_keeps_confirmed_messages_and_flags_only_what_was_delivered(node):
    q = uname("qm")
    c = connect(node)
    ch = c.channel()
    ch.queue_declare(q, durable=True, arguments=QUORUM)
    publish_confirmed(node, q, [b"m%d" % i for i in range(20)])
    # A consumer holds m0..m2 (its prefetch); basic.get takes m3 (acked) and m4 (held).
    ch.basic_qos(prefetch_count=3)
    got = take(ch, q, 4, timeout=1.0)
    assert [b for _, _, b in got] == [b"m0", b"m1", b"m2"]
    m3, _, b3 = ch.basic_get(q, auto_ack=False)
    m4, _, b4 = ch.basic_get(q, auto_ack=False)
    assert (b3, b4) == (b"m3", b"m4")
    ch.basic_ack(m3.delivery_tag)
    # The ack is applied once the count says so (the API's figures lag a little).
    wait_until(lambda: api(node, f"queues/%2F/{q}").get("messages") == 19, 10)
    node.kill9()
    node.start()
    c2 = connect(node)
    try:
        ch2 = c2.channel()
        wait_until(lambda: ch2.queue_declare(q, passive=True).method.message_count == 19, 15)
        out = []
        while True:
            m, _, body = ch2.basic_get(q, auto_ack=True)
            if m is None:
                break
            out.append((body, m.redelivered))
        assert sorted(b for b, _ in out) == sorted(b"m%d" % i for i in range(20) if i != 3)
        flagged = {b for b, r in out if r}
        assert flagged == {b"m0", b"m1", b"m2", b"m4"}, out
    finally:
        safe_close(c2)


def test_at_least_once_dead_letters_wait_for_a_route_through_a_kill_9(node):
    q, dlx, dlq = uname("qm"), uname("dlx"), uname("dlq")
    c = connect(node)
    ch = c.channel()
    ch.exchange_declare(dlx, "direct", durable=True)
    ch.queue_declare(q, durable=True, arguments={**QUORUM, "x-delivery-limit": 0,
                                                 "x-dead-letter-exchange": dlx,
                                                 "x-dead-letter-routing-key": "dead",
                                                 "x-dead-letter-strategy": "at-least-once",
                                                 "x-overflow": "reject-publish"})
    publish_confirmed(node, q, [b"kept"])
    ch.basic_qos(prefetch_count=1)
    (m, _, _), = take(ch, q, 1)
    # Returned past the limit: dead-lettered, but nothing is bound to the dead-letter exchange
    # yet, so the group keeps it (not lost, as at-most-once would).
    ch.basic_reject(m.delivery_tag, requeue=True)
    time.sleep(1.5)
    node.kill9()
    node.start()
    c2 = connect(node)
    try:
        ch2 = c2.channel()
        ch2.queue_declare(dlq, durable=True)
        ch2.queue_bind(dlq, dlx, "dead")
        # Sent again (every second) once it has a route.
        wait_until(lambda: ch2.queue_declare(dlq, passive=True).method.message_count == 1, 10)
        _, props, body = ch2.basic_get(dlq, auto_ack=True)
        assert body == b"kept"
        assert props.headers["x-death"][0]["reason"] == "delivery_limit"
        assert ch2.queue_declare(q, passive=True).method.message_count == 0
    finally:
        safe_close(c2)


def test_delayed_retries_are_held_in_the_group_through_a_kill_9(node):
    """x-delayed-retry-*: the due time of a returned message is in the group's state, so a
    restart (kill -9) holds it until the same time; a nack under type `failed` is not held."""
    q, q2 = uname("qm"), uname("qm")
    c = connect(node)
    ch = c.channel()
    ch.queue_declare(q, durable=True, arguments={**QUORUM, "x-delayed-retry-type": "all",
                                                 "x-delayed-retry-min": 3000})
    ch.queue_declare(q2, durable=True, arguments={**QUORUM, "x-delayed-retry-type": "failed",
                                                  "x-delayed-retry-min": 60000})
    publish_confirmed(node, q, [b"job"])
    publish_confirmed(node, q2, [b"other"])
    # A nack is a return: under `failed`, back at once.
    m, _, _ = ch.basic_get(q2, auto_ack=False)
    ch.basic_nack(m.delivery_tag, requeue=True)
    m, props, body = ch.basic_get(q2, auto_ack=True)
    assert body == b"other" and m.redelivered and props.headers["x-delivery-count"] == 1
    m, _, _ = ch.basic_get(q, auto_ack=False)
    nacked = time.monotonic()
    ch.basic_nack(m.delivery_tag, requeue=True)
    time.sleep(0.5)
    # Held back, it is not in the queue meanwhile.
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    assert ch.basic_get(q, auto_ack=True)[0] is None
    node.kill9()
    node.start()
    c2 = connect(node)
    try:
        ch2 = c2.channel()
        got = None
        deadline = time.monotonic() + 20
        while got is None and time.monotonic() < deadline:
            m, props, body = ch2.basic_get(q, auto_ack=True)
            if m is not None:
                got = (time.monotonic(), m, props, body)
            else:
                time.sleep(0.05)
        assert got is not None, "the retried message did not come back after the restart"
        at, m, props, body = got
        assert body == b"job" and m.redelivered and props.headers["x-delivery-count"] == 1
        assert at - nacked >= 2.9, f"back {at - nacked:.2f}s after the nack, before its 3 s delay"
    finally:
        safe_close(c2)


def props(priority=None) -> pika.BasicProperties:
    return pika.BasicProperties(delivery_mode=2, priority=priority)


def test_priorities_are_strict_levels_up_to_31_and_survive_a_kill_9(node):
    """RabbitMQ 4.3's quorum queue priorities on the machine: `x-max-priority` (refused by
    3.10's quorum queues) makes strict levels, capped at 31; a message above the top counts as
    the top, one without a priority as 0; within a level, first in first out. The levels are
    in the replicated state: a restart replays them."""
    q, fifo = uname("qm-prio"), uname("qm-fifo")
    c = connect(node)
    try:
        ch = c.channel()
        ch.queue_declare(q, durable=True, arguments={**QUORUM, "x-max-priority": 100})
        ch.queue_declare(fifo, durable=True, arguments=QUORUM)
        sent = [(b"none", None), (b"p5", 5), (b"p31", 31), (b"p200", 200), (b"p0", 0),
                (b"p30", 30), (b"p5b", 5)]
        for queue in (q, fifo):
            cc = connect(node)
            ch2 = cc.channel()
            ch2.confirm_delivery()
            for body, p in sent:
                ch2.basic_publish("", queue, body, props(p), mandatory=True)
            safe_close(cc)
    finally:
        safe_close(c)
    node.kill9()
    node.start()
    c = connect(node)
    try:
        ch = c.channel()
        got = [ch.basic_get(q, auto_ack=True)[2] for _ in sent]
        # 31 and 200 share the top level (31), in publish order; then 30, 5, 5, then 0 and none.
        assert got == [b"p31", b"p200", b"p30", b"p5", b"p5b", b"none", b"p0"]
        # Without x-max-priority a quorum queue is first in first out (as in RabbitMQ 3.10).
        assert [ch.basic_get(fifo, auto_ack=True)[2] for _ in sent] == [b for b, _ in sent]
        assert api(node, f"queues/%2F/{q}")["arguments"]["x-max-priority"] == 100
    finally:
        safe_close(c)
