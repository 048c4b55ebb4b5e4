//! The basic class but publishing (which is `publish.rs` and `mod.rs`): basic.consume and
//! cancel, basic.get, basic.ack, nack and reject, basic.recover and basic.qos. Settling takes
//! deliveries from the unacked map (`deliveries.rs`) and finishes them on their queues.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use warren_protocol::method::{
    BasicCancel, BasicCancelOk, BasicConsume, BasicConsumeOk, BasicGet, BasicGetEmpty, BasicNack,
    BasicQos, BasicQosOk, BasicRecover, BasicRecoverOk, BasicReject,
};
use warren_protocol::{ByteString, Method};

use super::deliveries::{finish, finish_with};
use super::{remove_consumer, Channel, Ctx, Settle, TxOp, Unacked};
use crate::access::{Perm, Resource};
use crate::error::{AmqpError, AmqpResult};
use crate::metrics::bump;
use crate::queue::{Consumer, QueueRef};
use crate::vhost::gen_name;
use crate::vhost::{VHost, DIRECT_REPLY_TO};

impl Channel {
    /// basic.nack: requeued messages of queues with `x-delayed-retry-*` go to their retry
    /// stores.
    pub(super) fn basic_nack(&mut self, n: BasicNack, ctx: &Ctx<'_>) -> AmqpResult<()> {
        let retry = Some((ctx.vhost, false));
        self.settle(n.delivery_tag, n.multiple, n.requeue, false, retry)
    }

    /// basic.reject: as basic.nack of one delivery.
    pub(super) fn basic_reject(&mut self, r: BasicReject, ctx: &Ctx<'_>) -> AmqpResult<()> {
        let retry = Some((ctx.vhost, true));
        self.settle(r.delivery_tag, false, r.requeue, false, retry)
    }

    /// basic.qos: a global prefetch is the channel's, the other one each new consumer's.
    pub(super) fn basic_qos(&mut self, q: BasicQos) -> AmqpResult<()> {
        if q.prefetch_size != 0 {
            return Err(AmqpError::not_implemented(format!(
                "prefetch_size!=0 ({})",
                q.prefetch_size
            )));
        }
        if q.global {
            self.shared.deliveries.lock().global_prefetch = q.prefetch_count;
            self.kick_consumers();
        } else {
            self.consumer_prefetch = q.prefetch_count;
            self.shared
                .modes
                .prefetch_count
                .store(q.prefetch_count, Ordering::Relaxed);
        }
        self.reply(BasicQosOk {});
        Ok(())
    }

    /// basic.cancel: an unknown tag is not an error.
    pub(super) fn basic_cancel(&mut self, c: BasicCancel, ctx: &Ctx<'_>) -> AmqpResult<()> {
        let vhost = ctx.vhost;
        if let Some(consumer) = self.consumers.remove(&c.consumer_tag) {
            remove_consumer(vhost, &consumer);
            // The reply consumer's pseudo-queue goes with it: consuming again makes a
            // new one, and replies to the old name are dropped, as in RabbitMQ.
            if self
                .direct_reply
                .as_ref()
                .is_some_and(|q| **q == **consumer.queue.name())
            {
                if let Some(q) = self.direct_reply.take() {
                    vhost.drop_direct_reply_queue(&q);
                }
            }
        }
        if !c.nowait {
            self.reply(BasicCancelOk {
                consumer_tag: c.consumer_tag,
            });
        }
        Ok(())
    }

    /// basic.get: one message, or basic.get-empty.
    pub(super) fn basic_get(&mut self, g: BasicGet, ctx: &Ctx<'_>) -> AmqpResult<()> {
        let vhost = ctx.vhost;
        let name = self.queue_name(&g.queue)?;
        self.allow(ctx, Perm::Read, Resource::Queue, &name)?;
        let q = vhost.queue_for(&name, ctx.conn_id)?.resolved()?;
        let shared = &self.shared;
        let got = q.get(!g.no_ack, |m, remaining| {
            shared.deliver_get(&q, m, remaining, g.no_ack)
        })?;
        if !got {
            bump(&self.shared.stats.get_empty, 1);
            self.reply(BasicGetEmpty {
                reserved_1: "".into(),
            });
        }
        Ok(())
    }

    /// basic.recover (synchronous; basic.recover-async calls [`Channel::recover`] alone).
    pub(super) fn basic_recover(&mut self, r: BasicRecover) -> AmqpResult<()> {
        self.recover(r.requeue)?;
        self.reply(BasicRecoverOk {});
        Ok(())
    }

