"""The consistent-hash exchange (x-consistent-hash, RabbitMQ's rabbitmq_consistent_hash_exchange
plugin): binding keys are weights, each message reaches exactly one queue, shares follow the
weights, the same key keeps its queue. Written against RabbitMQ 3.10 with the plugin enabled
(`rabbitmq-plugins enable rabbitmq_consistent_hash_exchange`); skipped there without it."""

from __future__ import annotations

import os

import pika
import pika.exceptions
import pytest

from helpers import connect, safe_close

N = 3000
# Shares are checked to within this absolute fraction: about 6 standard deviations at N.
TOLERANCE = 0.04


@pytest.fixture
def chx(conn, res):
    """A consistent-hash exchange's declarer; skips on a RabbitMQ without the plugin."""
    ch = conn.channel()

    def declare(arguments=None) -> str:
        name = res.exchange("chx")
        try:
            ch.exchange_declare(name, "x-consistent-hash", arguments=arguments)
        except pika.exceptions.ConnectionClosedByBroker as e:
            if not os.environ.get("WARREN_BIN") and "unknown exchange type" in str(e):
                pytest.skip("RabbitMQ without rabbitmq_consistent_hash_exchange enabled")
            raise
        return name
    return declare


def bound_queues(ch, res, exchange: str, weights: list[str]) -> list[str]:
    qs = []
    for w in weights:
        name = res.queue("chq")
        ch.queue_declare(name)
        ch.queue_bind(name, exchange, w)
        qs.append(name)
    return qs


def publish(ch, exchange: str, keys, props=None):
    ch.confirm_delivery()
    for i, k in enumerate(keys):
        p = props(i) if props else None
        ch.basic_publish(exchange, k, str(i).encode(), p)


def drain(ch, queue: str) -> list[int]:
    """Every message body in `queue` (as ints), emptying it."""
    out = []
    while True:
        m, _, body = ch.basic_get(queue, auto_ack=True)
        if m is None:
            return out
        out.append(int(body))


def placement(ch, queues: list[str]) -> dict[int, int]:
    """Message id -> index of the queue holding it; fails if a message is in two queues."""
    where: dict[int, int] = {}
    for qi, name in enumerate(queues):
        for mid in drain(ch, name):
            assert mid not in where, f"message {mid} in two queues"
            where[mid] = qi
    return where


def test_each_message_in_exactly_one_queue_with_weighted_shares(conn, res, chx):
    x = chx()
    ch = conn.channel()
    weights = [1, 2, 3]
    qs = bound_queues(ch, res, x, [str(w) for w in weights])
    publish(ch, x, [f"order-{i}" for i in range(N)])
    where = placement(ch, qs)
    assert sorted(where) == list(range(N)), "every message routed exactly once"
    total = sum(weights)
    for qi, w in enumerate(weights):
        share = sum(1 for v in where.values() if v == qi) / N
        assert abs(share - w / total) < TOLERANCE, (qi, share, w / total)


def test_same_keys_same_queues_and_a_new_binding_takes_only_its_share(conn, res, chx):
    x = chx()
    ch = conn.channel()
    qs = bound_queues(ch, res, x, ["10", "10"])
    keys = [f"user-{i}" for i in range(N)]
    publish(ch, x, keys)
    first = placement(ch, qs)
    publish(ch, x, keys)
    assert placement(ch, qs) == first, "stable while bindings do not change"
    qs += bound_queues(ch, res, x, ["20"])
    publish(ch, x, keys)
    after = placement(ch, qs)
    moved = [mid for mid in range(N) if after[mid] != first[mid]]
    assert all(after[mid] == 2 for mid in moved), "keys move only to the new queue"
    assert abs(len(moved) / N - 0.5) < TOLERANCE, len(moved) / N


def test_hash_header(conn, res, chx):
    x = chx({"hash-header": "tenant"})
    ch = conn.channel()
    qs = bound_queues(ch, res, x, ["5", "5", "5"])
    # The routing key is ignored: one tenant, one queue, whatever the key.
    publish(ch, x, [f"k{i}" for i in range(60)],
            lambda i: pika.BasicProperties(headers={"tenant": "acme"}))
    counts = [len(drain(ch, name)) for name in qs]
    assert sorted(counts) == [0, 0, 60], counts
    publish(ch, x, ["same"] * 300, lambda i: pika.BasicProperties(headers={"tenant": f"t{i}"}))
    counts = [len(drain(ch, name)) for name in qs]
    assert sum(counts) == 300 and min(counts) > 50, counts
    # No header: one fixed queue for all of them.
    publish(ch, x, [f"k{i}" for i in range(30)])
    counts = [len(drain(ch, name)) for name in qs]
    assert sorted(counts) == [0, 0, 30], counts


