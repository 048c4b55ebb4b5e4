"""Replicated streams in a 3-node cluster (issue 35, item 1): a stream declared in a cluster is
a Raft group over `x-initial-cluster-size` members (default 3), each holding a copy of its
segments; a publish is confirmed once a majority holds it, every member numbers the same
messages with the same offsets, and a consumer on any member reads its local copy.

* Declared through any node: members and leader in the management API, every node agrees.
* Published through every node (confirms), consumed from every node from `first`: the same
  messages at the same offsets everywhere, in one order, and the members' segment files equal.
* The leader killed (kill -9) under confirmed publishing: a new leader, no confirmed message
  lost, no offset given twice; the killed node, restarted, catches up and agrees again.
* `x-initial-cluster-size: 2` makes a stream of two members; the third node, no member (no
  Raft group of its own), publishes through them and reads a read copy fed from theirs.
* A member's copy deleted while it was down is fetched again from the others' segments.
* Deleting the stream removes every member's files.
* `warren ctl add_replica` / `delete_replica`: new members fetch what the group's snapshots
  cut from the Raft logs; a member removed keeps a read copy.
* The stream protocol (rstream): a node's metadata names the leader and the replicas on their
  own stream ports; the producer publishes on the leader, the consumer reads from a replica.

Warren only (WARREN_BIN): starts its own cluster and kills its nodes.
"""

from __future__ import annotations

import asyncio
import glob
import hashlib
import os
import subprocess
import time

import pika
import pika.exceptions
import pytest
from rstream import (AMQPMessage, Consumer, ConsumerOffsetSpecification, MessageContext,
                     OffsetType, Producer, amqp_decoder)

from cluster_harness import (_cluster, _mark_logs, _node_logs, needs_warren_bin,  # noqa: F401
                             publish_until_confirmed, q)
from helpers import safe_close, uname, wait_until

pytestmark = [needs_warren_bin, pytest.mark.timeout(240)]

STREAM = {"x-queue-type": "stream"}


@pytest.fixture(scope="module")
def streams():
    yield from _cluster("streams", stream=True)


def queue_info(node, qn: str) -> dict:
    st, body = node.api("GET", f"/api/queues/%2F/{q(qn)}")
    return body if st == 200 and isinstance(body, dict) else {}


def leader_of(node, qn: str) -> str | None:
    return queue_info(node, qn).get("leader")


def queues_dir(node) -> str:
    """Where vhost '/' keeps its queues' files on `node`."""
    return os.path.join(node.data_dir, "vhosts", "2f", "queues")


def stream_dirs(node) -> set[str]:
    """The names of the replicated streams' directories on `node` (`queues/<group>/`, with the
    group's Raft state in `group/`)."""
    return {os.path.basename(os.path.dirname(p))
            for p in glob.glob(os.path.join(queues_dir(node), "*", "group"))}


def declare(node, qn: str, arguments: dict | None = None) -> str:
    """Declares stream `qn` through `node`; returns its directory's name (`queues/<name>` on
    every member)."""
    before = stream_dirs(node)
    conn = pika.BlockingConnection(node.params())
    conn.channel().queue_declare(qn, durable=True, arguments={**STREAM, **(arguments or {})})
    safe_close(conn)
    found: list[str] = []

    def appeared() -> bool:
        found[:] = sorted(stream_dirs(node) - before)
        return len(found) == 1
    wait_until(appeared, timeout=15, what=f"the stream's directory on {node.name}")
    return found[0]


def read_all(node, qn: str, want: int, timeout: float = 30.0) -> list[tuple[int, bytes]]:
    """(offset, body) of every message from `first`, once at least `want` have arrived."""
    conn = pika.BlockingConnection(node.params())
    ch = conn.channel()
    ch.basic_qos(prefetch_count=500)
    got: list[tuple[int, bytes]] = []

    def on_message(chan, method, props, body):
        got.append((props.headers["x-stream-offset"], body))
        chan.basic_ack(method.delivery_tag)

    ch.basic_consume(qn, on_message, arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.2)
    # Anything more that is there (a duplicate of a retried publish) arrives too.
    conn.process_data_events(time_limit=0.5)
    safe_close(conn)
    return got