    pub(super) fn consume(&mut self, c: BasicConsume, ctx: &mut Ctx<'_>) -> AmqpResult<()> {
        let q = if &*c.queue == DIRECT_REPLY_TO {
            if !c.no_ack {
                return Err(AmqpError::precondition_failed(
                    "reply consumer cannot acknowledge",
                ));
            }
            if self.direct_reply.is_some() {
                return Err(AmqpError::precondition_failed("reply consumer already set"));
            }
            let q = ctx.vhost.new_direct_reply_queue();
            self.direct_reply = Some(q.name().clone());
            q
        } else {
            let name = self.queue_name(&c.queue)?;
            self.allow(ctx, Perm::Read, Resource::Queue, &name)?;
            // A replicated queue's consumer belongs to its leader's leg: cancelled with it.
            ctx.vhost.queue_for(&name, ctx.conn_id)?.resolved()?
        };
        let tag = if c.consumer_tag.is_empty() {
            ByteString::from(gen_name("amq.ctag-"))
        } else {
            c.consumer_tag.clone()
        };
        if self
            .consumers
            .get(&tag)
            .is_some_and(|x| !x.cancelled.load(Ordering::Relaxed))
        {
            return Err(AmqpError::not_allowed(format!(
                "attempt to reuse consumer tag '{tag}'"
            )));
        }
        // RabbitMQ's quorum queues and streams refuse a channel-wide prefetch.
        if matches!(q.type_name(), "quorum" | "stream")
            && self.shared.deliveries.lock().global_prefetch > 0
        {
            return Err(AmqpError::not_implemented(format!(
                "queue '{}' in vhost '{}' does not support global qos",
                q.name(),
                ctx.vhost.name
            )));
        }
        let priority = match c.arguments.get("x-priority") {
            None => 0,
            Some(v) => v.as_i64().ok_or_else(|| {
                AmqpError::precondition_failed(format!(
                    "invalid arg 'x-priority' for consumer '{tag}': \"expected integer, got {}\"",
                    crate::queue::type_name(v)
                ))
            })?,
        };
        let timeout_ms = match c.arguments.get("x-consumer-timeout") {
            None => None,
            Some(v) => match v.as_i64() {
                Some(n) if n >= 0 => Some(n as u64).filter(|&n| n > 0),
                Some(n) => {
                    return Err(AmqpError::precondition_failed(format!(
                        "invalid arg 'x-consumer-timeout' for consumer '{tag}': {{value_negative,{n}}}"
                    )))
                }
                None => {
                    return Err(AmqpError::precondition_failed(format!(
                        "invalid arg 'x-consumer-timeout' for consumer '{tag}': \"expected integer, got {}\"",
                        crate::queue::type_name(v)
                    )))
                }
            },
        };
        // A queue that times its consumers takes the timeout in force now.
        let timeout_ms = if q.times_consumers() {
            crate::consumer_timeout::effective(
                timeout_ms,
                q.args().consumer_timeout_ms,
                self.default_consumer_timeout,
            )
        } else {
            timeout_ms
        };
        let consumer = Arc::new(Consumer {
            key: crate::queue::consumer_key(),
            tag: tag.clone(),
            sink: self.shared.clone(),
            queue: q.clone(),
            no_ack: c.no_ack,
            exclusive: c.exclusive,
            priority,
            prefetch: self.consumer_prefetch,
            cancelled: AtomicBool::new(false),
            timeout_ms,
        });
        let (outbox, id, nowait) = (&self.shared.outbox, self.id(), c.nowait);
        let consume_ok = || {
            if !nowait {
                outbox.method(
                    id,
                    &Method::BasicConsumeOk(BasicConsumeOk {
                        consumer_tag: tag.clone(),
                    }),
                );
            }
        };
        match q.stream() {
            Some(s) => {
                let start = crate::queue::stream::parse_start(c.arguments.get("x-stream-offset"))?;
                s.add_consumer(consumer.clone(), start, consume_ok)?
            }
            None => q.add_consumer(consumer.clone(), consume_ok)?,
        }
        self.consumers.insert(tag, consumer);
        Ok(())
    }

