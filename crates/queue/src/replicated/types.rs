//! The replicated queue machine's vocabulary: what it keeps of a message ([`MsgRef`]), a
//! consumer's attach ([`Attach`]), the commands a log entry carries ([`Cmd`]), what an apply
//! puts out ([`Out`]), the retry back-off ([`Backoff`]) and the declared configuration
//! ([`MachineConfig`]). Data only: the behaviour is the machine's (`mod.rs`).

use crate::{ConsumeRefused, Limits, Payload, Reason};

/// What the machine keeps of a message: where its body is, and what the queue's semantics need.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MsgRef {
    /// The index of the log entry that carries the body.
    pub index: u64,
    /// Body bytes, for `x-max-length-bytes`.
    pub size: u64,
    pub priority: Option<u8>,
    /// The `expiration` property in ms.
    pub expiration_ms: Option<u64>,
    /// Times it went back to the queue after a delivery (`x-delivery-count`).
    pub delivery_count: u32,
}

impl Payload for MsgRef {
    fn body_len(&self) -> u64 {
        self.size
    }
    fn priority(&self) -> Option<u8> {
        self.priority
    }
    fn expiration_ms(&self) -> Option<u64> {
        self.expiration_ms
    }
}

/// A consumer attaching through any node.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Attach {
    /// Unique in the queue (the broker makes it from its connection id and consumer tag).
    pub key: u64,
    /// The node its connection is on: [`Cmd::NodeDown`] returns what it holds.
    pub node: String,
    pub priority: i64,
    /// Unsettled deliveries it may hold; 0 = no limit.
    pub prefetch: u32,
    pub no_ack: bool,
    pub exclusive: bool,
    /// Its consumer timeout in ms (`x-consumer-timeout`, else the queue's, else the node's),
    /// resolved when it attaches; `None`: none.
    pub timeout_ms: Option<u64>,
}

/// One command, as a log entry carries it; `Machine::apply` runs it.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Cmd {
    Enqueue(MsgRef),
    Attach(Attach),
    /// Acked.
    Settle {
        consumer: u64,
        seqs: Vec<u64>,
    },
    /// Back to the queue (basic.reject/nack with requeue, basic.recover): redelivered, its
    /// delivery count one more; held back first when the queue's retry back-off applies to
    /// `kind`.
    Return {
        consumer: u64,
        seqs: Vec<u64>,
        kind: ReturnKind,
    },
    /// Rejected without requeue: dead-lettered.
    Discard {
        consumer: u64,
        seqs: Vec<u64>,
    },
    /// basic.cancel: no more deliveries; what it holds may still be settled.
    Cancel {
        consumer: u64,
    },
    /// basic.get through a channel on `node`: with `ack`, the message is held under `key` (the
    /// channel's, unique in the queue, and no consumer's) until settled, as a consumer's
    /// delivery is.
    Get {
        key: u64,
        node: String,
        ack: bool,
    },
    /// Its channel or connection is gone: what it holds goes back to the queue.
    Down {
        consumer: u64,
    },
    /// A node is gone (it restarted): every consumer on it is down.
    NodeDown {
        node: String,
    },
    /// A node is unreachable: its consumers hold nothing more (what they held goes back, as
    /// when they go down) and get no deliveries, but stay attached, as `rabbit_fifo`'s
    /// suspected consumers.
    Unreachable {
        node: String,
    },
    /// The node is back: its suspected consumers receive again.
    Reachable {
        node: String,
    },
    Purge,
    SetLimits(Limits),
    /// The retry back-off in force changed (a policy).
    SetRetry(Option<Backoff>),
    /// Kept dead letters (at-least-once) that their targets now have, by log place: forgotten.
    DeadDone {
        places: Vec<u64>,
    },
    /// The time passes (the leader proposes it, as `rabbit_fifo`'s ticks): message deadlines
    /// and consumer timeouts are checked against the entry's timestamp.
    Tick,
    /// A consumer asks for more time on what it holds (Warren's lease extension,
    /// docs/consumer-timeout.md): each of `seqs` now times out `extend_ms` from the entry's
    /// time (its consumer's timeout when `None`), never sooner than it already would.
    Lease {
        consumer: u64,
        seqs: Vec<u64>,
        extend_ms: Option<u64>,
    },
    /// A message of the queue's earlier form, carried over when a group written by an earlier
    /// release is upgraded to this machine: enqueued as it was (its delivery count in `msg`,
    /// redelivered when it may have been delivered), never refused by the limits.
    Import {
        msg: MsgRef,
        redelivered: bool,
    },
}

