//! A stream's log: append-only segment files `<first offset>.seg` of records that are never
//! acked, only dropped a whole segment at a time by retention.
//!
//! It reuses [`crate::record`]'s framing and checksums (magic, length, CRC-32, resync) but not
//! [`crate::log::QueueLog`]: a queue log tracks live seqs, acks and per-segment live counts, a
//! stream has none of those and instead needs reads by offset and by time from any position,
//! so its bookkeeping is a sparse index per segment.
//!
//! Records: kind [`KIND_CHUNK`] starts a chunk (the records of one group write), kind
//! [`KIND_ENTRY`] continues it; `seq` is the entry's offset and `data` is `timestamp_ms u64 |
//! message`. Offsets are dense and only grow, and survive restarts: a segment's file name is
//! its first offset, so even an empty current segment says where offsets resume.
//!
//! Memory: per segment a handful of counters and one index entry per [`INDEX_EVERY_BYTES`] of
//! file, so a long stream costs ~24 bytes per MiB on disk, never anything per message
//! (appends still waiting for their group write are the exception, bounded by the caller).

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use crate::record::{self, Scan, HEADER_BYTES};

pub const KIND_CHUNK: u8 = 5;
pub const KIND_ENTRY: u8 = 6;
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
struct IndexEntry {
    offset: u64,
    pos: u64,
    ts_ms: u64,
}

#[derive(Debug)]
struct Segment {
    /// Its first offset (and file name).
    first: u64,
    /// One past its last offset (== `first` while empty).
    next: u64,
    len: u64,
    first_ts: u64,
    last_ts: u64,
    index: Vec<IndexEntry>,
    path: PathBuf,
    /// Read handle, shared with readers (an unlinked segment stays readable through it).
    file: Arc<File>,
}

struct Pending<T> {
    offset: u64,
    ts_ms: u64,
    data: Bytes,
    token: Option<T>,
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

/// What one group write produced: the tokens written, the file to fsync, and one past the last
/// offset written. On error, the tokens that were not written.
pub type StreamWritten<T> = Result<(Vec<T>, Option<Arc<File>>, u64), (std::io::Error, Vec<T>)>;

pub struct StreamLog<T> {
    dir: PathBuf,
    segments: VecDeque<Segment>,
    append: File,
    pending: VecDeque<Pending<T>>,
    pending_bytes: u64,
    next_offset: u64,
    /// Offsets below this are in the files.
    written: u64,
    /// First offset of the last chunk written (`x-stream-offset=last`).
    last_chunk: u64,
    /// A new segment is started before a chunk once the current one holds this much.
    pub max_segment_bytes: u64,
    buf: BytesMut,
    pub bytes_written: u64,
}

use crate::log::segment_path;

fn ts_of(data: &[u8]) -> u64 {
    data.get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_be_bytes)
}

fn open_read(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().read(true).open(path)
}

