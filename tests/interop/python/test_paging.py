"""Long queues keep their backlog on disk, not in memory (Warren only: restarts the broker and
reads its RSS and data dir).

A queue pages out past 16,384 messages or 8 MiB in memory; these tests go well past that and check
order, counts, restarts, purges, TTL and the broker's memory.
"""

from __future__ import annotations

import glob
import os
import time

import pika
import pytest

from test_durability import BIN, Node, connect, node  # noqa: F401  (fixture)
from helpers import safe_close

pytestmark = pytest.mark.skipif(not BIN, reason="reads the broker's RSS and data dir: Warren only (WARREN_BIN)")

PERSISTENT = pika.BasicProperties(delivery_mode=2)
N = 40_000


def body(i: int, size: int = 200) -> bytes:
    return f"m{i:08d}".encode().ljust(size, b".")


def publish(n: Node, queue: str, count: int, props=PERSISTENT, size: int = 200, start: int = 0) -> None:
    """Publishes without confirms, then one confirmed message: its confirm comes after the fsync
    of everything published before it into the same queue."""
    c = connect(n)
    try:
        ch = c.channel()
        for i in range(start, start + count):
            ch.basic_publish("", queue, body(i, size), props)
        ch.confirm_delivery()
        ch.basic_publish("", queue, body(start + count, size), props)
    finally:
        safe_close(c)


def consume(n: Node, queue: str, limit: int | None = None) -> list[tuple[bytes, bool]]:
    c = connect(n)
    try:
        ch = c.channel()
        ch.basic_qos(prefetch_count=1000)
        out: list[tuple[bytes, bool]] = []
        for m, props, b in ch.consume(queue, inactivity_timeout=2):
            if m is None:
                break
            out.append((b, m.redelivered))
            ch.basic_ack(m.delivery_tag)
            if limit is not None and len(out) == limit:
                break
        ch.cancel()
        return out
    finally:
        safe_close(c)


def count(n: Node, queue: str, durable: bool = True, arguments=None) -> int:
    c = connect(n)
    try:
        return c.channel().queue_declare(queue, durable=durable, arguments=arguments).method.message_count
    finally:
        safe_close(c)


def rss_kb(n: Node) -> int:
    with open(f"/proc/{n.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def scratch_bytes(n: Node) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(n.data, "vhosts", "*", "scratch", "*", "*.seg")))


def queue_log_bytes(n: Node) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(n.data, "vhosts", "*", "queues", "*", "*.seg")))


def test_a_paged_durable_queue_keeps_order_across_consumers_and_a_kill(node):
    node.start()
    assert count(node, "long") == 0
    publish(node, "long", N)
    total = N + 1
    assert count(node, "long") == total
    first = consume(node, "long", limit=5_000)
    assert [b for b, _ in first] == [body(i) for i in range(5_000)]
    assert not any(r for _, r in first), "nothing was delivered before"
    node.kill9()
    node.start()
    assert count(node, "long") == total - 5_000
    rest = consume(node, "long")
    assert [b for b, _ in rest] == [body(i) for i in range(5_000, total)], "in order, none lost, none twice"
    assert all(r for _, r in rest), "recovered messages are marked redelivered"
    assert count(node, "long") == 0


# pika moves 200,000 messages of 1 KiB here: about 30 s of the client's own CPU on 2 cores, so
# the suite's 30 s hang guard is too short for it. No figure here depends on time.
@pytest.mark.timeout(120)
def test_a_backlog_does_not_live_in_memory(node):
    node.start()
    count(node, "big")
    base = rss_kb(node)
    publish(node, "big", 100_000, size=1024)
    grown_mb = (rss_kb(node) - base) / 1024
    # 100 MB of bodies: held in memory they would grow RSS by more than that.
    assert grown_mb < 60, f"RSS grew by {grown_mb:.0f} MB for a 100 MB backlog"
    assert queue_log_bytes(node) > 100_000 * 1024
    got = consume(node, "big")
    assert len(got) == 100_001
    assert got[-1][0] == body(100_000, 1024)


def test_a_transient_backlog_pages_to_a_scratch_log_in_order(node):
    node.start()
    count(node, "scratchy", durable=False)
    publish(node, "scratchy", N, props=pika.BasicProperties(delivery_mode=1), size=1024)
    assert scratch_bytes(node) > 8 * 1024 * 1024, "the backlog went to disk"
    got = consume(node, "scratchy")
    assert [b for b, _ in got] == [body(i, 1024) for i in range(N + 1)]
    c = connect(node)
    try:
        c.channel().queue_delete("scratchy")
    finally:
        safe_close(c)
    assert scratch_bytes(node) == 0, "the scratch log goes with its queue"


def test_purging_a_paged_queue_frees_its_disk_and_survives_a_restart(node):
    node.start()
    count(node, "purged")
    publish(node, "purged", N, size=1024)
    assert queue_log_bytes(node) > N * 1024
    c = connect(node)
    try:
        ch = c.channel()
        assert ch.queue_purge("purged").method.message_count == N + 1
        # One more after the purge: it must survive, the purged ones must not come back.
        ch.confirm_delivery()
        ch.basic_publish("", "purged", b"after", PERSISTENT)
    finally:
        safe_close(c)
    assert queue_log_bytes(node) < 2 * 1024 * 1024, "purged segments are deleted"
    node.kill9()
    node.start()
    assert [b for b, _ in consume(node, "purged")] == [b"after"]


def test_paged_messages_still_expire(node):
    node.start()
    args = {"x-message-ttl": 1500}
    count(node, "ttl", arguments=args)
    publish(node, "ttl", N)
    deadline = time.monotonic() + 30
    while count(node, "ttl", arguments=args) > 0:
        assert time.monotonic() < deadline, "paged messages never expired"
        time.sleep(0.2)
    # And a deadline survives a restart rather than starting over.
    c = connect(node)
    try:
        ch = c.channel()
        ch.confirm_delivery()
        ch.basic_publish("", "ttl", b"short", PERSISTENT)
    finally:
        safe_close(c)
    node.kill9()
    time.sleep(1.6)
    node.start()
    assert count(node, "ttl", arguments=args) == 0, "expired while the broker was down"


def test_a_recovered_priority_queue_delivers_by_priority(node):
    node.start()
    args = {"x-max-priority": 5}
    count(node, "prio", arguments=args)
    c = connect(node)
    try:
        ch = c.channel()
        ch.confirm_delivery()
        for i, p in enumerate([1, 5, 3, 5, 0]):
            ch.basic_publish("", "prio", f"{i}-p{p}".encode(), pika.BasicProperties(delivery_mode=2, priority=p))
    finally:
        safe_close(c)
    node.kill9()
    node.start()
    assert count(node, "prio", arguments=args) == 5
    got = [b.decode() for b, _ in consume(node, "prio")]
    assert got == ["1-p5", "3-p5", "2-p3", "0-p1", "4-p0"]
