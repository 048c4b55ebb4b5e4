//! One queue: ready messages in order, its consumers, and dispatch. Each queue has its own mutex
//! and no lock is shared between queues, so N busy queues run on N cores. Work happens in the
//! task that causes it: a publisher's connection task enqueues and dispatches; an ack on the
//! consumer's connection settles and dispatches again; a writer that drained its outbox
//! dispatches the queues that were waiting for it; the vhost's sweeper expires messages.
//!
//! Lock order: queue -> channel deliveries -> outbox. Never take a queue lock while holding a
//! channel's deliveries lock. Dead letters are collected under the lock and published after it
//! is released, so dead-letter cycles between queues cannot deadlock.

pub mod args;
pub mod dead_letter;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use warren_protocol::{ByteString, FieldTable};

pub use args::{display_value, type_name, Overflow, QueueArgs};
use dead_letter::Reason;

use warren_store::{Cursor, LiveSet, QueueLog, Recovery};

use crate::channel::{ChannelShared, Offer};
use crate::confirm::ConfirmHandle;
use crate::error::{AmqpError, AmqpResult};
use crate::limits;
use crate::message::Message;
use crate::persist::Persister;
use crate::vhost::VHost;

/// A message in a queue, with its position so requeued messages go back where they were.
#[derive(Debug, Clone)]
pub struct QueuedMessage {
    pub seq: u64,
    pub msg: Arc<Message>,
    pub redelivered: bool,
    /// Deadline from `x-message-ttl` or the message's `expiration`, in [`now_ms`] time.
    pub expires_at_ms: Option<u64>,
    /// Written to (or buffered for) this queue's log: leaving the queue must record an ack.
    pub logged: bool,
}

/// A consumer: lives in its queue's consumer list and in its channel's consumer map.
pub struct Consumer {
    pub tag: ByteString,
    pub channel: Arc<ChannelShared>,
    pub queue: Arc<Queue>,
    pub no_ack: bool,
    pub exclusive: bool,
    /// `x-priority` from basic.consume: higher is served first while it has credit.
    pub priority: i64,
    /// Per-consumer prefetch (basic.qos global=false at consume time); 0 = unlimited.
    pub prefetch: u16,
    /// Unacked deliveries to this consumer; changed only under the channel's deliveries lock.
    pub unacked: AtomicU32,
    /// Set when the broker cancelled it (queue deleted) or the client did.
    pub cancelled: AtomicBool,
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
    /// Where dead letters are routed; weak so a vhost and its queues do not keep each other alive.
    vhost_ref: Weak<VHost>,
    /// Set once a message with a deadline is enqueued; the vhost sweeper only visits these queues.
    pub may_expire: AtomicBool,
    /// The group-commit thread that writes this queue's log, and whether this queue is already
    /// in its batch. Queues without one never page out.
    persister: Option<Arc<Persister>>,
    in_batch: AtomicBool,
    /// Persistent messages are stored (a durable queue) and their confirms wait for the fsync.
    durable_store: bool,
    /// A non-durable queue makes a scratch log here when it pages out.
    scratch_dir: Option<std::path::PathBuf>,
    /// The log's directory id, recorded in the definitions file.
    pub store_id: Option<u64>,
    /// Set while consumers fall behind (see `limits::QUEUE_PRESSURE_MSGS`); publishers stall on
    /// `relieved` for a bounded time. This is the queue's credit to its publishers.
    pressure: AtomicBool,
    relieved: tokio::sync::Notify,
    state: Mutex<State>,
}

/// The log a durable queue writes persistent messages to, with the confirms they owe.
pub type Log = QueueLog<Arc<ConfirmHandle>>;

/// What backs a queue on disk.
pub struct Backing {
    pub persister: Arc<Persister>,
    /// A durable queue: its log's id, the log, and what it held at boot.
    pub durable: Option<(u64, Log, Recovery)>,
    /// A non-durable queue: where to make a scratch log if it must page out.
    pub scratch_dir: Option<std::path::PathBuf>,
}