impl Segment {
    /// A segment holding nothing yet, its first offset `first`.
    fn empty(first: u64, path: PathBuf, file: File) -> Segment {
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

impl<T> StreamLog<T> {
    /// Opens (creating if needed) the stream in `dir`: scans every segment to rebuild its index,
    /// cuts a torn or corrupt tail off the last one.
    pub fn open(dir: &Path, max_segment_bytes: u64) -> std::io::Result<StreamLog<T>> {
        fs::create_dir_all(dir)?;
        let mut firsts = crate::log::segment_ids(dir)?;
        if firsts.is_empty() {
            File::create(segment_path(dir, 0))?;
            firsts.push(0);
        }
        let mut segments = VecDeque::new();
        let mut last_chunk = 0;
        let n = firsts.len();
        for (i, first) in firsts.into_iter().enumerate() {
            let path = segment_path(dir, first);
            let file = open_read(&path)?;
            let mut seg = Segment::empty(first, path, file);
            let size = seg.file.metadata()?.len();
            let good = scan_segment(&mut seg, size, &mut last_chunk)?;
            if good < size {
                if i + 1 == n {
                    tracing::warn!(segment = %seg.path.display(), kept = good, size, "stream segment has a torn or corrupt tail: truncated");
                    OpenOptions::new()
                        .write(true)
                        .open(&seg.path)?
                        .set_len(good)?;
                } else {
                    tracing::warn!(segment = %seg.path.display(), kept = good, size, "stream segment is corrupt past this point: the rest is not read");
                }
            }
            seg.len = good;
            segments.push_back(seg);
        }
        // Offsets stay dense: a later segment never starts below an earlier one's end.
        let next_offset = segments.back().map_or(0, |s| s.next);
        let append = OpenOptions::new()
            .append(true)
            .open(&segments.back().expect("one segment").path)?;
        Ok(StreamLog {
            dir: dir.to_path_buf(),
            segments,
            append,
            pending: VecDeque::new(),
            pending_bytes: 0,
            next_offset,
            written: next_offset,
            last_chunk,
            max_segment_bytes: max_segment_bytes.max(1),
            buf: BytesMut::new(),
            bytes_written: 0,
        })
    }

    /// Buffers an entry for the next group write; returns its offset.
    pub fn append(&mut self, ts_ms: u64, data: Bytes, token: Option<T>) -> u64 {
        let offset = self.next_offset;
        self.next_offset += 1;
        self.pending_bytes += data.len() as u64;
        self.pending.push_back(Pending {
            offset,
            ts_ms,
            data,
            token,
        });
        offset
    }

    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// One past the last offset in the files.
    pub fn written(&self) -> u64 {
        self.written
    }

    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The oldest offset retained.
    pub fn first_offset(&self) -> u64 {
        self.segments.front().map_or(self.next_offset, |s| s.first)
    }

    pub fn last_chunk(&self) -> u64 {
        self.last_chunk
    }

    /// Bytes of segments on disk.
    pub fn disk_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.len).sum()
    }

    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Writes the buffered entries as one chunk (starting a new segment first if the current
    /// one is full). The caller fsyncs the returned file before acting on the tokens.
    pub fn write_pending(&mut self) -> StreamWritten<T> {
        if self.pending.is_empty() {
            return Ok((Vec::new(), None, self.written));
        }
        let full = self
            .segments
            .back()
            .is_some_and(|s| s.len >= self.max_segment_bytes);
        if full {
            if let Err(e) = self.rotate() {
                return Err((e, self.drop_pending()));
            }
        }
        self.buf.clear();
        let seg = self
            .segments
            .back_mut()
            .expect("the current segment exists");
        let start_len = seg.len;
        let mut pos = seg.len;
        let mut tokens = Vec::new();
        let mut index = Vec::new();
        let mut last_index = seg.index.last().map(|i| i.pos);
        let chunk = self.pending.front().map_or(0, |p| p.offset);
        let mut first = true;
        let (mut first_ts, mut last_ts) = (seg.first_ts, seg.last_ts);
        let empty = seg.next == seg.first;
        for p in self.pending.drain(..) {
            let kind = if std::mem::take(&mut first) {
                KIND_CHUNK
            } else {
                KIND_ENTRY
            };
            if last_index.is_none_or(|l| pos >= l + INDEX_EVERY_BYTES) {
                index.push(IndexEntry {
                    offset: p.offset,
                    pos,
                    ts_ms: p.ts_ms,
                });
                last_index = Some(pos);
            }
            let before = self.buf.len();
            encode_entry(&mut self.buf, kind, p.offset, p.ts_ms, &p.data);
            pos += (self.buf.len() - before) as u64;
            if empty && first_ts == 0 {
                first_ts = p.ts_ms;
            }
            last_ts = p.ts_ms;
            tokens.extend(p.token);
        }
        self.pending_bytes = 0;
        let end = self.next_offset;
        if let Err(e) = self.append.write_all(&self.buf) {
            let _ = self.append.set_len(start_len);
            // Those offsets are lost: readers skip the gap.
            self.written = end;
            return Err((e, tokens));
        }
        seg.len = pos;
        seg.next = end;
        seg.first_ts = first_ts;
        seg.last_ts = last_ts;
        seg.index.extend(index);
        self.written = end;
        self.last_chunk = chunk;
        self.bytes_written += self.buf.len() as u64;
        if self.buf.capacity() > 4 * 1024 * 1024 {
            self.buf = BytesMut::new();
        }
        Ok((tokens, Some(seg.file.clone()), end))
    }

    /// The tokens of what is still buffered (the stream is being deleted).
    pub fn take_pending(&mut self) -> Vec<T> {
        self.pending_bytes = 0;
        self.pending.drain(..).filter_map(|p| p.token).collect()
    }

    fn drop_pending(&mut self) -> Vec<T> {
        self.pending_bytes = 0;
        self.written = self.next_offset;
        self.pending.drain(..).filter_map(|p| p.token).collect()
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        let first = self.pending.front().map_or(self.next_offset, |p| p.offset);
        let path = segment_path(&self.dir, first);
        let append = OpenOptions::new().create(true).append(true).open(&path)?;
        let file = open_read(&path)?;
        // The new name must survive a crash, or offsets would resume from the old segment's end.
        if let Ok(d) = File::open(&self.dir) {
            let _ = d.sync_all();
        }
        self.append = append;
        self.segments.push_back(Segment::empty(first, path, file));
        Ok(())
    }

    /// Deletes whole old segments (never the current one) while the stream holds more than
    /// `max_bytes` or a segment's newest entry is older than `min_ts_ms`. Returns the number of
    /// entries removed.
    pub fn retain(&mut self, max_bytes: Option<u64>, min_ts_ms: Option<u64>) -> u64 {
        let mut total = self.disk_bytes();
        let mut removed = 0;
        while self.segments.len() > 1 {
            let s = &self.segments[0];
            let over = max_bytes.is_some_and(|m| total > m);
            let old = min_ts_ms.is_some_and(|t| s.next > s.first && s.last_ts < t);
            if !over && !old {
                break;
            }
            let s = self.segments.pop_front().expect("checked");
            total -= s.len;
            removed += s.next - s.first;
            if let Err(e) = fs::remove_file(&s.path) {
                tracing::warn!(segment = %s.path.display(), error = %e, "cannot delete a stream segment");
            }
        }
        removed
    }

    /// Where to read `offset` from, if it is written: `hint` (a previous read's end: offset,
    /// segment, position) continues a sequential read without the index. An offset below the
    /// first retained one is read from the first.
    pub fn plan(&self, offset: u64, hint: Option<(u64, u64, u64)>) -> Option<ReadPlan> {
        if offset >= self.written {
            return None;
        }
        let offset = offset.max(self.first_offset());
        let i = self
            .segments
            .partition_point(|s| s.first <= offset)
            .checked_sub(1)?;
        let s = &self.segments[i];
        if offset >= s.next {
            // In a gap left by a failed write: the next segment, if any.
            let s = self.segments.get(i + 1)?;
            return Some(ReadPlan {
                file: s.file.clone(),
                pos: 0,
                end: s.len,
                segment: s.first,
            });
        }
        let pos = match hint {
            Some((o, seg, pos)) if o == offset && seg == s.first => pos,
            _ => {
                let j = s.index.partition_point(|e| e.offset <= offset);
                j.checked_sub(1).map_or(0, |j| s.index[j].pos)
            }
        };
        Some(ReadPlan {
            file: s.file.clone(),
            pos,
            end: s.len,
            segment: s.first,
        })
    }

    /// The first offset of the segment after the one holding `offset` (to skip past a segment
    /// that cannot be read).
    pub fn segment_after(&self, offset: u64) -> Option<u64> {
        self.segments.iter().map(|s| s.first).find(|&f| f > offset)
    }

    /// Where the first entry with a timestamp at or after `ts_ms` may be: a plan to read from
    /// (the caller skips older entries), or `None` if every written entry is older.
    pub fn plan_at_time(&self, ts_ms: u64) -> Option<ReadPlan> {
        let s = self
            .segments
            .iter()
            .find(|s| s.next > s.first && s.last_ts >= ts_ms)?;
        let j = s.index.partition_point(|e| e.ts_ms < ts_ms);
        let pos = j.checked_sub(1).map_or(0, |j| s.index[j].pos);
        Some(ReadPlan {
            file: s.file.clone(),
            pos,
            end: s.len,
            segment: s.first,
        })
    }
}

/// [`record::encode`] of `ts_ms | data`, without first copying them into one buffer.
fn encode_entry(buf: &mut BytesMut, kind: u8, offset: u64, ts_ms: u64, data: &[u8]) {
    let len = (1 + 8 + 8 + data.len()) as u32;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&[kind]);
    crc.update(&offset.to_be_bytes());
    crc.update(&ts_ms.to_be_bytes());
    crc.update(data);
    buf.reserve(HEADER_BYTES + len as usize);
    buf.put_u32(record::MAGIC);
    buf.put_u32(len);
    buf.put_u32(crc.finalize());
    buf.put_u8(kind);
    buf.put_u64(offset);
    buf.put_u64(ts_ms);
    buf.put_slice(data);
}

