"""The management API's cluster-wide view (issue 33, item 1), from whichever node serves it:
every node's connections, channels and consumers; a queue's figures and message rates from the
node that hosts it (a classic queue's home, a quorum queue's leader); the overview's totals
summed over the nodes; `/api/nodes` with each node's Raft role and connections; a queue whose
node is down listed `down` with no counts (unknown, never 0); one cluster name everywhere,
set with `warren ctl set_cluster_name`; a connection closed through another node.

Warren only: RabbitMQ's reference broker here is a single node (RabbitMQ's management is
cluster-wide in the same way; these are its field names and replies).
"""

from __future__ import annotations

import subprocess
import time
import urllib.request

import pika
import pika.exceptions
import pytest

from cluster_harness import BIN, PERSISTENT, needs_warren_bin, q
from cluster_harness import _mark_logs, _node_logs, cluster, conns  # noqa: F401
from helpers import uname, wait_until

pytestmark = needs_warren_bin


@pytest.fixture(autouse=True)
def _linked(cluster):
    """Every node sees every other running (its links are up) before a test starts: a node
    started a moment ago may not have linked to the others yet."""
    def linked():
        return all(all(n["running"] for n in rows(node, "/api/nodes")) for node in cluster.nodes)
    wait_until(linked, timeout=15, what="every node linked to every other")


def rows(node, path: str) -> list[dict]:
    st, body = node.api("GET", path)
    assert st == 200, (path, st, body)
    return body


