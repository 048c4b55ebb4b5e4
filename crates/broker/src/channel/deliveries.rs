//! The unacked map from outside the message path: basic.get-ok deliveries, taking deliveries
//! back for an ack, nack, reject or rolled-back transaction, finishing them on their queues,
//! releasing them all when the channel closes, and the [`DeliverySink`] through which queues
//! deliver (its `offer` calls [`ChannelShared::offer`], in `mod.rs` with the rest of that path).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use warren_protocol::frame;
use warren_protocol::method::{BasicCancel, BasicGetOk};
use warren_protocol::Method;

use super::{
    remove_consumer, Channel, ChannelShared, Deliveries, Offer, PublishState, Settle, TxOp, Unacked,
};
use crate::consumer_timeout as timeout;
use crate::error::{AmqpError, AmqpResult};
use crate::flow::SpaceWaiter;
use crate::metrics::delivered;
use crate::outbox;
use crate::queue::{Consumer, DeliverySink, Queue, QueueRef, QueuedMessage};
use crate::vhost::VHost;

impl ChannelShared {
    /// Closed (by either side, or with its connection): no longer listed.
    pub fn is_closed(&self) -> bool {
        self.deliveries.lock().closed
    }

    /// Deliveries awaiting ack, and the basic.qos global=true limit (0 = none).
    pub fn unacked_and_global_prefetch(&self) -> (usize, u16) {
        let d = self.deliveries.lock();
        (d.unacked.len(), d.global_prefetch)
    }

    pub fn set_unacked_max(&self, max: u32) {
        self.deliveries.lock().unacked_max = max;
    }

    /// A limit shared by the channel's consumers is set (basic.qos global or the broker's
    /// cap): room it regains may go to any of the channel's queues.
    pub(super) fn capped(&self) -> bool {
        let d = self.deliveries.lock();
        d.global_prefetch > 0 || d.unacked_max > 0
    }

    /// basic.get-ok for `m` (called under the queue lock).
    pub(super) fn deliver_get(
        &self,
        q: &QueueRef,
        m: &QueuedMessage,
        remaining: u32,
        no_ack: bool,
    ) {
        let mut d = self.deliveries.lock();
        let st = &self.stats;
        delivered(
            &st.get,
            &st.get_no_ack,
            &st.redeliver,
            no_ack,
            m.redelivered,
        );
        let tag = d.next_tag;
        d.next_tag += 1;
        let frame_max = self.outbox.frame_max.load(Ordering::Relaxed);
        let ok = Method::BasicGetOk(BasicGetOk {
            delivery_tag: tag,
            redelivered: m.redelivered,
            exchange: m.msg.exchange.clone(),
            routing_key: m.msg.routing_key.clone(),
            message_count: remaining,
        });
        self.outbox.push(|b| {
            frame::write_method(b, self.id, &ok);
            outbox::write_content(b, self.id, frame_max, &m.msg);
        });
        if !no_ack {
            d.unacked.push_back(Unacked {
                tag,
                queue: q.clone(),
                msg: m.clone(),
                consumer: None,
                stamp: timeout::now_ms(),
            });
        }
    }

    /// Removes the deliveries an ack/nack/reject names. `multiple` with tag 0 means all.
    pub(super) fn take(&self, tag: u64, multiple: bool) -> AmqpResult<Vec<Unacked>> {
        let mut d = self.deliveries.lock();
        let taken: Vec<Unacked> = if multiple {
            // `unacked` is in tag order (deliveries append, `untake` inserts in place).
            let known = |d: &Deliveries| d.unacked.binary_search_by_key(&tag, |u| u.tag).is_ok();
            if tag != 0 && !known(&d) && !d.reclaimed.contains(&tag) {
                return Err(unknown_tag(tag));
            }
            if !d.reclaimed.is_empty() {
                d.reclaimed.retain(|&t| tag != 0 && t > tag);
            }
            let n = if tag == 0 {
                d.unacked.len()
            } else {
                d.unacked.partition_point(|u| u.tag <= tag)
            };
            d.unacked.drain(..n).collect()
        } else {
            // Acks mostly come in delivery order: the oldest first, before searching.
            let at = match d.unacked.front() {
                Some(u) if u.tag == tag => Ok(0),
                _ => d.unacked.binary_search_by_key(&tag, |u| u.tag),
            };
            match at {
                Ok(i) => d.unacked.remove(i).into_iter().collect(),
                // Taken back by a consumer timeout: the client did not know yet.
                Err(_) if d.reclaimed.remove(&tag) => Vec::new(),
                Err(_) => return Err(unknown_tag(tag)),
            }
        };
        for u in &taken {
            if u.consumer.is_some() {
                d.global_unacked = d.global_unacked.saturating_sub(1);
            }
        }
        Ok(taken)
    }

    /// Puts back deliveries taken by a transaction that was rolled back.
    pub(super) fn untake(&self, back: Vec<Unacked>) {
        let mut d = self.deliveries.lock();
        for u in back {
            if u.consumer.is_some() {
                d.global_unacked += 1;
            }
            let i = d.unacked.partition_point(|x| x.tag < u.tag);
            d.unacked.insert(i, u);
        }
    }
}

fn unknown_tag(tag: u64) -> AmqpError {
    AmqpError::precondition_failed(format!("unknown delivery tag {tag}"))
}

/// Settles, requeues or discards taken deliveries, one queue lock per run of the same queue.
pub(super) fn finish(taken: Vec<Unacked>, how: Settle) {
    finish_with(taken, how, true)
}

