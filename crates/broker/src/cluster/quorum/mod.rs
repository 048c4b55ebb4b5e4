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
//!
//! This file holds the [`QuorumQueue`] and the types its jobs share (the replica, the
//! replicator and its batch, the group state machine, the log tail), its constructor and what
//! callers ask of it, and the member-change service. Each other job is a file of its own:
//! - `replica`: a member's copy of the queue (ids, sizes, snapshot point).
//! - `replicator`: the leader's side of replication, gathering batches to propose.
//! - `entry`: a log entry's encoding.
//! - `state_machine`: the group's state machine, applying entries to the replica.
//! - `tail`: reading a leader's paged tail back from the group's log.
//! - `roles`: a member's and a non-member's tasks, following the leader.
//! - `leader`: building and retiring the leader's queue, this node's leg when it leads.
//! - `propose`: the leader's proposing loop and dead-letter retries.
//! - `members`: changing a queue's members.
//!
//! The shared types stay here, not in a child: every child imports `super`, and this file imports
//! no child, so the split adds no import cycle.

mod entry;
mod kind;
mod leader;
mod leg;
mod members;
mod propose;
mod replica;
mod replicator;
mod roles;
mod state_machine;
mod tail;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use warren_protocol::ByteString;

use super::Cluster;
use crate::cluster::ClusterQueue;
use crate::confirm::ConfirmHandle;
use crate::error::AmqpError;
use crate::message::Message;
use crate::queue::{Consumer, QueueArgs, QueueOptions, QueueRef};
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

/// The group's state machine on one member.
struct GroupSm {
    queue: std::sync::OnceLock<Weak<QuorumQueue>>,
    replica: Mutex<Replica>,
    /// One past the index of the entry applied last (or being applied).
    applied: Arc<AtomicU64>,
}

/// Where a message is in the group's log: the entry's index, the id of its first message, and
/// the id reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogPos {
    index: u64,
    first_id: u64,
    next_id: u64,
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

    fn dir(&self, c: &Cluster) -> Option<std::path::PathBuf> {
        let b = c.broker()?;
        Some(
            b.config
                .data_dir
                .join("quorum")
                .join(format!("{:016x}", self.group)),
        )
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
        !crate::queue::args::is_quorum(&self.options.arguments)
    }

    /// The leader's name, if known.
    pub fn leader(&self) -> Option<String> {
        let c = self.cluster.upgrade()?;
        match self.leg.load().as_deref()? {
            QueueRef::Local(_) => Some(c.me.clone()),
            r => r.remote().map(|r| r.home.clone()),
        }
    }

    /// The group's leader as this member's Raft sees it (answers [`SERVICE_QLEADER`]).
    pub fn raft_leader(meta: &warren_cluster::Meta) -> Option<String> {
        meta.status().leader_name().map(String::from)
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
