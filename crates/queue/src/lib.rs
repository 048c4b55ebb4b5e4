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

use std::collections::VecDeque;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

#[cfg(any(test, feature = "testing"))]
#[allow(clippy::unwrap_used)]
pub mod testing;

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
pub enum Overflow {
    #[default]
    DropHead,
    RejectPublish,
    RejectPublishDlx,
}

/// Why a message was dead-lettered, as written in `x-death`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// The arguments in force that a policy may change ([`State::set_limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
pub struct Entry<M> {
    pub seq: u64,
    pub msg: M,
    pub redelivered: bool,
    /// Deadline from `x-message-ttl` or the message's `expiration`, on the host's clock.
    pub expires_at_ms: Option<u64>,
    /// In the queue's log: leaving the queue for good must be recorded ([`Effect::Forget`]).
    pub logged: bool,
}

/// A consumer as the queue sees it; `handle` is the host's and passed back in [`Host::offer`].
#[derive(Debug, Clone)]
pub struct Consumer<C> {
    /// Unique among this queue's consumers; names it in [`State::remove_consumer`].
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
pub enum ConsumeRefused {
    Deleted,
    /// The queue has an exclusive consumer, or this one asked to be exclusive and there are
    /// others.
    Exclusive,
}

/// Messages that exist only in the log, after those in memory (single-lane queues).
#[derive(Debug, Clone, Copy, Default)]
struct Tail {
    count: usize,
    bytes: u64,
}

/// One queue.
#[derive(Debug)]
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
    scratch: Vec<Entry<M>>,
}

