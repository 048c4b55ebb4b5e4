//! RabbitMQ's stream protocol (RabbitMQ's `rabbitmq_stream` plugin, port 5552) in front of
//! Warren's streams: a front end beside the AMQP 0-9-1 one, over the broker API (declaring and
//! deleting streams, publishing with confirms, consuming from an offset).
//!
//! - `frame.rs`: the protocol's frames (what clients send, and a writer for what the server
//!   sends).
//! - `conn.rs`: a connection: the handshake, then each command; `out.rs`: what it sends, one
//!   socket write at a time.
//! - `subscription.rs`: a subscription: a stream consumer whose messages go out as chunks
//!   under the client's chunk credit.
//! - `chunk.rs`: the osiris chunk format a `Deliver` carries.
//! - `super_stream.rs`: super streams (a direct exchange over partition streams).
//! - `amqp10.rs`: messages between AMQP 1.0 (the stream protocol's) and the AMQP 0-9-1 form
//!   Warren's streams hold, with RabbitMQ's mapping.

pub mod amqp10;
pub mod chunk;
mod conn;
pub mod frame;
mod out;
mod subscription;
pub mod super_stream;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use warren_broker::server::Broker;

/// Accepts stream-protocol connections until `shutdown` turns true.
pub async fn serve(
    broker: Arc<Broker>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((sock, peer)) => {
                    tokio::spawn(conn::serve(broker.clone(), sock, peer));
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
