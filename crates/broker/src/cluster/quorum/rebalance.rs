//! `warren ctl rebalance` (rabbitmq-queues rebalance): spreads the leaders of replicated queues
//! over the running nodes, one queue at a time, by leadership transfer. openraft 0.9 has no
//! transfer of its own: the chosen member stands for election (`SERVICE_QELECT`, served by
//! `Meta::stand_for_election`), and the leader, elected more than its lease ago, votes for it
//! when its log is as long (see there). A queue whose transfer does not take within
//! [`MOVE_WAIT`] stays where it is; the consumers of a queue that moves are served by its new
//! leader as after a failover (the queue machine's state is the same on every member).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{raft_leader, SERVICE_QLEADER};
use crate::cluster::Cluster;
use crate::server::Broker;

/// Stand for election in queue group `[group u64]` (served by the member chosen to lead).
pub const SERVICE_QELECT: u8 = 14;

/// How long one queue's transfer may take before it is left where it is.
const MOVE_WAIT: Duration = Duration::from_secs(5);

/// A member's side of [`SERVICE_QELECT`].
pub async fn serve_elect(c: &Arc<Cluster>, body: &[u8]) -> Result<Bytes, String> {
    let group = u64::from_be_bytes(
        body.get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or("short request")?,
    );
    let meta = c.groups.read().get(&group).cloned();
    let meta = meta.ok_or_else(|| format!("not a member of queue group {group:016x}"))?;
    if raft_leader(&meta).as_deref() != Some(c.me.as_str()) {
        meta.stand_for_election().await.map_err(|e| e.to_string())?;
    }
    Ok(Bytes::new())
}

/// Which replicated queues a rebalance moves (rabbitmq-queues' `all`, `quorum`, `classic`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    All,
    Quorum,
    Classic,
}

/// A replicated queue considered, and who leads it.
struct Candidate {
    group: u64,
    members: Vec<String>,
    leader: Option<String>,
}

impl Cluster {
    /// Asks group `group` who leads it: this node's Raft if it is a member, else each member.
    async fn leader_of_group(&self, group: u64, members: &[String]) -> Option<String> {
        if let Some(meta) = self.groups.read().get(&group).cloned() {
            if let Some(l) = raft_leader(&meta) {
                return Some(l);
            }
        }
        for m in members.iter().filter(|m| **m != self.me) {
            let Some(addr) = self.addr_of(m) else {
                continue;
            };
            let r = self
                .links
                .call(
                    &addr,
                    SERVICE_QLEADER,
                    &group.to_be_bytes(),
                    Duration::from_secs(2),
                )
                .await;
            match r {
                Ok(r) if !r.is_empty() => return Some(String::from_utf8_lossy(&r).into_owned()),
                _ => {}
            }
        }
        None
    }

    /// Has `node` stand for election in `group` and waits until it leads (or [`MOVE_WAIT`]).
    async fn transfer(self: &Arc<Self>, group: u64, members: &[String], node: &str) -> bool {
        let asked = if node == self.me {
            serve_elect(self, &group.to_be_bytes()).await.map(|_| ())
        } else {
            match self.addr_of(node) {
                Some(addr) => self
                    .links
                    .call(&addr, SERVICE_QELECT, &group.to_be_bytes(), MOVE_WAIT)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                None => Err(format!("{node} is not a cluster member")),
            }
        };
        if let Err(e) = asked {
            tracing::info!(group = format!("{group:016x}"), node, error = %e, "rebalance: the member could not stand for election");
            return false;
        }
        let deadline = tokio::time::Instant::now() + MOVE_WAIT;
        while tokio::time::Instant::now() < deadline {
            if self.leader_of_group(group, members).await.as_deref() == Some(node) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// Spreads the leaders of the replicated queues `keep` selects over the running nodes:
    /// while a node leads more than its share (the total over the running nodes, rounded up),
    /// one of its queues moves to the running member that leads fewest. Answers how many of
    /// them each running node leads afterwards, as the groups report it.
    pub async fn rebalance(
        self: &Arc<Self>,
        b: &Broker,
        kind: Kind,
        keep: impl Fn(&str, &str) -> bool,
    ) -> BTreeMap<String, usize> {
        let mut queues = Vec::new();
        for v in b.vhosts() {
            for q in v.snapshot().queues.values() {
                let Some((group, members)) = q.group() else {
                    continue;
                };
                let wanted = match kind {
                    Kind::All => true,
                    Kind::Quorum => !q.mirrored(),
                    Kind::Classic => q.mirrored(),
                };
                if wanted && keep(&v.name, q.name()) {
                    queues.push(Candidate {
                        group,
                        members,
                        leader: None,
                    });
                }
            }
        }
        for q in &mut queues {
            q.leader = self.leader_of_group(q.group, &q.members).await;
        }
        let running = self.running_members();
        let mut leads: BTreeMap<String, usize> = running.iter().map(|n| (n.clone(), 0)).collect();
        for q in &queues {
            if let Some(n) = q.leader.as_ref().and_then(|l| leads.get_mut(l)) {
                *n += 1;
            }
        }
        let led = leads.values().sum::<usize>();
        let share = led.div_ceil(running.len().max(1));
        for q in &mut queues {
            let Some(from) = q.leader.clone() else {
                continue;
            };
            if leads.get(&from).copied().unwrap_or(0) <= share {
                continue;
            }
            let to = q
                .members
                .iter()
                .filter(|m| **m != from && leads.contains_key(*m))
                .min_by_key(|m| leads[*m])
                .cloned();
            let Some(to) = to.filter(|t| leads[t] + 1 < leads[&from]) else {
                continue;
            };
            if self.transfer(q.group, &q.members, &to).await {
                tracing::info!(group = format!("{:016x}", q.group), from = %from, to = %to, "rebalance: queue leader moved");
                *leads.entry(from).or_default() -= 1;
                *leads.entry(to.clone()).or_default() += 1;
                q.leader = Some(to);
            }
        }
        // What the groups say now: a transfer that did not take may still have moved the
        // leader elsewhere (the group elected again).
        let mut now: BTreeMap<String, usize> = running.iter().map(|n| (n.clone(), 0)).collect();
        for q in &queues {
            if let Some(l) = self.leader_of_group(q.group, &q.members).await {
                if let Some(n) = now.get_mut(&l) {
                    *n += 1;
                }
            }
        }
        now
    }
}
