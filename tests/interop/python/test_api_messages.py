"""The management API's message endpoints, as RabbitMQ 3.10 answers them: POST
/api/exchanges/{vhost}/{name}/publish and POST /api/queues/{vhost}/{name}/get."""

from __future__ import annotations

import base64

import pytest

from helpers import wait_until
from test_access import Api, api, q  # noqa: F401  (api is a fixture)


def publish(api: Api, exchange: str, key: str, payload: str, encoding="string", props=None):
    return api.call("POST", f"/api/exchanges/%2F/{q(exchange)}/publish", {
        "properties": props if props is not None else {}, "routing_key": key,
        "payload": payload, "payload_encoding": encoding})


def get(api: Api, queue: str, count: int, ackmode: str, encoding="auto", truncate=None):
    body = {"count": count, "ackmode": ackmode, "encoding": encoding}
    if truncate is not None:
        body["truncate"] = truncate
    return api.call("POST", f"/api/queues/%2F/{q(queue)}/get", body)


def depth(api: Api, queue: str) -> int:
    return api.call("GET", f"/api/queues/%2F/{q(queue)}")[1].get("messages_ready", -1)


@pytest.fixture
def queue(api, res):
    name = res.queue("apimsg")
    assert api.call("PUT", f"/api/queues/%2F/{q(name)}", {"durable": False})[0] in (201, 204)
    return name


def test_publish_routes_and_get_requeues(api, queue):
    props = {"delivery_mode": 2, "headers": {"h": 1}, "content_type": "text/plain"}
    assert publish(api, "amq.default", queue, "hello", props=props) == (200, {"routed": True})
    binary = base64.b64encode(b"\xff\x00bin").decode()
    assert publish(api, "amq.default", queue, binary, encoding="base64") == (200, {"routed": True})
    st, got = get(api, queue, 5, "ack_requeue_true", truncate=3)
    assert st == 200 and len(got) == 2
    first, second = got
    assert first["payload"] == "hel" and first["payload_bytes"] == 5
    assert first["payload_encoding"] == "string" and first["redelivered"] is False
    assert first["routing_key"] == queue and first["exchange"] == ""
    assert first["message_count"] == 1
    assert first["properties"] == props
    assert second["payload_encoding"] == "base64"
    assert base64.b64decode(second["payload"]) == b"\xff\x00b"
    assert second["properties"] == [] and second["message_count"] == 0
    # Requeued: both are there again, now redelivered.
    st, again = get(api, queue, 5, "ack_requeue_true", encoding="base64")
    assert [m["redelivered"] for m in again] == [True, True]
    assert base64.b64decode(again[0]["payload"]) == b"hello"


def test_get_that_acks_removes_and_reject_dead_letters(api, res, queue):
    dlq = res.queue("apidlq")
    assert api.call("PUT", f"/api/queues/%2F/{q(dlq)}", {"durable": False})[0] in (201, 204)
    src = res.queue("apisrc")
    args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
    assert api.call("PUT", f"/api/queues/%2F/{q(src)}",
                    {"durable": False, "arguments": args})[0] in (201, 204)
    for i in range(3):
        assert publish(api, "amq.default", src, f"m{i}")[1] == {"routed": True}
    st, got = get(api, src, 1, "ack_requeue_false")
    assert [m["payload"] for m in got] == ["m0"]
    st, got = get(api, src, 1, "reject_requeue_false")
    assert [m["payload"] for m in got] == ["m1"]
    st, got = get(api, src, 1, "reject_requeue_true")
    assert [m["payload"] for m in got] == ["m2"]
    wait_until(lambda: depth(api, dlq) == 1 and depth(api, src) == 1, what="one dead-lettered")
    st, dead = get(api, dlq, 1, "ack_requeue_false")
    assert dead[0]["payload"] == "m1"
    assert dead[0]["properties"]["headers"]["x-death"][0]["reason"] == "rejected"


def test_unroutable_and_errors(api, queue):
    assert publish(api, "amq.direct", "no-such-key", "x") == (200, {"routed": False})
    st, body = publish(api, "no-such-exchange", "k", "x")
    assert st == 400
    assert body["reason"] == "404 NOT_FOUND - no exchange 'no-such-exchange' in vhost '/'"
    st, body = api.call("POST", "/api/exchanges/%2F/amq.default/publish",
                        {"routing_key": queue, "payload": "x"})
    assert (st, body["reason"]) == (400, "[{key_missing,properties},{key_missing,payload_encoding}]")
    st, body = api.call("POST", f"/api/queues/%2F/{q(queue)}/get",
                        {"count": 1, "ackmode": "ack_requeue_true"})
    assert (st, body["reason"]) == (400, "[{key_missing,encoding}]")
    st, body = get(api, "no-such-queue", 1, "ack_requeue_true")
    assert st == 404
    assert body == {"error": "not_found", "reason": "NOT_FOUND - no queue 'no-such-queue' in vhost '/'"}
    assert get(api, queue, 1, "ack_requeue_true") == (200, [])
