//! openraft's state machine side: applies entries to the broker's [`StateMachine`] and keeps the
//! last snapshot in `snapshot.bin` (one checksummed record, replaced atomically).
//!
//! The applied log id and membership live in memory only: at boot they come from the snapshot,
//! and openraft re-applies the committed entries after it.

use std::io::{self, Cursor};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use openraft::storage::RaftStateMachine;
use openraft::{
    Entry, EntryPayload, LogId, RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use warren_store::{record, snapshot};

use crate::api::{Node, NodeId, SnapshotPoint, StateMachine};
use crate::guard::lock;
use crate::types::{Blob, TypeConfig};

const KIND_SNAPSHOT: u8 = 1;

type StorageResult<T> = Result<T, StorageError<NodeId>>;

#[derive(Clone)]
pub(crate) struct SmStore {
    shared: Arc<Shared>,
}

struct Shared {
    sm: Arc<dyn StateMachine>,
    path: PathBuf,
    state: Mutex<SmState>,
}

/// A snapshot's meta and data.
type Stored = (SnapshotMeta<NodeId, Node>, Arc<Vec<u8>>);

struct SmState {
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, Node>,
    current: Option<Stored>,
    /// Makes snapshot ids unique within this process.
    built: u64,
    /// The memberships since the current snapshot (and the one in force at it), and the first
    /// log id of each leader's entries since then: what a snapshot at an earlier index
    /// ([`SnapshotPoint::At`]) records as its membership and log id.
    memberships: Vec<StoredMembership<NodeId, Node>>,
    terms: Vec<LogId<NodeId>>,
}

impl SmState {
    /// The log id of applied index `index`, if it is at or after the current snapshot.
    fn log_id_at(&self, index: u64) -> Option<LogId<NodeId>> {
        if self.last_applied.is_none_or(|l| l.index < index) {
            return None;
        }
        self.terms
            .iter()
            .rev()
            .find(|l| l.index <= index)
            .map(|l| LogId::new(l.leader_id, index))
    }

    /// The membership in force at applied index `index`.
    fn membership_at(&self, index: u64) -> StoredMembership<NodeId, Node> {
        self.memberships
            .iter()
            .rev()
            .find(|m| m.log_id().is_none_or(|l| l.index <= index))
            .cloned()
            .unwrap_or_default()
    }

    /// A snapshot at `at` is current: what led up to it is no longer needed.
    fn forget_before(&mut self, at: Option<LogId<NodeId>>) {
        let Some(at) = at else { return };
        let keep = |ids: Vec<Option<u64>>| {
            ids.iter()
                .rposition(|i| i.is_none_or(|i| i <= at.index))
                .unwrap_or(0)
        };
        let m = keep(
            self.memberships
                .iter()
                .map(|m| m.log_id().map(|l| l.index))
                .collect(),
        );
        self.memberships.drain(..m);
        let t = keep(self.terms.iter().map(|l| Some(l.index)).collect());
        self.terms.drain(..t);
    }

    /// Starts the history afresh from a snapshot.
    fn reset_history(&mut self, meta: &SnapshotMeta<NodeId, Node>) {
        self.memberships = vec![meta.last_membership.clone()];
        self.terms = meta.last_log_id.into_iter().collect();
    }
}

/// `u32 meta length | meta json | data`, all in one record's data.
fn encode_snapshot(meta: &SnapshotMeta<NodeId, Node>, data: &[u8]) -> io::Result<BytesMut> {
    let meta_json = serde_json::to_vec(meta)?;
    let mut body = Vec::with_capacity(4 + meta_json.len() + data.len());
    body.extend_from_slice(&(meta_json.len() as u32).to_be_bytes());
    body.extend_from_slice(&meta_json);
    body.extend_from_slice(data);
    let mut buf = BytesMut::new();
    let index = meta.last_log_id.map(|l| l.index).unwrap_or(0);
    record::encode(&mut buf, KIND_SNAPSHOT, index, &body);
    Ok(buf)
}

fn decode_snapshot(file: Vec<u8>) -> io::Result<(SnapshotMeta<NodeId, Node>, Vec<u8>)> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("snapshot: {what}"));
    let file = Bytes::from(file);
    // Written atomically, so any damage is corruption rather than a torn write.
    let record::Scan::Record(r, _) = record::scan(&file, 0) else {
        return Err(bad("damaged record"));
    };
    if r.kind != KIND_SNAPSHOT || r.data.len() < 4 {
        return Err(bad("not a snapshot"));
    }
    let meta_len = u32::from_be_bytes([r.data[0], r.data[1], r.data[2], r.data[3]]) as usize;
    let meta_end = 4usize
        .checked_add(meta_len)
        .filter(|end| *end <= r.data.len())
        .ok_or_else(|| bad("bad meta length"))?;
    let meta = serde_json::from_slice(&r.data[4..meta_end]).map_err(|_| bad("bad meta"))?;
    Ok((meta, r.data[meta_end..].to_vec()))
}

impl SmStore {
    /// Loads the last snapshot, if any, into `sm`.
    pub(crate) fn open(dir: &Path, sm: Arc<dyn StateMachine>) -> io::Result<SmStore> {
        let path = dir.join("snapshot.bin");
        let mut state = SmState {
            last_applied: None,
            membership: StoredMembership::default(),
            current: None,
            built: 0,
            memberships: Vec::new(),
            terms: Vec::new(),
        };
        if let Some(file) = snapshot::read(&path)? {
            let (meta, data) = decode_snapshot(file)?;
            sm.restore(meta.last_log_id.map(|l| l.index), &data);
            state.last_applied = meta.last_log_id;
            state.membership = meta.last_membership.clone();
            state.reset_history(&meta);
            state.current = Some((meta, Arc::new(data)));
        }
        Ok(SmStore {
            shared: Arc::new(Shared {
                sm,
                path,
                state: Mutex::new(state),
            }),
        })
    }
}

