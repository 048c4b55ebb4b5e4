//! A stream (`x-queue-type=stream`): an append-only log that consumers read from an offset of
//! their choosing, without removing anything. Old messages go with whole segments (retention).
//!
//! Not a mode of [`super::Queue`]: a stream has no ready list, no requeue, no per-message state,
//! so it shares none of the classic queue's state machine, and keeping it apart leaves the
//! classic hot path untouched (one more `QueueRef` variant, folded by the match).
//!
//! Writing: a publish takes the stream's mutex only to number the message (its offset, patched
//! into its `x-stream-offset` header, so deliveries copy bytes and re-encode nothing) and to
//! buffer it; the persister writes and fsyncs the buffer as one chunk (group commit), then
//! confirms the publishes and advances `committed`. Only committed offsets are delivered, so a
//! consumer never sees an offset that a crash could give to another message.
//!
//! Reading: each consumer has its own task and cursor. Near the end it copies `Arc`s from the
//! tail cache (the newest `TAIL_MSGS`/`TAIL_BYTES`); behind it, it reads the segment files
//! on the blocking pool (`warren_store::stream::read`, no lock held), so readers at any offset
//! never hold the writer up. A consumer at the end sleeps until a group commit wakes it; one out of prefetch
//! until an ack returns credit. Acks only return credit.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use warren_protocol::properties::BasicProperties;
use warren_protocol::{FieldTable, FieldValue};
use warren_store::stream::{self as log, StreamLog};

use crate::channel::Offer;
use crate::confirm::ConfirmHandle;
use crate::error::{AmqpError, AmqpResult};
use crate::message::Message;
use crate::metrics::QueueStats;
use crate::persist::{Logged, Persister};

use super::{Consumer, Enqueued, QueueArgs, QueueOptions, QueuedMessage, Settled};

/// The newest messages kept in memory for consumers at the end.
const TAIL_MSGS: usize = 16 * 1024;
const TAIL_BYTES: u64 = 8 * 1024 * 1024;
/// Above this much waiting for its group write, publishers are held back (`pressured`).
const PENDING_HIGH_BYTES: u64 = 64 * 1024 * 1024;
/// Most messages a reader takes from the cache at once, and bytes it reads from a file.
const READ_MSGS: usize = 256;
const READ_BYTES: u64 = 256 * 1024;

/// Retention and segment size in force: the declared arguments merged with a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamLimits {
    pub max_bytes: Option<u64>,
    pub max_age_ms: Option<u64>,
    pub segment_bytes: Option<u64>,
}

impl StreamLimits {
    /// From a declare's arguments (already validated by `queue_type`).
    pub fn from_args(a: &FieldTable) -> StreamLimits {
        StreamLimits {
            max_bytes: a
                .get("x-max-length-bytes")
                .and_then(FieldValue::as_i64)
                .and_then(|n| u64::try_from(n).ok()),
            max_age_ms: a
                .get("x-max-age")
                .and_then(FieldValue::as_str)
                .and_then(|s| parse_age(s).ok()),
            segment_bytes: a
                .get("x-stream-max-segment-size-bytes")
                .and_then(FieldValue::as_i64)
                .and_then(|n| u64::try_from(n).ok()),
        }
    }

    /// Merged with a policy's `max-length-bytes`, `max-age` and
    /// `stream-max-segment-size-bytes` (the queue's own argument wins, as RabbitMQ's streams do).
    pub fn with_policy(self, p: Option<&crate::access::PolicyDef>) -> StreamLimits {
        let Some(p) = p else { return self };
        let d = &p.definition;
        let num = |k: &str| {
            d.get(k)
                .and_then(serde_json::Value::as_i64)
                .and_then(|n| u64::try_from(n).ok())
        };
        StreamLimits {
            max_bytes: self.max_bytes.or(num("max-length-bytes")),
            max_age_ms: self.max_age_ms.or(d
                .get("max-age")
                .and_then(serde_json::Value::as_str)
                .and_then(|s| parse_age(s).ok())),
            segment_bytes: self.segment_bytes.or(num("stream-max-segment-size-bytes")),
        }
    }
}

