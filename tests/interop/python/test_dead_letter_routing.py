"""Dead-letter cycles and a message's whole key set (routing key, `CC`, `BCC`) at every hop of
exchange-to-exchange bindings, as RabbitMQ 3.10 does them (issue 29).

Every test here but the delayed-exchange one was written against the reference RabbitMQ 3.10
(`../shared/bench/rabbitmq.sh start`, then `tests/interop/python/run.sh` without WARREN_BIN)
and passes there unchanged.

RabbitMQ's rule (`rabbit_dead_letter:detect_cycles`): a dead letter is not delivered to a queue
that already appears in its `x-death` unless some entry from the newest back to that queue's is
`rejected`; other queues it routes to still get it.
"""

from __future__ import annotations

import os
import time

import pika
import pytest

from helpers import connect, get_all, queue_depth, safe_close, uname, wait_depth

# Long enough for a cycle that is not cut to go round many times (each turn takes the TTL).
SETTLE = 1.5
TTL = 50


@pytest.fixture
def chan(amqp_url, res):
    c = connect(amqp_url)
    yield c, c.channel()
    safe_close(c)


def _queue(ch, res, prefix, **args):
    name = res.queue(prefix)
    ch.queue_declare(name, durable=args.get("x-queue-type") == "quorum", arguments=args or None)
    return name


# The queue that dead-letters: classic, quorum (at-most-once dead-lettering, the default), and
# quorum with at-least-once dead-lettering (which needs reject-publish overflow).
KINDS = {
    "classic": {},
    "quorum": {"x-queue-type": "quorum"},
    "quorum-at-least-once": {"x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once",
                             "x-overflow": "reject-publish"},
}


def _exchange(ch, res, prefix, kind="fanout", **args):
    name = res.exchange(prefix)
    ch.exchange_declare(name, kind, arguments=args or None)
    return name


def _deaths(props) -> list[tuple[str, str, int]]:
    return [(d["queue"], d["reason"], d["count"]) for d in (props.headers or {}).get("x-death", [])]


@pytest.mark.parametrize("kind", KINDS)
def test_an_expiry_into_its_own_queue_is_dropped_there_and_delivered_elsewhere(chan, res, kind):
    """The issue's reproduction: a queue bound to its own dead-letter exchange, and an observer
    bound beside it. The observer gets the published message and one dead letter; the queue
    does not get its dead letter back (Warren used to loop for ever: 61 copies after 3 s)."""
    c, ch = chan
    dlx = _exchange(ch, res, "cyc-dlx")
    q = _queue(ch, res, "cyc-q", **{"x-message-ttl": TTL, "x-dead-letter-exchange": dlx}, **KINDS[kind])
    observer = _queue(ch, res, "cyc-obs")
    ch.queue_bind(q, dlx)
    ch.queue_bind(observer, dlx)
    ch.basic_publish(dlx, "k", b"loop")
    wait_depth(c, observer, 2)
    time.sleep(SETTLE)
    assert queue_depth(c, q) == 0
    assert queue_depth(c, observer) == 2
    got = get_all(ch, observer, 2)
    assert [b for _, _, b in got] == [b"loop", b"loop"]
    assert _deaths(got[1][1]) == [(q, "expired", 1)]


@pytest.mark.parametrize("kind", KINDS)
def test_a_cycle_through_two_queues_is_cut_where_it_closes(chan, res, kind):
    """q1 -(expired)-> q2 -(expired)-> back to q1: q1 is in the x-death with no rejection, so
    the dead letter from q2 goes to the observer only."""
    c, ch = chan
    x1 = _exchange(ch, res, "two-x1")
    x2 = _exchange(ch, res, "two-x2")
    q1 = _queue(ch, res, "two-q1", **{"x-message-ttl": TTL, "x-dead-letter-exchange": x1}, **KINDS[kind])
    q2 = _queue(ch, res, "two-q2", **{"x-message-ttl": TTL, "x-dead-letter-exchange": x2}, **KINDS[kind])
    observer = _queue(ch, res, "two-obs")
    ch.queue_bind(q2, x1)
    ch.queue_bind(q1, x2)
    ch.queue_bind(observer, x2)
    ch.basic_publish("", q1, b"m")
    wait_depth(c, observer, 1)
    time.sleep(SETTLE)
    assert (queue_depth(c, q1), queue_depth(c, q2), queue_depth(c, observer)) == (0, 0, 1)
    (_, props, _), = get_all(ch, observer, 1)
    assert _deaths(props) == [(q2, "expired", 1), (q1, "expired", 1)]


