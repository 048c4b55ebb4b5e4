//! Opening the store: the vote, committed index and purge point are read back, an earlier
//! version's single file is converted into segments, and the segments are scanned for the
//! longest valid run of entries. Invariant: a damaged tail is cut, but a whole record whose
//! checksum holds and that does not decode is never cut (the open fails); and a log cut below
//! its committed index lowers that index and uncommits the vote, so the node does not lead with
//! entries it no longer has.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use openraft::{Entry, LogId, Vote};
use warren_store::{record, segment_ids, segment_path, snapshot};

use super::{
    decode_entry, other, sync_dir, LogInner, LogStore, Segment, KIND_ENTRY, KIND_ENTRY_JSON,
    KIND_PURGED, KIND_PURGED_JSON, SEGMENT_BYTES,
};
use crate::api::NodeId;
use crate::types::{wire, TypeConfig};

impl LogStore {
    pub(crate) fn open(dir: &Path) -> io::Result<LogStore> {
        Self::open_with(dir, SEGMENT_BYTES)
    }

    pub(super) fn open_with(dir: &Path, segment_bytes: u64) -> io::Result<LogStore> {
        let log_dir = dir.join("log");
        std::fs::create_dir_all(&log_dir)?;
        let vote_path = dir.join("vote.json");
        let committed_path = dir.join("committed.json");
        let purged_path = dir.join("purged.json");
        convert_single_file(dir, &log_dir, &purged_path)?;
        let vote: Option<Vote<NodeId>> = match snapshot::read(&vote_path)? {
            Some(b) => Some(serde_json::from_slice(&b).map_err(other)?),
            None => None,
        };
        let committed = read_committed_file(&committed_path)?;
        let purged: Option<LogId<NodeId>> = match snapshot::read(&purged_path)? {
            Some(b) => serde_json::from_slice(&b).map_err(other)?,
            None => None,
        };
        let (segments, last_entry) = recover(&log_dir, purged)?;
        let last = last_entry.or(purged);
        let committed_before = committed;
        // A log cut shorter than what was known committed (a damaged tail that had been
        // fsynced: the disk lost acknowledged data) must not claim entries it no longer has:
        // this node holds what is left, and the leader sends it the rest.
        let committed = match committed {
            Some(c) if last.is_none_or(|l: LogId<NodeId>| l.index < c.index) => {
                tracing::warn!(
                    path = %log_dir.display(),
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
                dir: log_dir,
                vote_path,
                committed_path,
                purged_path,
                segment_bytes,
                segments,
                cache: VecDeque::new(),
                cache_bytes: 0,
                last,
                purged,
                vote,
                committed,
                committed_file: None,
                group_commit: false,
            })),
        })
    }
}

/// The committed index `committed.json` holds: none when there is no file, or when a power
/// cut tore its in-place write (it is not fsynced: `LogInner::write_committed`), which only
/// makes this node wait for its leader to say what is committed.
fn read_committed_file(path: &Path) -> io::Result<Option<LogId<NodeId>>> {
    let Some(b) = snapshot::read(path)? else {
        return Ok(None);
    };
    match serde_json::from_slice(&b) {
        Ok(c) => Ok(c),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "committed index unreadable; reading it as none");
            Ok(None)
        }
    }
}

/// Converts the single-file log of earlier versions into segments.
fn convert_single_file(dir: &Path, log_dir: &Path, purged_path: &Path) -> io::Result<()> {
    let old = dir.join("raft.log");
    let Some(data) = snapshot::read(&old)? else {
        return Ok(());
    };
    let (entries, purged) = read_single_file(&old, data)?;
    if let Some(first) = entries.first() {
        let mut buf = BytesMut::new();
        for e in &entries {
            record::encode(&mut buf, KIND_ENTRY, e.log_id.index, &wire::encode(e));
        }
        snapshot::write_atomic(&segment_path(log_dir, first.log_id.index), &buf)?;
    }
    let bytes = serde_json::to_vec(&purged).map_err(other)?;
    snapshot::write_atomic(purged_path, &bytes)?;
    std::fs::remove_file(&old)?;
    sync_dir(dir)
}

type SingleFile = (Vec<Entry<TypeConfig>>, Option<LogId<NodeId>>);

/// The entries of an earlier version's single file: the longest valid prefix.
fn read_single_file(path: &Path, data: Vec<u8>) -> io::Result<SingleFile> {
    let data = Bytes::from(data);
    let mut entries: Vec<Entry<TypeConfig>> = Vec::new();
    let mut purged = None;
    let mut at = 0;
    while at < data.len() {
        let record::Scan::Record(r, next) = record::scan(&data, at) else {
            break;
        };
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
                let entry = decode_entry(r.kind, &r.data).map_err(undecodable)?;
                if entries
                    .last()
                    .is_some_and(|l| l.log_id.index + 1 != entry.log_id.index)
                {
                    break;
                }
                entries.push(entry);
            }
            _ => break,
        }
        at = next;
    }
    Ok((entries, purged))
}

