"""Quorum queues (x-queue-type=quorum) replicated on Raft in a 3-node cluster, with RabbitMQ 3.10's
semantics.

* Declare: through any node; non-durable, exclusive and auto-delete quorum declares are refused
  (406). The queue has 3 members (one per node; `x-quorum-initial-group-size: 1`: one, the
  declaring node), its leader on the declaring node (client-local, RabbitMQ's default).
* Management API, on every node: `GET /api/queues/%2F/<q>` says `"type": "quorum"`, `"members"`
  (the node names), `"leader"` (the node whose replica leads) and `"node"` equal to `"leader"`, all
  nodes agreeing; `messages` counts the queue's messages (polled: stats lag).
* Messages published with confirms through one node reach consumers on the others exactly once,
  in publish order, not redelivered.
* Faults (a second cluster; each test restarts what it stopped): a killed (SIGKILL) leader is
  replaced within 20 s and no confirmed message is lost; a killed follower interrupts nothing; acks
  are replicated, so a new leader does not hand out acked messages again (a copy may come back,
  flagged redelivered, never as a first delivery); a whole-cluster stop and start keeps every
  message; without a majority of members a publish is not confirmed (acked). The fault tests
  check what is delivered; whether the redelivered flag is exact after a failover or a restart
  (RabbitMQ: set only on a message delivered before, its delivery count > 0) is a test of its
  own, test_never_delivered_messages_are_not_flagged_redelivered_after_failover_or_restart.

How the tests wait: publishes go through `ConfirmPublisher`, a pika SelectConnection (pika's
asynchronous adapter) that counts basic.ack / basic.nack per delivery tag and runs its I/O loop
only until a deadline, so that "no confirm within 5 s" is observable and no wait is unbounded
(pika's BlockingChannel waits for a confirm forever). Consumers and passive declares, whose pika
calls wait without a deadline (basic.consume, queue.declare), run in threads of their own, each
on its own connection, joined with a timeout.

The reference RabbitMQ is a single node: these tests start their own Warren nodes and run only
with WARREN_BIN. A failing test gets the tail of each node's log in its report.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Callable, NamedTuple

import pika
import pika.exceptions
import pika.spec
import pytest

from cluster_harness import (PERSISTENT, STOP_TIMEOUT, ClusterNode, bodies, expect_channel_error,
                             needs_warren_bin, q)
# Fixtures: pytest finds them in this module's namespace. _node_logs and _mark_logs are autouse.
from cluster_harness import _mark_logs, _node_logs, chans, cluster, conns, lossy, names  # noqa: F401
from helpers import safe_close, uname, wait_until

pytestmark = needs_warren_bin

QUORUM = {"x-queue-type": "quorum"}
FAILOVER_TIMEOUT = 20.0  # a killed leader's queue is served again through a survivor within this
NO_MAJORITY_WAIT = 5.0   # how long a publish without a majority must stay unconfirmed
# Acked messages that may come back (redelivered) after the leader that had the acks was killed:
# "a few", acks it applied (its stats said so) but may not have replicated yet. All 60 coming
# back would mean acks are not replicated.
ACKED_MAY_RETURN = 5


# ---------------------------------------------------------------------------------------------
# Helpers


def on_channel(node: ClusterNode, what: str, fn: Callable, timeout: float = 20):
    """fn(channel) on a connection of its own to node, in a thread joined within timeout: its
    result."""
    def run():
        c = pika.BlockingConnection(node.params())
        try:
            return fn(c.channel())
        finally:
            safe_close(c)
    return in_thread(run, timeout, f"{what} through {node.name}")


def declare_quorum(node: ClusterNode, qn: str, arguments: dict | None = None) -> None:
    """queue.declare of a durable quorum queue through node, on a connection of its own."""
    on_channel(node, f"queue.declare of quorum queue {qn}",
               lambda ch: ch.queue_declare(qn, durable=True, arguments={**QUORUM, **(arguments or {})}))


def in_thread(fn: Callable, timeout: float, what: str):
    """fn() in a daemon thread, joined within timeout: its result, or its exception re-raised, or
    AssertionError if it has not returned by then. fn must use connections of its own."""
    box: dict = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            box["error"] = e
    t = threading.Thread(target=run, daemon=True, name=what[:40])
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise AssertionError(f"{what}: no answer within {timeout}s")
    if "error" in box:
        raise box["error"]
    return box.get("result")


def passive(node: ClusterNode, qn: str, timeout: float = 5.0) -> tuple:
    """("ok", message_count) | ("error", code, text) | ("connection", error) | ("no answer",) of a
    passive queue.declare through node, on a fresh connection."""
    def run():
        c = None
        try:
            c = pika.BlockingConnection(node.params())
            return ("ok", c.channel().queue_declare(qn, passive=True).method.message_count)
        except pika.exceptions.ChannelClosedByBroker as e:
            return ("error", e.reply_code, e.reply_text)
        except pika.exceptions.AMQPError as e:
            return ("connection", repr(e))
        finally:
            safe_close(c)
    try:
        return in_thread(run, timeout, "passive declare")
    except AssertionError:
        return ("no answer",)


def wait_passive(nodes: list[ClusterNode], qn: str, count: int, timeout: float = 10.0) -> None:
    """Until a passive declare through each of nodes answers declare-ok with message_count count."""
    seen: dict = {}

    def ok():
        for n in nodes:
            seen[n.name] = passive(n, qn)
        return all(v == ("ok", count) for v in seen.values())
    try:
        wait_until(ok, timeout=timeout, interval=0.1)
    except AssertionError:
        raise AssertionError(f"passive declares of {qn} did not all answer message_count={count} "
                             f"within {timeout}s; last answers: {seen}") from None


VIEW_FIELDS = ("type", "leader", "members", "node", "messages", "messages_ready",
               "messages_unacknowledged", "durable", "auto_delete", "exclusive", "arguments")


def queue_view(node: ClusterNode, qn: str) -> dict:
    """What node's management API says of queue qn (the fields these tests read), or the HTTP
    status / connection error."""
    try:
        st, body = node.api("GET", f"/api/queues/%2F/{q(qn)}", timeout=5)
    except (OSError, ValueError) as e:
        return {"error": repr(e)}
    if st != 200 or not isinstance(body, dict):
        return {"status": st, "body": body}
    return {k: body.get(k) for k in VIEW_FIELDS}


def _is_quorum_view(v: dict, members: set[str], leaders: set[str]) -> bool:
    m = v.get("members")
    return (v.get("type") == "quorum" and isinstance(m, list) and len(m) == len(set(m))
            and set(m) == members and v.get("leader") in leaders and v.get("node") == v.get("leader"))


def wait_quorum(nodes: list[ClusterNode], qn: str, members, leaders=None,
                timeout: float = 10.0) -> str:
    """Polls GET /api/queues/%2F/<qn> on each of nodes until every one says: "type": "quorum",
    "members" (as a set, no name twice) == members, "leader" one of leaders (default: any
    member), "node" == "leader", and all name the same leader. Returns the leader's node name."""
    members = set(members)
    leaders = set(leaders) if leaders is not None else members
    seen: dict = {}

    def ok():
        for n in nodes:
            seen[n.name] = queue_view(n, qn)
        views = list(seen.values())
        return (all(_is_quorum_view(v, members, leaders) for v in views)
                and len({v["leader"] for v in views}) == 1)
    try:
        wait_until(ok, timeout=timeout, interval=0.1)
    except AssertionError:
        brief = {k: {f: v.get(f) for f in ("type", "leader", "members", "node", "status", "error")
                     if f in v} for k, v in seen.items()}
        raise AssertionError(
            f"GET /api/queues/%2F/{qn} on {[n.name for n in nodes]} did not all say type 'quorum', "
            f"members {sorted(members)}, leader one of {sorted(leaders)} with node == leader (one "
            f"leader on all) within {timeout}s; last seen: {brief}") from None
    return seen[nodes[0].name]["leader"]


def wait_messages(nodes: list[ClusterNode], qn: str, messages: int, timeout: float = 10.0) -> None:
    """Until the API of each of nodes says messages == messages and messages_unacknowledged == 0
    for qn (statistics lag behind: polled)."""
    seen: dict = {}

    def ok():
        for n in nodes:
            v = queue_view(n, qn)
            seen[n.name] = {k: v.get(k) for k in ("messages", "messages_ready", "messages_unacknowledged",
                                                  "status", "error") if k in v}
        return all(v.get("messages") == messages and v.get("messages_unacknowledged") == 0
                   for v in seen.values())
    try:
        wait_until(ok, timeout=timeout, interval=0.1)
    except AssertionError:
        raise AssertionError(f"GET /api/queues/%2F/{qn} on {[n.name for n in nodes]} did not all say "
                             f"messages={messages}, messages_unacknowledged=0 within {timeout}s; "
                             f"last seen: {seen}") from None


