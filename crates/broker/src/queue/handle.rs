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

use crate::confirm::ConfirmHandle;
use crate::error::AmqpResult;
use crate::flow::SpaceWaiter;
use crate::message::Message;

use crate::cluster::quorum::QuorumQueue;
use crate::cluster::remote::RemoteQueue;

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
    /// A delivery from queue `q`, already counted against the consumer's credit where it runs
    /// (another node): taken whatever the channel's limits; false if the channel is closing.
    fn push(&self, _c: &Arc<Consumer>, _q: QueueRef, _m: &QueuedMessage) -> bool {
        false
    }
}

/// A queue, wherever it runs.
#[derive(Clone)]
pub enum QueueRef {
    /// On this node, run inline under its own lock.
    Local(Arc<Queue>),
    /// On another node of the cluster: its operations go over the link to its home.
    Remote(Arc<RemoteQueue>),
    /// A stream on this node (`queue/stream/`): an append-only log read from offsets.
    Stream(Arc<Stream>),
    /// A replicated queue (`cluster/quorum/`): served by its group's leader, through
    /// [`QuorumQueue::leg`] (a `Local` queue where this node leads, else a `Remote` one).
    Quorum(Arc<QuorumQueue>),
}

impl std::fmt::Debug for QueueRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueRef::Local(q) => q.fmt(f),
            QueueRef::Remote(q) => q.fmt(f),
            QueueRef::Stream(q) => q.fmt(f),
            QueueRef::Quorum(q) => q.fmt(f),
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
            QueueRef::Remote(q) => Arc::as_ptr(q) as usize,
            QueueRef::Stream(q) => Arc::as_ptr(q) as usize,
            QueueRef::Quorum(q) => Arc::as_ptr(q) as usize,
        }
    }
}

impl QueueRef {
    /// The queue when it runs on this node (its log, its persister, its outbox waits).
    #[inline]
    pub fn local(&self) -> Option<&Arc<Queue>> {
        match self {
            QueueRef::Local(q) => Some(q),
            QueueRef::Remote(_) | QueueRef::Stream(_) | QueueRef::Quorum(_) => None,
        }
    }

    /// What serves it now: a replicated queue's leg (its leader's local queue, or a remote
    /// handle to it), so that deliveries and their settles stay with one leader; any other
    /// queue itself.
    pub fn resolved(self) -> AmqpResult<QueueRef> {
        match self {
            QueueRef::Quorum(q) => {
                if let Some(l) = q.leg() {
                    return Ok(l);
                }
                // An election under way, or a node that learns the leader by asking the
                // members (a queue declared a moment ago elsewhere): wait a little for it.
                let found = tokio::runtime::Handle::try_current().ok().and_then(|h| {
                    let q = q.clone();
                    tokio::task::block_in_place(|| {
                        h.block_on(q.wait_leader(std::time::Duration::from_secs(3)))
                    })
                    .then_some(())
                });
                match found.and_then(|_| q.leg()) {
                    Some(l) => Ok(l),
                    None => Err(q.unavailable()),
                }
            }
            q => Ok(q),
        }
    }

    /// The remote handle this node uses for it now: a queue homed elsewhere, or a replicated
    /// queue led elsewhere (publish credit, counts and link failures are the handle's).
    pub fn remote_leg(&self) -> Option<Arc<RemoteQueue>> {
        match self {
            QueueRef::Remote(q) => Some(q.clone()),
            QueueRef::Quorum(q) => q.leg().and_then(|l| l.remote().cloned()),
            _ => None,
        }
    }

    /// The replicated queue, if it is one.
    pub fn quorum(&self) -> Option<&Arc<QuorumQueue>> {
        match self {
            QueueRef::Quorum(q) => Some(q),
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
            QueueRef::Stream(_) => "stream",
            QueueRef::Quorum(q) if q.mirrored() => "classic",
            QueueRef::Quorum(_) => "quorum",
            _ => "classic",
        }
    }

    /// Its message counts, for a queue on this node.
    pub fn stats(&self) -> Option<&crate::metrics::QueueStats> {
        match self {
            QueueRef::Local(q) => Some(&q.stats),
            QueueRef::Stream(s) => Some(&s.stats),
            QueueRef::Remote(_) | QueueRef::Quorum(_) => None,
        }
    }

