//! A virtual host: its exchanges, queues and bindings. Changes happen under one definitions lock
//! (declares are rare); each change publishes a new immutable [`Snapshot`] that publishers read
//! through `ArcSwap` without taking any lock.
//!
//! This file holds the [`VHost`], the types its callers pass and get back, what a cluster node's
//! vhost asks of its cluster ([`ClusterNode`], which the cluster implements, so the vhost does
//! not import it), and its constructors (but `open`, which recovers a stored vhost, is
//! `recovery`'s). Each other job is an
//! `impl VHost` block (and its helpers) in a file of its own:
//! - `snapshot`: reading and republishing the routing snapshot; routing a publish through it.
//! - `exchanges`, `bindings`, `queues`: declaring and deleting each kind of definition.
//! - `equivalence`: whether a redeclare matches what exists (RabbitMQ's 406 texts).
//! - `journal`: what the definitions store records of a change, written before it is published.
//! - `recovery`: opening a vhost's storage: replaying its definitions, reopening queue logs.
//! - `replication`: proposing changes and applying them (a cluster's committed entries, a single
//!   node's changes made at once).
//! - `delay_stores`: the stores of delayed exchanges and of queues' delayed retries.
//! - `reply_to`: direct reply-to's pseudo-queues.
//! - `owner`: the vhost as its queues' owner (`queue::QueueOwner`): routing their dead letters.
//! - `publish`: publishing, whatever the protocol: route, hold in a delayed exchange's store, or
//!   fan out to the routed queues with one confirm (`VHost::publish`, `Published`).
//! - `tests`: changes proposed, made when applied, on a cluster node and on a single node.
//!
//! The shared types stay here (a child's own result type, `publish::Published`, stays with it):
//! every child imports `super`, and this file imports no child.

mod bindings;
mod delay_stores;
mod equivalence;
mod exchanges;
mod journal;
mod owner;
pub mod publish;
mod queue_type;
mod queues;
mod recovery;
mod replication;
mod reply_to;
mod snapshot;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use warren_protocol::FieldTable;
use warren_routing::counter::ExchangeStats;
use warren_routing::{Exchange, ExchangeKind, Table};

use crate::access::PolicyDef;
use crate::definitions::proposer::Proposer;
use crate::definitions::DefinitionsStore;
use crate::delayed::DelayStore;
use crate::error::AmqpResult;
use crate::metrics::{ChannelStats, Churn, PublishStats};
use crate::persist::Persister;
use crate::queue::{Consumer, QueueOptions, QueueRef};

#[derive(Clone, Default)]
pub struct Snapshot {
    pub table: Table<QueueRef>,
    /// By name; ahash because every publish through the default exchange looks a name up here
    /// (SipHash showed in profiles) and names come from clients (it stays DoS-resistant).
    pub queues: ahash::AHashMap<Arc<str>, QueueRef>,
}

/// A server-generated name: prefix plus 22 URL-safe random characters, as RabbitMQ makes them.
pub fn gen_name(prefix: &str) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut rng = rand::thread_rng();
    let mut s = String::with_capacity(prefix.len() + 22);
    s.push_str(prefix);
    for _ in 0..22 {
        s.push(ALPHABET[rng.gen_range(0..ALPHABET.len())] as char);
    }
    s
}