/// Opens the segments, keeping the longest valid run of entries and cutting the rest off (a
/// torn tail; any damage before it cuts there too, and the later segments go). Returns them and
/// the last entry's id.
fn recover(
    dir: &Path,
    purged: Option<LogId<NodeId>>,
) -> io::Result<(VecDeque<Segment>, Option<LogId<NodeId>>)> {
    let firsts = segment_ids(dir)?;
    let mut segments: VecDeque<Segment> = VecDeque::new();
    let mut last: Option<LogId<NodeId>> = None;
    let mut cut = false;
    for first in firsts {
        let path = segment_path(dir, first);
        if cut {
            tracing::warn!(path = %path.display(), "removing a raft log segment after damage");
            std::fs::remove_file(&path)?;
            continue;
        }
        // Segments must follow on from each other (and from what was purged).
        let expected = segments
            .back()
            .map(Segment::end)
            .or(purged.map(|p| p.index + 1));
        let starts_well = match expected {
            Some(e) => segments.is_empty() && first <= e || first == e,
            None => true,
        };
        if !starts_well {
            cut = true;
            tracing::warn!(path = %path.display(), "removing a raft log segment that does not follow on");
            std::fs::remove_file(&path)?;
            continue;
        }
        let data = Bytes::from(std::fs::read(&path)?);
        let mut offsets = Vec::new();
        let mut at = 0;
        // Checksums are checked here; only the last entry is decoded (for its log id): a long
        // log is read once at open, not decoded twice.
        let mut last_record: Option<(usize, u8, Bytes)> = None;
        while at < data.len() {
            let record::Scan::Record(r, next) = record::scan(&data, at) else {
                break;
            };
            if r.kind != KIND_ENTRY && r.kind != KIND_ENTRY_JSON {
                break;
            }
            if r.seq != first + offsets.len() as u64 {
                break;
            }
            offsets.push(at as u32);
            last_record = Some((at, r.kind, r.data));
            at = next;
        }
        if let Some((rec_at, kind, data)) = last_record {
            let entry = decode_entry(kind, &data).map_err(|e| {
                other(format!(
                    "raft log {}: a whole record at byte {rec_at} does not decode ({e}); refusing to cut it",
                    path.display()
                ))
            })?;
            last = Some(entry.log_id);
        }
        if at < data.len() {
            tracing::warn!(
                path = %path.display(),
                kept = at,
                dropped = data.len() - at,
                "raft log has a damaged tail; cutting it off"
            );
            let f = OpenOptions::new().write(true).open(&path)?;
            f.set_len(at as u64)?;
            f.sync_all()?;
            cut = true;
        }
        if offsets.is_empty() {
            std::fs::remove_file(&path)?;
            continue;
        }
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        segments.push_back(Segment {
            first,
            path,
            file: Arc::new(file),
            offsets,
            len: at as u64,
        });
    }
    // Entries at or below the purge point are not the log's any more.
    if last.is_some_and(|l| purged.is_some_and(|p| l.index <= p.index)) {
        last = None;
    }
    Ok((segments, last))
}

#[cfg(test)]
mod tests {
    use std::fs::OpenOptions;
    use std::io::Write;

    use bytes::BytesMut;
    use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
    use openraft::{CommittedLeaderId, LogId, Vote};
    use warren_store::record;

    use super::super::testutil::*;
    use super::super::{LogStore, KIND_ENTRY, KIND_ENTRY_JSON};

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
            .open(seg0(&d))
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
            .open(seg0(&d))
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
        let path = seg0(&d);
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
    async fn the_committed_index_written_in_place_reads_back_and_a_torn_one_reads_as_none() {
        let d = dir("committed-in-place");
        let at = |i| Some(LogId::new(CommittedLeaderId::new(1, 1), i));
        {
            let mut s = LogStore::open(&d).expect("open");
            s.blocking_append((0..12).map(|i| entry(i, "x")))
                .await
                .expect("append");
            // A longer value, then a shorter one: no tail of the longer one may be left.
            s.save_committed(at(11)).await.expect("commit");
            s.save_committed(at(9)).await.expect("commit");
        }
        let mut s = LogStore::open(&d).expect("reopen");
        assert_eq!(s.read_committed().await.expect("committed"), at(9));
        s.save_committed(at(10)).await.expect("commit");
        drop(s);
        let mut s = LogStore::open(&d).expect("reopen");
        assert_eq!(s.read_committed().await.expect("committed"), at(10));
        drop(s);
        // A power cut tore the write: the node waits for its leader instead of failing.
        let path = d.join("committed.json");
        let bytes = std::fs::read(&path).expect("read");
        std::fs::write(&path, &bytes[..7]).expect("tear");
        let mut s = LogStore::open(&d).expect("reopen after a torn write");
        assert_eq!(s.read_committed().await.expect("committed"), None);
        assert_eq!(indexes(&mut s).await, (0..12).collect::<Vec<_>>());
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
            .open(seg0(&d))
            .expect("open log");
        f.write_all(&rec).expect("write");
        drop(f);
        let len = std::fs::metadata(seg0(&d)).expect("stat").len();
        let e = LogStore::open(&d).err().expect("refused");
        assert!(e.to_string().contains("does not decode"), "{e}");
        assert_eq!(
            std::fs::metadata(seg0(&d)).expect("stat").len(),
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
}
