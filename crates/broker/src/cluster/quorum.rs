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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use parking_lot::Mutex;

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

/// Publishes proposed in one entry at most (bounds an entry's size and a confirm's wait).
const BATCH_MSGS: usize = 2048;
const BATCH_BYTES: usize = 4 << 20;
/// Publishes waiting for their entry beyond which the queue counts as pressured (publishers
/// stall, as for a queue whose consumers fall behind).
const PRESSURE_MSGS: usize = 16_384;
/// Entries one queue keeps in flight.
const PIPELINE: usize = 4;
/// Messages claimed for delivery ahead of need, per entry.
const CLAIM_WINDOW: usize = 512;
/// How often a non-member asks the members who leads.
const LEADER_POLL: Duration = Duration::from_millis(500);
/// How long a declare waits for the new group to elect its first leader.
pub const FIRST_LEADER_WAIT: Duration = Duration::from_secs(15);

const OP_ENQUEUE: u8 = 1;

/// A member's copy of the queue: every message enqueued and not yet settled, by id, and how
/// often each was returned (requeued) so far.
#[derive(Default)]
struct Replica {
    next_id: u64,
    msgs: BTreeMap<u64, Bytes>,
    returns: HashMap<u64, u32>,
    /// Claimed by a leader for delivery: a later leader marks them redelivered.
    delivered: HashSet<u64>,
}

/// Publishes and settlements waiting to be proposed.
#[derive(Default)]
struct Batch {
    msgs: Vec<(Arc<Message>, Option<Arc<ConfirmHandle>>)>,
    bytes: usize,
    settled: Vec<u64>,
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
    /// Publishes accepted and not yet confirmed or refused.
    in_flight: AtomicUsize,
    relieved: tokio::sync::Notify,
    /// Returns so far of the leader queue's messages that were returned at least once.
    returns: Mutex<HashMap<u64, u32>>,
    /// Claims asked for: the lowest unclaimed id an offer was held back for, and the ids
    /// proposed and not yet committed (not asked for twice).
    claims_from: Mutex<Option<u64>>,
    claiming: Mutex<HashSet<u64>>,
    /// Set afresh each time this node starts leading. An entry proposed under another epoch
    /// (an earlier leader's, committed after this node took over) may carry claims that leader
    /// acted on: its claimed messages may have been delivered, so they are marked redelivered.
    epoch: AtomicU64,
}

impl Replicator {
    /// A publish to replicate; its confirm (if any) is completed once it is committed.
    pub fn submit(&self, msg: Arc<Message>, confirm: Option<&Arc<ConfirmHandle>>) {
        let mut p = self.pending.lock();
        p.bytes += msg.body.len() + msg.properties.len() + 64;
        p.msgs.push((msg, confirm.cloned()));
        drop(p);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// A message (by its replica id) left the leader's queue for good.
    pub fn settled(&self, id: u64) {
        self.returns.lock().remove(&id);
        self.pending.lock().settled.push(id);
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
    }

    pub async fn stall(&self, max: Duration) {
        crate::limits::wait_relief(&self.relieved, || self.pressured(), max).await
    }

    fn take(&self) -> Option<Batch> {
        let mut p = self.pending.lock();
        if p.msgs.is_empty()
            && p.settled.is_empty()
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
            returned: std::mem::take(&mut p.returned),
            claimed: std::mem::take(&mut p.claimed),
            claim_new: 0,
            epoch,
        })
    }

    fn done(&self, n: usize) {
        let before = self.in_flight.fetch_sub(n, Ordering::Relaxed);
        if before >= PRESSURE_MSGS && before - n < PRESSURE_MSGS {
            self.relieved.notify_waiters();
        }
    }
}

/// An entry: `[OP_ENQUEUE][n u32]([len u32][stored message])*n`, then the settled, returned
/// and claimed ids, each as `[m u32]([id u64])*m`, then `[claim_new u32][epoch u64]`.
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
    b.to_vec()
}

struct Decoded {
    msgs: Vec<Bytes>,
    settled: Vec<u64>,
    returned: Vec<u64>,
    claimed: Vec<u64>,
    claim_new: u32,
    epoch: u64,
}

fn decode(command: &[u8]) -> Option<Decoded> {
    let mut b = Bytes::copy_from_slice(command);
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
    Some(Decoded {
        msgs,
        settled,
        returned,
        claimed,
        claim_new: b.get_u32(),
        epoch: b.get_u64(),
    })
}

/// The group's state machine on one member.
struct GroupSm {
    queue: std::sync::OnceLock<Weak<QuorumQueue>>,
    replica: Mutex<Replica>,
}

