//! Channel multiplexing: channel.open (channel_max, the user's channel limit), frames of an
//! open channel handed to its [`Channel`] (methods, then content header and body frames of a
//! publish), soft errors that close one channel, and the close handshake of a closing one.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use warren_protocol::method::{
    ChannelClose, ChannelCloseOk, ChannelOpenOk, ConnectionCloseOk, ConnectionUpdateSecretOk,
};
use warren_protocol::{reply, Frame, FrameKind, Method};

use super::{Conn, Slot};
use crate::channel::{Channel, Ctx};
use crate::error::AmqpError;
use crate::limits;

impl Conn {
    pub(super) fn handle_open_frame(&mut self, frame: Frame) -> Result<(), AmqpError> {
        let id = frame.channel;
        if id == 0 {
            return match frame.kind {
                FrameKind::Heartbeat => Ok(()),
                FrameKind::Method => match Self::decode_method(&frame)? {
                    Method::ConnectionClose(_) => {
                        // Released first: the close-ok promises the next connection finds the
                        // exclusive queues gone and the unacked deliveries back.
                        self.release();
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
    pub(super) fn close_channel(&mut self, id: u16, e: AmqpError) {
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
}
