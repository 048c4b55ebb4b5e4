//! The handle channels, vhosts and the management API hold for a queue, and the sink through
//! which a queue hands deliveries to a consumer's connection. Neither says where the queue or
//! the connection runs. The queue layer hosts two kinds itself: a classic queue on this node
//! ([`QueueRef::Local`]) and a stream ([`QueueRef::Stream`]). Every other kind (a queue whose
//! home is another node, a queue replicated on Raft) is defined above this layer, in
//! `cluster/`, behind the [`QueueKind`] interface ([`QueueRef::Other`]): RabbitMQ dispatches
//! on a queue's type the same way, in `rabbit_queue_type`.
//!
//! An enum with one open variant, not a trait object for every queue: the local kinds cost
//! nothing on the publish path (the match folds away) and keep their generic arguments
//! (iterators, closures); a queue of another kind goes over a link or through Raft, next to
//! which a virtual call is nothing.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use warren_routing::QueueKey;

use crate::confirm::ConfirmHandle;
use crate::error::AmqpResult;
use crate::flow::SpaceWaiter;
use crate::message::Message;

use super::stream::Stream;
use super::{Consumer, Enqueued, Queue, QueueArgs, QueueOptions, QueuedMessage, Settled};

/// What a queue's offer of a message to a consumer came to.
pub enum Offer {
    Delivered,
    /// Prefetch exhausted, flow stopped, channel closing or consumer cancelled.
    NoCredit,
    /// The consumer's connection output is above its high mark (`flow.rs`, link 1).
    OutboxFull,
}

/// Where a queue's deliveries go: the consumer's side of the queue-consumer link. The queue
/// counts each consumer's credit (its prefetch less its unsettled deliveries) and gets it back
/// through settles; a sink answers only for what the connection knows at that moment. A sink
/// is a local channel or a consumer's link to another node; the queue does not know which.
pub trait DeliverySink: Send + Sync {
    /// Takes `m` for consumer `c` of the local queue `q` now, or refuses: a channel-wide
    /// prefetch used up, the connection's output full, the channel paused or closing.
    fn offer(&self, c: &Arc<Consumer>, q: &Arc<Queue>, m: &QueuedMessage) -> Offer;
    /// [`DeliverySink::offer`] from a queue kind that counts its consumers' credit itself and
    /// is the consumer's own queue (`c.queue`: a stream's consumer task); a sink that cannot
    /// take such deliveries refuses.
    fn offer_for(&self, _c: &Arc<Consumer>, _m: &QueuedMessage) -> Offer {
        Offer::NoCredit
    }
    /// After an [`Offer::OutboxFull`], or before withholding credit: `w` is woken once the
    /// output drains. False if it has room already (the caller goes on at once).
    fn wait_for_space(&self, w: Arc<dyn SpaceWaiter>) -> bool;
    /// Whether the consumer's connection output is above its high mark now.
    fn output_full(&self) -> bool {
        false
    }
    /// The broker cancelled `c` (its queue was deleted): tell the client (basic.cancel).
    fn cancelled(&self, c: &Consumer);
    /// `c`'s queue timed it out (a queue that [times its consumers](QueueKind::times_consumers)
    /// did, after `timeout_ms`): what it held is back in the queue already; its channel
    /// cancels it, or closes, as for a timeout of its own.
    fn timed_out(&self, _c: &Arc<Consumer>, _timeout_ms: u64) {}
    /// A delivery from queue `q`, already counted against the consumer's credit where it runs
    /// (another node): taken whatever the channel's limits; false if the channel is closing.
    fn push(&self, _c: &Arc<Consumer>, _q: QueueRef, _m: &QueuedMessage) -> bool {
        false
    }
    /// The channel-wide prefetch (`basic.qos` with `global`) of the consumer's channel; 0: none.
    fn channel_prefetch(&self) -> u16 {
        0
    }
    /// [`DeliverySink::push`] within the channel-wide prefetch: `None` while it is used up
    /// (the caller holds the delivery and offers it again when the channel kicks its queues).
    fn push_limited(&self, c: &Arc<Consumer>, q: QueueRef, m: &QueuedMessage) -> Option<bool> {
        Some(self.push(c, q, m))
    }
}

