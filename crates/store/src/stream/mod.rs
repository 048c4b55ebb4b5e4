//! A stream's log: append-only segment files `<first offset>.seg` of records that are never
//! acked, only dropped a whole segment at a time by retention.
//!
//! It reuses [`crate::record`]'s framing and checksums (magic, length, CRC-32, resync) but not
//! [`crate::log::QueueLog`]: a queue log tracks live seqs, acks and per-segment live counts, a
//! stream has none of those and instead needs reads by offset and by time from any position,
//! so its bookkeeping is a sparse index per segment.
//!
//! Records: kind [`KIND_HEADER`] opens a segment with its format version ([`SEGMENT_VERSION`];
//! a segment without one is of version 1, the same records: a newer version is refused at
//! open, never read as something else); kind [`KIND_CHUNK`] starts a chunk (the records of one
//! group write, or of one replicated entry: [`StreamLog::start_chunk`]), kind [`KIND_ENTRY`]
//! continues it; `seq` is the entry's offset and `data` is `timestamp_ms u64 | message`. Offsets are dense and only grow, and survive restarts: a segment's file name is
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

use bytes::{Bytes, BytesMut};

mod records;
mod types;

pub use types::{
    Entry, ReadPlan, DEFAULT_SEGMENT_BYTES, INDEX_EVERY_BYTES, KIND_CHUNK, KIND_ENTRY, KIND_HEADER,
    READ_BYTES, SEGMENT_VERSION,
};
use types::{IndexEntry, Segment};

use crate::record::HEADER_BYTES;

use records::{encode_entry, scan_segment};
pub use records::{read, read_with_chunks};

struct Pending<T> {
    offset: u64,
    ts_ms: u64,
    data: Bytes,
    token: Option<T>,
    /// Starts a chunk of its own (`start_chunk`).
    chunk: bool,
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
    /// The next append starts a chunk of its own.
    chunk_next: bool,
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

fn open_read(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().read(true).open(path)
}

/// The bytes of a segment's header record.
fn header_len() -> u64 {
    (HEADER_BYTES + 17 + 1) as u64
}

/// The length of the header at the start of `file`: 0 for a segment of version 1 without one.
fn header_of(file: &File) -> u64 {
    let mut b = [0u8; HEADER_BYTES + 1];
    match file.read_exact_at(&mut b, 0) {
        Ok(()) if b[HEADER_BYTES] == KIND_HEADER => header_len(),
        _ => 0,
    }
}

/// Creates the segment that starts at `first` with its header (truncating one left there),
/// for appending; returns the append handle and the segment.
fn new_segment(dir: &Path, first: u64) -> std::io::Result<(File, Segment)> {
    let path = segment_path(dir, first);
    let mut b = BytesMut::new();
    encode_entry(&mut b, KIND_HEADER, first, 0, &[SEGMENT_VERSION]);
    fs::write(&path, &b)?;
    let append = OpenOptions::new().append(true).open(&path)?;
    let file = open_read(&path)?;
    let mut seg = Segment::empty(first, path, file);
    seg.len = b.len() as u64;
    Ok((append, seg))
}

impl<T> StreamLog<T> {
    /// Opens (creating if needed) the stream in `dir`: scans every segment to rebuild its index,
    /// cuts a torn or corrupt tail off the last one.
    pub fn open(dir: &Path, max_segment_bytes: u64) -> std::io::Result<StreamLog<T>> {
        fs::create_dir_all(dir)?;
        let mut firsts = crate::log::segment_ids(dir)?;
        if firsts.is_empty() {
            new_segment(dir, 0)?;
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
            chunk_next: false,
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
            chunk: std::mem::take(&mut self.chunk_next),
        });
        offset
    }

