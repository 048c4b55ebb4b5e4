//! Replicated queues (`x-queue-type=quorum` in a cluster): each queue is one openraft group of
//! its own (`warren-cluster`'s `Meta`, the same code as the metadata group) over its members,
//! with the messages in the group's log.
//!
//! - **What is replicated** is the queue's message log, as RabbitMQ's quorum queues replicate
//!   enqueues and settlements: an entry is a batch of enqueued messages and of settled ids.
//!   Every member applies it to its [`Replica`] (id -> stored message), so every member holds
//!   every message not yet settled, and the ids are the same everywhere.
//! - **The leader serves.** On the member that leads the group, the queue is an ordinary local
//!   [`Queue`] (the classic state machine: consumers, prefetch, priorities, TTL, length limits,
//!   dead-lettering), built from the replica when it becomes leader and fed every committed
//!   enqueue. Its messages are numbered with the replica's ids (`publish_as`), so when one
//!   leaves the queue for good (ack, drop, expiry, purge) its `Forget` effect is the id to
//!   settle in the next entry. Deliveries and requeues are not replicated: a new leader
//!   redelivers every message its replica holds, marked redelivered (at-least-once).
//! - **Every other node** (followers and non-members) reaches the leader as it reaches any
//!   queue homed elsewhere: a [`RemoteQueue`] whose home is the current leader.
//!   [`QuorumQueue::leg`] is whichever of the two this node has now; a leader change retires
//!   the old leg (its consumers are cancelled, as when a queue's node goes down) and installs
//!   the new one.
//! - **Confirms**: a publish goes to the leader's [`Replicator`], which proposes batches of
//!   them; the confirm is sent once the entry is committed (appended and fsynced on a
//!   majority) and applied on the leader.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use warren_protocol::ByteString;

use super::remote::RemoteQueue;
use super::{Cluster, MetaOp};
use crate::confirm::ConfirmHandle;
use crate::error::{AmqpError, AmqpResult};
use crate::message::Message;
use crate::queue::{Consumer, Queue, QueueArgs, QueueOptions, QueueRef};
use crate::vhost::VHost;

/// Raft messages of a queue group: `[group u64][openraft rpc]`.
pub const SERVICE_QRAFT: u8 = 5;
/// Which node leads a queue group (asked by non-members): `[group u64]` -> the leader's name.
pub const SERVICE_QLEADER: u8 = 6;

/// Change a queue group's Raft membership, served by one of its members:
/// `[group u64][1 add | 2 remove][node name]`.
pub const SERVICE_QMEMBER: u8 = 7;

/// Publishes proposed in one entry at most (bounds an entry's size and a confirm's wait). Also
/// what a restart holds in memory at once: openraft reads the log back 64 entries at a time.
const BATCH_MSGS: usize = 2048;
const BATCH_BYTES: usize = 1 << 20;
/// Publishes waiting for their entry beyond which the queue counts as pressured (publishers
/// stall, as for a queue whose consumers fall behind).
const PRESSURE_MSGS: usize = 16_384;
/// The same in bytes: what waits for the group is held in memory.
const PRESSURE_BYTES: usize = 16 << 20;
/// Entries one queue keeps in flight.
const PIPELINE: usize = 4;
/// Messages claimed for delivery ahead of need, per entry.
const CLAIM_WINDOW: usize = 512;
/// How often kept dead letters that could not be routed are tried again.
const DEAD_LETTER_RETRY: Duration = Duration::from_secs(1);
/// How often a non-member asks the members who leads.
const LEADER_POLL: Duration = Duration::from_millis(500);
/// How long a declare waits for the new group to elect its first leader.
pub const FIRST_LEADER_WAIT: Duration = Duration::from_secs(15);

const OP_ENQUEUE: u8 = 1;

/// A member's copy of the queue, without the bodies (they stay in the group's log, read back
/// through [`LogTail`]): which messages are in the queue and their sizes, how often each was
/// returned, which were claimed, and where a snapshot may be taken.
#[derive(Default)]
struct Replica {
    next_id: u64,
    /// The body size of each message from `base` on, [`GONE`] once settled; the front is
    /// always in the queue.
    base: u64,
    sizes: VecDeque<u32>,
    live: usize,
    live_bytes: u64,
    returns: HashMap<u64, u32>,
    /// Claimed by a leader for delivery: a later leader marks them redelivered.
    delivered: HashSet<u64>,
    /// `(index, next id after it)` every [`CHECKPOINT_ENTRIES`] entries or
    /// [`CHECKPOINT_BYTES`]: once every message below that id is settled, the state as of that
    /// index is just the id (see [`GroupSm::snapshot_point`]).
    checkpoints: VecDeque<(u64, u64)>,
    since_checkpoint: (u32, usize),
    /// Bodies restored from a snapshot of an earlier version, which held them.
    legacy: BTreeMap<u64, Bytes>,
    /// The snapshot restored: its index and the next id after it.
    start: Option<(u64, u64)>,
    /// At-least-once dead letters not yet taken by their targets, by message id: the copy to
    /// route and its extra routing keys.
    dead: BTreeMap<u64, (Bytes, Vec<ByteString>)>,
}

/// A settled message's place in [`Replica::sizes`].
const GONE: u32 = u32::MAX;
/// How often the replica notes a place where a snapshot could be taken (see
/// [`Replica::checkpoints`]): the log kept before the oldest message is at most about this.
const CHECKPOINT_ENTRIES: u32 = 256;
const CHECKPOINT_BYTES: usize = 4 << 20;
/// A snapshot of the new format: the magic, then the next id.
const SNAPSHOT_MAGIC: &[u8; 4] = b"WQS2";

impl Replica {
    fn holds(&self, id: u64) -> bool {
        id >= self.base
            && self
                .sizes
                .get((id - self.base) as usize)
                .is_some_and(|s| *s != GONE)
    }

    fn insert(&mut self, id: u64, size: u64) {
        if self.sizes.is_empty() {
            self.base = id;
        }
        while self.base + (self.sizes.len() as u64) < id {
            self.sizes.push_back(GONE);
        }
        let size = size.min(u64::from(GONE - 1)) as u32;
        self.sizes.push_back(size);
        self.live += 1;
        self.live_bytes += u64::from(size);
    }

    fn remove(&mut self, id: u64) {
        if !self.holds(id) {
            return;
        }
        let at = (id - self.base) as usize;
        self.live_bytes -= u64::from(self.sizes[at]);
        self.live -= 1;
        self.sizes[at] = GONE;
        while self.sizes.front() == Some(&GONE) {
            self.sizes.pop_front();
            self.base += 1;
        }
        self.returns.remove(&id);
        self.delivered.remove(&id);
        self.legacy.remove(&id);
        self.dead.remove(&id);
    }

    /// The oldest message still in the queue, or the next id if none is.
    fn oldest(&self) -> u64 {
        if self.live == 0 {
            self.next_id
        } else {
            self.base
        }
    }

    /// The ids in the queue from `from` on, in order.
    fn ids_from(&self, from: u64) -> impl Iterator<Item = u64> + '_ {
        let skip = from.saturating_sub(self.base) as usize;
        self.sizes
            .iter()
            .enumerate()
            .skip(skip)
            .filter(|(_, s)| **s != GONE)
            .map(|(i, _)| self.base + i as u64)
    }

    /// Entry `index` (of `len` bytes) was applied.
    fn applied(&mut self, index: u64, len: usize) {
        self.since_checkpoint.0 += 1;
        self.since_checkpoint.1 += len;
        if self.since_checkpoint.0 >= CHECKPOINT_ENTRIES
            || self.since_checkpoint.1 >= CHECKPOINT_BYTES
        {
            self.checkpoints.push_back((index, self.next_id));
            self.since_checkpoint = (0, 0);
        }
        // Only the newest checkpoint below the oldest message is of use.
        let oldest = self.oldest();
        while self.checkpoints.get(1).is_some_and(|c| c.1 <= oldest) {
            self.checkpoints.pop_front();
        }
    }

    /// The newest checkpoint before every message still in the queue: `(index, next id)`.
    fn release(&self) -> Option<(u64, u64)> {
        self.checkpoints
            .front()
            .copied()
            .filter(|c| c.1 <= self.oldest())
    }
}

