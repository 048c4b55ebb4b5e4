//! The Raft log, vote and committed index, persisted under the group's directory.
//!
//! - `log/<first index, 16 hex digits>.seg`: the entries, one checksummed record each
//!   (bincode, `types::wire`; the record's seq is the entry's index), in segments rotated past
//!   `SEGMENT_BYTES`. Appends are written and fsynced before openraft is told. A damaged tail
//!   (torn write) is cut off at open; a whole record (its checksum holds) that does not decode
//!   is never cut: the open fails on the last one, a read on any other. Purging deletes whole
//!   segments; truncating cuts the segment it falls in and deletes the later ones.
//! - `purged.json`, `vote.json`: small files replaced atomically; `committed.json`: the
//!   committed index, overwritten in place without an fsync (it is written on every commit;
//!   a lost or torn one reads as an older index or none, both safe).
//!
//! Memory holds each entry's offset in its segment (4 bytes) and the newest entries up to
//! `CACHE_BYTES`, which serve replication and apply; older entries are read back from their
//! segment. A replicated queue's message bodies live in its log (the broker's
//! `cluster/quorum/` reads them back through [`LogReader`]), so a long queue is not held in
//! memory. Writes happen on openraft's log task, one at a time; a file write and its fsync run
//! without the lock, so readers are not held up by the disk.
//!
//! Earlier versions kept one file, `raft.log`, wholly in memory: it is converted at open.
//!
//! By job: `recover` opens the store (converting the old single file, cutting a damaged tail,
//! keeping the committed index and vote honest about what is left), `read` reads entries back
//! from the cache or the segments, `write` appends, truncates and purges, `raft` maps openraft's
//! storage traits onto those. This file holds the store's state and what the parts share.

mod raft;
mod read;
mod recover;
mod sync;
mod write;

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::{Entry, EntryPayload, LogId, Vote};

use crate::api::NodeId;
use crate::guard::lock;
use crate::types::{wire, TypeConfig};

// Kinds 1 and 2 are the serde_json records of earlier versions, still read; 3 and 4 are written.
const KIND_ENTRY_JSON: u8 = 1;
const KIND_PURGED_JSON: u8 = 2;
const KIND_ENTRY: u8 = 3;
const KIND_PURGED: u8 = 4;

/// A segment is rotated once it has grown past this.
const SEGMENT_BYTES: u64 = 64 << 20;
/// The newest entries kept in memory (at least the last one).
const CACHE_BYTES: usize = 4 << 20;
/// `committed.json`'s size: its JSON padded with spaces.
const COMMITTED_BYTES: usize = 128;
/// What one read for replication returns at most (at least one entry): a follower that lags
/// far behind catches up in bounded steps.
const REPLICATION_READ_BYTES: usize = 8 << 20;

#[derive(Clone)]
pub(crate) struct LogStore {
    inner: Arc<Mutex<LogInner>>,
}

/// One segment file: entries `first ..` at `offsets`.
struct Segment {
    first: u64,
    path: PathBuf,
    file: Arc<File>,
    offsets: Vec<u32>,
    /// Bytes of whole records in the file.
    len: u64,
}

impl Segment {
    /// The index after its last entry.
    fn end(&self) -> u64 {
        self.first + self.offsets.len() as u64
    }

    /// Where entry `index`'s record starts and where the next one does.
    fn span(&self, index: u64) -> (u64, u64) {
        let i = (index - self.first) as usize;
        let start = u64::from(self.offsets[i]);
        let end = self.offsets.get(i + 1).map_or(self.len, |o| u64::from(*o));
        (start, end)
    }
}

