"""exchange.declare / delete / bind / unbind and routing through every exchange type."""

from __future__ import annotations

import pika
import pytest

from helpers import (assert_broker_alive, assert_connection_usable, channel_closed,
                     connection_closed, get_all, settle, uname)

LOCKED = ("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{q}' in vhost '/'. "
          "It could be originally declared on another connection or the exclusive property value "
          "does not match that of the original declaration.")
STANDARD = [("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
            ("amq.headers", "headers"), ("amq.match", "headers")]


def _bound_queue(ch, exchange, routing_key="", arguments=None):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, exchange, routing_key, arguments=arguments)
    return q


@pytest.mark.parametrize("etype", ["direct", "fanout", "topic", "headers"])
def test_declare_each_type(ch, res, etype):
    x = res.exchange(etype)
    ok = ch.exchange_declare(x, etype)
    assert isinstance(ok.method, pika.spec.Exchange.DeclareOk)
    # idempotent redeclare with identical attributes
    ch.exchange_declare(x, etype)
    ch.exchange_declare(x, passive=True)
    ch.exchange_delete(x)


def test_declare_durable_auto_delete_internal_with_arguments(ch, res):
    x1, x2, x3 = res.exchange("dur"), res.exchange("ad"), res.exchange("int")
    ch.exchange_declare(x1, "topic", durable=True, arguments={"alternate-exchange": "amq.fanout"})
    ch.exchange_declare(x2, "fanout", auto_delete=True)
    ch.exchange_declare(x3, "direct", internal=True)
    for x in (x1, x2, x3):
        ch.exchange_declare(x, passive=True)
    # redeclare with the same flags is fine
    ch.exchange_declare(x1, "topic", durable=True, arguments={"alternate-exchange": "amq.fanout"})
    ch.exchange_declare(x3, "direct", internal=True)
    for x in (x1, x2, x3):
        ch.exchange_delete(x)


def test_redeclare_with_different_arguments_is_accepted(ch, res):
    # RabbitMQ 3.10 compares no exchange argument on redeclare but alternate-exchange.
    x = res.exchange()
    ch.exchange_declare(x, "direct", arguments={"a": 1})
    ch.exchange_declare(x, "direct", arguments={"a": 2})
    ch.exchange_declare(x, "direct")
    ch.exchange_delete(x)


@pytest.mark.parametrize("first,second,received,current", [
    ({"alternate-exchange": "a"}, {"alternate-exchange": "b"}, "'b'", "'a'"),
    ({"alternate-exchange": "a"}, {}, "none", "the value 'a' of type 'longstr'"),
    ({}, {"alternate-exchange": "a"}, "the value 'a' of type 'longstr'", "none"),
    ({}, {"alternate-exchange": 1}, "the value '1' of type 'signedint'", "none"),
])
def test_redeclare_with_other_alternate_exchange_is_406(conn, res, first, second, received, current):
    x = res.exchange()
    ch = conn.channel()
    ch.exchange_declare(x, "direct", arguments=first)
    with channel_closed(406, f"PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange '{x}' "
                             f"in vhost '/': received {received} but current is {current}"):
        ch.exchange_declare(x, "direct", arguments=second)
    ch = conn.channel()
    # the same name as a longstr or a binary is the same value
    ch.exchange_declare(x, "direct", arguments={k: v.encode() for k, v in first.items()})
    ch.exchange_delete(x)


def test_passive_declare_existing_and_missing(conn, ch, res):
    x = res.exchange()
    ch.exchange_declare(x, "fanout")
    ch.exchange_declare(x, passive=True)
    # a passive declare does not care about type/flags
    ch.exchange_declare(x, "topic", durable=True, passive=True)
    missing = uname("missing")
    with channel_closed(404, f"NOT_FOUND - no exchange '{missing}' in vhost '/'"):
        ch.exchange_declare(missing, passive=True)
    assert_connection_usable(conn)
    conn.channel().exchange_delete(x)