def by_name(nodes: list[ClusterNode], name: str) -> ClusterNode:
    found = [n for n in nodes if n.name == name]
    assert found, f"the API names leader {name!r}, which is none of {[n.name for n in nodes]}"
    return found[0]


def delete_quietly(nodes: list[ClusterNode], qn: str) -> None:
    """Best effort, bounded: delete qn through the first running node (cleanup)."""
    node = next((n for n in nodes if n.running), None)
    if node is None:
        return

    def run():
        c = pika.BlockingConnection(node.params())
        try:
            c.channel().queue_delete(qn)
        finally:
            safe_close(c)
    try:
        in_thread(run, 10, f"cleanup: delete {qn}")
    except Exception:  # noqa: BLE001 - cleanup only
        pass


def index(body: bytes) -> int:
    """m-17 -> 17."""
    return int(body.rsplit(b"-", 1)[1])


class ConfirmPublisher:
    """A publisher in confirm mode on a pika SelectConnection. Its I/O loop runs only inside
    run()/wait_confirms()/close(), each bounded, so a test can wait for confirms with a deadline
    and see that none came (BlockingChannel.basic_publish waits for each confirm forever).

    Every publish gets the next delivery tag (1, 2, ...); basic.ack / basic.nack (multiple or
    not) move the tags they cover from `pending` to `acked` / `nacked` (tag -> body). A confirm
    for a tag that is not pending (twice, or never published) is kept in `bogus`; a basic.return
    (mandatory, unroutable) in `returned`; why the channel or connection closed in `closed`."""

    def __init__(self, node: ClusterNode, timeout: float = 10.0):
        self.node = node
        self.pending: dict[int, bytes] = {}
        self.acked: dict[int, bytes] = {}
        self.nacked: dict[int, bytes] = {}
        self.bogus: list[tuple[str, int, bool]] = []
        self.returned: list[bytes] = []
        self.closed: str | None = None
        self._tag = 0
        self._ch = None
        self._ready = False
        self.conn = pika.SelectConnection(node.params(), on_open_callback=self._on_open,
                                          on_open_error_callback=self._on_open_error,
                                          on_close_callback=self._on_conn_closed)
        self.run(timeout, lambda: self._ready or self.closed is not None)
        if not self._ready:
            self.close()
            raise AssertionError(f"no confirm-mode channel on {node.name} within {timeout}s: {self.closed}")

    # pika callbacks (called from inside the I/O loop)
    def _on_open(self, conn) -> None:
        conn.channel(on_open_callback=self._on_channel)

    def _on_open_error(self, conn, err) -> None:
        self.closed = f"connection failed: {err!r}"

    def _on_conn_closed(self, conn, reason) -> None:
        self.closed = self.closed or f"connection closed: {reason!r}"

    def _on_channel(self, ch) -> None:
        self._ch = ch
        ch.add_on_close_callback(self._on_ch_closed)
        ch.add_on_return_callback(lambda _ch, _m, _p, body: self.returned.append(body))
        ch.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_select_ok)

    def _on_select_ok(self, _frame) -> None:
        self._ready = True

    def _on_ch_closed(self, ch, reason) -> None:
        self.closed = self.closed or f"channel closed: {reason!r}"

    def _on_confirm(self, frame) -> None:
        m = frame.method
        kind = "ack" if isinstance(m, pika.spec.Basic.Ack) else "nack"
        into = self.acked if kind == "ack" else self.nacked
        tags = sorted(t for t in self.pending if t <= m.delivery_tag) if m.multiple else [m.delivery_tag]
        if not tags or any(t not in self.pending for t in tags):
            self.bogus.append((kind, m.delivery_tag, bool(m.multiple)))
        for t in tags:
            if t in self.pending:
                into[t] = self.pending.pop(t)

    # the test's side
    def publish(self, exchange: str, key: str, body: bytes, props=PERSISTENT, mandatory: bool = True) -> None:
        assert self.closed is None, f"publishing on a closed publisher ({self.node.name}): {self.closed}"
        self._ch.basic_publish(exchange, key, body, props, mandatory=mandatory)
        self._tag += 1
        self.pending[self._tag] = body

    def run(self, seconds: float, until: Callable[[], object] = lambda: False) -> bool:
        """Runs the I/O loop until until() is true or seconds have passed; returns until()."""
        deadline = time.monotonic() + seconds
        loop = self.conn.ioloop

        def tick():
            if until() or time.monotonic() >= deadline:
                loop.stop()
            else:
                loop.call_later(0.01, tick)
        loop.call_later(0, tick)
        loop.start()
        return bool(until())

    def wait_confirms(self, seconds: float) -> bool:
        """Until every publish is confirmed (ack or nack) or the connection is gone."""
        return self.run(seconds, lambda: not self.pending or self.closed is not None)

    def state(self) -> str:
        return (f"acked {len(self.acked)}, nacked {len(self.nacked)} (tags {sorted(self.nacked)[:10]}), "
                f"pending {len(self.pending)}, returned {len(self.returned)}, bogus confirms {self.bogus[:5]}, "
                f"closed: {self.closed}")

    def close(self) -> None:
        try:
            if self.conn.is_open:
                self.conn.close()
            if not self.conn.is_closed:
                self.run(5, lambda: self.conn.is_closed)
        except Exception:  # noqa: BLE001 - closing a connection that may be gone
            pass


def publish_confirmed(node: ClusterNode, qn: str, payloads: list[bytes], timeout: float = 30.0) -> float:
    """Publishes payloads (persistent, mandatory) to qn through node, all in flight at once, and
    asserts each is acked within timeout: no nack, no return, no other confirm. Returns the
    seconds it took."""
    t0 = time.monotonic()
    pub = ConfirmPublisher(node)
    try:
        for b in payloads:
            pub.publish("", qn, b)
        pub.wait_confirms(timeout)
        assert (len(pub.acked), pub.nacked, pub.pending, pub.returned, pub.bogus, pub.closed) == \
            (len(payloads), {}, {}, [], [], None), f"{len(payloads)} publishes to {qn} through {node.name}: {pub.state()}"
        assert [pub.acked[t] for t in sorted(pub.acked)] == payloads
    finally:
        pub.close()
    return time.monotonic() - t0


class Delivery(NamedTuple):
    body: bytes
    redelivered: bool
    delivery_mode: int | None


class Consumer:
    """basic.consume (manual ack, prefetch) of a queue through a node, in a thread of its own on a
    connection of its own: each delivery is recorded, then acked. It stops once done(deliveries)
    is true (and `settle` seconds more have passed, so that a delivery too many shows) or at the
    deadline. With retry, a refused consume or a lost connection (a leader being elected) is
    retried on a fresh connection until the deadline, and recorded in `errors`; without, it ends
    the consumer (and is in `errors` too)."""

    def __init__(self, node: ClusterNode, qn: str, done: Callable[[list[Delivery]], bool], timeout: float,
                 prefetch: int = 100, settle: float = 0.5, retry: bool = False):
        self.node, self.qn, self.done, self.timeout = node, qn, done, timeout
        self.prefetch, self.settle, self.retry = prefetch, settle, retry
        self.deliveries: list[Delivery] = []
        self.errors: list[str] = []
        self.consuming = threading.Event()  # set once a consume-ok came
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"consumer {qn}")

    def start(self) -> "Consumer":
        self._thread.start()
        return self

    def _run(self) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            conn = None
            try:
                conn = pika.BlockingConnection(self.node.params())
                ch = conn.channel()
                ch.basic_qos(prefetch_count=self.prefetch)

                def on_message(ch_, method, props, body):
                    self.deliveries.append(Delivery(body, method.redelivered, props.delivery_mode))
                    ch_.basic_ack(method.delivery_tag)
                ch.basic_consume(self.qn, on_message)
                self.consuming.set()
                while not self.done(self.deliveries) and time.monotonic() < deadline:
                    conn.process_data_events(time_limit=0.05)
                end = time.monotonic() + self.settle
                while time.monotonic() < end:
                    conn.process_data_events(time_limit=0.05)
                return
            except (pika.exceptions.AMQPError, OSError) as e:
                self.errors.append(f"{time.strftime('%H:%M:%S')} {type(e).__name__}: {e}")
                if not self.retry or time.monotonic() >= deadline:
                    return
                time.sleep(0.2)
            finally:
                safe_close(conn)

    def join(self) -> "Consumer":
        self._thread.join(self.timeout + self.settle + 15)
        if self._thread.is_alive():
            raise AssertionError(f"the consumer of {self.qn} through {self.node.name} is stuck in a pika call "
                                 f"after {len(self.deliveries)} deliveries (errors: {self.errors})")
        return self

    @property
    def bodies(self) -> list[bytes]:
        return [d.body for d in self.deliveries]


