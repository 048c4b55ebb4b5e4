//! The stream log's shared types and constants: what its records, index and readers are made
//! of (`mod.rs` keeps the log, `records.rs` the record reading and scanning).

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

pub const KIND_CHUNK: u8 = 5;
pub const KIND_ENTRY: u8 = 6;
/// A segment's first record: `seq` its first offset, `data` a zero timestamp and the version.
pub const KIND_HEADER: u8 = 7;
/// The segment format this build writes, and the newest it reads.
pub const SEGMENT_VERSION: u8 = 1;
/// One index entry per this many bytes of segment: a read by offset starts at most this far
/// before the record it wants.
pub const INDEX_EVERY_BYTES: u64 = 1024 * 1024;
/// RabbitMQ's default `x-stream-max-segment-size-bytes`.
pub const DEFAULT_SEGMENT_BYTES: u64 = 500_000_000;
/// Bytes read at once by recovery's scan and by readers.
pub const READ_BYTES: u64 = 1024 * 1024;

/// A stored entry: its offset, its timestamp (Unix ms) and the caller's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub offset: u64,
    pub ts_ms: u64,
    pub data: Bytes,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct IndexEntry {
    pub(super) offset: u64,
    pub(super) pos: u64,
    pub(super) ts_ms: u64,
}

#[derive(Debug)]
pub(super) struct Segment {
    /// Its first offset (and file name).
    pub(super) first: u64,
    /// One past its last offset (== `first` while empty).
    pub(super) next: u64,
    pub(super) len: u64,
    pub(super) first_ts: u64,
    pub(super) last_ts: u64,
    pub(super) index: Vec<IndexEntry>,
    pub(super) path: PathBuf,
    /// Read handle, shared with readers (an unlinked segment stays readable through it).
    pub(super) file: Arc<File>,
}

/// Where a reader finds `offset`: a file, a position in it at or before the record, and how far
/// the segment is written.
#[derive(Debug, Clone)]
pub struct ReadPlan {
    pub file: Arc<File>,
    pub pos: u64,
    pub end: u64,
    /// The segment's first offset, to continue a sequential read (see [`StreamLog::plan`]).
    pub segment: u64,
}

impl Segment {
    /// A segment holding nothing yet, its first offset `first`.
    pub(super) fn empty(first: u64, path: PathBuf, file: File) -> Segment {
        Segment {
            first,
            next: first,
            len: 0,
            first_ts: 0,
            last_ts: 0,
            index: Vec::new(),
            path,
            file: Arc::new(file),
        }
    }
}
