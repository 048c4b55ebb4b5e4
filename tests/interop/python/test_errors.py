"""Soft (channel) errors vs hard (connection) errors, and what survives each."""

from __future__ import annotations

import struct

import pika
import pika.exceptions
import pytest

import rawamqp as raw
from helpers import (Collector, assert_broker_alive, assert_connection_usable, channel_closed,
                     connect, connection_closed, get_all, host_port, pump, safe_close, uname,
                     wait_until)


def _exclusive_elsewhere(amqp_url, holder):
    q = uname("locked")
    holder.append(connect(amqp_url))
    holder[-1].channel().queue_declare(q, exclusive=True)
    return q


SOFT_ERRORS = {
    "403-amq-prefix": (403, "ACCESS_REFUSED - queue name 'amq.",
                       lambda ch, ctx: ch.queue_declare("amq." + uname("q"))),
    "403-default-exchange": (403, "ACCESS_REFUSED - operation not permitted on the default exchange",
                             lambda ch, ctx: ch.exchange_delete("")),
    "404-queue": (404, "NOT_FOUND - no queue '",
                  lambda ch, ctx: ch.queue_declare(uname("missing"), passive=True)),
    "404-exchange": (404, "NOT_FOUND - no exchange '",
                     lambda ch, ctx: ch.exchange_declare(uname("missing"), passive=True)),
    "405-locked": (405, "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '",
                   lambda ch, ctx: ch.queue_declare(_exclusive_elsewhere(ctx["url"], ctx["holder"]),
                                                    passive=True)),
    "406-inequivalent": (406, "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'amq.direct'",
                         lambda ch, ctx: ch.exchange_declare("amq.direct", "fanout", durable=True)),
    "406-unknown-tag": (406, "PRECONDITION_FAILED - unknown delivery tag 99",
                        lambda ch, ctx: (ch.basic_ack(99), ch.queue_declare("", exclusive=True))),
    "406-not-transactional": (406, "PRECONDITION_FAILED - channel is not transactional",
                              lambda ch, ctx: ch.tx_commit()),
}


@pytest.mark.parametrize("name", list(SOFT_ERRORS))
def test_soft_error_closes_only_the_channel(amqp_url, conn, name):
    code, prefix, op = SOFT_ERRORS[name]
    holder: list = []
    try:
        bystander = conn.channel()
        bq = bystander.queue_declare("", exclusive=True).method.queue
        ch = conn.channel()
        with channel_closed(code, prefix):
            op(ch, {"url": amqp_url, "holder": holder})
        assert ch.is_closed
        assert conn.is_open
        # other channels of the same connection are unaffected
        assert bystander.is_open
        bystander.basic_publish("", bq, b"bystander")
        assert get_all(bystander, bq, 1)[0][2] == b"bystander"
        # and new channels work
        assert_connection_usable(conn)
    finally:
        for h in holder:
            safe_close(h)


def test_soft_error_does_not_disturb_consumer_on_other_channel(conn):
    cons = conn.channel()
    q = cons.queue_declare("", exclusive=True).method.queue
    col = Collector()
    cons.basic_consume(q, col, auto_ack=True)
    bad = conn.channel()
    with channel_closed(404, "NOT_FOUND"):
        bad.queue_declare(uname("missing"), passive=True)
    conn.channel().basic_publish("", q, b"after-error")
    pump(conn, lambda: len(col) == 1)
    assert col.bodies == [b"after-error"]


def _assert_other_connections_unaffected(amqp_url, witness):
    assert witness.is_open
    assert_connection_usable(witness)
    assert_broker_alive(amqp_url)


def test_hard_error_503_command_invalid(amqp_url):
    witness = connect(amqp_url)
    c = connect(amqp_url)
    try:
        ch = c.channel()
        other_ch = c.channel()
        etype = uname("type")
        with connection_closed(503, f"COMMAND_INVALID - unknown exchange type '{etype}'"):
            ch.exchange_declare(uname("x"), etype)
        assert c.is_closed and other_ch.is_closed
        _assert_other_connections_unaffected(amqp_url, witness)
    finally:
        safe_close(c)
        safe_close(witness)


def test_hard_error_530_duplicate_consumer_tag_via_pika(amqp_url):
    witness = connect(amqp_url)
    c = connect(amqp_url)
    try:
        ch = c.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_consume(q, lambda *a: None, consumer_tag="twice")
        # pika refuses duplicate tags client-side, so send the second basic.consume by hand
        ch._impl._send_method(pika.spec.Basic.Consume(queue=q, consumer_tag="twice"))
        with connection_closed(530, "NOT_ALLOWED - attempt to reuse consumer tag 'twice'"):
            wait_until(lambda: False, timeout=10, conn=c, what="connection.close")
        assert c.is_closed
        _assert_other_connections_unaffected(amqp_url, witness)
    finally:
        safe_close(c)
        safe_close(witness)


