//! What a replicated queue's group and a replicated stream's share: the Raft settings of a
//! member, opening a member's group (bootstrapped by the first member), and who leads as this
//! node last heard ([`Leader`]).

use std::sync::Arc;
use std::time::Duration;

use super::net::GroupNet;

/// A member's Raft settings: a group of one elects at once; a group of several fails over in
/// 1-2 s (a queue's or a stream's leader is what publishers and consumers wait for).
pub(super) fn config(single: bool) -> warren_cluster::MetaConfig {
    if single {
        warren_cluster::MetaConfig {
            election_timeout_min_ms: 150,
            election_timeout_max_ms: 300,
            heartbeat_ms: 50,
            propose_timeout: Duration::from_secs(10),
            snapshot_after: 1024,
            group_commit: true,
        }
    } else {
        warren_cluster::MetaConfig {
            election_timeout_min_ms: 600,
            election_timeout_max_ms: 1200,
            heartbeat_ms: 150,
            propose_timeout: Duration::from_secs(5),
            snapshot_after: 1024,
            group_commit: true,
        }
    }
}

/// Opens this member's group under `dir` (its state restored from its last snapshot and log)
/// and registers it for Raft messages; the first of `members` bootstraps a new group (a member
/// whose address is not known yet is left out, as the metadata group's own bootstrap does; the
/// group can add it later). `what` names it in the log.
pub(super) async fn open(
    dir: &std::path::Path,
    me: &str,
    members: &[String],
    group: u64,
    sm: Arc<dyn warren_cluster::StateMachine>,
    net: &Arc<dyn GroupNet>,
    what: &str,
) -> Result<warren_cluster::Meta, warren_cluster::MetaError> {
    let node = warren_cluster::Node {
        name: me.to_string(),
        addr: net.addr_of(me).unwrap_or_default(),
    };
    let meta = warren_cluster::Meta::open(
        dir,
        node,
        sm,
        net.transport(group),
        config(members.len() == 1),
    )
    .await?;
    net.register(group, Some(meta.clone()));
    if members.first().map(String::as_str) == Some(me) && !meta.is_initialized() {
        let nodes: Vec<warren_cluster::Node> = members
            .iter()
            .filter_map(|name| {
                let addr = net.addr_of(name)?;
                Some(warren_cluster::Node {
                    name: name.clone(),
                    addr,
                })
            })
            .collect();
        if let Err(e) = meta.initialize_with(nodes).await {
            tracing::error!(group = %format!("{group:016x}"), error = %e, "cannot start the group of {what}");
        }
    }
    Ok(meta)
}

/// The member that leads a group, as this node last heard, and a wait for one to be known.
#[derive(Default)]
pub(super) struct Leader {
    name: parking_lot::RwLock<Option<String>>,
    known: tokio::sync::Notify,
}

impl Leader {
    pub(super) fn get(&self) -> Option<String> {
        self.name.read().clone()
    }

    /// Sets who leads; returns whether that changed.
    pub(super) fn set(&self, leader: Option<String>) -> bool {
        if leader.is_some() {
            self.known.notify_waiters();
        }
        let mut l = self.name.write();
        let changed = *l != leader;
        *l = leader;
        changed
    }

    /// Waits up to `max` until a leader is known; whether one is.
    pub(super) async fn wait(&self, max: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + max;
        loop {
            let known = self.known.notified();
            if self.name.read().is_some() {
                return true;
            }
            if tokio::time::timeout_at(deadline, known).await.is_err() {
                return self.name.read().is_some();
            }
        }
    }

    /// A node that is no member asks `group`'s members who leads, every `every`, until
    /// `stop`.
    pub(super) async fn poll(
        &self,
        net: &Arc<dyn GroupNet>,
        group: u64,
        members: impl Fn() -> Vec<String>,
        every: Duration,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        loop {
            self.set(net.leader_of(group, members()).await);
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }
}
