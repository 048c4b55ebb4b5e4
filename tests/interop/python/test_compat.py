"""Smaller RabbitMQ 3.10 behaviours applications rely on: CR/LF in names, the empty queue name
and routing key shortcut of queue.bind, direct reply-to after a cancel, uncommitted acks at close.
Written against RabbitMQ 3.10 (5673) first, then run against Warren."""

from __future__ import annotations

import pika
import pytest

import rawamqp
from helpers import channel_closed, connect, get_all, safe_close, uname, wait_until


# --- CR and LF in names (rabbit_channel:strip_cr_lf) ---

def _raw_declare(url: str, name: str, passive: bool = False) -> dict:
    """queue.declare over raw frames: pika waits for a declare-ok naming what it asked for."""
    with rawamqp.RawConnection.from_url(url) as c:
        c.handshake()
        c.open_channel(1)
        c.send(rawamqp.queue_declare(1, name, passive=passive))
        return c.expect(rawamqp.QUEUE_DECLARE_OK).args


def test_cr_lf_stripped_from_queue_names(amqp_url, conn, res):
    name = res.queue("crlf")
    ch = conn.channel()
    assert _raw_declare(amqp_url, name[:8] + "\r\n" + name[8:] + "\n")["queue"] == name
    assert _raw_declare(amqp_url, "\r" + name, passive=True)["queue"] == name
    assert ch.queue_declare(name, passive=True).method.queue == name
    ch.basic_publish("", name, b"m")
    wait_until(lambda: ch.queue_declare(name, passive=True).method.message_count == 1)
    assert ch.queue_delete(name + "\r\n").method.message_count == 1
    with channel_closed(404, f"NOT_FOUND - no queue '{name}' in vhost '/'"):
        ch.queue_declare(name, passive=True)


def test_cr_lf_stripped_from_exchange_names_and_bindings(conn, res):
    x, qn = res.exchange("crlf"), res.queue("crlf")
    ch = conn.channel()
    ch.exchange_declare(x + "\n", "direct")
    ch.exchange_declare(x, "direct", passive=True)
    ch.queue_declare(qn)
    ch.queue_bind("\n" + qn, x + "\r\n", routing_key="k")
    ch.basic_publish(x, "k", b"via-binding")
    assert [b for _m, _p, b in get_all(ch, qn, 1)] == [b"via-binding"]
    # Bindings between exchanges strip both names too.
    x2 = res.exchange("crlf-src")
    ch.exchange_declare(x2, "fanout")
    ch.exchange_bind(x + "\n", "\r" + x2)
    ch.basic_publish(x2, "k", b"e2e")
    assert [b for _m, _p, b in get_all(ch, qn, 1)] == [b"e2e"]
    ch.exchange_unbind(x, x2 + "\n")
    ch.queue_unbind(qn + "\n", "\r" + x, routing_key="k")
    ch.basic_publish(x, "k", b"unbound")
    ch.basic_publish(x2, "k", b"unbound")
    assert ch.queue_declare(qn, passive=True).method.message_count == 0
    ch.exchange_delete(x2 + "\r\n")
    ch.exchange_delete("\n" + x)
    with channel_closed(404, f"NOT_FOUND - no exchange '{x}' in vhost '/'"):
        ch.exchange_declare(x, "direct", passive=True)


def test_cr_lf_kept_where_rabbitmq_keeps_them(conn, res):
    # basic.consume, basic.get and routing keys take names as given: no stripping.
    name = res.queue("crlf")
    ch = conn.channel()
    ch.queue_declare(name)
    ch.basic_publish("", name + "\n", b"lost")
    assert ch.queue_declare(name, passive=True).method.message_count == 0
    with channel_closed(404, f"NOT_FOUND - no queue '{name}\n' in vhost '/'"):
        ch.basic_get(name + "\n")
    ch = conn.channel()
    with channel_closed(404, f"NOT_FOUND - no queue '{name}\r' in vhost '/'"):
        ch.basic_consume(name + "\r", lambda *a: None)


# --- queue.bind / queue.unbind with an empty queue name and an empty routing key ---

def test_bind_shortcut_uses_last_queue_name_as_key(conn, res):
    name = res.queue("shortcut")
    ch = conn.channel()
    ch.queue_declare(name)
    ch.queue_bind("", "amq.direct", routing_key="")
    ch.basic_publish("amq.direct", name, b"by-name")
    ch.basic_publish("amq.direct", "", b"by-empty-key")
    assert [b for _m, _p, b in get_all(ch, name, 1)] == [b"by-name"]
    assert ch.queue_declare(name, passive=True).method.message_count == 0
    # An explicit key with the empty queue name keeps that key.
    ch.queue_bind("", "amq.direct", routing_key="other")
    ch.basic_publish("amq.direct", "other", b"other")
    assert [b for _m, _p, b in get_all(ch, name, 1)] == [b"other"]
    # unbind takes the same shortcut.
    ch.queue_unbind("", "amq.direct", routing_key="")
    ch.basic_publish("amq.direct", name, b"gone")
    ch.basic_publish("amq.direct", "other", b"still")
    assert [b for _m, _p, b in get_all(ch, name, 1)] == [b"still"]