struct LogInner {
    dir: PathBuf,
    vote_path: PathBuf,
    committed_path: PathBuf,
    purged_path: PathBuf,
    segment_bytes: u64,
    segments: VecDeque<Segment>,
    /// The newest entries, consecutive up to the last one, with their encoded sizes.
    cache: VecDeque<(Entry<TypeConfig>, usize)>,
    cache_bytes: usize,
    last: Option<LogId<NodeId>>,
    purged: Option<LogId<NodeId>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    /// `committed.json`, open once it is first written.
    committed_file: Option<File>,
    /// Appends are made durable by the node's sync thread, with other groups' (`sync.rs`),
    /// rather than by an fdatasync of their own in line.
    group_commit: bool,
}

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn decode_entry(kind: u8, data: &[u8]) -> Result<Entry<TypeConfig>, String> {
    if kind == KIND_ENTRY {
        wire::decode(data)
    } else {
        serde_json::from_slice(data).map_err(|e| e.to_string())
    }
}

impl LogStore {
    /// Makes appends durable with other groups' on the node's sync thread (`sync.rs`).
    pub(crate) fn set_group_commit(&self, on: bool) {
        lock(&self.inner).group_commit = on;
    }

    /// A reader of the entries for the state machine's own use (see [`LogReader`]).
    pub(crate) fn reader(&self) -> LogReader {
        LogReader {
            store: self.clone(),
        }
    }
}

/// Reads a group's entries back in order, for its state machine (a replicated queue reads its
/// message bodies here rather than keeping them in memory). Only entries that are applied
/// and not purged should be asked for.
#[derive(Clone)]
pub struct LogReader {
    store: LogStore,
}

impl LogReader {
    /// Entries from `from` on, about `max_bytes` of them (at least one if there is any): each
    /// index with its command (`None` for Raft's own entries).
    pub fn read(
        &self,
        from: u64,
        max_bytes: usize,
    ) -> io::Result<Vec<(u64, Option<bytes::Bytes>)>> {
        let entries = self.store.read_range(from, u64::MAX, max_bytes)?;
        Ok(entries
            .into_iter()
            .map(|e| {
                let cmd = match e.payload {
                    EntryPayload::Normal(b) => Some(b.0),
                    _ => None,
                };
                (e.log_id.index, cmd)
            })
            .collect())
    }
}

impl LogInner {
    /// Overwrites `committed.json` in place, padded to `COMMITTED_BYTES` so that a shorter
    /// value leaves no tail of a longer one, without an fsync: the page cache keeps it across
    /// a crash of the process, and a power cut leaves an older value, a lower index that is
    /// still true (the entries up to it are fsynced first), or a torn one, read as none
    /// (`read_committed_file`).
    fn write_committed(&mut self, committed: Option<LogId<NodeId>>) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut bytes = serde_json::to_vec(&committed).map_err(other)?;
        if bytes.len() < COMMITTED_BYTES {
            bytes.resize(COMMITTED_BYTES, b' ');
        }
        let f = match &mut self.committed_file {
            Some(f) => f,
            None => self.committed_file.insert(
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&self.committed_path)?,
            ),
        };
        f.write_all_at(&bytes, 0)
    }

    /// The first index the log holds.
    fn first_index(&self) -> u64 {
        self.purged.map_or(0, |p| p.index + 1)
    }

    fn push_cache(&mut self, entry: Entry<TypeConfig>, size: usize) {
        self.cache_bytes += size;
        self.cache.push_back((entry, size));
        while self.cache_bytes > CACHE_BYTES && self.cache.len() > 1 {
            if let Some((_, s)) = self.cache.pop_front() {
                self.cache_bytes -= s;
            }
        }
    }
}

/// What the tests of every part share: entries, a fresh directory, the first segment's path.
#[cfg(test)]
mod testutil {
    use std::path::{Path, PathBuf};

    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftLogReader};

    use super::LogStore;
    use crate::types::{Blob, TypeConfig};

    pub(super) fn entry(index: u64, text: &str) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Blob(bytes::Bytes::copy_from_slice(text.as_bytes()))),
        }
    }

    pub(super) fn dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("warren-cluster-log-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }

    pub(super) fn seg0(d: &Path) -> PathBuf {
        d.join("log").join(format!("{:016x}.seg", 0))
    }

    pub(super) async fn indexes(store: &mut LogStore) -> Vec<u64> {
        store
            .try_get_log_entries(..)
            .await
            .expect("read")
            .iter()
            .map(|e| e.log_id.index)
            .collect()
    }
}
