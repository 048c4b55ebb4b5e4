//! The hook through which a replicated queue's leader leg runs on a classic queue host: the
//! replication module (`cluster/quorum/leg.rs`) implements it, the queue calls it at the few
//! points where a leader differs from a classic queue. The leader's queue publishes through
//! the group ([`LeaderHook::publish`]) and takes committed publishes in
//! ([`LeaderCtx::publish_as`]); it delivers only what the group recorded as claimed
//! ([`LeaderIo::hold_back`]); reads its paged tail back from the group's log
//! ([`LeaderIo::page_in`]); settles what leaves for good through the group
//! ([`LeaderIo::effect`]); and is retired when its node no longer leads ([`Queue::retire`]).
//! A classic queue has no hook and pays one `None` check at each point.
//!
//! Moved here as it was; the replicated-core issue replaces it next.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use warren_queue::{Effect, PagedIn};

use super::{
    Consumer, Core, Ctx, Enqueued, Queue, QueueOptions, QueueOwner, QueuedMessage, Reason,
};
use crate::confirm::ConfirmHandle;
use crate::message::Message;
use crate::metrics::bump;

/// The leader's side that needs no queue lock (held by the queue, shared with the group).
pub trait LeaderHook: Send + Sync {
    /// A publish: `Accepted` once handed to the group (it enters the queue when committed),
    /// `Rejected` when the leg is retired (its confirm would be a lie).
    fn publish(&self, msg: Arc<Message>, confirm: Option<&Arc<ConfirmHandle>>) -> Enqueued;
    /// Still replicating (not retired): every publish is stored by the group.
    fn replicating(&self) -> bool;
    /// The group falls behind: publishers stall on [`LeaderHook::stall`].
    fn pressured(&self) -> bool;
    fn stall(&self, max: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
    /// A requeued message's return count, kept by the group; `None` once retired.
    fn returned(&self, seq: u64) -> Option<u32>;
    /// What the state under the lock left to do, once the lock is released.
    fn after_lock(&self, q: &Arc<Queue>, p: Pending);
    /// The node no longer leads: stop replicating.
    fn retire(&self);
}

/// The leader's state kept under the queue's lock, beside the state machine.
pub trait LeaderIo: Send {
    /// An offer of `m`: true to hold it back until the group records its claim.
    fn hold_back(&mut self, m: &QueuedMessage) -> bool;
    /// basic.get took `seq`: it cannot wait for the group, its claim follows it.
    fn got(&mut self, seq: u64);
    /// Reads the paged tail back from the group's log.
    fn page_in(
        &mut self,
        q: &Queue,
        remaining: usize,
        now: &mut dyn FnMut() -> u64,
        out: &mut Vec<QueuedMessage>,
    ) -> PagedIn;
    fn can_page(&self) -> bool;
    /// An effect of the state machine: taken here (`None`), or handed back for the host.
    fn effect<'e>(
        &mut self,
        q: &Queue,
        e: Effect<'e, Arc<Message>>,
    ) -> Option<Effect<'e, Arc<Message>>>;
    /// What is left to do once the lock is released ([`LeaderHook::after_lock`]).
    fn take_pending(&mut self) -> Option<Pending>;
    /// The node no longer leads: what leaves from now on is not settled.
    fn retire(&mut self);
    /// For the replication module's own state ([`LeaderCtx::io`]).
    fn as_any(&mut self) -> &mut dyn Any;
}

/// What a leader's state left to do after the lock: claims to ask for, dead letters to keep.
#[derive(Default)]
pub struct Pending {
    /// The lowest unclaimed message an offer was held back for.
    pub want_claim: Option<u64>,
    /// At-least-once dead letters: the message's id, its message and why.
    pub dead_kept: Vec<(u64, Arc<Message>, Reason)>,
}

/// The leader's state and the queue's state machine, under the queue's lock.
pub struct LeaderCtx<'a, 'b> {
    q: &'a Arc<Queue>,
    core: &'a mut Core,
    host: &'a mut Ctx<'b>,
}

impl LeaderCtx<'_, '_> {
    /// The replication module's state (a leader queue always has one).
    pub fn io(&mut self) -> &mut dyn LeaderIo {
        self.host
            .io
            .leader
            .as_deref_mut()
            .expect("a leader queue has its state")
    }

    /// A committed publish, numbered `id` by the group's log; false if the queue refused it
    /// (full, reject-publish) or is gone.
    pub fn publish_as(&mut self, id: u64, msg: Arc<Message>, redelivered: bool) -> bool {
        self.host.io.outbox_bound = false;
        match self.core.publish_as(id, msg, redelivered, self.host) {
            warren_queue::Published::Accepted { .. } => bump(&self.q.stats.publish, 1),
            _ => return false,
        }
        self.q.after_publish(self.core, self.host);
        true
    }

    /// Takes over the replica's messages as a paged tail: `count` of `bytes`; ids go on from
    /// `next_id`.
    pub fn recover(&mut self, next_id: u64, count: usize, bytes: u64) {
        self.core.recover(next_id, count, bytes, self.host);
        self.q
            .may_expire
            .store(self.core.may_expire(), Ordering::Relaxed);
    }

    pub fn dispatch(&mut self) {
        self.core.dispatch(self.host);
    }
}

impl Queue {
    /// The leader's queue of a replicated queue (`cluster/quorum/`), replicating through
    /// `hook`, with `io` its state under the lock: no log of its own.
    pub fn leader<O: QueueOwner + 'static>(
        name: Arc<str>,
        vhost: Arc<str>,
        options: QueueOptions,
        owner: Weak<O>,
        hook: Arc<dyn LeaderHook>,
        io: Box<dyn LeaderIo>,
    ) -> Arc<Queue> {
        Self::build(name, vhost, options, owner, None, Some((hook, io)))
    }

    /// Runs `f` under the queue's lock on a leader's state and state machine, then does what
    /// its effects left (as every command does).
    pub fn with_leader<R>(self: &Arc<Self>, f: impl FnOnce(&mut LeaderCtx<'_, '_>) -> R) -> R {
        self.locked(|q, core, host| f(&mut LeaderCtx { q, core, host }))
    }

    /// Retires the leader's queue of a replicated queue (this node no longer leads): it stops
    /// replicating, so what it drops is not settled, refuses publishes, and is deleted.
    /// Returns its consumers, to be told of the cancel.
    pub fn retire(self: &Arc<Self>) -> Vec<Arc<Consumer>> {
        if let Some(h) = &self.leader {
            h.retire();
        }
        if let Some(l) = self.state.lock().io.leader.as_deref_mut() {
            l.retire();
        }
        self.mark_deleted().1
    }

    /// An earlier leader may have delivered these: their next delivery says so.
    pub fn mark_redelivered(self: &Arc<Self>, ids: impl IntoIterator<Item = u64>) {
        let mut st = self.state.lock();
        for id in ids {
            st.core.mark_redelivered(id);
        }
    }

    /// Deliveries the consumers could take now beyond the ready messages (a guess at how many
    /// of the next publishes go straight out, so they are claimed with their enqueue).
    pub fn spare_credit(&self) -> usize {
        let st = self.state.lock();
        let mut spare = 0usize;
        for c in st.core.consumers() {
            spare = spare.saturating_add(if c.no_ack || c.prefetch == 0 {
                usize::MAX / 4
            } else {
                c.prefetch.saturating_sub(c.outstanding) as usize
            });
        }
        spare.saturating_sub(st.core.ready_len())
    }
}
