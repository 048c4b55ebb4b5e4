"""Channel lifecycle and channel.flow."""

from __future__ import annotations

import struct

import pika.exceptions

import rawamqp as raw
from helpers import (assert_broker_alive, assert_connection_usable, connection_closed,
                     host_port, uname)


def test_open_and_close_channel(conn):
    ch = conn.channel()
    assert ch.is_open
    ch.close()
    assert ch.is_closed
    assert conn.is_open
    assert_connection_usable(conn)


def test_reopen_same_channel_number_after_close(conn):
    ch = conn.channel(channel_number=7)
    assert ch.channel_number == 7
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.close()
    ch2 = conn.channel(channel_number=7)
    assert ch2.channel_number == 7 and ch2.is_open
    # the queue belongs to the connection, not the channel
    assert ch2.queue_declare(q, passive=True).method.queue == q
    ch2.queue_delete(q)
    ch2.close()


def test_reopen_after_soft_error(conn):
    ch = conn.channel(channel_number=3)
    try:
        ch.queue_declare(uname("missing"), passive=True)
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 404
    ch2 = conn.channel(channel_number=3)
    assert ch2.is_open
    ch2.queue_declare("", exclusive=True)
    ch2.close()


def test_channel_flow_active_true(ch):
    assert ch.flow(True) is True
    assert ch.is_open


def test_channel_flow_active_false_is_not_implemented(amqp_url, conn):
    # RabbitMQ 3.10 refuses channel.flow{active=false} with a connection error:
    # 540 "NOT_IMPLEMENTED - active=false".
    ch = conn.channel()
    with connection_closed(540, "NOT_IMPLEMENTED - active=false"):
        ch.flow(False)
    assert conn.is_closed
    assert_broker_alive(amqp_url)


def test_channel_close_raw_and_reopen(amqp_url):
    with raw.RawConnection(*host_port(amqp_url)) as c:
        c.handshake()
        c.open_channel(1)
        c.send(raw.method_frame(1, raw.CHANNEL_CLOSE,
                                struct.pack(">H", 200) + raw.shortstr("bye") + struct.pack(">HH", 0, 0)))
        f = c.expect(raw.CHANNEL_CLOSE_OK)
        assert f.channel == 1
        c.open_channel(1)
        c.send(raw.queue_declare(1, "", exclusive=True))
        ok = c.expect(raw.QUEUE_DECLARE_OK)
        assert ok.args["queue"].startswith("amq.gen-")
        c.send(raw.connection_close())
        c.expect(raw.CONNECTION_CLOSE_OK)


def test_method_on_closed_channel_is_channel_error(amqp_url):
    with raw.RawConnection(*host_port(amqp_url)) as c:
        c.handshake()
        c.open_channel(1)
        c.send(raw.method_frame(1, raw.CHANNEL_CLOSE,
                                struct.pack(">H", 200) + raw.shortstr("bye") + struct.pack(">HH", 0, 0)))
        c.expect(raw.CHANNEL_CLOSE_OK)
        c.send(raw.queue_declare(1, "", exclusive=True))
        f = c.expect_connection_close()
        assert f.args["reply_code"] == 504
        assert f.args["reply_text"] == "CHANNEL_ERROR - expected 'channel.open'"
        assert (f.args["class_id"], f.args["method_id"]) == raw.QUEUE_DECLARE
        assert c.wait_closed()
    assert_broker_alive(amqp_url)


def test_frames_after_server_channel_close_are_discarded(amqp_url):
    # After the server sends channel.close, it ignores everything on that channel until close-ok.
    with raw.RawConnection(*host_port(amqp_url)) as c:
        c.handshake()
        c.open_channel(1)
        missing = uname("missing")
        c.send(raw.queue_declare(1, missing, passive=True))
        f = c.expect(raw.CHANNEL_CLOSE)
        assert f.args["reply_code"] == 404
        assert f.args["reply_text"] == f"NOT_FOUND - no queue '{missing}' in vhost '/'"
        assert (f.args["class_id"], f.args["method_id"]) == raw.QUEUE_DECLARE
        # these must be dropped silently, not answered and not treated as errors
        c.send(raw.queue_declare(1, "", exclusive=True))
        c.send(raw.basic_publish(1, "", "x"))
        c.send(raw.header_frame(1, 3))
        c.send(raw.body_frame(1, b"abc"))
        c.send(raw.channel_close_ok(1))
        c.open_channel(1)
        c.send(raw.queue_declare(1, "", exclusive=True))
        ok = c.expect(raw.QUEUE_DECLARE_OK)
        assert ok.args["queue"].startswith("amq.gen-")
        c.send(raw.connection_close())
        c.expect(raw.CONNECTION_CLOSE_OK)
