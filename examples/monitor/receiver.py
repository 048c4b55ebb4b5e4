#!/usr/bin/env python3
"""The monitor's receiver: consumes the agents' samples, keeps a table of live hosts (the newest
sample of each), drops a host not heard from for --timeout seconds (10 by default), and serves
the table as a live web page.

    receiver.py [--uri URI ...] [--http-port 8080] [--timeout 10]
    receiver.py --shard K --shards N [...]      # one of N receivers sharing the hosts

Unsharded, it binds an exclusive server-named queue of its own to the fanout exchange `rsysmon`:
every receiver sees every host. Sharded, it consumes from the exclusive queue `rsysmon.shard.K`
bound (weight 1) to the consistent-hash exchange `rsysmon.hash`, itself bound to `rsysmon`; the
routing key is the host name, so each host's samples go to exactly one running shard, always the
same one while the set of shards does not change. A shard that stops takes its queue and its
share of the ring with it, and its hosts move to the others.

HTTP (bound to --http-bind, 127.0.0.1 by default; --http-port 0 picks a free port): `/` is the
page (it polls `/hosts.json` every second), `/hosts.json` the table:

    {"receiver": {"shard": K|null, "shards": N|null, "queue": ..., "timeout_s": ...,
                  "connected": bool, "samples": n, "rejected": n},
     "now": unix seconds,
     "hosts": [{"host": ..., "age_s": now - the sample's timestamp (the agent's clock),
                "heard_s": seconds since it arrived (this receiver's clock),
                "samples": n, "sample": {...the agent's JSON...}}, ...]}   # sorted by host

On start it prints `serving http://ADDR:PORT/` on stdout. SIGTERM or Ctrl-C exits 0.
"""

from __future__ import annotations

import argparse
import http.server
import json
import logging
import signal
import sys
import threading
import time

import pika
import pika.exceptions

import rsysmon

log = logging.getLogger("receiver")


