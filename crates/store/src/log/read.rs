//! Paging back in: a long queue drops its copy of the messages it does not hold in memory and
//! reads them back from the log in order, in large sequential reads that continue into what is
//! still buffered. A [`Cursor`] says where the next read starts; the caller's `keep` says which
//! enqueues are still in the queue.

use std::fs::File;
use std::os::unix::fs::FileExt;

use bytes::Bytes;

use super::{Cursor, QueueLog};
use crate::record::{self, Scan, KIND_ENQUEUE, KIND_VOLATILE};

/// Smallest read issued when paging messages back in.
const READ_CHUNK_BYTES: u64 = 256 * 1024;

impl<T> QueueLog<T> {
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
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::log::QueueLog;

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
        // A cursor made from a seq alone reads from the first segment and skips what is below.
        let mut c = crate::log::Cursor::from_seq(38);
        assert_eq!(
            read_all(&log, &mut c, |_| true),
            (38..43).collect::<Vec<_>>()
        );
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
}
