"""Users, vhosts, permissions, policies, queue types and definitions: the AMQP side checked with
pika, set up through the management HTTP API. Written against RabbitMQ 3.10 (texts verbatim)."""

from __future__ import annotations

import base64
import os
import time
import json
import urllib.error
import urllib.parse
import urllib.request

import pika
import pytest

from helpers import (channel_closed, connect, connection_closed, safe_close, uname, url_with,
                     wait_until)


class Api:
    def __init__(self, base: str, user: str = "guest", password: str = "guest"):
        self.base = base
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def call(self, method: str, path: str, body=None, headers=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, method=method, data=data)
        req.add_header("Authorization", self.auth)
        req.add_header("content-type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                text = r.read()
                return r.status, (json.loads(text) if text.strip() else None)
        except urllib.error.HTTPError as e:
            text = e.read()
            return e.code, (json.loads(text) if text.strip() else None)


def q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


@pytest.fixture
def api(mgmt_url):
    return Api(mgmt_url)


@pytest.fixture
def tenant(api, amqp_url):
    """A fresh user with permissions configure ^cfg, write ^w, read ^r on a fresh vhost."""
    user, vhost, password = uname("user"), uname("vhost"), "s3cret"
    assert api.call("PUT", f"/api/users/{q(user)}", {"password": password, "tags": ""})[0] == 201
    assert api.call("PUT", f"/api/vhosts/{q(vhost)}")[0] == 201
    st, _ = api.call("PUT", f"/api/permissions/{q(vhost)}/{q(user)}",
                     {"configure": "^cfg", "write": "^w", "read": "^r"})
    assert st == 201
    t = type("Tenant", (), {})()
    t.user, t.vhost, t.password = user, vhost, password
    t.url = url_with(amqp_url, user=user, password=password, vhost=vhost)
    t.admin_url = url_with(amqp_url, vhost=vhost)
    yield t
    api.call("DELETE", f"/api/vhosts/{q(vhost)}")
    api.call("DELETE", f"/api/users/{q(user)}")


def refused(t, kind: str, name: str) -> str:
    return f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '{t.vhost}' refused for user '{t.user}'"


def test_vhost_without_permission_is_530(tenant, amqp_url):
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as e:
        connect(url_with(amqp_url, user=tenant.user, password=tenant.password, vhost="/"))
    assert f"(530) \"NOT_ALLOWED - access to vhost '/' refused for user '{tenant.user}'\"" in str(e.value)


def test_wrong_password_is_refused(tenant):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(url_with(tenant.url, password="wrong"))


def _setup(t):
    """Objects the restricted user may not configure, made by guest (who gets full permissions
    on a vhost it creates through the API)."""
    c = connect(t.admin_url)
    ch = c.channel()
    ch.queue_declare("cfgq")
    ch.exchange_declare("zzx", "direct")
    safe_close(c)


@pytest.mark.parametrize("op,kind,name", [
    (lambda ch: ch.queue_declare("zz"), "queue", "zz"),
    (lambda ch: ch.queue_declare("", exclusive=True), "queue", "amq.gen-"),
    (lambda ch: ch.queue_declare("cfgq2", arguments={"x-dead-letter-exchange": "dlx"}), "queue", "cfgq2"),
    (lambda ch: ch.queue_bind("cfgq", "amq.direct", "k"), "queue", "cfgq"),
    (lambda ch: ch.queue_unbind("cfgq", "amq.direct", "k"), "queue", "cfgq"),
    (lambda ch: ch.basic_get("cfgq"), "queue", "cfgq"),
    (lambda ch: ch.basic_consume("cfgq", lambda *a: None), "queue", "cfgq"),
    (lambda ch: ch.queue_purge("cfgq"), "queue", "cfgq"),
    (lambda ch: ch.queue_delete("rq"), "queue", "rq"),
    (lambda ch: ch.exchange_declare("zzx2", "direct"), "exchange", "zzx2"),
    (lambda ch: ch.exchange_declare("cfgx", "direct", arguments={"alternate-exchange": "ae"}), "exchange", "cfgx"),
    (lambda ch: ch.exchange_delete("zzx"), "exchange", "zzx"),
    (lambda ch: ch.exchange_bind("zzx", "amq.direct", "k"), "exchange", "zzx"),
    (lambda ch: (ch.basic_publish("amq.direct", "k", b"m"), ch.queue_declare("cfgq", passive=True)), "exchange", "amq.direct"),
    (lambda ch: (ch.basic_publish("", "k", b"m"), ch.queue_declare("cfgq", passive=True)), "exchange", "amq.default"),
    (lambda ch: (ch.basic_publish("nonexistent", "k", b"m"), ch.queue_declare("cfgq", passive=True)), "exchange", "nonexistent"),
], ids=["declare", "declare-server-named", "declare-dlx", "bind", "unbind", "get", "consume", "purge",
        "delete", "exchange-declare", "exchange-declare-ae", "exchange-delete", "exchange-bind",
        "publish", "publish-default", "publish-missing"])
def test_refused_where_rabbitmq_checks(tenant, op, kind, name):
    _setup(tenant)
    c = connect(tenant.url)
    try:
        # A server-chosen name is random: its prefix is checked.
        text = refused(tenant, kind, name) if name != "amq.gen-" else "ACCESS_REFUSED - access to queue 'amq.gen-"
        with channel_closed(403, text):
            op(c.channel())
    finally:
        safe_close(c)


def test_allowed_operations(tenant):
    _setup(tenant)
    c = connect(tenant.url)
    try:
        ch = c.channel()
        ch.queue_declare("cfg-own")                    # configure ^cfg
        ch.queue_declare("cfgq", passive=True)         # passive: no permission needed
        ch.exchange_declare("amq.direct", "direct", passive=True)
        with channel_closed(403, "ACCESS_REFUSED - queue name 'amq.q' contains reserved prefix 'amq.*'"):
            ch.queue_declare("amq.q")
    finally:
        safe_close(c)


def test_permissions_apply_to_open_channels(tenant, api):
    _setup(tenant)
    c = connect(tenant.url)
    try:
        ch = c.channel()
        ch.queue_declare("cfg-a")
        api.call("PUT", f"/api/permissions/{q(tenant.vhost)}/{q(tenant.user)}",
                 {"configure": "^other", "write": "", "read": ""})
        with channel_closed(403, refused(tenant, "queue", "cfg-b")):
            ch.queue_declare("cfg-b")
    finally:
        safe_close(c)


def test_delete_vhost_closes_its_connections(api, amqp_url):
    vhost = uname("vhost")
    assert api.call("PUT", f"/api/vhosts/{q(vhost)}")[0] == 201
    c = connect(url_with(amqp_url, vhost=vhost))
    c.channel().queue_declare("dq", durable=True)
    assert api.call("DELETE", f"/api/vhosts/{q(vhost)}")[0] == 204
    # RabbitMQ says "is deleted", or "is down" when the vhost's supervisor stops first.
    with connection_closed(320, f"CONNECTION_FORCED - vhost '{vhost}' is ") as closed:
        wait_until(lambda: False, timeout=10, conn=c)
    assert closed.exc.reply_text.endswith((" is deleted", " is down"))
    assert api.call("GET", f"/api/vhosts/{q(vhost)}")[0] == 404
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as e:
        connect(url_with(amqp_url, vhost=vhost))
    assert f"NOT_ALLOWED - vhost {vhost} not found" in str(e.value)


def test_close_connection_through_the_api(api, amqp_url):
    name = uname("conn")
    c = connect(amqp_url, client_properties={"connection_name": name})

    def find():
        st, conns = api.call("GET", "/api/connections")
        return next((x for x in conns if x.get("client_properties", {}).get("connection_name") == name), None)

    info = wait_until(find, timeout=20, what="connection listed", conn=c)
    assert info["user"] == "guest" and info["vhost"] == "/"
    st, _ = api.call("DELETE", f"/api/connections/{q(info['name'])}", headers={"X-Reason": "maintenance"})
    assert st == 204
    with connection_closed(320, "CONNECTION_FORCED - maintenance"):
        wait_until(lambda: False, timeout=10, conn=c)


def test_management_errors(api):
    assert api.call("GET", "/api/users/nosuch-user")[0] == 404
    assert api.call("DELETE", "/api/vhosts/nosuch-vhost")[0] == 404
    st, body = api.call("PUT", "/api/permissions/nosuch-vhost/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    assert (st, body["reason"]) == (400, "vhost_or_user_not_found")
    st, body = api.call("PUT", "/api/policies/%2F/p", {"pattern": ".*", "definition": {"foo": 1}})
    assert st == 400 and "are not recognised policy settings" in body["reason"]
    st, body = api.call("PUT", "/api/policies/%2F/p", {"pattern": ".*", "definition": {"max-priority": 5}})
    assert st == 400 and "max-priority" in body["reason"]
    st, body = api.call("PUT", "/api/policies/%2F/p", {"pattern": ".*", "definition": {"message-ttl": -1}})
    assert (st, body["reason"]) == (400, "Validation failed\n\n-1 is not a valid message TTL\n")
    assert Api(api.base, "guest", "wrong").call("GET", "/api/overview")[0] == 401


def test_non_administrator_cannot_write(api, tenant):
    api.call("PUT", f"/api/users/{q(tenant.user)}", {"password": tenant.password, "tags": "management"})
    as_user = Api(api.base, tenant.user, tenant.password)
    st, body = as_user.call("PUT", f"/api/vhosts/{q(uname('v'))}")
    assert (st, body["reason"]) == (401, "Not administrator user")


def _depth(ch, name):
    return ch.queue_declare(name, passive=True).method.message_count


def test_policy_applies_to_new_and_existing_queues(api, res, conn):
    prefix = uname("pol")
    ch = conn.channel()
    existing = res.track_queue(prefix + "-old")
    ch.queue_declare(existing)
    st, _ = api.call("PUT", f"/api/policies/%2F/{q(prefix)}",
                     {"pattern": "^" + prefix, "definition": {"max-length": 2}, "apply-to": "queues", "priority": 1})
    assert st in (201, 204)
    try:
        fresh = res.track_queue(prefix + "-new")
        ch.queue_declare(fresh)
        # A queue argument lower than the policy's wins (the lower limit applies).
        low = res.track_queue(prefix + "-low")
        ch.queue_declare(low, arguments={"x-max-length": 1})

        def filled():
            for n in (existing, fresh, low):
                for i in range(4):
                    ch.basic_publish("", n, str(i).encode())
            return [_depth(ch, existing), _depth(ch, fresh), _depth(ch, low)] == [2, 2, 1]
        wait_until(filled, timeout=20, what="policy max-length applied", conn=conn)
        # A higher-priority policy takes over; removing policies lifts the limit.
        st, _ = api.call("PUT", f"/api/policies/%2F/{q(prefix)}-hi",
                         {"pattern": "^" + prefix + "-new", "definition": {"max-length": 3}, "priority": 5})
        assert st in (201, 204)

        def three():
            ch.basic_publish("", fresh, b"x")
            return _depth(ch, fresh) == 3
        wait_until(three, timeout=20, what="higher-priority policy applied", conn=conn)
    finally:
        api.call("DELETE", f"/api/policies/%2F/{q(prefix)}-hi")
        api.call("DELETE", f"/api/policies/%2F/{q(prefix)}")

    def unlimited():
        ch.basic_publish("", existing, b"y")
        return _depth(ch, existing) > 3
    wait_until(unlimited, timeout=20, what="policy removed", conn=conn)


@pytest.mark.parametrize("props,args,text", [
    (dict(durable=False), {"x-queue-type": "quorum"}, "invalid property 'non-durable' for queue '{q}' in vhost '/'"),
    (dict(durable=True, exclusive=True), {"x-queue-type": "quorum"}, "invalid property 'exclusive-owner' for queue '{q}' in vhost '/'"),
    (dict(durable=True, auto_delete=True), {"x-queue-type": "quorum"}, "invalid property 'auto-delete' for queue '{q}' in vhost '/'"),
    (dict(durable=False), {"x-queue-type": "stream"}, "invalid property 'non-durable' for queue '{q}' in vhost '/'"),
    (dict(durable=True), {"x-queue-type": "foo"}, "invalid arg 'x-queue-type' for queue '{q}' in vhost '/': \"unsupported queue type 'foo'\""),
    (dict(durable=True), {"x-queue-type": 5}, "invalid arg 'x-queue-type' for queue '{q}' in vhost '/': {{unacceptable_type,signedint}}"),
], ids=["quorum-non-durable", "quorum-exclusive", "quorum-auto-delete", "stream-non-durable", "unknown", "not-a-string"])
def test_queue_type_validation(conn, res, props, args, text):
    name = res.queue("qt")
    with channel_closed(406, "PRECONDITION_FAILED - " + text.format(q=name)):
        conn.channel().queue_declare(name, arguments=args, **props)


def test_quorum_queue_is_accepted(conn, res):
    ch = conn.channel()
    name = res.queue("quorum")
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    ch.basic_publish("", name, b"hello")
    wait_until(lambda: _depth(ch, name) == 1, conn=conn)
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_declare(res.queue("classic"), arguments={"x-queue-type": "classic"})


def test_quorum_queue_delivery_limit_dead_letters_after_the_limit(conn, res):
    """x-delivery-limit 2: a message returned twice is delivered a third time (x-delivery-count
    0 on the first delivery, then 1, then 2: RabbitMQ 3.10 sets it on every quorum queue
    delivery), and returned once more it is dead-lettered with reason delivery_limit."""
    ch = conn.channel()
    dlq, name = res.queue("dlq"), res.queue("limited")
    ch.queue_declare(dlq, durable=True)
    ch.queue_declare(name, durable=True, arguments={
        "x-queue-type": "quorum", "x-delivery-limit": 2,
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    ch.confirm_delivery()
    ch.basic_publish("", name, b"m", pika.BasicProperties(delivery_mode=2))
    seen = []
    for _ in range(4):
        got = None
        deadline = time.time() + 5
        while got is None and time.time() < deadline:
            m = ch.basic_get(name)
            if m[0] is not None:
                got = m
            elif seen and len(seen) == 3:
                break
            else:
                time.sleep(0.05)
        if got is None:
            break
        method, props, body = got
        assert body == b"m"
        seen.append((method.redelivered, (props.headers or {}).get("x-delivery-count")))
        ch.basic_nack(method.delivery_tag, requeue=True)
    assert seen == [(False, 0), (True, 1), (True, 2)], seen
    deadline = time.time() + 5
    dead = ch.basic_get(dlq, auto_ack=True)
    while dead[0] is None and time.time() < deadline:
        time.sleep(0.05)
        dead = ch.basic_get(dlq, auto_ack=True)
    assert dead[2] == b"m", dead
    assert dead[1].headers["x-death"][0]["reason"] == "delivery_limit"


# probeu / secret1 exported by RabbitMQ 3.10.8 (rabbit_password_hashing_sha256).
RABBITMQ_HASH = "ZMxFk8ASgWCnMazyJikjcF+qRkrwSVF82S06D/jmieBuNXuS"


def test_definitions_from_rabbitmq_import_and_log_in(api, amqp_url):
    user, vhost, queue = uname("imported"), uname("vhost"), uname("q")
    doc = {
        "users": [{"name": user, "password_hash": RABBITMQ_HASH,
                   "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["management"], "limits": {}}],
        "vhosts": [{"name": vhost}],
        "permissions": [{"user": user, "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"}],
        "policies": [{"vhost": vhost, "name": "cap", "pattern": "^" + queue, "apply-to": "queues",
                      "definition": {"max-length": 1}, "priority": 0}],
        "queues": [{"name": queue, "vhost": vhost, "durable": True, "auto_delete": False,
                    "arguments": {"x-message-ttl": 60000}}],
        "exchanges": [{"name": "ix", "vhost": vhost, "type": "topic", "durable": True,
                       "auto_delete": False, "internal": False, "arguments": {}}],
        "bindings": [{"source": "ix", "vhost": vhost, "destination": queue, "destination_type": "queue",
                      "routing_key": "a.#", "arguments": {}}],
    }
    st, body = api.call("POST", "/api/definitions", doc)
    assert st in (201, 204), body
    try:
        c = connect(url_with(amqp_url, user=user, password="secret1", vhost=vhost))
        ch = c.channel()
        ch.queue_declare(queue, durable=True, arguments={"x-message-ttl": 60000})
        for i in range(3):
            ch.basic_publish("ix", "a.b", str(i).encode())
        wait_until(lambda: _depth(ch, queue) == 1, timeout=20, conn=c)
        safe_close(c)
        st, exported = api.call("GET", "/api/definitions")
        assert st == 200
        u = next(x for x in exported["users"] if x["name"] == user)
        assert (u["password_hash"], u["hashing_algorithm"]) == (RABBITMQ_HASH, "rabbit_password_hashing_sha256")
        assert any(b["source"] == "ix" and b["destination"] == queue for b in exported["bindings"])
        assert any(p["name"] == "cap" and p["vhost"] == vhost for p in exported["policies"])
    finally:
        api.call("DELETE", f"/api/vhosts/{q(vhost)}")
        api.call("DELETE", f"/api/users/{q(user)}")


def test_definitions_import_skips_amq_queues(api):
    # RabbitMQ 3.10 logs "Skipping import of a queue whose name begins with 'amq.'", skips the
    # bindings to it too, and answers the import as a success.
    name = "amq.gen-" + uname("imported")
    doc = {
        "queues": [{"name": name, "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}],
        "bindings": [{"source": "amq.direct", "vhost": "/", "destination": name, "destination_type": "queue",
                      "routing_key": "k", "arguments": {}}],
    }
    st, body = api.call("POST", "/api/definitions", doc)
    assert st in (201, 204), body
    assert api.call("GET", f"/api/queues/%2F/{q(name)}")[0] == 404


def test_trace_exchange_listed_but_not_exported(api):
    # /api/exchanges shows the predeclared amq.rabbitmq.trace; definitions leave amq.* out.
    st, x = api.call("GET", "/api/exchanges/%2F/amq.rabbitmq.trace")
    assert st == 200, x
    assert (x["name"], x["type"], x["durable"], x["auto_delete"], x["internal"]) == \
        ("amq.rabbitmq.trace", "topic", True, False, True)
    st, xs = api.call("GET", "/api/exchanges/%2F")
    assert st == 200
    assert "amq.rabbitmq.trace" in [e["name"] for e in xs]
    st, defs = api.call("GET", "/api/definitions")
    assert st == 200
    assert not [e for e in defs["exchanges"] if e["name"].startswith("amq.")]


@pytest.mark.skipif(not os.environ.get("WARREN_BIN"), reason="limits the broker's file sizes: Warren only (WARREN_BIN)")
def test_change_that_cannot_be_written_is_refused():
    """With access.json unable to grow (a size-limited file), a new user or vhost gets 500
    instead of a 2xx and does not exist; users that did get a 2xx survive a kill -9."""
    import resource

    from test_durability import Node

    n = Node(fsize_limit=8 * 1024)
    try:
        n.start()
        api = Api(f"http://127.0.0.1:{n.http_port}")
        created, refused = [], None
        for i in range(200):
            name = f"full-{i}"
            st, body = api.call("PUT", f"/api/users/{name}", {"password": "p", "tags": "t" * 200})
            if st == 500:
                assert "access.json" in body["reason"], body
                refused = name
                break
            assert st == 201, (st, body)
            created.append(name)
        assert refused is not None, f"{len(created)} users past an 8 KiB file limit all got 201"
        assert len(created) > 3, "refused before the limit could have been reached"
        assert api.call("GET", f"/api/users/{refused}")[0] == 404, "a refused user was applied"
        assert api.call("PUT", "/api/vhosts/full-vh", {"description": "d" * 400})[0] == 500
        assert api.call("GET", "/api/vhosts/full-vh")[0] == 404, "a refused vhost was created"
        resource.prlimit(n.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        assert api.call("PUT", "/api/users/after-full", {"password": "p", "tags": ""})[0] == 201
        n.kill9()
        n.fsize_limit = None
        n.start()
        for name in (created[0], created[-1], "after-full"):
            assert api.call("GET", f"/api/users/{name}")[0] == 200, f"{name} got 201 and was lost"
        assert api.call("GET", f"/api/users/{refused}")[0] == 404
        assert api.call("GET", "/api/vhosts/full-vh")[0] == 404
    finally:
        n.cleanup()


@pytest.mark.parametrize("tags", ["impersonator", "monitoring"])
def test_impersonator_may_publish_any_user_id(api, amqp_url, res, tags):
    user, password = uname("imp"), "s3cret"
    assert api.call("PUT", f"/api/users/{q(user)}", {"password": password, "tags": tags})[0] == 201
    try:
        st, _ = api.call("PUT", f"/api/permissions/%2F/{q(user)}",
                         {"configure": ".*", "write": ".*", "read": ".*"})
        assert st == 201
        name = res.queue("imp")
        c = connect(url_with(amqp_url, user=user, password=password))
        try:
            ch = c.channel()
            ch.queue_declare(name)
            props = pika.BasicProperties(user_id="somebody-else")
            if tags == "impersonator":
                ch.basic_publish("", name, b"as-someone", props)
                _m, p, b = _get_one(ch, name)
                assert (b, p.user_id) == (b"as-someone", "somebody-else")
            else:
                with channel_closed(406, "PRECONDITION_FAILED - user_id property set to "
                                         f"'somebody-else' but authenticated user was '{user}'"):
                    ch.basic_publish("", name, b"refused", props)
                    ch.queue_declare(name, passive=True)
        finally:
            safe_close(c)
    finally:
        api.call("DELETE", f"/api/users/{q(user)}")


def _get_one(ch, name):
    def got():
        m, p, b = ch.basic_get(name, auto_ack=True)
        return (m, p, b) if m else None
    return wait_until(got, what=f"a message in {name}")
