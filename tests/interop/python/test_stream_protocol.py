"""RabbitMQ's stream protocol with the Python client rstream: the handshake, streams created and
deleted, publishing with confirms, subscribing from each kind of offset, and a message crossing
between the stream protocol and AMQP 0-9-1 with RabbitMQ 3.10's mapping of its properties. Each
test runs against the suite's broker: the session Warren (WARREN_BIN, its `--stream-port`) or the
reference RabbitMQ 3.10 with its stream plugin (STREAM_PORT, default 5553), and passes on both."""

from __future__ import annotations

import asyncio
import time

import pika
import pytest
from rstream import (AMQPMessage, Consumer, ConsumerOffsetSpecification, MessageContext,
                     OffsetType, Producer, amqp_decoder)
from rstream import exceptions as rx
from rstream._pyamqp.message import Properties

from helpers import connect, safe_close, uname
from test_tls import certs  # noqa: F401 - fixture: a CA, another CA, server, client, stranger

pytestmark = [pytest.mark.timeout(60), pytest.mark.single_node("the stream protocol is single-node")]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 45))


def producer(port: int, **kw) -> Producer:
    return Producer("127.0.0.1", port=port, username=kw.pop("username", "guest"),
                    password=kw.pop("password", "guest"), **kw)


def consumer(port: int) -> Consumer:
    return Consumer("127.0.0.1", port=port, username="guest", password="guest")


async def publish(port: int, stream: str, messages: list[AMQPMessage], create: bool = True) -> None:
    async with producer(port) as p:
        if create:
            await p.create_stream(stream, exists_ok=True)
        for m in messages:
            await p.send_wait(stream, m)


async def read(port: int, stream: str, n: int, spec: ConsumerOffsetSpecification,
               settle: float = 0.0) -> list[tuple[int, AMQPMessage]]:
    """Subscribes at `spec` and returns (offset, message) of the first n messages (waiting
    `settle` seconds more for any that should not come)."""
    got: list[tuple[int, AMQPMessage]] = []
    enough = asyncio.Event()

    async def on(msg: AMQPMessage, ctx: MessageContext) -> None:
        got.append((ctx.offset, msg))
        if len(got) >= n:
            enough.set()

    async with consumer(port) as c:
        await c.start()
        await c.subscribe(stream, on, decoder=amqp_decoder, offset_specification=spec)
        if n:
            await asyncio.wait_for(enough.wait(), 20)
        await asyncio.sleep(settle)
    return got


async def delete(port: int, stream: str) -> None:
    async with producer(port) as p:
        try:
            await p.delete_stream(stream)
        except rx.StreamDoesNotExist:
            pass


def first() -> ConsumerOffsetSpecification:
    return ConsumerOffsetSpecification(OffsetType.FIRST, None)


def test_publish_with_confirms_and_read_from_the_first_offset(stream_port):
    s = uname("sp")

    async def go():
        msgs = [AMQPMessage(body=f"m{i}".encode(), application_properties={"i": i, "kind": "t"})
                for i in range(50)]
        await publish(stream_port, s, msgs)
        got = await read(stream_port, s, 50, first(), settle=0.5)
        await delete(stream_port, s)
        return got

    got = run(go())
    assert [o for o, _ in got] == list(range(50))
    assert [bytes(m.body) for _, m in got] == [f"m{i}".encode() for i in range(50)]
    assert got[7][1].application_properties == {b"i": 7, b"kind": b"t"}


