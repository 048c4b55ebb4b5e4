//! Clustering: several nodes act as one broker (docs/clustering.md).
//!
//! - [`link`]: one TCP connection per pair of nodes, cookie-authenticated, multiplexed.
//! - Metadata (vhosts, users, permissions, policies, limits, exchanges, bindings, queue records
//!   with their home node) is one openraft group (`warren-cluster`). A change is never made
//!   where it is asked for: it is proposed, and every node (the proposer too) makes it when
//!   it applies the committed entry, through the same vhost and access code a single node
//!   runs. The outcome (ok, or RabbitMQ's error) is therefore the same everywhere.
//! - [`remote`]: a queue whose home is another node: publishes, consumers, acks and gets go
//!   over the link to the queue's home, where it is an ordinary local queue.
//!
//! This file: [`Cluster`], the services on the links, and Raft's transport over them. Beside it:
//! `formation.rs` (boot: start, initialize or join, seed, catch up), `membership.rs`
//! (`join_cluster`, `forget_cluster_node`), `nodes.rs` (members, which run, `/api/nodes`,
//! `cluster_status`), `placement.rs` (where a new queue and its replicas live), `propose.rs`
//! (proposing a change, the definitions command `definitions::op::DefOp`, and waiting for it),
//! `state_machine.rs` (the broker as the metadata group's state machine) and `handler.rs` (what
//! a node serves on its links).

pub mod link;
pub mod quorum;
pub mod remote;
pub mod rq;
mod streams;

mod formation;
mod handler;
mod membership;
mod nodes;
mod placement;
mod propose;
mod state_machine;

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::server::Broker;
use link::Links;

impl crate::server::ClusterHandle for Cluster {
    fn raft_role(&self) -> &'static str {
        let st = self.meta().status();
        match st.members.iter().find(|m| m.id == st.id) {
            _ if st.leader == Some(st.id) => "leader",
            Some(m) if m.voter => "follower",
            Some(_) => "learner",
            None => "none",
        }
    }
    fn links(&self) -> Vec<(String, String)> {
        self.links
            .all()
            .iter()
            .map(|l| (l.peer_name.clone(), l.peer_addr.clone()))
            .collect()
    }
    fn as_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

impl Cluster {
    /// The cluster `b` runs in, if it runs in one.
    pub fn of(b: &Broker) -> Option<Arc<Cluster>> {
        b.cluster_handle()?.clone().as_any().downcast().ok()
    }
}

/// The cluster's queue kinds behind a [`QueueRef`] (`QueueRef::Other`).
pub trait ClusterQueue {
    /// The queue when its home is another node.
    fn remote(&self) -> Option<Arc<remote::RemoteQueue>>;
}

impl ClusterQueue for crate::queue::QueueRef {
    fn remote(&self) -> Option<Arc<remote::RemoteQueue>> {
        self.downcast()
    }
}

pub const SERVICE_RAFT: u8 = 1;
/// How long a change waits for the other running nodes to apply it.
const APPLY_WAIT: Duration = Duration::from_secs(2);
pub const SERVICE_QUEUE: u8 = 2;
/// This node's `/api/nodes` object.
pub const SERVICE_NODE: u8 = 3;
/// Wait until this node has applied entry N (a u64; 0: no wait); answers its applied index.
pub const SERVICE_APPLIED: u8 = 4;
/// Is the asking node (its name, the request) a member here? Answers this node's applied index
/// (u64) and 1 or 0.
pub const SERVICE_MEMBER: u8 = 8;
/// A management question (the request, opaque here) answered by the node's `LocalView`.
pub const SERVICE_VIEW: u8 = 13;
/// This node's stream-protocol port (`[port u16]`, 0 when it has none): what a stream
/// connection's metadata answers for a replicated stream's members here (`streams.rs`).
pub const SERVICE_STREAM_PORT: u8 = 16;

/// This node's part in a cluster.
pub struct Cluster {
    pub me: String,
    pub addr: String,
    pub links: Arc<Links>,
    /// Replaced when the node joins another cluster (`join_cluster`).
    meta: parking_lot::RwLock<Option<warren_cluster::Meta>>,
    broker: Weak<Broker>,
    pub remote: remote::Remote,
    /// Link addresses by node name, from the Raft membership (kept by the status watcher).
    nodes: parking_lot::RwLock<Vec<warren_cluster::Node>>,
    /// Members that recently did not apply a change in time, by name.
    lagging: parking_lot::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    /// The Raft groups of the replicated queues this node is a member of, by group id.
    pub groups: parking_lot::RwLock<std::collections::HashMap<u64, warren_cluster::Meta>>,
    /// The replicated queues on the queue machine (`rq.rs`) this node has, by group id.
    rqueues: parking_lot::RwLock<
        std::collections::HashMap<u64, Weak<crate::replicated::ReplicatedQueue>>,
    >,
    /// The replicated streams this node holds a copy of, by group id (`rq.rs`).
    rstreams: parking_lot::RwLock<
        std::collections::HashMap<u64, Weak<crate::replicated::stream::ReplicatedStream>>,
    >,
    /// Other nodes' stream-protocol ports as they last answered, and when (`streams.rs`).
    stream_ports: parking_lot::Mutex<std::collections::HashMap<String, (u16, std::time::Instant)>>,
}

impl Cluster {
    pub fn meta(&self) -> warren_cluster::Meta {
        self.meta
            .read()
            .clone()
            .expect("meta is set before the cluster is used")
    }

    pub(crate) fn broker(&self) -> Option<Arc<Broker>> {
        self.broker.upgrade()
    }
}

/// Raft's messages travel on the links: the metadata group's as `SERVICE_RAFT`, a replicated
/// queue's as `quorum::SERVICE_QRAFT` led by its group id.
pub(crate) struct LinkTransport {
    pub(crate) links: Arc<Links>,
    pub(crate) service: u8,
    pub(crate) group: Option<u64>,
}

impl warren_cluster::Transport for LinkTransport {
    fn call(
        &self,
        to: &warren_cluster::Node,
        request: Vec<u8>,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<Vec<u8>, warren_cluster::TransportError>>
                + Send,
        >,
    > {
        let links = self.links.clone();
        let addr = to.addr.clone();
        let service = self.service;
        // A queue group's requests are headed by the group's number.
        let head = self.group.map(u64::to_be_bytes);
        Box::pin(async move {
            let head: &[u8] = match &head {
                Some(h) => h,
                None => &[],
            };
            links
                // Below the propose deadline, so a forward to a leader that stopped answering
                // leaves time to retry with the next one.
                .call_headed(&addr, service, head, &request, Duration::from_secs(3))
                .await
                .map(|b| b.to_vec())
                .map_err(|e| match e {
                    // Ambiguous: the request may have been served (a proposal forwarded to a
                    // leader that died after appending it must not be retried elsewhere).
                    link::LinkError::Timeout(_) | link::LinkError::Lost(_) => {
                        warren_cluster::TransportError::Timeout
                    }
                    e => warren_cluster::TransportError::Unreachable(addr, e.to_string()),
                })
        })
    }
}
