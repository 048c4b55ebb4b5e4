//! The local host of one queue: runs `warren-queue`'s state machine inline under the queue's
//! own mutex, and does for it what it cannot do itself: hand deliveries to channels, read and
//! write the queue's log, publish dead letters, read the clock. No lock is shared between
//! queues, so N busy queues run on N cores. Work happens in the task that causes it: a
//! publisher's connection task enqueues and dispatches; an ack on the consumer's connection
//! settles and dispatches again; a writer that drained its outbox dispatches the queues that
//! were waiting for it; the vhost's sweeper expires messages.
//!
//! Lock order: queue -> channel deliveries -> outbox. Never take a queue lock while holding a
//! channel's deliveries lock. Dead letters are collected under the lock and published after it
//! is released, so dead-letter cycles between queues cannot deadlock.
//!
//! This file holds the [`Queue`], the types its callers pass and get back, the host of its
//! state machine (`Ctx`, with what it keeps under the lock, `Io`), its constructors and its
//! publish path (kept here: `bench/callgrind.sh` finds `Queue::publish` by this module's path).
//! Each other job is an `impl Queue` block in a file of its own:
//!
//! - `consume`: consumers joining and leaving, basic.get, acks, rejects and requeues.
//! - `paging`: reading a paged-out tail back, the scratch log, the persister's side.
//! - `dead_publish`: publishing dead letters once the lock is released.
//!
//! The other children hold their own types: `args` (arguments), `dead_letter` (the dead letter's
//! copy and `x-death`), `handle` (`QueueRef`, `QueueKind`, `DeliverySink`), `owner`
//! (`QueueOwner`), `fan_out` (publishing to routed queues with one confirm), `stream` (stream
//! queues). `tests` runs this host with a fake sink and owner. The queue layer names nothing
//! above it (`docs/ARCHITECTURE.md`, "Layers").

pub mod args;
mod consume;
pub mod dead_letter;
mod dead_publish;
pub mod fan_out;
pub mod handle;
pub mod owner;
mod paging;
pub mod stream;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use warren_protocol::{ByteString, FieldTable};
use warren_queue::{Effect, Host, PagedIn};

pub use args::{display_value, type_name, Overflow, QueueArgs};
pub use dead_publish::{route_dead_at_most_once, route_dead_kept};
pub use fan_out::{fan_out, ConfirmTo, FannedOut};
pub use handle::{Counts, DeliverySink, Offer, QueueKind, QueueRef};
pub use owner::{DeadRoute, QueueOwner};
pub use warren_queue::Reason;

use warren_store::{Cursor, LiveSet, QueueLog};

use crate::clock::now_ms;
use crate::confirm::ConfirmHandle;
use crate::limits;
use crate::message::Message;
use crate::metrics::{bump, delivered, QueueStats};
use crate::persist::{MessageLog, Persister};

/// A message in a queue, with its position so requeued messages go back where they were.
pub type QueuedMessage = warren_queue::Entry<Arc<Message>>;

/// A delivery coming back to its queue, with the key of the consumer it went to (`None`: a
/// basic.get).
pub type Settled = warren_queue::Settled<Arc<Message>>;

/// A consumer: lives in its queue's consumer list and in its channel's consumer map.
pub struct Consumer {
    /// Names it to its queue's state machine; unique in the process.
    pub key: u64,
    pub tag: ByteString,
    /// Where its deliveries go (its channel).
    pub sink: Arc<dyn DeliverySink>,
    pub queue: QueueRef,
    pub no_ack: bool,
    pub exclusive: bool,
    /// `x-priority` from basic.consume: higher is served first while it has credit.
    pub priority: i64,
    /// Per-consumer prefetch (basic.qos global=false at consume time); 0 = unlimited. Its
    /// credit is counted by the queue's state machine.
    pub prefetch: u16,
    /// Set when the broker cancelled it (queue deleted) or the client did.
    pub cancelled: AtomicBool,
    /// `x-consumer-timeout` from basic.consume, in ms (0 and absent: the queue's or the
    /// broker's applies). Checked by the consumer's channel, not by the queue; for a queue
    /// that [times its consumers](QueueKind::times_consumers), the timeout in force (the
    /// consumer's, else the queue's, else the broker's), resolved at basic.consume and checked
    /// by the queue.
    pub timeout_ms: Option<u64>,
}

