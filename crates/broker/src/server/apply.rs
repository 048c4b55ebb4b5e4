//! Applying the definitions command ([`DefOp`]) on this node, the one way a change of users,
//! vhosts, permissions, policies, limits, exchanges, queues or bindings is made:
//! - in a cluster, the metadata group's state machine (`cluster/state_machine.rs`) calls
//!   [`apply`] for each committed entry, on every node;
//! - on a single node, the [`LocalApplier`] is the [`Proposer`]: it applies each change at once
//!   through the same [`apply`], and the vhost and access code journal it (`definitions.log`,
//!   `access.json`) before it is visible.
//!
//! Either way the caller asked through the [`Proposer`] and reads the outcome as a [`DefReply`].

use std::sync::{Arc, Weak};

use bytes::Bytes;
use warren_protocol::Method;

use super::Broker;
use crate::access::LimitScope;
use crate::definitions::op::{Applying, DefOp, DefReply};
use crate::definitions::proposer::{Proposal, Proposer};
use crate::error::AmqpError;

/// Makes `op` on this node, as the entry or change `at`.
pub fn apply(b: &Arc<Broker>, op: DefOp, at: Applying) -> DefReply {
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
                Ok(m) => {
                    let r = v.apply_method(&m, queue.as_ref(), at);
                    // A new queue takes the policies in force on every node, where it runs
                    // too (its declaring node may be another, whose channel applies them to
                    // its own stand-in only).
                    if let (Ok(_), Method::QueueDeclare(d)) = (&r, &m) {
                        if let Some(q) = v.queue(&d.queue) {
                            crate::policy::apply(&b.access, &q);
                        }
                    }
                    match r {
                        Ok(Some(message_count)) => DefReply::Deleted { message_count },
                        r => DefReply::amqp(r.map(|_| ())),
                    }
                }
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
        DefOp::ClearLimit { user, name, key } => {
            let scope = limit_scope(user);
            let r = b.access.clear_limit_at(scope, &name, key.as_deref(), now);
            b.limits_changed(scope, &name);
            DefReply::mgmt(r)
        }
        DefOp::SetGlobalParameter { name, value } => {
            DefReply::mgmt(b.access.set_global_parameter_at(&name, value, now))
        }
        DefOp::SetParameter {
            component,
            vhost,
            name,
            value,
        } => DefReply::mgmt(
            b.access
                .set_parameter_at(&component, &vhost, &name, value, now),
        ),
        DefOp::ClearParameter {
            component,
            vhost,
            name,
        } => DefReply::mgmt(b.access.clear_parameter_at(&component, &vhost, &name, now)),
        // A replicated queue's members: only a cluster has them, and its state machine applies
        // this op itself (`cluster/state_machine.rs`).
        DefOp::QueueMembers { vhost, queue, .. } => DefReply::Mgmt {
            kind: 0,
            text: format!("no quorum queue '{queue}' in vhost '{vhost}'"),
        },
    }
}

fn limit_scope(user: bool) -> LimitScope {
    if user {
        LimitScope::User
    } else {
        LimitScope::Vhost
    }
}

/// A single node's [`Proposer`]: makes each change at once, on the caller's thread, through
/// [`apply`] (as [`Applying::LOCAL`]).
pub struct LocalApplier(pub Weak<Broker>);

impl LocalApplier {
    fn apply_now(&self, op: DefOp) -> Result<DefReply, String> {
        let b = self.0.upgrade().ok_or("the broker is stopping")?;
        Ok(apply(&b, op, Applying::LOCAL))
    }
}

impl Proposer for LocalApplier {
    fn propose(&self, op: DefOp) -> Proposal<'_> {
        let r = self.apply_now(op);
        Box::pin(async move { r })
    }

    /// At once: nothing to wait for, so the worker is not handed off (`block_in_place`).
    fn propose_blocking(&self, op: DefOp) -> Result<DefReply, String> {
        self.apply_now(op)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use warren_protocol::FieldTable;

    use super::*;
    use crate::config::Config;
    use crate::definitions::records::VhostDef;
    use crate::vhost::tests::queue as spec;

    /// A single node's vhosts, recovered or created, and its access registry send their
    /// changes to the node's applier, which makes them at once; a restart finds them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_single_nodes_changes_go_through_its_applier_and_survive_a_restart() {
        let dir = std::env::temp_dir().join(format!("warren-apply-{}", rand::random::<u64>()));
        let config = Config {
            data_dir: dir.clone(),
            ..Config::default()
        };
        let b = Broker::new(config.clone()).unwrap();
        let local = b
            .proposer
            .get()
            .cloned()
            .expect("a single node has its applier");
        let def = VhostDef {
            name: "v".into(),
            description: String::new(),
        };
        assert!(b.add_vhost(def).unwrap());
        for v in b.vhosts() {
            assert!(v.proposes_through(&local), "vhost '{}'", v.name);
        }
        let args = FieldTable::new();
        let v = b.vhost("v").unwrap();
        let q = v.declare_queue(&spec("q", &args)).unwrap();
        assert!(q.store_id().is_some_and(|id| id != 0));
        let gone = v.declare_queue(&spec("gone", &args)).unwrap();
        assert_eq!(
            v.delete_queue("gone", false, false, None)
                .unwrap()
                .message_count,
            0
        );
        assert!(gone.is_deleted());
        let user = crate::definitions::records::UserDef {
            name: "u".into(),
            password_hash: String::new(),
            hashing_algorithm: "rabbit_password_hashing_sha256".into(),
            tags: Vec::new(),
            limits: Default::default(),
        };
        b.access.put_user(user).unwrap();
        // A change the applier refuses comes back as the caller's error.
        assert!(matches!(
            b.delete_vhost("no-such"),
            Err(crate::access::MgmtError::NotFound(_))
        ));
        drop((q, gone, v));
        b.persister.stop();
        drop(b);
        let again = Broker::new(config).unwrap();
        let v = again.vhost("v").expect("the vhost was recorded");
        assert!(v.snapshot().queues.contains_key("q"));
        assert!(!v.snapshot().queues.contains_key("gone"));
        assert!(again.access.user("u").is_some());
        again.persister.stop();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
