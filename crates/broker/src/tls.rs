//! AMQPS: a second listener (5671 by default) that wraps each accepted socket in rustls and then
//! runs the same connection code as plain TCP (`connection::serve_split`). The TLS handshake
//! counts against the handshake timeout. Plain TCP keeps its own accept loop and its
//! `try_write` fast path; only TLS connections write through the writer task.
//!
//! Client certificates follow RabbitMQ's options: `verify = "verify_none"` asks for none;
//! `"verify_peer"` asks for one and checks it against `ca_file`, and `fail_if_no_peer_cert`
//! decides whether a client without one is refused.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::rustls;
use tokio_rustls::TlsAcceptor;

use crate::config::{TlsConfig, TlsVerify};
use crate::connection;
use crate::outbox::WriteHalf;
use crate::server::Broker;

/// Builds the acceptor from the PEM files the config names; the error says which file and why.
pub fn acceptor(c: &TlsConfig) -> Result<TlsAcceptor, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&c.cert_file)
        .and_then(|i| i.collect::<Result<_, _>>())
        .map_err(|e| format!("cannot read tls.cert_file {}: {e}", c.cert_file.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "tls.cert_file {} holds no certificate",
            c.cert_file.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&c.key_file)
        .map_err(|e| format!("cannot read tls.key_file {}: {e}", c.key_file.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls: {e}"))?;
    let builder = match c.verify {
        TlsVerify::VerifyNone => builder.with_no_client_auth(),
        TlsVerify::VerifyPeer => {
            let Some(ca) = &c.ca_file else {
                return Err("tls.verify = \"verify_peer\" needs tls.ca_file".into());
            };
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca)
                .map_err(|e| format!("cannot read tls.ca_file {}: {e}", ca.display()))?
            {
                let cert =
                    cert.map_err(|e| format!("cannot read tls.ca_file {}: {e}", ca.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("bad CA certificate in {}: {e}", ca.display()))?;
            }
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            );
            let v = if c.fail_if_no_peer_cert {
                v
            } else {
                v.allow_unauthenticated()
            };
            builder.with_client_cert_verifier(v.build().map_err(|e| format!("tls: {e}"))?)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("tls.cert_file and tls.key_file do not make a pair: {e}"))?;
    config.alpn_protocols = vec![b"amqp".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepts TLS clients until `shutdown` turns true (pausing between stop_app and start_app),
/// then waits (bounded) for their connections, which the same signal closes with 320.
pub async fn serve(
    broker: Arc<Broker>,
    listener: TcpListener,
    acceptor: TlsAcceptor,
    shutdown: watch::Receiver<bool>,
) {
    let b = broker.clone();
    crate::app::serve_listener(broker, listener, shutdown, move |stream, peer, close| {
        handshake(b.clone(), acceptor.clone(), stream, peer, close)
    })
    .await
}

async fn handshake(
    broker: Arc<Broker>,
    acceptor: TlsAcceptor,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
) {
    let accepted = Instant::now();
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr().ok();
    let limit = Duration::from_millis(broker.config.limits.handshake_timeout_ms);
    let tls = match tokio::time::timeout_at(accepted + limit, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::info!(%peer, error = %e, "closing connection: TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::info!(%peer, "closing connection: handshake timeout (TLS)");
            return;
        }
    };
    let (rd, wr) = tokio::io::split(tls);
    connection::serve_split(
        broker,
        rd,
        WriteHalf::Io(Box::new(wr)),
        peer,
        local,
        accepted,
        shutdown,
    )
    .await
}
