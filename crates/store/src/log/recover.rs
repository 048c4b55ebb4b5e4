//! Recovery: opening a log scans every segment once and says which enqueues on disk are still
//! in the queue ([`Recovery`], its live seqs as runs in a [`LiveSet`](super::LiveSet)). A torn
//! tail of the last segment is truncated; a corrupt record elsewhere is skipped (scanning
//! resumes at the next plausible record header). Invariant: an ack record is always in the same
//! or a later segment than its enqueue, so one pass in segment order sees each enqueue before
//! its ack.

use std::collections::VecDeque;
use std::fs::{self, OpenOptions};
use std::path::Path;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::{empty_segment, open_append, segment_ids, QueueLog, Recovery, Segment};
use crate::record::{self, Scan, KIND_ACK, KIND_ACK_RANGE, KIND_ENQUEUE, KIND_VOLATILE};

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
    use std::fs::{self, OpenOptions};
    use std::io::Write;

    use bytes::BytesMut;

    use super::super::testutil::*;
    use crate::log::{segment_path, QueueLog};
    use crate::record::{self, KIND_ENQUEUE};

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
}