def test_hard_error_540_prefetch_size(amqp_url):
    # RabbitMQ: basic.qos with prefetch_size != 0 -> 540 "NOT_IMPLEMENTED - prefetch_size!=0 (N)", hard error.
    witness = connect(amqp_url)
    c = connect(amqp_url)
    try:
        with connection_closed(540, "NOT_IMPLEMENTED - prefetch_size!=0 (1000)"):
            c.channel().basic_qos(prefetch_size=1000)
        _assert_other_connections_unaffected(amqp_url, witness)
    finally:
        safe_close(c)
        safe_close(witness)


def test_hard_error_540_recover_without_requeue(amqp_url):
    # RabbitMQ: basic.recover{requeue=false} -> 540 "NOT_IMPLEMENTED - requeue=false", hard error.
    c = connect(amqp_url)
    try:
        with connection_closed(540, "NOT_IMPLEMENTED - requeue=false"):
            c.channel().basic_recover(requeue=False)
        assert_broker_alive(amqp_url)
    finally:
        safe_close(c)


def test_hard_error_540_immediate_publish(amqp_url):
    # RabbitMQ: basic.publish with immediate=true -> 540 "NOT_IMPLEMENTED - immediate=true".
    with raw.RawConnection(*host_port(amqp_url)) as c:
        c.handshake()
        c.open_channel(1)
        c.send(raw.basic_publish(1, "amq.direct", "k", immediate=True) + raw.header_frame(1, 0))
        f = c.expect_connection_close()
        assert f.args["reply_code"] == 540
        assert f.args["reply_text"] == "NOT_IMPLEMENTED - immediate=true"
        assert (f.args["class_id"], f.args["method_id"]) == raw.BASIC_PUBLISH
        assert c.wait_closed()
    assert_broker_alive(amqp_url)


def test_hard_error_504_second_channel_open(amqp_url):
    with raw.RawConnection(*host_port(amqp_url)) as c:
        c.handshake()
        c.open_channel(1)
        c.send(raw.channel_open(1))
        f = c.expect_connection_close()
        assert f.args["reply_code"] == 504
        assert f.args["reply_text"] == "CHANNEL_ERROR - second 'channel.open' seen"
        assert (f.args["class_id"], f.args["method_id"]) == raw.CHANNEL_OPEN
        assert c.wait_closed()
    assert_broker_alive(amqp_url)


def test_hard_error_505_unexpected_frame(amqp_url):
    with raw.RawConnection(*host_port(amqp_url)) as c:
        c.handshake()
        c.open_channel(1)
        c.send(raw.body_frame(1, b"orphan body"))
        f = c.expect_connection_close()
        assert f.args["reply_code"] == 505
        assert f.args["reply_text"] == "UNEXPECTED_FRAME - expected method frame, got non method frame instead"
        assert c.wait_closed()
    assert_broker_alive(amqp_url)


def test_hard_error_530_channel_max_exceeded(amqp_url):
    # RabbitMQ counts open channels against channel_max (not channel numbers):
    # 530 "NOT_ALLOWED - number of channels opened (N) has reached the negotiated channel_max (N)".
    with raw.RawConnection(*host_port(amqp_url)) as c:
        c.handshake(channel_max=2)
        c.open_channel(1)
        c.open_channel(2)
        c.send(raw.channel_open(3))
        f = c.expect_connection_close()
        assert f.args["reply_code"] == 530
        assert f.args["reply_text"] == ("NOT_ALLOWED - number of channels opened (2) has reached "
                                        "the negotiated channel_max (2)")
        # Raised by RabbitMQ's reader with no method: class and method are 0.
        assert (f.args["class_id"], f.args["method_id"]) == (0, 0)
        assert c.wait_closed()
    assert_broker_alive(amqp_url)


def test_hard_error_closes_every_channel_and_drops_exclusive_queues(amqp_url, conn):
    c = connect(amqp_url)
    try:
        q = uname("excl")
        c.channel().queue_declare(q, exclusive=True)
        chans = [c.channel() for _ in range(3)]
        with connection_closed(540, "NOT_IMPLEMENTED"):
            chans[0].basic_recover(requeue=False)
        assert all(x.is_closed for x in chans)

        def gone():
            ch = conn.channel()
            try:
                ch.queue_declare(q, passive=True)
                ch.close()
                return False
            except pika.exceptions.ChannelClosedByBroker as e:
                return e.reply_code == 404
        wait_until(gone, what="exclusive queue removal after hard error")
    finally:
        safe_close(c)


def test_soft_error_close_carries_failing_method_ids(amqp_url):
    with raw.RawConnection(*host_port(amqp_url)) as c:
        c.handshake()
        c.open_channel(1)
        missing = uname("missing")
        c.send(raw.method_frame(1, (40, 10), struct.pack(">H", 0) + raw.shortstr(missing)
                                + raw.shortstr("direct") + raw.bits(True, False, False, False, False)
                                + raw.table({})))  # exchange.declare passive
        f = c.expect(raw.CHANNEL_CLOSE)
        assert f.channel == 1
        assert f.args["reply_code"] == 404
        assert f.args["reply_text"] == f"NOT_FOUND - no exchange '{missing}' in vhost '/'"
        assert (f.args["class_id"], f.args["method_id"]) == (40, 10)
        c.send(raw.channel_close_ok(1))
        c.open_channel(2)
        c.send(raw.connection_close())
        c.expect(raw.CONNECTION_CLOSE_OK)
