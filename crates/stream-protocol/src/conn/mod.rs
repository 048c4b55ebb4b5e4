//! One stream-protocol connection: the handshake (peer properties, SASL PLAIN, tune, open),
//! then commands, each answered as RabbitMQ 3.10's `rabbit_stream_reader` answers it.
//!
//! The reading task runs the commands; what the server sends goes through [`Out`], a buffer a
//! writer task flushes to the socket (responses, publish confirms from the persister's
//! thread, and each subscription's chunks from its own task, `subscription.rs`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use warren_broker::access::Perm;
use warren_broker::auth::AuthError;
use warren_broker::confirm::ConfirmTarget;
use warren_broker::queue::QueueRef;
use warren_broker::server::Broker;
use warren_broker::vhost::VHost;

use crate::frame::*;
use crate::frame::{code, Malformed, Request, RESPONSE};
mod consume;
mod manage;
mod publish;

use crate::out::Out;
use crate::publishers::{Confirms, Publisher};
use crate::sac::{Event, GroupKey, Groups};
use crate::subscription::Subscription;

/// The largest frame the server offers (RabbitMQ's default `frame_max`, 1 MiB).
pub const FRAME_MAX: u32 = 1_048_576;
/// The heartbeat the server offers, in seconds (RabbitMQ's default).
pub const HEARTBEAT_S: u32 = 60;

/// Where a connection is in its handshake.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    PeerProperties,
    Sasl,
    Authenticated,
    Tuned,
    Open,
}

pub struct Conn {
    broker: Arc<Broker>,
    peer: SocketAddr,
    /// The address and port the client reached (advertised in metadata, as RabbitMQ
    /// advertises its host and port).
    local: SocketAddr,
    id: u64,
    out: Arc<Out>,
    phase: Phase,
    user: String,
    vhost: Option<Arc<VHost>>,
    frame_max: u32,
    heartbeat_s: u32,
    publishers: HashMap<u8, Publisher>,
    subscriptions: HashMap<u8, Arc<Subscription>>,
    /// Single-active-consumer subscriptions: their group, and what starts them once active.
    sac: HashMap<u8, SacMember>,
    groups: Arc<Groups>,
    events: mpsc::UnboundedSender<Event>,
    /// Consumer updates sent, by correlation id: the subscription each activates (true) or
    /// deactivates.
    updates: HashMap<u32, (u8, bool)>,
    next_corr: u32,
    confirms: Arc<Confirms>,
    target: Arc<dyn ConfirmTarget>,
    next_seq: u64,
    targets: Vec<QueueRef>,
    closing: bool,
}

/// The RabbitMQ release whose stream protocol Warren serves (stream stats, super stream
/// commands, filtering), announced as the stream connection's `version` unless the config's
/// `[server_properties] version` says otherwise.
pub const STREAM_PROTOCOL_RABBITMQ_VERSION: &str = "3.13.0";

/// Serves one connection until it closes.
/// A single-active-consumer subscription: started when its group makes it active.
struct SacMember {
    key: GroupKey,
    stream: Arc<warren_broker::queue::stream::Stream>,
    credit: u16,
    filter: Option<crate::subscription::Filter>,
}