def consume(node: ClusterNode, qn: str, count: int, timeout: float = 20.0, **kw) -> Consumer:
    """A Consumer until count deliveries, joined."""
    return Consumer(node, qn, lambda ds: len(ds) >= count, timeout, **kw).start().join()


def assert_exactly_in_order(c: Consumer, want: list[bytes], where: str, redelivered_ok: bool = False) -> None:
    """The consumer got want: each once, in order, all persistent, no error; none redelivered
    unless redelivered_ok."""
    assert c.errors == [], f"{where}: consumer errors: {c.errors}"
    if c.bodies != want:
        got = [index(b) for b in c.bodies]
        missing = sorted(set(want) - set(c.bodies))
        pytest.fail(f"{where}: {len(got)} deliveries, want the {len(want)} published, once each, in order; "
                    f"missing {len(missing)} (first {[index(b) for b in missing[:10]]}); got (indices) "
                    f"{got[:40]}{' ...' if len(got) > 40 else ''}")
    redelivered = [index(d.body) for d in c.deliveries if d.redelivered]
    assert redelivered_ok or redelivered == [], \
        f"{where}: {len(redelivered)} never delivered before, yet delivered with redelivered=True: {redelivered[:20]}"
    modes = {d.delivery_mode for d in c.deliveries}
    assert modes <= {2}, f"{where}: delivery modes {modes}, want 2 (persistent)"


def check_after_failover(c: Consumer, want: list[bytes], where: str, published: list[bytes] | None = None,
                         may_return: frozenset = frozenset(), may_arrive: frozenset = frozenset()) -> list[bytes]:
    """The deliveries of a consumer started after a failover.

    want: messages the queue must still hold: each arrives (lost = 0). may_return: messages acked
    before the failover: they may come back, but only flagged redelivered. may_arrive: messages
    whose fate is open (published, never acked). A message is delivered at most once with
    redelivered=False (a duplicate is flagged redelivered); nothing outside want, may_return and
    may_arrive arrives; the deliveries with redelivered=False come in publish order (published:
    every message published to the queue, in order; default: want). Whether a message never
    delivered before may be flagged redelivered is not checked here (see
    test_never_delivered_messages_are_not_flagged_redelivered_after_failover_or_restart).
    Returns the bodies of the redelivered deliveries."""
    published = published if published is not None else want
    pos = {b: i for i, b in enumerate(published)}
    info = (f"{len(c.deliveries)} deliveries ({sum(d.redelivered for d in c.deliveries)} redelivered); "
            f"consumer errors: {c.errors}")
    got = set(c.bodies)
    lost = [index(b) for b in want if b not in got]
    assert lost == [], f"{where}: {len(lost)} confirmed messages lost (never delivered): {lost[:20]}; {info}"
    first = [d.body for d in c.deliveries if not d.redelivered]
    again = [index(b) for b in first if b in may_return]
    assert again == [], (f"{where}: messages acked before the failover delivered again with redelivered=False: "
                         f"{again[:20]} ({len(again)} in all); {info}")
    dups = sorted({index(b) for b in first if first.count(b) > 1})
    assert dups == [], f"{where}: delivered more than once with redelivered=False: {dups[:20]}; {info}"
    known = set(want) | may_return | may_arrive
    foreign = [d.body for d in c.deliveries if d.body not in known]
    assert foreign == [], f"{where}: deliveries of messages that cannot be in the queue: {foreign[:10]}; {info}"
    order = [pos[b] for b in first if b in pos]
    assert order == sorted(order), f"{where}: deliveries with redelivered=False out of publish order: {order[:60]}"
    return [d.body for d in c.deliveries if d.redelivered]


# ---------------------------------------------------------------------------------------------
# Declaring, and what the management API says


def test_non_durable_exclusive_or_auto_delete_quorum_declare_is_refused(cluster, chans, names):
    """406 with RabbitMQ's texts, through a node that is not the first, and nothing is declared
    on any node."""
    node = cluster.nodes[1]
    for props, what in ((dict(durable=False), "non-durable"), (dict(durable=True, exclusive=True), "exclusive-owner"),
                        (dict(durable=True, auto_delete=True), "auto-delete")):
        qn = names("queue", "qq-refused")
        ch = chans(node)
        e = expect_channel_error(lambda: ch.queue_declare(qn, arguments=QUORUM, **props), 406)
        assert e.reply_text == f"PRECONDITION_FAILED - invalid property '{what}' for queue '{qn}' in vhost '/'"
        for n in cluster.nodes:
            e = expect_channel_error(lambda: chans(n).queue_declare(qn, passive=True), 404)
            assert e.reply_text == f"NOT_FOUND - no queue '{qn}' in vhost '/'"


def test_api_on_every_node_shows_a_quorum_queue_with_three_members_and_its_leader(cluster, chans, names):
    """Declared through each node in turn: every node's API says type quorum, the 3 node names
    as members, one leader (a member) that is also "node", durable, not auto-delete or
    exclusive, x-queue-type in arguments; an equal redeclare through another node is ok, and a
    passive declare through every node answers 0 messages, 0 consumers."""
    everyone = {n.name for n in cluster.nodes}
    for i, node in enumerate(cluster.nodes):
        qn = names("queue", "qq-api")
        chans(node).queue_declare(qn, durable=True, arguments=QUORUM)
        wait_quorum(cluster.nodes, qn, everyone)
        for n in cluster.nodes:
            v = queue_view(n, qn)
            assert (v["durable"], v["auto_delete"], v["exclusive"], (v["arguments"] or {}).get("x-queue-type")) == \
                (True, False, False, "quorum"), f"{qn} declared through {node.name}, API of {n.name}: {v}"
        other = cluster.nodes[(i + 1) % 3]
        chans(other).queue_declare(qn, durable=True, arguments=QUORUM)
        for n in cluster.nodes:
            ok = chans(n).queue_declare(qn, passive=True).method
            assert (ok.queue, ok.message_count, ok.consumer_count) == (qn, 0, 0), n.name


def test_leader_is_on_the_declaring_node_by_default(cluster, chans, names):
    """RabbitMQ's default leader locator is client-local: a quorum queue's first leader is the
    node the client declared it through."""
    everyone = {n.name for n in cluster.nodes}
    for node in cluster.nodes:
        qn = names("queue", "qq-local")
        chans(node).queue_declare(qn, durable=True, arguments=QUORUM)
        assert wait_quorum(cluster.nodes, qn, everyone, leaders={node.name}) == node.name


def test_initial_group_size_one_has_one_member_the_declaring_node(cluster, chans, names):
    """x-quorum-initial-group-size 1, declared through b: members [b], leader b on every node's
    API; it is served through the other nodes (published through a, consumed through c)."""
    a, b, c = cluster.nodes
    qn = names("queue", "qq-one")
    chans(b).queue_declare(qn, durable=True, arguments={**QUORUM, "x-quorum-initial-group-size": 1})
    assert wait_quorum(cluster.nodes, qn, {b.name}, leaders={b.name}) == b.name
    for n in cluster.nodes:
        v = queue_view(n, qn)
        assert v["members"] == [b.name], f"API of {n.name}: {v}"
    want = bodies("m", 50)
    publish_confirmed(a, qn, want)
    assert_exactly_in_order(consume(c, qn, 50), want, f"group of 1 on {b.name}, consumed through {c.name}")


# ---------------------------------------------------------------------------------------------
# Publishing and consuming through every node


