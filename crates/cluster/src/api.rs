//! What the broker implements and sees of the metadata group: node ids and [`Node`], the
//! replicated [`StateMachine`], the [`Transport`] between nodes, the node's [`MetaConfig`], the
//! errors of proposals and of membership, and the [`Status`] it reports. Types (and
//! [`node_id`]) only, using nothing else of the crate; the behaviour is on
//! [`Meta`](crate::Meta).

use std::pin::Pin;
use std::time::Duration;

use sha2::{Digest, Sha256};

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
    /// `command` is shared with the log (a replicated queue's entries carry message bodies:
    /// the machine keeps slices of it rather than copies).
    fn apply(&self, index: u64, command: &bytes::Bytes) -> Vec<u8>;
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

/// How this node reaches another node's [`Meta::handle_rpc`](crate::Meta::handle_rpc) (the
/// broker's inter-node link implements it).
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
    /// Make appends durable together with the other groups' of this process, on one sync
    /// thread (`log_store/sync.rs`), rather than each with an fdatasync in line. A node with
    /// many groups wants it; a deterministic simulation does not.
    pub group_commit: bool,
}

impl Default for MetaConfig {
    fn default() -> Self {
        MetaConfig {
            election_timeout_min_ms: 1500,
            election_timeout_max_ms: 3000,
            heartbeat_ms: 300,
            propose_timeout: Duration::from_secs(5),
            snapshot_after: 5000,
            group_commit: false,
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

impl Status {
    /// The name of the member that leads, if there is one and it is in the membership.
    pub fn leader_name(&self) -> Option<&str> {
        let id = self.leader?;
        self.members
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.node.name.as_str())
    }
}

/// A member's log as openraft's metrics give it, in the terms of RabbitMQ's `ra_metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RaftLog {
    /// The current term.
    pub term: u64,
    /// The last index in this member's log (ra's `last_written_index`).
    pub last_written: u64,
    /// The commit index: on the leader, the highest index a majority of voters hold; on a
    /// follower, the last applied (openraft 0.9 does not publish a follower's commit index;
    /// it applies each committed entry as soon as it learns it is committed).
    pub committed: u64,
    /// The last index applied to the state machine.
    pub last_applied: u64,
    /// The last index the latest snapshot covers.
    pub snapshot: u64,
    /// How long the latest entry this node appended as leader took to be committed and
    /// applied, in microseconds; 0 when it has appended none (a follower).
    pub commit_latency_us: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Member {
    pub id: NodeId,
    pub node: Node,
    pub voter: bool,
    /// As the leader sees it (None when this node is not the leader or it is this node).
    pub reachable: Option<bool>,
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
