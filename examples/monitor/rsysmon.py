"""What the monitor's agent and receiver share: the exchange names and how both declare them,
and a connection helper that walks a list of broker URIs (one per cluster node) until one
answers. Plain pika; nothing here is Warren-specific, so the example runs unchanged against
RabbitMQ."""

from __future__ import annotations

import logging
import threading
import time

import pika
import pika.exceptions

DEFAULT_URI = "amqp://guest:guest@127.0.0.1:5672/%2f"
# Every agent publishes its samples here; every unsharded receiver binds a queue of its own.
EXCHANGE = "rsysmon"
# Sharded receivers: this consistent-hash exchange is bound to EXCHANGE and hashes the routing
# key, which agents set to the host name, so each host's samples reach exactly one shard.
HASH_EXCHANGE = "rsysmon.hash"
# Each shard's queue binds with this weight (jump consistent hashing: equal weights, equal shares).
SHARD_WEIGHT = "1"

log = logging.getLogger("rsysmon")


def declare_exchange(ch) -> None:
    """Declares `rsysmon` as agents and receivers both do, with the same arguments, so whichever
    starts first creates it and the others' declares are no-ops. Durable: it is part of the
    deployment, not of one process, and survives a broker restart; the samples themselves are
    transient (delivery mode 1) and the queues are the receivers' own."""
    ch.exchange_declare(EXCHANGE, exchange_type="fanout", durable=True)


def declare_hash_exchange(ch) -> None:
    """`rsysmon.hash` (x-consistent-hash, hashing the routing key) bound to `rsysmon`. On
    RabbitMQ this needs the rabbitmq_consistent_hash_exchange plugin; Warren has it built in."""
    declare_exchange(ch)
    ch.exchange_declare(HASH_EXCHANGE, exchange_type="x-consistent-hash", durable=True)
    ch.exchange_bind(destination=HASH_EXCHANGE, source=EXCHANGE, routing_key="")


def redact(uri: str) -> str:
    """The URI without its password, for logs."""
    p = pika.URLParameters(uri)
    user = p.credentials.username if hasattr(p.credentials, "username") else ""
    vhost = p.virtual_host
    return f"amqp://{user}@{p.host}:{p.port}/{'%2f' if vhost == '/' else vhost}"


def connect(uris: list[str], start: int = 0, stop: threading.Event | None = None,
            name: str = "") -> tuple[pika.BlockingConnection, str] | None:
    """Connects to the first of `uris` that answers, trying them in turn from `uris[start]`
    (so several connections spread over cluster nodes), and again every second after a full
    round failed. Returns (connection, uri), or None once `stop` is set."""
    attempt = 0
    while stop is None or not stop.is_set():
        uri = uris[(start + attempt) % len(uris)]
        params = pika.URLParameters(uri)
        params.connection_attempts = 1
        params.socket_timeout = 5
        if name:
            params.client_properties = {"connection_name": name}
        try:
            conn = pika.BlockingConnection(params)
            log.info("connected to %s%s", redact(uri), f" as {name}" if name else "")
            return conn, uri
        except pika.exceptions.AMQPError as e:
            log.warning("cannot connect to %s: %s", redact(uri), describe(e))
        attempt += 1
        if attempt % len(uris) == 0:
            if stop is not None:
                stop.wait(1.0)
            else:
                time.sleep(1.0)
    return None


def describe(e: BaseException) -> str:
    """A pika exception as one readable line (some have an empty str())."""
    text = str(e) or repr(e)
    return f"{type(e).__name__}: {text}" if not text.startswith(type(e).__name__) else text
