//! A replicated queue as the queue layer dispatches to it ([`QueueKind`]): publishes and
//! settlements become operations proposed to its group; counts are read from this member's
//! machine.

use std::any::Any;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use warren_queue::replicated::{Cmd, Out, ReturnKind};

use super::ReplicatedQueue;
use crate::confirm::ConfirmHandle;
use crate::error::AmqpResult;
use crate::message::Message;
use crate::queue::{
    Consumer, Enqueued, QueueArgs, QueueKind, QueueOptions, QueueRef, QueuedMessage, Settled,
};

impl ReplicatedQueue {
    /// Settlements by machine key, in order, as one command each.
    fn settlements(
        &self,
        msgs: &mut dyn Iterator<Item = Settled>,
        cmd: impl Fn(u64, Vec<u64>) -> Cmd,
    ) {
        let mut by: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for (key, m) in msgs {
            by.entry(self.machine_key(key)).or_default().push(m.seq);
        }
        for (consumer, seqs) in by {
            self.push_cmd(cmd(consumer, seqs), None);
        }
    }
}

impl QueueKind for ReplicatedQueue {
    fn name(&self) -> &Arc<str> {
        &self.name
    }
    fn vhost(&self) -> &Arc<str> {
        &self.vhost
    }
    fn options(&self) -> &QueueOptions {
        &self.options
    }
    /// A mirrored classic queue (`ha-mode`) on the machine is listed as classic, as RabbitMQ
    /// lists its mirrored queues.
    fn type_name(&self) -> &'static str {
        if self.sm.counted {
            "quorum"
        } else {
            "classic"
        }
    }
    fn mirrored(&self) -> bool {
        !self.sm.counted
    }
    /// Its leader's node, when that is another.
    fn home(&self) -> Option<String> {
        self.leader().filter(|l| *l != self.me)
    }
    fn resolved(self: Arc<Self>) -> AmqpResult<QueueRef> {
        Ok(QueueRef::Other(self))
    }
    fn args(&self) -> arc_swap::Guard<Arc<QueueArgs>> {
        ReplicatedQueue::args(self)
    }
    /// A policy changed the limits: every member applies them at the same entry.
    fn set_effective_args(&self, a: QueueArgs) {
        self.push_cmd(Cmd::SetLimits(crate::queue::core_limits(&a)), None);
        let retry = super::backoff(&a);
        if retry != super::backoff(&self.args()) {
            self.push_cmd(Cmd::SetRetry(retry), None);
        }
        self.args.store(Arc::new(a));
    }
    fn describe(&self) -> String {
        ReplicatedQueue::describe(self)
    }
    fn publish(&self, msg: Arc<Message>, confirm: Option<&Arc<ConfirmHandle>>) -> Enqueued {
        if self.is_deleted() {
            return Enqueued::Rejected;
        }
        self.push_publish(msg, confirm);
        Enqueued::Accepted
    }
    fn pressured(&self) -> bool {
        ReplicatedQueue::pressured(self)
    }
    fn stall(&self, max: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(ReplicatedQueue::stall(self, max))
    }
    fn get(
        self: Arc<Self>,
        ack_mode: bool,
        take: &mut dyn FnMut(&QueuedMessage, u32),
    ) -> AmqpResult<bool> {
        let key = self.machine_key(None);
        let answer = self.call(Cmd::Get {
            key,
            node: self.me.clone(),
            ack: ack_mode,
        })?;
        let Some(got) = answer.outs.into_iter().find_map(|o| match o {
            Out::Got(g) => g,
            _ => None,
        }) else {
            return Ok(false);
        };
        let msg = answer
            .got
            .into_iter()
            .find(|(seq, _)| *seq == got.seq)
            .and_then(|(_, b)| crate::persist::decode_message(&bytes::Bytes::from(b)))
            .map(|(m, _)| m);
        let Some(msg) = msg else {
            tracing::error!(queue = %self.name, vhost = %self.vhost, seq = got.seq, "a message's body is missing from the queue's log; it is dropped");
            if ack_mode {
                self.push_cmd(
                    Cmd::Discard {
                        consumer: key,
                        seqs: vec![got.seq],
                    },
                    None,
                );
            }
            return Ok(false);
        };
        let qm = QueuedMessage {
            seq: got.seq,
            msg: if self.sm.counted {
                Arc::new(crate::message::with_delivery_count(
                    &msg,
                    u64::from(got.msg.delivery_count),
                ))
            } else {
                Arc::new(msg)
            },
            redelivered: got.redelivered,
            expires_at_ms: None,
            logged: true,
        };
        take(&qm, got.remaining);
        Ok(true)
    }
    fn settle(&self, msgs: &mut dyn Iterator<Item = Settled>) {
        self.settlements(msgs, |consumer, seqs| Cmd::Settle { consumer, seqs });
    }
    fn discard(&self, msgs: &mut dyn Iterator<Item = Settled>) {
        self.settlements(msgs, |consumer, seqs| Cmd::Discard { consumer, seqs });
    }
    /// Back to the queue, redelivered: basic.recover, or a closed channel's deliveries (never
    /// held back by the retry back-off).
    fn requeue(&self, msgs: &mut dyn Iterator<Item = Settled>) {
        self.settlements(msgs, |consumer, seqs| Cmd::Return {
            consumer,
            seqs,
            kind: ReturnKind::Released,
        });
    }
    fn holds_retries(&self) -> bool {
        true
    }
    /// basic.reject (`failed`) or basic.nack with requeue: the machine holds it back when the
    /// queue's retry back-off applies to that kind.
    fn requeue_failed(&self, msgs: &mut dyn Iterator<Item = Settled>, failed: bool) {
        let kind = if failed {
            ReturnKind::Rejected
        } else {
            ReturnKind::Nacked
        };
        self.settlements(msgs, |consumer, seqs| Cmd::Return {
            consumer,
            seqs,
            kind,
        });
    }
    fn add_consumer(
        self: Arc<Self>,
        c: Arc<Consumer>,
        on_added: &mut dyn FnMut(),
    ) -> AmqpResult<()> {
        self.attach(c, on_added)
    }
    fn remove_consumer(&self, c: &Arc<Consumer>) {
        self.detach(c)
    }
    /// Ready messages: one held back by the retry back-off is not in the queue meanwhile (as
    /// with a classic queue's retry store, and RabbitMQ 4.3's delayed retries).
    fn message_count(&self) -> u32 {
        self.counts().0
    }
    fn unacked_count(&self) -> u32 {
        self.counts().1
    }
    fn consumer_count(&self) -> u32 {
        self.counts().2
    }
    /// From this member's copy of the state (a member applies what the leader committed).
    fn starving(&self) -> bool {
        self.is_member() && self.sm.state.lock().machine.starving(0)
    }
    fn consumers(&self) -> Vec<Arc<Consumer>> {
        self.consumers
            .lock()
            .values()
            .map(|l| l.c.clone())
            .collect()
    }
    fn purge(&self) -> u32 {
        match self.call(Cmd::Purge) {
            Ok(a) => a
                .outs
                .into_iter()
                .find_map(|o| match o {
                    Out::Purged(n) => Some(n),
                    _ => None,
                })
                .unwrap_or(0),
            Err(e) => {
                tracing::warn!(queue = %self.name, vhost = %self.vhost, error = %e.text, "purge not applied");
                0
            }
        }
    }
    fn mark_deleted(&self) -> (u32, Vec<Arc<Consumer>>) {
        ReplicatedQueue::mark_deleted(self)
    }
    fn is_deleted(&self) -> bool {
        ReplicatedQueue::is_deleted(self)
    }
    fn touch(&self) {
        ReplicatedQueue::touch(self)
    }
    /// A declare: an `x-expires` queue's lease starts again on every member before the
    /// declare-ok, so the leader (wherever it is) counts from it.
    fn check_home(&self) -> AmqpResult<()> {
        self.touch_members();
        Ok(())
    }
    fn lease_expired(&self, now: u64) -> bool {
        ReplicatedQueue::lease_expired(self, now)
    }
    fn store_id(&self) -> Option<u64> {
        self.store_id
    }
    fn group(&self) -> Option<(u64, Vec<String>)> {
        Some((self.group, self.members()))
    }
    fn leader(&self) -> Option<String> {
        ReplicatedQueue::leader(self)
    }
    fn stats(&self) -> Option<&crate::metrics::QueueStats> {
        Some(&self.stats)
    }
    /// Consumer timeouts are in the machine: held deliveries carry when they were made.
    fn times_consumers(&self) -> bool {
        true
    }
    fn extend_lease(&self, consumer: u64, seqs: Vec<u64>, extend_ms: Option<u64>) {
        let consumer = self.machine_key(Some(consumer));
        self.push_cmd(
            Cmd::Lease {
                consumer,
                seqs,
                extend_ms,
            },
            None,
        );
    }
    fn as_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}