/// Publishes and settlements waiting to be proposed.
#[derive(Default)]
struct Batch {
    msgs: Vec<(Arc<Message>, Option<Arc<ConfirmHandle>>)>,
    bytes: usize,
    settled: Vec<u64>,
    /// Runs of ids settled at once (a purged or deleted paged tail), first and last.
    settled_runs: Vec<(u64, u64)>,
    /// At-least-once dead letters: the message's id, its dead-lettered copy and extra routing
    /// keys; kept by every member until the id is settled.
    dead: Vec<(u64, Arc<Message>, Vec<ByteString>)>,
    returned: Vec<u64>,
    /// Ids claimed for delivery, and how many of this entry's new messages are claimed too
    /// (the first ones: consumers are waiting for them).
    claimed: Vec<u64>,
    claim_new: u32,
    /// The proposing leader's epoch (see `Replicator::epoch`).
    epoch: u64,
}

/// The leader's side of replication: gathers what its queue did and proposes it in batches.
#[derive(Default)]
pub struct Replicator {
    pending: Mutex<Batch>,
    wake: tokio::sync::Notify,
    /// Publishes accepted and not yet confirmed or refused, and their bytes.
    in_flight: AtomicUsize,
    in_flight_bytes: AtomicUsize,
    relieved: tokio::sync::Notify,
    /// Returns so far of the leader queue's messages that were returned at least once.
    returns: Mutex<HashMap<u64, u32>>,
    /// Claims asked for: the lowest unclaimed id an offer was held back for, and the ids
    /// proposed and not yet committed (not asked for twice).
    claims_from: Mutex<Option<u64>>,
    claiming: Mutex<HashSet<u64>>,
    /// At-least-once dead letters of the leader's queue by message id, until their targets
    /// have them.
    dead: Mutex<HashMap<u64, DeadKept>>,
    /// Set afresh each time this node starts leading. An entry proposed under another epoch
    /// (an earlier leader's, committed after this node took over) may carry claims that leader
    /// acted on: its claimed messages may have been delivered, so they are marked redelivered.
    epoch: AtomicU64,
}

/// A dead letter kept until its targets have it: the copy to route, its extra routing keys,
/// and whether it is on its way (routed, confirms awaited).
struct DeadKept {
    msg: Arc<Message>,
    cc: Vec<ByteString>,
    sent: bool,
}

impl Replicator {
    /// Message `id` was dead-lettered as `msg` (at-least-once): kept, and replicated as kept,
    /// until [`Replicator::dead_done`].
    pub fn dead_lettering(&self, id: u64, msg: Arc<Message>, cc: Vec<ByteString>) {
        self.pending.lock().dead.push((id, msg.clone(), cc.clone()));
        self.dead.lock().insert(
            id,
            DeadKept {
                msg,
                cc,
                sent: false,
            },
        );
        self.wake.notify_one();
    }

    /// The kept dead letters not on their way, now marked as on their way.
    pub fn dead_to_send(&self) -> Vec<(u64, Arc<Message>, Vec<ByteString>)> {
        let mut d = self.dead.lock();
        d.iter_mut()
            .filter(|(_, k)| !k.sent)
            .map(|(id, k)| {
                k.sent = true;
                (*id, k.msg.clone(), k.cc.clone())
            })
            .collect()
    }

    fn has_dead_to_send(&self) -> bool {
        self.dead.lock().values().any(|k| !k.sent)
    }

    /// Could not be routed: tried again later.
    pub fn dead_unsent(&self, id: u64) {
        if let Some(k) = self.dead.lock().get_mut(&id) {
            k.sent = false;
        }
    }

    /// Every target has dead letter `id` (`ok`): its message is settled. Otherwise it is sent
    /// again later.
    pub fn dead_done(&self, id: u64, ok: bool) {
        if ok {
            if self.dead.lock().remove(&id).is_some() {
                self.settled(id);
            }
        } else {
            self.dead_unsent(id);
        }
    }

    /// A publish to replicate; its confirm (if any) is completed once it is committed.
    pub fn submit(&self, msg: Arc<Message>, confirm: Option<&Arc<ConfirmHandle>>) {
        let size = msg.body.len() + msg.properties.len() + 64;
        let mut p = self.pending.lock();
        p.bytes += size;
        p.msgs.push((msg, confirm.cloned()));
        drop(p);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.in_flight_bytes.fetch_add(size, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// A message (by its replica id) left the leader's queue for good.
    pub fn settled(&self, id: u64) {
        self.returns.lock().remove(&id);
        self.pending.lock().settled.push(id);
        self.wake.notify_one();
    }

    /// Every message from `first` to `last` that is still in the queue left it.
    pub fn settled_run(&self, first: u64, last: u64) {
        self.returns
            .lock()
            .retain(|id, _| *id < first || *id > last);
        self.pending.lock().settled_runs.push((first, last));
        self.wake.notify_one();
    }

    /// An offer of `id` (and probably of the ones after it) waits for its claim.
    pub fn want_claims(&self, id: u64) {
        let mut w = self.claims_from.lock();
        *w = Some(w.map_or(id, |x| x.min(id)));
        drop(w);
        self.wake.notify_one();
    }

    /// `id` went out already (basic.get): record its claim in the next entry.
    pub fn claim_now(&self, id: u64) {
        if self.claiming.lock().insert(id) {
            self.pending.lock().claimed.push(id);
            self.wake.notify_one();
        }
    }

    /// A message went back to the leader's queue (requeued): its count of returns so far.
    pub fn returned(&self, id: u64) -> u32 {
        let n = {
            let mut r = self.returns.lock();
            let n = r.entry(id).or_insert(0);
            *n += 1;
            *n
        };
        self.pending.lock().returned.push(id);
        self.wake.notify_one();
        n
    }

    /// Publishes wait for replication beyond what the log keeps up with.
    pub fn pressured(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) >= PRESSURE_MSGS
            || self.in_flight_bytes.load(Ordering::Relaxed) >= PRESSURE_BYTES
    }

    pub async fn stall(&self, max: Duration) {
        crate::limits::wait_relief(&self.relieved, || self.pressured(), max).await
    }

    fn take(&self) -> Option<Batch> {
        let mut p = self.pending.lock();
        if p.msgs.is_empty()
            && p.settled.is_empty()
            && p.settled_runs.is_empty()
            && p.dead.is_empty()
            && p.returned.is_empty()
            && p.claimed.is_empty()
            && self.claims_from.lock().is_none()
        {
            return None;
        }
        let epoch = self.epoch.load(Ordering::Relaxed);
        if p.msgs.len() <= BATCH_MSGS && p.bytes <= BATCH_BYTES {
            let mut b = std::mem::take(&mut *p);
            b.epoch = epoch;
            return Some(b);
        }
        let mut n = 0;
        let mut bytes = 0;
        for (m, _) in &p.msgs {
            let b = m.body.len() + m.properties.len() + 64;
            if n > 0 && (n == BATCH_MSGS || bytes + b > BATCH_BYTES) {
                break;
            }
            n += 1;
            bytes += b;
        }
        let rest = p.msgs.split_off(n);
        let msgs = std::mem::replace(&mut p.msgs, rest);
        p.bytes -= bytes;
        Some(Batch {
            msgs,
            bytes,
            settled: std::mem::take(&mut p.settled),
            settled_runs: std::mem::take(&mut p.settled_runs),
            dead: std::mem::take(&mut p.dead),
            returned: std::mem::take(&mut p.returned),
            claimed: std::mem::take(&mut p.claimed),
            claim_new: 0,
            epoch,
        })
    }

    fn done(&self, n: usize, bytes: usize) {
        let was = self.pressured();
        self.in_flight.fetch_sub(n, Ordering::Relaxed);
        self.in_flight_bytes.fetch_sub(bytes, Ordering::Relaxed);
        if was && !self.pressured() {
            self.relieved.notify_waiters();
        }
    }
}

/// An entry: `[OP_ENQUEUE][n u32]([len u32][stored message])*n`, then the settled, returned
/// and claimed ids, each as `[m u32]([id u64])*m`, then `[claim_new u32][epoch u64]`, then the
/// settled runs `[r u32]([first u64][last u64])*r` and the kept dead letters
/// `[d u32]([id u64][len u32][stored message][k u16]([len u16][routing key])*k)*d` (both absent
/// from entries of earlier versions).
fn encode(batch: &Batch) -> Vec<u8> {
    let mut b = BytesMut::with_capacity(batch.bytes + 16 + batch.settled.len() * 8);
    b.put_u8(OP_ENQUEUE);
    b.put_u32(batch.msgs.len() as u32);
    for (m, _) in &batch.msgs {
        let at = b.len();
        b.put_u32(0);
        crate::persist::encode_message_into(&mut b, m, None);
        let len = (b.len() - at - 4) as u32;
        b[at..at + 4].copy_from_slice(&len.to_be_bytes());
    }
    for ids in [&batch.settled, &batch.returned, &batch.claimed] {
        b.put_u32(ids.len() as u32);
        for id in ids {
            b.put_u64(*id);
        }
    }
    b.put_u32(batch.claim_new);
    b.put_u64(batch.epoch);
    b.put_u32(batch.settled_runs.len() as u32);
    for (first, last) in &batch.settled_runs {
        b.put_u64(*first);
        b.put_u64(*last);
    }
    b.put_u32(batch.dead.len() as u32);
    for (id, m, cc) in &batch.dead {
        b.put_u64(*id);
        let at = b.len();
        b.put_u32(0);
        crate::persist::encode_message_into(&mut b, m, None);
        let len = (b.len() - at - 4) as u32;
        b[at..at + 4].copy_from_slice(&len.to_be_bytes());
        b.put_u16(cc.len() as u16);
        for k in cc {
            b.put_u16(k.len() as u16);
            b.put_slice(k.as_bytes());
        }
    }
    b.to_vec()
}

struct Decoded {
    msgs: Vec<Bytes>,
    settled: Vec<u64>,
    settled_runs: Vec<(u64, u64)>,
    dead: Vec<(u64, Bytes, Vec<ByteString>)>,
    returned: Vec<u64>,
    claimed: Vec<u64>,
    claim_new: u32,
    epoch: u64,
}

fn decode(command: Bytes) -> Option<Decoded> {
    let mut b = command;
    if b.remaining() < 5 || b.get_u8() != OP_ENQUEUE {
        return None;
    }
    let n = b.get_u32() as usize;
    let mut msgs = Vec::with_capacity(n.min(BATCH_MSGS * 2));
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
    let epoch = b.get_u64();
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
        epoch,
    })
}

