//! Upgrading a replicated queue of the earlier form (a `Replica` of ids beside a leader's
//! classic queue, `cluster/quorum/` before this release) to the queue machine, in its own Raft
//! group and log, as RabbitMQ moves a queue to a new machine version through its log.
//!
//! A group whose log holds entries of the earlier format is opened on this machine as it is
//! (same directory, same members). Every member applies those entries to a [`Legacy`] state:
//! the messages still in the queue, where each body is (an entry and slot of the log, or held
//! from a snapshot of the earlier format), how often each was returned, which an earlier
//! leader may have delivered, and the kept at-least-once dead letters. Then the leader carries
//! them over: it proposes entries of [`Op::Import`]s, in the queue's order, each naming the
//! earlier id it copies, with the body, the delivery count and whether it was delivered. Every
//! member applies an import by enqueuing the copy on the machine
//! ([`Cmd::Import`](warren_queue::replicated::Cmd::Import)) and forgetting the earlier id, so
//! an import of an id already carried imports nothing. A leader proposes its first import only
//! once an entry of its own is applied (every entry an earlier leader got committed is then
//! applied before it), and each next one once the one before is applied: no id is proposed
//! again after it was carried. Once no earlier message is left, the `Legacy` state goes;
//! until then the group takes no snapshot, so the log the bodies are in stays.
//!
//! A kept dead letter is not imported: its copy is routed once more (at most once) and the
//! earlier id forgotten. Client operations are served meanwhile; a publish during the carrying
//! over is enqueued among the earlier messages rather than after them.

use std::collections::{BTreeMap, HashMap, HashSet};

use bytes::{Buf, Bytes};
use warren_protocol::ByteString;

use super::entry::Op;

/// The first byte of an entry of the earlier format.
pub const OP_ENQUEUE: u8 = 1;
/// A snapshot of the earlier format at its release point: the magic, then the next id.
const SNAPSHOT_MAGIC: &[u8; 4] = b"WQS2";
/// Publishes of the earlier format read back per entry, at most (its `BATCH_MSGS`, twice).
const ENTRY_MSGS: usize = 4096;

/// An entry of the earlier format: `[OP_ENQUEUE][n u32]([len u32][stored message])*n`, then the
/// settled, returned and claimed ids, each `[m u32]([id u64])*m`, then
/// `[claim_new u32][epoch u64]`, then (absent from the first versions) the settled runs
/// `[r u32]([first u64][last u64])*r` and the kept dead letters
/// `[d u32]([id u64][len u32][stored message][k u16]([len u16][routing key])*k)*d`.
pub(crate) struct Decoded {
    pub(crate) msgs: Vec<Bytes>,
    pub(crate) settled: Vec<u64>,
    pub(crate) settled_runs: Vec<(u64, u64)>,
    pub(crate) dead: Vec<(u64, Bytes, Vec<ByteString>)>,
    pub(crate) returned: Vec<u64>,
    pub(crate) claimed: Vec<u64>,
    pub(crate) claim_new: u32,
}

pub(crate) fn decode(command: Bytes) -> Option<Decoded> {
    let mut b = command;
    if b.remaining() < 5 || b.get_u8() != OP_ENQUEUE {
        return None;
    }
    let n = b.get_u32() as usize;
    let mut msgs = Vec::with_capacity(n.min(ENTRY_MSGS));
    for _ in 0..n {
        if b.remaining() < 4 {
            return None;
        }
        let len = b.get_u32() as usize;
        if b.remaining() < len {
            return None;
        }
        msgs.push(b.split_to(len));
    }
    let mut ids = || -> Option<Vec<u64>> {
        if b.remaining() < 4 {
            return None;
        }
        let m = b.get_u32() as usize;
        if b.remaining() < m * 8 {
            return None;
        }
        Some((0..m).map(|_| b.get_u64()).collect())
    };
    let settled = ids()?;
    let returned = ids()?;
    let claimed = ids()?;
    if b.remaining() < 12 {
        return None;
    }
    let claim_new = b.get_u32();
    // The proposing leader's epoch: of no use once carried over.
    b.advance(8);
    let mut settled_runs = Vec::new();
    if b.remaining() >= 4 {
        let r = b.get_u32() as usize;
        if b.remaining() < r * 16 {
            return None;
        }
        settled_runs = (0..r).map(|_| (b.get_u64(), b.get_u64())).collect();
    }
    let mut dead = Vec::new();
    if b.remaining() >= 4 {
        let d = b.get_u32() as usize;
        for _ in 0..d {
            if b.remaining() < 12 {
                return None;
            }
            let id = b.get_u64();
            let len = b.get_u32() as usize;
            if b.remaining() < len + 2 {
                return None;
            }
            let data = b.split_to(len);
            let k = b.get_u16() as usize;
            let mut cc = Vec::with_capacity(k);
            for _ in 0..k {
                if b.remaining() < 2 {
                    return None;
                }
                let n = b.get_u16() as usize;
                if b.remaining() < n {
                    return None;
                }
                cc.push(ByteString::try_from(b.split_to(n)).ok()?);
            }
            dead.push((id, data, cc));
        }
    }
    Some(Decoded {
        msgs,
        settled,
        settled_runs,
        dead,
        returned,
        claimed,
        claim_new,
    })
}

