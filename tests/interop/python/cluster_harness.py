"""The 3-node Warren cluster harness of the cluster test modules (test_cluster.py, test_quorum.py).

Not a test module: a test module imports what it uses, fixtures included (pytest finds a fixture
in the test module's namespace, imported or not), e.g.

    from cluster_harness import (_mark_logs, _node_logs, chans, cluster, conns, lossy, names,
                                 needs_warren_bin, ...)
    pytestmark = needs_warren_bin

Each test module that imports them gets its own module-scoped `cluster` and `lossy` clusters.
`_node_logs` (module-scoped, autouse) and `_mark_logs` (autouse) must be imported too: with them a
failing test's report carries the tail of each node's log (since the test began).

Nodes run on loopback, each with fixed ports and data dir for its whole life, so that a node
restarts as the same node; they are named warren1@localhost, warren2@localhost, ...
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pika
import pika.exceptions
import pytest

from conftest import _free_port
from helpers import connect, params, safe_close, uname, wait_until

BIN = os.environ.get("WARREN_BIN")
# A test module using the harness sets `pytestmark = needs_warren_bin`.
needs_warren_bin = pytest.mark.skipif(not BIN, reason="starts its own 3-node Warren cluster (WARREN_BIN); "
                                                      "the reference RabbitMQ is a single node")

PERSISTENT = pika.BasicProperties(delivery_mode=2)
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
LOG_TAIL = 6000


def q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


# ---------------------------------------------------------------------------------------------
# The cluster harness


class ClusterNode:
    """One node: fixed ports and data dir for its whole life, so it restarts as the same node."""

    def __init__(self, cluster: "Cluster", index: int, name: str | None = None,
                 cookie: str | None = None):
        self.cluster = cluster
        self.name = name or f"warren{index}@localhost"
        self.amqp_port = _free_port()
        self.http_port = _free_port()
        self.link_port = _free_port()
        # The stream protocol's port, when the cluster runs it (`Cluster(stream=True)`).
        self.stream_port = _free_port() if cluster.stream else None
        self.cookie = cookie if cookie is not None else cluster.cookie
        self.data_dir = os.path.join(cluster.dir, f"n{index}")
        os.makedirs(self.data_dir)
        self.log_path = os.path.join(cluster.dir, f"n{index}.log")
        self.proc: subprocess.Popen | None = None

    @property
    def link_addr(self) -> str:
        return f"127.0.0.1:{self.link_port}"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2f"

    def params(self, **overrides) -> pika.URLParameters:
        return params(self.url, **overrides)

    def command(self, peers: list[str]) -> list[str]:
        cmd = [BIN, "server", "--node-name", self.name, "--data-dir", self.data_dir,
               "--amqp-port", str(self.amqp_port), "--http-port", str(self.http_port),
               "--cluster-listen", self.link_addr, "--cluster-peers", ",".join(peers)]
        if self.cluster.config_path is not None:
            cmd += ["--config", self.cluster.config_path]
        if self.stream_port is not None:
            cmd += ["--stream-port", str(self.stream_port)]
        return cmd

    def start(self, peers: list[str] | None = None) -> None:
        assert not self.running, f"{self.name} is already running"
        env = dict(os.environ, WARREN_COOKIE=self.cookie)
        env.pop("WARREN_LOG", None)  # the default log level: what the tests look for is at info
        with open(self.log_path, "ab") as log:
            log.write(f"=== {time.strftime('%H:%M:%S')} starting {self.name}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.command(peers or self.cluster.peers), env=env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.running:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within STOP_TIMEOUT."""
        if self.running:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT)

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def log_size(self) -> int:
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def api(self, method: str, path: str, body=None, timeout: float = 10.0):
        """(status, decoded JSON or None) of a management API call as guest."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.http_port}{path}", method=method, data=data)
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        req.add_header("content-type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                text = r.read()
                return r.status, (json.loads(text) if text.strip() else None)
        except urllib.error.HTTPError as e:
            text = e.read()
            try:
                return e.code, (json.loads(text) if text.strip() else None)
            except ValueError:
                return e.code, text.decode("utf-8", "replace")

    def is_ready(self) -> bool:
        try:
            st, _ = self.api("GET", "/api/overview", timeout=2)
            if st != 200:
                return False
            st, vhosts = self.api("GET", "/api/vhosts", timeout=2)
            return st == 200 and any(v.get("name") == "/" for v in vhosts)
        except (OSError, ValueError):
            return False

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not self.is_ready():
            if not self.running:
                raise AssertionError(f"{self.name} exited with status {self.proc.returncode} before "
                                     f"it was ready\n{self.log()[-LOG_TAIL:]}")
            if time.monotonic() >= deadline:
                raise AssertionError(f"{self.name} did not answer /api/overview and list vhost '/' "
                                     f"within {timeout}s\n{self.log()[-LOG_TAIL:]}")
            time.sleep(0.05)


class Cluster:
    def __init__(self, label: str, size: int = 3, config: str | None = None, stream: bool = False):
        """`config`: TOML for every node's `--config`; by default WARREN_CLUSTER_CONFIG's (to run
        the cluster suites with a setting that is off by default), or none. `stream`: every node
        also runs the stream protocol, each on a port of its own (`ClusterNode.stream_port`)."""
        self.label = label
        self.stream = stream
        self.config = config if config is not None else os.environ.get("WARREN_CLUSTER_CONFIG")
        self.dir = tempfile.mkdtemp(prefix=f"warren-cluster-{label}-")
        # Written once: nodes starting together read it while another starts.
        self.config_path: str | None = None
        if self.config is not None:
            self.config_path = os.path.join(self.dir, "warren.toml")
            with open(self.config_path, "w") as f:
                f.write(self.config)
        self.cookie = uuid.uuid4().hex
        self.nodes = [ClusterNode(self, i + 1) for i in range(size)]
        self.extra: list[ClusterNode] = []  # nodes started by a test that are no members
        self.log_marks: dict[str, int] = {}

    @property
    def peers(self) -> list[str]:
        return [n.link_addr for n in self.nodes]

    def all_nodes(self) -> list[ClusterNode]:
        return self.nodes + self.extra

    def start(self) -> None:
        for n in self.nodes:
            n.start()
        for n in self.nodes:
            n.wait_ready()
        # Formed, as an operator waits for it (rabbitmqctl await_online_nodes): every node sees
        # every member running, i.e. linked to it. Answering HTTP alone says nothing of links.
        _wait_running(self.nodes, {n.name: True for n in self.nodes}, timeout=READY_TIMEOUT)

    def stop(self) -> None:
        for n in self.all_nodes():
            try:
                n.stop()
            except Exception:
                n.kill9()
        shutil.rmtree(self.dir, ignore_errors=True)

    def mark_logs(self) -> None:
        self.log_marks = {n.log_path: n.log_size() for n in self.all_nodes()}

    def log_report(self) -> str:
        out = []
        for n in self.all_nodes():
            text = n.log()
            since = self.log_marks.get(n.log_path, 0)
            part = text[since:] if since < len(text) else text
            state = "running" if n.running else f"not running ({n.proc.returncode if n.proc else 'never started'})"
            out.append(f"--- {n.name} ({state}; AMQP {n.amqp_port}, HTTP {n.http_port}, link {n.link_port}) "
                       f"log{' since the test began' if since else ''} ---\n{part[-LOG_TAIL:]}")
        return "\n".join(out)


class _NodeLogsOnFailure:
    """A pytest plugin (registered while a test module that imports `_node_logs` runs): a failed
    test of that module gets, in its report, the node logs of the clusters it used."""

    def __init__(self) -> None:
        self.clusters: list[Cluster] = []
        self.modules: set[str] = set()  # __name__ of the test module now running

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        rep = outcome.get_result()
        module = getattr(item, "module", None)
        if rep.failed and module is not None and module.__name__ in self.modules:
            for c in self.clusters:
                rep.sections.append((f"warren cluster '{c.label}' node logs", c.log_report()))


_LOGS = _NodeLogsOnFailure()


@pytest.fixture(scope="module", autouse=True)
def _node_logs(request):
    """Module-scoped and autouse: a test module gets it by importing it (as it does `cluster`,
    `conns`, ...). One module at a time runs it: pytest tears a module's fixtures down before the
    next module's are set up."""
    request.config.pluginmanager.register(_LOGS, "warren-cluster-node-logs")
    _LOGS.modules.add(request.module.__name__)
    try:
        yield _LOGS
    finally:
        request.config.pluginmanager.unregister(_LOGS)
        _LOGS.clusters.clear()
        _LOGS.modules.clear()