pub async fn serve<S>(
    broker: Arc<Broker>,
    groups: Arc<Groups>,
    sock: S,
    peer: SocketAddr,
    local: SocketAddr,
) where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(sock);
    let out = Out::new();
    let writer = {
        let out = out.clone();
        tokio::spawn(async move {
            loop {
                let b = out.next().await;
                if wr.write_all(&b).await.is_err() {
                    out.close();
                    return;
                }
                out.written();
            }
        })
    };
    let confirms = Arc::new(Confirms::new(out.clone()));
    let (events, mut events_rx) = mpsc::unbounded_channel();
    let mut c = Conn {
        sac: HashMap::new(),
        groups,
        events,
        updates: HashMap::new(),
        next_corr: 0,
        id: broker.next_connection_id(),
        broker,
        peer,
        local,
        out: out.clone(),
        phase: Phase::PeerProperties,
        user: String::new(),
        vhost: None,
        frame_max: FRAME_MAX,
        heartbeat_s: HEARTBEAT_S,
        publishers: HashMap::new(),
        subscriptions: HashMap::new(),
        target: confirms.clone(),
        confirms,
        next_seq: 0,
        targets: Vec::new(),
        closing: false,
    };
    tracing::debug!(peer = %peer, conn = c.id, "stream connection accepted");
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let why = loop {
        // Credit flow: a client that does not read what it is sent is not read from either.
        c.out.below_high().await;
        // Until tuned, a silent client is dropped after RabbitMQ's handshake timeout (10 s);
        // after, twice the heartbeat.
        let idle = match (c.phase, c.heartbeat_s) {
            (Phase::Tuned | Phase::Open, 0) => Duration::from_secs(u64::MAX / 4),
            (Phase::Tuned | Phase::Open, h) => Duration::from_secs(2 * h as u64),
            _ => Duration::from_secs(10),
        };
        let read = tokio::select! {
            r = tokio::time::timeout(idle, rd.read_buf(&mut buf)) => r,
            Some(e) = events_rx.recv() => {
                match e {
                    Event::Activate { id } => c.activate(id),
                    Event::Deactivate { id } => c.deactivate(id),
                }
                continue;
            }
        };
        match read {
            Err(_) => break "missed heartbeats".to_string(),
            Ok(Err(e)) => break e.to_string(),
            Ok(Ok(0)) => break "closed by the client".to_string(),
            Ok(Ok(_)) => {}
        }
        let mut failed = None;
        while buf.len() >= 4 {
            let size = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
            if c.frame_max != 0 && size > c.frame_max.max(FRAME_MAX) {
                failed = Some(format!("frame of {size} bytes, over frame_max"));
                break;
            }
            if buf.len() < 4 + size as usize {
                break;
            }
            let _ = buf.split_to(4);
            let frame = buf.split_to(size as usize).freeze();
            if let Err(e) = c.handle(&frame).await {
                failed = Some(e);
                break;
            }
        }
        if let Some(e) = failed {
            break e;
        }
        if c.closing {
            break "closed".to_string();
        }
    };
    tracing::debug!(peer = %peer, conn = c.id, reason = %why, "stream connection closed");
    c.stop();
    // Let the writer send what is queued (a close response), bounded.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    while out.pending() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    writer.abort();
}

impl Conn {
    fn stop(&mut self) {
        for (_, p) in self.publishers.drain() {
            p.flush();
        }
        for (_, s) in self.subscriptions.drain() {
            s.stop();
        }
        for (id, m) in self.sac.drain() {
            self.groups.leave(&m.key, self.id, id);
        }
    }

    fn respond(&self, key: u16, corr: u32, code: u16) {
        self.out.send(|w| w.response(key, corr, code));
    }

