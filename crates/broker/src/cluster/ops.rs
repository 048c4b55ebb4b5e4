//! What the proposer and the state machine share: an applied entry's index and outcome
//! ([`Applied`]), and which entry this thread is applying ([`applying`]). The replicated change
//! itself is the definitions command (`definitions::op::DefOp`).

use std::cell::Cell;

use serde::{Deserialize, Serialize};

use crate::definitions::op::DefReply;

/// What the state machine hands back to a proposer: the entry's index and its outcome.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Applied {
    pub(super) index: u64,
    pub(super) reply: DefReply,
}

thread_local! {
    /// The Raft index of the entry this thread is applying, so the vhost and access code
    /// called from the apply changes state here instead of proposing again.
    pub(super) static APPLYING: Cell<Option<u64>> = const { Cell::new(None) };
}

/// The log index being applied on this thread, if this is the apply.
pub fn applying() -> Option<u64> {
    APPLYING.with(|a| a.get())
}