/// The tail of a long queue, on disk only (see `limits::PAGE_OUT_BYTES`). Every message
/// enqueued while a queue pages out goes here, so memory holds the head and disk the rest, in
/// order.
struct Paged {
    cursor: Cursor,
    count: usize,
    /// Body bytes.
    bytes: u64,
    /// What was recovered at boot and not yet read back; an enqueue on disk at or below
    /// `recovered_max` that it does not hold had left the queue before the restart.
    recovered: LiveSet,
    recovered_max: Option<u64>,
}

impl Paged {
    fn holds(&self, seq: u64) -> bool {
        holds(&self.recovered, self.recovered_max, seq)
    }
}

fn holds(recovered: &LiveSet, recovered_max: Option<u64>, seq: u64) -> bool {
    recovered_max.is_none_or(|m| seq > m) || recovered.holds(seq)
}

#[derive(Default)]
struct State {
    /// One deque per priority level (one level unless `x-max-priority`), each ordered by seq.
    ready: Vec<VecDeque<QueuedMessage>>,
    ready_len: usize,
    /// Body bytes of `ready`, for x-max-length-bytes.
    ready_bytes: u64,
    next_seq: u64,
    /// Sorted by priority, highest first; round-robin within equal priority.
    consumers: Vec<Arc<Consumer>>,
    rr: usize,
    /// Delivered to an ack-mode consumer or basic.get, not yet settled.
    unacked: usize,
    deleted: bool,
    /// An auto-delete queue goes away when its last consumer leaves, not before its first.
    had_consumer: bool,
    /// Last time the queue was used (declared, consumed from, got from), for `x-expires`.
    last_used_ms: u64,
    /// The last dispatch left messages ready because a consumer's connection could not take
    /// more output (as opposed to consumers out of prefetch credit).
    outbox_bound: bool,
    /// A scratch log could not be made: do not try again on every publish.
    scratch_failed: bool,
    /// Dead letters gathered under the lock, published once it is released.
    dead: Vec<(Arc<Message>, Reason)>,
    log: Option<Log>,
    /// Confirms settled under the lock (message left before it was written), sent after it.
    confirmed: Vec<Arc<ConfirmHandle>>,
    /// The log has records to write.
    log_dirty: bool,
    /// Messages on disk only, after those in `ready` (single-lane queues).
    paged: Option<Paged>,
}

pub struct RemovedConsumer {
    /// The queue is auto-delete and this was its last consumer.
    pub auto_delete_now: bool,
}

/// Milliseconds on a monotonic clock shared by the process (TTL deadlines).
pub fn now_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

impl Queue {
    pub fn new(
        name: Arc<str>,
        vhost: Arc<str>,
        options: QueueOptions,
        vhost_ref: Weak<VHost>,
    ) -> Arc<Queue> {
        Self::with_log(name, vhost, options, vhost_ref, None)
    }

