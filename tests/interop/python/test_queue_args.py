"""x-expires and x-single-active-consumer, as RabbitMQ 3.10 answers them."""

from __future__ import annotations

import time

import pika
import pytest

from helpers import channel_closed, connect, connection_closed, safe_close, uname, wait_until


def test_x_expires_deletes_an_unused_queue(conn, ch):
    q = uname("exp")
    ch.queue_declare(q, arguments={"x-expires": 300})
    ch.basic_publish("", q, b"m")  # messages do not keep it alive
    def gone():
        c = conn.channel()
        try:
            c.queue_declare(q, passive=True)
            c.close()
            return False
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code == 404
            return True
    # Passive declares reset the lease, so poll slower than the lease would allow... first wait.
    time.sleep(0.6)
    assert wait_until(gone, timeout=10, interval=0.5)


def test_x_expires_is_held_off_by_a_consumer(conn, ch):
    q = uname("exp")
    ch.queue_declare(q, arguments={"x-expires": 200})
    tag = ch.basic_consume(q, lambda *a: None, auto_ack=True)
    conn.sleep(0.6)
    ch.queue_declare(q, passive=True)  # still there
    ch.basic_cancel(tag)
    time.sleep(0.6)
    with channel_closed(404, "NOT_FOUND"):
        conn.channel().queue_declare(q, passive=True)
    ch = conn.channel()


@pytest.mark.parametrize("value,text", [(0, "{value_zero,0}"), (-5, "{value_negative,-5}")])
def test_x_expires_must_be_positive(ch, value, text):
    q = uname("exp")
    with channel_closed(406, f"PRECONDITION_FAILED - invalid arg 'x-expires' for queue '{q}' in vhost '/': {text}"):
        ch.queue_declare(q, arguments={"x-expires": value})


def test_single_active_consumer_delivers_to_one_then_fails_over(amqp_url, conn, ch):
    q = uname("sac")
    ch.queue_declare(q, arguments={"x-single-active-consumer": True})
    try:
        got: dict[str, list[bytes]] = {"a": [], "b": []}
        ca = conn.channel()
        cb = conn.channel()
        ta = ca.basic_consume(q, lambda c, m, p, body: got["a"].append(body), auto_ack=True)
        cb.basic_consume(q, lambda c, m, p, body: got["b"].append(body), auto_ack=True)
        for i in range(6):
            ch.basic_publish("", q, b"%d" % i)
        assert wait_until(lambda: (conn.process_data_events(0.05), len(got["a"]) == 6)[1], timeout=10)
        assert got["b"] == []
        ca.basic_cancel(ta)
        for i in range(6, 9):
            ch.basic_publish("", q, b"%d" % i)
        assert wait_until(lambda: (conn.process_data_events(0.05), len(got["b"]) == 3)[1], timeout=10)
        assert got["b"] == [b"6", b"7", b"8"]
    finally:
        conn.channel().queue_delete(q)


@pytest.mark.parametrize("arg,value,why", [
    ("x-max-priority", -1, "{value_negative,-1}"),
    ("x-max-priority", 256, "{max_value_exceeded,256}"),
    ("x-overflow", "bogus", "invalid_overflow"),
    ("x-overflow", 1, "{unacceptable_type,signedint}"),
    ("x-dead-letter-routing-key", 1, "{unacceptable_type,signedint}"),
    ("x-single-active-consumer", "yes", "{unacceptable_type,longstr}"),
    ("x-single-active-consumer", 1, "{unacceptable_type,signedint}"),
])
def test_invalid_argument_texts(ch, arg, value, why):
    # RabbitMQ 3.10: a channel error 406 naming the argument and its check's reason verbatim.
    q = uname("badarg")
    with channel_closed(406, "PRECONDITION_FAILED") as info:
        ch.queue_declare(q, exclusive=True, arguments={arg: value})
    assert info.exc.reply_text == f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{q}' in vhost '/': {why}"


def test_dead_letter_exchange_of_wrong_type(ch):
    # RabbitMQ 3.10 (rabbit_channel's own check): 406 "invalid type 'signedint' for arg ... in queue ...".
    q = uname("badarg")
    with channel_closed(406, "PRECONDITION_FAILED") as info:
        ch.queue_declare(q, exclusive=True, arguments={"x-dead-letter-exchange": 1})
    assert info.exc.reply_text == (f"PRECONDITION_FAILED - invalid type 'signedint' for arg "
                                   f"'x-dead-letter-exchange' in queue '{q}' in vhost '/'")