@pytest.mark.parametrize("first,second,arg,received,current", [
    (dict(exchange_type="direct"), dict(exchange_type="fanout"), "type", "fanout", "direct"),
    (dict(exchange_type="direct"), dict(exchange_type="direct", durable=True), "durable", "true", "false"),
    (dict(exchange_type="direct", durable=True), dict(exchange_type="direct"), "durable", "false", "true"),
    (dict(exchange_type="direct"), dict(exchange_type="direct", auto_delete=True), "auto_delete", "true", "false"),
    (dict(exchange_type="direct"), dict(exchange_type="direct", internal=True), "internal", "true", "false"),
])
def test_redeclare_with_different_flags_is_406(conn, res, first, second, arg, received, current):
    x = res.exchange()
    ch = conn.channel()
    ch.exchange_declare(x, **first)
    with channel_closed(406, f"PRECONDITION_FAILED - inequivalent arg '{arg}' for exchange '{x}' "
                             f"in vhost '/': received '{received}' but current is '{current}'"):
        ch.exchange_declare(x, **second)
    assert_connection_usable(conn)
    conn.channel().exchange_delete(x)


def test_declare_unknown_type_is_connection_error(amqp_url, conn, res):
    # RabbitMQ: hard error 503 "COMMAND_INVALID - unknown exchange type '<t>'" (closes the connection).
    # (For a type that happens to be an existing Erlang atom, e.g. 'foo', it says "invalid exchange type".)
    x = res.exchange()
    etype = uname("type")
    ch = conn.channel()
    with connection_closed(503, f"COMMAND_INVALID - unknown exchange type '{etype}'"):
        ch.exchange_declare(x, etype)
    assert conn.is_closed
    assert_broker_alive(amqp_url)


def test_amq_prefix_is_reserved(conn):
    name = "amq.interop-" + uname("x")
    ch = conn.channel()
    with channel_closed(403, f"ACCESS_REFUSED - exchange name '{name}' contains reserved prefix 'amq.*'"):
        ch.exchange_declare(name, "direct")
    assert_connection_usable(conn)
    # passive declare of a missing amq.* name is a plain 404
    ch = conn.channel()
    with channel_closed(404, f"NOT_FOUND - no exchange '{name}' in vhost '/'"):
        ch.exchange_declare(name, passive=True)


@pytest.mark.parametrize("name,etype", STANDARD)
def test_standard_exchanges_exist(ch, name, etype):
    ch.exchange_declare(name, passive=True)
    # redeclaring a standard exchange with its real attributes is allowed
    ch.exchange_declare(name, etype, durable=True)


def test_redeclare_standard_exchange_with_other_flags_is_406(conn):
    ch = conn.channel()
    with channel_closed(406, "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'amq.direct' "
                             "in vhost '/': received 'false' but current is 'true'"):
        ch.exchange_declare("amq.direct", "direct")


def test_default_exchange_cannot_be_declared_or_deleted(conn):
    # RabbitMQ refuses every exchange.* operation on "" even passive declare:
    # 403 "ACCESS_REFUSED - operation not permitted on the default exchange".
    for op in (lambda c: c.exchange_declare("", passive=True),
               lambda c: c.exchange_declare("", "direct", durable=True),
               lambda c: c.exchange_delete(""),
               lambda c: c.queue_bind(c.queue_declare("", exclusive=True).method.queue, "", "k")):
        ch = conn.channel()
        with channel_closed(403, "ACCESS_REFUSED - operation not permitted on the default exchange"):
            op(ch)
    assert_connection_usable(conn)


def test_default_exchange_routes_by_queue_name(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"via-default")
    (m, _p, body), = get_all(ch, q, 1)
    assert body == b"via-default"
    assert m.exchange == "" and m.routing_key == q


def test_delete_exchange(conn, ch, res):
    x = res.exchange()
    ch.exchange_declare(x, "direct")
    ok = ch.exchange_delete(x)
    assert isinstance(ok.method, pika.spec.Exchange.DeleteOk)
    with channel_closed(404, f"NOT_FOUND - no exchange '{x}' in vhost '/'"):
        ch.exchange_declare(x, passive=True)


def test_delete_missing_exchange_is_ok(ch):
    # RabbitMQ 3.10: exchange.delete of a missing exchange replies delete-ok (no 404).
    ok = ch.exchange_delete(uname("missing"))
    assert isinstance(ok.method, pika.spec.Exchange.DeleteOk)


def test_delete_standard_exchange_is_refused(conn):
    ch = conn.channel()
    with channel_closed(403, "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed"):
        ch.exchange_delete("amq.direct")
    assert_connection_usable(conn)


