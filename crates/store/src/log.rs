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

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::record::{self, Scan, KIND_ACK, KIND_ACK_RANGE, KIND_ENQUEUE, KIND_VOLATILE};

/// A segment is rotated once it has grown past this.
pub const SEGMENT_BYTES: u64 = 16 * 1024 * 1024;
/// A fully acked current segment at least this big is replaced by a fresh one.
pub const DRAINED_ROTATE_BYTES: u64 = 1024 * 1024;
/// Smallest read issued when paging messages back in.
const READ_CHUNK_BYTES: u64 = 256 * 1024;

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

fn range_end(data: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(data.get(..8)?.try_into().ok()?))
}

impl<T> QueueLog<T> {
    /// Opens (creating if needed) the log in `dir` and says which messages it holds; `measure`
    /// gives the size a message counts for. A torn tail is truncated; a corrupt record elsewhere
    /// is logged and skipped. Bodies are not kept: the caller reads them back with [`Self::read`].
    pub fn open(
        dir: &Path,
        measure: impl Fn(&[u8]) -> u64,
    ) -> std::io::Result<(QueueLog<T>, Recovery)> {
        fs::create_dir_all(dir)?;
        let ids = segment_ids(dir)?;
        // Every enqueue on disk in seq order (seqs only grow in a log), with its size; an acked
        // one gets DEAD. Flat vectors: 12 bytes a message while scanning, freed after.
        const DEAD: u32 = u32::MAX;
        let mut seqs: Vec<u64> = Vec::new();
        let mut sizes: Vec<u32> = Vec::new();
        let mut max_seq: Option<u64> = None;
        let mut segments: VecDeque<Segment> = VecDeque::new();
        let n = ids.len();
        for (i, id) in ids.into_iter().enumerate() {
            let mut seg = empty_segment(dir, id);
            let path = seg.path.clone();
            let bytes = Bytes::from(fs::read(&path)?);
            seg.len = bytes.len() as u64;
            let mut at = 0usize;
            while at < bytes.len() {
                match record::scan(&bytes, at) {
                    Scan::Record(r, next) => {
                        match r.kind {
                            KIND_ENQUEUE => {
                                seg.first_seq = seg.first_seq.min(r.seq);
                                seg.last_seq = seg.last_seq.max(r.seq);
                                seg.live += 1;
                                max_seq = max_seq.max(Some(r.seq));
                                let size = measure(&r.data).min(DEAD as u64 - 1) as u32;
                                push_sorted(&mut seqs, &mut sizes, r.seq, size);
                            }
                            // Not recovered, but on disk: it must split the runs of live ones.
                            KIND_VOLATILE => {
                                max_seq = max_seq.max(Some(r.seq));
                                push_sorted(&mut seqs, &mut sizes, r.seq, DEAD);
                            }
                            KIND_ACK | KIND_ACK_RANGE => {
                                let to = if r.kind == KIND_ACK {
                                    r.seq
                                } else {
                                    range_end(&r.data).unwrap_or(r.seq)
                                };
                                let lo = seqs.partition_point(|&s| s < r.seq);
                                let hi = seqs.partition_point(|&s| s <= to);
                                for i in lo..hi {
                                    if sizes[i] != DEAD {
                                        sizes[i] = DEAD;
                                        dec_live(&mut segments, &mut seg, seqs[i]);
                                    }
                                }
                            }
                            other => {
                                tracing::warn!(segment = %path.display(), kind = other, "skipping record of unknown kind")
                            }
                        }
                        at = next;
                    }
                    found => {
                        let next = if found == Scan::Corrupt {
                            record::resync(&bytes, at)
                        } else {
                            None
                        };
                        match next {
                            Some(next) => {
                                tracing::warn!(segment = %path.display(), offset = at, skipped = next - at, "corrupt record skipped");
                                at = next;
                            }
                            None => {
                                tracing::warn!(segment = %path.display(), offset = at, dropped = bytes.len() - at, "torn tail truncated");
                                if i + 1 == n {
                                    OpenOptions::new()
                                        .write(true)
                                        .open(&path)?
                                        .set_len(at as u64)?;
                                    seg.len = at as u64;
                                }
                                break;
                            }
                        }
                    }
                }
            }
            segments.push_back(seg);
        }
        let mut recovery = Recovery {
            max_seq,
            ..Default::default()
        };
        let mut run: Option<(u64, u64)> = None;
        for (&seq, &size) in seqs.iter().zip(&sizes) {
            if size == DEAD {
                recovery.live.runs.extend(run.take());
                continue;
            }
            recovery.count += 1;
            recovery.bytes += size as u64;
            run = Some(run.map_or((seq, seq), |(first, _)| (first, seq)));
        }
        recovery.live.runs.extend(run);
        drop((seqs, sizes));
        if segments.is_empty() {
            segments.push_back(empty_segment(dir, 0));
        }
        let file = open_append(&segments.back().expect("a segment exists").path)?;
        let mut log = QueueLog {
            dir: dir.to_path_buf(),
            segments,
            file: Arc::new(file),
            pending_enqueues: VecDeque::new(),
            pending_acks: Vec::new(),
            pending_ranges: Vec::new(),
            unsynced: Vec::new(),
            needs_sync: false,
            scratch: false,
            buf: BytesMut::new(),
            bytes_written: 0,
        };
        log.reclaim();
        Ok((log, recovery))
    }

