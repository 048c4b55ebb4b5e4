"""Prometheus beyond the dashboard families (test_stats.py): the `rabbitmq_global_*` counters,
`rabbitmq_build_info`'s version, `/metrics/detailed` with RabbitMQ's `family` and `vhost`
parameters, and the per-channel unconfirmed gauge (issue 33, item 3; docs/prometheus.md).

A RabbitMQ node reports a queue where the queue runs (a classic queue's node, a quorum queue's
leader), so summing a queue family over the nodes counts each queue once; in cluster mode the
queue families are read from the queue's node (`queue_metrics_url`). Counters of channels are
read where the channel is: the suite's node."""

from __future__ import annotations

import os
import urllib.parse

import pika
import pytest

from helpers import connect, safe_close, uname, wait_until
from test_access import Api, api, q  # noqa: F401  (api is a fixture)
from test_stats import (STATS_WAIT, connection_name, http_get, prom_url,  # noqa: F401
                        queue_metrics_url, scrape)

WARREN = bool(os.environ.get("WARREN_BIN"))


def value(metrics: dict, name: str, labels: dict | None = None) -> float:
    """The one sample of `name` carrying `labels` (all of them; None: unlabelled or any)."""
    assert name in metrics, f"{name} missing"
    samples = [s for s in metrics[name][1]
               if labels is None or all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(samples) == 1, (name, labels, metrics[name][1])
    return samples[0].value


def declare_in(amqp_url: str, vhost: str, queue: str, n: int) -> str:
    """Declares `queue` in `vhost` and publishes `n` confirmed messages to it."""
    url = urllib.parse.urlparse(amqp_url)._replace(path="/" + q(vhost)).geturl()
    c = connect(url)
    try:
        ch = c.channel()
        ch.queue_declare(queue)
        ch.confirm_delivery()
        for i in range(n):
            ch.basic_publish("", queue, b"d%d" % i)
    finally:
        safe_close(c)
    return queue


GLOBAL = "rabbitmq_global_"
PROTOCOL = {"protocol": "amqp091"}


@pytest.mark.timeout(60)
def test_global_counters_move_with_traffic(conn, prom_url, res):
    """Each rabbitmq_global_* counter of what a channel does rises by what this test did (at
    least: other clients of the node count too)."""
    names = ["messages_received_total", "messages_received_confirm_total",
             "messages_routed_total", "messages_unroutable_dropped_total",
             "messages_unroutable_returned_total", "messages_confirmed_total",
             "messages_delivered_total", "messages_delivered_get_manual_ack_total",
             "messages_delivered_get_auto_ack_total", "messages_get_empty_total",
             "messages_acknowledged_total", "messages_redelivered_total"]
    before_m = scrape(prom_url)
    for n in names:
        assert before_m[GLOBAL + n][0] == "counter", (n, before_m[GLOBAL + n][0])
    assert before_m[GLOBAL + "publishers"][0] == "gauge"
    assert before_m[GLOBAL + "consumers"][0] == "gauge"
    before = {n: value(before_m, GLOBAL + n, PROTOCOL) for n in names}

    ch = conn.channel()
    qn = res.queue("glob")
    ch.queue_declare(qn)
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", qn, b"m%d" % i)
    ch.basic_publish("", uname("nowhere"), b"dropped")
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("", uname("nowhere"), b"returned", mandatory=True)
    m, _, _ = ch.basic_get(qn, auto_ack=False)
    assert m is not None
    ch.basic_nack(m.delivery_tag, requeue=True)
    m, _, _ = ch.basic_get(qn, auto_ack=False)
    assert m is not None and m.redelivered
    ch.basic_ack(m.delivery_tag)
    assert ch.basic_get(qn, auto_ack=True)[0] is not None
    ch.queue_purge(qn)
    assert ch.basic_get(qn, auto_ack=True)[0] is None

    rise = {"messages_received_total": 7, "messages_received_confirm_total": 7,
            "messages_routed_total": 5, "messages_unroutable_dropped_total": 1,
            "messages_unroutable_returned_total": 1, "messages_confirmed_total": 7,
            "messages_delivered_total": 3, "messages_delivered_get_manual_ack_total": 2,
            "messages_delivered_get_auto_ack_total": 1, "messages_get_empty_total": 1,
            "messages_acknowledged_total": 1, "messages_redelivered_total": 1}
    last: dict = {}

    def reached():
        m = scrape(prom_url)
        last.update({n: value(m, GLOBAL + n, PROTOCOL) - before[n] for n in names})
        return all(last[n] >= r for n, r in rise.items())

    try:
        wait_until(reached, STATS_WAIT, interval=0.5, what="global counters", conn=conn)
    except AssertionError:
        raise AssertionError(f"global counters rose by {last}, want at least {rise}")
    m = scrape(prom_url)
    assert value(m, GLOBAL + "publishers", PROTOCOL) >= 1


@pytest.mark.timeout(60)
def test_auth_attempts_counted(amqp_url, prom_url):
    """rabbitmq_auth_attempts_{,succeeded_,failed_}total{protocol="amqp091"} count logins."""
    names = ["rabbitmq_auth_attempts_total", "rabbitmq_auth_attempts_succeeded_total",
             "rabbitmq_auth_attempts_failed_total"]
    m = scrape(prom_url)
    before = {n: value(m, n, PROTOCOL) for n in names}
    assert all(m[n][0] == "counter" for n in names)
    safe_close(connect(amqp_url))
    bad = urllib.parse.urlparse(amqp_url)._replace(
        netloc="guest:wrong-" + uname("pw") + "@" + urllib.parse.urlparse(amqp_url).hostname
        + ":" + str(urllib.parse.urlparse(amqp_url).port)).geturl()
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connect(bad)
    last: dict = {}

    def reached():
        m = scrape(prom_url)
        last.update({n: value(m, n, PROTOCOL) - before[n] for n in names})
        return (last["rabbitmq_auth_attempts_total"] >= 2
                and last["rabbitmq_auth_attempts_succeeded_total"] >= 1
                and last["rabbitmq_auth_attempts_failed_total"] >= 1)

    try:
        wait_until(reached, STATS_WAIT, interval=0.5, what="auth attempts")
    except AssertionError:
        raise AssertionError(f"auth attempt counters rose by {last}")


@pytest.mark.timeout(30)
def test_build_info_reports_the_compatibility_version(prom_url):
    info = scrape(prom_url)["rabbitmq_build_info"][1]
    assert len(info) == 1, info
    labels = info[0].labels
    assert labels["rabbitmq_version"].startswith("3.10."), labels
    if WARREN:
        assert labels["rabbitmq_version"] == "3.10.8", labels
        assert labels["product_name"] == "Warren", labels
        assert labels["product_version"] != labels["rabbitmq_version"], labels


@pytest.fixture
def vhost(api):
    name = uname("promvh")
    assert api.call("PUT", f"/api/vhosts/{q(name)}")[0] in (201, 204)
    assert api.call("PUT", f"/api/permissions/{q(name)}/guest",
                    {"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
    yield name
    api.call("DELETE", f"/api/vhosts/{q(name)}")


def detailed(prom_url: str, params: list) -> str:
    url = prom_url.rstrip("/") + "/detailed?" + urllib.parse.urlencode(params)
    st, ctype, text = http_get(url)
    assert st == 200, (url, st, text[:300])
    assert ctype.startswith("text/plain"), ctype
    return text


@pytest.mark.timeout(60)
def test_detailed_filters_by_family_and_vhost(conn, api, amqp_url, prom_url, cluster_mode, vhost,
                                              res):
    """/metrics/detailed?family=F&vhost=V: only the families asked for, named rabbitmq_detailed_*
    (so that it can be scraped beside /metrics), and only V's queues."""
    ours = declare_in(amqp_url, vhost, uname("dq"), 2)
    other = res.queue("dq-default")
    conn.channel().queue_declare(other)
    url = queue_metrics_url(prom_url, api, cluster_mode, vhost, ours)
    params = [("family", "queue_coarse_metrics"), ("vhost", vhost)]

    def ours_ready():
        fams = {f.name: f for f in _families(detailed(url, params))}
        samples = [s for f in fams.values() for s in f.samples]
        found = [s for s in samples if s.name == "rabbitmq_detailed_queue_messages_ready"
                 and s.labels.get("queue") == ours]
        return (fams, samples) if found and found[0].value == 2 else None

    fams, samples = wait_until(ours_ready, STATS_WAIT, interval=0.5, what="detailed ready 2",
                               conn=conn)
    assert {"rabbitmq_detailed_queue_messages_ready", "rabbitmq_detailed_queue_messages_unacked",
            "rabbitmq_detailed_queue_messages"} <= set(fams), sorted(fams)
    assert all(n.startswith("rabbitmq_detailed_queue_") for n in fams), sorted(fams)
    assert samples and all(s.labels.get("vhost") == vhost for s in samples), samples
    assert all(fams[n].type == "gauge" for n in fams if not n.endswith("_total"))

    # Another family, every vhost: the default vhost's queue is there too.
    other_url = queue_metrics_url(prom_url, api, cluster_mode, "/", other)
    text = detailed(other_url, [("family", "queue_consumer_count")])
    fams = {f.name: f for f in _families(text)}
    assert set(fams) == {"rabbitmq_detailed_queue_consumers"}, sorted(fams)
    assert any(s.labels == {"vhost": "/", "queue": other} for s in fams[
        "rabbitmq_detailed_queue_consumers"].samples)
    # No identity, no aggregated names: nothing that would clash with /metrics.
    assert "rabbitmq_identity_info" not in text and "\nrabbitmq_queues " not in text

    if WARREN:
        st, _, body = http_get(prom_url.rstrip("/") + "/detailed?family=queue_coarse")
        assert st == 400 and "unknown metric family" in body, (st, body)


def _families(text: str) -> list:
    from prometheus_client.parser import text_string_to_metric_families
    return list(text_string_to_metric_families(text))


@pytest.mark.timeout(60)
def test_channel_messages_unconfirmed_per_channel(conn, api, prom_url, res):
    """rabbitmq_channel_messages_unconfirmed is a gauge per channel: 0 once every publish of a
    confirm channel is confirmed (Warren's unit test `unconfirmed_counts_publishes_until_their_
    confirm_is_sent` covers a count above 0, which no client holds open deterministically)."""
    ch = conn.channel()
    qn = res.queue("unconf")
    ch.queue_declare(qn, durable=True)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", qn, b"p%d" % i, pika.BasicProperties(delivery_mode=2))
    per_object = prom_url.rstrip("/") + "/per-object"
    m = scrape(per_object)
    assert m["rabbitmq_channel_messages_unconfirmed"][0] == "gauge"
    if WARREN:
        cname = f"{connection_name(api, conn)} ({ch.channel_number})"
        st, rows = api.call("GET", "/api/warren/channels")
        assert st == 200
        pid = next(r["pid"] for r in rows if r["name"] == cname)
        assert value(m, "rabbitmq_channel_messages_unconfirmed", {"channel": pid}) == 0
        assert value(m, "rabbitmq_channel_messages_published_total", {"channel": pid}) == 3
        assert value(scrape(prom_url), "rabbitmq_channel_messages_unconfirmed") >= 0


@pytest.mark.timeout(60)
def test_connection_families(conn, prom_url):
    """connection_coarse_metrics and connection_metrics: bytes both ways and channels, summed on
    /metrics, per connection on /metrics/per-object."""
    conn.channel()
    conn.channel()
    m = scrape(prom_url)
    assert value(m, "rabbitmq_connection_incoming_bytes_total") > 0
    assert value(m, "rabbitmq_connection_outgoing_bytes_total") > 0
    assert value(m, "rabbitmq_connection_channels") >= 2
    assert m["rabbitmq_connection_incoming_bytes_total"][0] == "counter"
    per = scrape(prom_url.rstrip("/") + "/per-object")
    samples = per["rabbitmq_connection_channels"][1]
    assert samples and all(set(s.labels) == {"channel"} for s in samples), samples
    assert any(s.value >= 2 for s in samples), samples


@pytest.mark.timeout(60)
def test_raft_families_of_a_quorum_queue(conn, api, prom_url, cluster_mode, res):
    """ra_metrics: a quorum queue's member reports its term and log indexes, per queue on
    /metrics/per-object and /metrics/detailed?family=ra_metrics (Warren: docs/prometheus.md maps
    them to openraft's metrics)."""
    ch = conn.channel()
    qn = res.queue("promqq")
    ch.queue_declare(qn, durable=True, arguments={"x-queue-type": "quorum"})
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", qn, b"r%d" % i)
    url = queue_metrics_url(prom_url, api, cluster_mode, "/", qn)
    names = ["rabbitmq_raft_term_total", "rabbitmq_raft_log_commit_index",
             "rabbitmq_raft_log_last_written_index", "rabbitmq_raft_log_last_applied_index",
             "rabbitmq_raft_log_snapshot_index"]
    m = scrape(url)
    assert all(n in m for n in names), [n for n in names if n not in m]
    assert m["rabbitmq_raft_term_total"][0] == "counter"
    if not WARREN:
        return
    labels = {"vhost": "/", "queue": qn}

    def applied():
        per = scrape(url.rstrip("/") + "/per-object")
        return per if value(per, "rabbitmq_raft_log_last_applied_index", labels) >= 1 else None

    per = wait_until(applied, STATS_WAIT, interval=0.5, what="the queue's entries applied",
                     conn=conn)
    term = value(per, "rabbitmq_raft_term_total", labels)
    commit = value(per, "rabbitmq_raft_log_commit_index", labels)
    written = value(per, "rabbitmq_raft_log_last_written_index", labels)
    assert term >= 1 and 1 <= commit <= written, (term, commit, written)
    samples = [s for f in _families(detailed(url, [("family", "ra_metrics"), ("vhost", "/")]))
               for s in f.samples]
    assert any(s.name == "rabbitmq_detailed_raft_term_total" and s.labels == labels
               for s in samples), samples
