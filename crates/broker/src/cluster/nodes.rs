//! The members and which of them run: the membership watcher, the task that keeps a link open to
//! every member, node addresses, and the `/api/nodes` and `cluster_status` views.

use std::sync::Arc;
use std::time::Duration;

use super::{Cluster, SERVICE_NODE, SERVICE_VIEW};

/// A member not running (no link to it) for this many one-second ticks in a row is down, for
/// its exclusive queues: longer than a link's reconnect after a blip.
const DOWN_AFTER_TICKS: u32 = 3;

impl Cluster {
    pub(super) async fn watch_members(self: Arc<Self>) {
        let mut w = self.meta().watch();
        loop {
            let st = w.borrow_and_update().clone();
            let now: Vec<warren_cluster::Node> =
                st.members.iter().map(|m| m.node.clone()).collect();
            let before = std::mem::replace(&mut *self.nodes.write(), now.clone());
            // A member just added is up (it asked to join): link to it now, even if a dial to
            // its address failed a moment ago (a seed dialed before it listened), so the first
            // request forwarded to it does not fail fast as if it were down.
            for n in now {
                if n.name != self.me && !before.iter().any(|b| b.name == n.name) {
                    self.links.forget_failure(&n.addr);
                    let links = self.links.clone();
                    tokio::spawn(async move {
                        let _ = links.link(&n.addr).await;
                    });
                }
            }
            if w.changed().await.is_err() {
                return;
            }
        }
    }

    /// Keeps a link open to every member (Raft alone links followers only to the leader), so
    /// "running" is known for every node and a forwarded request finds its link open.
    pub(super) async fn keep_links(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut leaderless = 0u32;
        let mut told = false;
        // Members seen not running, by name: for how many ticks in a row.
        let mut down: std::collections::HashMap<String, u32> = Default::default();
        let naming = Arc::new(std::sync::atomic::AtomicBool::new(false));
        loop {
            tick.tick().await;
            self.drop_exclusive_of_down_nodes(&mut down);
            self.name_the_cluster(&naming);
            // A node forgotten while it was cut off never hears from a leader again: find out
            // why, and say it once.
            leaderless = match self.meta().status().leader {
                Some(_) => 0,
                None => leaderless + 1,
            };
            if leaderless % 10 == 9 && !told {
                if let Some(peer) = self.forgotten_by().await.first() {
                    tracing::error!(node = %self.me, by = %peer, "this node was removed from the cluster (forget_cluster_node); it cannot serve definitions changes. To add it again, stop it, delete its Raft state ({}) and start it with the cluster's peers", self.raft_dir().display());
                    told = true;
                }
            }
            for n in self.members() {
                if n.name != self.me && self.links.get(&n.addr).is_none() {
                    let links = self.links.clone();
                    tokio::spawn(async move {
                        let _ = links.link(&n.addr).await;
                    });
                }
            }
        }
    }

    /// A cluster without a name takes its first leader's, once, through the log: from then on
    /// every node reports the same `cluster_name`, whoever leads (RabbitMQ names a cluster
    /// after a node too; `warren ctl set_cluster_name` changes it). `naming`: a proposal is
    /// in flight (a failed one is tried again on a later tick).
    fn name_the_cluster(self: &Arc<Self>, naming: &Arc<std::sync::atomic::AtomicBool>) {
        if naming.load(std::sync::atomic::Ordering::Acquire) || !self.leads() {
            return;
        }
        let Some(broker) = self.broker() else { return };
        if broker
            .access
            .global_parameter(crate::access::CLUSTER_NAME)
            .is_some()
        {
            return;
        }
        naming.store(true, std::sync::atomic::Ordering::Release);
        let (name, naming) = (serde_json::Value::from(self.me.clone()), naming.clone());
        tokio::task::spawn_blocking(move || {
            let r = broker
                .access
                .set_global_parameter(crate::access::CLUSTER_NAME, name);
            naming.store(false, std::sync::atomic::Ordering::Release);
            match r {
                Ok(()) => {
                    tracing::info!(cluster_name = %broker.cluster_name(), "the cluster is named after its first leader")
                }
                Err(e) => tracing::debug!(error = %e, "cannot name the cluster yet"),
            }
        });
    }

    /// Whether this node leads the metadata group now.
    fn leads(&self) -> bool {
        let st = self.meta().status();
        st.members
            .iter()
            .any(|m| Some(m.id) == st.leader && m.node.name == self.me)
    }

