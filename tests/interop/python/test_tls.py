"""AMQPS on the second listener with pika over TLS: a round trip with verify_none, and client
certificates with verify_peer (a certificate from the configured CA is accepted; none, or one
from another CA, is refused when fail_if_no_peer_cert is set). Certificates are made here with
the openssl CLI; no key is kept in the repository.
Warren only: it writes the broker's TLS config (RabbitMQ's is in rabbitmq.conf)."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess

import pika
import pika.exceptions
import pytest

from conftest import _free_port
from helpers import safe_close, wait_until
from test_limits import start, url

BIN = os.environ.get("WARREN_BIN")
pytestmark = [
    pytest.mark.skipif(not BIN, reason="writes the broker's TLS config: Warren only (WARREN_BIN)"),
    pytest.mark.skipif(not shutil.which("openssl"), reason="needs the openssl CLI to make certificates"),
]


def openssl(*args: str, cwd: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(d: str, name: str) -> None:
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}", cwd=d)


def make_cert(d: str, name: str, ca: str, ext: str) -> None:
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    with open(os.path.join(d, f"{name}.ext"), "w") as f:
        f.write(ext)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture
def certs(tmp_path):
    d = str(tmp_path)
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    make_cert(d, "server", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    make_cert(d, "client", "ca", "extendedKeyUsage=clientAuth\n")
    make_cert(d, "stranger", "other-ca", "extendedKeyUsage=clientAuth\n")
    return d


@pytest.fixture
def nodes():
    started = []
    yield started
    for n in started:
        n.cleanup()


def tls_config(d: str, port: int, extra: str = "") -> str:
    return (f"[tls]\nport = {port}\ncert_file = '{d}/server.pem'\nkey_file = '{d}/server.key'\n" + extra)


def tls_params(d: str, port: int, client: str | None = None) -> pika.ConnectionParameters:
    ctx = ssl.create_default_context(cafile=os.path.join(d, "ca.pem"))
    if client:
        ctx.load_cert_chain(os.path.join(d, f"{client}.pem"), os.path.join(d, f"{client}.key"))
    return pika.ConnectionParameters(host="127.0.0.1", port=port, heartbeat=0, connection_attempts=1,
                                     ssl_options=pika.SSLOptions(ctx, "localhost"))


def round_trip(c: pika.BlockingConnection, q: str) -> None:
    ch = c.channel()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"over tls " * 1000)
    assert ch.basic_get(q, auto_ack=True)[2] == b"over tls " * 1000


def test_tls_listener_round_trip(certs, nodes):
    port = _free_port()
    n = start(tls_config(certs, port))
    nodes.append(n)
    c = pika.BlockingConnection(tls_params(certs, port))
    round_trip(c, "tls-q")
    safe_close(c)
    # The plain listener is unchanged beside it.
    p = pika.BlockingConnection(pika.URLParameters(url(n)))
    round_trip(p, "plain-q")
    safe_close(p)
    assert "over TLS" in n.stderr()


def test_plain_amqp_on_the_tls_port_is_dropped(certs, nodes):
    port = _free_port()
    n = start(tls_config(certs, port))
    nodes.append(n)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=port, connection_attempts=1,
                                                          socket_timeout=5, blocked_connection_timeout=5))
    # The server logs the failure as it drops the socket: the client may see the drop first.
    wait_until(lambda: "TLS handshake failed" in n.stderr(), timeout=5, interval=0.05,
               what="the server to log the failed TLS handshake")


def test_client_certificates_verify_peer(certs, nodes):
    port = _free_port()
    n = start(tls_config(certs, port, f"ca_file = '{certs}/ca.pem'\nverify = 'verify_peer'\nfail_if_no_peer_cert = true\n"))
    nodes.append(n)
    c = pika.BlockingConnection(tls_params(certs, port, client="client"))
    round_trip(c, "mtls-q")
    safe_close(c)
    for client in (None, "stranger"):
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(tls_params(certs, port, client=client))
    assert "TLS handshake failed" in n.stderr()


def test_verify_peer_without_fail_if_no_peer_cert_allows_none(certs, nodes):
    port = _free_port()
    n = start(tls_config(certs, port, f"ca_file = '{certs}/ca.pem'\nverify = 'verify_peer'\n"))
    nodes.append(n)
    safe_close(pika.BlockingConnection(tls_params(certs, port)))
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(tls_params(certs, port, client="stranger"))