@pytest.fixture(autouse=True)
def _mark_logs():
    for c in _LOGS.clusters:
        c.mark_logs()
    yield


def _cluster(label: str, config: str | None = None, stream: bool = False):
    c = Cluster(label, config=config, stream=stream)
    _LOGS.clusters.append(c)
    try:
        c.start()
        c.mark_logs()
        yield c
    finally:
        c.stop()
        if c in _LOGS.clusters:
            _LOGS.clusters.remove(c)


@pytest.fixture(scope="module")
def cluster():
    """Three running nodes for the non-destructive tests."""
    yield from _cluster("main")


@pytest.fixture(scope="module")
def lossy():
    """Three nodes for the tests that kill nodes; every such test restarts what it killed."""
    yield from _cluster("lossy")


@pytest.fixture
def conns():
    """open(node) -> a connection to that node; all are closed when the test ends."""
    opened: list[pika.BlockingConnection] = []

    def open_(node, **overrides) -> pika.BlockingConnection:
        """node: a ClusterNode (as guest on "/") or an amqp:// URL."""
        p = node.params(**overrides) if isinstance(node, ClusterNode) else params(node, **overrides)
        c = pika.BlockingConnection(p)
        opened.append(c)
        return c

    yield open_
    for c in opened:
        safe_close(c)


