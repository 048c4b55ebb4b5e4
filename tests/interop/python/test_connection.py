"""Connection-level behaviour: handshake, auth, vhosts, tuning, close."""

from __future__ import annotations

import os
import re

import pika
import pika.exceptions
import pytest

import rawamqp as raw
from conftest import WarrenProcess
from helpers import (assert_broker_alive, assert_connection_usable, connect, host_port,
                     safe_close, url_with)

REQUIRED_CAPABILITIES = [
    "publisher_confirms",
    "exchange_exchange_bindings",
    "basic.nack",
    "consumer_cancel_notify",
    "connection.blocked",
    "authentication_failure_close",
    "per_consumer_qos",
    "direct_reply_to",
]

LOGIN_REFUSED_PLAIN = ("ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
                       "For details see the broker logfile.")


def test_open_and_close_with_plain_credentials(amqp_url):
    c = connect(amqp_url)
    assert c.is_open
    ch = c.channel()
    assert ch.is_open
    c.close()
    assert c.is_closed
    assert ch.is_closed


def test_wrong_password_is_refused(amqp_url):
    with pytest.raises((pika.exceptions.ProbableAuthenticationError,
                        pika.exceptions.AuthenticationError)) as ei:
        connect(url_with(amqp_url, password="definitely-wrong"))
    # pika wraps the broker's connection.close (authentication_failure_close capability).
    assert "(403)" in str(ei.value.args[0])
    assert "ACCESS_REFUSED" in str(ei.value.args[0])
    assert_broker_alive(amqp_url)


def test_unknown_user_is_refused(amqp_url):
    with pytest.raises((pika.exceptions.ProbableAuthenticationError,
                        pika.exceptions.AuthenticationError)) as ei:
        connect(url_with(amqp_url, user="no-such-user-interop", password="x"))
    assert "(403)" in str(ei.value.args[0])


def test_wrong_password_close_text_raw(amqp_url):
    # The client announces authentication_failure_close, so RabbitMQ sends connection.close.
    with raw.RawConnection(*host_port(amqp_url)) as c:
        c.start()
        c.send(raw.start_ok_plain("guest", "wrong"))
        f = c.expect_connection_close()
        assert f.args["reply_code"] == 403
        assert f.args["reply_text"] == LOGIN_REFUSED_PLAIN
        assert (f.args["class_id"], f.args["method_id"]) == (0, 0)
        assert c.wait_closed()


def test_unknown_vhost_is_refused(amqp_url):
    with pytest.raises((pika.exceptions.ProbableAccessDeniedError,
                        pika.exceptions.ConnectionClosedByBroker)) as ei:
        connect(url_with(amqp_url, vhost="no-such-vhost-interop"))
    assert "(530)" in str(ei.value) or getattr(ei.value, "reply_code", None) == 530
    assert "NOT_ALLOWED - vhost no-such-vhost-interop not found" in str(ei.value)
    assert_broker_alive(amqp_url)


def test_unknown_vhost_close_raw(amqp_url):
    with raw.RawConnection(*host_port(amqp_url)) as c:
        c.start()
        c.send(raw.start_ok_plain())
        t = c.expect(raw.CONNECTION_TUNE)
        c.send(raw.tune_ok(t.args["channel_max"], t.args["frame_max"], 0))
        c.send(raw.connection_open("no-such-vhost-interop"))
        f = c.expect_connection_close()
        # RabbitMQ: 530, "NOT_ALLOWED - vhost <name> not found", class/method = connection.open
        assert f.args["reply_code"] == 530
        assert f.args["reply_text"] == "NOT_ALLOWED - vhost no-such-vhost-interop not found"
        assert (f.args["class_id"], f.args["method_id"]) == raw.CONNECTION_OPEN
        assert c.wait_closed()


def test_server_properties_raw(amqp_url):
    with raw.RawConnection(*host_port(amqp_url)) as c:
        start = c.start()
        assert (start.args["version_major"], start.args["version_minor"]) == (0, 9)
        props = start.args["server_properties"]
        assert isinstance(props.get("product"), str) and props["product"]
        assert isinstance(props.get("version"), str) and props["version"]
        caps = props["capabilities"]
        for cap in REQUIRED_CAPABILITIES:
            assert caps.get(cap) is True, f"capability {cap} missing or not true: {caps}"
        assert {"PLAIN", "AMQPLAIN"} <= set(start.args["mechanisms"].split())
        assert "en_US" in start.args["locales"].split()


def test_server_properties_via_pika(conn):
    props = conn._impl.server_properties
    caps = props["capabilities"]
    for cap in REQUIRED_CAPABILITIES:
        assert caps.get(cap) is True, cap
    assert conn.publisher_confirms_supported
    assert conn.basic_nack_supported
    assert conn.consumer_cancel_notify_supported
    assert conn.exchange_exchange_bindings_supported


def test_server_product_and_version_via_pika(conn):
    props = conn._impl.server_properties
    # RabbitMQ announces its own; Warren its own unless configured (see the next test).
    expected = "Warren" if os.environ.get("WARREN_BIN") else "RabbitMQ"
    assert props["product"] == expected
    # A plain x.y.z: clients and applications parse it to gate features.
    assert re.fullmatch(r"\d+\.\d+\.\d+", props["version"]), props["version"]