/// Tells consumers of a deleted queue that the broker cancelled them (their sink sends the
/// server's basic.cancel).
pub fn notify_cancelled(consumers: &[Arc<Consumer>]) {
    for c in consumers {
        if !c.cancelled.swap(true, Ordering::Relaxed) {
            c.sink.cancelled(c);
        }
    }
}

/// A fresh [`Consumer::key`].
pub fn consumer_key() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[derive(Debug, Clone, PartialEq)]
pub struct QueueOptions {
    pub durable: bool,
    pub exclusive_owner: Option<u64>,
    pub auto_delete: bool,
    pub arguments: FieldTable,
    pub args: QueueArgs,
}

/// The outcome of offering a published message to a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    Accepted,
    /// The queue is full and its overflow mode refuses publishes: the publisher gets a nack.
    Rejected,
    /// The queue was deleted between routing and enqueue.
    Gone,
}

pub struct Queue {
    pub name: Arc<str>,
    pub vhost: Arc<str>,
    pub options: QueueOptions,
    /// The arguments in force: `options.args` merged with the applying policy (see `policy`).
    effective: arc_swap::ArcSwap<QueueArgs>,
    /// Where dead letters are routed (the vhost); weak so a vhost and its queues do not keep
    /// each other alive.
    owner: Weak<dyn QueueOwner>,
    /// Set once a message with a deadline is enqueued; the vhost sweeper only visits these queues.
    pub may_expire: AtomicBool,
    /// The group-commit thread that writes this queue's log, and whether this queue is already
    /// in its batch. Queues without one never page out.
    persister: Option<Arc<Persister>>,
    in_batch: AtomicBool,
    /// Persistent messages are stored (a durable queue) and their confirms wait for the fsync.
    durable_store: bool,
    /// How a non-durable queue makes a scratch log when it pages out.
    scratch: Option<OpenScratch>,
    /// The log's directory id, recorded in the definitions file.
    pub store_id: Option<u64>,
    /// Set while consumers fall behind (see `limits::QUEUE_PRESSURE_MSGS`); publishers stall on
    /// `relieved` for a bounded time. This is the queue's credit to its publishers.
    pressure: AtomicBool,
    relieved: tokio::sync::Notify,
    /// Message counts (management API, Prometheus), bumped under `state`'s lock.
    pub stats: QueueStats,
    state: Mutex<Locked>,
}

/// The log a durable queue writes persistent messages to, with the confirms they owe.
pub type Log = QueueLog<Arc<ConfirmHandle>>;

/// A queue's log: the store's, called directly, or any other [`MessageLog`] (a test's, in
/// memory). Not a plain `Box<dyn MessageLog>`: its indirect calls cost a persistent publish 18
/// more instructions in `Queue::publish` and the persister 22 more per write (callgrind, issue
/// 30's note in docs/benchmarks), where this match costs a branch.
pub enum QueueLogOf {
    Store(Log),
    Other(Box<dyn MessageLog>),
}

/// Each call goes to the store's log directly (inlined), or through the other log's vtable.
macro_rules! either {
    ($self:expr, $l:ident => $call:expr) => {
        match $self {
            QueueLogOf::Store($l) => $call,
            QueueLogOf::Other($l) => $call,
        }
    };
}

impl MessageLog for QueueLogOf {
    #[inline]
    fn enqueue(&mut self, seq: u64, data: bytes::Bytes, c: Option<Arc<ConfirmHandle>>, v: bool) {
        either!(self, l => l.enqueue(seq, data, c, v))
    }
    #[inline]
    fn ack(&mut self, seq: u64) -> Option<Arc<ConfirmHandle>> {
        either!(self, l => l.ack(seq))
    }
    fn ack_range(
        &mut self,
        from: u64,
        to: u64,
        live: &dyn Fn(u64) -> bool,
    ) -> Vec<Arc<ConfirmHandle>> {
        either!(self, l => l.ack_range(from, to, live))
    }
    fn cursor_at_start(&self, first_seq: u64) -> Cursor {
        either!(self, l => l.cursor_at_start(first_seq))
    }
    fn cursor_at_end(&self, next_seq: u64) -> Cursor {
        either!(self, l => l.cursor_at_end(next_seq))
    }
    fn read(
        &self,
        cursor: &mut Cursor,
        max_bytes: usize,
        keep: &dyn Fn(u64) -> bool,
    ) -> std::io::Result<Vec<(u64, bytes::Bytes)>> {
        either!(self, l => l.read(cursor, max_bytes, keep))
    }
    #[inline]
    fn write_pending(&mut self) -> warren_store::Written<Arc<ConfirmHandle>> {
        either!(self, l => l.write_pending())
    }
    #[inline]
    fn bytes_written(&self) -> u64 {
        either!(self, l => l.bytes_written())
    }
    fn destroy(self: Box<Self>) -> Vec<Arc<ConfirmHandle>> {
        self.remove()
    }
}