    /// Makes this a scratch log: nothing in it survives a restart, so nothing is fsynced.
    pub fn set_scratch(&mut self) {
        self.scratch = true;
    }

    fn size(&self) -> u64 {
        self.segments.back().map_or(0, |s| s.len)
    }

    /// Buffers an enqueue record. Seqs must be increasing. A `volatile` one is readable at run
    /// time but not recovered after a restart (a transient message paged out of memory).
    pub fn enqueue(&mut self, seq: u64, data: Bytes, token: Option<T>, volatile: bool) {
        debug_assert!(
            self.pending_enqueues.back().is_none_or(|p| p.seq < seq),
            "enqueue seqs must increase"
        );
        self.pending_enqueues.push_back(Pending {
            seq,
            data,
            token,
            volatile,
        });
    }

    /// Records that `seq` left the queue. If its enqueue is still buffered it is dropped unwritten
    /// and its token returned; otherwise an ack record is buffered.
    pub fn ack(&mut self, seq: u64) -> Option<T> {
        if let Ok(i) = self.pending_enqueues.binary_search_by_key(&seq, |p| p.seq) {
            return self.pending_enqueues.remove(i).and_then(|p| p.token);
        }
        if let Some(s) = self
            .segments
            .iter_mut()
            .find(|s| s.first_seq <= seq && seq <= s.last_seq)
        {
            s.live = s.live.saturating_sub(1);
            self.pending_acks.push(seq);
        }
        None
    }

    /// Records that every message from `from` to `to` left the queue (a purge of what was paged
    /// out) with one record. `is_live` says which enqueues on disk in that range were still in
    /// the queue. Returns the tokens of buffered enqueues it cancelled.
    pub fn ack_range(&mut self, from: u64, to: u64, is_live: impl Fn(u64) -> bool) -> Vec<T> {
        let mut tokens = Vec::new();
        self.pending_enqueues.retain_mut(|p| {
            if (from..=to).contains(&p.seq) {
                tokens.extend(p.token.take());
                false
            } else {
                true
            }
        });
        for s in self.segments.iter_mut() {
            if s.last_seq < from || s.first_seq > to || s.first_seq > s.last_seq {
                continue;
            }
            if from <= s.first_seq && s.last_seq <= to {
                s.live = 0;
                continue;
            }
            // Straddles the range: count what it held in it.
            let n = fs::read(&s.path).map_or(0, |b| {
                let b = Bytes::from(b);
                let mut at = 0;
                let mut n = 0u64;
                while let Scan::Record(r, next) = record::scan(&b, at) {
                    if matches!(r.kind, KIND_ENQUEUE | KIND_VOLATILE)
                        && (from..=to).contains(&r.seq)
                        && is_live(r.seq)
                    {
                        n += 1;
                    }
                    at = next;
                }
                n
            });
            s.live = s.live.saturating_sub(n);
        }
        self.pending_ranges.push((from, to));
        tokens
    }

