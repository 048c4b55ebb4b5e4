//! The Raft log, vote and committed index, persisted under the group's directory.
//!
//! - `log/<first index, 16 hex digits>.seg`: the entries, one checksummed record each
//!   (bincode, `types::wire`; the record's seq is the entry's index), in segments rotated past
//!   `SEGMENT_BYTES`. Appends are written and fsynced before openraft is told. A damaged tail
//!   (torn write) is cut off at open; a whole record (its checksum holds) that does not decode
//!   is never cut: the open fails on the last one, a read on any other. Purging deletes whole segments; truncating cuts the segment it falls in and
//!   deletes the later ones.
//! - `purged.json`, `vote.json`, `committed.json`: small files replaced atomically.
//!
//! Memory holds each entry's offset in its segment (4 bytes) and the newest entries up to
//! `CACHE_BYTES`, which serve replication and apply; older entries are read back from their
//! segment. A replicated queue's message bodies live in its log (the broker's
//! `cluster/quorum.rs` reads them back through [`LogReader`]), so a long queue is not held in
//! memory. Writes happen on openraft's log task, one at a time; a file write and its fsync run
//! without the lock, so readers are not held up by the disk.
//!
//! Earlier versions kept one file, `raft.log`, wholly in memory: it is converted at open.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::{Bound, RangeBounds};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, LogState, RaftLogReader, StorageError, StorageIOError,
    Vote,
};
use warren_store::{record, segment_ids, segment_path, snapshot};

use crate::types::{wire, TypeConfig};
use crate::{lock, NodeId};

// Kinds 1 and 2 are the serde_json records of earlier versions, still read; 3 and 4 are written.
const KIND_ENTRY_JSON: u8 = 1;
const KIND_PURGED_JSON: u8 = 2;
const KIND_ENTRY: u8 = 3;
const KIND_PURGED: u8 = 4;

/// A segment is rotated once it has grown past this.
const SEGMENT_BYTES: u64 = 64 << 20;
/// The newest entries kept in memory (at least the last one).
const CACHE_BYTES: usize = 4 << 20;
/// What one read for replication returns at most (at least one entry): a follower that lags
/// far behind catches up in bounded steps.
const REPLICATION_READ_BYTES: usize = 8 << 20;

type StorageResult<T> = Result<T, StorageError<NodeId>>;

#[derive(Clone)]
pub(crate) struct LogStore {
    inner: Arc<Mutex<LogInner>>,
}

/// One segment file: entries `first ..` at `offsets`.
struct Segment {
    first: u64,
    path: PathBuf,
    file: Arc<File>,
    offsets: Vec<u32>,
    /// Bytes of whole records in the file.
    len: u64,
}

impl Segment {
    /// The index after its last entry.
    fn end(&self) -> u64 {
        self.first + self.offsets.len() as u64
    }

    /// Where entry `index`'s record starts and where the next one does.
    fn span(&self, index: u64) -> (u64, u64) {
        let i = (index - self.first) as usize;
        let start = u64::from(self.offsets[i]);
        let end = self.offsets.get(i + 1).map_or(self.len, |o| u64::from(*o));
        (start, end)
    }
}

struct LogInner {
    dir: PathBuf,
    vote_path: PathBuf,
    committed_path: PathBuf,
    purged_path: PathBuf,
    segment_bytes: u64,
    segments: VecDeque<Segment>,
    /// The newest entries, consecutive up to the last one, with their encoded sizes.
    cache: VecDeque<(Entry<TypeConfig>, usize)>,
    cache_bytes: usize,
    last: Option<LogId<NodeId>>,
    purged: Option<LogId<NodeId>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
}

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn decode_entry(kind: u8, data: &[u8]) -> Result<Entry<TypeConfig>, String> {
    if kind == KIND_ENTRY {
        wire::decode(data)
    } else {
        serde_json::from_slice(data).map_err(|e| e.to_string())
    }
}

impl LogStore {
    pub(crate) fn open(dir: &Path) -> io::Result<LogStore> {
        Self::open_with(dir, SEGMENT_BYTES)
    }

