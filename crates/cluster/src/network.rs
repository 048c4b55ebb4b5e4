//! openraft's network side: Raft RPCs encoded as [`Rpc`] and carried by the broker's
//! [`Transport`]. Every outcome is recorded per peer so that the leader can tell which members
//! it currently reaches.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::error::{
    Fatal, NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Timeout,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{RPCTypes, Snapshot, Vote};

use crate::api::{Node, NodeId, Transport, TransportError};
use crate::guard::lock;
use crate::types::{wire, Blob, Reply, Rpc, TypeConfig};

/// The last RPC outcome per peer: whether it succeeded, and when.
#[derive(Clone, Default)]
pub(crate) struct Reach(Arc<Mutex<HashMap<NodeId, (bool, Instant)>>>);

impl Reach {
    fn record(&self, id: NodeId, ok: bool) {
        lock(&self.0).insert(id, (ok, Instant::now()));
    }

    /// Whether the last RPC to `id` succeeded no longer than `fresh` ago.
    pub(crate) fn reachable(&self, id: NodeId, fresh: Duration) -> bool {
        lock(&self.0)
            .get(&id)
            .is_some_and(|(ok, at)| *ok && at.elapsed() <= fresh)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct RemoteFailure(String);

pub(crate) struct Network {
    pub(crate) me: NodeId,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) reach: Reach,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Conn;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> Conn {
        Conn {
            me: self.me,
            target,
            node: node.clone(),
            transport: self.transport.clone(),
            reach: self.reach.clone(),
        }
    }
}

pub(crate) struct Conn {
    me: NodeId,
    target: NodeId,
    node: Node,
    transport: Arc<dyn Transport>,
    reach: Reach,
}

/// Why an RPC got no usable reply.
enum CallError {
    Unreachable(String),
    Timeout(Duration),
    /// The reply was not the expected kind, or could not be decoded.
    Bad(String),
}

impl Conn {
    async fn call(&self, rpc: &Rpc, ttl: Duration) -> Result<Reply, CallError> {
        let request = wire::encode(rpc);
        let sent = tokio::time::timeout(ttl, self.transport.call(&self.node, request)).await;
        let bytes = match sent {
            Ok(Ok(b)) => b,
            Ok(Err(TransportError::Timeout)) | Err(_) => {
                self.reach.record(self.target, false);
                return Err(CallError::Timeout(ttl));
            }
            Ok(Err(e)) => {
                self.reach.record(self.target, false);
                return Err(CallError::Unreachable(e.to_string()));
            }
        };
        match wire::decode::<Reply>(&bytes) {
            // A peer whose Raft is stopped is as good as down.
            Ok(Reply::Error(msg)) => {
                self.reach.record(self.target, false);
                Err(CallError::Unreachable(msg))
            }
            Ok(reply) => {
                self.reach.record(self.target, true);
                Ok(reply)
            }
            Err(e) => Err(CallError::Bad(format!("undecodable reply: {e}"))),
        }
    }

    fn rpc_error<E: std::error::Error>(
        &self,
        e: CallError,
        action: RPCTypes,
    ) -> RPCError<NodeId, Node, E> {
        match e {
            CallError::Unreachable(m) => RPCError::Unreachable(Unreachable::new(&RemoteFailure(m))),
            CallError::Timeout(timeout) => RPCError::Timeout(Timeout {
                action,
                id: self.me,
                target: self.target,
                timeout,
            }),
            CallError::Bad(m) => RPCError::Network(NetworkError::new(&RemoteFailure(m))),
        }
    }
}

fn unexpected() -> CallError {
    CallError::Bad("unexpected reply kind".into())
}

impl RaftNetwork<TypeConfig> for Conn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        match self.call(&Rpc::Append(rpc), option.hard_ttl()).await {
            Ok(Reply::Append(r)) => Ok(r),
            Ok(_) => Err(self.rpc_error(unexpected(), RPCTypes::AppendEntries)),
            Err(e) => Err(self.rpc_error(e, RPCTypes::AppendEntries)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        match self.call(&Rpc::Vote(rpc), option.hard_ttl()).await {
            Ok(Reply::Vote(r)) => Ok(r),
            Ok(_) => Err(self.rpc_error(unexpected(), RPCTypes::Vote)),
            Err(e) => Err(self.rpc_error(e, RPCTypes::Vote)),
        }
    }

    // The whole snapshot in one call: metadata snapshots are small.
    async fn full_snapshot(
        &mut self,
        vote: Vote<NodeId>,
        snapshot: Snapshot<TypeConfig>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        let rpc = Rpc::Snapshot {
            vote,
            meta: snapshot.meta,
            data: Blob(snapshot.snapshot.into_inner().into()),
        };
        let res = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            res = self.call(&rpc, option.hard_ttl()) => res,
        };
        let e = match res {
            Ok(Reply::Snapshot(r)) => return Ok(r),
            Ok(_) => unexpected(),
            Err(e) => e,
        };
        Err(match e {
            CallError::Unreachable(m) => {
                StreamingError::Unreachable(Unreachable::new(&RemoteFailure(m)))
            }
            CallError::Timeout(timeout) => StreamingError::Timeout(Timeout {
                action: RPCTypes::InstallSnapshot,
                id: self.me,
                target: self.target,
                timeout,
            }),
            CallError::Bad(m) => StreamingError::Network(NetworkError::new(&RemoteFailure(m))),
        })
    }
}
