"""Through any node, the same guarantees: a reply never comes before its effect on the queue's
node (issue 32).

Run in cluster mode (tests/interop/cluster_mode.sh): the client talks to node 2 of the
session's cluster; every queue here (but the exclusive ones, which live with their
connection) lives on node 1, where a classic queue's home is and a quorum queue's leader. Each
test checks one promise a reply makes, as RabbitMQ 3.10 keeps it (its channel calls the queue
synchronously):

1. `basic.cancel-ok`: the home delivers nothing more to the consumer;
2. `channel.close-ok`: the channel's unacked deliveries are back in their queues;
3. `basic.cancel-ok` of an auto-delete queue's last consumer: the queue is gone;
4. `queue.declare-ok` (passive or not) of an `x-expires` queue: its lease starts again;
5. `connection.close-ok`: the connection's exclusive queues are gone, so the next connection
   may declare the same name;

and an exclusive queue whose node is detected down is deleted, as RabbitMQ deletes it.
"""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest

from cluster_harness import (expect_channel_error, needs_warren_bin, node_rows)
# Fixtures: pytest finds them in this module's namespace. _node_logs and _mark_logs are autouse.
from cluster_harness import _mark_logs, _node_logs, chans, conns, lossy, names  # noqa: F401
from helpers import safe_close, wait_until

pytestmark = needs_warren_bin

KINDS = ["classic", "quorum"]


def _args(kind: str, **extra) -> dict:
    """Declared through node 1, it lives there whatever the cluster's default locator."""
    locator = "x-queue-leader-locator" if kind == "quorum" else "x-queue-master-locator"
    a = {"x-queue-type": kind, locator: "client-local"}
    a.update(extra)
    return a


@pytest.fixture(scope="module")
def cluster(cluster_mode):
    """The cluster mode's session cluster (tests/interop/cluster_mode.sh, which scripts/test.sh
    runs): the client is its node 2, as for the rest of the suite there."""
    if cluster_mode is None:
        pytest.skip("runs in cluster mode (WARREN_CLUSTER=1; tests/interop/cluster_mode.sh)")
    yield cluster_mode


def _home_queue(chans, cluster, names, kind: str, n: int = 0, **args) -> str:
    """A queue homed (led) on node 1, declared through node 1, holding n messages."""
    home, _, _ = cluster.nodes
    qn = names("queue", f"any-{kind}-")
    ch = chans(home)
    ch.queue_declare(qn, durable=True, arguments=_args(kind, **args))
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish("", qn, f"m{i}".encode(), mandatory=True)
    return qn


def _home_of(cluster, qn: str) -> str:
    st, row = cluster.nodes[0].api("GET", f"/api/queues/%2f/{qn}")
    assert st == 200, (st, row)
    return row.get("leader") or row.get("node")


def _gets(ch, qn: str) -> list[tuple[bytes, bool]]:
    """Everything a run of basic.get (auto-ack) takes: (body, redelivered)."""
    out = []
    while True:
        m, _, body = ch.basic_get(qn, auto_ack=True)
        if m is None:
            return out
        out.append((body, m.redelivered))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("global_qos", [True, False])
