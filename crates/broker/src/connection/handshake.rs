//! The handshake: connection.start with the server's properties and capabilities, start-ok
//! (SASL PLAIN or AMQPLAIN, with RabbitMQ's delayed refusal), tune/tune-ok negotiation with
//! RabbitMQ's rules, and connection.open (vhost access, connection limits, the registry).
//! Failures before open-ok drop the socket, as RabbitMQ does.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use warren_protocol::method::{
    ConnectionCloseOk, ConnectionOpenOk, ConnectionStart, ConnectionStartOk, ConnectionTune,
    ConnectionTuneOk,
};
use warren_protocol::{FieldTable, FieldValue, Frame, FrameKind, Method};

use super::{Conn, Phase};
use crate::auth::AuthError;
use crate::error::AmqpError;

impl Conn {
    pub(super) fn send_start(&self) {
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
        props.insert("cluster_name", FieldValue::str(&self.broker.cluster_name()));
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

    pub(super) fn handle_handshake_frame(&mut self, frame: Frame) -> Result<(), AmqpError> {
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
                let counts = &self.broker.auth_attempts;
                counts.attempts.fetch_add(1, Ordering::Relaxed);
                counts.succeeded.fetch_add(1, Ordering::Relaxed);
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
                let counts = &self.broker.auth_attempts;
                counts.attempts.fetch_add(1, Ordering::Relaxed);
                counts.failed.fetch_add(1, Ordering::Relaxed);
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
            std::mem::take(&mut self.client_properties),
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
}
