//! One client connection: protocol header, handshake (start, SASL, tune, open), the read loop
//! that splits frames and hands them to channels, heartbeats, and the close sequence.
//!
//! The reader runs in this task; output goes through the connection's [`Outbox`] to a writer task.
//! A read batch (all frames one syscall returned) is processed before confirms are flushed, so
//! confirms for a burst of publishes go out as one `multiple` ack.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use warren_protocol::frame::FrameDecoder;
use warren_protocol::method::*;
use warren_protocol::{
    reply, DecodeError, FieldTable, FieldValue, Frame, FrameKind, Method, PROTOCOL_HEADER,
};

use crate::auth::{AuthError, User};
use crate::channel::{notify_cancelled, Channel, Ctx};
use crate::error::AmqpError;
use crate::limits;
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

impl Conn {
    fn send_start(&self) {
        let mut caps = FieldTable::new();
        for c in [
            "publisher_confirms",
            "exchange_exchange_bindings",
            "basic.nack",
            "consumer_cancel_notify",
            "connection.blocked",
            "consumer_priorities",
            "authentication_failure_close",
            "per_consumer_qos",
            "direct_reply_to",
        ] {
            caps.insert(c, FieldValue::Bool(true));
        }
        let mut props = FieldTable::new();
        props.insert("capabilities", FieldValue::Table(caps));
        props.insert("cluster_name", FieldValue::str("warren"));
        props.insert(
            "copyright",
            FieldValue::str("Copyright (c) the Warren authors"),
        );
        props.insert(
            "information",
            FieldValue::str("Warren, an AMQP 0-9-1 broker; see README.md"),
        );
        props.insert("platform", FieldValue::str("Rust"));
        // Configurable: some clients and applications gate features on these.
        let announced = &self.broker.config.server_properties;
        props.insert("product", FieldValue::str(&announced.product));
        props.insert("version", FieldValue::str(&announced.version));
        self.outbox.method(
            0,
            &Method::ConnectionStart(ConnectionStart {
                version_major: 0,
                version_minor: 9,
                server_properties: props,
                mechanisms: Bytes::from_static(b"PLAIN AMQPLAIN"),
                locales: Bytes::from_static(b"en_US"),
            }),
        );
    }

