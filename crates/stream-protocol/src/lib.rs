//! RabbitMQ's stream protocol (RabbitMQ's `rabbitmq_stream` plugin, port 5552) in front of
//! Warren's streams: a front end beside the AMQP 0-9-1 one, over the broker API (declaring and
//! deleting streams, publishing with confirms, consuming from an offset).
//!
//! - `frame.rs`: the protocol's frames (what clients send, and a writer for what the server
//!   sends).
//! - `conn/`: a connection: the handshake, then each command (`manage.rs`: streams and super
//!   streams; `publish.rs`: publishers; `consume.rs`: subscriptions); `out.rs`: what it sends,
//!   one socket write at a time; `publishers.rs`: publishers' confirms and deduplication.
//! - `subscription.rs`: a subscription: a stream consumer whose messages go out as chunks
//!   under the client's chunk credit.
//! - `chunk.rs`: the osiris chunk format a `Deliver` carries.
//! - `super_stream.rs`: super streams (a direct exchange over partition streams).
//! - `sac.rs`: single active consumer groups, across this node's connections.
//! - `amqp10.rs`: messages between AMQP 1.0 (the stream protocol's) and the AMQP 0-9-1 form
//!   Warren's streams hold, with RabbitMQ's mapping.

pub mod amqp10;
pub mod chunk;
mod conn;
pub mod frame;
mod out;
mod publishers;
pub mod sac;
mod subscription;
pub mod super_stream;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use warren_broker::server::Broker;

/// Accepts stream-protocol connections until `shutdown` turns true; over TLS (RabbitMQ's 5551)
/// when an `acceptor` is given, the handshake bounded as AMQP's is. `groups`: the node's single
/// active consumer groups, shared by its stream listeners.
pub async fn serve(
    broker: Arc<Broker>,
    groups: Arc<sac::Groups>,
    listener: TcpListener,
    acceptor: Option<TlsAcceptor>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((sock, peer)) => {
                    let _ = sock.set_nodelay(true);
                    let local = sock.local_addr().unwrap_or(peer);
                    let broker = broker.clone();
                    let groups = groups.clone();
                    match &acceptor {
                        None => {
                            tokio::spawn(conn::serve(broker, groups, sock, peer, local));
                        }
                        Some(a) => {
                            let a = a.clone();
                            tokio::spawn(async move {
                                match tokio::time::timeout(TLS_HANDSHAKE, a.accept(sock)).await {
                                    Ok(Ok(tls)) => conn::serve(broker, groups, tls, peer, local).await,
                                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "stream TLS handshake failed"),
                                    Err(_) => tracing::debug!(%peer, "stream TLS handshake timed out"),
                                }
                            });
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "stream listener accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.changed() => {
                if *shutdown.borrow() {
                    return;
                }
            }
        }
    }
}

/// How long a TLS client may take to finish its handshake.
const TLS_HANDSHAKE: std::time::Duration = std::time::Duration::from_secs(10);
