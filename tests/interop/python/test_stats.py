"""Statistics: the management API's message_stats (queues, channels, exchanges, overview),
churn_rates and queue_totals, rates, /api/channels and /api/consumers, and the Prometheus text
(aggregated /metrics and /metrics/per-object). Written against RabbitMQ 3.10 (management on
15673, its prometheus plugin on 15693), whose statistics lag up to collect_statistics_interval
(5 s) behind: every check polls, bounded.

RabbitMQ is shared and long-running, so node-wide counters are checked by deltas and per-object
ones on objects each test creates."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request

import pika
import pika.exceptions
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import connect, pump, safe_close, uname, wait_until
from test_access import Api, api, q  # noqa: F401  (api is a fixture)

STATS_WAIT = 20.0
DEFAULT_PROM_URL = "http://127.0.0.1:15693/metrics"
HERE = os.path.dirname(os.path.abspath(__file__))

QUEUE_COUNTERS = ["ack", "deliver", "deliver_get", "deliver_no_ack", "get", "get_empty",
                  "get_no_ack", "publish", "redeliver"]


@pytest.fixture
def prom_url(mgmt_url):
    """The aggregated Prometheus endpoint: Warren's on its management port, RabbitMQ's on its
    prometheus plugin's port (PROM_URL, default http://127.0.0.1:15693/metrics)."""
    if os.environ.get("WARREN_BIN"):
        return mgmt_url + "/metrics"
    return os.environ.get("PROM_URL") or DEFAULT_PROM_URL


# --- helpers -------------------------------------------------------------------------------


def local_port(conn: pika.BlockingConnection) -> int:
    return conn._impl._transport._sock.getsockname()[1]


def connection_name(api: Api, conn: pika.BlockingConnection) -> str:
    """The broker's name for this pika connection, found by its client port."""
    port = local_port(conn)

    def find():
        st, body = api.call("GET", "/api/connections")
        if st != 200:
            return None
        for c in body or []:
            if c.get("peer_port") == port:
                return c["name"]
        return None

    return wait_until(find, STATS_WAIT, interval=0.25, what=f"connection from port {port}", conn=conn)


def channel_name(api: Api, conn: pika.BlockingConnection, ch) -> str:
    """The channel's name, as listed under /api/connections/<name>/channels."""
    cname = connection_name(api, conn)
    number = ch.channel_number

    def find():
        st, body = api.call("GET", f"/api/connections/{q(cname)}/channels")
        if st != 200:
            return None
        for c in body or []:
            if c.get("number") == number:
                return c["name"]
        return None

    name = wait_until(find, STATS_WAIT, interval=0.25, what=f"channel {number} of {cname}", conn=conn)
    assert name == f"{cname} ({number})"
    return name


def poll_stats(api: Api, path: str, want: dict, conn=None, key: str = "message_stats",
               timeout: float = STATS_WAIT) -> dict:
    """GET path until body[key][k] >= v for every k, v in want; return the body."""
    last: dict = {}

    def reached():
        nonlocal last
        st, body = api.call("GET", path)
        if st != 200:
            return False
        last = body
        stats = body.get(key) or {}
        return all(isinstance(stats.get(k), int) and stats[k] >= v for k, v in want.items())

    try:
        wait_until(reached, timeout, interval=0.5, what=path, conn=conn)
    except AssertionError:
        raise AssertionError(f"{path}: {key} never reached {want}; last: {last.get(key)!r}")
    return last


def assert_exact(stats: dict, want: dict) -> None:
    got = {k: stats.get(k) for k in want}
    assert got == want, f"message_stats {got} != {want} (all: {stats})"


def assert_details(stats: dict, keys) -> None:
    """Every counter k has k_details = {"rate": <number>}."""
    for k in keys:
        assert isinstance(stats.get(k), int), (k, stats)
        d = stats.get(f"{k}_details")
        assert isinstance(d, dict), (k, stats)
        assert isinstance(d.get("rate"), (int, float)) and not isinstance(d["rate"], bool), (k, d)


def counters_of(stats: dict) -> list:
    return [k for k in stats if not k.endswith("_details")]


def publish_confirmed(ch, queue: str, n: int, prefix: bytes = b"m") -> None:
    for i in range(n):
        ch.basic_publish("", queue, prefix + b"%d" % i)


def http_get(url: str, auth: bool = False):
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", Api("").auth)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("content-type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type", ""), e.read().decode()


