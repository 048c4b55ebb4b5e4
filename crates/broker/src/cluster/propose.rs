//! Proposing a change to the metadata group: replicate it, retry while there is no leader,
//! and wait (bounded) until the other running members applied it. The cluster is the
//! [`Proposer`] the vhost, access and broker code propose their changes through.

use std::time::Duration;

use super::state_machine::Applied;
use super::{Cluster, APPLY_WAIT, SERVICE_APPLIED};
use crate::access::MgmtError;
use crate::definitions::op::{DefOp, DefReply};
use crate::definitions::proposer::{Proposal, Proposer};

/// How long a change is retried for while the cluster has no leader that answers.
const PROPOSE_DEADLINE: Duration = Duration::from_secs(10);
/// A member that did not apply a change within [`APPLY_WAIT`] is not waited for again for this
/// long (a paused node must not slow every change down).
const LAGGING_FOR: Duration = Duration::from_secs(5);

impl Cluster {
    /// Waits (bounded) until every running member has applied entry `index`, so a change
    /// answered ok here is what a client sees through any node next (declare through one node,
    /// publish through another), as with RabbitMQ's Mnesia transactions. A member that does
    /// not answer in time is skipped: it catches up from the log.
    async fn wait_everywhere(&self, index: u64) {
        let mut waits = Vec::new();
        for n in self.members() {
            if n.name == self.me || self.links.get(&n.addr).is_none() {
                continue;
            }
            if self
                .lagging
                .lock()
                .get(&n.name)
                .is_some_and(|t| t.elapsed() < LAGGING_FOR)
            {
                continue;
            }
            let links = self.links.clone();
            waits.push(tokio::spawn(async move {
                let r = links
                    .call(&n.addr, SERVICE_APPLIED, &index.to_be_bytes(), APPLY_WAIT)
                    .await;
                let applied = r
                    .ok()
                    .and_then(|b| <[u8; 8]>::try_from(&b[..]).ok())
                    .map(u64::from_be_bytes);
                (n.name, applied.is_some_and(|a| a >= index))
            }));
        }
        for w in waits {
            if let Ok((name, caught_up)) = w.await {
                let mut lagging = self.lagging.lock();
                if caught_up {
                    lagging.remove(&name);
                } else {
                    lagging.insert(name, std::time::Instant::now());
                }
            }
        }
    }

    /// Replicates `op` and waits until this node applied it.
    pub async fn propose(&self, op: DefOp) -> Result<DefReply, String> {
        let bytes = serde_json::to_vec(&op).map_err(|e| e.to_string())?;
        // A leader that stopped answering (paused, partitioned) fails the forward after the
        // link's timeout, while the others elect a new one: try again until the deadline. Every
        // op sets state (declare, bind, put, delete), so one applied twice changes nothing.
        let deadline = tokio::time::Instant::now() + PROPOSE_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let attempt = tokio::time::timeout(left, self.meta().propose(bytes.clone()))
                .await
                .unwrap_or_else(|_| {
                    Err(warren_cluster::ProposeError::Unavailable(format!(
                        "no leader committed it within {} s",
                        PROPOSE_DEADLINE.as_secs()
                    )))
                });
            match attempt {
                Ok(r) => {
                    let a: Applied = serde_json::from_slice(&r).map_err(|e| e.to_string())?;
                    self.wait_everywhere(a.index).await;
                    return Ok(a.reply);
                }
                Err(warren_cluster::ProposeError::Unavailable(_))
                    if tokio::time::Instant::now() + Duration::from_millis(500) < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(warren_cluster::ProposeError::Unavailable(t)) => {
                    return Err(format!(
                        "the cluster has no majority to record this change ({t}); it is made only if a majority comes back before the entry is dropped"
                    ))
                }
                Err(warren_cluster::ProposeError::Fatal(t)) => return Err(t),
            }
        }
    }

    /// A users/permissions/policies/limits/vhosts change, from async code.
    pub async fn propose_mgmt(&self, op: DefOp) -> Result<(), MgmtError> {
        DefReply::into_mgmt(self.propose(op).await)
    }
}

/// The cluster is a cluster node's [`Proposer`]: the vhost, access and broker code propose
/// through it, and the state machine applies what is committed.
impl Proposer for Cluster {
    fn propose(&self, op: DefOp) -> Proposal<'_> {
        Box::pin(Cluster::propose(self, op))
    }
}