/// A single node's quorum queue of the earlier form (a durable classic queue) being carried
/// over into a new group of one member.
pub struct Seed {
    pub legacy: Legacy,
    /// The classic queue's directory (the new group is its `group/`), with its log files.
    pub classic_dir: std::path::PathBuf,
}

/// Marks of a single node's carrying over, in the classic queue's directory: begun (a `group/`
/// beside it is incomplete: made again), and done (the classic files are to go).
pub const CARRYING: &str = "group.carrying";
pub const CARRIED: &str = "group.carried";

/// What a single node's quorum queue directory `dir` (`queues/<id>`) holds: `None` when it
/// needs no carrying over (new, on the machine already, or carried over: then the classic files
/// left are removed now), else the classic form's stored messages, in order, to carry over
/// (an incomplete earlier attempt's `group/` removed first).
pub fn single_node_seed(dir: &std::path::Path) -> std::io::Result<Option<Seed>> {
    let group = dir.join("group");
    if dir.join(CARRIED).exists() {
        remove_classic_files(dir)?;
        std::fs::remove_file(dir.join(CARRIED))?;
        return Ok(None);
    }
    if !dir.exists() || (group.exists() && !dir.join(CARRYING).exists()) {
        return Ok(None);
    }
    if group.exists() {
        std::fs::remove_dir_all(&group)?;
    }
    warren_store::snapshot::write_atomic(&dir.join(CARRYING), b"")?;
    let (log, rec) = crate::queue::Log::open(dir, crate::persist::stored_body_len)?;
    let mut cursor = warren_store::log::Cursor::from_seq(rec.live.first().unwrap_or(0));
    let mut msgs = Vec::with_capacity(rec.count);
    loop {
        let got = log.read(&mut cursor, 1 << 20, |seq| rec.live.holds(seq))?;
        if got.is_empty() {
            break;
        }
        msgs.extend(got.into_iter().map(|(_, stored)| stored));
    }
    drop(log);
    Ok(Some(Seed {
        legacy: Legacy::held(msgs),
        classic_dir: dir.to_path_buf(),
    }))
}

/// Every file of the classic form in `dir` (its log's), not the group nor the marks.
fn remove_classic_files(dir: &std::path::Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)?.flatten() {
        let name = e.file_name();
        if name == "group" || name == CARRYING || name == CARRIED {
            continue;
        }
        let p = e.path();
        if p.is_dir() {
            std::fs::remove_dir_all(p)?;
        } else {
            std::fs::remove_file(p)?;
        }
    }
    Ok(())
}

/// A single node's carrying over is done (every message committed in the group): marked so,
/// then the classic files go.
fn finish_single_node(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::rename(dir.join(CARRYING), dir.join(CARRIED))?;
    std::fs::File::open(dir)?.sync_all()?;
    remove_classic_files(dir)?;
    std::fs::remove_file(dir.join(CARRIED))
}

/// Where an earlier message's body is.
#[derive(Debug, Clone, PartialEq)]
enum Body {
    /// The `slot`th message of the entry at `index`.
    Log { index: u64, slot: u32 },
    /// Held: a snapshot of the earlier format carried it.
    Held(Bytes),
}