    async fn run<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
        shutdown: &mut watch::Receiver<bool>,
    ) {
        let mut buf = BytesMut::with_capacity(limits::READ_BUFFER_BYTES);
        let mut shutting_down = false;
        let mut alarms = self.broker.alarms.subscribe();
        // Futures that outlive a loop turn: making them afresh each turn (a timer entry, two
        // `Notified` registrations and their drops) cost ~1,500 instructions per read
        // (callgrind), as much as several small messages.
        let outbox = self.outbox.clone();
        let failed = outbox.failed();
        tokio::pin!(failed);
        let timer = tokio::time::sleep_until(self.next_tick());
        tokio::pin!(timer);
        // A forced close (management API, vhost deletion) is possible once the connection is in
        // the registry, from connection.open on.
        let mut forced: std::pin::Pin<Box<dyn std::future::Future<Output = String> + Send>> =
            Box::pin(std::future::pending());
        let mut forced_armed = false;
        while self.phase != Phase::Done {
            self.apply_alarm(*alarms.borrow());
            if self.backlog && self.outbox.pending() < limits::OUTBOX_READ_PAUSE_BYTES {
                // Replies drained: handle the requests held back, before reading more.
                self.backlog = false;
                let pressured = self.process(&mut buf);
                self.await_credit(pressured).await;
                continue;
            }
            let paused =
                self.blocked || self.backlog || (!self.starved.is_empty() && !self.trickle);
            let read_limit = if self.trickle {
                limits::STARVED_READ_BYTES
            } else {
                usize::MAX
            };
            let starved = self.starved.first().cloned();
            if buf.capacity() - buf.len() < 4096 {
                buf.reserve(limits::READ_BUFFER_BYTES);
            }
            let tick = self.next_tick();
            if timer.deadline() != tick {
                timer.as_mut().reset(tick);
            }
            if !forced_armed {
                if let Some(i) = self.info.clone() {
                    forced = Box::pin(async move { i.closed().await });
                    forced_armed = true;
                }
            }
            let mut limited = (&mut buf).limit(read_limit);
            tokio::select! {
                reason = &mut forced => {
                    // Done with: a second forced close would change nothing.
                    forced = Box::pin(std::future::pending());
                    self.close_connection(AmqpError::new(reply::CONNECTION_FORCED, reason));
                }
                why = &mut failed => {
                    tracing::info!(peer = %self.peer, conn = self.id, reason = %why, "closing connection");
                    self.reason = why;
                    return;
                }
                _ = outbox.space(), if self.backlog => {}
                _ = async move {
                    if let Some(q) = starved {
                        q.stall(Duration::from_millis(limits::CREDIT_RECHECK_MS)).await;
                    }
                }, if !self.starved.is_empty() && !self.trickle => {
                    self.starved.retain(|q| q.pressured());
                    self.trickle = !self.starved.is_empty();
                }
                _ = alarms.changed() => {}
                r = rd.read_buf(&mut limited), if !paused => match r {
                    Ok(0) => {
                        if self.reason.is_empty() && self.phase != Phase::Draining {
                            self.reason = "client closed TCP connection".into();
                        }
                        return;
                    }
                    Ok(n) => {
                        if let Some(i) = &self.info {
                            crate::metrics::bump(&i.recv_oct, n as u64);
                            crate::metrics::bump(&i.recv_cnt, 1);
                        }
                        self.last_read = Instant::now();
                        self.trickle = false;
                        let pressured = self.process(limited.get_mut());
                        self.await_credit(pressured).await;
                    }
                    Err(e) => {
                        self.reason = format!("read error: {e}");
                        return;
                    }
                },
                _ = &mut timer => self.tick(),
                _ = shutdown.changed(), if !shutting_down => {
                    shutting_down = true;
                    if self.phase == Phase::Open {
                        self.close_connection(AmqpError::new(reply::CONNECTION_FORCED, "broker forced connection closure with reason 'shutdown'"));
                    } else {
                        self.reason = "broker shutdown".into();
                        self.phase = Phase::Done;
                    }
                }
            }
        }
    }

    /// Blocks or unblocks this connection's reads as the resource alarms say, telling the client.
    fn apply_alarm(&mut self, state: crate::alarms::AlarmState) {
        let block = self.publisher && state.any() && self.phase == Phase::Open;
        if block == self.blocked {
            return;
        }
        self.blocked = block;
        if self.blocked_capability {
            let m = if block {
                Method::ConnectionBlocked(ConnectionBlocked {
                    reason: state.reason().into(),
                })
            } else {
                Method::ConnectionUnblocked(ConnectionUnblocked {})
            };
            self.outbox.method(0, &m);
        }
        tracing::info!(peer = %self.peer, conn = self.id, blocked = block, "publishing connection {}", if block { "blocked by a resource alarm" } else { "unblocked" });
    }

    /// Credit: a queue whose consumers fall behind holds back this connection's next read, so
    /// TCP pushes back on the publisher. A connection that only publishes waits until the queue
    /// is relieved (in the select loop, so heartbeats and closes still work); one that also
    /// consumes waits a bounded time, since it must keep reading its own acks.
    async fn await_credit(&mut self, pressured: Vec<QueueRef>) {
        if pressured.is_empty() {
            return;
        }
        let consumes = self
            .channels
            .values()
            .any(|s| matches!(s, Slot::Open(c) if c.has_consumers()));
        if consumes {
            for q in pressured {
                q.stall(Duration::from_millis(limits::PUBLISH_STALL_MS))
                    .await;
            }
        } else {
            self.starved = pressured;
            self.starved.retain(|q| q.pressured());
        }
    }

    /// When the timer next fires: the handshake or close deadline, or the next heartbeat check.
    /// Stored rather than recomputed per loop turn, so steady reads cannot postpone it forever.
    fn next_tick(&mut self) -> Instant {
        match self.phase {
            Phase::Open => {
                if self.heartbeat_tick.is_none() {
                    let period = if self.heartbeat_s > 0 {
                        Duration::from_millis(self.heartbeat_s as u64 * 500)
                    } else {
                        Duration::from_secs(3600)
                    };
                    self.heartbeat_tick = Some(Instant::now() + period);
                }
                let hb = self.heartbeat_tick.unwrap_or(self.deadline);
                self.timeout_tick.map_or(hb, |t| t.min(hb))
            }
            _ => self.deadline,
        }
    }

    fn tick(&mut self) {
        let now = Instant::now();
        match self.phase {
            Phase::Open => {
                if self.timeout_tick.is_some_and(|t| now >= t) {
                    self.expire_deliveries();
                }
                if self.heartbeat_tick.is_some_and(|t| now < t) {
                    return;
                }
                self.heartbeat_tick = None;
                if self.heartbeat_s == 0 {
                    return;
                }
                let hb = Duration::from_secs(self.heartbeat_s as u64);
                if self.blocked || self.backlog || !self.starved.is_empty() {
                    // We are not reading: the client's silence is ours (RabbitMQ does the same).
                    self.last_read = now;
                }
                if now.duration_since(self.last_read) > hb * 2 {
                    self.reason = format!(
                        "missed heartbeats from client, timeout: {}s",
                        self.heartbeat_s
                    );
                    self.phase = Phase::Done;
                    return;
                }
                let writes = self.outbox.writes.load(Ordering::Relaxed);
                if writes == self.last_writes {
                    self.outbox.push(warren_protocol::frame::write_heartbeat);
                }
                self.last_writes = writes;
            }
            Phase::Done => {}
            Phase::CloseSent | Phase::Draining => {
                if now >= self.deadline {
                    self.phase = Phase::Done;
                }
            }
            Phase::AuthDelay => {
                if now >= self.deadline {
                    match self.auth_refusal.take() {
                        Some(e) => {
                            let reason = std::mem::take(&mut self.reason);
                            self.close_connection(e);
                            self.reason = reason;
                            self.deadline = now + Duration::from_secs(1);
                        }
                        None => self.phase = Phase::Done,
                    }
                }
            }
            _ => {
                if now >= self.deadline {
                    self.reason = "handshake timeout".into();
                    self.phase = Phase::Done;
                }
            }
        }
    }

    /// Handles every whole frame in `buf`, then flushes confirms. Returns the queues that asked
    /// this connection's publishers to slow down.
    fn process(&mut self, buf: &mut BytesMut) -> Vec<QueueRef> {
        let mut pressured = Vec::new();
        crate::outbox::begin_batch();
        if self.discard_input {
            buf.clear();
        }
        while self.phase != Phase::Done && !self.discard_input {
            if self.outbox.pending() >= limits::OUTBOX_READ_PAUSE_BYTES {
                // The client is not reading its replies: hold its requests until it does.
                self.backlog = true;
                break;
            }
            match self.decoder.decode(buf) {
                Ok(Some(frame)) => {
                    if let Err(e) = self.handle_frame(frame) {
                        self.close_connection(e);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // The stream is out of step: answer, stop decoding, and keep the socket
                    // open for the close-ok wait (RabbitMQ holds it 3 s) so the client reads
                    // the close rather than a reset.
                    let code = match e {
                        DecodeError::BadFrameEnd(_) | DecodeError::FrameTooLarge { .. } => {
                            reply::FRAME_ERROR
                        }
                        _ => reply::SYNTAX_ERROR,
                    };
                    match self.phase {
                        // Before tune-ok RabbitMQ answers nothing: it waits, then closes.
                        Phase::AwaitStartOk | Phase::AwaitTuneOk => {
                            tracing::info!(peer = %self.peer, conn = self.id, error = %e, "closing connection on a framing error during the handshake");
                            self.reason = e.to_string();
                            self.phase = Phase::CloseSent;
                            self.deadline =
                                Instant::now() + Duration::from_millis(limits::CLOSE_OK_TIMEOUT_MS);
                        }
                        Phase::Open | Phase::AwaitOpen => {
                            self.close_connection(AmqpError::new(code, e))
                        }
                        _ => {}
                    }
                    self.discard_input = true;
                    buf.clear();
                }
            }
        }
        if let Some(i) = &self.info {
            i.set_channels(self.channels.len());
        }
        for id in std::mem::take(&mut self.dirty) {
            if let Some(Slot::Open(ch)) = self.channels.get_mut(&id) {
                ch.flush_confirms();
                pressured.append(&mut ch.pressured);
            }
        }
        crate::outbox::end_batch();
        pressured
    }

    fn drain(&mut self) {
        self.phase = Phase::Draining;
        self.deadline = Instant::now() + Duration::from_millis(limits::CLOSE_OK_TIMEOUT_MS);
    }

    /// Sends connection.close and waits for close-ok.
    fn close_connection(&mut self, e: AmqpError) {
        if matches!(self.phase, Phase::CloseSent | Phase::Done | Phase::Draining) {
            return;
        }
        tracing::info!(peer = %self.peer, conn = self.id, code = e.code, text = %e.text, "closing connection on error");
        self.reason = e.text.clone();
        self.outbox.method(
            0,
            &Method::ConnectionClose(ConnectionClose {
                reply_code: e.code,
                reply_text: e.text.into(),
                class_id: e.class_id,
                method_id: e.method_id,
            }),
        );
        self.phase = Phase::CloseSent;
        self.deadline = Instant::now() + Duration::from_millis(limits::CLOSE_OK_TIMEOUT_MS);
    }

    fn decode_method(frame: &Frame) -> Result<Method, AmqpError> {
        let p = &frame.payload;
        if p.len() < 4 {
            return Err(AmqpError::frame_error(format!(
                "type 1, all octets = {}: unknown_frame",
                erlang_binary(p)
            )));
        }
        Method::decode(p).map_err(|e| {
            let (c, m) = (
                u16::from_be_bytes([p[0], p[1]]),
                u16::from_be_bytes([p[2], p[3]]),
            );
            match e {
                // RabbitMQ drops the TCP connection here without a word; a clear close is kinder.
                DecodeError::UnknownMethod { .. } => {
                    AmqpError::not_implemented(format!("unknown method {c}/{m}")).on(c, m)
                }
                _ => AmqpError::frame_error(format!("cannot decode {}", erlang_binary(&p[4..])))
                    .on(c, m),
            }
        })
    }

    /// RabbitMQ's answer to a frame whose type makes no sense where it arrived.
    fn odd_frame(code: u16, frame: &Frame) -> AmqpError {
        let t = match frame.kind {
            FrameKind::Method => 1,
            FrameKind::Header => 2,
            FrameKind::Body => 3,
            FrameKind::Heartbeat => 8,
            FrameKind::Other(t) => t,
        };
        let p = &frame.payload;
        let octets = if p.len() > 16 {
            format!("first 16 octets = {}", erlang_binary(&p[..16]))
        } else {
            format!("all octets = {}", erlang_binary(p))
        };
        let suffix = if code == reply::FRAME_ERROR {
            ": unknown_frame"
        } else {
            ""
        };
        AmqpError::new(code, format!("type {t}, {octets}{suffix}"))
    }

    fn handle_frame(&mut self, frame: Frame) -> Result<(), AmqpError> {
        let malformed = match frame.kind {
            FrameKind::Other(_) => true,
            FrameKind::Heartbeat => !frame.payload.is_empty(),
            _ => false,
        };
        if malformed && !matches!(self.phase, Phase::CloseSent | Phase::Draining) {
            return Err(Self::odd_frame(reply::FRAME_ERROR, &frame));
        }
        match self.phase {
            Phase::Open => self.handle_open_frame(frame),
            Phase::CloseSent => {
                if frame.channel == 0 && frame.kind == FrameKind::Method {
                    match Method::decode(&frame.payload) {
                        Ok(Method::ConnectionCloseOk(_)) => self.phase = Phase::Done,
                        Ok(Method::ConnectionClose(_)) => {
                            self.outbox
                                .method(0, &Method::ConnectionCloseOk(ConnectionCloseOk {}));
                            self.phase = Phase::Done;
                        }
                        _ => {}
                    }
                }
                Ok(())
            }
            // Whatever a refused client sends while it waits is ignored.
            Phase::Done | Phase::Draining | Phase::AuthDelay => Ok(()),
            _ => self.handle_handshake_frame(frame),
        }
    }

    fn handle_handshake_frame(&mut self, frame: Frame) -> Result<(), AmqpError> {
        if frame.kind == FrameKind::Heartbeat {
            return Ok(());
        }
        if frame.kind != FrameKind::Method || frame.channel != 0 {
            return Err(AmqpError::unexpected_frame(
                "expected a connection method on channel 0 during the handshake",
            ));
        }
        let m = Self::decode_method(&frame)?;
        match (self.phase, m) {
            (Phase::AwaitStartOk, Method::ConnectionStartOk(s)) => self.start_ok(s),
            (Phase::AwaitTuneOk, Method::ConnectionTuneOk(t)) => self.tune_ok(t),
            (Phase::AwaitOpen, Method::ConnectionOpen(o)) => {
                let Some(vhost) = self.broker.vhost(&o.virtual_host) else {
                    return Err(AmqpError::not_allowed(format!(
                        "vhost {} not found",
                        o.virtual_host
                    ))
                    .on(10, 40));
                };
                let user = self
                    .user
                    .as_ref()
                    .map(|u| u.name.clone())
                    .unwrap_or_default();
                if !self.broker.access.can_open(&user, &o.virtual_host) {
                    return Err(AmqpError::not_allowed(format!(
                        "access to vhost '{}' refused for user '{user}'",
                        o.virtual_host
                    ))
                    .on(10, 40));
                }
                self.place = Some(
                    self.broker
                        .admission
                        .admit(&user, &o.virtual_host)
                        .map_err(|e| e.on(10, 40))?,
                );
                self.register(user, o.virtual_host.to_string());
                self.vhost = Some(vhost);
                self.outbox.method(
                    0,
                    &Method::ConnectionOpenOk(ConnectionOpenOk {
                        reserved_1: "".into(),
                    }),
                );
                self.phase = Phase::Open;
                let user = self.user.as_ref().map(|u| u.name.as_str()).unwrap_or("");
                tracing::info!(peer = %self.peer, conn = self.id, user, vhost = %o.virtual_host, "connection opened");
                Ok(())
            }
            (_, Method::ConnectionClose(_)) => {
                self.outbox
                    .method(0, &Method::ConnectionCloseOk(ConnectionCloseOk {}));
                self.reason = "client closed during handshake".into();
                self.drain();
                Ok(())
            }
            (_, m) => Err(AmqpError::command_invalid(format!(
                "unexpected {} during the handshake",
                m.name()
            ))
            .on(m.class_id(), m.method_id())),
        }
    }

    /// Before connection.open-ok RabbitMQ drops the socket rather than sending connection.close
    /// (the spec's rule for handshake failures); we do the same and log why.
    fn drop_in_handshake(&mut self, why: String) -> Result<(), AmqpError> {
        tracing::warn!(peer = %self.peer, conn = self.id, reason = %why, "handshake failed");
        self.reason = why;
        self.phase = Phase::Done;
        Ok(())
    }

    fn start_ok(&mut self, s: ConnectionStartOk) -> Result<(), AmqpError> {
        self.client_properties = s.client_properties.clone();
        if let Some(FieldValue::Table(caps)) = s.client_properties.get("capabilities") {
            self.auth_failure_close =
                caps.get("authentication_failure_close") == Some(&FieldValue::Bool(true));
            self.blocked_capability =
                caps.get("connection.blocked") == Some(&FieldValue::Bool(true));
            self.cancel_notify =
                caps.get("consumer_cancel_notify") == Some(&FieldValue::Bool(true));
        }
        match self
            .broker
            .users
            .authenticate(&s.mechanism, &s.response, self.peer.ip())
        {
            Ok(user) => {
                self.user = Some(user);
                let l = &self.broker.config.limits;
                self.outbox.method(
                    0,
                    &Method::ConnectionTune(ConnectionTune {
                        channel_max: l.channel_max,
                        frame_max: l.frame_max,
                        heartbeat: l.heartbeat_s,
                    }),
                );
                self.phase = Phase::AwaitTuneOk;
                Ok(())
            }
            Err(AuthError::UnknownMechanism) => self.drop_in_handshake(format!(
                "unknown authentication mechanism '{}'",
                s.mechanism
            )),
            Err(e) => {
                let (user, why) = match e {
                    AuthError::BadCredentials { user } => (user, "invalid credentials".to_string()),
                    AuthError::LoopbackOnly { user } => (
                        user.clone(),
                        format!("user '{user}' can only connect via localhost"),
                    ),
                    _ => (String::new(), "malformed SASL response".to_string()),
                };
                tracing::warn!(peer = %self.peer, user = %user, mechanism = %s.mechanism, why = %why, "authentication failed");
                self.reason = format!("authentication failed: {why}");
                if self.auth_failure_close {
                    let text = match &why[..] {
                        w if w.contains("localhost") => format!("User '{user}' can only connect via localhost"),
                        _ => format!("Login was refused using authentication mechanism {}. For details see the broker logfile.", s.mechanism),
                    };
                    self.auth_refusal = Some(AmqpError::access_refused(text));
                }
                // Answer only after a delay (this task's timer: other connections go on), so
                // each guess costs the guesser time.
                self.phase = Phase::AuthDelay;
                self.deadline = Instant::now()
                    + Duration::from_millis(self.broker.config.limits.auth_failure_delay_ms);
                Ok(())
            }
        }
    }

    fn tune_ok(&mut self, t: ConnectionTuneOk) -> Result<(), AmqpError> {
        match self.negotiate(&t) {
            Ok(()) => Ok(()),
            Err(why) => self.drop_in_handshake(why),
        }
    }

    fn negotiate(&mut self, t: &ConnectionTuneOk) -> Result<(), String> {
        let l = &self.broker.config.limits;
        let fail = |field: &str, v: u64, detail: &str, lower: bool, bound: u64| {
            let (s1, s2) = if lower {
                ("lower", "minimum")
            } else {
                ("higher", "maximum")
            };
            Err(format!("failed to negotiate connection parameters: negotiated {field} = {v}{detail} is {s1} than the {s2} allowed value ({bound})"))
        };
        let frame_min = warren_protocol::frame::FRAME_MIN_SIZE;
        if t.frame_max != 0 && t.frame_max < frame_min {
            return fail("frame_max", t.frame_max as u64, "", true, frame_min as u64);
        }
        if l.frame_max != 0 && (t.frame_max == 0 || t.frame_max > l.frame_max) {
            return fail(
                "frame_max",
                t.frame_max as u64,
                if t.frame_max == 0 { " (no limit)" } else { "" },
                false,
                l.frame_max as u64,
            );
        }
        if l.channel_max != 0 && (t.channel_max == 0 || t.channel_max > l.channel_max) {
            return fail(
                "channel_max",
                t.channel_max as u64,
                if t.channel_max == 0 {
                    " (no limit)"
                } else {
                    ""
                },
                false,
                l.channel_max as u64,
            );
        }
        self.decoder.frame_max = t.frame_max;
        self.outbox.frame_max.store(t.frame_max, Ordering::Relaxed);
        self.channel_max = if t.channel_max == 0 {
            u16::MAX
        } else {
            t.channel_max
        };
        self.heartbeat_s = t.heartbeat;
        self.phase = Phase::AwaitOpen;
        Ok(())
    }

    fn handle_open_frame(&mut self, frame: Frame) -> Result<(), AmqpError> {
        let id = frame.channel;
        if id == 0 {
            return match frame.kind {
                FrameKind::Heartbeat => Ok(()),
                FrameKind::Method => match Self::decode_method(&frame)? {
                    Method::ConnectionClose(_) => {
                        self.outbox
                            .method(0, &Method::ConnectionCloseOk(ConnectionCloseOk {}));
                        self.reason = "client closed connection".into();
                        self.drain();
                        Ok(())
                    }
                    Method::ConnectionUpdateSecret(_) => {
                        self.outbox.method(
                            0,
                            &Method::ConnectionUpdateSecretOk(ConnectionUpdateSecretOk {}),
                        );
                        Ok(())
                    }
                    Method::ConnectionBlocked(_) | Method::ConnectionUnblocked(_) => Ok(()),
                    m => Err(AmqpError::channel_error(
                        "unexpected method in connection state running",
                    )
                    .on(m.class_id(), m.method_id())),
                },
                _ => Err(Self::odd_frame(reply::UNEXPECTED_FRAME, &frame)),
            };
        }
        if frame.kind == FrameKind::Heartbeat {
            return Err(Self::odd_frame(reply::UNEXPECTED_FRAME, &frame));
        }
        match self.channels.get_mut(&id) {
            None => {
                if frame.kind != FrameKind::Method {
                    return Err(AmqpError::channel_error("expected 'channel.open'"));
                }
                match Self::decode_method(&frame)? {
                    Method::ChannelOpen(_) => {
                        if self.channels.len() >= self.channel_max as usize {
                            let n = self.channels.len();
                            // RabbitMQ raises this with no method: class and method 0.
                            return Err(AmqpError::not_allowed(format!("number of channels opened ({n}) has reached the negotiated channel_max ({})", self.channel_max)));
                        }
                        let user = self.user.as_ref().map_or("", |u| u.name.as_str());
                        let place = self.broker.admission.open_channel(user)?;
                        let mut ch = Channel::new(id, self.outbox.clone());
                        ch.place = Some(place);
                        ch.default_consumer_timeout = self.broker.config.consumer_timeout;
                        ch.shared
                            .set_unacked_max(self.broker.config.limits.unacked_max_per_channel);
                        if let Some(i) = &self.info {
                            i.channel_opened(ch.shared.clone());
                        }
                        if let Some(v) = &self.vhost {
                            v.churn.channel_created.fetch_add(1, Ordering::Relaxed);
                        }
                        self.channels.insert(id, Slot::Open(Box::new(ch)));
                        self.outbox.method(
                            id,
                            &Method::ChannelOpenOk(ChannelOpenOk {
                                reserved_1: Bytes::new(),
                            }),
                        );
                        Ok(())
                    }
                    m => Err(AmqpError::channel_error("expected 'channel.open'")
                        .on(m.class_id(), m.method_id())),
                }
            }
            Some(Slot::Closing) => {
                if frame.kind == FrameKind::Method {
                    match Method::decode(&frame.payload) {
                        Ok(Method::ChannelCloseOk(_)) => {
                            self.channels.remove(&id);
                        }
                        Ok(Method::ChannelClose(_)) => {
                            self.outbox
                                .method(id, &Method::ChannelCloseOk(ChannelCloseOk {}));
                        }
                        _ => {}
                    }
                }
                Ok(())
            }
            Some(Slot::Open(_)) => self.handle_channel_frame(id, frame),
        }
    }

    fn handle_channel_frame(&mut self, id: u16, frame: Frame) -> Result<(), AmqpError> {
        if frame.kind == FrameKind::Method && frame.payload.starts_with(&[0, 60, 0, 40]) {
            self.publisher = true;
        }
        // basic.consume or basic.get: manual-ack deliveries may follow, whose age is checked.
        if self.timeout_tick.is_none()
            && frame.kind == FrameKind::Method
            && (frame.payload.starts_with(&[0, 60, 0, 20])
                || frame.payload.starts_with(&[0, 60, 0, 70]))
        {
            self.timeout_tick =
                Some(Instant::now() + Duration::from_millis(limits::CONSUMER_TIMEOUT_CHECK_MS));
        }
        let Some(vhost) = self.vhost.as_ref() else {
            return Err(AmqpError::internal_error("no vhost"));
        };
        let user = self.user.as_ref().map_or("", |u| u.name.as_str());
        let impersonator = self.user.as_ref().is_some_and(|u| u.impersonator);
        let max_size = self.broker.config.limits.message_size_max_bytes;
        let mut ctx = Ctx {
            conn_id: self.id,
            user,
            impersonator,
            vhost,
            access: &self.broker.access,
            message_size_max_bytes: max_size,
            exclusive_queues: &mut self.exclusive_queues,
        };
        let Some(Slot::Open(ch)) = self.channels.get_mut(&id) else {
            return Ok(());
        };
        let result = match frame.kind {
            FrameKind::Method => {
                let m = Self::decode_method(&frame)?;
                if let Some(e) = ch.out_of_order("method") {
                    return Err(e.on(m.class_id(), m.method_id()));
                }
                match m {
                    Method::ChannelClose(_) => {
                        ch.close(vhost);
                        self.channels.remove(&id);
                        self.outbox
                            .method(id, &Method::ChannelCloseOk(ChannelCloseOk {}));
                        return Ok(());
                    }
                    Method::ChannelCloseOk(_) => return Ok(()),
                    Method::ChannelOpen(_) => {
                        return Err(
                            AmqpError::channel_error("second 'channel.open' seen").on(20, 10)
                        )
                    }
                    m if m.class_id() == 10 => {
                        return Err(AmqpError::command_invalid("unimplemented method")
                            .on(m.class_id(), m.method_id()))
                    }
                    m => ch.handle_method(m, &mut ctx),
                }
            }
            FrameKind::Header => match ch.handle_header(&frame.payload, max_size) {
                Ok(Some((p, h, body))) => ch.publish(p, h, body, &ctx),
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            },
            FrameKind::Body => match ch.handle_body(frame.payload) {
                Ok(Some((p, h, body))) => ch.publish(p, h, body, &ctx),
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            },
            FrameKind::Heartbeat | FrameKind::Other(_) => {
                Err(Self::odd_frame(reply::UNEXPECTED_FRAME, &frame))
            }
        };
        if !self.dirty.contains(&id) {
            self.dirty.push(id);
        }
        match result {
            Ok(()) => Ok(()),
            Err(e) if e.is_hard() => Err(e),
            Err(e) => {
                tracing::debug!(conn = self.id, channel = id, code = e.code, text = %e.text, "closing channel on error");
                self.close_channel(id, e);
                Ok(())
            }
        }
    }

    /// Closes channel `id` on a soft error: releases it and sends channel.close; frames other
    /// than close/close-ok are dropped until the client's close-ok.
    fn close_channel(&mut self, id: u16, e: AmqpError) {
        if let Some(Slot::Open(mut ch)) = self.channels.insert(id, Slot::Closing) {
            ch.flush_confirms();
            if let Some(vhost) = &self.vhost {
                ch.close(vhost);
            }
        }
        self.outbox.method(
            id,
            &Method::ChannelClose(ChannelClose {
                reply_code: e.code,
                reply_text: e.text.into(),
                class_id: e.class_id,
                method_id: e.method_id,
            }),
        );
    }

    /// The consumer timeout's check of every channel (docs/consumer-timeout.md). Runs again at
    /// the earliest deadline ahead, at most `CONSUMER_TIMEOUT_CHECK_MS` later, while a channel
    /// may hold manual-ack deliveries; the next basic.consume or basic.get re-arms it.
    fn expire_deliveries(&mut self) {
        let Some(vhost) = self.vhost.clone() else {
            self.timeout_tick = None;
            return;
        };
        let now = crate::consumer_timeout::now_ms();
        let (mut next, mut armed, mut failed) = (None::<u64>, false, Vec::new());
        crate::outbox::begin_batch();
        for (&id, slot) in self.channels.iter_mut() {
            let Slot::Open(ch) = slot else { continue };
            match ch.expire_deliveries(now, self.cancel_notify, self.id, &vhost) {
                Ok(Some(d)) => next = Some(next.map_or(d, |n| n.min(d))),
                Ok(None) => {}
                Err(e) => {
                    failed.push((id, e));
                    continue;
                }
            }
            armed |= ch.awaits_acks();
        }
        for (id, e) in failed {
            self.close_channel(id, e);
        }
        crate::outbox::end_batch();
        let period = limits::CONSUMER_TIMEOUT_CHECK_MS;
        let wait = next.map_or(period, |d| d.saturating_sub(now).clamp(10, period));
        self.timeout_tick = armed.then(|| Instant::now() + Duration::from_millis(wait));
    }

    /// Enters the broker's connection registry (management API, forced closes).
    fn register(&mut self, user: String, vhost: String) {
        let local = self.local.unwrap_or(self.peer);
        let info = Arc::new(crate::tracking::ConnInfo::new(
            self.broker.config.node_name.as_str().into(),
            self.outbox.clone(),
            self.id,
            (self.peer, local),
            user,
            vhost,
            &self.client_properties,
        ));
        info.frame_max
            .store(self.decoder.frame_max as u64, Ordering::Relaxed);
        info.heartbeat_s
            .store(self.heartbeat_s as u32, Ordering::Relaxed);
        self.broker.connections.lock().insert(self.id, info.clone());
        self.broker
            .churn
            .connection_created
            .fetch_add(1, Ordering::Relaxed);
        self.info = Some(info);
    }

    /// Releases channels and exclusive queues, then leaves the registry: once the management
    /// API no longer lists a connection, its channels no longer count against any limit.
    fn cleanup(&mut self) {
        if let Some(vhost) = self.vhost.clone() {
            for (_, slot) in self.channels.drain() {
                if let Slot::Open(mut ch) = slot {
                    ch.close(&vhost);
                }
            }
            for q in std::mem::take(&mut self.exclusive_queues) {
                if let Ok(d) = vhost.delete_queue(q.name(), false, false, None) {
                    notify_cancelled(&d.consumers);
                }
            }
        }
        if self.info.take().is_some() {
            self.broker.connections.lock().remove(&self.id);
            self.broker
                .churn
                .connection_closed
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Bytes as Erlang prints a binary, which is how RabbitMQ quotes frames in its error texts.
fn erlang_binary(b: &[u8]) -> String {
    if !b.is_empty() && b.iter().all(|&c| (0x20..0x7f).contains(&c)) {
        let s: String = b.iter().map(|&c| c as char).collect();
        return format!("<<\"{}\">>", s.replace('\\', "\\\\").replace('"', "\\\""));
    }
    let parts: Vec<String> = b.iter().map(|c| c.to_string()).collect();
    format!("<<{}>>", parts.join(","))
}

#[cfg(test)]
mod tests {
    #[test]
    fn erlang_binary_format() {
        assert_eq!(super::erlang_binary(b"abc"), "<<\"abc\">>");
        assert_eq!(super::erlang_binary(&[0, 50]), "<<0,50>>");
        assert_eq!(super::erlang_binary(b""), "<<>>");
    }
}