def test_offset_specifications(stream_port):
    s = uname("sp-offsets")

    async def go():
        await publish(stream_port, s, [AMQPMessage(body=f"m{i}".encode()) for i in range(10)])
        at = await read(stream_port, s, 4, ConsumerOffsetSpecification(OffsetType.OFFSET, 6), settle=0.5)
        # `next`: only what is published after the subscription.
        got: list = []
        came = asyncio.Event()

        async def on(msg, ctx):
            got.append((ctx.offset, bytes(msg.body)))
            came.set()

        async with consumer(stream_port) as c:
            await c.start()
            await c.subscribe(s, on, decoder=amqp_decoder,
                              offset_specification=ConsumerOffsetSpecification(OffsetType.NEXT, None))
            await asyncio.sleep(0.5)
            await publish(stream_port, s, [AMQPMessage(body=b"later")], create=False)
            await asyncio.wait_for(came.wait(), 20)
            await asyncio.sleep(0.3)
        # A timestamp in the future: nothing yet.
        future = int(time.time() * 1000) + 3_600_000
        none = await read(stream_port, s, 0, ConsumerOffsetSpecification(OffsetType.TIMESTAMP, future), settle=0.5)
        await delete(stream_port, s)
        return at, got, none

    at, nxt, none = run(go())
    assert [o for o, _ in at] == [6, 7, 8, 9]
    assert nxt == [(10, b"later")]
    assert none == []


def test_errors_as_rabbitmq_answers_them(stream_port):
    s = uname("sp-errors")

    async def go():
        out = {}
        async with producer(stream_port) as p:
            await p.create_stream(s)
            try:
                await p.create_stream(s)
            except rx.StreamAlreadyExists:
                out["create twice"] = "StreamAlreadyExists"
            await p.delete_stream(s)
            try:
                await p.delete_stream(s)
            except rx.StreamDoesNotExist:
                out["delete missing"] = "StreamDoesNotExist"
            try:
                await p.send_wait(s, AMQPMessage(body=b"x"))
            except (rx.StreamDoesNotExist, rx.ServerError) as e:
                out["publish to missing"] = type(e).__name__
        try:
            async with consumer(stream_port) as c:
                await c.start()
                await c.subscribe(s, lambda m, ctx: None, offset_specification=first())
        except rx.StreamDoesNotExist:
            out["subscribe to missing"] = "StreamDoesNotExist"
        try:
            async with producer(stream_port, password="wrong"):
                pass
        except rx.AuthenticationFailure:
            out["bad password"] = "AuthenticationFailure"
        return out

    assert run(go()) == {
        "create twice": "StreamAlreadyExists",
        "delete missing": "StreamDoesNotExist",
        "publish to missing": "StreamDoesNotExist",
        "subscribe to missing": "StreamDoesNotExist",
        "bad password": "AuthenticationFailure",
    }


def test_amqp091_publish_reads_over_the_stream_protocol(stream_port, amqp_url):
    """Published with pika (AMQP 0-9-1), read with rstream: RabbitMQ's mapping of properties."""
    s = uname("sp-from091")
    c = connect(amqp_url)
    try:
        ch = c.channel()
        ch.queue_declare(s, durable=True, arguments={"x-queue-type": "stream"})
        ch.confirm_delivery()
        ch.basic_publish("", s, b"from pika", pika.BasicProperties(
            content_type="text/plain", content_encoding="utf-8", message_id="m-1",
            correlation_id="c-1", reply_to="r", priority=3, delivery_mode=2,
            timestamp=1_700_000_000, type="order", app_id="shop", expiration="60000",
            headers={"region": "eu", "n": 5}))
    finally:
        safe_close(c)

    async def go():
        got = await read(stream_port, s, 1, first())
        await delete(stream_port, s)
        return got

    ((offset, m),) = run(go())
    assert offset == 0 and bytes(m.body) == b"from pika"
    p = m.properties
    assert (p.message_id, p.correlation_id, p.reply_to) == (b"m-1", b"c-1", b"r")
    assert (p.content_type, p.content_encoding) == (b"text/plain", b"utf-8")
    assert p.creation_time == 1_700_000_000_000
    ap = m.application_properties
    assert ap[b"region"] == b"eu" and ap[b"n"] == 5, ap
    assert ap[b"x-basic-type"] == b"order" and ap[b"x-basic-app-id"] == b"shop", ap
    ma = m.message_annotations
    assert ma[b"x-basic-priority"] == 3 and ma[b"x-basic-delivery-mode"] == 2, ma
    assert ma[b"x-basic-expiration"] == b"60000", ma