    /// The id of its log directory, for a queue with one on this node.
    pub fn store_id(&self) -> Option<u64> {
        match self {
            QueueRef::Local(q) => q.store_id,
            QueueRef::Stream(s) => Some(s.store_id),
            QueueRef::Remote(_) | QueueRef::Quorum(_) => None,
        }
    }

    /// The queue when its home is another node.
    pub fn remote(&self) -> Option<&Arc<RemoteQueue>> {
        match self {
            QueueRef::Remote(q) => Some(q),
            QueueRef::Local(_) | QueueRef::Stream(_) | QueueRef::Quorum(_) => None,
        }
    }

    #[inline]
    pub fn ptr_eq(&self, other: &QueueRef) -> bool {
        self.key() == other.key()
    }

    pub fn name(&self) -> &Arc<str> {
        match self {
            QueueRef::Local(q) => &q.name,
            QueueRef::Remote(q) => &q.name,
            QueueRef::Stream(q) => &q.name,
            QueueRef::Quorum(q) => &q.name,
        }
    }

    pub fn vhost(&self) -> &Arc<str> {
        match self {
            QueueRef::Local(q) => &q.vhost,
            QueueRef::Remote(q) => &q.vhost,
            QueueRef::Stream(q) => &q.vhost,
            QueueRef::Quorum(q) => &q.vhost,
        }
    }

    /// As declared.
    pub fn options(&self) -> &QueueOptions {
        match self {
            QueueRef::Local(q) => &q.options,
            QueueRef::Remote(q) => &q.options,
            QueueRef::Stream(q) => &q.options,
            QueueRef::Quorum(q) => &q.options,
        }
    }

    /// The node it runs on (`None`: this one); a replicated queue's leader, its first member
    /// while it has none.
    pub fn home(&self) -> Option<String> {
        match self {
            QueueRef::Local(_) | QueueRef::Stream(_) => None,
            QueueRef::Remote(q) => Some(q.home.clone()),
            QueueRef::Quorum(q) => match q.leg() {
                Some(QueueRef::Local(_)) => None,
                Some(QueueRef::Remote(r)) => Some(r.home.clone()),
                _ => q.members().first().cloned(),
            },
        }
    }

    /// The arguments in force (declared, merged with a policy).
    pub fn args(&self) -> arc_swap::Guard<Arc<QueueArgs>> {
        match self {
            QueueRef::Local(q) => q.args(),
            QueueRef::Remote(q) => q.args(),
            QueueRef::Stream(q) => q.args(),
            QueueRef::Quorum(q) => q.args(),
        }
    }

    pub fn set_effective_args(&self, a: QueueArgs) {
        match self {
            QueueRef::Local(q) => q.set_effective_args(a),
            QueueRef::Remote(q) => q.set_effective_args(a),
            QueueRef::Stream(q) => q.set_effective_args(a),
            QueueRef::Quorum(q) => q.set_effective_args(a),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            QueueRef::Local(q) => q.describe(),
            QueueRef::Remote(q) => q.describe(),
            QueueRef::Stream(q) => q.describe(),
            QueueRef::Quorum(q) => q.describe(),
        }
    }

    #[inline]
    pub fn publish(&self, msg: Arc<Message>, confirm: Option<&Arc<ConfirmHandle>>) -> Enqueued {
        match self {
            QueueRef::Local(q) => q.publish(msg, confirm),
            QueueRef::Remote(q) => q.publish(msg, confirm),
            QueueRef::Stream(q) => q.publish(msg, confirm),
            QueueRef::Quorum(q) => match q.leg() {
                Some(l) => l.publish(msg, confirm),
                None => Enqueued::Rejected,
            },
        }
    }

    /// A persistent message published here is stored, and its confirm waits for the fsync.
    /// A remote queue's confirm always waits for its home's answer.
    #[inline]
    pub fn stores(&self, msg: &Message) -> bool {
        match self {
            QueueRef::Local(q) => q.stores(msg),
            QueueRef::Remote(_) | QueueRef::Stream(_) | QueueRef::Quorum(_) => true,
        }
    }

    /// Consumers fall behind; publishers should stall (see [`QueueRef::stall`]).
    #[inline]
    pub fn pressured(&self) -> bool {
        match self {
            QueueRef::Local(q) => q.pressured(),
            QueueRef::Remote(q) => q.pressured(),
            QueueRef::Stream(q) => q.pressured(),
            QueueRef::Quorum(q) => q.leg().is_some_and(|l| l.pressured()),
        }
    }