def test_confirmed_messages_reach_consumers_on_other_nodes_once_in_order(cluster, names):
    """Declared through b, published through a with confirms: 300 persistent
    messages, counted on every node (API and passive declare), are consumed (manual ack) through
    b, then 300 more through c, then 300 by one consumer on b and one on c at once; each
    consumer gets its messages once, in publish order, not redelivered; none is left."""
    a, b, c = cluster.nodes
    qn = names("queue", "qq-flow")
    declare_quorum(b, qn)
    wait_quorum(cluster.nodes, qn, {n.name for n in cluster.nodes})
    for round_, at in enumerate((b, c)):
        want = bodies(f"r{round_}", 300)
        publish_confirmed(a, qn, want)
        wait_passive(cluster.nodes, qn, 300)
        wait_messages(cluster.nodes, qn, 300)
        got = consume(at, qn, 300, prefetch=50)
        assert_exactly_in_order(got, want, f"published through {a.name}, consumed through {at.name}")
        wait_messages(cluster.nodes, qn, 0)
        wait_passive(cluster.nodes, qn, 0)

    want = bodies("both", 300)
    publish_confirmed(a, qn, want)
    consumers: list[Consumer] = []
    done = lambda _: sum(len(x.deliveries) for x in consumers) >= 300  # noqa: E731
    consumers += [Consumer(b, qn, done, 20, prefetch=10), Consumer(c, qn, done, 20, prefetch=10)]
    for x in consumers:
        x.start()
    for x in consumers:
        x.join()
    for x in consumers:
        assert x.errors == [], f"consumer through {x.node.name}: {x.errors}"
        order = [index(bd) for bd in x.bodies]
        assert order == sorted(order), f"consumer through {x.node.name} got its messages out of order: {order[:60]}"
        assert [d.redelivered for d in x.deliveries] == [False] * len(x.deliveries), x.node.name
    together = sorted(consumers[0].bodies + consumers[1].bodies, key=index)
    assert together == want, (f"two consumers got {len(together)} deliveries in all "
                              f"({[len(x.deliveries) for x in consumers]}), want the 300 once each")
    wait_messages(cluster.nodes, qn, 0)


def test_purge_delete_and_redeclare_through_other_nodes(cluster, chans, names):
    """Purge through c empties the queue on every node; delete through a removes it everywhere
    (404 on every node's API and passive declare); declared again with the same name, it is a new,
    empty quorum queue (nothing of the old one's log comes back)."""
    a, b, c = cluster.nodes
    everyone = {n.name for n in cluster.nodes}
    qn = names("queue", "qq-purge")
    chans(b).queue_declare(qn, durable=True, arguments=QUORUM)
    wait_quorum(cluster.nodes, qn, everyone)
    publish_confirmed(a, qn, bodies("p", 20))
    assert chans(c).queue_purge(qn).method.message_count == 20
    wait_passive(cluster.nodes, qn, 0)
    wait_messages(cluster.nodes, qn, 0)
    publish_confirmed(c, qn, bodies("d", 5))
    assert chans(a).queue_delete(qn).method.message_count == 5
    for n in cluster.nodes:
        e = expect_channel_error(lambda: chans(n).queue_declare(qn, passive=True), 404)
        assert e.reply_text == f"NOT_FOUND - no queue '{qn}' in vhost '/'"
        assert n.api("GET", f"/api/queues/%2F/{q(qn)}")[0] == 404, n.name
    chans(c).queue_declare(qn, durable=True, arguments=QUORUM)
    wait_quorum(cluster.nodes, qn, everyone)
    wait_passive(cluster.nodes, qn, 0)
    want = bodies("new", 3)
    publish_confirmed(b, qn, want)
    assert_exactly_in_order(consume(a, qn, 3), want, "the queue declared again")


# ---------------------------------------------------------------------------------------------
# Faults (the "lossy" cluster; every test restarts what it stopped)


def _restart(nodes: list[ClusterNode]) -> None:
    for n in nodes:
        if not n.running:
            n.start()
    for n in nodes:
        n.wait_ready()


def _stop_all_and_start(nodes: list[ClusterNode]) -> None:
    """SIGTERM to every node at once; each must exit by itself within STOP_TIMEOUT; then all start."""
    procs = [n.proc for n in nodes]
    for p in procs:
        p.send_signal(signal.SIGTERM)
    codes = {}
    for n, p in zip(nodes, procs):
        try:
            codes[n.name] = p.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            n.kill9()
            codes[n.name] = f"SIGKILLed: still running {STOP_TIMEOUT}s after SIGTERM"
    assert all(isinstance(v, int) for v in codes.values()), f"SIGTERM did not stop every node: {codes}"
    _restart(nodes)


@pytest.mark.timeout(150)
def test_leader_killed_a_new_leader_serves_every_confirmed_message(lossy):
    """500 persistent messages confirmed through a follower; the leader is SIGKILLed. Within 20 s
    the API of both survivors names a new leader (a survivor) and the queue answers through a
    survivor with 500 messages; a consumer there gets all 500 (lost = 0; with redelivered=False
    at most once each, in order; a duplicate only flagged redelivered), acks them, and the queue
    is empty.
    The killed node restarts: every node's API shows the 3 members and one leader again, and the
    restarted node serves the (empty) queue."""
    nodes = lossy.nodes
    everyone = {n.name for n in nodes}
    qn = uname("qq-leader-kill")
    try:
        declare_quorum(nodes[0], qn)
        victim = by_name(nodes, wait_quorum(nodes, qn, everyone))
        survivors = [n for n in nodes if n is not victim]
        pub_node, cons_node = survivors
        want = bodies("m", 500)
        publish_confirmed(pub_node, qn, want)
        wait_passive(nodes, qn, 500)

        victim.kill9()
        t0 = time.monotonic()
        new_leader = wait_quorum(survivors, qn, everyone, leaders={n.name for n in survivors},
                                 timeout=FAILOVER_TIMEOUT)
        # Served through a survivor, within the same 20 s.
        wait_passive([cons_node], qn, 500, timeout=max(1.0, FAILOVER_TIMEOUT - (time.monotonic() - t0)))

        got = Consumer(cons_node, qn, lambda ds: set(want) <= {d.body for d in ds}, 20,
                       settle=1.0, retry=True).start().join()
        check_after_failover(got, want, f"after {victim.name} (leader) was killed, new leader {new_leader}, "
                                        f"consumed through {cons_node.name}")
        wait_passive(survivors, qn, 0)
        wait_messages(survivors, qn, 0)

        _restart([victim])
        wait_quorum(nodes, qn, everyone, timeout=20)
        wait_passive([victim], qn, 0)
        more = bodies("after", 10)
        publish_confirmed(pub_node, qn, more)
        assert_exactly_in_order(consume(victim, qn, 10), more, f"through {victim.name} after its restart")
        wait_messages(nodes, qn, 0)
    finally:
        _restart(nodes)
        delete_quietly(nodes, qn)


@pytest.mark.timeout(150)
def test_follower_killed_publishing_and_consuming_go_on(lossy):
    """A consumer on the leader's node takes every message while 400 are published (8 batches
    of 50, confirms) through the other follower; after the 2nd batch one follower is SIGKILLed.
    Every batch is acked within 10 s, and the consumer gets the 400 once each, in order, not
    redelivered, without an error. Then 100 more are confirmed while the follower is down; it
    restarts, every node's API shows the 3 members and one leader, and the 100 are consumed
    through the restarted node: nothing was lost."""
    nodes = lossy.nodes
    everyone = {n.name for n in nodes}
    qn = uname("qq-follower-kill")
    try:
        declare_quorum(nodes[1], qn)
        leader = by_name(nodes, wait_quorum(nodes, qn, everyone))
        victim, pub_node = [n for n in nodes if n is not leader]
        want = bodies("m", 400)
        consumer = Consumer(leader, qn, lambda ds: len(ds) >= 400, 60, prefetch=50).start()
        assert consumer.consuming.wait(10), f"no consume-ok through {leader.name}: {consumer.errors}"
        pub = ConfirmPublisher(pub_node)
        try:
            for batch in range(8):
                if batch == 2:
                    victim.kill9()
                chunk = want[batch * 50:(batch + 1) * 50]
                t0 = time.monotonic()
                for b in chunk:
                    pub.publish("", qn, b)
                pub.wait_confirms(10)
                assert (len(pub.acked), pub.nacked, pub.pending, pub.returned, pub.bogus, pub.closed) == \
                    ((batch + 1) * 50, {}, {}, [], [], None), \
                    (f"batch {batch} ({'after' if batch >= 2 else 'before'} {victim.name} was killed), "
                     f"{time.monotonic() - t0:.1f}s: {pub.state()}")
        finally:
            pub.close()
        consumer.join()
        assert_exactly_in_order(consumer, want, f"consumed through {leader.name} (leader) while "
                                                f"{victim.name} (follower) was killed")
        assert wait_quorum([leader, pub_node], qn, everyone, leaders={leader.name}) == leader.name

        kept = bodies("kept", 100)
        publish_confirmed(pub_node, qn, kept)
        _restart([victim])
        wait_quorum(nodes, qn, everyone, timeout=20)
        wait_passive(nodes, qn, 100)
        assert_exactly_in_order(consume(victim, qn, 100), kept, f"through {victim.name} after its restart")
        wait_messages(nodes, qn, 0)
    finally:
        _restart(nodes)
        delete_quietly(nodes, qn)