class Table:
    """The live hosts: host name -> its newest sample and when it arrived. Shared by the consumer
    loop (writes) and the HTTP threads (reads), under one lock."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.lock = threading.Lock()
        # host -> [sample, arrival on time.monotonic(), samples received]
        self.hosts: dict[str, list] = {}
        self.samples = 0
        self.rejected = 0

    def update(self, sample: dict) -> bool:
        """Records a sample; True if the host was not in the table."""
        now = time.monotonic()
        with self.lock:
            self.samples += 1
            entry = self.hosts.get(sample["host"])
            if entry is None:
                self.hosts[sample["host"]] = [sample, now, 1]
                return True
            # Keep the newest by the agent's clock (a late, older sample must not replace it).
            if sample.get("timestamp", 0) >= entry[0].get("timestamp", 0):
                entry[0] = sample
            entry[1] = now
            entry[2] += 1
            return False

    def sweep(self) -> list[str]:
        """Drops the hosts not heard from for timeout_s; returns their names."""
        cutoff = time.monotonic() - self.timeout_s
        with self.lock:
            gone = [h for h, e in self.hosts.items() if e[1] < cutoff]
            for h in gone:
                del self.hosts[h]
        return gone

    def snapshot(self) -> dict:
        """The table as /hosts.json shows it. A host past the timeout is left out even if the
        consumer loop (which drops it, and logs that) has not swept it yet."""
        now_wall, now_mono = time.time(), time.monotonic()
        cutoff = now_mono - self.timeout_s
        with self.lock:
            rows = [{"host": h, "age_s": round(now_wall - e[0].get("timestamp", now_wall), 3),
                     "heard_s": round(now_mono - e[1], 3), "samples": e[2], "sample": e[0]}
                    for h, e in sorted(self.hosts.items()) if e[1] >= cutoff]
            return {"now": now_wall, "hosts": rows, "samples": self.samples, "rejected": self.rejected}


def parse_sample(body: bytes) -> dict | None:
    """The agent's JSON, or None if it is not a sample (no string `host`, or a timestamp that is
    not a number)."""
    try:
        sample = json.loads(body)
    except ValueError:
        return None
    if not isinstance(sample, dict) or not isinstance(sample.get("host"), str) or not sample["host"]:
        return None
    if not isinstance(sample.get("timestamp"), (int, float)):
        return None
    return sample


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>rsysmon</title>
<style>
 body { font: 14px system-ui, sans-serif; margin: 1.5em; }
 table { border-collapse: collapse; } th, td { padding: 2px 10px; text-align: right; }
 th { border-bottom: 1px solid #888; } td:first-child, th:first-child { text-align: left; }
 tr.stale td { color: #b00; } #status { color: #666; }
</style></head>
<body><h1>rsysmon: <span id="count">0</span> live hosts</h1>
<p id="status">loading...</p>
<table><thead><tr><th>host</th><th>age s</th><th>procs run/total</th><th>load</th><th>cpu %</th>
<th>mem avail / total</th><th>disk free / total</th><th>net rx/s</th><th>net tx/s</th></tr></thead>
<tbody id="rows"></tbody></table>
<script>
function size(b) { if (b == null) return "-"; const u = ["B","KiB","MiB","GiB","TiB"]; let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; } return b.toFixed(i ? 1 : 0) + " " + u[i]; }
function num(v) { return v == null ? "-" : String(v); }
async function refresh() {
  try {
    const r = await fetch("hosts.json", {cache: "no-store"}); const t = await r.json();
    const rc = t.receiver; const body = document.getElementById("rows"); body.textContent = "";
    for (const h of t.hosts) {
      const s = h.sample; const tr = document.createElement("tr");
      if (h.heard_s > 3 * (s.interval_s || 1)) tr.className = "stale";
      for (const v of [h.host, h.age_s.toFixed(1), num(s.procs_running) + " / " + num(s.procs_total),
                       num(s.load1), num(s.cpu_percent),
                       size(s.mem_available_bytes) + " / " + size(s.mem_total_bytes),
                       size(s.disk_free_bytes) + " / " + size(s.disk_total_bytes),
                       size(s.net_rx_rate), size(s.net_tx_rate)]) {
        const td = document.createElement("td"); td.textContent = v; tr.appendChild(td); }
      body.appendChild(tr); }
    document.getElementById("count").textContent = t.hosts.length;
    document.getElementById("status").textContent =
      (rc.shard == null ? "all hosts" : "shard " + rc.shard + " of " + rc.shards) +
      "; queue " + rc.queue + "; hosts dropped after " + rc.timeout_s + " s of silence; " +
      (rc.connected ? "connected" : "NOT CONNECTED to the broker") +
      "; updated " + new Date(t.now * 1000).toLocaleTimeString();
  } catch (e) { document.getElementById("status").textContent = "receiver unreachable: " + e; }
}
refresh(); setInterval(refresh, 1000);
</script></body></html>
"""