    fn open_with(dir: &Path, segment_bytes: u64) -> io::Result<LogStore> {
        let log_dir = dir.join("log");
        std::fs::create_dir_all(&log_dir)?;
        let vote_path = dir.join("vote.json");
        let committed_path = dir.join("committed.json");
        let purged_path = dir.join("purged.json");
        convert_single_file(dir, &log_dir, &purged_path)?;
        let vote: Option<Vote<NodeId>> = match snapshot::read(&vote_path)? {
            Some(b) => Some(serde_json::from_slice(&b).map_err(other)?),
            None => None,
        };
        let committed: Option<LogId<NodeId>> = match snapshot::read(&committed_path)? {
            Some(b) => serde_json::from_slice(&b).map_err(other)?,
            None => None,
        };
        let purged: Option<LogId<NodeId>> = match snapshot::read(&purged_path)? {
            Some(b) => serde_json::from_slice(&b).map_err(other)?,
            None => None,
        };
        let (segments, last_entry) = recover(&log_dir, purged)?;
        let last = last_entry.or(purged);
        let committed_before = committed;
        // A log cut shorter than what was known committed (a damaged tail that had been
        // fsynced: the disk lost acknowledged data) must not claim entries it no longer has:
        // this node holds what is left, and the leader sends it the rest.
        let committed = match committed {
            Some(c) if last.is_none_or(|l: LogId<NodeId>| l.index < c.index) => {
                tracing::warn!(
                    path = %log_dir.display(),
                    committed = c.index,
                    last = ?last.map(|l| l.index),
                    "the raft log ends before its committed index; catching up from the leader"
                );
                let bytes = serde_json::to_vec(&last).map_err(other)?;
                snapshot::write_atomic(&committed_path, &bytes)?;
                last
            }
            c => c,
        };
        // With entries it had acknowledged gone, this node must not come back as the leader it
        // may have been (openraft resumes leading on a committed vote for itself): a leader
        // with a shorter log would write other entries under the same term and index as the
        // followers' lost ones. An uncommitted vote keeps the term; the node starts as a
        // follower and catches up from whoever leads.
        let cut = match (committed_before, committed) {
            (Some(b), Some(a)) => a.index < b.index,
            (Some(_), None) => true,
            _ => false,
        };
        let vote: Option<Vote<NodeId>> = match vote {
            Some(mut v) if cut && v.committed => {
                v.committed = false;
                let bytes = serde_json::to_vec(&v).map_err(other)?;
                snapshot::write_atomic(&vote_path, &bytes)?;
                Some(v)
            }
            v => v,
        };
        Ok(LogStore {
            inner: Arc::new(Mutex::new(LogInner {
                dir: log_dir,
                vote_path,
                committed_path,
                purged_path,
                segment_bytes,
                segments,
                cache: VecDeque::new(),
                cache_bytes: 0,
                last,
                purged,
                vote,
                committed,
            })),
        })
    }

    /// A reader of the entries for the state machine's own use (see [`LogReader`]).
    pub(crate) fn reader(&self) -> LogReader {
        LogReader {
            store: self.clone(),
        }
    }
}

/// Reads a group's entries back in order, for its state machine (a replicated queue reads its
/// message bodies here rather than keeping them in memory). Only entries that are applied
/// and not purged should be asked for.
#[derive(Clone)]
pub struct LogReader {
    store: LogStore,
}

impl LogReader {
    /// Entries from `from` on, about `max_bytes` of them (at least one if there is any): each
    /// index with its command (`None` for Raft's own entries).
    pub fn read(&self, from: u64, max_bytes: usize) -> io::Result<Vec<(u64, Option<Vec<u8>>)>> {
        let entries = self.store.read_range(from, u64::MAX, max_bytes)?;
        Ok(entries
            .into_iter()
            .map(|e| {
                let cmd = match e.payload {
                    EntryPayload::Normal(b) => Some(b.0),
                    _ => None,
                };
                (e.log_id.index, cmd)
            })
            .collect())
    }
}

/// Converts the single-file log of earlier versions into segments.
fn convert_single_file(dir: &Path, log_dir: &Path, purged_path: &Path) -> io::Result<()> {
    let old = dir.join("raft.log");
    let Some(data) = snapshot::read(&old)? else {
        return Ok(());
    };
    let (entries, purged) = read_single_file(&old, data)?;
    if let Some(first) = entries.first() {
        let mut buf = BytesMut::new();
        for e in &entries {
            record::encode(&mut buf, KIND_ENTRY, e.log_id.index, &wire::encode(e));
        }
        snapshot::write_atomic(&segment_path(log_dir, first.log_id.index), &buf)?;
    }
    let bytes = serde_json::to_vec(&purged).map_err(other)?;
    snapshot::write_atomic(purged_path, &bytes)?;
    std::fs::remove_file(&old)?;
    sync_dir(dir)
}

