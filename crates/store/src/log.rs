//! A durable queue's log: segment files `<id>.seg` holding enqueue and ack records.
//!
//! Appends are buffered in memory and written in groups by [`QueueLog::write_pending`]; the caller
//! then fsyncs the files it returns (group commit). An enqueue acked while still buffered is
//! dropped from the buffer and never written. Segments are reclaimed oldest first once every
//! message in them is acked: an ack record always lives in the same or a later segment than its
//! enqueue, so deleting a fully acked prefix can never resurrect a message.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::record::{self, Scan, KIND_ACK, KIND_ENQUEUE};

/// A segment is rotated once it has grown past this.
pub const SEGMENT_BYTES: u64 = 16 * 1024 * 1024;
/// A fully acked current segment at least this big is replaced by a fresh one.
pub const DRAINED_ROTATE_BYTES: u64 = 1024 * 1024;

/// What a group write produced: the tokens of the enqueues written, and the files to fsync
/// before acting on them. On error, the tokens of the enqueues that were not written.
pub type Written<T> = Result<(Vec<T>, Vec<Arc<File>>), (std::io::Error, Vec<T>)>;

/// A message found on disk at recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    pub seq: u64,
    pub data: Bytes,
}

#[derive(Debug)]
struct Segment {
    id: u64,
    path: PathBuf,
    /// Range of enqueue seqs written here (seqs only grow, so ranges do not overlap).
    first_seq: u64,
    last_seq: u64,
    /// Enqueues here not yet acked.
    live: u64,
}

/// One queue's log. `T` is a token carried with each buffered enqueue (the broker's publisher
/// confirm), handed back once the enqueue is written, or when an ack cancels it.
pub struct QueueLog<T> {
    dir: PathBuf,
    segments: VecDeque<Segment>,
    file: Arc<File>,
    size: u64,
    pending_enqueues: VecDeque<(u64, Bytes, Option<T>)>,
    pending_acks: Vec<u64>,
    /// Files written since the last `write_pending` returned them (rotated ones included).
    unsynced: Vec<Arc<File>>,
    buf: BytesMut,
    /// Bytes written since the log was opened, for the persister's statistics.
    pub bytes_written: u64,
}

fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:016x}.seg"))
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl<T> QueueLog<T> {
    /// Opens (creating if needed) the log in `dir` and returns the messages it holds, in seq
    /// order. A torn tail is truncated; a corrupt record elsewhere is logged and skipped.
    pub fn open(dir: &Path) -> std::io::Result<(QueueLog<T>, Vec<Recovered>)> {
        fs::create_dir_all(dir)?;
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
        let mut live: BTreeMap<u64, Bytes> = BTreeMap::new();
        let mut segments: VecDeque<Segment> = VecDeque::new();
        let n = ids.len();
        for (i, id) in ids.into_iter().enumerate() {
            let path = segment_path(dir, id);
            let bytes = Bytes::from(fs::read(&path)?);
            let mut seg = Segment {
                id,
                path: path.clone(),
                first_seq: u64::MAX,
                last_seq: 0,
                live: 0,
            };
            let mut at = 0usize;
            while at < bytes.len() {
                match record::scan(&bytes, at) {
                    Scan::Record(r, next) => {
                        match r.kind {
                            KIND_ENQUEUE => {
                                seg.first_seq = seg.first_seq.min(r.seq);
                                seg.last_seq = seg.last_seq.max(r.seq);
                                seg.live += 1;
                                live.insert(r.seq, r.data);
                            }
                            KIND_ACK => {
                                if live.remove(&r.seq).is_some() {
                                    if let Some(s) = segments
                                        .iter_mut()
                                        .chain(std::iter::once(&mut seg))
                                        .find(|s| s.first_seq <= r.seq && r.seq <= s.last_seq)
                                    {
                                        s.live = s.live.saturating_sub(1);
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
                                }
                                break;
                            }
                        }
                    }
                }
            }
            segments.push_back(seg);
        }
        let recovered = live
            .into_iter()
            .map(|(seq, data)| Recovered { seq, data })
            .collect();
        let (file, size) = match segments.back() {
            Some(s) => {
                let f = open_append(&s.path)?;
                let size = f.metadata()?.len();
                (f, size)
            }
            None => {
                let path = segment_path(dir, 0);
                segments.push_back(Segment {
                    id: 0,
                    path: path.clone(),
                    first_seq: u64::MAX,
                    last_seq: 0,
                    live: 0,
                });
                (open_append(&path)?, 0)
            }
        };
        let mut log = QueueLog {
            dir: dir.to_path_buf(),
            segments,
            file: Arc::new(file),
            size,
            pending_enqueues: VecDeque::new(),
            pending_acks: Vec::new(),
            unsynced: Vec::new(),
            buf: BytesMut::new(),
            bytes_written: 0,
        };
        log.reclaim();
        Ok((log, recovered))
    }

    /// Buffers an enqueue record. Seqs must be increasing.
    pub fn enqueue(&mut self, seq: u64, data: Bytes, token: Option<T>) {
        debug_assert!(
            self.pending_enqueues
                .back()
                .is_none_or(|(s, _, _)| *s < seq),
            "enqueue seqs must increase"
        );
        self.pending_enqueues.push_back((seq, data, token));
    }

    /// Records that `seq` left the queue. If its enqueue is still buffered it is dropped unwritten
    /// and its token returned; otherwise an ack record is buffered.
    pub fn ack(&mut self, seq: u64) -> Option<T> {
        if let Ok(i) = self
            .pending_enqueues
            .binary_search_by_key(&seq, |(s, _, _)| *s)
        {
            return self.pending_enqueues.remove(i).and_then(|(_, _, t)| t);
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

    pub fn has_pending(&self) -> bool {
        !self.pending_enqueues.is_empty() || !self.pending_acks.is_empty()
    }

    /// Writes everything buffered (one write call) and returns the tokens of the enqueues written
    /// and the files the caller must fsync before acting on those tokens. On a write error (disk
    /// full) the file is cut back to its last good size and the tokens come back with the error:
    /// those enqueues are not durable and must not be confirmed.
    pub fn write_pending(&mut self) -> Written<T> {
        match self.try_write() {
            Ok(r) => Ok(r),
            Err((e, tokens)) => {
                let _ = self.file.set_len(self.size);
                Err((e, tokens))
            }
        }
    }

    fn try_write(&mut self) -> Written<T> {
        let mut tokens = Vec::new();
        if self.has_pending() {
            if self.size >= SEGMENT_BYTES {
                if let Err(e) = self.rotate() {
                    let tokens = self
                        .pending_enqueues
                        .drain(..)
                        .filter_map(|(_, _, t)| t)
                        .collect();
                    return Err((e, tokens));
                }
            }
            self.buf.clear();
            let seg = self
                .segments
                .back_mut()
                .expect("the current segment exists");
            for (seq, data, token) in self.pending_enqueues.drain(..) {
                record::encode(&mut self.buf, KIND_ENQUEUE, seq, &data);
                seg.first_seq = seg.first_seq.min(seq);
                seg.last_seq = seg.last_seq.max(seq);
                seg.live += 1;
                tokens.extend(token);
            }
            for seq in self.pending_acks.drain(..) {
                record::encode(&mut self.buf, KIND_ACK, seq, &[]);
            }
            if let Err(e) = (&*self.file).write_all(&self.buf) {
                return Err((e, tokens));
            }
            self.size += self.buf.len() as u64;
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
        if self.size >= DRAINED_ROTATE_BYTES && self.segments.iter().all(|s| s.live == 0) {
            if let Err(e) = self.rotate() {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot start a new segment");
            }
        }
        self.reclaim();
        Ok((tokens, std::mem::take(&mut self.unsynced)))
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        let id = self.segments.back().map_or(0, |s| s.id + 1);
        let path = segment_path(&self.dir, id);
        self.file = Arc::new(open_append(&path)?);
        self.size = 0;
        self.segments.push_back(Segment {
            id,
            path,
            first_seq: u64::MAX,
            last_seq: 0,
            live: 0,
        });
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
            .filter_map(|(_, _, t)| t)
            .collect();
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot remove queue log");
        }
        tokens
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

    fn data(i: u64) -> Bytes {
        Bytes::from(format!("message-{i}"))
    }

    #[test]
    fn acked_before_write_is_never_written() {
        let dir = tmp("skip");
        let (mut log, rec) = QueueLog::<u64>::open(&dir).expect("open");
        assert!(rec.is_empty());
        log.enqueue(1, data(1), Some(10));
        log.enqueue(2, data(2), Some(20));
        assert_eq!(log.ack(1), Some(10), "cancelled while buffered");
        let (tokens, files) = log
            .write_pending()
            .unwrap_or_else(|(e, _)| panic!("write: {e}"));
        assert_eq!(tokens, vec![20]);
        assert_eq!(files.len(), 1);
        drop(log);
        let (_, rec) = QueueLog::<u64>::open(&dir).expect("reopen");
        assert_eq!(
            rec,
            vec![Recovered {
                seq: 2,
                data: data(2)
            }]
        );
    }

    #[test]
    fn acks_survive_and_torn_tail_is_truncated() {
        let dir = tmp("torn");
        let (mut log, _) = QueueLog::<()>::open(&dir).expect("open");
        for i in 1..=3 {
            log.enqueue(i, data(i), None);
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
        let (mut log, rec) = QueueLog::<()>::open(&dir).expect("reopen");
        assert_eq!(rec.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(
            fs::metadata(&seg).expect("meta").len(),
            len,
            "tail truncated"
        );
        log.enqueue(5, data(5), None);
        log.write_pending()
            .unwrap_or_else(|(e, _)| panic!("write: {e}"));
        drop(log);
        let (_, rec) = QueueLog::<()>::open(&dir).expect("reopen");
        assert_eq!(rec.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 3, 5]);
    }

    #[test]
    fn corrupt_record_in_the_middle_is_skipped() {
        let dir = tmp("corrupt");
        let (mut log, _) = QueueLog::<()>::open(&dir).expect("open");
        for i in 1..=3 {
            log.enqueue(i, data(i), None);
        }
        log.write_pending()
            .unwrap_or_else(|(e, _)| panic!("write: {e}"));
        drop(log);
        let seg = segment_path(&dir, 0);
        let mut bytes = fs::read(&seg).expect("read");
        let first = record::HEADER_BYTES + 9 + data(1).len();
        bytes[first + record::HEADER_BYTES + 12] ^= 0xff; // inside record 2's payload
        fs::write(&seg, &bytes).expect("write");
        let (_, rec) = QueueLog::<()>::open(&dir).expect("reopen");
        assert_eq!(rec.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 3]);
    }

    #[test]
    fn fully_acked_segments_are_deleted() {
        let dir = tmp("reclaim");
        let (mut log, _) = QueueLog::<()>::open(&dir).expect("open");
        let big = Bytes::from(vec![0u8; 1024 * 1024]);
        for i in 0..40 {
            log.enqueue(i, big.clone(), None);
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
        let (_, rec) = QueueLog::<()>::open(&dir).expect("reopen");
        assert!(rec.is_empty());
    }
}