/// The group's state machine on one member.
struct GroupSm {
    queue: std::sync::OnceLock<Weak<QuorumQueue>>,
    replica: Mutex<Replica>,
    /// One past the index of the entry applied last (or being applied).
    applied: Arc<AtomicU64>,
}

impl warren_cluster::StateMachine for GroupSm {
    fn apply(&self, index: u64, command: &[u8]) -> Vec<u8> {
        // Entries up to this one may be read back (a leader's tail reaches into it as it goes).
        self.applied.store(index + 1, Ordering::Release);
        let Some(d) = decode(Bytes::copy_from_slice(command)) else {
            tracing::error!(index, "undecodable queue entry skipped");
            return Vec::new();
        };
        let q = self.queue.get().and_then(Weak::upgrade);
        let mut r = self.replica.lock();
        // Under the replica's lock, so a leg being built sees each message exactly once.
        let leg = q.as_ref().and_then(|q| q.local_leg());
        let mut refused: Vec<u32> = Vec::new();
        let first_id = r.next_id;
        // Claims first: a claimed new message may go out as soon as it is enqueued.
        let claim_new = (d.claim_new as usize).min(d.msgs.len()) as u64;
        let new_claims = first_id..first_id + claim_new;
        for id in d.claimed.iter().copied().chain(new_claims.clone()) {
            if id >= first_id || r.holds(id) {
                r.delivered.insert(id);
            }
        }
        // An earlier leader's entry, applied after this node took over: what it claimed or
        // returned may have been delivered already.
        let foreign = q
            .as_ref()
            .is_some_and(|q| d.epoch != q.repl.epoch.load(Ordering::Relaxed));
        if let Some(leg) = &leg {
            if foreign && (!d.claimed.is_empty() || !d.returned.is_empty()) {
                leg.mark_redelivered(d.claimed.iter().chain(&d.returned).copied());
            }
            if !d.claimed.is_empty() || claim_new > 0 {
                leg.claimed(d.claimed.iter().copied().chain(new_claims.clone()));
            }
        }
        for (i, data) in d.msgs.into_iter().enumerate() {
            let id = r.next_id;
            r.next_id += 1;
            let size = crate::persist::stored_body_len(&data);
            if let (Some(leg), Some(q)) = (&leg, &q) {
                if let Some((msg, _)) = crate::persist::decode_message(&data) {
                    let seen = foreign && new_claims.contains(&id);
                    let at = LogPos {
                        index,
                        first_id,
                        next_id: id,
                    };
                    if leg.apply_committed(id, Some(at), q.delivery_form(msg, 0), seen) {
                        r.insert(id, size);
                    } else {
                        refused.push(i as u32);
                    }
                    continue;
                }
            }
            r.insert(id, size);
        }
        // Kept before the settlements: a dead letter taken at once is settled in the same entry.
        for (id, data, cc) in d.dead {
            if r.holds(id) {
                r.dead.insert(id, (data, cc));
            }
        }
        for id in d.settled {
            r.remove(id);
        }
        for (first, last) in d.settled_runs {
            let last = last.min(r.next_id.saturating_sub(1));
            for id in first.max(r.base)..=last {
                r.remove(id);
            }
        }
        for id in d.returned {
            if r.holds(id) {
                *r.returns.entry(id).or_insert(0) += 1;
            }
        }
        r.applied(index, command.len());
        drop(r);
        if let Some(q) = &q {
            let mut c = q.repl.claiming.lock();
            for id in &d.claimed {
                c.remove(id);
            }
        }
        // The other members hold the refused ones: settled in the next entry.
        if let Some(q) = &q {
            for i in &refused {
                q.repl.settled(first_id + u64::from(*i));
            }
        }
        // The positions in the entry of publishes the leader's queue refused (x-overflow
        // reject-publish): they never entered it, and their publishers get a nack.
        let mut out = Vec::with_capacity(refused.len() * 4);
        for i in refused {
            out.extend_from_slice(&i.to_be_bytes());
        }
        out
    }

    // Never called: `snapshot_point` always names a point.
    fn snapshot(&self) -> Vec<u8> {
        Vec::new()
    }

    /// As Ra does for a quorum queue, at the release cursor: the newest checkpoint below the
    /// oldest message still in the queue. Every message enqueued up to it has been settled, so
    /// the state there is the next id alone, and the entries after it (which hold every body
    /// still needed) are applied again from the log.
    fn snapshot_point(&self) -> warren_cluster::SnapshotPoint {
        let r = self.replica.lock();
        // A snapshot of the earlier format holds bodies nothing else has: kept until they go.
        if !r.legacy.is_empty() {
            return warren_cluster::SnapshotPoint::Unchanged;
        }
        match r.release() {
            Some((index, next_id)) => {
                let mut b = SNAPSHOT_MAGIC.to_vec();
                b.extend_from_slice(&next_id.to_be_bytes());
                warren_cluster::SnapshotPoint::At(index, b)
            }
            None => warren_cluster::SnapshotPoint::Unchanged,
        }
    }

    fn restore(&self, index: Option<u64>, snapshot: &[u8]) {
        let mut r = Replica::default();
        if let Some(point) = snapshot.strip_prefix(SNAPSHOT_MAGIC) {
            // `[next id u64]`: every message before it was settled.
            if let Ok(next) = <[u8; 8]>::try_from(point) {
                r.next_id = u64::from_be_bytes(next);
                r.base = r.next_id;
            }
        } else {
            restore_legacy(&mut r, snapshot);
        }
        // The log is read again from the entry after the snapshot's.
        if let Some(index) = index {
            r.start = Some((index, r.next_id));
        }
        *self.replica.lock() = r;
        // A leader's queue no longer matches: build it again from the new state.
        if let Some(q) = self.queue.get().and_then(Weak::upgrade) {
            q.retire_leg();
        }
    }
}

/// A snapshot of the earlier format: every message's body, returns and claim.
fn restore_legacy(r: &mut Replica, snapshot: &[u8]) {
    let mut b = Bytes::copy_from_slice(snapshot);
    if b.remaining() < 16 {
        return;
    }
    let next_id = b.get_u64();
    let n = b.get_u64();
    for _ in 0..n {
        if b.remaining() < 17 {
            break;
        }
        let id = b.get_u64();
        let returns = b.get_u32();
        let delivered = b.get_u8() == 1;
        let len = b.get_u32() as usize;
        if b.remaining() < len {
            break;
        }
        let data = b.split_to(len);
        r.insert(id, crate::persist::stored_body_len(&data));
        r.legacy.insert(id, data);
        if delivered {
            r.delivered.insert(id);
        }
        if returns > 0 {
            r.returns.insert(id, returns);
        }
    }
    r.next_id = next_id;
    if r.live == 0 {
        r.base = next_id;
    }
}

