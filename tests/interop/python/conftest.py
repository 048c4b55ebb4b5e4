"""Broker fixtures for the Warren interop suite.

* WARREN_BIN set: start `$WARREN_BIN server --amqp-port P --http-port H --data-dir DIR` once per
  session (and once per test for `fresh_broker`), on free loopback ports, and stop it afterwards.
* Otherwise: use AMQP_URL (default: the reference RabbitMQ 3.10 on 127.0.0.1:5673) and start nothing.
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

from helpers import connect, safe_close, uname  # noqa: E402

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5673/%2f"
DEFAULT_MGMT_URL = "http://127.0.0.1:15673"
# The session broker's management API port, once `amqp_url` started one.
_SESSION: dict = {}
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


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
               "--http-port", str(self.http_port), "--data-dir", self.data_dir]
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


@pytest.fixture(scope="session")
def amqp_url():
    """URL of the broker under test (session-wide)."""
    binary = os.environ.get("WARREN_BIN")
    if not binary:
        yield _external_url()
        return
    # WARREN_SESSION_CONFIG: TOML for the session broker (e.g. to run the suite with a setting
    # that is off by default).
    w = WarrenProcess(binary, config=os.environ.get("WARREN_SESSION_CONFIG"))
    w.start()
    _SESSION["http_port"] = w.http_port
    try:
        yield w.url
    finally:
        w.stop()


@pytest.fixture(scope="session")
def mgmt_url(amqp_url):
    """Management API base URL (guest/guest) of the `amqp_url` broker: the session Warren's, or
    MGMT_URL (default: the reference RabbitMQ's, http://127.0.0.1:15673)."""
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
