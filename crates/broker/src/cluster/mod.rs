//! Clustering: several nodes act as one broker (docs/clustering.md).
//!
//! - [`link`]: one TCP connection per pair of nodes, cookie-authenticated, multiplexed.
//! - Metadata (vhosts, users, permissions, policies, limits, exchanges, bindings, queue records
//!   with their home node) is one openraft group (`warren-cluster`). A change is never made
//!   where it is asked for: it is proposed, and every node (the proposer too) makes it when
//!   it applies the committed entry, through the same vhost and access code a single node
//!   runs. The outcome (ok, or RabbitMQ's error) is therefore the same everywhere.
//! - [`remote`]: a queue whose home is another node: publishes, consumers, acks and gets go
//!   over the link to the queue's home, where it is an ordinary local queue.

pub mod link;
pub mod quorum;
pub mod remote;

use std::cell::Cell;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use warren_protocol::Method;

use crate::access::{AccessFile, MgmtError, PermissionDef, PolicyDef, UserDef, VhostDef};
use crate::error::{AmqpError, AmqpResult};
use crate::queue::QueueRef;
use crate::server::Broker;
use link::{BoxFuture, Handler, Link, Links};

pub const SERVICE_RAFT: u8 = 1;
/// How long a change waits for the other running nodes to apply it.
const APPLY_WAIT: Duration = Duration::from_secs(2);
/// How long a change is retried for while the cluster has no leader that answers.
const PROPOSE_DEADLINE: Duration = Duration::from_secs(10);
/// A member that did not apply a change within [`APPLY_WAIT`] is not waited for again for this
/// long (a paused node must not slow every change down).
const LAGGING_FOR: Duration = Duration::from_secs(5);
pub const SERVICE_QUEUE: u8 = 2;
/// This node's `/api/nodes` object.
pub const SERVICE_NODE: u8 = 3;
/// Wait until this node has applied entry N (a u64; 0: no wait); answers its applied index.
pub const SERVICE_APPLIED: u8 = 4;
/// Is the asking node (its name, the request) a member here? Answers this node's applied index
/// (u64) and 1 or 0.
pub const SERVICE_MEMBER: u8 = 8;

/// What the state machine hands back to a proposer: the entry's index and its outcome.
#[derive(Debug, Serialize, Deserialize)]
struct Applied {
    index: u64,
    reply: MetaReply,
}

thread_local! {
    /// The Raft index of the entry this thread is applying, so the vhost and access code
    /// called from the apply changes state here instead of proposing again.
    static APPLYING: Cell<Option<u64>> = const { Cell::new(None) };
}

/// The log index being applied on this thread, if this is the apply.
pub fn applying() -> Option<u64> {
    APPLYING.with(|a| a.get())
}

