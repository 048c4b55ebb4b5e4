//! Warren's cluster metadata: one Raft group (openraft 0.9) replicating the broker's metadata
//! [`StateMachine`] across the nodes.
//!
//! - [`Meta`] runs the local Raft node: [`Meta::propose`] replicates a command (forwarded to the
//!   leader when needed) and returns the leader's reply once this node applied it too.
//! - Nodes talk through the broker's inter-node link ([`Transport`] out, [`Meta::handle_rpc`]
//!   in); requests, replies and log entries are bincode (`types::wire`).
//! - State under the node's directory: `raft.log` (entries), `vote.json`, `committed.json`,
//!   `snapshot.bin` (the last snapshot). Everything is fsynced before it is acknowledged.
//!
//! Behaviour worth knowing:
//! - Elections: a follower starts one after hearing nothing from the leader for the leader lease
//!   (`election_timeout_max_ms`) plus a random `election_timeout_min_ms..election_timeout_max_ms`,
//!   so a failover takes about 1.5x to 2x `election_timeout_max_ms` (4.5 to 6 s with the
//!   defaults; 0.5 to 0.6 s measured with 150/300 ms). Proposals made meanwhile wait, up to
//!   `propose_timeout`. The leader sends heartbeats every `heartbeat_ms`, and one AppendEntries
//!   call (Transport round trip included) must answer within `heartbeat_ms` or it counts as lost.
//! - Without a quorum, a leader keeps its role (openraft 0.9 does not step down) but cannot
//!   commit: [`Meta::propose`] fails with [`ProposeError::Unavailable`] after `propose_timeout`.
//!   The entry may still be committed later (when the quorum returns) and then applied, or be
//!   discarded by a new leader. Commands should therefore be safe to apply late or twice.
//! - The state machine is rebuilt at boot from the last snapshot plus the committed entries
//!   after it, without needing a quorum; entries committed while this node was down arrive once
//!   a leader reaches it.
//! - A node unreachable from the leader is retried every 500 ms.
//! - A removed node is not told so reliably: it keeps running with the old membership and calls
//!   elections nobody grants. Stop it ([`Meta::shutdown`]) and wipe its directory before it
//!   joins again.
//! - [`StateMachine`] methods run on the Raft state machine task: they must not wait on this
//!   `Meta` (e.g. propose), or the node deadlocks.

mod log_store;
mod network;
mod sm_store;
mod types;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, InitializeError, RaftError};
use openraft::metrics::WaitError;
use openraft::{ChangeMembers, Raft, RaftMetrics, ServerState, Snapshot, SnapshotPolicy};
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio::time::Instant;

pub use crate::log_store::LogReader;
use crate::log_store::LogStore;
use crate::network::{Network, Reach};
use crate::sm_store::SmStore;
use crate::types::{wire, Blob, Reply, Rpc, TypeConfig};

pub type NodeId = u64;

/// A stable id from a node name: the first 8 bytes of its SHA-256, big-endian; never 0.
pub fn node_id(name: &str) -> NodeId {
    let digest = Sha256::digest(name.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    match u64::from_be_bytes(first) {
        0 => 1,
        id => id,
    }
}

/// openraft's Node type: the node's name and the address of its inter-node link.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Node {
    pub name: String,
    pub addr: String,
}

/// The replicated state machine, implemented by the broker. Called from the Raft state machine
/// task, in log order.
pub trait StateMachine: Send + Sync + 'static {
    /// Applies one committed command deterministically; `index` is its Raft log index (unique,
    /// increasing: the broker uses it as an id). Returns the reply handed back to the proposer.
    fn apply(&self, index: u64, command: &[u8]) -> Vec<u8>;
    /// The whole state, for a Raft snapshot.
    fn snapshot(&self) -> Vec<u8>;
    /// Replaces the whole state with a snapshot's (a snapshot installed from the leader, or the
    /// last one at boot), which includes the entries up to `index`.
    fn restore(&self, index: Option<u64>, snapshot: &[u8]);
    /// Where a snapshot is taken. The default is the whole state now ([`StateMachine::snapshot`]).
    fn snapshot_point(&self) -> SnapshotPoint {
        SnapshotPoint::Now
    }
}