/// Why an age string was refused: RabbitMQ answers `invalid_max_age` for a bad unit or zero,
/// and crashes (541) when there are no digits at all.
#[derive(Debug, PartialEq, Eq)]
pub enum BadAge {
    Invalid,
    NoDigits,
}

/// `x-max-age` and interval offsets: digits and a unit, Y M D h m s (RabbitMQ's units; a
/// month is 30 days, a year 365).
pub fn parse_age(s: &str) -> Result<u64, BadAge> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(BadAge::NoDigits);
    }
    let n: u64 = s[..digits].parse().unwrap_or(u64::MAX);
    let unit_s: u64 = match &s[digits..] {
        "Y" => 365 * 86_400,
        "M" => 30 * 86_400,
        "D" => 86_400,
        "h" => 3_600,
        "m" => 60,
        "s" => 1,
        _ => return Err(BadAge::Invalid),
    };
    match n.saturating_mul(unit_s).saturating_mul(1000) {
        0 => Err(BadAge::Invalid),
        ms => Ok(ms),
    }
}

/// Where a new consumer starts (`x-stream-offset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    First,
    /// The first offset of the last chunk (the last group commit).
    Last,
    Next,
    Offset(u64),
    /// The first message stored at or after this Unix time (ms).
    Time(u64),
}

/// Parses `x-stream-offset` as RabbitMQ 3.10 does; what it cannot parse crashes its channel
/// process (541 INTERNAL_ERROR, the connection is closed).
pub fn parse_start(v: Option<&FieldValue>) -> AmqpResult<StartAt> {
    let crash = || AmqpError {
        code: warren_protocol::reply::INTERNAL_ERROR,
        text: "INTERNAL_ERROR".into(),
        class_id: 0,
        method_id: 0,
    };
    let Some(v) = v else {
        return Ok(StartAt::Next);
    };
    if let FieldValue::Timestamp(s) = v {
        return Ok(StartAt::Time(s.saturating_mul(1000)));
    }
    if let (Some(n), false) = (v.as_i64(), matches!(v, FieldValue::Bool(_))) {
        return Ok(StartAt::Offset(n.max(0) as u64));
    }
    match v.as_str() {
        Some("first") => Ok(StartAt::First),
        Some("last") => Ok(StartAt::Last),
        Some("next") => Ok(StartAt::Next),
        Some(s) => match parse_age(s) {
            Ok(ms) => Ok(StartAt::Time(unix_ms().saturating_sub(ms))),
            Err(_) => Err(crash()),
        },
        None => Err(crash()),
    }
}

pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A consumer's reading state, shared between its task, the stream and the channel's acks.
struct Reader {
    consumer: Arc<Consumer>,
    /// Deliveries it may still take (its prefetch less its unacked ones).
    credit: AtomicU32,
    wake: tokio::sync::Notify,
    /// Waiting for the next group commit.
    at_end: AtomicBool,
}

struct Inner {
    log: StreamLog<Arc<ConfirmHandle>>,
    /// The newest messages; `tail[0]` has offset `tail_first`.
    tail: VecDeque<Arc<Message>>,
    tail_first: u64,
    tail_bytes: u64,
    /// One past the last offset of the write in flight (committed once its fsync is done).
    in_flight: u64,
    deleted: bool,
}

pub struct Stream {
    pub name: Arc<str>,
    pub vhost: Arc<str>,
    pub options: QueueOptions,
    effective: arc_swap::ArcSwap<QueueArgs>,
    declared: StreamLimits,
    limits: arc_swap::ArcSwap<StreamLimits>,
    /// The log's directory id, recorded in the definitions file.
    pub store_id: u64,
    dir: std::path::PathBuf,
    persister: Arc<Persister>,
    in_batch: AtomicBool,
    inner: Mutex<Inner>,
    /// Offsets below this are on disk and may be delivered.
    committed: AtomicU64,
    /// The first offset retained (read without the lock for counts).
    first: AtomicU64,
    readers: Mutex<Vec<Arc<Reader>>>,
    deleted: AtomicBool,
    pressure: AtomicBool,
    relieved: tokio::sync::Notify,
    pub stats: QueueStats,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({})", self.name)
    }
}