pub struct VHost {
    pub name: Arc<str>,
    /// The default exchange's statistics (its publishes skip the exchange table).
    default_stats: Arc<ExchangeStats>,
    /// Counts of this vhost's closed channels, so totals do not drop when a channel goes.
    pub retired: ChannelStats,
    /// The same for their [`PublishStats`].
    pub retired_publish: PublishStats,
    /// Queues declared, created and deleted here.
    pub churn: Churn,
    snapshot: ArcSwap<Snapshot>,
    /// The authoritative definitions; `snapshot` is a copy swapped in after each change.
    defs: Mutex<Snapshot>,
    /// Direct reply-to pseudo-queues (`amq.rabbitmq.reply-to.<token>`), one per consuming channel.
    direct_reply: Mutex<HashMap<Arc<str>, QueueRef>>,
    /// Where durable definitions and queue logs live; `None` keeps everything in memory.
    storage: Option<Storage>,
    /// Set while the definitions file is replayed at boot, so replaying does not rewrite it.
    loading: std::sync::atomic::AtomicBool,
    /// Where durable definitions are recorded (see `definitions/mod.rs`); used under `defs`.
    store: Option<Box<dyn DefinitionsStore>>,
    /// RabbitMQ's `max-queues` vhost limit (`u32::MAX` = none), checked when a queue is created.
    max_queues: std::sync::atomic::AtomicU32,
    /// This vhost's policies, for the `alternate-exchange` of exchanges declared later; set
    /// (under `defs`) by [`VHost::set_policies`].
    policies: Mutex<Vec<PolicyDef>>,
    /// In a cluster: where new queues live and which nodes replicate them.
    cluster: Option<Arc<dyn ClusterNode>>,
    /// Where a change asked for here goes, to come back through [`VHost::apply_method`]: the
    /// cluster, or a single node's applier (`server/apply.rs`), set once the vhost is
    /// recovered (replaying its definitions at boot makes each change directly).
    proposer: std::sync::OnceLock<Arc<dyn Proposer>>,
    /// The stores of `x-delayed-message` exchanges, opened at boot or on first use.
    delayed: Mutex<HashMap<Arc<str>, Arc<DelayStore>>>,
    /// The messages queues with `x-delayed-retry-*` hold back after a requeue, by queue.
    retry: Mutex<HashMap<Arc<str>, Arc<DelayStore>>>,
}

pub struct Storage {
    pub dir: PathBuf,
    pub persister: Arc<Persister>,
    /// This node's name: quorum queues declared outside a cluster run on the replicated queue
    /// machine, as a group of one member of that name. (`None` only in unit tests.)
    pub quorum_on_machine: Option<String>,
}

/// The pseudo-queue RPC clients consume from for direct reply-to.
pub const DIRECT_REPLY_TO: &str = "amq.rabbitmq.reply-to";

pub struct ExchangeSpec<'a> {
    pub name: &'a str,
    pub kind: &'a str,
    pub passive: bool,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: &'a FieldTable,
}

pub struct QueueSpec<'a> {
    pub name: &'a str,
    pub passive: bool,
    pub durable: bool,
    pub exclusive: bool,
    pub auto_delete: bool,
    pub arguments: &'a FieldTable,
    /// The declaring connection, owner of an exclusive queue.
    pub conn_id: u64,
    /// The broker chose the name (`amq.gen-…`), so the reserved prefix is allowed.
    pub server_named: bool,
    /// In a cluster: the node it is to live on (`None`: this one).
    pub home: Option<&'a str>,
    /// A replicated queue's group (`None` for the entry that first declares it: that entry's
    /// index) and members, from the metadata entry.
    pub members: Option<(Option<u64>, &'a [String])>,
}

/// What a cluster node's vhost asks of its cluster (`cluster::Cluster` implements it): to
/// propose its changes (the [`Proposer`]), where a new queue lives and which nodes replicate
/// it, and the handles of queues that live or are led elsewhere.
pub trait ClusterNode: Proposer {
    /// This node's name.
    fn me(&self) -> &str;
    /// The node a new queue lives on, by RabbitMQ's locator (`None`: this node).
    fn place(&self, locator: Option<&str>) -> String;
    /// A new queue's members, `home` (its first leader) first, if it is replicated: a quorum
    /// queue, or a classic one that an `ha-mode` policy covers (`policy`: the definition of
    /// the policy that matches it, asked for only then). Empty if it is not.
    fn members(
        &self,
        home: &str,
        arguments: &FieldTable,
        exclusive: bool,
        policy: &dyn Fn() -> Option<serde_json::Map<String, serde_json::Value>>,
    ) -> AmqpResult<Vec<String>>;
    /// The handle every node holds of a replicated queue of `vhost`; its members run its group.
    fn replicated_queue(
        self: Arc<Self>,
        name: Arc<str>,
        vhost: &Arc<VHost>,
        options: QueueOptions,
        group: u64,
        members: Vec<String>,
    ) -> QueueRef;
    /// Makes this node's copy of a replicated stream a member of its group (`group`, over
    /// `members`, this node one of them).
    fn stream_member(
        self: Arc<Self>,
        stream: &Arc<crate::queue::stream::Stream>,
        group: u64,
        members: Vec<String>,
    ) -> AmqpResult<()>;
    /// The handle of a queue that lives on node `home`.
    fn remote_queue(
        self: Arc<Self>,
        name: Arc<str>,
        vhost: Arc<str>,
        options: QueueOptions,
        home: String,
    ) -> QueueRef;
    /// Waits (bounded) until `q`, if a new replicated queue, has its first leader, as
    /// RabbitMQ waits for its Ra cluster to start; its error if it has none by then.
    fn first_leader(&self, q: &QueueRef) -> AmqpResult<()>;
}

