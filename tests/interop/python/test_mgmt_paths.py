"""Management API URL forms: every /api/... URL also answers with one trailing slash, as
RabbitMQ 3.10's does (client libraries build URLs that way); two slashes are a 404 there.
Written against RabbitMQ 3.10 (management on 15673)."""

from __future__ import annotations

import pytest

from helpers import uname
from test_access import Api, q


@pytest.fixture
def api(mgmt_url):
    return Api(mgmt_url)


@pytest.mark.parametrize("path", [
    "/api/overview", "/api/whoami", "/api/queues", "/api/queues/%2F", "/api/exchanges/%2F",
    "/api/exchanges/%2F/amq.direct", "/api/bindings/%2F", "/api/connections", "/api/vhosts",
    "/api/vhosts/%2F", "/api/users/guest", "/api/permissions/%2F/guest", "/api/policies/%2F",
    "/api/definitions",
])
def test_trailing_slash_answers_as_without(api, path):
    st, plain = api.call("GET", path)
    assert st == 200, plain
    st, slashed = api.call("GET", path + "/")
    assert st == 200, slashed
    assert type(slashed) is type(plain)
    if isinstance(plain, dict) and "name" in plain:
        assert slashed["name"] == plain["name"]


def test_trailing_slash_keeps_the_query_string(api):
    st, body = api.call("GET", "/api/queues/?columns=name")
    assert st == 200 and isinstance(body, list), body


def test_put_get_delete_with_trailing_slash(api):
    name = uname("slash")
    st, body = api.call("PUT", f"/api/queues/%2F/{q(name)}/", {"durable": False})
    assert st == 201, body
    st, body = api.call("GET", f"/api/queues/%2F/{q(name)}/")
    assert st == 200 and body["name"] == name, body
    assert api.call("DELETE", f"/api/queues/%2F/{q(name)}/")[0] == 204
    assert api.call("GET", f"/api/queues/%2F/{q(name)}")[0] == 404


@pytest.mark.parametrize("path", ["/api/overview//", "/api/nonexistent/", "/api/queues/%2F/nope/"])
def test_other_paths_stay_not_found(api, path):
    st, body = api.call("GET", path)
    assert st == 404
    assert body == {"error": "Object Not Found", "reason": "Not Found"}
