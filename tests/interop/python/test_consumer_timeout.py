"""Consumer (delivery acknowledgement) timeout, RabbitMQ 4.3's `notify_consumer` behaviour: a
manual-ack delivery unacked past its consumer's timeout cancels that consumer (basic.cancel) and
requeues all its unacked deliveries; a client without `consumer_cancel_notify` gets its channel
closed with 406, as RabbitMQ 3.10 does for everyone. Sources: the consume argument, the queue
argument / policy (the lower of the two), the broker's `consumer_timeout`. Lease extension
through `amq.warren.lease` is Warren's own (docs/consumer-timeout.md).

RabbitMQ 3.10 has only the global 30-minute timeout, so the timing tests need WARREN_BIN. Timeouts
are short (800-1000 ms) and the broker checks at least once a second: waits are bounded at a few
seconds and assert no tight timing."""

from __future__ import annotations

import os
import time

import pika
import pika.exceptions
import pytest

from conftest import WarrenProcess
from helpers import channel_closed, connect, pump, safe_close, settle, uname, wait_until
from test_access import Api, q as quote

BIN = os.environ.get("WARREN_BIN")
warren_only = pytest.mark.skipif(not BIN, reason="RabbitMQ 3.10 has only the global 30-minute consumer timeout: Warren only (WARREN_BIN)")

# A timeout fires within its value plus one check period (1 s); this bounds it generously.
EXPIRY_WAIT = 6.0
TIMEOUT_TEXT = ("PRECONDITION_FAILED - delivery acknowledgement on channel {ch} timed out. Timeout value used: "
                "{ms} ms. This timeout value can be configured, see consumers doc guide to learn more")


class Watch:
    """A manual-ack consumer on its own channel: what it received and whether it was cancelled."""

    def __init__(self, conn, queue: str, arguments=None, prefetch: int = 0):
        self.conn = conn
        self.ch = conn.channel()
        if prefetch:
            self.ch.basic_qos(prefetch_count=prefetch)
        self.deliveries: list = []
        self.cancelled: list = []
        self.ch.add_on_cancel_callback(lambda frame: self.cancelled.append(frame.method.consumer_tag))
        self.tag = self.ch.basic_consume(queue, lambda ch, m, p, b: self.deliveries.append((m, b)),
                                         auto_ack=False, arguments=arguments)

    def wait_deliveries(self, n: int) -> None:
        pump(self.conn, lambda: len(self.deliveries) >= n, what=f"{n} deliveries")

    def wait_cancel(self, timeout: float = EXPIRY_WAIT) -> None:
        pump(self.conn, lambda: self.cancelled, timeout=timeout, what="basic.cancel from the broker")
        assert self.cancelled == [self.tag]


def declare(ch, res, arguments=None, prefix: str = "ct") -> str:
    name = res.queue(prefix)
    ch.queue_declare(name, arguments=arguments)
    return name


def publish(ch, queue: str, *bodies: bytes) -> None:
    for b in bodies:
        ch.basic_publish("", queue, b)


def get_redelivered(ch, queue: str):
    """The next message of `queue` by basic.get (bounded poll), asserting it is a redelivery."""
    def got():
        m, _, b = ch.basic_get(queue, auto_ack=False)
        return (m, b) if m else None
    m, b = wait_until(got, timeout=EXPIRY_WAIT, what=f"a requeued message in {queue}")
    assert m.redelivered, "a requeued delivery must be flagged redelivered"
    return m, b


def depth(ch, queue: str):
    r = ch.queue_declare(queue, passive=True).method
    return r.message_count, r.consumer_count


@pytest.fixture
def api(mgmt_url):
    return Api(mgmt_url)


@pytest.fixture
def policies(api):
    names = []

    def put(name, pattern, definition):
        st, body = api.call("PUT", f"/api/policies/%2F/{quote(name)}",
                            {"pattern": pattern, "definition": definition, "apply-to": "queues"})
        assert st in (201, 204), body
        names.append(name)
    yield put
    for n in names:
        api.call("DELETE", f"/api/policies/%2F/{quote(n)}")


