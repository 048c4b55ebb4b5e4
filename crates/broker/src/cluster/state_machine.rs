//! The broker as the metadata group's Raft state machine: applying an entry runs the same vhost
//! and access code a single node runs, given the entry as an [`Applying`] so that code makes
//! the change instead of proposing it, and a snapshot is the whole metadata state.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use warren_protocol::Method;

use crate::access::AccessFile;
use crate::cluster::ClusterQueue;
use crate::definitions::op::{Applying, DefOp, DefReply};
use crate::error::AmqpError;
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
    fn apply(&self, index: u64, command: &[u8]) -> Vec<u8> {
        let Some(b) = self.0.upgrade() else {
            return Vec::new();
        };
        let reply = match serde_json::from_slice::<DefOp>(command) {
            Ok(op) => apply(&b, op, Applying { index }),
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

fn apply(b: &Arc<Broker>, op: DefOp, at: Applying) -> DefReply {
    let now = Some(at);
    match op {
        DefOp::Vhost {
            vhost,
            method,
            queue,
        } => {
            let Some(v) = b.vhost(&vhost) else {
                return DefReply::amqp(Err(AmqpError::not_found(format!("no vhost '{vhost}'"))));
            };
            match Method::decode(&Bytes::from(method)) {
                Ok(m) => DefReply::amqp(v.apply_method(&m, queue.as_ref(), at)),
                Err(e) => DefReply::amqp(Err(AmqpError::internal_error(format!(
                    "undecodable method: {e:?}"
                )))),
            }
        }
        DefOp::AddVhost(d) => DefReply::mgmt(b.add_vhost_at(d, now).map(|_| ())),
        DefOp::DeleteVhost(name) => DefReply::mgmt(b.delete_vhost_at(&name, now)),
        DefOp::PutUser(u) => DefReply::mgmt(b.access.put_user_at(u, now)),
        DefOp::DeleteUser(name) => {
            let r = b.access.delete_user_at(&name, now);
            if r.is_ok() {
                b.close_user_connections(&name, &format!("user '{name}' is deleted"));
            }
            DefReply::mgmt(r)
        }
        DefOp::SetPermissions(p) => DefReply::mgmt(b.access.set_permissions_at(p, now)),
        DefOp::ClearPermissions { user, vhost } => {
            DefReply::mgmt(b.access.clear_permissions_at(&user, &vhost, now))
        }
        DefOp::PutPolicy(p) => DefReply::mgmt(b.put_policy_at(p, now)),
        DefOp::DeletePolicy { vhost, name } => {
            DefReply::mgmt(b.delete_policy_at(&vhost, &name, now))
        }
        DefOp::SetLimits {
            user,
            name,
            def,
            replace,
        } => {
            let scope = limit_scope(user);
            let r = b.access.set_limits_at(scope, &name, &def, replace, now);
            b.limits_changed(scope, &name);
            DefReply::mgmt(r)
        }
        DefOp::QueueMembers {
            vhost,
            queue,
            members,
        } => {
            let q = b.vhost(&vhost).and_then(|v| v.queue(&queue));
            match q.as_ref().and_then(|q| q.quorum()) {
                Some(q) => {
                    q.set_members(members);
                    DefReply::Ok
                }
                None => DefReply::Mgmt {
                    kind: 0,
                    text: format!("no quorum queue '{queue}' in vhost '{vhost}'"),
                },
            }
        }
        DefOp::ClearLimit { user, name, key } => {
            let scope = limit_scope(user);
            let r = b.access.clear_limit_at(scope, &name, key.as_deref(), now);
            b.limits_changed(scope, &name);
            DefReply::mgmt(r)
        }
    }
}

fn limit_scope(user: bool) -> crate::access::LimitScope {
    if user {
        crate::access::LimitScope::User
    } else {
        crate::access::LimitScope::Vhost
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