    /// A queue backed by `backing`; a durable one starts with the messages its log recovered,
    /// which stay on disk until read back in order.
    pub fn with_log(
        name: Arc<str>,
        vhost: Arc<str>,
        options: QueueOptions,
        vhost_ref: Weak<VHost>,
        backing: Option<Backing>,
    ) -> Arc<Queue> {
        let levels = options.args.max_priority.map_or(1, |p| p as usize + 1);
        let mut state = State {
            ready: (0..levels).map(|_| VecDeque::new()).collect(),
            last_used_ms: now_ms(),
            ..Default::default()
        };
        let mut may_expire = false;
        let (store_id, persister, scratch_dir) = match backing {
            None => (None, None, None),
            Some(b) => {
                let id = b.durable.map(|(id, log, rec)| {
                    state.next_seq = rec.max_seq.map_or(0, |m| m + 1);
                    if let Some(first) = rec.live.first() {
                        state.ready_len = rec.count;
                        state.ready_bytes = rec.bytes;
                        state.paged = Some(Paged {
                            cursor: log.cursor_at_start(first),
                            count: rec.count,
                            bytes: rec.bytes,
                            recovered: rec.live,
                            recovered_max: rec.max_seq,
                        });
                        // Recovered messages may carry deadlines; the sweeper finds out.
                        may_expire = true;
                    }
                    state.log = Some(log);
                    id
                });
                (id, Some(b.persister), b.scratch_dir)
            }
        };
        if state.paged.is_some() && levels > 1 {
            // A priority queue keeps everything in memory: read the recovered messages now.
            while state.paged.is_some() {
                state.page_in();
            }
            let max = options.args.max_priority.unwrap_or(0);
            for m in std::mem::take(&mut state.ready[0]) {
                let level = m.msg.priority.unwrap_or(0).min(max) as usize;
                state.ready[level].push_back(m);
            }
        }
        Arc::new(Queue {
            name,
            vhost,
            effective: arc_swap::ArcSwap::from_pointee(options.args.clone()),
            options,
            vhost_ref,
            may_expire: AtomicBool::new(may_expire),
            persister,
            in_batch: AtomicBool::new(false),
            durable_store: store_id.is_some(),
            scratch_dir,
            store_id,
            pressure: AtomicBool::new(false),
            relieved: tokio::sync::Notify::new(),
            state: Mutex::new(state),
        })
    }

    /// The arguments in force (declared, merged with a policy).
    pub fn args(&self) -> arc_swap::Guard<Arc<QueueArgs>> {
        self.effective.load()
    }

    /// Swaps the arguments in force when a policy changes (max-priority and single active
    /// consumer are not policy-settable, so `options.args` keeps deciding those).
    pub fn set_effective_args(&self, a: QueueArgs) {
        if **self.effective.load() != a {
            self.effective.store(Arc::new(a));
        }
    }

    /// True while consumers fall behind; publishers should stall (see [`Queue::stall`]).
    pub fn pressured(&self) -> bool {
        self.pressure.load(Ordering::Relaxed)
    }

    /// Waits until the queue is relieved, for at most `max`.
    pub async fn stall(&self, max: std::time::Duration) {
        let relieved = self.relieved.notified();
        tokio::pin!(relieved);
        relieved.as_mut().enable();
        if self.pressured() {
            let _ = tokio::time::timeout(max, relieved).await;
        }
    }

    /// Marks the queue as used now (a redeclare), for `x-expires`.
    pub fn touch(&self) {
        self.state.lock().last_used_ms = now_ms();
    }

    /// An `x-expires` queue unused for its lease: no consumers and no use since.
    pub fn lease_expired(&self, now: u64) -> bool {
        let Some(ms) = self.args().expires_ms else {
            return false;
        };
        let st = self.state.lock();
        st.consumers.is_empty() && !st.deleted && now.saturating_sub(st.last_used_ms) >= ms
    }

    /// Joins the persister's next batch; false if already in it.
    pub fn mark_dirty(&self) -> bool {
        !self.in_batch.swap(true, Ordering::AcqRel)
    }

    /// Called by the persister: writes the buffered records (the caller fsyncs the files).
    pub fn write_log(&self) -> warren_store::Written<Arc<ConfirmHandle>> {
        self.in_batch.store(false, Ordering::Release);
        let mut st = self.state.lock();
        st.log_dirty = false;
        match &mut st.log {
            Some(log) => {
                let before = log.bytes_written;
                let r = log.write_pending();
                if let Some(p) = &self.persister {
                    p.bytes
                        .fetch_add(log.bytes_written - before, Ordering::Relaxed);
                }
                r
            }
            None => Ok((Vec::new(), Vec::new())),
        }
    }

    pub fn describe(&self) -> String {
        format!("queue '{}' in vhost '{}'", self.name, self.vhost)
    }