@pytest.fixture
def chans(conns):
    """ch(node) -> a fresh channel on a fresh connection to that node."""
    return lambda node: conns(node).channel()


@pytest.fixture
def names(cluster):
    """Unique queue and exchange names, deleted at the end of the test (through a running node)."""
    made: dict[str, list[str]] = {"queue": [], "exchange": []}

    def name(kind: str, prefix: str = "") -> str:
        n = uname(prefix or kind[0])
        made[kind].append(n)
        return n

    yield name
    node = next((n for n in cluster.nodes if n.running), None)
    if node is None:
        return
    c = None
    try:
        c = connect(node.url)
        ch = c.channel()
        for kind, ns in made.items():
            for n in ns:
                try:
                    ch.queue_delete(n) if kind == "queue" else ch.exchange_delete(n)
                except pika.exceptions.ChannelClosed:
                    ch = c.channel()
    except Exception:
        pass
    finally:
        safe_close(c)


# ---------------------------------------------------------------------------------------------
# Helpers



def publish_until_confirmed(node: ClusterNode, qn: str, bodies: list[bytes], timeout: float = 30.0) -> None:
    """Publishes each body (persistent, through the default exchange) until the broker confirms
    it: a nack or a lost connection during a failover is retried, so a message may be stored
    twice (at-least-once), never lost."""
    deadline = time.monotonic() + timeout
    pending = list(bodies)
    while pending:
        assert time.monotonic() < deadline, f"{len(pending)} publishes not confirmed in {timeout}s"
        try:
            conn = pika.BlockingConnection(node.params())
            ch = conn.channel()
            ch.confirm_delivery()
            while pending:
                ch.basic_publish("", qn, pending[0], PERSISTENT)
                pending.pop(0)
            safe_close(conn)
        except (pika.exceptions.AMQPError, OSError):
            time.sleep(0.2)


