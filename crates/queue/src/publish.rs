//! Enqueueing: a publish gets its seq and its deadline (`x-message-ttl` or the message's
//! `expiration`, whichever is sooner), goes to memory or to the tail in the log, and the length
//! limits (`x-max-length`, `x-max-length-bytes`) are applied under the queue's `x-overflow` mode.

use crate::host::forget;
use crate::{Effect, Entry, Host, Limits, Overflow, Payload, Published, Reason, State, Tail};

impl<C, M: Payload> State<C, M> {
    /// Enqueues and dispatches, applying TTL and the length limits. `logged`: the host writes
    /// this message to its log (a persistent message in a durable queue), so it is handed over
    /// as [`Effect::Append`] and its leaving as [`Effect::Forget`].
    pub fn publish(&mut self, msg: M, logged: bool, host: &mut impl Host<C, M>) -> Published {
        self.publish_entry(msg, logged, false, true, host)
    }

    /// A message that was in the queue comes back at its tail (a retry after its back-off),
    /// marked redelivered. As a requeue, it is never refused by the reject overflow modes (the
    /// queue stays over); under drop-head the head makes room.
    pub fn requeue_at_tail(&mut self, msg: M, host: &mut impl Host<C, M>) -> Published {
        self.publish_entry(msg, false, true, false, host)
    }

    /// A message carried over from an earlier form of the queue (an upgrade): enqueued at the
    /// tail as it was, `redelivered` when it may have been delivered before; never refused by
    /// the queue's limits (it was in the queue already).
    pub fn import(&mut self, msg: M, redelivered: bool, host: &mut impl Host<C, M>) -> Published {
        self.publish_entry(msg, false, redelivered, false, host)
    }

    fn publish_entry(
        &mut self,
        msg: M,
        logged: bool,
        redelivered: bool,
        refuse_when_full: bool,
        host: &mut impl Host<C, M>,
    ) -> Published {
        if self.deleted {
            return Published::Gone;
        }
        let limits = self.limits;
        let size = msg.body_len();
        if refuse_when_full
            && limits.overflow != Overflow::DropHead
            && self.is_full(&limits, Some(size))
        {
            if limits.overflow == Overflow::RejectPublishDlx {
                host.effect(Effect::DeadLetter(msg, Reason::MaxLen));
            }
            return Published::Rejected;
        }
        let ttl = match (limits.message_ttl_ms, msg.expiration_ms()) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        let now = if ttl.is_some() { host.now() } else { 0 };
        let expires_at_ms = ttl.map(|t| now.saturating_add(t));
        self.may_expire |= expires_at_ms.is_some();
        let seq = self.next_seq;
        self.next_seq += 1;
        let level = self.level(&msg);
        let was_empty = self.ready_len == 0;
        self.ready_bytes += size;
        self.ready_len += 1;
        let page_out = self.tail.is_some()
            || (self.ready.len() == 1
                && (self.ready_len > self.config.page_out_msgs
                    || self.ready_bytes > self.config.page_out_bytes)
                && host.can_page());
        let entry = Entry {
            seq,
            msg,
            redelivered,
            expires_at_ms,
            logged: logged && !page_out,
        };
        if page_out {
            let tail = self.tail.get_or_insert_with(|| {
                host.effect(Effect::PageOut { from_seq: seq });
                Tail::default()
            });
            tail.count += 1;
            tail.bytes += size;
            host.effect(Effect::Append {
                entry: &entry,
                paged: true,
            });
        } else {
            let lane = &mut self.ready[level];
            lane.push_back(entry);
            if logged {
                if let Some(e) = lane.back() {
                    host.effect(Effect::Append {
                        entry: e,
                        paged: false,
                    });
                }
            }
        }
        if was_empty {
            // A message that finds the queue empty is offered before any deadline is checked, as
            // RabbitMQ does: a TTL 0 message reaches a consumer that can take it at once, and
            // expires just below otherwise.
            self.deliver(None, host);
        } else {
            self.dispatch(host);
        }
        if expires_at_ms.is_some() {
            self.expire(now, host);
        }
        if limits.overflow == Overflow::DropHead {
            self.drop_head(&limits, host);
        }
        Published::Accepted { seq }
    }

    /// Under drop-head, drops (dead-letters, reason maxlen) from the head until the queue is
    /// within its length limits.
    pub(crate) fn drop_head(&mut self, limits: &Limits, host: &mut impl Host<C, M>) {
        if limits.overflow != Overflow::DropHead {
            return;
        }
        while self.is_full(limits, None) {
            let Some(m) = self.pop_ready(host) else { break };
            forget(&m, host);
            host.effect(Effect::DeadLetter(m.msg, Reason::MaxLen));
        }
    }

    /// Over a limit once a message of `adding` bytes is added (`None`: already over). A
    /// message counts one whatever its size, as RabbitMQ's `will_overflow` counts it.
    fn is_full(&self, limits: &Limits, adding: Option<u64>) -> bool {
        let (extra, bytes) = adding.map_or((0, 0), |b| (1, b));
        limits
            .max_length
            .is_some_and(|m| self.ready_len as u64 + extra > m)
            || limits
                .max_length_bytes
                .is_some_and(|m| self.ready_bytes + bytes > m)
    }
}
