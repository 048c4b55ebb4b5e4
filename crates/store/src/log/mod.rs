//! A durable queue's log: segment files `<id>.seg` holding enqueue and ack records.
//!
//! Appends are buffered in memory and written in groups by [`QueueLog::write_pending`]; the caller
//! then fsyncs the files it returns (group commit). An enqueue acked while still buffered is
//! dropped from the buffer and never written. Segments are reclaimed oldest first once every
//! message in them is acked: an ack record always lives in the same or a later segment than its
//! enqueue, so deleting a fully acked prefix can never resurrect a message.
//!
//! The log is also where a long queue keeps the messages it does not hold in memory: the queue
//! drops its copy and later reads them back in order with [`QueueLog::read`], in large
//! sequential reads that continue into what is still buffered.
//!
//! By job: `recover` opens a log and says what it holds, `write` buffers enqueues and acks and
//! writes them in groups (rotation and reclamation with it), `read` pages messages back in order.
//! This file holds the log's state and types, and what every part shares; the parts refer to
//! it, never it to them, so the modules have no import cycle.

mod read;
mod recover;
mod write;

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

/// A segment is rotated once it has grown past this.
pub const SEGMENT_BYTES: u64 = 16 * 1024 * 1024;
/// A fully acked current segment at least this big is replaced by a fresh one.
pub const DRAINED_ROTATE_BYTES: u64 = 1024 * 1024;

/// What a group write produced: the tokens of the enqueues written, and the files to fsync
/// before acting on them. On error, the tokens of the enqueues that were not written.
pub type Written<T> = Result<(Vec<T>, Vec<Arc<File>>), (std::io::Error, Vec<T>)>;

/// What recovery found on disk.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// The messages still in the queue; read them with [`QueueLog::read`].
    pub live: LiveSet,
    pub count: usize,
    /// The sum of the `measure` given to [`QueueLog::open`] over them.
    pub bytes: u64,
    /// The highest seq of any enqueue on disk: new enqueues must be above it.
    pub max_seq: Option<u64>,
}

/// Which enqueues on disk are still in the queue, as runs `(first, last)` of seqs within which
/// every enqueue on disk is live. A backlog published in one go is one run, whatever its length,
/// so recovering 10M messages does not cost 10M entries of memory.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LiveSet {
    runs: VecDeque<(u64, u64)>,
}

impl LiveSet {
    /// Whether an enqueue on disk with this seq is live (meaningful for seqs that have one).
    pub fn holds(&self, seq: u64) -> bool {
        let i = self.runs.partition_point(|&(_, last)| last < seq);
        self.runs.get(i).is_some_and(|&(first, _)| first <= seq)
    }

    /// Forgets every run that ends below `seq` (they have been read back).
    pub fn forget_below(&mut self, seq: u64) {
        while self.runs.front().is_some_and(|&(_, last)| last < seq) {
            self.runs.pop_front();
        }
    }

    pub fn first(&self) -> Option<u64> {
        self.runs.front().map(|r| r.0)
    }

    pub fn runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.runs.iter().copied()
    }
}

/// A position in the log for reading messages back in order: enqueues below `next_seq` are
/// skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    segment: u64,
    offset: u64,
    pub next_seq: u64,
}

impl Cursor {
    /// A cursor from the log's first segment on that skips enqueues below `next_seq`: valid for
    /// any log, where [`QueueLog::cursor_at_start`] and [`QueueLog::cursor_at_end`] start
    /// closer to what is wanted. A log kept elsewhere (a test's, in memory) uses only
    /// `next_seq`.
    pub fn from_seq(next_seq: u64) -> Cursor {
        Cursor {
            segment: 0,
            offset: 0,
            next_seq,
        }
    }
}

#[derive(Debug)]
struct Segment {
    id: u64,
    path: PathBuf,
    /// Bytes of whole records in the file.
    len: u64,
    /// Range of enqueue seqs written here (seqs only grow, so ranges do not overlap).
    first_seq: u64,
    last_seq: u64,
    /// Enqueues here not yet acked.
    live: u64,
}

struct Pending<T> {
    seq: u64,
    data: Bytes,
    token: Option<T>,
    volatile: bool,
}