impl warren_cluster::StateMachine for GroupSm {
    fn apply(&self, index: u64, command: &[u8]) -> Vec<u8> {
        let Some(d) = decode(command) else {
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
            if id >= first_id || r.msgs.contains_key(&id) {
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
            if let (Some(leg), Some(q)) = (&leg, &q) {
                if let Some((msg, _)) = crate::persist::decode_message(&data) {
                    let seen = foreign && new_claims.contains(&id);
                    if leg.apply_committed(id, q.delivery_form(msg, 0), seen) {
                        r.msgs.insert(id, data);
                    } else {
                        refused.push(i as u32);
                    }
                    continue;
                }
            }
            r.msgs.insert(id, data);
        }
        for id in d.settled {
            r.msgs.remove(&id);
            r.returns.remove(&id);
            r.delivered.remove(&id);
        }
        for id in d.returned {
            if r.msgs.contains_key(&id) {
                *r.returns.entry(id).or_insert(0) += 1;
            }
        }
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

    fn snapshot(&self) -> Vec<u8> {
        let r = self.replica.lock();
        let mut b = BytesMut::new();
        b.put_u64(r.next_id);
        b.put_u64(r.msgs.len() as u64);
        for (id, data) in &r.msgs {
            b.put_u64(*id);
            b.put_u32(r.returns.get(id).copied().unwrap_or(0));
            b.put_u8(r.delivered.contains(id) as u8);
            b.put_u32(data.len() as u32);
            b.put_slice(data);
        }
        b.to_vec()
    }

    fn restore(&self, snapshot: &[u8]) {
        let mut b = Bytes::copy_from_slice(snapshot);
        let mut r = Replica::default();
        if b.remaining() >= 16 {
            r.next_id = b.get_u64();
            let n = b.get_u64();
            for _ in 0..n {
                if b.remaining() < 17 {
                    break;
                }
                let id = b.get_u64();
                let returns = b.get_u32();
                if b.get_u8() == 1 {
                    r.delivered.insert(id);
                }
                let len = b.get_u32() as usize;
                if b.remaining() < len {
                    break;
                }
                r.msgs.insert(id, b.split_to(len));
                if returns > 0 {
                    r.returns.insert(id, returns);
                }
            }
        }
        *self.replica.lock() = r;
        // A leader's queue no longer matches: build it again from the new state.
        if let Some(q) = self.queue.get().and_then(Weak::upgrade) {
            q.retire_leg();
        }
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
                snapshot_after: 20_000,
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

    /// This node leads: its queue is built from the replica; the messages an earlier leader
    /// claimed for delivery are marked redelivered.
    fn lead(self: &Arc<Self>) {
        let q = Queue::leader(
            self.name.clone(),
            self.vhost.clone(),
            self.options.clone(),
            self.vhost_ref.clone(),
            self.repl.clone(),
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
        let mut refused = Vec::new();
        for (id, data) in &r.msgs {
            match crate::persist::decode_message(data) {
                Some((msg, _)) => {
                    let n = r.returns.get(id).copied().unwrap_or(0);
                    let msg = self.delivery_form(msg, n);
                    // Only what an earlier leader claimed (or that came back) may have been
                    // delivered; the rest is new to every consumer.
                    let seen = r.delivered.contains(id)
                        || r.returns.contains_key(id)
                        || pending_claims.contains(id);
                    if !q.apply_committed(*id, msg, seen) {
                        refused.push(*id);
                    }
                }
                None => {
                    tracing::warn!(queue = %self.name, id, "skipping a replicated message that does not decode");
                    refused.push(*id);
                }
            }
        }
        self.leg.store(Some(Arc::new(QueueRef::Local(q))));
        drop(r);
        for id in refused {
            self.repl.settled(id);
        }
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

    /// Completes a batch's confirms from its entry's outcome. Without a reply (not committed in
    /// time, no leader) every publish is nacked: the entry may still commit, so a publisher
    /// that resends may duplicate.
    fn finish(&self, batch: Batch, r: Result<Vec<u8>, warren_cluster::ProposeError>) {
        let n = batch.msgs.len();
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
        self.repl.done(n);
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
        for id in r.msgs.range(from..).map(|(id, _)| *id) {
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
        let batch = Batch {
            msgs: vec![(m.clone(), None), (m, None)],
            bytes: 10,
            settled: vec![3, 9],
            returned: vec![4],
            claimed: vec![7, 8],
            claim_new: 1,
            epoch: 42,
        };
        let d = decode(&encode(&batch)).expect("decodes");
        assert_eq!(d.msgs.len(), 2);
        assert_eq!(d.settled, [3, 9]);
        assert_eq!(d.returned, [4]);
        assert_eq!(d.claimed, [7, 8]);
        assert_eq!(d.claim_new, 1);
        assert_eq!(d.epoch, 42);
        let (back, _) = crate::persist::decode_message(&d.msgs[0]).expect("a stored message");
        assert_eq!(&back.body[..], b"hello");
        assert!(
            decode(&encode(&batch)[..7]).is_none(),
            "a cut entry is refused"
        );
    }
}