impl Stream {
    /// Opens (or recovers) the stream whose log lives in `dir`.
    pub fn open(
        name: Arc<str>,
        vhost: Arc<str>,
        options: QueueOptions,
        store_id: u64,
        dir: std::path::PathBuf,
        persister: Arc<Persister>,
    ) -> std::io::Result<Arc<Stream>> {
        let declared = StreamLimits::from_args(&options.arguments);
        let segment = declared.segment_bytes.unwrap_or(log::DEFAULT_SEGMENT_BYTES);
        let log = StreamLog::open(&dir, segment)?;
        let next = log.next_offset();
        let first = log.first_offset();
        if next > 0 {
            tracing::info!(vhost = %vhost, stream = %name, first, next, segments = log.segment_count(), "stream recovered");
        }
        Ok(Arc::new(Stream {
            effective: arc_swap::ArcSwap::from_pointee(options.args.clone()),
            name,
            vhost,
            options,
            declared,
            limits: arc_swap::ArcSwap::from_pointee(declared),
            store_id,
            dir,
            persister,
            in_batch: AtomicBool::new(false),
            inner: Mutex::new(Inner {
                log,
                tail: VecDeque::new(),
                tail_first: next,
                tail_bytes: 0,
                in_flight: next,
                deleted: false,
            }),
            committed: AtomicU64::new(next),
            first: AtomicU64::new(first),
            readers: Mutex::new(Vec::new()),
            deleted: AtomicBool::new(false),
            pressure: AtomicBool::new(false),
            relieved: tokio::sync::Notify::new(),
            stats: QueueStats::default(),
        }))
    }

    pub fn describe(&self) -> String {
        format!("queue '{}' in vhost '{}'", self.name, self.vhost)
    }

    pub fn args(&self) -> arc_swap::Guard<Arc<QueueArgs>> {
        self.effective.load()
    }

    pub fn set_effective_args(&self, a: QueueArgs) {
        self.effective.store(Arc::new(a));
    }

    /// Applies the vhost's policy for this stream (retention and segment size).
    pub fn set_policy(&self, p: Option<&crate::access::PolicyDef>) {
        let l = self.declared.with_policy(p);
        if **self.limits.load() != l {
            self.limits.store(Arc::new(l));
            let mut g = self.inner.lock();
            g.log.max_segment_bytes = l.segment_bytes.unwrap_or(log::DEFAULT_SEGMENT_BYTES).max(1);
            drop(g);
            self.enforce_retention();
        }
    }

    pub fn limits(&self) -> StreamLimits {
        **self.limits.load()
    }

    /// Retained messages (committed ones still on disk).
    pub fn message_count(&self) -> u32 {
        let c = self.committed.load(Ordering::Acquire);
        c.saturating_sub(self.first.load(Ordering::Relaxed))
            .min(u32::MAX as u64) as u32
    }

    pub fn first_offset(&self) -> u64 {
        self.first.load(Ordering::Relaxed)
    }

