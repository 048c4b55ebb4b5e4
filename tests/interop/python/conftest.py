"""Broker fixtures for the Warren interop suite.

* WARREN_BIN set: start `$WARREN_BIN server --amqp-port P --http-port H --data-dir DIR` once per
  session (and once per test for `fresh_broker`), on free loopback ports, and stop it afterwards.
* Otherwise: use AMQP_URL (default: the reference RabbitMQ 3.10 on 127.0.0.1:5673) and start nothing.

Cluster mode (WARREN_CLUSTER=1, with WARREN_BIN): the session broker is a 3-node cluster
(cluster_harness.Cluster: warren1@localhost, warren2@localhost, warren3@localhost) whose nodes all
run with `queue_master_locator = "min-masters"` (plus WARREN_SESSION_CONFIG's TOML, if set), and
the suite talks to node 2: `amqp_url` is node 2's AMQP URL, `mgmt_url` node 2's HTTP API. Once the
cluster is ready, node 2 gets "ballast": WARREN_CLUSTER_BALLAST (default 1000) non-durable,
non-exclusive queues `warren.ballast.N` declared through it with `x-queue-master-locator:
client-local`, so that min-masters never picks node 2 and every non-exclusive queue a test declares
without a locator of its own lives on node 1 or 3 (exclusive queues live on their connection's
node, node 2). The start checks it: a queue declared through node 2 without arguments must not be
reported on warren2@localhost. So every test exercises the forwarding between nodes.

* `cluster_mode` (session fixture): the Cluster in cluster mode, None otherwise; a test can talk to
  the other nodes through it (`cluster_mode.nodes[0]`, ...; `SESSION_NODE` is node 2's index).
* `@pytest.mark.single_node("why")`: the test cannot run through a cluster node by its nature
  (e.g. it needs the one node's view of the whole broker); skipped in cluster mode with that
  reason. Not for hiding a divergence between a cluster node and a single broker.
* A failing test's report carries each node's log since the test began.
* `fresh_broker` stays a single node of the test's own.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pika
import pytest

# The cluster harness holds assertions (and fixtures) of the cluster test modules: pytest rewrites
# its asserts as it does theirs, so a failing one explains its values. Before anything imports it.
pytest.register_assert_rewrite("cluster_harness")

from helpers import connect, safe_close, uname, wait_until  # noqa: E402

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5673/%2f"
DEFAULT_MGMT_URL = "http://127.0.0.1:15673"
# The session broker's management API port, once `amqp_url` started one.
_SESSION: dict = {}
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0

# Cluster mode: see the docstring above.
CLUSTER_CONFIG = 'queue_master_locator = "min-masters"\n'
BALLAST_PREFIX = "warren.ballast."
SESSION_NODE = 1  # the suite's node in cluster mode: nodes[1], warren2@localhost


def cluster_mode_on() -> bool:
    """Whether the suite runs in cluster mode (WARREN_CLUSTER set, not "0", with WARREN_BIN)."""
    return os.environ.get("WARREN_CLUSTER", "") not in ("", "0") and bool(os.environ.get("WARREN_BIN"))


_GIVEN_PORTS: set = set()


def _free_port() -> int:
    """A free loopback port below the kernel's ephemeral range. A port from bind(0) is an
    ephemeral one: a client socket can take it as its source port before the broker binds it
    (EADDRINUSE), and a connect() loop can connect to itself. Never the same port twice."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = (random.randrange(10000, low) for _ in range(1000)) if low > 11000 else ()
    for port in candidates:
        if port in _GIVEN_PORTS:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN_PORTS.add(port)
        return port
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN_PORTS:
            _GIVEN_PORTS.add(port)
            return port


