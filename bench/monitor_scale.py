#!/usr/bin/env python3
"""The monitor example (examples/monitor) at scale: N receivers sharded through the
consistent-hash exchange, and one process simulating --agents hosts (1,000 by default), each
publishing a sample per second. After a warm-up it polls every receiver's /hosts.json once a
second and reports, per receiver, how many hosts it holds and how stale its table is (the age of
the newest sample of each host, by the agents' clock: the max over hosts, then its median and
max over the polls), with each process's CPU use (100% is one core; the broker's too, given
--broker-pid), and whether the union of the shards covers every simulated host exactly once. A benchmark: nothing is asserted about time; it exits 1 only
if the shards' union misses a host or two shards hold the same one.

    bench/monitor_scale.py [--uri URI ...] [--agents 1000] [--shards 3] [--connections 4]
                           [--warmup 12] [--duration 20] [--interval 1] [--broker-pid PID ...]

Needs a running broker (Warren or RabbitMQ with rabbitmq_consistent_hash_exchange); --uri
repeated (cluster nodes) spreads the agent's connections and the receivers over them. Uses the
interop suite's venv for pika (run it with .venv-interop/bin/python). No receiver shard of the
example may be running already (shard queues are exclusive).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "monitor")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


class Proc:
    def __init__(self, label: str, script: str, args: list[str], logdir: str) -> None:
        self.label = label
        self.log_path = os.path.join(logdir, f"{label}.log")
        self.log = open(self.log_path, "w")
        self.p = subprocess.Popen([sys.executable, "-u", os.path.join(EXAMPLE, script), *args],
                                  stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL, text=True)

    def tail(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-2000:]

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


def wait_for(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"monitor_scale: timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def fetch(url: str) -> dict:
    with urllib.request.urlopen(url + "hosts.json", timeout=10) as r:
        return json.load(r)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--uri", action="append", help="broker URI; repeat for cluster nodes "
                    "(default amqp://guest:guest@127.0.0.1:5672/%%2f)")
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--connections", type=int, default=4, help="the simulating agent's connections")
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--warmup", type=float, default=12.0, help="seconds before measuring")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of polling")
    ap.add_argument("--broker-pid", type=int, action="append", default=[],
                    help="a broker process whose CPU to report too (repeat for cluster nodes)")
    args = ap.parse_args()
    uris = args.uri or ["amqp://guest:guest@127.0.0.1:5672/%2f"]
    logdir = tempfile.mkdtemp(prefix="monitor-scale-")
    procs: list[Proc] = []
    try:
        receivers = []
        for k in range(args.shards):
            # Receiver k prefers node k mod count (it moves on if that one is down).
            mine = uris[k % len(uris):] + uris[:k % len(uris)]
            r = Proc(f"receiver-{k}", "receiver.py",
                     [a for u in mine for a in ("--uri", u)] +
                     ["--shard", str(k), "--shards", str(args.shards), "--http-port", "0"], logdir)
            procs.append(r)
            line = r.p.stdout.readline()
            if not line.startswith("serving http://"):
                raise SystemExit(f"monitor_scale: receiver {k} did not start: {line!r}\n{r.tail()}")
            r.url = line.split()[1]
            receivers.append(r)
        for r in receivers:
            wait_for(lambda r=r: "consuming from" in r.tail() or r.p.poll() is not None, 30,
                     f"{r.label} to consume")
            if r.p.poll() is not None:
                raise SystemExit(f"monitor_scale: {r.label} exited:\n{r.tail()}")
        agent = Proc("agent", "agent.py", [a for u in uris for a in ("--uri", u)] +
                     ["--simulate", str(args.agents), "--connections", str(args.connections),
                      "--interval", str(args.interval)], logdir)
        procs.append(agent)
        print(f"{args.agents} simulated agents over {args.connections} connections, {args.shards} "
              f"receiver shards, {len(uris)} broker URI(s); warm-up {args.warmup:.0f} s, "
              f"then {args.duration:.0f} s of polls (logs in {logdir})", flush=True)
        time.sleep(args.warmup)
        for p in procs:
            if p.p.poll() is not None:
                raise SystemExit(f"monitor_scale: {p.label} exited:\n{p.tail()}")

        pids = {p.label: p.p.pid for p in procs}
        pids.update({f"broker {pid}": pid for pid in args.broker_pid})
        cpu0 = {label: cpu_seconds(pid) for label, pid in pids.items()}
        t0 = time.monotonic()
        polls: dict[str, list[dict]] = {r.label: [] for r in receivers}
        last: dict[str, dict] = {}
        while time.monotonic() - t0 < args.duration:
            tick = time.monotonic()
            for r in receivers:
                doc = fetch(r.url)
                rows = doc["hosts"]
                polls[r.label].append({
                    "hosts": len(rows),
                    "stale_max": max((h["age_s"] for h in rows), default=float("nan")),
                    "heard_max": max((h["heard_s"] for h in rows), default=float("nan")),
                })
                last[r.label] = doc
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        elapsed = time.monotonic() - t0
        cpu = {label: 100.0 * (cpu_seconds(pid) - cpu0[label]) / elapsed for label, pid in pids.items()}

        print(f"\n{'receiver':<12}{'hosts now':>10}{'min..max':>12}{'stale med s':>13}{'stale max s':>13}"
              f"{'heard max s':>13}{'cpu %':>8}")
        owner: dict[str, list[str]] = {}
        for r in receivers:
            ps = polls[r.label]
            counts = [p["hosts"] for p in ps]
            stale = [p["stale_max"] for p in ps]
            heard = [p["heard_max"] for p in ps]
            print(f"{r.label:<12}{counts[-1]:>10}{f'{min(counts)}..{max(counts)}':>12}"
                  f"{statistics.median(stale):>13.2f}{max(stale):>13.2f}{max(heard):>13.2f}"
                  f"{cpu[r.label]:>8.1f}")
            for h in last[r.label]["hosts"]:
                owner.setdefault(h["host"], []).append(r.label)
        width = max(4, len(str(args.agents)))
        expected = {f"sim-{i:0{width}d}" for i in range(1, args.agents + 1)}
        missing = expected - owner.keys()
        shared = [h for h, o in owner.items() if len(o) > 1]
        extra = owner.keys() - expected
        for label in ["agent"] + [f"broker {pid}" for pid in args.broker_pid]:
            print(f"{label:<12}{'':>10}{'':>12}{'':>13}{'':>13}{'':>13}{cpu[label]:>8.1f}")
        print(f"\nunion of the shards' last tables: {len(owner.keys() & expected)} of {args.agents} "
              f"simulated hosts; missing {len(missing)}, in two shards {len(shared)}, "
              f"other hosts {len(extra)}; {len(ps)} polls over {elapsed:.1f} s")
        agent_lines = [l for l in agent.tail().splitlines() if "published" in l]
        if agent_lines:
            print("agent:", agent_lines[-1].split(" INFO ", 1)[-1])
        if missing or shared:
            print(f"monitor_scale: shards do not cover the hosts exactly once "
                  f"(missing e.g. {sorted(missing)[:5]}, shared e.g. {shared[:5]})", file=sys.stderr)
            return 1
        return 0
    finally:
        for p in reversed(procs):
            p.stop()


if __name__ == "__main__":
    sys.exit(main())