@pytest.mark.parametrize("qtype,arg,value,module", [
    (None, "x-max-in-memory-length", 1, "rabbit_classic_queue"),
    (None, "x-delivery-limit", -1, "rabbit_classic_queue"),  # refused before its value is checked
    (None, "x-max-age", "1D", "rabbit_classic_queue"),
    # (x-max-priority, which 3.10 refuses here, is taken as RabbitMQ 4.3's quorum queues take it:
    # test_quorum_on_machine.py's priority test.)
    ("quorum", "x-max-age", "1D", "rabbit_quorum_queue"),
    ("quorum", "x-queue-mode", "lazy", "rabbit_quorum_queue"),
    ("stream", "x-message-ttl", 1000, "rabbit_stream_queue"),
    ("stream", "x-max-length", 10, "rabbit_stream_queue"),
])
def test_argument_the_queue_type_does_not_take(ch, qtype, arg, value, module):
    # RabbitMQ 3.10: 406 "invalid arg 'K' for queue 'q' in vhost '/' of queue type <module>".
    q = uname("qt")
    args = {arg: value} if qtype is None else {"x-queue-type": qtype, arg: value}
    with channel_closed(406, "PRECONDITION_FAILED") as info:
        ch.queue_declare(q, durable=qtype is not None, exclusive=qtype is None, arguments=args)
    assert info.exc.reply_text == (f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{q}' "
                                   f"in vhost '/' of queue type {module}")


@pytest.mark.parametrize("args,arg,why", [
    ({"x-dead-letter-routing-key": "k"}, "x-dead-letter-routing-key", "routing_key_but_no_dlx_defined"),
    ({"x-queue-mode": "bogus"}, "x-queue-mode", "\"unsupported queue mode 'bogus'\""),
    ({"x-queue-mode": 1}, "x-queue-mode", "{unacceptable_type,signedint}"),
])
def test_declare_only_argument_checks(ch, args, arg, why):
    q = uname("badarg")
    with channel_closed(406, "PRECONDITION_FAILED") as info:
        ch.queue_declare(q, exclusive=True, arguments=args)
    assert info.exc.reply_text == f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{q}' in vhost '/': {why}"


@pytest.mark.parametrize("value,why", [("bogus", "invalid_dlx_strategy"), (5, "{unacceptable_type,signedint}")])
def test_invalid_dead_letter_strategy(ch, value, why):
    # RabbitMQ 3.10's quorum queues take at-most-once and at-least-once only.
    q = uname("badarg")
    with channel_closed(406, "PRECONDITION_FAILED") as info:
        ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum", "x-dead-letter-strategy": value})
    assert info.exc.reply_text == f"PRECONDITION_FAILED - invalid arg 'x-dead-letter-strategy' for queue '{q}' in vhost '/': {why}"


@pytest.mark.parametrize("value,why", [("min-masters", "invalid_queue_locator_arg"),
                                       ("bogus", "invalid_queue_locator_arg"),
                                       (5, "{unacceptable_type,signedint}")])
def test_invalid_quorum_leader_locator(ch, value, why):
    # RabbitMQ 3.10 takes client-local and balanced (and random and least-leaders, older names).
    q = uname("badarg")
    with channel_closed(406, "PRECONDITION_FAILED") as info:
        ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum", "x-queue-leader-locator": value})
    assert info.exc.reply_text == f"PRECONDITION_FAILED - invalid arg 'x-queue-leader-locator' for queue '{q}' in vhost '/': {why}"


@pytest.mark.parametrize("value", ["client-local", "balanced", "random", "least-leaders"])
def test_quorum_leader_locators_are_taken(ch, value):
    q = uname("loc")
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum", "x-queue-leader-locator": value})
    ch.queue_delete(q)


@pytest.mark.parametrize("qtype", ["quorum", "stream"])
def test_server_named_replicated_queue_is_refused(ch, qtype):
    module = {"quorum": "rabbit_quorum_queue", "stream": "rabbit_stream_queue"}[qtype]
    with channel_closed(406, "PRECONDITION_FAILED") as info:
        ch.queue_declare("", durable=True, arguments={"x-queue-type": qtype})
    assert info.exc.reply_text == f"PRECONDITION_FAILED - Cannot declare a server-named queue for type {module}"


@pytest.mark.parametrize("qtype", ["bogus", 1])
def test_server_named_queue_of_unknown_type_closes_the_connection(amqp_url, qtype):
    # RabbitMQ 3.10 crashes looking the type up for a server-named queue: a bare 541, connection closed
    # (a named queue gets the 406 "unsupported queue type" answer, see test_access.py).
    c = connect(amqp_url)
    try:
        with connection_closed(541, "INTERNAL_ERROR") as info:
            c.channel().queue_declare("", exclusive=True, arguments={"x-queue-type": qtype})
        assert info.exc.reply_text == "INTERNAL_ERROR"
    finally:
        safe_close(c)