impl Shared {
    /// Persists a snapshot and makes it current, unless a newer one already is.
    fn save(&self, meta: &SnapshotMeta<NodeId, Node>, data: Arc<Vec<u8>>) -> io::Result<bool> {
        let mut st = lock(&self.state);
        // Nothing new: the same snapshot again, or one of nothing.
        if meta.last_log_id.is_none()
            || st
                .current
                .as_ref()
                .is_some_and(|(cur, _)| cur.last_log_id >= meta.last_log_id)
        {
            return Ok(false);
        }
        snapshot::write_atomic(&self.path, &encode_snapshot(meta, &data)?)?;
        st.current = Some((meta.clone(), data));
        st.forget_before(meta.last_log_id);
        Ok(true)
    }
}

pub(crate) struct SnapshotBuilder {
    shared: Arc<Shared>,
    meta: SnapshotMeta<NodeId, Node>,
    data: Arc<Vec<u8>>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        self.shared
            .save(&self.meta, self.data.clone())
            .map_err(|e| StorageIOError::write_snapshot(Some(self.meta.signature()), &e))?;
        Ok(Snapshot {
            meta: self.meta.clone(),
            snapshot: Box::new(Cursor::new(self.data.to_vec())),
        })
    }
}

impl RaftStateMachine<TypeConfig> for SmStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> StorageResult<(Option<LogId<NodeId>>, StoredMembership<NodeId, Node>)> {
        let st = lock(&self.shared.state);
        Ok((st.last_applied, st.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<Blob>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut replies = Vec::new();
        for e in entries {
            {
                let mut st = lock(&self.shared.state);
                if st.terms.last().map(|l| l.leader_id) != Some(e.log_id.leader_id) {
                    st.terms.push(e.log_id);
                }
            }
            let reply = match e.payload {
                EntryPayload::Blank => Vec::new(),
                EntryPayload::Normal(cmd) => self.shared.sm.apply(e.log_id.index, &cmd.0),
                EntryPayload::Membership(m) => {
                    let mut st = lock(&self.shared.state);
                    st.membership = StoredMembership::new(Some(e.log_id), m);
                    let m = st.membership.clone();
                    st.memberships.push(m);
                    Vec::new()
                }
            };
            lock(&self.shared.state).last_applied = Some(e.log_id);
            replies.push(Blob(reply.into()));
        }
        Ok(replies)
    }

    // Called on the state machine task, in order with `apply`, so the state captured here matches
    // the applied log id exactly; `build_snapshot` then only writes it out.
    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        let point = match self.shared.sm.snapshot_point() {
            SnapshotPoint::Now => Some((None, self.shared.sm.snapshot())),
            SnapshotPoint::At(index, data) => Some((Some(index), data)),
            SnapshotPoint::Unchanged => None,
        };
        let mut st = lock(&self.shared.state);
        st.built += 1;
        let fresh = point.and_then(|(at, data)| {
            let (log_id, membership) = match at {
                None => (st.last_applied, st.membership.clone()),
                Some(i) => (Some(st.log_id_at(i)?), st.membership_at(i)),
            };
            let newer = st
                .current
                .as_ref()
                .is_none_or(|(cur, _)| cur.last_log_id < log_id);
            newer.then_some((log_id, membership, data))
        });
        let Some((last_log_id, last_membership, data)) = fresh else {
            // Nothing to add: the current snapshot again (openraft keeps what it has).
            let (meta, data) = st.current.clone().unwrap_or_else(|| {
                let meta = SnapshotMeta {
                    last_log_id: None,
                    last_membership: StoredMembership::default(),
                    snapshot_id: format!("none-{}", st.built),
                };
                (meta, Arc::new(Vec::new()))
            });
            return SnapshotBuilder {
                shared: self.shared.clone(),
                meta,
                data,
            };
        };
        let snapshot_id = match last_log_id {
            Some(l) => format!("{}-{}-{}", l.leader_id.term, l.index, st.built),
            None => format!("none-{}", st.built),
        };
        SnapshotBuilder {
            shared: self.shared.clone(),
            meta: SnapshotMeta {
                last_log_id,
                last_membership,
                snapshot_id,
            },
            data: Arc::new(data),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, Node>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<()> {
        let data = Arc::new(snapshot.into_inner());
        // Persist first: a crash before `restore` then boots from this snapshot anyway.
        self.shared
            .save(meta, data.clone())
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        self.shared
            .sm
            .restore(meta.last_log_id.map(|l| l.index), &data);
        let mut st = lock(&self.shared.state);
        st.last_applied = meta.last_log_id;
        st.membership = meta.last_membership.clone();
        st.reset_history(meta);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        let st = lock(&self.shared.state);
        Ok(st.current.as_ref().map(|(meta, data)| Snapshot {
            meta: meta.clone(),
            snapshot: Box::new(Cursor::new(data.to_vec())),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_file_round_trip() {
        let meta = SnapshotMeta::<NodeId, Node> {
            last_log_id: Some(LogId::new(openraft::CommittedLeaderId::new(2, 1), 9)),
            last_membership: StoredMembership::default(),
            snapshot_id: "2-9-1".into(),
        };
        let buf = encode_snapshot(&meta, b"state").expect("encode");
        let (m, d) = decode_snapshot(buf.to_vec()).expect("decode");
        assert_eq!(m, meta);
        assert_eq!(d, b"state");
        let mut bad = buf.to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(decode_snapshot(bad).is_err());
    }
}