/// Where a snapshot is taken (see [`StateMachine::snapshot_point`]).
pub enum SnapshotPoint {
    /// The whole state after the last applied entry.
    Now,
    /// The state as of an earlier applied index, which [`StateMachine::restore`] takes and from
    /// which the entries after it are applied again. A state machine whose data lives in its log
    /// takes snapshots this way, as RabbitMQ's Ra does at a quorum queue's release cursor: a
    /// replicated queue's message bodies stay in the log, which is kept from the entry of the
    /// oldest message still in the queue.
    At(u64, Vec<u8>),
    /// Nothing new since the last snapshot.
    Unchanged,
}

/// How this node reaches another node's [`Meta::handle_rpc`] (the broker's inter-node link
/// implements it).
///
/// Return [`TransportError::Unreachable`] only when the request was certainly not delivered
/// (e.g. no connection): a forwarded proposal is then retried on the next leader. Anything
/// ambiguous should be [`TransportError::Timeout`], which makes the proposal fail as
/// unavailable instead of risking a duplicate.
pub trait Transport: Send + Sync + 'static {
    fn call(
        &self,
        to: &Node,
        request: Vec<u8>,
    ) -> Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>, TransportError>> + Send>>;
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("node {0} unreachable: {1}")]
    Unreachable(String, String),
    #[error("timeout")]
    Timeout,
}

#[derive(Debug, Clone)]
pub struct MetaConfig {
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    pub heartbeat_ms: u64,
    pub propose_timeout: Duration,
    /// Build a snapshot after this many log entries since the last one; 0 never does.
    pub snapshot_after: u64,
}

impl Default for MetaConfig {
    fn default() -> Self {
        MetaConfig {
            election_timeout_min_ms: 1500,
            election_timeout_max_ms: 3000,
            heartbeat_ms: 300,
            propose_timeout: Duration::from_secs(5),
            snapshot_after: 5000,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProposeError {
    /// No leader, or the leader could not commit within propose_timeout (a majority is down).
    /// The command may still be applied later.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Fatal(String),
}

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("cluster metadata storage: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid cluster configuration: {0}")]
    Config(String),
    #[error("cannot initialize the cluster: {0}")]
    NotAllowed(String),
    #[error("joining a cluster needs at least one seed address")]
    NoSeeds,
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    #[error("refused by the cluster leader: {0}")]
    Rejected(String),
    #[error("raft stopped: {0}")]
    Stopped(String),
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    pub me: Node,
    pub id: NodeId,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub last_applied: Option<u64>,
    pub members: Vec<Member>,
    /// The log index of the membership `members` comes from.
    pub membership_index: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Member {
    pub id: NodeId,
    pub node: Node,
    pub voter: bool,
    /// As the leader sees it (None when this node is not the leader or it is this node).
    pub reachable: Option<bool>,
}

/// Locks, ignoring poisoning: every critical section leaves its data consistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The local node of the metadata Raft group. Cheap to clone.
#[derive(Clone)]
pub struct Meta {
    inner: Arc<Inner>,
}

struct Inner {
    me: Node,
    id: NodeId,
    raft: Raft<TypeConfig>,
    metrics: watch::Receiver<RaftMetrics<NodeId, Node>>,
    transport: Arc<dyn Transport>,
    config: MetaConfig,
    reach: Reach,
    status_tx: watch::Sender<Status>,
    log: LogReader,
}

/// Where a leader-only request goes next.
enum Target {
    Local,
    Remote(Node),
}

impl Meta {
    /// Opens (or creates) the Raft state under `dir`, restores the state machine from the last
    /// snapshot and re-applies the committed entries after it.
    pub async fn open(
        dir: &Path,
        me: Node,
        sm: Arc<dyn StateMachine>,
        transport: Arc<dyn Transport>,
        config: MetaConfig,
    ) -> Result<Meta, MetaError> {
        std::fs::create_dir_all(dir)?;
        let id = node_id(&me.name);
        let log_store = LogStore::open(dir)?;
        let log = log_store.reader();
        let sm_store = SmStore::open(dir, sm)?;
        let raft_config = openraft::Config {
            cluster_name: "warren-meta".into(),
            election_timeout_min: config.election_timeout_min_ms,
            election_timeout_max: config.election_timeout_max_ms,
            heartbeat_interval: config.heartbeat_ms,
            // A whole snapshot travels in one call.
            install_snapshot_timeout: (config.propose_timeout.as_millis() as u64).max(1000),
            snapshot_policy: match config.snapshot_after {
                0 => SnapshotPolicy::Never,
                n => SnapshotPolicy::LogsSinceLast(n),
            },
            // Keep a lag of entries behind the snapshot so a slightly late follower gets entries,
            // not a snapshot; capped so a small `snapshot_after` still purges.
            max_in_snapshot_log_to_keep: (config.snapshot_after / 5).min(1000),
            replication_lag_threshold: config.snapshot_after.max(1000) * 2,
            ..Default::default()
        }
        .validate()
        .map_err(|e| MetaError::Config(e.to_string()))?;
        let reach = Reach::default();
        let network = Network {
            me: id,
            transport: transport.clone(),
            reach: reach.clone(),
        };
        let raft = Raft::new(id, Arc::new(raft_config), network, log_store, sm_store)
            .await
            .map_err(|e| MetaError::Stopped(e.to_string()))?;
        // Answered by the Raft task after it published its first metrics, so `status()` and
        // `is_initialized()` reflect the stored state from here on.
        raft.is_initialized()
            .await
            .map_err(|e| MetaError::Stopped(e.to_string()))?;
        let metrics = raft.metrics();
        let (status_tx, _) = watch::channel(Status {
            me: me.clone(),
            id,
            leader: None,
            term: 0,
            last_applied: None,
            members: Vec::new(),
            membership_index: None,
        });
        let meta = Meta {
            inner: Arc::new(Inner {
                me,
                id,
                raft,
                metrics,
                transport,
                config,
                reach,
                status_tx,
                log,
            }),
        };
        let now = meta.status();
        meta.inner.status_tx.send_replace(now);
        meta.spawn_status_task();
        Ok(meta)
    }

    /// Publishes `status()` on every metrics change, and every heartbeat for reachability.
    fn spawn_status_task(&self) {
        let weak = Arc::downgrade(&self.inner);
        let mut metrics = self.inner.metrics.clone();
        let period = Duration::from_millis(self.inner.config.heartbeat_ms.max(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    changed = metrics.changed() => if changed.is_err() { break },
                    _ = tick.tick() => {}
                }
                // Weak, so that a dropped Meta is not kept alive by this task.
                let Some(inner) = weak.upgrade() else { break };
                let meta = Meta { inner };
                let now = meta.status();
                meta.inner.status_tx.send_if_modified(|old| {
                    if *old == now {
                        return false;
                    }
                    *old = now;
                    true
                });
            }
        });
    }

