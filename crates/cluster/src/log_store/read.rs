//! Reading entries back: the newest ones from the in-memory cache, older ones from their
//! segment at the offset kept for each. A read is planned under the lock and the files are read
//! without it, so replication and apply are not held up by the disk; a byte budget bounds what
//! one read returns (at least one entry), so a far-behind follower catches up in steps.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::Bytes;
use openraft::Entry;
use warren_store::record;

use super::{decode_entry, other, LogInner, LogStore};
use crate::guard::lock;
use crate::types::TypeConfig;

/// What a read takes from one segment: `count` entries from `first`, in `len` bytes at `at`.
struct Chunk {
    file: Arc<File>,
    first: u64,
    count: usize,
    at: u64,
    len: usize,
}

impl LogInner {
    /// Reads one entry from its segment, under the lock (for the rare truncate).
    pub(super) fn read_one(&self, index: u64) -> io::Result<Option<Entry<TypeConfig>>> {
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

impl LogStore {
    /// Entries in `[start, end)` that the log holds, about `max_bytes` of them at most (at least
    /// one). Plans under the lock, reads the files without it.
    pub(super) fn read_range(
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
                // The cache is consecutive: `at`'s entry is `at - cache_first` in.
                let skip = (at - cache_first) as usize;
                for (e, size) in inner.cache.range(skip.min(inner.cache.len())..) {
                    let i = e.log_id.index;
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
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
    use openraft::{CommittedLeaderId, EntryPayload, LogId, RaftLogReader};

    use super::super::testutil::*;
    use super::super::LogStore;

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
        assert!(matches!(&got[1].payload, EntryPayload::Normal(b) if b.0[..] == b"z"[..]));
        let _ = std::fs::remove_dir_all(&d);
    }
}
