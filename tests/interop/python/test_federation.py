"""Federation as RabbitMQ 3.10's federation plugin runs it: `federation-upstream` and
`federation-upstream-set` parameters checked with RabbitMQ's texts, policies with
`federation-upstream(-set|-pattern)`; a federated exchange's link declares RabbitMQ's queue and
`x-federation-upstream` exchange on the upstream, follows the downstream's bindings, and
republishes with `x-received-from`; a federated queue's link consumes its upstream queue (at
priority -1) only while the downstream queue has consumers waiting; `/api/federation-links`. Validation runs against RabbitMQ
3.10 too (the default AMQP_URL broker); the links need a second broker (WARREN_BIN), and the
RabbitMQ tests RabbitMQ 3.10 at the other end (test_shovel.py's fixture)."""

from __future__ import annotations

import contextlib
import os
import shutil
import time

import pika
import pika.exceptions
import pytest

from helpers import Collector, connect, get_all, pump, safe_close, settle, uname, wait_until
from test_access import Api, api, q  # noqa: F401 - fixtures
from test_durability import Node
from test_shovel import RABBITMQ_AMQP, rabbitmq  # noqa: F401 - fixture
from test_tls import certs  # noqa: F401 - fixture: a CA, another CA, server, client, stranger

BIN = os.environ.get("WARREN_BIN")
warren_only = pytest.mark.skipif(not BIN, reason="links a second Warren (WARREN_BIN)")
# Moving messages between brokers, each step bounded by its own wait: more than the suite's 30 s.
pytestmark = pytest.mark.timeout(120)


def put(api: Api, component: str, name: str, value, vhost: str = "/"):
    return api.call("PUT", f"/api/parameters/{component}/{q(vhost)}/{q(name)}", {"value": value})


@pytest.fixture
def cleanup(api):
    """(kind, name) of parameters and policies made by the test; deleted at teardown."""
    made: list[tuple[Api, str, str]] = []
    yield made
    for a, path, _ in reversed(made):
        try:
            a.call("DELETE", path)
        except OSError:
            pass  # a broker the test started and stopped


# ---- validation (RabbitMQ 3.10.8's texts) ----

UPSTREAM_BAD = [
    ({}, 'Key "uri" not found in {name}'),
    ({"uri": 5}, "uri should be list, actually was 5"),
    ({"uri": "amqp://x", "max-hops": "a", "colour": 1},
     'Unrecognised terms [{&lt;&lt;"colour"&gt;&gt;,1}] in {name}\n'
     'max-hops should be a number, actually was &lt;&lt;"a"&gt;&gt;'),
    ({"uri": "amqp://x", "ack-mode": "x", "expires": "1"},
     'ack-mode should be one of [&lt;&lt;"no-ack"&gt;&gt;,&lt;&lt;"on-publish"&gt;&gt;,&lt;&lt;"on-confirm"&gt;&gt;], '
     'actually was &lt;&lt;"x"&gt;&gt;\nexpires should be a number, actually was &lt;&lt;"1"&gt;&gt;'),
]


@pytest.mark.parametrize("value,reason", UPSTREAM_BAD, ids=[r[:30] for _, r in UPSTREAM_BAD])
def test_bad_upstreams(api, value, reason):
    name = uname("up")
    st, body = put(api, "federation-upstream", name, value)
    assert st == 400, body
    assert body == {"error": "bad_request",
                    "reason": "Validation failed\n\n" + reason.replace("{name}", name) + "\n"}