def segment_digests(node, d: str) -> dict[str, str]:
    """The SHA-256 of each segment file of the stream in `queues/<d>` on `node`."""
    out = {}
    for path in sorted(glob.glob(os.path.join(queues_dir(node), d, "*.seg"))):
        with open(path, "rb") as f:
            out[os.path.basename(path)] = hashlib.sha256(f.read()).hexdigest()
    return out


def test_a_stream_is_replicated_on_three_members_and_reads_the_same_everywhere(streams):
    a, b, c = streams.nodes
    qn = uname("rs")
    # Declared through b, which is then its first member (as a quorum queue's leader is placed).
    d = declare(b, qn)
    for n in (a, b, c):
        wait_until(lambda n=n: leader_of(n, qn) is not None, timeout=15,
                   what=f"{n.name} to name the stream's leader")
    info = queue_info(a, qn)
    assert info["type"] == "stream"
    assert sorted(info["members"]) == sorted(n.name for n in streams.nodes)
    assert len({leader_of(n, qn) for n in (a, b, c)}) == 1, "every node names one leader"

    sent = []
    for i, n in enumerate((a, b, c)):
        bodies = [f"{n.name}-{k}".encode() for k in range(40)]
        publish_until_confirmed(n, qn, bodies)
        sent += bodies
    copies = {n.name: read_all(n, qn, len(sent)) for n in (a, b, c)}
    first = copies[a.name]
    assert sorted(body for _, body in first) == sorted(sent)
    assert [o for o, _ in first] == list(range(len(sent))), "offsets are dense from 0"
    for name, got in copies.items():
        assert got == first, f"{name} reads the same messages at the same offsets"
    # Per publisher, the order it published in.
    for n in (a, b, c):
        mine = [body for _, body in first if body.startswith(n.name.encode() + b"-")]
        assert mine == [f"{n.name}-{k}".encode() for k in range(40)]
    # The same chunks, so the same segment files.
    assert segment_digests(a, d), "the stream has segment files"
    wait_until(lambda: len({tuple(segment_digests(n, d).items()) for n in (a, b, c)}) == 1,
               timeout=10, what="every member's segment files to be the same")


def test_the_leader_killed_loses_no_confirmed_message_and_reuses_no_offset(streams):
    nodes = streams.nodes
    qn = uname("rsk")
    d = declare(nodes[0], qn)
    wait_until(lambda: leader_of(nodes[0], qn) is not None, timeout=15, what="a leader")
    before = [f"before-{k}".encode() for k in range(100)]
    publish_until_confirmed(nodes[1], qn, before)
    leader = next(n for n in nodes if n.name == leader_of(nodes[0], qn))
    others = [n for n in nodes if n is not leader]
    leader.kill9()
    try:
        after = [f"after-{k}".encode() for k in range(100)]
        publish_until_confirmed(others[0], qn, after[:50])
        publish_until_confirmed(others[1], qn, after[50:])
        wait_until(lambda: leader_of(others[0], qn) in {o.name for o in others}, timeout=20,
                   what="a new leader among the survivors")
        for n in others:
            got = read_all(n, qn, len(before) + len(after))
            offsets = [o for o, _ in got]
            assert offsets == list(range(len(got))), f"{n.name}: dense offsets, none given twice"
            bodies_read = [body for _, body in got]
            assert set(before + after) <= set(bodies_read), f"{n.name}: a confirmed message lost"
            assert [x for x in bodies_read if x.startswith(b"before-")][:100] == before
    finally:
        leader.start()
        leader.wait_ready()
    # The restarted member catches up: the same copy as the others.
    want = read_all(others[0], qn, 200)
    wait_until(lambda: read_all(leader, qn, len(want), timeout=5) == want, timeout=30,
               what=f"{leader.name} to catch up with the others")
    wait_until(lambda: len({tuple(segment_digests(n, d).items()) for n in nodes}) == 1,
               timeout=15, what="every member's segment files to be the same after the restart")


