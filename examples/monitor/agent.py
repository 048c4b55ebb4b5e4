#!/usr/bin/env python3
"""The monitor's agent: once per interval it reads this host's figures from /proc and publishes
them, as one JSON message, to the fanout exchange `rsysmon` with the host name as routing key.

    agent.py [--uri URI ...] [--name HOST] [--interval 1.0]
    agent.py --simulate 1000 [--connections 4] [--uri URI ...]   # simulated hosts sim-0001...

A sample (every field a number unless said; *_bytes are bytes, rates per second):

    host, timestamp (Unix seconds, the agent's clock), interval_s, simulated (bool),
    procs_running, procs_total (processes, /proc/stat and /proc/<pid>), threads_total and
    load1 (/proc/loadavg), cpu_percent (busy share of all CPUs since the previous sample,
    /proc/stat; null in the first), mem_total_bytes, mem_available_bytes (/proc/meminfo),
    disk_path, disk_total_bytes, disk_free_bytes (os.statvfs, what a non-root user may use),
    net_rx_bytes, net_tx_bytes (counters summed over interfaces but lo, /proc/net/dev),
    net_rx_rate, net_tx_rate (null in the first sample).

`--simulate N` runs N made-up hosts in this one process over `--connections` connections (one
thread each, each publishing for N/connections hosts, spread over the interval), so a thousand
agents cost one process; `--uri` given several times spreads those connections over cluster
nodes (connection k starts at URI k mod count and moves on to the next if that one fails).
SIGTERM or Ctrl-C closes the connections and exits 0. Needs pika; otherwise the standard library.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import socket
import sys
import threading
import time

import pika
import pika.exceptions

import rsysmon

log = logging.getLogger("agent")


class ProcReader:
    """This machine's figures from /proc, with the previous reading kept for CPU and network
    rates."""

    def __init__(self, disk_path: str) -> None:
        self.disk_path = disk_path
        self.prev_cpu: tuple[int, int] | None = None
        self.prev_net: tuple[float, int, int] | None = None

    @staticmethod
    def _procs() -> tuple[int, int, int, float]:
        with open("/proc/stat") as f:
            running = next(int(line.split()[1]) for line in f if line.startswith("procs_running "))
        total = sum(1 for d in os.listdir("/proc") if d.isdigit())
        with open("/proc/loadavg") as f:
            fields = f.read().split()
        return running, total, int(fields[3].split("/")[1]), float(fields[0])

    def _cpu_percent(self) -> float | None:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal [guest guest_nice, already in user/nice]
        total = sum(values[:8])
        idle = values[3] + values[4]
        prev, self.prev_cpu = self.prev_cpu, (total, idle)
        if prev is None or total == prev[0]:
            return None
        return round(100.0 * (1 - (idle - prev[1]) / (total - prev[0])), 1)

    @staticmethod
    def _meminfo() -> tuple[int, int]:
        fields = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                fields[key] = int(rest.split()[0]) * 1024
        return fields["MemTotal"], fields["MemAvailable"]

    def _net(self) -> tuple[int, int, float | None, float | None]:
        rx = tx = 0
        with open("/proc/net/dev") as f:
            for line in f.readlines()[2:]:
                name, _, rest = line.partition(":")
                if name.strip() == "lo":
                    continue
                cols = rest.split()
                rx += int(cols[0])
                tx += int(cols[8])
        now = time.monotonic()
        prev, self.prev_net = self.prev_net, (now, rx, tx)
        if prev is None or now <= prev[0]:
            return rx, tx, None, None
        dt = now - prev[0]
        return rx, tx, round((rx - prev[1]) / dt, 1), round((tx - prev[2]) / dt, 1)

    def sample(self, host: str, interval: float) -> dict:
        running, total, threads, load1 = self._procs()
        mem_total, mem_available = self._meminfo()
        st = os.statvfs(self.disk_path)
        rx, tx, rx_rate, tx_rate = self._net()
        return {
            "host": host, "timestamp": time.time(), "interval_s": interval, "simulated": False,
            "procs_running": running, "procs_total": total, "threads_total": threads,
            "load1": load1, "cpu_percent": self._cpu_percent(),
            "mem_total_bytes": mem_total, "mem_available_bytes": mem_available,
            "disk_path": self.disk_path, "disk_total_bytes": st.f_blocks * st.f_frsize,
            "disk_free_bytes": st.f_bavail * st.f_frsize,
            "net_rx_bytes": rx, "net_tx_bytes": tx, "net_rx_rate": rx_rate, "net_tx_rate": tx_rate,
        }


class SimulatedHost:
    """A made-up host whose figures wander plausibly; seeded by its name, so a rerun shows the
    same machines. Marked `"simulated": true` in every sample."""

    GIB = 1 << 30

    def __init__(self, name: str) -> None:
        self.name = name
        self.rng = random.Random(name)
        self.mem_total = self.rng.choice([4, 8, 16, 32, 64]) * self.GIB
        self.mem_available = self.mem_total * self.rng.uniform(0.2, 0.9)
        self.disk_total = self.rng.choice([64, 128, 256, 512]) * self.GIB
        self.disk_free = self.disk_total * self.rng.uniform(0.1, 0.9)
        self.procs = self.rng.randint(80, 400)
        self.cpu = self.rng.uniform(0, 60)
        self.rx = self.rng.randint(0, 10**9)
        self.tx = self.rng.randint(0, 10**9)

    def sample(self, interval: float) -> dict:
        r = self.rng
        self.procs = max(20, self.procs + r.randint(-3, 3))
        self.cpu = min(100.0, max(0.0, self.cpu + r.uniform(-5, 5)))
        self.mem_available = min(self.mem_total, max(0.0, self.mem_available + r.uniform(-0.01, 0.01) * self.mem_total))
        self.disk_free = min(self.disk_total, max(0.0, self.disk_free + r.uniform(-1e6, 1e6)))
        rx_rate, tx_rate = r.uniform(0, 1e6), r.uniform(0, 5e5)
        self.rx += int(rx_rate * interval)
        self.tx += int(tx_rate * interval)
        return {
            "host": self.name, "timestamp": time.time(), "interval_s": interval, "simulated": True,
            "procs_running": r.randint(1, 8), "procs_total": self.procs,
            "threads_total": self.procs * 3, "load1": round(self.cpu / 25, 2),
            "cpu_percent": round(self.cpu, 1),
            "mem_total_bytes": self.mem_total, "mem_available_bytes": int(self.mem_available),
            "disk_path": "/", "disk_total_bytes": self.disk_total, "disk_free_bytes": int(self.disk_free),
            "net_rx_bytes": self.rx, "net_tx_bytes": self.tx,
            "net_rx_rate": round(rx_rate, 1), "net_tx_rate": round(tx_rate, 1),
        }


PROPS = dict(content_type="application/json", delivery_mode=1, app_id="rsysmon-agent")


def publish(ch, sample: dict) -> None:
    ch.basic_publish(rsysmon.EXCHANGE, sample["host"], json.dumps(sample).encode(),
                     pika.BasicProperties(timestamp=int(sample["timestamp"]), **PROPS))


class Counter:
    """Samples published, for the periodic progress line of --simulate."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.n = 0

    def add(self, k: int) -> None:
        with self.lock:
            self.n += k


