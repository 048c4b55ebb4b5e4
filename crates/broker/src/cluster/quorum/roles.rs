//! This node's role in a queue's group: a member's task (opening, bootstrapping and following its
//! group) or a non-member's (asking the members who leads), and following the leader: the
//! leg this node uses is a remote handle to it, or this node's own queue when it leads.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{stopped, QuorumQueue, LEADER_POLL, SERVICE_QLEADER, SERVICE_QRAFT};
use crate::cluster::remote::RemoteQueue;
use crate::cluster::ClusterQueue;
use crate::queue::QueueRef;

impl QuorumQueue {
    /// Stops the current role's tasks and starts a member's or a non-member's.
    pub(super) fn start_role(self: &Arc<Self>, member: bool) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let old = std::mem::replace(&mut *self.role.lock(), tx);
        let _ = old.send(true);
        if member {
            tokio::spawn(self.clone().run_member(rx));
        } else {
            tokio::spawn(self.clone().run_follower(rx));
        }
    }

    /// A member: opens the group, bootstraps it if this is its first member and it is new, then
    /// proposes the leader's batches and follows leadership until the queue is deleted.
    async fn run_member(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let Some(c) = self.cluster.upgrade() else {
            return;
        };
        let Some(dir) = self.dir(&c) else { return };
        let me = warren_cluster::Node {
            name: c.me.clone(),
            addr: c.addr.clone(),
        };
        let meta = match warren_cluster::Meta::open(
            &dir,
            me,
            self.sm.clone(),
            Arc::new(crate::cluster::LinkTransport {
                links: c.links.clone(),
                service: SERVICE_QRAFT,
                group: Some(self.group),
            }),
            // Failover in 1-2 s: a queue's leader is what publishers wait for.
            warren_cluster::MetaConfig {
                election_timeout_min_ms: 600,
                election_timeout_max_ms: 1200,
                heartbeat_ms: 150,
                propose_timeout: Duration::from_secs(5),
                // Asked often; the replica answers with its release cursor, which moves only
                // every `CHECKPOINT_ENTRIES` entries and as messages are settled.
                snapshot_after: 64,
            },
        )
        .await
        {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(queue = %self.name, vhost = %self.vhost, error = %e, "cannot open the queue's replica");
                return;
            }
        };
        if self.deleted.load(Ordering::Acquire) || *stop.borrow() {
            meta.shutdown().await;
            return;
        }
        *self.meta.lock() = Some(meta.clone());
        c.groups.write().insert(self.group, meta.clone());
        drop(c);
        let first = self.members.read().first().cloned();
        if first.as_ref() == Some(&meta.status().me.name) && !meta.is_initialized() {
            let nodes: Vec<warren_cluster::Node> = {
                let Some(c) = self.cluster.upgrade() else {
                    return;
                };
                self.members()
                    .iter()
                    .filter_map(|n| {
                        c.addr_of(n).map(|addr| warren_cluster::Node {
                            name: n.clone(),
                            addr,
                        })
                    })
                    .collect()
            };
            if let Err(e) = meta.initialize_with(nodes).await {
                tracing::warn!(queue = %self.name, error = %e, "starting the queue's group");
            }
        }
        tokio::spawn(self.clone().propose_loop(meta.clone(), stop.clone()));
        tokio::spawn(self.clone().dead_letter_retries(stop.clone()));
        let mut status = meta.watch();
        loop {
            let (leader, me) = {
                let s = status.borrow_and_update();
                (s.leader_name().map(String::from), s.me.name.clone())
            };
            self.follow(leader, &me);
            tokio::select! {
                changed = status.changed() => if changed.is_err() { break },
                _ = stopped(&mut stop) => break,
            }
            if self.deleted.load(Ordering::Acquire) {
                break;
            }
        }
    }

    /// A non-member: asks the members who leads, and follows.
    async fn run_follower(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(LEADER_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stopped(&mut stop) => break,
            }
            if self.deleted.load(Ordering::Acquire) {
                break;
            }
            let Some(c) = self.cluster.upgrade() else {
                break;
            };
            let mut leader = None;
            for m in &self.members() {
                let Some(addr) = c.addr_of(m) else { continue };
                if !c.running(m) {
                    continue;
                }
                let asked = c
                    .links
                    .call(
                        &addr,
                        SERVICE_QLEADER,
                        &self.group.to_be_bytes(),
                        Duration::from_secs(1),
                    )
                    .await;
                if let Ok(b) = asked {
                    if !b.is_empty() {
                        leader = Some(String::from_utf8_lossy(&b).into_owned());
                        break;
                    }
                }
            }
            let me = c.me.clone();
            drop(c);
            if leader.is_some() || self.leg.load().is_none() {
                self.follow(leader, &me);
            }
        }
    }

    /// Installs the leg for `leader`, retiring the old one if it changed.
    fn follow(self: &Arc<Self>, leader: Option<String>, me: &str) {
        let current = self.leg.load_full();
        let same = match (&leader, current.as_deref()) {
            (Some(l), Some(QueueRef::Local(_))) => l == me,
            (Some(l), Some(r @ QueueRef::Other(_))) => {
                r.remote().is_some_and(|r| *l == r.home && !r.is_deleted())
            }
            (None, None) => true,
            _ => false,
        };
        if same {
            return;
        }
        self.retire_leg();
        let Some(leader) = leader else { return };
        if self.deleted.load(Ordering::Acquire) {
            return;
        }
        let Some(c) = self.cluster.upgrade() else {
            return;
        };
        if leader == me {
            self.lead();
        } else {
            let r = RemoteQueue::new(
                self.name.clone(),
                self.vhost.clone(),
                self.options.clone(),
                leader.clone(),
                &c,
            );
            r.set_effective_args((**self.args.load()).clone());
            self.leg.store(Some(Arc::new(QueueRef::Other(r))));
        }
        tracing::info!(vhost = %self.vhost, queue = %self.name, leader = %leader, "quorum queue leader");
        self.leg_changed.notify_waiters();
    }
}