/// What an apply puts out, in order. Every member computes it; the leader acts on it.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Out {
    /// The publish took seq `seq` (confirm it once the entry is committed).
    Accepted {
        seq: u64,
    },
    /// The queue is full and refuses publishes (nack).
    Rejected,
    /// `delivery` numbers the deliveries made to this consumer (0, 1, ...): its node sees a
    /// gap, and asks the leader for `Machine::held_since`, when a leader lost a delivery it
    /// had committed but not yet sent.
    Deliver {
        consumer: u64,
        delivery: u64,
        seq: u64,
        msg: MsgRef,
        redelivered: bool,
    },
    DeadLetter(MsgRef, Reason),
    Attached(Result<(), ConsumeRefused>),
    /// A get's answer: the message, held under the get's key if it was with ack, and how many
    /// are left; `None`: the queue is empty.
    Got(Option<Got>),
    /// A consumer left; an auto-delete queue should go now.
    Detached {
        auto_delete_now: bool,
    },
    /// A consumer held a delivery past its timeout: it is cancelled and what it held went
    /// back (the leader tells its channel on `node`: basic.cancel, or the channel's close,
    /// naming `timeout_ms`).
    TimedOut {
        consumer: u64,
        node: String,
        timeout_ms: u64,
    },
    Purged(u32),
}

/// Why a delivery came back, which decides whether the retry back-off holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum ReturnKind {
    /// basic.reject with requeue: a failed delivery (`x-delayed-retry-type` `failed`).
    Rejected,
    /// basic.nack with requeue (`returned`).
    Nacked,
    /// Not a processing outcome (basic.recover): never held back.
    Released,
}

/// Retry with back-off (`x-delayed-retry-*`, as `broker/src/queue/args.rs`'s `Retry`): attempt
/// `n` waits `min * n`, or `min * multiplier^(n-1)`, capped by `max` and by 2^32-1 ms. The due
/// times are in the state, so a new leader holds the same messages back until the same times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Backoff {
    pub on_reject: bool,
    pub on_nack: bool,
    pub min_ms: u64,
    pub max_ms: Option<u64>,
    pub multiplier: Option<u64>,
}

impl Backoff {
    pub fn delay_ms(&self, attempt: u64) -> u64 {
        let n = attempt.max(1);
        let d = match self.multiplier {
            None => self.min_ms.saturating_mul(n),
            Some(m) => {
                let exp = u32::try_from(n - 1).unwrap_or(u32::MAX);
                self.min_ms.saturating_mul(m.saturating_pow(exp))
            }
        };
        d.min(self.max_ms.unwrap_or(u64::MAX))
            .min(u64::from(u32::MAX))
    }

    pub(super) fn applies(&self, kind: ReturnKind) -> bool {
        match kind {
            ReturnKind::Rejected => self.on_reject,
            ReturnKind::Nacked => self.on_nack,
            ReturnKind::Released => false,
        }
    }
}

/// A delivery sent again (`Machine::held_since`).
#[derive(Debug, Clone, PartialEq)]
pub struct Resend {
    pub delivery: u64,
    pub seq: u64,
    pub msg: MsgRef,
    pub redelivered: bool,
}

/// A message basic.get took.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Got {
    pub seq: u64,
    pub msg: MsgRef,
    pub redelivered: bool,
    pub remaining: u32,
}

/// What is fixed when a replicated queue is declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MachineConfig {
    pub max_priority: Option<u8>,
    pub single_active_consumer: bool,
    pub auto_delete: bool,
    /// `x-delivery-limit`: a message returned more often than this is dead-lettered
    /// (`delivery_limit`).
    pub delivery_limit: Option<u32>,
    pub retry: Option<Backoff>,
    /// At-least-once dead-lettering: dead letters stay in the state until
    /// [`Cmd::DeadDone`].
    pub keep_dead_letters: bool,
}