def run_publisher(uris: list[str], index: int, name: str, interval: float, stop: threading.Event,
                  make_samples, slices: int, counter: Counter | None = None) -> None:
    """One connection's loop: every interval, `slices` times, publish the samples
    make_samples(slice) returns, then sleep to the slice's next due time (pumping the
    connection, so heartbeats are answered). Reconnects, over `uris`, when the connection drops."""
    while not stop.is_set():
        got = rsysmon.connect(uris, start=index, stop=stop, name=name)
        if got is None:
            return
        conn, _uri = got
        try:
            ch = conn.channel()
            rsysmon.declare_exchange(ch)
            due = time.monotonic()
            while not stop.is_set():
                for s in range(slices):
                    samples = make_samples(s)
                    for sample in samples:
                        publish(ch, sample)
                    if counter is not None:
                        counter.add(len(samples))
                    due += interval / slices
                    now = time.monotonic()
                    if due < now - interval:
                        # Fell more than an interval behind (a stall): skip, do not burst to catch up.
                        log.warning("%s: %.1f s behind schedule, skipping ahead", name, now - due)
                        due = now
                    while not stop.is_set() and time.monotonic() < due:
                        conn.sleep(min(0.2, max(0.0, due - time.monotonic())))
                    if stop.is_set():
                        break
            conn.close()
            return
        except (pika.exceptions.AMQPError, OSError) as e:
            log.warning("%s: connection lost (%s); reconnecting", name, rsysmon.describe(e))
            try:
                if conn.is_open:
                    conn.close()
            except Exception:
                pass
            stop.wait(1.0)


def main() -> int:
    ap = argparse.ArgumentParser(description="Publish this host's figures to the rsysmon exchange.")
    ap.add_argument("--uri", action="append",
                    help=f"broker URI; repeat for cluster nodes (default {rsysmon.DEFAULT_URI})")
    ap.add_argument("--name", default=socket.gethostname(), help="host name to report (default: this host's)")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    ap.add_argument("--disk", default="/", help="file system whose free space is reported (default /)")
    ap.add_argument("--simulate", type=int, metavar="N", help="run N simulated hosts sim-0001... instead")
    ap.add_argument("--connections", type=int, default=4,
                    help="connections (threads) for --simulate (default 4)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s agent %(levelname)s %(message)s")
    logging.getLogger("pika").setLevel(logging.WARNING)
    if args.interval <= 0:
        ap.error("--interval must be positive")
    uris = args.uri or [rsysmon.DEFAULT_URI]
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    if args.simulate is None:
        reader = ProcReader(args.disk)
        log.info("reporting as %s every %.3g s", args.name, args.interval)
        run_publisher(uris, 0, f"rsysmon-agent {args.name}", args.interval, stop,
                      lambda _s: [reader.sample(args.name, args.interval)], 1)
        return 0

    if args.simulate < 1 or args.connections < 1:
        ap.error("--simulate and --connections must be at least 1")
    width = max(4, len(str(args.simulate)))
    hosts = [SimulatedHost(f"sim-{i:0{width}d}") for i in range(1, args.simulate + 1)]
    n_conn = min(args.connections, len(hosts))
    counter = Counter()
    threads = []
    for k in range(n_conn):
        mine = hosts[k::n_conn]
        slices = min(10, len(mine))
        groups = [mine[s::slices] for s in range(slices)]
        t = threading.Thread(
            target=run_publisher, daemon=True, name=f"conn-{k}",
            args=(uris, k, f"rsysmon-sim {k + 1}/{n_conn}", args.interval, stop,
                  lambda s, groups=groups: [h.sample(args.interval) for h in groups[s]], slices, counter))
        t.start()
        threads.append(t)
    log.info("simulating %d hosts (%s..%s) every %.3g s over %d connections",
             len(hosts), hosts[0].name, hosts[-1].name, args.interval, n_conn)
    last_n, last_t = 0, time.monotonic()
    while not stop.wait(10.0):
        now, n = time.monotonic(), counter.n
        log.info("published %d samples in %.1f s (%.0f/s)", n - last_n, now - last_t, (n - last_n) / (now - last_t))
        last_n, last_t = n, now
    for t in threads:
        t.join(5.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