/// Where a message is in the group's log: the entry's index, the id of its first message, and
/// the id reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogPos {
    index: u64,
    first_id: u64,
    next_id: u64,
}

impl LogPos {
    /// At message `id`.
    pub fn is(&self, id: u64) -> bool {
        self.next_id == id
    }
}

/// The paged tail of a leader's queue, read back from the group's log: a replicated queue keeps
/// no second copy of a long queue's messages. The queue's state machine counts the tail; this
/// knows which ids it holds (runs, so a backlog costs a few words), where to read on, and what
/// the messages need when they come back (redelivered flag, returns, deadline).
pub struct LogTail {
    log: warren_cluster::LogReader,
    /// One past the last entry applied: nothing beyond is read (it may still change).
    applied: Arc<AtomicU64>,
    repl: Arc<Replicator>,
    /// Deliveries carry `x-delivery-count` (a quorum queue, not a mirrored classic one).
    counts: bool,
    at: Option<LogPos>,
    runs: VecDeque<(u64, u64)>,
    /// Ids an earlier leader may have delivered.
    seen: HashSet<u64>,
    /// Deadlines of tail messages that have one, by id.
    deadlines: VecDeque<(u64, u64)>,
    /// Ids up to this came from the replica when this node took over: their TTL starts again
    /// when they are read back (as it does for in-memory messages at a failover).
    recovered_max: Option<u64>,
}

impl LogTail {
    fn new(
        log: warren_cluster::LogReader,
        applied: Arc<AtomicU64>,
        repl: Arc<Replicator>,
        counts: bool,
    ) -> LogTail {
        LogTail {
            log,
            applied,
            repl,
            counts,
            at: None,
            runs: VecDeque::new(),
            seen: HashSet::new(),
            deadlines: VecDeque::new(),
            recovered_max: None,
        }
    }

    /// The queue pages out from the message at `at` on.
    pub fn start(&mut self, at: LogPos) {
        self.at = Some(at);
        self.runs.clear();
        self.deadlines.clear();
    }

    /// A new leader's whole queue, in the log from `from` on (see [`Queue::recover_tail`]).
    pub fn recover(&mut self, from: LogPos, runs: VecDeque<(u64, u64)>, seen: HashSet<u64>) {
        self.recovered_max = runs.back().map(|r| r.1);
        self.at = Some(from);
        self.runs = runs;
        self.seen = seen;
        self.deadlines.clear();
    }

    /// Message `id` joined the tail.
    pub fn push(&mut self, id: u64, expires_at_ms: Option<u64>) {
        match self.runs.back_mut() {
            Some(r) if r.1 + 1 == id => r.1 = id,
            _ => self.runs.push_back((id, id)),
        }
        if let Some(t) = expires_at_ms {
            self.deadlines.push_back((id, t));
        }
    }

    /// The whole tail left (purge, delete): settled in runs, without reading it back, if
    /// `settle` (not when the queue is retired: the messages stay in the group).
    pub fn forget(&mut self, settle: bool) {
        for (first, last) in self.runs.drain(..) {
            if settle {
                self.repl.settled_run(first, last);
            }
        }
        self.at = None;
        self.deadlines.clear();
        self.seen.clear();
    }

    fn holds(&self, id: u64) -> bool {
        let i = self.runs.partition_point(|r| r.1 < id);
        self.runs.get(i).is_some_and(|r| r.0 <= id)
    }

    /// Reads about `limits::PAGE_IN_BYTES` of the tail's messages back, in order; `ttl` is the
    /// queue's message TTL, for recovered messages.
    pub fn read(
        &mut self,
        remaining: usize,
        ttl: Option<u64>,
        now: &mut dyn FnMut() -> u64,
        out: &mut Vec<warren_queue::Entry<Arc<Message>>>,
    ) -> warren_queue::PagedIn {
        let mut read = warren_queue::PagedIn::default();
        let Some(mut at) = self.at else {
            return read;
        };
        let Some(last) = self.runs.back().map(|r| r.1) else {
            return read;
        };
        let applied = self.applied.load(Ordering::Acquire);
        let repl = self.repl.clone();
        let returns_so_far = repl.returns.lock();
        // Settled messages are skipped: read on until something is found (or the end).
        let mut done = false;
        while !done && read.records == 0 {
            let entries = match self.log.read(at.index, crate::limits::PAGE_IN_BYTES) {
                Ok(e) => e,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read a replicated queue's messages back from its log");
                    return read;
                }
            };
            done = entries.is_empty();
            'entries: for (index, cmd) in entries {
                if index >= applied {
                    done = true;
                    break;
                }
                if index != at.index {
                    tracing::error!(
                        index,
                        expected = at.index,
                        "a replicated queue's log skips an entry"
                    );
                    return read;
                }
                // As `GroupSm::apply` numbers them: an entry that does not decode has none.
                let msgs = cmd
                    .and_then(|c| decode(Bytes::from(c)))
                    .map(|d| d.msgs)
                    .unwrap_or_default();
                let n = msgs.len() as u64;
                for (i, data) in msgs.into_iter().enumerate() {
                    let id = at.first_id + i as u64;
                    if id < at.next_id {
                        continue;
                    }
                    if read.records == remaining || id > last {
                        done = true;
                        break 'entries;
                    }
                    at.next_id = id + 1;
                    if !self.holds(id) {
                        continue;
                    }
                    read.records += 1;
                    read.bytes += crate::persist::stored_body_len(&data);
                    let Some((msg, _)) = crate::persist::decode_message(&data) else {
                        tracing::warn!(id, "skipping a replicated message that does not decode");
                        continue;
                    };
                    let returns = returns_so_far.get(&id).copied().unwrap_or(0);
                    let msg = if self.counts {
                        crate::delayed::with_delivery_count(&msg, u64::from(returns))
                    } else {
                        msg
                    };
                    while self.deadlines.front().is_some_and(|d| d.0 < id) {
                        self.deadlines.pop_front();
                    }
                    let mut expires_at_ms =
                        self.deadlines.front().filter(|d| d.0 == id).map(|d| d.1);
                    if self.recovered_max.is_some_and(|m| id <= m) {
                        let t = match (ttl, warren_queue::Payload::expiration_ms(&msg)) {
                            (Some(x), Some(y)) => Some(x.min(y)),
                            (x, y) => x.or(y),
                        };
                        expires_at_ms = t.map(|t| now().saturating_add(t));
                    }
                    out.push(warren_queue::Entry {
                        seq: id,
                        msg: Arc::new(msg),
                        redelivered: self.seen.remove(&id) || returns > 0,
                        expires_at_ms,
                        logged: true,
                    });
                }
                // The whole entry is read: on to the next.
                at = LogPos {
                    index: index + 1,
                    first_id: at.first_id + n,
                    next_id: at.next_id.max(at.first_id + n),
                };
            }
        }
        while self.runs.front().is_some_and(|r| r.1 < at.next_id) {
            self.runs.pop_front();
        }
        if let Some(r) = self.runs.front_mut() {
            r.0 = r.0.max(at.next_id);
        }
        self.at = Some(at);
        read
    }
}

/// A replicated queue as one node sees it.
pub struct QuorumQueue {
    pub name: Arc<str>,
    pub vhost: Arc<str>,
    pub options: QueueOptions,
    args: arc_swap::ArcSwap<QueueArgs>,
    /// The group's id: the metadata index of the declare, the same on every node.
    pub group: u64,
    /// Node names, the initial leader first (changed by add_member / delete_member).
    members: parking_lot::RwLock<Vec<String>>,
    cluster: Weak<Cluster>,
    vhost_ref: Weak<VHost>,
    /// The leader's queue here, or a remote handle to the leader; none while there is none.
    leg: arc_swap::ArcSwapOption<QueueRef>,
    leg_changed: tokio::sync::Notify,
    sm: Arc<GroupSm>,
    repl: Arc<Replicator>,
    meta: Mutex<Option<warren_cluster::Meta>>,
    deleted: AtomicBool,
    /// Stops the tasks of this node's current role (member or not); replaced on a change.
    role: Mutex<tokio::sync::watch::Sender<bool>>,
}

/// Resolves once `stop` says so (or its sender is gone).
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

impl std::fmt::Debug for QuorumQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QuorumQueue({})", self.name)
    }
}