impl QueueLogOf {
    /// Removes the log; the confirms it still held.
    fn remove(self) -> Vec<Arc<ConfirmHandle>> {
        match self {
            QueueLogOf::Store(l) => l.destroy(),
            QueueLogOf::Other(l) => l.destroy(),
        }
    }
}

/// Makes a non-durable queue's scratch log, the first time it must page out.
pub type OpenScratch = Box<dyn Fn() -> std::io::Result<QueueLogOf> + Send + Sync>;

/// What backs a queue on disk.
pub struct Backing {
    pub persister: Arc<Persister>,
    /// A durable queue: its log's id, the log, and what it held at boot.
    pub durable: Option<(u64, QueueLogOf, warren_store::Recovery)>,
    /// A non-durable queue: how to make a scratch log if it must page out.
    pub scratch: Option<OpenScratch>,
}

/// Where the tail of a long queue (on disk only, see `limits::PAGE_OUT_BYTES`) is read back
/// from. The state machine counts the tail; this finds its records.
struct Pager {
    cursor: Cursor,
    /// What was recovered at boot and not yet read back; an enqueue on disk at or below
    /// `recovered_max` that it does not hold had left the queue before the restart.
    recovered: LiveSet,
    recovered_max: Option<u64>,
}

impl Pager {
    fn holds(&self, seq: u64) -> bool {
        holds(&self.recovered, self.recovered_max, seq)
    }
}

fn holds(recovered: &LiveSet, recovered_max: Option<u64>, seq: u64) -> bool {
    recovered_max.is_none_or(|m| seq > m) || recovered.holds(seq)
}

/// The state machine of a local queue.
type Core = warren_queue::State<Arc<Consumer>, Arc<Message>>;

/// Everything under the queue's mutex: the state machine and what its host keeps beside it.
struct Locked {
    core: Core,
    io: Io,
}

/// The host's side: the log and what the state machine's effects leave to do once the lock is
/// released.
#[derive(Default)]
struct Io {
    log: Option<QueueLogOf>,
    pager: Option<Pager>,
    /// The last dispatch left messages ready because a consumer's connection could not take
    /// more output (as opposed to consumers out of prefetch credit).
    outbox_bound: bool,
    /// A scratch log could not be made: do not try again on every publish.
    scratch_failed: bool,
    /// Dead letters gathered under the lock, published once it is released.
    dead: Vec<(Arc<Message>, Reason)>,
    /// Confirms settled under the lock (message left before it was written), sent after it.
    confirmed: Vec<Arc<ConfirmHandle>>,
    /// The log has records to write.
    log_dirty: bool,
}

/// One command's host: the queue, its side of the lock, the publish's confirm, and the time,
/// read at most once per command.
struct Ctx<'a> {
    q: &'a Arc<Queue>,
    io: &'a mut Io,
    confirm: Option<&'a Arc<ConfirmHandle>>,
    now: Option<u64>,
}