    /// basic.ack/nack/reject. `retry`: for a nack or reject (`true`), the vhost whose retry
    /// stores take requeued messages of queues with `x-delayed-retry-*`.
    pub(super) fn settle(
        &mut self,
        tag: u64,
        multiple: bool,
        requeue: bool,
        ack: bool,
        retry: Option<(&Arc<VHost>, bool)>,
    ) -> AmqpResult<()> {
        let mut taken = self.shared.take(tag, multiple)?;
        let how = Settle::of(ack, requeue);
        if how != Settle::Ack {
            // RabbitMQ 3.10 closes the connection; what was taken goes back as credit.
            if let Some(u) = taken.iter().find(|u| u.queue.stream().is_some()) {
                let e = AmqpError::not_implemented(format!(
                    "basic.nack and basic.reject not supported by stream queues {}",
                    u.queue.describe()
                ));
                finish(taken, Settle::Ack);
                return Err(e);
            }
        }
        if let (Settle::Requeue, None, Some((vhost, failed))) = (how, &self.tx, retry) {
            if taken.iter().any(|u| u.queue.holds_retries()) {
                taken = requeue_held(taken, failed);
            }
            if taken.iter().any(|u| u.queue.args().retry.is_some()) {
                taken = retry_later(taken, vhost, failed);
            }
        }
        if how == Settle::Ack {
            bump(&self.shared.stats.ack, taken.len() as u64);
        }
        if let Some(ops) = &mut self.tx {
            ops.push(TxOp::Settle(taken, how));
            return Ok(());
        }
        // Under a channel-wide limit the room an ack opens is the channel's: the settled
        // queue dispatching first would take it every time and starve the channel's others.
        let capped = self.shared.capped();
        finish_with(taken, how, !capped);
        if capped {
            self.kick_consumers();
        }
        Ok(())
    }

    pub(super) fn recover(&mut self, requeue: bool) -> AmqpResult<()> {
        if !requeue {
            return Err(AmqpError::not_implemented("requeue=false"));
        }
        let taken = self.shared.take(0, true)?;
        finish(taken, Settle::Requeue);
        // The channel-wide count dropped: queues with nothing to requeue may deliver again.
        if self.shared.capped() {
            self.kick_consumers();
        }
        Ok(())
    }

    /// Lets every queue this channel consumes from try again (after prefetch space opened),
    /// each once, starting from a random one as RabbitMQ's limiter resumes blocked queues:
    /// under a channel-wide limit the first queue dispatched takes the room, so a fixed order
    /// would serve the same queue every time.
    pub(super) fn kick_consumers(&self) {
        use rand::Rng;
        let mut queues: Vec<&QueueRef> = Vec::with_capacity(self.consumers.len());
        for c in self.consumers.values() {
            if !queues.iter().any(|q| q.ptr_eq(&c.queue)) {
                queues.push(&c.queue);
            }
        }
        if queues.len() > 1 {
            let start = rand::thread_rng().gen_range(0..queues.len());
            queues.rotate_left(start);
        }
        for q in queues {
            q.dispatch();
        }
    }
}

/// Requeues the deliveries of queues that hold their delayed retries themselves (a replicated
/// queue on the machine keeps their due times in its state), saying whether they failed
/// (basic.reject) or were returned (basic.nack); returns the others.
fn requeue_held(taken: Vec<Unacked>, failed: bool) -> Vec<Unacked> {
    let (held, rest): (Vec<Unacked>, Vec<Unacked>) =
        taken.into_iter().partition(|u| u.queue.holds_retries());
    let mut held = held.into_iter().peekable();
    while let Some(first) = held.next() {
        let q = first.queue.clone();
        let run = std::iter::once(first)
            .chain(std::iter::from_fn(|| held.next_if(|u| u.queue.ptr_eq(&q))));
        q.requeue_failed(run.map(|u| (u.consumer.map(|c| c.key), u.msg)), failed);
    }
    rest
}

/// Hands the requeued deliveries of queues with `x-delayed-retry-*` to their retry stores and
/// returns the others. Each leaves its queue once its store has it (on disk when it must be).
fn retry_later(taken: Vec<Unacked>, vhost: &Arc<VHost>, failed: bool) -> Vec<Unacked> {
    let mut rest = Vec::with_capacity(taken.len());
    for u in taken {
        let retry = u.queue.args().retry.filter(|r| r.applies(failed));
        let store = retry.and_then(|r| Some((r, vhost.retry_store(u.queue.name())?)));
        let Some((retry, store)) = store else {
            rest.push(u);
            continue;
        };
        let (msg, attempt) = crate::message::next_attempt(&u.msg.msg);
        let q = u.queue.clone();
        let settled = (u.consumer.map(|c| c.key), u.msg);
        let done = crate::confirm::ConfirmHandle::then(move |ok| {
            if ok {
                q.settle(std::iter::once(settled), true)
            } else {
                q.requeue(std::iter::once(settled))
            }
        });
        if !store.hold(msg, retry.delay_ms(attempt), Some(&done)) {
            done.done(true);
        }
    }
    rest
}