@pytest.mark.timeout(150)
def test_acks_are_replicated_a_new_leader_does_not_deliver_acked_messages_again(lossy):
    """100 confirmed; 60 got (basic.get, manual ack) and acked through a follower, until the
    leader's API says messages=40, unacked 0; the leader is SIGKILLed. Through a survivor: all
    40 unacked messages arrive (lost = 0; once each with redelivered=False, in order); an acked
    message may come back only flagged redelivered (none with redelivered=False), and at most
    ACKED_MAY_RETURN (5) of the 60 at all. Acked there, the queue is empty, and stays so when the
    old leader restarts."""
    nodes = lossy.nodes
    everyone = {n.name for n in nodes}
    qn = uname("qq-acks")
    try:
        declare_quorum(nodes[2], qn)
        victim = by_name(nodes, wait_quorum(nodes, qn, everyone))
        survivors = [n for n in nodes if n is not victim]
        want = bodies("m", 100)
        publish_confirmed(survivors[0], qn, want)
        wait_passive(nodes, qn, 100)

        def get_and_ack():
            c = pika.BlockingConnection(survivors[1].params())
            try:
                ch = c.channel()
                got = []
                for _ in range(60):
                    m, props, body = ch.basic_get(qn, auto_ack=False)
                    assert m is not None, f"basic.get {len(got) + 1} of 60: empty"
                    got.append((m, body))
                assert [(b, m.redelivered) for m, b in got] == [(b, False) for b in want[:60]], \
                    [(index(b), m.redelivered) for m, b in got]
                ch.basic_ack(got[-1][0].delivery_tag, multiple=True)
                # Keep the channel open until the leader has the acks (closing it would requeue
                # whatever is still unacked).
                wait_messages([victim], qn, 40, timeout=10)
            finally:
                safe_close(c)
        in_thread(get_and_ack, 30, f"basic.get and ack of 60 through {survivors[1].name}")
        wait_passive(nodes, qn, 40)

        victim.kill9()
        wait_quorum(survivors, qn, everyone, leaders={n.name for n in survivors}, timeout=FAILOVER_TIMEOUT)
        unacked = want[60:]
        got = Consumer(survivors[1], qn, lambda ds: set(unacked) <= {d.body for d in ds}, 20,
                       settle=1.0, retry=True).start().join()
        acked = frozenset(want[:60])
        redelivered = check_after_failover(got, unacked, f"after {victim.name} (leader) was killed, consumed "
                                                         f"through {survivors[1].name}", published=want,
                                           may_return=acked)
        came_back = sorted({index(b) for b in redelivered if b in acked})
        assert len(came_back) <= ACKED_MAY_RETURN, \
            (f"{len(came_back)} of the 60 messages acked before {victim.name} (leader) was killed were delivered "
             f"again (redelivered): {came_back}; at most {ACKED_MAY_RETURN} may be (acks are replicated)")
        wait_passive(survivors, qn, 0)
        wait_messages(survivors, qn, 0)

        _restart([victim])
        wait_quorum(nodes, qn, everyone, timeout=20)
        wait_passive(nodes, qn, 0)
        wait_messages(nodes, qn, 0)
    finally:
        _restart(nodes)
        delete_quietly(nodes, qn)


@pytest.mark.timeout(150)
def test_whole_cluster_stopped_and_started_keeps_every_message(lossy):
    """200 persistent messages confirmed; all three nodes get SIGTERM at once (each exits by
    itself within 10 s) and are started again: the queue is a quorum queue with the 3 members
    and a leader again, counts 200 on every node, and a consumer gets the 200 once each, in
    order, persistent (the redelivered flag: see the next test)."""
    nodes = lossy.nodes
    everyone = {n.name for n in nodes}
    qn = uname("qq-restart")
    try:
        declare_quorum(nodes[0], qn)
        wait_quorum(nodes, qn, everyone)
        want = bodies("m", 200)
        publish_confirmed(nodes[1], qn, want)
        wait_passive(nodes, qn, 200)

        _stop_all_and_start(nodes)
        wait_quorum(nodes, qn, everyone, timeout=FAILOVER_TIMEOUT)
        wait_passive(nodes, qn, 200, timeout=FAILOVER_TIMEOUT)
        wait_messages(nodes, qn, 200)
        assert_exactly_in_order(consume(nodes[2], qn, 200), want, "after the whole cluster restarted",
                                redelivered_ok=True)
        wait_messages(nodes, qn, 0)
    finally:
        _restart(nodes)
        delete_quietly(nodes, qn)


@pytest.mark.timeout(150)
def test_never_delivered_messages_are_not_flagged_redelivered_after_failover_or_restart(lossy):
    """RabbitMQ flags a quorum queue's delivery redelivered only if the message was delivered
    before (its delivery count > 0, kept in the replicated state). 20 confirmed, never delivered;
    the leader is SIGKILLed: 10 got (basic.get, ack) through a survivor have redelivered=False;
    the node restarts, then the whole cluster is stopped (SIGTERM) and started: the other 10 have
    redelivered=False too."""
    nodes = lossy.nodes
    everyone = {n.name for n in nodes}
    qn = uname("qq-flag")
    try:
        declare_quorum(nodes[1], qn)
        victim = by_name(nodes, wait_quorum(nodes, qn, everyone))
        survivors = [n for n in nodes if n is not victim]
        want = bodies("m", 20)
        publish_confirmed(survivors[0], qn, want)
        wait_passive(nodes, qn, 20)

        def get(node: ClusterNode, n: int) -> list[tuple[bytes, bool]]:
            """basic.get (manual ack) of n messages through node, retried on a fresh connection
            while the queue is not served (a leader being elected)."""
            def run():
                out: list[tuple[bytes, bool]] = []
                errors: list[str] = []
                deadline = time.monotonic() + FAILOVER_TIMEOUT
                while len(out) < n:
                    c = None
                    try:
                        c = pika.BlockingConnection(node.params())
                        ch = c.channel()
                        while len(out) < n:
                            m, _, body = ch.basic_get(qn, auto_ack=False)
                            if m is None:
                                assert time.monotonic() < deadline, f"got {len(out)} of {n} (errors {errors})"
                                time.sleep(0.05)
                                continue
                            ch.basic_ack(m.delivery_tag)
                            out.append((body, m.redelivered))
                    except pika.exceptions.AMQPError as e:
                        errors.append(repr(e))
                        assert time.monotonic() < deadline, f"got {len(out)} of {n}; errors {errors[-3:]}"
                        time.sleep(0.2)
                    finally:
                        safe_close(c)
                return out
            return in_thread(run, FAILOVER_TIMEOUT + 10, f"basic.get of {n} through {node.name}")

        victim.kill9()
        wait_quorum(survivors, qn, everyone, leaders={n.name for n in survivors}, timeout=FAILOVER_TIMEOUT)
        after_failover = get(survivors[1], 10)
        _restart([victim])
        wait_quorum(nodes, qn, everyone, timeout=FAILOVER_TIMEOUT)
        _stop_all_and_start(nodes)
        wait_quorum(nodes, qn, everyone, timeout=FAILOVER_TIMEOUT)
        after_restart = get(nodes[0], 10)

        assert [b for b, _ in after_failover + after_restart] == want, \
            [index(b) for b, _ in after_failover + after_restart]
        flagged = {"after the leader was killed": [index(b) for b, r in after_failover if r],
                   "after the whole cluster restarted": [index(b) for b, r in after_restart if r]}
        assert flagged == {k: [] for k in flagged}, \
            f"messages never delivered before, delivered with redelivered=True: {flagged}"
        wait_passive(nodes, qn, 0)
    finally:
        _restart(nodes)
        delete_quietly(nodes, qn)


