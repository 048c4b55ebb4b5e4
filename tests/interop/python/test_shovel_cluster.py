"""Shovels in a 3-node cluster: a shovel set through one node runs on exactly one node, every
node lists it (with the node that runs it), and when that node is killed another member starts
it and the messages keep moving, with nothing lost (`on-confirm`).

Warren only (a cluster of `warren server` processes)."""

from __future__ import annotations

import time

import pika
import pytest

from cluster_harness import needs_warren_bin, q
from cluster_harness import _mark_logs, _node_logs, lossy  # noqa: F401
from helpers import uname, wait_until

pytestmark = [needs_warren_bin, pytest.mark.timeout(180)]


def shovel_rows(node, name: str) -> list[dict]:
    st, rows = node.api("GET", "/api/shovels")
    assert st == 200, rows
    return [r for r in rows if r["name"] == name]


def running_on(node, name: str) -> str | None:
    rows = shovel_rows(node, name)
    running = [r for r in rows if r["state"] == "running"]
    return running[0]["node"] if len(running) == 1 and len(rows) == 1 else None


def depth(node, queue: str) -> int:
    st, body = node.api("GET", f"/api/queues/%2F/{q(queue)}")
    assert st == 200, body
    return body.get("messages_ready", 0) or 0


def test_a_shovel_runs_on_one_node_and_moves_when_it_is_lost(lossy):
    c = lossy
    first = c.nodes[0]
    src, dest, name = uname("sc-src"), uname("sc-dest"), uname("sc-shovel")
    conn = pika.BlockingConnection(first.params())
    ch = conn.channel()
    # Quorum queues, so that they outlive any one node.
    for qn in (src, dest):
        ch.queue_declare(qn, durable=True, arguments={"x-queue-type": "quorum"})
    conn.close()
    st, body = first.api("PUT", f"/api/parameters/shovel/%2F/{q(name)}", {"value": {
        "src-uri": "amqp://", "src-queue": src, "dest-uri": "amqp://", "dest-queue": dest}})
    assert st == 201, body
    wait_until(lambda: all(running_on(n, name) for n in c.nodes), timeout=20,
               what="every node to list the shovel running on one node")
    owners = {running_on(n, name) for n in c.nodes}
    assert len(owners) == 1, owners
    owner = owners.pop()
    victim = next(n for n in c.nodes if n.name == owner)
    survivor = next(n for n in c.nodes if n is not victim)

    def publish(node, start: int, n: int) -> None:
        conn = pika.BlockingConnection(node.params())
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(start, start + n):
            ch.basic_publish("", src, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
        conn.close()

    publish(survivor, 0, 100)
    wait_until(lambda: depth(survivor, dest) == 100, timeout=20, what="100 moved")
    victim.kill9()
    try:
        # Another member takes it over and moves what comes next.
        wait_until(lambda: running_on(survivor, name) not in (None, owner), timeout=30,
                   what="the shovel to start on another node")
        publish(survivor, 100, 100)
        wait_until(lambda: depth(survivor, dest) >= 200, timeout=30, what="200 moved")
    finally:
        victim.start()
        victim.wait_ready()
    conn = pika.BlockingConnection(survivor.params())
    ch = conn.channel()
    got = set()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m, _, body = ch.basic_get(dest, auto_ack=True)
        if m is None:
            if len(got) >= 200:
                break
            time.sleep(0.05)
            continue
        got.add(body)
    conn.close()
    assert got == {f"m{i}".encode() for i in range(200)}, f"missing {sorted({f'm{i}'.encode() for i in range(200)} - got)[:10]}"
    first.api("DELETE", f"/api/parameters/shovel/%2F/{q(name)}")
