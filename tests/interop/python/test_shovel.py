"""Dynamic shovels as RabbitMQ 3.10's shovel plugin runs them: set through
`PUT /api/parameters/shovel/{vhost}/{name}`, checked with RabbitMQ's validation texts, run
between local ends (`amqp://`, the broker API) and remote ones, in each ack mode, deleting
themselves after `src-delete-after`, reported at `/api/shovels`, and kept across a restart.
Written against RabbitMQ 3.10 with its shovel plugin (the default AMQP_URL broker); the tests
that need a second broker or a restart are Warren only."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import pika
import pika.exceptions
import pytest

from helpers import connect, get_all, safe_close, uname, wait_until
from test_access import Api, api, q  # noqa: F401 - fixtures
from test_durability import Node
from test_tls import certs  # noqa: F401 - fixture: a CA, another CA, server, client, stranger

BIN = os.environ.get("WARREN_BIN")
warren_only = pytest.mark.skipif(not BIN, reason="starts a second Warren (WARREN_BIN)")
# Moving messages between brokers, each step bounded by its own wait: more than the suite's 30 s.
pytestmark = pytest.mark.timeout(120)


def put_shovel(api: Api, name: str, value: dict, vhost: str = "/"):
    return api.call("PUT", f"/api/parameters/shovel/{q(vhost)}/{q(name)}", {"value": value})


def delete_shovel(api: Api, name: str, vhost: str = "/") -> None:
    api.call("DELETE", f"/api/parameters/shovel/{q(vhost)}/{q(name)}")


def shovel_row(api: Api, name: str, vhost: str = "/"):
    st, rows = api.call("GET", f"/api/shovels/{q(vhost)}")
    assert st == 200, rows
    return next((r for r in rows if r["name"] == name), None)


def wait_state(api: Api, name: str, state: str, vhost: str = "/", timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        row = shovel_row(api, name, vhost)
        if row is not None and row["state"] == state:
            return row
        assert time.monotonic() < deadline, f"shovel {name} not {state} after {timeout}s: {row}"
        time.sleep(0.1)


def depth(url: str, queue: str) -> int:
    """Messages ready in `queue`; -1 while it does not exist (a shovel declares its ends)."""
    c = connect(url)
    try:
        return c.channel().queue_declare(queue, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker as e:
        if e.reply_code == 404:
            return -1
        raise
    finally:
        safe_close(c)


def publish(url: str, queue: str, n: int, **props) -> None:
    c = connect(url)
    try:
        ch = c.channel()
        ch.confirm_delivery()
        for i in range(n):
            ch.basic_publish("", queue, f"m{i}".encode(), pika.BasicProperties(**props))
    finally:
        safe_close(c)


@pytest.fixture
def shovels(api):
    """Names of shovels made by the test; deleted at teardown."""
    names: list[tuple[str, str]] = []

    def make(prefix: str = "shovel", vhost: str = "/") -> str:
        n = uname(prefix)
        names.append((n, vhost))
        return n

    yield make
    for n, v in names:
        delete_shovel(api, n, v)


# ---- validation ----

# Each refused value with RabbitMQ 3.10.8's whole reason (its management API escapes < > &).
BAD = [
    ({"src-uri": "amqp://", "dest-uri": "amqp://"}, "Must specify 'src-exchange' or 'src-queue'"),
    ({"src-uri": "amqp://", "dest-uri": "amqp://", "src-queue": "a", "src-exchange": "x"},
     "Cannot specify 'src-exchange' and 'src-queue'"),
    ({"src-uri": "amqp://", "dest-uri": "amqp://", "src-queue": "a", "dest-queue": "b", "dest-exchange": "x"},
     "Cannot specify 'dest-exchange' and 'dest-queue'"),
    ({"src-uri": "amqp://", "dest-uri": "amqp://", "src-queue": "a", "ack-mode": "no-ack", "src-delete-after": 3},
     "Cannot specify 'no-ack' and numerical 'delete-after'"),
    ({"src-uri": "amqp://", "dest-uri": "amqp://", "src-queue": "a", "ack-mode": "sometimes"},
     'ack-mode should be one of [&lt;&lt;"no-ack"&gt;&gt;,&lt;&lt;"on-publish"&gt;&gt;,&lt;&lt;"on-confirm"&gt;&gt;], '
     'actually was &lt;&lt;"sometimes"&gt;&gt;'),
    ({"src-uri": "amqp://", "dest-uri": "amqp://", "src-queue": "a", "src-delete-after": "later"},
     'src-delete-after should be a number greater than or equal to 0, "never" or "queue-length", '
     'actually was &lt;&lt;"later"&gt;&gt;'),
    ({"src-uri": "amqp://", "dest-uri": "amqp://", "src-queue": "a", "src-prefetch-count": "ten",
      "reconnect-delay": True},
     'src-prefetch-count should be a number, actually was &lt;&lt;"ten"&gt;&gt;\n'
     "reconnect-delay should be a number, actually was true"),
    ({"src-uri": "amqp://", "src-queue": "a"}, 'Key "dest-uri" not found in {name}'),
    ({"src-uri": "amqp://", "dest-uri": "amqp://", "src-queue": "a", "colour": "blue"},
     'Unrecognised terms [{&lt;&lt;"colour"&gt;&gt;,&lt;&lt;"blue"&gt;&gt;}] in {name}'),
    ({"src-uri": "http://x", "dest-uri": "amqp://", "src-queue": "a"},
     '"http://x" not a valid URI: {{unexpected_uri_scheme,"http"},"http://x"}'),
    ({"src-uri": "amqp://", "dest-uri": "amqp://", "src-queue": "a",
      "dest-publish-properties": {"delivery_mode": "2"}},
     'delivery_mode should be a number, actually was &lt;&lt;"2"&gt;&gt;'),
]


@pytest.mark.parametrize("value,reason", BAD, ids=[r[:30] for _, r in BAD])
def test_bad_values_get_rabbitmqs_validation_errors(api, shovels, value, reason):
    name = shovels()
    st, body = put_shovel(api, name, value)
    assert st == 400, body
    assert body == {"error": "bad_request",
                    "reason": "Validation failed\n\n" + reason.replace("{name}", name) + "\n"}
    assert api.call("GET", f"/api/parameters/shovel/%2F/{q(name)}")[0] == 404


def test_unknown_component_and_vhost(api):
    st, body = api.call("PUT", "/api/parameters/no-such-component/%2F/x", {"value": {}})
    assert st == 400, body
    assert "component no-such-component not found" in body["reason"]
    st, _ = api.call("PUT", f"/api/parameters/shovel/{q(uname('novhost'))}/x",
                     {"value": {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://"}})
    assert st == 404


# ---- moving messages between local ends ----

@pytest.mark.parametrize("ack_mode", ["on-confirm", "on-publish", "no-ack"])
def test_local_queue_to_queue(api, amqp_url, res, shovels, ack_mode):
    src, dest = res.queue("src"), res.queue("dest")
    c = connect(amqp_url)
    ch = c.channel()
    ch.queue_declare(src, durable=True)
    ch.confirm_delivery()
    headers = {"h": "v", "n": 7}
    for i in range(50):
        ch.basic_publish("", src, f"m{i}".encode(), pika.BasicProperties(
            delivery_mode=2, content_type="text/plain", headers=headers, message_id=f"id{i}"))
    safe_close(c)
    name = shovels()
    st, body = put_shovel(api, name, {"src-uri": "amqp://", "src-queue": src, "dest-uri": "amqp://",
                                      "dest-queue": dest, "ack-mode": ack_mode})
    assert st == 201, body
    res.track_queue(dest)
    wait_until(lambda: depth(amqp_url, dest) == 50 and depth(amqp_url, src) == 0, timeout=20,
               what="all 50 moved")
    row = wait_state(api, name, "running")
    assert row["src_queue"] == src and row["dest_queue"] == dest
    c = connect(amqp_url)
    got = get_all(c.channel(), dest, 50)
    safe_close(c)
    assert [b for _, _, b in got] == [f"m{i}".encode() for i in range(50)]
    _, props, _ = got[0]
    assert props.content_type == "text/plain" and props.delivery_mode == 2
    assert props.headers == headers and props.message_id == "id0"
    # Still running: what comes later moves too.
    publish(amqp_url, src, 5)
    wait_until(lambda: depth(amqp_url, dest) == 5, timeout=20)


def test_exchange_source_and_destination_key_with_forward_headers(api, amqp_url, res, shovels):
    x, dest = res.exchange("x"), res.queue("dest")
    c = connect(amqp_url)
    ch = c.channel()
    ch.exchange_declare(x, "topic")
    ch.queue_declare(dest)
    ch.queue_bind(dest, "amq.direct", "moved")
    name = shovels()
    st, body = put_shovel(api, name, {
        "src-uri": "amqp://", "src-exchange": x, "src-exchange-key": "a.*",
        "dest-uri": "amqp://", "dest-exchange": "amq.direct", "dest-exchange-key": "moved",
        "dest-add-forward-headers": True, "dest-add-timestamp-header": True,
        "dest-publish-properties": {"app_id": "shovelled"}})
    assert st == 201, body
    wait_state(api, name, "running")
    ch.confirm_delivery()
    ch.basic_publish(x, "a.b", b"yes")
    ch.basic_publish(x, "b.b", b"no")
    wait_until(lambda: depth(amqp_url, dest) == 1, timeout=20)
    (_, props, body), = get_all(ch, dest, 1)
    safe_close(c)
    assert body == b"yes"
    assert props.app_id == "shovelled"
    (entry,) = props.headers["x-shovelled"]
    assert entry["shovel-name"] == name and entry["shovel-vhost"] == "/"
    assert entry["shovel-type"] == "dynamic"
    assert entry["src-exchange"] == x and entry["src-exchange-key"] == "a.*"
    assert entry["dest-exchange"] == "amq.direct" and entry["dest-exchange-key"] == "moved"
    assert entry["src-uri"] == "amqp://" and entry["dest-uri"] == "amqp://"
    assert abs(props.headers["x-shovelled-timestamp"] - time.time()) < 60


def src_and_dest(url: str, res, n: int) -> tuple[str, str]:
    """Two fresh queues, the first holding n messages."""
    src, dest = res.queue("src"), res.queue("dest")
    c = connect(url)
    ch = c.channel()
    ch.queue_declare(src)
    ch.queue_declare(dest)
    safe_close(c)
    publish(url, src, n)
    return src, dest


def test_delete_after_queue_length(api, amqp_url, res, shovels):
    src, dest = src_and_dest(amqp_url, res, 20)
    name = shovels()
    st, body = put_shovel(api, name, {"src-uri": "amqp://", "src-queue": src, "dest-uri": "amqp://",
                                      "dest-queue": dest, "src-delete-after": "queue-length"})
    assert st == 201, body
    # It moves the 20 it found, then deletes itself.
    wait_until(lambda: api.call("GET", f"/api/parameters/shovel/%2F/{q(name)}")[0] == 404, timeout=20)
    assert depth(amqp_url, dest) == 20
    publish(amqp_url, src, 3)
    time.sleep(1)
    assert depth(amqp_url, src) == 3 and depth(amqp_url, dest) == 20
    assert shovel_row(api, name) is None


def test_delete_after_a_number(api, amqp_url, res, shovels):
    src, dest = src_and_dest(amqp_url, res, 10)
    name = shovels()
    st, body = put_shovel(api, name, {"src-uri": "amqp://", "src-queue": src, "dest-uri": "amqp://",
                                      "dest-queue": dest, "src-delete-after": 4, "src-prefetch-count": 1})
    assert st == 201, body
    wait_until(lambda: api.call("GET", f"/api/parameters/shovel/%2F/{q(name)}")[0] == 404, timeout=20)
    wait_until(lambda: depth(amqp_url, src) == 6, timeout=10)
    assert depth(amqp_url, dest) == 4


def test_status_of_a_shovel_that_cannot_connect(api, amqp_url, res, shovels):
    src = res.queue("src")
    name = shovels()
    # Port 1 on loopback refuses connections.
    st, body = put_shovel(api, name, {"src-uri": "amqp://", "src-queue": src,
                                      "dest-uri": "amqp://guest:secret@127.0.0.1:1", "reconnect-delay": 1})
    assert st == 201, body
    res.track_queue(src)
    if BIN:
        # Warren: terminated, with the reason, between its attempts.
        row = wait_state(api, name, "terminated")
        assert row["reason"], row
    else:
        # RabbitMQ 3.10 shows it starting again at each attempt, without a reason.
        row = wait_state(api, name, "starting")
        time.sleep(2)
        assert shovel_row(api, name)["state"] != "running"
    assert row["vhost"] == "/" and row["type"] == "dynamic"
    assert "secret" not in str(row)
    # The parameter is there as it was set.
    st, p = api.call("GET", f"/api/parameters/shovel/%2F/{q(name)}")
    assert st == 200 and p["component"] == "shovel" and p["value"]["src-queue"] == src, p
    assert p["value"]["dest-uri"] == "amqp://guest:secret@127.0.0.1:1"
    st, rows = api.call("GET", "/api/parameters/shovel")
    assert any(r["name"] == name for r in rows)
    # Restarted on request; a shovel that does not exist is a 404.
    assert api.call("DELETE", f"/api/shovels/vhost/%2F/{q(name)}/restart")[0] == 204
    assert api.call("DELETE", f"/api/shovels/vhost/%2F/{q(uname('none'))}/restart")[0] == 404


def test_running_status_row(api, amqp_url, res, shovels):
    src, dest = res.queue("src"), res.queue("dest")
    name = shovels()
    port = amqp_url.split("@127.0.0.1:")[1].split("/")[0]
    st, body = put_shovel(api, name, {"src-uri": "amqp://", "src-queue": src,
                                      "dest-uri": f"amqp://guest:guest@127.0.0.1:{port}", "dest-queue": dest})
    assert st == 201, body
    row = wait_state(api, name, "running")
    assert row["src_uri"] == "amqp://" and row["dest_uri"] == f"amqp://127.0.0.1:{port}", row
    assert row["src_protocol"] == row["dest_protocol"] == "amqp091"
    assert row["src_queue"] == src and row["dest_queue"] == dest
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d{1,2}:\d\d:\d\d", row["timestamp"]), row
    assert api.call("GET", f"/api/shovels/vhost/%2F/{q(name)}")[0] == 200


# ---- remote ends (a second Warren), restarts, ctl ----

@warren_only
def test_to_and_from_another_warren(api, amqp_url, res, shovels):
    other = Node()
    other.start()
    try:
        src, mid = res.queue("src"), uname("mid")
        c = connect(amqp_url)
        c.channel().queue_declare(src)
        safe_close(c)
        publish(amqp_url, src, 30, delivery_mode=2, headers={"k": "v"})
        out, back = shovels("out"), shovels("back")
        remote = f"amqp://guest:guest@127.0.0.1:{other.port}"
        # There and back: local -> remote queue `mid`, then remote `mid` -> local `back`.
        st, body = put_shovel(api, out, {"src-uri": "amqp://", "src-queue": src,
                                         "dest-uri": remote, "dest-queue": mid})
        assert st == 201, body
        wait_until(lambda: depth(other.url, mid) == 30, timeout=20)
        back_q = res.queue("back")
        st, body = put_shovel(api, back, {"src-uri": remote, "src-queue": mid,
                                          "dest-uri": "amqp://", "dest-queue": back_q,
                                          "ack-mode": "on-confirm"})
        assert st == 201, body
        wait_until(lambda: depth(amqp_url, back_q) == 30, timeout=20)
        assert depth(other.url, mid) == 0
        row = wait_state(api, back, "running")
        assert row["src_uri"] == f"amqp://127.0.0.1:{other.port}"
        c = connect(amqp_url)
        got = get_all(c.channel(), back_q, 30)
        safe_close(c)
        assert got[0][1].headers == {"k": "v"} and got[0][1].delivery_mode == 2
        # The remote broker goes away: the shovel says so, and resumes once it is back.
        delete_shovel(api, out)
        other.stop()
        wait_state(api, back, "terminated")
        other.start()  # the same broker again, same port and data
        publish(other.url, mid, 5)
        wait_until(lambda: depth(amqp_url, back_q) == 5, timeout=30)
    finally:
        other.cleanup()


@warren_only
def test_a_shovel_survives_a_restart():
    n = Node()
    n.start()
    try:
        a = Api(f"http://127.0.0.1:{n.http_port}")
        c = connect(n.url)
        ch = c.channel()
        ch.queue_declare("src", durable=True)
        ch.queue_declare("dest", durable=True)
        safe_close(c)
        st, body = put_shovel(a, "keep", {"src-uri": "amqp://", "src-queue": "src",
                                          "dest-uri": "amqp://", "dest-queue": "dest"})
        assert st == 201, body
        wait_state(a, "keep", "running")
        n.stop()
        n.start()
        wait_state(a, "keep", "running")
        publish(n.url, "src", 10, delivery_mode=2)
        wait_until(lambda: depth(n.url, "dest") == 10, timeout=20)
        # Exported and imported with the definitions.
        st, defs = a.call("GET", "/api/definitions")
        assert any(p["component"] == "shovel" and p["name"] == "keep" for p in defs["parameters"])
    finally:
        n.cleanup()


@warren_only
def test_ctl_commands(api, amqp_url, mgmt_url, res):
    src, dest = res.queue("src"), res.queue("dest")
    c = connect(amqp_url)
    c.channel().queue_declare(src)
    safe_close(c)
    name = uname("ctl")
    ctl = [BIN, "ctl", "--url", mgmt_url, "-q"]
    value = f'{{"src-uri": "amqp://", "src-queue": "{src}", "dest-uri": "amqp://", "dest-queue": "{dest}"}}'
    r = subprocess.run(ctl + ["set_parameter", "shovel", name, value], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    res.track_queue(dest)
    wait_state(api, name, "running")
    r = subprocess.run(ctl + ["shovel_status"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    header, *lines = r.stdout.splitlines()
    assert header.split("\t")[:4] == ["name", "vhost", "type", "state"]
    assert any(line.split("\t")[:4] == [name, "/", "dynamic", "running"] for line in lines), r.stdout
    r = subprocess.run(ctl + ["list_parameters"], capture_output=True, text=True)
    assert any(line.startswith(f"shovel\t{name}\t") for line in r.stdout.splitlines()), r.stdout
    r = subprocess.run(ctl + ["restart_shovel", name], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    wait_state(api, name, "running")
    r = subprocess.run(ctl + ["set_parameter", "shovel", uname("bad"), '{"src-uri": "amqp://"}'],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "Validation failed" in r.stderr, r.stderr
    r = subprocess.run(ctl + ["delete_shovel", name], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    wait_until(lambda: shovel_row(api, name) is None, timeout=10, what="the shovel stopped")
    r = subprocess.run(ctl + ["delete_shovel", name], capture_output=True, text=True)
    assert r.returncode == 1 and "not found" in r.stderr, r.stderr
    # set_parameter / clear_parameter, as rabbitmqctl's, for any component.
    other = uname("ctl2")
    r = subprocess.run(ctl + ["set_parameter", "shovel", other, value], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    wait_state(api, other, "running")
    r = subprocess.run(ctl + ["clear_parameter", "shovel", other], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert api.call("GET", f"/api/parameters/shovel/%2F/{q(other)}")[0] == 404
    wait_until(lambda: shovel_row(api, other) is None, timeout=10, what="the shovel stopped")
    r = subprocess.run(ctl + ["clear_parameter", "shovel", other], capture_output=True, text=True)
    assert r.returncode == 1, r.stderr


# ---- RabbitMQ 3.10 at the other end ----

RABBITMQ_SH = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared", "bench", "rabbitmq.sh")
RABBITMQ_AMQP = "amqp://guest:guest@127.0.0.1:5673/%2F"
RABBITMQ_MGMT = "http://127.0.0.1:15673"


@pytest.fixture(scope="module")
def rabbitmq():
    """RabbitMQ 3.10 with its shovel plugin (RABBITMQ_URL and RABBITMQ_MGMT_URL, or the one
    ../shared/bench/rabbitmq.sh runs on 5673, started here if it is down and stopped after)."""
    if not BIN:
        pytest.skip("Warren at one end, RabbitMQ at the other: needs WARREN_BIN")
    url = os.environ.get("RABBITMQ_URL")
    if url:
        yield url, os.environ.get("RABBITMQ_MGMT_URL", RABBITMQ_MGMT)
        return
    script = os.path.abspath(RABBITMQ_SH)
    if not os.path.exists(script):
        pytest.skip(f"no RabbitMQ: set RABBITMQ_URL, or provide {script}")
    was_up = subprocess.run([script, "status"], capture_output=True, text=True).stdout.strip() == "up"
    if not was_up:
        r = subprocess.run([script, "start"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"cannot start RabbitMQ: {r.stderr[-2000:]}"
    try:
        yield RABBITMQ_AMQP, RABBITMQ_MGMT
    finally:
        if not was_up:
            subprocess.run([script, "stop"], capture_output=True, timeout=120)


def purge_declare(url: str, queue: str) -> None:
    c = connect(url)
    try:
        ch = c.channel()
        ch.queue_declare(queue, durable=True)
        ch.queue_purge(queue)
    finally:
        safe_close(c)


def drop_queue(url: str, queue: str) -> None:
    c = connect(url)
    try:
        c.channel().queue_delete(queue)
    finally:
        safe_close(c)


@pytest.mark.parametrize("ack_mode", ["on-confirm", "on-publish", "no-ack"])
def test_warren_shovel_from_rabbitmq(api, amqp_url, res, shovels, rabbitmq, ack_mode):
    rmq, _ = rabbitmq
    src, dest = uname("from-rmq"), res.queue("dest")
    purge_declare(rmq, src)
    try:
        publish(rmq, src, 200, delivery_mode=2, headers={"origin": "rabbitmq"}, content_type="a/b")
        name = shovels()
        st, body = put_shovel(api, name, {"src-uri": rmq, "src-queue": src, "dest-uri": "amqp://",
                                          "dest-queue": dest, "ack-mode": ack_mode,
                                          "src-prefetch-count": 50})
        assert st == 201, body
        wait_until(lambda: depth(amqp_url, dest) == 200, timeout=30, what="200 moved from RabbitMQ")
        wait_until(lambda: depth(rmq, src) == 0, timeout=10, what="RabbitMQ's queue drained")
        c = connect(amqp_url)
        got = get_all(c.channel(), dest, 200)
        safe_close(c)
        assert [b for _, _, b in got] == [f"m{i}".encode() for i in range(200)]
        assert got[0][1].headers == {"origin": "rabbitmq"} and got[0][1].content_type == "a/b"
        assert got[0][1].delivery_mode == 2
    finally:
        drop_queue(rmq, src)


def test_warren_shovel_to_rabbitmq_with_queue_length(api, amqp_url, res, shovels, rabbitmq):
    rmq, _ = rabbitmq
    src, dest = res.queue("to-rmq"), uname("to-rmq")
    c = connect(amqp_url)
    c.channel().queue_declare(src, durable=True)
    safe_close(c)
    publish(amqp_url, src, 100, delivery_mode=2, headers={"origin": "warren"})
    name = shovels()
    try:
        st, body = put_shovel(api, name, {"src-uri": "amqp://", "src-queue": src, "dest-uri": rmq,
                                          "dest-queue": dest, "src-delete-after": "queue-length",
                                          "dest-add-forward-headers": True})
        assert st == 201, body
        wait_until(lambda: api.call("GET", f"/api/parameters/shovel/%2F/{q(name)}")[0] == 404,
                   timeout=30, what="the shovel to delete itself")
        assert depth(rmq, dest) == 100 and depth(amqp_url, src) == 0
        c = connect(rmq)
        (_, props, _), = get_all(c.channel(), dest, 1)
        safe_close(c)
        assert props.headers["origin"] == "warren"
        assert props.headers["x-shovelled"][0]["shovel-name"] == name
    finally:
        drop_queue(rmq, dest)


def test_rabbitmqs_own_shovel_into_warren(amqp_url, res, rabbitmq):
    """RabbitMQ's shovel plugin, on RabbitMQ, pointed at Warren as its destination."""
    rmq, rmq_mgmt = rabbitmq
    rapi = Api(rmq_mgmt)
    src, dest = uname("rmq-own"), res.queue("rmq-own")
    purge_declare(rmq, src)
    name = uname("rmq-shovel")
    try:
        publish(rmq, src, 100, delivery_mode=2)
        # Warren's session broker as RabbitMQ sees it: the same URL, guest over loopback.
        st, body = rapi.call("PUT", f"/api/parameters/shovel/%2F/{q(name)}", {"value": {
            "src-uri": "amqp://", "src-queue": src, "dest-uri": amqp_url.split("?")[0],
            "dest-queue": dest, "ack-mode": "on-confirm"}})
        assert st in (201, 204), body
        wait_until(lambda: depth(amqp_url, dest) == 100, timeout=30, what="RabbitMQ's shovel to deliver")
        wait_until(lambda: depth(rmq, src) == 0, timeout=10, what="RabbitMQ's queue drained")
    finally:
        rapi.call("DELETE", f"/api/parameters/shovel/%2F/{q(name)}")
        drop_queue(rmq, src)


