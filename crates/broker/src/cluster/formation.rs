//! Forming the cluster at boot: open this node's Raft state, start the link listener, then
//! initialize the cluster (the first node, which seeds it) or join it; catch up with the other
//! members, and refuse to boot a node the cluster forgot.

use std::sync::Arc;
use std::time::Duration;

use super::handler::LinkHandler;
use super::link::Links;
use super::remote;
use super::state_machine::BrokerSm;
use super::{Cluster, LinkTransport, SERVICE_APPLIED, SERVICE_MEMBER, SERVICE_RAFT};
use crate::definitions::op::DefOp;
use crate::server::Broker;

impl Cluster {
    /// Opens this node's Raft state, starts the link listener, and joins or starts the cluster.
    pub async fn start(broker: &Arc<Broker>) -> anyhow::Result<Arc<Cluster>> {
        let cfg = broker
            .config
            .cluster
            .clone()
            .ok_or_else(|| anyhow::anyhow!("no [cluster] section"))?;
        let cookie = cookie(&broker.config, &cfg)?;
        let addr = cfg.address();
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .map_err(|e| {
                anyhow::anyhow!("cannot listen for inter-node links on {}: {e}", cfg.listen)
            })?;
        let links = Links::new(broker.config.node_name.clone(), addr.clone(), cookie);
        let c = Arc::new(Cluster {
            me: broker.config.node_name.clone(),
            addr: addr.clone(),
            links: links.clone(),
            meta: parking_lot::RwLock::new(None),
            broker: Arc::downgrade(broker),
            remote: remote::Remote::default(),
            nodes: Default::default(),
            lagging: Default::default(),
            groups: Default::default(),
            rqueues: Default::default(),
            rstreams: Default::default(),
            stream_ports: Default::default(),
        });
        links.set_handler(Arc::new(LinkHandler(Arc::downgrade(&c))));
        broker.set_cluster(c.clone());
        tokio::spawn(links.clone().serve(listener));
        tracing::info!(listen = %cfg.listen, addr = %addr, "inter-node link listening");
        let meta = c.open_meta(broker).await?;
        if meta.is_initialized() {
            c.refuse_if_forgotten().await?;
        } else {
            let mut seeds: Vec<String> =
                cfg.peers.iter().filter(|p| **p != addr).cloned().collect();
            seeds.sort();
            let first = seeds.first().is_none_or(|s| addr < *s);
            if first {
                meta.initialize()
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot start the cluster: {e}"))?;
                tracing::info!(node = %c.me, "cluster started on this node");
                c.seed(broker).await?;
            } else {
                let mut tries = 0u32;
                loop {
                    match meta.join(&seeds).await {
                        Ok(()) => break,
                        Err(e) => {
                            tries += 1;
                            if tries % 10 == 1 {
                                tracing::info!(seeds = ?seeds, error = %e, "waiting to join the cluster");
                            }
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    }
                }
                tracing::info!(node = %c.me, "joined the cluster");
            }
        }
        *c.nodes.write() = meta
            .status()
            .members
            .iter()
            .map(|m| m.node.clone())
            .collect();
        // Dials to seeds that failed while this node was joining (a seed not listening yet) are
        // no news about the members now: the keeper's first round dials each of them.
        for n in c.members() {
            c.links.forget_failure(&n.addr);
        }
        tokio::spawn(c.clone().watch_members());
        tokio::spawn(c.clone().keep_links());
        c.catch_up().await;
        // In the background: without a majority each proposal waits out its timeout, and the
        // node must serve meanwhile.
        let (c2, b2) = (c.clone(), broker.clone());
        tokio::spawn(async move { c2.drop_transient_queues(&b2).await });
        Ok(c)
    }

    /// At boot, as RabbitMQ does: this node's non-durable and exclusive queues did not survive
    /// its restart, so their records go.
    async fn drop_transient_queues(&self, broker: &Arc<Broker>) {
        let gone = self
            .delete_queues(broker, |q| {
                q.home().is_none()
                    && (!q.options().durable || q.options().exclusive_owner.is_some())
            })
            .await;
        for (vhost, queue, r) in gone {
            if let Err(e) = r {
                tracing::warn!(%vhost, %queue, error = %e, "cannot drop a transient queue at boot");
            }
        }
    }

    pub(super) async fn open_meta(
        &self,
        broker: &Arc<Broker>,
    ) -> anyhow::Result<warren_cluster::Meta> {
        let me = warren_cluster::Node {
            name: self.me.clone(),
            addr: self.addr.clone(),
        };
        let meta = warren_cluster::Meta::open(
            &broker.config.data_dir.join("raft"),
            me,
            Arc::new(BrokerSm(Arc::downgrade(broker))),
            Arc::new(LinkTransport {
                links: self.links.clone(),
                service: SERVICE_RAFT,
                group: None,
            }),
            // Failover (lease + election) takes 2-4 s; a change waits out one failover.
            warren_cluster::MetaConfig {
                election_timeout_min_ms: 1000,
                election_timeout_max_ms: 2000,
                heartbeat_ms: 250,
                propose_timeout: Duration::from_secs(8),
                group_commit: true,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("cannot open the cluster state: {e}"))?;
        *self.meta.write() = Some(meta.clone());
        Ok(meta)
    }

    /// The first node creates what a fresh single node has: the config's vhosts and users.
    async fn seed(&self, broker: &Arc<Broker>) -> anyhow::Result<()> {
        let f = crate::access::Access::seed(&broker.config);
        let mut ops: Vec<DefOp> = f.vhosts.into_iter().map(DefOp::AddVhost).collect();
        ops.extend(f.users.into_iter().map(DefOp::PutUser));
        ops.extend(f.permissions.into_iter().map(DefOp::SetPermissions));
        for op in ops {
            self.propose(op)
                .await
                .map_err(|e| anyhow::anyhow!("cannot seed the cluster: {e:?}"))?;
        }
        Ok(())
    }

    /// At boot: waits (bounded) until this node has applied what the other running members
    /// have, so it does not serve definitions older than the cluster's. (Not "what the leader
    /// has": right after a restart this node may still believe in a leader of an old term,
    /// itself included.) An applied entry is a committed one, so this node gets there.
    async fn catch_up(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut target = 0u64;
        // From Raft's own membership: the watcher filling `members()` may not have run yet.
        for n in self.meta().status().members.into_iter().map(|m| m.node) {
            if n.name == self.me {
                continue;
            }
            let r = self
                .links
                .call(
                    &n.addr,
                    SERVICE_APPLIED,
                    &0u64.to_be_bytes(),
                    Duration::from_secs(2),
                )
                .await;
            if let Ok(b) = r {
                if let Ok(a) = <[u8; 8]>::try_from(&b[..]) {
                    target = target.max(u64::from_be_bytes(a));
                }
            }
        }
        if target == 0 {
            return;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if !self.meta().wait_applied_within(target, left).await {
            tracing::warn!(node = %self.me, target, "serving before catching up with the cluster (not there in 10 s)");
        }
    }

    /// The members that no longer count this node as one of them although they have applied
    /// more of the log than the membership this node holds: it was removed (forget_cluster_node)
    /// while it was stopped or cut off. A member that lags (has not applied this node's own
    /// join yet) is no evidence.
    pub(super) async fn forgotten_by(&self) -> Vec<String> {
        let st = self.meta().status();
        let since = st.membership_index.unwrap_or(0);
        // All at once: a member that is down costs its timeout once, not once per member.
        let mut asks = tokio::task::JoinSet::new();
        for n in st.members.into_iter().map(|m| m.node) {
            if n.name == self.me {
                continue;
            }
            let (links, me) = (self.links.clone(), self.me.clone());
            asks.spawn(async move {
                let r = links
                    .call(
                        &n.addr,
                        SERVICE_MEMBER,
                        me.as_bytes(),
                        Duration::from_secs(2),
                    )
                    .await;
                let Ok(Ok([a0, a1, a2, a3, a4, a5, a6, a7, member])) =
                    r.map(|b| <[u8; 9]>::try_from(&b[..]))
                else {
                    return None;
                };
                let applied = u64::from_be_bytes([a0, a1, a2, a3, a4, a5, a6, a7]);
                (member == 0 && applied > since).then_some(n.name)
            });
        }
        let mut by = Vec::new();
        while let Some(r) = asks.join_next().await {
            by.extend(r.ok().flatten());
        }
        by
    }

    /// At the boot of a node that was a member: as RabbitMQ refuses to boot a node the cluster
    /// forgot (`inconsistent_cluster`), so does Warren, instead of serving stale definitions
    /// and campaigning for a leadership it can never win.
    async fn refuse_if_forgotten(&self) -> anyhow::Result<()> {
        if let Some(peer) = self.forgotten_by().await.first() {
            return Err(anyhow::anyhow!(
                "Node '{me}' thinks it's clustered with node '{peer}', but '{peer}' disagrees: \
                 {me} was removed from the cluster (forget_cluster_node). To add it again, delete \
                 its Raft state ({dir}) and start it with the cluster's peers",
                me = self.me,
                dir = self.raft_dir().display(),
            ));
        }
        Ok(())
    }

    pub(super) fn raft_dir(&self) -> std::path::PathBuf {
        self.broker()
            .map(|b| b.config.data_dir.join("raft"))
            .unwrap_or_else(|| "raft".into())
    }
}

/// `cluster.cookie`, else `cluster.cookie_file`, else `<data_dir>/.cookie` (created with a
/// random cookie on first boot, mode 0600).
fn cookie(
    config: &crate::config::Config,
    c: &crate::config::ClusterConfig,
) -> anyhow::Result<Vec<u8>> {
    if let Some(k) = &c.cookie {
        return Ok(k.as_bytes().to_vec());
    }
    if let Ok(k) = std::env::var("WARREN_COOKIE") {
        if !k.is_empty() {
            return Ok(k.into_bytes());
        }
    }
    let path = c
        .cookie_file
        .clone()
        .unwrap_or_else(|| config.data_dir.join(".cookie"));
    match std::fs::read(&path) {
        Ok(k) if !k.trim_ascii().is_empty() => Ok(k.trim_ascii().to_vec()),
        Ok(_) => anyhow::bail!("cookie file {} is empty", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && c.cookie_file.is_none() => {
            let k: String = (0..20)
                .map(|_| (b'A' + rand::random::<u8>() % 26) as char)
                .collect();
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            std::io::Write::write_all(&mut f, k.as_bytes())?;
            tracing::info!(file = %path.display(), "made a new cluster cookie");
            Ok(k.into_bytes())
        }
        Err(e) => anyhow::bail!("cannot read cookie file {}: {e}", path.display()),
    }
}
