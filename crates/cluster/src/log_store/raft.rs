//! openraft's log storage traits, mapped onto the store's own reads and writes: a replication
//! read is bounded in bytes, an append tells openraft once it is fsynced, the vote is a small
//! file replaced atomically, and the committed index one overwritten in place.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    AnyError, Entry, LogId, LogState, RaftLogReader, StorageError, StorageIOError, Vote,
};
use warren_store::snapshot;

use super::{LogStore, REPLICATION_READ_BYTES};
use crate::api::NodeId;
use crate::guard::lock;
use crate::types::TypeConfig;

type StorageResult<T> = Result<T, StorageError<NodeId>>;

fn bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(s) => *s,
        Bound::Excluded(s) => s + 1,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(e) => e.saturating_add(1),
        Bound::Excluded(e) => *e,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let (start, end) = bounds(&range);
        self.read_range(start, end, usize::MAX)
            .map_err(|e| StorageIOError::read_logs(&e).into())
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        self.read_range(start, end, REPLICATION_READ_BYTES)
            .map_err(|e| StorageIOError::read_logs(&e).into())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let inner = lock(&self.inner);
        Ok(LogState {
            last_purged_log_id: inner.purged,
            last_log_id: inner.last.or(inner.purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        // Not durable before an append openraft made first (its writes are to be in order).
        // openraft 0.9's core waits for each append's flush before its next command, so this
        // finds nothing to do today; it keeps the order from depending on that.
        if lock(&self.inner).group_commit {
            self.sync_last()
                .map_err(|e| StorageIOError::write_vote(&e))?;
        }
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

    // Kept so that a restarted node re-applies its committed entries on its own, without
    // waiting for a leader to tell it what is committed, and so that a log cut below it is
    // caught at open. Written in place without an fsync (`write_committed`): openraft calls
    // this on every commit, and an atomic replace (two fsyncs, a create and a rename) per
    // commit was 40% of a node's CPU with 100 quorum queues at a low rate each (the sizing
    // study, docs/benchmarks.md). A value lost to a power cut is only an older, lower one.
    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        let mut inner = lock(&self.inner);
        if inner.committed == committed {
            return Ok(());
        }
        inner
            .write_committed(committed)
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
        // openraft is told once the entries are durable, possibly after this returns (group
        // commit, `sync.rs`); a write that fails fails the append at once.
        let done = Box::new(move |r: io::Result<()>| callback.log_io_completed(r));
        self.append_entries(entries, done)
            .map_err(|e| StorageIOError::write_logs(AnyError::new(&e)).into())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        self.truncate_from(log_id.index)
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        self.purge_upto(log_id)
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }
}