/// A group's earlier messages not yet carried over. (One map entry a message: an upgrade of a
/// very long queue holds that much more memory until it is done.)
#[derive(Debug, Default, PartialEq)]
pub struct Legacy {
    next_id: u64,
    live: BTreeMap<u64, Body>,
    returns: HashMap<u64, u32>,
    delivered: HashSet<u64>,
    dead: BTreeMap<u64, (Bytes, Vec<ByteString>)>,
}

/// One message to carry over, as the leader reads it.
pub enum Carry {
    Import {
        old: u64,
        stored: Bytes,
        returns: u32,
        delivered: bool,
    },
    /// A kept dead letter: its copy to route (and extra routing keys); nothing is imported.
    Dead {
        old: u64,
        stored: Bytes,
        cc: Vec<ByteString>,
    },
    /// Its body cannot be read back (logged): forgotten.
    Lost { old: u64 },
}

impl Carry {
    pub fn op(&self) -> Op {
        match self {
            Carry::Import {
                old,
                stored,
                returns,
                delivered,
            } => Op::Import {
                old: *old,
                redelivered: *delivered || *returns > 0,
                count: *returns,
                stored: Some(stored.clone()),
            },
            Carry::Dead { old, .. } | Carry::Lost { old } => Op::Import {
                old: *old,
                redelivered: false,
                count: 0,
                stored: None,
            },
        }
    }
}

impl Legacy {
    /// A single node's quorum queue of the earlier form (a durable classic queue): its stored
    /// messages in order, each with its delivery count (its `x-delivery-count` header, where
    /// that form kept one in the message), each redelivered (that form marked every message it
    /// recovered so), held in memory until carried over.
    pub fn held(msgs: Vec<Bytes>) -> Legacy {
        let mut l = Legacy::default();
        for stored in msgs {
            let id = l.next_id;
            l.next_id += 1;
            let count = crate::persist::decode_message(&stored).map_or(0, |(m, _)| {
                warren_protocol::properties::BasicProperties::decode(&m.properties)
                    .ok()
                    .and_then(|p| p.headers)
                    .and_then(|h| h.get("x-delivery-count").and_then(|v| v.as_i64()))
                    .map_or(0, |n| n.clamp(0, i64::from(u32::MAX)) as u32)
            });
            if count > 0 {
                l.returns.insert(id, count);
            }
            // As that form marked every message it recovered at a boot: it kept no record of
            // which had been delivered.
            l.delivered.insert(id);
            l.live.insert(id, Body::Held(stored));
        }
        l
    }

    /// From a snapshot of the earlier format: `None` when `snapshot` is not one.
    pub fn restore(snapshot: &[u8]) -> Option<Legacy> {
        let mut l = Legacy::default();
        if let Some(point) = snapshot.strip_prefix(SNAPSHOT_MAGIC) {
            // `[next id u64]`: every message before it was settled.
            l.next_id = u64::from_be_bytes(<[u8; 8]>::try_from(point).ok()?);
            return Some(l);
        }
        // The first format: `[next id u64][n u64]` then per message
        // `[id u64][returns u32][delivered u8][len u32][stored message]`.
        let mut b = Bytes::copy_from_slice(snapshot);
        if b.remaining() < 16 {
            return None;
        }
        let next_id = b.get_u64();
        let n = b.get_u64();
        for _ in 0..n {
            if b.remaining() < 17 {
                return None;
            }
            let id = b.get_u64();
            let returns = b.get_u32();
            let delivered = b.get_u8() == 1;
            let len = b.get_u32() as usize;
            if b.remaining() < len {
                return None;
            }
            l.live.insert(id, Body::Held(b.split_to(len)));
            if delivered {
                l.delivered.insert(id);
            }
            if returns > 0 {
                l.returns.insert(id, returns);
            }
        }
        l.next_id = next_id;
        Some(l)
    }