impl Host<Arc<Consumer>, Arc<Message>> for Ctx<'_> {
    #[inline]
    fn offer(&mut self, c: &Arc<Consumer>, m: &QueuedMessage) -> warren_queue::Offer {
        match c.sink.offer(c, self.q, m) {
            Offer::Delivered => {
                let st = &self.q.stats;
                delivered(
                    &st.deliver,
                    &st.deliver_no_ack,
                    &st.redeliver,
                    c.no_ack,
                    m.redelivered,
                );
                warren_queue::Offer::Taken
            }
            Offer::OutboxFull => {
                self.io.outbox_bound = true;
                c.sink.wait_for_space(self.q.clone());
                warren_queue::Offer::Refused
            }
            Offer::NoCredit => warren_queue::Offer::Refused,
        }
    }

    fn page_in(&mut self, remaining: usize, out: &mut Vec<QueuedMessage>) -> PagedIn {
        self.io.page_in(remaining, out)
    }

    fn can_page(&mut self) -> bool {
        self.q.persister.is_some() && self.q.ensure_log(self.io)
    }

    #[inline]
    fn now(&mut self) -> u64 {
        *self.now.get_or_insert_with(now_ms)
    }

    fn effect(&mut self, effect: Effect<'_, Arc<Message>>) {
        let io = &mut *self.io;
        match effect {
            Effect::Append { entry, paged } => {
                let Some(log) = &mut io.log else { return };
                let stored = self.q.stores(&entry.msg);
                let data = crate::persist::encode_message(&entry.msg, entry.expires_at_ms);
                let confirm = self.confirm.filter(|_| stored).cloned();
                log.enqueue(entry.seq, data, confirm, paged && !stored);
                io.log_dirty = true;
            }
            Effect::Forget { seq } => {
                if let Some(log) = &mut io.log {
                    if let Some(h) = log.ack(seq) {
                        io.confirmed.push(h);
                    }
                    io.log_dirty = true;
                }
            }
            Effect::DeadLetter(m, reason) => io.dead.push((m, reason)),
            Effect::PageOut { from_seq } => {
                if let Some(log) = &io.log {
                    io.pager = Some(Pager {
                        cursor: log.cursor_at_end(from_seq),
                        recovered: LiveSet::default(),
                        recovered_max: None,
                    });
                }
            }
            Effect::ForgetTail { last_seq } => {
                if let (Some(p), Some(log)) = (io.pager.take(), &mut io.log) {
                    // What is on disk only goes with one record, without reading it back.
                    let cancelled = log.ack_range(p.cursor.next_seq, last_seq, &|s| p.holds(s));
                    io.confirmed.extend(cancelled);
                    io.log_dirty = true;
                }
            }
        }
    }
}

pub struct RemovedConsumer {
    /// The queue is auto-delete and this was its last consumer.
    pub auto_delete_now: bool,
}

/// The state machine's view of the arguments in force.
pub(crate) fn core_limits(a: &QueueArgs) -> warren_queue::Limits {
    warren_queue::Limits {
        max_length: a.max_length,
        max_length_bytes: a.max_length_bytes,
        overflow: a.overflow,
        message_ttl_ms: a.message_ttl_ms,
    }
}