def test_trace_exchange_is_predeclared_and_internal(conn):
    # RabbitMQ's firehose exchange exists in every vhost: topic, durable, internal.
    x = "amq.rabbitmq.trace"
    ch = conn.channel()
    ch.exchange_declare(x, passive=True)
    ch.exchange_declare(x, "topic", durable=True, internal=True)
    with channel_closed(406, f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{x}' in vhost '/': "
                             "received 'direct' but current is 'topic'"):
        ch.exchange_declare(x, "direct", durable=True, internal=True)
    ch = conn.channel()
    q = _bound_queue(ch, x, "#")
    ch.queue_unbind(q, x, "#")
    ch.basic_publish(x, "k", b"m")
    with channel_closed(403, f"ACCESS_REFUSED - cannot publish to internal exchange '{x}' in vhost '/'"):
        ch.queue_declare("", exclusive=True)  # round trip to see the close
    ch = conn.channel()
    with channel_closed(403, f"ACCESS_REFUSED - deletion of system exchange '{x}' in vhost '/' not allowed"):
        ch.exchange_delete(x)
    assert_connection_usable(conn)


def test_delete_if_unused(conn, res):
    ch = conn.channel()
    x = res.exchange()
    ch.exchange_declare(x, "direct")
    q = _bound_queue(ch, x, "k")
    with channel_closed(406, f"PRECONDITION_FAILED - exchange '{x}' in vhost '/' in use"):
        ch.exchange_delete(x, if_unused=True)
    ch = conn.channel()
    ch.exchange_declare(x, passive=True)  # still there
    ch.queue_unbind(q, x, "k")
    ch.exchange_delete(x, if_unused=True)
    with channel_closed(404, "NOT_FOUND"):
        ch.exchange_declare(x, passive=True)


def test_delete_if_unused_counts_only_source_bindings(ch, res):
    # RabbitMQ: an exchange that is only the *destination* of a binding is "unused".
    src, dst = res.exchange("src"), res.exchange("dst")
    ch.exchange_declare(src, "fanout")
    ch.exchange_declare(dst, "fanout")
    ch.exchange_bind(dst, src)
    ch.exchange_delete(dst, if_unused=True)
    ch.exchange_delete(src, if_unused=True)  # its only binding went away with dst


def test_auto_delete_exchange_goes_when_last_binding_removed(conn, res):
    ch = conn.channel()
    x = res.exchange("ad")
    ch.exchange_declare(x, "direct", auto_delete=True)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.exchange_declare(x, passive=True)  # never bound: still exists
    ch.queue_bind(q, x, "a")
    ch.queue_bind(q, x, "b")
    ch.queue_unbind(q, x, "a")
    ch.exchange_declare(x, passive=True)
    ch.queue_unbind(q, x, "b")
    with channel_closed(404, f"NOT_FOUND - no exchange '{x}' in vhost '/'"):
        ch.exchange_declare(x, passive=True)


def test_auto_delete_exchange_goes_when_bound_queue_deleted(conn, res):
    ch = conn.channel()
    x = res.exchange("ad")
    ch.exchange_declare(x, "fanout", auto_delete=True)
    q = _bound_queue(ch, x)
    ch.queue_delete(q)
    with channel_closed(404, "NOT_FOUND"):
        ch.exchange_declare(x, passive=True)


def test_direct_routing(ch, res):
    x = res.exchange()
    ch.exchange_declare(x, "direct")
    qa, qb = _bound_queue(ch, x, "a"), _bound_queue(ch, x, "b")
    ch.queue_bind(qb, x, "a")  # qb gets both keys
    for k in ("a", "b", "c"):
        ch.basic_publish(x, k, k.encode())
    assert [b for _, _, b in get_all(ch, qa, 1)] == [b"a"]
    assert sorted(b for _, _, b in get_all(ch, qb, 2)) == [b"a", b"b"]
    settle(ch.connection, 0.1)
    assert ch.basic_get(qa)[0] is None and ch.basic_get(qb)[0] is None
    ch.exchange_delete(x)


