"""A quorum queue on the replicated queue machine in a 3-node cluster (`quorum_queues_on_machine`):
its consumers and their checked-out deliveries are part of the state every member applies, so a
failover is one a consumer never notices (issue 31, item 2).

* A consumer on a follower keeps consuming through the leader's kill -9: no basic.cancel, and
  deliveries resume from the new leader (how soon is a figure for bench/faults, not asserted
  here: the suite has no timing assertions).
* Deliveries the old leader made, held unacked through the failover, are acked afterwards
  through the new leader: they are not delivered again, and the queue ends empty.
* Every confirmed message is delivered; one delivered again is flagged redelivered.
* What a consumer on a node that dies (and stays down) held goes back to the queue, and a
  consumer elsewhere gets it, redelivered.
* A consumer on a node that is unreachable for longer than the leader waits (10 s; here the
  node is paused with SIGSTOP) gives back what it held, to a consumer elsewhere, and receives
  again once its node is back, without consuming anew and without a basic.cancel.
* A consumer timeout is the queue's (in the replicated state): a consumer on another node that
  holds a delivery too long is cancelled by its channel when the queue tells it, also when the
  leader that made the delivery died meanwhile, and what it held goes to another consumer.

Warren only (WARREN_BIN): starts its own cluster with the setting on, and kills its nodes.
"""

from __future__ import annotations

import signal
import threading
import time

import pika
import pytest

from cluster_harness import (_cluster, _mark_logs, _node_logs, needs_warren_bin,  # noqa: F401
                             publish_until_confirmed, q)
from helpers import safe_close, uname, wait_until

pytestmark = needs_warren_bin

QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture(scope="module")
def machine():
    yield from _cluster("machine", config="quorum_queues_on_machine = true\n")


def leader_of(node, qn: str) -> str | None:
    st, body = node.api("GET", f"/api/queues/%2F/{q(qn)}")
    return body.get("leader") if st == 200 and isinstance(body, dict) else None


def declare_led_by(a, nodes, qn: str, arguments: dict | None = QUORUM) -> None:
    """Declares quorum queue `qn` (or, with `arguments=None`, a classic one a policy mirrors)
    through node `a`, which leads it once every node says so."""
    conn = pika.BlockingConnection(a.params())
    conn.channel().queue_declare(qn, durable=True, arguments=arguments)
    safe_close(conn)
    wait_until(lambda: all(leader_of(n, qn) == a.name for n in nodes), timeout=15,
               what="every node to name the declaring node the leader")


def started(c: "Consumer") -> "Consumer":
    c.start()
    assert c.ready.wait(15) and c.error is None, c.error
    return c


class Consumer(threading.Thread):
    """A manual-ack consumer on its own connection: records each delivery (body, redelivered,
    time), acks at once except the first `hold` deliveries, which it acks when told; records a
    server basic.cancel."""

    def __init__(self, node, qn: str, hold: int = 0, arguments: dict | None = None):
        super().__init__(daemon=True)
        self.node, self.qn, self.hold, self.arguments = node, qn, hold, arguments
        self.got: list[tuple[bytes, bool, float]] = []
        self.counts: list[int | None] = []  # each delivery's x-delivery-count header
        self.held: list[int] = []
        self.cancelled = False
        self.ack_held = threading.Event()
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(self.node.params(heartbeat=0))
            ch = conn.channel()
            ch.basic_qos(prefetch_count=20)
            ch.add_on_cancel_callback(lambda _frame: setattr(self, "cancelled", True))

            def on_message(chan, method, props, body):
                self.got.append((body, method.redelivered, time.monotonic()))
                self.counts.append((props.headers or {}).get("x-delivery-count"))
                if len(self.held) < self.hold and not method.redelivered:
                    self.held.append(method.delivery_tag)
                else:
                    chan.basic_ack(method.delivery_tag)

            ch.basic_consume(self.qn, on_message, arguments=self.arguments)
            self.ready.set()
            acked_held = False
            while not self.stop.is_set():
                conn.process_data_events(time_limit=0.1)
                if self.ack_held.is_set() and not acked_held:
                    for tag in self.held:
                        ch.basic_ack(tag)
                    acked_held = True
            safe_close(conn)
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e
            self.ready.set()


