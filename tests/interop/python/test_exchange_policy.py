"""Exchange policies: `alternate-exchange` set by a policy (apply-to exchanges or all) applies to
matching exchanges, existing and later ones; the exchange's own argument wins; re-evaluated when
policies change. Written against RabbitMQ 3.10; policies set through the management HTTP API."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest

from helpers import uname, wait_until
from test_access import Api, q


@pytest.fixture
def api(mgmt_url):
    return Api(mgmt_url)


@pytest.fixture
def policies(api):
    """Sets policies on vhost / and removes them at teardown."""
    names = []

    def put(name, pattern, definition, apply_to="exchanges", priority=0):
        st, body = api.call("PUT", f"/api/policies/%2F/{q(name)}",
                            {"pattern": pattern, "definition": definition,
                             "apply-to": apply_to, "priority": priority})
        assert st in (201, 204), body
        names.append(name)

    def delete(name):
        assert api.call("DELETE", f"/api/policies/%2F/{q(name)}")[0] == 204
        names.remove(name)
    put.delete = delete
    yield put
    for n in names:
        api.call("DELETE", f"/api/policies/%2F/{q(n)}")


def ae_with_queue(ch, res) -> tuple[str, str]:
    """A fanout exchange with one queue bound: an alternate exchange to observe."""
    ae, queue = res.exchange("ae"), res.queue("aeq")
    ch.exchange_declare(ae, "fanout")
    ch.queue_declare(queue)
    ch.queue_bind(queue, ae)
    return ae, queue


def depth(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def lands_in(conn, ch, exchange: str, queue: str) -> None:
    """Unroutable publishes to `exchange` reach `queue` (polled: RabbitMQ applies policies
    asynchronously)."""
    def reached():
        before = depth(ch, queue)
        ch.basic_publish(exchange, "nowhere", b"m")
        return depth(ch, queue) > before
    wait_until(reached, timeout=20, what=f"{exchange} to use the alternate exchange", conn=conn)
    ch.queue_purge(queue)


def unroutable(conn, exchange: str) -> None:
    """A mandatory publish to `exchange` comes back: no alternate exchange in force."""
    def returned():
        ch = conn.channel()
        ch.confirm_delivery()
        try:
            ch.basic_publish(exchange, "nowhere", b"m", mandatory=True)
            return False
        except pika.exceptions.UnroutableError:
            return True
        finally:
            ch.close()
    wait_until(returned, timeout=20, what=f"{exchange} to have no alternate exchange", conn=conn)


def test_policy_alternate_exchange_applies_to_existing_and_new_exchanges(conn, res, policies):
    ch = conn.channel()
    prefix = uname("aepol")
    ae, ae_queue = ae_with_queue(ch, res)
    old = prefix + "-old"
    res.exchanges.append(old)
    ch.exchange_declare(old, "direct")
    unroutable(conn, old)
    policies(prefix, "^" + prefix, {"alternate-exchange": ae})
    lands_in(conn, ch, old, ae_queue)
    new = prefix + "-new"
    res.exchanges.append(new)
    ch.exchange_declare(new, "topic")
    lands_in(conn, ch, new, ae_queue)
    # Routed messages do not go to the alternate exchange.
    routed = res.queue("routed")
    ch.queue_declare(routed)
    ch.queue_bind(routed, new, "k")
    ch.basic_publish(new, "k", b"m")
    wait_until(lambda: depth(ch, routed) == 1, conn=conn)
    assert depth(ch, ae_queue) == 0
    # Clearing the policy takes the alternate exchange away.
    policies.delete(prefix)
    unroutable(conn, old)
    unroutable(conn, new)


def test_exchange_argument_wins_over_policy(conn, res, policies):
    ch = conn.channel()
    prefix = uname("aearg")
    pol_ae, pol_queue = ae_with_queue(ch, res)
    own_ae, own_queue = ae_with_queue(ch, res)
    x = prefix + "-x"
    res.exchanges.append(x)
    ch.exchange_declare(x, "direct", arguments={"alternate-exchange": own_ae})
    policies(prefix, "^" + prefix, {"alternate-exchange": pol_ae}, apply_to="all")
    # A second exchange, without the argument, shows the policy is in force.
    plain = prefix + "-plain"
    res.exchanges.append(plain)
    ch.exchange_declare(plain, "direct")
    lands_in(conn, ch, plain, pol_queue)
    lands_in(conn, ch, x, own_queue)
    assert depth(ch, pol_queue) == 0


def test_only_the_applying_policy_counts(conn, res, policies):
    ch = conn.channel()
    prefix = uname("aeprio")
    ae, ae_queue = ae_with_queue(ch, res)
    x = prefix + "-x"
    res.exchanges.append(x)
    ch.exchange_declare(x, "fanout")
    # A queues-only policy does not apply to exchanges.
    policies(prefix + "-q", "^" + prefix, {"alternate-exchange": ae}, apply_to="queues", priority=9)
    policies(prefix + "-low", "^" + prefix, {"alternate-exchange": ae}, priority=1)
    lands_in(conn, ch, x, ae_queue)
    # A higher-priority exchange policy without the key replaces it: one policy per exchange.
    policies(prefix + "-high", "^" + prefix, {"max-length": 5}, priority=5)
    unroutable(conn, x)
    policies.delete(prefix + "-high")
    lands_in(conn, ch, x, ae_queue)