def test_a_maxlen_cycle_is_cut_too(chan, res):
    """Dropped from the head of a full queue (reason maxlen) into an exchange that routes back
    to it: not delivered back, so the queue holds only the newer message."""
    c, ch = chan
    dlx = _exchange(ch, res, "ml-dlx")
    q = _queue(ch, res, "ml-q", **{"x-max-length": 1, "x-dead-letter-exchange": dlx})
    observer = _queue(ch, res, "ml-obs")
    ch.queue_bind(q, dlx)
    ch.queue_bind(observer, dlx)
    ch.basic_publish("", q, b"first")
    ch.basic_publish("", q, b"second")
    wait_depth(c, observer, 1)
    time.sleep(0.3)
    assert queue_depth(c, q) == 1
    (_, _, body), = get_all(ch, q, 1)
    assert body == b"second"
    (_, props, body), = get_all(ch, observer, 1)
    assert body == b"first" and _deaths(props) == [(q, "maxlen", 1)]


def test_a_rejection_lets_a_dead_letter_back_into_its_queue(chan, res):
    """A rejected message goes back to a queue it died in (the client drove it), every time."""
    c, ch = chan
    dlx = _exchange(ch, res, "rej-dlx")
    q = _queue(ch, res, "rej-q", **{"x-dead-letter-exchange": dlx})
    ch.queue_bind(q, dlx)
    ch.basic_publish("", q, b"m")
    for n in (1, 2, 3):
        (m, _, _), = get_all(ch, q, 1, no_ack=False)
        ch.basic_reject(m.delivery_tag, requeue=False)
        wait_depth(c, q, 1)
    (_, props, _), = get_all(ch, q, 1)
    assert _deaths(props) == [(q, "rejected", 3)]


def test_a_rejection_on_the_way_back_breaks_the_cycle(chan, res):
    """Rejected from w into t, expired from t back into w: w's own entry is a rejection, so w
    gets it back. The next expiry from t is a cycle for t (t expired, then w rejected, newest
    first: t's entry comes before the rejection), so t does not get it again."""
    c, ch = chan
    to_t = _exchange(ch, res, "brk-to-t")
    to_w = _exchange(ch, res, "brk-to-w")
    w = _queue(ch, res, "brk-w", **{"x-dead-letter-exchange": to_t})
    t = _queue(ch, res, "brk-t", **{"x-message-ttl": TTL, "x-dead-letter-exchange": to_w})
    ch.queue_bind(t, to_t)
    ch.queue_bind(w, to_w)
    ch.basic_publish("", w, b"m")
    (m, _, _), = get_all(ch, w, 1, no_ack=False)
    ch.basic_reject(m.delivery_tag, requeue=False)
    wait_depth(c, w, 1)
    (m, props, _), = get_all(ch, w, 1, no_ack=False)
    assert _deaths(props) == [(t, "expired", 1), (w, "rejected", 1)]
    # Rejected again: into t, expires, back to w (w's newest entry is a rejection again).
    ch.basic_reject(m.delivery_tag, requeue=False)
    wait_depth(c, w, 1)
    (_, props, _), = get_all(ch, w, 1)
    assert _deaths(props) == [(t, "expired", 2), (w, "rejected", 2)]


def test_the_whole_key_set_is_matched_at_every_hop(chan, res):
    """The issue's second reproduction: direct exchange, key "", CC [rk1], BCC [rk2]; rk1 binds
    a topic exchange that binds a queue with rk2. RabbitMQ delivers (every hop sees every key),
    with the BCC header removed and the CC header kept."""
    c, ch = chan
    x1 = _exchange(ch, res, "hop-x1", "direct")
    x2 = _exchange(ch, res, "hop-x2", "topic")
    q = _queue(ch, res, "hop-q")
    ch.exchange_bind(x2, x1, "rk1")
    ch.queue_bind(q, x2, "rk2")
    ch.basic_publish(x1, "", b"m", pika.BasicProperties(headers={"CC": ["rk1"], "BCC": ["rk2"]}))
    (_, props, body), = get_all(ch, q, 1)
    assert body == b"m"
    assert props.headers == {"CC": ["rk1"]}


def test_keys_reach_through_two_hops_each_queue_once(chan, res):
    """direct --CC a--> fanout --> topic: the topic exchange matches the routing key and every
    CC/BCC key; a queue two keys reach gets one copy."""
    c, ch = chan
    d = _exchange(ch, res, "two-hop-d", "direct")
    f = _exchange(ch, res, "two-hop-f", "fanout")
    t = _exchange(ch, res, "two-hop-t", "topic")
    qa = _queue(ch, res, "two-hop-qa")
    qb = _queue(ch, res, "two-hop-qb")
    qnone = _queue(ch, res, "two-hop-qnone")
    ch.exchange_bind(f, d, "a")
    ch.exchange_bind(t, f, "")
    ch.queue_bind(qa, t, "k.*")
    ch.queue_bind(qb, t, "b.#")
    ch.queue_bind(qnone, t, "zzz")
    ch.basic_publish(d, "k.1", b"m", pika.BasicProperties(headers={"CC": ["a", "k.2"], "BCC": ["b.x"]}))
    ch.basic_publish(d, "k.1", b"unrouted", pika.BasicProperties(headers={"BCC": ["b.x"]}))
    time.sleep(0.3)
    assert (queue_depth(c, qa), queue_depth(c, qb), queue_depth(c, qnone)) == (1, 1, 0)
    for q in (qa, qb):
        (_, props, body), = get_all(ch, q, 1)
        assert body == b"m" and props.headers == {"CC": ["a", "k.2"]}