@pytest.mark.parametrize("prop", ["message_id", "correlation_id", "timestamp"])
def test_hash_property(conn, res, chx, prop):
    x = chx({"hash-property": prop})
    ch = conn.channel()
    qs = bound_queues(ch, res, x, ["5", "5", "5"])

    def props(v):
        return pika.BasicProperties(**{prop: v if prop == "timestamp" else str(v)})
    publish(ch, x, [f"k{i}" for i in range(60)], lambda i: props(1234567))
    counts = [len(drain(ch, name)) for name in qs]
    assert sorted(counts) == [0, 0, 60], counts
    publish(ch, x, ["same"] * 300, lambda i: props(1000 + i))
    counts = [len(drain(ch, name)) for name in qs]
    assert sum(counts) == 300 and min(counts) > 50, counts


def test_no_bindings_unroutable(conn, res, chx):
    x = chx()
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(x, "k", b"m", mandatory=True)


@pytest.mark.parametrize("key,text", [
    ("abc", 'PRECONDITION_FAILED - The binding key must be an integer: <<"abc">>'),
    ("", "PRECONDITION_FAILED - The binding key must be an integer: <<>>"),
    (" 3", 'PRECONDITION_FAILED - The binding key must be an integer: <<" 3">>'),
    ('a"b', 'PRECONDITION_FAILED - The binding key must be an integer: <<"a\\"b">>'),
    ("\x01a", "PRECONDITION_FAILED - The binding key must be an integer: <<1,97>>"),
    ("1.5", 'PRECONDITION_FAILED - The binding key must be an integer: <<"1.5">>'),
    ("0", "PRECONDITION_FAILED - The binding key must be greater than 0"),
    ("-3", "PRECONDITION_FAILED - The binding key must be greater than 0"),
])
def test_binding_key_must_be_a_positive_integer(conn, res, chx, key, text):
    x = chx()
    ch = conn.channel()
    name = res.queue("chq")
    ch.queue_declare(name)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.queue_bind(name, x, key)
    assert (e.value.reply_code, e.value.reply_text) == (406, text)


def test_signed_weight_accepted(conn, res, chx):
    x = chx()
    ch = conn.channel()
    bound_queues(ch, res, x, ["+3"])


@pytest.mark.parametrize("args,code,text", [
    ({"hash-header": "h", "hash-property": "message_id"}, 406,
     "PRECONDITION_FAILED - hash-header and hash-property are mutually exclusive"),
    ({"hash-property": "app_id"}, 406, "PRECONDITION_FAILED - Unsupported property: app_id"),
])
def test_exchange_arguments_validated(conn, res, chx, args, code, text):
    chx()  # skips without the plugin
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.exchange_declare(res.exchange("chx"), "x-consistent-hash", arguments=args)
    assert (e.value.reply_code, e.value.reply_text) == (code, text)


def test_non_string_hash_header_closes_the_connection(amqp_url, res, chx):
    chx()
    c = connect(amqp_url)
    try:
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
            c.channel().exchange_declare(res.exchange("chx"), "x-consistent-hash",
                                         arguments={"hash-property": 5})
        # RabbitMQ's validation crashes on it: a bare 541.
        assert (e.value.reply_code, e.value.reply_text) == (541, "INTERNAL_ERROR")
    finally:
        safe_close(c)


def test_redeclare_checks_the_type(conn, res, chx):
    x = chx()
    ch = conn.channel()
    ch.exchange_declare(x, "x-consistent-hash")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.exchange_declare(x, "direct")
    assert e.value.reply_code == 406
    assert e.value.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{x}' in vhost '/': "
        "received 'direct' but current is ''x-consistent-hash''")


@pytest.mark.skipif(not os.environ.get("WARREN_BIN"), reason="restarts the broker: Warren only (WARREN_BIN)")
def test_durable_exchange_routes_the_same_after_restart():
    from test_durability import Node

    node = Node()
    try:
        node.start()
        c = connect(node.url)
        ch = c.channel()
        ch.exchange_declare("chx-dur", "x-consistent-hash", durable=True,
                            arguments={"hash-property": "message_id"})
        qs = []
        for i, w in enumerate(["1", "2", "3"]):
            qs.append(f"chq-dur-{i}")
            ch.queue_declare(qs[-1], durable=True)
            ch.queue_bind(qs[-1], "chx-dur", w)
        ids = lambda i: pika.BasicProperties(message_id=f"m{i}")  # noqa: E731
        publish(ch, "chx-dur", ["k"] * 300, ids)
        before = placement(ch, qs)
        safe_close(c)
        node.stop()
        node.start()
        c = connect(node.url)
        ch = c.channel()
        publish(ch, "chx-dur", ["k"] * 300, ids)
        assert placement(ch, qs) == before, "the same buckets after a restart"
        safe_close(c)
    finally:
        node.cleanup()