/// A command, for hosts that log commands (replication) and for tests. Each maps to the typed
/// method of the same name.
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

    /// Takes over what a log recovered at boot: `count` messages of `bytes`, to be read back in
    /// order from the host's log; seqs continue from `next_seq`. A priority queue reads them all
    /// now, into their levels.
    pub fn recover(&mut self, next_seq: u64, count: usize, bytes: u64, host: &mut impl Host<C, M>) {
        self.next_seq = self.next_seq.max(next_seq);
        if count == 0 {
            return;
        }
        self.ready_len += count;
        self.ready_bytes += bytes;
        self.tail = Some(Tail { count, bytes });
        // Recovered messages may carry deadlines.
        self.may_expire = true;
        if self.ready.len() > 1 {
            while self.tail.is_some() {
                self.page_in(host);
            }
            let lane = std::mem::take(&mut self.ready[0]);
            for e in lane {
                let level = self.level(&e.msg);
                self.ready[level].push_back(e);
            }
        }
    }

    pub fn apply(&mut self, cmd: Command<C, M>, host: &mut impl Host<C, M>) -> Reply<C, M> {
        match cmd {
            Command::Publish { msg, logged } => Reply::Published(self.publish(msg, logged, host)),
            Command::Dispatch => {
                self.dispatch(host);
                Reply::Ok
            }
            Command::Expire => {
                let now = host.now();
                self.expire(now, host);
                Reply::Ok
            }
            Command::Get { ack } => Reply::Got(self.get(ack, host)),
            Command::Settle { entries, dispatch } => {
                self.settle(entries, dispatch, host);
                Reply::Ok
            }
            Command::Discard { entries, dispatch } => {
                self.discard(entries, dispatch, host);
                Reply::Ok
            }
            Command::Requeue { entries } => {
                self.requeue(entries, host);
                Reply::Ok
            }
            Command::AddConsumer(c) => {
                let r = self.add_consumer(c, host.now());
                if r.is_ok() {
                    self.dispatch(host);
                }
                Reply::Consume(r)
            }
            Command::RemoveConsumer { key } => {
                let (consumer, auto_delete_now) = self.remove_consumer(key, host);
                Reply::Removed {
                    consumer,
                    auto_delete_now,
                }
            }
            Command::Purge => Reply::Count(self.purge(host)),
            Command::Delete => {
                let (ready, consumers) = self.delete(host);
                Reply::Deleted { ready, consumers }
            }
            Command::SetLimits(l) => {
                self.set_limits(l);
                Reply::Ok
            }
            Command::Touch => {
                self.touch(host.now());
                Reply::Ok
            }
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

    /// Marks the ready message `seq` redelivered (a replicated host learned that an earlier
    /// leader may have delivered it); false if it is not ready here.
    pub fn mark_redelivered(&mut self, seq: u64) -> bool {
        for lane in &mut self.ready {
            if let Ok(i) = lane.binary_search_by_key(&seq, |e| e.seq) {
                if let Some(e) = lane.get_mut(i) {
                    e.redelivered = true;
                    return true;
                }
            }
        }
        false
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

    pub fn is_deleted(&self) -> bool {
        self.deleted
    }

    pub fn may_expire(&self) -> bool {
        self.may_expire
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Marks the queue used now (a redeclare), for `x-expires`.
    pub fn touch(&mut self, now: u64) {
        self.last_used_ms = now;
    }

    /// An `x-expires` queue of lease `expires_ms` unused for that long: no consumers, no use.
    pub fn lease_expired(&self, expires_ms: u64, now: u64) -> bool {
        self.consumers.is_empty()
            && !self.deleted
            && now.saturating_sub(self.last_used_ms) >= expires_ms
    }

    fn level(&self, msg: &M) -> usize {
        match self.config.max_priority {
            None => 0,
            Some(max) => msg.priority().unwrap_or(0).min(max) as usize,
        }
    }

    /// Enqueues and dispatches, applying TTL and the length limits. `logged`: the host writes
    /// this message to its log (a persistent message in a durable queue), so it is handed over
    /// as [`Effect::Append`] and its leaving as [`Effect::Forget`].
    pub fn publish(&mut self, msg: M, logged: bool, host: &mut impl Host<C, M>) -> Published {
        self.publish_entry(msg, logged, false, host)
    }

    /// [`State::publish`] for a replicated host, which numbers messages itself (its log's ids,
    /// the same on every replica, so an ack names the same message wherever it lands): `msg`
    /// becomes `seq` (which must be above every seq so far; a lower one takes the next free),
    /// logged, and marked `redelivered` when an earlier leader may have delivered it.
    pub fn publish_as(
        &mut self,
        seq: u64,
        msg: M,
        redelivered: bool,
        host: &mut impl Host<C, M>,
    ) -> Published {
        self.next_seq = self.next_seq.max(seq);
        self.publish_entry(msg, true, redelivered, host)
    }

    fn publish_entry(
        &mut self,
        msg: M,
        logged: bool,
        redelivered: bool,
        host: &mut impl Host<C, M>,
    ) -> Published {
        if self.deleted {
            return Published::Gone;
        }
        let limits = self.limits;
        let size = msg.body_len();
        if limits.overflow != Overflow::DropHead && self.is_full(&limits, Some(size)) {
            if limits.overflow == Overflow::RejectPublishDlx {
                host.effect(Effect::DeadLetter(msg, Reason::MaxLen));
            }
            return Published::Rejected;
        }
        let ttl = match (limits.message_ttl_ms, msg.expiration_ms()) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        let now = if ttl.is_some() { host.now() } else { 0 };
        let expires_at_ms = ttl.map(|t| now.saturating_add(t));
        self.may_expire |= expires_at_ms.is_some();
        let seq = self.next_seq;
        self.next_seq += 1;
        let level = self.level(&msg);
        let was_empty = self.ready_len == 0;
        self.ready_bytes += size;
        self.ready_len += 1;
        let page_out = self.tail.is_some()
            || (self.ready.len() == 1
                && (self.ready_len > self.config.page_out_msgs
                    || self.ready_bytes > self.config.page_out_bytes)
                && host.can_page());
        let entry = Entry {
            seq,
            msg,
            redelivered,
            expires_at_ms,
            logged: logged && !page_out,
        };
        if page_out {
            let tail = self.tail.get_or_insert_with(|| {
                host.effect(Effect::PageOut { from_seq: seq });
                Tail::default()
            });
            tail.count += 1;
            tail.bytes += size;
            host.effect(Effect::Append {
                entry: &entry,
                paged: true,
            });
        } else {
            let lane = &mut self.ready[level];
            lane.push_back(entry);
            if logged {
                if let Some(e) = lane.back() {
                    host.effect(Effect::Append {
                        entry: e,
                        paged: false,
                    });
                }
            }
        }
        if was_empty {
            // A message that finds the queue empty is offered before any deadline is checked, as
            // RabbitMQ does: a TTL 0 message reaches a consumer that can take it at once, and
            // expires just below otherwise.
            self.deliver(None, host);
        } else {
            self.dispatch(host);
        }
        if expires_at_ms.is_some() {
            self.expire(now, host);
        }
        if limits.overflow == Overflow::DropHead {
            self.drop_head(&limits, host);
        }
        Published::Accepted { seq }
    }

    /// Offers ready messages to the consumers that can take them.
    pub fn dispatch(&mut self, host: &mut impl Host<C, M>) {
        let expiring = if self.ready_len > 0 && self.may_expire {
            let now = host.now();
            self.expire(now, host);
            Some(now)
        } else {
            None
        };
        self.deliver(expiring, host);
    }

    /// The dispatch loop. With `expiring`, deadlines are checked against it each time a message
    /// leaves: classic queues expire from the head only, so a message that expired behind a live
    /// one is dropped when it becomes the head, never delivered. `None` (no message here has a
    /// deadline) keeps the loop free of deadline work.
    fn deliver(&mut self, expiring: Option<u64>, host: &mut impl Host<C, M>) {
        'messages: while self.ready_len > 0 && !self.consumers.is_empty() {
            self.fill(host);
            let n = if self.config.single_active_consumer {
                1
            } else {
                self.consumers.len()
            };
            let mut start = 0;
            // Priority groups, highest first; round-robin inside a group.
            while start < n {
                let p = self.consumers[start].priority;
                let end = self.consumers[start..n]
                    .iter()
                    .position(|c| c.priority != p)
                    .map_or(n, |i| start + i);
                let len = end - start;
                for k in 0..len {
                    let idx = start + (self.rr + k) % len;
                    let Some(front) = self.ready.iter().rev().find_map(|l| l.front()) else {
                        break 'messages;
                    };
                    let c = &mut self.consumers[idx];
                    if c.has_credit() && host.offer(&c.handle, front) == Offer::Taken {
                        let no_ack = c.no_ack;
                        if !no_ack {
                            c.outstanding += 1;
                        }
                        if let Some(m) = self.ready.iter_mut().rev().find_map(|l| l.pop_front()) {
                            self.ready_bytes -= m.msg.body_len();
                            self.ready_len -= 1;
                            if no_ack {
                                forget(&m, host);
                            } else {
                                self.unacked += 1;
                            }
                        }
                        if let Some(now) = expiring {
                            self.expire(now, host);
                        }
                        self.rr = self.rr.wrapping_add(k + 1);
                        continue 'messages;
                    }
                }
                start = end;
            }
            break;
        }
    }

    /// basic.get: takes the head message; `ack` counts it as unacked. Returns it with the number
    /// of messages left.
    pub fn get(&mut self, ack: bool, host: &mut impl Host<C, M>) -> Option<(Entry<M>, u32)> {
        let now = host.now();
        self.last_used_ms = now;
        self.expire(now, host);
        let m = self.pop_ready(host)?;
        // RabbitMQ drops what expired behind the head as soon as it is the head, before the
        // count in get-ok is taken.
        if self.may_expire {
            self.expire(now, host);
        }
        if ack {
            self.unacked += 1;
        } else {
            forget(&m, host);
        }
        Some((m, self.ready_len as u32))
    }

    /// Acked. With `dispatch`, dispatches; a channel under a channel-wide limit passes false and
    /// dispatches all its queues itself, in a fair order.
    pub fn settle(
        &mut self,
        entries: impl IntoIterator<Item = Settled<M>>,
        dispatch: bool,
        host: &mut impl Host<C, M>,
    ) {
        self.leave(entries, None, dispatch, host)
    }

    /// Rejected without requeue: settled, and dead-lettered. `dispatch` as for `settle`.
    pub fn discard(
        &mut self,
        entries: impl IntoIterator<Item = Settled<M>>,
        dispatch: bool,
        host: &mut impl Host<C, M>,
    ) {
        self.leave(entries, Some(Reason::Rejected), dispatch, host)
    }

    /// Unacked deliveries leave for good, dead-lettered for `reason` (a host that counts
    /// returns drops those past their delivery limit this way).
    pub fn dead_letter(
        &mut self,
        entries: impl IntoIterator<Item = Settled<M>>,
        reason: Reason,
        host: &mut impl Host<C, M>,
    ) {
        self.leave(entries, Some(reason), true, host)
    }

    /// Settled deliveries leave for good, dead-lettered with `dead` if given.
    fn leave(
        &mut self,
        entries: impl IntoIterator<Item = Settled<M>>,
        dead: Option<Reason>,
        dispatch: bool,
        host: &mut impl Host<C, M>,
    ) {
        for (consumer, m) in entries {
            self.settled(consumer);
            forget(&m, host);
            if let Some(reason) = dead {
                host.effect(Effect::DeadLetter(m.msg, reason));
            }
        }
        if dispatch {
            self.dispatch(host);
        }
    }

    /// Puts unacked messages back at their original positions, marked redelivered. A queue this
    /// takes past x-max-length(-bytes) drops from the head under drop-head, as RabbitMQ's requeue
    /// does; the reject overflow modes refuse publishes only, so it stays over.
    pub fn requeue(
        &mut self,
        entries: impl IntoIterator<Item = Settled<M>>,
        host: &mut impl Host<C, M>,
    ) {
        if self.deleted {
            return;
        }
        for (consumer, mut m) in entries {
            self.settled(consumer);
            m.redelivered = true;
            let level = self.level(&m.msg);
            self.ready_bytes += m.msg.body_len();
            self.ready_len += 1;
            let lane = &mut self.ready[level];
            let pos = lane.partition_point(|r| r.seq < m.seq);
            lane.insert(pos, m);
        }
        let limits = self.limits;
        self.drop_head(&limits, host);
        self.dispatch(host);
    }

    /// One unacked delivery settled: its consumer, if still here, gets its credit back.
    #[inline]
    fn settled(&mut self, consumer: Option<u64>) {
        self.unacked = self.unacked.saturating_sub(1);
        if let Some(key) = consumer {
            if let Some(c) = self.consumers.iter_mut().find(|c| c.key == key) {
                c.outstanding = c.outstanding.saturating_sub(1);
            }
        }
    }

    /// Adds a consumer after its equals in priority. The host dispatches once it has told the
    /// client (consume-ok before any delivery).
    pub fn add_consumer(&mut self, mut c: Consumer<C>, now: u64) -> Result<(), ConsumeRefused> {
        c.outstanding = 0;
        if self.deleted {
            return Err(ConsumeRefused::Deleted);
        }
        if self.consumers.iter().any(|x| x.exclusive) || (c.exclusive && !self.consumers.is_empty())
        {
            return Err(ConsumeRefused::Exclusive);
        }
        let pos = self.consumers.partition_point(|x| x.priority >= c.priority);
        self.consumers.insert(pos, c);
        self.had_consumer = true;
        self.last_used_ms = now;
        Ok(())
    }

    /// Removes a consumer and dispatches (the next one may have become the active one). Also
    /// says whether an auto-delete queue should go now.
    pub fn remove_consumer(
        &mut self,
        key: u64,
        host: &mut impl Host<C, M>,
    ) -> (Option<Consumer<C>>, bool) {
        let removed = self
            .consumers
            .iter()
            .position(|c| c.key == key)
            .map(|i| self.consumers.remove(i));
        self.last_used_ms = host.now();
        self.dispatch(host);
        let auto_delete_now = self.config.auto_delete
            && self.had_consumer
            && self.consumers.is_empty()
            && !self.deleted;
        (removed, auto_delete_now)
    }

    /// Removes every ready message; returns how many.
    pub fn purge(&mut self, host: &mut impl Host<C, M>) -> u32 {
        let n = self.ready_len as u32;
        self.clear_ready(host);
        n
    }

    /// Deletes the queue: returns its ready count and its consumers (to be told of the cancel).
    /// Unacked messages stay with their channels; settling them later is harmless.
    pub fn delete(&mut self, host: &mut impl Host<C, M>) -> (u32, Vec<Consumer<C>>) {
        self.deleted = true;
        let n = self.ready_len as u32;
        self.clear_ready(host);
        (n, std::mem::take(&mut self.consumers))
    }

    /// Drops (dead-letters) messages whose deadline passed, from the head of each level only, as
    /// RabbitMQ does.
    pub fn expire(&mut self, now: u64, host: &mut impl Host<C, M>) {
        for i in 0..self.ready.len() {
            loop {
                if i == 0 {
                    self.fill(host);
                }
                let mut expired = false;
                while self.ready[i]
                    .front()
                    .is_some_and(|m| m.expires_at_ms.is_some_and(|t| t <= now))
                {
                    if let Some(m) = self.ready[i].pop_front() {
                        self.ready_bytes -= m.msg.body_len();
                        self.ready_len -= 1;
                        forget(&m, host);
                        host.effect(Effect::DeadLetter(m.msg, Reason::Expired));
                        expired = true;
                    }
                }
                // The whole head expired: the paged-out messages behind it may have too.
                if !(expired && self.ready[i].is_empty() && self.tail.is_some()) {
                    break;
                }
            }
        }
    }

    /// Reads paged-out messages back once memory holds none.
    fn fill(&mut self, host: &mut impl Host<C, M>) {
        if self.tail.is_some() && self.ready[0].is_empty() {
            self.page_in(host);
        }
    }

    /// Reads the next paged-out messages into level 0, in order.
    fn page_in(&mut self, host: &mut impl Host<C, M>) {
        let Some(mut tail) = self.tail else { return };
        let mut got = std::mem::take(&mut self.scratch);
        let read = host.page_in(tail.count, &mut got);
        // Never trust a host to read more than the tail holds.
        let records = read.records.min(tail.count);
        let mut kept_bytes = 0;
        let mut kept = 0;
        for e in got.drain(..).take(records) {
            kept_bytes += e.msg.body_len();
            kept += 1;
            self.ready[0].push_back(e);
        }
        // Records that did not decode leave the counts; so does the whole tail if none could be
        // read.
        let (records, bytes) = if records == 0 {
            (tail.count, tail.bytes)
        } else {
            (records, read.bytes.max(kept_bytes))
        };
        let lost = records - kept;
        self.ready_len -= lost;
        self.ready_bytes = self.ready_bytes.saturating_sub(bytes - kept_bytes);
        tail.count -= records;
        tail.bytes = tail.bytes.saturating_sub(bytes);
        self.tail = (tail.count > 0).then_some(tail);
        self.scratch = got;
    }

    fn pop_ready(&mut self, host: &mut impl Host<C, M>) -> Option<Entry<M>> {
        self.fill(host);
        let m = self.ready.iter_mut().rev().find_map(|l| l.pop_front())?;
        self.ready_bytes -= m.msg.body_len();
        self.ready_len -= 1;
        Some(m)
    }

    fn clear_ready(&mut self, host: &mut impl Host<C, M>) {
        for lane in &mut self.ready {
            for m in lane.drain(..) {
                forget(&m, host);
            }
        }
        if self.tail.take().is_some() {
            // What is on disk only goes with one record, without reading it back.
            host.effect(Effect::ForgetTail {
                last_seq: self.next_seq.saturating_sub(1),
            });
        }
        self.ready_len = 0;
        self.ready_bytes = 0;
    }

    /// Under drop-head, drops (dead-letters, reason maxlen) from the head until the queue is
    /// within its length limits.
    fn drop_head(&mut self, limits: &Limits, host: &mut impl Host<C, M>) {
        if limits.overflow != Overflow::DropHead {
            return;
        }
        while self.is_full(limits, None) {
            let Some(m) = self.pop_ready(host) else { break };
            forget(&m, host);
            host.effect(Effect::DeadLetter(m.msg, Reason::MaxLen));
        }
    }

    /// Over a limit once a message of `adding` bytes is added (`None`: already over). A
    /// message counts one whatever its size, as RabbitMQ's `will_overflow` counts it.
    fn is_full(&self, limits: &Limits, adding: Option<u64>) -> bool {
        let (extra, bytes) = adding.map_or((0, 0), |b| (1, b));
        limits
            .max_length
            .is_some_and(|m| self.ready_len as u64 + extra > m)
            || limits
                .max_length_bytes
                .is_some_and(|m| self.ready_bytes + bytes > m)
    }

    /// Checks the bookkeeping against the contents; for tests and the fuzz target.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mem: usize = self.ready.iter().map(|l| l.len()).sum();
        let mem_bytes: u64 = self.ready.iter().flatten().map(|e| e.msg.body_len()).sum();
        let (tc, tb) = self.tail.map_or((0, 0), |t| (t.count, t.bytes));
        if self.tail.is_some_and(|t| t.count == 0) {
            return Err("empty tail kept".into());
        }
        if mem + tc != self.ready_len {
            return Err(format!("ready_len {} != {mem} + {tc}", self.ready_len));
        }
        if mem_bytes + tb != self.ready_bytes {
            return Err(format!(
                "ready_bytes {} != {mem_bytes} + {tb}",
                self.ready_bytes
            ));
        }
        for (i, lane) in self.ready.iter().enumerate() {
            if lane
                .iter()
                .zip(lane.iter().skip(1))
                .any(|(a, b)| a.seq >= b.seq)
            {
                return Err(format!("level {i} out of seq order"));
            }
            if lane.iter().any(|e| e.seq >= self.next_seq) {
                return Err(format!("level {i} holds a seq not yet given"));
            }
            if lane.iter().any(|e| self.level(&e.msg) != i) {
                return Err(format!("level {i} holds a message of another level"));
            }
        }
        if self.tail.is_some() && self.ready.len() > 1 {
            return Err("a priority queue with a tail".into());
        }
        if self
            .consumers
            .iter()
            .zip(self.consumers.iter().skip(1))
            .any(|(a, b)| a.priority < b.priority)
        {
            return Err("consumers out of priority order".into());
        }
        if let Some(c) = self
            .consumers
            .iter()
            .find(|c| c.prefetch > 0 && !c.no_ack && c.outstanding > c.prefetch)
        {
            return Err(format!("consumer {} holds more than its prefetch", c.key));
        }
        if self.deleted && (self.ready_len > 0 || !self.consumers.is_empty()) {
            return Err("a deleted queue holds messages or consumers".into());
        }
        Ok(())
    }
}

/// A message left the queue for good: the log records it.
#[inline]
fn forget<C, M>(m: &Entry<M>, host: &mut impl Host<C, M>) {
    if m.logged {
        host.effect(Effect::Forget { seq: m.seq });
    }
}