@pytest.mark.timeout(150)
def test_publish_without_a_majority_is_not_confirmed_then_the_queue_recovers(lossy):
    """50 messages confirmed; both followers SIGKILLed; 10 publishes through the leader's node
    get no basic.ack within 5 s (a nack, or no answer, is what RabbitMQ gives: the log entry
    cannot be committed). The followers restart; the queue has 3 members and a leader again; a
    consumer gets the 50 and every one of the 10 that was acked meanwhile (a late ack); one never
    acked may arrive or not; none with redelivered=False twice, in publish order. Every publish
    left pending is answered (ack or nack) once there is a majority again. Then messages
    confirmed through each node arrive through another."""
    nodes = lossy.nodes
    everyone = {n.name for n in nodes}
    qn = uname("qq-no-majority")
    try:
        declare_quorum(nodes[0], qn)
        leader = by_name(nodes, wait_quorum(nodes, qn, everyone))
        down = [n for n in nodes if n is not leader]
        before = bodies("before", 50)
        publish_confirmed(down[0], qn, before)
        wait_passive(nodes, qn, 50)

        pub = ConfirmPublisher(leader)
        limbo = bodies("limbo", 10)
        try:
            for n in down:
                n.kill9()
            t0 = time.monotonic()
            for b in limbo:
                pub.publish("", qn, b)
            pub.run(NO_MAJORITY_WAIT, lambda: pub.acked)
            assert pub.acked == {}, (f"acked within {time.monotonic() - t0:.1f}s although 2 of 3 members "
                                     f"({[n.name for n in down]}) are down: {pub.state()}")
            assert pub.bogus == [] and pub.returned == [], pub.state()
            nacked_early = sorted(pub.nacked)

            _restart(down)
            # With a majority again, every publish still pending is answered: acked (committed
            # at last) or nacked; an open channel never leaves one unconfirmed.
            pub.wait_confirms(FAILOVER_TIMEOUT)
            assert pub.bogus == [] and pub.returned == [], pub.state()
            assert pub.pending == {} or pub.closed is not None, \
                f"publishes still unconfirmed {FAILOVER_TIMEOUT}s after the majority came back: {pub.state()}"
            late_acked = [pub.acked[t] for t in sorted(pub.acked)]
            state = pub.state()
        finally:
            pub.close()

        wait_quorum(nodes, qn, everyone, timeout=FAILOVER_TIMEOUT)
        must = before + late_acked
        got = Consumer(down[0], qn, lambda ds: set(must) <= {d.body for d in ds}, FAILOVER_TIMEOUT,
                       settle=1.0, retry=True).start().join()
        where = (f"after 2 of 3 members were down (early nacks: tags {nacked_early}; then {state}), "
                 f"consumed through {down[0].name}")
        check_after_failover(got, must, where, published=before + limbo,
                             may_arrive=frozenset(limbo) - set(late_acked))
        wait_passive(nodes, qn, 0)

        for i, via in enumerate(nodes):
            at = nodes[(i + 1) % 3]
            fresh = bodies(f"again{i}", 5)
            publish_confirmed(via, qn, fresh)
            assert_exactly_in_order(consume(at, qn, 5), fresh, f"published through {via.name}, consumed "
                                                               f"through {at.name}, after the recovery")
        wait_messages(nodes, qn, 0)
    finally:
        _restart(nodes)
        delete_quietly(nodes, qn)


# ---------------------------------------------------------------------------------------------
# Delivery limit, mirrored classic queues, member changes, the fault checker