/// One queue's log. `T` is a token carried with each buffered enqueue (the broker's publisher
/// confirm), handed back once the enqueue is written, or when an ack cancels it.
pub struct QueueLog<T> {
    dir: PathBuf,
    segments: VecDeque<Segment>,
    file: Arc<File>,
    pending_enqueues: VecDeque<Pending<T>>,
    pending_acks: Vec<u64>,
    pending_ranges: Vec<(u64, u64)>,
    /// Files written since the last `write_pending` returned them (rotated ones included).
    unsynced: Vec<Arc<File>>,
    /// A durable record was written since the last `write_pending` returned files: volatile
    /// records alone need no fsync.
    needs_sync: bool,
    /// A scratch log (a non-durable queue's paged messages) is never fsynced.
    scratch: bool,
    buf: BytesMut,
    /// Bytes written since the log was opened, for the persister's statistics.
    pub bytes_written: u64,
}

/// A segment file's path: `<id, 16 hex digits>.seg` (queue logs, streams, Raft logs).
pub fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:016x}.seg"))
}

/// The ids of the `<hex id>.seg` files in `dir`, ascending (queue logs, streams, Raft logs).
pub fn segment_ids(dir: &Path) -> std::io::Result<Vec<u64>> {
    let mut ids: Vec<u64> = fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".seg"))
                .and_then(|h| u64::from_str_radix(h, 16).ok())
        })
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

fn empty_segment(dir: &Path, id: u64) -> Segment {
    Segment {
        id,
        path: segment_path(dir, id),
        len: 0,
        first_seq: u64::MAX,
        last_seq: 0,
        live: 0,
    }
}

impl<T> QueueLog<T> {
    /// Makes this a scratch log: nothing in it survives a restart, so nothing is fsynced.
    pub fn set_scratch(&mut self) {
        self.scratch = true;
    }

    fn size(&self) -> u64 {
        self.segments.back().map_or(0, |s| s.len)
    }

    /// A cursor over the messages recovered at open, the first of which is `first_seq`.
    pub fn cursor_at_start(&self, first_seq: u64) -> Cursor {
        Cursor {
            segment: self.segments.front().map_or(0, |s| s.id),
            offset: 0,
            next_seq: first_seq,
        }
    }

    /// A cursor for messages from `next_seq` on, none of which is written yet.
    pub fn cursor_at_end(&self, next_seq: u64) -> Cursor {
        Cursor {
            segment: self.segments.back().map_or(0, |s| s.id),
            offset: self.size(),
            next_seq,
        }
    }

    /// Bytes on disk, for accounting and tests.
    pub fn disk_bytes(&self) -> u64 {
        self.segments
            .iter()
            .filter_map(|s| fs::metadata(&s.path).ok())
            .map(|m| m.len())
            .sum()
    }

    /// Removes the whole log (the queue was deleted); returns the tokens still buffered.
    pub fn destroy(mut self) -> Vec<T> {
        let tokens = self
            .pending_enqueues
            .drain(..)
            .filter_map(|p| p.token)
            .collect();
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot remove queue log");
        }
        tokens
    }
}

/// What the tests of every part share: a fresh directory, messages and their sizes.
#[cfg(test)]
mod testutil {
    use super::*;

    pub(super) fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("warren-store-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    pub(super) fn measure(d: &[u8]) -> u64 {
        d.len() as u64
    }

    pub(super) fn runs(rec: &Recovery) -> Vec<(u64, u64)> {
        rec.live.runs().collect()
    }

    pub(super) fn data(i: u64) -> Bytes {
        Bytes::from(format!("message-{i}"))
    }

    pub(super) fn write(log: &mut QueueLog<()>) {
        log.write_pending()
            .unwrap_or_else(|(e, _)| panic!("write: {e}"));
    }

    pub(super) fn read_all(
        log: &QueueLog<()>,
        c: &mut Cursor,
        keep: impl Fn(u64) -> bool,
    ) -> Vec<u64> {
        let mut seqs = Vec::new();
        loop {
            let got = log.read(c, 3 * 1024 * 1024, &keep).expect("read");
            if got.is_empty() {
                return seqs;
            }
            for (seq, d) in got {
                assert_eq!(&d[..8], &seq.to_be_bytes(), "data belongs to its seq");
                seqs.push(seq);
            }
        }
    }

    pub(super) fn tagged(seq: u64, size: usize) -> Bytes {
        let mut v = vec![7u8; size.max(8)];
        v[..8].copy_from_slice(&seq.to_be_bytes());
        Bytes::from(v)
    }
}
