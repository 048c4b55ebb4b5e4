//! Requests between nodes: a leader-only request (a proposal, a membership change) is routed
//! to the leader, following redirects and waiting out elections until its deadline, and served
//! there; [`Meta::handle_rpc`] is the receiving side of
//! [`Transport::call`](crate::Transport::call), Raft's own messages included. Invariant: a
//! transport failure is retried only when the request certainly was not delivered
//! ([`TransportError::Unreachable`]); an ambiguous one (a timeout) fails the request as
//! unavailable instead of risking a duplicate.

use std::io::Cursor;
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::Snapshot;
use tokio::time::Instant;

use crate::types::{wire, Reply, Rpc};
use crate::{Meta, MetaError, Node, NodeId, TransportError};

/// Where a leader-only request goes next.
pub(crate) enum Target {
    Local,
    Remote(Node),
}

/// A membership change asked of the leader, served by `membership`.
pub(crate) enum Change {
    Join(Node),
    Promote(NodeId),
    Remove(NodeId),
}

impl Meta {
    pub(crate) fn leader_target(&self) -> Option<Target> {
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
    pub(crate) async fn route(
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

    /// The receiving side of [`Transport::call`](crate::Transport::call).
    /// Entries in `request` are handed on as slices of it, not copies.
    pub async fn handle_rpc(&self, request: bytes::Bytes) -> Vec<u8> {
        let raft = &self.inner.raft;
        let reply = match wire::decode_shared::<Rpc>(&request) {
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
                    snapshot: Box::new(Cursor::new(data.0.to_vec())),
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
}

pub(crate) fn write_error(e: RaftError<NodeId, ClientWriteError<NodeId, Node>>) -> Reply {
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