@pytest.fixture
def mirroring(machine):
    """An `ha-mode all` policy for queues named `ha-fo.*` (RabbitMQ's mirrored classic queues),
    removed afterwards."""
    a = machine.nodes[0]
    st, body = a.api("PUT", "/api/policies/%2F/ha-failover", {
        "pattern": r"^ha-fo\.", "definition": {"ha-mode": "all"}, "apply-to": "queues"})
    assert st in (201, 204), body
    yield
    a.api("DELETE", "/api/policies/%2F/ha-failover")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["quorum", "mirrored"])
def test_a_consumer_on_a_follower_keeps_consuming_through_the_leaders_kill_9(machine, mirroring, kind):
    """Also for a classic queue mirrored by an `ha-mode` policy, which runs on the machine too:
    RabbitMQ 3.10's mirrored queues do not cancel their consumers on failover either (unless
    they ask, `x-cancel-on-ha-failover`), and do not add `x-delivery-count`."""
    a, b, c = machine.nodes
    qn = uname("qq-failover") if kind == "quorum" else f"ha-fo.{uname('q')}"
    declare_led_by(a, machine.nodes, qn, QUORUM if kind == "quorum" else None)
    if kind == "mirrored":
        st, v = a.api("GET", f"/api/queues/%2F/{q(qn)}")
        assert st == 200 and v.get("type") == "classic", v
        assert sorted(v.get("slave_nodes") or []) == sorted([b.name, c.name]), v
    consumer = started(Consumer(b, qn, hold=5))
    first = [b"m%03d" % i for i in range(100)]
    publish_until_confirmed(c, qn, first)
    wait_until(lambda: len(consumer.got) >= 100, timeout=20, what="the first 100 deliveries")
    assert [g[0] for g in consumer.got[:100]] == first
    assert len(consumer.held) == 5

    a.kill9()
    try:
        second = [b"n%03d" % i for i in range(100)]
        publish_until_confirmed(c, qn, second, timeout=60)
        wait_until(lambda: {g[0] for g in consumer.got} >= set(second), timeout=30,
                   what="every message published after the failover")
        # The held deliveries the old leader made are acked through the new one.
        consumer.ack_held.set()
        wait_until(lambda: all(leader_of(n, qn) in (b.name, c.name) for n in (b, c)), timeout=20,
                   what="a new leader")
        def settled():
            st, v = b.api("GET", f"/api/queues/%2F/{q(qn)}")
            return st == 200 and v.get("messages") == 0
        wait_until(settled, timeout=20, what="the queue to be empty once the held deliveries are acked")
        time.sleep(1)
        assert not consumer.cancelled, "the consumer was cancelled by the failover"
        assert consumer.error is None, consumer.error
        bodies = [g[0] for g in consumer.got]
        assert set(bodies) == set(first) | set(second)
        # Every delivery after a message's first is flagged redelivered; the held ones were
        # acked, not delivered again.
        seen: set[bytes] = set()
        for body, redelivered, _ in consumer.got:
            if body in seen:
                assert redelivered, f"{body!r} delivered again unflagged"
            seen.add(body)
        held_bodies = set(first[:5])
        again = [body for body in bodies if body in held_bodies]
        assert len(again) == 5, f"held deliveries came back after their acks: {again}"
        if kind == "quorum":
            assert consumer.counts[0] == 0, consumer.counts[:3]
        else:
            assert set(consumer.counts) == {None}, "a mirrored classic queue adds no x-delivery-count"
    finally:
        consumer.stop.set()
        consumer.join(10)
        if not a.running:
            a.start()
            a.wait_ready()