/// A replicated change. Vhost changes carry the AMQP method that makes them (the definitions
/// file's encoding, see `definitions.rs`).
#[derive(Debug, Serialize, Deserialize)]
pub enum MetaOp {
    Vhost {
        vhost: String,
        /// An encoded exchange/queue declare, delete, bind or unbind method.
        method: Vec<u8>,
        /// For a queue.declare: where it lives and who owns it.
        #[serde(default)]
        queue: Option<QueueMeta>,
    },
    AddVhost(VhostDef),
    DeleteVhost(String),
    PutUser(UserDef),
    DeleteUser(String),
    SetPermissions(PermissionDef),
    ClearPermissions {
        user: String,
        vhost: String,
    },
    PutPolicy(PolicyDef),
    DeletePolicy {
        vhost: String,
        name: String,
    },
    SetLimits {
        user: bool,
        name: String,
        def: crate::access::Limits,
        replace: bool,
    },
    ClearLimit {
        user: bool,
        name: String,
        key: Option<String>,
    },
    /// A replicated queue's members changed (add_member, delete_member, grow, shrink).
    QueueMembers {
        vhost: String,
        queue: String,
        members: Vec<String>,
    },
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct QueueMeta {
    /// The node that runs it.
    pub home: String,
    /// The owning connection of an exclusive queue (connection ids are unique in the cluster).
    pub owner: Option<u64>,
    pub server_named: bool,
    /// A replicated queue's group id (the index of the entry that first declared it; `None` in
    /// that entry itself) and its members, the initial leader first.
    #[serde(default)]
    pub group: Option<u64>,
    #[serde(default)]
    pub members: Vec<String>,
}

/// The outcome of an applied op, as the proposer reports it.
#[derive(Debug, Serialize, Deserialize)]
pub enum MetaReply {
    Ok,
    Amqp { code: u16, text: String },
    Mgmt { kind: u8, text: String },
}

impl MetaReply {
    fn amqp(r: AmqpResult<()>) -> MetaReply {
        match r {
            Ok(()) => MetaReply::Ok,
            Err(e) => MetaReply::Amqp {
                code: e.code,
                text: e.text,
            },
        }
    }
    fn mgmt(r: Result<(), MgmtError>) -> MetaReply {
        match r {
            Ok(()) => MetaReply::Ok,
            Err(MgmtError::NotFound(t)) => MetaReply::Mgmt { kind: 0, text: t },
            Err(MgmtError::BadRequest(t)) => MetaReply::Mgmt { kind: 1, text: t },
            Err(MgmtError::Internal(t)) | Err(MgmtError::Unavailable(t)) => {
                MetaReply::Mgmt { kind: 2, text: t }
            }
        }
    }
}

/// This node's part in a cluster.
pub struct Cluster {
    pub me: String,
    pub addr: String,
    pub links: Arc<Links>,
    /// Replaced when the node joins another cluster (`join_cluster`).
    meta: parking_lot::RwLock<Option<warren_cluster::Meta>>,
    broker: Weak<Broker>,
    pub remote: remote::Remote,
    /// Link addresses by node name, from the Raft membership (kept by the status watcher).
    nodes: parking_lot::RwLock<Vec<warren_cluster::Node>>,
    /// Members that recently did not apply a change in time, by name.
    lagging: parking_lot::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    /// The Raft groups of the replicated queues this node is a member of, by group id.
    pub groups: parking_lot::RwLock<std::collections::HashMap<u64, warren_cluster::Meta>>,
}

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

