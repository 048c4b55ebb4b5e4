//! Changing a queue's members: `add_member` / `delete_member` (the group's change, then the
//! metadata's; each node applies the new member list to its queue, `ReplicatedQueue::set_members`).

use std::sync::Arc;
use std::time::Duration;

use super::{change_group, SERVICE_QMEMBER};
use crate::cluster::Cluster;
use crate::definitions::op::DefOp;

impl Cluster {
    /// `add_member` / `delete_member`: adds `node` to (or removes it from) a replicated queue's
    /// members. A new member first opens an empty replica (through the metadata), then the
    /// group adds it and its leader sends it the log; a member leaves the group first, then
    /// the metadata, so the group never counts on a node that has dropped its replica.
    pub async fn change_queue_member(
        self: &Arc<Self>,
        vhost: &str,
        queue: &str,
        node: &str,
        add: bool,
    ) -> Result<(), crate::access::MgmtError> {
        use crate::access::MgmtError;
        let b = self
            .broker()
            .ok_or_else(|| MgmtError::Internal("stopping".into()))?;
        let q = b
            .vhost(vhost)
            .and_then(|v| v.queue(queue))
            .ok_or_else(|| MgmtError::NotFound(format!("no queue '{queue}' in vhost '{vhost}'")))?;
        // A replicated queue of either kind (`quorum/` or `replicated/`).
        let (group, mut members) = q.group().ok_or_else(|| {
            MgmtError::BadRequest(format!(
                "queue '{queue}' in vhost '{vhost}' is not a quorum queue"
            ))
        })?;
        if self.addr_of(node).is_none() {
            return Err(MgmtError::BadRequest(format!(
                "{node} is not a member of the cluster"
            )));
        }
        let present = members.iter().any(|m| m == node);
        if add == present {
            return Ok(());
        }
        if !add && members.len() == 1 {
            return Err(MgmtError::BadRequest(format!(
                "cannot remove the last member of queue '{queue}' in vhost '{vhost}'"
            )));
        }
        let set = |members: Vec<String>| DefOp::QueueMembers {
            vhost: vhost.to_string(),
            queue: queue.to_string(),
            members,
        };
        // The members that run the group already: one of them makes the change (a new
        // member knows no leader yet).
        let old: Vec<String> = members.iter().filter(|m| *m != node).cloned().collect();
        if add {
            members.push(node.to_string());
            self.propose_mgmt(set(members.clone())).await?;
        }
        let mut body = group.to_be_bytes().to_vec();
        body.push(if add { 1 } else { 2 });
        body.extend_from_slice(node.as_bytes());
        let local = if old.contains(&self.me) {
            self.groups.read().get(&group).cloned()
        } else {
            None
        };
        let changed = match local {
            Some(meta) => change_group(self, &meta, node, add).await,
            None => {
                let mut done = Err("no member of the queue is running".to_string());
                for m in old.iter().filter(|m| self.running(m)) {
                    let Some(addr) = self.addr_of(m) else {
                        continue;
                    };
                    done = self
                        .links
                        .call(&addr, SERVICE_QMEMBER, &body, Duration::from_secs(15))
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string());
                    if done.is_ok() {
                        break;
                    }
                }
                done
            }
        };
        if let Err(e) = changed {
            if add {
                // The group did not take it: the new member's empty replica goes again.
                members.retain(|m| m != node);
                let _ = self.propose_mgmt(set(members)).await;
            }
            return Err(MgmtError::Unavailable(format!(
                "changing the members of queue '{queue}' in vhost '{vhost}': {e}"
            )));
        }
        if !add {
            members.retain(|m| m != node);
            self.propose_mgmt(set(members)).await?;
        }
        tracing::info!(vhost, queue, node, add, "quorum queue members changed");
        Ok(())
    }
}