def test_upstreams_sets_and_policies(api, cleanup):
    up, s, pol = uname("up"), uname("set"), uname("fedpol")
    value = {"uri": ["amqp://a", "amqp://b"], "bind-nowait": True, "trust-user-id": False,
             "prefetch-count": 10, "reconnect-delay": 1, "message-ttl": 5, "exchange": "e",
             "max-hops": 2, "expires": 60000, "ack-mode": "on-publish"}
    st, body = put(api, "federation-upstream", up, value)
    assert st == 201, body
    cleanup.append((api, f"/api/parameters/federation-upstream/%2F/{q(up)}", ""))
    st, got = api.call("GET", f"/api/parameters/federation-upstream/%2F/{q(up)}")
    assert st == 200 and got["value"] == value and got["component"] == "federation-upstream", got
    st, body = put(api, "federation-upstream-set", s, [{}])
    assert st == 400 and body["reason"] == f'Validation failed\n\nKey "upstream" not found in {s}\n', body
    st, body = put(api, "federation-upstream-set", s, [{"upstream": up, "max-hops": 2}])
    assert st == 201, body
    cleanup.append((api, f"/api/parameters/federation-upstream-set/%2F/{q(s)}", ""))
    for definition, reason in [
        ({"federation-upstream": 5}, "5 is not a valid federation upstream name"),
        ({"federation-upstream-set": 5}, "5 is not a valid federation upstream set name"),
        ({"federation-upstream": "a", "federation-upstream-set": "all"},
         "cannot specify federation-upstream, federation-upstream-set or federation-upstream-pattern together"),
    ]:
        st, body = api.call("PUT", f"/api/policies/%2F/{q(pol)}",
                            {"pattern": "^fed-none$", "definition": definition, "apply-to": "exchanges"})
        assert st == 400 and body["reason"] == f"Validation failed\n\n{reason}\n", body


# ---- links ----

def declare_x(url: str, x: str, kind: str = "topic") -> None:
    c = connect(url)
    try:
        c.channel().exchange_declare(x, kind, durable=True)
    finally:
        safe_close(c)


def bound_queue(url: str, x: str, key: str) -> str:
    qn = uname("fedq")
    c = connect(url)
    try:
        ch = c.channel()
        ch.queue_declare(qn, durable=True)
        ch.queue_bind(qn, x, key)
    finally:
        safe_close(c)
    return qn


def publish(url: str, x: str, key: str, body: bytes) -> None:
    c = connect(url)
    try:
        ch = c.channel()
        ch.confirm_delivery()
        ch.basic_publish(x, key, body, pika.BasicProperties(delivery_mode=2, headers={"k": "v"}))
    finally:
        safe_close(c)


def depth(url: str, queue: str) -> int:
    c = connect(url)
    try:
        return c.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        safe_close(c)


def link_rows(a: Api, x: str) -> list[dict]:
    st, rows = a.call("GET", "/api/federation-links")
    assert st == 200, rows
    return [r for r in rows if r.get("exchange") == x]


def federate(a: Api, cleanup, x: str, upstream_uri: str, max_hops: int = 1) -> str:
    """An upstream named after x, and a policy federating x from it; returns the upstream."""
    up, pol = f"up-{x}", f"pol-{x}"
    st, body = put(a, "federation-upstream", up, {"uri": upstream_uri, "max-hops": max_hops,
                                                 "reconnect-delay": 1})
    assert st == 201, body
    cleanup.append((a, f"/api/parameters/federation-upstream/%2F/{q(up)}", ""))
    st, body = a.call("PUT", f"/api/policies/%2F/{q(pol)}", {
        "pattern": f"^{x}$", "definition": {"federation-upstream": up}, "apply-to": "exchanges"})
    assert st in (201, 204), body
    cleanup.append((a, f"/api/policies/%2F/{q(pol)}", ""))
    return up