    /// Applies entry `index` of the earlier format.
    pub(crate) fn apply(&mut self, index: u64, d: Decoded) {
        let first_id = self.next_id;
        let claim_new = (d.claim_new as usize).min(d.msgs.len()) as u64;
        for id in d
            .claimed
            .iter()
            .copied()
            .chain(first_id..first_id + claim_new)
        {
            if id >= first_id || self.live.contains_key(&id) {
                self.delivered.insert(id);
            }
        }
        for slot in 0..d.msgs.len() {
            self.live.insert(
                self.next_id,
                Body::Log {
                    index,
                    slot: slot as u32,
                },
            );
            self.next_id += 1;
        }
        // Kept before the settlements: a dead letter taken at once is settled in the same entry.
        for (id, data, cc) in d.dead {
            if self.live.contains_key(&id) {
                self.dead.insert(id, (data, cc));
            }
        }
        for id in d.settled {
            self.forget(id);
        }
        for (first, last) in d.settled_runs {
            let ids: Vec<u64> = self
                .live
                .range(first..=last.max(first))
                .map(|(id, _)| *id)
                .collect();
            for id in ids {
                self.forget(id);
            }
        }
        for id in d.returned {
            if self.live.contains_key(&id) {
                *self.returns.entry(id).or_insert(0) += 1;
            }
        }
        // Claims of ids not in the queue (settled since) are of no use.
        self.delivered
            .retain(|id| *id >= first_id || self.live.contains_key(id));
    }