    /// As RabbitMQ deletes a node's exclusive queues when it detects the node down (their
    /// connections went with it): the metadata leader deletes those of a member that has not
    /// been running for [`DOWN_AFTER_TICKS`] ticks in a row, once per time it goes down.
    fn drop_exclusive_of_down_nodes(
        self: &Arc<Self>,
        down: &mut std::collections::HashMap<String, u32>,
    ) {
        if !self.leads() {
            down.clear();
            return;
        }
        for n in self.members() {
            if n.name == self.me || self.running(&n.name) {
                down.remove(&n.name);
                continue;
            }
            let ticks = down.entry(n.name.clone()).or_insert(0);
            *ticks += 1;
            if *ticks != DOWN_AFTER_TICKS {
                continue;
            }
            let Some(broker) = self.broker() else { return };
            let c = self.clone();
            tokio::spawn(async move {
                let gone = c
                    .delete_queues(&broker, |q| {
                        q.options().exclusive_owner.is_some()
                            && q.home().as_deref() == Some(n.name.as_str())
                    })
                    .await;
                for (vhost, queue, r) in gone {
                    match r {
                        Ok(_) => {
                            tracing::info!(%vhost, %queue, node = %n.name, "exclusive queue of a node that is down deleted")
                        }
                        Err(e) => {
                            tracing::warn!(%vhost, %queue, node = %n.name, error = %e, "cannot delete an exclusive queue of a node that is down")
                        }
                    }
                }
            });
        }
    }

    /// The link address of node `name`.
    pub fn addr_of(&self, name: &str) -> Option<String> {
        if name == self.me {
            return Some(self.addr.clone());
        }
        self.nodes
            .read()
            .iter()
            .find(|n| n.name == name)
            .map(|n| n.addr.clone())
    }

    pub fn members(&self) -> Vec<warren_cluster::Node> {
        self.nodes.read().clone()
    }

    /// The names of the members running now (this node and those linked to it).
    pub fn running_members(&self) -> Vec<String> {
        self.members()
            .into_iter()
            .map(|n| n.name)
            .filter(|n| self.running(n))
            .collect()
    }

    /// Whether node `name` is this one or linked to it now.
    pub fn running(&self, name: &str) -> bool {
        name == self.me
            || self
                .addr_of(name)
                .is_some_and(|a| self.links.get(&a).is_some())
    }

    /// Every member's `/api/nodes` object; a node that does not answer is listed not running.
    pub async fn node_objects(&self, local: serde_json::Value) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        for n in self.members() {
            if n.name == self.me {
                out.push(local.clone());
                continue;
            }
            let r = self
                .links
                .call(&n.addr, SERVICE_NODE, &[], Duration::from_secs(1))
                .await;
            match r
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            {
                Some(v) => out.push(v),
                None => {
                    out.push(serde_json::json!({"name": n.name, "type": "disc", "running": false}))
                }
            }
        }
        out.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        out
    }

    /// Every other member's answer to management question `request` (`SERVICE_VIEW`), asked
    /// at once; `None` for a member that is down or does not answer within `wait`. By node
    /// name, in name order.
    pub async fn gather(
        &self,
        request: &[u8],
        wait: Duration,
    ) -> Vec<(String, Option<bytes::Bytes>)> {
        let mut asks = tokio::task::JoinSet::new();
        let mut out = Vec::new();
        for n in self.members() {
            if n.name == self.me {
                continue;
            }
            if !self.running(&n.name) {
                out.push((n.name, None));
                continue;
            }
            let (links, request) = (self.links.clone(), request.to_vec());
            asks.spawn(async move {
                let r = links.call(&n.addr, SERVICE_VIEW, &request, wait).await;
                (n.name, r.ok())
            });
        }
        while let Some(r) = asks.join_next().await {
            if let Ok(answer) = r {
                out.push(answer);
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// `warren ctl cluster_status`: members, which run, the Raft leader and term.
    pub fn status_json(&self) -> serde_json::Value {
        let st = self.meta().status();
        let leader = st
            .members
            .iter()
            .find(|m| Some(m.id) == st.leader)
            .map(|m| m.node.name.clone());
        let mut nodes: Vec<serde_json::Value> = st
            .members
            .iter()
            .map(|m| {
                serde_json::json!({
                    "name": m.node.name,
                    "address": m.node.addr,
                    "voter": m.voter,
                    "running": self.running(&m.node.name),
                })
            })
            .collect();
        nodes.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        serde_json::json!({
            "node": self.me,
            "nodes": nodes,
            "leader": leader,
            "term": st.term,
            "last_applied": st.last_applied,
        })
    }
}
