//! The broker as the metadata group's Raft state machine: applying an entry runs the applier a
//! single node runs (`server/apply.rs`), given the entry as an [`Applying`] so that the vhost
//! and access code make the change instead of proposing it, and a snapshot is the whole
//! metadata state.

use std::sync::{Arc, Weak};

use serde::{Deserialize, Serialize};

use crate::access::AccessFile;
use crate::definitions::op::{Applying, DefOp, DefReply};
use crate::server::Broker;

/// What the state machine hands back to a proposer: the entry's index and its outcome.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Applied {
    pub(super) index: u64,
    pub(super) reply: DefReply,
}

/// The broker as Raft's state machine.
pub(super) struct BrokerSm(pub(super) Weak<Broker>);

impl warren_cluster::StateMachine for BrokerSm {
    fn apply(&self, index: u64, command: &bytes::Bytes) -> Vec<u8> {
        let Some(b) = self.0.upgrade() else {
            return Vec::new();
        };
        let reply = match serde_json::from_slice::<DefOp>(command) {
            Ok(op) => apply(&b, op, Applying::entry(index)),
            Err(e) => {
                tracing::error!(index, error = %e, "undecodable metadata entry skipped");
                DefReply::Mgmt {
                    kind: 2,
                    text: format!("undecodable entry: {e}"),
                }
            }
        };
        serde_json::to_vec(&Applied { index, reply }).unwrap_or_default()
    }

    fn snapshot(&self) -> Vec<u8> {
        let Some(b) = self.0.upgrade() else {
            return Vec::new();
        };
        serde_json::to_vec(&snapshot(&b)).unwrap_or_default()
    }

    fn restore(&self, _index: Option<u64>, data: &[u8]) {
        let Some(b) = self.0.upgrade() else { return };
        match serde_json::from_slice::<Snapshot>(data) {
            Ok(s) => restore(&b, s),
            Err(e) => tracing::error!(error = %e, "undecodable metadata snapshot"),
        }
    }
}

/// Applies a committed entry: a replicated queue's members here, the rest as a single node
/// applies it (`server/apply.rs`).
fn apply(b: &Arc<Broker>, op: DefOp, at: Applying) -> DefReply {
    match op {
        DefOp::QueueMembers {
            vhost,
            queue,
            members,
        } => {
            let q = b.vhost(&vhost).and_then(|v| v.queue(&queue));
            if let Some(q) = q
                .as_ref()
                .and_then(|q| q.downcast::<crate::replicated::ReplicatedQueue>())
            {
                q.set_members(members);
                return DefReply::Ok;
            }
            if let Some(g) = q
                .as_ref()
                .and_then(|q| q.stream())
                .and_then(|s| s.replicated())
            {
                g.set_members(members);
                return DefReply::Ok;
            }
            DefReply::Mgmt {
                kind: 0,
                text: format!("no quorum queue '{queue}' in vhost '{vhost}'"),
            }
        }
        op => crate::server::apply::apply(b, op, at),
    }
}

/// The whole metadata state, as a Raft snapshot holds it.
#[derive(Serialize, Deserialize)]
struct Snapshot {
    access: AccessFile,
    /// Per vhost, the ops that recreate its exchanges, queues and bindings.
    vhosts: Vec<(String, Vec<DefOp>)>,
}

fn snapshot(b: &Arc<Broker>) -> Snapshot {
    Snapshot {
        access: b.access.export(),
        vhosts: b
            .vhosts()
            .iter()
            .map(|v| (v.name.to_string(), v.replicated_definitions()))
            .collect(),
    }
}

/// Replaces this node's metadata with a snapshot's: what the snapshot lacks is deleted, what
/// it has is declared (a no-op for what exists already, equal), as [`Applying::RESTORE`].
fn restore(b: &Arc<Broker>, s: Snapshot) {
    let at = Applying::RESTORE;
    let keep: std::collections::HashSet<&str> =
        s.access.vhosts.iter().map(|v| v.name.as_str()).collect();
    for v in b.vhosts() {
        if !keep.contains(&*v.name) {
            let _ = b.delete_vhost_at(&v.name, Some(at));
        }
    }
    for v in &s.access.vhosts {
        let _ = b.add_vhost_at(v.clone(), Some(at));
    }
    if let Err(e) = b.access.replace(s.access) {
        tracing::error!(error = %e, "cannot restore users and permissions from the snapshot");
    }
    for (name, ops) in s.vhosts {
        let Some(v) = b.vhost(&name) else { continue };
        v.retain_only(&ops, at);
        for op in ops {
            let _ = apply(b, op, at);
        }
        b.apply_policies(&v);
    }
}
