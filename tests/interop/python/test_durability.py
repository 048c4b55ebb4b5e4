"""Durability against the real binary: restarts, kill -9 at random moments, a full disk.

These tests stop and kill the broker, so they run only against Warren (WARREN_BIN); against the
shared reference RabbitMQ they are skipped.
"""

from __future__ import annotations

import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pika
import pytest

from conftest import _free_port
from helpers import safe_close

BIN = os.environ.get("WARREN_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="kills and restarts the broker: Warren only (WARREN_BIN)")

PERSISTENT = pika.BasicProperties(delivery_mode=2)


class Node:
    """A broker process that can be killed and restarted on the same port and data dir."""

    def __init__(self, fsize_limit: int | None = None):
        self.dir = tempfile.mkdtemp(prefix="warren-durability-")
        self.data = os.path.join(self.dir, "data")
        self.port = _free_port()
        self.http_port = _free_port()  # kept across restarts, like the AMQP port
        self.fsize_limit = fsize_limit
        self.proc: subprocess.Popen | None = None
        self.extra_args: list[str] = []
        self.log = open(os.path.join(self.dir, "stderr.log"), "ab")

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2f?heartbeat=0&connection_attempts=1"

    def _preexec(self) -> None:
        if self.fsize_limit is not None:
            # A size-limited file stands in for a full disk: writes past it fail with EFBIG.
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (self.fsize_limit, resource.RLIM_INFINITY))

    def start(self) -> None:
        cmd = [BIN, "server", "--amqp-port", str(self.port), "--http-port", str(self.http_port), "--data-dir", self.data] + self.extra_args
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log, stdin=subprocess.DEVNULL, preexec_fn=self._preexec)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"broker exited: {self.stderr()}"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.02)
        raise AssertionError(f"broker did not listen: {self.stderr()}")

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill9()

    def stderr(self) -> str:
        self.log.flush()
        with open(os.path.join(self.dir, "stderr.log"), "rb") as f:
            return f.read()[-4000:].decode("utf-8", "replace")

    def cleanup(self) -> None:
        self.stop()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def node():
    n = Node()
    yield n
    n.cleanup()


def connect(n: Node) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(n.url))


def drain(n: Node, queue: str) -> list[tuple[bytes, bool]]:
    c = connect(n)
    try:
        ch = c.channel()
        out = []
        while True:
            m, _, body = ch.basic_get(queue, auto_ack=True)
            if m is None:
                return out
            out.append((body, m.redelivered))
    finally:
        safe_close(c)


def test_definitions_and_persistent_messages_survive_restart_and_kill(node):
    node.start()
    c = connect(node)
    ch = c.channel()
    ch.exchange_declare("dur-x", "topic", durable=True)
    ch.exchange_declare("tmp-x", "fanout", durable=False)
    ch.queue_declare("dur-q", durable=True, arguments={"x-max-length": 1000})
    ch.queue_declare("tmp-q", durable=False)
    ch.queue_declare("excl-q", durable=True, exclusive=True)
    ch.queue_bind("dur-q", "dur-x", "a.#")
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("dur-x", "a.b", b"p%d" % i, PERSISTENT)
    ch.basic_publish("dur-x", "a.b", b"transient")
    safe_close(c)

    node.stop()  # clean restart
    node.start()
    c = connect(node)
    ch = c.channel()
    assert ch.queue_declare("dur-q", passive=True).method.message_count == 5
    ch.exchange_declare("dur-x", passive=True)
    for gone in ("tmp-q", "excl-q"):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.queue_declare(gone, passive=True)
        assert e.value.reply_code == 404
        ch = c.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        ch.exchange_declare("tmp-x", passive=True)
    ch = c.channel()
    # Arguments survive too: x-max-length still applies.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.queue_declare("dur-q", durable=True, arguments={"x-max-length": 5})
    assert e.value.reply_code == 406
    ch = c.channel()
    # Consume two and ack them, leave one delivered but unacked, then kill -9.
    for _ in range(2):
        m, _, _ = ch.basic_get("dur-q")
        ch.basic_ack(m.delivery_tag)
    ch.basic_get("dur-q")
    ch.queue_declare("dur-q", passive=True)  # a round trip: the acks were processed
    time.sleep(0.3)
    node.kill9()
    node.start()
    got = drain(node, "dur-q")
    assert [b for b, _ in got] == [b"p2", b"p3", b"p4"]
    assert got[0][1], "the message delivered before the crash comes back redelivered"


