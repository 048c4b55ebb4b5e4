//! Placement: the node a new queue lives on (RabbitMQ's locators) and a new replicated queue's
//! members.

use super::Cluster;
use crate::cluster::ClusterQueue;

impl Cluster {
    /// Where a new queue lives, by RabbitMQ's locators (`x-queue-master-locator` /
    /// `queue-master-locator`: `client-local`, `min-masters`, `random`; `x-queue-leader-locator`
    /// / `queue-leader-locator`: `client-local`, `balanced`, and `least-leaders`, an older name
    /// of `balanced`). Default: this node (client-local).
    /// Only running nodes are chosen.
    pub fn place(&self, locator: Option<&str>) -> String {
        let running: Vec<String> = self
            .members()
            .into_iter()
            .map(|n| n.name)
            .filter(|n| self.running(n))
            .collect();
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
                    for m in q.quorum().map(|q| q.members()).unwrap_or_default() {
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