/// [`finish`]; `dispatch` false leaves the settled queues undispatched (a requeue always
/// dispatches: its messages may go to any consumer of the queue).
pub(super) fn finish_with(taken: Vec<Unacked>, how: Settle, dispatch: bool) {
    let mut taken = taken.into_iter().peekable();
    while let Some(first) = taken.next() {
        let q = first.queue.clone();
        let rest = std::iter::from_fn(|| taken.next_if(|u| u.queue.ptr_eq(&q)));
        // Each names the consumer it went to, whose credit the queue gives back.
        let msgs = std::iter::once(first)
            .chain(rest)
            .map(|u| (u.consumer.map(|c| c.key), u.msg));
        match how {
            Settle::Ack => q.settle(msgs, dispatch),
            Settle::Requeue => q.requeue(msgs),
            Settle::Discard => q.discard(msgs, dispatch),
        }
    }
}

impl Channel {
    /// Releases everything the channel holds: unacked messages go back to their queues,
    /// consumers are removed (auto-delete queues may go).
    pub fn close(&mut self, vhost: &Arc<VHost>) {
        // Confirms ready now go before the close-ok, as RabbitMQ sends them after each method;
        // those that complete later (an fsync, another node's answer) are never sent.
        self.confirms.flush();
        self.confirms.close();
        let mut taken = {
            let mut d = self.shared.deliveries.lock();
            if !d.closed {
                // Its counts stay in the vhost's totals once it is gone.
                vhost.retired.absorb(&self.shared.stats);
                vhost.retired_publish.absorb(&self.shared.publish_stats);
                vhost.churn.channel_closed.fetch_add(1, Ordering::Relaxed);
            }
            d.closed = true;
            d.unacked.drain(..).collect::<Vec<_>>()
        };
        // Acks, nacks and rejects of an uncommitted transaction are discarded, as in RabbitMQ:
        // those deliveries go back to their queues with the rest.
        for op in self.tx.take().into_iter().flatten() {
            if let TxOp::Settle(held, _) = op {
                taken.extend(held);
            }
        }
        for c in self.consumers.values() {
            c.cancelled.store(true, Ordering::Relaxed);
        }
        for (_, c) in self.consumers.drain() {
            remove_consumer(vhost, &c);
        }
        if let Some(q) = self.direct_reply.take() {
            vhost.drop_direct_reply_queue(&q);
        }
        // Requeues to queues on other nodes travel one-way: the close-ok waits until their
        // nodes applied them, so a get right after it finds the messages back.
        let mut elsewhere: Vec<QueueRef> = Vec::new();
        for u in &taken {
            if matches!(u.queue, QueueRef::Other(_))
                && !elsewhere.iter().any(|q| q.ptr_eq(&u.queue))
            {
                elsewhere.push(u.queue.clone());
            }
        }
        finish(taken, Settle::Requeue);
        QueueRef::sync_settles(&elsewhere);
        self.publish = PublishState::Idle;
        self.tx = None;
    }
}

impl ChannelShared {
    /// A delivery counted where its queue runs: taken (`Some(true)`), refused as the channel
    /// is closing or the consumer cancelled (`Some(false)`), or, `limited`, held back while
    /// the channel-wide prefetch is used up (`None`; as `offer_from`, no-ack ones too). One
    /// body for both pushes, so `deliver_locked` keeps its callers (and its inlining).
    fn push_within(
        &self,
        c: &Arc<Consumer>,
        q: QueueRef,
        m: &QueuedMessage,
        limited: bool,
    ) -> Option<bool> {
        if c.cancelled.load(Ordering::Relaxed) {
            return Some(false);
        }
        let mut d = self.deliveries.lock();
        if d.closed {
            return Some(false);
        }
        if limited && d.global_prefetch > 0 && d.global_unacked >= d.global_prefetch as u32 {
            return None;
        }
        self.deliver_locked(&mut d, c, || q, m);
        Some(true)
    }
}

/// A local channel is the sink of its consumers' deliveries.
impl DeliverySink for ChannelShared {
    #[inline]
    fn offer(&self, c: &Arc<Consumer>, q: &Arc<Queue>, m: &QueuedMessage) -> Offer {
        ChannelShared::offer(self, c, q, m)
    }

    fn offer_for(&self, c: &Arc<Consumer>, m: &QueuedMessage) -> Offer {
        self.offer_from(c, || c.queue.clone(), m)
    }

    fn wait_for_space(&self, w: Arc<dyn SpaceWaiter>) -> bool {
        self.outbox.wait_for_space(w)
    }

    fn output_full(&self) -> bool {
        self.outbox.is_full()
    }

    fn push(&self, c: &Arc<Consumer>, q: QueueRef, m: &QueuedMessage) -> bool {
        self.push_within(c, q, m, false) == Some(true)
    }

    fn channel_prefetch(&self) -> u16 {
        self.deliveries.lock().global_prefetch
    }

    fn push_limited(&self, c: &Arc<Consumer>, q: QueueRef, m: &QueuedMessage) -> Option<bool> {
        self.push_within(c, q, m, true)
    }

    fn cancelled(&self, c: &Consumer) {
        self.outbox.method(
            self.id,
            &Method::BasicCancel(BasicCancel {
                consumer_tag: c.tag.clone(),
                nowait: true,
            }),
        );
    }
    fn timed_out(&self, c: &Arc<Consumer>, timeout_ms: u64) {
        let mut d = self.deliveries.lock();
        if !d.closed {
            d.timed_out_by_queue.push((c.key, timeout_ms));
        }
    }
}
