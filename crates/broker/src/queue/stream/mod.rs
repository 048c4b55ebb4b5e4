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
//!
//! This file holds the [`Stream`], its arguments ([`StreamLimits`], [`StartAt`]) and its
//! lifecycle (open, policy, delete). Each other job is an `impl Stream` block (and its helpers)
//! in a file of its own:
//! - `write`: publishing (numbering and buffering), retention, and the persister's group writes
//!   (`Logged`) that commit offsets and wake readers.
//! - `consumers`: adding and removing consumers, their credit (acks), counts.
//! - `read`: a consumer's task, reading from the tail cache or the segment files.
//! - `tracking`: stored consumer offsets and publisher sequences (the stream protocol's).
//! - `replica`: a replicated stream's member: its group's entries applied as chunks, the
//!   checkpoint of what it applied durably, catching up from another member.
//!
//! The shared types stay here, not in a child: every child imports `super`, and this file imports
//! no child, so the split adds no import cycle. No benchmark counts a stream method by its symbol
//! name, so the hot paths (`publish`, `serve`) may live in children.

mod consumers;
mod read;
mod replica;
mod tracking;
mod write;

pub use replica::{StreamGroup, Track};

use crate::clock::unix_ms;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use warren_protocol::{FieldTable, FieldValue};
use warren_store::stream::{self as log, StreamLog};

use crate::confirm::ConfirmHandle;
use crate::error::{AmqpError, AmqpResult};
use crate::message::Message;
use crate::metrics::QueueStats;
use crate::persist::Persister;

use super::{Consumer, QueueArgs, QueueOptions};

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
    pub fn with_policy(
        self,
        d: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> StreamLimits {
        let Some(d) = d else { return self };
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

impl Inner {
    /// The tail cache emptied, to start at `next`.
    fn empty_tail(&mut self, next: u64) {
        self.tail.clear();
        self.tail_first = next;
        self.tail_bytes = 0;
    }
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
    /// Stored consumer offsets and publisher sequences (`tracking`); `None` if its file could
    /// not be opened (logged; the stream works without them).
    tracking: Mutex<Option<warren_store::tracking::Tracking>>,
    /// A replicated stream's group (`replica`): set once, before any publish.
    group: std::sync::OnceLock<Arc<dyn StreamGroup>>,
    applied: Mutex<replica::Applied>,
    /// Told when committed offsets advance (a member waiting to serve another's fetch).
    grown: tokio::sync::Notify,
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
        let tracking = match warren_store::tracking::Tracking::open(&dir) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::error!(vhost = %vhost, stream = %name, error = %e, "cannot open the stream's tracking: stored offsets are not kept");
                None
            }
        };
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
            tracking: Mutex::new(tracking),
            group: std::sync::OnceLock::new(),
            applied: Mutex::new(Default::default()),
            grown: tokio::sync::Notify::new(),
        }))
    }

    /// Where its files are.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
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

    /// Applies the definition of the vhost's policy for this stream (retention and segment size).
    pub fn set_policy(&self, p: Option<&serde_json::Map<String, serde_json::Value>>) {
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

    /// The first offset of the last chunk whose offsets are all committed (the stream
    /// protocol's `committed_chunk_id`); the last committed offset while the newest chunk's
    /// write is still being made durable.
    pub fn committed_chunk_id(&self) -> u64 {
        let committed = self.committed();
        let last = self.inner.lock().log.last_chunk();
        if last < committed {
            last
        } else {
            committed.saturating_sub(1)
        }
    }

    pub fn disk_bytes(&self) -> u64 {
        self.inner.lock().log.disk_bytes()
    }

    pub fn pressured(&self) -> bool {
        self.pressure.load(Ordering::Relaxed) || self.group.get().is_some_and(|g| g.pressured())
    }

    pub async fn stall(&self, max: Duration) {
        crate::flow::wait_relief(&self.relieved, || self.pressured(), max).await
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
        match self.group.get() {
            // Its group stops, then removes the files.
            Some(g) => g.delete(),
            None => {
                if let Err(e) = std::fs::remove_dir_all(&self.dir) {
                    tracing::warn!(stream = %self.name, error = %e, "cannot remove the stream's files");
                }
            }
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
}
