//! Placement: the node a new queue lives on (RabbitMQ's locators) and a new replicated queue's
//! members; the cluster as what a vhost asks of it (`vhost::ClusterNode`).

use std::sync::Arc;

use warren_protocol::FieldTable;

use super::{quorum, remote, Cluster};
use crate::error::AmqpResult;
use crate::queue::{QueueOptions, QueueRef};
use crate::vhost::{ClusterNode, VHost};

impl Cluster {
    /// Where a new queue lives, by RabbitMQ's locators (`x-queue-master-locator` /
    /// `queue-master-locator`: `client-local`, `min-masters`, `random`; `x-queue-leader-locator`
    /// / `queue-leader-locator`: `client-local`, `balanced`, and `least-leaders`, an older name
    /// of `balanced`). Default: this node (client-local).
    /// Only running nodes are chosen. Without a locator, the config's `queue_master_locator`.
    pub fn place(&self, locator: Option<&str>) -> String {
        let default = self
            .broker()
            .and_then(|b| b.config.queue_master_locator.clone());
        let locator = locator.or(default.as_deref());
        let running = self.running_members();
        match locator {
            Some("min-masters" | "balanced" | "least-leaders") => {
                let mut load: std::collections::HashMap<&str, usize> =
                    running.iter().map(|n| (n.as_str(), 0)).collect();
                if let Some(b) = self.broker() {
                    for v in b.vhosts() {
                        for q in v.snapshot().queues.values() {
                            if let Some(n) = load.get_mut(q.home().as_deref().unwrap_or(&self.me)) {
                                *n += 1;
                            }
                        }
                    }
                }
                let mut by: Vec<(usize, &str)> = load.into_iter().map(|(n, c)| (c, n)).collect();
                by.sort();
                by.first()
                    .map_or_else(|| self.me.clone(), |(_, n)| n.to_string())
            }
            Some("random") if !running.is_empty() => {
                running[rand::random::<usize>() % running.len()].clone()
            }
            _ => self.me.clone(),
        }
    }

    /// A new replicated queue's members: `first` (its initial leader) and `size - 1` other
    /// nodes: running ones first (a node this one has no link to yet may well be up: links
    /// between followers are made on first use), then those in the fewest groups, so replicas
    /// spread over the cluster.
    pub fn quorum_members(&self, first: &str, size: usize) -> Vec<String> {
        let mut load: std::collections::HashMap<String, usize> = self
            .members()
            .into_iter()
            .map(|n| n.name)
            .filter(|n| n != first)
            .map(|n| (n, 0))
            .collect();
        if let Some(b) = self.broker() {
            for v in b.vhosts() {
                for q in v.snapshot().queues.values() {
                    for m in q.group().map(|(_, m)| m).unwrap_or_default() {
                        if let Some(n) = load.get_mut(&m) {
                            *n += 1;
                        }
                    }
                }
            }
        }
        let mut by: Vec<(bool, usize, String)> = load
            .into_iter()
            .map(|(n, c)| (!self.running(&n), c, n))
            .collect();
        by.sort();
        std::iter::once(first.to_string())
            .chain(by.into_iter().map(|(_, _, n)| n))
            .take(size.max(1))
            .collect()
    }
}

/// What a vhost of this node asks of the cluster: placement, members, and the handles of the
/// queues that live or are led elsewhere (`vhost::ClusterNode`).
impl ClusterNode for Cluster {
    fn me(&self) -> &str {
        &self.me
    }

    fn place(&self, locator: Option<&str>) -> String {
        Cluster::place(self, locator)
    }

    fn members(
        &self,
        home: &str,
        arguments: &FieldTable,
        exclusive: bool,
        policy: &dyn Fn() -> Option<serde_json::Map<String, serde_json::Value>>,
    ) -> AmqpResult<Vec<String>> {
        if crate::queue::args::is_quorum(arguments) {
            let size = crate::queue::args::initial_group_size(arguments)?;
            return Ok(self.quorum_members(home, size));
        }
        if crate::queue::args::is_stream(arguments) {
            // `x-initial-cluster-size`, default 3 (RabbitMQ's), at most the cluster's nodes.
            let size = arguments
                .get("x-initial-cluster-size")
                .and_then(|v| v.as_i64())
                .map_or(3, |n| n.max(1) as usize);
            return Ok(self.quorum_members(home, size));
        }
        if exclusive {
            return Ok(Vec::new());
        }
        // A classic queue matched by an `ha-mode` policy (RabbitMQ's mirrored queues) is
        // replicated the same way, so older clusters' setups keep their guarantee.
        Ok(match policy().and_then(|p| quorum::ha_members(&p)) {
            Some(quorum::Ha::Size(n)) => self.quorum_members(home, n),
            Some(quorum::Ha::Nodes(nodes)) => {
                let first = if nodes.iter().any(|n| n == home) {
                    home.to_string()
                } else {
                    nodes[0].clone()
                };
                std::iter::once(first.clone())
                    .chain(nodes.into_iter().filter(|n| *n != first))
                    .collect()
            }
            None => Vec::new(),
        })
    }

