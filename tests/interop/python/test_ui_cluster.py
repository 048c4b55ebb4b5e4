"""The management web UI of a 3-node Warren cluster, in headless Chromium (see test_ui.py for
how the browser is set up and when it skips): node 1's Nodes page lists the three nodes running;
node 3 is killed (SIGKILL); the page shows it down; a classic queue declared on node 3 before
the kill is listed by node 1 with state "down" and its message counts as "unknown" (RabbitMQ's
API leaves them out for a queue whose node is down)."""

from __future__ import annotations

import urllib.parse
import uuid

import pika
import pytest

from cluster_harness import PERSISTENT, _cluster, _mark_logs, _node_logs, needs_warren_bin  # noqa: F401
from helpers import wait_until
from test_ui import _debug, _row, by_id, driver, ensure_login, wait  # noqa: F401

try:
    from selenium.webdriver.common.by import By
except ImportError:  # the driver fixture skips, saying so
    pass

pytestmark = needs_warren_bin

QUEUE = f"ui-down-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def ui_cluster():
    yield from _cluster("ui")


def _queue_row(d, base: str):
    """The queue's row in node 1's queue list, filtered to it."""
    if not d.current_url.endswith("#/queues"):
        d.get(base + "/#/queues")
        by_id(d, "queues-filter").send_keys(QUEUE)
    return wait(d, lambda drv: _row(drv, "data-queue", QUEUE), "the queue's row")


@pytest.mark.timeout(180)
def test_ui_cluster_nodes_page_and_a_killed_node(driver, ui_cluster):
    d = driver
    n1, _, n3 = ui_cluster.nodes
    base = f"http://127.0.0.1:{n1.http_port}"
    try:
        # A classic queue on node 3 (declared through it), with a message.
        conn = pika.BlockingConnection(n3.params())
        ch = conn.channel()
        ch.queue_declare(QUEUE, durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", QUEUE, b"m", PERSISTENT)
        conn.close()
        path = "/api/queues/%2F/" + urllib.parse.quote(QUEUE, safe="")
        q = wait_until(lambda: (lambda r: r[0] == 200 and r[1])(n1.api("GET", path)), 15, 0.2,
                       "node 1 to list the queue")
        assert q["node"] == n3.name, q

        ensure_login(d, base)
        d.get(base + "/#/nodes")
        for n in ui_cluster.nodes:
            wait(d, lambda drv, n=n: (r := _row(drv, "data-node", n.name)) is not None
                 and r.get_attribute("data-running") == "true", f"{n.name} running")
        assert "3 of 3 running" in d.find_element(By.CSS_SELECTOR, "main h1 small").text
        # The header names the cluster as the API does (one name on every node).
        _, cn = n1.api("GET", "/api/cluster-name")
        wait(d, lambda drv: drv.find_element(By.ID, "hdr-cluster").text == cn["name"],
             f"the header names the cluster {cn['name']}")

        n3.kill9()
        row = wait(d, lambda drv: (r := _row(drv, "data-node", n3.name)) is not None
                   and r.get_attribute("data-running") == "false" and r, f"{n3.name} down", 40)
        assert "down" in row.find_element(By.CLASS_NAME, "node-state").text
        assert "2 of 3 running" in d.find_element(By.CSS_SELECTOR, "main h1 small").text
        assert _row(d, "data-node", n1.name).get_attribute("data-running") == "true"

        # The queue list served by node 1: the queue is down, on node 3.
        row = wait(d, lambda drv: (r := _queue_row(drv, base)).get_attribute("data-state") == "down" and r,
                   "the queue shown down", 30)
        assert n3.name in row.text, row.text
    except Exception as e:
        raise AssertionError(f"{e}\n{_debug(d)}") from e


@pytest.mark.timeout(60)
def test_ui_cluster_down_queue_counts_are_unknown(driver, ui_cluster):
    """After the test above: node 3 is down. RabbitMQ's contract: no `messages`,
    `messages_ready`, `messages_unacknowledged` for a queue whose node is down; the UI then
    shows "unknown" (never 0 or blank)."""
    d = driver
    n1 = ui_cluster.nodes[0]
    base = f"http://127.0.0.1:{n1.http_port}"
    st, q = n1.api("GET", "/api/queues/%2F/" + urllib.parse.quote(QUEUE, safe=""))
    assert st == 200 and q["state"] == "down", q
    assert not {"messages", "messages_ready", "messages_unacknowledged"} & set(q), q
    row = _queue_row(d, base)
    cells = [row.find_element(By.CLASS_NAME, c).text for c in ("count-ready", "count-unacked", "count-total")]
    assert cells == ["unknown"] * 3, cells