    async fn handle(&mut self, frame: &Bytes) -> Result<(), String> {
        let req = match Request::parse(frame) {
            Ok(r) => r,
            Err(Malformed(why)) => return Err(format!("malformed frame: {why}")),
        };
        tracing::trace!(conn = self.id, ?req, "stream command");
        // Before open, only the handshake's commands (RabbitMQ closes the connection).
        let handshake = matches!(
            req,
            Request::PeerProperties { .. }
                | Request::SaslHandshake { .. }
                | Request::SaslAuthenticate { .. }
                | Request::Tune { .. }
                | Request::Open { .. }
                | Request::Close { .. }
                | Request::Heartbeat
        );
        if self.phase != Phase::Open && !handshake {
            return Err(format!("{req:?} before the connection was opened"));
        }
        match req {
            Request::PeerProperties { corr, .. } => {
                let cluster = self.broker.cluster_name();
                // As announced to AMQP clients (`[server_properties]`), but for the version:
                // RabbitMQ's stream clients gate features on it (the Java client asks which
                // commands the server has only from 3.11, and manages super streams only from
                // 3.13), so unless the config names one, the version announced is the RabbitMQ
                // release whose stream protocol this serves.
                let announced = &self.broker.config.server_properties;
                let version = if announced.version
                    == warren_broker::config::ServerProperties::default().version
                {
                    STREAM_PROTOCOL_RABBITMQ_VERSION
                } else {
                    announced.version.as_str()
                };
                let props = [
                    ("product", announced.product.as_str()),
                    ("version", version),
                    ("platform", "Rust"),
                    ("cluster_name", cluster.as_str()),
                    ("copyright", "Warren authors"),
                    ("information", "Licensed under the Apache License 2.0"),
                ];
                self.out.send(|w| {
                    w.begin(PEER_PROPERTIES | RESPONSE, 1)
                        .u32(corr)
                        .u16(code::OK)
                        .properties(props.iter().copied())
                        .end()
                });
                self.phase = Phase::Sasl;
            }
            Request::SaslHandshake { corr } => self.out.send(|w| {
                w.begin(SASL_HANDSHAKE | RESPONSE, 1)
                    .u32(corr)
                    .u16(code::OK)
                    .u32(2)
                    .string("PLAIN")
                    .string("AMQPLAIN")
                    .end()
            }),
            Request::SaslAuthenticate {
                corr,
                mechanism,
                data,
            } => return self.authenticate(corr, &mechanism, &data).await,
            Request::Tune {
                frame_max,
                heartbeat,
            } => {
                self.frame_max = if frame_max == 0 {
                    FRAME_MAX
                } else {
                    frame_max.min(FRAME_MAX)
                };
                self.heartbeat_s = heartbeat;
                if self.phase == Phase::Authenticated {
                    self.phase = Phase::Tuned;
                }
                if heartbeat > 0 {
                    let out = self.out.clone();
                    tokio::spawn(heartbeats(out, heartbeat));
                }
            }
            Request::Open { corr, vhost } => self.open(corr, &vhost),
            Request::Close { corr, .. } => {
                self.respond(CLOSE, corr, code::OK);
                self.closing = true;
            }
            Request::CloseOk { .. } => self.closing = true,
            Request::Heartbeat => {}
            Request::Create {
                corr,
                stream,
                arguments,
            } => self.create(corr, &stream, &arguments),
            Request::Delete { corr, stream } => self.delete(corr, &stream),
            Request::Metadata { corr, streams } => self.metadata(corr, &streams).await,
            Request::DeclarePublisher {
                corr,
                id,
                reference,
                stream,
            } => self.declare_publisher(corr, id, reference, stream),
            Request::DeletePublisher { corr, id } => {
                let code = match self.publishers.remove(&id) {
                    Some(p) => {
                        p.flush();
                        code::OK
                    }
                    None => code::PUBLISHER_DOES_NOT_EXIST,
                };
                self.respond(DELETE_PUBLISHER, corr, code);
            }
            Request::Publish {
                publisher,
                messages,
            } => self.publish(publisher, messages).await,
            Request::QueryPublisherSequence {
                corr,
                reference,
                stream,
            } => self.query_publisher_sequence(corr, &reference, &stream),
            Request::Subscribe {
                corr,
                id,
                stream,
                offset,
                credit,
                properties,
            } => self.subscribe(corr, id, &stream, offset, credit, &properties),
            Request::Credit { id, credit } => match self.subscriptions.get(&id) {
                Some(s) => s.add_credit(credit),
                None => self.out.send(|w| {
                    w.begin(CREDIT | RESPONSE, 1)
                        .u16(code::SUBSCRIPTION_ID_DOES_NOT_EXIST)
                        .u8(id)
                        .end()
                }),
            },
            Request::Unsubscribe { corr, id } => {
                let member = self.sac.remove(&id);
                let running = self.subscriptions.remove(&id);
                if let Some(s) = &running {
                    s.stop();
                }
                if let Some(m) = &member {
                    self.groups.leave(&m.key, self.id, id);
                }
                let code = if running.is_some() || member.is_some() {
                    code::OK
                } else {
                    code::SUBSCRIPTION_ID_DOES_NOT_EXIST
                };
                self.respond(UNSUBSCRIBE, corr, code);
            }
            Request::StoreOffset {
                reference,
                stream,
                offset,
            } => {
                if self.permitted(Perm::Read, &stream) {
                    if let Some(QueueRef::Stream(s)) = self.stream(&stream) {
                        s.store_offset(&reference, offset);
                    }
                }
            }
            Request::QueryOffset {
                corr,
                reference,
                stream,
            } => {
                let (code, offset) = match self.stream(&stream) {
                    Some(QueueRef::Stream(s)) if self.permitted(Perm::Read, &stream) => {
                        match s.stored_offset(&reference) {
                            Some(o) => (code::OK, o),
                            None => (code::NO_OFFSET, 0),
                        }
                    }
                    Some(_) => (code::ACCESS_REFUSED, 0),
                    None => (code::STREAM_DOES_NOT_EXIST, 0),
                };
                self.out.send(|w| {
                    w.begin(QUERY_OFFSET | RESPONSE, 1)
                        .u32(corr)
                        .u16(code)
                        .u64(offset)
                        .end()
                });
            }
            Request::ExchangeCommandVersions { corr, .. } => self.out.send(|w| {
                let ours: &[(u16, u16, u16)] = &[
                    (DECLARE_PUBLISHER, 1, 1),
                    // Version 2: a filter value per message (RabbitMQ 3.13's filtering).
                    (PUBLISH, 1, 2),
                    (QUERY_PUBLISHER_SEQUENCE, 1, 1),
                    (DELETE_PUBLISHER, 1, 1),
                    (SUBSCRIBE, 1, 1),
                    (DELIVER, 1, 1),
                    (CREDIT, 1, 1),
                    (UNSUBSCRIBE, 1, 1),
                    (CREATE, 1, 1),
                    (DELETE, 1, 1),
                    (METADATA, 1, 1),
                    (METADATA_UPDATE, 1, 1),
                    (PEER_PROPERTIES, 1, 1),
                    (SASL_HANDSHAKE, 1, 1),
                    (SASL_AUTHENTICATE, 1, 1),
                    (TUNE, 1, 1),
                    (OPEN, 1, 1),
                    (CLOSE, 1, 1),
                    (HEARTBEAT, 1, 1),
                    (ROUTE, 1, 1),
                    (PARTITIONS, 1, 1),
                    (EXCHANGE_COMMAND_VERSIONS, 1, 1),
                    (STREAM_STATS, 1, 1),
                    (CREATE_SUPER_STREAM, 1, 1),
                    (CONSUMER_UPDATE, 1, 1),
                    (DELETE_SUPER_STREAM, 1, 1),
                ];
                w.begin(EXCHANGE_COMMAND_VERSIONS | RESPONSE, 1)
                    .u32(corr)
                    .u16(code::OK)
                    .u32(ours.len() as u32);
                for (k, lo, hi) in ours {
                    w.u16(*k).u16(*lo).u16(*hi);
                }
                w.end();
            }),
            Request::StreamStats { corr, stream } => {
                let stats = self.stream(&stream).and_then(|q| match q {
                    QueueRef::Stream(s) => Some((s.first_offset(), s.committed_chunk_id())),
                    _ => None,
                });
                self.out.send(|w| match stats {
                    Some((first, committed)) => {
                        w.begin(STREAM_STATS | RESPONSE, 1)
                            .u32(corr)
                            .u16(code::OK)
                            .u32(2)
                            .string("first_chunk_id")
                            .u64(first)
                            .string("committed_chunk_id")
                            .u64(committed)
                            .end();
                    }
                    // The stats list is there, empty (RabbitMQ's encoder writes it; the Java
                    // client reads it).
                    None => {
                        w.begin(STREAM_STATS | RESPONSE, 1)
                            .u32(corr)
                            .u16(code::STREAM_DOES_NOT_EXIST)
                            .u32(0)
                            .end();
                    }
                });
            }
            Request::Route {
                corr,
                routing_key,
                super_stream,
            } => {
                let found = if self.permitted(Perm::Read, &super_stream) {
                    crate::super_stream::route(self.vhost(), &super_stream, &routing_key)
                } else {
                    None
                };
                self.streams_response(ROUTE, corr, found);
            }
            Request::Partitions { corr, super_stream } => {
                let found = if self.permitted(Perm::Read, &super_stream) {
                    crate::super_stream::partitions(self.vhost(), &super_stream)
                } else {
                    None
                };
                self.streams_response(PARTITIONS, corr, found);
            }
            Request::CreateSuperStream {
                corr,
                name,
                partitions,
                binding_keys,
                arguments,
            } => {
                let code = self.create_super_stream(&name, &partitions, &binding_keys, &arguments);
                self.respond(CREATE_SUPER_STREAM, corr, code);
            }
            Request::DeleteSuperStream { corr, name } => {
                let code = if !self.permitted(Perm::Configure, &name) {
                    code::ACCESS_REFUSED
                } else if crate::super_stream::delete(self.vhost(), &name, self.id) {
                    code::OK
                } else {
                    code::STREAM_DOES_NOT_EXIST
                };
                self.respond(DELETE_SUPER_STREAM, corr, code);
            }
            Request::ConsumerUpdateReply { corr, offset, .. } => self.activated(corr, offset),
            Request::Unknown { key, .. } => {
                tracing::debug!(conn = self.id, key, "unknown stream command");
                if let Some(corr) = frame
                    .get(4..8)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                {
                    self.respond(key, corr, code::UNKNOWN_FRAME);
                }
            }
        }
        Ok(())
    }