    fn replicated_queue(
        self: Arc<Self>,
        name: Arc<str>,
        vhost: &Arc<VHost>,
        options: QueueOptions,
        group: u64,
        members: Vec<String>,
    ) -> QueueRef {
        self.on_machine(&name, vhost, &options, group, &members)
    }

    fn stream_member(
        self: Arc<Self>,
        stream: &Arc<crate::queue::stream::Stream>,
        group: u64,
        members: Vec<String>,
    ) -> AmqpResult<()> {
        let net = Arc::new(super::rq::ClusterNet {
            c: Arc::downgrade(&self),
        });
        let r = crate::replicated::stream::ReplicatedStream::start(
            stream,
            group,
            members,
            self.me.clone(),
            stream.dir().join("group"),
            net,
        )
        .map_err(|e| {
            crate::error::AmqpError::internal_error(format!(
                "cannot make {} a member of its group: {e}",
                stream.describe()
            ))
        })?;
        self.register_rstream(&r);
        Ok(())
    }

    fn remote_queue(
        self: Arc<Self>,
        name: Arc<str>,
        vhost: Arc<str>,
        options: QueueOptions,
        home: String,
    ) -> QueueRef {
        QueueRef::Other(remote::RemoteQueue::new(name, vhost, options, home, &self))
    }

    fn first_leader(&self, q: &QueueRef) -> AmqpResult<()> {
        if let Some(r) = q.group().and_then(|(g, _)| self.rstream(g)) {
            let handle = tokio::runtime::Handle::current();
            let up = tokio::task::block_in_place(|| {
                handle.block_on(r.wait_leader(quorum::FIRST_LEADER_WAIT))
            });
            return if up {
                Ok(())
            } else {
                Err(crate::error::AmqpError::not_found(format!(
                    "{} has no leader: a majority of its members ({}) is down, or an election is under way",
                    q.describe(),
                    r.members().join(", ")
                )))
            };
        }
        if let Some(r) = q.downcast::<crate::replicated::ReplicatedQueue>() {
            let handle = tokio::runtime::Handle::current();
            let up = tokio::task::block_in_place(|| {
                handle.block_on(r.wait_leader(quorum::FIRST_LEADER_WAIT))
            });
            return if up { Ok(()) } else { Err(r.unavailable()) };
        }
        Ok(())
    }
}

impl Cluster {
    /// A replicated queue (a quorum queue, or a classic one an `ha-mode` policy mirrors) on the
    /// replicated queue machine (`replicated/`): its group under `quorum/<group>/group`. A group
    /// an earlier release wrote (`quorum/<group>` without `group/`) is opened where it is, and
    /// its leader carries its messages over to the machine (`replicated/legacy.rs`).
    fn on_machine(
        self: &Arc<Self>,
        name: &Arc<str>,
        vhost: &Arc<VHost>,
        options: &QueueOptions,
        group: u64,
        members: &[String],
    ) -> QueueRef {
        // (No broker: this node is stopping, and the group will not open.)
        let data_dir = self
            .broker()
            .map(|b| b.config.data_dir.clone())
            .unwrap_or_default();
        let dir = data_dir.join("quorum").join(format!("{group:016x}"));
        let dir = if dir.exists() && !dir.join("group").exists() {
            dir
        } else {
            dir.join("group")
        };
        let owner: std::sync::Weak<dyn crate::queue::QueueOwner> = Arc::downgrade(vhost) as _;
        let q = crate::replicated::ReplicatedQueue::open(
            name.clone(),
            vhost.name.clone(),
            options.clone(),
            None,
            dir,
            owner,
            crate::replicated::Placement {
                group,
                members: members.to_vec(),
                me: self.me.clone(),
                net: Arc::new(super::rq::ClusterNet {
                    c: Arc::downgrade(self),
                }),
                carry: None,
            },
        );
        self.register_rqueue(&q);
        QueueRef::Other(q)
    }
}