    /// The next append starts a chunk of its own, and so a group write of its own: a
    /// replicated stream writes each entry of its group as one chunk, so every member's
    /// chunks, and with them its segment files, are the same.
    pub fn start_chunk(&mut self) {
        self.chunk_next = true;
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
    /// one is full), up to the next entry that starts a chunk of its own: the caller calls it
    /// again while [`StreamLog::has_pending`]. The caller fsyncs the returned file before
    /// acting on the tokens.
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
        while let Some(p) = self.pending.pop_front() {
            if p.chunk && !first {
                self.pending.push_front(p);
                break;
            }
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
            self.pending_bytes -= p.data.len() as u64;
            tokens.extend(p.token);
        }
        let end = self.pending.front().map_or(self.next_offset, |p| p.offset);
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
        let (append, seg) = new_segment(&self.dir, first)?;
        // The new name must survive a crash, or offsets would resume from the old segment's end.
        if let Ok(d) = File::open(&self.dir) {
            let _ = d.sync_all();
        }
        self.append = append;
        self.segments.push_back(seg);
        Ok(())
    }

    /// Cuts everything from `offset` on (nothing may be pending): a replicated stream's member
    /// at boot, back to what its group has applied durably, so that the entries after it are
    /// applied again exactly once. Whole segments past it go; the one holding it is cut at the
    /// record. The files are fsynced before it returns.
    pub fn truncate_to(&mut self, offset: u64) -> std::io::Result<()> {
        if offset >= self.next_offset {
            return Ok(());
        }
        self.take_pending();
        while self.segments.len() > 1 && self.segments.back().is_some_and(|s| s.first >= offset) {
            let s = self.segments.pop_back().expect("checked");
            fs::remove_file(&s.path)?;
        }
        let seg = self.segments.back_mut().expect("one segment");
        let size = if offset <= seg.first {
            header_len()
        } else {
            // The position of the record `offset`: scan from an index entry before it.
            let j = seg.index.partition_point(|e| e.offset < offset);
            let mut pos = j.checked_sub(1).map_or(0, |j| seg.index[j].pos);
            loop {
                let plan = ReadPlan {
                    file: seg.file.clone(),
                    pos,
                    end: seg.len,
                    segment: seg.first,
                };
                let (got, end) = read(&plan, READ_BYTES)?;
                if got.is_empty() {
                    break seg.len;
                }
                match got.iter().position(|e| e.offset >= offset) {
                    Some(i) => {
                        // Each record's length from its data: header + kind, seq, ts, data.
                        let skip: u64 = got[..i]
                            .iter()
                            .map(|e| (HEADER_BYTES + 17 + e.data.len()) as u64)
                            .sum();
                        break pos + skip + if pos == 0 { header_of(&seg.file) } else { 0 };
                    }
                    None => pos = end,
                }
            }
        };
        let f = OpenOptions::new().write(true).open(&seg.path)?;
        f.set_len(size)?;
        f.sync_all()?;
        self.append = OpenOptions::new().append(true).open(&seg.path)?;
        seg.len = size.min(seg.len);
        seg.next = offset.max(seg.first);
        seg.index.retain(|e| e.offset < offset);
        self.next_offset = seg.next;
        self.written = seg.next;
        self.last_chunk = self.last_chunk.min(seg.next.saturating_sub(1));
        Ok(())
    }

    /// Drops every segment and starts again, empty, at `first`: a replicated stream's member
    /// whose copy is behind what its group kept (it fetches the rest from another member).
    pub fn reset(&mut self, first: u64) -> std::io::Result<()> {
        self.take_pending();
        let (append, seg) = new_segment(&self.dir, first)?;
        for s in std::mem::take(&mut self.segments) {
            if s.first != first {
                fs::remove_file(&s.path)?;
            }
        }
        if let Ok(d) = File::open(&self.dir) {
            let _ = d.sync_all();
        }
        self.append = append;
        self.segments.push_back(seg);
        self.next_offset = first;
        self.written = first;
        self.last_chunk = first;
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

#[cfg(test)]
mod tests;