    async fn authenticate(
        &mut self,
        corr: u32,
        mechanism: &str,
        data: &Bytes,
    ) -> Result<(), String> {
        match self
            .broker
            .users
            .authenticate(mechanism, data, self.peer.ip())
        {
            Ok(user) => {
                self.user = user.name;
                self.respond(SASL_AUTHENTICATE, corr, code::OK);
                self.phase = Phase::Authenticated;
                self.out.send(|w| {
                    w.begin(TUNE, 1).u32(FRAME_MAX).u32(HEARTBEAT_S).end();
                });
                Ok(())
            }
            Err(e) => {
                let (code, why) = match e {
                    AuthError::UnknownMechanism => (
                        code::SASL_MECHANISM_NOT_SUPPORTED,
                        "unknown mechanism".to_string(),
                    ),
                    AuthError::Malformed => (code::SASL_ERROR, "malformed SASL response".into()),
                    AuthError::BadCredentials { user } => (
                        code::AUTHENTICATION_FAILURE,
                        format!("invalid credentials for '{user}'"),
                    ),
                    AuthError::LoopbackOnly { user } => (
                        code::SASL_AUTHENTICATION_FAILURE_LOOPBACK,
                        format!("user '{user}' can only connect via localhost"),
                    ),
                };
                tracing::warn!(peer = %self.peer, mechanism, why = %why, "stream authentication failed");
                // As for AMQP: the answer comes after a delay, so each guess costs time.
                let delay = self.broker.config.limits.auth_failure_delay_ms;
                tokio::time::sleep(Duration::from_millis(delay)).await;
                self.respond(SASL_AUTHENTICATE, corr, code);
                Err(format!("authentication failed: {why}"))
            }
        }
    }