def test_no_delivery_to_a_consumer_after_its_cancel_ok(cluster, chans, names, kind, global_qos):
    """(1) Prefetch 1 (the channel's, or the consumer's): consume, take one, cancel, ack. With
    the cancel-ok the home has stopped delivering to the consumer: the ack frees the prefetch,
    and nothing more is delivered to the cancelled tag; the other two messages stay in the
    queue."""
    _, client, _ = cluster.nodes
    qn = _home_queue(chans, cluster, names, kind, n=3)
    assert _home_of(cluster, qn) == cluster.nodes[0].name
    conn = pika.BlockingConnection(client.params())
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1, global_qos=global_qos)
        got = []
        if kind == "quorum" and global_qos:
            # As RabbitMQ: a quorum queue refuses a channel-wide prefetch (540, connection).
            with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
                ch.basic_consume(qn, lambda *a: None)
            assert e.value.reply_code == 540, e.value
            assert "does not support global qos" in e.value.reply_text, e.value
            return
        tag = ch.basic_consume(qn, lambda c, m, p, b: got.append((m.delivery_tag, b)))
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        assert len(got) == 1, got
        ch.basic_cancel(tag)
        ch.basic_ack(got[0][0])
        # Whatever the home still sent would reach the channel within this time.
        conn.process_data_events(time_limit=1.0)
        assert len(got) == 1, f"delivered to {tag} after its cancel-ok: {got[1:]}"
        # A delivery to a tag the client no longer knows is held unacked by the channel: the
        # queue would then hold one message, not two.
        left = _gets(conn.channel(), qn)
        assert sorted(b for b, _ in left) == [b"m1", b"m2"], left
    finally:
        safe_close(conn)


def test_channel_wide_prefetch_over_queues_of_two_other_nodes(cluster, chans, names):
    """A channel-wide prefetch of 1 over two consumers, of queues homed on nodes 1 and 3: the
    client holds one unacked delivery at a time; an ack lets the next through; after both
    cancel-oks, what the limit held back is in its queue again."""
    n1, client, n3 = cluster.nodes
    qs = []
    for home in (n1, n3):
        qn = names("queue", "any-gq-")
        ch = chans(home)
        ch.queue_declare(qn, arguments=_args("classic"))
        ch.confirm_delivery()
        for i in range(3):
            ch.basic_publish("", qn, f"{qn}-{i}".encode(), mandatory=True)
        qs.append(qn)
    conn = pika.BlockingConnection(client.params())
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1, global_qos=True)
        got = []
        tags = [ch.basic_consume(qn, lambda c, m, p, b: got.append(m.delivery_tag)) for qn in qs]
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        conn.process_data_events(time_limit=0.5)
        assert len(got) == 1, f"{len(got)} deliveries under a channel-wide prefetch of 1"
        ch.basic_ack(got[0])
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        conn.process_data_events(time_limit=0.5)
        assert len(got) == 2, f"{len(got)} deliveries after one ack under a prefetch of 1"
        for t in tags:
            ch.basic_cancel(t)
        probe = conn.channel()
        left = [len(_gets(probe, qn)) for qn in qs]
        # Two taken; the second is unacked on the channel (not in its queue until it closes).
        assert sum(left) == 4, f"left in the queues after the cancel-oks: {left}"
    finally:
        safe_close(conn)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["consume", "get"])
def test_channel_close_ok_comes_after_the_requeue(cluster, chans, names, kind, how):
    """(2) A channel holding unacked deliveries (to a consumer, or from basic.get) closes; right
    after its close-ok, gets on another channel, opened before, find every message,
    redelivered."""
    _, client, _ = cluster.nodes
    # Enough that requeueing them at the home and delivering them again (to a consumer the
    # home still had) takes longer than the client's next request.
    n = 500
    qn = _home_queue(chans, cluster, names, kind, n=n)
    want = sorted(f"m{i}".encode() for i in range(n))
    conn = pika.BlockingConnection(client.params())
    try:
        for round_ in range(3):
            other = conn.channel()
            ch = conn.channel()
            if how == "get":
                for _ in range(n):
                    m, _, _ = ch.basic_get(qn, auto_ack=False)
                    assert m is not None, f"round {round_}: the queue is short before the close"
            else:
                got = []
                ch.basic_qos(prefetch_count=n)
                ch.basic_consume(qn, lambda c, m, p, b: got.append(b))
                deadline = time.monotonic() + 10
                while len(got) < n and time.monotonic() < deadline:
                    conn.process_data_events(time_limit=0.05)
                assert sorted(got) == want, f"round {round_}: {len(got)} delivered"
            ch.close()
            left = _gets(other, qn)
            assert sorted(b for b, _ in left) == want, \
                f"round {round_}: {len(left)} of {n} unacked messages back right after close-ok"
            assert all(r for _, r in left), left
            # Put them back for the next round (the gets above auto-acked them).
            other.confirm_delivery()
            for b in want:
                other.basic_publish("", qn, b)
            other.close()
    finally:
        safe_close(conn)