/// A queue's figures as the node that runs it reports them.
#[derive(Clone, Copy, Default)]
pub struct Counts {
    pub messages: u32,
    pub consumers: u32,
    pub unacked: u32,
}

/// A queue kind defined above the queue layer (`cluster/remote/`: a queue whose home is another
/// node; `cluster/quorum/`: a replicated queue), as the queue layer dispatches to it. Its
/// operations mirror [`QueueRef`]'s, with trait-object arguments in place of generic ones.
pub trait QueueKind: Send + Sync + std::fmt::Debug + 'static {
    fn name(&self) -> &Arc<str>;
    fn vhost(&self) -> &Arc<str>;
    fn options(&self) -> &QueueOptions;
    /// RabbitMQ's name for its type (the management API's `type`).
    fn type_name(&self) -> &'static str;
    /// The node it runs on (`None`: this one).
    fn home(&self) -> Option<String>;
    /// What serves it now (see [`QueueRef::resolved`]).
    fn resolved(self: Arc<Self>) -> AmqpResult<QueueRef>;
    fn args(&self) -> arc_swap::Guard<Arc<QueueArgs>>;
    fn set_effective_args(&self, a: QueueArgs);
    fn describe(&self) -> String;
    fn publish(&self, msg: Arc<Message>, confirm: Option<&Arc<ConfirmHandle>>) -> Enqueued;
    fn pressured(&self) -> bool;
    fn stall(&self, max: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
    fn get(
        self: Arc<Self>,
        ack_mode: bool,
        take: &mut dyn FnMut(&QueuedMessage, u32),
    ) -> AmqpResult<bool>;
    fn settle(&self, msgs: &mut dyn Iterator<Item = Settled>);
    fn discard(&self, msgs: &mut dyn Iterator<Item = Settled>);
    fn requeue(&self, msgs: &mut dyn Iterator<Item = Settled>);
    /// A kind that holds its delayed retries (`x-delayed-retry-*`) itself: a basic.reject
    /// (`failed`) or basic.nack with requeue comes to [`QueueKind::requeue_failed`], not to the
    /// vhost's retry store.
    fn holds_retries(&self) -> bool {
        false
    }
    /// Requeued by basic.reject (`failed`) or basic.nack, for a kind that
    /// [holds its retries](QueueKind::holds_retries).
    fn requeue_failed(&self, msgs: &mut dyn Iterator<Item = Settled>, _failed: bool) {
        self.requeue(msgs)
    }
    fn dispatch(&self) {}
    /// A kind whose settles travel one-way to another node: names that node (settles sent
    /// to one node are made durable by one [`QueueKind::sync_settles`]).
    fn settles_go_to(&self) -> Option<&str> {
        None
    }
    /// Returns once the settles this node sent before are applied where the queue runs.
    fn sync_settles(&self) {}
    fn add_consumer(
        self: Arc<Self>,
        c: Arc<Consumer>,
        on_added: &mut dyn FnMut(),
    ) -> AmqpResult<()>;
    fn remove_consumer(&self, c: &Arc<Consumer>);
    fn message_count(&self) -> u32;
    fn unacked_count(&self) -> u32;
    fn consumer_count(&self) -> u32;
    /// Its consumers on this node.
    fn consumers(&self) -> Vec<Arc<Consumer>>;
    fn purge(&self) -> u32;
    /// See [`QueueRef::starving`]; false where this node does not hold the queue's state.
    fn starving(&self) -> bool {
        false
    }
    fn mark_deleted(&self) -> (u32, Vec<Arc<Consumer>>);
    fn is_deleted(&self) -> bool;
    fn touch(&self) {}
    fn lease_expired(&self, _now: u64) -> bool {
        false
    }
    fn may_expire(&self) -> bool {
        false
    }
    fn expire(&self) {}
    /// Its home must be up (a queue on another node: a redeclare checks, as RabbitMQ asks the
    /// queue's process); fine for a queue that runs here.
    fn check_home(&self) -> AmqpResult<()> {
        Ok(())
    }
    /// Its counts, asked fresh from the node that serves it now when that is another one.
    fn home_counts(&self) -> Option<AmqpResult<Counts>> {
        None
    }
    /// A replicated queue's group id and members.
    fn group(&self) -> Option<(u64, Vec<String>)> {
        None
    }
    /// The id its definition is recorded under, for a kind whose data lives on this node.
    fn store_id(&self) -> Option<u64> {
        None
    }
    /// A replicated queue's leader, as this node knows it.
    fn leader(&self) -> Option<String> {
        None
    }
    /// A classic queue replicated by an `ha-mode` policy (RabbitMQ's mirrored queue).
    fn mirrored(&self) -> bool {
        false
    }
    /// Its message counters, where this node keeps them (a replicated queue's members do).
    fn stats(&self) -> Option<&crate::metrics::QueueStats> {
        None
    }
    /// It times its consumers out itself (the timeout is in its state, as a replicated
    /// queue's): its consumers' channels do not, and tell it of a lease extension instead
    /// ([`QueueKind::extend_lease`]).
    fn times_consumers(&self) -> bool {
        false
    }
    /// Consumer `consumer` (its [`Consumer::key`]) asks for more time on `seqs`: each times
    /// out `extend_ms` from now (its timeout when `None`), never sooner than it would.
    fn extend_lease(&self, _consumer: u64, _seqs: Vec<u64>, _extend_ms: Option<u64>) {}
    /// For [`QueueRef::downcast`].
    fn as_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

/// A queue, wherever it runs.
#[derive(Clone)]
pub enum QueueRef {
    /// On this node, run inline under its own lock.
    Local(Arc<Queue>),
    /// A stream on this node (`queue/stream/`): an append-only log read from offsets.
    Stream(Arc<Stream>),
    /// A kind defined above the queue layer: on another node, or replicated.
    Other(Arc<dyn QueueKind>),
}

impl std::fmt::Debug for QueueRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueRef::Local(q) => q.fmt(f),
            QueueRef::Stream(q) => q.fmt(f),
            QueueRef::Other(q) => q.fmt(f),
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
            QueueRef::Stream(q) => Arc::as_ptr(q) as usize,
            QueueRef::Other(q) => Arc::as_ptr(q) as *const () as usize,
        }
    }
}