# ---- TLS ----

@warren_only
@pytest.mark.skipif(not shutil.which("openssl"), reason="needs the openssl CLI to make certificates")
def test_over_tls_with_a_client_certificate(api, amqp_url, res, shovels, certs):
    """A shovel into a second Warren whose AMQPS listener requires a client certificate from
    its CA: with the CA and the client's certificate it moves the messages; with a client
    certificate from another CA it is refused, and says so in its status."""
    from conftest import _free_port
    from test_limits import start
    from test_tls import tls_config, tls_params

    d = certs
    tls_port = _free_port()
    other = start(tls_config(d, tls_port, f"ca_file = '{d}/ca.pem'\nverify = 'verify_peer'\nfail_if_no_peer_cert = true\n"))
    try:
        src, dest = res.queue("tls-src"), uname("tls-dest")
        c = connect(amqp_url)
        c.channel().queue_declare(src)
        safe_close(c)
        publish(amqp_url, src, 20, headers={"over": "tls"})

        def uri(client: str) -> str:
            return (f"amqps://guest:guest@localhost:{tls_port}/%2F?cacertfile={d}/ca.pem"
                    f"&certfile={d}/{client}.pem&keyfile={d}/{client}.key&verify=verify_peer")

        refused = shovels("tls-refused")
        st, body = put_shovel(api, refused, {"src-uri": "amqp://", "src-queue": src,
                                             "dest-uri": uri("stranger"), "dest-queue": dest})
        assert st == 201, body
        row = wait_state(api, refused, "terminated")
        assert row["reason"], row
        delete_shovel(api, refused)
        name = shovels("tls")
        st, body = put_shovel(api, name, {"src-uri": "amqp://", "src-queue": src,
                                          "dest-uri": uri("client"), "dest-queue": dest})
        assert st == 201, body
        row = wait_state(api, name, "running")
        assert row["dest_uri"].startswith(f"amqps://localhost:{tls_port}/"), row
        tc = pika.BlockingConnection(tls_params(d, tls_port, "client"))
        try:
            wait_until(lambda: tc.channel().queue_declare(dest, passive=True).method.message_count == 20,
                       timeout=20, what="20 moved over TLS")
            (_, props, _), = get_all(tc.channel(), dest, 1)
            assert props.headers == {"over": "tls"}
        finally:
            safe_close(tc)
    finally:
        other.cleanup()


