//! The commands that change the membership: `join_cluster` (this node leaves its own cluster
//! for another's) and `forget_cluster_node` (a stopped member is taken out, with its queues).

use std::sync::Arc;

use warren_protocol::Method;

use super::Cluster;
use crate::access::AccessFile;
use crate::cluster::ClusterQueue;
use crate::definitions::op::{Applying, DefOp, DefReply};
use crate::queue::QueueRef;
use crate::server::Broker;

impl Cluster {
    /// Proposes the deletion of every queue `which` picks (in every vhost); returns each one's
    /// vhost, name and outcome.
    pub(super) async fn delete_queues(
        &self,
        broker: &Arc<Broker>,
        which: impl Fn(&QueueRef) -> bool,
    ) -> Vec<(Arc<str>, Arc<str>, Result<DefReply, String>)> {
        let mut done = Vec::new();
        for v in broker.vhosts() {
            let gone: Vec<Arc<str>> = v
                .snapshot()
                .queues
                .values()
                .filter(|q| which(q))
                .map(|q| q.name().clone())
                .collect();
            for name in gone {
                let m = warren_protocol::method::QueueDelete {
                    queue: (&*name).into(),
                    ..Default::default()
                };
                let mut b = bytes::BytesMut::new();
                Method::from(m).encode_payload(&mut b);
                let op = DefOp::Vhost {
                    vhost: v.name.to_string(),
                    method: b.to_vec(),
                    queue: None,
                };
                done.push((v.name.clone(), name, self.propose(op).await));
            }
        }
        done
    }

    /// `join_cluster`: leaves this node's own (single-node) cluster, dropping its definitions
    /// and messages, and joins the cluster of the node at `addr`.
    pub async fn join_cluster(
        self: &Arc<Self>,
        broker: &Arc<Broker>,
        addr: &str,
    ) -> Result<(), String> {
        let st = self.meta().status();
        if st.members.len() > 1 {
            return Err(format!(
                "node {} is already a member of a cluster of {} nodes; forget it there first (forget_cluster_node) and reset it",
                self.me,
                st.members.len()
            ));
        }
        if addr == self.addr {
            return Err("a node cannot join itself".into());
        }
        // The target must answer before anything here is dropped.
        self.links
            .link(addr)
            .await
            .map_err(|e| format!("cannot reach {addr}: {e}"))?;
        tracing::info!(node = %self.me, target = addr, "joining another cluster: resetting this node");
        let old = self.meta();
        old.shutdown().await;
        for v in broker.vhosts() {
            let _ = broker.delete_vhost_at(&v.name, Some(Applying::RESTORE));
        }
        let _ = broker.access.replace(AccessFile::default());
        let dir = broker.config.data_dir.join("raft");
        std::fs::remove_dir_all(&dir)
            .map_err(|e| format!("cannot reset {}: {e}", dir.display()))?;
        let meta = self.open_meta(broker).await.map_err(|e| e.to_string())?;
        meta.join(&[addr.to_string()])
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(self.clone().watch_members());
        tracing::info!(node = %self.me, target = addr, "joined the cluster");
        Ok(())
    }

    /// `forget_cluster_node`: takes `name` out of the membership (from any member).
    pub async fn forget(self: &Arc<Self>, name: &str) -> Result<(), String> {
        if name == self.me {
            return Err(
                "a node cannot forget itself; run forget_cluster_node on another node".into(),
            );
        }
        let st = self.meta().status();
        let m = st
            .members
            .iter()
            .find(|m| m.node.name == name)
            .ok_or_else(|| format!("node {name} is not a member of this cluster"))?;
        // RabbitMQ's rule: a running member would go on as a member of nothing.
        if self.running(name) {
            return Err(format!(
                "Warren on node {name} must be stopped before it can be removed"
            ));
        }
        let broker = self.broker().ok_or("node stopping")?;
        let mut unshrunk = Vec::new();
        // As RabbitMQ's forget_cluster_node: the node leaves its replicated queues
        // (rabbit_quorum_queue:shrink_all) while it is still a member to be named...
        for v in broker.vhosts() {
            for q in v.snapshot().queues.values() {
                // A replicated queue of either kind (`quorum/` or `replicated/`).
                let Some((_, members)) = q.group() else {
                    continue;
                };
                if members.iter().any(|m| m == name) {
                    if let Err(e) = self
                        .change_queue_member(&v.name, q.name(), name, false)
                        .await
                    {
                        tracing::warn!(vhost = %v.name, queue = %q.name(), node = name, error = %e, "cannot remove a forgotten node from a replicated queue");
                        unshrunk.push(format!("'{}' in vhost '{}' ({e})", q.name(), v.name));
                    }
                }
            }
        }
        self.meta().remove(m.id).await.map_err(|e| e.to_string())?;
        // ...and its classic queues go with it (rabbit_amqqueue:forget_all_durable): their
        // messages were on its disk only.
        let gone = self
            .delete_queues(&broker, |q| q.remote().is_some_and(|r| r.home == name))
            .await;
        for (vhost, queue, r) in gone {
            match r {
                Ok(_) => {
                    tracing::info!(%vhost, %queue, node = name, "queue of a forgotten node deleted")
                }
                Err(e) => {
                    tracing::warn!(%vhost, %queue, node = name, error = %e, "cannot delete a queue of a forgotten node")
                }
            }
        }
        if unshrunk.is_empty() {
            return Ok(());
        }
        // RabbitMQ answers so too: the node is forgotten, and the queues it kept are named.
        Err(format!(
            "{name} was removed from the cluster, but it could not leave these quorum queues: {}",
            unshrunk.join(", ")
        ))
    }
}