def scrape(url: str) -> dict:
    """Parse a Prometheus text page: {sample name: (family type, [samples])}."""
    st, _, text = http_get(url)
    assert st == 200, (url, st, text[:500])
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, (fam.type, []))[1].append(s)
    return out


def unlabelled_value(metrics: dict, name: str) -> float:
    assert name in metrics, f"{name} missing"
    samples = metrics[name][1]
    assert len(samples) == 1 and samples[0].labels == {}, (name, samples)
    return samples[0].value


def queue_metrics_url(prom_url: str, api: Api, cluster_mode, vhost: str, queue: str) -> str:
    """The /metrics URL of the node that reports `queue`'s families: the suite's node, or in
    cluster mode the queue's own node (a RabbitMQ node reports the queues that run on it, so a
    sum over the nodes counts each once; channel families stay on the channel's node)."""
    if cluster_mode is None:
        return prom_url
    st, body = api.call("GET", f"/api/queues/{q(vhost)}/{q(queue)}")
    assert st == 200, (st, body)
    node = next(n for n in cluster_mode.nodes if n.name == body["node"])
    return f"http://127.0.0.1:{node.http_port}/metrics"


def dashboard_metrics() -> list:
    with open(os.path.join(HERE, "data", "rabbitmq_overview_metrics.txt")) as f:
        return [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]


# --- queues, channels, exchanges ------------------------------------------------------------


@pytest.mark.timeout(60)
def test_queue_message_stats(conn, api, res):
    qn = res.queue("stats")
    pub = conn.channel()
    pub.queue_declare(qn)
    pub.confirm_delivery()
    publish_confirmed(pub, qn, 20)

    cons = conn.channel()
    cons.basic_qos(prefetch_count=5)
    got = []

    def on_msg(c, m, p, b):
        got.append(b)
        c.basic_ack(m.delivery_tag)

    tag = cons.basic_consume(qn, on_msg)
    pump(conn, lambda: len(got) >= 20, what="20 deliveries")
    cons.basic_cancel(tag)
    assert len(got) == 20

    pub.basic_publish("", qn, b"last")
    m, _, body = pub.basic_get(qn, auto_ack=False)
    assert m is not None and body == b"last"
    pub.basic_ack(m.delivery_tag)
    assert pub.basic_get(qn, auto_ack=False)[0] is None

    want = {"publish": 21, "deliver": 20, "get": 1, "ack": 21, "deliver_get": 21, "get_empty": 1,
            "redeliver": 0, "deliver_no_ack": 0, "get_no_ack": 0}
    body = poll_stats(api, f"/api/queues/%2F/{q(qn)}", want, conn=conn)
    stats = body["message_stats"]
    assert_exact(stats, want)
    assert_details(stats, QUEUE_COUNTERS)
    assert_details(stats, counters_of(stats))


@pytest.mark.timeout(60)
def test_redeliver_counted_on_queue_and_channel(conn, api, res):
    qn = res.queue("redeliver")
    pub = conn.channel()
    pub.queue_declare(qn)
    pub.confirm_delivery()
    pub.basic_publish("", qn, b"again")

    cons = conn.channel()
    cons.basic_qos(prefetch_count=1)
    seen = []

    def on_msg(c, m, p, b):
        seen.append(m.redelivered)
        if len(seen) == 1:
            c.basic_nack(m.delivery_tag, requeue=True)
        else:
            c.basic_ack(m.delivery_tag)

    cons.basic_consume(qn, on_msg)
    pump(conn, lambda: len(seen) >= 2, what="the redelivery")
    assert seen == [False, True]

    body = poll_stats(api, f"/api/queues/%2F/{q(qn)}", {"redeliver": 1, "deliver": 2, "ack": 1},
                      conn=conn)
    assert_exact(body["message_stats"], {"redeliver": 1, "deliver": 2, "deliver_get": 2, "ack": 1})
    cname = channel_name(api, conn, cons)
    body = poll_stats(api, f"/api/channels/{q(cname)}", {"redeliver": 1, "deliver": 2, "ack": 1},
                      conn=conn)
    assert_exact(body["message_stats"], {"redeliver": 1, "deliver": 2, "deliver_get": 2, "ack": 1})
    assert_details(body["message_stats"], ["redeliver", "deliver", "ack"])


