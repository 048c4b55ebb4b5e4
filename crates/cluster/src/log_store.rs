//! The Raft log, vote and committed index, persisted under the node's directory.
//!
//! - `raft.log`: checksummed records, one per entry (bincode, `types::wire`), optionally led by
//!   a record naming the last purged log id. Appends are written and fsynced before openraft is
//!   told; truncation and purging rewrite the whole file atomically (metadata logs are small and
//!   these are rare). A damaged tail (torn write) is cut off at open.
//! - `vote.json`, `committed.json`: small files replaced atomically.
//!
//! All entries are also kept in memory. File I/O is done inline on the calling task: writes are
//! small and the metadata rate is low.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    AnyError, Entry, LogId, LogState, RaftLogReader, StorageError, StorageIOError, Vote,
};
use warren_store::{record, snapshot};

use crate::types::{wire, TypeConfig};
use crate::{lock, NodeId};

// Kinds 1 and 2 are the serde_json records of earlier versions, still read; 3 and 4 are written.
const KIND_ENTRY_JSON: u8 = 1;
const KIND_PURGED_JSON: u8 = 2;
const KIND_ENTRY: u8 = 3;
const KIND_PURGED: u8 = 4;

type StorageResult<T> = Result<T, StorageError<NodeId>>;

#[derive(Clone)]
pub(crate) struct LogStore {
    inner: Arc<Mutex<LogInner>>,
}

struct LogInner {
    log_path: PathBuf,
    vote_path: PathBuf,
    committed_path: PathBuf,
    /// Append handle; `None` after a rewrite replaced the file.
    file: Option<File>,
    /// Bytes of valid records in the log file.
    len: u64,
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    purged: Option<LogId<NodeId>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
}

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

impl LogStore {
    pub(crate) fn open(dir: &Path) -> io::Result<LogStore> {
        let log_path = dir.join("raft.log");
        let vote_path = dir.join("vote.json");
        let committed_path = dir.join("committed.json");
        let vote: Option<Vote<NodeId>> = match snapshot::read(&vote_path)? {
            Some(b) => Some(serde_json::from_slice(&b).map_err(other)?),
            None => None,
        };
        let committed: Option<LogId<NodeId>> = match snapshot::read(&committed_path)? {
            Some(b) => serde_json::from_slice(&b).map_err(other)?,
            None => None,
        };
        let (entries, purged, len) = recover(&log_path)?;
        let committed_before = committed;
        // A log cut shorter than what was known committed (a damaged tail that had been
        // fsynced: the disk lost acknowledged data) must not claim entries it no longer has:
        // this node holds what is left, and the leader sends it the rest.
        let last = entries
            .last_key_value()
            .map(|(_, e): (_, &Entry<TypeConfig>)| e.log_id)
            .or(purged);
        let committed = match committed {
            Some(c) if last.is_none_or(|l: LogId<NodeId>| l.index < c.index) => {
                tracing::warn!(
                    path = %log_path.display(),
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
                log_path,
                vote_path,
                committed_path,
                file: None,
                len,
                entries,
                purged,
                vote,
                committed,
            })),
        })
    }
}

type Recovered = (BTreeMap<u64, Entry<TypeConfig>>, Option<LogId<NodeId>>, u64);

/// Reads the log file, keeping the longest valid prefix and cutting the rest off the file.
fn recover(path: &Path) -> io::Result<Recovered> {
    let mut entries = BTreeMap::new();
    let mut purged = None;
    let Some(data) = snapshot::read(path)? else {
        return Ok((entries, purged, 0));
    };
    let data = Bytes::from(data);
    let mut at = 0;
    while at < data.len() {
        let record::Scan::Record(r, next) = record::scan(&data, at) else {
            break;
        };
        // A record whose checksum holds but does not decode is not a torn write: refuse to
        // start rather than cut acknowledged entries off.
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
                let entry: Entry<TypeConfig> = if r.kind == KIND_ENTRY {
                    wire::decode(&r.data)
                } else {
                    serde_json::from_slice(&r.data).map_err(|e| e.to_string())
                }
                .map_err(undecodable)?;
                // Entries are consecutive; anything else is damage, never a valid suffix.
                let index = entry.log_id.index;
                if entries
                    .last_key_value()
                    .is_some_and(|(last, _)| *last + 1 != index)
                {
                    break;
                }
                entries.insert(index, entry);
            }
            _ => break,
        }
        at = next;
    }
    if at < data.len() {
        tracing::warn!(
            path = %path.display(),
            kept = at,
            dropped = data.len() - at,
            "raft log has a damaged tail; cutting it off"
        );
        let f = OpenOptions::new().write(true).open(path)?;
        f.set_len(at as u64)?;
        f.sync_all()?;
    }
    Ok((entries, purged, at as u64))
}