def test_stream_protocol_publish_reads_over_amqp091(stream_port, amqp_url):
    """Published with rstream, read with pika: properties, application properties as headers,
    the offset in x-stream-offset."""
    s = uname("sp-to091")
    msg = AMQPMessage(body=b"from rstream", application_properties={"region": "us", "n": 9},
                      properties=Properties(message_id="id-9", correlation_id="corr",
                                            content_type="application/json", reply_to="back"))
    run(publish(stream_port, s, [msg]))
    c = connect(amqp_url)
    try:
        ch = c.channel()
        ch.basic_qos(prefetch_count=10)
        got = []
        ch.basic_consume(s, lambda ch_, m, p, b: got.append((p, b)),
                         arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            c.process_data_events(time_limit=0.1)
        assert got, "nothing delivered over AMQP 0-9-1"
        props, body = got[0]
        assert body == b"from rstream"
        assert (props.message_id, props.correlation_id, props.reply_to) == ("id-9", "corr", "back")
        assert props.content_type == "application/json"
        assert props.headers["region"] == "us" and props.headers["n"] == 9, props.headers
        assert props.headers["x-stream-offset"] == 0
        ch.queue_delete(s)
    finally:
        safe_close(c)


# ---- super streams ----

def declare_super_stream(amqp_url: str, name: str, keys: list[str]) -> list[str]:
    """A super stream as RabbitMQ's tools lay it out, made over AMQP 0-9-1 (RabbitMQ 3.10 has no
    command for it): a direct exchange, a stream per key, bindings with the partition's order."""
    c = connect(amqp_url)
    try:
        ch = c.channel()
        ch.exchange_declare(name, "direct", durable=True, arguments={"x-super-stream": True})
        parts = []
        for i, k in enumerate(keys):
            p = f"{name}-{k}"
            ch.queue_declare(p, durable=True, arguments={"x-queue-type": "stream"})
            ch.queue_bind(p, name, k, arguments={"x-stream-partition-order": i})
            parts.append(p)
        return parts
    finally:
        safe_close(c)


def drop_super_stream(amqp_url: str, name: str, parts: list[str]) -> None:
    c = connect(amqp_url)
    try:
        ch = c.channel()
        for p in parts:
            ch.queue_delete(p)
        ch.exchange_delete(name)
    finally:
        safe_close(c)


# RabbitMQ 3.10's route and partitions responses carry no response code (its protocol then);
# rstream speaks the later protocol (3.11 on), so against 3.10 these run on Warren only.
warren_only = pytest.mark.skipif(not __import__("os").environ.get("WARREN_BIN"),
                                 reason="super streams as clients use them came after RabbitMQ 3.10")


@warren_only
def test_a_super_streams_route_and_partitions(stream_port, amqp_url):
    """rstream's super stream producer: by routing key (the route command) and by hash over the
    partitions (the partitions command, in their x-stream-partition-order)."""
    from rstream import RouteType, SuperStreamProducer

    ss = uname("ss")
    keys = ["amer", "emea", "apac"]
    parts = declare_super_stream(amqp_url, ss, keys)

    async def key_of(m):
        return m.application_properties["region"]

    async def go():
        # One producer per key: rstream 1.1.1 keeps the first route it is given for every key.
        for k in keys:
            async with SuperStreamProducer("127.0.0.1", port=stream_port, username="guest",
                                           password="guest", super_stream=ss,
                                           routing=RouteType.Key, routing_extractor=key_of) as p:
                for i in range(3):
                    await p.send(AMQPMessage(body=f"{k}{i}".encode(), application_properties={"region": k}))
                await asyncio.sleep(0.5)
        async with SuperStreamProducer("127.0.0.1", port=stream_port, username="guest",
                                       password="guest", super_stream=ss,
                                       routing=RouteType.Hash, routing_extractor=key_of) as p:
            for i in range(30):
                await p.send(AMQPMessage(body=f"h{i}".encode(), application_properties={"region": f"r{i}"}))
            await asyncio.sleep(1)
        async with consumer(stream_port) as c:
            await c.start()
            client = await c.default_client
            listed = await client.partitions(ss)
            routed = await client.route("emea", ss)
            nowhere = await client.route("none", ss)
        got = {}
        for p in parts:
            msgs = await read(stream_port, p, 0, first(), settle=1.0)
            got[p] = [bytes(m.body) for _, m in msgs]
        return listed, routed, nowhere, got

    try:
        listed, routed, nowhere, got = run(go())
    finally:
        drop_super_stream(amqp_url, ss, parts)
    assert listed == parts
    assert routed == [f"{ss}-emea"] and nowhere == []
    for k in keys:
        by_key = [b for b in got[f"{ss}-{k}"] if not b.startswith(b"h")]
        assert by_key == [f"{k}{i}".encode() for i in range(3)], got
    hashed = [b for p in parts for b in got[p] if b.startswith(b"h")]
    assert sorted(hashed) == sorted(f"h{i}".encode() for i in range(30))
    assert all(any(b.startswith(b"h") for b in got[p]) for p in parts), "hash routing used one partition"


@warren_only
def test_super_streams_made_by_the_client_and_by_warren_ctl(stream_port, amqp_url, mgmt_url):
    import os
    import subprocess

    from rstream import SuperStreamProducer

    ss, ss2 = uname("ss-client"), uname("ss-ctl")

    async def key_of(m):
        return "k"

    async def go():
        async with SuperStreamProducer("127.0.0.1", port=stream_port, username="guest",
                                       password="guest", super_stream=ss, routing_extractor=key_of) as p:
            await p.create_super_stream(ss, n_partitions=3)
            async with consumer(stream_port) as c:
                await c.start()
                made = await (await c.default_client).partitions(ss)
            try:
                await p.create_super_stream(ss, n_partitions=3)
                twice = "created twice"
            except rx.StreamAlreadyExists:
                twice = "StreamAlreadyExists"
            await p.delete_super_stream(ss)
        async with consumer(stream_port) as c:
            await c.start()
            client = await c.default_client
            ctl_made = await client.partitions(ss2)
            gone = await client.partitions(ss)
        return twice, made, ctl_made, gone

    ctl = [os.environ["WARREN_BIN"], "ctl", "--url", mgmt_url]
    r = subprocess.run(ctl + ["add_super_stream", ss2, "--binding-keys", "a,b"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(ctl + ["add_super_stream", ss2, "--partitions", "2"], capture_output=True, text=True)
    assert r.returncode != 0 and f"there is already an exchange named {ss2}" in r.stderr, r.stderr
    twice, made, ctl_made, gone = run(go())
    assert twice == "StreamAlreadyExists"
    assert made == [f"{ss}-0", f"{ss}-1", f"{ss}-2"]
    assert ctl_made == [f"{ss2}-a", f"{ss2}-b"]
    assert gone == []
    r = subprocess.run(ctl + ["delete_super_stream", ss2], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    c = connect(amqp_url)
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            c.channel().queue_declare(f"{ss2}-a", passive=True)
    finally:
        safe_close(c)


@warren_only
def test_over_tls_with_a_client_certificate(certs):
    """The stream protocol over TLS ([tls] stream_port, RabbitMQ's 5551), the AMQPS listener's
    certificate and client checks: with the CA's client certificate it works, without one the
    handshake is refused."""
    import os
    import ssl

    from conftest import _free_port
    from test_limits import start
    from test_tls import tls_config

    d = certs
    tls_port, stream_tls = _free_port(), _free_port()
    node = start(tls_config(d, tls_port, f"ca_file = '{d}/ca.pem'\nverify = 'verify_peer'\n"
                                          f"fail_if_no_peer_cert = true\nstream_port = {stream_tls}\n"))
    s = uname("sp-tls")

    def context(client: str | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=os.path.join(d, "ca.pem"))
        if client:
            ctx.load_cert_chain(os.path.join(d, f"{client}.pem"), os.path.join(d, f"{client}.key"))
        return ctx

    async def go():
        async with Producer("localhost", port=stream_tls, username="guest", password="guest",
                            ssl_context=context("client")) as p:
            await p.create_stream(s)
            await p.send_wait(s, AMQPMessage(body=b"over tls"))
        got = []
        done = asyncio.Event()

        async def on(m, ctx):
            got.append(bytes(m.body))
            done.set()

        async with Consumer("localhost", port=stream_tls, username="guest", password="guest",
                            ssl_context=context("client")) as c:
            await c.start()
            await c.subscribe(s, on, decoder=amqp_decoder, offset_specification=first())
            await asyncio.wait_for(done.wait(), 20)
        refused = None
        try:
            async with Producer("localhost", port=stream_tls, username="guest", password="guest",
                                ssl_context=context(None)) as p:
                await p.create_stream(uname("sp-tls-no"))
        except Exception as e:  # the server ends the handshake: an SSL or connection error
            refused = type(e).__name__
        return got, refused

    try:
        got, refused = run(go())
    finally:
        node.cleanup()
    assert got == [b"over tls"]
    assert refused is not None, "a client without a certificate got through"


@warren_only
def test_single_active_consumer_hands_over_when_the_active_one_goes(stream_port):
    """Two subscriptions of one name (single-active-consumer, RabbitMQ 3.11's): only the first
    receives; when it goes, the other is told it is active (a consumer update), answers where
    to start, and receives from there."""
    from rstream.schema import OffsetSpecification

    s = uname("sp-sac")
    sac = {"single-active-consumer": "true", "name": "billing"}

    async def go():
        await publish(stream_port, s, [AMQPMessage(body=f"a{i}".encode()) for i in range(5)])
        got = {"one": [], "two": []}
        updates = {"one": [], "two": []}

        def collect(who):
            async def on(msg, ctx):
                got[who].append(bytes(msg.body))
            return on

        def listener(who, start):
            async def on_update(active, ctx):
                updates[who].append(active)
                return start
            return on_update

        one, two = consumer(stream_port), consumer(stream_port)
        await one.start()
        await two.start()
        await one.subscribe(s, collect("one"), decoder=amqp_decoder, properties=sac,
                            consumer_update_listener=listener("one", OffsetSpecification(OffsetType.FIRST, 0)))
        await two.subscribe(s, collect("two"), decoder=amqp_decoder, properties=sac,
                            consumer_update_listener=listener("two", OffsetSpecification(OffsetType.OFFSET, 5)))
        await asyncio.sleep(1)
        await one.close()
        await asyncio.sleep(1)
        await publish(stream_port, s, [AMQPMessage(body=f"b{i}".encode()) for i in range(3)], create=False)
        deadline = asyncio.get_running_loop().time() + 20
        while len(got["two"]) < 3 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)
        await two.close()
        await delete(stream_port, s)
        return got, updates

    got, updates = run(go())
    assert got["one"] == [f"a{i}".encode() for i in range(5)]
    assert updates["one"] == [True]
    assert updates["two"] == [True], "the second subscription was not made active"
    assert got["two"] == [b"b0", b"b1", b"b2"], got


@warren_only
def test_single_active_consumers_spread_over_a_super_streams_partitions(stream_port, amqp_url):
    """Two consumers of one name on a super stream of three partitions (single-active-consumer
    with `super-stream`, RabbitMQ 3.11's rule): each partition's active member is the one at
    `partition index % members`, so the second to join takes partition 1 over (the first is
    told to give way, then the second is made active) and the first keeps partitions 0 and 2."""
    from rstream import SuperStreamConsumer
    from rstream.schema import OffsetSpecification

    ss = uname("ss-sac")
    parts = declare_super_stream(amqp_url, ss, ["0", "1", "2"])
    sac = {"single-active-consumer": "true", "name": "billing", "super-stream": ss}

    async def go():
        got = {"one": [], "two": []}
        updates = {"one": [], "two": []}

        def collect(who):
            async def on(msg, ctx):
                got[who].append((ctx.stream, bytes(msg.body)))
            return on

        def listener(who):
            async def on_update(active, ctx):
                updates[who].append((ctx.stream if hasattr(ctx, "stream") else None, active))
                return OffsetSpecification(OffsetType.NEXT, 0)
            return on_update

        def superstream_consumer():
            return SuperStreamConsumer("127.0.0.1", port=stream_port, username="guest",
                                       password="guest", super_stream=ss)

        one, two = superstream_consumer(), superstream_consumer()
        await one.start()
        await two.start()
        await one.subscribe(collect("one"), decoder=amqp_decoder, properties=sac,
                            consumer_update_listener=listener("one"))
        await asyncio.sleep(1)
        await two.subscribe(collect("two"), decoder=amqp_decoder, properties=sac,
                            consumer_update_listener=listener("two"))
        await asyncio.sleep(1.5)
        for p in parts:
            await publish(stream_port, p, [AMQPMessage(body=f"{p}:{i}".encode()) for i in range(4)],
                          create=False)
        deadline = asyncio.get_running_loop().time() + 20
        while len(got["one"]) + len(got["two"]) < 12 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        # Before either closes (the other then takes its partitions over).
        seen = {k: list(v) for k, v in updates.items()}
        await one.close()
        await two.close()
        return got, seen

    try:
        got, updates = run(go())
    finally:
        drop_super_stream(amqp_url, ss, parts)
    assert sorted({s for s, _ in got["one"]}) == [parts[0], parts[2]], got
    assert sorted({s for s, _ in got["two"]}) == [parts[1]], got
    assert sorted(b for _, b in got["one"] + got["two"]) == sorted(
        f"{p}:{i}".encode() for p in parts for i in range(4)), "each message once"
    assert [a for _, a in updates["one"]].count(False) == 1, updates
    assert [a for _, a in updates["two"]] == [True], updates


@warren_only
def test_filtering_sends_only_the_messages_a_subscription_filters_on(stream_port, amqp_url):
    """RabbitMQ 3.13's filtering: publish v2 gives each message a filter value; a subscription
    with filter values (and `match-unfiltered`) gets only those messages, at their own offsets,
    with no client-side filter (rstream's predicate left out), so the server's choice is what
    is checked. A message published over AMQP 0-9-1 without `x-stream-filter-value` is
    unfiltered."""
    from rstream import FilterConfiguration

    s = uname("sp-filter")

    async def region(msg):
        return msg.application_properties["region"]

    async def go():
        async with Producer("127.0.0.1", port=stream_port, username="guest", password="guest",
                            filter_value_extractor=region) as p:
            await p.create_stream(s)
            for i in range(30):
                r = ["eu", "us", "apac"][i % 3]
                await p.send_wait(s, AMQPMessage(body=f"{r}{i}".encode(),
                                                 application_properties={"region": r}))
        conn = connect(amqp_url)
        conn.channel().basic_publish("", s, b"plain", pika.BasicProperties(delivery_mode=2))
        conn.channel().basic_publish("", s, b"tagged", pika.BasicProperties(
            delivery_mode=2, headers={"x-stream-filter-value": "eu"}))
        safe_close(conn)
        await asyncio.sleep(0.5)
        everything = {bytes(m.body): o for o, m in await read(stream_port, s, 32, first())}

        async def filtered(values, unfiltered):
            got = []
            async with consumer(stream_port) as c:
                await c.start()

                async def on(msg, ctx):
                    got.append((ctx.offset, bytes(msg.body)))
                await c.subscribe(s, on, decoder=amqp_decoder, offset_specification=first(),
                                  filter_input=FilterConfiguration(values_to_filter=values,
                                                                   match_unfiltered=unfiltered))
                await asyncio.sleep(1.5)
            return got
        eu = await filtered(["eu"], False)
        us_or_none = await filtered(["us", "apac"], True)
        await delete(stream_port, s)
        return everything, eu, us_or_none

    everything, eu, us_or_none = run(go())
    want_eu = [f"eu{i}".encode() for i in range(0, 30, 3)] + [b"tagged"]
    assert [b for _, b in eu] == want_eu
    assert all(everything[b] == o for o, b in eu), "each at its own offset"
    want = [b for b in everything if not b.startswith(b"eu") and b != b"tagged"]
    assert sorted(b for _, b in us_or_none) == sorted(want)
    assert all(everything[b] == o for o, b in us_or_none)


# ---- tracking: stored offsets and deduplication ----

def test_offsets_stored_on_the_server(stream_port):
    """store_offset / query_offset under a reference (RabbitMQ keeps them in the stream): none
    stored yet is OffsetNotFound; the last stored wins; a missing stream says so."""
    s = uname("sp-offset")

    async def go():
        await publish(stream_port, s, [AMQPMessage(body=f"m{i}".encode()) for i in range(10)])
        out = {}
        async with consumer(stream_port) as c:
            await c.start()
            try:
                await c.query_offset(s, "billing")
            except rx.OffsetNotFound:
                out["before"] = "OffsetNotFound"
            await c.store_offset(s, "billing", 3)
            await c.store_offset(s, "billing", 7)
            deadline = asyncio.get_running_loop().time() + 10
            while True:  # store_offset has no answer: it lands a little later
                try:
                    out["after"] = await c.query_offset(s, "billing")
                except rx.OffsetNotFound:
                    out["after"] = None
                if out["after"] == 7 or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.1)
            try:
                await c.query_offset(uname("sp-none"), "billing")
            except rx.StreamDoesNotExist:
                out["missing stream"] = "StreamDoesNotExist"
        await delete(stream_port, s)
        return out

    assert run(go()) == {"before": "OffsetNotFound", "after": 7, "missing stream": "StreamDoesNotExist"}


def with_id(m: AMQPMessage, publishing_id: int) -> AMQPMessage:
    """rstream takes a message's own publishing id when it has one (not a constructor keyword)."""
    m.publishing_id = publishing_id
    return m


def test_a_named_publisher_is_deduplicated(stream_port):
    """A publisher with a name (reference): a message whose publishing id is not above the last
    stored one is confirmed and not stored again, across connections; the sequence query
    answers the last id."""
    s = uname("sp-dedup")

    async def send(ids: list[int]):
        async with producer(stream_port) as p:
            for i in ids:
                await p.send_wait(s, with_id(AMQPMessage(body=f"m{i}".encode()), i),
                                  publisher_name="orders")

    async def go():
        async with producer(stream_port) as p:
            await p.create_stream(s)
        await send([1, 2, 3, 4, 5])
        await send([3, 4, 5, 6, 7])
        async with consumer(stream_port) as c:
            await c.start()
            client = await c.default_client
            seq = await client.query_publisher_sequence(stream=s, reference="orders")
            none = await client.query_publisher_sequence(stream=s, reference="nobody")
        got = await read(stream_port, s, 7, first(), settle=1.0)
        await delete(stream_port, s)
        return seq, none, [bytes(m.body) for _, m in got]

    seq, none, bodies = run(go())
    assert bodies == [f"m{i}".encode() for i in range(1, 8)]
    assert seq == 7 and none == 0


@warren_only
def test_stored_offsets_and_sequences_survive_a_restart():
    from conftest import _free_port

    from test_durability import Node

    port = _free_port()
    node = Node()
    node.extra_args = ["--stream-port", str(port)]
    node.start()
    s = uname("sp-restart")

    async def before():
        async with producer(port) as p:
            await p.create_stream(s)
            for i in range(1, 4):
                await p.send_wait(s, with_id(AMQPMessage(body=b"x"), i), publisher_name="orders")
        async with consumer(port) as c:
            await c.start()
            await c.store_offset(s, "billing", 2)
            await asyncio.sleep(0.5)

    async def after():
        async with consumer(port) as c:
            await c.start()
            client = await c.default_client
            return (await c.query_offset(s, "billing"),
                    await client.query_publisher_sequence(stream=s, reference="orders"))

    try:
        run(before())
        node.kill9()
        node.start()
        stored, seq = run(after())
    finally:
        node.cleanup()
    assert stored == 2
    # Recorded at most every 50 ms and when the publisher ends: its close came before the kill.
    assert seq == 3
