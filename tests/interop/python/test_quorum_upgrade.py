"""Replicated queues written by an earlier release are carried over to the queue machine (issue
31: the earlier `Replica` + leader-queue form goes; its data must not).

tests/fixtures/earlier-form/ holds data directories a build of that release wrote
(tests/fixtures/earlier-form/make.py says which and how): a 3-node cluster with a quorum queue
`qq-old` (m00..m19 confirmed; m00 acked; m01 delivered and requeued) and a classic queue `ha.old`
mirrored by an `ha-mode: all` policy (h00..h04), and a single node with the same `qq-old` (there,
a durable classic queue). Today's build boots on copies of them:

* every message still in the queue is there after the boot, once, in order; the cluster's m01
  keeps its delivery count (1) and is redelivered; the single node's messages are all
  redelivered (that form marked every message it recovered so) and count 0;
* `ha.old` stays a classic queue mirrored on the three nodes, without `x-delivery-count`;
* the queues then work as any other: acks hold, a new publish is kept, and a restart neither
  carries anything over again nor loses what was carried;
* a single node's carrying over that was cut short (its `group.carrying` mark, a `group/` part
  made) is made again from the classic files, which are removed only once it is done (a
  `group.carried` mark left by a crash before that removes them at the next boot).

Warren only (WARREN_BIN): it boots its own nodes on the fixtures' ports.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time

import pika
import pytest

from cluster_harness import needs_warren_bin
from helpers import wait_until

pytestmark = needs_warren_bin

BIN = os.environ.get("WARREN_BIN", "")
FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "earlier-form")
PEERS = ",".join(f"127.0.0.1:{47200 + i}" for i in (1, 2, 3))


class Booted:
    """A node on a copy of a fixture's data directory, on the ports the fixture's metadata names."""

    def __init__(self, data: str, name: str, amqp: int, http: int, link: int | None = None):
        self.data, self.name, self.amqp, self.http, self.link = data, name, amqp, http, link
        self.log_path = data + ".log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Booted":
        args = [BIN, "server", "--node-name", self.name, "--data-dir", self.data,
                "--amqp-port", str(self.amqp), "--http-port", str(self.http)]
        if self.link:
            args += ["--cluster-listen", f"127.0.0.1:{self.link}", "--cluster-peers", PEERS]
        log = open(self.log_path, "a")
        log.write(f"=== boot {time.strftime('%H:%M:%S')}\n")
        log.flush()
        self.proc = subprocess.Popen(args, stdout=log, stderr=log,
                                     env={**os.environ, "WARREN_COOKIE": "fixture"})
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def boots(self) -> list[str]:
        return self.log().split("=== boot ")[1:]

    def queue(self, name: str) -> dict:
        import base64
        import json
        import urllib.request
        req = urllib.request.Request(f"http://127.0.0.1:{self.http}/api/queues/%2F/{name}")
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return json.loads(r.read())
        except Exception:  # noqa: BLE001 - not up yet, or no such queue yet
            return {}

    def channel(self):
        conn = pika.BlockingConnection(pika.URLParameters(
            f"amqp://guest:guest@127.0.0.1:{self.amqp}/%2f?heartbeat=0"))
        return conn, conn.channel()


def get_all(node: Booted, queue: str, n: int, ack: int | None = None):
    """Gets `n` messages (manual ack): (body, redelivered, x-delivery-count); acks the first
    `ack` of them (all by default) and requeues the others by closing."""
    conn, ch = node.channel()
    try:
        out = []
        for i in range(n):
            m, p, body = ch.basic_get(queue, auto_ack=False)
            assert m is not None, f"{queue}: only {i} of {n} messages"
            out.append((body, m.redelivered, (p.headers or {}).get("x-delivery-count"), m.delivery_tag))
        upto = n if ack is None else ack
        for _, _, _, tag in out[:upto]:
            ch.basic_ack(tag)
        # The acks are on their way before the connection closes (its close returns the rest).
        ch.queue_declare(queue, passive=True)
        return [o[:3] for o in out]
    finally:
        conn.close()


@pytest.fixture
def cluster(tmp_path):
    shutil.copytree(os.path.join(FIXTURES, "cluster"), tmp_path / "cluster")
    nodes = [Booted(str(tmp_path / "cluster" / f"n{i}"), f"warren{i}@localhost", 47100 + i, 57100 + i,
                    47200 + i) for i in (1, 2, 3)]
    for n in nodes:
        n.start()
    yield nodes
    for n in nodes:
        n.stop()


@pytest.mark.timeout(120)
def test_a_clusters_earlier_replicated_queues_are_carried_over_with_their_messages(cluster):
    a, b, c = cluster
    three = sorted(n.name for n in cluster)
    wait_until(lambda: b.queue("qq-old").get("messages") == 19 and b.queue("ha.old").get("messages") == 5,
               timeout=30, interval=0.2, what="the earlier queues listed with their messages")
    qq, ha = b.queue("qq-old"), b.queue("ha.old")
    assert qq["type"] == "quorum" and sorted(qq["members"]) == three, qq
    assert ha["type"] == "classic" and len(ha["slave_nodes"]) == 2, ha
    wait_until(lambda: sum("carried the earlier form's messages over" in n.log() for n in cluster) >= 1,
               timeout=15, what="the leader's carrying over")

    got = get_all(c, "qq-old", 19, ack=10)
    assert [g[0] for g in got] == [b"m%02d" % i for i in range(1, 20)], "every message, once, in order"
    assert got[0][1:] == (True, 1), "m01 was delivered and requeued: redelivered, count 1"
    assert all(g[1:] == (False, 0) for g in got[1:]), got[1:4]
    got = get_all(b, "ha.old", 5, ack=0)
    assert got == [(b"h%02d" % i, False, None) for i in range(5)], "a mirrored classic queue counts nothing"

    conn, ch = a.channel()
    ch.confirm_delivery()
    ch.basic_publish("", "qq-old", b"after", pika.BasicProperties(delivery_mode=2), mandatory=True)
    conn.close()
    for n in cluster:
        n.stop()
    for n in cluster:
        n.start()
    wait_until(lambda: b.queue("qq-old").get("messages") == 10 and b.queue("ha.old").get("messages") == 5,
               timeout=30, interval=0.2, what="the queues after a restart")
    got = get_all(a, "qq-old", 10)
    assert [g[0] for g in got] == [b"m%02d" % i for i in range(11, 20)] + [b"after"]
    assert all(g[1] for g in got[:9]), "delivered before the restart: redelivered"
    for n in cluster:
        assert "carrying a replicated queue" not in n.boots()[-1], f"{n.name} carried something over again"
        assert "ERROR" not in "".join(
            line for line in n.log().splitlines(True) if "legacy" in line or "carried" in line)


def single(tmp_path) -> Booted:
    shutil.copytree(os.path.join(FIXTURES, "single"), tmp_path / "single")
    return Booted(str(tmp_path / "single" / "n"), "warren@localhost", 47111, 57111)


def queue_dir(node: Booted) -> str:
    (d,) = glob.glob(os.path.join(node.data, "vhosts", "2f", "queues", "*"))
    return d


def classic_files(node: Booted) -> list[str]:
    return [f for f in os.listdir(queue_dir(node)) if f.endswith(".seg")]


@pytest.mark.timeout(90)
def test_a_single_nodes_earlier_quorum_queue_is_carried_over_and_its_classic_files_go(tmp_path):
    n = single(tmp_path)
    assert classic_files(n), "the fixture is the classic form"
    n.start()
    try:
        wait_until(lambda: n.queue("qq-old").get("type") == "quorum" and n.queue("qq-old").get("messages") == 19,
                   timeout=20, interval=0.2, what="qq-old on the machine with its 19 messages")
        wait_until(lambda: not classic_files(n), timeout=10, interval=0.2, what="the classic files to go")
        assert os.path.isdir(os.path.join(queue_dir(n), "group"))
        got = get_all(n, "qq-old", 5, ack=5)
        assert got == [(b"m%02d" % i, True, 0) for i in range(1, 6)], got
        n.stop()
        n.start()
        wait_until(lambda: n.queue("qq-old").get("messages") == 14, timeout=20, interval=0.2,
                   what="14 messages after a restart")
        assert "carrying" not in n.boots()[-1]
    finally:
        n.stop()


@pytest.mark.timeout(90)
def test_a_single_nodes_carrying_over_cut_short_is_made_again_and_a_finished_one_cleaned_up(tmp_path):
    n = single(tmp_path)
    d = queue_dir(n)
    # Cut short: the mark, and part of a group written.
    os.makedirs(os.path.join(d, "group", "log"))
    with open(os.path.join(d, "group", "log", "0000000000000000.seg"), "wb") as f:
        f.write(b"\x00" * 100)
    open(os.path.join(d, "group.carrying"), "w").close()
    n.start()
    try:
        wait_until(lambda: n.queue("qq-old").get("messages") == 19, timeout=20, interval=0.2,
                   what="the 19 messages carried over again, once")
        wait_until(lambda: not classic_files(n), timeout=10, interval=0.2, what="the classic files to go")
        assert not os.path.exists(os.path.join(d, "group.carrying"))
        n.stop()
        # Done, but the classic files still there (a crash before they went): removed, not
        # carried over a second time.
        shutil.copy(glob.glob(os.path.join(FIXTURES, "single", "n", "vhosts", "2f", "queues", "*", "*.seg"))[0], d)
        open(os.path.join(d, "group.carried"), "w").close()
        n.start()
        wait_until(lambda: n.queue("qq-old").get("messages") is not None, timeout=20, interval=0.2,
                   what="qq-old listed")
        time.sleep(1)
        assert n.queue("qq-old")["messages"] == 19
        assert not classic_files(n) and not os.path.exists(os.path.join(d, "group.carried"))
    finally:
        n.stop()