/// Reads whole entries from `plan.pos` up to about `max_bytes` (at least one whole entry if
/// there is one), without any lock. Returns them and the position after the last one.
pub fn read(plan: &ReadPlan, max_bytes: u64) -> std::io::Result<(Vec<Entry>, u64)> {
    let mut out = Vec::new();
    let mut pos = plan.pos;
    if pos >= plan.end {
        return Ok((out, pos));
    }
    let mut want = max_bytes.max(HEADER_BYTES as u64).min(plan.end - pos);
    loop {
        let mut b = vec![0u8; want as usize];
        plan.file.read_exact_at(&mut b, pos)?;
        let bytes = Bytes::from(b);
        let mut at = 0;
        while at < bytes.len() {
            match record::scan(&bytes, at) {
                Scan::Record(r, next) => {
                    out.push(Entry {
                        offset: r.seq,
                        ts_ms: ts_of(&r.data),
                        data: r.data.slice(8.min(r.data.len())..),
                    });
                    at = next;
                }
                Scan::Truncated => break,
                Scan::Corrupt => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "corrupt stream record",
                    ))
                }
            }
        }
        pos += at as u64;
        if !out.is_empty() || pos >= plan.end {
            return Ok((out, pos));
        }
        // One entry bigger than the read: read exactly its length.
        if bytes.len() < HEADER_BYTES {
            return Ok((out, pos));
        }
        let len = u32::from_be_bytes(bytes[4..8].try_into().unwrap_or_default()) as u64;
        let need = (HEADER_BYTES as u64 + len).min(plan.end - pos);
        if need <= want {
            return Ok((out, pos));
        }
        want = need;
    }
}