def test_bind_shortcut_without_a_declared_queue_is_404(conn):
    ch = conn.channel()
    with channel_closed(404, "NOT_FOUND - no previously declared queue"):
        ch.queue_bind("", "amq.direct", routing_key="")


# --- direct reply-to ---

def _rpc(amqp_url, requester, server_queue: str, body: bytes) -> None:
    """One request through direct reply-to; the server side answers on its own connection."""
    requester.basic_publish("", server_queue, body,
                            pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    srv = connect(amqp_url)
    try:
        sch = srv.channel()
        m, p, b = get_all(sch, server_queue, 1)[0]
        sch.basic_publish("", p.reply_to, b"re:" + b)
    finally:
        safe_close(srv)


def test_direct_reply_to_consume_again_after_cancel(amqp_url, conn, res):
    server_q = res.queue("rpc")
    ch = conn.channel()
    ch.queue_declare(server_q)
    replies = []
    tag = ch.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, b: replies.append(b),
                           auto_ack=True)
    ch.basic_cancel(tag)
    ch.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, b: replies.append(b),
                     auto_ack=True)
    _rpc(amqp_url, ch, server_q, b"ping")
    wait_until(lambda: replies, conn=conn, what="reply after re-consume")
    assert replies == [b"re:ping"]


def test_direct_reply_to_encoded_name_declares_while_requester_is_there(amqp_url, conn, res):
    server_q = res.queue("rpc")
    ch = conn.channel()
    ch.queue_declare(server_q)
    ch.basic_consume("amq.rabbitmq.reply-to", lambda *a: None, auto_ack=True)
    ch.basic_publish("", server_q, b"req", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    srv = connect(amqp_url)
    try:
        sch = srv.channel()
        _m, p, _b = get_all(sch, server_q, 1)[0]
        reply_to = p.reply_to
        assert reply_to.startswith("amq.rabbitmq.reply-to.")
        for passive in (True, False):
            ok = sch.queue_declare(reply_to, passive=passive).method
            assert (ok.queue, ok.message_count, ok.consumer_count) == (reply_to, 0, 1)
        # Once the requester's channel is gone, the name is unknown.
        ch.close()
        with channel_closed(404, f"NOT_FOUND - no queue '{reply_to}' in vhost '/'"):
            sch.queue_declare(reply_to, passive=True)
        sch = srv.channel()
        bogus = "amq.rabbitmq.reply-to." + uname("nobody")
        with channel_closed(404, f"NOT_FOUND - no queue '{bogus}' in vhost '/'"):
            sch.queue_declare(bogus, passive=True)
    finally:
        safe_close(srv)


# --- transactions: uncommitted acks are discarded when the channel or connection closes ---

@pytest.mark.parametrize("close", ["channel", "connection"])
def test_close_in_tx_requeues_uncommitted_acks(amqp_url, res, close):
    name = res.queue("tx")
    c = connect(amqp_url)
    try:
        ch = c.channel()
        ch.queue_declare(name)
        for i in range(3):
            ch.basic_publish("", name, f"m{i}".encode())
        wait_until(lambda: ch.queue_declare(name, passive=True).method.message_count == 3)
        ch.tx_select()
        got = get_all(ch, name, 3, no_ack=False)
        ch.basic_ack(got[0][0].delivery_tag)
        ch.basic_nack(got[1][0].delivery_tag, requeue=False)
        ch.basic_reject(got[2][0].delivery_tag, requeue=True)
        if close == "channel":
            ch.close()
        else:
            c.close()
    finally:
        safe_close(c)
    c = connect(amqp_url)
    try:
        ch = c.channel()
        back = get_all(ch, name, 3)
        assert sorted(b for _m, _p, b in back) == [b"m0", b"m1", b"m2"]
        assert all(m.redelivered for m, _p, _b in back)
        assert ch.queue_declare(name, passive=True).method.message_count == 0
    finally:
        safe_close(c)


def test_committed_acks_stay_acked_at_close(amqp_url, res):
    name = res.queue("tx")
    c = connect(amqp_url)
    try:
        ch = c.channel()
        ch.queue_declare(name)
        for i in range(2):
            ch.basic_publish("", name, f"m{i}".encode())
        wait_until(lambda: ch.queue_declare(name, passive=True).method.message_count == 2)
        ch.tx_select()
        got = get_all(ch, name, 2, no_ack=False)
        ch.basic_ack(got[0][0].delivery_tag)
        ch.tx_commit()
        ch.basic_ack(got[1][0].delivery_tag)
        ch.close()
    finally:
        safe_close(c)
    c = connect(amqp_url)
    try:
        ch = c.channel()
        assert [b for _m, _p, b in get_all(ch, name, 1)] == [b"m1"]
    finally:
        safe_close(c)


# --- CC and BCC headers: sender-selected distribution ---

def _depths(ch, queues):
    return [ch.queue_declare(q, passive=True).method.message_count for q in queues]


def _cc_setup(ch, res, kind: str, keys: list[str]):
    x = res.exchange("cc")
    ch.exchange_declare(x, kind)
    qs = [res.queue("cc") for _ in keys]
    for q, k in zip(qs, keys):
        ch.queue_declare(q)
        ch.queue_bind(q, x, routing_key=k)
    return x, qs


def test_cc_and_bcc_route_on_a_direct_exchange(conn, res):
    ch = conn.channel()
    ch.confirm_delivery()
    x, qs = _cc_setup(ch, res, "direct", ["main", "c1", "c2", "b1", "none"])
    headers = {"CC": ["c1", "c2", "c1", "main"], "BCC": ["b1"], "other": "kept"}
    ch.basic_publish(x, "main", b"m", pika.BasicProperties(headers=headers))
    assert _depths(ch, qs) == [1, 1, 1, 1, 0], "each queue once"
    for q in qs[:4]:
        m, p, b = get_all(ch, q, 1)[0]
        assert (m.routing_key, b) == ("main", b"m")
        assert p.headers == {"CC": ["c1", "c2", "c1", "main"], "other": "kept"}, "BCC removed"
    # BCC alone leaves an empty headers table behind, as in RabbitMQ.
    ch.basic_publish(x, "main", b"bcc", pika.BasicProperties(headers={"BCC": ["b1"]}))
    assert _depths(ch, qs) == [1, 0, 0, 1, 0]
    assert get_all(ch, qs[3], 1)[0][1].headers == {}


def test_cc_on_topic_and_exchange_to_exchange_routes(conn, res):
    ch = conn.channel()
    ch.confirm_delivery()
    topic, qs = _cc_setup(ch, res, "topic", ["a.*", "b.#"])
    src = res.exchange("cc-src")
    ch.exchange_declare(src, "direct")
    ch.exchange_bind(topic, src, routing_key="b.x")
    ch.exchange_bind(topic, src, routing_key="a.y")
    ch.basic_publish(topic, "nothing", b"t", pika.BasicProperties(headers={"CC": ["a.1", "b.2.3"]}))
    assert _depths(ch, qs) == [1, 1]
    ch.queue_purge(qs[0])
    ch.queue_purge(qs[1])
    ch.basic_publish(src, "nothing", b"e2e",
                     pika.BasicProperties(headers={"BCC": ["b.x", "a.y", "b.x"]}))
    assert _depths(ch, qs) == [1, 1]


def test_cc_entries_that_are_not_strings_and_other_header_names_are_ignored(conn, res):
    ch = conn.channel()
    ch.confirm_delivery()
    x, qs = _cc_setup(ch, res, "direct", ["main", "c1", "lower"])
    ch.basic_publish(x, "main", b"m",
                     pika.BasicProperties(headers={"CC": [5, b"c1", "", "c1"], "cc": ["lower"]}))
    assert _depths(ch, qs) == [1, 1, 0]


@pytest.mark.parametrize("header,value,kind", [("CC", "c1", "longstr"), ("BCC", 5, "signedint"),
                                               ("CC", {"a": 1}, "table")])
def test_cc_that_is_not_an_array_is_refused(conn, res, header, value, kind):
    ch = conn.channel()
    x, qs = _cc_setup(ch, res, "direct", ["main"])
    with channel_closed(406, "PRECONDITION_FAILED - invalid message: "
                             f'{{unacceptable_type_in_header,"{header}",{kind}}}'):
        ch.basic_publish(x, "main", b"m", pika.BasicProperties(headers={header: value}))
        ch.queue_declare(qs[0], passive=True)
    ch = conn.channel()
    assert _depths(ch, qs) == [0]


@pytest.mark.parametrize("dl_key", [None, "dead"])
def test_dead_lettering_keeps_cc_unless_given_a_new_routing_key(conn, res, dl_key):
    ch = conn.channel()
    ch.confirm_delivery()
    dlx, (q_k, q_c, q_dead) = _cc_setup(ch, res, "direct", ["k", "c", "dead"])
    pub = res.exchange("cc-pub")
    ch.exchange_declare(pub, "direct")
    src = res.queue("cc-src")
    args = {"x-dead-letter-exchange": dlx}
    if dl_key:
        args["x-dead-letter-routing-key"] = dl_key
    ch.queue_declare(src, arguments=args)
    ch.queue_bind(src, pub, routing_key="k")
    ch.basic_publish(pub, "k", b"m", pika.BasicProperties(headers={"CC": ["c"]}))
    m, _p, _b = get_all(ch, src, 1, no_ack=False)[0]
    ch.basic_reject(m.delivery_tag, requeue=False)
    if dl_key:
        wait_until(lambda: _depths(ch, [q_dead])[0] == 1)
        assert _depths(ch, [q_k, q_c]) == [0, 0]
        _m, p, _b = get_all(ch, q_dead, 1)[0]
        assert "CC" not in p.headers
    else:
        wait_until(lambda: _depths(ch, [q_k, q_c]) == [1, 1])
        assert _depths(ch, [q_dead]) == [0]
        _m, p, _b = get_all(ch, q_c, 1)[0]
        assert p.headers["CC"] == ["c"]
    death = p.headers["x-death"][0]
    assert (death["reason"], death["routing-keys"]) == ("rejected", ["k", "c"])
