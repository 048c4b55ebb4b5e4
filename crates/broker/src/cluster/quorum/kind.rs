//! A replicated queue as the queue layer dispatches to it ([`crate::queue::QueueKind`]): served
//! by its group's leader, through [`QuorumQueue::leg`] (a `Local` queue where this node leads,
//! else a handle to the leader's node), so that deliveries and their settles stay with one
//! leader.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::QuorumQueue;
use crate::confirm::ConfirmHandle;
use crate::error::AmqpResult;
use crate::message::Message;
use crate::queue::{
    Consumer, Counts, Enqueued, QueueArgs, QueueKind, QueueOptions, QueueRef, QueuedMessage,
    Settled,
};

impl QueueKind for QuorumQueue {
    fn name(&self) -> &Arc<str> {
        &self.name
    }
    fn vhost(&self) -> &Arc<str> {
        &self.vhost
    }
    fn options(&self) -> &QueueOptions {
        &self.options
    }
    fn type_name(&self) -> &'static str {
        if self.mirrored() {
            "classic"
        } else {
            "quorum"
        }
    }
    /// Its leader's node, its first member while it has none.
    fn home(&self) -> Option<String> {
        match self.leg() {
            Some(l) => l.home(),
            None => self.members().first().cloned(),
        }
    }
    fn resolved(self: Arc<Self>) -> AmqpResult<QueueRef> {
        if let Some(l) = self.leg() {
            return Ok(l);
        }
        // An election under way, or a node that learns the leader by asking the members (a
        // queue declared a moment ago elsewhere): wait a little for it.
        let found = tokio::runtime::Handle::try_current().ok().and_then(|h| {
            let q = self.clone();
            tokio::task::block_in_place(|| h.block_on(q.wait_leader(Duration::from_secs(3))))
                .then_some(())
        });
        match found.and_then(|_| self.leg()) {
            Some(l) => Ok(l),
            None => Err(self.unavailable()),
        }
    }
    fn args(&self) -> arc_swap::Guard<Arc<QueueArgs>> {
        QuorumQueue::args(self)
    }
    fn set_effective_args(&self, a: QueueArgs) {
        QuorumQueue::set_effective_args(self, a)
    }
    fn describe(&self) -> String {
        QuorumQueue::describe(self)
    }
    fn publish(&self, msg: Arc<Message>, confirm: Option<&Arc<ConfirmHandle>>) -> Enqueued {
        match self.leg() {
            Some(l) => l.publish(msg, confirm),
            None => Enqueued::Rejected,
        }
    }
    fn pressured(&self) -> bool {
        self.leg().is_some_and(|l| l.pressured())
    }
    fn stall(&self, max: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if let Some(l) = self.leg() {
                l.stall(max).await
            }
        })
    }
    fn get(
        self: Arc<Self>,
        ack_mode: bool,
        take: &mut dyn FnMut(&QueuedMessage, u32),
    ) -> AmqpResult<bool> {
        match self.leg() {
            Some(l) => l.get(ack_mode, take),
            None => Err(self.unavailable()),
        }
    }
    // Deliveries name the leg they came from: a quorum queue's are never settled here.
    fn settle(&self, msgs: &mut dyn Iterator<Item = Settled>) {
        self.drop_settles(msgs)
    }
    fn discard(&self, msgs: &mut dyn Iterator<Item = Settled>) {
        self.drop_settles(msgs)
    }
    fn requeue(&self, msgs: &mut dyn Iterator<Item = Settled>) {
        self.drop_settles(msgs)
    }
    fn dispatch(&self) {
        if let Some(l) = self.leg() {
            l.dispatch()
        }
    }
    fn add_consumer(
        self: Arc<Self>,
        c: Arc<Consumer>,
        on_added: &mut dyn FnMut(),
    ) -> AmqpResult<()> {
        match self.leg() {
            Some(l) => l.add_consumer(c, on_added),
            None => Err(self.unavailable()),
        }
    }
    fn remove_consumer(&self, c: &Arc<Consumer>) {
        if let Some(l) = self.leg() {
            l.remove_consumer(c);
        }
    }
    fn message_count(&self) -> u32 {
        self.leg().map_or(0, |l| l.message_count())
    }
    fn unacked_count(&self) -> u32 {
        self.leg().map_or(0, |l| l.unacked_count())
    }
    fn consumer_count(&self) -> u32 {
        self.leg().map_or(0, |l| l.consumer_count())
    }
    fn consumers(&self) -> Vec<Arc<Consumer>> {
        self.leg().map_or_else(Vec::new, |l| l.consumers())
    }
    fn purge(&self) -> u32 {
        self.leg().map_or(0, |l| l.purge())
    }
    fn mark_deleted(&self) -> (u32, Vec<Arc<Consumer>>) {
        QuorumQueue::mark_deleted(self)
    }
    fn is_deleted(&self) -> bool {
        QuorumQueue::is_deleted(self)
    }
    /// The leader's queue keeps a replicated queue's lease (its sweeper decides).
    fn touch(&self) {
        if let Some(QueueRef::Local(l)) = self.leg() {
            l.touch()
        }
    }
    fn lease_expired(&self, now: u64) -> bool {
        match self.leg() {
            Some(QueueRef::Local(l)) => l.lease_expired(now),
            _ => false,
        }
    }
    fn may_expire(&self) -> bool {
        self.leg().is_some_and(|l| l.may_expire())
    }
    fn expire(&self) {
        if let Some(l) = self.leg() {
            l.expire()
        }
    }
    /// Led elsewhere: its leader's node answers.
    fn home_counts(&self) -> Option<AmqpResult<Counts>> {
        self.leg().and_then(|l| l.home_counts())
    }
    fn group(&self) -> Option<(u64, Vec<String>)> {
        Some((self.group, self.members()))
    }
    fn leader(&self) -> Option<String> {
        QuorumQueue::leader(self)
    }
    fn mirrored(&self) -> bool {
        QuorumQueue::mirrored(self)
    }
    fn as_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

impl QuorumQueue {
    /// Settles addressed to a quorum queue itself rather than to the leg that delivered them:
    /// a bookkeeping slip, since the ids they carry may mean nothing to the current leader.
    fn drop_settles(&self, msgs: &mut dyn Iterator<Item = Settled>) {
        let n = msgs.count();
        if n > 0 {
            tracing::debug!(queue = %self.name, n, "settles addressed to a quorum queue ignored");
        }
    }
}