def ctl(node, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([BIN, "ctl", "--url", f"http://127.0.0.1:{node.http_port}", *args],
                          capture_output=True, text=True, timeout=60)


def local_port(c: pika.BlockingConnection) -> int:
    return c._impl._transport._sock.getsockname()[1]


def test_every_list_covers_every_node_from_every_node(cluster, conns):
    n1, n2, n3 = cluster.nodes
    clients = {n.name: conns(n) for n in (n1, n2, n3)}
    qn = uname("view-classic")
    ch3 = clients[n3.name].channel()
    ch3.queue_declare(qn, durable=True)
    ch1 = clients[n1.name].channel()
    ch1.confirm_delivery()
    for i in range(5):
        ch1.basic_publish("", qn, b"m%d" % i, PERSISTENT)
    ch2 = clients[n2.name].channel()
    ch2.basic_qos(prefetch_count=2)
    tag = ch2.basic_consume(qn, lambda *a: None)
    # Two deliveries held unacknowledged by node 2's consumer, three ready at the home.
    clients[n2.name].process_data_events(time_limit=0.5)
    ports = {name: local_port(c) for name, c in clients.items()}

    for server in (n1, n2, n3):
        cs = rows(server, "/api/connections")
        mine = {c["node"]: c for c in cs if c["peer_port"] in ports.values()}
        assert set(mine) == {n1.name, n2.name, n3.name}, (server.name, cs)
        for name, port in ports.items():
            assert mine[name]["peer_port"] == port
        chs = [c for c in rows(server, "/api/channels")
               if c["connection_details"]["peer_port"] in ports.values()]
        assert {c["node"] for c in chs} == {n1.name, n2.name, n3.name}, (server.name, chs)
        consumers = [c for c in rows(server, "/api/consumers") if c["consumer_tag"] == tag]
        assert len(consumers) == 1, (server.name, consumers)
        assert consumers[0]["channel_details"]["node"] == n2.name
        assert consumers[0]["queue"] == {"name": qn, "vhost": "/"}

        def counted():
            row = next(r for r in rows(server, "/api/queues/%2F") if r["name"] == qn)
            return (row["node"], row["messages"], row["messages_ready"],
                    row["messages_unacknowledged"], row["consumers"],
                    row["message_stats"].get("publish"))
        wait_until(lambda: counted() == (n3.name, 5, 3, 2, 1, 5), timeout=10,
                   what=f"{qn}'s figures from the home, read through {server.name}: {counted()}")
        one = rows(server, f"/api/queues/%2F/{q(qn)}")
        assert (one["messages"], one["message_stats"]["publish"]) == (5, 5)
        st, _ = server.api("GET", f"/api/connections/{q(cs[0]['name'])}")
        assert st == 200

    # The overview adds up every node's part: at least our three connections and channels,
    # and its listeners are every node's.
    o = rows(n2, "/api/overview")
    assert o["object_totals"]["connections"] >= 3
    assert o["object_totals"]["channels"] >= 3
    assert o["object_totals"]["consumers"] >= 1
    assert o["queue_totals"]["messages"] >= 5
    assert {(l["node"], l["protocol"]) for l in o["listeners"]} >= {
        (n.name, p) for n in (n1, n2, n3) for p in ("amqp", "http")}
    ch3.queue_delete(qn)


def test_a_quorum_queue_shows_its_counts_and_rates_through_any_node(cluster, conns):
    n1, n2, n3 = cluster.nodes
    qn = uname("view-quorum")
    ch = conns(n1).channel()
    ch.queue_declare(qn, durable=True, arguments={"x-queue-type": "quorum"})
    ch.confirm_delivery()
    for i in range(4):
        ch.basic_publish("", qn, b"q%d" % i, PERSISTENT)
    got = []
    for _ in range(2):
        m, _, _ = ch.basic_get(qn)
        got.append(m.delivery_tag)
    ch.basic_ack(got[-1], multiple=True)
    for server in (n1, n2, n3):
        def figures():
            row = rows(server, f"/api/queues/%2F/{q(qn)}")
            s = row.get("message_stats", {})
            return row.get("messages"), s.get("publish"), s.get("get"), s.get("ack")
        wait_until(lambda: figures() == (2, 4, 2, 2), timeout=10,
                   what=f"{qn}'s counts and counters through {server.name}: {figures()}")
        row = rows(server, f"/api/queues/%2F/{q(qn)}")
        assert "rate" in row["message_stats"]["publish_details"]
        assert row["leader"] in {n.name for n in cluster.nodes}
    ch.queue_delete(qn)


def test_ctl_lists_every_nodes_connections_channels_and_consumers(cluster, conns):
    n1, n2, n3 = cluster.nodes
    c2, c3 = conns(n2), conns(n3)
    qn = uname("view-ctl")
    ch3 = c3.channel()
    ch3.queue_declare(qn)
    tag = c2.channel().basic_consume(qn, lambda *a: None)
    ports = {local_port(c2), local_port(c3)}
    r = ctl(n1, "-q", "list_connections", "peer_port", "name")
    assert r.returncode == 0, r.stderr
    listed = {int(line.split("\t")[0]) for line in r.stdout.splitlines()[1:] if line.strip()}
    assert ports <= listed, r.stdout
    r = ctl(n1, "-q", "list_channels", "name", "number")
    assert sum(str(p) in r.stdout for p in ports) == 2, r.stdout
    r = ctl(n1, "-q", "list_consumers", "queue_name", "consumer_tag")
    assert [l for l in r.stdout.splitlines() if tag in l] == [f"{qn}\t{tag}"], r.stdout
    ch3.queue_delete(qn)


def test_an_exchange_counts_what_every_node_routed(cluster, conns):
    n1, n2, n3 = cluster.nodes
    x, qn = uname("view-x"), uname("view-xq")
    ch1, ch3 = conns(n1).channel(), conns(n3).channel()
    ch1.exchange_declare(x, "fanout")
    ch1.queue_declare(qn)
    ch1.queue_bind(qn, x)
    for ch, n in ((ch1, 3), (ch3, 2)):
        ch.confirm_delivery()
        for i in range(n):
            ch.basic_publish(x, "", b"x%d" % i)
    for server in (n1, n2, n3):
        def counts():
            row = rows(server, f"/api/exchanges/%2F/{q(x)}")
            listed = next(r for r in rows(server, "/api/exchanges/%2F") if r["name"] == x)
            s, ls = row.get("message_stats", {}), listed.get("message_stats", {})
            return s.get("publish_in"), s.get("publish_out"), ls.get("publish_in")
        wait_until(lambda: counts() == (5, 5, 5), timeout=10,
                   what=f"{x}'s counters summed over the nodes, through {server.name}: {counts()}")
    ch1.queue_delete(qn)
    ch1.exchange_delete(x)


def test_nodes_report_their_raft_role_and_connections(cluster, conns):
    c = conns(cluster.nodes[1])
    for server in cluster.nodes:
        ns = rows(server, "/api/nodes")
        assert [n["name"] for n in ns] == sorted(n.name for n in cluster.nodes)
        assert all(n["running"] for n in ns)
        roles = sorted(n["raft_role"] for n in ns)
        assert roles == ["follower", "follower", "leader"], ns
        by = {n["name"]: n for n in ns}
        assert by[cluster.nodes[1].name]["connections"] >= 1
        for n in ns:
            assert n["uptime"] > 0 and n["mem_used"] > 0 and n["fd_total"] > 0
            assert n["disk_free_limit"] > 0
    c.close()


def test_one_cluster_name_everywhere_and_set_with_ctl(cluster, conns):
    names = {rows(n, "/api/overview")["cluster_name"] for n in cluster.nodes}
    assert len(names) == 1, names
    (first,) = names
    # Named after a member (the first leader), as RabbitMQ names a cluster after a node.
    assert first in {n.name for n in cluster.nodes}
    new = uname("cluster")
    r = ctl(cluster.nodes[1], "set_cluster_name", new)
    assert r.returncode == 0, r.stderr
    assert f"Setting cluster name to {new}" in r.stdout + r.stderr
    for n in cluster.nodes:
        wait_until(lambda: rows(n, "/api/overview")["cluster_name"] == new, timeout=10,
                   what=f"{n.name}'s overview names the cluster {new}")
        assert rows(n, "/api/cluster-name") == {"name": new}
        st, cs = n.api("GET", "/api/warren/cluster")
        assert cs["cluster_name"] == new
        out = ctl(n, "cluster_status").stdout
        assert f"Cluster name: {new}" in out, out
        c = conns(n)
        assert c._impl.server_properties["cluster_name"] in (new, new.encode())
        defs = rows(n, "/api/definitions")
        assert {"name": "cluster_name", "value": new} in defs["global_parameters"]
        with urllib.request.urlopen(f"http://127.0.0.1:{n.http_port}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert f'rabbitmq_cluster="{new}"' in metrics
    # Bad input: a clear 400, the name unchanged.
    st, body = cluster.nodes[0].api("PUT", "/api/cluster-name", {"name": ""})
    assert st == 400 and "empty" in body["reason"], body
    st, body = cluster.nodes[0].api("PUT", "/api/cluster-name", {})
    assert st == 400, body
    assert rows(cluster.nodes[2], "/api/cluster-name") == {"name": new}


def test_a_connection_on_another_node_is_closed_through_this_one(cluster, conns):
    n1, n2, _ = cluster.nodes
    c = conns(n2)
    port = local_port(c)
    name = next(r["name"] for r in rows(n1, "/api/connections") if r["peer_port"] == port)
    st, _ = n1.api("DELETE", f"/api/connections/{q(name)}")
    assert st == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
        c.process_data_events(time_limit=5)
        c.channel()
    assert e.value.reply_code == 320
    st, _ = n1.api("DELETE", f"/api/connections/{q(name)}")
    assert st == 404


def test_rebalance_spreads_quorum_queue_leaders(cluster, conns):
    n1, n2, n3 = cluster.nodes
    ch = conns(n1).channel()
    ch.confirm_delivery()
    qs = [uname("view-rebalance") for _ in range(6)]
    for qn in qs:
        ch.queue_declare(qn, durable=True, arguments={"x-queue-type": "quorum",
                                                      "x-queue-leader-locator": "client-local"})
        ch.basic_publish("", qn, qn.encode(), PERSISTENT)

    def leaders():
        by = {r["name"]: r.get("leader") for r in rows(n2, "/api/queues/%2F")}
        return [by.get(qn) for qn in qs]
    wait_until(lambda: None not in leaders(), timeout=15, what=f"every queue has a leader: {leaders()}")
    assert set(leaders()) == {n1.name}, leaders()
    # A consumer of each, on node 2, is served across the moves and never cancelled.
    c2 = conns(n2)
    cch = c2.channel()
    got, cancelled = {qn: [] for qn in qs}, []
    cch.add_on_cancel_callback(lambda frame: cancelled.append(frame))
    for qn in qs:
        cch.basic_consume(qn, lambda c, m, p, body, qn=qn: (got[qn].append(body),
                                                             c.basic_ack(m.delivery_tag)))
    wait_until(lambda: all(got[qn] == [qn.encode()] for qn in qs), timeout=10, conn=c2,
               what=f"each consumer's first message: {got}")
    # A leader grants its vote away only after its lease (the group's election timeout).
    time.sleep(2)
    r = ctl(n2, "rebalance", "all", "--queue-pattern", "^interop-view-rebalance")
    assert r.returncode == 0, r.stderr
    assert "Re-balancing leaders of all replicated queues" in r.stdout + r.stderr
    table = dict(line.split("\t") for line in r.stdout.splitlines()[1:] if line.strip())
    assert table == {n.name: "2" for n in cluster.nodes}, r.stdout
    wait_until(lambda: sorted(leaders().count(n.name) for n in cluster.nodes) == [2, 2, 2],
               timeout=10, what=f"two leaders on each node: {leaders()}")
    # Nothing lost and nobody cancelled: each consumer gets what is published after the moves
    # from its queue's new leader.
    for qn in qs:
        ch.basic_publish("", qn, b"after", PERSISTENT)
    wait_until(lambda: all(got[qn] == [qn.encode(), b"after"] for qn in qs), timeout=10,
               conn=c2, what=f"each consumer served after the moves: {got}")
    assert not cancelled
    for qn in qs:
        ch.queue_delete(qn)
    # Bad input: a clear message (not a panic).
    r = ctl(n2, "rebalance", "sideways")
    assert r.returncode != 0 and "all', 'quorum' or 'classic'" in r.stderr, r.stderr


def test_a_queue_whose_node_is_down_has_unknown_counts_and_comes_back(cluster, conns):
    """Last in the module: it kills node 3 and starts it again."""
    n1, n2, n3 = cluster.nodes
    qn, qq = uname("view-down"), uname("view-down-quorum")
    ch = conns(n3).channel()
    ch.queue_declare(qn, durable=True)
    ch.queue_declare(qq, durable=True, arguments={"x-queue-type": "quorum"})
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", qn, b"d%d" % i, PERSISTENT)
        ch.basic_publish("", qq, b"d%d" % i, PERSISTENT)
    name_before = rows(n1, "/api/cluster-name")
    n3.kill9()
    try:
        def listed():
            by = {r["name"]: r for r in rows(n1, "/api/queues")}
            return by[qn], by[qq]
        wait_until(lambda: listed()[0]["state"] == "down", timeout=15,
                   what=f"{qn} listed down through {n1.name}: {listed()[0]}")
        row, quorum = listed()
        for k in ("messages", "messages_ready", "messages_unacknowledged"):
            assert k not in row, f"a down queue's {k} is unknown, not {row.get(k)}"
        assert row["node"] == n3.name
        # The quorum queue keeps a majority: its counts are known.
        wait_until(lambda: listed()[1].get("messages") == 5, timeout=15,
                   what=f"{qq}'s counts with a majority up: {listed()[1]}")
        ns = {n["name"]: n for n in rows(n2, "/api/nodes")}
        assert ns[n3.name]["running"] is False

        def roles():
            return sorted(n.get("raft_role") for n in rows(n2, "/api/nodes") if n["running"])
        # If node 3 led the metadata group, the other two elect a leader first.
        wait_until(lambda: roles() == ["follower", "leader"], timeout=15,
                   what=f"a metadata leader among the running nodes: {roles()}")
        assert rows(n2, "/api/cluster-name") == name_before
    finally:
        n3.start()
        n3.wait_ready()
    wait_until(lambda: listed()[0].get("messages") == 5, timeout=30,
               what=f"{qn}'s counts once its node is back: {listed()[0]}")
    ch = conns(n1).channel()
    ch.queue_delete(qn)
    ch.queue_delete(qq)