type SingleFile = (Vec<Entry<TypeConfig>>, Option<LogId<NodeId>>);

/// The entries of an earlier version's single file: the longest valid prefix.
fn read_single_file(path: &Path, data: Vec<u8>) -> io::Result<SingleFile> {
    let data = Bytes::from(data);
    let mut entries: Vec<Entry<TypeConfig>> = Vec::new();
    let mut purged = None;
    let mut at = 0;
    while at < data.len() {
        let record::Scan::Record(r, next) = record::scan(&data, at) else {
            break;
        };
        let undecodable = |e: String| {
            other(format!(
                "raft log {}: a whole record at byte {at} does not decode ({e}); refusing to cut it",
                path.display()
            ))
        };
        match r.kind {
            KIND_PURGED_JSON | KIND_PURGED if at == 0 => {
                let id = if r.kind == KIND_PURGED {
                    wire::decode(&r.data)
                } else {
                    serde_json::from_slice(&r.data).map_err(|e| e.to_string())
                };
                purged = Some(id.map_err(undecodable)?);
            }
            KIND_ENTRY_JSON | KIND_ENTRY => {
                let entry = decode_entry(r.kind, &r.data).map_err(undecodable)?;
                if entries
                    .last()
                    .is_some_and(|l| l.log_id.index + 1 != entry.log_id.index)
                {
                    break;
                }
                entries.push(entry);
            }
            _ => break,
        }
        at = next;
    }
    Ok((entries, purged))
}

/// Opens the segments, keeping the longest valid run of entries and cutting the rest off (a
/// torn tail; any damage before it cuts there too, and the later segments go). Returns them and
/// the last entry's id.
fn recover(
    dir: &Path,
    purged: Option<LogId<NodeId>>,
) -> io::Result<(VecDeque<Segment>, Option<LogId<NodeId>>)> {
    let firsts = segment_ids(dir)?;
    let mut segments: VecDeque<Segment> = VecDeque::new();
    let mut last: Option<LogId<NodeId>> = None;
    let mut cut = false;
    for first in firsts {
        let path = segment_path(dir, first);
        if cut {
            tracing::warn!(path = %path.display(), "removing a raft log segment after damage");
            std::fs::remove_file(&path)?;
            continue;
        }
        // Segments must follow on from each other (and from what was purged).
        let expected = segments
            .back()
            .map(Segment::end)
            .or(purged.map(|p| p.index + 1));
        let starts_well = match expected {
            Some(e) => segments.is_empty() && first <= e || first == e,
            None => true,
        };
        if !starts_well {
            cut = true;
            tracing::warn!(path = %path.display(), "removing a raft log segment that does not follow on");
            std::fs::remove_file(&path)?;
            continue;
        }
        let data = Bytes::from(std::fs::read(&path)?);
        let mut offsets = Vec::new();
        let mut at = 0;
        // Checksums are checked here; only the last entry is decoded (for its log id): a long
        // log is read once at open, not decoded twice.
        let mut last_record: Option<(usize, u8, Bytes)> = None;
        while at < data.len() {
            let record::Scan::Record(r, next) = record::scan(&data, at) else {
                break;
            };
            if r.kind != KIND_ENTRY && r.kind != KIND_ENTRY_JSON {
                break;
            }
            if r.seq != first + offsets.len() as u64 {
                break;
            }
            offsets.push(at as u32);
            last_record = Some((at, r.kind, r.data));
            at = next;
        }
        if let Some((rec_at, kind, data)) = last_record {
            let entry = decode_entry(kind, &data).map_err(|e| {
                other(format!(
                    "raft log {}: a whole record at byte {rec_at} does not decode ({e}); refusing to cut it",
                    path.display()
                ))
            })?;
            last = Some(entry.log_id);
        }
        if at < data.len() {
            tracing::warn!(
                path = %path.display(),
                kept = at,
                dropped = data.len() - at,
                "raft log has a damaged tail; cutting it off"
            );
            let f = OpenOptions::new().write(true).open(&path)?;
            f.set_len(at as u64)?;
            f.sync_all()?;
            cut = true;
        }
        if offsets.is_empty() {
            std::fs::remove_file(&path)?;
            continue;
        }
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        segments.push_back(Segment {
            first,
            path,
            file: Arc::new(file),
            offsets,
            len: at as u64,
        });
    }
    // Entries at or below the purge point are not the log's any more.
    if last.is_some_and(|l| purged.is_some_and(|p| l.index <= p.index)) {
        last = None;
    }
    Ok((segments, last))
}