def _gets_one(ch, qn: str):
    m, _, body = ch.basic_get(qn, auto_ack=True)
    return None if m is None else (body, m.redelivered)


def _count(node, qn: str) -> int:
    c = pika.BlockingConnection(node.params())
    try:
        return c.channel().queue_declare(qn, passive=True).method.message_count
    finally:
        safe_close(c)


def test_connection_close_ok_comes_after_the_requeue(cluster, chans, names):
    """(2) The same for connection.close: its channels' unacked deliveries are back first."""
    _, client, _ = cluster.nodes
    qn = _home_queue(chans, cluster, names, "classic", n=1)
    for round_ in range(5):
        conn = pika.BlockingConnection(client.params())
        other = pika.BlockingConnection(client.params())
        ch = conn.channel()
        got = []
        ch.basic_consume(qn, lambda c, m, p, b: got.append(b))
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert got == [b"m0"], f"round {round_}: {got}"
        conn.close()
        try:
            left = _gets_one(other.channel(), qn)
            assert left == (b"m0", True), f"round {round_}: {left}"
            other.channel().basic_publish("", qn, b"m0")
            wait_until(lambda: _count(cluster.nodes[0], qn) == 1, timeout=5, what="the message back")
        finally:
            safe_close(other)


def test_auto_delete_queue_is_gone_with_its_last_cancel_ok(cluster, chans, conns, names):
    """(3) The cancel-ok of an auto-delete queue's only consumer comes once the queue is
    deleted: a passive declare right after it, on a channel opened before, through the same
    node or the third, is 404."""
    home, client, third = cluster.nodes
    for round_ in range(5):
        qn = names("queue", "any-ad-")
        chans(home).queue_declare(qn, auto_delete=True, arguments=_args("classic"))
        conn = conns(client)
        ch, probe = conn.channel(), conn.channel()
        elsewhere = chans(third)
        tag = ch.basic_consume(qn, lambda *a: None, auto_ack=True)
        ch.basic_cancel(tag)
        expect_channel_error(lambda: probe.queue_declare(qn, passive=True), 404)
        expect_channel_error(lambda: elsewhere.queue_declare(qn, passive=True), 404)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("passive", [True, False])
def test_declare_through_another_node_extends_an_x_expires_lease(cluster, chans, names, kind, passive):
    """(4) An `x-expires` queue declared again through node 2 every 0.4 s outlives its 1.5 s
    lease by far; once the declares stop, it expires."""
    _, client, _ = cluster.nodes
    qn = _home_queue(chans, cluster, names, kind, **{"x-expires": 1500})
    ch = chans(client)
    start = time.monotonic()
    while time.monotonic() - start < 4.0:
        if passive:
            ch.queue_declare(qn, passive=True)
        else:
            ch.queue_declare(qn, durable=True, arguments=_args(kind, **{"x-expires": 1500}))
        time.sleep(0.4)
    # Still there: each declare restarted the lease at the home.
    ch.queue_declare(qn, passive=True)
    wait_until(lambda: _gone(cluster.nodes[0], qn), timeout=10, interval=0.2,
               what=f"{qn} to expire once no longer declared")


def _gone(node, qn: str) -> bool:
    """Asked through the management API: a declare would start the lease again."""
    st, body = node.api("GET", f"/api/queues/%2f/{qn}")
    assert st in (200, 404), (st, body)
    return st == 404