def test_configured_product_and_version_via_pika():
    """`[server_properties]` makes Warren announce what applications that check for RabbitMQ
    expect; there is no such setting in RabbitMQ."""
    binary = os.environ.get("WARREN_BIN")
    if not binary:
        pytest.skip("a Warren setting: needs WARREN_BIN")
    w = WarrenProcess(binary, config='[server_properties]\nproduct = "RabbitMQ"\n'
                                     'version = "3.10.8"\n')
    w.start()
    try:
        c = connect(w.url)
        try:
            props = c._impl.server_properties
            assert (props["product"], props["version"]) == ("RabbitMQ", "3.10.8")
            assert props["capabilities"]["publisher_confirms"] is True
        finally:
            safe_close(c)
    finally:
        w.stop()


def test_tune_defaults_raw(amqp_url):
    # RabbitMQ 3.10 defaults: channel_max 2047, frame_max 131072, heartbeat 60.
    with raw.RawConnection(*host_port(amqp_url)) as c:
        c.start()
        c.send(raw.start_ok_plain())
        t = c.expect(raw.CONNECTION_TUNE)
        assert t.args == {"channel_max": 2047, "frame_max": 131072, "heartbeat": 60}
        c.send(raw.tune_ok(2047, 131072, 0))
        c.send(raw.connection_open())
        c.expect(raw.CONNECTION_OPEN_OK)
        c.send(raw.connection_close())
        c.expect(raw.CONNECTION_CLOSE_OK)


@pytest.mark.parametrize("asked,expected", [(None, 60), (0, 0), (30, 30), (120, 120)])
def test_heartbeat_negotiation(amqp_url, asked, expected):
    # pika: None takes the server's proposal (60); an explicit value (0 = off) wins.
    c = connect(amqp_url) if asked is None else connect(amqp_url, heartbeat=asked)
    try:
        assert c._impl.params.heartbeat == expected
        assert_connection_usable(c)
    finally:
        c.close()


def test_channel_max_and_frame_max_negotiation(amqp_url):
    c = connect(amqp_url, channel_max=10, frame_max=8192)
    try:
        assert c._impl.params.channel_max == 10
        assert c._impl.params.frame_max == 8192
        ch = c.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        body = bytes(range(256)) * 200  # 51200 bytes: many 8 KiB body frames
        ch.basic_publish("", q, body)
        m = None
        for _ in range(500):
            m, _p, b = ch.basic_get(q, auto_ack=True)
            if m:
                break
            c.sleep(0.01)
        assert m is not None and b == body
    finally:
        c.close()


def test_default_negotiation_with_pika(conn):
    assert conn._impl.params.channel_max == 2047
    assert conn._impl.params.frame_max == 131072


def test_client_initiated_close_raw(amqp_url):
    with raw.RawConnection(*host_port(amqp_url)) as c:
        c.handshake()
        c.open_channel(1)
        c.send(raw.connection_close(200, "client bye"))
        f = c.expect(raw.CONNECTION_CLOSE_OK)
        assert f.channel == 0
        # RabbitMQ does not close the socket after close-ok: it waits (30 s) for the client to.


def test_client_close_with_open_channels(amqp_url):
    c = connect(amqp_url)
    chans = [c.channel() for _ in range(5)]
    c.close()
    assert c.is_closed
    assert all(x.is_closed for x in chans)
    assert_broker_alive(amqp_url)


def test_many_channels_on_one_connection(conn):
    chans = [conn.channel() for _ in range(200)]
    numbers = {c.channel_number for c in chans}
    assert len(numbers) == 200
    q = chans[0].queue_declare("", exclusive=True).method.queue
    for i, c in enumerate(chans):
        c.basic_publish("", q, str(i).encode())
    ok = chans[-1].queue_declare(q, passive=True)
    # publishes on different channels are not ordered with respect to each other, but all arrive
    for _ in range(500):
        if ok.method.message_count == 200:
            break
        conn.sleep(0.01)
        ok = chans[-1].queue_declare(q, passive=True)
    assert ok.method.message_count == 200
    for c in chans[1:]:
        c.close()
    chans[0].queue_delete(q)
    assert_connection_usable(conn)


def test_many_connections(amqp_url):
    conns = []
    try:
        for _ in range(20):
            conns.append(connect(amqp_url))
        for c in conns:
            assert c.channel().is_open
    finally:
        for c in conns:
            safe_close(c)


def test_explicit_plain_credentials(amqp_url):
    # pika only speaks PLAIN/EXTERNAL; AMQPLAIN is covered in test_raw_frames.py.
    creds = pika.PlainCredentials("guest", "guest")
    p = pika.URLParameters(amqp_url)
    p.credentials = creds
    c = pika.BlockingConnection(p)
    assert c.is_open
    c.close()


def test_fresh_broker_fixture_works(fresh_broker):
    assert_broker_alive(fresh_broker)
