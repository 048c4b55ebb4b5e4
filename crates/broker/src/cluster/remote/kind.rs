//! A queue whose home is another node, as the queue layer dispatches to it
//! ([`crate::queue::QueueKind`]): every operation goes over the link to its home.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::queue::RemoteQueue;
use crate::confirm::ConfirmHandle;
use crate::error::AmqpResult;
use crate::message::Message;
use crate::queue::{
    Consumer, Counts, Enqueued, QueueArgs, QueueKind, QueueOptions, QueueRef, QueuedMessage,
    Settled,
};

impl QueueKind for RemoteQueue {
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
        "classic"
    }
    fn home(&self) -> Option<String> {
        Some(self.home.clone())
    }
    fn resolved(self: Arc<Self>) -> AmqpResult<QueueRef> {
        Ok(QueueRef::Other(self))
    }
    fn args(&self) -> arc_swap::Guard<Arc<QueueArgs>> {
        RemoteQueue::args(self)
    }
    fn set_effective_args(&self, a: QueueArgs) {
        RemoteQueue::set_effective_args(self, a)
    }
    fn describe(&self) -> String {
        RemoteQueue::describe(self)
    }
    fn publish(&self, msg: Arc<Message>, confirm: Option<&Arc<ConfirmHandle>>) -> Enqueued {
        RemoteQueue::publish(self, msg, confirm)
    }
    fn pressured(&self) -> bool {
        RemoteQueue::pressured(self)
    }
    fn stall(&self, max: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(RemoteQueue::stall(self, max))
    }
    fn get(
        self: Arc<Self>,
        ack_mode: bool,
        take: &mut dyn FnMut(&QueuedMessage, u32),
    ) -> AmqpResult<bool> {
        RemoteQueue::get(&self, ack_mode, take)
    }
    fn settle(&self, msgs: &mut dyn Iterator<Item = Settled>) {
        RemoteQueue::settle(self, msgs)
    }
    fn discard(&self, msgs: &mut dyn Iterator<Item = Settled>) {
        RemoteQueue::discard(self, msgs)
    }
    fn requeue(&self, msgs: &mut dyn Iterator<Item = Settled>) {
        RemoteQueue::requeue(self, msgs)
    }
    fn dispatch(&self) {
        RemoteQueue::dispatch(self)
    }
    fn settles_go_to(&self) -> Option<&str> {
        Some(&self.home)
    }
    fn sync_settles(&self) {
        RemoteQueue::sync_settles(self)
    }
    fn add_consumer(
        self: Arc<Self>,
        c: Arc<Consumer>,
        on_added: &mut dyn FnMut(),
    ) -> AmqpResult<()> {
        RemoteQueue::add_consumer(&self, c, on_added)
    }
    fn remove_consumer(&self, c: &Arc<Consumer>) {
        RemoteQueue::remove_consumer(self, c)
    }
    fn message_count(&self) -> u32 {
        self.counts().messages
    }
    fn unacked_count(&self) -> u32 {
        self.counts().unacked
    }
    fn consumer_count(&self) -> u32 {
        self.counts().consumers
    }
    fn consumers(&self) -> Vec<Arc<Consumer>> {
        self.local_consumers()
    }
    fn purge(&self) -> u32 {
        RemoteQueue::purge(self)
    }
    fn mark_deleted(&self) -> (u32, Vec<Arc<Consumer>>) {
        RemoteQueue::mark_deleted(self)
    }
    fn is_deleted(&self) -> bool {
        RemoteQueue::is_deleted(self)
    }
    /// A declare: the home must be up, and the queue's lease starts again there.
    fn check_home(&self) -> AmqpResult<()> {
        self.counts_checked(true).map(|_| ())
    }
    fn home_counts(&self) -> Option<AmqpResult<Counts>> {
        Some(self.counts_checked(false))
    }
    fn as_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}