@pytest.mark.timeout(120)
def test_what_a_dead_nodes_consumer_held_goes_to_another_consumer(machine):
    a, b, c = machine.nodes
    qn = uname("qq-node-down")
    conn = pika.BlockingConnection(a.params())
    conn.channel().queue_declare(qn, durable=True, arguments=QUORUM)
    safe_close(conn)
    wait_until(lambda: leader_of(a, qn) == a.name, timeout=15, what="a leader")
    holder = started(Consumer(c, qn, hold=1000))
    held = [b"h%d" % i for i in range(5)]
    publish_until_confirmed(a, qn, held)
    wait_until(lambda: len(holder.got) == 5, timeout=15, what="the holder's five deliveries")
    other = started(Consumer(b, qn))
    c.kill9()
    try:
        # The leader finds c unreachable and, after a while, returns what c's consumer held.
        wait_until(lambda: {g[0] for g in other.got} >= set(held), timeout=40,
                   what="the dead node's held messages at the other consumer")
        assert all(r for body, r, _ in other.got if body in set(held)), other.got
        assert not other.cancelled
    finally:
        holder.stop.set()
        other.stop.set()
        other.join(10)
        if not c.running:
            c.start()
            c.wait_ready()


@pytest.mark.timeout(120)
def test_the_queue_times_out_a_consumer_on_another_node_across_a_failover(machine):
    a, b, c = machine.nodes
    qn = uname("qq-timeout")
    declare_led_by(a, machine.nodes, qn)
    holder = started(Consumer(c, qn, hold=1, arguments={"x-consumer-timeout": 4000}))
    publish_until_confirmed(b, qn, [b"slow"])
    wait_until(lambda: len(holder.got) == 1, timeout=15, what="the holder's delivery")
    # The leader that made the delivery dies; the new one times the holder out.
    a.kill9()
    other = None
    try:
        wait_until(lambda: holder.cancelled, timeout=30, what="basic.cancel for the holder")
        other = Consumer(b, qn)
        other.start()
        assert other.ready.wait(15) and other.error is None, other.error
        wait_until(lambda: other.got, timeout=15, what="the held message at another consumer")
        assert other.got[0][:2] == (b"slow", True)
        assert not other.cancelled and holder.error is None
    finally:
        holder.stop.set()
        if other:
            other.stop.set()
            other.join(10)
        if not a.running:
            a.start()
            a.wait_ready()


@pytest.mark.timeout(150)
def test_a_consumer_on_a_node_unreachable_for_a_while_receives_again_when_it_is_back(machine):
    a, b, c = machine.nodes
    qn = uname("qq-unreachable")
    declare_led_by(a, machine.nodes, qn)
    holder = started(Consumer(c, qn, hold=3))
    held = [b"h%d" % i for i in range(3)]
    publish_until_confirmed(a, qn, held)
    wait_until(lambda: len(holder.got) == 3, timeout=15, what="the holder's three deliveries")
    other = started(Consumer(b, qn))
    c.proc.send_signal(signal.SIGSTOP)
    try:
        # Past the leader's 10 s: what c's consumer held goes to the other one, redelivered.
        wait_until(lambda: {g[0] for g in other.got} >= set(held), timeout=40,
                   what="the unreachable node's held messages at the other consumer")
        assert all(r for body, r, _ in other.got if body in set(held)), other.got
    finally:
        c.proc.send_signal(signal.SIGCONT)
    try:
        # Back: the holder receives new messages again (round robin with the other), without
        # consuming anew.
        before = len(holder.got)
        after = [b"n%02d" % i for i in range(20)]
        deadline = time.monotonic() + 40
        while len(holder.got) == before and time.monotonic() < deadline:
            publish_until_confirmed(a, qn, after)
            time.sleep(1)
        assert len(holder.got) > before, "the consumer on the node that came back receives nothing"
        assert not holder.cancelled and not other.cancelled
        assert holder.error is None and other.error is None
    finally:
        holder.stop.set()
        other.stop.set()
        other.join(10)