def test_fanout_routing_ignores_key(ch, res):
    x = res.exchange()
    ch.exchange_declare(x, "fanout")
    qs = [_bound_queue(ch, x, k) for k in ("", "whatever", "x.y")]
    ch.basic_publish(x, "some-key", b"fan")
    for q in qs:
        (m, _p, b), = get_all(ch, q, 1)
        assert b == b"fan" and m.routing_key == "some-key" and m.exchange == x
    ch.exchange_delete(x)


def test_direct_routing_with_many_bindings(ch, res):
    # Enough bindings that the broker routes by its per-key index, not by scanning.
    x = res.exchange()
    ch.exchange_declare(x, "direct")
    keys = [f"k{i}" for i in range(40)]
    qs = {k: _bound_queue(ch, x, k) for k in keys}
    shared = _bound_queue(ch, x, "k7")
    ch.queue_bind(shared, x, "k30")
    for k in keys + ["nobody"]:
        ch.basic_publish(x, k, k.encode())
    for k, q in qs.items():
        assert [b for _, _, b in get_all(ch, q, 1)] == [k.encode()]
    assert sorted(b for _, _, b in get_all(ch, shared, 2)) == [b"k30", b"k7"]
    # Unbinding shifts the remaining bindings: each key must still reach its own queue only.
    ch.queue_unbind(qs["k0"], x, "k0")
    ch.queue_unbind(shared, x, "k7")
    for k in keys:
        ch.basic_publish(x, k, b"again-" + k.encode())
    for k, q in qs.items():
        want = [] if k == "k0" else [b"again-" + k.encode()]
        assert [b for _, _, b in get_all(ch, q, len(want))] == want
    assert [b for _, _, b in get_all(ch, shared, 1)] == [b"again-k30"]
    settle(ch.connection, 0.1)
    for q in list(qs.values()) + [shared]:
        assert ch.basic_get(q)[0] is None
    ch.exchange_delete(x)


def test_wide_fanout_delivers_once_per_queue(ch, res):
    # Past the broker's linear de-duplication: every queue is also reachable a second way.
    fan, again = res.exchange("fan"), res.exchange("again")
    ch.exchange_declare(fan, "fanout")
    ch.exchange_declare(again, "fanout")
    qs = [_bound_queue(ch, fan) for _ in range(40)]
    for q in qs:
        ch.queue_bind(q, again)
    ch.exchange_bind(again, fan)
    ch.basic_publish(fan, "", b"wide")
    for q in qs:
        assert [b for _, _, b in get_all(ch, q, 1)] == [b"wide"]
    settle(ch.connection, 0.1)
    for q in qs:
        assert ch.basic_get(q)[0] is None
    ch.exchange_delete(fan)
    ch.exchange_delete(again)


def _topic_match(pattern: str, key: str) -> bool:
    """RabbitMQ's topic semantics, naively: '*' is one word, '#' zero or more; '' has no words."""
    def words(s):
        return s.split(".") if s else []

    def m(p, k):
        if not p:
            return not k
        if p[0] == "#":
            return any(m(p[1:], k[i:]) for i in range(len(k) + 1))
        return bool(k) and p[0] in ("*", k[0]) and m(p[1:], k[1:])
    return m(words(pattern), words(key))


def test_topic_routing_many_patterns(ch, res):
    x = res.exchange()
    ch.exchange_declare(x, "topic")
    patterns = ["#", "*", "", "a", "a.*", "a.#", "*.b", "#.b", "a.*.c", "a.#.c", "#.a.#", "*.*",
                "a..c", "a.*.*", "#.#", "b.#.b", "*.#", "x.y.z"] + [f"w{i}.#" for i in range(12)]
    qs = {p: _bound_queue(ch, x, p) for p in patterns}
    keys = ["", "a", "b", "a.b", "a.c", "a.b.c", "a..c", "a.b.b.c", "b.a", "b.x.b", "x.y.z", "w3.q",
            "w11", "c.a.b"]
    for k in keys:
        ch.basic_publish(x, k, k.encode() or b"<empty>")
    for p, q in qs.items():
        want = sorted((k.encode() or b"<empty>") for k in keys if _topic_match(p, k))
        got = sorted(b for _, _, b in get_all(ch, q, len(want)))
        assert got == want, f"pattern {p!r}"
    settle(ch.connection, 0.1)
    for p, q in qs.items():
        assert ch.basic_get(q)[0] is None, f"pattern {p!r} got more"
    ch.exchange_delete(x)


