#!/usr/bin/env python3
"""Runs every PromQL query of RabbitMQ's published Grafana dashboards (RabbitMQ-Overview and
RabbitMQ-Quorum-Queues-Raft, copied in bench/prometheus/dashboard_queries/ with their source)
through a real Prometheus scraping a 3-node Warren cluster under load, and lists the queries
that return nothing (issue 33, item 3).

    bench/prometheus_dashboards.py [--base 8480] [--settle 25] [--keep] [--verbose]

What it does, all on loopback under a temporary directory:
  1. starts a 3-node cluster with scripts/cluster.sh (BASE moves its ports: AMQP BASE+1..3,
     HTTP BASE+10001..3);
  2. runs `warren perf` against it: a quorum queue (dash-qq, 1 producer with confirms and 1
     consumer on each node) and a classic queue (dash-classic, homed on node 1), at a modest
     rate, for as long as the queries take;
  3. starts Prometheus (Debian's package: /usr/bin/prometheus, `apt-get install prometheus`)
     with a generated configuration scraping every node's /metrics (job "warren", as RabbitMQ's
     own docker/prometheus.yml does) and /metrics/detailed?family=ra_metrics&family=
     queue_coarse_metrics (job "warren-detailed": rabbitmq_detailed_* names, which must not
     clash with /metrics) every 5 s;
  4. waits until each target has been scraped and SETTLE seconds more (rates over [60s] need
     two samples), then runs each query through /api/v1/query and prints a table: dashboard,
     panel, series returned, their values, the metrics the query reads (--verbose: the whole
     query as run); then the queries that returned nothing. --settle 65 fills the [60s]
     windows, so the rates read true.

Template variables are substituted as a Grafana user of a plain (non-Kubernetes) Prometheus
would have them: $rabbitmq_cluster is the cluster name the nodes report in
rabbitmq_identity_info (its only value); $namespace is "" (there is no namespace label outside
Kubernetes, and namespace="" matches series without one); $__rate_interval is 60s and
$__interval 15s (neither appears in these two dashboards, which write [60s] themselves).

It is a report, not a test: it exits non-zero only when the harness fails (a node, Prometheus
or the load does not start, a query is refused as invalid, or a node exports its identity
more than once, which breaks every join). Everything it started is stopped on exit.
WARREN_BIN picks the binary (default target/release/warren); PROMETHEUS the Prometheus binary.
"""

import argparse
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUERIES = os.path.join(ROOT, "bench", "prometheus", "dashboard_queries")
DASHBOARDS = ["RabbitMQ-Overview", "RabbitMQ-Quorum-Queues-Raft"]


class HarnessError(Exception):
    pass


def load_queries(dashboard):
    """The (panel, expression) pairs of one dashboard's .promql file."""
    out, panel, lines = [], None, []
    with open(os.path.join(QUERIES, dashboard + ".promql")) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("## "):
                if panel is not None:
                    out.append((panel, "\n".join(lines).strip()))
                panel, lines = line[3:], []
            elif panel is not None:
                lines.append(line)
            elif line and not line.startswith("#"):
                raise HarnessError(f"{dashboard}: text before the first panel: {line!r}")
    if panel is not None:
        out.append((panel, "\n".join(lines).strip()))
    return out


def substitute(expr, cluster):
    subs = {
        "$rabbitmq_cluster": cluster,
        "$namespace": "",
        "$__rate_interval": "60s",
        "$__interval": "15s",
    }
    for k in sorted(subs, key=len, reverse=True):
        expr = expr.replace(k, subs[k])
    left = re.findall(r"\$\w+", expr)
    if left:
        raise HarnessError(f"unsubstituted template variables {left} in {expr!r}")
    return expr


def metric_names(query):
    """The rabbitmq_* metrics a query reads, but the identity it joins on (and its labels)."""
    names = dict.fromkeys(re.findall(r"\brabbitmq_\w+", query))
    for joined in ("rabbitmq_identity_info", "rabbitmq_cluster", "rabbitmq_node"):
        names.pop(joined, None)
    return ", ".join(names) or "rabbitmq_identity_info"


def http_get(url, timeout=10, auth=False):
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def prom_query(port, expr):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        body = json.loads(http_get(url))
    except urllib.error.HTTPError as e:
        body = json.loads(e.read() or b"{}")
    if body.get("status") != "success":
        raise HarnessError(f"query refused: {body.get('error', body)}\n  {expr}")
    return body["data"]["result"]