    /// Proposes the deletion of every queue `which` picks (in every vhost); returns each one's
    /// vhost, name and outcome.
    async fn delete_queues(
        &self,
        broker: &Arc<Broker>,
        which: impl Fn(&QueueRef) -> bool,
    ) -> Vec<(Arc<str>, Arc<str>, Result<MetaReply, String>)> {
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
                let op = MetaOp::Vhost {
                    vhost: v.name.to_string(),
                    method: b.to_vec(),
                    queue: None,
                };
                done.push((v.name.clone(), name, self.propose(op).await));
            }
        }
        done
    }

    async fn open_meta(&self, broker: &Arc<Broker>) -> anyhow::Result<warren_cluster::Meta> {
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
                ..Default::default()
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("cannot open the cluster state: {e}"))?;
        *self.meta.write() = Some(meta.clone());
        Ok(meta)
    }

    pub fn meta(&self) -> warren_cluster::Meta {
        self.meta
            .read()
            .clone()
            .expect("meta is set before the cluster is used")
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
        APPLYING.with(|a| a.set(Some(0)));
        for v in broker.vhosts() {
            let _ = broker.delete_vhost(&v.name);
        }
        let _ = broker.access.replace(AccessFile::default());
        APPLYING.with(|a| a.set(None));
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

    pub(crate) fn broker(&self) -> Option<Arc<Broker>> {
        self.broker.upgrade()
    }

    /// The first node creates what a fresh single node has: the config's vhosts and users.
    async fn seed(&self, broker: &Arc<Broker>) -> anyhow::Result<()> {
        let f = crate::access::Access::seed(&broker.config);
        let mut ops: Vec<MetaOp> = f.vhosts.into_iter().map(MetaOp::AddVhost).collect();
        ops.extend(f.users.into_iter().map(MetaOp::PutUser));
        ops.extend(f.permissions.into_iter().map(MetaOp::SetPermissions));
        for op in ops {
            self.propose(op)
                .await
                .map_err(|e| anyhow::anyhow!("cannot seed the cluster: {e:?}"))?;
        }
        Ok(())
    }

    async fn watch_members(self: Arc<Self>) {
        let mut w = self.meta().watch();
        loop {
            let st = w.borrow_and_update().clone();
            *self.nodes.write() = st.members.iter().map(|m| m.node.clone()).collect();
            if w.changed().await.is_err() {
                return;
            }
        }
    }

    /// Waits (bounded) until every running member has applied entry `index`, so a change
    /// answered ok here is what a client sees through any node next (declare through one node,
    /// publish through another), as with RabbitMQ's Mnesia transactions. A member that does
    /// not answer in time is skipped: it catches up from the log.
    async fn wait_everywhere(&self, index: u64) {
        let mut waits = Vec::new();
        for n in self.members() {
            if n.name == self.me || self.links.get(&n.addr).is_none() {
                continue;
            }
            if self
                .lagging
                .lock()
                .get(&n.name)
                .is_some_and(|t| t.elapsed() < LAGGING_FOR)
            {
                continue;
            }
            let links = self.links.clone();
            waits.push(tokio::spawn(async move {
                let r = links
                    .call(&n.addr, SERVICE_APPLIED, &index.to_be_bytes(), APPLY_WAIT)
                    .await;
                let applied = r
                    .ok()
                    .and_then(|b| <[u8; 8]>::try_from(&b[..]).ok())
                    .map(u64::from_be_bytes);
                (n.name, applied.is_some_and(|a| a >= index))
            }));
        }
        for w in waits {
            if let Ok((name, caught_up)) = w.await {
                let mut lagging = self.lagging.lock();
                if caught_up {
                    lagging.remove(&name);
                } else {
                    lagging.insert(name, std::time::Instant::now());
                }
            }
        }
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
    async fn forgotten_by(&self) -> Vec<String> {
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

    fn raft_dir(&self) -> std::path::PathBuf {
        self.broker()
            .map(|b| b.config.data_dir.join("raft"))
            .unwrap_or_else(|| "raft".into())
    }

    /// Keeps a link open to every member (Raft alone links followers only to the leader), so
    /// "running" is known for every node and a forwarded request finds its link open.
    async fn keep_links(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut leaderless = 0u32;
        let mut told = false;
        loop {
            tick.tick().await;
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
            "cluster_name": leader.clone().unwrap_or_else(|| self.me.clone()),
            "node": self.me,
            "nodes": nodes,
            "leader": leader,
            "term": st.term,
            "last_applied": st.last_applied,
        })
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
                let Some(qq) = q.quorum() else { continue };
                if qq.members().iter().any(|m| m == name) {
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
            .delete_queues(
                &broker,
                |q| matches!(q, QueueRef::Remote(r) if r.home == name),
            )
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

    /// Replicates `op` and waits until this node applied it.
    pub async fn propose(&self, op: MetaOp) -> Result<MetaReply, String> {
        let bytes = serde_json::to_vec(&op).map_err(|e| e.to_string())?;
        // A leader that stopped answering (paused, partitioned) fails the forward after the
        // link's timeout, while the others elect a new one: try again until the deadline. Every
        // op sets state (declare, bind, put, delete), so one applied twice changes nothing.
        let deadline = tokio::time::Instant::now() + PROPOSE_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let attempt = tokio::time::timeout(left, self.meta().propose(bytes.clone()))
                .await
                .unwrap_or_else(|_| {
                    Err(warren_cluster::ProposeError::Unavailable(format!(
                        "no leader committed it within {} s",
                        PROPOSE_DEADLINE.as_secs()
                    )))
                });
            match attempt {
                Ok(r) => {
                    let a: Applied = serde_json::from_slice(&r).map_err(|e| e.to_string())?;
                    self.wait_everywhere(a.index).await;
                    return Ok(a.reply);
                }
                Err(warren_cluster::ProposeError::Unavailable(_))
                    if tokio::time::Instant::now() + Duration::from_millis(500) < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(warren_cluster::ProposeError::Unavailable(t)) => {
                    return Err(format!(
                        "the cluster has no majority to record this change ({t}); it is made only if a majority comes back before the entry is dropped"
                    ))
                }
                Err(warren_cluster::ProposeError::Fatal(t)) => return Err(t),
            }
        }
    }

    /// [`Cluster::propose`] from synchronous code on a tokio worker (the vhost's and the access
    /// registry's methods): the worker's other tasks move to another thread meanwhile.
    fn propose_blocking(&self, op: MetaOp) -> Result<MetaReply, String> {
        let handle = tokio::runtime::Handle::current();
        tokio::task::block_in_place(|| handle.block_on(self.propose(op)))
    }

    /// A vhost change (called by the vhost's public methods in place of making it).
    pub fn vhost_op(
        &self,
        vhost: &str,
        method: Method,
        queue: Option<QueueMeta>,
    ) -> AmqpResult<()> {
        let mut b = bytes::BytesMut::new();
        method.encode_payload(&mut b);
        let op = MetaOp::Vhost {
            vhost: vhost.into(),
            method: b.to_vec(),
            queue,
        };
        match self.propose_blocking(op) {
            Ok(MetaReply::Ok) => Ok(()),
            Ok(MetaReply::Amqp { code, text }) => Err(AmqpError {
                code,
                text,
                class_id: 0,
                method_id: 0,
            }),
            Ok(MetaReply::Mgmt { text, .. }) => Err(AmqpError::internal_error(text)),
            Err(t) => Err(AmqpError::new(warren_protocol::reply::CONNECTION_FORCED, t)),
        }
    }

    /// A users/permissions/policies/limits/vhosts change.
    pub fn mgmt_op(&self, op: MetaOp) -> Result<(), MgmtError> {
        mgmt_reply(self.propose_blocking(op))
    }

    /// [`Cluster::mgmt_op`] from async code.
    pub async fn propose_mgmt(&self, op: MetaOp) -> Result<(), MgmtError> {
        mgmt_reply(self.propose(op).await)
    }
}

fn mgmt_reply(r: Result<MetaReply, String>) -> Result<(), MgmtError> {
    {
        match r {
            Ok(MetaReply::Ok) => Ok(()),
            Ok(MetaReply::Mgmt { kind: 0, text }) => Err(MgmtError::NotFound(text)),
            Ok(MetaReply::Mgmt { kind: 1, text }) => Err(MgmtError::BadRequest(text)),
            Ok(MetaReply::Mgmt { text, .. }) | Ok(MetaReply::Amqp { text, .. }) => {
                Err(MgmtError::Internal(text))
            }
            Err(t) => Err(MgmtError::Unavailable(t)),
        }
    }
}

impl Cluster {
    /// This node's id for connection ids: exclusive queues name their owner by connection id,
    /// so ids must not repeat across nodes.
    pub fn connection_id_base_of(config: &crate::Config) -> u64 {
        if config.cluster.is_none() {
            return 0;
        }
        (warren_cluster::node_id(&config.node_name) & 0xFF_FFFF) << 40
    }
}

/// The broker as Raft's state machine.
struct BrokerSm(Weak<Broker>);

impl warren_cluster::StateMachine for BrokerSm {
    fn apply(&self, index: u64, command: &[u8]) -> Vec<u8> {
        let Some(b) = self.0.upgrade() else {
            return Vec::new();
        };
        let reply = match serde_json::from_slice::<MetaOp>(command) {
            Ok(op) => {
                APPLYING.with(|a| a.set(Some(index)));
                let r = apply(&b, op);
                APPLYING.with(|a| a.set(None));
                r
            }
            Err(e) => {
                tracing::error!(index, error = %e, "undecodable metadata entry skipped");
                MetaReply::Mgmt {
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
            Ok(s) => {
                APPLYING.with(|a| a.set(Some(0)));
                restore(&b, s);
                APPLYING.with(|a| a.set(None));
            }
            Err(e) => tracing::error!(error = %e, "undecodable metadata snapshot"),
        }
    }
}

fn apply(b: &Arc<Broker>, op: MetaOp) -> MetaReply {
    match op {
        MetaOp::Vhost {
            vhost,
            method,
            queue,
        } => {
            let Some(v) = b.vhost(&vhost) else {
                return MetaReply::amqp(Err(AmqpError::not_found(format!("no vhost '{vhost}'"))));
            };
            match Method::decode(&Bytes::from(method)) {
                Ok(m) => MetaReply::amqp(v.apply_method(&m, queue.as_ref())),
                Err(e) => MetaReply::amqp(Err(AmqpError::internal_error(format!(
                    "undecodable method: {e:?}"
                )))),
            }
        }
        MetaOp::AddVhost(d) => MetaReply::mgmt(b.add_vhost(d).map(|_| ())),
        MetaOp::DeleteVhost(name) => MetaReply::mgmt(b.delete_vhost(&name)),
        MetaOp::PutUser(u) => MetaReply::mgmt(b.access.put_user(u)),
        MetaOp::DeleteUser(name) => {
            let r = b.access.delete_user(&name);
            if r.is_ok() {
                b.close_user_connections(&name, &format!("user '{name}' is deleted"));
            }
            MetaReply::mgmt(r)
        }
        MetaOp::SetPermissions(p) => MetaReply::mgmt(b.access.set_permissions(p)),
        MetaOp::ClearPermissions { user, vhost } => {
            MetaReply::mgmt(b.access.clear_permissions(&user, &vhost))
        }
        MetaOp::PutPolicy(p) => MetaReply::mgmt(crate::policy::put(b, p)),
        MetaOp::DeletePolicy { vhost, name } => {
            MetaReply::mgmt(crate::policy::delete(b, &vhost, &name))
        }
        MetaOp::SetLimits {
            user,
            name,
            def,
            replace,
        } => {
            let scope = limit_scope(user);
            let r = b.access.set_limits(scope, &name, &def, replace);
            b.limits_changed(scope, &name);
            MetaReply::mgmt(r)
        }
        MetaOp::QueueMembers {
            vhost,
            queue,
            members,
        } => {
            let q = b.vhost(&vhost).and_then(|v| v.queue(&queue));
            match q.as_ref().and_then(|q| q.quorum()) {
                Some(q) => {
                    q.set_members(members);
                    MetaReply::Ok
                }
                None => MetaReply::Mgmt {
                    kind: 0,
                    text: format!("no quorum queue '{queue}' in vhost '{vhost}'"),
                },
            }
        }
        MetaOp::ClearLimit { user, name, key } => {
            let scope = limit_scope(user);
            let r = b.access.clear_limit(scope, &name, key.as_deref());
            b.limits_changed(scope, &name);
            MetaReply::mgmt(r)
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
    vhosts: Vec<(String, Vec<MetaOp>)>,
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
/// it has is declared (a no-op for what exists already, equal).
fn restore(b: &Arc<Broker>, s: Snapshot) {
    let keep: std::collections::HashSet<&str> =
        s.access.vhosts.iter().map(|v| v.name.as_str()).collect();
    for v in b.vhosts() {
        if !keep.contains(&*v.name) {
            let _ = b.delete_vhost(&v.name);
        }
    }
    for v in &s.access.vhosts {
        let _ = b.add_vhost(v.clone());
    }
    if let Err(e) = b.access.replace(s.access) {
        tracing::error!(error = %e, "cannot restore users and permissions from the snapshot");
    }
    for (name, ops) in s.vhosts {
        let Some(v) = b.vhost(&name) else { continue };
        v.retain_only(&ops);
        for op in ops {
            let _ = apply(b, op);
        }
        crate::policy::apply_all(b, &v);
    }
}

/// `cluster.cookie`, else `cluster.cookie_file`, else `<data_dir>/.cookie` (created with a
/// random cookie on first boot, mode 0600).
fn cookie(config: &crate::Config, c: &crate::config::ClusterConfig) -> anyhow::Result<Vec<u8>> {
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

/// Raft's messages travel on the links: the metadata group's as `SERVICE_RAFT`, a replicated
/// queue's as `quorum::SERVICE_QRAFT` led by its group id.
pub(crate) struct LinkTransport {
    pub(crate) links: Arc<Links>,
    pub(crate) service: u8,
    pub(crate) group: Option<u64>,
}

impl warren_cluster::Transport for LinkTransport {
    fn call(
        &self,
        to: &warren_cluster::Node,
        request: Vec<u8>,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<Vec<u8>, warren_cluster::TransportError>>
                + Send,
        >,
    > {
        let links = self.links.clone();
        let addr = to.addr.clone();
        let service = self.service;
        let body = match self.group {
            Some(g) => {
                let mut b = Vec::with_capacity(8 + request.len());
                b.extend_from_slice(&g.to_be_bytes());
                b.extend_from_slice(&request);
                b
            }
            None => request,
        };
        Box::pin(async move {
            links
                // Below the propose deadline, so a forward to a leader that stopped answering
                // leaves time to retry with the next one.
                .call(&addr, service, &body, Duration::from_secs(3))
                .await
                .map(|b| b.to_vec())
                .map_err(|e| match e {
                    link::LinkError::Timeout(_) => warren_cluster::TransportError::Timeout,
                    e => warren_cluster::TransportError::Unreachable(addr, e.to_string()),
                })
        })
    }
}

struct LinkHandler(Weak<Cluster>);

impl Handler for LinkHandler {
    fn request(
        &self,
        link: &Arc<Link>,
        service: u8,
        body: Bytes,
    ) -> BoxFuture<Result<Bytes, String>> {
        let c = self.0.upgrade();
        let link = link.clone();
        Box::pin(async move {
            let c = c.ok_or("node stopping")?;
            match service {
                SERVICE_RAFT => {
                    let m = c.meta.read().clone();
                    match m {
                        Some(m) => Ok(Bytes::from(m.handle_rpc(&body).await)),
                        None => Err("not ready".into()),
                    }
                }
                SERVICE_QUEUE => remote::serve_request(&c, &link, body).await,
                quorum::SERVICE_QMEMBER => quorum::serve_member_change(&c, &body).await,
                quorum::SERVICE_QRAFT | quorum::SERVICE_QLEADER => {
                    if body.len() < 8 {
                        return Err("short request".into());
                    }
                    let group = u64::from_be_bytes([
                        body[0], body[1], body[2], body[3], body[4], body[5], body[6], body[7],
                    ]);
                    let m = c.groups.read().get(&group).cloned();
                    let m = m.ok_or_else(|| format!("no queue group {group:016x} here"))?;
                    if service == quorum::SERVICE_QLEADER {
                        let leader = quorum::QuorumQueue::raft_leader(&m).unwrap_or_default();
                        return Ok(Bytes::from(leader));
                    }
                    Ok(Bytes::from(m.handle_rpc(&body[8..]).await))
                }
                SERVICE_APPLIED => {
                    let m = c.meta.read().clone().ok_or("not ready")?;
                    let index = match body.len() {
                        8 => u64::from_be_bytes([
                            body[0], body[1], body[2], body[3], body[4], body[5], body[6], body[7],
                        ]),
                        _ => 0,
                    };
                    if index > 0 {
                        m.wait_applied_within(index, APPLY_WAIT).await;
                    }
                    let applied = m.status().last_applied.unwrap_or(0);
                    Ok(Bytes::copy_from_slice(&applied.to_be_bytes()))
                }
                SERVICE_MEMBER => {
                    let st = c.meta.read().clone().ok_or("not ready")?.status();
                    let mut r = st.last_applied.unwrap_or(0).to_be_bytes().to_vec();
                    r.push(
                        st.members
                            .iter()
                            .any(|m| m.node.name.as_bytes() == body.as_ref())
                            as u8,
                    );
                    Ok(Bytes::from(r))
                }
                SERVICE_NODE => {
                    let b = c.broker().ok_or("node stopping")?;
                    Ok(Bytes::from(crate::health_api::node_json(&b).to_string()))
                }
                s => Err(format!("unknown service {s}")),
            }
        })
    }

    fn message(&self, link: &Arc<Link>, kind: u8, body: Bytes) {
        if let Some(c) = self.0.upgrade() {
            remote::on_message(&c, link, kind, body);
        }
    }

    fn link_down(&self, link: &Arc<Link>) {
        if let Some(c) = self.0.upgrade() {
            remote::on_link_down(&c, link);
        }
    }

    fn batch_end(&self, link: &Arc<Link>) {
        if let Some(c) = self.0.upgrade() {
            remote::on_batch_end(&c, link);
        }
    }
}