@warren_only
def test_consumer_argument_cancels_requeues_and_channel_stays_usable(conn, res, api):
    ch = conn.channel()
    qn = declare(ch, res)
    publish(ch, qn, b"a", b"b")
    w = Watch(conn, qn, arguments={"x-consumer-timeout": 1000})
    w.wait_deliveries(2)
    st, consumers = api.call("GET", "/api/consumers/%2F")
    mine = [c for c in consumers if c["consumer_tag"] == w.tag]
    assert st == 200 and mine[0]["arguments"] == {"x-consumer-timeout": 1000}
    cancelled_with_both_back_and_late_settles_ignored(ch, w, qn)


def cancelled_with_both_back_and_late_settles_ignored(ch, w: Watch, qn: str) -> None:
    """`w` held "a" and "b" of `qn` past its timeout: it is cancelled, the channel stays open,
    both went back flagged redelivered, and late settles of the taken-back tags are ignored
    (RabbitMQ 4.3), not a 406 (shared with test_consumer_timeout_machine.py)."""
    w.wait_cancel()
    assert w.ch.is_open and w.tag not in w.ch.consumer_tags
    assert depth(ch, qn) == (2, 0)
    m, body = get_redelivered(w.ch, qn)
    assert body == b"a" and m.delivery_tag == 3
    w.ch.basic_ack(1)
    w.ch.basic_nack(2, requeue=True)
    w.ch.basic_ack(3)
    assert depth(w.ch, qn) == (1, 0), "the channel stays open and the late settles changed nothing"
    # A tag that was never delivered is still an error.
    with channel_closed(406, "PRECONDITION_FAILED - unknown delivery tag 99"):
        w.ch.basic_ack(99)
        w.ch.queue_declare(qn, passive=True)


@warren_only
def test_queue_argument_and_redelivery_to_another_consumer(conn, res):
    ch = conn.channel()
    qn = declare(ch, res, arguments={"x-consumer-timeout": 1000})
    publish(ch, qn, b"m")
    w = Watch(conn, qn)
    w.wait_deliveries(1)
    w.wait_cancel()
    other = Watch(conn, qn)
    other.wait_deliveries(1)
    m, body = other.deliveries[0]
    assert (body, m.redelivered) == (b"m", True)
    other.ch.basic_ack(m.delivery_tag)
    assert depth(other.ch, qn) == (0, 1)


@warren_only
def test_policy_sets_it_and_shows_in_the_queue(conn, res, policies, api):
    ch = conn.channel()
    qn = declare(ch, res)
    policies(qn, f"^{qn}$", {"consumer-timeout": 1000})
    st, info = api.call("GET", f"/api/queues/%2F/{quote(qn)}")
    assert st == 200 and info["effective_policy_definition"] == {"consumer-timeout": 1000}
    publish(ch, qn, b"m")
    w = Watch(conn, qn)
    w.wait_deliveries(1)
    w.wait_cancel()
    get_redelivered(ch, qn)


@warren_only
def test_the_lower_of_queue_argument_and_policy_applies(conn, res, policies):
    ch = conn.channel()
    qn = declare(ch, res, arguments={"x-consumer-timeout": 600_000})
    policies(qn, f"^{qn}$", {"consumer-timeout": 800})
    publish(ch, qn, b"m")
    w = Watch(conn, qn)
    w.wait_deliveries(1)
    w.wait_cancel()


@warren_only
def test_consumer_argument_wins_over_the_queue(conn, res):
    ch = conn.channel()
    qn = declare(ch, res, arguments={"x-consumer-timeout": 800})
    publish(ch, qn, b"1", b"2")
    patient = Watch(conn, qn, arguments={"x-consumer-timeout": 600_000}, prefetch=1)
    quick = Watch(conn, qn, prefetch=1)
    patient.wait_deliveries(1)
    quick.wait_deliveries(1)
    quick.wait_cancel()
    settle(conn, 0.5)
    assert patient.cancelled == [] and patient.ch.is_open
    # The one the quick consumer held is redelivered to the patient one once it acks.
    patient.ch.basic_ack(patient.deliveries[0][0].delivery_tag)
    patient.wait_deliveries(2)
    assert patient.deliveries[1][0].redelivered