    /// Earlier message `id` was carried over (or its dead letter sent): true if it was still
    /// here (an import of it applies), false if an earlier import took it.
    pub fn forget(&mut self, id: u64) -> bool {
        self.returns.remove(&id);
        self.delivered.remove(&id);
        self.dead.remove(&id);
        self.live.remove(&id).is_some()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// The next earlier messages to carry over, in the queue's order: up to `max_msgs` of them
    /// and about `max_bytes`, their bodies read back from `log` (an entry read serves the
    /// messages after it in it too). A body that cannot be read is logged and skipped.
    pub fn next(
        &self,
        log: Option<&warren_cluster::LogReader>,
        max_msgs: usize,
        max_bytes: usize,
    ) -> Vec<Carry> {
        let mut out = Vec::new();
        let mut bytes = 0;
        let mut last: Option<(u64, Vec<Bytes>)> = None;
        for (id, body) in &self.live {
            if out.len() >= max_msgs || bytes >= max_bytes {
                break;
            }
            let stored = match body {
                Body::Held(b) => Some(b.clone()),
                Body::Log { index, slot } => {
                    if last.as_ref().is_none_or(|(i, _)| i != index) {
                        last = read_entry(log, *index).map(|msgs| (*index, msgs));
                    }
                    last.as_ref()
                        .and_then(|(i, msgs)| (i == index).then(|| msgs.get(*slot as usize)))
                        .flatten()
                        .cloned()
                }
            };
            let Some(stored) = stored else {
                tracing::error!(
                    id,
                    "an earlier message's body is missing from the queue's log; not carried over"
                );
                out.push(Carry::Lost { old: *id });
                continue;
            };
            bytes += stored.len();
            out.push(match self.dead.get(id) {
                Some((copy, cc)) => Carry::Dead {
                    old: *id,
                    stored: copy.clone(),
                    cc: cc.clone(),
                },
                None => Carry::Import {
                    old: *id,
                    stored,
                    returns: self.returns.get(id).copied().unwrap_or(0),
                    delivered: self.delivered.contains(id),
                },
            });
        }
        out
    }
}

/// Earlier messages carried over per entry, at most, and their bytes.
const CARRY_MSGS: usize = 2048;
const CARRY_BYTES: usize = 1 << 20;
/// After an entry that failed (a leader change), before the next try.
const CARRY_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

impl super::ReplicatedQueue {
    /// As the leader of a group an earlier release wrote: carries its earlier messages over to
    /// the machine, an entry at a time, each waited for (the next one is read from the state it
    /// left). Ends when none is left, or when this node no longer leads (the next leader goes
    /// on from the applied state).
    pub(super) async fn carry_over(self: std::sync::Arc<Self>, meta: warren_cluster::Meta) {
        let mut carried = 0usize;
        // First an entry of this leader's own, applied: every entry before it in the log (an
        // earlier leader's imports among them) is then applied too, so what is read next is
        // what is left, and no import is proposed twice (see `sm.rs`: an import after the
        // earlier state is gone would apply again).
        loop {
            if !self.leads() {
                return;
            }
            let b = super::entry::Builder::new(crate::clock::unix_ms());
            let applied = match meta.submit(b.finish()).await {
                Ok(f) => f.await.is_ok(),
                Err(_) => false,
            };
            if applied {
                break;
            }
            tokio::time::sleep(CARRY_RETRY).await;
        }
        if let Some(n) = self.sm.state.lock().legacy.as_ref().map(Legacy::len) {
            tracing::info!(queue = %self.name, vhost = %self.vhost, messages = n, "carrying a replicated queue of the earlier form over to the queue machine");
        }
        loop {
            if !self.leads() || self.deleted.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            let batch = match &self.sm.state.lock().legacy {
                Some(l) => l.next(self.sm.log.get(), CARRY_MSGS, CARRY_BYTES),
                None => {
                    tracing::info!(queue = %self.name, vhost = %self.vhost, messages = carried, "carried the earlier form's messages over");
                    if let Some(dir) = self.carried_from.lock().take() {
                        if let Err(e) = finish_single_node(&dir) {
                            tracing::warn!(queue = %self.name, vhost = %self.vhost, error = %e, "cannot remove the earlier form's files (they are removed at the next boot)");
                        }
                    }
                    return;
                }
            };
            let mut b = super::entry::Builder::new(crate::clock::unix_ms());
            for c in &batch {
                b.import(&c.op());
            }
            let applied = match meta.submit(b.finish()).await {
                Ok(f) => f.await.is_ok(),
                Err(_) => false,
            };
            if !applied {
                tokio::time::sleep(CARRY_RETRY).await;
                continue;
            }
            carried += batch.len();
            // Kept dead letters: routed once more, at most once (their ids are forgotten).
            if let Some(owner) = self.owner.upgrade() {
                for c in batch {
                    if let Carry::Dead { stored, cc, .. } = c {
                        if let Some((m, _)) = crate::persist::decode_message(&stored) {
                            crate::queue::route_dead_kept(
                                &owner,
                                &std::sync::Arc::new(m),
                                &cc,
                                |_| {},
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The stored messages of entry `index` of the earlier format.
fn read_entry(log: Option<&warren_cluster::LogReader>, index: u64) -> Option<Vec<Bytes>> {
    let (i, data) = log?.read(index, 1).ok()?.into_iter().next()?;
    if i != index {
        return None;
    }
    decode(data?).map(|d| d.msgs)
}

#[cfg(test)]
mod tests {
    use bytes::{BufMut, BytesMut};

    use super::*;

    /// An entry of the earlier format, as `cluster/quorum/entry.rs` wrote it.
    pub(crate) fn encode(
        msgs: &[&[u8]],
        settled: &[u64],
        returned: &[u64],
        claimed: &[u64],
        claim_new: u32,
        runs: &[(u64, u64)],
        dead: &[(u64, &[u8])],
    ) -> Bytes {
        let mut b = BytesMut::new();
        b.put_u8(OP_ENQUEUE);
        b.put_u32(msgs.len() as u32);
        for m in msgs {
            b.put_u32(m.len() as u32);
            b.put_slice(m);
        }
        for ids in [settled, returned, claimed] {
            b.put_u32(ids.len() as u32);
            for id in ids {
                b.put_u64(*id);
            }
        }
        b.put_u32(claim_new);
        b.put_u64(7);
        b.put_u32(runs.len() as u32);
        for (f, l) in runs {
            b.put_u64(*f);
            b.put_u64(*l);
        }
        b.put_u32(dead.len() as u32);
        for (id, m) in dead {
            b.put_u64(*id);
            b.put_u32(m.len() as u32);
            b.put_slice(m);
            b.put_u16(0);
        }
        b.freeze()
    }

    fn ids(l: &Legacy) -> Vec<u64> {
        l.live.keys().copied().collect()
    }

    #[test]
    fn earlier_entries_leave_what_is_still_in_the_queue_with_its_returns_claims_and_dead() {
        let mut l = Legacy::default();
        l.apply(
            1,
            decode(encode(&[b"a", b"b", b"c"], &[], &[], &[], 1, &[], &[])).unwrap(),
        );
        assert_eq!(ids(&l), [0, 1, 2]);
        assert!(l.delivered.contains(&0), "claimed with its enqueue");
        l.apply(
            2,
            decode(encode(&[b"d"], &[0], &[1], &[2], 0, &[], &[(2, b"dead")])).unwrap(),
        );
        assert_eq!(ids(&l), [1, 2, 3]);
        assert_eq!(l.returns.get(&1), Some(&1));
        assert!(l.delivered.contains(&2));
        assert_eq!(l.live.get(&3), Some(&Body::Log { index: 2, slot: 0 }));
        l.apply(
            3,
            decode(encode(&[], &[], &[], &[], 0, &[(0, 2)], &[])).unwrap(),
        );
        assert_eq!(ids(&l), [3]);
        assert!(l.dead.is_empty() && l.returns.is_empty());
        assert!(
            decode(Bytes::from_static(b"\x01\x00")).is_none(),
            "cut short"
        );
    }

    #[test]
    fn earlier_snapshots_restore_their_next_id_or_their_held_bodies() {
        let l = Legacy::restore(b"WQS2\x00\x00\x00\x00\x00\x00\x00\x09").unwrap();
        assert_eq!((l.next_id, l.len()), (9, 0));
        let mut b = BytesMut::new();
        b.put_u64(12);
        b.put_u64(1);
        b.put_u64(11);
        b.put_u32(2);
        b.put_u8(1);
        b.put_u32(3);
        b.put_slice(b"xyz");
        let l = Legacy::restore(&b).unwrap();
        assert_eq!(l.next_id, 12);
        assert_eq!(
            l.live.get(&11),
            Some(&Body::Held(Bytes::from_static(b"xyz")))
        );
        let carried = l.next(None, 10, 1 << 20);
        assert!(matches!(
            &carried[..],
            [Carry::Import {
                old: 11,
                returns: 2,
                delivered: true,
                ..
            }]
        ));
        assert!(Legacy::restore(b"nonsense").is_none());
    }

    fn stored(body: &str) -> Bytes {
        let m = crate::message::Message {
            exchange: warren_protocol::ByteString::from(""),
            routing_key: warren_protocol::ByteString::from("q"),
            properties: warren_protocol::properties::BasicProperties::default().to_bytes(),
            body: Bytes::copy_from_slice(body.as_bytes()),
            persistent: true,
            priority: None,
            expiration_ms: None,
            forwarded: crate::message::Forwarded::NONE,
        };
        let mut b = BytesMut::new();
        crate::persist::encode_message_into(&mut b, &m, None);
        b.freeze()
    }

    fn imports(ops: &[(u64, &str, u32, bool)]) -> Vec<u8> {
        let mut b = super::super::entry::Builder::new(1_000);
        for (old, body, count, redelivered) in ops {
            b.import(&Op::Import {
                old: *old,
                redelivered: *redelivered,
                count: *count,
                stored: Some(stored(body)),
            });
        }
        b.finish()
    }

    #[test]
    fn a_log_of_earlier_entries_then_imports_replays_to_one_machine_and_imports_each_message_once()
    {
        use warren_cluster::StateMachine;
        let (a, b, c) = (stored("a"), stored("b"), stored("c"));
        let log: Vec<Vec<u8>> = vec![
            encode(&[&a, &b, &c], &[], &[], &[], 1, &[], &[]).to_vec(),
            encode(&[], &[0], &[1], &[], 0, &[], &[]).to_vec(),
            // A leader carries b (returned once) over, then died; the next carries b and c
            // (its entry was proposed before the first one's apply): b is not imported twice.
            imports(&[(1, "b", 1, true)]),
            imports(&[(1, "b", 1, true), (2, "c", 0, false)]),
        ];
        let apply_all = || {
            let sm = super::super::sm::GroupSm::new(Default::default(), Default::default(), true);
            for (i, e) in log.iter().enumerate() {
                sm.apply(i as u64 + 1, &Bytes::copy_from_slice(e));
                if i == 1 {
                    let st = sm.state.lock();
                    let l = st.legacy.as_ref().expect("the earlier state");
                    assert_eq!(ids(l), [1, 2]);
                }
            }
            sm
        };
        let one = apply_all();
        let st = one.state.lock();
        assert!(
            st.legacy.is_none(),
            "carried over: the earlier state is gone"
        );
        assert_eq!(st.machine.ready_len(), 2, "b and c, once each");
        let fingerprint = st.machine.fingerprint();
        drop(st);
        assert_eq!(
            apply_all().state.lock().machine.fingerprint(),
            fingerprint,
            "replayed alike"
        );
    }
}