impl QuorumQueue {
    /// The queue as declared (or recovered) on this node: a member opens its group in the
    /// background (the first member bootstraps it); every node then follows its leader.
    pub fn open(
        name: Arc<str>,
        vhost: Arc<str>,
        options: QueueOptions,
        group: u64,
        members: Vec<String>,
        cluster: &Arc<Cluster>,
        vhost_ref: Weak<VHost>,
    ) -> Arc<QuorumQueue> {
        let q = Arc::new(QuorumQueue {
            name,
            vhost,
            args: arc_swap::ArcSwap::from_pointee(options.args.clone()),
            options,
            group,
            members: parking_lot::RwLock::new(members),
            cluster: Arc::downgrade(cluster),
            vhost_ref,
            leg: arc_swap::ArcSwapOption::empty(),
            leg_changed: tokio::sync::Notify::new(),
            sm: Arc::new(GroupSm {
                queue: std::sync::OnceLock::new(),
                replica: Mutex::new(Replica::default()),
                applied: Arc::new(AtomicU64::new(0)),
            }),
            repl: Arc::new(Replicator::default()),
            meta: Mutex::new(None),
            deleted: AtomicBool::new(false),
            role: Mutex::new(tokio::sync::watch::channel(false).0),
        });
        let _ = q.sm.queue.set(Arc::downgrade(&q));
        q.start_role(q.is_member(&cluster.me));
        q
    }

    /// Its members now.
    pub fn members(&self) -> Vec<String> {
        self.members.read().clone()
    }

    fn is_member(&self, node: &str) -> bool {
        self.members.read().iter().any(|m| m == node)
    }