@warren_only
def test_global_config_applies_when_lower_levels_are_zero():
    """`consumer_timeout` in the config file; an x-consumer-timeout of 0 means "not set"."""
    w = WarrenProcess(BIN, config="consumer_timeout = 1000\n")
    w.start()
    c = None
    try:
        c = connect(w.url)
        ch = c.channel()
        qn = uname("ct-global")
        ch.queue_declare(qn, arguments={"x-consumer-timeout": 0})
        publish(ch, qn, b"m")
        watch = Watch(c, qn, arguments={"x-consumer-timeout": 0})
        watch.wait_deliveries(1)
        watch.wait_cancel()
        get_redelivered(ch, qn)
    finally:
        safe_close(c)
        w.stop()


def without_cancel_notify_the_channel_is_closed(url: str, declare_q) -> None:
    # pika announces consumer_cancel_notify unless told otherwise.
    caps = {"publisher_confirms": True, "basic.nack": True, "exchange_exchange_bindings": True,
            "connection.blocked": True, "authentication_failure_close": True}
    c = connect(url, client_properties={"capabilities": caps})
    try:
        ch = c.channel()
        qn = declare_q(ch, None)
        publish(ch, qn, b"m")
        w = Watch(c, qn, arguments={"x-consumer-timeout": 800})
        closed = []
        w.ch._impl.add_on_close_callback(lambda _ch, reason: closed.append(reason))
        w.wait_deliveries(1)
        pump(c, lambda: closed, timeout=EXPIRY_WAIT, what="channel.close from the broker")
        assert isinstance(closed[0], pika.exceptions.ChannelClosedByBroker)
        assert (closed[0].reply_code, closed[0].reply_text) == \
            (406, TIMEOUT_TEXT.format(ch=w.ch.channel_number, ms=800))
        assert w.cancelled == []
        get_redelivered(ch, qn)
    finally:
        safe_close(c)


@warren_only
def test_client_without_cancel_notify_gets_the_channel_closed(amqp_url, res):
    without_cancel_notify_the_channel_is_closed(
        amqp_url, lambda ch, args: declare(ch, res, arguments=args))


@warren_only
def test_unacked_basic_get_is_requeued(conn, res):
    ch = conn.channel()
    qn = declare(ch, res, arguments={"x-consumer-timeout": 800})
    publish(ch, qn, b"g")
    m, _, _ = ch.basic_get(qn, auto_ack=False)
    assert m is not None and not m.redelivered
    m2, body = get_redelivered(ch, qn)
    assert body == b"g"
    ch.basic_ack(m.delivery_tag)  # late: ignored
    ch.basic_ack(m2.delivery_tag)
    assert depth(ch, qn) == (0, 0)


def lease_keeps_a_slow_consumer(conn, declare_q) -> None:
    """A consumer that extends its delivery's lease keeps it past twice its timeout, while one
    that does not is cancelled. `declare_q(ch, arguments)` declares a queue and names it (shared
    with test_consumer_timeout_machine.py)."""
    ch = conn.channel()
    slow_q = declare_q(ch, {"x-consumer-timeout": 1000})
    idle_q = declare_q(ch, {"x-consumer-timeout": 1000})
    publish(ch, slow_q, b"s")
    publish(ch, idle_q, b"i")
    slow, idle = Watch(conn, slow_q), Watch(conn, idle_q)
    slow.wait_deliveries(1)
    idle.wait_deliveries(1)
    tag = slow.deliveries[0][0].delivery_tag
    start = time.monotonic()
    # Past twice the timeout, and until the idle one is cancelled (bounded).
    while time.monotonic() - start < EXPIRY_WAIT and (time.monotonic() - start < 2.5 or not idle.cancelled):
        # On the delivery's own channel; the default extension is the timeout from now.
        slow.ch.basic_publish("amq.warren.lease", str(tag), b"")
        settle(conn, 0.2)
    assert idle.cancelled == [idle.tag], "the consumer that did not extend is cancelled"
    assert slow.cancelled == [] and slow.ch.is_open
    slow.ch.basic_ack(tag)
    assert depth(slow.ch, slow_q) == (0, 1)