def test_an_alternate_exchange_is_taken_at_the_hop_that_matched_nothing(chan, res):
    """y1 (AE ae1) binds y2 (AE ae2) with k, and y2 binds nothing: a message with key k ends in
    ae2's queue (y2 matched nothing), one with another key in ae1's."""
    c, ch = chan
    ae1 = _exchange(ch, res, "ae-1")
    ae2 = _exchange(ch, res, "ae-2")
    y1 = _exchange(ch, res, "ae-y1", "direct", **{"alternate-exchange": ae1})
    y2 = _exchange(ch, res, "ae-y2", "direct", **{"alternate-exchange": ae2})
    q1 = _queue(ch, res, "ae-q1")
    q2 = _queue(ch, res, "ae-q2")
    ch.exchange_bind(y2, y1, "k")
    ch.queue_bind(q1, ae1)
    ch.queue_bind(q2, ae2)
    ch.basic_publish(y1, "k", b"inner")
    ch.basic_publish(y1, "zz", b"outer")
    (_, _, b1), = get_all(ch, q1, 1)
    (_, _, b2), = get_all(ch, q2, 1)
    assert (b1, b2) == (b"outer", b"inner")
    time.sleep(0.2)
    assert (queue_depth(c, q1), queue_depth(c, q2)) == (0, 0)


def test_dead_lettering_keeps_the_cc_keys(chan, res):
    """Rejected with CC [c] and no x-dead-letter-routing-key: routed again with the key and the
    CC keys, the CC header kept, x-death's routing-keys listing both. With a dead-letter routing
    key, that key alone is used and the CC header removed."""
    c, ch = chan
    px = _exchange(ch, res, "dlcc-px", "direct")
    dx = _exchange(ch, res, "dlcc-dx", "direct")
    s = _queue(ch, res, "dlcc-s", **{"x-dead-letter-exchange": dx})
    s2 = _queue(ch, res, "dlcc-s2", **{"x-dead-letter-exchange": dx, "x-dead-letter-routing-key": "z"})
    qa, qc, qz = (_queue(ch, res, f"dlcc-q{k}") for k in "acz")
    ch.queue_bind(s, px, "a")
    ch.queue_bind(s2, px, "a2")
    for q, k in ((qa, "a"), (qc, "c"), (qz, "z")):
        ch.queue_bind(q, dx, k)
    ch.basic_publish(px, "a", b"one", pika.BasicProperties(headers={"CC": ["c"]}))
    ch.basic_publish(px, "a2", b"two", pika.BasicProperties(headers={"CC": ["c"]}))
    for q in (s, s2):
        (m, _, _), = get_all(ch, q, 1, no_ack=False)
        ch.basic_reject(m.delivery_tag, requeue=False)
    for q in (qa, qc):
        (_, props, body), = get_all(ch, q, 1)
        assert body == b"one"
        assert props.headers["CC"] == ["c"]
        (death,) = props.headers["x-death"]
        assert (death["queue"], death["reason"], death["routing-keys"]) == (s, "rejected", ["a", "c"])
    (_, props, body), = get_all(ch, qz, 1)
    assert body == b"two" and "CC" not in props.headers
    assert props.headers["x-death"][0]["routing-keys"] == ["a2", "c"]
    time.sleep(0.2)
    assert [queue_depth(c, q) for q in (qa, qc, qz)] == [0, 0, 0]


@pytest.mark.skipif(not os.environ.get("WARREN_BIN"),
                    reason="the reference RabbitMQ has no delayed-message plugin: Warren only")
def test_a_cycle_through_a_delayed_exchange_is_cut_when_it_comes_due(chan, res):
    """Warren applies the rule to a dead letter held by a delayed exchange's store when it comes
    due (RabbitMQ's plugin routes it without the check and would loop, slowly, for ever)."""
    c, ch = chan
    dx = res.exchange("dly-dx")
    ch.exchange_declare(dx, "x-delayed-message", arguments={"x-delayed-type": "fanout"})
    q = _queue(ch, res, "dly-q", **{"x-message-ttl": TTL, "x-dead-letter-exchange": dx})
    observer = _queue(ch, res, "dly-obs")
    ch.queue_bind(q, dx)
    ch.queue_bind(observer, dx)
    ch.basic_publish("", q, b"m", pika.BasicProperties(headers={"x-delay": 100}))
    wait_depth(c, observer, 1)
    time.sleep(SETTLE)
    assert (queue_depth(c, q), queue_depth(c, observer)) == (0, 1)
    (_, props, _), = get_all(ch, observer, 1)
    assert _deaths(props) == [(q, "expired", 1)]
