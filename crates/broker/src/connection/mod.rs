//! One client connection: protocol header, handshake (start, SASL, tune, open), the read loop
//! that splits frames and hands them to channels, heartbeats, and the close sequence.
//!
//! The reader runs in this task; output goes through the connection's [`Outbox`] to a writer task.
//! A read batch (all frames one syscall returned) is processed before confirms are flushed, so
//! confirms for a burst of publishes go out as one `multiple` ack.
//!
//! By job, one file each, as `impl Conn` blocks: `handshake.rs` (start, SASL, tune, open),
//! `reader.rs` (the read loop, frame splitting and the phase each frame goes to, read pauses
//! for alarms and credit), `channels.rs` (channel multiplexing: open, close, frames handed to
//! a [`Channel`]), `timer.rs` (heartbeats, deadlines, the consumer-timeout check) and
//! `close.rs` (the close sequence and cleanup). This file holds the connection's state and the
//! entry points that accept a socket.

mod channels;
mod close;
mod handshake;
mod reader;
mod timer;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use warren_protocol::frame::FrameDecoder;
use warren_protocol::{FieldTable, PROTOCOL_HEADER};

use crate::auth::User;
use crate::channel::Channel;
use crate::error::AmqpError;
use crate::outbox::{Outbox, WriteHalf};
use crate::queue::QueueRef;
use crate::server::Broker;
use crate::vhost::VHost;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitStartOk,
    AwaitTuneOk,
    AwaitOpen,
    Open,
    /// A login failed: wait out the auth failure delay (so guessing is slow), then close.
    AuthDelay,
    /// We sent connection.close and wait for close-ok (or the deadline).
    CloseSent,
    /// The client closed and we answered close-ok: wait for it to close TCP (as RabbitMQ does),
    /// so our close-ok is not lost to a reset.
    Draining,
    Done,
}

enum Slot {
    Open(Box<Channel>),
    /// We sent channel.close; everything but close/close-ok is dropped until close-ok.
    Closing,
}

struct Conn {
    broker: Arc<Broker>,
    id: u64,
    peer: SocketAddr,
    outbox: Arc<Outbox>,
    decoder: FrameDecoder,
    phase: Phase,
    user: Option<User>,
    vhost: Option<Arc<VHost>>,
    channel_max: u16,
    heartbeat_s: u16,
    /// ahash: looked up on every frame; SipHash showed in profiles.
    channels: ahash::AHashMap<u16, Slot>,
    /// Channels with confirms to flush at the end of the read batch.
    dirty: Vec<u16>,
    exclusive_queues: Vec<QueueRef>,
    /// Our end of the socket, for the connection's name.
    local: Option<SocketAddr>,
    /// The client's properties from start-ok, kept for the management API.
    client_properties: FieldTable,
    /// This connection in the broker's registry, once open.
    info: Option<Arc<crate::tracking::ConnInfo>>,
    /// The client asked for connection.close 403 on failed auth rather than a dropped socket.
    auth_failure_close: bool,
    /// The client handles connection.blocked/unblocked.
    blocked_capability: bool,
    /// The client handles a server-sent basic.cancel: a consumer timeout cancels the consumer
    /// rather than closing its channel.
    cancel_notify: bool,
    /// The next consumer-timeout check, while a channel may hold manual-ack deliveries.
    timeout_tick: Option<Instant>,
    /// This connection has published: resource alarms block its reads.
    publisher: bool,
    /// Reads are paused by a resource alarm (and connection.blocked was sent if supported).
    blocked: bool,
    last_read: Instant,
    last_writes: u64,
    deadline: Instant,
    heartbeat_tick: Option<Instant>,
    reason: String,
    /// This connection's place in the connection limits, held from connection.open.
    place: Option<crate::admission::Place>,
    /// The connection.close 403 to send when the auth failure delay ends (None: just drop).
    auth_refusal: Option<AmqpError>,
    /// process() stopped early because the outbox is over its pause mark; frames wait in buf.
    backlog: bool,
    /// The byte stream is out of step (a framing error): input is dropped until the socket
    /// closes, so the client can still read our connection.close instead of a reset.
    discard_input: bool,
    /// Queues this connection published into whose consumers fell behind: while any stays
    /// pressured, a connection that consumes nothing is not read (credit flow).
    starved: Vec<QueueRef>,
    /// Starved for a whole `CREDIT_RECHECK_MS`: the next read takes at most
    /// `STARVED_READ_BYTES`, so the publisher trickles on rather than stopping dead for seconds.
    trickle: bool,
}