    /// Runs `f` under the queue lock, then publishes any dead letters it produced.
    fn locked<R>(self: &Arc<Self>, f: impl FnOnce(&Arc<Self>, &mut State) -> R) -> R {
        let mut st = self.state.lock();
        let r = f(self, &mut st);
        if self.pressure.load(Ordering::Relaxed)
            && (st.ready_len < limits::QUEUE_RELIEF_MSGS || st.consumers.is_empty() || st.deleted)
        {
            self.pressure.store(false, Ordering::Relaxed);
            self.relieved.notify_waiters();
        }
        let dead = if st.dead.is_empty() {
            Vec::new()
        } else {
            std::mem::take(&mut st.dead)
        };
        let confirmed = if st.confirmed.is_empty() {
            Vec::new()
        } else {
            std::mem::take(&mut st.confirmed)
        };
        let dirty = std::mem::take(&mut st.log_dirty);
        drop(st);
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
        self.locked(|q, st| {
            if st.deleted {
                return Enqueued::Gone;
            }
            let args = q.args();
            let a = &*args;
            let size = msg.body.len() as u64;
            if a.overflow != Overflow::DropHead && st.is_full(a, size) {
                if a.overflow == Overflow::RejectPublishDlx {
                    st.dead.push((msg, Reason::MaxLen));
                }
                return Enqueued::Rejected;
            }
            let ttl = match (a.message_ttl_ms, msg.expiration_ms) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            };
            let now = if ttl.is_some() { now_ms() } else { 0 };
            let expires_at_ms = ttl.map(|t| now.saturating_add(t));
            if expires_at_ms.is_some() {
                q.may_expire.store(true, Ordering::Relaxed);
            }
            let seq = st.next_seq;
            st.next_seq += 1;
            let level = q.level(&msg);
            let stored = q.stores(&msg);
            let was_empty = st.ready_len == 0;
            st.ready_bytes += size;
            st.ready_len += 1;
            let page_out = st.paged.is_some()
                || (level == 0
                    && q.options.args.max_priority.is_none()
                    && (st.ready_len > limits::PAGE_OUT_MSGS
                        || st.ready_bytes > limits::PAGE_OUT_BYTES)
                    && q.start_paging(st, seq));
            if let (true, Some(log), Some(p)) = (page_out, &mut st.log, &mut st.paged) {
                let data = crate::persist::encode_message(&msg, expires_at_ms);
                log.enqueue(seq, data, confirm.filter(|_| stored).cloned(), !stored);
                p.count += 1;
                p.bytes += size;
                st.log_dirty = true;
            } else {
                let logged = stored && st.log.is_some();
                if let (true, Some(log)) = (logged, &mut st.log) {
                    let data = crate::persist::encode_message(&msg, expires_at_ms);
                    log.enqueue(seq, data, confirm.cloned(), false);
                    st.log_dirty = true;
                }
                st.ready[level].push_back(QueuedMessage {
                    seq,
                    msg,
                    redelivered: false,
                    expires_at_ms,
                    logged,
                });
            }
            if was_empty {
                // A message that finds the queue empty is offered before any deadline is
                // checked, as RabbitMQ does: a TTL 0 message reaches a consumer that can take it
                // at once, and expires just below otherwise.
                q.deliver_locked(st, None);
            } else {
                q.dispatch_locked(st);
            }
            if expires_at_ms.is_some() {
                st.expire(now);
            }
            // Only a consumer held back by its own connection's output counts: one that stopped
            // acking must not stop publishers (the backlog pages to disk instead).
            if st.outbox_bound
                && !st.consumers.is_empty()
                && (st.ready_len > limits::QUEUE_PRESSURE_MSGS
                    || st.ready_bytes > limits::QUEUE_PRESSURE_BYTES)
            {
                q.pressure.store(true, Ordering::Relaxed);
            }
            if a.overflow == Overflow::DropHead {
                st.drop_head(a);
            }
            Enqueued::Accepted
        })
    }

    /// Starts keeping new messages on disk only, from `seq` on; false if this queue cannot.
    fn start_paging(&self, st: &mut State, seq: u64) -> bool {
        if self.persister.is_none() {
            return false;
        }
        if st.log.is_none() {
            let Some(dir) = self.scratch_dir.as_deref().filter(|_| !st.scratch_failed) else {
                return false;
            };
            match Log::open(dir, crate::persist::stored_body_len) {
                Ok((mut log, _)) => {
                    log.set_scratch();
                    st.log = Some(log);
                }
                Err(e) => {
                    st.scratch_failed = true;
                    tracing::warn!(queue = %self.name, vhost = %self.vhost, error = %e, "cannot page out: the queue keeps its backlog in memory");
                    return false;
                }
            }
        }
        let Some(log) = &st.log else { return false };
        st.paged = Some(Paged {
            cursor: log.cursor_at_end(seq),
            count: 0,
            bytes: 0,
            recovered: LiveSet::default(),
            recovered_max: None,
        });
        true
    }

    fn level(&self, msg: &Message) -> usize {
        match self.options.args.max_priority {
            None => 0,
            Some(max) => msg.priority.unwrap_or(0).min(max) as usize,
        }
    }

    pub fn dispatch(self: &Arc<Self>) {
        self.locked(|q, st| q.dispatch_locked(st));
    }

    /// Drops (dead-letters) messages whose deadline passed; called by the vhost sweeper.
    pub fn expire(self: &Arc<Self>) {
        self.locked(|_, st| st.expire(now_ms()));
    }

    fn dispatch_locked(self: &Arc<Self>, st: &mut State) {
        let expiring = if st.ready_len > 0 && self.may_expire.load(Ordering::Relaxed) {
            let now = now_ms();
            st.expire(now);
            Some(now)
        } else {
            None
        };
        self.deliver_locked(st, expiring);
    }

    /// Offers ready messages to the consumers. With `expiring`, deadlines are checked against
    /// it each time a message leaves: classic queues expire from the head only, so a message
    /// that expired behind a live one is dropped when it becomes the head, never delivered.
    /// `None` (no message here has a deadline) keeps the loop free of clock and deadline work.
    fn deliver_locked(self: &Arc<Self>, st: &mut State, expiring: Option<u64>) {
        st.outbox_bound = false;
        'messages: while st.ready_len > 0 && !st.consumers.is_empty() {
            st.fill();
            // With a single active consumer only the first (oldest of the highest priority) receives.
            let n = if self.options.args.single_active_consumer {
                1
            } else {
                st.consumers.len()
            };
            let mut start = 0;
            // Priority groups, highest first; round-robin inside a group.
            while start < n {
                let p = st.consumers[start].priority;
                let end = st.consumers[start..]
                    .iter()
                    .position(|c| c.priority != p)
                    .map_or(n, |i| start + i);
                let len = end - start;
                for k in 0..len {
                    let idx = start + (st.rr + k) % len;
                    let Some(front) = st.front() else {
                        break 'messages;
                    };
                    let c = &st.consumers[idx];
                    match c.channel.offer(c, self, front) {
                        Offer::Delivered => {
                            let no_ack = c.no_ack;
                            if let Some(m) = st.pop_ready() {
                                if no_ack {
                                    st.forget(&m);
                                } else {
                                    st.unacked += 1;
                                }
                            }
                            if let Some(now) = expiring {
                                st.expire(now);
                            }
                            st.rr = st.rr.wrapping_add(k + 1);
                            continue 'messages;
                        }
                        Offer::OutboxFull => {
                            st.outbox_bound = true;
                            c.channel.outbox.wait_for_space(self)
                        }
                        Offer::NoCredit => {}
                    }
                }
                start = end;
            }
            break;
        }
    }

    /// basic.get: takes the head message. `ack_mode` counts it as unacked.
    pub fn get(self: &Arc<Self>, ack_mode: bool, take: impl FnOnce(&QueuedMessage, u32)) -> bool {
        self.locked(|q, st| {
            st.last_used_ms = now_ms();
            st.expire(st.last_used_ms);
            let Some(m) = st.pop_ready() else {
                return false;
            };
            // RabbitMQ drops what expired behind the head as soon as it is the head, before
            // the count in get-ok is taken.
            if q.may_expire.load(Ordering::Relaxed) {
                st.expire(st.last_used_ms);
            }
            if ack_mode {
                st.unacked += 1;
            } else {
                st.forget(&m);
            }
            take(&m, st.ready_len as u32);
            true
        })
    }

    /// Settles acked messages and, with `dispatch`, dispatches. A channel under a channel-wide
    /// limit passes false and dispatches all its queues itself, in a fair order.
    pub fn settle(self: &Arc<Self>, msgs: impl IntoIterator<Item = QueuedMessage>, dispatch: bool) {
        self.locked(|q, st| {
            for m in msgs {
                st.unacked = st.unacked.saturating_sub(1);
                st.forget(&m);
            }
            if dispatch {
                q.dispatch_locked(st);
            }
        })
    }

    /// Rejected without requeue: settled, and dead-lettered if the queue has a DLX.
    /// `dispatch` as for [`Queue::settle`].
    pub fn discard(
        self: &Arc<Self>,
        msgs: impl IntoIterator<Item = QueuedMessage>,
        dispatch: bool,
    ) {
        self.locked(|q, st| {
            for m in msgs {
                st.unacked = st.unacked.saturating_sub(1);
                st.forget(&m);
                st.dead.push((m.msg, Reason::Rejected));
            }
            if dispatch {
                q.dispatch_locked(st);
            }
        })
    }

    /// Puts unacked messages back at their original positions, marked redelivered. A queue
    /// this takes past x-max-length(-bytes) drops from the head under drop-head, as RabbitMQ's
    /// requeue does; the reject overflow modes refuse publishes only, so it stays over.
    pub fn requeue(self: &Arc<Self>, msgs: impl IntoIterator<Item = QueuedMessage>) {
        self.locked(|q, st| {
            if st.deleted {
                return;
            }
            for mut m in msgs {
                st.unacked = st.unacked.saturating_sub(1);
                m.redelivered = true;
                let level = q.level(&m.msg);
                st.ready_bytes += m.msg.body.len() as u64;
                st.ready_len += 1;
                let lane = &mut st.ready[level];
                let pos = lane.partition_point(|r| r.seq < m.seq);
                lane.insert(pos, m);
            }
            st.drop_head(&q.args());
            q.dispatch_locked(st);
        })
    }

    /// Adds a consumer; `on_added` runs under the queue lock (it sends consume-ok), so no
    /// delivery can overtake the consume-ok.
    pub fn add_consumer(
        self: &Arc<Self>,
        c: Arc<Consumer>,
        on_added: impl FnOnce(),
    ) -> AmqpResult<()> {
        self.locked(|q, st| {
            if st.deleted {
                return Err(AmqpError::not_found(format!("no {}", q.describe())));
            }
            if st.consumers.iter().any(|x| x.exclusive) || (c.exclusive && !st.consumers.is_empty())
            {
                return Err(AmqpError::access_refused(format!(
                    "{} in exclusive use",
                    q.describe()
                )));
            }
            let pos = st.consumers.partition_point(|x| x.priority >= c.priority);
            st.consumers.insert(pos, c);
            st.had_consumer = true;
            on_added();
            q.dispatch_locked(st);
            Ok(())
        })
    }

    pub fn remove_consumer(self: &Arc<Self>, c: &Arc<Consumer>) -> RemovedConsumer {
        self.locked(|q, st| {
            st.consumers.retain(|x| !Arc::ptr_eq(x, c));
            st.last_used_ms = now_ms();
            // The next consumer may have become the active one.
            q.dispatch_locked(st);
            RemovedConsumer {
                auto_delete_now: q.options.auto_delete
                    && st.had_consumer
                    && st.consumers.is_empty()
                    && !st.deleted,
            }
        })
    }

    pub fn message_count(self: &Arc<Self>) -> u32 {
        self.locked(|_, st| {
            st.expire(now_ms());
            st.ready_len as u32
        })
    }

    /// Delivered and not yet settled (management API's messages_unacknowledged).
    pub fn unacked_count(&self) -> u32 {
        self.state.lock().unacked as u32
    }

    pub fn consumer_count(&self) -> u32 {
        self.state.lock().consumers.len() as u32
    }

    /// The consumers in dispatch order (with a single active consumer, the first is the
    /// active one), for the management side.
    pub fn consumers(&self) -> Vec<Arc<Consumer>> {
        self.state.lock().consumers.clone()
    }

    pub fn purge(self: &Arc<Self>) -> u32 {
        self.locked(|_, st| {
            let n = st.ready_len as u32;
            st.clear_ready();
            n
        })
    }

    /// Marks the queue deleted (its log is removed); returns its ready count and consumers (to
    /// be told of the cancel).
    pub fn mark_deleted(self: &Arc<Self>) -> (u32, Vec<Arc<Consumer>>) {
        self.locked(|_, st| {
            st.deleted = true;
            let n = st.ready_len as u32;
            st.clear_ready();
            if let Some(log) = st.log.take() {
                st.confirmed.extend(log.destroy());
            }
            (n, std::mem::take(&mut st.consumers))
        })
    }

    pub fn is_deleted(&self) -> bool {
        self.state.lock().deleted
    }

    fn publish_dead(&self, dead: Vec<(Arc<Message>, Reason)>) {
        let args = self.args();
        let a = &*args;
        let (Some(dlx), Some(vhost)) = (&a.dead_letter_exchange, self.vhost_ref.upgrade()) else {
            return;
        };
        let now_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut targets = Vec::new();
        for (msg, reason) in dead {
            let (m, cc) = dead_letter::dead_lettered(
                &msg,
                &self.name,
                reason,
                dlx,
                a.dead_letter_routing_key.as_deref(),
                now_s,
            );
            targets.clear();
            // A missing dead-letter exchange drops the message, as in RabbitMQ.
            if vhost
                .route_keys(
                    &m.exchange,
                    &m.routing_key,
                    &cc,
                    &m.properties,
                    &mut targets,
                )
                .is_err()
            {
                continue;
            }
            let m = Arc::new(m);
            for q in targets.drain(..) {
                q.publish(m.clone(), None);
            }
        }
    }
}