/// Scans a segment in [`READ_BYTES`] reads, filling in its offsets, timestamps and index;
/// returns the length of its whole, valid records.
fn scan_segment(seg: &mut Segment, size: u64, last_chunk: &mut u64) -> std::io::Result<u64> {
    let mut pos = 0u64;
    let mut last_index: Option<u64> = None;
    while pos < size {
        let want = READ_BYTES.min(size - pos);
        let mut b = vec![0u8; want as usize];
        seg.file.read_exact_at(&mut b, pos)?;
        let bytes = Bytes::from(b);
        let mut at = 0usize;
        let mut bad = false;
        while at < bytes.len() {
            match record::scan(&bytes, at) {
                Scan::Record(r, next) => {
                    if !matches!(r.kind, KIND_CHUNK | KIND_ENTRY) || r.seq < seg.next {
                        bad = true;
                        break;
                    }
                    let rec_pos = pos + at as u64;
                    let ts = ts_of(&r.data);
                    if seg.next == seg.first {
                        seg.first_ts = ts;
                    }
                    if last_index.is_none_or(|l| rec_pos >= l + INDEX_EVERY_BYTES) {
                        seg.index.push(IndexEntry {
                            offset: r.seq,
                            pos: rec_pos,
                            ts_ms: ts,
                        });
                        last_index = Some(rec_pos);
                    }
                    if r.kind == KIND_CHUNK {
                        *last_chunk = r.seq;
                    }
                    seg.last_ts = ts;
                    seg.next = r.seq + 1;
                    at = next;
                }
                Scan::Truncated if at > 0 => break,
                // A record longer than the read: read it whole, if the file holds it.
                Scan::Truncated => {
                    if bytes.len() < HEADER_BYTES {
                        return Ok(pos);
                    }
                    let len = u32::from_be_bytes(bytes[4..8].try_into().unwrap_or_default());
                    let need = HEADER_BYTES as u64 + len as u64;
                    if len > record::MAX_PAYLOAD_BYTES || pos + need > size {
                        return Ok(pos);
                    }
                    let mut whole = vec![0u8; need as usize];
                    seg.file.read_exact_at(&mut whole, pos)?;
                    let whole = Bytes::from(whole);
                    match record::scan(&whole, 0) {
                        Scan::Record(r, _) if matches!(r.kind, KIND_CHUNK | KIND_ENTRY) => {
                            let ts = ts_of(&r.data);
                            if seg.next == seg.first {
                                seg.first_ts = ts;
                            }
                            seg.index.push(IndexEntry {
                                offset: r.seq,
                                pos,
                                ts_ms: ts,
                            });
                            last_index = Some(pos);
                            if r.kind == KIND_CHUNK {
                                *last_chunk = r.seq;
                            }
                            seg.last_ts = ts;
                            seg.next = r.seq + 1;
                            at = whole.len();
                        }
                        _ => return Ok(pos),
                    }
                    break;
                }
                Scan::Corrupt => {
                    bad = true;
                    break;
                }
            }
        }
        pos += at as u64;
        if bad || at == 0 {
            return Ok(pos);
        }
    }
    Ok(pos)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("warren-stream-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn read_all(log: &StreamLog<u32>, from: u64) -> Vec<(u64, Bytes)> {
        let mut out = Vec::new();
        let mut next = from;
        let mut hint = None;
        while let Some(plan) = log.plan(next, hint) {
            let (got, end) = read(&plan, 100).expect("reads");
            if got.is_empty() {
                break;
            }
            for e in got {
                if e.offset >= next {
                    next = e.offset + 1;
                    out.push((e.offset, e.data));
                }
            }
            hint = Some((next, plan.segment, end));
        }
        out
    }

    #[test]
    fn append_write_read_and_offsets() {
        let d = dir("rw");
        let mut log: StreamLog<u32> = StreamLog::open(&d, 100).expect("opens");
        for i in 0..10u32 {
            let o = log.append(1000 + i as u64, Bytes::from(format!("m{i}")), Some(i));
            assert_eq!(o, i as u64);
            if i % 3 == 2 {
                let (tokens, file, end) = log.write_pending().expect("writes");
                assert!(file.is_some());
                assert_eq!(end, i as u64 + 1);
                assert_eq!(tokens.len(), 3);
            }
        }
        log.write_pending().expect("writes");
        assert!(log.segment_count() > 1, "small segments rotate");
        assert_eq!(log.last_chunk(), 9);
        let all = read_all(&log, 0);
        assert_eq!(all.len(), 10);
        assert!(all.iter().enumerate().all(|(i, (o, _))| *o == i as u64));
        assert_eq!(read_all(&log, 7)[0], (7, Bytes::from("m7")));
        // By time: the first entry at or after 1004.
        let plan = log.plan_at_time(1004).expect("found");
        let (got, _) = read(&plan, 1 << 20).expect("reads");
        assert!(got.iter().any(|e| e.ts_ms == 1004));
        assert!(log.plan_at_time(5000).is_none());
        // Reopen: same offsets, same last chunk.
        drop(log);
        let mut log: StreamLog<u32> = StreamLog::open(&d, 100).expect("reopens");
        assert_eq!(log.next_offset(), 10);
        assert_eq!(log.last_chunk(), 9);
        assert_eq!(log.append(0, Bytes::from("m10"), None), 10);
        log.write_pending().expect("writes");
        assert_eq!(read_all(&log, 0).len(), 11);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn retention_drops_whole_old_segments() {
        let d = dir("ret");
        let mut log: StreamLog<u32> = StreamLog::open(&d, 200).expect("opens");
        for i in 0..40u64 {
            log.append(i, Bytes::from(vec![b'x'; 50]), None);
            log.write_pending().expect("writes");
        }
        let before = log.segment_count();
        assert!(before > 3);
        let removed = log.retain(Some(500), None);
        assert!(removed > 0);
        assert!(log.disk_bytes() <= 500 || log.segment_count() == 1);
        assert_eq!(log.first_offset(), removed);
        // Reading below the first retained offset starts at the first.
        assert_eq!(read_all(&log, 0)[0].0, removed);
        // By age: everything older than ts 39 goes, but never the current segment.
        log.retain(None, Some(39));
        assert_eq!(log.segment_count(), 1);
        drop(log);
        let log: StreamLog<u32> = StreamLog::open(&d, 200).expect("reopens");
        assert_eq!(log.next_offset(), 40);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn torn_tail_is_truncated() {
        let d = dir("torn");
        let mut log: StreamLog<u32> = StreamLog::open(&d, 1 << 20).expect("opens");
        for i in 0..5u64 {
            log.append(i, Bytes::from("abc"), None);
        }
        log.write_pending().expect("writes");
        drop(log);
        let path = segment_path(&d, 0);
        let len = fs::metadata(&path).expect("exists").len();
        let f = OpenOptions::new().write(true).open(&path).expect("opens");
        f.set_len(len - 3).expect("cuts");
        let mut log: StreamLog<u32> = StreamLog::open(&d, 1 << 20).expect("reopens");
        assert_eq!(log.next_offset(), 4);
        assert_eq!(log.append(9, Bytes::from("new"), None), 4);
        log.write_pending().expect("writes");
        let all = read_all(&log, 0);
        assert_eq!(all.len(), 5);
        assert_eq!(all[4], (4, Bytes::from("new")));
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn entry_encoding_is_a_record() {
        let mut a = BytesMut::new();
        encode_entry(&mut a, KIND_CHUNK, 9, 77, b"payload");
        let mut b = BytesMut::new();
        let mut data = 77u64.to_be_bytes().to_vec();
        data.extend_from_slice(b"payload");
        record::encode(&mut b, KIND_CHUNK, 9, &data);
        assert_eq!(a, b);
    }

    #[test]
    fn big_entry_is_read_whole() {
        let d = dir("big");
        let mut log: StreamLog<u32> = StreamLog::open(&d, 1 << 30).expect("opens");
        log.append(1, Bytes::from(vec![7u8; 3 * READ_BYTES as usize]), None);
        log.append(2, Bytes::from("small"), None);
        log.write_pending().expect("writes");
        let plan = log.plan(0, None).expect("written");
        let (got, _) = read(&plan, 1000).expect("reads");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].data.len(), 3 * READ_BYTES as usize);
        drop(log);
        let log: StreamLog<u32> = StreamLog::open(&d, 1 << 30).expect("reopens");
        assert_eq!(log.next_offset(), 2);
        let _ = fs::remove_dir_all(&d);
    }
}
