//! Membership: bootstrapping a group, joining one through a seed (as a learner first, a voter
//! once caught up), adding and removing members from any node, and the leader's side that turns
//! each request into an openraft membership change. Invariant: every change is idempotent (a
//! retried join, promote or remove whose effect is already in the membership answers with the
//! current membership's index), since a forwarded request may be delivered twice.

use std::collections::{BTreeMap, BTreeSet};

use openraft::error::{InitializeError, RaftError};
use openraft::ChangeMembers;
use tokio::time::Instant;

use crate::propose::wait_error;
use crate::rpc::{write_error, Change};
use crate::types::Reply;
use crate::types::Rpc;
use crate::{node_id, Meta, MetaError, Node, NodeId};

impl Meta {
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
                    // Routine while the nodes of a new cluster boot together (a seed in no
                    // cluster yet): the caller retries, and says so if it goes on.
                    tracing::debug!(seed = %addr, error = %e, "joining through this seed failed");
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

    pub(crate) async fn serve_membership(&self, change: Change) -> Reply {
        let inner = &self.inner;
        // One change at a time: openraft refuses (and logs an ERROR for) a change proposed while
        // another is uncommitted, which nodes booting together hit when they join at once.
        let _one = inner.changing.lock().await;
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

impl Meta {
    /// Stands for election now (openraft's `trigger().elect()`): the second half of a leadership
    /// transfer. openraft 0.9 has no transfer of its own; a leader elected more than its lease
    /// (`election_timeout_max_ms`) ago grants a candidate whose log is as long as its own its
    /// vote, and steps down, so a caught-up voter of a 3-member group takes over in one round
    /// (the other followers refuse while their lease lasts). Returns at once; the caller
    /// watches who leads.
    pub async fn stand_for_election(&self) -> Result<(), MetaError> {
        if !self.is_voter() {
            return Err(MetaError::NotAllowed("not a voter of this group".into()));
        }
        self.inner
            .raft
            .trigger()
            .elect()
            .await
            .map_err(|e| MetaError::Unavailable(e.to_string()))
    }
}
