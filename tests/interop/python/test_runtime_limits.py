"""Runtime vhost and user limits, as `rabbitmqctl set_vhost_limits` / `set_user_limits` and the
management API's /api/vhost-limits and /api/user-limits set them: enforced on the next
connection, queue or channel (open ones are left alone), cleared, and kept across a restart.
Written against RabbitMQ 3.10 (texts verbatim); the restart test is Warren only."""

from __future__ import annotations

import os

import pika
import pika.exceptions
import pytest

from helpers import connect, safe_close, uname, wait_until
# A fresh user on a fresh vhost (configure ^cfg, write ^w, read ^r), and the API as guest.
from test_access import Api, api, q, tenant  # noqa: F401 - fixtures
from test_durability import Node

BIN = os.environ.get("WARREN_BIN")


def set_limit(api: Api, kind: str, name: str, limit: str, value) -> None:
    st, body = api.call("PUT", f"/api/{kind}/{q(name)}/{limit}", {"value": value})
    assert st == 204, body


def clear_limit(api: Api, kind: str, name: str, limit: str) -> None:
    st, body = api.call("DELETE", f"/api/{kind}/{q(name)}/{limit}")
    assert st == 204, body


def refused_open(url: str) -> str:
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as e:
        connect(url)
    return str(e.value)


def test_vhost_limits_api(api, tenant):
    v = tenant.vhost
    assert api.call("GET", f"/api/vhost-limits/{q(v)}") == (200, [])
    set_limit(api, "vhost-limits", v, "max-connections", 10)
    set_limit(api, "vhost-limits", v, "max-queues", -1)
    expected = {"vhost": v, "value": {"max-connections": 10, "max-queues": -1}}
    assert api.call("GET", f"/api/vhost-limits/{q(v)}") == (200, [expected])
    st, rows = api.call("GET", "/api/vhost-limits")
    assert st == 200 and expected in rows
    st, body = api.call("PUT", f"/api/vhost-limits/{q(v)}/max-queues", {"value": "lots"})
    assert st == 400 and body["error"] == "bad_request"
    st, body = api.call("PUT", f"/api/vhost-limits/{q(v)}/max-channels", {"value": 1})
    assert st == 400
    clear_limit(api, "vhost-limits", v, "max-connections")
    assert api.call("GET", f"/api/vhost-limits/{q(v)}") == (200, [{"vhost": v, "value": {"max-queues": -1}}])
    clear_limit(api, "vhost-limits", v, "max-queues")
    assert api.call("GET", f"/api/vhost-limits/{q(v)}") == (200, [])
    assert api.call("GET", f"/api/vhost-limits/{q(uname('missing'))}")[0] == 404


def test_vhost_max_connections(api, tenant):
    v, u = tenant.vhost, tenant.user
    set_limit(api, "vhost-limits", v, "max-connections", 1)
    a = connect(tenant.url)
    text = refused_open(tenant.url)
    assert f"NOT_ALLOWED - access to vhost '{v}' refused for user '{u}': connection limit (1) is reached" in text
    # 0 refuses every new connection; the open one is left alone.
    set_limit(api, "vhost-limits", v, "max-connections", 0)
    text = refused_open(tenant.url)
    assert f"connection limit (0) is reached" in text
    assert a.is_open
    a.channel().queue_declare("cfg-a", exclusive=True)
    # A negative value means no limit.
    set_limit(api, "vhost-limits", v, "max-connections", -1)
    b = connect(tenant.url)
    c = connect(tenant.url)
    clear_limit(api, "vhost-limits", v, "max-connections")
    for x in (a, b, c):
        safe_close(x)


def test_vhost_max_queues(api, tenant):
    v = tenant.vhost
    set_limit(api, "vhost-limits", v, "max-queues", 1)
    c = connect(tenant.url)
    ch = c.channel()
    ch.queue_declare("cfg-lq1")
    ch.queue_declare("cfg-lq1")  # redeclaring is not a new queue
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.queue_declare("cfg-lq2")
    assert e.value.reply_code == 406
    assert e.value.reply_text == f"PRECONDITION_FAILED - cannot declare queue 'cfg-lq2': queue limit in vhost '{v}' (1) is reached"
    clear_limit(api, "vhost-limits", v, "max-queues")
    ch = c.channel()
    ch.queue_declare("cfg-lq2")
    set_limit(api, "vhost-limits", v, "max-queues", 0)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.queue_declare("cfg-lq3")
    assert "queue limit in vhost" in e.value.reply_text and "(0)" in e.value.reply_text
    safe_close(c)


