"""examples/monitor (the capstone's remote system monitor), end to end: two agents and one
receiver run as subprocesses against the broker under test; the receiver's /hosts.json fills
with both hosts and their figures, and a stopped agent leaves the table after the drop timeout
while the other stays. Plain pika and the standard library, so it runs unchanged against
RabbitMQ. Waits are bounded only as hang guards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

from helpers import uname, wait_until

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "monitor")
INTERVAL = "0.2"
DROP_TIMEOUT = "1.5"
HANG_GUARD = 20.0


class Proc:
    """A script of the example run with this interpreter; its stderr goes to a file that a
    failing test shows."""

    def __init__(self, script: str, *args: str) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix=f"monitor-{script}-", suffix=".log", delete=False)
        self.p = subprocess.Popen([sys.executable, "-u", os.path.join(EXAMPLE, script), *args],
                                  stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL,
                                  text=True)

    def stderr(self) -> str:
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()[-4000:]

    def stop(self) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                return self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(10)
        return self.p.returncode

    def close(self) -> None:
        self.stop()
        if self.p.stdout:
            self.p.stdout.close()
        self.log.close()
        os.unlink(self.log.name)


@pytest.fixture
def procs():
    started: list[Proc] = []

    def start(script: str, *args: str) -> Proc:
        p = Proc(script, *args)
        started.append(p)
        return p
    yield start
    for p in started:
        p.close()


def table(url: str) -> dict:
    with urllib.request.urlopen(url + "hosts.json", timeout=5) as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == "application/json"
        return json.load(r)


def hosts(url: str) -> dict[str, dict]:
    return {row["host"]: row for row in table(url)["hosts"]}


def test_two_agents_fill_the_table_and_a_stopped_one_leaves_it(amqp_url, procs):
    receiver = procs("receiver.py", "--uri", amqp_url, "--http-port", "0", "--timeout", DROP_TIMEOUT)
    line = receiver.p.stdout.readline()
    assert line.startswith("serving http://"), f"receiver said {line!r}\n{receiver.stderr()}"
    url = line.split()[1]
    # The receiver's queue is bound once its log says it consumes; samples before that are lost.
    wait_until(lambda: "consuming from" in receiver.stderr() or receiver.p.poll() is not None,
               timeout=HANG_GUARD, what="the receiver to consume")
    assert receiver.p.poll() is None, receiver.stderr()

    a, b = uname("host-a"), uname("host-b")
    agent_a = procs("agent.py", "--uri", amqp_url, "--name", a, "--interval", INTERVAL)
    agent_b = procs("agent.py", "--uri", amqp_url, "--name", b, "--interval", INTERVAL)

    def both_with_cpu():
        # The second sample of each carries the CPU and network rates (the first has none).
        t = hosts(url)
        return all(h in t and t[h]["sample"]["cpu_percent"] is not None for h in (a, b)) and t
    t = wait_until(both_with_cpu, timeout=HANG_GUARD, interval=0.1,
                   what=f"{a} and {b} in the table\nagent a: {agent_a.stderr()}\nreceiver: {receiver.stderr()}")
    for h in (a, b):
        row = t[h]
        s = row["sample"]
        assert s["host"] == h and s["simulated"] is False
        assert row["samples"] >= 2
        # The agent itself runs as it reads /proc/stat; tasks (threads) count every process.
        assert 1 <= s["procs_running"] <= s["threads_total"] and s["procs_total"] >= 1
        assert 0 < s["mem_available_bytes"] <= s["mem_total_bytes"]
        assert 0 <= s["disk_free_bytes"] <= s["disk_total_bytes"] and s["disk_total_bytes"] > 0
        assert 0.0 <= s["cpu_percent"] <= 100.0
        assert s["net_rx_rate"] is not None and s["net_rx_bytes"] >= 0
        assert abs(s["timestamp"] - time.time()) < 60, "timestamp is the agent's Unix time"
    info = table(url)["receiver"]
    assert info["connected"] is True and info["shard"] is None and info["rejected"] == 0

    # The page itself serves the table's script (it polls hosts.json).
    with urllib.request.urlopen(url, timeout=5) as r:
        page = r.read().decode()
    assert "hosts.json" in page and "<table" in page

    assert agent_a.stop() == 0, agent_a.stderr()
    samples_b = t[b]["samples"]
    wait_until(lambda: a not in hosts(url), timeout=HANG_GUARD, interval=0.1,
               what=f"{a} to leave the table\nreceiver: {receiver.stderr()}")
    t = hosts(url)
    assert b in t and t[b]["samples"] > samples_b, "the running agent stays and keeps reporting"
    # The receiver's loop drops (and logs) it; /hosts.json already leaves out a host past the timeout.
    wait_until(lambda: f"host {a} dropped: not heard from for {DROP_TIMEOUT} s" in receiver.stderr(),
               timeout=HANG_GUARD, what=f"the receiver to log {a}'s drop\n{receiver.stderr()}")
    assert f"host {b} dropped" not in receiver.stderr()
    assert agent_b.stop() == 0, agent_b.stderr()
    assert receiver.stop() == 0, receiver.stderr()
