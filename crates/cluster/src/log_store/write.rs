//! Changing the log: appends are written (whole entries up to a segment's size per write,
//! rotating to a new segment past it) and made durable before openraft is told, by an
//! fdatasync here or by the node's sync thread with other groups' appends (`sync.rs`);
//! truncation cuts the segment it falls in and deletes the later ones, and purging deletes
//! whole segments once the purge point is durable. Writes happen on openraft's log task, one at
//! a time; an append's file write and fsync run without the lock, so readers are not held up by
//! the disk.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::BytesMut;
use openraft::{Entry, LogId};
use warren_store::{record, segment_path, snapshot};

use super::{other, sync, sync_dir, LogStore, Segment, KIND_ENTRY};
use crate::api::NodeId;
use crate::guard::lock;
use crate::types::{wire, TypeConfig};

impl LogStore {
    /// Appends `entries` and makes them durable: `done` is called once they are, here or (with
    /// group commit) on the node's sync thread. An error writing them is returned, and given
    /// to `done` too.
    pub(super) fn append_entries(
        &self,
        entries: Vec<Entry<TypeConfig>>,
        done: Box<dyn FnOnce(io::Result<()>) + Send>,
    ) -> io::Result<()> {
        let files = match self.write_entries(entries) {
            Ok(f) => f,
            Err(e) => {
                done(Err(io::Error::new(e.kind(), e.to_string())));
                return Err(e);
            }
        };
        if lock(&self.inner).group_commit && !files.is_empty() {
            sync::submit(sync::Job { files, done });
        } else {
            done(sync::sync_each(&files));
        }
        Ok(())
    }

    /// Writes `entries` through the page cache: the files written, not yet durable.
    fn write_entries(&self, entries: Vec<Entry<TypeConfig>>) -> io::Result<Vec<Arc<File>>> {
        let mut files: Vec<Arc<File>> = Vec::new();
        let Some(first) = entries.first().map(|e| e.log_id.index) else {
            return Ok(files);
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
            record::encode_with(&mut buf, KIND_ENTRY, e.log_id.index, |b| {
                wire::encode_into(b, e)
            });
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
            if let Err(e) = file.write_all_at(&buf[at[i]..at[j]], len) {
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
            if !files.iter().any(|f| Arc::ptr_eq(f, &file)) {
                files.push(file);
            }
            i = j;
        }
        let mut inner = lock(&self.inner);
        for (k, e) in entries.into_iter().enumerate() {
            inner.last = Some(e.log_id);
            inner.push_cache(e, at[k + 1] - at[k]);
        }
        Ok(files)
    }

    /// Makes what was written to the last segment durable now (an fdatasync), so that a write
    /// after it (a vote) is not durable before an append openraft made first.
    pub(super) fn sync_last(&self) -> io::Result<()> {
        let file = lock(&self.inner).segments.back().map(|s| s.file.clone());
        match file {
            Some(f) => f.sync_data(),
            None => Ok(()),
        }
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
    pub(super) fn truncate_from(&self, index: u64) -> io::Result<()> {
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

    pub(super) fn purge_upto(&self, log_id: LogId<NodeId>) -> io::Result<()> {
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

#[cfg(test)]
mod tests {
    use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
    use openraft::{CommittedLeaderId, LogId, Vote};

    use super::super::testutil::*;
    use super::super::LogStore;

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
}
