"""Cluster membership through `warren ctl`, as rabbitmqctl's users run it: cluster_status,
join_cluster (stop_app, join, start_app) and forget_cluster_node, with real processes and a real
client (pika) checking what a member serves afterwards.

The module has a 3-node cluster of its own: it adds and removes a member."""

from __future__ import annotations

import os
import subprocess

import pika
import pika.exceptions
import pytest

from cluster_harness import (BIN, ClusterNode, _cluster, _mark_logs, _node_logs, confirmed,  # noqa: F401
                             drain, needs_warren_bin, node_rows, q)
from conftest import _free_port
from helpers import connect, safe_close, uname, wait_until

pytestmark = needs_warren_bin


@pytest.fixture(scope="module")
def members():
    yield from _cluster("membership")


def ctl(node: ClusterNode, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([BIN, "ctl", "--url", f"http://127.0.0.1:{node.http_port}", *args],
                       capture_output=True, text=True, timeout=90)
    if ok:
        assert r.returncode == 0, f"warren ctl {' '.join(args)} on {node.name}: {r.stdout}{r.stderr}"
    return r


def status_sections(node: ClusterNode) -> dict[str, list[str]]:
    """cluster_status's sections (title -> lines), as rabbitmqctl prints them."""
    out = ctl(node, "cluster_status", "--quiet").stdout
    sections: dict[str, list[str]] = {}
    title = None
    for line in out.splitlines():
        if not line.strip():
            continue
        if title is None or line in ("Basics", "Disk Nodes", "Running Nodes", "Metadata leader (Raft)"):
            title = line
            sections[title] = []
        else:
            sections[title].append(line)
    return sections


def members_seen(node: ClusterNode) -> tuple[list[str], list[str]]:
    s = status_sections(node)
    return sorted(s.get("Disk Nodes", [])), sorted(s.get("Running Nodes", []))


def queue_view(node: ClusterNode, name: str) -> dict:
    st, v = node.api("GET", f"/api/queues/%2f/{q(name)}")
    assert st == 200, (node.name, name, st, v)
    return v


def outside_node(cluster, index: int) -> ClusterNode:
    """A node of the cluster's cookie that is no member: started alone, a cluster of one."""
    n = ClusterNode(cluster, index)
    cluster.extra.append(n)
    n.start(peers=[n.link_addr])
    n.wait_ready()
    return n


def test_cluster_status_lists_every_member_running_and_one_leader(members):
    names = sorted(n.name for n in members.nodes)
    leaders = set()
    for n in members.nodes:
        # Links between followers come up within a second of the cluster forming (Raft alone
        # links each follower to the leader only).
        wait_until(lambda n=n: members_seen(n) == (names, names), timeout=10, interval=0.1,
                   what=f"cluster_status on {n.name} to list every member running")
        s = status_sections(n)
        assert len(s["Metadata leader (Raft)"]) == 1 and s["Metadata leader (Raft)"][0] in names, s
        leaders.add(s["Metadata leader (Raft)"][0])
    assert len(leaders) == 1, f"the members name different leaders: {leaders}"


@pytest.mark.timeout(120)
def test_join_serve_forget_and_the_forgotten_node_refuses_to_boot(members):
    a, b, c = members.nodes
    before = uname("q-before")
    ch = connect(a.url)
    try:
        ch.channel().queue_declare(before, durable=True)
    finally:
        safe_close(ch)

    d = outside_node(members, 4)
    try:
        own = uname("q-own")
        on_d, replicated, only_d = uname("q-on-d"), uname("qq-of-d"), uname("qq-only-d")
        conn = connect(d.url)
        try:
            conn.channel().queue_declare(own, durable=True)
        finally:
            safe_close(conn)

        # As with rabbitmqctl: the app must be stopped first.
        r = ctl(d, "join_cluster", b.link_addr, ok=False)
        assert r.returncode != 0 and "stop_app" in (r.stdout + r.stderr), r
        ctl(d, "stop_app")
        ctl(d, "join_cluster", b.link_addr)
        ctl(d, "start_app")
        assert "joined the cluster" in d.log()

        names = sorted(n.name for n in members.nodes + [d])
        for n in members.nodes + [d]:
            wait_until(lambda n=n: members_seen(n) == (names, names), timeout=20, interval=0.2,
                       what=f"cluster_status on {n.name} to list the four members running")
            wait_until(lambda n=n: sorted(node_rows(n)) == names, timeout=10, interval=0.2,
                       what=f"/api/nodes on {n.name} to list the four members")

        # Its own definitions went with the reset; the cluster's are there.
        conn = connect(d.url)
        try:
            ch = conn.channel()
            ok = ch.queue_declare(before, passive=True)
            assert ok.method.queue == before
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
                ch.queue_declare(own, passive=True)
            assert e.value.reply_code == 404
        finally:
            safe_close(conn)

        # The new member forwards: publish through it, consume through another member.
        pub = connect(d.url)
        sub = connect(c.url)
        try:
            p = pub.channel()
            p.confirm_delivery()
            confirmed(p, "", before, [b"via-the-new-member"], pika.BasicProperties(delivery_mode=2))
            assert drain(sub.channel(), before) == [b"via-the-new-member"]
            # And a queue declared through it is known everywhere.
            fresh = uname("q-fresh")
            p.queue_declare(fresh)
            for n in members.nodes:
                conn = connect(n.url)
                try:
                    conn.channel().queue_declare(fresh, passive=True)
                finally:
                    safe_close(conn)
            p.queue_delete(fresh)
            p.queue_delete(before)
            # What the forget below must clean up: a classic queue that lives on the new member,
            # and a replicated queue it is a member of.
            p.queue_declare(on_d, durable=True)
            confirmed(p, "", on_d, [b"lost-with-its-node"], pika.BasicProperties(delivery_mode=2))
            p.queue_declare(replicated, durable=True, arguments={"x-queue-type": "quorum"})
            p.queue_declare(only_d, durable=True, arguments={"x-queue-type": "quorum",
                                                              "x-quorum-initial-group-size": 1})
            confirmed(p, "", replicated, [b"kept"], pika.BasicProperties(delivery_mode=2))
        finally:
            safe_close(pub)
            safe_close(sub)
        # Three members (RabbitMQ's default initial group size), the declaring node first.
        qq_members = wait_until(lambda: (queue_view(a, replicated).get("members") or [None])[0] == d.name
                                and queue_view(a, replicated)["members"], timeout=20, interval=0.2,
                                what=f"the replicated queue to have {d.name} among its members")
        assert len(qq_members) == 3, qq_members

        # As RabbitMQ: a running member cannot be forgotten.
        r = ctl(a, "forget_cluster_node", d.name, ok=False)
        assert r.returncode != 0 and "must be stopped" in r.stdout + r.stderr, r
        assert members_seen(a) == (names, names)
    finally:
        d.stop()
    wait_until(lambda: node_rows(a)[d.name].get("running") is False, timeout=10, interval=0.1,
               what=f"{a.name} to see {d.name} stopped")

    # forget_cluster_node, run on another member, takes the stopped node out. As RabbitMQ's, it
    # says which quorum queues the node could not leave: the one it is the only member of.
    r = ctl(a, "forget_cluster_node", d.name, ok=False)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "could not leave" in out and only_d in out and replicated not in out, out
    names = sorted(n.name for n in members.nodes)
    for n in members.nodes:
        wait_until(lambda n=n: members_seen(n) == (names, names), timeout=20, interval=0.2,
                   what=f"cluster_status on {n.name} to list three members after the forget")
        assert sorted(node_rows(n)) == names
        # Its classic queue went with it (RabbitMQ's forget_all_durable); it left the replicated
        # queue's members (shrink_all), which keeps its message.
        wait_until(lambda n=n: n.api("GET", f"/api/queues/%2f/{q(on_d)}")[0] == 404, timeout=10,
                   interval=0.2, what=f"{on_d} to be gone on {n.name}")
    # The replicated queue elected a leader among the members left, which every node names.
    left = sorted(set(qq_members) - {d.name})

    def shrunk() -> bool:
        views = [queue_view(n, replicated) for n in members.nodes]
        return (all(sorted(v.get("members") or []) == left for v in views)
                and len({v.get("leader") for v in views}) == 1 and views[0].get("leader") in left)
    wait_until(shrunk, timeout=20, interval=0.2, what=f"{replicated} to have members {left} and one of them lead")
    conn = connect(c.url)
    try:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.queue_declare(on_d, passive=True)
        assert e.value.reply_code == 404
        ch = conn.channel()
        assert drain(ch, replicated) == [b"kept"]
        ch.queue_delete(replicated)
        # Metadata changes need a majority of three now, which the three running members are.
        x = uname("x-after-forget")
        ch.exchange_declare(x, "fanout")
        ch.exchange_delete(x)
    finally:
        safe_close(conn)

    # Started again on its old state, the forgotten node refuses to boot (RabbitMQ's
    # inconsistent_cluster), and the cluster goes on.
    mark = d.log_size()
    d.start(peers=members.peers + [d.link_addr])
    try:
        d.proc.wait(30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the forgotten node kept running:\n{d.log()[mark:][-3000:]}")
    assert d.proc.returncode != 0
    assert "disagrees" in d.log()[mark:] and "forget_cluster_node" in d.log()[mark:], d.log()[mark:][-3000:]
    for n in members.nodes:
        assert members_seen(n) == (names, names)
    members.extra.remove(d)


def test_forget_cluster_node_refuses_itself_and_strangers(members):
    a = members.nodes[0]
    r = ctl(a, "forget_cluster_node", a.name, ok=False)
    assert r.returncode != 0 and "cannot forget itself" in r.stderr + r.stdout, r
    r = ctl(a, "forget_cluster_node", "nobody@nowhere", ok=False)
    assert r.returncode != 0 and "not a member" in r.stderr + r.stdout, r
    # Nobody was removed.
    assert members_seen(a)[0] == sorted(n.name for n in members.nodes)


def test_join_cluster_refuses_a_member_of_a_cluster_and_an_unreachable_target(members):
    a, b, _ = members.nodes
    r = ctl(a, "stop_app")
    try:
        r = ctl(a, "join_cluster", b.link_addr, ok=False)
        assert r.returncode != 0 and "already a member" in r.stderr + r.stdout, r
    finally:
        ctl(a, "start_app")
    d = outside_node(members, 5)
    try:
        ctl(d, "stop_app")
        dead = f"127.0.0.1:{_free_port()}"
        r = ctl(d, "join_cluster", dead, ok=False)
        assert r.returncode != 0 and "cannot reach" in r.stderr + r.stdout, r
        # Nothing was dropped: it still is a cluster of one of its own.
        ctl(d, "start_app")
        assert members_seen(d) == ([d.name], [d.name])
    finally:
        d.stop()
        members.extra.remove(d)


def test_a_second_process_on_a_members_data_dir_is_refused(members):
    """Every cluster node holds its data directory: a second process started with a running
    member's name, data directory and peers, on ports of its own, exits 1 naming the directory
    and the member's pid, and the member keeps serving."""
    a = members.nodes[0]
    cmd = [BIN, "server", "--node-name", a.name, "--data-dir", a.data_dir,
           "--amqp-port", str(_free_port()), "--http-port", str(_free_port()),
           "--cluster-listen", f"127.0.0.1:{_free_port()}", "--cluster-peers", ",".join(members.peers)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
                       env={**os.environ, "WARREN_COOKIE": a.cookie})
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert a.data_dir in r.stderr and f"pid {a.proc.pid}" in r.stderr, r.stderr
    assert a.running
    names = sorted(n.name for n in members.nodes)
    wait_until(lambda: members_seen(a) == (names, names), timeout=10, interval=0.1,
               what="the member to keep listing every member running")