def _ctl(node: ClusterNode, *args: str) -> subprocess.CompletedProcess:
    from cluster_harness import BIN
    return subprocess.run([BIN, "ctl", "--url", f"http://127.0.0.1:{node.http_port}", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("strategy", ["at-most-once", "at-least-once"])
def test_a_dead_letter_cycle_is_cut_on_a_replicated_queue(cluster, chans, names, strategy):
    """RabbitMQ 3.10's cycle rule on a 3-member quorum queue led by a, used through b: its
    expired message goes to its dead-letter exchange, which routes back to it and to a classic
    observer on c. The observer gets the published copy and the dead letter; the quorum queue
    does not get its own dead letter back (the rule itself is checked against RabbitMQ in
    test_dead_letter_routing.py)."""
    a, b, c = cluster.nodes
    qn, observer = names("queue", "qq-cycle"), names("queue", "qq-cycle-obs")
    dlx = names("exchange", "qq-cycle-dlx")
    chans(a).exchange_declare(dlx, "fanout", durable=True)
    chans(c).queue_declare(observer, durable=True)
    chans(a).queue_declare(qn, durable=True, arguments={
        **QUORUM, "x-message-ttl": 50, "x-dead-letter-exchange": dlx,
        "x-dead-letter-strategy": strategy, "x-overflow": "reject-publish"})
    assert wait_quorum(cluster.nodes, qn, {n.name for n in cluster.nodes}, leaders={a.name}) == a.name
    for n in (qn, observer):
        chans(b).queue_bind(n, dlx)
    chans(b).confirm_delivery()
    chans(b).basic_publish(dlx, "k", b"loop", pika.BasicProperties(delivery_mode=2))
    wait_passive([c], observer, 2, timeout=10)
    time.sleep(1.5)  # a cycle that was not cut goes round every 50 ms
    wait_passive([a, b], qn, 0, timeout=5)
    assert passive(c, observer) == ("ok", 2)


def test_delivery_limit_is_kept_through_a_node_that_does_not_lead(cluster, chans, names):
    """x-delivery-limit 1 on a queue led by a, used through b: the message comes back once
    (x-delivery-count 1, redelivered), and the next return dead-letters it (reason
    delivery_limit) into a classic queue on c."""
    a, b, c = cluster.nodes
    qn, dlq = names("queue", "qq-limit"), names("queue", "qq-dlq")
    chans(c).queue_declare(dlq, durable=True)
    chans(a).queue_declare(qn, durable=True, arguments={
        **QUORUM, "x-delivery-limit": 1, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    assert wait_quorum(cluster.nodes, qn, {n.name for n in cluster.nodes}, leaders={a.name}) == a.name
    publish_confirmed(b, qn, [b"m"])
    ch = chans(b)
    seen = []
    deadline = time.time() + 10
    while len(seen) < 2 and time.time() < deadline:
        m = ch.basic_get(qn)
        if m[0] is None:
            time.sleep(0.05)
            continue
        seen.append((m[2], m[0].redelivered, (m[1].headers or {}).get("x-delivery-count")))
        ch.basic_nack(m[0].delivery_tag, requeue=True)
    assert seen == [(b"m", False, 0), (b"m", True, 1)], seen
    ch2 = chans(c)
    dead = (None, None, None)
    deadline = time.time() + 10
    while dead[0] is None and time.time() < deadline:
        dead = ch2.basic_get(dlq, auto_ack=True)
        time.sleep(0.05)
    assert dead[2] == b"m", "dead-lettered after its second return"
    assert dead[1].headers["x-death"][0]["reason"] == "delivery_limit"
    assert ch.basic_get(qn)[0] is None, "gone from the quorum queue"


def test_an_ha_policy_replicates_a_classic_queue(lossy, chans):
    """A classic queue matched by a policy with ha-mode exactly 2 at declare time is replicated
    on 3 nodes (a group of 2 could not survive the loss of one): the API lists it as classic
    with its leader and 2 slave_nodes; its leader killed, every confirmed message is served by
    another node."""
    a, b, c = lossy.nodes
    qn = f"ha.{uname('q')}"
    st, body = a.api("PUT", "/api/policies/%2F/ha-two", {
        "pattern": r"^ha\.", "definition": {"ha-mode": "exactly", "ha-params": 2}, "apply-to": "queues"})
    assert st in (201, 204), body
    try:
        chans(a).queue_declare(qn, durable=True)
        seen: dict = {}

        def listed():
            v = a.api("GET", f"/api/queues/%2F/{q(qn)}")[1] or {}
            seen.update(v)
            return (v.get("type") == "classic" and v.get("leader") == a.name
                    and sorted(v.get("slave_nodes") or []) == sorted([b.name, c.name]))
        wait_until(listed, timeout=10, interval=0.1,
                   what=f"{qn} listed as classic, led by {a.name}, mirrored on {b.name} and {c.name}")
        want = bodies("ha", 100)
        publish_confirmed(b, qn, want)
        a.kill9()
        try:
            def served():
                v = b.api("GET", f"/api/queues/%2F/{q(qn)}")[1] or {}
                return v.get("leader") in (b.name, c.name) and v.get("messages") == 100
            wait_until(served, timeout=FAILOVER_TIMEOUT, interval=0.1)
            got = consume(c, qn, 100)
            assert sorted(got.bodies, key=index) == want, "every confirmed message, once"
        finally:
            a.start()
            a.wait_ready()
    finally:
        a.api("DELETE", "/api/policies/%2F/ha-two")
        delete_quietly(lossy.nodes, qn)


def test_members_are_added_and_removed_with_ctl(cluster, chans, names):
    """A queue of one member (a) grows with `warren ctl add_member` and `grow`; the new members
    get its messages; `delete_member` and `shrink` take members out (their replica files go)
    and the queue keeps every message through the remaining one."""
    a, b, c = cluster.nodes
    qn = names("queue", "qq-members")
    chans(a).queue_declare(qn, durable=True, arguments={**QUORUM, "x-quorum-initial-group-size": 1})
    assert wait_quorum(cluster.nodes, qn, {a.name}, leaders={a.name}) == a.name
    want = bodies("mb", 60)
    publish_confirmed(a, qn, want[:30])
    r = _ctl(c, "add_member", qn, b.name)
    assert r.returncode == 0, r.stderr
    r = _ctl(c, "grow", c.name, "all", "--queue-pattern", f"^{qn}$")
    assert r.returncode == 0 and f"{qn}\t3\tok" in r.stdout, (r.stdout, r.stderr)
    wait_quorum(cluster.nodes, qn, {a.name, b.name, c.name}, leaders={a.name})
    publish_confirmed(b, qn, want[30:])
    r = _ctl(b, "delete_member", qn, a.name)
    assert r.returncode == 0, r.stderr
    leader = wait_quorum(cluster.nodes, qn, {b.name, c.name}, timeout=FAILOVER_TIMEOUT)
    r = _ctl(a, "shrink", leader)
    assert r.returncode == 0 and f"{qn}\t1\tok" in r.stdout, (r.stdout, r.stderr)
    rest = ({b.name, c.name} - {leader}).pop()
    wait_quorum(cluster.nodes, qn, {rest}, timeout=FAILOVER_TIMEOUT)
    assert_exactly_in_order(consume(a, qn, 60), want, f"after the members changed (left: {rest})",
                            redelivered_ok=True)
    r = _ctl(a, "delete_member", qn, rest)
    assert r.returncode != 0 and "last member" in r.stderr, (r.stdout, r.stderr)


def test_the_fault_checker_short_run_loses_nothing():
    """bench/faults/checker.py --short: a fresh cluster, publishers with confirms and consumers
    with manual acks through every node while the leader is killed (-9) and a node paused;
    then every node is restarted and the queue drained. Exit 0: no confirmed message lost, every
    repeated delivery flagged redelivered, every node and replica back."""
    import os
    import sys
    from cluster_harness import BIN
    here = os.path.dirname(os.path.abspath(__file__))
    checker = os.path.join(here, "..", "..", "..", "bench", "faults", "checker.py")
    r = subprocess.run([sys.executable, checker, "--short", "--bin", BIN], capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, f"checker failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"


def test_publishers_on_a_node_that_does_not_lead_are_credited(cluster, names):
    """20,000 confirmed publishes through b to a queue led by a, from `warren perf`: more than
    the 8,192 a node may have outstanding to a queue, so they go through only if the leader's
    publish credit reaches b's handle of the queue (without it they trickle at ~100 msg/s)."""
    from cluster_harness import BIN
    a, b, _ = cluster.nodes
    qn = names("queue", "qq-credit")
    declare_quorum(a, qn)
    wait_quorum(cluster.nodes, qn, {n.name for n in cluster.nodes}, leaders={a.name})
    r = subprocess.run([BIN, "perf", "-h", f"amqp://guest:guest@127.0.0.1:{b.amqp_port}/%2f", "-u", qn,
                        "-qq", "-p", "-x", "1", "-y", "0", "-s", "100", "-c", "2000", "-C", "20000",
                        "-z", "60"], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "confirmed 20000, nacked 0" in r.stdout, r.stdout[-2000:]
    wait_messages(cluster.nodes, qn, 20000, timeout=20)


def test_x_expires_deletes_an_unused_quorum_queue_everywhere(cluster, chans, names):
    """x-expires 1000 on a quorum queue declared through b: unused, it is gone from every
    node's API within a few seconds (its leader's sweeper decides, the metadata deletes it)."""
    _, b, _ = cluster.nodes
    qn = names("queue", "qq-expires")
    chans(b).queue_declare(qn, durable=True, arguments={**QUORUM, "x-expires": 1000})

    def gone():
        return all(n.api("GET", f"/api/queues/%2F/{q(qn)}")[0] == 404 for n in cluster.nodes)
    wait_until(gone, timeout=10, interval=0.2, what=f"{qn} deleted by x-expires on every node")


# ---------------------------------------------------------------------------------------------
# A backlog lives in the log (issue 16, item 3): the leader keeps 16,384 messages / 8 MiB in
# memory and reads the rest back from the group's Raft log; replicas hold no bodies.

BACKLOG_BODY = 4096


def big_bodies(prefix: str, n: int, size: int) -> list[bytes]:
    """n bodies of size bytes, each ending in -<prefix>-<i> (so index() reads i)."""
    return [f"-{prefix}-{i}".encode().rjust(size, b".") for i in range(n)]


def rss_mb(node: ClusterNode) -> float:
    with open(f"/proc/{node.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def quorum_disk_mb(node: ClusterNode) -> float:
    total = 0
    for root, _, files in os.walk(os.path.join(node.data_dir, "quorum")):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total / (1 << 20)


class Taken:
    """Exactly count messages consumed (prefetch 1, manual ack) through a node, on a connection of
    its own: the last one is acked only after basic.cancel, so no message beyond count is ever
    delivered. A refused consume or a lost connection (a leader being elected) is retried on a
    fresh connection until timeout. (Not basic.get: a get's claim is replicated after it, so a
    get just before a failover may come back unflagged; see docs/clustering.md.)"""

    def __init__(self, node: ClusterNode, qn: str, count: int, timeout: float = 60.0):
        self.deliveries: list[Delivery] = []
        self.errors: list[str] = []

        def run():
            deadline = time.monotonic() + timeout
            while len(self.deliveries) < count and time.monotonic() < deadline:
                c = None
                try:
                    c = pika.BlockingConnection(node.params())
                    ch = c.channel()
                    ch.basic_qos(prefetch_count=1)

                    def on_message(ch_, method, props, body):
                        self.deliveries.append(Delivery(body, method.redelivered, props.delivery_mode))
                        if len(self.deliveries) >= count:
                            ch_.basic_cancel(method.consumer_tag)
                        ch_.basic_ack(method.delivery_tag)
                    ch.basic_consume(qn, on_message)
                    while len(self.deliveries) < count and time.monotonic() < deadline:
                        c.process_data_events(time_limit=0.05)
                except (pika.exceptions.AMQPError, OSError) as e:
                    self.errors.append(f"{time.strftime('%H:%M:%S')} {type(e).__name__}: {e}")
                    time.sleep(0.2)
                finally:
                    safe_close(c)
        in_thread(run, timeout + 15, f"{count} deliveries from {qn} through {node.name}")

    @property
    def bodies(self) -> list[bytes]:
        return [d.body for d in self.deliveries]


@pytest.mark.timeout(240)
def test_a_backlog_lives_in_the_log_through_failover_and_restart(lossy):
    """25,000 confirmed messages of 4 KiB (100 MiB): every node's RSS grows by less than 60 MB
    (a replica holding bodies would grow by 100, the leader by 200) and each node's group
    directory holds them. 1,000 are consumed through a follower (in order, not redelivered); the
    leader is SIGKILLed; a survivor serves the rest (lost = 0, read back from its log, in order);
    2,000 more are consumed, then the whole cluster is stopped and started: the remaining 22,000
    come back in order, once each."""
    nodes = lossy.nodes
    everyone = {n.name for n in nodes}
    qn = uname("qq-backlog")
    n = 25_000
    try:
        declare_quorum(nodes[0], qn)
        leader = by_name(nodes, wait_quorum(nodes, qn, everyone))
        followers = [x for x in nodes if x is not leader]
        base = {x.name: rss_mb(x) for x in nodes}
        want = big_bodies("b", n, BACKLOG_BODY)
        publish_confirmed(followers[0], qn, want, timeout=120)
        wait_passive(nodes, qn, n, timeout=30)
        # Freed memory goes back to the system within seconds (jemalloc's decay): polled.
        grown: dict = {}

        def small():
            grown.update({x.name: round(rss_mb(x) - base[x.name]) for x in nodes})
            return all(g < 60 for g in grown.values())
        try:
            wait_until(small, timeout=30, interval=1)
        except AssertionError:
            raise AssertionError(f"RSS grew (MB) by {grown} for a {n * BACKLOG_BODY >> 20} MiB backlog, "
                                 f"30 s after it was published: bodies held in memory") from None
        disk = {x.name: round(quorum_disk_mb(x)) for x in nodes}
        assert all(d >= 95 for d in disk.values()), f"the groups' logs hold the bodies: {disk} MB"

        first = Taken(followers[1], qn, 1000)
        assert first.bodies == want[:1000], \
            f"the first 1,000 through {followers[1].name}: {[index(b) for b in first.bodies[:20]]}; {first.errors}"
        assert not any(d.redelivered for d in first.deliveries)

        leader.kill9()
        wait_quorum(followers, qn, everyone, leaders={x.name for x in followers}, timeout=FAILOVER_TIMEOUT)
        # Acks the killed leader had not replicated may bring a few of the first 1,000 back,
        # flagged redelivered, and messages it had claimed for delivery come flagged too (at
        # most a claim window); every one of the next 2,000 arrives, read back from the new
        # leader's log, the first deliveries in publish order.
        second = Taken(followers[0], qn, 2600)
        second.errors = []  # consumers of the killed leader are cancelled: retried, as intended
        check_after_failover(second, want[1000:3000], f"after {leader.name} (leader) was killed",
                             published=want, may_return=frozenset(want[:1000]),
                             may_arrive=frozenset(want[3000:3600]))
        got = set(second.bodies)
        rest = [b for b in want[1000:] if b not in got]
        _restart([leader])
        _stop_all_and_start(nodes)
        wait_quorum(nodes, qn, everyone, timeout=FAILOVER_TIMEOUT)
        wait_passive(nodes, qn, len(rest), timeout=FAILOVER_TIMEOUT)
        last = consume(nodes[2], qn, len(rest), timeout=120)
        assert_exactly_in_order(last, rest, "after the whole cluster restarted", redelivered_ok=True)
        wait_messages(nodes, qn, 0)
    finally:
        _restart(nodes)
        delete_quietly(nodes, qn)


@pytest.mark.timeout(150)
def test_purging_a_paged_backlog_is_replicated(lossy):
    """20,000 confirmed messages of 1 KiB (most in the leader's log-backed tail) are purged
    through a follower: purge-ok counts 20,000, every node says 0, and after the leader is
    SIGKILLed the new leader still holds none (the purge was replicated, as runs of ids); 10 new
    messages are then all a consumer gets."""
    nodes = lossy.nodes
    everyone = {n.name for n in nodes}
    qn = uname("qq-purge-tail")
    n = 20_000
    try:
        declare_quorum(nodes[0], qn)
        leader = by_name(nodes, wait_quorum(nodes, qn, everyone))
        followers = [x for x in nodes if x is not leader]
        publish_confirmed(followers[0], qn, big_bodies("p", n, 1024), timeout=90)
        wait_passive(nodes, qn, n, timeout=30)

        purged = on_channel(followers[1], "queue.purge", lambda ch: ch.queue_purge(qn).method.message_count)
        assert purged == n
        wait_passive(nodes, qn, 0)

        leader.kill9()
        wait_quorum(followers, qn, everyone, leaders={x.name for x in followers}, timeout=FAILOVER_TIMEOUT)
        wait_passive(followers, qn, 0, timeout=FAILOVER_TIMEOUT)
        more = bodies("after", 10)
        publish_confirmed(followers[0], qn, more)
        assert_exactly_in_order(consume(followers[1], qn, 10), more, "after the purge and a failover")
    finally:
        _restart(nodes)
        delete_quietly(nodes, qn)


@pytest.mark.timeout(120)
def test_a_paged_backlog_still_expires(cluster, names):
    """x-message-ttl 2 s on a quorum queue; 20,000 confirmed messages of 1 KiB, most of them in
    the leader's log-backed tail: within 15 s of the publish every node counts 0."""
    nodes = cluster.nodes
    qn = names("queue", "qq-ttl-tail")
    declare_quorum(nodes[0], qn, {"x-message-ttl": 2000})
    wait_quorum(nodes, qn, {x.name for x in nodes})
    publish_confirmed(nodes[1], qn, big_bodies("t", 20_000, 1024), timeout=90)
    wait_passive(nodes, qn, 0, timeout=15)


# ---------------------------------------------------------------------------------------------
# At-least-once dead-lettering (x-dead-letter-strategy, RabbitMQ 3.10's quorum queues)


@pytest.mark.timeout(150)
def test_at_least_once_dead_letters_wait_for_a_route_through_a_failover(lossy):
    """Two quorum queues with x-message-ttl 300 and a dead-letter exchange that does not exist
    yet: one with x-dead-letter-strategy at-least-once (and x-overflow reject-publish, which it
    needs), one at-most-once. 50 confirmed messages each expire unroutable. The leader is
    SIGKILLed; the exchange and a queue for each are declared afterwards: the at-least-once
    queue's 50 all reach their dead-letter queue (kept by the group, sent again by the new
    leader), with x-death reason expired, and no more come once they did; the at-most-once
    queue's were dropped, as RabbitMQ drops unroutable dead letters."""
    nodes = lossy.nodes
    everyone = {n.name for n in nodes}
    src, lax = uname("qq-dlx-alo"), uname("qq-dlx-amo")
    dlx = uname("dlx")
    dlq, dlq_lax = uname("qq-dlq"), uname("qq-dlq-amo")
    made = [src, lax, dlq, dlq_lax]
    try:
        base = {"x-message-ttl": 300, "x-dead-letter-exchange": dlx, "x-overflow": "reject-publish"}
        declare_quorum(nodes[0], src, {**base, "x-dead-letter-strategy": "at-least-once"})
        declare_quorum(nodes[0], lax, base)
        leader = by_name(nodes, wait_quorum(nodes, src, everyone))
        wait_quorum(nodes, lax, everyone)
        survivors = [n for n in nodes if n is not leader]
        want = bodies("d", 50)
        publish_confirmed(survivors[0], src, want)
        publish_confirmed(survivors[0], lax, bodies("lax", 50))
        wait_passive(nodes, src, 0)  # expired: they left the queue's ready messages
        wait_passive(nodes, lax, 0)
        time.sleep(1.5)  # retried (unroutable) at least once before the kill

        leader.kill9()
        wait_quorum(survivors, src, everyone, leaders={n.name for n in survivors}, timeout=FAILOVER_TIMEOUT)
        on_channel(survivors[1], f"exchange.declare {dlx}",
                   lambda ch: ch.exchange_declare(dlx, "direct", durable=True))
        declare_quorum(survivors[1], dlq)
        declare_quorum(survivors[1], dlq_lax)
        for q_, key in ((dlq, src), (dlq_lax, lax)):
            on_channel(survivors[1], f"queue.bind {q_}", lambda ch: ch.queue_bind(q_, dlx, key))

        got = Consumer(survivors[0], dlq, lambda ds: set(want) <= {d.body for d in ds}, 30,
                       retry=True).start().join()
        assert set(want) <= set(got.bodies), \
            f"dead letters kept through the failover: {len(set(got.bodies) & set(want))} of 50 arrived"
        assert set(got.bodies) <= set(want)
        # Settled once their target had them: not sent again.
        time.sleep(3)
        wait_passive(survivors, dlq, 0)

        def x_death(ch):
            ch.basic_publish("", src, b"probe", pika.BasicProperties(delivery_mode=2))
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                m, props, _ = ch.basic_get(dlq, auto_ack=True)
                if m is not None:
                    return props.headers
                time.sleep(0.1)
        headers = on_channel(survivors[0], "a dead letter's headers", x_death, timeout=30)
        assert headers and headers["x-death"][0]["reason"] == "expired", headers
        assert headers["x-first-death-queue"] == src

        lax_got = passive(survivors[0], dlq_lax)
        assert lax_got == ("ok", 0), f"at-most-once dead letters that were unroutable are dropped: {lax_got}"
    finally:
        _restart(nodes)
        for qn in made:
            delete_quietly(nodes, qn)