def test_initial_cluster_size_two_and_a_node_that_is_no_member(streams):
    a, b, c = streams.nodes
    qn = uname("rs2")
    d = declare(a, qn, {"x-initial-cluster-size": 2})
    wait_until(lambda: leader_of(a, qn) is not None, timeout=15, what="a leader")
    members = queue_info(a, qn)["members"]
    assert len(members) == 2
    outsider = next(n for n in (a, b, c) if n.name not in members)
    assert not os.path.exists(os.path.join(queues_dir(outsider), d, "group")), "no Raft group"
    bodies = [f"m{k}".encode() for k in range(30)]
    publish_until_confirmed(outsider, qn, bodies)
    for n in (a, b, c):
        got = read_all(n, qn, len(bodies))
        assert [body for _, body in got] == bodies, f"read through {n.name}"
        assert [o for o, _ in got] == list(range(30))


def test_a_member_whose_copy_is_gone_fetches_it_from_the_others(streams):
    nodes = streams.nodes
    qn = uname("rsf")
    d = declare(nodes[0], qn)
    wait_until(lambda: leader_of(nodes[0], qn) is not None, timeout=15, what="a leader")
    # Enough entries that every member's Raft log is cut back to its segments (snapshots).
    for k in range(12):
        publish_until_confirmed(nodes[k % 3], qn, [f"e{k}-{i}".encode() for i in range(150)])
    want = read_all(nodes[0], qn, 1800)
    assert len(want) == 1800
    victim = next(n for n in nodes if n.name != leader_of(nodes[0], qn))
    victim.stop()
    try:
        copy = os.path.join(queues_dir(victim), d)
        # The copy goes, its Raft state (and so its place in the group) stays.
        for path in glob.glob(os.path.join(copy, "*.seg")) + [os.path.join(copy, "applied")]:
            os.remove(path)
        publish_until_confirmed(nodes[0] if nodes[0] is not victim else nodes[1], qn,
                          [b"while-down"])
    finally:
        victim.start()
        victim.wait_ready()
    want = read_all(nodes[0] if nodes[0] is not victim else nodes[1], qn, 1801)
    wait_until(lambda: read_all(victim, qn, len(want), timeout=5) == want, timeout=30,
               what=f"{victim.name} to fetch its copy again")


def test_deleting_a_replicated_stream_removes_every_members_files(streams):
    a, b, c = streams.nodes
    qn = uname("rsd")
    d = declare(a, qn)
    wait_until(lambda: leader_of(a, qn) is not None, timeout=15, what="a leader")
    publish_until_confirmed(a, qn, [b"x"] * 10)
    dirs = [os.path.join(queues_dir(n), d) for n in (a, b, c)]
    assert all(os.path.isdir(d) for d in dirs)
    conn = pika.BlockingConnection(c.params())
    conn.channel().queue_delete(qn)
    safe_close(conn)
    wait_until(lambda: not any(os.path.exists(d) for d in dirs), timeout=15,
               what="every member to remove the stream's files")


# ---- the stream protocol (rstream) on a replicated stream ----