    /// Whether this node already belongs to a cluster as a voter. A node that was only added as a
    /// learner (a join cut short) answers false, so that joining again completes it.
    pub fn is_initialized(&self) -> bool {
        self.is_voter()
    }

    fn is_voter(&self) -> bool {
        let m = self.inner.metrics.borrow();
        let voter = m
            .membership_config
            .membership()
            .voter_ids()
            .any(|v| v == self.inner.id);
        voter
    }

    /// Makes this node a single-member cluster (bootstrap) and waits until it leads it. Does
    /// nothing if this node is already a voter.
    pub async fn initialize(&self) -> Result<(), MetaError> {
        let me = self.inner.me.clone();
        self.initialize_with(vec![me]).await
    }

    /// Bootstraps a group of `members` (this node among them) from this node, and waits until
    /// the group has a leader. The other members start empty and are brought in by the leader;
    /// only one member may call this. Does nothing if this node is already a voter.
    pub async fn initialize_with(&self, members: Vec<Node>) -> Result<(), MetaError> {
        let inner = &self.inner;
        if self.is_voter() {
            return Ok(());
        }
        let members: BTreeMap<NodeId, Node> =
            members.into_iter().map(|n| (node_id(&n.name), n)).collect();
        if !members.contains_key(&inner.id) {
            return Err(MetaError::Config(
                "a group is initialized by one of its members".into(),
            ));
        }
        match inner.raft.initialize(members).await {
            Ok(()) => {}
            Err(RaftError::APIError(InitializeError::NotAllowed(e))) => {
                return Err(MetaError::NotAllowed(format!(
                    "this node already has Raft state but is not a voter ({e}); join instead"
                )))
            }
            Err(RaftError::APIError(e)) => return Err(MetaError::NotAllowed(e.to_string())),
            Err(RaftError::Fatal(e)) => return Err(MetaError::Stopped(e.to_string())),
        }
        let timeout = inner.config.propose_timeout;
        inner
            .raft
            .wait(Some(timeout))
            .metrics(
                |m| m.current_leader.is_some(),
                "initialize: wait for a leader",
            )
            .await
            .map_err(wait_error)?;
        Ok(())
    }