/// Serves one accepted plain-TCP socket until it closes.
pub async fn serve(
    broker: Arc<Broker>,
    stream: TcpStream,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
) {
    let accepted = Instant::now();
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr().ok();
    let (rd, wr) = stream.into_split();
    serve_split(
        broker,
        rd,
        WriteHalf::Tcp(wr),
        peer,
        local,
        accepted,
        shutdown,
    )
    .await
}

/// Serves a connection over any byte stream (plain TCP halves, or TLS), from the protocol
/// header on. `accepted`: when the socket was accepted; the whole handshake (a TLS one
/// included) must end within the handshake timeout of it.
pub async fn serve_split<R: AsyncRead + Unpin>(
    broker: Arc<Broker>,
    mut rd: R,
    mut wr: WriteHalf,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    accepted: Instant,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut header = [0u8; 8];
    let handshake = Duration::from_millis(broker.config.limits.handshake_timeout_ms);
    match tokio::time::timeout_at(accepted + handshake, rd.read_exact(&mut header)).await {
        Ok(Ok(_)) if &header == PROTOCOL_HEADER => {}
        Ok(Ok(_)) => {
            tracing::info!(%peer, "closing connection: bad protocol header");
            match &mut wr {
                WriteHalf::Tcp(w) => {
                    let _ = w.write_all(PROTOCOL_HEADER).await;
                    let _ = w.shutdown().await;
                }
                WriteHalf::Io(w) => {
                    let _ = w.write_all(PROTOCOL_HEADER).await;
                    let _ = w.shutdown().await;
                }
            }
            return;
        }
        Ok(Err(_)) => return,
        Err(_) => {
            tracing::info!(%peer, "closing connection: handshake timeout");
            return;
        }
    }
    let frame_max = broker.config.limits.frame_max;
    let outbox = Outbox::new(frame_max);
    outbox
        .send_timeout_ms
        .store(broker.config.limits.send_timeout_ms, Ordering::Relaxed);
    let writer = tokio::spawn(outbox.clone().run_writer(wr));
    let id = broker.next_connection_id();
    let mut conn = Conn {
        broker: broker.clone(),
        id,
        peer,
        outbox: outbox.clone(),
        // Until tune-ok, RabbitMQ's initial frame_max: a start-ok must fit in 4096 octets.
        decoder: FrameDecoder::new(warren_protocol::frame::FRAME_MIN_SIZE),
        phase: Phase::AwaitStartOk,
        user: None,
        vhost: None,
        channel_max: broker.config.limits.channel_max,
        heartbeat_s: 0,
        channels: ahash::AHashMap::new(),
        dirty: Vec::new(),
        exclusive_queues: Vec::new(),
        local,
        client_properties: FieldTable::new(),
        info: None,
        auth_failure_close: false,
        blocked_capability: false,
        cancel_notify: false,
        timeout_tick: None,
        publisher: false,
        blocked: false,
        last_read: Instant::now(),
        last_writes: 0,
        deadline: accepted + handshake,
        heartbeat_tick: None,
        reason: String::new(),
        place: None,
        auth_refusal: None,
        backlog: false,
        discard_input: false,
        starved: Vec::new(),
        trickle: false,
    };
    conn.send_start();
    conn.run(&mut rd, &mut shutdown).await;
    conn.cleanup();
    outbox.close();
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    let user = conn.user.as_ref().map(|u| u.name.as_str()).unwrap_or("");
    tracing::info!(%peer, conn = id, user, reason = %conn.reason, "connection closed");
}
