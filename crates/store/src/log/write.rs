//! The write path: enqueues and acks are buffered, then written in groups by
//! [`QueueLog::write_pending`], which hands back the files the caller must fsync (group commit).
//! An enqueue acked while still buffered is dropped unwritten. Segments rotate past
//! [`SEGMENT_BYTES`](super::SEGMENT_BYTES) and are reclaimed oldest first once fully acked.
//! Invariant: an ack record is always written to the same or a later segment than its enqueue,
//! so deleting a fully acked prefix can never resurrect a message.

use std::fs;
use std::io::Write;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::{
    empty_segment, open_append, Pending, QueueLog, Written, DRAINED_ROTATE_BYTES, SEGMENT_BYTES,
};
use crate::record::{self, Scan, KIND_ACK, KIND_ACK_RANGE, KIND_ENQUEUE, KIND_VOLATILE};

impl<T> QueueLog<T> {
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
    pub(super) fn reclaim(&mut self) {
        while self.segments.len() > 1 && self.segments.front().is_some_and(|s| s.live == 0) {
            if let Some(s) = self.segments.pop_front() {
                if let Err(e) = fs::remove_file(&s.path) {
                    tracing::warn!(segment = %s.path.display(), error = %e, "cannot delete acked segment");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::super::testutil::*;
    use crate::log::QueueLog;

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