impl QueueRef {
    /// The queue when it runs on this node (its log, its persister, its outbox waits).
    #[inline]
    pub fn local(&self) -> Option<&Arc<Queue>> {
        match self {
            QueueRef::Local(q) => Some(q),
            QueueRef::Stream(_) | QueueRef::Other(_) => None,
        }
    }

    /// What serves it now: a replicated queue's leg (its leader's local queue, or a remote
    /// handle to it), so that deliveries and their settles stay with one leader; any other
    /// queue itself.
    pub fn resolved(self) -> AmqpResult<QueueRef> {
        match self {
            QueueRef::Other(q) => q.resolved(),
            q => Ok(q),
        }
    }

    /// A queue of kind `T` (defined above this layer), if it is one.
    pub fn downcast<T: QueueKind>(&self) -> Option<Arc<T>> {
        match self {
            QueueRef::Other(q) => q.clone().as_any().downcast::<T>().ok(),
            _ => None,
        }
    }

    /// Returns once the settles sent before to each of `queues`' other nodes are applied
    /// there (one round trip per node): what a channel's close-ok waits for.
    pub fn sync_settles<'a>(queues: impl IntoIterator<Item = &'a QueueRef>) {
        let mut done: Vec<&str> = Vec::new();
        for q in queues {
            if let QueueRef::Other(k) = q {
                if let Some(node) = k.settles_go_to() {
                    if !done.contains(&node) {
                        k.sync_settles();
                        done.push(node);
                    }
                }
            }
        }
    }

    /// See [`QueueKind::check_home`].
    pub fn check_home(&self) -> AmqpResult<()> {
        match self {
            QueueRef::Other(q) => q.check_home(),
            _ => Ok(()),
        }
    }

    /// See [`QueueKind::home_counts`].
    pub fn home_counts(&self) -> Option<AmqpResult<Counts>> {
        match self {
            QueueRef::Other(q) => q.home_counts(),
            _ => None,
        }
    }

    /// See [`QueueKind::group`].
    /// See [`QueueKind::leader`].
    pub fn leader(&self) -> Option<String> {
        match self {
            QueueRef::Other(q) => q.leader(),
            QueueRef::Stream(s) => s.replicated().and_then(|g| g.leader()),
            _ => None,
        }
    }

    /// See [`QueueKind::mirrored`].
    pub fn mirrored(&self) -> bool {
        match self {
            QueueRef::Other(q) => q.mirrored(),
            _ => false,
        }
    }

    /// See [`QueueKind::times_consumers`].
    pub fn times_consumers(&self) -> bool {
        match self {
            QueueRef::Other(q) => q.times_consumers(),
            _ => false,
        }
    }

    /// See [`QueueKind::extend_lease`].
    pub fn extend_lease(&self, consumer: u64, seqs: Vec<u64>, extend_ms: Option<u64>) {
        if let QueueRef::Other(q) = self {
            q.extend_lease(consumer, seqs, extend_ms);
        }
    }

    pub fn group(&self) -> Option<(u64, Vec<String>)> {
        match self {
            QueueRef::Other(q) => q.group(),
            QueueRef::Stream(s) => s.replicated().map(|g| g.group()),
            _ => None,
        }
    }

    /// The stream, if it is one.
    pub fn stream(&self) -> Option<&Arc<Stream>> {
        match self {
            QueueRef::Stream(s) => Some(s),
            _ => None,
        }
    }

    /// RabbitMQ's name for its type (the management API's `type`).
    pub fn type_name(&self) -> &'static str {
        match self {
            QueueRef::Local(_) => "classic",
            QueueRef::Stream(_) => "stream",
            QueueRef::Other(q) => q.type_name(),
        }
    }

    /// Its message counters, for a queue this node runs or is a member of.
    pub fn stats(&self) -> Option<&crate::metrics::QueueStats> {
        match self {
            QueueRef::Local(q) => Some(&q.stats),
            QueueRef::Stream(s) => Some(&s.stats),
            QueueRef::Other(q) => q.stats(),
        }
    }

    /// The id of its log directory, for a queue with one on this node.
    pub fn store_id(&self) -> Option<u64> {
        match self {
            QueueRef::Local(q) => q.store_id,
            QueueRef::Stream(s) => Some(s.store_id),
            QueueRef::Other(q) => q.store_id(),
        }
    }

    #[inline]
    pub fn ptr_eq(&self, other: &QueueRef) -> bool {
        self.key() == other.key()
    }

    pub fn name(&self) -> &Arc<str> {
        match self {
            QueueRef::Local(q) => &q.name,
            QueueRef::Stream(q) => &q.name,
            QueueRef::Other(q) => q.name(),
        }
    }

    pub fn vhost(&self) -> &Arc<str> {
        match self {
            QueueRef::Local(q) => &q.vhost,
            QueueRef::Stream(q) => &q.vhost,
            QueueRef::Other(q) => q.vhost(),
        }
    }

    /// As declared.
    pub fn options(&self) -> &QueueOptions {
        match self {
            QueueRef::Local(q) => &q.options,
            QueueRef::Stream(q) => &q.options,
            QueueRef::Other(q) => q.options(),
        }
    }

    /// The node it runs on (`None`: this one); a replicated queue's leader, its first member
    /// while it has none.
    pub fn home(&self) -> Option<String> {
        match self {
            QueueRef::Local(_) | QueueRef::Stream(_) => None,
            QueueRef::Other(q) => q.home(),
        }
    }

    /// The arguments in force (declared, merged with a policy).
    pub fn args(&self) -> arc_swap::Guard<Arc<QueueArgs>> {
        match self {
            QueueRef::Local(q) => q.args(),
            QueueRef::Stream(q) => q.args(),
            QueueRef::Other(q) => q.args(),
        }
    }

    pub fn set_effective_args(&self, a: QueueArgs) {
        match self {
            QueueRef::Local(q) => q.set_effective_args(a),
            QueueRef::Stream(q) => q.set_effective_args(a),
            QueueRef::Other(q) => q.set_effective_args(a),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            QueueRef::Local(q) => q.describe(),
            QueueRef::Stream(q) => q.describe(),
            QueueRef::Other(q) => q.describe(),
        }
    }

    #[inline]
    pub fn publish(&self, msg: Arc<Message>, confirm: Option<&Arc<ConfirmHandle>>) -> Enqueued {
        match self {
            QueueRef::Local(q) => q.publish(msg, confirm),
            QueueRef::Stream(q) => q.publish(msg, confirm),
            QueueRef::Other(q) => q.publish(msg, confirm),
        }
    }

    /// A persistent message published here is stored, and its confirm waits for the fsync.
    /// A queue of another kind's confirm always waits for its home's (or its group's) answer.
    #[inline]
    pub fn stores(&self, msg: &Message) -> bool {
        match self {
            QueueRef::Local(q) => q.stores(msg),
            QueueRef::Stream(_) | QueueRef::Other(_) => true,
        }
    }

    /// Consumers fall behind; publishers should stall (see [`QueueRef::stall`]).
    #[inline]
    pub fn pressured(&self) -> bool {
        match self {
            QueueRef::Local(q) => q.pressured(),
            QueueRef::Stream(q) => q.pressured(),
            QueueRef::Other(q) => q.pressured(),
        }
    }

    pub async fn stall(&self, max: Duration) {
        match self {
            QueueRef::Local(q) => q.stall(max).await,
            QueueRef::Stream(q) => q.stall(max).await,
            QueueRef::Other(q) => q.stall(max).await,
        }
    }

    /// basic.get: `take` gets the head message and the count left; false if it is empty. Fails
    /// only for a queue of another kind that cannot be reached.
    pub fn get(&self, ack_mode: bool, take: impl FnOnce(&QueuedMessage, u32)) -> AmqpResult<bool> {
        match self {
            QueueRef::Local(q) => Ok(q.get(ack_mode, take)),
            QueueRef::Stream(q) => Err(crate::error::AmqpError::not_implemented(format!(
                "basic.get not supported by stream queues {}",
                q.describe()
            ))),
            QueueRef::Other(q) => {
                let mut take = Some(take);
                q.clone().get(ack_mode, &mut |m, n| {
                    if let Some(t) = take.take() {
                        t(m, n)
                    }
                })
            }
        }
    }

    #[inline]
    pub fn settle(&self, msgs: impl IntoIterator<Item = Settled>, dispatch: bool) {
        match self {
            QueueRef::Local(q) => q.settle(msgs, dispatch),
            QueueRef::Stream(q) => q.settle(msgs),
            QueueRef::Other(q) => q.settle(&mut msgs.into_iter()),
        }
    }

    pub fn discard(&self, msgs: impl IntoIterator<Item = Settled>, dispatch: bool) {
        match self {
            QueueRef::Local(q) => q.discard(msgs, dispatch),
            QueueRef::Stream(q) => q.settle(msgs),
            QueueRef::Other(q) => q.discard(&mut msgs.into_iter()),
        }
    }

    /// See [`QueueKind::holds_retries`].
    pub fn holds_retries(&self) -> bool {
        match self {
            QueueRef::Other(q) => q.holds_retries(),
            _ => false,
        }
    }

    /// See [`QueueKind::requeue_failed`].
    pub fn requeue_failed(&self, msgs: impl IntoIterator<Item = Settled>, failed: bool) {
        match self {
            QueueRef::Other(q) => q.requeue_failed(&mut msgs.into_iter(), failed),
            _ => self.requeue(msgs),
        }
    }

    pub fn requeue(&self, msgs: impl IntoIterator<Item = Settled>) {
        match self {
            QueueRef::Local(q) => q.requeue(msgs),
            QueueRef::Stream(q) => q.settle(msgs),
            QueueRef::Other(q) => q.requeue(&mut msgs.into_iter()),
        }
    }

    pub fn dispatch(&self) {
        match self {
            QueueRef::Local(q) => q.dispatch(),
            QueueRef::Stream(q) => q.dispatch(),
            QueueRef::Other(q) => q.dispatch(),
        }
    }

    pub fn add_consumer(&self, c: Arc<Consumer>, on_added: impl FnOnce()) -> AmqpResult<()> {
        match self {
            QueueRef::Local(q) => q.add_consumer(c, on_added),
            // A stream consumer names its offset: the channel adds it with `Stream::add_consumer`.
            QueueRef::Stream(q) => q.add_consumer(c, super::stream::StartAt::Next, on_added),
            QueueRef::Other(q) => {
                let mut on_added = Some(on_added);
                q.clone().add_consumer(c, &mut || {
                    if let Some(f) = on_added.take() {
                        f()
                    }
                })
            }
        }
    }

    /// True if the queue is auto-delete and this was its last consumer (a queue of another
    /// kind decides that where it runs).
    pub fn remove_consumer(&self, c: &Arc<Consumer>) -> bool {
        match self {
            QueueRef::Local(q) => q.remove_consumer(c).auto_delete_now,
            QueueRef::Stream(q) => {
                q.remove_consumer(c);
                false
            }
            QueueRef::Other(q) => {
                q.remove_consumer(c);
                false
            }
        }
    }

    pub fn message_count(&self) -> u32 {
        match self {
            QueueRef::Local(q) => q.message_count(),
            QueueRef::Stream(q) => q.message_count(),
            QueueRef::Other(q) => q.message_count(),
        }
    }

    pub fn unacked_count(&self) -> u32 {
        match self {
            QueueRef::Local(q) => q.unacked_count(),
            QueueRef::Stream(q) => q.unacked_count(),
            QueueRef::Other(q) => q.unacked_count(),
        }
    }

    pub fn consumer_count(&self) -> u32 {
        match self {
            QueueRef::Local(q) => q.consumer_count(),
            QueueRef::Stream(q) => q.consumer_count(),
            QueueRef::Other(q) => q.consumer_count(),
        }
    }

    /// Nothing ready, and a consumer of priority 0 or more has credit: when a federated
    /// queue's links fetch from their upstreams (RabbitMQ's federation queue decorator). Known
    /// where the queue's state is: a queue that runs here, a replicated queue's member; false
    /// elsewhere, and for a stream.
    pub fn starving(&self) -> bool {
        match self {
            QueueRef::Local(q) => q.starving(),
            QueueRef::Stream(_) => false,
            QueueRef::Other(q) => q.starving(),
        }
    }

    /// Its consumers (of a queue on another node: those on this node).
    pub fn consumers(&self) -> Vec<Arc<Consumer>> {
        match self {
            QueueRef::Local(q) => q.consumers(),
            QueueRef::Stream(q) => q.consumers(),
            QueueRef::Other(q) => q.consumers(),
        }
    }

    pub fn purge(&self) -> u32 {
        match self {
            QueueRef::Local(q) => q.purge(),
            // The channel refuses a purge first (540, as RabbitMQ); elsewhere it removes nothing.
            QueueRef::Stream(_) => 0,
            QueueRef::Other(q) => q.purge(),
        }
    }

    /// Deletes it: its ready count and its consumers (to be told of the cancel).
    pub fn mark_deleted(&self) -> (u32, Vec<Arc<Consumer>>) {
        match self {
            QueueRef::Local(q) => q.mark_deleted(),
            // RabbitMQ answers delete-ok with 0 messages for a stream.
            QueueRef::Stream(q) => (0, q.mark_deleted()),
            QueueRef::Other(q) => q.mark_deleted(),
        }
    }

    pub fn is_deleted(&self) -> bool {
        match self {
            QueueRef::Local(q) => q.is_deleted(),
            QueueRef::Stream(q) => q.is_deleted(),
            QueueRef::Other(q) => q.is_deleted(),
        }
    }

    /// Marks it used now, for `x-expires` (a remote queue's home sees its own use).
    pub fn touch(&self) {
        match self {
            QueueRef::Local(q) => q.touch(),
            QueueRef::Stream(_) => {}
            QueueRef::Other(q) => q.touch(),
        }
    }

    pub fn lease_expired(&self, now: u64) -> bool {
        match self {
            QueueRef::Local(q) => q.lease_expired(now),
            QueueRef::Stream(_) => false,
            QueueRef::Other(q) => q.lease_expired(now),
        }
    }

    /// Holds a message with a deadline: the sweeper should visit it.
    pub fn may_expire(&self) -> bool {
        match self {
            QueueRef::Local(q) => q.may_expire.load(std::sync::atomic::Ordering::Relaxed),
            // Age retention is checked on the sweeper's visits.
            QueueRef::Stream(q) => q.may_expire(),
            QueueRef::Other(q) => q.may_expire(),
        }
    }

    pub fn expire(&self) {
        match self {
            QueueRef::Local(q) => q.expire(),
            QueueRef::Stream(q) => q.expire(),
            QueueRef::Other(q) => q.expire(),
        }
    }
}