@pytest.mark.timeout(60)
def test_channel_message_stats(conn, api, res):
    qn = res.queue("chstats")
    pub = conn.channel()
    pub.queue_declare(qn)
    pub.confirm_delivery()
    publish_confirmed(pub, qn, 10)
    pub.basic_publish("amq.direct", uname("nokey"), b"dropped")
    with pytest.raises(pika.exceptions.UnroutableError):
        pub.basic_publish("amq.direct", uname("nokey"), b"returned", mandatory=True)

    cons = conn.channel()
    cons.basic_qos(prefetch_count=3)
    got = []

    def on_msg(c, m, p, b):
        got.append(b)
        c.basic_ack(m.delivery_tag)

    cons.basic_consume(qn, on_msg)
    pump(conn, lambda: len(got) >= 10, what="10 deliveries")

    pub_name = channel_name(api, conn, pub)
    cons_name = channel_name(api, conn, cons)
    assert pub_name != cons_name

    want = {"publish": 12, "confirm": 12, "drop_unroutable": 1, "return_unroutable": 1}
    body = poll_stats(api, f"/api/channels/{q(pub_name)}", want, conn=conn)
    stats = body["message_stats"]
    assert_exact(stats, want)
    assert_details(stats, want)
    assert body["confirm"] is True
    assert body["number"] == pub.channel_number

    want = {"deliver": 10, "ack": 10, "deliver_get": 10}
    body = poll_stats(api, f"/api/channels/{q(cons_name)}", want, conn=conn)
    stats = body["message_stats"]
    assert_exact(stats, dict(want, redeliver=0, get=0, get_no_ack=0, deliver_no_ack=0))
    assert_details(stats, want)
    assert body["prefetch_count"] == 3
    assert body["consumer_count"] == 1


@pytest.mark.timeout(60)
def test_exchange_message_stats(conn, api, res):
    x, qn = res.exchange("xstats"), res.queue("xstats")
    ch = conn.channel()
    ch.exchange_declare(x, "direct")
    ch.queue_declare(qn)
    ch.queue_bind(qn, x, "k")
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish(x, "k", b"r%d" % i)
    for i in range(3):
        ch.basic_publish(x, "nope", b"u%d" % i)

    want = {"publish_in": 8, "publish_out": 5}
    body = poll_stats(api, f"/api/exchanges/%2F/{q(x)}", want, conn=conn)
    assert_exact(body["message_stats"], want)
    assert_details(body["message_stats"], want)


# --- overview -------------------------------------------------------------------------------


def overview(api: Api) -> dict:
    st, body = api.call("GET", "/api/overview")
    assert st == 200, body
    return body


@pytest.mark.timeout(60)
def test_overview_message_stats_and_queue_totals(conn, api, res):
    before = (overview(api).get("message_stats") or {}).get("publish", 0)
    k = 30
    qn = res.queue("overview")
    ch = conn.channel()
    ch.queue_declare(qn)
    ch.confirm_delivery()
    publish_confirmed(ch, qn, k)

    last: dict = {}

    def reached():
        nonlocal last
        last = overview(api)
        ms, qt = last.get("message_stats") or {}, last.get("queue_totals") or {}
        return (ms.get("publish", 0) >= before + k and qt.get("messages_ready", 0) >= k
                and qt.get("messages", 0) >= k)

    try:
        wait_until(reached, STATS_WAIT, interval=0.5, what="overview", conn=conn)
    except AssertionError:
        raise AssertionError(f"overview never counted {k} publishes over {before} and {k} ready "
                             f"messages: {last.get('message_stats')!r} {last.get('queue_totals')!r}")
    ms = last["message_stats"]
    assert_details(ms, ["publish", "confirm"])
    assert_details(ms, counters_of(ms))
    qt = last["queue_totals"]
    assert_details(qt, ["messages", "messages_ready", "messages_unacknowledged"])
    assert qt["messages"] >= qt["messages_ready"]


@pytest.mark.timeout(60)
def test_overview_churn_rates(api, amqp_url):
    keys = ["channel_closed", "channel_created", "connection_closed", "connection_created",
            "queue_created", "queue_declared", "queue_deleted"]
    churn = overview(api).get("churn_rates")
    assert isinstance(churn, dict), churn
    assert_details(churn, keys)
    before = churn["connection_created"]

    c = connect(amqp_url)
    try:
        last: dict = {}

        def reached():
            nonlocal last
            last = overview(api)["churn_rates"]
            return last["connection_created"] >= before + 1

        try:
            wait_until(reached, STATS_WAIT, interval=0.5, what="churn_rates", conn=c)
        except AssertionError:
            raise AssertionError(f"connection_created never rose over {before}: {last!r}")
        assert_details(last, keys)
    finally:
        safe_close(c)


