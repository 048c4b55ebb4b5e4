"""scripts/cluster.sh as a new user meets it: a node that does not come up fails the start
(exit 1, with that node's log tail) instead of printing "cluster up"; stop signals only pids
that are still the cluster's nodes; and a real 3-node cluster starts, with no WARN or ERROR
line in its nodes' logs, and stops. Waits are bounded only as hang guards."""

from __future__ import annotations

import base64
import json
import os
import random
import re
import signal
import socket
import stat
import subprocess
import tempfile
import time
import urllib.request

import pytest

from helpers import wait_until

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "cluster.sh")
BIN = os.environ.get("WARREN_BIN")
HANG_GUARD = 120


def run(cmd: str, data: str, binary: str, base: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, WARREN_BIN=binary, BASE=str(base))
    return subprocess.run(["bash", SCRIPT, cmd, data], env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD)


def running_nodes(base: int) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{base + 10001}/api/nodes")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return sum(1 for n in json.load(r) if n.get("running"))
    except OSError:
        return 0


def free_base() -> int:
    """A BASE whose nine ports are free now. BASE moves every port by BASE-5680: AMQP BASE+1..,
    HTTP BASE+10001.., links BASE+20001... All stay below Linux's ephemeral range (32768 on),
    where other tests' outgoing connections take ports at random."""
    for _ in range(50):
        base = random.randrange(6000, 12700)
        ports = [base + off + i for off in (0, 10000, 20000) for i in (1, 2, 3)]
        if all(port_free(p) for p in ports):
            return base
    raise RuntimeError("no free BASE for a cluster's nine ports")


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_a_node_that_does_not_come_up_fails_the_start_with_its_log():
    with tempfile.TemporaryDirectory() as d:
        fake = os.path.join(d, "fake-warren")
        with open(fake, "w") as f:
            f.write("#!/bin/sh\necho 'fake node: cannot open the data directory' >&2\nexit 1\n")
        os.chmod(fake, os.stat(fake).st_mode | stat.S_IEXEC)
        r = run("start", os.path.join(d, "c"), fake, free_base())
        assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
        assert "cluster up" not in r.stdout, r.stdout
        assert "did not come up" in r.stderr, r.stderr
        assert "fake node: cannot open the data directory" in r.stderr, r.stderr


def test_stop_leaves_a_process_that_a_stale_pid_file_names():
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "c")
        os.makedirs(data)
        other = subprocess.Popen(["sleep", "300"])
        try:
            with open(os.path.join(data, "n1.pid"), "w") as f:
                f.write(str(other.pid))
            r = run("stop", data, BIN or "/bin/false", free_base())
            assert r.returncode == 0, r.stderr
            time.sleep(0.2)
            assert other.poll() is None, "an unrelated process was signalled"
            assert not os.path.exists(os.path.join(data, "n1.pid"))
        finally:
            other.send_signal(signal.SIGKILL)
            other.wait()


@pytest.mark.skipif(not BIN, reason="starts the real binary: Warren only (WARREN_BIN)")
def test_a_real_cluster_starts_and_stops():
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "c")
        base = free_base()
        r = run("start", data, BIN, base)
        try:
            assert r.returncode == 0, (r.stdout, r.stderr)
            assert "cluster up" in r.stdout, r.stdout
            pids = [int(open(os.path.join(data, f"n{i}.pid")).read()) for i in (1, 2, 3)]
            # Once all three run as one cluster, a healthy start has logged no WARN or ERROR
            # line (openraft's routine messages and the joiners' retries are below that).
            wait_until(lambda: running_nodes(base) == 3, timeout=60)
            for i in (1, 2, 3):
                with open(os.path.join(data, f"n{i}.log"), encoding="utf-8", errors="replace") as f:
                    bad = [line for line in f if re.search(r"Z\s+(WARN|ERROR) ", line)]
                assert not bad, f"node {i}: " + "".join(bad[:5])
        finally:
            s = run("stop", data, BIN, base)
        assert s.returncode == 0, s.stderr
        for pid in pids:
            assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z", \
                f"node pid {pid} still running"