class WarrenProcess:
    def __init__(self, binary: str, config: str | None = None):
        """`config`: TOML text for `--config` (flags still set the ports and data dir)."""
        self.binary = binary
        self.config = config
        self.dir = tempfile.mkdtemp(prefix="warren-interop-")
        self.amqp_port = _free_port()
        self.http_port = _free_port()
        while self.http_port == self.amqp_port:
            self.http_port = _free_port()
        self.stream_port = _free_port()
        while self.stream_port in (self.amqp_port, self.http_port):
            self.stream_port = _free_port()
        self.data_dir = os.path.join(self.dir, "data")
        os.makedirs(self.data_dir)
        self.stdout_path = os.path.join(self.dir, "stdout.log")
        self.stderr_path = os.path.join(self.dir, "stderr.log")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2f"

    def _stderr(self) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read()[-8000:].decode("utf-8", "replace")
        except OSError:
            return ""

    def start(self) -> None:
        cmd = [self.binary, "server", "--amqp-port", str(self.amqp_port),
               "--http-port", str(self.http_port), "--stream-port", str(self.stream_port),
               "--data-dir", self.data_dir]
        if self.config is not None:
            path = os.path.join(self.dir, "warren.toml")
            with open(path, "w") as f:
                f.write(self.config)
            cmd += ["--config", path]
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise RuntimeError(f"warren exited with status {rc} before accepting connections: "
                                   f"{' '.join(cmd)}\n--- stderr ---\n{self._stderr()}")
            try:
                with socket.create_connection(("127.0.0.1", self.amqp_port), timeout=0.5):
                    return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                self.stop()
                raise RuntimeError(f"warren did not accept AMQP connections on port {self.amqp_port} "
                                   f"within {START_TIMEOUT}s\n--- stderr ---\n{self._stderr()}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT)
        shutil.rmtree(self.dir, ignore_errors=True)


def _external_url() -> str:
    return os.environ.get("AMQP_URL") or DEFAULT_URL


def pytest_configure(config):
    if os.environ.get("WARREN_CLUSTER", "") not in ("", "0") and not os.environ.get("WARREN_BIN"):
        raise pytest.UsageError("WARREN_CLUSTER=1 (cluster mode) starts a Warren cluster: set WARREN_BIN too")


def pytest_collection_modifyitems(config, items):
    """Cluster mode skips the tests marked single_node, with the marker's reason."""
    if not cluster_mode_on():
        return
    for item in items:
        m = item.get_closest_marker("single_node")
        if m is not None:
            why = m.args[0] if m.args else m.kwargs.get("reason", "single-node only")
            item.add_marker(pytest.mark.skip(reason=f"single node only (WARREN_CLUSTER=1): {why}"))


def pytest_runtest_setup(item):
    c = _SESSION.get("cluster")
    if c is not None:
        c.mark_logs()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    c = _SESSION.get("cluster")
    if c is not None and rep.failed:
        rep.sections.append(("warren session cluster node logs", c.log_report()))


def _ballast(node, count: int) -> None:
    """`count` queues warren.ballast.N declared through node with x-queue-master-locator:
    client-local, so that they live on node. Pipelined (nowait) on a raw connection; a passive
    declare of the last one afterwards waits for all of them (one channel: in order)."""
    import rawamqp

    with rawamqp.RawConnection("127.0.0.1", node.amqp_port, timeout=60.0) as c:
        c.handshake()
        c.open_channel(1)
        batch = []
        for i in range(count):
            batch.append(rawamqp.queue_declare(1, f"{BALLAST_PREFIX}{i}", nowait=True,
                                               arguments={"x-queue-master-locator": "client-local"}))
            if len(batch) == 100:
                c.send(b"".join(batch))
                batch = []
        c.send(b"".join(batch))
        c.send(rawamqp.queue_declare(1, f"{BALLAST_PREFIX}{count - 1}", passive=True))
        f = c.recv_frame(timeout=60.0)
        if f.method != rawamqp.QUEUE_DECLARE_OK:
            raise RuntimeError(f"ballast declares through {node.name} failed: {f!r}")
        c.send(rawamqp.connection_close())
        c.wait_closed(timeout=5.0)


def _start_session_cluster():
    """The cluster of cluster mode, ready, with node 2's ballast, and checked: a queue declared
    through node 2 without arguments lives on another node."""
    from cluster_harness import Cluster  # not at the top: cluster_harness imports conftest

    config = CLUSTER_CONFIG + (os.environ.get("WARREN_SESSION_CONFIG") or "")
    c = Cluster("session", config=config)
    try:
        c.start()
        node = c.nodes[SESSION_NODE]
        names = sorted(n.name for n in c.nodes)

        def members_running():
            for n in c.nodes:
                st, rows = n.api("GET", "/api/nodes", timeout=2)
                if st != 200 or sorted(r["name"] for r in rows if r.get("running")) != names:
                    return False
            return True
        wait_until(members_running, timeout=30, interval=0.1, what=f"every node's /api/nodes to list {names} running")
        _ballast(node, int(os.environ.get("WARREN_CLUSTER_BALLAST", "1000")))
        probe = uname("cluster-mode-probe")
        cn = connect(node.url)
        try:
            cn.channel().queue_declare(probe)
            st, row = node.api("GET", f"/api/queues/%2f/{probe}")
            if st != 200 or row.get("node") in (None, node.name):
                raise RuntimeError(f"cluster mode: a queue declared through {node.name} without arguments "
                                   f"should live on another node (min-masters and the ballast); "
                                   f"GET /api/queues/%2f/{probe}: {st} {row}")
            cn.channel().queue_delete(probe)
        finally:
            safe_close(cn)
    except BaseException:
        _stop_cluster(c)
        raise
    return c


def _check_ballast(c) -> None:
    """At the end of the session: a warning if the other nodes now hold as many queues as node 2
    (the tests left that many behind), i.e. if min-masters may have picked node 2 late in the run
    (then WARREN_CLUSTER_BALLAST should be raised)."""
    import warnings

    try:
        st, rows = c.nodes[SESSION_NODE].api("GET", "/api/queues", timeout=30)
    except (OSError, ValueError):
        return
    if st != 200 or not isinstance(rows, list):
        return
    per_node = {n.name: 0 for n in c.nodes}
    for r in rows:
        if r.get("node") in per_node:
            per_node[r["node"]] += 1
    mine = per_node.pop(c.nodes[SESSION_NODE].name)
    if per_node and min(per_node.values()) >= mine:
        warnings.warn(f"cluster mode: at the end of the run the other nodes hold {per_node} queues and node 2 "
                      f"{mine}: min-masters may have placed queues on node 2; raise WARREN_CLUSTER_BALLAST")


def _stop_cluster(c) -> None:
    """SIGTERM to every node at once (one by one, the last ones may wait for the gone ones), then
    Cluster.stop (waits, SIGKILL after its timeout, removes the directory)."""
    for n in c.nodes:
        if n.running:
            n.proc.send_signal(signal.SIGTERM)
    c.stop()


@pytest.fixture(scope="session")
def cluster_mode():
    """Cluster mode's cluster_harness.Cluster (the suite runs through nodes[SESSION_NODE],
    warren2@localhost), or None when the suite runs against one broker."""
    if not cluster_mode_on():
        yield None
        return
    c = _start_session_cluster()
    _SESSION["cluster"] = c
    node = c.nodes[SESSION_NODE]
    _SESSION["http_port"] = node.http_port
    try:
        yield c
        _check_ballast(c)
    finally:
        _SESSION.pop("cluster", None)
        _stop_cluster(c)


@pytest.fixture(scope="session")
def amqp_url(cluster_mode):
    """URL of the broker under test (session-wide); in cluster mode, node 2's."""
    if cluster_mode is not None:
        yield cluster_mode.nodes[SESSION_NODE].url
        return
    binary = os.environ.get("WARREN_BIN")
    if not binary:
        yield _external_url()
        return
    # WARREN_SESSION_CONFIG: TOML for the session broker (e.g. to run the suite with a setting
    # that is off by default).
    w = WarrenProcess(binary, config=os.environ.get("WARREN_SESSION_CONFIG"))
    w.start()
    _SESSION["http_port"] = w.http_port
    _SESSION["stream_port"] = w.stream_port
    try:
        yield w.url
    finally:
        w.stop()


@pytest.fixture(scope="session")
def stream_port(amqp_url, cluster_mode):
    """The stream protocol's port of the `amqp_url` broker: the session Warren's, or STREAM_PORT
    (default: the reference RabbitMQ's, 5553). Not in cluster mode (streams are single-node)."""
    if cluster_mode is not None:
        pytest.skip("the stream protocol runs on a single node")
    if "stream_port" in _SESSION:
        return _SESSION["stream_port"]
    return int(os.environ.get("STREAM_PORT", "5553"))


@pytest.fixture(scope="session")
def mgmt_url(amqp_url):
    """Management API base URL (guest/guest) of the `amqp_url` broker: the session Warren's (in
    cluster mode node 2's), or MGMT_URL (default: the reference RabbitMQ's, http://127.0.0.1:15673)."""
    if "http_port" in _SESSION:
        return f"http://127.0.0.1:{_SESSION['http_port']}"
    return os.environ.get("MGMT_URL") or DEFAULT_MGMT_URL


@pytest.fixture
def fresh_broker():
    """URL of a broker of this test's own. Only with WARREN_BIN; otherwise the shared AMQP_URL
    broker is returned (tests using it must still use unique names)."""
    binary = os.environ.get("WARREN_BIN")
    if not binary:
        yield _external_url()
        return
    w = WarrenProcess(binary)
    w.start()
    try:
        yield w.url
    finally:
        w.stop()


@pytest.fixture
def conn(amqp_url):
    c = connect(amqp_url)
    yield c
    safe_close(c)


@pytest.fixture
def ch(conn):
    return conn.channel()


class Resources:
    """Names a test declares; whatever is left is deleted at teardown on a separate connection."""

    def __init__(self, url: str):
        self.url = url
        self.queues: list[str] = []
        self.exchanges: list[str] = []

    def queue(self, prefix: str = "q") -> str:
        name = uname(prefix)
        self.queues.append(name)
        return name

    def exchange(self, prefix: str = "x") -> str:
        name = uname(prefix)
        self.exchanges.append(name)
        return name

    def track_queue(self, name: str) -> str:
        self.queues.append(name)
        return name

    def cleanup(self) -> None:
        if not self.queues and not self.exchanges:
            return
        c = None
        try:
            c = connect(self.url)
            ch = c.channel()
            for kind, names in (("queue", self.queues), ("exchange", self.exchanges)):
                for n in names:
                    try:
                        if kind == "queue":
                            ch.queue_delete(n)
                        else:
                            ch.exchange_delete(n)
                    except pika.exceptions.ChannelClosed:
                        ch = c.channel()  # e.g. still exclusively owned by a live connection
        except Exception:
            pass
        finally:
            safe_close(c)


@pytest.fixture
def res(amqp_url):
    r = Resources(amqp_url)
    yield r
    r.cleanup()