def wait_for(what, check, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise HarnessError(f"timed out waiting for {what}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", type=int, default=8480, help="port base for the cluster")
    ap.add_argument("--prometheus-port", type=int, default=9490)
    ap.add_argument("--settle", type=int, default=25, help="seconds of scrapes before the queries")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--verbose", action="store_true", help="print each query as it was run")
    a = ap.parse_args()
    warren = os.environ.get("WARREN_BIN", os.path.join(ROOT, "target", "release", "warren"))
    prometheus = os.environ.get("PROMETHEUS", shutil.which("prometheus") or "/usr/bin/prometheus")
    for path, hint in [(warren, "build it: cargo build --release -p warren"),
                       (prometheus, "apt-get install -y prometheus")]:
        if not os.access(path, os.X_OK):
            raise HarnessError(f"{path} is missing ({hint})")
    queries = [(d, p, e) for d in DASHBOARDS for p, e in load_queries(d)]

    tmp = tempfile.mkdtemp(prefix="warren-dashboards-")
    cluster_dir = os.path.join(tmp, "cluster")
    env = dict(os.environ, WARREN_BIN=warren, BASE=str(a.base))
    procs = []
    cluster_started = False

    def stop_all():
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        if cluster_started:
            subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "stop", cluster_dir],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if a.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    try:
        cluster_started = True
        r = subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "start", cluster_dir],
                           env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise HarnessError(f"the cluster did not start:\n{r.stdout}{r.stderr}")
        http = [a.base + 10000 + i for i in (1, 2, 3)]
        uris = ",".join(f"amqp://guest:guest@127.0.0.1:{a.base + i}" for i in (1, 2, 3))
        log = open(os.path.join(tmp, "perf.log"), "w")
        # A quorum queue with clients on every node, and a classic queue on node 1.
        for args in (["-u", "dash-qq", "--quorum-queue", "-x", "3", "-y", "3", "-h", uris],
                     ["-u", "dash-classic", "-x", "1", "-y", "1", "-h",
                      f"amqp://guest:guest@127.0.0.1:{a.base + 1}"]):
            procs.append(subprocess.Popen([warren, "perf", *args, "-c", "50", "-r", "100",
                                           "-q", "100", "-i", "10"],
                                          stdout=log, stderr=subprocess.STDOUT))

        def queues_declared():
            body = json.loads(http_get(f"http://127.0.0.1:{http[0]}/api/overview", auth=True))
            return body.get("object_totals", {}).get("queues", 0) >= 2
        wait_for("the load's queues", lambda: all(p.poll() is None for p in procs)
                 and queues_declared(), 60)

        targets = ", ".join(f"'127.0.0.1:{p}'" for p in http)
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: 5s
  evaluation_interval: 5s
scrape_configs:
  - job_name: warren
    static_configs:
      - targets: [{targets}]
  - job_name: warren-detailed
    metrics_path: /metrics/detailed
    params:
      family: [ra_metrics, queue_coarse_metrics]
    static_configs:
      - targets: [{targets}]
""")
        procs.append(subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp}/tsdb",
             f"--web.listen-address=127.0.0.1:{a.prometheus_port}"],
            stdout=open(os.path.join(tmp, "prometheus.log"), "w"), stderr=subprocess.STDOUT))
        pport = a.prometheus_port

        def all_up():
            ts = json.loads(http_get(f"http://127.0.0.1:{pport}/api/v1/targets"))
            active = ts["data"]["activeTargets"]
            return len(active) == 6 and all(t["health"] == "up" for t in active)
        wait_for("Prometheus to scrape all 6 targets", all_up, 60)
        time.sleep(a.settle)
        if any(p.poll() is not None for p in procs):
            raise HarnessError(f"the load or Prometheus exited early; see {tmp} (--keep)")

        ids = prom_query(pport, "rabbitmq_identity_info")
        per_instance = {}
        for s in ids:
            per_instance.setdefault(s["metric"]["instance"], []).append(s["metric"])
        dup = {i: m for i, m in per_instance.items() if len(m) != 1}
        if len(per_instance) != 3 or dup:
            raise HarnessError(f"rabbitmq_identity_info is not one series per node: {ids}")
        clusters = {m["rabbitmq_cluster"] for s in per_instance.values() for m in s}
        if len(clusters) != 1:
            raise HarnessError(f"the nodes report different cluster names: {clusters}")
        cluster = clusters.pop()
        clash = prom_query(pport, 'count by (__name__) ({job="warren-detailed"})')
        clashing = [s["metric"]["__name__"] for s in clash
                    if not s["metric"]["__name__"].startswith("rabbitmq_detailed_")
                    and not s["metric"]["__name__"].startswith(("up", "scrape_"))]
        if clashing:
            raise HarnessError(f"/metrics/detailed exports names /metrics has: {clashing}")

        rows, empty = [], []
        for dashboard, panel, expr in queries:
            query = substitute(expr, cluster)
            result = prom_query(pport, query)
            values = [s["value"][1] for s in result]
            rows.append((dashboard, panel, query, len(result), values))
            if not result:
                empty.append((dashboard, panel))
        print(f"cluster {cluster!r}: 3 nodes, Prometheus {pport}, {len(queries)} queries "
              f"after {a.settle} s of 5 s scrapes under load\n")
        w = max(len(r[1]) for r in rows)
        print(f"{'dashboard':<28} {'panel':<{w}} series  values (up to 3)  metrics queried")
        for dashboard, panel, query, n, values in rows:
            shown = ", ".join(v[:10] for v in values[:3]) + (" ..." if len(values) > 3 else "")
            print(f"{dashboard:<28} {panel:<{w}} {n:>6}  {shown:<36} {metric_names(query)}")
            if a.verbose:
                print("    " + " ".join(query.split()))
        print(f"\n{len(rows) - len(empty)} of {len(rows)} queries return data; "
              f"{len(empty)} return nothing:")
        for dashboard, panel in empty:
            print(f"  {dashboard}: {panel}")
        return 0
    finally:
        stop_all()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except HarnessError as e:
        print(f"prometheus_dashboards: {e}", file=sys.stderr)
        sys.exit(1)