class Receiver:
    def __init__(self, args) -> None:
        self.args = args
        self.uris = args.uri or [rsysmon.DEFAULT_URI]
        self.table = Table(args.timeout)
        self.stop = threading.Event()
        self.connected = False
        self.queue = None

    def info(self) -> dict:
        return {"shard": self.args.shard, "shards": self.args.shards, "queue": self.queue,
                "exchange": rsysmon.HASH_EXCHANGE if self.args.shard is not None else rsysmon.EXCHANGE,
                "timeout_s": self.table.timeout_s, "connected": self.connected}

    def setup(self, ch) -> str:
        """Declares the exchanges, this receiver's queue and its binding; returns the queue."""
        if self.args.shard is None:
            rsysmon.declare_exchange(ch)
            q = ch.queue_declare("", exclusive=True).method.queue
            ch.queue_bind(q, rsysmon.EXCHANGE)
            return q
        rsysmon.declare_hash_exchange(ch)
        q = f"rsysmon.shard.{self.args.shard}"
        try:
            ch.queue_declare(q, exclusive=True)
        except pika.exceptions.ChannelClosedByBroker as e:
            if e.reply_code == 405:
                raise SystemExit(f"receiver: shard {self.args.shard} already has a receiver "
                                 f"(queue {q} is exclusive to another connection): {e.reply_text}")
            raise
        ch.queue_bind(q, rsysmon.HASH_EXCHANGE, rsysmon.SHARD_WEIGHT)
        return q

    def on_message(self, _ch, _method, _props, body: bytes) -> None:
        sample = parse_sample(body)
        if sample is None:
            with self.table.lock:
                self.table.rejected += 1
                n = self.table.rejected
            if n <= 10 or n % 1000 == 0:
                log.warning("ignored a message that is not a sample (%d so far): %.100r", n, body)
            return
        if self.table.update(sample) and len(self.table.hosts) <= 20:
            log.info("host %s joined", sample["host"])

    def log_sweep(self, gone: list[str]) -> None:
        if not gone:
            return
        if len(gone) <= 5:
            for h in gone:
                log.info("host %s dropped: not heard from for %.3g s", h, self.table.timeout_s)
        else:
            log.info("%d hosts dropped: not heard from for %.3g s (%s, ...)", len(gone),
                     self.table.timeout_s, ", ".join(gone[:5]))

    def consume(self) -> None:
        """Connects, consumes and sweeps the table until stopped; reconnects over the URIs when
        the connection drops (the table keeps its hosts meanwhile, and they age out as usual)."""
        index = 0
        last_count, last_count_at = -1, float("-inf")
        while not self.stop.is_set():
            got = rsysmon.connect(self.uris, start=index, stop=self.stop,
                                  name=f"rsysmon-receiver {self.args.shard if self.args.shard is not None else ''}".strip())
            if got is None:
                return
            conn, uri = got
            index = self.uris.index(uri)
            try:
                ch = conn.channel()
                self.queue = self.setup(ch)
                ch.basic_consume(self.queue, self.on_message, auto_ack=True)
                self.connected = True
                log.info("consuming from %s", self.queue)
                while not self.stop.is_set():
                    conn.process_data_events(time_limit=0.25)
                    self.log_sweep(self.table.sweep())
                    # Past 20 hosts joins are not logged one by one: the count, at most every 10 s.
                    n = len(self.table.hosts)
                    if n != last_count and n > 20 and time.monotonic() - last_count_at >= 10:
                        log.info("%d live hosts", n)
                        last_count, last_count_at = n, time.monotonic()
                self.connected = False
                conn.close()
                return
            except (pika.exceptions.AMQPError, OSError) as e:
                self.connected = False
                log.warning("connection lost (%s); reconnecting", rsysmon.describe(e))
                try:
                    if conn.is_open:
                        conn.close()
                except Exception:
                    pass
                index += 1
                self.stop.wait(1.0)

    def handler(self):
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/hosts.json":
                    snap = receiver.table.snapshot()
                    doc = {"receiver": dict(receiver.info(), samples=snap.pop("samples"),
                                            rejected=snap.pop("rejected")), **snap}
                    self.reply(200, "application/json", json.dumps(doc).encode())
                elif path in ("/", "/index.html"):
                    self.reply(200, "text/html; charset=utf-8", PAGE.encode())
                else:
                    self.reply(404, "text/plain", b"not found: try / or /hosts.json\n")

            def reply(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args) -> None:
                pass  # one line per poll would drown the log

        return Handler


def main() -> int:
    ap = argparse.ArgumentParser(description="Keep and serve the table of live rsysmon hosts.")
    ap.add_argument("--uri", action="append",
                    help=f"broker URI; repeat for cluster nodes (default {rsysmon.DEFAULT_URI})")
    ap.add_argument("--http-bind", default="127.0.0.1", help="address of the web page (default 127.0.0.1)")
    ap.add_argument("--http-port", type=int, default=8080, help="port of the web page (default 8080; 0: any free)")
    ap.add_argument("--timeout", type=float, default=10.0,
                    help="seconds without a sample after which a host is dropped (default 10)")
    ap.add_argument("--shard", type=int, help="this receiver's shard, 0..N-1 (with --shards)")
    ap.add_argument("--shards", type=int, help="how many shards share the hosts")
    args = ap.parse_args()
    if (args.shard is None) != (args.shards is None):
        ap.error("--shard and --shards go together")
    if args.shard is not None and not (args.shards >= 1 and 0 <= args.shard < args.shards):
        ap.error("--shard must be in 0..N-1 for --shards N")
    if args.timeout <= 0:
        ap.error("--timeout must be positive")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s receiver %(levelname)s %(message)s")
    logging.getLogger("pika").setLevel(logging.WARNING)
    receiver = Receiver(args)
    server = http.server.ThreadingHTTPServer((args.http_bind, args.http_port), receiver.handler())
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    addr, port = server.server_address[:2]
    print(f"serving http://{addr}:{port}/", flush=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: receiver.stop.set())
    try:
        receiver.consume()
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