def test_user_limits_api(api, tenant):
    u = tenant.user
    set_limit(api, "user-limits", u, "max-connections", 3)
    set_limit(api, "user-limits", u, "max-channels", 7)
    expected = {"user": u, "value": {"max-channels": 7, "max-connections": 3}}
    assert api.call("GET", f"/api/user-limits/{q(u)}") == (200, [expected])
    st, rows = api.call("GET", "/api/user-limits")
    assert st == 200 and expected in rows
    assert api.call("GET", f"/api/users/{q(u)}")[1]["limits"] == expected["value"]
    assert api.call("PUT", f"/api/user-limits/{q(u)}/max-queues", {"value": 1})[0] == 400
    clear_limit(api, "user-limits", u, "max-channels")
    assert api.call("GET", f"/api/user-limits/{q(u)}") == (200, [{"user": u, "value": {"max-connections": 3}}])
    clear_limit(api, "user-limits", u, "all")
    assert api.call("GET", f"/api/user-limits/{q(u)}") == (200, [])


def test_user_max_connections(api, tenant):
    u = tenant.user
    set_limit(api, "user-limits", u, "max-connections", 1)
    a = connect(tenant.url)
    text = refused_open(tenant.url)
    assert f"NOT_ALLOWED - connection refused for user '{u}': user connection limit (1) is reached" in text
    clear_limit(api, "user-limits", u, "max-connections")
    b = connect(tenant.url)
    safe_close(a)
    safe_close(b)


def test_user_max_channels_across_connections(api, tenant):
    u = tenant.user
    set_limit(api, "user-limits", u, "max-channels", 2)
    a, b = connect(tenant.url), connect(tenant.url)
    a.channel()
    b.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
        b.channel()
    assert e.value.reply_code == 530
    assert e.value.reply_text == (f"NOT_ALLOWED - number of channels opened for user '{u}' "
                                  "has reached the maximum allowed user limit of (2)")
    # b's channel was given back with b (which goes once the client's close-ok arrives, so
    # wait until the API no longer lists it); a keeps its channel.
    wait_until(lambda: len([c for c in api.call("GET", "/api/connections")[1] if c["user"] == u]) == 1,
               what=f"{u}'s second connection to go")
    assert a.is_open
    a.channel()
    clear_limit(api, "user-limits", u, "max-channels")
    a.channel()
    safe_close(a)


def test_definitions_carry_limits(api):
    """RabbitMQ 3.10's shape: a user's limits in its object, a vhost's as a `vhost-limits`
    parameter. Warren also reads the `limits` newer RabbitMQ versions put on vhost objects."""
    user, v1, v2 = uname("duser"), uname("dvhost"), uname("dvhost")
    vhosts = [{"name": v1}, {"name": v2}]
    if BIN:
        vhosts[1]["limits"] = [["max-connections", 4]]
    doc = {
        "users": [{"name": user, "password_hash": "", "tags": [], "limits": {"max-channels": 3}}],
        "vhosts": vhosts,
        "parameters": [{"vhost": v1, "component": "vhost-limits", "name": "limits",
                        "value": {"max-queues": 7}}],
    }
    try:
        st, body = api.call("POST", "/api/definitions", doc)
        assert st in (200, 201, 204), body
        assert api.call("GET", f"/api/vhost-limits/{q(v1)}") == (200, [{"vhost": v1, "value": {"max-queues": 7}}])
        assert api.call("GET", f"/api/user-limits/{q(user)}") == (200, [{"user": user, "value": {"max-channels": 3}}])
        if BIN:
            assert api.call("GET", f"/api/vhost-limits/{q(v2)}")[1] == [{"vhost": v2, "value": {"max-connections": 4}}]
        st, defs = api.call("GET", "/api/definitions")
        assert {"vhost": v1, "component": "vhost-limits", "name": "limits",
                "value": {"max-queues": 7}} in defs["parameters"]
        exported = next(u for u in defs["users"] if u["name"] == user)
        assert exported["limits"] == {"max-channels": 3}
    finally:
        for v in (v1, v2):
            api.call("DELETE", f"/api/vhosts/{q(v)}")
        api.call("DELETE", f"/api/users/{q(user)}")


@pytest.mark.skipif(not BIN, reason="restarts the broker: Warren only (WARREN_BIN)")
def test_limits_survive_a_restart():
    n = Node()
    try:
        n.start()
        admin = Api(f"http://127.0.0.1:{n.http_port}")
        set_limit(admin, "vhost-limits", "/", "max-queues", 1)
        set_limit(admin, "user-limits", "guest", "max-channels", 5)
        n.kill9()
        n.start()
        assert admin.call("GET", "/api/vhost-limits") == (200, [{"vhost": "/", "value": {"max-queues": 1}}])
        assert admin.call("GET", "/api/user-limits") == (200, [{"user": "guest", "value": {"max-channels": 5}}])
        st, defs = admin.call("GET", "/api/definitions")
        assert {"vhost": "/", "component": "vhost-limits", "name": "limits",
                "value": {"max-queues": 1}} in defs["parameters"]
        c = connect(n.url)
        ch = c.channel()
        ch.queue_declare("only")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.queue_declare("second")
        assert e.value.reply_code == 406
        safe_close(c)
    finally:
        n.cleanup()