@warren_only
def test_lease_extension_keeps_a_slow_consumer(conn, res):
    lease_keeps_a_slow_consumer(conn, lambda ch, args: declare(ch, res, arguments=args))


def lease_by_body_for_every_delivery(conn, declare_q) -> None:
    ch = conn.channel()
    qn = declare_q(ch, None)
    publish(ch, qn, b"1", b"2")
    w = Watch(conn, qn, arguments={"x-consumer-timeout": 800})
    w.wait_deliveries(2)
    # Routing key "*" (or empty): every unacked delivery on the channel; body: ms from now.
    w.ch.basic_publish("amq.warren.lease", "*", b"3000")
    w.ch.basic_publish("amq.warren.lease", "12345", b"")  # unknown tag: ignored
    w.ch.basic_publish("amq.warren.lease", "not-a-tag", b"")  # malformed: ignored
    settle(conn, 1.8)
    assert w.cancelled == [], "extended past its 800 ms timeout"
    w.wait_cancel(timeout=EXPIRY_WAIT)
    assert depth(ch, qn) == (2, 0)


@warren_only
def test_lease_extension_by_body_for_every_delivery(conn, res):
    lease_by_body_for_every_delivery(conn, lambda ch, args: declare(ch, res, arguments=args))


@warren_only
def test_lease_exchange_is_not_an_exchange(conn, api):
    st, xs = api.call("GET", "/api/exchanges/%2F")
    assert st == 200 and "amq.warren.lease" not in [x["name"] for x in xs]
    ch = conn.channel()
    with channel_closed(403, "ACCESS_REFUSED - exchange name 'amq.warren.lease' contains reserved prefix 'amq.*'"):
        ch.exchange_declare("amq.warren.lease", "direct")


@warren_only
def test_invalid_values_are_refused(conn, api):
    ch = conn.channel()
    name = uname("ct-bad")
    with channel_closed(406, f"PRECONDITION_FAILED - invalid arg 'x-consumer-timeout' for queue '{name}' in vhost '/': \"expected integer, got longstr\""):
        ch.queue_declare(name, arguments={"x-consumer-timeout": "1s"})
    ch = conn.channel()
    with channel_closed(406, f"PRECONDITION_FAILED - invalid arg 'x-consumer-timeout' for queue '{name}' in vhost '/': {{value_negative,-1}}"):
        ch.queue_declare(name, arguments={"x-consumer-timeout": -1})
    ch = conn.channel()
    qn = ch.queue_declare("", exclusive=True).method.queue
    with channel_closed(406, "PRECONDITION_FAILED - invalid arg 'x-consumer-timeout' for consumer 'c1': {value_negative,-5}"):
        ch.basic_consume(qn, lambda *a: None, consumer_tag="c1", arguments={"x-consumer-timeout": -5})
    for bad, shown in ((-1, "-1"), ("soon", '<<"soon">>')):
        st, body = api.call("PUT", "/api/policies/%2F/ct-bad", {"pattern": "^nothing$", "definition": {"consumer-timeout": bad}})
        assert (st, body["reason"]) == (400, f"Validation failed\n\n{shown} is not a valid consumer timeout\n")


def test_classic_and_quorum_queues_take_the_argument(ch, res):
    """RabbitMQ 3.10 ignores the argument; Warren acts on it. Both accept it on either type."""
    for kind in ("classic", "quorum"):
        name = res.queue(f"ct-{kind}")
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": kind, "x-consumer-timeout": 60_000})
        assert ch.queue_declare(name, passive=True).method.consumer_count == 0