@pytest.mark.parametrize("next_on", [1, 2])
def test_exclusive_queue_is_released_by_connection_close_ok(cluster, names, next_on):
    """(5) A connection declares an exclusive queue and closes; with its close-ok the queue is
    gone, so the next connection (opened before, on the same node or on another) declares the
    same name."""
    client = cluster.nodes[1]
    for round_ in range(5):
        qn = names("queue", "any-ex-")
        first = pika.BlockingConnection(client.params())
        nxt = pika.BlockingConnection(cluster.nodes[next_on].params())
        try:
            ch = nxt.channel()
            first.channel().queue_declare(qn, exclusive=True)
            first.close()
            try:
                ch.queue_declare(qn, exclusive=True)
            except pika.exceptions.ChannelClosedByBroker as e:
                pytest.fail(f"round {round_}: {e.reply_code} {e.reply_text}")
        finally:
            safe_close(nxt)
            safe_close(first)


def test_exclusive_queue_of_a_node_detected_down_is_deleted(lossy):
    """An exclusive queue whose node dies is deleted once that node is detected down (RabbitMQ
    deletes it then), not when the node boots again."""
    home, n2, n3 = lossy.nodes
    qn = f"any-exdown-{time.monotonic_ns()}"
    c = pika.BlockingConnection(n3.params())
    c.channel().queue_declare(qn, exclusive=True)
    assert _listed(home, qn)
    n3.kill9()
    try:
        wait_until(lambda: not _listed(home, qn) and not _listed(n2, qn), timeout=30, interval=0.5,
                   what=f"exclusive queue {qn} of the dead node to be deleted")
        expect_channel_error(lambda: pika.BlockingConnection(n2.params()).channel()
                             .queue_declare(qn, passive=True), 404)
    finally:
        n3.start()
        n3.wait_ready()
        wait_until(lambda: node_rows(home).get(n3.name, {}).get("running") is True, timeout=30,
                   interval=0.2, what=f"{n3.name} running again")
    assert not _listed(n3, qn)


def _listed(node, qn: str) -> bool:
    st, rows = node.api("GET", "/api/queues/%2f")
    assert st == 200, (st, rows)
    return any(r["name"] == qn for r in rows)


def test_quorum_critical_health_check_sees_the_cluster(lossy):
    """RabbitMQ's node-is-quorum-critical in a cluster: ok while every member runs; once one of
    a 3-member quorum queue's nodes is down, each other member is critical for it (503, the
    queue listed); ok again when it is back. No classic mirrored queues: mirror-sync is ok."""
    n1, n2, n3 = lossy.nodes
    qn = f"any-qcrit-{time.monotonic_ns()}"
    c = pika.BlockingConnection(n1.params())
    try:
        c.channel().queue_declare(qn, durable=True, arguments={"x-queue-type": "quorum"})
    finally:
        safe_close(c)
    path = "/api/health/checks/node-is-quorum-critical"
    for n in lossy.nodes:
        wait_until(lambda n=n: n.api("GET", path) == (200, {"status": "ok"}), timeout=15, interval=0.2,
                   what=f"{n.name}'s quorum check ok with every node running")
        assert n.api("GET", "/api/health/checks/node-is-mirror-sync-critical") == (200, {"status": "ok"})
    n3.kill9()
    try:
        for n in (n1, n2):
            wait_until(lambda n=n: n.api("GET", path)[0] == 503, timeout=20, interval=0.2,
                       what=f"{n.name} quorum-critical once {n3.name} is down")
            st, body = n.api("GET", path)
            assert body["status"] == "failed", body
            assert [x["name"] for x in body["queues"]] == [qn], body
            assert body["queues"][0]["virtual_host"] == "/", body
    finally:
        n3.start()
        n3.wait_ready()
    wait_until(lambda: n1.api("GET", path) == (200, {"status": "ok"}), timeout=30, interval=0.2,
               what=f"{n1.name}'s quorum check ok again with {n3.name} back")
    c = pika.BlockingConnection(n1.params())
    try:
        c.channel().queue_delete(qn)
    finally:
        safe_close(c)