impl State {
    fn front(&self) -> Option<&QueuedMessage> {
        self.ready.iter().rev().find_map(|l| l.front())
    }

    /// Reads the next paged-out messages back once memory holds none.
    fn fill(&mut self) {
        if self.paged.is_some() && self.ready[0].is_empty() {
            self.page_in();
        }
    }

    /// Reads about `limits::PAGE_IN_BYTES` of paged-out messages into lane 0, in order.
    fn page_in(&mut self) {
        let (Some(p), Some(log)) = (&mut self.paged, &self.log) else {
            self.paged = None;
            return;
        };
        let (recovered, max) = (&p.recovered, p.recovered_max);
        let got = match log.read(&mut p.cursor, limits::PAGE_IN_BYTES, |s| {
            holds(recovered, max, s)
        }) {
            Ok(got) => got,
            Err(e) => {
                tracing::error!(error = %e, "cannot read paged-out messages back");
                Vec::new()
            }
        };
        let lost = got.is_empty();
        for (seq, data) in got {
            // More records than the tail counts would be a bookkeeping bug: never underflow.
            if p.count == 0 {
                tracing::error!(
                    seq,
                    "a paged-out record beyond the queue's count is ignored"
                );
                break;
            }
            p.recovered.forget_below(seq);
            let redelivered = p.recovered_max.is_some_and(|m| seq <= m);
            let size = crate::persist::stored_body_len(&data);
            p.count -= 1;
            p.bytes = p.bytes.saturating_sub(size);
            let Some((msg, expires_at_ms)) = crate::persist::decode_message(&data) else {
                tracing::warn!(seq, "skipping a stored message that does not decode");
                self.ready_len = self.ready_len.saturating_sub(1);
                self.ready_bytes = self.ready_bytes.saturating_sub(size);
                continue;
            };
            // Recovered at boot: it may have been delivered before the restart, so say so.
            self.ready[0].push_back(QueuedMessage {
                seq,
                msg: Arc::new(msg),
                redelivered,
                expires_at_ms,
                logged: true,
            });
        }
        if lost && p.count > 0 {
            tracing::error!(
                messages = p.count,
                "paged-out messages could not be read back and are dropped"
            );
            self.ready_len = self.ready_len.saturating_sub(p.count);
            self.ready_bytes = self.ready_bytes.saturating_sub(p.bytes);
            p.count = 0;
        }
        if p.count == 0 {
            self.paged = None;
        }
    }

