//! The queue's boundary with the world: the questions it asks its [`Host`] and the [`Effect`]s
//! it hands it, in order. The invariant of the crate lives here: nothing else in it does I/O,
//! reads a clock or takes a lock; all of that is the host's, behind this trait.

use crate::types::{Entry, Reason};

/// The host's answer to an offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Delivered: the host wrote it to the consumer (and holds it as unacked unless no-ack).
    Taken,
    /// Not now: the channel-wide prefetch is used up, the output is full, the channel is
    /// paused or closing. (A consumer's own prefetch is the queue's to check: it is never
    /// offered a message without credit.)
    Refused,
}

/// What [`Host::page_in`] read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PagedIn {
    /// Records consumed from the tail, including those that could not be decoded (dropped).
    pub records: usize,
    /// Their body bytes.
    pub bytes: u64,
}

/// What the queue does to the outside world, handed to [`Host::effect`] in order.
#[derive(Debug, PartialEq)]
pub enum Effect<'a, M> {
    /// From this seq on, new messages live in the log only (the tail), until it is read back.
    PageOut { from_seq: u64 },
    /// Write the message to the log; `paged`: it is in the tail, not in memory.
    Append { entry: &'a Entry<M>, paged: bool },
    /// A logged message left the queue for good (a buffered write is cancelled).
    Forget { seq: u64 },
    /// Every message of the tail up to `last_seq` left at once (purge, delete).
    ForgetTail { last_seq: u64 },
    /// Publish this to the dead-letter exchange (the host drops it if there is none).
    DeadLetter(M, Reason),
}

/// The queue's view of the world outside it.
pub trait Host<C, M> {
    /// Hands `entry` to `consumer` now if it can take it.
    fn offer(&mut self, consumer: &C, entry: &Entry<M>) -> Offer;
    /// Reads the next paged-out messages (at most `remaining`) into `out`, in order. Zero
    /// records read means nothing more can be: the rest of the tail is lost.
    fn page_in(&mut self, remaining: usize, out: &mut Vec<Entry<M>>) -> PagedIn;
    /// Whether new messages may go to the log only from now on (asked once a limit is passed).
    fn can_page(&mut self) -> bool;
    /// The time in ms, asked only when a deadline is set or checked.
    fn now(&mut self) -> u64;
    fn effect(&mut self, effect: Effect<'_, M>);
}

/// A message left the queue for good: the log records it.
#[inline]
pub(crate) fn forget<C, M>(m: &Entry<M>, host: &mut impl Host<C, M>) {
    if m.logged {
        host.effect(Effect::Forget { seq: m.seq });
    }
}