    pub async fn stall(&self, max: std::time::Duration) {
        match self {
            QueueRef::Local(q) => q.stall(max).await,
            QueueRef::Remote(q) => q.stall(max).await,
            QueueRef::Stream(q) => q.stall(max).await,
            QueueRef::Quorum(q) => {
                if let Some(l) = q.leg() {
                    Box::pin(l.stall(max)).await
                }
            }
        }
    }

    /// basic.get: `take` gets the head message and the count left; false if it is empty. Fails
    /// only for a remote queue whose home is down.
    pub fn get(&self, ack_mode: bool, take: impl FnOnce(&QueuedMessage, u32)) -> AmqpResult<bool> {
        match self {
            QueueRef::Local(q) => Ok(q.get(ack_mode, take)),
            QueueRef::Remote(q) => q.get(ack_mode, take),
            QueueRef::Stream(q) => Err(crate::error::AmqpError::not_implemented(format!(
                "basic.get not supported by stream queues {}",
                q.describe()
            ))),
            QueueRef::Quorum(q) => match q.leg() {
                Some(l) => l.get(ack_mode, take),
                None => Err(q.unavailable()),
            },
        }
    }

    #[inline]
    pub fn settle(&self, msgs: impl IntoIterator<Item = Settled>, dispatch: bool) {
        match self {
            QueueRef::Local(q) => q.settle(msgs, dispatch),
            QueueRef::Remote(q) => q.settle(msgs),
            QueueRef::Stream(q) => q.settle(msgs),
            // Deliveries name the leg they came from: a quorum queue's are never settled here.
            QueueRef::Quorum(q) => drop_settles(q, msgs),
        }
    }

    pub fn discard(&self, msgs: impl IntoIterator<Item = Settled>, dispatch: bool) {
        match self {
            QueueRef::Local(q) => q.discard(msgs, dispatch),
            QueueRef::Remote(q) => q.discard(msgs),
            QueueRef::Stream(q) => q.settle(msgs),
            QueueRef::Quorum(q) => drop_settles(q, msgs),
        }
    }

    pub fn requeue(&self, msgs: impl IntoIterator<Item = Settled>) {
        match self {
            QueueRef::Local(q) => q.requeue(msgs),
            QueueRef::Remote(q) => q.requeue(msgs),
            QueueRef::Stream(q) => q.settle(msgs),
            QueueRef::Quorum(q) => drop_settles(q, msgs),
        }
    }

    pub fn dispatch(&self) {
        match self {
            QueueRef::Local(q) => q.dispatch(),
            QueueRef::Stream(q) => q.dispatch(),
            QueueRef::Quorum(q) => {
                if let Some(l) = q.leg() {
                    l.dispatch()
                }
            }
            QueueRef::Remote(_) => {}
        }
    }

    pub fn add_consumer(&self, c: Arc<Consumer>, on_added: impl FnOnce()) -> AmqpResult<()> {
        match self {
            QueueRef::Local(q) => q.add_consumer(c, on_added),
            QueueRef::Remote(q) => q.add_consumer(c, on_added),
            // A stream consumer names its offset: the channel adds it with `Stream::add_consumer`.
            QueueRef::Stream(q) => q.add_consumer(c, super::stream::StartAt::Next, on_added),
            QueueRef::Quorum(q) => match q.leg() {
                Some(l) => l.add_consumer(c, on_added),
                None => Err(q.unavailable()),
            },
        }
    }

    /// True if the queue is auto-delete and this was its last consumer (a remote queue's
    /// home decides that itself).
    pub fn remove_consumer(&self, c: &Arc<Consumer>) -> bool {
        match self {
            QueueRef::Local(q) => q.remove_consumer(c).auto_delete_now,
            QueueRef::Remote(q) => {
                q.remove_consumer(c);
                false
            }
            QueueRef::Stream(q) => {
                q.remove_consumer(c);
                false
            }
            QueueRef::Quorum(q) => {
                if let Some(l) = q.leg() {
                    l.remove_consumer(c);
                }
                false
            }
        }
    }

    pub fn message_count(&self) -> u32 {
        match self {
            QueueRef::Local(q) => q.message_count(),
            QueueRef::Remote(q) => q.counts().messages,
            QueueRef::Stream(q) => q.message_count(),
            QueueRef::Quorum(q) => q.leg().map_or(0, |l| l.message_count()),
        }
    }

