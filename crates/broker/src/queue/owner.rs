//! What a queue asks of the layer that owns it, as an interface the queue layer defines: a
//! queue routes its dead letters through its owner (the vhost: exchanges, bindings, delayed
//! exchanges' stores) without knowing what the owner is. The vhost implements it
//! (`vhost.rs`); a test can stand a fake in its place.

use std::sync::Arc;

use warren_protocol::ByteString;

use crate::confirm::ConfirmHandle;
use crate::message::Message;

use super::QueueRef;

/// Where a dead letter goes, as its owner routed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadRoute {
    /// Routed: its queues were added to the caller's list (none if no binding matched).
    Routed,
    /// Its exchange is a delayed one and the message asks for this delay (ms): it is to be held
    /// by that exchange's store ([`QueueOwner::hold_dead_letter`]).
    Delay(u64),
    /// Its exchange does not exist (or may not be published to): dropped, as in RabbitMQ.
    NoExchange,
}

/// The layer above a queue, as the queue sees it.
pub trait QueueOwner: Send + Sync {
    /// Routes dead letter `m` by its exchange and routing key plus `extra_keys` (its `CC`
    /// keys), adding its queues to `out`.
    fn route_dead_letter(
        &self,
        m: &Message,
        extra_keys: &[ByteString],
        out: &mut Vec<QueueRef>,
    ) -> DeadRoute;

    /// Holds dead letter `m` in the store of its (delayed) exchange for `delay_ms`, the cycle
    /// rule applying when it comes due. `None` if there is no such store, or it was deleted
    /// meanwhile (nothing is held); else whether `confirm` was taken (it completes once the
    /// store has the message on disk).
    fn hold_dead_letter(
        self: Arc<Self>,
        m: &Message,
        delay_ms: u64,
        confirm: Option<&Arc<ConfirmHandle>>,
    ) -> Option<bool>;

    /// Deletes auto-delete queue `name`, whose last consumer has just left from another node
    /// (a local channel deletes it itself).
    fn delete_unused_queue(&self, name: &str);
}
