//! The read loop: one `read_buf` per wake into a reused buffer, every whole frame in it handled
//! before confirms are flushed, each frame sent by the connection's phase (handshake, open,
//! closing). Reads pause for resource alarms, for a client that does not read its replies, and
//! for credit (queues whose consumers fall behind); framing errors get RabbitMQ's texts.

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::watch;
use tokio::time::Instant;
use warren_protocol::method::{ConnectionBlocked, ConnectionCloseOk, ConnectionUnblocked};
use warren_protocol::{reply, DecodeError, Frame, FrameKind, Method};

use super::{Conn, Phase, Slot};
use crate::error::AmqpError;
use crate::limits;
use crate::queue::QueueRef;

impl Conn {
    pub(super) async fn run<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
        shutdown: &mut watch::Receiver<bool>,
    ) {
        let mut buf = BytesMut::with_capacity(limits::READ_BUFFER_IDLE_BYTES);
        // The last read filled the buffer: the client sends in bulk, read in big pieces.
        let mut bulk = false;
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
                buf.reserve(if bulk {
                    limits::READ_BUFFER_BYTES
                } else {
                    limits::READ_BUFFER_IDLE_BYTES
                });
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
                        let filled = limited.get_ref().len() == limited.get_ref().capacity();
                        let pressured = self.process(limited.get_mut());
                        bulk = filled;
                        if !filled
                            && n < limits::READ_BUFFER_IDLE_BYTES
                            && buf.is_empty()
                            && buf.capacity() > limits::READ_BUFFER_IDLE_BYTES
                        {
                            // Little came and nothing waits: give the big buffer back.
                            buf = BytesMut::with_capacity(limits::READ_BUFFER_IDLE_BYTES);
                        }
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

    pub(super) fn decode_method(frame: &Frame) -> Result<Method, AmqpError> {
        let p = &frame.payload;
        if p.len() < 4 {
            return Err(AmqpError::frame_error(format!(
                "type 1, all octets = {}: unknown_frame",
                erlang_binary(p)
            )));
        }
        // Decoded in place, fields are slices of the read buffer: anything kept from them (a
        // consumer's tag, a queue's arguments, the client's properties) would pin that 4-64 KiB
        // buffer for as long as it lives, one per connection at least. So every method but the
        // per-message ones (publish, ack, nack, reject, get) is decoded from a copy of its few
        // octets.
        let copy;
        let p = if per_message(p) {
            p
        } else {
            copy = bytes::Bytes::copy_from_slice(p);
            &copy
        };
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
    pub(super) fn odd_frame(code: u16, frame: &Frame) -> AmqpError {
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
}

/// basic.publish, basic.ack, basic.nack, basic.reject and basic.get: the methods that come once
/// per message, decoded in place (no copy on the hot path; nothing of them outlives the frame
/// but a publish's exchange and routing key, which its message holds with its body anyway).
fn per_message(p: &[u8]) -> bool {
    p.len() >= 4 && p[..3] == [0, 60, 0] && matches!(p[3], 40 | 70 | 80 | 90 | 120)
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
    /// A kept field of a non-message method owns its octets; a publish's are slices of the
    /// read buffer.
    #[test]
    fn only_per_message_methods_are_decoded_in_place() {
        use bytes::{Bytes, BytesMut};
        use warren_protocol::method::{BasicConsume, BasicPublish};
        use warren_protocol::{Frame, FrameKind, Method};
        let within = |b: &[u8], buf: &Bytes| {
            let (p, s) = (b.as_ptr() as usize, buf.as_ptr() as usize);
            p >= s && p < s + buf.len()
        };
        for (m, kept_in_place) in [
            (
                Method::BasicConsume(BasicConsume {
                    reserved_1: 0,
                    queue: "a-queue-name".into(),
                    consumer_tag: "a-tag".into(),
                    no_local: false,
                    no_ack: false,
                    exclusive: false,
                    nowait: false,
                    arguments: Default::default(),
                }),
                false,
            ),
            (
                Method::BasicPublish(BasicPublish {
                    reserved_1: 0,
                    exchange: "".into(),
                    routing_key: "a-queue-name".into(),
                    mandatory: false,
                    immediate: false,
                }),
                true,
            ),
        ] {
            let mut b = BytesMut::new();
            m.encode_payload(&mut b);
            let buf = b.freeze();
            let frame = Frame {
                kind: FrameKind::Method,
                channel: 1,
                payload: buf.clone(),
            };
            let name = match super::Conn::decode_method(&frame).expect("decodes") {
                Method::BasicConsume(c) => c.queue,
                Method::BasicPublish(p) => p.routing_key,
                other => panic!("{other:?}"),
            };
            assert_eq!(&name[..], "a-queue-name");
            assert_eq!(within(name.as_bytes(), &buf), kept_in_place, "{m:?}");
        }
    }

    #[test]
    fn erlang_binary_format() {
        assert_eq!(super::erlang_binary(b"abc"), "<<\"abc\">>");
        assert_eq!(super::erlang_binary(&[0, 50]), "<<0,50>>");
        assert_eq!(super::erlang_binary(b""), "<<>>");
    }
}