# ---- LavinMQ 2.8.2 at the other end ----

LAVINMQ_SH = os.path.join(os.path.dirname(RABBITMQ_SH), "lavinmq.sh")


@pytest.fixture(scope="module")
def lavinmq():
    """LavinMQ 2.8.2 on 5674 (../shared/bench/lavinmq.sh, started here if it is down and
    stopped after), or LAVINMQ_URL."""
    if not BIN:
        pytest.skip("Warren at one end, LavinMQ at the other: needs WARREN_BIN")
    url = os.environ.get("LAVINMQ_URL")
    if url:
        yield url
        return
    script = os.path.abspath(LAVINMQ_SH)
    if not os.path.exists(script):
        pytest.skip(f"no LavinMQ: set LAVINMQ_URL, or provide {script}")
    was_up = subprocess.run([script, "status"], capture_output=True, text=True).stdout.strip().startswith("up")
    if not was_up:
        r = subprocess.run([script, "start"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"cannot start LavinMQ: {r.stdout[-1000:]} {r.stderr[-1000:]}"
    try:
        yield "amqp://guest:guest@127.0.0.1:5674/%2F"
    finally:
        if not was_up:
            subprocess.run([script, "stop"], capture_output=True, timeout=60)


def test_lavinmq_to_warren_and_back(api, amqp_url, res, shovels, lavinmq):
    src, dest, back = uname("lmq-src"), res.queue("from-lmq"), uname("lmq-back")
    purge_declare(lavinmq, src)
    try:
        publish(lavinmq, src, 100, delivery_mode=2, headers={"origin": "lavinmq"})
        into, out = shovels("from-lmq"), shovels("to-lmq")
        st, body = put_shovel(api, into, {"src-uri": lavinmq, "src-queue": src,
                                          "dest-uri": "amqp://", "dest-queue": dest})
        assert st == 201, body
        wait_until(lambda: depth(amqp_url, dest) == 100 and depth(lavinmq, src) == 0, timeout=30,
                   what="100 moved from LavinMQ")
        st, body = put_shovel(api, out, {"src-uri": "amqp://", "src-queue": dest,
                                         "dest-uri": lavinmq, "dest-queue": back})
        assert st == 201, body
        wait_until(lambda: depth(lavinmq, back) == 100, timeout=30, what="100 moved to LavinMQ")
        c = connect(lavinmq)
        (_, props, _), = get_all(c.channel(), back, 1)
        safe_close(c)
        assert props.headers == {"origin": "lavinmq"} and props.delivery_mode == 2
    finally:
        drop_queue(lavinmq, src)
        drop_queue(lavinmq, back)


@warren_only
def test_definitions_import_starts_shovels_and_checks_them(api, amqp_url, res, shovels):
    src, dest = res.queue("def-src"), res.queue("def-dest")
    name = shovels("def")
    doc = {"parameters": [{"vhost": "/", "component": "shovel", "name": name, "value": {
        "src-uri": "amqp://", "src-queue": src, "dest-uri": "amqp://", "dest-queue": dest}}]}
    st, body = api.call("POST", "/api/definitions", doc)
    assert st in (200, 201, 204), body
    wait_state(api, name, "running")
    publish(amqp_url, src, 10)
    wait_until(lambda: depth(amqp_url, dest) == 10, timeout=20, what="10 moved")
    bad = {"parameters": [{"vhost": "/", "component": "shovel", "name": uname("bad"),
                           "value": {"src-uri": "amqp://", "dest-uri": "amqp://"}}]}
    st, body = api.call("POST", "/api/definitions", bad)
    assert st == 400 and "Must specify 'src-exchange' or 'src-queue'" in body["reason"], body