def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_stream_protocol_metadata_names_the_leader_and_replicas_and_clients_follow_it(streams):
    """rstream asks the node it reaches for the stream's leader and replicas: its producer then
    publishes on the leader's stream port, its consumer reads from a replica's, and what one
    publishes the other reads, at the offsets every member gives it."""
    a, b, c = streams.nodes
    name = uname("rsp")

    async def go():
        async with Producer("127.0.0.1", port=c.stream_port, username="guest",
                            password="guest") as p:
            await p.create_stream(name)
            leader = None
            for _ in range(100):
                leader = leader_of(c, name)
                if leader:
                    break
                await asyncio.sleep(0.1)
            assert leader, "the new stream has a leader"
            client = await p.default_client
            lead, replicas = await client.query_leader_and_replicas(name)
            by_port = {n.stream_port: n.name for n in streams.nodes}
            assert by_port[lead.port] == leader
            assert sorted(by_port[r.port] for r in replicas) == sorted(
                n.name for n in streams.nodes if n.name != leader)
            assert all(x.host == "127.0.0.1" for x in [lead, *replicas])
            for i in range(50):
                await p.send_wait(name, AMQPMessage(body=f"m{i}".encode()))
        got: list[tuple[int, bytes]] = []
        enough = asyncio.Event()

        async def on(msg, ctx: MessageContext) -> None:
            got.append((ctx.offset, bytes(msg.body) if not isinstance(msg, bytes) else msg))
            if len(got) >= 50:
                enough.set()

        async with Consumer("127.0.0.1", port=a.stream_port, username="guest",
                            password="guest") as cons:
            await cons.start()
            await cons.subscribe(name, on, decoder=amqp_decoder,
                                 offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
            await asyncio.wait_for(enough.wait(), 20)
        return got

    got = run(go())
    assert [o for o, _ in got] == list(range(50))
    # The same messages over AMQP 0-9-1 on every node.
    for n in streams.nodes:
        assert [o for o, _ in read_all(n, name, 50)] == list(range(50))


def _ctl(node, *args: str) -> subprocess.CompletedProcess:
    from cluster_harness import BIN
    return subprocess.run([BIN, "ctl", "--url", f"http://127.0.0.1:{node.http_port}", *args],
                          capture_output=True, text=True, timeout=60)


def test_replicas_are_added_and_removed_with_ctl(streams):
    """`warren ctl add_replica` / `delete_replica` (rabbitmq-streams'): a stream of one member
    grows to three; the new members get every offset (their Raft logs start after snapshots
    have cut the first member's: they fetch from its segments) and agree with it; a member
    removed keeps a read copy but no Raft state; the last member cannot be removed."""
    a, b, c = streams.nodes
    qn = uname("rsm")
    d = declare(a, qn, {"x-initial-cluster-size": 1})
    wait_until(lambda: leader_of(a, qn) == a.name, timeout=15, what="a to lead")
    # More entries than a snapshot interval (1024), one confirmed publish each.
    publish_until_confirmed(a, qn, [f"m{i}".encode() for i in range(1100)])
    want = read_all(a, qn, 1100)
    r = _ctl(c, "add_replica", qn, b.name)
    assert r.returncode == 0, r.stderr
    r = _ctl(b, "add_replica", qn, c.name)
    assert r.returncode == 0, r.stderr
    wait_until(lambda: sorted(queue_info(a, qn).get("members", [])) == sorted([a.name, b.name, c.name]),
               timeout=15, what="three members")
    for n in (b, c):
        assert os.path.isdir(os.path.join(queues_dir(n), d, "group")), f"{n.name} runs the group"
    publish_until_confirmed(b, qn, [b"after"])
    want = read_all(a, qn, 1101)
    for n in (b, c):
        wait_until(lambda n=n: read_all(n, qn, 1101, timeout=5) == want, timeout=30,
                   what=f"{n.name} to hold every offset")
    wait_until(lambda: len({tuple(segment_digests(n, d).items()) for n in (a, b, c)}) == 1,
               timeout=15, what="the same segment files on every member")
    r = _ctl(a, "delete_replica", qn, c.name)
    assert r.returncode == 0, r.stderr
    wait_until(lambda: not os.path.exists(os.path.join(queues_dir(c), d, "group")), timeout=15,
               what=f"{c.name} to drop its Raft state")
    publish_until_confirmed(c, qn, [b"from-outside"])
    want = read_all(a, qn, 1102)
    assert want[-1][1] == b"from-outside"
    wait_until(lambda: read_all(c, qn, 1102, timeout=5) == want, timeout=30,
               what=f"{c.name}'s read copy to follow")
    r = _ctl(a, "delete_replica", qn, b.name)
    assert r.returncode == 0, r.stderr
    r = _ctl(a, "delete_replica", qn, a.name)
    assert r.returncode != 0 and "last member" in r.stderr, (r.stdout, r.stderr)
