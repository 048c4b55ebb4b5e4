//! One queue's semantics as a deterministic state machine, after RabbitMQ's `rabbit_fifo`: the
//! same commands in the same order, with the same answers from the host, give the same state,
//! replies and effects on any node. That is what lets a queue be replayed from a Raft log.
//!
//! **Architecture invariant:** no I/O, no clock, no locks, no runtime. Messages (`M`) and
//! consumers (`C`) are opaque to this crate, as queues are to `warren-routing`. Everything the
//! queue needs from the outside world it asks its [`Host`], and everything it does to the outside
//! world it hands the host as an [`Effect`], in order:
//!
//! - **questions** (inputs): may this consumer, which has credit, take this message now
//!   ([`Host::offer`]: its connection's output may be full, or a channel-wide prefetch shared
//!   with other queues may be used up, which only the channel knows at that moment, as
//!   RabbitMQ's classic queues ask `rabbit_limiter:can_send`), the next paged-out messages ([`Host::page_in`]), whether the
//!   queue may page out at all ([`Host::can_page`]), and the time ([`Host::now`]: a replicated
//!   host answers with the command's timestamp, not a clock);
//! - **effects** (outputs): write a message to the log, record that one left, dead-letter one.
//!
//! Deliveries are effects too: an accepted [`Host::offer`] *is* the delivery, so a message is
//! never handed to a consumer that can no longer take it and never has to be taken back. Each
//! consumer's credit (its prefetch less its unsettled deliveries) is queue state, as in
//! `rabbit_fifo`: a delivery spends it and a settle naming the consumer gives it back.
//!
//! A host runs it inline under the queue's lock (`warren-broker`'s `queue` module), so a publish
//! reaches a consumer with no task hop. [`State::apply`] takes a [`Command`] and is what tests,
//! the fuzz target and a replicated host drive; the typed methods it calls are the same ones the
//! local host calls directly.
//!
//! The state is [`State`], here; its methods live by job in the modules below: `publish`
//! (enqueue, TTL, length limits), `dispatch` (consumers, delivery, settles), `ready` (the ready
//! lanes and the paged-out tail), `expiry` (message deadlines, `x-expires`), `command`
//! ([`State::apply`]), `host` (the [`Host`] boundary) and `invariants`. `replicated` is a
//! replicated queue's Raft state machine built on it (`rabbit_fifo`'s design: consumers and
//! their checked-out deliveries are part of the replicated state). The types are in
//! `types`; all are re-exported here. Only `types` and `host` are re-exported, and neither
//! refers back to this file, so the crate's modules have no import cycle
//! (`scripts/check_structure.py --crate crates/queue`).

use std::collections::VecDeque;

mod command;
mod dispatch;
mod expiry;
mod host;
mod invariants;
mod publish;
mod ready;
pub mod replicated;
mod types;

pub use host::{Effect, Host, Offer, PagedIn};
pub use types::{
    Command, Config, ConsumeRefused, Consumer, Entry, Limits, Overflow, Payload, Published, Reason,
    Reply, Settled,
};

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

#[cfg(any(test, feature = "testing"))]
#[allow(clippy::unwrap_used)]
pub mod testing;

/// Messages that exist only in the log, after those in memory (single-lane queues).
#[derive(Debug, Clone, Copy, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
struct Tail {
    count: usize,
    bytes: u64,
}

/// One queue.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct State<C, M> {
    config: Config,
    limits: Limits,
    /// One deque per priority level, each ordered by seq.
    ready: Vec<VecDeque<Entry<M>>>,
    /// Ready messages, in memory and in the tail.
    ready_len: usize,
    ready_bytes: u64,
    next_seq: u64,
    /// Sorted by priority, highest first; round-robin within equal priority.
    consumers: Vec<Consumer<C>>,
    rr: usize,
    /// Delivered to an ack-mode consumer or basic.get, not yet settled.
    unacked: usize,
    deleted: bool,
    had_consumer: bool,
    /// Last use (declare, consume, get, cancel), for `x-expires`.
    last_used_ms: u64,
    /// A message with a deadline was enqueued (or recovered): dispatch checks deadlines.
    may_expire: bool,
    tail: Option<Tail>,
    /// Page-in buffer, kept to reuse its allocation.
    #[cfg_attr(feature = "serde", serde(skip, default = "Vec::new"))]
    scratch: Vec<Entry<M>>,
}

impl<C, M: Payload> State<C, M> {
    pub fn new(config: Config, limits: Limits, now: u64) -> Self {
        let levels = config.max_priority.map_or(1, |p| p as usize + 1);
        State {
            config,
            limits,
            ready: (0..levels).map(|_| VecDeque::new()).collect(),
            ready_len: 0,
            ready_bytes: 0,
            next_seq: 0,
            consumers: Vec::new(),
            rr: 0,
            unacked: 0,
            deleted: false,
            had_consumer: false,
            last_used_ms: now,
            may_expire: false,
            tail: None,
            scratch: Vec::new(),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A policy changed the arguments in force. Limits apply from the next publish or requeue,
    /// as in RabbitMQ.
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    pub fn ready_len(&self) -> usize {
        self.ready_len
    }

    pub fn ready_bytes(&self) -> u64 {
        self.ready_bytes
    }

    /// Ready messages that live in the log only.
    pub fn paged_len(&self) -> usize {
        self.tail.map_or(0, |t| t.count)
    }

    pub fn unacked(&self) -> usize {
        self.unacked
    }

    pub fn consumers(&self) -> &[Consumer<C>] {
        &self.consumers
    }

    /// Whether a consumer of priority `min_priority` or more waits for messages: none is
    /// ready and such a consumer has credit. RabbitMQ's federation queue decorator runs a
    /// federated queue's links exactly while this holds for priority 0 (`is_empty` and
    /// `max_active_consumer_priority >= 0`); the links' own consumers upstream take -1.
    pub fn starving(&self, min_priority: i64) -> bool {
        self.ready_len == 0
            && self
                .consumers
                .iter()
                .any(|c| c.priority >= min_priority && c.has_credit())
    }

    pub fn is_deleted(&self) -> bool {
        self.deleted
    }

    pub fn may_expire(&self) -> bool {
        self.may_expire
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    fn level(&self, msg: &M) -> usize {
        match self.config.max_priority {
            None => 0,
            Some(max) => msg.priority().unwrap_or(0).min(max) as usize,
        }
    }
}