    /// Stops the current role's tasks and starts a member's or a non-member's.
    fn start_role(self: &Arc<Self>, member: bool) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let old = std::mem::replace(&mut *self.role.lock(), tx);
        let _ = old.send(true);
        if member {
            tokio::spawn(self.clone().run_member(rx));
        } else {
            tokio::spawn(self.clone().run_follower(rx));
        }
    }

    /// The metadata changed its members (applied on every node): a node that joins opens an
    /// empty replica, which the group's leader fills; a node that leaves drops its replica.
    pub fn set_members(self: &Arc<Self>, members: Vec<String>) {
        let Some(c) = self.cluster.upgrade() else {
            return;
        };
        let was = self.is_member(&c.me);
        *self.members.write() = members;
        let is = self.is_member(&c.me);
        if was == is || self.is_deleted() {
            return;
        }
        if was {
            self.retire_leg();
            self.drop_replica(&c);
        }
        self.start_role(is);
    }

    /// Stops this node's member of the group and deletes its files.
    fn drop_replica(&self, c: &Cluster) {
        let meta = self.meta.lock().take();
        c.groups.write().remove(&self.group);
        let dir = self.dir(c);
        *self.sm.replica.lock() = Replica::default();
        if let Some(meta) = meta {
            tokio::spawn(async move {
                meta.shutdown().await;
                if let Some(d) = dir {
                    let _ = std::fs::remove_dir_all(d);
                }
            });
        }
    }

    fn dir(&self, c: &Cluster) -> Option<std::path::PathBuf> {
        let b = c.broker()?;
        Some(
            b.config
                .data_dir
                .join("quorum")
                .join(format!("{:016x}", self.group)),
        )
    }

    /// A member: opens the group, bootstraps it if this is its first member and it is new, then
    /// proposes the leader's batches and follows leadership until the queue is deleted.
    async fn run_member(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let Some(c) = self.cluster.upgrade() else {
            return;
        };
        let Some(dir) = self.dir(&c) else { return };
        let me = warren_cluster::Node {
            name: c.me.clone(),
            addr: c.addr.clone(),
        };
        let meta = match warren_cluster::Meta::open(
            &dir,
            me,
            self.sm.clone(),
            Arc::new(super::LinkTransport {
                links: c.links.clone(),
                service: SERVICE_QRAFT,
                group: Some(self.group),
            }),
            // Failover in 1-2 s: a queue's leader is what publishers wait for.
            warren_cluster::MetaConfig {
                election_timeout_min_ms: 600,
                election_timeout_max_ms: 1200,
                heartbeat_ms: 150,
                propose_timeout: Duration::from_secs(5),
                // Asked often; the replica answers with its release cursor, which moves only
                // every `CHECKPOINT_ENTRIES` entries and as messages are settled.
                snapshot_after: 64,
            },
        )
        .await
        {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(queue = %self.name, vhost = %self.vhost, error = %e, "cannot open the queue's replica");
                return;
            }
        };
        if self.deleted.load(Ordering::Acquire) || *stop.borrow() {
            meta.shutdown().await;
            return;
        }
        *self.meta.lock() = Some(meta.clone());
        c.groups.write().insert(self.group, meta.clone());
        drop(c);
        let first = self.members.read().first().cloned();
        if first.as_ref() == Some(&meta.status().me.name) && !meta.is_initialized() {
            let nodes: Vec<warren_cluster::Node> = {
                let Some(c) = self.cluster.upgrade() else {
                    return;
                };
                self.members()
                    .iter()
                    .filter_map(|n| {
                        c.addr_of(n).map(|addr| warren_cluster::Node {
                            name: n.clone(),
                            addr,
                        })
                    })
                    .collect()
            };
            if let Err(e) = meta.initialize_with(nodes).await {
                tracing::warn!(queue = %self.name, error = %e, "starting the queue's group");
            }
        }
        tokio::spawn(self.clone().propose_loop(meta.clone(), stop.clone()));
        tokio::spawn(self.clone().dead_letter_retries(stop.clone()));
        let mut status = meta.watch();
        loop {
            let (leader, me) = {
                let s = status.borrow_and_update();
                let leader = s.leader.and_then(|id| {
                    s.members
                        .iter()
                        .find(|m| m.id == id)
                        .map(|m| m.node.name.clone())
                });
                (leader, s.me.name.clone())
            };
            self.follow(leader, &me);
            tokio::select! {
                changed = status.changed() => if changed.is_err() { break },
                _ = stopped(&mut stop) => break,
            }
            if self.deleted.load(Ordering::Acquire) {
                break;
            }
        }
    }

    /// A non-member: asks the members who leads, and follows.
    async fn run_follower(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(LEADER_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stopped(&mut stop) => break,
            }
            if self.deleted.load(Ordering::Acquire) {
                break;
            }
            let Some(c) = self.cluster.upgrade() else {
                break;
            };
            let mut leader = None;
            for m in &self.members() {
                let Some(addr) = c.addr_of(m) else { continue };
                if !c.running(m) {
                    continue;
                }
                let asked = c
                    .links
                    .call(
                        &addr,
                        SERVICE_QLEADER,
                        &self.group.to_be_bytes(),
                        Duration::from_secs(1),
                    )
                    .await;
                if let Ok(b) = asked {
                    if !b.is_empty() {
                        leader = Some(String::from_utf8_lossy(&b).into_owned());
                        break;
                    }
                }
            }
            let me = c.me.clone();
            drop(c);
            if leader.is_some() || self.leg.load().is_none() {
                self.follow(leader, &me);
            }
        }
    }

    /// Installs the leg for `leader`, retiring the old one if it changed.
    fn follow(self: &Arc<Self>, leader: Option<String>, me: &str) {
        let current = self.leg.load_full();
        let same = match (&leader, current.as_deref()) {
            (Some(l), Some(QueueRef::Local(_))) => l == me,
            (Some(l), Some(QueueRef::Remote(r))) => *l == r.home && !r.is_deleted(),
            (None, None) => true,
            _ => false,
        };
        if same {
            return;
        }
        self.retire_leg();
        let Some(leader) = leader else { return };
        if self.deleted.load(Ordering::Acquire) {
            return;
        }
        let Some(c) = self.cluster.upgrade() else {
            return;
        };
        if leader == me {
            self.lead();
        } else {
            let r = RemoteQueue::new(
                self.name.clone(),
                self.vhost.clone(),
                self.options.clone(),
                leader.clone(),
                &c,
            );
            r.set_effective_args((**self.args.load()).clone());
            self.leg.store(Some(Arc::new(QueueRef::Remote(r))));
        }
        tracing::info!(vhost = %self.vhost, queue = %self.name, leader = %leader, "quorum queue leader");
        self.leg_changed.notify_waiters();
    }

    /// This node leads: its queue is built from the replica, its messages read back from the
    /// log as they are needed (all of them a paged tail); the messages an earlier leader
    /// claimed for delivery are marked redelivered.
    fn lead(self: &Arc<Self>) {
        let Some(log) = self.meta.lock().as_ref().map(|m| m.log().clone()) else {
            return;
        };
        let tail = LogTail::new(
            log,
            self.sm.applied.clone(),
            self.repl.clone(),
            !self.mirrored(),
        );
        let q = Queue::leader(
            self.name.clone(),
            self.vhost.clone(),
            self.options.clone(),
            self.vhost_ref.clone(),
            self.repl.clone(),
            tail,
        );
        q.set_effective_args((**self.args.load()).clone());
        let r = self.sm.replica.lock();
        // Under the replica's lock: every entry applied from here on knows this epoch.
        self.repl
            .epoch
            .store(rand::random::<u64>() | 1, Ordering::Relaxed);
        *self.repl.returns.lock() = r.returns.clone();
        // Claims still on their way are an earlier leg's: it may have delivered those.
        let pending_claims = self.repl.claiming.lock().clone();
        // Only what an earlier leader claimed (or that came back) may have been delivered; the
        // rest is new to every consumer.
        let seen = |id: &u64| {
            r.delivered.contains(id) || r.returns.contains_key(id) || pending_claims.contains(id)
        };
        let mut refused = Vec::new();
        // Dead letters an earlier leader kept (at-least-once) are sent again, not queued.
        {
            let mut dead = self.repl.dead.lock();
            dead.clear();
            for (id, (data, cc)) in &r.dead {
                if let Some((msg, _)) = crate::persist::decode_message(data) {
                    let kept = DeadKept {
                        msg: Arc::new(msg),
                        cc: cc.clone(),
                        sent: false,
                    };
                    dead.insert(*id, kept);
                }
            }
        }
        // Bodies from a snapshot of an earlier version come first, from memory.
        for (id, data) in r.legacy.iter().filter(|(id, _)| !r.dead.contains_key(id)) {
            match crate::persist::decode_message(data) {
                Some((msg, _)) => {
                    let n = r.returns.get(id).copied().unwrap_or(0);
                    let msg = self.delivery_form(msg, n);
                    if !q.apply_committed(*id, None, msg, seen(id)) {
                        refused.push(*id);
                    }
                }
                None => {
                    tracing::warn!(queue = %self.name, id, "skipping a replicated message that does not decode");
                    refused.push(*id);
                }
            }
        }
        let mut runs: VecDeque<(u64, u64)> = VecDeque::new();
        let (mut count, mut bytes) = (0usize, 0u64);
        let mut seen_ids = HashSet::new();
        for id in r
            .ids_from(0)
            .filter(|id| !r.legacy.contains_key(id) && !r.dead.contains_key(id))
        {
            match runs.back_mut() {
                Some(run) if run.1 + 1 == id => run.1 = id,
                _ => runs.push_back((id, id)),
            }
            count += 1;
            bytes += u64::from(r.sizes[(id - r.base) as usize]);
            if seen(&id) {
                seen_ids.insert(id);
            }
        }
        // From the newest checkpoint before them all, else the snapshot restored, else the
        // group's first entry.
        let (index, next_id) = r.release().or(r.start).map_or((0, 0), |(i, n)| (i + 1, n));
        let from = LogPos {
            index,
            first_id: next_id,
            next_id,
        };
        q.recover_tail(r.next_id, from, runs, seen_ids, count, bytes);
        self.leg.store(Some(Arc::new(QueueRef::Local(q.clone()))));
        drop(r);
        for id in refused {
            self.repl.settled(id);
        }
        q.send_dead_kept(&self.repl);
    }

    /// A message as the leader's queue holds it: a quorum queue's deliveries carry
    /// `x-delivery-count` (0 on the first), as RabbitMQ 3.10's do; a mirrored classic queue's
    /// do not.
    fn delivery_form(&self, msg: Message, returns: u32) -> Arc<Message> {
        if self.mirrored() {
            return Arc::new(msg);
        }
        Arc::new(crate::delayed::with_delivery_count(
            &msg,
            u64::from(returns),
        ))
    }

    /// The leader's queue, when this node leads.
    fn local_leg(&self) -> Option<Arc<Queue>> {
        match self.leg.load().as_deref() {
            Some(QueueRef::Local(q)) => Some(q.clone()),
            _ => None,
        }
    }

    /// Drops the current leg: its consumers here are cancelled (they consume again, from the
    /// new leader); a local queue stops replicating first, so what it drops is not settled.
    fn retire_leg(&self) {
        crate::channel::notify_cancelled(&self.take_leg());
    }

    /// Takes the leg away and retires it; returns its consumers here.
    fn take_leg(&self) -> Vec<Arc<Consumer>> {
        match self.leg.swap(None).as_deref() {
            Some(QueueRef::Local(q)) => q.retire(),
            Some(QueueRef::Remote(r)) => r.mark_deleted().1,
            _ => Vec::new(),
        }
    }

    /// Proposes the leader queue's publishes and settlements, a batch per entry, and completes
    /// the publishes' confirms once committed.
    async fn propose_loop(
        self: Arc<Self>,
        meta: warren_cluster::Meta,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        type Pending = std::pin::Pin<
            Box<
                dyn std::future::Future<Output = Result<Vec<u8>, warren_cluster::ProposeError>>
                    + Send,
            >,
        >;
        // Entries in flight, oldest first: a batch waits for the group only while the window
        // is full, so commits of consecutive batches overlap (each is one fsync per member).
        let mut in_flight: std::collections::VecDeque<(Pending, Batch)> = Default::default();
        loop {
            while in_flight.len() < PIPELINE {
                let Some(mut batch) = self.repl.take() else {
                    break;
                };
                self.claim(&mut batch);
                let cmd = encode(&batch);
                let fut: Pending = match meta.submit(cmd.clone()).await {
                    Some(f) => Box::pin(f),
                    // Not the leader (any more): through whoever leads, one at a time.
                    None => {
                        let m = meta.clone();
                        Box::pin(async move { m.propose(cmd).await })
                    }
                };
                in_flight.push_back((fut, batch));
            }
            let room = in_flight.len() < PIPELINE;
            if let Some((fut, _)) = in_flight.front_mut() {
                let r = tokio::select! {
                    r = fut => Some(r),
                    _ = self.repl.wake.notified(), if room => None,
                    _ = stopped(&mut stop) => return,
                };
                let Some(r) = r else { continue };
                if let Some((_, batch)) = in_flight.pop_front() {
                    self.finish(batch, r);
                }
                continue;
            }
            if self.deleted.load(Ordering::Acquire) {
                return;
            }
            tokio::select! {
                _ = self.repl.wake.notified() => {}
                _ = stopped(&mut stop) => return,
            }
        }
    }

    /// Sends again, every second, the kept dead letters that could not be routed or were
    /// refused (RabbitMQ's at-least-once dead-lettering retries them too).
    async fn dead_letter_retries(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(DEAD_LETTER_RETRY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stopped(&mut stop) => return,
            }
            if self.deleted.load(Ordering::Acquire) {
                return;
            }
            if self.repl.has_dead_to_send() {
                if let Some(q) = self.local_leg() {
                    q.send_dead_kept(&self.repl);
                }
            }
        }
    }

    /// Completes a batch's confirms from its entry's outcome. Without a reply (not committed in
    /// time, no leader) every publish is nacked: the entry may still commit, so a publisher
    /// that resends may duplicate.
    fn finish(&self, batch: Batch, r: Result<Vec<u8>, warren_cluster::ProposeError>) {
        let n = batch.msgs.len();
        let bytes = batch.bytes;
        let refused: Option<Vec<usize>> = match r {
            Ok(reply) => Some(
                reply
                    .chunks_exact(4)
                    .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
                    .collect(),
            ),
            Err(e) => {
                tracing::warn!(queue = %self.name, vhost = %self.vhost, messages = n, error = %e, "replicating publishes failed; they are nacked");
                None
            }
        };
        let handles = batch
            .msgs
            .into_iter()
            .enumerate()
            .filter_map(|(i, (_, h))| h.map(|h| (i, h)));
        crate::confirm::complete_all(handles.map(|(i, h)| {
            let ok = refused.as_ref().is_some_and(|r| !r.contains(&i));
            (h, ok)
        }));
        self.repl.done(n, bytes);
    }

    /// Adds the claims this batch should carry: the new messages consumers are waiting for, and
    /// unclaimed ones from the lowest an offer was held back for (a window, so a backlog drains
    /// a window per entry; a new leader marks at most that many never-delivered messages).
    fn claim(&self, batch: &mut Batch) {
        let Some(leg) = self.local_leg() else {
            self.repl.claims_from.lock().take();
            return;
        };
        batch.claim_new = leg.spare_credit().min(batch.msgs.len()) as u32;
        let Some(from) = self.repl.claims_from.lock().take() else {
            return;
        };
        let r = self.sm.replica.lock();
        let mut claiming = self.repl.claiming.lock();
        for id in r.ids_from(from) {
            if batch.claimed.len() >= CLAIM_WINDOW {
                break;
            }
            if !r.delivered.contains(&id) && claiming.insert(id) {
                batch.claimed.push(id);
            }
        }
    }

    /// Waits until this node knows the leader (a fresh declare waits for the first election).
    pub async fn wait_leader(&self, max: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + max;
        loop {
            let changed = self.leg_changed.notified();
            if self.leg.load().is_some() {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.leg.load().is_some();
            }
        }
    }

    /// The leader's leg on this node, if there is a leader.
    pub fn leg(&self) -> Option<QueueRef> {
        self.leg.load().as_deref().cloned()
    }

    /// A classic queue replicated because an `ha-mode` policy matched it (RabbitMQ's mirrored
    /// queue): listed as `classic`, with its mirrors.
    pub fn mirrored(&self) -> bool {
        !crate::queue_type::is_quorum(&self.options.arguments)
    }

    /// The leader's name, if known.
    pub fn leader(&self) -> Option<String> {
        let c = self.cluster.upgrade()?;
        match self.leg.load().as_deref()? {
            QueueRef::Local(_) => Some(c.me.clone()),
            QueueRef::Remote(r) => Some(r.home.clone()),
            _ => None,
        }
    }

    /// The group's leader as this member's Raft sees it (answers [`SERVICE_QLEADER`]).
    pub fn raft_leader(meta: &warren_cluster::Meta) -> Option<String> {
        let s = meta.status();
        let id = s.leader?;
        s.members
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.node.name.clone())
    }

    pub fn args(&self) -> arc_swap::Guard<Arc<QueueArgs>> {
        self.args.load()
    }

    pub fn set_effective_args(&self, a: QueueArgs) {
        if let Some(l) = self.leg() {
            l.set_effective_args(a.clone());
        }
        self.args.store(Arc::new(a));
    }

    pub fn describe(&self) -> String {
        format!("queue '{}' in vhost '{}'", self.name, self.vhost)
    }

    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    /// No leader known: the answer to what needs one.
    pub fn unavailable(&self) -> AmqpError {
        AmqpError::not_found(format!(
            "{} has no leader: a majority of its members ({}) is down, or an election is under way",
            self.describe(),
            self.members().join(", ")
        ))
    }

    /// Deleted (applied on every node): the leg goes, the group stops and its files with it.
    pub fn mark_deleted(&self) -> (u32, Vec<Arc<Consumer>>) {
        self.deleted.store(true, Ordering::Release);
        let ready = self.leg().map_or(0, |l| match l {
            QueueRef::Local(q) => q.message_count(),
            _ => 0,
        });
        let consumers = self.take_leg();
        let _ = self.role.lock().send(true);
        if let Some(c) = self.cluster.upgrade() {
            self.drop_replica(&c);
        }
        (ready, consumers)
    }
}

