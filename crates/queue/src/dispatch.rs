//! Consumers and delivery: adding and removing consumers, offering ready messages to those
//! with credit (priority groups, round-robin inside each, single active consumer), basic.get,
//! and the settles (ack, reject, requeue, dead-letter) that give credit back. Invariant: a
//! consumer is offered a message only while it has credit, and an accepted offer is the
//! delivery, so nothing delivered is ever taken back.

use crate::host::forget;
use crate::{
    ConsumeRefused, Consumer, Effect, Entry, Host, Offer, Payload, Reason, Settled, State,
};

impl<C, M: Payload> State<C, M> {
    /// Offers ready messages to the consumers that can take them.
    pub fn dispatch(&mut self, host: &mut impl Host<C, M>) {
        let expiring = if self.ready_len > 0 && self.may_expire {
            let now = host.now();
            self.expire(now, host);
            Some(now)
        } else {
            None
        };
        self.deliver(expiring, host);
    }

    /// The dispatch loop. With `expiring`, deadlines are checked against it each time a message
    /// leaves: classic queues expire from the head only, so a message that expired behind a live
    /// one is dropped when it becomes the head, never delivered. `None` (no message here has a
    /// deadline) keeps the loop free of deadline work.
    pub(crate) fn deliver(&mut self, expiring: Option<u64>, host: &mut impl Host<C, M>) {
        'messages: while self.ready_len > 0 && !self.consumers.is_empty() {
            self.fill(host);
            let n = if self.config.single_active_consumer {
                1
            } else {
                self.consumers.len()
            };
            let mut start = 0;
            // Priority groups, highest first; round-robin inside a group.
            while start < n {
                let p = self.consumers[start].priority;
                let end = self.consumers[start..n]
                    .iter()
                    .position(|c| c.priority != p)
                    .map_or(n, |i| start + i);
                let len = end - start;
                for k in 0..len {
                    let idx = start + (self.rr + k) % len;
                    let Some(front) = self.ready.iter().rev().find_map(|l| l.front()) else {
                        break 'messages;
                    };
                    let c = &mut self.consumers[idx];
                    if c.has_credit() && host.offer(&c.handle, front) == Offer::Taken {
                        let no_ack = c.no_ack;
                        if !no_ack {
                            c.outstanding += 1;
                        }
                        if let Some(m) = self.ready.iter_mut().rev().find_map(|l| l.pop_front()) {
                            self.ready_bytes -= m.msg.body_len();
                            self.ready_len -= 1;
                            if no_ack {
                                forget(&m, host);
                            } else {
                                self.unacked += 1;
                            }
                        }
                        if let Some(now) = expiring {
                            self.expire(now, host);
                        }
                        self.rr = self.rr.wrapping_add(k + 1);
                        continue 'messages;
                    }
                }
                start = end;
            }
            break;
        }
    }

    /// basic.get: takes the head message; `ack` counts it as unacked. Returns it with the number
    /// of messages left.
    pub fn get(&mut self, ack: bool, host: &mut impl Host<C, M>) -> Option<(Entry<M>, u32)> {
        let now = host.now();
        self.last_used_ms = now;
        self.expire(now, host);
        let m = self.pop_ready(host)?;
        // RabbitMQ drops what expired behind the head as soon as it is the head, before the
        // count in get-ok is taken.
        if self.may_expire {
            self.expire(now, host);
        }
        if ack {
            self.unacked += 1;
        } else {
            forget(&m, host);
        }
        Some((m, self.ready_len as u32))
    }

    /// Acked. With `dispatch`, dispatches; a channel under a channel-wide limit passes false and
    /// dispatches all its queues itself, in a fair order.
    pub fn settle(
        &mut self,
        entries: impl IntoIterator<Item = Settled<M>>,
        dispatch: bool,
        host: &mut impl Host<C, M>,
    ) {
        self.leave(entries, None, dispatch, host)
    }

    /// Rejected without requeue: settled, and dead-lettered. `dispatch` as for `settle`.
    pub fn discard(
        &mut self,
        entries: impl IntoIterator<Item = Settled<M>>,
        dispatch: bool,
        host: &mut impl Host<C, M>,
    ) {
        self.leave(entries, Some(Reason::Rejected), dispatch, host)
    }

    /// Unacked deliveries leave for good, dead-lettered for `reason` (a host that counts
    /// returns drops those past their delivery limit this way).
    pub fn dead_letter(
        &mut self,
        entries: impl IntoIterator<Item = Settled<M>>,
        reason: Reason,
        host: &mut impl Host<C, M>,
    ) {
        self.leave(entries, Some(reason), true, host)
    }

    /// Settled deliveries leave for good, dead-lettered with `dead` if given.
    fn leave(
        &mut self,
        entries: impl IntoIterator<Item = Settled<M>>,
        dead: Option<Reason>,
        dispatch: bool,
        host: &mut impl Host<C, M>,
    ) {
        for (consumer, m) in entries {
            self.settled(consumer);
            forget(&m, host);
            if let Some(reason) = dead {
                host.effect(Effect::DeadLetter(m.msg, reason));
            }
        }
        if dispatch {
            self.dispatch(host);
        }
    }

    /// Puts unacked messages back at their original positions, marked redelivered. A queue this
    /// takes past x-max-length(-bytes) drops from the head under drop-head, as RabbitMQ's requeue
    /// does; the reject overflow modes refuse publishes only, so it stays over.
    pub fn requeue(
        &mut self,
        entries: impl IntoIterator<Item = Settled<M>>,
        host: &mut impl Host<C, M>,
    ) {
        if self.deleted {
            return;
        }
        for (consumer, mut m) in entries {
            self.settled(consumer);
            m.redelivered = true;
            let level = self.level(&m.msg);
            self.ready_bytes += m.msg.body_len();
            self.ready_len += 1;
            let lane = &mut self.ready[level];
            let pos = lane.partition_point(|r| r.seq < m.seq);
            lane.insert(pos, m);
        }
        let limits = self.limits;
        self.drop_head(&limits, host);
        self.dispatch(host);
    }

    /// One unacked delivery settled: its consumer, if still here, gets its credit back.
    #[inline]
    fn settled(&mut self, consumer: Option<u64>) {
        self.unacked = self.unacked.saturating_sub(1);
        if let Some(key) = consumer {
            if let Some(c) = self.consumers.iter_mut().find(|c| c.key == key) {
                c.outstanding = c.outstanding.saturating_sub(1);
            }
        }
    }

    /// Adds a consumer after its equals in priority. The host dispatches once it has told the
    /// client (consume-ok before any delivery).
    pub fn add_consumer(&mut self, mut c: Consumer<C>, now: u64) -> Result<(), ConsumeRefused> {
        c.outstanding = 0;
        if self.deleted {
            return Err(ConsumeRefused::Deleted);
        }
        if self.consumers.iter().any(|x| x.exclusive) || (c.exclusive && !self.consumers.is_empty())
        {
            return Err(ConsumeRefused::Exclusive);
        }
        let pos = self.consumers.partition_point(|x| x.priority >= c.priority);
        self.consumers.insert(pos, c);
        self.had_consumer = true;
        self.last_used_ms = now;
        Ok(())
    }

    /// Removes a consumer and dispatches (the next one may have become the active one). Also
    /// says whether an auto-delete queue should go now.
    pub fn remove_consumer(
        &mut self,
        key: u64,
        host: &mut impl Host<C, M>,
    ) -> (Option<Consumer<C>>, bool) {
        let removed = self
            .consumers
            .iter()
            .position(|c| c.key == key)
            .map(|i| self.consumers.remove(i));
        self.last_used_ms = host.now();
        self.dispatch(host);
        let auto_delete_now = self.config.auto_delete
            && self.had_consumer
            && self.consumers.is_empty()
            && !self.deleted;
        (removed, auto_delete_now)
    }
}