def _second_server(data_dir: str) -> subprocess.CompletedProcess:
    """`warren server` on `data_dir` with ports of its own."""
    cmd = [BIN, "server", "--amqp-port", str(_free_port()), "--http-port", str(_free_port()),
           "--data-dir", data_dir]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)


def _publish_confirmed(n: Node, queue: str) -> None:
    """Declares durable `queue` and publishes one persistent message to it, confirmed."""
    c = connect(n)
    ch = c.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue, durable=True)
    ch.basic_publish("", queue, b"confirmed", PERSISTENT)
    safe_close(c)


def _files(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_a_second_server_on_the_same_data_dir_is_refused(node):
    """The reproduction of issue 29: a second server on the first one's data directory was
    accepted, and after it stopped the first server's durable queue and confirmed message were
    gone at its next start. Now the second one exits 1 at once, naming the directory and the
    holder's pid, before it reads or writes anything there."""
    node.start()
    _publish_confirmed(node, "lock-q")
    files_before = _files(node.data)

    r = _second_server(node.data)  # a refusal that hung would hit its 30 s timeout
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert node.data in r.stderr and f"pid {node.proc.pid}" in r.stderr, r.stderr
    assert "in use by another warren server" in r.stderr, r.stderr
    # Nothing was opened: no recovery, no listener.
    assert "recovered" not in r.stderr and "listening" not in r.stderr, r.stderr
    assert _files(node.data) == files_before

    # The first server keeps serving, and its queue and message survive its restart.
    c = connect(node)
    assert c.channel().queue_declare("lock-q", passive=True).method.message_count == 1
    safe_close(c)
    node.stop()
    node.start()
    assert [b for b, _ in drain(node, "lock-q")] == [b"confirmed"]


def test_a_server_killed_with_9_leaves_no_stale_lock(node):
    node.start()
    _publish_confirmed(node, "kill-lock-q")
    node.kill9()
    # The lock file (with the dead holder's pid) stays; the lock itself went with the process.
    assert os.path.exists(os.path.join(node.data, ".lock"))
    node.start()
    assert [b for b, _ in drain(node, "kill-lock-q")] == [b"confirmed"]
    # And the restarted server holds the directory in its turn.
    r = _second_server(node.data)
    assert r.returncode == 1 and f"pid {node.proc.pid}" in r.stderr, r.stderr


def test_crash_loop_loses_no_confirmed_message(node):
    """Publisher (confirms) and consumer (acks) run while the broker is killed with SIGKILL at
    random moments, 20 times. Every confirmed message must be delivered at some point or still be
    in the queue; a message delivered twice must carry redelivered; nothing unknown appears."""
    rng = random.Random(os.environ.get("CRASH_SEED", "warren"))
    queue = "crash-q"
    node.start()
    c = connect(node)
    c.channel().queue_declare(queue, durable=True)
    safe_close(c)
    next_id = [0]
    published: set[int] = set()
    confirmed: set[int] = set()
    delivered: dict[int, int] = {}
    bad_duplicates: list[int] = []

    def publisher(stop: threading.Event) -> None:
        try:
            conn = connect(node)
            ch = conn.channel()
            ch.confirm_delivery()
            while not stop.is_set():
                i = next_id[0]
                next_id[0] += 1
                published.add(i)
                ch.basic_publish("", queue, str(i).encode(), PERSISTENT)
                confirmed.add(i)
        except Exception:
            pass

    def consumer(stop: threading.Event) -> None:
        try:
            conn = connect(node)
            ch = conn.channel()
            while not stop.is_set():
                m, _, body = ch.basic_get(queue)
                if m is None:
                    conn.sleep(0.005)
                    continue
                i = int(body)
                if i in delivered and not m.redelivered:
                    bad_duplicates.append(i)
                delivered[i] = delivered.get(i, 0) + 1
                if rng.random() < 0.9:
                    ch.basic_ack(m.delivery_tag)
        except Exception:
            pass

    for _ in range(20):
        stop = threading.Event()
        threads = [threading.Thread(target=publisher, args=(stop,)), threading.Thread(target=consumer, args=(stop,))]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.1, 0.6))
        node.kill9()
        stop.set()
        for t in threads:
            t.join(15)
            assert not t.is_alive(), "client thread stuck after the broker died"
        node.start()

    rest = drain(node, queue)
    for body, _ in rest:
        delivered[int(body)] = delivered.get(int(body), 0) + 1
    assert len(confirmed) > 50, f"too little traffic to mean anything: {len(confirmed)} confirmed"
    lost = confirmed - delivered.keys()
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:10]}"
    unknown = delivered.keys() - published
    assert not unknown, f"delivered messages never published: {sorted(unknown)[:10]}"
    assert not bad_duplicates, f"delivered twice without redelivered: {bad_duplicates[:10]}"