def wait_running(a: Api, x: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        rows = link_rows(a, x)
        if rows and rows[0]["status"] == "running":
            return rows[0]
        assert time.monotonic() < deadline, f"link of {x} not running: {rows}"
        time.sleep(0.2)


def received(url: str, queue: str, n: int) -> list:
    c = connect(url)
    try:
        return get_all(c.channel(), queue, n)
    finally:
        safe_close(c)


@warren_only
def test_warren_to_warren_follows_bindings(api, amqp_url, cleanup):
    upstream = Node()
    upstream.start()
    try:
        x = uname("fedx")
        declare_x(amqp_url, x)
        qa = bound_queue(amqp_url, x, "a.#")
        up = federate(api, cleanup, x, f"amqp://guest:guest@127.0.0.1:{upstream.port}")
        row = wait_running(api, x)
        assert row["upstream"] == up and row["type"] == "exchange" and row["vhost"] == "/"
        assert row["uri"] == f"amqp://127.0.0.1:{upstream.port}", row
        assert row["upstream_queue"].startswith(f"federation: {x} -> "), row
        publish(upstream.url, x, "a.b", b"wanted")
        publish(upstream.url, x, "c.d", b"not bound")
        wait_until(lambda: depth(amqp_url, qa) == 1, timeout=20, what="the federated message")
        (_, props, body), = received(amqp_url, qa, 1)
        assert body == b"wanted" and props.headers["k"] == "v"
        (hop,) = props.headers["x-received-from"]
        assert hop["exchange"] == x and hop["redelivered"] is False, hop
        # A binding added downstream is followed upstream.
        qc = bound_queue(amqp_url, x, "c.#")
        time.sleep(3)
        publish(upstream.url, x, "c.d", b"bound now")
        wait_until(lambda: depth(amqp_url, qc) == 1, timeout=20, what="the newly bound key")
        assert depth(amqp_url, qa) == 0
        # The policy gone, the link deletes its queue and internal exchange upstream (RabbitMQ's
        # resource-cleanup-mode default).
        up_api = Api(f"http://127.0.0.1:{upstream.http_port}")

        def made_upstream():
            _, queues = up_api.call("GET", "/api/queues")
            _, exchanges = up_api.call("GET", "/api/exchanges")
            return [e["name"] for e in queues + exchanges if e["name"].startswith("federation: ")]

        assert len(made_upstream()) == 2, made_upstream()
        st, _ = api.call("DELETE", f"/api/policies/%2F/{q('pol-' + x)}")
        assert st == 204
        wait_until(lambda: made_upstream() == [], timeout=20, what="the link's queue and exchange deleted")
    finally:
        upstream.cleanup()


@warren_only
def test_a_cycle_of_two_warrens_delivers_once(api, amqp_url, cleanup):
    """A federates X from B and B from A (max-hops 1): a message published on either side
    reaches each side's bound queue once, and goes no further."""
    other = Node()
    other.start()
    try:
        b_api = Api(f"http://127.0.0.1:{other.http_port}")
        x = uname("cyclex")
        declare_x(amqp_url, x)
        declare_x(other.url, x)
        qa = bound_queue(amqp_url, x, "#")
        qb = bound_queue(other.url, x, "#")
        port = amqp_url.split("@127.0.0.1:")[1].split("/")[0]
        federate(api, cleanup, x, f"amqp://guest:guest@127.0.0.1:{other.port}")
        federate(b_api, cleanup, x, f"amqp://guest:guest@127.0.0.1:{port}")
        wait_running(api, x)
        wait_running(b_api, x)
        time.sleep(2)
        publish(amqp_url, x, "k", b"from a")
        wait_until(lambda: depth(other.url, qb) == 1, timeout=20, what="A's message at B")
        time.sleep(2)
        assert depth(amqp_url, qa) == 1 and depth(other.url, qb) == 1
    finally:
        other.cleanup()


def test_rabbitmq_upstream_to_warren(api, amqp_url, cleanup, rabbitmq):
    rmq, rmq_mgmt = rabbitmq
    x = uname("rmqfedx")
    declare_x(rmq, x)
    declare_x(amqp_url, x)
    qa = bound_queue(amqp_url, x, "orders.*")
    try:
        federate(api, cleanup, x, rmq.split("?")[0])
        wait_running(api, x)
        for i in range(20):
            publish(rmq, x, "orders.new", f"o{i}".encode())
        publish(rmq, x, "audit.log", b"not bound")
        wait_until(lambda: depth(amqp_url, qa) == 20, timeout=30, what="20 from RabbitMQ")
        got = received(amqp_url, qa, 20)
        assert [b for _, _, b in got] == [f"o{i}".encode() for i in range(20)]
        # The link's queue on RabbitMQ, named as RabbitMQ's own plugin names it, and its
        # internal exchange of RabbitMQ's x-federation-upstream type (x-max-hops a long).
        st, overview = api.call("GET", "/api/overview")
        link_queue = f"federation: {x} -> {overview['cluster_name']}"
        assert depth(rmq, link_queue) == 0
        st, ix = Api(rmq_mgmt).call("GET", f"/api/exchanges/%2F/{q(link_queue + ' A')}")
        assert st == 200 and ix["type"] == "x-federation-upstream" and ix["internal"], ix
        assert ix["arguments"]["x-max-hops"] == 1, ix
    finally:
        c = connect(rmq)
        try:
            ch = c.channel()
            ch.exchange_delete(x)
            ch.queue_delete(f"federation: {x} -> {api.call('GET', '/api/overview')[1]['cluster_name']}")
        finally:
            safe_close(c)


@contextlib.contextmanager
def rabbitmq_federates_from(rapi: Api, amqp_url: str, kind: str, name: str):
    """RabbitMQ's federation plugin federating the exchange or queue (`kind`) `name` from
    Warren (an upstream and a policy on RabbitMQ), once its link runs; removed after."""
    up, pol = f"up-{name}", f"pol-{name}"
    try:
        st, body = put(rapi, "federation-upstream", up, {"uri": amqp_url.split("?")[0]})
        assert st in (201, 204), body
        st, body = rapi.call("PUT", f"/api/policies/%2F/{q(pol)}", {
            "pattern": f"^{name}$", "definition": {"federation-upstream": up}, "apply-to": f"{kind}s"})
        assert st in (201, 204), body

        def running():
            st, rows = rapi.call("GET", "/api/federation-links")
            return any(r.get(kind) == name and r.get("status") == "running" for r in rows)

        wait_until(running, timeout=30, what=f"RabbitMQ's link of {kind} {name} to Warren running")
        yield
    finally:
        rapi.call("DELETE", f"/api/policies/%2F/{q(pol)}")
        rapi.call("DELETE", f"/api/parameters/federation-upstream/%2F/{q(up)}")


def test_rabbitmqs_federation_from_warren(api, amqp_url, rabbitmq):
    """RabbitMQ 3.10's federation plugin on the downstream side, Warren upstream: RabbitMQ's link
    declares an `x-federation-upstream` exchange on Warren."""
    rmq, rmq_mgmt = rabbitmq
    rapi = Api(rmq_mgmt)
    x = uname("fromwarren")
    declare_x(amqp_url, x)
    declare_x(rmq, x)
    qr = bound_queue(rmq, x, "#")
    try:
        with rabbitmq_federates_from(rapi, amqp_url, "exchange", x):
            time.sleep(2)
            for i in range(10):
                publish(amqp_url, x, "any.key", f"w{i}".encode())
            wait_until(lambda: depth(rmq, qr) == 10, timeout=30, what="10 from Warren at RabbitMQ")
            (_, props, _), *_ = received(rmq, qr, 10)
            assert props.headers["x-received-from"][0]["exchange"] == x
    finally:
        c = connect(rmq)
        try:
            c.channel().exchange_delete(x)
        finally:
            safe_close(c)


def test_the_upstream_exchange_type_checks_its_hops(amqp_url):
    """`x-federation-upstream`, the type a downstream's link declares on its upstream, needs
    `x-max-hops` as a long (RabbitMQ's texts)."""
    for args, text in [(None, "PRECONDITION_FAILED - Argument x-max-hops missing"),
                       ({"x-max-hops": "a"}, "PRECONDITION_FAILED - Argument x-max-hops must be of type long")]:
        c = connect(amqp_url)
        try:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
                c.channel().exchange_declare(uname("xfu"), "x-federation-upstream", arguments=args,
                                             auto_delete=True)
            assert (e.value.reply_code, e.value.reply_text) == (406, text)
        finally:
            safe_close(c)


def cluster_name(a: Api, name: str | None = None) -> str:
    """The broker's cluster name (set first when `name` is given)."""
    if name is not None:
        st, body = a.call("PUT", "/api/cluster-name", {"name": name})
        assert st in (200, 204), body
    st, body = a.call("GET", "/api/cluster-name")
    assert st == 200, body
    return body["name"]


@warren_only
def test_a_cycle_with_two_hops_is_stopped_by_cluster_name(api, amqp_url, cleanup):
    """A and B federate X from each other with max-hops 2: hops alone would bring A's message
    back to A through B; the upstream's cluster name (from its connection.start) in
    `x-received-from` and `x-bound-from` stops it, as RabbitMQ's plugin does."""
    other = Node()
    other.start()
    try:
        b_api = Api(f"http://127.0.0.1:{other.http_port}")
        b_name = cluster_name(b_api, uname("cluster-b"))
        a_name = cluster_name(api)
        assert a_name != b_name
        x = uname("cycle2x")
        declare_x(amqp_url, x)
        declare_x(other.url, x)
        qa = bound_queue(amqp_url, x, "#")
        qb = bound_queue(other.url, x, "#")
        port = amqp_url.split("@127.0.0.1:")[1].split("/")[0]
        federate(api, cleanup, x, f"amqp://guest:guest@127.0.0.1:{other.port}", max_hops=2)
        federate(b_api, cleanup, x, f"amqp://guest:guest@127.0.0.1:{port}", max_hops=2)
        wait_running(api, x)
        wait_running(b_api, x)
        time.sleep(3)
        publish(amqp_url, x, "k", b"from a")
        wait_until(lambda: depth(other.url, qb) == 1, timeout=20, what="A's message at B")
        time.sleep(3)
        assert depth(amqp_url, qa) == 1, "A's message came back to A"
        assert depth(other.url, qb) == 1
        (_, props, _), = received(other.url, qb, 1)
        (hop,) = props.headers["x-received-from"]
        assert hop["cluster-name"] == a_name and hop["vhost"] == "/", hop
        publish(other.url, x, "k", b"from b")
        wait_until(lambda: depth(amqp_url, qa) == 2, timeout=20, what="B's message at A")
        time.sleep(3)
        assert depth(other.url, qb) == 1, "B's message came back to B"
    finally:
        other.cleanup()


# ---- federated queues ----

def federate_queue(a: Api, cleanup, qn: str, upstream_uri: str, how: str = "federation-upstream",
                   **extra) -> str:
    """An upstream named after the queue, and a policy federating it; `how` is the policy key
    (`federation-upstream`, or `federation-upstream-pattern` with the upstream's name as the
    pattern)."""
    up, pol = f"up-{qn}", f"pol-{qn}"
    st, body = put(a, "federation-upstream", up, {"uri": upstream_uri, "reconnect-delay": 1, **extra})
    assert st == 201, body
    cleanup.append((a, f"/api/parameters/federation-upstream/%2F/{q(up)}", ""))
    value = up if how == "federation-upstream" else f"^{up}$"
    st, body = a.call("PUT", f"/api/policies/%2F/{q(pol)}", {
        "pattern": f"^{qn}$", "definition": {how: value}, "apply-to": "queues"})
    assert st in (201, 204), body
    cleanup.append((a, f"/api/policies/%2F/{q(pol)}", ""))
    return up


def queue_link(a: Api, qn: str, timeout: float = 30) -> dict:
    def row():
        st, rows = a.call("GET", "/api/federation-links")
        assert st == 200, rows
        r = [r for r in rows if r.get("type") == "queue" and r.get("queue") == qn]
        return r[0] if r and r[0]["status"] == "running" else None
    return wait_until(row, timeout=timeout, what=f"the link of queue {qn} running")


def fill(url: str, qn: str, bodies: list[bytes], declare: bool = True, args=None) -> None:
    c = connect(url)
    try:
        ch = c.channel()
        if declare:
            ch.queue_declare(qn, durable=True, arguments=args)
        ch.confirm_delivery()
        for b in bodies:
            ch.basic_publish("", qn, b, pika.BasicProperties(delivery_mode=2, headers={"k": "v"}))
    finally:
        safe_close(c)


def declare_q(url: str, qn: str) -> None:
    c = connect(url)
    try:
        c.channel().queue_declare(qn, durable=True)
    finally:
        safe_close(c)


def consume_n(url: str, qn: str, n: int, prefetch: int = 3, timeout: float = 30) -> list:
    """Consumes (acking) until n deliveries came; returns them."""
    c = connect(url)
    try:
        ch = c.channel()
        ch.basic_qos(prefetch_count=prefetch)
        got = Collector()

        def on(ch_, m, p, b):
            got(ch_, m, p, b)
            ch_.basic_ack(m.delivery_tag)

        ch.basic_consume(qn, on)
        pump(c, lambda: len(got) >= n, timeout=timeout, what=f"{n} deliveries from {qn}")
        settle(c, 1.0)
        return got.deliveries
    finally:
        safe_close(c)


@warren_only
def test_a_federated_queue_moves_messages_only_while_its_consumers_wait(api, amqp_url, cleanup):
    upstream = Node()
    upstream.start()
    try:
        qn = uname("fedqq")
        declare_q(amqp_url, qn)
        fill(upstream.url, qn, [f"m{i}".encode() for i in range(10)])
        up = federate_queue(api, cleanup, qn, f"amqp://guest:guest@127.0.0.1:{upstream.port}",
                            how="federation-upstream-pattern")
        row = queue_link(api, qn)
        assert row["upstream"] == up and row["upstream_queue"] == qn and row["vhost"] == "/", row
        assert row["uri"] == f"amqp://127.0.0.1:{upstream.port}", row
        # No consumer downstream: nothing moves.
        time.sleep(2)
        assert depth(upstream.url, qn) == 10 and depth(amqp_url, qn) == 0
        # A consumer downstream: everything comes over, each message once.
        got = consume_n(amqp_url, qn, 10)
        assert sorted(b for _, _, b in got) == sorted(f"m{i}".encode() for i in range(10))
        _, props, _ = got[0]
        assert props.headers["k"] == "v"
        (hop,) = props.headers["x-received-from"]
        assert hop["uri"] == f"amqp://127.0.0.1:{upstream.port}" and hop["queue"] == qn, hop
        assert hop["visit-count"] == 1 and hop["redelivered"] is False, hop
        assert props.headers["x-original-exchange"] == "" and props.headers["x-original-routing-key"] == qn
        assert depth(upstream.url, qn) == 0
        # The upstream's own consumer comes first (the link's consumer has priority -1),
        # while the downstream's consumer waits too.
        down = connect(amqp_url)
        upc = connect(upstream.url)
        try:
            dch = down.channel()
            dch.basic_qos(prefetch_count=5)
            down_got = Collector()
            dch.basic_consume(qn, down_got, auto_ack=True)
            settle(down, 1.0)
            uch = upc.channel()
            uch.basic_qos(prefetch_count=100)
            up_got = Collector()
            uch.basic_consume(qn, up_got, auto_ack=False)
            fill(upstream.url, qn, [f"u{i}".encode() for i in range(20)], declare=False)
            pump(upc, lambda: len(up_got) == 20, timeout=20, what="20 to the upstream's consumer")
            settle(down, 1.0)
            assert len(down_got) == 0, down_got.bodies
            # The upstream's consumer gone, what it held goes downstream.
            uch.close()
            pump(down, lambda: len(down_got) == 20, timeout=20, what="20 moved downstream")
        finally:
            safe_close(upc)
            safe_close(down)
    finally:
        upstream.cleanup()


@warren_only
def test_a_federated_quorum_queue_fetches_for_its_consumers(api, amqp_url, cleanup):
    """A replicated (quorum) queue downstream: its link runs where it leads and reads whether it
    starves from the replicated state."""
    upstream = Node()
    upstream.start()
    try:
        qn = uname("fedqq-quorum")
        c = connect(amqp_url)
        try:
            c.channel().queue_declare(qn, durable=True, arguments={"x-queue-type": "quorum"})
        finally:
            safe_close(c)
        # The link declares the upstream queue as the downstream one is: a quorum queue too.
        fill(upstream.url, qn, [f"m{i}".encode() for i in range(5)], args={"x-queue-type": "quorum"})
        federate_queue(api, cleanup, qn, f"amqp://guest:guest@127.0.0.1:{upstream.port}")
        queue_link(api, qn)
        time.sleep(2)
        assert depth(upstream.url, qn) == 5 and depth(amqp_url, qn) == 0
        got = consume_n(amqp_url, qn, 5)
        assert sorted(b for _, _, b in got) == [f"m{i}".encode() for i in range(5)]
        assert depth(upstream.url, qn) == 0
    finally:
        upstream.cleanup()


@warren_only
def test_mutually_federated_queues_move_each_message_once(api, amqp_url, cleanup):
    """A and B federate Q from each other (a ring, as RabbitMQ's docs describe): messages move
    to where consumers wait, and do not bounce back and forth."""
    other = Node()
    other.start()
    try:
        b_api = Api(f"http://127.0.0.1:{other.http_port}")
        qn = uname("ringq")
        declare_q(amqp_url, qn)
        declare_q(other.url, qn)
        port = amqp_url.split("@127.0.0.1:")[1].split("/")[0]
        federate_queue(api, cleanup, qn, f"amqp://guest:guest@127.0.0.1:{other.port}")
        federate_queue(b_api, cleanup, qn, f"amqp://guest:guest@127.0.0.1:{port}")
        queue_link(api, qn)
        queue_link(b_api, qn)
        fill(amqp_url, qn, [f"a{i}".encode() for i in range(5)])
        time.sleep(2)
        assert depth(amqp_url, qn) == 5 and depth(other.url, qn) == 0, "moved without a consumer"
        got = consume_n(other.url, qn, 5)
        assert sorted(b for _, _, b in got) == [f"a{i}".encode() for i in range(5)]
        assert all(p.headers["x-received-from"][0]["visit-count"] == 1 for _, p, _ in got)
        time.sleep(2)
        assert depth(amqp_url, qn) == 0 and depth(other.url, qn) == 0
    finally:
        other.cleanup()


def test_rabbitmq_upstream_queue_to_warren(api, amqp_url, cleanup, rabbitmq):
    rmq, _ = rabbitmq
    qn = uname("rmqfedq")
    declare_q(amqp_url, qn)
    fill(rmq, qn, [f"r{i}".encode() for i in range(10)])
    try:
        federate_queue(api, cleanup, qn, rmq.split("?")[0])
        queue_link(api, qn)
        time.sleep(1)
        assert depth(rmq, qn) == 10, "moved without a consumer"
        got = consume_n(amqp_url, qn, 10)
        assert sorted(b for _, _, b in got) == sorted(f"r{i}".encode() for i in range(10))
        assert got[0][1].headers["x-received-from"][0]["queue"] == qn
        assert depth(rmq, qn) == 0
    finally:
        c = connect(rmq)
        try:
            c.channel().queue_delete(qn)
        finally:
            safe_close(c)


def test_rabbitmqs_queue_federation_from_warren(api, amqp_url, rabbitmq):
    """RabbitMQ 3.10's plugin federates a queue from Warren: it checks Warren's
    consumer_priorities capability and consumes at x-priority -1."""
    rmq, rmq_mgmt = rabbitmq
    rapi = Api(rmq_mgmt)
    qn = uname("fromwarrenq")
    declare_q(rmq, qn)
    fill(amqp_url, qn, [f"w{i}".encode() for i in range(10)])
    try:
        with rabbitmq_federates_from(rapi, amqp_url, "queue", qn):
            got = consume_n(rmq, qn, 10)
            assert sorted(b for _, _, b in got) == sorted(f"w{i}".encode() for i in range(10))
            assert depth(amqp_url, qn) == 0
    finally:
        c = connect(rmq)
        try:
            c.channel().queue_delete(qn)
        finally:
            safe_close(c)


@warren_only
@pytest.mark.skipif(not shutil.which("openssl"), reason="needs the openssl CLI to make certificates")
def test_an_upstream_over_tls_with_a_client_certificate(api, amqp_url, cleanup, certs):
    """An upstream Warren whose AMQPS listener requires a client certificate: the link (and its
    look at the upstream's connection.start, for the cluster name) connects with the CA and the
    client's certificate; with a certificate from another CA the link is in error."""
    from conftest import _free_port
    from test_limits import start
    from test_tls import tls_config, tls_params

    d = certs
    tls_port = _free_port()
    other = start(tls_config(d, tls_port, f"ca_file = '{d}/ca.pem'\nverify = 'verify_peer'\nfail_if_no_peer_cert = true\n"))
    try:
        name = cluster_name(Api(f"http://127.0.0.1:{other.http_port}"), uname("tls-cluster"))

        def uri(client: str) -> str:
            return (f"amqps://guest:guest@localhost:{tls_port}/%2F?cacertfile={d}/ca.pem"
                    f"&certfile={d}/{client}.pem&keyfile={d}/{client}.key&verify=verify_peer")

        bad = uname("tlsx-refused")
        declare_x(amqp_url, bad)
        federate(api, cleanup, bad, uri("stranger"))

        def in_error():
            rows = link_rows(api, bad)
            return rows and rows[0]["status"] == "error" and rows[0].get("error")

        wait_until(in_error, timeout=30, what="the link with a stranger's certificate in error")
        x = uname("tlsx")
        declare_x(amqp_url, x)
        qa = bound_queue(amqp_url, x, "#")
        federate(api, cleanup, x, uri("client"))
        row = wait_running(api, x)
        assert row["uri"].startswith(f"amqps://localhost:{tls_port}/"), row
        time.sleep(2)
        tc = pika.BlockingConnection(tls_params(d, tls_port, "client"))
        try:
            ch = tc.channel()
            ch.confirm_delivery()
            ch.basic_publish(x, "k", b"over tls")
        finally:
            safe_close(tc)
        wait_until(lambda: depth(amqp_url, qa) == 1, timeout=20, what="the message over TLS")
        (_, props, body), = received(amqp_url, qa, 1)
        (hop,) = props.headers["x-received-from"]
        assert body == b"over tls" and hop["cluster-name"] == name, hop
    finally:
        other.cleanup()