/// The outcome of deleting a queue, for the caller to notify consumers and log.
pub struct DeletedQueue {
    pub message_count: u32,
    pub consumers: Vec<Arc<Consumer>>,
}

impl VHost {
    pub fn new(name: &str) -> Arc<VHost> {
        Self::with_storage(name, None, None, None)
    }

    fn with_storage(
        name: &str,
        storage: Option<Storage>,
        store: Option<Box<dyn DefinitionsStore>>,
        cluster: Option<Arc<dyn ClusterNode>>,
    ) -> Arc<VHost> {
        let mut s = Snapshot::default();
        let default_stats = Arc::new(ExchangeStats::default());
        let mk = |n: &str, kind, internal| {
            let stats = if n.is_empty() {
                default_stats.clone()
            } else {
                Default::default()
            };
            let n: Arc<str> = n.into();
            (
                n.clone(),
                Arc::new(Exchange {
                    name: n,
                    kind,
                    delayed: false,
                    durable: true,
                    auto_delete: false,
                    internal,
                    arguments: FieldTable::new(),
                    bindings: Vec::new(),
                    alternate: None,
                    ring: Default::default(),
                    direct: Default::default(),
                    topic: Default::default(),
                    stats,
                }),
            )
        };
        for (n, k) in [
            ("", ExchangeKind::Direct),
            ("amq.direct", ExchangeKind::Direct),
            ("amq.fanout", ExchangeKind::Fanout),
            ("amq.topic", ExchangeKind::Topic),
            ("amq.headers", ExchangeKind::Headers),
            ("amq.match", ExchangeKind::Headers),
        ] {
            let (n, x) = mk(n, k, false);
            s.table.exchanges.insert(n, x);
        }
        // RabbitMQ's firehose exchange: present in every vhost, internal, so clients cannot
        // publish to it; Warren never traces into it.
        {
            let (n, x) = mk("amq.rabbitmq.trace", ExchangeKind::Topic, true);
            s.table.exchanges.insert(n, x);
        }
        Arc::new(VHost {
            name: name.into(),
            default_stats,
            retired: ChannelStats::default(),
            retired_publish: PublishStats::default(),
            churn: Churn::default(),
            snapshot: ArcSwap::from_pointee(s.clone()),
            defs: Mutex::new(s),
            direct_reply: Mutex::new(HashMap::new()),
            storage,
            loading: std::sync::atomic::AtomicBool::new(false),
            store,
            max_queues: std::sync::atomic::AtomicU32::new(u32::MAX),
            policies: Mutex::new(Vec::new()),
            proposer: match &cluster {
                Some(c) => std::sync::OnceLock::from(c.clone() as Arc<dyn Proposer>),
                None => std::sync::OnceLock::new(),
            },
            cluster,
            delayed: Mutex::new(HashMap::new()),
            retry: Mutex::new(HashMap::new()),
        })
    }

    /// A vhost of a cluster node: its definitions are the Raft log's (applied through
    /// [`VHost::apply_method`]); only queue logs live under `storage.dir`.
    pub fn clustered(
        name: &str,
        storage: Storage,
        cluster: Arc<dyn ClusterNode>,
    ) -> std::io::Result<Arc<VHost>> {
        std::fs::create_dir_all(storage.dir.join("queues"))?;
        let _ = std::fs::remove_dir_all(storage.dir.join("scratch"));
        Ok(Self::with_storage(name, Some(storage), None, Some(cluster)))
    }

    /// Where changes asked for here go from now on (a single node's applier, once recovered).
    pub fn set_proposer(&self, p: Arc<dyn Proposer>) {
        let _ = self.proposer.set(p);
    }

    /// Whether changes asked for here go to `p`.
    #[cfg(test)]
    pub(crate) fn proposes_through(&self, p: &Arc<dyn Proposer>) -> bool {
        self.proposer.get().is_some_and(|q| Arc::ptr_eq(q, p))
    }

    /// The most queues this vhost may hold (`None` = no limit; 0 = none may be declared).
    pub fn set_max_queues(&self, max: Option<u32>) {
        self.max_queues.store(
            max.unwrap_or(u32::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}
