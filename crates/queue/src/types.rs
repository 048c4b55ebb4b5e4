//! The queue's vocabulary: what it needs to know of a message ([`Payload`]), the arguments it
//! is declared with ([`Config`]) and those a policy may change ([`Limits`]), the messages and
//! consumers it holds, the plain answers of its typed methods, and those methods as data
//! ([`Command`], answered by a [`Reply`]). Data only: the behaviour is on
//! [`State`](crate::State).

/// What the queue needs to know of a message.
pub trait Payload {
    /// Body bytes, for `x-max-length-bytes`.
    fn body_len(&self) -> u64;
    /// The `priority` property, if set.
    fn priority(&self) -> Option<u8>;
    /// The `expiration` property in ms, if set.
    fn expiration_ms(&self) -> Option<u64>;
}

impl<T: Payload> Payload for std::sync::Arc<T> {
    #[inline]
    fn body_len(&self) -> u64 {
        (**self).body_len()
    }
    #[inline]
    fn priority(&self) -> Option<u8> {
        (**self).priority()
    }
    #[inline]
    fn expiration_ms(&self) -> Option<u64> {
        (**self).expiration_ms()
    }
}

/// What happens to a publish into a full queue (`x-overflow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Overflow {
    #[default]
    DropHead,
    RejectPublish,
    RejectPublishDlx,
}

/// Why a message was dead-lettered, as written in `x-death`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Reason {
    Rejected,
    Expired,
    MaxLen,
    /// Returned more often than the queue's delivery limit (quorum queues).
    DeliveryLimit,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Rejected => "rejected",
            Reason::Expired => "expired",
            Reason::MaxLen => "maxlen",
            Reason::DeliveryLimit => "delivery_limit",
        }
    }
}

/// The arguments in force that a policy may change
/// ([`State::set_limits`](crate::State::set_limits)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Limits {
    /// `x-max-length`, `x-max-length-bytes`: limits on ready messages.
    pub max_length: Option<u64>,
    pub max_length_bytes: Option<u64>,
    pub overflow: Overflow,
    /// `x-message-ttl` in ms.
    pub message_ttl_ms: Option<u64>,
}

/// What is fixed when the queue is declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Config {
    /// `x-max-priority`: priority levels above 0. A priority queue keeps everything in memory.
    pub max_priority: Option<u8>,
    /// `x-single-active-consumer`: only the first consumer (oldest of the highest priority)
    /// receives.
    pub single_active_consumer: bool,
    /// The queue goes when its last consumer leaves (once it had one).
    pub auto_delete: bool,
    /// Past this many ready messages (or bytes) in memory, new ones go to the log only.
    pub page_out_msgs: usize,
    pub page_out_bytes: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_priority: None,
            single_active_consumer: false,
            auto_delete: false,
            page_out_msgs: usize::MAX,
            page_out_bytes: u64::MAX,
        }
    }
}

/// A message in the queue, with its position, so a requeued message goes back where it was.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Entry<M> {
    pub seq: u64,
    pub msg: M,
    pub redelivered: bool,
    /// Deadline from `x-message-ttl` or the message's `expiration`, on the host's clock.
    pub expires_at_ms: Option<u64>,
    /// In the queue's log: leaving the queue for good must be recorded
    /// ([`Effect::Forget`](crate::Effect::Forget)).
    pub logged: bool,
}

/// A consumer as the queue sees it; `handle` is the host's and passed back in
/// [`Host::offer`](crate::Host::offer).
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Consumer<C> {
    /// Unique among this queue's consumers; names it in
    /// [`State::remove_consumer`](crate::State::remove_consumer).
    pub key: u64,
    pub handle: C,
    /// `x-priority`: higher is served first while it can take messages.
    pub priority: i64,
    /// A delivery is settled the moment it is made.
    pub no_ack: bool,
    pub exclusive: bool,
    /// Unsettled deliveries it may hold (basic.qos global=false at consume time); 0 = no limit.
    /// Its credit lives here, in the queue: a delivery spends one, a settle of a delivery made
    /// to it (ack, reject, requeue) gives it back, so the state says who may receive next.
    pub prefetch: u32,
    /// Its deliveries not yet settled (ack mode only).
    pub outstanding: u32,
}

impl<C> Consumer<C> {
    /// May take another delivery under its own prefetch.
    #[inline]
    pub fn has_credit(&self) -> bool {
        self.no_ack || self.prefetch == 0 || self.outstanding < self.prefetch
    }
}

/// The outcome of a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    Accepted {
        seq: u64,
    },
    /// The queue is full and its overflow mode refuses publishes: the publisher gets a nack.
    Rejected,
    /// The queue was deleted.
    Gone,
}

/// Why a consumer was not added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum ConsumeRefused {
    Deleted,
    /// The queue has an exclusive consumer, or this one asked to be exclusive and there are
    /// others.
    Exclusive,
}

/// A command, for hosts that log commands (replication) and for tests. Each maps to the typed
/// method of the same name; [`State::apply`](crate::State::apply) runs it.
#[derive(Debug, Clone)]
pub enum Command<C, M> {
    Publish {
        msg: M,
        logged: bool,
    },
    Dispatch,
    Expire,
    Get {
        ack: bool,
    },
    Settle {
        entries: Vec<Settled<M>>,
        dispatch: bool,
    },
    Discard {
        entries: Vec<Settled<M>>,
        dispatch: bool,
    },
    Requeue {
        entries: Vec<Settled<M>>,
    },
    AddConsumer(Consumer<C>),
    RemoveConsumer {
        key: u64,
    },
    Purge,
    Delete,
    SetLimits(Limits),
    Touch,
}

/// A delivery coming back to settle, with the key of the consumer it was made to (`None`: a
/// basic.get), whose credit it returns.
pub type Settled<M> = (Option<u64>, Entry<M>);

/// The answer to a [`Command`].
#[derive(Debug)]
pub enum Reply<C, M> {
    Ok,
    Published(Published),
    Got(Option<(Entry<M>, u32)>),
    Consume(Result<(), ConsumeRefused>),
    /// The consumer removed (if it was there) and whether an auto-delete queue should go now.
    Removed {
        consumer: Option<Consumer<C>>,
        auto_delete_now: bool,
    },
    /// Ready messages removed.
    Count(u32),
    Deleted {
        ready: u32,
        consumers: Vec<Consumer<C>>,
    },
}