def test_disk_full_nacks_publishes_and_recovers():
    """With writes failing (a size-limited file), persistent publishes are nacked rather than
    confirmed, the broker keeps serving, nothing confirmed is lost, and it recovers when space
    returns."""
    n = Node(fsize_limit=256 * 1024)
    try:
        n.start()
        c = connect(n)
        ch = c.channel()
        ch.queue_declare("full-q", durable=True)
        ch.confirm_delivery()
        body = b"x" * 16 * 1024
        confirmed, nacked = 0, 0
        for _ in range(64):  # 1 MiB in total: well past the limit
            try:
                ch.basic_publish("", "full-q", body, PERSISTENT)
                confirmed += 1
            except pika.exceptions.NackError:
                nacked += 1
        assert confirmed > 0 and nacked > 0, (confirmed, nacked)
        assert "nacked" in n.stderr()
        # Space returns: raise the limit of the running broker.
        resource.prlimit(n.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        ch.basic_publish("", "full-q", b"after", PERSISTENT)  # confirmed, or NackError fails the test
        safe_close(c)
        n.kill9()
        n.fsize_limit = None
        n.start()
        bodies = [b for b, _ in drain(n, "full-q")]
        assert bodies.count(body) >= confirmed, "a confirmed message was lost"
        assert bodies[-1] == b"after"
    finally:
        n.cleanup()


def _routed(n: Node, exchange: str, key: str, queues: list[str]) -> dict[str, int]:
    """Publishes one persistent message and returns how many each queue then holds (drained)."""
    c = connect(n)
    try:
        ch = c.channel()
        ch.confirm_delivery()
        ch.basic_publish(exchange, key, b"probe", PERSISTENT)
    finally:
        safe_close(c)
    return {q: len(drain(n, q)) for q in queues}


def _exists(n: Node, exchange: str | None = None, queue: str | None = None) -> bool:
    c = connect(n)
    try:
        ch = c.channel()
        if exchange is not None:
            ch.exchange_declare(exchange, passive=True)
        else:
            ch.queue_declare(queue, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 404
        return False
    finally:
        safe_close(c)


def test_journaled_definition_changes_survive_kill(node):
    """Deletes, unbinds, cascades and redeclares after the last snapshot, then kill -9."""
    node.start()
    c = connect(node)
    ch = c.channel()
    ch.exchange_declare("j-x", "direct", durable=True)
    ch.exchange_declare("j-y", "fanout", durable=True)
    ch.exchange_declare("j-ad", "fanout", durable=True, auto_delete=True)
    ch.exchange_declare("j-gone", "topic", durable=True)
    for q in ("j-q1", "j-q2", "j-q3"):
        ch.queue_declare(q, durable=True)
    ch.queue_bind("j-q1", "j-x", "k1")
    ch.queue_bind("j-q2", "j-x", "k2")
    ch.queue_bind("j-q3", "j-x", "k3")
    ch.exchange_bind("j-y", "j-x", "k1")  # j-x -> j-y on k1
    ch.queue_bind("j-q3", "j-y")
    ch.queue_bind("j-q2", "j-ad")
    ch.queue_unbind("j-q2", "j-x", "k2")
    ch.queue_delete("j-q3")  # takes its bindings from j-x and j-y
    ch.queue_unbind("j-q2", "j-ad")  # j-ad loses its last binding: auto-deleted
    ch.exchange_delete("j-gone")
    ch.queue_declare("j-q3", durable=True)  # same name, a new queue
    ch.queue_bind("j-q3", "j-x", "k3b")
    safe_close(c)
    node.kill9()
    node.start()
    qs = ["j-q1", "j-q2", "j-q3"]
    assert _routed(node, "j-x", "k1", qs) == {"j-q1": 1, "j-q2": 0, "j-q3": 0}
    assert _routed(node, "j-x", "k2", qs) == {"j-q1": 0, "j-q2": 0, "j-q3": 0}
    assert _routed(node, "j-x", "k3", qs) == {"j-q1": 0, "j-q2": 0, "j-q3": 0}
    assert _routed(node, "j-x", "k3b", qs) == {"j-q1": 0, "j-q2": 0, "j-q3": 1}
    assert _exists(node, exchange="j-y")
    assert not _exists(node, exchange="j-ad")
    assert not _exists(node, exchange="j-gone")
    # Changes after the recovery's snapshot, killed again, then a clean restart.
    c = connect(node)
    ch = c.channel()
    ch.queue_unbind("j-q1", "j-x", "k1")
    ch.queue_bind("j-q2", "j-y")
    safe_close(c)
    node.kill9()
    node.start()
    assert _routed(node, "j-x", "k1", qs) == {"j-q1": 0, "j-q2": 1, "j-q3": 0}
    node.stop()
    node.start()
    assert _routed(node, "j-x", "k1", qs) == {"j-q1": 0, "j-q2": 1, "j-q3": 0}
    assert _routed(node, "j-x", "k3b", qs) == {"j-q1": 0, "j-q2": 0, "j-q3": 1}


def test_journal_older_than_snapshot_is_ignored(node):
    """A crash between writing a new snapshot and resetting the journal leaves the old journal
    beside a snapshot that already holds its changes: replaying it again would undo later ones."""
    vhost_dir = os.path.join(node.data, "vhosts", "2f")
    node.start()
    c = connect(node)
    ch = c.channel()
    ch.queue_declare("g-q", durable=True)
    ch.queue_delete("g-q")
    safe_close(c)
    with open(os.path.join(vhost_dir, "definitions.log"), "rb") as f:
        old_journal = f.read()  # declares g-q, then deletes it
    c = connect(node)
    c.channel().queue_declare("g-q", durable=True)  # declared again, after that journal
    safe_close(c)
    node.kill9()
    node.start()  # recovers g-q and compacts: a newer snapshot, a fresh journal
    assert _exists(node, queue="g-q")
    node.stop()
    with open(os.path.join(vhost_dir, "definitions.log"), "wb") as f:
        f.write(old_journal)  # as if the crash came before the journal was reset
    node.start()
    assert _exists(node, queue="g-q"), "the stale journal's delete was replayed"


def test_auto_delete_through_a_transient_binding_survives_restart(node):
    """A durable auto-delete exchange whose last binding was to a transient queue goes when that
    queue goes, and stays gone after a crash, as in RabbitMQ."""
    node.start()
    c = connect(node)
    ch = c.channel()
    ch.exchange_declare("ad-dur", "fanout", durable=True, auto_delete=True)
    ch.exchange_declare("ad-chain", "fanout", durable=True, auto_delete=True)
    ch.exchange_bind("ad-chain", "ad-dur")  # ad-dur -> ad-chain, durable
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "ad-chain")
    safe_close(c)  # the exclusive queue goes; ad-chain loses its last binding, then ad-dur
    assert not _exists(node, exchange="ad-chain")
    assert not _exists(node, exchange="ad-dur")
    node.kill9()
    node.start()
    assert not _exists(node, exchange="ad-chain")
    assert not _exists(node, exchange="ad-dur")


def test_definitions_journal_is_compacted(node):
    """Churn on a durable queue grows the journal past its compaction point; it must be folded
    into the snapshot, not grow without bound, and recovery must still see the last state."""
    node.start()
    c = connect(node)
    ch = c.channel()
    name = "churn-" + "x" * 200  # big records: about 0.5 KB per declare-and-delete cycle
    args = {"x-max-length": 10, "x-note": "y" * 40}
    cycles = 1500
    for _ in range(cycles):
        ch.queue_declare(name, durable=True, arguments=args)
        ch.queue_delete(name)
    ch.queue_declare(name, durable=True, arguments=args)
    safe_close(c)
    log = os.path.join(node.data, "vhosts", "2f", "definitions.log")
    size = os.path.getsize(log)
    assert size < 256 * 1024 + 4096, f"journal of {size} bytes after {cycles} cycles: never compacted"
    node.kill9()
    node.start()
    assert _exists(node, queue=name)


def test_definition_that_cannot_be_written_is_refused():
    """With the definitions files unable to grow (a size-limited file), a durable declare or
    bind gets 541 INTERNAL_ERROR instead of an ok, is not applied, and nothing that did get an
    ok is lost; once writes work again, so do declares."""
    n = Node(fsize_limit=64 * 1024)
    try:
        n.start()
        prefix = "full-defs-" + "d" * 200 + "-"  # about 0.3 KB per journal record
        declared: list[str] = []
        refused = None
        c = connect(n)
        ch = c.channel()
        for i in range(2000):
            try:
                ch.queue_declare(f"{prefix}{i}", durable=True)
                declared.append(f"{prefix}{i}")
            except pika.exceptions.ConnectionClosedByBroker as e:
                assert e.reply_code == 541, e
                assert "cannot write the definitions" in e.reply_text, e
                refused = f"{prefix}{i}"
                break
        assert refused is not None, f"{len(declared)} durable declares past a 64 KiB file limit all got an ok"
        assert len(declared) > 50, "refused before the limit could have been reached"
        assert not _exists(n, queue=refused), "a refused declare was applied in memory"
        vhost_dir = os.path.join(n.data, "vhosts", "2f")
        assert not os.path.exists(os.path.join(vhost_dir, "definitions.tmp")), "a failed rewrite left its partial copy"
        # A bind is refused the same way and does not route.
        c = connect(n)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
            c.channel().queue_bind(declared[0], "amq.direct", "refused-key")
        assert e.value.reply_code == 541
        safe_close(c)
        # Space returns: raise the limit of the running broker.
        resource.prlimit(n.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        c = connect(n)
        c.channel().queue_declare("after-full", durable=True)
        safe_close(c)
        n.kill9()
        n.fsize_limit = None
        n.start()
        for q in (declared[0], declared[-1], "after-full"):
            assert _exists(n, queue=q), f"{q} got declare-ok and was lost"
        assert not _exists(n, queue=refused), "a refused declare came back after a restart"
        assert _routed(n, "amq.direct", "refused-key", [declared[0]]) == {declared[0]: 0}
    finally:
        n.cleanup()