# --- rates ----------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_publish_rate_is_reported(conn, api, res):
    qn = res.queue("rate")
    ch = conn.channel()
    ch.queue_declare(qn, arguments={"x-max-length": 100})
    path = f"/api/queues/%2F/{q(qn)}"
    target_rate, publish_for, poll_after = 200.0, 14.0, 3.0
    rates: list = []
    sent = 0
    start = time.monotonic()
    next_check = start + 1.0
    while True:
        now = time.monotonic()
        elapsed = now - start
        if elapsed > publish_for + poll_after:
            break
        if elapsed <= publish_for:
            while sent < target_rate * elapsed:
                ch.basic_publish("", qn, b"r")
                sent += 1
        if now >= next_check:
            next_check = now + 1.0
            st, body = api.call("GET", path)
            assert st == 200, body
            rate = ((body.get("message_stats") or {}).get("publish_details") or {}).get("rate")
            rates.append(rate)
            if isinstance(rate, (int, float)) and rate > 50:
                break
        conn.process_data_events(time_limit=0.01)
    assert sent >= 200, sent
    assert any(isinstance(r, (int, float)) and r > 50 for r in rates), \
        f"publish rate never above 50/s while publishing ~{target_rate:.0f}/s; rates seen: {rates}"


# --- /api/consumers, /api/channels ----------------------------------------------------------


@pytest.mark.timeout(60)
def test_consumers_listed(conn, api, res):
    qn = res.queue("consumers")
    ch = conn.channel()
    ch.queue_declare(qn)
    ch.basic_qos(prefetch_count=7)
    tag = ch.basic_consume(qn, lambda *a: None)
    cname = connection_name(api, conn)

    def find(path):
        def f():
            st, body = api.call("GET", path)
            assert st == 200, (path, body)
            for c in body:
                if (c.get("queue") or {}).get("name") == qn:
                    return c
            return None
        return wait_until(f, STATS_WAIT, interval=0.25, what=f"consumer on {qn} in {path}", conn=conn)

    for path in ("/api/consumers", "/api/consumers/%2F"):
        c = find(path)
        assert c["queue"] == {"name": qn, "vhost": "/"}
        assert c["consumer_tag"] == tag
        assert c["ack_required"] is True
        assert c["prefetch_count"] == 7
        assert c["exclusive"] is False
        assert c["active"] is True
        assert c["arguments"] == {}
        d = c["channel_details"]
        assert d["connection_name"] == cname
        assert d["name"] == f"{cname} ({ch.channel_number})"
        assert d["number"] == ch.channel_number
        assert d["peer_host"] == "127.0.0.1"
        assert d["peer_port"] == local_port(conn)
        assert d["user"] == "guest"

    ch.basic_cancel(tag)

    def gone():
        st, body = api.call("GET", "/api/consumers/%2F")
        return st == 200 and not any((c.get("queue") or {}).get("name") == qn for c in body)

    wait_until(gone, STATS_WAIT, interval=0.25, what="the cancelled consumer to leave", conn=conn)


@pytest.mark.timeout(60)
def test_channel_by_name(conn, api):
    ch = conn.channel()
    ch.basic_qos(prefetch_count=4)
    name = channel_name(api, conn, ch)
    cname = connection_name(api, conn)
    st, body = api.call("GET", f"/api/channels/{q(name)}")
    assert st == 200, body
    assert body["name"] == name
    assert body["number"] == ch.channel_number
    assert body["vhost"] == "/"
    assert body["user"] == "guest"
    assert body["prefetch_count"] == 4
    assert body["confirm"] is False and body["transactional"] is False
    cd = body["connection_details"]
    assert cd["name"] == cname
    assert cd["peer_host"] == "127.0.0.1"
    assert cd["peer_port"] == local_port(conn)

    for path in ("/api/channels", "/api/vhosts/%2F/channels", f"/api/connections/{q(cname)}/channels"):
        st, body = api.call("GET", path)
        assert st == 200, (path, body)
        assert name in [c["name"] for c in body], path

    st, body = api.call("GET", f"/api/channels/{q(cname + ' (999)')}")
    assert st == 404, body
    assert body == {"error": "Object Not Found", "reason": "Not Found"}