    #[inline]
    fn pop_ready(&mut self) -> Option<QueuedMessage> {
        self.fill();
        let m = self.ready.iter_mut().rev().find_map(|l| l.pop_front())?;
        self.ready_bytes -= m.msg.body.len() as u64;
        self.ready_len -= 1;
        Some(m)
    }

    fn clear_ready(&mut self) {
        let lanes = std::mem::take(&mut self.ready);
        for m in lanes.iter().flatten() {
            self.forget(m);
        }
        self.ready = lanes.into_iter().map(|_| VecDeque::new()).collect();
        if let (Some(p), Some(log)) = (self.paged.take(), &mut self.log) {
            // What is on disk only goes with one record, without reading it back.
            let last = self.next_seq.saturating_sub(1);
            let cancelled = log.ack_range(p.cursor.next_seq, last, |s| p.holds(s));
            self.confirmed.extend(cancelled);
            self.log_dirty = true;
        }
        self.ready_len = 0;
        self.ready_bytes = 0;
    }

    /// A message left the queue for good: record it in the log (or cancel its buffered write).
    #[inline]
    fn forget(&mut self, m: &QueuedMessage) {
        if !m.logged {
            return;
        }
        if let Some(log) = &mut self.log {
            if let Some(h) = log.ack(m.seq) {
                self.confirmed.push(h);
            }
            self.log_dirty = true;
        }
    }