impl LogInner {
    fn last_index(&self) -> Option<u64> {
        self.entries.last_key_value().map(|(i, _)| *i)
    }

    /// Writes the whole file anew: the purged marker, then every entry.
    fn rewrite(&mut self) -> io::Result<()> {
        let mut buf = BytesMut::new();
        if let Some(p) = &self.purged {
            record::encode(&mut buf, KIND_PURGED, p.index, &wire::encode(p));
        }
        for (index, e) in &self.entries {
            record::encode(&mut buf, KIND_ENTRY, *index, &wire::encode(e));
        }
        self.file = None;
        snapshot::write_atomic(&self.log_path, &buf)?;
        self.len = buf.len() as u64;
        Ok(())
    }

    fn append(&mut self, entries: Vec<Entry<TypeConfig>>) -> io::Result<()> {
        let Some(first) = entries.first().map(|e| e.log_id.index) else {
            return Ok(());
        };
        // openraft truncates conflicts before appending; this keeps the file consecutive anyway.
        if self.last_index().is_some_and(|last| last >= first) {
            self.entries.split_off(&first);
            self.rewrite()?;
        }
        let mut buf = BytesMut::new();
        for e in &entries {
            record::encode(&mut buf, KIND_ENTRY, e.log_id.index, &wire::encode(e));
        }
        if self.file.is_none() {
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log_path)?;
            // A fresh file needs its directory entry to be durable too.
            if let Some(dir) = self.log_path.parent() {
                File::open(dir)?.sync_all()?;
            }
            self.file = Some(f);
        }
        let file = self.file.as_mut().ok_or_else(|| other("no log file"))?;
        let written = file.write_all(&buf).and_then(|_| file.sync_data());
        if let Err(e) = written {
            // Cut a partial write so that later appends do not follow garbage.
            let _ = file.set_len(self.len);
            self.file = None;
            return Err(e);
        }
        self.len += buf.len() as u64;
        for e in entries {
            self.entries.insert(e.log_id.index, e);
        }
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let inner = lock(&self.inner);
        Ok(inner.entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let inner = lock(&self.inner);
        let last = inner
            .entries
            .last_key_value()
            .map(|(_, e)| e.log_id)
            .or(inner.purged);
        Ok(LogState {
            last_purged_log_id: inner.purged,
            last_log_id: last,
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
        let res = lock(&self.inner).append(entries);
        match res {
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
        let mut inner = lock(&self.inner);
        inner.entries.split_off(&log_id.index);
        inner
            .rewrite()
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        let mut inner = lock(&self.inner);
        let kept = inner.entries.split_off(&(log_id.index + 1));
        inner.entries = kept;
        inner.purged = Some(log_id);
        inner
            .rewrite()
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
            .open(d.join("raft.log"))
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
            .open(d.join("raft.log"))
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
        let path = d.join("raft.log");
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
            .open(d.join("raft.log"))
            .expect("open log");
        f.write_all(&rec).expect("write");
        drop(f);
        let len = std::fs::metadata(d.join("raft.log")).expect("stat").len();
        let e = LogStore::open(&d).err().expect("refused");
        assert!(e.to_string().contains("does not decode"), "{e}");
        assert_eq!(
            std::fs::metadata(d.join("raft.log")).expect("stat").len(),
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
}