# --- Prometheus -----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_prometheus_dashboard_metrics(conn, api, prom_url, cluster_mode, res):
    ch = conn.channel()
    qn = res.queue("prom")
    ch.queue_declare(qn)
    ch.confirm_delivery()
    ch.basic_publish("", qn, b"warm-up")
    home_url = queue_metrics_url(prom_url, api, cluster_mode, "/", qn)

    metrics = scrape(prom_url)
    names = dashboard_metrics()
    assert len(names) > 30
    missing = [n for n in names if n not in metrics]
    assert not missing, f"dashboard metrics missing from {prom_url}: {missing}"

    ident = metrics["rabbitmq_identity_info"][1]
    assert len(ident) == 1
    assert {"rabbitmq_node", "rabbitmq_cluster"} <= set(ident[0].labels), ident[0].labels
    assert all(ident[0].labels[k] for k in ("rabbitmq_node", "rabbitmq_cluster"))
    labelled = {"rabbitmq_identity_info", "rabbitmq_build_info"}
    for n in names:
        if n not in labelled:
            unlabelled_value(metrics, n)
    for n in names:
        if n.endswith("_total"):
            assert metrics[n][0] == "counter", (n, metrics[n][0])
    assert metrics["rabbitmq_queue_messages_ready"][0] == "gauge"
    assert metrics["rabbitmq_connections"][0] == "gauge"

    n = 25
    # The channel's counter on its node, the queue's on the queue's node.
    urls = {"rabbitmq_channel_messages_published_total": prom_url,
            "rabbitmq_queue_messages_published_total": home_url}
    before = {k: unlabelled_value(scrape(u), k) for k, u in urls.items()}
    publish_confirmed(ch, qn, n)
    last: dict = {}

    def reached():
        last.update({k: unlabelled_value(scrape(u), k) for k, u in urls.items()})
        return all(last[k] >= before[k] + n for k in urls)

    try:
        wait_until(reached, STATS_WAIT, interval=0.5, what="published totals", conn=conn)
    except AssertionError:
        raise AssertionError(f"totals never rose by {n}: before {before}, last {last}")


def per_object_url(prom_url: str) -> str:
    return prom_url.rstrip("/") + "/per-object"


def poll_samples(url: str, want: dict, conn) -> tuple:
    """Scrape url until, for each name: (labels, value) in want, exactly one sample of that name
    carries those labels (and maybe others) and has that value. Returns (metrics, found)."""
    found: dict = {}
    metrics: dict = {}

    def reached():
        nonlocal metrics
        metrics = scrape(url)
        for name, (labels, _) in want.items():
            found[name] = [(s.labels, s.value) for s in metrics.get(name, (None, []))[1]
                           if all(s.labels.get(k) == v for k, v in labels.items())]
        return all(len(found[n]) == 1 and found[n][0][1] == v for n, (_, v) in want.items())

    try:
        wait_until(reached, STATS_WAIT, interval=0.5, what="per-object samples", conn=conn)
    except AssertionError:
        raise AssertionError(f"{url}: samples never {dict((n, v) for n, (_, v) in want.items())}: "
                             f"found {found}")
    return metrics, found


@pytest.mark.timeout(60)
def test_prometheus_per_object_queue_ready(conn, api, prom_url, cluster_mode, res):
    qn = res.queue("promq")
    ch = conn.channel()
    ch.queue_declare(qn)
    ch.confirm_delivery()
    publish_confirmed(ch, qn, 3)
    labels = {"vhost": "/", "queue": qn}
    home_url = queue_metrics_url(prom_url, api, cluster_mode, "/", qn)
    metrics, found = poll_samples(per_object_url(home_url), {
        "rabbitmq_queue_messages_ready": (labels, 3),
        "rabbitmq_queue_messages_unacked": (labels, 0),
        "rabbitmq_queue_messages": (labels, 3),
        "rabbitmq_queue_consumers": (labels, 0),
    }, conn)
    for name in found:
        assert found[name][0][0] == labels, found[name]
        assert metrics[name][0] == "gauge", (name, metrics[name][0])
    # Node-wide families stay unlabelled there.
    assert metrics["rabbitmq_connections"][1][0].labels == {}
    assert metrics["rabbitmq_queues"][1][0].labels == {}