    pub fn unacked_count(&self) -> u32 {
        match self {
            QueueRef::Local(q) => q.unacked_count(),
            QueueRef::Remote(q) => q.counts().unacked,
            QueueRef::Stream(q) => q.unacked_count(),
            QueueRef::Quorum(q) => q.leg().map_or(0, |l| l.unacked_count()),
        }
    }

    pub fn consumer_count(&self) -> u32 {
        match self {
            QueueRef::Local(q) => q.consumer_count(),
            QueueRef::Remote(q) => q.counts().consumers,
            QueueRef::Stream(q) => q.consumer_count(),
            QueueRef::Quorum(q) => q.leg().map_or(0, |l| l.consumer_count()),
        }
    }

    /// Its consumers (of a remote queue: those on this node).
    pub fn consumers(&self) -> Vec<Arc<Consumer>> {
        match self {
            QueueRef::Local(q) => q.consumers(),
            QueueRef::Remote(q) => q.local_consumers(),
            QueueRef::Stream(q) => q.consumers(),
            QueueRef::Quorum(q) => q.leg().map_or_else(Vec::new, |l| l.consumers()),
        }
    }

    pub fn purge(&self) -> u32 {
        match self {
            QueueRef::Local(q) => q.purge(),
            QueueRef::Remote(q) => q.purge(),
            // The channel refuses a purge first (540, as RabbitMQ); elsewhere it removes nothing.
            QueueRef::Stream(_) => 0,
            QueueRef::Quorum(q) => q.leg().map_or(0, |l| l.purge()),
        }
    }

    /// Deletes it: its ready count and its consumers (to be told of the cancel).
    pub fn mark_deleted(&self) -> (u32, Vec<Arc<Consumer>>) {
        match self {
            QueueRef::Local(q) => q.mark_deleted(),
            QueueRef::Remote(q) => q.mark_deleted(),
            // RabbitMQ answers delete-ok with 0 messages for a stream.
            QueueRef::Stream(q) => (0, q.mark_deleted()),
            QueueRef::Quorum(q) => q.mark_deleted(),
        }
    }

    pub fn is_deleted(&self) -> bool {
        match self {
            QueueRef::Local(q) => q.is_deleted(),
            QueueRef::Remote(q) => q.is_deleted(),
            QueueRef::Stream(q) => q.is_deleted(),
            QueueRef::Quorum(q) => q.is_deleted(),
        }
    }

    /// Marks it used now, for `x-expires` (a remote queue's home sees its own use).
    pub fn touch(&self) {
        match self {
            QueueRef::Local(q) => q.touch(),
            // The leader's queue keeps a replicated queue's lease (its sweeper decides).
            QueueRef::Quorum(q) => {
                if let Some(QueueRef::Local(l)) = q.leg() {
                    l.touch()
                }
            }
            _ => {}
        }
    }

    pub fn lease_expired(&self, now: u64) -> bool {
        match self {
            QueueRef::Local(q) => q.lease_expired(now),
            QueueRef::Quorum(q) => match q.leg() {
                Some(QueueRef::Local(l)) => l.lease_expired(now),
                _ => false,
            },
            QueueRef::Remote(_) | QueueRef::Stream(_) => false,
        }
    }

    /// Holds a message with a deadline: the sweeper should visit it.
    pub fn may_expire(&self) -> bool {
        match self {
            QueueRef::Local(q) => q.may_expire.load(std::sync::atomic::Ordering::Relaxed),
            // Age retention is checked on the sweeper's visits.
            QueueRef::Stream(q) => q.may_expire(),
            QueueRef::Quorum(q) => q.leg().is_some_and(|l| l.may_expire()),
            QueueRef::Remote(_) => false,
        }
    }

    pub fn expire(&self) {
        match self {
            QueueRef::Local(q) => q.expire(),
            QueueRef::Stream(q) => q.expire(),
            QueueRef::Quorum(q) => {
                if let Some(l) = q.leg() {
                    l.expire()
                }
            }
            QueueRef::Remote(_) => {}
        }
    }
}

/// Settles addressed to a quorum queue itself rather than to the leg that delivered them: a
/// bookkeeping slip, since the ids they carry may mean nothing to the current leader.
fn drop_settles(q: &QuorumQueue, msgs: impl IntoIterator<Item = Settled>) {
    let n = msgs.into_iter().count();
    if n > 0 {
        tracing::debug!(queue = %q.name, n, "settles addressed to a quorum queue ignored");
    }
}