/// A member's side of [`SERVICE_QMEMBER`].
pub async fn serve_member_change(c: &Arc<Cluster>, body: &[u8]) -> Result<Bytes, String> {
    if body.len() < 9 {
        return Err("short request".into());
    }
    let group = u64::from_be_bytes(body[..8].try_into().map_err(|_| "short request")?);
    let add = body[8] == 1;
    let name = String::from_utf8_lossy(&body[9..]).into_owned();
    let meta = c.groups.read().get(&group).cloned();
    let meta = meta.ok_or_else(|| format!("not a member of queue group {group:016x}"))?;
    change_group(c, &meta, &name, add).await?;
    Ok(Bytes::new())
}

async fn change_group(
    c: &Cluster,
    meta: &warren_cluster::Meta,
    name: &str,
    add: bool,
) -> Result<(), String> {
    if add {
        let addr = c
            .addr_of(name)
            .ok_or_else(|| format!("{name} is not a cluster member"))?;
        meta.add_voter(warren_cluster::Node {
            name: name.to_string(),
            addr,
        })
        .await
        .map_err(|e| e.to_string())
    } else {
        meta.remove(warren_cluster::node_id(name))
            .await
            .map_err(|e| e.to_string())
    }
}

impl Cluster {
    /// `add_member` / `delete_member`: adds `node` to (or removes it from) a replicated queue's
    /// members. A new member first opens an empty replica (through the metadata), then the
    /// group adds it and its leader sends it the log; a member leaves the group first, then
    /// the metadata, so the group never counts on a node that has dropped its replica.
    pub async fn change_queue_member(
        self: &Arc<Self>,
        vhost: &str,
        queue: &str,
        node: &str,
        add: bool,
    ) -> Result<(), crate::access::MgmtError> {
        use crate::access::MgmtError;
        let b = self
            .broker()
            .ok_or_else(|| MgmtError::Internal("stopping".into()))?;
        let q = b
            .vhost(vhost)
            .and_then(|v| v.queue(queue))
            .ok_or_else(|| MgmtError::NotFound(format!("no queue '{queue}' in vhost '{vhost}'")))?;
        let q = q.quorum().cloned().ok_or_else(|| {
            MgmtError::BadRequest(format!(
                "queue '{queue}' in vhost '{vhost}' is not a quorum queue"
            ))
        })?;
        if self.addr_of(node).is_none() {
            return Err(MgmtError::BadRequest(format!(
                "{node} is not a member of the cluster"
            )));
        }
        let mut members = q.members();
        let present = members.iter().any(|m| m == node);
        if add == present {
            return Ok(());
        }
        if !add && members.len() == 1 {
            return Err(MgmtError::BadRequest(format!(
                "cannot remove the last member of queue '{queue}' in vhost '{vhost}'"
            )));
        }
        let set = |members: Vec<String>| MetaOp::QueueMembers {
            vhost: vhost.to_string(),
            queue: queue.to_string(),
            members,
        };
        // The members that run the group already: one of them makes the change (a new
        // member knows no leader yet).
        let old: Vec<String> = members.iter().filter(|m| *m != node).cloned().collect();
        if add {
            members.push(node.to_string());
            self.propose_mgmt(set(members.clone())).await?;
        }
        let mut body = q.group.to_be_bytes().to_vec();
        body.push(if add { 1 } else { 2 });
        body.extend_from_slice(node.as_bytes());
        let local = if old.contains(&self.me) {
            self.groups.read().get(&q.group).cloned()
        } else {
            None
        };
        let changed = match local {
            Some(meta) => change_group(self, &meta, node, add).await,
            None => {
                let mut done = Err("no member of the queue is running".to_string());
                for m in old.iter().filter(|m| self.running(m)) {
                    let Some(addr) = self.addr_of(m) else {
                        continue;
                    };
                    done = self
                        .links
                        .call(&addr, SERVICE_QMEMBER, &body, Duration::from_secs(15))
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string());
                    if done.is_ok() {
                        break;
                    }
                }
                done
            }
        };
        if let Err(e) = changed {
            if add {
                // The group did not take it: the new member's empty replica goes again.
                members.retain(|m| m != node);
                let _ = self.propose_mgmt(set(members)).await;
            }
            return Err(MgmtError::Unavailable(format!(
                "changing the members of queue '{queue}' in vhost '{vhost}': {e}"
            )));
        }
        if !add {
            members.retain(|m| m != node);
            self.propose_mgmt(set(members)).await?;
        }
        tracing::info!(vhost, queue, node, add, "quorum queue members changed");
        Ok(())
    }
}

/// How many members (or which) an `ha-mode` policy asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Ha {
    Size(usize),
    Nodes(Vec<String>),
}

/// RabbitMQ's `ha-mode` / `ha-params`: `all` (every node), `exactly` N (N nodes, the leader
/// included; 2 is taken as 3), `nodes` [names]. `None` without a (valid) `ha-mode`.
pub fn ha_members(definition: &serde_json::Map<String, serde_json::Value>) -> Option<Ha> {
    let params = definition.get("ha-params");
    match definition.get("ha-mode")?.as_str()? {
        "all" => Some(Ha::Size(usize::MAX)),
        // A Raft group of 2 cannot elect a leader once one member is gone, where RabbitMQ
        // promotes the mirror: 2 becomes 3, so losing one node loses nothing, as users expect.
        "exactly" => {
            let n = params?.as_i64().filter(|n| *n >= 1)?;
            Some(Ha::Size(if n == 2 { 3 } else { n as usize }))
        }
        "nodes" => {
            let nodes: Vec<String> = params?
                .as_array()?
                .iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect();
            (!nodes.is_empty()).then_some(Ha::Nodes(nodes))
        }
        _ => None,
    }
}