@pytest.mark.timeout(60)
def test_prometheus_per_object_channel_labels(conn, api, prom_url, cluster_mode, res):
    """Per-object channel labels. RabbitMQ 3.10: channel gauges {channel}; channel counters kept
    per exchange {channel, vhost, exchange} or per queue {channel, vhost, queue}; queue publishes
    {channel, queue_vhost, queue, exchange_vhost, exchange}. Warren (docs/management.md, a
    deliberate difference: those pairs would cost a lookup per message): every channel family
    per channel {channel}, queue publishes per queue {vhost, queue}."""
    qn = res.queue("promch")
    ch = conn.channel()
    ch.queue_declare(qn)
    ch.confirm_delivery()
    publish_confirmed(ch, qn, 4)
    m, _, _ = ch.basic_get(qn, auto_ack=False)
    assert m is not None
    ch.basic_ack(m.delivery_tag)
    if os.environ.get("WARREN_BIN"):
        cname = f"{connection_name(api, conn)} ({ch.channel_number})"
        st, rows = api.call("GET", "/api/warren/channels")
        assert st == 200
        pid = next(r["pid"] for r in rows if r["name"] == cname)
        chl = {"channel": pid}
        want = {
            "rabbitmq_channel_get_ack_total": (chl, 1),
            "rabbitmq_channel_messages_acked_total": (chl, 1),
            "rabbitmq_channel_messages_published_total": (chl, 4),
            "rabbitmq_channel_messages_confirmed_total": (chl, 4),
        }
        # The queue's families on the queue's node (in cluster mode, not the channel's).
        home_url = queue_metrics_url(prom_url, api, cluster_mode, "/", qn)
        _, qfound = poll_samples(per_object_url(home_url), {
            "rabbitmq_queue_messages_ready": ({"vhost": "/", "queue": qn}, 3),
            "rabbitmq_queue_messages_published_total": ({"vhost": "/", "queue": qn}, 4),
        }, conn)
        metrics, found = poll_samples(per_object_url(prom_url), want, conn)
        assert set(qfound["rabbitmq_queue_messages_published_total"][0][0]) == {"vhost", "queue"}
        channel_labels = {"channel"}
        label_sets = {
            "rabbitmq_channel_messages_published_total": channel_labels,
            "rabbitmq_channel_messages_confirmed_total": channel_labels,
            "rabbitmq_channel_messages_acked_total": channel_labels,
        }
    else:
        qlabels = {"vhost": "/", "queue": qn}
        metrics, found = poll_samples(per_object_url(prom_url), {
            "rabbitmq_queue_messages_ready": (qlabels, 3),
            "rabbitmq_channel_get_ack_total": (qlabels, 1),
            "rabbitmq_channel_messages_acked_total": (qlabels, 1),
            "rabbitmq_queue_messages_published_total": (
                {"queue_vhost": "/", "queue": qn, "exchange_vhost": "/", "exchange": ""}, 4),
        }, conn)
        assert set(found["rabbitmq_channel_get_ack_total"][0][0]) == {"channel", "vhost", "queue"}
        assert set(found["rabbitmq_queue_messages_published_total"][0][0]) == \
            {"channel", "queue_vhost", "queue", "exchange_vhost", "exchange"}
        label_sets = {
            "rabbitmq_channel_messages_published_total": {"channel", "vhost", "exchange"},
            "rabbitmq_channel_messages_confirmed_total": {"channel", "vhost", "exchange"},
            "rabbitmq_channel_messages_acked_total": {"channel", "vhost", "queue"},
        }
    assert metrics["rabbitmq_channel_get_ack_total"][0] == "counter"
    label_sets.update({
        "rabbitmq_channel_consumers": {"channel"},
        "rabbitmq_channel_messages_unacked": {"channel"},
        "rabbitmq_channel_messages_unconfirmed": {"channel"},
        "rabbitmq_channel_prefetch": {"channel"},
    })
    for name, labels in label_sets.items():
        samples = metrics.get(name, (None, []))[1]
        assert samples, f"no {name} samples"
        bad = [s.labels for s in samples if set(s.labels) != labels]
        assert not bad, (name, labels, bad[:3])


def test_prometheus_needs_no_credentials(prom_url, mgmt_url):
    st, ctype, text = http_get(prom_url)
    assert st == 200, (st, text[:300])
    assert ctype.startswith("text/plain"), ctype
    assert "# TYPE rabbitmq_connections gauge" in text
    st, _, _ = http_get(prom_url.rstrip("/") + "/per-object")
    assert st == 200
    # The management API itself still wants them.
    st, _, _ = http_get(mgmt_url + "/api/overview")
    assert st == 401
    st, _, _ = http_get(mgmt_url + "/api/overview", auth=True)
    assert st == 200
