"""RabbitMQ's health checks (/api/health/checks/..., /api/aliveness-test/{vhost}) and node
listing (/api/nodes), which Kubernetes probes and monitoring scripts call."""

from __future__ import annotations

import os
import socket

import pytest

from helpers import host_port, wait_until
from test_access import Api, api, q  # noqa: F401  (api is a fixture)

OK = {"status": "ok"}


def test_alarm_checks_pass_without_alarms(api):
    assert api.call("GET", "/api/health/checks/alarms") == (200, OK)
    assert api.call("GET", "/api/health/checks/local-alarms") == (200, OK)


def test_port_and_protocol_listeners(api, amqp_url):
    _, port = host_port(amqp_url)
    assert api.call("GET", f"/api/health/checks/port-listener/{port}") == \
        (200, {"status": "ok", "port": port})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        unused = s.getsockname()[1]
    st, body = api.call("GET", f"/api/health/checks/port-listener/{unused}")
    assert st == 503
    assert body["status"] == "failed" and body["reason"] == "No active listener"
    assert body["missing"] == unused and port in body["ports"]
    assert api.call("GET", "/api/health/checks/protocol-listener/amqp") == \
        (200, {"status": "ok", "protocol": "amqp"})
    st, body = api.call("GET", "/api/health/checks/protocol-listener/mqtt")
    assert st == 503
    assert (body["status"], body["missing"]) == ("failed", "mqtt")
    assert "amqp" in body["protocols"] and "http" in body["protocols"]


@pytest.mark.single_node("asserts the single-node answers (reason 'single node cluster')")
def test_cluster_checks_on_a_single_node(api):
    assert api.call("GET", "/api/health/checks/virtual-hosts") == (200, OK)
    single = {"status": "ok", "reason": "single node cluster"}
    assert api.call("GET", "/api/health/checks/node-is-quorum-critical") == (200, single)
    assert api.call("GET", "/api/health/checks/node-is-mirror-sync-critical") == (200, single)


def test_aliveness_test(api):
    assert api.call("GET", "/api/aliveness-test/%2F") == (200, OK)
    # Twice: the queue is reused, and its test message was taken.
    assert api.call("GET", "/api/aliveness-test/%2F") == (200, OK)
    assert api.call("GET", "/api/aliveness-test/no-such-vhost") == \
        (404, {"error": "Object Not Found", "reason": "Not Found"})
    api.call("DELETE", "/api/queues/%2F/aliveness-test")


@pytest.mark.single_node("asserts /api/nodes lists exactly one node")
def test_nodes(api):
    st, overview = api.call("GET", "/api/overview")
    st, nodes = api.call("GET", "/api/nodes")
    assert st == 200 and len(nodes) == 1
    n = nodes[0]
    assert n["name"] == overview["node"]
    assert n["running"] is True and n["type"] == "disc" and n["partitions"] == []
    for k in ["mem_used", "mem_limit", "disk_free", "disk_free_limit", "fd_used", "fd_total",
              "sockets_used", "sockets_total", "proc_used", "proc_total", "uptime", "processors"]:
        assert isinstance(n[k], int) and n[k] >= 0, k
    assert n["mem_used"] > 0 and n["mem_limit"] > 0 and n["disk_free"] > 0
    assert n["mem_alarm"] is False and n["disk_free_alarm"] is False
    assert isinstance(n["os_pid"], str) and n["os_pid"].isdigit()
    st, one = api.call("GET", f"/api/nodes/{q(n['name'])}")
    assert st == 200 and one["name"] == n["name"]
    # RabbitMQ 3.10 crashes on a node it does not know (500, empty body); Warren says 404
    # (docs/management.md).
    expected = 404 if os.environ.get("WARREN_BIN") else 500
    assert api.call("GET", "/api/nodes/nobody@nowhere")[0] == expected


@pytest.mark.skipif(not os.environ.get("WARREN_BIN"),
                    reason="sets a broker's memory watermark to force an alarm: Warren only (WARREN_BIN)")
def test_alarm_checks_fail_with_rabbitmqs_body_during_an_alarm():
    from test_durability import Node

    n = Node()
    try:
        n.start()
        api = Api(f"http://127.0.0.1:{n.http_port}")
        st, _ = api.call("PUT", "/api/warren/vm_memory_high_watermark", {"absolute": 1})
        assert st in (200, 204)
        node = api.call("GET", "/api/overview")[1]["node"]
        alarm = [{"node": node, "resource": "memory"}]
        wait_until(lambda: api.call("GET", "/api/health/checks/alarms")[0] == 503,
                   what="the memory alarm")
        assert api.call("GET", "/api/health/checks/alarms") == (503, {
            "status": "failed", "reason": "There are alarms in effect in the cluster",
            "alarms": alarm})
        assert api.call("GET", "/api/health/checks/local-alarms") == (503, {
            "status": "failed", "reason": "There are alarms in effect on the node",
            "alarms": alarm})
        assert api.call("GET", "/api/nodes")[1][0]["mem_alarm"] is True
        api.call("PUT", "/api/warren/vm_memory_high_watermark", {"fraction": 0.4})
        wait_until(lambda: api.call("GET", "/api/health/checks/alarms") == (200, OK),
                   what="the alarm to clear")
    finally:
        n.cleanup()