/// What a read takes from one segment: `count` entries from `first`, in `len` bytes at `at`.
struct Chunk {
    file: Arc<File>,
    first: u64,
    count: usize,
    at: u64,
    len: usize,
}

impl LogInner {
    /// The first index the log holds.
    fn first_index(&self) -> u64 {
        self.purged.map_or(0, |p| p.index + 1)
    }

    fn push_cache(&mut self, entry: Entry<TypeConfig>, size: usize) {
        self.cache_bytes += size;
        self.cache.push_back((entry, size));
        while self.cache_bytes > CACHE_BYTES && self.cache.len() > 1 {
            if let Some((_, s)) = self.cache.pop_front() {
                self.cache_bytes -= s;
            }
        }
    }

    /// Reads one entry from its segment, under the lock (for the rare truncate).
    fn read_one(&self, index: u64) -> io::Result<Option<Entry<TypeConfig>>> {
        if let Some((e, _)) = self.cache.iter().find(|(e, _)| e.log_id.index == index) {
            return Ok(Some(e.clone()));
        }
        let Some(seg) = self
            .segments
            .iter()
            .find(|s| s.first <= index && index < s.end())
        else {
            return Ok(None);
        };
        let (start, end) = seg.span(index);
        let chunk = Chunk {
            file: seg.file.clone(),
            first: index,
            count: 1,
            at: start,
            len: (end - start) as usize,
        };
        Ok(read_chunk(&chunk)?.pop())
    }
}

/// Reads and decodes a chunk's entries.
fn read_chunk(c: &Chunk) -> io::Result<Vec<Entry<TypeConfig>>> {
    let mut buf = vec![0u8; c.len];
    c.file.read_exact_at(&mut buf, c.at)?;
    let data = Bytes::from(buf);
    let mut out = Vec::with_capacity(c.count);
    let mut at = 0;
    while out.len() < c.count {
        let record::Scan::Record(r, next) = record::scan(&data, at) else {
            return Err(other(format!(
                "raft log: entry {} cannot be read back",
                c.first + out.len() as u64
            )));
        };
        let e = decode_entry(r.kind, &r.data).map_err(other)?;
        if e.log_id.index != c.first + out.len() as u64 {
            return Err(other(format!(
                "raft log: entry {} is not where it should be",
                c.first + out.len() as u64
            )));
        }
        out.push(e);
        at = next;
    }
    Ok(out)
}