    /// Expires from the head of each lane only, as RabbitMQ does.
    fn expire(&mut self, now: u64) {
        for i in 0..self.ready.len() {
            loop {
                if i == 0 {
                    self.fill();
                }
                let mut expired = false;
                while self.ready[i]
                    .front()
                    .is_some_and(|m| m.expires_at_ms.is_some_and(|t| t <= now))
                {
                    if let Some(m) = self.ready[i].pop_front() {
                        self.ready_bytes -= m.msg.body.len() as u64;
                        self.ready_len -= 1;
                        self.forget(&m);
                        self.dead.push((m.msg, Reason::Expired));
                        expired = true;
                    }
                }
                // The whole head expired: the paged-out messages behind it may have too.
                if !(expired && self.ready[i].is_empty() && self.paged.is_some()) {
                    break;
                }
            }
        }
    }

    /// Under drop-head, drops (dead-letters, reason maxlen) from the head until the queue is
    /// within its length limits.
    fn drop_head(&mut self, a: &QueueArgs) {
        if a.overflow != Overflow::DropHead {
            return;
        }
        while self.is_full(a, 0) {
            let Some(m) = self.pop_ready() else { break };
            self.forget(&m);
            self.dead.push((m.msg, Reason::MaxLen));
        }
    }

    /// Over a limit once a message of `incoming` bytes is added (0: already over).
    fn is_full(&self, a: &QueueArgs, incoming: u64) -> bool {
        let extra = (incoming > 0) as u64;
        a.max_length
            .is_some_and(|m| self.ready_len as u64 + extra > m)
            || a.max_length_bytes
                .is_some_and(|m| self.ready_bytes + incoming > m)
    }
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Queue({})", self.name)
    }
}

/// Checks if a consumer may take another delivery under its own prefetch.
pub fn consumer_has_credit(c: &Consumer) -> bool {
    c.no_ack || c.prefetch == 0 || c.unacked.load(Ordering::Relaxed) < c.prefetch as u32
}