def expect_channel_error(fn, code: int) -> pika.exceptions.ChannelClosedByBroker:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        fn()
    assert e.value.reply_code == code, f"expected {code}, got {e.value.reply_code} {e.value.reply_text!r}"
    return e.value


def confirmed(ch, exchange: str, key: str, bodies, props=None, mandatory: bool = True) -> None:
    """Publish each body on a confirm-mode channel; pika raises NackError on a nack and (the
    publish being mandatory) UnroutableError if no queue took it, e.g. when the publishing
    node does not know the queue."""
    for b in bodies:
        ch.basic_publish(exchange, key, b, props, mandatory=mandatory)


def drain(ch, queue: str) -> list[bytes]:
    out = []
    while True:
        m, _, body = ch.basic_get(queue, auto_ack=True)
        if m is None:
            return out
        out.append(body)


def node_rows(node: ClusterNode) -> dict[str, dict]:
    st, rows = node.api("GET", "/api/nodes")
    assert st == 200, (st, rows)
    return {r["name"]: r for r in rows}


def bindings(node: ClusterNode, source: str, queue: str) -> list[str]:
    """Routing keys of the bindings from exchange source to queue, as node's API lists them."""
    st, rows = node.api("GET", "/api/bindings/%2f")
    assert st == 200, (st, rows)
    return sorted(r["routing_key"] for r in rows if r["source"] == source
                  and r["destination_type"] == "queue" and r["destination"] == queue)


def bodies(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]

# ---------------------------------------------------------------------------------------------
# Node loss


def _passive_outcome(node: ClusterNode, qn: str):
    """("ok", message_count) or ("error", code, text) of a passive declare through node."""
    c = None
    try:
        c = pika.BlockingConnection(node.params())
        ok = c.channel().queue_declare(qn, passive=True).method
        return ("ok", ok.message_count)
    except pika.exceptions.ChannelClosedByBroker as e:
        return ("error", e.reply_code, e.reply_text)
    finally:
        safe_close(c)


def _declare_exchange_with_retry(node: ClusterNode, x: str, timeout: float, kind: str = "fanout") -> list:
    """exchange.declare through node, on a fresh connection each try, until it succeeds (a new
    Raft leader may take a few seconds); returns the failures seen meanwhile."""
    failures = []
    deadline = time.monotonic() + timeout
    while True:
        c = None
        try:
            c = pika.BlockingConnection(node.params())
            c.channel().exchange_declare(x, kind, durable=True)
            return failures
        except (pika.exceptions.ChannelClosedByBroker, pika.exceptions.ConnectionClosedByBroker) as e:
            failures.append((e.reply_code, e.reply_text))
        except pika.exceptions.AMQPConnectionError as e:
            failures.append(("connection", repr(e)))
        finally:
            safe_close(c)
        if time.monotonic() >= deadline:
            raise AssertionError(f"exchange.declare through {node.name} still failing after {timeout}s: {failures[-3:]}")
        time.sleep(0.2)


def _wait_running(nodes: list[ClusterNode], want: dict[str, bool], timeout: float = 15) -> None:
    def ok():
        for n in nodes:
            rows = node_rows(n)
            if {k: rows.get(k, {}).get("running") for k in want} != want:
                return False
        return True
    try:
        wait_until(ok, timeout=timeout, interval=0.2, what=f"/api/nodes to report {want}")
    except AssertionError:
        seen = {n.name: {k: v.get("running") for k, v in node_rows(n).items()} for n in nodes}
        raise AssertionError(f"/api/nodes did not report {want} within {timeout}s; it reports {seen}")


def _leader(nodes: list[ClusterNode]) -> ClusterNode | None:
    """The metadata (Raft) leader, as Warren's cluster status endpoint names it, if it does."""
    for n in nodes:
        st, body = n.api("GET", "/api/warren/cluster")
        if st == 200 and isinstance(body, dict):
            found = [m for m in nodes if m.name == body.get("leader")]
            if found:
                return found[0]
    return None