impl Queue {
    pub fn new<O: QueueOwner + 'static>(
        name: Arc<str>,
        vhost: Arc<str>,
        options: QueueOptions,
        owner: Weak<O>,
    ) -> Arc<Queue> {
        Self::with_log(name, vhost, options, owner, None)
    }

    /// A queue backed by `backing`; a durable one starts with the messages its log recovered,
    /// which stay on disk until read back in order.
    pub fn with_log<O: QueueOwner + 'static>(
        name: Arc<str>,
        vhost: Arc<str>,
        options: QueueOptions,
        owner: Weak<O>,
        backing: Option<Backing>,
    ) -> Arc<Queue> {
        Self::build(name, vhost, options, owner, backing)
    }

    fn build(
        name: Arc<str>,
        vhost: Arc<str>,
        options: QueueOptions,
        owner: Weak<dyn QueueOwner>,
        backing: Option<Backing>,
    ) -> Arc<Queue> {
        let config = warren_queue::Config {
            max_priority: options.args.max_priority,
            single_active_consumer: options.args.single_active_consumer,
            auto_delete: options.auto_delete,
            page_out_msgs: limits::PAGE_OUT_MSGS,
            page_out_bytes: limits::PAGE_OUT_BYTES,
        };
        let core = warren_queue::State::new(config, core_limits(&options.args), now_ms());
        let mut io = Io::default();
        let mut recovered = None;
        let (store_id, persister, scratch) = match backing {
            None => (None, None, None),
            Some(b) => {
                let id = b.durable.map(|(id, log, rec)| {
                    let next_seq = rec.max_seq.map_or(0, |m| m + 1);
                    if let Some(first) = rec.live.first() {
                        io.pager = Some(Pager {
                            cursor: log.cursor_at_start(first),
                            recovered: rec.live,
                            recovered_max: rec.max_seq,
                        });
                        recovered = Some((next_seq, rec.count, rec.bytes));
                    } else {
                        recovered = Some((next_seq, 0, 0));
                    }
                    io.log = Some(log);
                    id
                });
                (id, Some(b.persister), b.scratch)
            }
        };
        let q = Arc::new(Queue {
            name,
            vhost,
            effective: arc_swap::ArcSwap::from_pointee(options.args.clone()),
            options,
            owner,
            may_expire: AtomicBool::new(false),
            persister,
            in_batch: AtomicBool::new(false),
            durable_store: store_id.is_some(),
            scratch,
            store_id,
            pressure: AtomicBool::new(false),
            relieved: tokio::sync::Notify::new(),
            stats: QueueStats::default(),
            state: Mutex::new(Locked { core, io }),
        });
        if let Some((next_seq, count, bytes)) = recovered {
            q.locked(|q, st, host| {
                st.recover(next_seq, count, bytes, host);
                // Recovered messages may carry deadlines; the sweeper finds out.
                q.may_expire.store(st.may_expire(), Ordering::Relaxed);
            });
        }
        q
    }

    /// The arguments in force (declared, merged with a policy).
    pub fn args(&self) -> arc_swap::Guard<Arc<QueueArgs>> {
        self.effective.load()
    }

    /// Swaps the arguments in force when a policy changes (max-priority and single active
    /// consumer are not policy-settable, so `options.args` keeps deciding those).
    pub fn set_effective_args(&self, a: QueueArgs) {
        if **self.effective.load() != a {
            self.state.lock().core.set_limits(core_limits(&a));
            self.effective.store(Arc::new(a));
        }
    }

    /// True while consumers fall behind; publishers should stall (see [`Queue::stall`]).
    pub fn pressured(&self) -> bool {
        self.pressure.load(Ordering::Relaxed)
    }

    /// Waits until the queue is relieved, for at most `max`.
    pub async fn stall(&self, max: std::time::Duration) {
        crate::flow::wait_relief(&self.relieved, || self.pressured(), max).await
    }

    /// What a publish leaves to check: deadlines for the sweeper, and publisher pressure.
    fn after_publish(&self, st: &Core, host: &Ctx<'_>) {
        if st.may_expire() && !self.may_expire.load(Ordering::Relaxed) {
            self.may_expire.store(true, Ordering::Relaxed);
        }
        // Only a consumer held back by its own connection's output counts: one that stopped
        // acking must not stop publishers (the backlog pages to disk instead).
        if host.io.outbox_bound
            && !st.consumers().is_empty()
            && (st.ready_len() > limits::QUEUE_PRESSURE_MSGS
                || st.ready_bytes() > limits::QUEUE_PRESSURE_BYTES)
        {
            self.pressure.store(true, Ordering::Relaxed);
        }
    }

    /// Marks the queue as used now (a redeclare), for `x-expires`.
    pub fn touch(&self) {
        self.state.lock().core.touch(now_ms());
    }

    /// An `x-expires` queue unused for its lease: no consumers and no use since.
    pub fn lease_expired(&self, now: u64) -> bool {
        let Some(ms) = self.args().expires_ms else {
            return false;
        };
        self.state.lock().core.lease_expired(ms, now)
    }

    pub fn describe(&self) -> String {
        format!("queue '{}' in vhost '{}'", self.name, self.vhost)
    }

    /// Runs `f` on the state machine under the queue lock, then sends what its effects left to
    /// do: confirms, the persister's wake-up, dead letters.
    #[inline]
    fn locked<R>(self: &Arc<Self>, f: impl FnOnce(&Arc<Self>, &mut Core, &mut Ctx<'_>) -> R) -> R {
        self.locked_with(None, f)
    }

    fn locked_with<R>(
        self: &Arc<Self>,
        confirm: Option<&Arc<ConfirmHandle>>,
        f: impl FnOnce(&Arc<Self>, &mut Core, &mut Ctx<'_>) -> R,
    ) -> R {
        let mut guard = self.state.lock();
        let Locked { core, io } = &mut *guard;
        let mut host = Ctx {
            q: self,
            io: &mut *io,
            confirm,
            now: None,
        };
        let r = f(self, core, &mut host);
        if self.pressure.load(Ordering::Relaxed)
            && (core.ready_len() < limits::QUEUE_RELIEF_MSGS
                || core.consumers().is_empty()
                || core.is_deleted())
        {
            self.pressure.store(false, Ordering::Relaxed);
            self.relieved.notify_waiters();
        }
        let dead = if io.dead.is_empty() {
            Vec::new()
        } else {
            std::mem::take(&mut io.dead)
        };
        let confirmed = if io.confirmed.is_empty() {
            Vec::new()
        } else {
            std::mem::take(&mut io.confirmed)
        };
        let dirty = std::mem::take(&mut io.log_dirty);
        drop(guard);
        if dirty {
            if let Some(p) = &self.persister {
                p.mark_dirty(self);
            }
        }
        if !confirmed.is_empty() {
            crate::confirm::complete_all(confirmed.into_iter().map(|h| (h, true)));
        }
        if !dead.is_empty() {
            self.publish_dead(dead);
        }
        r
    }

    /// True if a persistent message published here is written to disk (and its confirm waits).
    pub fn stores(&self, msg: &Message) -> bool {
        msg.persistent && self.durable_store
    }

    /// Enqueues and dispatches, applying TTL and the length limits. A message this queue
    /// [`stores`](Self::stores) carries `confirm`, completed once written or once it left.
    pub fn publish(
        self: &Arc<Self>,
        msg: Arc<Message>,
        confirm: Option<&Arc<ConfirmHandle>>,
    ) -> Enqueued {
        self.locked_with(confirm, |q, st, host| {
            let logged = q.stores(&msg) && host.io.log.is_some();
            host.io.outbox_bound = false;
            match st.publish(msg, logged, host) {
                warren_queue::Published::Accepted { .. } => bump(&q.stats.publish, 1),
                warren_queue::Published::Rejected => return Enqueued::Rejected,
                warren_queue::Published::Gone => return Enqueued::Gone,
            }
            q.after_publish(st, host);
            Enqueued::Accepted
        })
    }

    pub fn dispatch(self: &Arc<Self>) {
        self.locked(|_, st, host| st.dispatch(host));
    }

    /// Drops (dead-letters) messages whose deadline passed; called by the vhost sweeper.
    pub fn expire(self: &Arc<Self>) {
        self.locked(|_, st, host| {
            let now = host.now();
            st.expire(now, host)
        });
    }

    /// Its owner (the vhost), while it lives.
    pub fn owner(&self) -> Option<Arc<dyn QueueOwner>> {
        self.owner.upgrade()
    }

    pub fn message_count(self: &Arc<Self>) -> u32 {
        self.locked(|_, st, host| {
            let now = host.now();
            st.expire(now, host);
            st.ready_len() as u32
        })
    }

    /// Nothing ready, and a consumer of priority 0 or more has credit: a federated queue's
    /// links fetch from their upstreams while this holds ([`warren_queue::State::starving`]).
    pub fn starving(self: &Arc<Self>) -> bool {
        self.locked(|_, st, host| {
            let now = host.now();
            st.expire(now, host);
            st.starving(0)
        })
    }

    pub fn purge(self: &Arc<Self>) -> u32 {
        self.locked(|_, st, host| st.purge(host))
    }

    /// Marks the queue deleted (its log is removed); returns its ready count and consumers (to
    /// be told of the cancel).
    pub fn mark_deleted(self: &Arc<Self>) -> (u32, Vec<Arc<Consumer>>) {
        self.locked(|_, st, host| {
            let (n, consumers) = st.delete(host);
            if let Some(log) = host.io.log.take() {
                host.io.confirmed.extend(log.remove());
            }
            (n, consumers.into_iter().map(|c| c.handle).collect())
        })
    }

    pub fn is_deleted(&self) -> bool {
        self.state.lock().core.is_deleted()
    }
}

/// A queue waiting for a consumer's output to drain dispatches again (`flow.rs`).
impl crate::flow::SpaceWaiter for Queue {
    fn space(self: Arc<Self>) {
        self.dispatch()
    }
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Queue({})", self.name)
    }
}
