//! The handle channels, vhosts and the management API hold for a queue, and the sink through
//! which a queue hands deliveries to a consumer's connection. Neither says where the queue or
//! the connection runs: today every queue is [`QueueRef::Local`] and every sink a local
//! channel; a queue on another node or replicated on Raft is another variant here, and a
//! consumer on another node another `DeliverySink`, without touching their users (RabbitMQ
//! dispatches on queue type the same way, in `rabbit_queue_type`).
//!
//! An enum, not a trait object: one variant costs nothing on the publish path (the match
//! folds away), and the methods keep their generic arguments (iterators, closures).

use std::sync::Arc;

use warren_routing::QueueKey;

use crate::channel::Offer;
use crate::confirm::ConfirmHandle;
use crate::error::AmqpResult;
use crate::message::Message;

use super::{Consumer, Enqueued, Queue, QueueArgs, QueueOptions, QueuedMessage, Settled};

/// Where a queue's deliveries go: the consumer's side of the queue-consumer link. The queue
/// counts each consumer's credit (its prefetch less its unsettled deliveries) and gets it back
/// through settles; a sink answers only for what the connection knows at that moment.
pub trait DeliverySink: Send + Sync {
    /// Takes `m` for consumer `c` of `q` now, or refuses: a channel-wide prefetch used up, the
    /// connection's output full, the channel paused or closing.
    fn offer(&self, c: &Arc<Consumer>, q: &Arc<Queue>, m: &QueuedMessage) -> Offer;
    /// After an [`Offer::OutboxFull`]: dispatch `q` again once there is room.
    fn wait_for_space(&self, q: &Arc<Queue>);
    /// The broker cancelled `c` (its queue was deleted): tell the client (basic.cancel).
    fn cancelled(&self, c: &Consumer);
}

/// A queue, wherever it runs.
#[derive(Clone)]
pub enum QueueRef {
    /// On this node, run inline under its own lock.
    Local(Arc<Queue>),
}

impl std::fmt::Debug for QueueRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueRef::Local(q) => q.fmt(f),
        }
    }
}

impl From<Arc<Queue>> for QueueRef {
    fn from(q: Arc<Queue>) -> Self {
        QueueRef::Local(q)
    }
}

/// Handles are the same queue when they point at the same queue.
impl warren_routing::QueueKey for QueueRef {
    #[inline]
    fn key(&self) -> usize {
        match self {
            QueueRef::Local(q) => q.key(),
        }
    }
}

impl QueueRef {
    /// The queue when it runs on this node (its log, its persister, its outbox waits).
    #[inline]
    pub fn local(&self) -> Option<&Arc<Queue>> {
        match self {
            QueueRef::Local(q) => Some(q),
        }
    }

    #[inline]
    pub fn ptr_eq(&self, other: &QueueRef) -> bool {
        self.key() == other.key()
    }

    #[inline]
    fn q(&self) -> &Arc<Queue> {
        match self {
            QueueRef::Local(q) => q,
        }
    }

    pub fn name(&self) -> &Arc<str> {
        &self.q().name
    }

    pub fn vhost(&self) -> &Arc<str> {
        &self.q().vhost
    }

    /// As declared.
    pub fn options(&self) -> &QueueOptions {
        &self.q().options
    }

    /// The arguments in force (declared, merged with a policy).
    pub fn args(&self) -> arc_swap::Guard<Arc<QueueArgs>> {
        self.q().args()
    }

    pub fn set_effective_args(&self, a: QueueArgs) {
        self.q().set_effective_args(a)
    }

    pub fn describe(&self) -> String {
        self.q().describe()
    }

    #[inline]
    pub fn publish(&self, msg: Arc<Message>, confirm: Option<&Arc<ConfirmHandle>>) -> Enqueued {
        self.q().publish(msg, confirm)
    }

    /// A persistent message published here is stored, and its confirm waits for the fsync.
    #[inline]
    pub fn stores(&self, msg: &Message) -> bool {
        self.q().stores(msg)
    }

    /// Consumers fall behind; publishers should stall (see [`QueueRef::stall`]).
    #[inline]
    pub fn pressured(&self) -> bool {
        self.q().pressured()
    }

    pub async fn stall(&self, max: std::time::Duration) {
        self.q().stall(max).await
    }

    /// basic.get: `take` gets the head message and the count left.
    pub fn get(&self, ack_mode: bool, take: impl FnOnce(&QueuedMessage, u32)) -> bool {
        self.q().get(ack_mode, take)
    }

    #[inline]
    pub fn settle(&self, msgs: impl IntoIterator<Item = Settled>, dispatch: bool) {
        self.q().settle(msgs, dispatch)
    }

    pub fn discard(&self, msgs: impl IntoIterator<Item = Settled>, dispatch: bool) {
        self.q().discard(msgs, dispatch)
    }

    pub fn requeue(&self, msgs: impl IntoIterator<Item = Settled>) {
        self.q().requeue(msgs)
    }

    pub fn dispatch(&self) {
        self.q().dispatch()
    }

    pub fn add_consumer(&self, c: Arc<Consumer>, on_added: impl FnOnce()) -> AmqpResult<()> {
        self.q().add_consumer(c, on_added)
    }

    /// True if the queue is auto-delete and this was its last consumer.
    pub fn remove_consumer(&self, c: &Arc<Consumer>) -> bool {
        self.q().remove_consumer(c).auto_delete_now
    }

    pub fn message_count(&self) -> u32 {
        self.q().message_count()
    }

    pub fn unacked_count(&self) -> u32 {
        self.q().unacked_count()
    }

    pub fn consumer_count(&self) -> u32 {
        self.q().consumer_count()
    }

    pub fn consumers(&self) -> Vec<Arc<Consumer>> {
        self.q().consumers()
    }

    pub fn purge(&self) -> u32 {
        self.q().purge()
    }

    /// Deletes it: its ready count and its consumers (to be told of the cancel).
    pub fn mark_deleted(&self) -> (u32, Vec<Arc<Consumer>>) {
        self.q().mark_deleted()
    }

    pub fn is_deleted(&self) -> bool {
        self.q().is_deleted()
    }

    /// Marks it used now, for `x-expires`.
    pub fn touch(&self) {
        self.q().touch()
    }

    pub fn lease_expired(&self, now: u64) -> bool {
        self.q().lease_expired(now)
    }

    /// Holds a message with a deadline: the sweeper should visit it.
    pub fn may_expire(&self) -> bool {
        self.q()
            .may_expire
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn expire(&self) {
        self.q().expire()
    }
}
