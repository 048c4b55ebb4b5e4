//! Publishing one message to the queues it was routed to, with one confirm for them all: what
//! a channel does with a basic.publish, a home node with a forwarded publish and a delayed
//! exchange's store with a message that came due. Written once here so that the rule is one:
//! each queue that stores the message owes the confirm a write, a queue that refuses it
//! (full, `reject-publish`) makes it a nack, one deleted meanwhile counts as done.

use std::sync::Arc;

use crate::confirm::{ConfirmHandle, ConfirmTarget, Confirms};
use crate::message::Message;

use super::{Enqueued, QueueRef};

/// Who a publish's confirm goes to, and the publish's number there.
pub enum ConfirmTo<'a> {
    /// A channel in confirm mode: kept apart so that it costs no virtual call.
    Channel(&'a Arc<Confirms>, u64),
    /// Anything else that confirms publishes: a link (a forwarded publish), a delay store.
    Target(&'a Arc<dyn ConfirmTarget>, u64),
}

impl ConfirmTo<'_> {
    /// A confirm that waits for `waits` writes.
    pub fn pending(&self, waits: usize) -> Arc<ConfirmHandle> {
        match self {
            ConfirmTo::Channel(c, seq) => c.pending(*seq, waits),
            ConfirmTo::Target(t, seq) => ConfirmHandle::for_target((*t).clone(), *seq, waits),
        }
    }
}

/// What became of a fanned-out publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FannedOut {
    /// Its confirm goes once the queues that store it have it on disk.
    Pending,
    /// Nothing waits for a write (no confirm wanted, or no queue stores it): the caller
    /// settles a wanted confirm now, acked if `accepted` (no queue refused it).
    Settled { accepted: bool },
}

/// Publishes `msg` to each of `targets`, confirmed to `confirm` (if one is wanted) once every
/// queue that stores it has it on disk; `each` sees each queue after its publish.
#[inline]
pub fn fan_out(
    msg: &Arc<Message>,
    targets: &[QueueRef],
    confirm: Option<ConfirmTo<'_>>,
    mut each: impl FnMut(&QueueRef),
) -> FannedOut {
    let handle = match &confirm {
        Some(c) => {
            // The last wait is the fan-out's own, released once every queue has answered.
            let stores = targets.iter().filter(|q| q.stores(msg)).count();
            (stores > 0).then(|| c.pending(stores + 1))
        }
        None => None,
    };
    let mut accepted = true;
    for q in targets {
        let h = handle.as_ref().filter(|_| q.stores(msg));
        let r = q.publish(msg.clone(), h);
        each(q);
        accepted &= r != Enqueued::Rejected;
        if let (Some(h), false) = (h, r == Enqueued::Accepted) {
            h.done(r == Enqueued::Gone);
        }
    }
    match handle {
        Some(h) => {
            h.done(accepted);
            FannedOut::Pending
        }
        None => FannedOut::Settled { accepted },
    }
}
