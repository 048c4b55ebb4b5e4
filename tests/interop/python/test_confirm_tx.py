"""Publisher confirms (confirm.select) and transactions (tx.*)."""

from __future__ import annotations

import struct

import pika
import pika.exceptions
import pytest

import rawamqp as raw
from helpers import (Collector, assert_connection_usable, channel_closed, get_all, host_port, pump,
                     settle, uname, wait_depth)


class ConfirmChannel:
    """A channel in confirm mode that records acks/nacks/returns in arrival order."""

    def __init__(self, conn):
        self.conn = conn
        self.ch = conn.channel()
        self.events: list[tuple] = []  # ("ack"|"nack", tag, multiple) or ("return", reply_code, text, body)
        self.ch.add_on_return_callback(
            lambda _c, m, p, b: self.events.append(("return", m.reply_code, m.reply_text, b)))
        selected = []
        self.ch._impl.confirm_delivery(ack_nack_callback=self._on_confirm, callback=selected.append)
        pump(conn, lambda: selected, what="confirm.select-ok")
        self.published = 0

    def _on_confirm(self, frame) -> None:
        m = frame.method
        kind = "ack" if isinstance(m, pika.spec.Basic.Ack) else "nack"
        self.events.append((kind, m.delivery_tag, m.multiple))

    def publish(self, exchange, key, body=b"x", mandatory=False, properties=None) -> int:
        self.ch.basic_publish(exchange, key, body, properties, mandatory=mandatory)
        self.published += 1
        return self.published

    def confirms(self) -> list[tuple]:
        return [e for e in self.events if e[0] in ("ack", "nack")]

    def outcome(self) -> dict[int, str]:
        """Expand multiple-acks into a per-tag result."""
        out: dict[int, str] = {}
        for kind, tag, multiple in self.confirms():
            tags = range(1, tag + 1) if multiple else [tag]
            for t in tags:
                if t not in out:
                    out[t] = kind
        return out

    def wait_all(self, timeout=10.0) -> dict[int, str]:
        pump(self.conn, lambda: len(self.outcome()) >= self.published, timeout=timeout,
             what=f"confirms for {self.published} publishes")
        return self.outcome()


# ---------------------------------------------------------------- confirms


def test_confirm_select_and_acks(conn):
    cc = ConfirmChannel(conn)
    q = cc.ch.queue_declare("", exclusive=True).method.queue
    for i in range(200):
        cc.publish("", q, str(i).encode())
    outcome = cc.wait_all()
    assert outcome == {t: "ack" for t in range(1, 201)}
    tags = [tag for _, tag, _ in cc.confirms()]
    assert tags == sorted(tags) and len(set(tags)) == len(tags)  # strictly increasing
    wait_depth(conn, q, 200)


def test_confirm_select_twice_is_fine(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"x")  # blocking confirm: returns once acked


def test_unroutable_publish_is_still_acked(conn, res):
    cc = ConfirmChannel(conn)
    x = res.exchange()
    cc.ch.exchange_declare(x, "fanout")
    cc.publish(x, "", b"no-bindings")
    cc.publish("amq.direct", uname("nowhere"), b"no-route")
    assert cc.wait_all() == {1: "ack", 2: "ack"}
    assert not [e for e in cc.events if e[0] == "return"]
    cc.ch.exchange_delete(x)


