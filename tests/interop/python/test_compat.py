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
