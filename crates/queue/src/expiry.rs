//! Expiry: messages past their deadline leave from the head of each level (as RabbitMQ's
//! classic queues drop them, never from behind a live one), dead-lettered as expired; and the
//! queue's own lease (`x-expires`), renewed by each use.

use crate::host::forget;
use crate::{Effect, Host, Payload, Reason, State};

impl<C, M: Payload> State<C, M> {
    /// Drops (dead-letters) messages whose deadline passed, from the head of each level only, as
    /// RabbitMQ does.
    pub fn expire(&mut self, now: u64, host: &mut impl Host<C, M>) {
        for i in 0..self.ready.len() {
            loop {
                if i == 0 {
                    self.fill(host);
                }
                let mut expired = false;
                while self.ready[i]
                    .front()
                    .is_some_and(|m| m.expires_at_ms.is_some_and(|t| t <= now))
                {
                    if let Some(m) = self.ready[i].pop_front() {
                        self.ready_bytes -= m.msg.body_len();
                        self.ready_len -= 1;
                        forget(&m, host);
                        host.effect(Effect::DeadLetter(m.msg, Reason::Expired));
                        expired = true;
                    }
                }
                // The whole head expired: the paged-out messages behind it may have too.
                if !(expired && self.ready[i].is_empty() && self.tail.is_some()) {
                    break;
                }
            }
        }
    }

    /// Marks the queue used now (a redeclare), for `x-expires`.
    pub fn touch(&mut self, now: u64) {
        self.last_used_ms = now;
    }

    /// An `x-expires` queue of lease `expires_ms` unused for that long: no consumers, no use.
    pub fn lease_expired(&self, expires_ms: u64, now: u64) -> bool {
        self.consumers.is_empty()
            && !self.deleted
            && now.saturating_sub(self.last_used_ms) >= expires_ms
    }
}