def test_reject_publish_overflow_is_nacked(conn, res):
    # RabbitMQ 3.10: x-overflow=reject-publish on a full queue -> basic.nack for that publish.
    cc = ConfirmChannel(conn)
    q = res.queue("overflow")
    cc.ch.queue_declare(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    cc.publish("", q, b"first")
    cc.publish("", q, b"second")
    cc.publish("", q, b"third")
    assert cc.wait_all() == {1: "ack", 2: "nack", 3: "nack"}
    wait_depth(conn, q, 1)
    assert get_all(cc.ch, q, 1)[0][2] == b"first"
    cc.publish("", q, b"fourth")
    assert cc.wait_all()[4] == "ack"
    cc.ch.queue_delete(q)


def test_reject_publish_nack_with_blocking_api(conn, res):
    ch = conn.channel()
    ch.confirm_delivery()
    q = res.queue("overflow")
    ch.queue_declare(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.basic_publish("", q, b"first")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"second")
    assert ch.is_open
    ch.queue_delete(q)


def test_mandatory_unroutable_gets_return_and_ack(conn):
    cc = ConfirmChannel(conn)
    key = uname("nowhere")
    cc.publish("amq.direct", key, b"bounce", mandatory=True)
    assert cc.wait_all() == {1: "ack"}
    pump(conn, lambda: len(cc.events) >= 2)
    # (pika's blocking adapter dispatches returns late, so the wire order is checked raw below)
    assert sorted(cc.events, key=str) == sorted([("return", 312, "NO_ROUTE", b"bounce"), ("ack", 1, False)], key=str)


def test_mandatory_unroutable_return_precedes_ack_on_the_wire(amqp_url):
    with raw.RawConnection(*host_port(amqp_url)) as c:
        c.handshake()
        c.open_channel(1)
        c.send(raw.method_frame(1, (85, 10), raw.bits(False)))  # confirm.select
        c.expect((85, 11))
        key = uname("nowhere")
        c.send(raw.basic_publish(1, "amq.direct", key, mandatory=True)
               + raw.header_frame(1, 6) + raw.body_frame(1, b"bounce"))
        ret = c.expect((60, 50))  # basic.return
        r = raw.Reader(ret.payload[4:])
        assert (r.short(), r.shortstr(), r.shortstr(), r.shortstr()) == (312, "NO_ROUTE", "amq.direct", key)
        hdr = c.recv_frame()
        assert hdr.type == raw.FRAME_HEADER and hdr.channel == 1
        body = c.recv_frame()
        assert (body.type, body.payload) == (raw.FRAME_BODY, b"bounce")
        ack = c.expect((60, 80))  # basic.ack
        assert struct.unpack(">QB", ack.payload[4:]) == (1, 0)
        c.send(raw.connection_close())
        c.expect(raw.CONNECTION_CLOSE_OK)


def test_mandatory_unroutable_with_blocking_api(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError) as ei:
        ch.basic_publish("amq.direct", uname("nowhere"), b"bounce", mandatory=True)
    (returned,) = ei.value.messages
    assert returned.method.reply_code == 312 and returned.body == b"bounce"


def test_persistent_message_to_durable_queue_is_acked(conn, res):
    cc = ConfirmChannel(conn)
    q = res.queue("durable")
    cc.ch.queue_declare(q, durable=True)
    for _ in range(5):
        cc.publish("", q, b"persist", properties=pika.BasicProperties(delivery_mode=2))
    assert cc.wait_all() == {t: "ack" for t in range(1, 6)}
    cc.ch.queue_delete(q)


def test_confirm_publish_to_missing_exchange_closes_channel(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    missing = uname("missing")
    with channel_closed(404, f"NOT_FOUND - no exchange '{missing}' in vhost '/'"):
        ch.basic_publish(missing, "k", b"x")
    assert_connection_usable(conn)


# ---------------------------------------------------------------- transactions


def test_tx_commit_makes_publishes_visible(conn, res):
    q = res.queue()
    ch = conn.channel()
    ch.queue_declare(q)
    ch.tx_select()
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    settle(conn, 0.2)
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    ch.tx_commit()
    wait_depth(conn, q, 3)
    assert [b for _, _, b in get_all(conn.channel(), q, 3)] == [b"0", b"1", b"2"]
    ch.queue_delete(q)


def test_tx_rollback_discards_publishes(conn, res):
    q = res.queue()
    ch = conn.channel()
    ch.queue_declare(q)
    ch.tx_select()
    ch.basic_publish("", q, b"rolled-back")
    ch.tx_rollback()
    ch.tx_commit()  # still transactional; nothing pending
    settle(conn, 0.2)
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    ch.basic_publish("", q, b"committed")
    ch.tx_commit()
    (_, _, b), = get_all(conn.channel(), q, 1)
    assert b == b"committed"
    ch.queue_delete(q)


def test_tx_ack_applied_only_on_commit(conn, res):
    q = res.queue()
    setup = conn.channel()
    setup.queue_declare(q)
    setup.basic_publish("", q, b"a")
    setup.basic_publish("", q, b"b")
    wait_depth(conn, q, 2)

    ch = conn.channel()
    ch.tx_select()
    (ma, _, _), (mb, _, _) = get_all(ch, q, 2, no_ack=False)
    ch.basic_ack(ma.delivery_tag)
    ch.tx_rollback()  # the ack of "a" is discarded: "a" stays unacked
    ch.basic_ack(mb.delivery_tag)
    ch.tx_commit()  # "b" acked
    ch.close()  # "a" goes back to the queue
    wait_depth(conn, q, 1)
    (m, _, b), = get_all(setup, q, 1)
    assert b == b"a" and m.redelivered is True
    setup.queue_delete(q)


def test_tx_reject_applied_on_commit(conn, res):
    q = res.queue()
    ch = conn.channel()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"r")
    wait_depth(conn, q, 1)
    ch.tx_select()
    (m, _, _), = get_all(ch, q, 1, no_ack=False)
    ch.basic_reject(m.delivery_tag, requeue=True)
    settle(conn, 0.2)
    assert ch.queue_declare(q, passive=True).method.message_count == 0  # not yet
    ch.tx_commit()
    wait_depth(conn, q, 1)
    ch.queue_delete(q)


def test_tx_uncommitted_ack_keeps_the_consumers_prefetch_used(conn, res):
    # The queue counts a consumer's credit: an ack inside a transaction reaches the queue at
    # commit, so until then a consumer with prefetch 1 is still full, as in RabbitMQ.
    q = res.queue()
    ch = conn.channel()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"first")
    consumer = conn.channel()
    consumer.basic_qos(prefetch_count=1)
    consumer.tx_select()
    got = Collector()
    consumer.basic_consume(q, got)
    pump(conn, lambda: len(got) == 1)
    consumer.basic_ack(got.deliveries[0][0].delivery_tag)
    ch.basic_publish("", q, b"second")
    settle(conn, 0.5)
    assert got.bodies == [b"first"]
    consumer.tx_commit()
    pump(conn, lambda: len(got) == 2)
    assert got.bodies == [b"first", b"second"]
    ch.queue_delete(q)


def test_tx_select_twice_is_fine(conn):
    ch = conn.channel()
    ch.tx_select()
    ch.tx_select()
    ch.tx_commit()


@pytest.mark.parametrize("op", ["tx_commit", "tx_rollback"])
def test_tx_commit_or_rollback_without_select_is_406(conn, op):
    ch = conn.channel()
    with channel_closed(406, "PRECONDITION_FAILED - channel is not transactional"):
        getattr(ch, op)()
    assert_connection_usable(conn)


def test_confirm_select_on_tx_channel_is_406(conn):
    ch = conn.channel()
    ch.tx_select()
    with channel_closed(406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode"):
        ch.confirm_delivery()
    assert_connection_usable(conn)


def test_tx_select_on_confirm_channel_is_406(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    with channel_closed(406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode"):
        ch.tx_select()
    assert_connection_usable(conn)