def test_bind_same_key_twice_delivers_once(ch):
    key = uname("k")
    q = _bound_queue(ch, "amq.direct", key)
    ch.queue_bind(q, "amq.direct", key)
    ch.basic_publish("amq.direct", key, b"once")
    get_all(ch, q, 1)
    settle(ch.connection, 0.2)
    assert ch.basic_get(q)[0] is None


def test_exchange_to_exchange_bind_and_unbind(ch, res):
    src, dst = res.exchange("src"), res.exchange("dst")
    ch.exchange_declare(src, "topic")
    ch.exchange_declare(dst, "direct")
    q = _bound_queue(ch, dst, "k.1")
    ch.exchange_bind(dst, src, "k.*")
    ch.basic_publish(src, "k.1", b"through")
    ch.basic_publish(src, "k.2", b"matches-binding-not-queue")
    ch.basic_publish(src, "x.1", b"nowhere")
    (m, _p, b), = get_all(ch, q, 1)
    assert b == b"through"
    assert m.exchange == src  # the exchange the message was published to
    settle(ch.connection, 0.1)
    assert ch.basic_get(q)[0] is None
    ch.exchange_unbind(dst, src, "k.*")
    ch.basic_publish(src, "k.1", b"after-unbind")
    settle(ch.connection, 0.2)
    assert ch.basic_get(q)[0] is None
    ch.exchange_delete(src)
    ch.exchange_delete(dst)


def test_exchange_to_exchange_cycle_delivers_once(ch, res):
    a, b = res.exchange("a"), res.exchange("b")
    ch.exchange_declare(a, "fanout")
    ch.exchange_declare(b, "fanout")
    ch.exchange_bind(b, a)
    ch.exchange_bind(a, b)
    q = _bound_queue(ch, b)
    ch.basic_publish(a, "", b"loop")
    get_all(ch, q, 1)
    settle(ch.connection, 0.2)
    assert ch.basic_get(q)[0] is None
    ch.exchange_delete(a)
    ch.exchange_delete(b)


def test_internal_exchange_reachable_only_via_e2e(conn, res):
    ch = conn.channel()
    front, internal = res.exchange("front"), res.exchange("internal")
    ch.exchange_declare(front, "fanout")
    ch.exchange_declare(internal, "fanout", internal=True)
    ch.exchange_bind(internal, front)
    q = _bound_queue(ch, internal)
    ch.basic_publish(front, "", b"via-front")
    assert get_all(ch, q, 1)[0][2] == b"via-front"
    ch.basic_publish(internal, "", b"direct")
    with channel_closed(403, f"ACCESS_REFUSED - cannot publish to internal exchange '{internal}' in vhost '/'"):
        ch.queue_declare(q, passive=True)  # the async error surfaces on the next sync call
    assert_connection_usable(conn)
    ch = conn.channel()
    ch.exchange_delete(front)
    ch.exchange_delete(internal)


def test_publish_to_missing_exchange_closes_channel(conn):
    ch = conn.channel()
    x = uname("missing")
    ch.basic_publish(x, "k", b"lost")
    with channel_closed(404, f"NOT_FOUND - no exchange '{x}' in vhost '/'"):
        ch.queue_declare("", exclusive=True)
    assert_connection_usable(conn)


