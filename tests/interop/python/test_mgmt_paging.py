"""Management API list paging, sorting and filtering (RabbitMQ's `page`, `page_size`, `name`,
`use_regex`, `sort`, `sort_reverse`), and adding and removing bindings at RabbitMQ's binding
URLs. Written against RabbitMQ 3.10 (management on 15673); each test works in a vhost of its
own, so the counts are its own."""

from __future__ import annotations

import pytest

from helpers import uname
from test_access import Api, q


@pytest.fixture
def api(mgmt_url):
    return Api(mgmt_url)


@pytest.fixture
def vhost(api):
    name = uname("paging-vh")
    st, body = api.call("PUT", f"/api/vhosts/{q(name)}", {})
    assert st == 201, body
    yield name
    api.call("DELETE", f"/api/vhosts/{q(name)}")


def _queues(api, vhost, names, arguments=None):
    for i, n in enumerate(names):
        args = arguments(i) if arguments else {}
        st, body = api.call("PUT", f"/api/queues/{q(vhost)}/{q(n)}",
                            {"durable": False, "arguments": args})
        assert st == 201, body


def test_pages_with_counts(api, vhost):
    names = [f"pq-{i:02}" for i in range(7)]
    _queues(api, vhost, reversed(names))
    st, body = api.call("GET", f"/api/queues/{q(vhost)}?page=2&page_size=3")
    assert st == 200, body
    assert [i["name"] for i in body["items"]] == names[3:6]
    assert {k: v for k, v in body.items() if k != "items"} == {
        "filtered_count": 7, "item_count": 3, "page": 2, "page_count": 3, "page_size": 3,
        "total_count": 7}
    st, body = api.call("GET", f"/api/queues/{q(vhost)}?page=3&page_size=3")
    assert st == 200 and [i["name"] for i in body["items"]] == names[6:], body
    # The default page size is 100.
    st, body = api.call("GET", f"/api/queues/{q(vhost)}?page=1")
    assert st == 200 and body["page_size"] == 100 and body["item_count"] == 7, body
    # Past the last page.
    st, body = api.call("GET", f"/api/queues/{q(vhost)}?page=4&page_size=3")
    assert (st, body) == (400, {"error": "page_out_of_range",
                                "reason": "Page out of range, page: 4 page size: 3, len: 7"})


def test_without_page_a_sorted_plain_list(api, vhost):
    names = [f"sq-{c}" for c in "bdac"]
    _queues(api, vhost, names)
    st, body = api.call("GET", f"/api/queues/{q(vhost)}")
    assert st == 200 and [i["name"] for i in body] == sorted(names), body
    st, body = api.call("GET", f"/api/queues/{q(vhost)}?sort=name&sort_reverse=true")
    assert st == 200 and [i["name"] for i in body] == sorted(names, reverse=True), body
    # page_size alone does not page.
    st, body = api.call("GET", f"/api/queues/{q(vhost)}?page_size=2")
    assert st == 200 and isinstance(body, list) and len(body) == 4, body


def test_sort_by_a_dotted_key(api, vhost):
    # arguments.x-max-length: 30, 10, none (sorts as 0), 20.
    lengths = [30, 10, None, 20]
    names = [f"dq-{i}" for i in range(4)]
    _queues(api, vhost, names,
            lambda i: {} if lengths[i] is None else {"x-max-length": lengths[i]})
    st, body = api.call("GET", f"/api/queues/{q(vhost)}?page=1&sort=arguments.x-max-length")
    assert st == 200, body
    assert [i["name"] for i in body["items"]] == ["dq-2", "dq-1", "dq-3", "dq-0"]
    st, body = api.call("GET", f"/api/queues/{q(vhost)}?page=1&page_size=2"
                               "&sort=arguments.x-max-length&sort_reverse=true")
    assert st == 200 and [i["name"] for i in body["items"]] == ["dq-0", "dq-3"], body


def test_name_filter_substring_and_regex(api, vhost):
    _queues(api, vhost, ["Orders.EU", "orders.us", "billing", "ordersXeu"])
    base = f"/api/queues/{q(vhost)}?page=1"
    st, body = api.call("GET", base + "&name=ORDERS.")
    assert st == 200 and [i["name"] for i in body["items"]] == ["Orders.EU", "orders.us"], body
    assert body["filtered_count"] == 2 and body["total_count"] == 4
    st, body = api.call("GET", base + "&name=" + q(r"^orders\.eu$") + "&use_regex=true")
    assert st == 200 and [i["name"] for i in body["items"]] == ["Orders.EU"], body
    st, body = api.call("GET", base + "&name=" + q("ing|xeu") + "&use_regex=true")
    assert st == 200 and [i["name"] for i in body["items"]] == ["billing", "ordersXeu"], body
    # An invalid regex.
    st, body = api.call("GET", base + "&name=" + q("(") + "&use_regex=true")
    assert (st, body) == (400, {"error": "bad_request", "reason": "Pagination parameters are invalid"})