    pub fn committed(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    pub fn disk_bytes(&self) -> u64 {
        self.inner.lock().log.disk_bytes()
    }

    pub fn pressured(&self) -> bool {
        self.pressure.load(Ordering::Relaxed)
    }

    pub async fn stall(&self, max: Duration) {
        crate::limits::wait_relief(&self.relieved, || self.pressured(), max).await
    }

    /// Appends `msg` with the next offset; its confirm completes once the chunk is fsynced.
    pub fn publish(
        self: &Arc<Self>,
        msg: Arc<Message>,
        confirm: Option<&Arc<ConfirmHandle>>,
    ) -> Enqueued {
        // Encoded outside the lock with a placeholder offset, patched under it.
        let (mut data, props, patch) = encode_with_offset(&msg);
        let ts = unix_ms();
        let mut g = self.inner.lock();
        if g.deleted {
            return Enqueued::Gone;
        }
        let offset = g.log.next_offset();
        data[patch..patch + 8].copy_from_slice(&offset.to_be_bytes());
        let data = data.freeze();
        let m = Arc::new(Message {
            exchange: msg.exchange.clone(),
            routing_key: msg.routing_key.clone(),
            properties: data.slice(props.clone()),
            body: data.slice(props.end..),
            persistent: msg.persistent,
            priority: msg.priority,
            expiration_ms: None,
        });
        g.log.append(ts, data, confirm.cloned());
        g.tail_bytes += m.body.len() as u64;
        g.tail.push_back(m);
        while g.tail.len() > TAIL_MSGS || (g.tail_bytes > TAIL_BYTES && g.tail.len() > 1) {
            if let Some(old) = g.tail.pop_front() {
                g.tail_bytes -= old.body.len() as u64;
                g.tail_first += 1;
            }
        }
        if g.log.pending_bytes() > PENDING_HIGH_BYTES {
            self.pressure.store(true, Ordering::Relaxed);
        }
        drop(g);
        self.stats.publish.fetch_add(1, Ordering::Relaxed);
        self.persister.mark_dirty(self);
        Enqueued::Accepted
    }

    /// Deletes old segments past the limits in force.
    fn enforce_retention(&self) {
        let l = self.limits();
        if l.max_bytes.is_none() && l.max_age_ms.is_none() {
            return;
        }
        let min_ts = l.max_age_ms.map(|a| unix_ms().saturating_sub(a));
        let mut g = self.inner.lock();
        let removed = g.log.retain(l.max_bytes, min_ts);
        if removed > 0 {
            self.first.store(g.log.first_offset(), Ordering::Relaxed);
            let (first, segments) = (g.log.first_offset(), g.log.segment_count());
            drop(g);
            tracing::debug!(stream = %self.name, removed, first, segments, "stream retention");
        }
    }

    /// The sweeper's periodic visit: retention by age.
    pub fn may_expire(&self) -> bool {
        self.limits.load().max_age_ms.is_some()
    }

    pub fn expire(&self) {
        self.enforce_retention();
    }

    /// Adds a consumer starting at `start`; `on_added` sends consume-ok before any delivery.
    pub fn add_consumer(
        self: &Arc<Self>,
        c: Arc<Consumer>,
        start: StartAt,
        on_added: impl FnOnce(),
    ) -> AmqpResult<()> {
        // RabbitMQ's order: the prefetch first, then the ack mode.
        if c.prefetch == 0 {
            return Err(AmqpError::precondition_failed(format!(
                "consumer prefetch count is not set for '{}'",
                self.describe()
            )));
        }
        if c.no_ack {
            return Err(AmqpError::not_implemented(format!(
                "automatic acknowledgement not supported by stream queues {}",
                self.describe()
            )));
        }
        let from = {
            let g = self.inner.lock();
            if g.deleted {
                return Err(AmqpError::not_found(format!("no {}", self.describe())));
            }
            let first = g.log.first_offset();
            match start {
                StartAt::First => first,
                StartAt::Next => g.log.next_offset(),
                StartAt::Last if g.log.written() > first => g.log.last_chunk().max(first),
                StartAt::Last => g.log.next_offset(),
                StartAt::Offset(n) => n.max(first),
                StartAt::Time(ms) => match g.log.plan_at_time(ms) {
                    None => g.log.written(),
                    Some(plan) => {
                        // Read without the lock would race retention for nothing: this is once
                        // per consume, at most one index step of a segment.
                        let written = g.log.written();
                        drop(g);
                        first_at_or_after(&plan, ms).unwrap_or(written)
                    }
                },
            }
        };
        let reader = Arc::new(Reader {
            credit: AtomicU32::new(u32::from(c.prefetch)),
            consumer: c,
            wake: tokio::sync::Notify::new(),
            at_end: AtomicBool::new(false),
        });
        self.readers.lock().push(reader.clone());
        on_added();
        tokio::spawn(self.clone().serve(reader, from));
        Ok(())
    }

    pub fn remove_consumer(&self, c: &Arc<Consumer>) {
        let mut rs = self.readers.lock();
        if let Some(i) = rs.iter().position(|r| r.consumer.key == c.key) {
            let r = rs.swap_remove(i);
            r.wake.notify_one();
        }
    }

    pub fn consumers(&self) -> Vec<Arc<Consumer>> {
        self.readers
            .lock()
            .iter()
            .map(|r| r.consumer.clone())
            .collect()
    }

    pub fn consumer_count(&self) -> u32 {
        self.readers.lock().len() as u32
    }

    pub fn unacked_count(&self) -> u32 {
        self.readers
            .lock()
            .iter()
            .map(|r| {
                u32::from(r.consumer.prefetch).saturating_sub(r.credit.load(Ordering::Relaxed))
            })
            .sum()
    }

    /// Acks (and anything else that ends a delivery) give the consumer its credit back.
    pub fn settle(&self, msgs: impl IntoIterator<Item = Settled>) {
        let mut counts: Vec<(u64, u32)> = Vec::new();
        let mut n = 0;
        for (key, _) in msgs {
            n += 1;
            let Some(key) = key else { continue };
            match counts.iter_mut().find(|(k, _)| *k == key) {
                Some(c) => c.1 += 1,
                None => counts.push((key, 1)),
            }
        }
        self.stats.ack.fetch_add(n, Ordering::Relaxed);
        let rs = self.readers.lock();
        for (key, k) in counts {
            if let Some(r) = rs.iter().find(|r| r.consumer.key == key) {
                let before = r.credit.fetch_add(k, Ordering::AcqRel);
                if before == 0 {
                    r.wake.notify_one();
                }
            }
        }
    }

    /// Lets every consumer try again (room opened under a channel-wide limit).
    pub fn dispatch(&self) {
        for r in self.readers.lock().iter() {
            r.wake.notify_one();
        }
    }

    /// Deletes the stream and its files; returns its consumers (to be told of the cancel).
    pub fn mark_deleted(&self) -> Vec<Arc<Consumer>> {
        let confirms = {
            let mut g = self.inner.lock();
            if g.deleted {
                return Vec::new();
            }
            g.deleted = true;
            g.tail.clear();
            g.log.take_pending()
        };
        self.deleted.store(true, Ordering::Release);
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(stream = %self.name, error = %e, "cannot remove the stream's files");
        }
        crate::confirm::complete_all(confirms.into_iter().map(|h| (h, true)));
        let readers = std::mem::take(&mut *self.readers.lock());
        for r in &readers {
            r.wake.notify_one();
        }
        self.relieved.notify_waiters();
        readers.into_iter().map(|r| r.consumer.clone()).collect()
    }

    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    /// A consumer's task: reads from its cursor and offers to its channel while it has credit.
    async fn serve(self: Arc<Self>, r: Arc<Reader>, mut next: u64) {
        let mut batch: VecDeque<QueuedMessage> = VecDeque::new();
        let mut hint = None;
        let mut failures = 0u32;
        loop {
            if r.consumer.cancelled.load(Ordering::Relaxed) || self.is_deleted() {
                return;
            }
            if batch.is_empty() {
                r.at_end.store(true, Ordering::SeqCst);
                let got = match self.fetch_cached(&mut next, &mut hint, &mut batch) {
                    Fetch::Got => Ok(true),
                    Fetch::End => Ok(false),
                    // On the blocking pool: a read from a cold disk must not stall the other
                    // tasks (connections, publishers) of this worker thread.
                    Fetch::File(plan, committed) => {
                        let s = self.clone();
                        let (n, h) = (next, hint);
                        let read = tokio::task::spawn_blocking(move || {
                            let (mut n, mut h, mut out) = (n, h, VecDeque::new());
                            let r = s.read_file(&plan, committed, &mut n, &mut h, &mut out);
                            (r, n, h, out)
                        });
                        match read.await {
                            Ok((r, n, h, out)) => {
                                (next, hint, batch) = (n, h, out);
                                r
                            }
                            Err(e) => Err(std::io::Error::other(e.to_string())),
                        }
                    }
                };
                match got {
                    Ok(true) => {
                        r.at_end.store(false, Ordering::SeqCst);
                        failures = 0;
                    }
                    Ok(false) => {
                        // Woken by the next group commit (or a cancel).
                        r.wake.notified().await;
                        r.at_end.store(false, Ordering::SeqCst);
                        continue;
                    }
                    Err(e) => {
                        r.at_end.store(false, Ordering::SeqCst);
                        failures += 1;
                        if failures == 1 {
                            tracing::error!(stream = %self.name, offset = next, error = %e, "cannot read the stream; retrying");
                        }
                        if failures >= 3 {
                            // A damaged segment: what cannot be read is skipped, not retried
                            // forever.
                            let after = self.inner.lock().log.segment_after(next);
                            if let Some(to) = after {
                                tracing::error!(stream = %self.name, from = next, to, "skipping the unreadable rest of a stream segment");
                                (next, hint, failures) = (to, None, 0);
                                continue;
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                }
            }
            let mut outbox_full = false;
            // One flush per batch straight to the socket, as a connection's read batch does,
            // rather than a writer wake-up per delivery. Nothing awaits until `end_batch`.
            crate::outbox::begin_batch();
            while let Some(m) = batch.front() {
                if r.credit.load(Ordering::Acquire) == 0 {
                    break;
                }
                match r.consumer.sink.offer_stream(&r.consumer, &self, m) {
                    Offer::Delivered => {
                        r.credit.fetch_sub(1, Ordering::AcqRel);
                        self.stats.deliver.fetch_add(1, Ordering::Relaxed);
                        batch.pop_front();
                    }
                    Offer::NoCredit => break,
                    Offer::OutboxFull => {
                        outbox_full = true;
                        break;
                    }
                }
            }
            crate::outbox::end_batch();
            if outbox_full {
                // The outbox wakes the stream's consumers once it drains (the timeout only
                // bounds a wake-up lost to a consumer that stopped).
                if r.consumer.sink.wait_for_space_stream(&self) {
                    let _ =
                        tokio::time::timeout(Duration::from_millis(100), r.wake.notified()).await;
                }
            } else if !batch.is_empty() {
                // Out of credit: an ack wakes it; the timeout covers a channel-wide limit
                // freed by another queue's ack.
                let _ = tokio::time::timeout(Duration::from_millis(100), r.wake.notified()).await;
            }
        }
    }

    /// Fills `out` from `*next` on from the tail cache, or says which file read comes next.
    fn fetch_cached(
        &self,
        next: &mut u64,
        hint: &mut Option<(u64, u64, u64)>,
        out: &mut VecDeque<QueuedMessage>,
    ) -> Fetch {
        let committed = self.committed.load(Ordering::SeqCst);
        let g = self.inner.lock();
        let first = g.log.first_offset();
        if *next < first {
            *next = first;
            *hint = None;
        }
        if *next >= committed {
            return Fetch::End;
        }
        if *next >= g.tail_first {
            let end = committed
                .min(g.tail_first + g.tail.len() as u64)
                .min(*next + READ_MSGS as u64);
            for o in *next..end {
                out.push_back(entry(o, g.tail[(o - g.tail_first) as usize].clone()));
            }
            *next = end;
            *hint = None;
            return if out.is_empty() {
                Fetch::End
            } else {
                Fetch::Got
            };
        }
        match g.log.plan(*next, *hint) {
            Some(plan) => Fetch::File(plan, committed),
            None => Fetch::End,
        }
    }

    /// Reads the entries `plan` points at (no lock held), up to `committed`. False: wait for
    /// the next commit.
    fn read_file(
        &self,
        plan: &log::ReadPlan,
        committed: u64,
        next: &mut u64,
        hint: &mut Option<(u64, u64, u64)>,
        out: &mut VecDeque<QueuedMessage>,
    ) -> std::io::Result<bool> {
        let (entries, end) = log::read(plan, READ_BYTES)?;
        let mut cut = false;
        for e in entries {
            if e.offset < *next {
                continue;
            }
            if e.offset >= committed {
                cut = true;
                break;
            }
            let Some((msg, _)) = crate::persist::decode_message(&e.data) else {
                tracing::warn!(stream = %self.name, offset = e.offset, "skipping a stored message that does not decode");
                *next = e.offset + 1;
                continue;
            };
            *next = e.offset + 1;
            out.push_back(entry(e.offset, Arc::new(msg)));
        }
        *hint = (!cut).then_some((*next, plan.segment, end));
        // Entries skipped below the cursor still moved it on; past `committed`, wait.
        Ok(!out.is_empty() || (!cut && end > plan.pos))
    }
}

/// What a reader's next step is.
enum Fetch {
    /// Messages were taken from the tail cache.
    Got,
    /// Nothing committed past the cursor yet.
    End,
    /// Read this file position (entries below this commit point only).
    File(log::ReadPlan, u64),
}

/// The first offset at or after `ms` in the entries `plan` starts at, reading forward.
fn first_at_or_after(plan: &log::ReadPlan, ms: u64) -> Option<u64> {
    let mut plan = plan.clone();
    loop {
        let (entries, end) = log::read(&plan, READ_BYTES).ok()?;
        if let Some(e) = entries.iter().find(|e| e.ts_ms >= ms) {
            return Some(e.offset);
        }
        if entries.is_empty() || end >= plan.end {
            return None;
        }
        plan.pos = end;
    }
}

fn entry(offset: u64, msg: Arc<Message>) -> QueuedMessage {
    QueuedMessage {
        seq: offset,
        msg,
        redelivered: false,
        expires_at_ms: None,
        logged: false,
    }
}

/// The stored form of `msg` (`persist::encode_message`'s layout, no deadline) with an
/// `x-stream-offset` long header appended to its properties; returns the bytes, where the
/// properties are, and where the offset's 8 bytes go.
fn encode_with_offset(msg: &Message) -> (BytesMut, std::ops::Range<usize>, usize) {
    let mut p = BasicProperties::decode(&msg.properties).unwrap_or_default();
    let mut h = p.headers.take().unwrap_or_default();
    h.0.retain(|(k, _)| &**k != "x-stream-offset");
    h.0.push(("x-stream-offset".into(), FieldValue::I64(0)));
    p.headers = Some(h);
    let props: Bytes = p.to_bytes();
    // The header was appended last to the table, so its value is the last match.
    const KEY: &[u8] = b"\x0fx-stream-offsetl";
    let at = props
        .windows(KEY.len())
        .rposition(|w| w == KEY)
        .map_or(0, |i| i + KEY.len());
    let mut b = BytesMut::with_capacity(
        7 + msg.exchange.len() + msg.routing_key.len() + props.len() + msg.body.len(),
    );
    b.put_u8(0);
    b.put_u8(msg.exchange.len() as u8);
    b.put_slice(msg.exchange.as_bytes());
    b.put_u8(msg.routing_key.len() as u8);
    b.put_slice(msg.routing_key.as_bytes());
    b.put_u32(props.len() as u32);
    let start = b.len();
    b.put_slice(&props);
    let end = b.len();
    b.put_slice(&msg.body);
    (b, start..end, start + at)
}

impl Logged for Stream {
    fn join_batch(&self) -> bool {
        !self.in_batch.swap(true, Ordering::AcqRel)
    }

    fn write_log(&self) -> warren_store::Written<Arc<ConfirmHandle>> {
        self.in_batch.store(false, Ordering::Release);
        let mut g = self.inner.lock();
        if g.deleted {
            return Ok((Vec::new(), Vec::new()));
        }
        let before = g.log.bytes_written;
        let segments = g.log.segment_count();
        let r = g.log.write_pending();
        self.persister
            .bytes
            .fetch_add(g.log.bytes_written - before, Ordering::Relaxed);
        let rotated = g.log.segment_count() != segments;
        let r = match r {
            Ok((tokens, file, end)) => {
                g.in_flight = end;
                Ok((tokens, file.into_iter().collect()))
            }
            Err((e, tokens)) => {
                // Those offsets are lost: drop them from the cache too, readers skip the gap.
                let keep = g.log.written();
                g.in_flight = keep;
                let first = g.tail_first;
                while g.tail_first + g.tail.len() as u64 > first && !g.tail.is_empty() {
                    let _ = g.tail.pop_back();
                }
                g.tail_first = keep;
                g.tail_bytes = 0;
                Err((e, tokens))
            }
        };
        drop(g);
        if self.pressured() && self.inner.lock().log.pending_bytes() < PENDING_HIGH_BYTES / 2 {
            self.pressure.store(false, Ordering::Relaxed);
            self.relieved.notify_waiters();
        }
        if rotated || self.limits.load().max_bytes.is_some() {
            self.enforce_retention();
        }
        r
    }

    fn synced(&self, ok: bool) {
        let to = self.inner.lock().in_flight;
        // A failed fsync: the data may still be on disk; its publishes were nacked, and the
        // offsets are not delivered until a later group's fsync covers them.
        if !ok || to <= self.committed.load(Ordering::SeqCst) {
            return;
        }
        self.committed.store(to, Ordering::SeqCst);
        for r in self.readers.lock().iter() {
            if r.at_end.load(Ordering::SeqCst) {
                r.wake.notify_one();
            }
        }
    }

    fn log_name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_and_offsets() {
        assert_eq!(parse_age("7D"), Ok(7 * 86_400_000));
        assert_eq!(parse_age("12h"), Ok(12 * 3_600_000));
        assert_eq!(parse_age("1Y"), Ok(365 * 86_400_000));
        assert_eq!(parse_age("1M"), Ok(30 * 86_400_000));
        assert_eq!(parse_age("0s"), Err(BadAge::Invalid));
        assert_eq!(parse_age("10"), Err(BadAge::Invalid));
        assert_eq!(parse_age("5W"), Err(BadAge::Invalid));
        assert_eq!(parse_age("abc"), Err(BadAge::NoDigits));
        assert_eq!(parse_start(None).ok(), Some(StartAt::Next));
        assert_eq!(
            parse_start(Some(&FieldValue::str("first"))).ok(),
            Some(StartAt::First)
        );
        assert_eq!(
            parse_start(Some(&FieldValue::I64(-3))).ok(),
            Some(StartAt::Offset(0))
        );
        assert_eq!(
            parse_start(Some(&FieldValue::Timestamp(5))).ok(),
            Some(StartAt::Time(5000))
        );
        assert!(matches!(
            parse_start(Some(&FieldValue::str("1h"))),
            Ok(StartAt::Time(_))
        ));
        assert_eq!(
            parse_start(Some(&FieldValue::str("bogus"))).map_err(|e| e.code),
            Err(541)
        );
        assert!(parse_start(Some(&FieldValue::Bool(true))).is_err());
    }

    #[test]
    fn offset_header_is_patched_in_place() {
        let m = Message {
            exchange: "".into(),
            routing_key: "s".into(),
            properties: BasicProperties::default().to_bytes(),
            body: Bytes::from_static(b"hi"),
            persistent: false,
            priority: None,
            expiration_ms: None,
        };
        let (mut b, props, patch) = encode_with_offset(&m);
        b[patch..patch + 8].copy_from_slice(&42u64.to_be_bytes());
        let b = b.freeze();
        let (back, _) = crate::persist::decode_message(&b).expect("decodes");
        assert_eq!(&back.body[..], b"hi");
        assert_eq!(back.properties, b.slice(props));
        let p = BasicProperties::decode(&back.properties).expect("props");
        assert_eq!(
            p.headers.and_then(|h| h.get("x-stream-offset").cloned()),
            Some(FieldValue::I64(42))
        );
    }
}