    /// Asks `seeds` (link addresses, tried in turn; any member, which redirects to the leader) to
    /// add this node: first as a learner, then, once this node has caught up, as a voter.
    /// Returns once this node is a voter.
    pub async fn join(&self, seeds: &[String]) -> Result<(), MetaError> {
        let mut last = MetaError::NoSeeds;
        for addr in seeds {
            let seed = Node {
                name: String::new(),
                addr: addr.clone(),
            };
            match self.join_via(&seed).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::warn!(seed = %addr, error = %e, "joining the cluster failed");
                    last = e;
                }
            }
        }
        Err(last)
    }

    async fn join_via(&self, seed: &Node) -> Result<(), MetaError> {
        let inner = &self.inner;
        let t = inner.config.propose_timeout;
        let index = changed_index(
            self.route(&Rpc::Join(inner.me.clone()), Some(seed), Instant::now() + t)
                .await?,
        )?;
        // Catching up may take a snapshot transfer: allow more than one write's time.
        self.wait_applied(index, Instant::now() + t * 4).await?;
        let index = changed_index(
            self.route(&Rpc::Promote(inner.id), Some(seed), Instant::now() + t)
                .await?,
        )?;
        self.wait_applied(index, Instant::now() + t).await?;
        if !self.is_voter() {
            return Err(MetaError::Unavailable(
                "promoted, but this node is not a voter yet".into(),
            ));
        }
        Ok(())
    }

    /// Adds `node` as a voter, from any member: it is added as a learner (the leader starts
    /// sending it the log) and then promoted. Returns once the change is committed.
    pub async fn add_voter(&self, node: Node) -> Result<(), MetaError> {
        let t = self.inner.config.propose_timeout;
        let id = node_id(&node.name);
        changed_index(
            self.route(&Rpc::Join(node), None, Instant::now() + t)
                .await?,
        )?;
        let index = changed_index(
            self.route(&Rpc::Promote(id), None, Instant::now() + t)
                .await?,
        )?;
        self.wait_applied(index, Instant::now() + t).await
    }

    /// Removes a node from the membership (forget_cluster_node). Works from any member.
    pub async fn remove(&self, id: NodeId) -> Result<(), MetaError> {
        let t = self.inner.config.propose_timeout;
        let index = changed_index(
            self.route(&Rpc::Remove(id), None, Instant::now() + t)
                .await?,
        )?;
        // A removed node may never hear of its removal.
        if id != self.inner.id {
            self.wait_applied(index, Instant::now() + t).await?;
        }
        Ok(())
    }

    /// Replicates `command`, forwarded to the leader when this node is not it; returns the
    /// leader's [`StateMachine::apply`] reply once this node has applied the entry too.
    pub async fn propose(&self, command: Vec<u8>) -> Result<Vec<u8>, ProposeError> {
        let deadline = Instant::now() + self.inner.config.propose_timeout;
        let reply = self
            .route(&Rpc::Propose(Blob(command)), None, deadline)
            .await
            .map_err(|e| match e {
                MetaError::Unavailable(m) => ProposeError::Unavailable(m),
                e => ProposeError::Fatal(e.to_string()),
            })?;
        let Reply::Proposed { reply, index } = reply else {
            return Err(ProposeError::Fatal("unexpected reply to a proposal".into()));
        };
        self.wait_applied(index, deadline)
            .await
            .map_err(|e| match e {
                MetaError::Stopped(m) => ProposeError::Fatal(m),
                e => ProposeError::Unavailable(format!(
                    "committed at index {index} but not applied here in time: {e}"
                )),
            })?;
        Ok(reply.0)
    }

    /// Submits `command` on this node when it leads, without waiting: the returned future
    /// resolves to the apply's reply once the entry is committed and applied here. Entries are
    /// ordered as submitted, so a caller may keep several in flight (pipelining) and still
    /// know their order. `None` when this node does not lead (use [`Meta::propose`]).
    pub async fn submit(
        &self,
        command: Vec<u8>,
    ) -> Option<impl std::future::Future<Output = Result<Vec<u8>, ProposeError>>> {
        if !matches!(self.leader_target(), Some(Target::Local)) {
            return None;
        }
        let rx = self.inner.raft.client_write_ff(Blob(command)).await.ok()?;
        let t = self.inner.config.propose_timeout;
        Some(async move {
            match tokio::time::timeout(t, rx).await {
                Ok(Ok(Ok(resp))) => Ok(resp.data.0),
                Ok(Ok(Err(e))) => Err(ProposeError::Unavailable(e.to_string())),
                Ok(Err(_)) => Err(ProposeError::Unavailable("the leader stopped".into())),
                Err(_) => Err(ProposeError::Unavailable(format!(
                    "not committed within {t:?} (is a majority down?); it may still be"
                ))),
            }
        })
    }

    /// Waits up to `timeout` for this node to have applied entry `index`; true if it has.
    pub async fn wait_applied_within(&self, index: u64, timeout: Duration) -> bool {
        self.wait_applied(index, Instant::now() + timeout)
            .await
            .is_ok()
    }

    async fn wait_applied(&self, index: u64, deadline: Instant) -> Result<(), MetaError> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.inner
            .raft
            .wait(Some(left))
            .applied_index_at_least(Some(index), "wait for the entry to be applied here")
            .await
            .map(|_| ())
            .map_err(wait_error)
    }

    fn leader_target(&self) -> Option<Target> {
        let m = self.inner.metrics.borrow();
        let leader = m.current_leader?;
        if leader == self.inner.id {
            return Some(Target::Local);
        }
        let node = m.membership_config.membership().get_node(&leader).cloned();
        node.map(Target::Remote)
    }

    /// Sends a leader-only request to the leader, following redirects and waiting out
    /// elections until `deadline`. Starts from `seed` when this node knows no leader.
    async fn route(
        &self,
        rpc: &Rpc,
        seed: Option<&Node>,
        deadline: Instant,
    ) -> Result<Reply, MetaError> {
        let inner = &self.inner;
        let pause = Duration::from_millis(inner.config.heartbeat_ms.clamp(10, 100));
        let request = wire::encode(rpc);
        let mut hint: Option<Target> = None;
        let mut last = String::from("no leader known");
        loop {
            if Instant::now() >= deadline {
                return Err(MetaError::Unavailable(format!(
                    "no leader accepted the request within {:?}: {last}",
                    inner.config.propose_timeout
                )));
            }
            let target = match hint.take().or_else(|| self.leader_target()) {
                Some(t) => t,
                None => match seed {
                    Some(s) => Target::Remote(s.clone()),
                    None => {
                        tokio::time::sleep(pause).await;
                        continue;
                    }
                },
            };
            let reply = match &target {
                Target::Local => self.serve(rpc).await,
                Target::Remote(node) => {
                    let call = inner.transport.call(node, request.clone());
                    match tokio::time::timeout_at(deadline, call).await {
                        Ok(Ok(bytes)) => wire::decode(&bytes)
                            .unwrap_or_else(|e| Reply::Error(format!("undecodable reply: {e}"))),
                        Ok(Err(TransportError::Timeout)) | Err(_) => {
                            return Err(MetaError::Unavailable(format!(
                                "{} did not answer in time; the request may still take effect",
                                node.addr
                            )))
                        }
                        Ok(Err(e)) => {
                            // A seed that cannot be reached is for the caller to skip.
                            if seed.is_some_and(|s| s.addr == node.addr) {
                                return Err(MetaError::Unavailable(e.to_string()));
                            }
                            last = e.to_string();
                            hint = seed.cloned().map(Target::Remote);
                            tokio::time::sleep(pause).await;
                            continue;
                        }
                    }
                }
            };
            match reply {
                Reply::Proposed { .. } | Reply::Changed { .. } => return Ok(reply),
                Reply::NotLeader(leader) => {
                    last = "the node asked is not the leader".into();
                    // Pause even with a hint: two nodes with stale views could bounce forever.
                    tokio::time::sleep(pause / 4).await;
                    hint = leader.map(|(id, node)| {
                        if id == inner.id {
                            Target::Local
                        } else {
                            Target::Remote(node)
                        }
                    });
                    if hint.is_none() {
                        tokio::time::sleep(pause).await;
                    }
                }
                Reply::Busy(m) => {
                    last = m;
                    tokio::time::sleep(pause).await;
                }
                Reply::Unavailable(m) => return Err(MetaError::Unavailable(m)),
                Reply::Rejected(m) => return Err(MetaError::Rejected(m)),
                Reply::Error(m) if matches!(target, Target::Local) => {
                    return Err(MetaError::Stopped(m))
                }
                Reply::Error(m) => {
                    last = m;
                    tokio::time::sleep(pause).await;
                }
                Reply::Vote(_) | Reply::Append(_) | Reply::Snapshot(_) => {
                    last = "unexpected reply kind".into();
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// Serves a leader-only request on this node; `NotLeader` if it is not the leader.
    async fn serve(&self, rpc: &Rpc) -> Reply {
        let inner = &self.inner;
        let t = inner.config.propose_timeout;
        let written = match rpc {
            Rpc::Propose(cmd) => {
                tokio::time::timeout(t, inner.raft.client_write(cmd.clone())).await
            }
            Rpc::Join(node) => return self.serve_membership(Change::Join(node.clone())).await,
            Rpc::Promote(id) => return self.serve_membership(Change::Promote(*id)).await,
            Rpc::Remove(id) => return self.serve_membership(Change::Remove(*id)).await,
            Rpc::Vote(_) | Rpc::Append(_) | Rpc::Snapshot { .. } => {
                return Reply::Error("not a leader request".into())
            }
        };
        match written {
            Ok(Ok(resp)) => Reply::Proposed {
                reply: resp.data,
                index: resp.log_id.index,
            },
            Ok(Err(e)) => write_error(e),
            Err(_) => Reply::Unavailable(format!(
                "the leader could not commit within {t:?} (is a majority down?); \
                 the command may still be applied later"
            )),
        }
    }

    async fn serve_membership(&self, change: Change) -> Reply {
        let inner = &self.inner;
        let (leader, membership) = {
            let m = inner.metrics.borrow();
            (m.current_leader, m.membership_config.clone())
        };
        // A node that is in no cluster yet (a fellow joiner taken for a seed) will not know a
        // leader however long it is asked: say so, and the joiner tries its next seed at once.
        if membership.membership().voter_ids().next().is_none() {
            return Reply::Unavailable("the node asked is not in a cluster yet".into());
        }
        if leader != Some(inner.id) {
            let hint = leader.and_then(|l| {
                let node = membership.membership().get_node(&l).cloned();
                node.map(|n| (l, n))
            });
            return Reply::NotLeader(hint);
        }
        let current = Reply::Changed {
            index: membership.log_id().map(|l| l.index).unwrap_or(0),
        };
        let m = membership.membership();
        let voters: BTreeSet<NodeId> = m.voter_ids().collect();
        let raft = &inner.raft;
        let op = match change {
            Change::Join(node) => {
                let id = node_id(&node.name);
                match m.get_node(&id) {
                    Some(n) if *n == node => return current,
                    // Same name, new address: update it in place.
                    Some(_) => Op::Change(ChangeMembers::SetNodes(BTreeMap::from([(id, node)]))),
                    None => Op::AddLearner(id, node),
                }
            }
            Change::Promote(id) if voters.contains(&id) => return current,
            Change::Promote(id) => Op::Change(ChangeMembers::AddVoterIds(BTreeSet::from([id]))),
            Change::Remove(id) if voters.contains(&id) => {
                Op::Change(ChangeMembers::RemoveVoters(BTreeSet::from([id])))
            }
            Change::Remove(id) if m.get_node(&id).is_some() => {
                Op::Change(ChangeMembers::RemoveNodes(BTreeSet::from([id])))
            }
            Change::Remove(_) => return current,
        };
        let t = inner.config.propose_timeout;
        let res = match op {
            // Not blocking: the joining node itself waits until it has caught up.
            Op::AddLearner(id, node) => {
                tokio::time::timeout(t, raft.add_learner(id, node, false)).await
            }
            // `retain: false` drops removed voters from the node list as well.
            Op::Change(c) => tokio::time::timeout(t, raft.change_membership(c, false)).await,
        };
        match res {
            Ok(Ok(resp)) => Reply::Changed {
                index: resp.log_id.index,
            },
            Ok(Err(e)) => write_error(e),
            Err(_) => Reply::Unavailable(format!(
                "the membership change was not committed within {t:?} (is a majority down?)"
            )),
        }
    }

    /// The receiving side of [`Transport::call`].
    pub async fn handle_rpc(&self, request: &[u8]) -> Vec<u8> {
        let raft = &self.inner.raft;
        let reply = match wire::decode::<Rpc>(request) {
            Err(e) => Reply::Error(format!("undecodable request: {e}")),
            Ok(Rpc::Vote(req)) => match raft.vote(req).await {
                Ok(r) => Reply::Vote(r),
                Err(e) => Reply::Error(e.to_string()),
            },
            Ok(Rpc::Append(req)) => match raft.append_entries(req).await {
                Ok(r) => Reply::Append(r),
                Err(e) => Reply::Error(e.to_string()),
            },
            Ok(Rpc::Snapshot { vote, meta, data }) => {
                let snapshot = Snapshot {
                    meta,
                    snapshot: Box::new(Cursor::new(data.0)),
                };
                match raft.install_full_snapshot(vote, snapshot).await {
                    Ok(r) => Reply::Snapshot(r),
                    Err(e) => Reply::Error(e.to_string()),
                }
            }
            Ok(rpc) => self.serve(&rpc).await,
        };
        wire::encode(&reply)
    }

    /// Reads this node's copy of the log (applied entries only; see [`LogReader`]).
    pub fn log(&self) -> &LogReader {
        &self.inner.log
    }

    pub fn status(&self) -> Status {
        let inner = &self.inner;
        let m = inner.metrics.borrow();
        let leading = m.state == ServerState::Leader && m.current_leader == Some(inner.id);
        let fresh = Duration::from_millis(inner.config.election_timeout_max_ms);
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, node)| Member {
                id: *id,
                node: node.clone(),
                voter: voters.contains(id),
                reachable: (leading && *id != inner.id).then(|| inner.reach.reachable(*id, fresh)),
            })
            .collect();
        Status {
            me: inner.me.clone(),
            id: inner.id,
            leader: m.current_leader,
            term: m.current_term,
            last_applied: m.last_applied.map(|l| l.index),
            members,
            membership_index: m.membership_config.log_id().map(|l| l.index),
        }
    }

    /// A watch of [`Meta::status`], updated whenever it changes: leader, term, membership,
    /// applied index, or (on the leader) a member's reachability.
    pub fn watch(&self) -> watch::Receiver<Status> {
        self.inner.status_tx.subscribe()
    }

    /// Stops the Raft node. Requests afterwards fail; call it before dropping the last handle.
    pub async fn shutdown(&self) {
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
    }
}

enum Change {
    Join(Node),
    Promote(NodeId),
    Remove(NodeId),
}

enum Op {
    AddLearner(NodeId, Node),
    Change(ChangeMembers<NodeId, Node>),
}

fn changed_index(reply: Reply) -> Result<u64, MetaError> {
    match reply {
        Reply::Changed { index } => Ok(index),
        _ => Err(MetaError::Stopped(
            "unexpected reply to a membership change".into(),
        )),
    }
}

fn write_error(e: RaftError<NodeId, ClientWriteError<NodeId, Node>>) -> Reply {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            Reply::NotLeader(f.leader_id.zip(f.leader_node))
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            ChangeMembershipError::InProgress(p),
        )) => Reply::Busy(p.to_string()),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            Reply::Rejected(e.to_string())
        }
        RaftError::Fatal(f) => Reply::Error(f.to_string()),
    }
}

fn wait_error(e: WaitError) -> MetaError {
    match e {
        WaitError::Timeout(..) => MetaError::Unavailable(e.to_string()),
        WaitError::ShuttingDown => MetaError::Stopped(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_stable_and_nonzero() {
        assert_eq!(node_id("rabbit@a"), node_id("rabbit@a"));
        assert_ne!(node_id("rabbit@a"), node_id("rabbit@b"));
        assert_ne!(node_id(""), 0);
    }
}