def test_bind_to_missing_exchange_or_queue_is_404(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    missing_x, missing_q = uname("mx"), uname("mq")
    with channel_closed(404, f"NOT_FOUND - no exchange '{missing_x}' in vhost '/'"):
        ch.queue_bind(q, missing_x, "k")
    ch = conn.channel()
    with channel_closed(404, f"NOT_FOUND - no queue '{missing_q}' in vhost '/'"):
        ch.queue_bind(missing_q, "amq.direct", "k")
    ch = conn.channel()
    with channel_closed(404, f"NOT_FOUND - no exchange '{missing_x}' in vhost '/'"):
        ch.exchange_bind(missing_x, "amq.direct", "k")
    ch = conn.channel()
    with channel_closed(404, f"NOT_FOUND - no exchange '{missing_x}' in vhost '/'"):
        ch.exchange_bind("amq.direct", missing_x, "k")
    assert_connection_usable(conn)


def test_bind_with_source_and_destination_missing_names_the_source(conn):
    # RabbitMQ looks the source exchange up first; unbinding such a pair is just unbind-ok.
    missing_x, missing_q, missing_d = uname("mx"), uname("mq"), uname("md")
    ch = conn.channel()
    with channel_closed(404, f"NOT_FOUND - no exchange '{missing_x}' in vhost '/'"):
        ch.queue_bind(missing_q, missing_x, "k")
    ch = conn.channel()
    with channel_closed(404, f"NOT_FOUND - no exchange '{missing_x}' in vhost '/'"):
        ch.exchange_bind(missing_d, missing_x, "k")
    ch = conn.channel()
    ch.queue_unbind(missing_q, missing_x, "k")
    ch.exchange_unbind(missing_d, missing_x, "k")
    # the default exchange is refused before any lookup
    with channel_closed(403, "ACCESS_REFUSED - operation not permitted on the default exchange"):
        ch.queue_bind(missing_q, "", "k")
    assert_connection_usable(conn)


def test_bind_of_other_connections_exclusive_queue_checks_exchange_and_arguments_first(amqp_url, conn):
    # RabbitMQ checks exclusivity last: after the exchange, the queue and the binding arguments.
    q = conn.channel().queue_declare("", exclusive=True).method.queue
    other = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        missing_x = uname("mx")
        ch = other.channel()
        with channel_closed(404, f"NOT_FOUND - no exchange '{missing_x}' in vhost '/'"):
            ch.queue_bind(q, missing_x, "k")
        ch = other.channel()
        with channel_closed(403, "ACCESS_REFUSED - operation not permitted on the default exchange"):
            ch.queue_bind(q, "", "k")
        ch = other.channel()
        with channel_closed(406, 'PRECONDITION_FAILED - Invalid x-match field value <<"bogus">>; '
                                 "expected all, any, all-with-x, or any-with-x"):
            ch.queue_bind(q, "amq.match", "", arguments={"x-match": "bogus"})
        ch = other.channel()
        with channel_closed(405, LOCKED.format(q=q)):
            ch.queue_bind(q, "amq.direct", "k")
        assert_connection_usable(other)
    finally:
        other.close()


def test_unbind_missing_binding_is_ok(ch):
    # RabbitMQ 3.10: unbinding a binding (or exchange) that does not exist replies unbind-ok.
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_unbind(q, "amq.direct", "never-bound")
    ch.queue_unbind(q, uname("missing-x"), "k")
    ch.exchange_unbind("amq.fanout", "amq.direct", "never-bound")


def test_alternate_exchange(ch, res):
    x, ae = res.exchange("main"), res.exchange("ae")
    ch.exchange_declare(ae, "fanout")
    ch.exchange_declare(x, "direct", arguments={"alternate-exchange": ae})
    q_main = _bound_queue(ch, x, "known")
    q_ae = _bound_queue(ch, ae)
    ch.basic_publish(x, "known", b"routed")
    ch.basic_publish(x, "unknown", b"to-ae")
    assert get_all(ch, q_main, 1)[0][2] == b"routed"
    assert get_all(ch, q_ae, 1)[0][2] == b"to-ae"
    ch.exchange_delete(x)
    ch.exchange_delete(ae)


@pytest.mark.parametrize("value,type_name", [
    (1, "signedint"), (2**40, "long"), (True, "bool"), ({"a": 1}, "table"), (["a"], "array"), (b"ae", "binary"),
])
def test_alternate_exchange_of_another_type_than_longstr_is_406(conn, value, type_name):
    x = uname("x")
    ch = conn.channel()
    with channel_closed(406, f"PRECONDITION_FAILED - invalid type '{type_name}' for arg 'alternate-exchange' "
                             f"in exchange '{x}' in vhost '/'"):
        ch.exchange_declare(x, "direct", arguments={"alternate-exchange": value})
    ch = conn.channel()
    with channel_closed(404, f"NOT_FOUND - no exchange '{x}' in vhost '/'"):
        ch.exchange_declare(x, passive=True)
    assert_connection_usable(conn)


def test_publish_to_exchange_without_bindings_is_dropped(conn, ch, res):
    x = res.exchange()
    ch.exchange_declare(x, "topic")
    ch.basic_publish(x, "a.b", b"dropped")
    assert_connection_usable(conn)
    ch.exchange_delete(x)