    fn open(&mut self, corr: u32, vhost: &str) {
        let ok = self.phase == Phase::Tuned
            && self.broker.access.can_open(&self.user, vhost)
            && self.broker.vhost(vhost).is_some();
        if !ok {
            self.respond(OPEN, corr, code::VIRTUAL_HOST_ACCESS_FAILURE);
            self.closing = true;
            return;
        }
        self.vhost = self.broker.vhost(vhost);
        self.phase = Phase::Open;
        let host = self.local.ip().to_string();
        let port = self.local.port().to_string();
        self.out.send(|w| {
            w.begin(OPEN | RESPONSE, 1)
                .u32(corr)
                .u16(code::OK)
                .properties(
                    [
                        ("advertised_host", host.as_str()),
                        ("advertised_port", port.as_str()),
                    ]
                    .into_iter(),
                )
                .end()
        });
        tracing::info!(peer = %self.peer, conn = self.id, user = %self.user, vhost, "stream connection opened");
    }

    fn vhost(&self) -> &Arc<VHost> {
        self.vhost.as_ref().expect("open before any command")
    }

    fn permitted(&self, perm: Perm, name: &str) -> bool {
        self.broker
            .access
            .permitted(&self.user, &self.vhost().name, perm, name)
    }

    /// The stream `name`, if it is one.
    fn stream(&self, name: &str) -> Option<QueueRef> {
        self.vhost()
            .queue(name)
            .filter(|q| matches!(q, QueueRef::Stream(_)))
    }
}

async fn heartbeats(out: Arc<Out>, every_s: u32) {
    let mut t = tokio::time::interval(Duration::from_secs(every_s as u64));
    t.tick().await;
    loop {
        t.tick().await;
        if Arc::strong_count(&out) <= 1 {
            return;
        }
        out.send(|w| {
            w.begin(HEARTBEAT, 1).end();
        });
    }
}