    pub fn has_pending(&self) -> bool {
        !self.pending_enqueues.is_empty()
            || !self.pending_acks.is_empty()
            || !self.pending_ranges.is_empty()
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

    /// Reads enqueues at `cursor` onward, in seq order, up to about `max_bytes` (at least one
    /// message if there is one), continuing into what is buffered; `keep` filters out enqueues
    /// that are no longer in the queue. Advances the cursor past what it returns.
    pub fn read(
        &self,
        cursor: &mut Cursor,
        max_bytes: usize,
        keep: impl Fn(u64) -> bool,
    ) -> std::io::Result<Vec<(u64, Bytes)>> {
        let mut out = Vec::new();
        let mut got = 0usize;
        let wanted = |r: &record::Record, c: &Cursor| {
            matches!(r.kind, KIND_ENQUEUE | KIND_VOLATILE) && r.seq >= c.next_seq && keep(r.seq)
        };
        let start = cursor.segment;
        for seg in self.segments.iter().filter(|s| s.id >= start) {
            if seg.id != cursor.segment {
                cursor.segment = seg.id;
                cursor.offset = 0;
            }
            if cursor.offset >= seg.len {
                continue;
            }
            let file = File::open(&seg.path)?;
            let mut min_read = 0u64;
            while cursor.offset < seg.len && got < max_bytes {
                let want = (seg.len - cursor.offset)
                    .min((max_bytes as u64).max(READ_CHUNK_BYTES).max(min_read));
                let mut raw = vec![0u8; want as usize];
                file.read_exact_at(&mut raw, cursor.offset)?;
                let buf = Bytes::from(raw);
                let mut at = 0usize;
                while at < buf.len() && got < max_bytes {
                    match record::scan(&buf, at) {
                        Scan::Record(r, next) => {
                            if wanted(&r, cursor) {
                                got += r.data.len();
                                cursor.next_seq = r.seq + 1;
                                out.push((r.seq, r.data));
                            }
                            at = next;
                        }
                        Scan::Truncated if at > 0 => break,
                        Scan::Truncated if want < seg.len - cursor.offset => {
                            // One record larger than the read: read it whole next time.
                            let len = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
                            min_read = record::HEADER_BYTES as u64 + len as u64;
                            break;
                        }
                        found => {
                            let next = if found == Scan::Corrupt {
                                record::resync(&buf, at)
                            } else {
                                None
                            };
                            tracing::warn!(segment = %seg.path.display(), offset = cursor.offset + at as u64, "unreadable record skipped while paging in");
                            at = next.unwrap_or(buf.len());
                        }
                    }
                }
                cursor.offset += at as u64;
            }
            if got >= max_bytes {
                return Ok(out);
            }
        }
        for p in &self.pending_enqueues {
            if got >= max_bytes {
                break;
            }
            if p.seq >= cursor.next_seq && keep(p.seq) {
                got += p.data.len();
                cursor.next_seq = p.seq + 1;
                out.push((p.seq, p.data.clone()));
            }
        }
        Ok(out)
    }

    /// Writes everything buffered (one write call) and returns the tokens of the enqueues written
    /// and the files the caller must fsync before acting on those tokens. On a write error (disk
    /// full) the file is cut back to its last good size and the tokens come back with the error:
    /// those enqueues are not durable and must not be confirmed.
    pub fn write_pending(&mut self) -> Written<T> {
        match self.try_write() {
            Ok(r) => Ok(r),
            Err((e, tokens)) => {
                let _ = self.file.set_len(self.size());
                Err((e, tokens))
            }
        }
    }

    fn try_write(&mut self) -> Written<T> {
        let mut tokens = Vec::new();
        if self.has_pending() {
            if self.size() >= SEGMENT_BYTES {
                if let Err(e) = self.rotate() {
                    let tokens = self
                        .pending_enqueues
                        .drain(..)
                        .filter_map(|p| p.token)
                        .collect();
                    return Err((e, tokens));
                }
            }
            self.buf.clear();
            let seg = self
                .segments
                .back_mut()
                .expect("the current segment exists");
            for p in self.pending_enqueues.drain(..) {
                let kind = if p.volatile {
                    KIND_VOLATILE
                } else {
                    self.needs_sync = true;
                    KIND_ENQUEUE
                };
                record::encode(&mut self.buf, kind, p.seq, &p.data);
                seg.first_seq = seg.first_seq.min(p.seq);
                seg.last_seq = seg.last_seq.max(p.seq);
                seg.live += 1;
                tokens.extend(p.token);
            }
            for seq in self.pending_acks.drain(..) {
                record::encode(&mut self.buf, KIND_ACK, seq, &[]);
                self.needs_sync = true;
            }
            for (from, to) in self.pending_ranges.drain(..) {
                record::encode(&mut self.buf, KIND_ACK_RANGE, from, &to.to_be_bytes());
                self.needs_sync = true;
            }
            if let Err(e) = (&*self.file).write_all(&self.buf) {
                return Err((e, tokens));
            }
            seg.len += self.buf.len() as u64;
            self.bytes_written += self.buf.len() as u64;
            if !self.unsynced.iter().any(|f| Arc::ptr_eq(f, &self.file)) {
                self.unsynced.push(self.file.clone());
            }
            if self.buf.capacity() > 4 * 1024 * 1024 {
                self.buf = BytesMut::new();
            }
        }
        // A drained log whose current segment holds only dead records starts a fresh one, so the
        // old one can go and disk use returns to near zero.
        if self.size() >= DRAINED_ROTATE_BYTES && self.segments.iter().all(|s| s.live == 0) {
            if let Err(e) = self.rotate() {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot start a new segment");
            }
        }
        self.reclaim();
        let files = if std::mem::take(&mut self.needs_sync) && !self.scratch {
            std::mem::take(&mut self.unsynced)
        } else {
            Vec::new()
        };
        Ok((tokens, files))
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        let id = self.segments.back().map_or(0, |s| s.id + 1);
        let seg = empty_segment(&self.dir, id);
        self.file = Arc::new(open_append(&seg.path)?);
        self.segments.push_back(seg);
        Ok(())
    }

    /// Deletes the oldest segments while they are fully acked (never the current one).
    fn reclaim(&mut self) {
        while self.segments.len() > 1 && self.segments.front().is_some_and(|s| s.live == 0) {
            if let Some(s) = self.segments.pop_front() {
                if let Err(e) = fs::remove_file(&s.path) {
                    tracing::warn!(segment = %s.path.display(), error = %e, "cannot delete acked segment");
                }
            }
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

/// Adds an enqueue seen at recovery; seqs come in order except in logs of older builds.
fn push_sorted(seqs: &mut Vec<u64>, sizes: &mut Vec<u32>, seq: u64, size: u32) {
    match seqs.last() {
        Some(&last) if last >= seq => match seqs.binary_search(&seq) {
            Ok(i) => sizes[i] = size,
            Err(i) => {
                seqs.insert(i, seq);
                sizes.insert(i, size);
            }
        },
        _ => {
            seqs.push(seq);
            sizes.push(size);
        }
    }
}

/// An ack at recovery: the segment holding `seq`'s enqueue has one fewer live message.
fn dec_live(done: &mut VecDeque<Segment>, current: &mut Segment, seq: u64) {
    if let Some(s) = done
        .iter_mut()
        .chain(std::iter::once(current))
        .find(|s| s.first_seq <= seq && seq <= s.last_seq)
    {
        s.live = s.live.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("warren-store-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn measure(d: &[u8]) -> u64 {
        d.len() as u64
    }

    fn runs(rec: &Recovery) -> Vec<(u64, u64)> {
        rec.live.runs().collect()
    }

    fn data(i: u64) -> Bytes {
        Bytes::from(format!("message-{i}"))
    }

    #[test]
    fn acked_before_write_is_never_written() {
        let dir = tmp("skip");
        let (mut log, rec) = QueueLog::<u64>::open(&dir, measure).expect("open");
        assert_eq!(rec.count, 0);
        log.enqueue(1, data(1), Some(10), false);
        log.enqueue(2, data(2), Some(20), false);
        assert_eq!(log.ack(1), Some(10), "cancelled while buffered");
        let (tokens, files) = log
            .write_pending()
            .unwrap_or_else(|(e, _)| panic!("write: {e}"));
        assert_eq!(tokens, vec![20]);
        assert_eq!(files.len(), 1);
        drop(log);
        let (_, rec) = QueueLog::<u64>::open(&dir, measure).expect("reopen");
        assert_eq!(runs(&rec), vec![(2, 2)]);
        assert_eq!(rec.bytes, data(2).len() as u64);
    }

    #[test]
    fn acks_survive_and_torn_tail_is_truncated() {
        let dir = tmp("torn");
        let (mut log, _) = QueueLog::<()>::open(&dir, measure).expect("open");
        for i in 1..=3 {
            log.enqueue(i, data(i), None, false);
        }
        log.write_pending()
            .unwrap_or_else(|(e, _)| panic!("write: {e}"));
        log.ack(2);
        log.write_pending()
            .unwrap_or_else(|(e, _)| panic!("write: {e}"));
        drop(log);
        // Append half a record: a crash mid-write.
        let seg = segment_path(&dir, 0);
        let mut half = BytesMut::new();
        record::encode(&mut half, KIND_ENQUEUE, 4, b"torn");
        let len = fs::metadata(&seg).expect("meta").len();
        OpenOptions::new()
            .append(true)
            .open(&seg)
            .expect("open")
            .write_all(&half[..half.len() - 3])
            .expect("write");
        let (mut log, rec) = QueueLog::<()>::open(&dir, measure).expect("reopen");
        assert_eq!(runs(&rec), vec![(1, 1), (3, 3)]);
        assert_eq!(
            fs::metadata(&seg).expect("meta").len(),
            len,
            "tail truncated"
        );
        log.enqueue(5, data(5), None, false);
        log.write_pending()
            .unwrap_or_else(|(e, _)| panic!("write: {e}"));
        drop(log);
        let (_, rec) = QueueLog::<()>::open(&dir, measure).expect("reopen");
        assert_eq!((runs(&rec), rec.count), (vec![(1, 1), (3, 5)], 3));
    }

    #[test]
    fn corrupt_record_in_the_middle_is_skipped() {
        let dir = tmp("corrupt");
        let (mut log, _) = QueueLog::<()>::open(&dir, measure).expect("open");
        for i in 1..=3 {
            log.enqueue(i, data(i), None, false);
        }
        log.write_pending()
            .unwrap_or_else(|(e, _)| panic!("write: {e}"));
        drop(log);
        let seg = segment_path(&dir, 0);
        let mut bytes = fs::read(&seg).expect("read");
        let first = record::HEADER_BYTES + 9 + data(1).len();
        bytes[first + record::HEADER_BYTES + 12] ^= 0xff; // inside record 2's payload
        fs::write(&seg, &bytes).expect("write");
        let (_, rec) = QueueLog::<()>::open(&dir, measure).expect("reopen");
        // Seq 2's record is gone, so nothing on disk separates 1 and 3.
        assert_eq!((runs(&rec), rec.count), (vec![(1, 3)], 2));
    }

    #[test]
    fn fully_acked_segments_are_deleted() {
        let dir = tmp("reclaim");
        let (mut log, _) = QueueLog::<()>::open(&dir, measure).expect("open");
        let big = Bytes::from(vec![0u8; 1024 * 1024]);
        for i in 0..40 {
            log.enqueue(i, big.clone(), None, false);
            log.write_pending()
                .unwrap_or_else(|(e, _)| panic!("write: {e}"));
        }
        assert!(log.segments.len() > 1);
        for i in 0..40 {
            log.ack(i);
        }
        log.write_pending()
            .unwrap_or_else(|(e, _)| panic!("write: {e}"));
        assert_eq!(log.segments.len(), 1, "only the current segment is left");
        assert_eq!(log.disk_bytes(), 0, "a drained log takes no space");
        drop(log);
        let (_, rec) = QueueLog::<()>::open(&dir, measure).expect("reopen");
        assert_eq!(rec.count, 0);
    }

    fn write(log: &mut QueueLog<()>) {
        log.write_pending()
            .unwrap_or_else(|(e, _)| panic!("write: {e}"));
    }

    fn read_all(log: &QueueLog<()>, c: &mut Cursor, keep: impl Fn(u64) -> bool) -> Vec<u64> {
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

    fn tagged(seq: u64, size: usize) -> Bytes {
        let mut v = vec![7u8; size.max(8)];
        v[..8].copy_from_slice(&seq.to_be_bytes());
        Bytes::from(v)
    }

    #[test]
    fn paged_messages_read_back_in_order_across_segments_and_buffer() {
        let dir = tmp("read");
        let (mut log, _) = QueueLog::<()>::open(&dir, measure).expect("open");
        let c0 = log.cursor_at_end(0);
        for i in 0..40 {
            log.enqueue(i, tagged(i, 1024 * 1024), None, i % 3 == 0);
            if i < 35 {
                write(&mut log);
            }
        }
        assert!(log.segments.len() > 1, "spans segments");
        // A record larger than one read, and small ones after it, still buffered.
        log.enqueue(40, tagged(40, 5 * 1024 * 1024), None, false);
        log.enqueue(41, tagged(41, 10), None, false);
        let mut c = c0;
        assert_eq!(
            read_all(&log, &mut c, |_| true),
            (0..42).collect::<Vec<_>>()
        );
        write(&mut log);
        let mut c = c0;
        assert_eq!(
            read_all(&log, &mut c, |s| s % 2 == 0),
            (0..42).filter(|s| s % 2 == 0).collect::<Vec<_>>(),
            "keep filters"
        );
        // A cursor past what was read sees only later enqueues.
        log.enqueue(42, tagged(42, 100), None, false);
        assert_eq!(read_all(&log, &mut c, |_| true), vec![42]);
        drop(log);
        let (log, rec) = QueueLog::<()>::open(&dir, measure).expect("reopen");
        let durable: Vec<u64> = (0..42).filter(|i| i % 3 != 0).collect();
        assert_eq!(
            rec.count,
            durable.len(),
            "volatile records are not recovered"
        );
        assert_eq!(runs(&rec).len(), 14, "volatile records split the runs");
        assert_eq!(rec.max_seq, Some(41), "42 was never written");
        let mut c = log.cursor_at_start(rec.live.first().expect("live"));
        let m = rec.max_seq;
        assert_eq!(
            read_all(&log, &mut c, |s| rec.live.holds(s)
                || m.is_none_or(|m| s > m)),
            durable
        );
    }

    #[test]
    fn a_range_ack_purges_what_was_paged_out_and_frees_its_segments() {
        let dir = tmp("range");
        let (mut log, _) = QueueLog::<()>::open(&dir, measure).expect("open");
        for i in 0..40 {
            log.enqueue(i, tagged(i, 1024 * 1024), None, false);
            write(&mut log);
        }
        log.ack(1);
        // 0 and 2 stay (unacked elsewhere); 3.. are purged, 40 is still buffered.
        log.enqueue(40, tagged(40, 10), None, false);
        log.ack_range(3, 40, |s| s != 1);
        write(&mut log);
        drop(log);
        let (mut log, rec) = QueueLog::<()>::open(&dir, measure).expect("reopen");
        assert_eq!(runs(&rec), vec![(0, 0), (2, 2)]);
        assert_eq!(rec.max_seq, Some(39));
        log.ack(0);
        log.ack(2);
        write(&mut log);
        assert_eq!(
            log.segments.len(),
            1,
            "every segment but the current one is gone"
        );
        drop(log);
        let (_, rec) = QueueLog::<()>::open(&dir, measure).expect("reopen");
        assert_eq!(rec.count, 0);
    }

    #[test]
    fn a_scratch_log_is_never_synced() {
        let dir = tmp("scratch");
        let (mut log, _) = QueueLog::<()>::open(&dir, measure).expect("open");
        log.set_scratch();
        log.enqueue(1, data(1), None, true);
        let (_, files) = log
            .write_pending()
            .unwrap_or_else(|(e, _)| panic!("write: {e}"));
        assert!(files.is_empty());
        let (mut log, _) = QueueLog::<()>::open(&tmp("durable"), measure).expect("open");
        log.enqueue(1, data(1), None, true);
        let (_, files) = log
            .write_pending()
            .unwrap_or_else(|(e, _)| panic!("write: {e}"));
        assert!(files.is_empty(), "volatile records alone need no fsync");
        log.enqueue(2, data(2), None, false);
        let (_, files) = log
            .write_pending()
            .unwrap_or_else(|(e, _)| panic!("write: {e}"));
        assert_eq!(files.len(), 1);
    }
}
