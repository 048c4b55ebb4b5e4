//! Warren's cluster metadata: one Raft group (openraft 0.9) replicating the broker's metadata
//! [`StateMachine`] across the nodes.
//!
//! - [`Meta`] runs the local Raft node: [`Meta::propose`] replicates a command (forwarded to the
//!   leader when needed) and returns the leader's reply once this node applied it too.
//! - Nodes talk through the broker's inter-node link ([`Transport`] out, [`Meta::handle_rpc`]
//!   in); requests, replies and log entries are bincode (`types::wire`).
//! - State under the node's directory: `log/` (entries, in segments), `vote.json`,
//!   `committed.json`, `purged.json`, `snapshot.bin` (the last snapshot). Entries, the vote and
//!   snapshots are durable before they are acknowledged (appends possibly with other groups'
//!   on the process's sync thread: [`MetaConfig::group_commit`]); the committed index is
//!   written without an fsync (`log_store`).
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
//!
//! By job: `api` holds what the broker implements and sees (node ids, the [`StateMachine`] and
//! [`Transport`] traits, [`MetaConfig`], the errors, [`Status`]); this file opens the node and
//! reports on it; `propose` replicates commands; `membership` bootstraps, joins and changes the
//! members; `rpc` routes leader-only requests to the leader and serves them. Layered, no import
//! cycle among them: `membership` uses `propose` and `rpc`, `propose` uses `rpc`, and `api`
//! uses nothing of the crate.

mod api;
mod guard;
mod log_store;
mod membership;
mod network;
mod propose;
mod rpc;
pub mod runtime;
mod sm_store;
mod types;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::{Raft, RaftMetrics, ServerState, SnapshotPolicy};
use tokio::sync::watch;

pub use crate::api::{
    node_id, Member, MetaConfig, MetaError, Node, NodeId, ProposeError, RaftLog, SnapshotPoint,
    StateMachine, Status, Transport, TransportError,
};
pub use crate::log_store::LogReader;
use crate::log_store::LogStore;
use crate::network::{Network, Reach};
use crate::sm_store::SmStore;
pub use crate::types::is_raft_message;
use crate::types::TypeConfig;

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
    /// Held while this node, as leader, makes a membership change (`serve_membership`).
    changing: tokio::sync::Mutex<()>,
    /// How long the latest entry [`Meta::submit`] appended took to be committed and applied
    /// here, in microseconds (0 until one has): one store per entry, no lock.
    commit_latency_us: std::sync::atomic::AtomicU64,
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
        log_store.set_group_commit(config.group_commit);
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
                changing: tokio::sync::Mutex::new(()),
                commit_latency_us: Default::default(),
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

    /// This member's log in the terms of RabbitMQ's `ra_metrics` (Prometheus' `rabbitmq_raft_*`).
    pub fn raft_log(&self) -> RaftLog {
        let m = self.inner.metrics.borrow();
        let last_written = m.last_log_index.unwrap_or(0);
        let last_applied = m.last_applied.map_or(0, |l| l.index);
        let committed = match &m.replication {
            // The leader: the index a majority of voters hold (its own log counts as held).
            Some(matched) => {
                let voters: Vec<NodeId> = m.membership_config.membership().voter_ids().collect();
                let mut held: Vec<u64> = voters
                    .iter()
                    .map(|v| match *v == self.inner.id {
                        true => last_written,
                        false => matched.get(v).copied().flatten().map_or(0, |l| l.index),
                    })
                    .collect();
                held.sort_unstable_by(|a, b| b.cmp(a));
                held.get(voters.len() / 2)
                    .copied()
                    .unwrap_or(0)
                    .max(last_applied)
            }
            None => last_applied,
        };
        RaftLog {
            commit_latency_us: self
                .inner
                .commit_latency_us
                .load(std::sync::atomic::Ordering::Relaxed),
            term: m.current_term,
            last_written,
            committed,
            last_applied,
            snapshot: m.snapshot.map_or(0, |l| l.index),
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
