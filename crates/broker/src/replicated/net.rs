//! What a replicated queue needs of the nodes around it, as an interface its layer defines
//! ([`GroupNet`]): the Raft transport among its members, proposing through a member from a
//! node that is none, handing a delivery to a consumer on another node, and asking a member for
//! the queue's counts. A single node's group of one has no peers ([`Alone`]); a cluster's
//! (`cluster/rq.rs`) goes over the inter-node links.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::message::Message;

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A delivery for a consumer on another node.
pub struct Delivery {
    pub consumer: u64,
    /// Its number among the consumer's deliveries: the consumer's node drops one it has had
    /// (a new leader sends again everything the consumer holds).
    pub delivery: u64,
    pub seq: u64,
    pub redelivered: bool,
    pub msg: Arc<Message>,
}

/// The queue's figures as a member reports them: ready, unacked, consumers.
pub type Counts = (u32, u32, u32);

pub trait GroupNet: Send + Sync + 'static {
    /// The Raft transport among the members of `group`.
    fn transport(&self, group: u64) -> Arc<dyn warren_cluster::Transport>;
    /// A node's address on that transport.
    fn addr_of(&self, node: &str) -> Option<String>;
    /// This member's group, opened (`Some`) or closed: Raft messages for `group` reach it.
    fn register(&self, group: u64, meta: Option<warren_cluster::Meta>);
    /// Proposes `entry` through one of `members` (this node is none of them): the apply's
    /// reply.
    fn forward(
        &self,
        group: u64,
        members: Vec<String>,
        entry: Vec<u8>,
    ) -> BoxFuture<Result<Vec<u8>, String>>;
    /// Proposes `entry` through `leader`, number `seq` of this node's `stream` (the leader
    /// submits a stream's entries in their order): the apply's reply.
    fn propose_at(
        &self,
        leader: &str,
        group: u64,
        stream: u64,
        seq: u64,
        entry: Vec<u8>,
    ) -> BoxFuture<Result<Vec<u8>, String>>;
    /// Hands `d` to its consumer on `node`.
    fn deliver(&self, node: &str, group: u64, d: Delivery);
    /// Tells `consumer` on `node` that the machine timed it out after `timeout_ms`.
    fn timed_out(&self, node: &str, group: u64, consumer: u64, timeout_ms: u64);
    /// Asks one of `members` for the queue's counts.
    fn counts(&self, group: u64, members: Vec<String>) -> BoxFuture<Option<Counts>>;
    /// Asks the members who leads.
    fn leader_of(&self, group: u64, members: Vec<String>) -> BoxFuture<Option<String>>;
    /// Whether `node` is reachable now (its link is up).
    fn node_up(&self, node: &str) -> bool;
    /// Reads a replicated stream's committed entries from `from` on (about `max_bytes`) from
    /// `node`'s copy (`replicated::stream::encode_fetched`), waiting up to `wait_ms` there
    /// for some when it has none yet.
    fn fetch(
        &self,
        node: &str,
        _group: u64,
        _from: u64,
        _max_bytes: u32,
        _wait_ms: u32,
    ) -> BoxFuture<Result<bytes::Bytes, String>> {
        let node = node.to_string();
        Box::pin(async move { Err(format!("{node}: not reachable from a single node")) })
    }
    /// The queue was declared here: each of `members` (but this node) starts its `x-expires`
    /// lease again; returns once they have (or could not be reached).
    fn touch(&self, _group: u64, _members: Vec<String>) -> BoxFuture<()> {
        Box::pin(async {})
    }
}

/// A group of one member: nothing to reach.
pub struct Alone;

impl warren_cluster::Transport for Alone {
    fn call(
        &self,
        to: &warren_cluster::Node,
        _request: Vec<u8>,
    ) -> BoxFuture<Result<Vec<u8>, warren_cluster::TransportError>> {
        let to = to.name.clone();
        Box::pin(async move {
            Err(warren_cluster::TransportError::Unreachable(
                to,
                "a single node's queue group has no peers".into(),
            ))
        })
    }
}

impl GroupNet for Alone {
    fn transport(&self, _group: u64) -> Arc<dyn warren_cluster::Transport> {
        Arc::new(Alone)
    }
    fn addr_of(&self, _node: &str) -> Option<String> {
        Some(String::new())
    }
    fn register(&self, _group: u64, _meta: Option<warren_cluster::Meta>) {}
    fn forward(
        &self,
        _group: u64,
        _members: Vec<String>,
        _entry: Vec<u8>,
    ) -> BoxFuture<Result<Vec<u8>, String>> {
        Box::pin(async { Err("a single node's queue has no other member".to_string()) })
    }
    fn propose_at(
        &self,
        _leader: &str,
        _group: u64,
        _stream: u64,
        _seq: u64,
        _entry: Vec<u8>,
    ) -> BoxFuture<Result<Vec<u8>, String>> {
        Box::pin(async { Err("a single node's queue has no other member".to_string()) })
    }
    fn deliver(&self, node: &str, _group: u64, d: Delivery) {
        tracing::debug!(
            node,
            consumer = d.consumer,
            "a delivery for another node, alone: dropped"
        );
    }
    fn timed_out(&self, node: &str, _group: u64, consumer: u64, _timeout_ms: u64) {
        tracing::debug!(node, consumer, "a timeout for another node, alone: dropped");
    }
    fn counts(&self, _group: u64, _members: Vec<String>) -> BoxFuture<Option<Counts>> {
        Box::pin(async { None })
    }
    fn leader_of(&self, _group: u64, _members: Vec<String>) -> BoxFuture<Option<String>> {
        Box::pin(async { None })
    }
    fn node_up(&self, _node: &str) -> bool {
        true
    }
}