fn bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(s) => *s,
        Bound::Excluded(s) => s + 1,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(e) => e.saturating_add(1),
        Bound::Excluded(e) => *e,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl LogStore {
    /// Entries in `[start, end)` that the log holds, about `max_bytes` of them at most (at least
    /// one). Plans under the lock, reads the files without it.
    fn read_range(
        &self,
        start: u64,
        end: u64,
        max_bytes: usize,
    ) -> io::Result<Vec<Entry<TypeConfig>>> {
        let mut chunks = Vec::new();
        let mut cached = Vec::new();
        {
            let inner = lock(&self.inner);
            let end = end.min(inner.last.map_or(0, |l| l.index + 1));
            let mut at = start.max(inner.first_index());
            let cache_first = inner
                .cache
                .front()
                .map_or(end, |(e, _)| e.log_id.index)
                .min(end);
            let mut budget = max_bytes;
            let mut any = false;
            // From the files up to the cache.
            for seg in &inner.segments {
                if at >= cache_first || (any && budget == 0) {
                    break;
                }
                if seg.end() <= at {
                    continue;
                }
                if seg.first > at {
                    break;
                }
                let (from, _) = seg.span(at);
                let mut count = 0usize;
                let mut to = from;
                while at + (count as u64) < cache_first.min(seg.end()) {
                    let (_, e) = seg.span(at + count as u64);
                    let size = (e - to) as usize;
                    if any && size > budget {
                        budget = 0;
                        break;
                    }
                    budget = budget.saturating_sub(size);
                    to = e;
                    count += 1;
                    any = true;
                }
                if count > 0 {
                    chunks.push(Chunk {
                        file: seg.file.clone(),
                        first: at,
                        count,
                        at: from,
                        len: (to - from) as usize,
                    });
                    at += count as u64;
                }
            }
            // Then from memory, if the files got that far.
            if at >= cache_first && !(any && budget == 0) {
                for (e, size) in &inner.cache {
                    let i = e.log_id.index;
                    if i < at {
                        continue;
                    }
                    if i >= end || (any && *size > budget) {
                        break;
                    }
                    budget = budget.saturating_sub(*size);
                    any = true;
                    cached.push(e.clone());
                }
            }
        }
        let mut out = Vec::new();
        for c in &chunks {
            out.extend(read_chunk(c)?);
        }
        out.extend(cached);
        Ok(out)
    }

    fn append_entries(&self, entries: Vec<Entry<TypeConfig>>) -> io::Result<()> {
        let Some(first) = entries.first().map(|e| e.log_id.index) else {
            return Ok(());
        };
        // openraft truncates conflicts before appending; this keeps the log consecutive anyway.
        let last = lock(&self.inner).last;
        if last.is_some_and(|l| l.index >= first) {
            self.truncate_from(first)?;
        }
        let mut buf = BytesMut::new();
        let mut at = Vec::with_capacity(entries.len() + 1);
        for e in &entries {
            at.push(buf.len());
            record::encode(&mut buf, KIND_ENTRY, e.log_id.index, &wire::encode(e));
        }
        at.push(buf.len());
        let mut i = 0;
        while i < entries.len() {
            let index = entries[i].log_id.index;
            let active = {
                let inner = lock(&self.inner);
                inner
                    .segments
                    .back()
                    .filter(|s| {
                        s.end() == index && (s.len < inner.segment_bytes || s.offsets.is_empty())
                    })
                    .map(|s| (s.file.clone(), s.len, inner.segment_bytes))
            };
            let Some((file, len, segment_bytes)) = active else {
                self.new_segment(index)?;
                continue;
            };
            // Whole entries up to the segment's size, at least one.
            let mut j = i + 1;
            while j < entries.len() && len + (at[j + 1] - at[i]) as u64 <= segment_bytes {
                j += 1;
            }
            let written = file
                .write_all_at(&buf[at[i]..at[j]], len)
                .and_then(|_| file.sync_data());
            if let Err(e) = written {
                // Cut a partial write so that later appends do not follow garbage.
                let _ = file.set_len(len);
                return Err(e);
            }
            let mut inner = lock(&self.inner);
            let Some(seg) = inner.segments.back_mut() else {
                return Err(other("raft log: segment gone while appending"));
            };
            for k in i..j {
                seg.offsets.push((len + (at[k] - at[i]) as u64) as u32);
            }
            seg.len = len + (at[j] - at[i]) as u64;
            i = j;
        }
        let mut inner = lock(&self.inner);
        for (k, e) in entries.into_iter().enumerate() {
            inner.last = Some(e.log_id);
            inner.push_cache(e, at[k + 1] - at[k]);
        }
        Ok(())
    }

    /// Starts a segment whose first entry will be `first`.
    fn new_segment(&self, first: u64) -> io::Result<()> {
        let dir = lock(&self.inner).dir.clone();
        let path = segment_path(&dir, first);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        // Its directory entry must be durable before anything in it is acknowledged.
        sync_dir(&dir)?;
        lock(&self.inner).segments.push_back(Segment {
            first,
            path,
            file: Arc::new(file),
            offsets: Vec::new(),
            len: 0,
        });
        Ok(())
    }

    /// Removes the entries from `index` on.
    fn truncate_from(&self, index: u64) -> io::Result<()> {
        let mut inner = lock(&self.inner);
        while let Some((e, size)) = inner.cache.back() {
            if e.log_id.index < index {
                break;
            }
            inner.cache_bytes -= *size;
            inner.cache.pop_back();
        }
        while let Some(seg) = inner.segments.back_mut() {
            if seg.first >= index {
                std::fs::remove_file(&seg.path)?;
                inner.segments.pop_back();
                continue;
            }
            if seg.end() > index {
                let (start, _) = seg.span(index);
                seg.file.set_len(start)?;
                seg.file.sync_all()?;
                seg.offsets.truncate((index - seg.first) as usize);
                seg.len = start;
            }
            break;
        }
        inner.last = match index.checked_sub(1) {
            Some(prev) if prev >= inner.first_index() => inner.read_one(prev)?.map(|e| e.log_id),
            _ => inner.purged,
        };
        Ok(())
    }

    fn purge_upto(&self, log_id: LogId<NodeId>) -> io::Result<()> {
        let mut inner = lock(&self.inner);
        let bytes = serde_json::to_vec(&Some(log_id)).map_err(other)?;
        // The marker first: a crash between the two leaves segments the log no longer counts.
        snapshot::write_atomic(&inner.purged_path, &bytes)?;
        inner.purged = Some(log_id);
        while inner
            .segments
            .front()
            .is_some_and(|s| s.end() <= log_id.index + 1 && s.end() > s.first)
        {
            if let Some(seg) = inner.segments.pop_front() {
                std::fs::remove_file(&seg.path)?;
            }
        }
        while let Some((e, size)) = inner.cache.front() {
            if e.log_id.index > log_id.index {
                break;
            }
            inner.cache_bytes -= *size;
            inner.cache.pop_front();
        }
        if inner.last.is_none_or(|l| l.index < log_id.index) {
            inner.last = Some(log_id);
        }
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let (start, end) = bounds(&range);
        self.read_range(start, end, usize::MAX)
            .map_err(|e| StorageIOError::read_logs(&e).into())
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        self.read_range(start, end, REPLICATION_READ_BYTES)
            .map_err(|e| StorageIOError::read_logs(&e).into())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let inner = lock(&self.inner);
        Ok(LogState {
            last_purged_log_id: inner.purged,
            last_log_id: inner.last.or(inner.purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        let mut inner = lock(&self.inner);
        let bytes = serde_json::to_vec(vote).map_err(|e| StorageIOError::write_vote(&e))?;
        snapshot::write_atomic(&inner.vote_path, &bytes)
            .map_err(|e| StorageIOError::write_vote(&e))?;
        inner.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        Ok(lock(&self.inner).vote)
    }

    // Persisted so that a restarted node re-applies its committed entries on its own, without
    // waiting for a leader to tell it what is committed.
    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        let mut inner = lock(&self.inner);
        if inner.committed == committed {
            return Ok(());
        }
        let bytes = serde_json::to_vec(&committed).map_err(|e| StorageIOError::write(&e))?;
        snapshot::write_atomic(&inner.committed_path, &bytes)
            .map_err(|e| StorageIOError::write(&e))?;
        inner.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        Ok(lock(&self.inner).committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<_> = entries.into_iter().collect();
        match self.append_entries(entries) {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(io::Error::new(e.kind(), e.to_string())));
                Err(StorageIOError::write_logs(AnyError::new(&e)).into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        self.truncate_from(log_id.index)
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        self.purge_upto(log_id)
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    use openraft::storage::RaftLogStorageExt;
    use openraft::{CommittedLeaderId, EntryPayload};

    use crate::types::Blob;

    fn entry(index: u64, text: &str) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Blob(text.as_bytes().to_vec())),
        }
    }

    fn dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("warren-cluster-log-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }

    fn seg0(d: &Path) -> PathBuf {
        d.join("log").join(format!("{:016x}.seg", 0))
    }

    async fn indexes(store: &mut LogStore) -> Vec<u64> {
        store
            .try_get_log_entries(..)
            .await
            .expect("read")
            .iter()
            .map(|e| e.log_id.index)
            .collect()
    }

    #[tokio::test]
    async fn torn_tail_is_cut_off() {
        let d = dir("torn");
        {
            let mut s = LogStore::open(&d).expect("open");
            s.blocking_append((0..5).map(|i| entry(i, "x")))
                .await
                .expect("append");
        }
        // A torn write: half of a record's bytes at the end of the file.
        let mut partial = BytesMut::new();
        record::encode(&mut partial, KIND_ENTRY, 5, b"not finished");
        let mut f = OpenOptions::new()
            .append(true)
            .open(seg0(&d))
            .expect("open log");
        f.write_all(&partial[..partial.len() / 2]).expect("write");
        drop(f);

        let mut s = LogStore::open(&d).expect("reopen");
        assert_eq!(indexes(&mut s).await, vec![0, 1, 2, 3, 4]);
        // Appends after recovery land right after the valid prefix.
        s.blocking_append([entry(5, "y")]).await.expect("append");
        drop(s);
        let mut s = LogStore::open(&d).expect("reopen");
        assert_eq!(indexes(&mut s).await, vec![0, 1, 2, 3, 4, 5]);

        // Garbage (not a record at all) at the tail is cut off too.
        let mut f = OpenOptions::new()
            .append(true)
            .open(seg0(&d))
            .expect("open log");
        f.write_all(&[0u8; 37]).expect("write");
        drop(f);
        let mut s = LogStore::open(&d).expect("reopen");
        assert_eq!(indexes(&mut s).await, vec![0, 1, 2, 3, 4, 5]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[tokio::test]
    async fn a_log_cut_below_its_committed_index_lowers_the_committed_index() {
        let d = dir("committed");
        {
            let mut s = LogStore::open(&d).expect("open");
            s.blocking_append((0..5).map(|i| entry(i, "x")))
                .await
                .expect("append");
            s.save_committed(Some(LogId::new(CommittedLeaderId::new(1, 1), 4)))
                .await
                .expect("commit");
            let mut v = Vote::new(1, 1);
            v.commit();
            s.save_vote(&v).await.expect("vote");
        }
        // The disk lost fsynced bytes: the last record is cut in half.
        let path = seg0(&d);
        let len = std::fs::metadata(&path).expect("stat").len();
        let f = OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open log");
        f.set_len(len - 3).expect("cut");
        drop(f);
        let mut s = LogStore::open(&d).expect("reopen");
        assert_eq!(indexes(&mut s).await, vec![0, 1, 2, 3]);
        let c = s.read_committed().await.expect("committed");
        assert_eq!(
            c.map(|c| c.index),
            Some(3),
            "never past the last entry it has"
        );
        let v = s.read_vote().await.expect("vote").expect("a vote");
        assert!(
            !v.committed,
            "no longer a leader's vote: it must not lead at once"
        );
        drop(s);
        let mut s = LogStore::open(&d).expect("reopen again");
        let c = s.read_committed().await.expect("committed");
        assert_eq!(c.map(|c| c.index), Some(3), "and that is what is on disk");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[tokio::test]
    async fn a_whole_record_that_does_not_decode_is_refused_not_cut() {
        let d = dir("undecodable");
        {
            let mut s = LogStore::open(&d).expect("open");
            s.blocking_append((0..3).map(|i| entry(i, "x")))
                .await
                .expect("append");
        }
        let mut rec = BytesMut::new();
        record::encode(&mut rec, KIND_ENTRY, 3, b"\xff\xff not an entry");
        let mut f = OpenOptions::new()
            .append(true)
            .open(seg0(&d))
            .expect("open log");
        f.write_all(&rec).expect("write");
        drop(f);
        let len = std::fs::metadata(seg0(&d)).expect("stat").len();
        let e = LogStore::open(&d).err().expect("refused");
        assert!(e.to_string().contains("does not decode"), "{e}");
        assert_eq!(
            std::fs::metadata(seg0(&d)).expect("stat").len(),
            len,
            "nothing was cut"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[tokio::test]
    async fn entries_of_the_json_format_are_still_read() {
        let d = dir("json");
        let mut buf = BytesMut::new();
        for i in 0..3 {
            let json = serde_json::to_vec(&entry(i, "old")).expect("json");
            record::encode(&mut buf, KIND_ENTRY_JSON, i, &json);
        }
        std::fs::write(d.join("raft.log"), &buf).expect("write");
        let mut s = LogStore::open(&d).expect("open");
        assert_eq!(indexes(&mut s).await, vec![0, 1, 2]);
        s.blocking_append([entry(3, "new")]).await.expect("append");
        drop(s);
        let mut s = LogStore::open(&d).expect("reopen");
        assert_eq!(indexes(&mut s).await, vec![0, 1, 2, 3]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[tokio::test]
    async fn truncate_purge_and_state_survive_reopen() {
        let d = dir("purge");
        {
            let mut s = LogStore::open(&d).expect("open");
            s.blocking_append((0..10).map(|i| entry(i, "x")))
                .await
                .expect("append");
            s.truncate(LogId::new(CommittedLeaderId::new(1, 1), 8))
                .await
                .expect("truncate");
            s.purge(LogId::new(CommittedLeaderId::new(1, 1), 3))
                .await
                .expect("purge");
            s.blocking_append([entry(8, "z")]).await.expect("append");
            s.save_vote(&Vote::new(3, 2)).await.expect("vote");
            s.save_committed(Some(LogId::new(CommittedLeaderId::new(1, 1), 7)))
                .await
                .expect("committed");
        }
        let mut s = LogStore::open(&d).expect("reopen");
        assert_eq!(indexes(&mut s).await, vec![4, 5, 6, 7, 8]);
        let st = s.get_log_state().await.expect("state");
        assert_eq!(st.last_purged_log_id.map(|l| l.index), Some(3));
        assert_eq!(st.last_log_id.map(|l| l.index), Some(8));
        assert_eq!(s.read_vote().await.expect("vote"), Some(Vote::new(3, 2)));
        assert_eq!(
            s.read_committed()
                .await
                .expect("committed")
                .map(|l| l.index),
            Some(7)
        );

        // Purging everything leaves only the marker: the last log id is the purged one.
        s.purge(LogId::new(CommittedLeaderId::new(1, 1), 8))
            .await
            .expect("purge");
        drop(s);
        let mut s = LogStore::open(&d).expect("reopen");
        let st = s.get_log_state().await.expect("state");
        assert_eq!(st.last_purged_log_id.map(|l| l.index), Some(8));
        assert_eq!(st.last_log_id.map(|l| l.index), Some(8));
        assert!(indexes(&mut s).await.is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[tokio::test]
    async fn segments_rotate_and_are_read_back_from_disk() {
        let d = dir("segments");
        let body = "y".repeat(300);
        {
            let mut s = LogStore::open_with(&d, 2048).expect("open");
            for i in 0..100 {
                s.blocking_append([entry(i, &body)]).await.expect("append");
            }
            // Several batches of several entries, some crossing a segment's end.
            s.blocking_append((100..140).map(|i| entry(i, &body)))
                .await
                .expect("append");
        }
        let segs = |d: &Path| std::fs::read_dir(d.join("log")).expect("ls").count();
        assert!(segs(&d) > 10, "rotated: {} segments", segs(&d));
        let mut s = LogStore::open_with(&d, 2048).expect("reopen");
        assert_eq!(indexes(&mut s).await, (0..140).collect::<Vec<_>>());
        // Nothing is in memory after a reopen: every read comes from the files.
        let got = s.try_get_log_entries(37..75).await.expect("read");
        assert_eq!(got.len(), 38);
        assert!(got
            .iter()
            .all(|e| matches!(&e.payload, EntryPayload::Normal(b) if b.0 == body.as_bytes())));
        // A limited read stops at its byte budget, but returns at least one entry.
        let some = s.read_range(0, 140, 1000).expect("read");
        assert!(!some.is_empty() && some.len() < 5, "{}", some.len());
        assert_eq!(s.read_range(5, 140, 0).expect("read").len(), 1);
        // The reader the state machine uses.
        let r = s.reader().read(138, usize::MAX).expect("read");
        assert_eq!(
            r.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            vec![138, 139]
        );
        assert_eq!(r[0].1.as_deref(), Some(body.as_bytes()));

        // Purging deletes whole segments only, and what it keeps is still there.
        let before = segs(&d);
        s.purge(LogId::new(CommittedLeaderId::new(1, 1), 69))
            .await
            .expect("purge");
        assert!(segs(&d) < before);
        assert_eq!(indexes(&mut s).await, (70..140).collect::<Vec<_>>());
        // Truncating cuts into a segment and removes the later ones.
        s.truncate(LogId::new(CommittedLeaderId::new(1, 1), 101))
            .await
            .expect("truncate");
        assert_eq!(
            s.get_log_state()
                .await
                .expect("state")
                .last_log_id
                .map(|l| l.index),
            Some(100)
        );
        s.blocking_append((101..110).map(|i| entry(i, "z")))
            .await
            .expect("append");
        drop(s);
        let mut s = LogStore::open_with(&d, 2048).expect("reopen");
        assert_eq!(indexes(&mut s).await, (70..110).collect::<Vec<_>>());
        let got = s.try_get_log_entries(100..102).await.expect("read");
        assert!(matches!(&got[1].payload, EntryPayload::Normal(b) if b.0 == b"z"));
        let _ = std::fs::remove_dir_all(&d);
    }
}