@pytest.mark.parametrize("query,error,reason", [
    ("page=0", "invalid_pagination_parameters",
     "Invalid pagination parameters: page number 0, page size undefined"),
    ("page=1&page_size=501", "invalid_pagination_parameters",
     "Invalid pagination parameters: page number 1, page size 501"),
    ("page=2&page_size=0", "invalid_pagination_parameters",
     "Invalid pagination parameters: page number 2, page size 0"),
    ("page=abc", "bad_request", "Pagination parameters are invalid"),
    ("page=1&page_size=x", "bad_request", "Pagination parameters are invalid"),
])
@pytest.mark.parametrize("path", ["/api/queues", "/api/exchanges", "/api/connections",
                                  "/api/channels", "/api/vhosts"])
def test_bad_parameters(api, path, query, error, reason):
    st, body = api.call("GET", f"{path}?{query}")
    assert (st, body) == (400, {"error": error, "reason": reason})


@pytest.mark.parametrize("path", ["/api/exchanges", "/api/connections", "/api/channels",
                                  "/api/vhosts"])
def test_other_lists_page(api, path):
    st, plain = api.call("GET", path)
    assert st == 200 and isinstance(plain, list), plain
    st, body = api.call("GET", f"{path}?page=1&page_size=500")
    assert st == 200, body
    assert set(body) == {"filtered_count", "item_count", "items", "page", "page_count",
                         "page_size", "total_count"}
    assert body["page"] == 1 and body["page_size"] == 500


def test_exchanges_of_a_vhost_sorted_and_paged(api, vhost):
    st, plain = api.call("GET", f"/api/exchanges/{q(vhost)}")
    assert st == 200, plain
    names = sorted(x["name"] for x in plain)
    st, body = api.call("GET", f"/api/exchanges/{q(vhost)}?page=1&page_size=2&sort=name&sort_reverse=true")
    assert st == 200, body
    assert [x["name"] for x in body["items"]] == names[::-1][:2]
    assert body["total_count"] == len(plain) and body["page_count"] == (len(plain) + 1) // 2


def test_add_list_and_remove_bindings(api, vhost):
    v = q(vhost)
    assert api.call("PUT", f"/api/exchanges/{v}/src", {"type": "topic", "durable": False})[0] == 201
    assert api.call("PUT", f"/api/exchanges/{v}/dst", {"type": "fanout", "durable": False})[0] == 201
    _queues(api, vhost, ["bq"])

    # Exchange to queue: 201 with the new binding's location.
    st, body = api.call("POST", f"/api/bindings/{v}/e/src/q/bq", {"routing_key": "a b~c", "arguments": {}})
    assert st == 201, body
    st, body = api.call("POST", f"/api/bindings/{v}/e/src/q/bq",
                        {"routing_key": "k", "arguments": {"x-tag": "one"}})
    assert st == 201, body
    st, between = api.call("GET", f"/api/bindings/{v}/e/src/q/bq")
    assert st == 200, between
    by_key = {b["routing_key"]: b for b in between}
    assert set(by_key) == {"a b~c", "k"}
    assert by_key["a b~c"]["properties_key"] == "a+b%7Ec"
    assert by_key["k"]["arguments"] == {"x-tag": "one"}
    assert by_key["k"]["properties_key"].startswith("k~")

    # The queue's bindings: the default exchange's first.
    st, qb = api.call("GET", f"/api/queues/{v}/bq/bindings")
    assert st == 200, qb
    assert [(b["source"], b["routing_key"]) for b in qb] == [("", "bq"), ("src", "a b~c"), ("src", "k")]

    # Exchange to exchange, seen from both ends.
    st, body = api.call("POST", f"/api/bindings/{v}/e/src/e/dst", {"routing_key": "x.#"})
    assert st == 201, body
    st, source = api.call("GET", f"/api/exchanges/{v}/src/bindings/source")
    assert st == 200 and sorted((b["destination"], b["destination_type"]) for b in source) == [
        ("bq", "queue"), ("bq", "queue"), ("dst", "exchange")], source
    st, dest = api.call("GET", f"/api/exchanges/{v}/dst/bindings/destination")
    assert st == 200 and [(b["source"], b["routing_key"]) for b in dest] == [("src", "x.#")], dest

    # One binding by its properties key, then removed by it.
    props = by_key["k"]["properties_key"]
    st, one = api.call("GET", f"/api/bindings/{v}/e/src/q/bq/{q(props)}")
    assert st == 200 and one["routing_key"] == "k", one
    assert api.call("DELETE", f"/api/bindings/{v}/e/src/q/bq/{q(props)}")[0] == 204
    assert api.call("GET", f"/api/bindings/{v}/e/src/q/bq/{q(props)}")[0] == 404
    assert api.call("DELETE", f"/api/bindings/{v}/e/src/q/bq/{q('a+b%7Ec')}")[0] == 204
    # The key as it is, unquoted, is read the same (RabbitMQ unquotes the properties key).
    assert api.call("DELETE", f"/api/bindings/{v}/e/src/e/dst/{q('x.#')}")[0] == 204
    st, source = api.call("GET", f"/api/exchanges/{v}/src/bindings/source")
    assert st == 200 and source == [], source

    # Unknown ends.
    assert api.call("POST", f"/api/bindings/{v}/e/nope/q/bq", {"routing_key": ""})[0] == 404
    assert api.call("POST", f"/api/bindings/{v}/e/src/q/nope", {"routing_key": ""})[0] == 404