/// `x-quorum-initial-group-size`, default 3, at most the cluster's size.
pub fn initial_group_size(args: &warren_protocol::FieldTable) -> AmqpResult<usize> {
    match args.get("x-quorum-initial-group-size") {
        None => Ok(3),
        Some(v) => match v.as_i64() {
            Some(n) if n >= 1 => Ok(n as usize),
            _ => Err(AmqpError::precondition_failed(
                "invalid arg 'x-quorum-initial-group-size': must be a positive integer".to_string(),
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ha_policies_map_to_group_sizes_and_nodes() {
        let def = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
        assert_eq!(
            ha_members(&def(serde_json::json!({"ha-mode": "all"}))),
            Some(Ha::Size(usize::MAX))
        );
        assert_eq!(
            ha_members(&def(
                serde_json::json!({"ha-mode": "exactly", "ha-params": 2})
            )),
            Some(Ha::Size(3)),
            "two members could not survive the loss of one"
        );
        assert_eq!(
            ha_members(&def(
                serde_json::json!({"ha-mode": "exactly", "ha-params": 5})
            )),
            Some(Ha::Size(5))
        );
        assert_eq!(
            ha_members(&def(
                serde_json::json!({"ha-mode": "nodes", "ha-params": ["a@h", "b@h"]})
            )),
            Some(Ha::Nodes(vec!["a@h".into(), "b@h".into()]))
        );
        assert_eq!(
            ha_members(&def(serde_json::json!({"ha-mode": "exactly"}))),
            None
        );
        assert_eq!(ha_members(&def(serde_json::json!({"max-length": 3}))), None);
    }

    #[test]
    fn entries_round_trip() {
        let m = Arc::new(Message {
            exchange: "x".into(),
            routing_key: "k".into(),
            properties: Bytes::from_static(&[0, 0]),
            body: Bytes::from_static(b"hello"),
            persistent: true,
            priority: None,
            expiration_ms: None,
        });
        let m_dead = m.clone();
        let batch = Batch {
            msgs: vec![(m.clone(), None), (m, None)],
            bytes: 10,
            settled: vec![3, 9],
            returned: vec![4],
            claimed: vec![7, 8],
            claim_new: 1,
            epoch: 42,
            settled_runs: vec![(100, 200)],
            dead: vec![(5, m_dead, vec![ByteString::from_static("cc-key")])],
        };
        let d = decode(Bytes::from(encode(&batch))).expect("decodes");
        assert_eq!(d.msgs.len(), 2);
        assert_eq!(d.settled, [3, 9]);
        assert_eq!(d.returned, [4]);
        assert_eq!(d.claimed, [7, 8]);
        assert_eq!(d.claim_new, 1);
        assert_eq!(d.epoch, 42);
        assert_eq!(d.settled_runs, [(100, 200)]);
        assert_eq!(d.dead.len(), 1);
        assert_eq!(d.dead[0].0, 5);
        assert_eq!(&*d.dead[0].2[0], "cc-key");
        let (back, _) = crate::persist::decode_message(&d.msgs[0]).expect("a stored message");
        assert_eq!(&back.body[..], b"hello");
        let whole = encode(&batch);
        assert!(
            decode(Bytes::copy_from_slice(&whole[..7])).is_none(),
            "a cut entry is refused"
        );
        // Entries of earlier versions end before the dead letters, or before the runs too.
        let no_dead = encode(&Batch {
            dead: Vec::new(),
            ..batch
        });
        let runs_only =
            decode(Bytes::copy_from_slice(&no_dead[..no_dead.len() - 4])).expect("decodes");
        assert_eq!(runs_only.settled_runs, [(100, 200)]);
        assert!(runs_only.dead.is_empty());
        let old = decode(Bytes::copy_from_slice(&no_dead[..no_dead.len() - 24])).expect("decodes");
        assert_eq!(old.epoch, 42);
        assert!(old.settled_runs.is_empty());
    }

    #[test]
    fn a_snapshot_of_the_earlier_format_keeps_its_bodies() {
        use warren_cluster::StateMachine;
        let m = Message {
            exchange: "".into(),
            routing_key: "q".into(),
            properties: Bytes::from_static(&[0, 0]),
            body: Bytes::from_static(b"kept body"),
            persistent: true,
            priority: None,
            expiration_ms: None,
        };
        let stored = crate::persist::encode_message(&m, None);
        // `[next_id][n]([id][returns u32][delivered u8][len u32][stored])*n`
        let mut old = BytesMut::new();
        old.put_u64(12);
        old.put_u64(2);
        for (id, returns, delivered) in [(7u64, 2u32, 0u8), (9, 0, 1)] {
            old.put_u64(id);
            old.put_u32(returns);
            old.put_u8(delivered);
            old.put_u32(stored.len() as u32);
            old.put_slice(&stored);
        }
        let sm = GroupSm {
            queue: std::sync::OnceLock::new(),
            replica: Mutex::new(Replica::default()),
            applied: Arc::new(AtomicU64::new(0)),
        };
        sm.restore(Some(40), &old);
        {
            let r = sm.replica.lock();
            assert_eq!((r.next_id, r.live, r.live_bytes), (12, 2, 18));
            assert!(r.holds(7) && r.holds(9) && !r.holds(8));
            assert_eq!(r.legacy.len(), 2);
            assert_eq!(r.returns.get(&7), Some(&2));
            assert!(r.delivered.contains(&9));
            assert_eq!(r.start, Some((40, 12)));
        }
        // Its bodies are nowhere else: no snapshot replaces it while they are in the queue.
        assert!(matches!(
            sm.snapshot_point(),
            warren_cluster::SnapshotPoint::Unchanged
        ));
        sm.replica.lock().remove(7);
        sm.replica.lock().remove(9);
        assert!(sm.replica.lock().legacy.is_empty());
        // And a snapshot of the new format is the next id alone.
        sm.restore(Some(50), b"WQS2\0\0\0\0\0\0\0\x20");
        let r = sm.replica.lock();
        assert_eq!(
            (r.next_id, r.base, r.live, r.start),
            (32, 32, 0, Some((50, 32)))
        );
    }

    #[test]
    fn replica_keeps_sizes_and_a_release_point() {
        let mut r = Replica::default();
        // Entries of 10 messages each, 100 bytes a body.
        for index in 1..=1000u64 {
            for _ in 0..10 {
                let id = r.next_id;
                r.next_id += 1;
                r.insert(id, 100);
            }
            r.applied(index, 1100);
        }
        assert_eq!((r.live, r.live_bytes), (10_000, 1_000_000));
        // Nothing settled: no snapshot can be taken past the first message.
        assert_eq!(r.release(), None);
        // The first 5,000 settled (a purge's run, as apply does it), one more out of order.
        for id in 0..5000 {
            r.remove(id);
        }
        r.remove(7000);
        assert!(!r.holds(7000) && r.holds(6999) && r.holds(5000) && !r.holds(4999));
        assert_eq!(r.oldest(), 5000);
        assert_eq!((r.live, r.live_bytes), (4999, 499_900));
        assert_eq!(r.sizes.len(), 5000, "the front is always in the queue");
        r.applied(1001, 10);
        let (index, next) = r.release().expect("a release point");
        assert!(next <= 5000 && index <= 500, "{index} {next}");
        assert!(
            index >= 256,
            "the newest checkpoint before the oldest message: {index}"
        );
        assert_eq!(r.checkpoints.len(), 3, "the older ones are dropped");
        assert_eq!(
            r.ids_from(6998).take(3).collect::<Vec<_>>(),
            [6998, 6999, 7001]
        );
        // All gone: the release point is the newest checkpoint (at most a checkpoint's worth of
        // log is kept behind an empty queue).
        for id in 5000..10_000 {
            r.remove(id);
        }
        assert_eq!((r.live, r.live_bytes, r.sizes.len()), (0, 0, 0));
        r.applied(1002, 10);
        assert_eq!(r.release(), Some((768, 7680)));
        assert_eq!(r.checkpoints.len(), 1);
        // A message after a gap of settled ones.
        r.insert(10_005, 7);
        assert_eq!((r.base, r.oldest()), (10_005, 10_005));
    }
}
