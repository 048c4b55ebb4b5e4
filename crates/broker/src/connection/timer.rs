//! The connection's one timer: the handshake, auth-delay and close-ok deadlines, heartbeats
//! (sent when idle for half the interval, a peer silent for two is dropped) and the consumer
//! timeout's check of every channel.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{Conn, Phase, Slot};
use crate::limits;

impl Conn {
    /// When the timer next fires: the handshake or close deadline, or the next heartbeat check.
    /// Stored rather than recomputed per loop turn, so steady reads cannot postpone it forever.
    pub(super) fn next_tick(&mut self) -> Instant {
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

    pub(super) fn tick(&mut self) {
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
}
