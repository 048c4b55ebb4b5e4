//! A virtual host: its exchanges, queues and bindings. Changes happen under one definitions lock
//! (declares are rare); each change publishes a new immutable [`Snapshot`] that publishers read
//! through `ArcSwap` without taking any lock.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use warren_protocol::{ByteString, FieldTable, FieldValue, Method};
use warren_routing::consistent_hash::{self, HashOn};
use warren_routing::counter::ExchangeStats;
use warren_routing::{Binding, Destination, Exchange, ExchangeKind, HashRing, Table};

use std::path::PathBuf;

use warren_protocol::method::{
    ExchangeBind, ExchangeDeclare, ExchangeDelete, ExchangeUnbind, QueueBind, QueueDeclare,
    QueueDelete, QueueUnbind,
};

use crate::access::PolicyDef;
use crate::cluster::{Cluster, QueueMeta};
use crate::definitions::{self, Definition, DefinitionsStore};
use crate::delayed::DelayStore;
use crate::error::{AmqpError, AmqpResult};
use crate::message::Message;
use crate::metrics::{ChannelStats, Churn};
use crate::persist::Persister;
use crate::queue::{Backing, Consumer, Queue, QueueArgs, QueueOptions, QueueRef};

#[derive(Clone, Default)]
pub struct Snapshot {
    pub table: Table<QueueRef>,
    /// By name; ahash because every publish through the default exchange looks a name up here
    /// (SipHash showed in profiles) and names come from clients (it stays DoS-resistant).
    pub queues: ahash::AHashMap<Arc<str>, QueueRef>,
}

pub struct VHost {
    pub name: Arc<str>,
    /// The default exchange's statistics (its publishes skip the exchange table).
    default_stats: Arc<ExchangeStats>,
    /// Counts of this vhost's closed channels, so totals do not drop when a channel goes.
    pub retired: ChannelStats,
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
    /// Where durable definitions are recorded (see `definitions.rs`); used under `defs`.
    store: Option<Box<dyn DefinitionsStore>>,
    /// RabbitMQ's `max-queues` vhost limit (`u32::MAX` = none), checked when a queue is created.
    max_queues: std::sync::atomic::AtomicU32,
    /// This vhost's policies, for the `alternate-exchange` of exchanges declared later; set
    /// (under `defs`) by [`VHost::set_policies`].
    policies: Mutex<Vec<PolicyDef>>,
    /// In a cluster: changes are proposed to it, and made here when applied.
    cluster: Option<Arc<Cluster>>,
    /// The stores of `x-delayed-message` exchanges, opened at boot or on first use.
    delayed: Mutex<HashMap<Arc<str>, Arc<DelayStore>>>,
    /// The messages queues with `x-delayed-retry-*` hold back after a requeue, by queue.
    retry: Mutex<HashMap<Arc<str>, Arc<DelayStore>>>,
}

pub struct Storage {
    pub dir: PathBuf,
    pub persister: Arc<Persister>,
}

/// An exchange type and whether it is `x-delayed-message` (then the kind is its
/// `x-delayed-type`), with the plugin's errors.
fn parse_exchange_type(kind: &str, arguments: &FieldTable) -> AmqpResult<(ExchangeKind, bool)> {
    let unknown = |k: &str| AmqpError::command_invalid(format!("unknown exchange type '{k}'"));
    if kind != warren_routing::DELAYED_TYPE {
        return ExchangeKind::parse(kind)
            .map(|k| (k, false))
            .ok_or_else(|| unknown(kind));
    }
    match arguments.get("x-delayed-type").and_then(|v| v.as_str()) {
        Some(warren_routing::DELAYED_TYPE) => Err(AmqpError::precondition_failed(
            "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'",
        )),
        Some(inner) => ExchangeKind::parse(inner)
            .map(|k| (k, true))
            .ok_or_else(|| unknown(inner)),
        None => Err(AmqpError::precondition_failed(
            "Invalid argument, 'x-delayed-type' must be an existing exchange type",
        )),
    }
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

/// The outcome of deleting a queue, for the caller to notify consumers and log.
pub struct DeletedQueue {
    pub message_count: u32,
    pub consumers: Vec<Arc<Consumer>>,
}

/// The method a cluster replicates for a bind or unbind of `dest` (a queue, or an exchange) to
/// `source`.
fn bind_method(
    queue: bool,
    dest: &str,
    source: &str,
    key: &str,
    args: &FieldTable,
    add: bool,
) -> Method {
    let (d, x, k, a) = (dest.into(), source.into(), key.into(), args.clone());
    match (queue, add) {
        (true, true) => QueueBind {
            queue: d,
            exchange: x,
            routing_key: k,
            arguments: a,
            ..Default::default()
        }
        .into(),
        (true, false) => QueueUnbind {
            queue: d,
            exchange: x,
            routing_key: k,
            arguments: a,
            ..Default::default()
        }
        .into(),
        (false, true) => ExchangeBind {
            destination: d,
            source: x,
            routing_key: k,
            arguments: a,
            ..Default::default()
        }
        .into(),
        (false, false) => ExchangeUnbind {
            destination: d,
            source: x,
            routing_key: k,
            arguments: a,
            ..Default::default()
        }
        .into(),
    }
}

/// Binding arguments are equal whatever their order (clients encode maps in any order).
fn same_args(a: &FieldTable, b: &FieldTable) -> bool {
    a.0.len() == b.0.len() && a.0.iter().all(|(k, v)| b.get(k) == Some(v))
}

/// A consistent-hash exchange's arguments, refused as RabbitMQ's plugin refuses them.
fn consistent_hash_args(args: &FieldTable) -> AmqpResult<HashOn> {
    HashOn::from_arguments(args).map_err(|e| match e {
        consistent_hash::ArgsError::Invalid(text) => AmqpError::precondition_failed(text),
        // The plugin's validation crashes on a non-string value; RabbitMQ then closes the
        // connection with a bare 541.
        consistent_hash::ArgsError::NotAString => AmqpError {
            code: warren_protocol::reply::INTERNAL_ERROR,
            text: "INTERNAL_ERROR".into(),
            class_id: 0,
            method_id: 0,
        },
    })
}

fn validate_x_match(args: &FieldTable) -> AmqpResult<()> {
    match args.get("x-match") {
        None => Ok(()),
        Some(v) => match v.as_str() {
            Some("all" | "any" | "all-with-x" | "any-with-x") => Ok(()),
            Some(other) => Err(AmqpError::precondition_failed(format!("Invalid x-match field value <<\"{other}\">>; expected all, any, all-with-x, or any-with-x"))),
            None => Err(AmqpError::precondition_failed("Invalid x-match field type; expected longstr")),
        },
    }
}

/// Queue arguments compared on redeclare, as RabbitMQ's `assert_args_equivalence` does.
const EQUIVALENT_QUEUE_ARGS: &[&str] = &[
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-expires",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-priority",
    "x-message-ttl",
    "x-overflow",
    "x-queue-mode",
    "x-queue-type",
    "x-single-active-consumer",
];

/// A stream's (`rabbit_stream_queue`'s `queue_arguments`, in its order).
const EQUIVALENT_STREAM_ARGS: &[&str] = &[
    "x-max-length-bytes",
    "x-queue-type",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
    "x-queue-leader-locator",
];

fn check_args_equivalent(
    name: &str,
    vhost: &str,
    got: &FieldTable,
    cur: &FieldTable,
) -> AmqpResult<()> {
    let keys = if crate::queue_type::is_stream(cur) {
        EQUIVALENT_STREAM_ARGS
    } else {
        EQUIVALENT_QUEUE_ARGS
    };
    check_args_equivalent_of("queue", keys, name, vhost, got, cur)
}

/// RabbitMQ's `assert_args_equivalence` over `keys` of a `what` ("queue", "exchange").
fn check_args_equivalent_of(
    what: &str,
    keys: &[&str],
    name: &str,
    vhost: &str,
    got: &FieldTable,
    cur: &FieldTable,
) -> AmqpResult<()> {
    for key in keys {
        let (a, b) = (got.get(key), cur.get(key));
        if a == b {
            continue;
        }
        // RabbitMQ takes a missing x-queue-type as 'classic' here.
        if *key == "x-queue-type" {
            let classic = |v: Option<&FieldValue>| matches!(v, Some(FieldValue::LongStr(s)) if &s[..] == b"classic");
            if (a.is_none() && classic(b)) || (classic(a) && b.is_none()) {
                continue;
            }
        }
        let describe = |v: Option<&FieldValue>| match v {
            None => "none".to_string(),
            Some(v) => format!(
                "the value '{}' of type '{}'",
                crate::queue::display_value(v),
                crate::queue::type_name(v)
            ),
        };
        let (ga, gb) = match (a, b) {
            (Some(x), Some(y)) => {
                // Both given: RabbitMQ compares the values only, so integers of any type are
                // equal, as are a longstr and a binary with the same bytes (a `long` from the
                // HTTP API equals a client's `signedint`).
                let ints = x.as_i64().is_some() && x.as_i64() == y.as_i64();
                let strs = matches!(
                    (x, y),
                    (FieldValue::LongStr(p) | FieldValue::Bytes(p), FieldValue::LongStr(q) | FieldValue::Bytes(q)) if p == q
                );
                if ints || strs {
                    continue;
                }
                (
                    format!("'{}'", crate::queue::display_value(x)),
                    format!("'{}'", crate::queue::display_value(y)),
                )
            }
            _ => (describe(a), describe(b)),
        };
        return Err(AmqpError::precondition_failed(format!("inequivalent arg '{key}' for {what} '{name}' in vhost '{vhost}': received {ga} but current is {gb}")));
    }
    Ok(())
}

/// An exchange type as RabbitMQ prints the atom: quoted when it is not a plain atom
/// (`'x-consistent-hash'`), so the 406 text reads `''x-consistent-hash''` as RabbitMQ's does.
fn erl_atom(s: &str) -> String {
    let plain = s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '@');
    if plain {
        s.to_string()
    } else {
        format!("'{s}'")
    }
}

fn inequivalent(
    what: &str,
    arg: &str,
    name: &str,
    vhost: &str,
    got: impl std::fmt::Display,
    cur: impl std::fmt::Display,
) -> AmqpError {
    AmqpError::precondition_failed(format!("inequivalent arg '{arg}' for {what} '{name}' in vhost '{vhost}': received '{got}' but current is '{cur}'"))
}

impl VHost {
    pub fn new(name: &str) -> Arc<VHost> {
        Self::with_storage(name, None, None, None)
    }

    /// A vhost whose durable definitions and messages live under `storage.dir`; what is there
    /// from an earlier run is loaded.
    pub fn open(name: &str, storage: Storage) -> std::io::Result<Arc<VHost>> {
        std::fs::create_dir_all(storage.dir.join("queues"))?;
        // Scratch logs hold non-durable queues' paged-out messages: nothing there outlives a run.
        let _ = std::fs::remove_dir_all(storage.dir.join("scratch"));
        let store = definitions::FileStore::new(&storage.dir, name);
        let defs = store.load()?;
        let v = Self::with_storage(name, Some(storage), Some(Box::new(store)), None);
        v.loading.store(true, std::sync::atomic::Ordering::Relaxed);
        let (mut queues, mut messages) = (0usize, 0u64);
        for d in defs {
            let r = match d {
                Definition::Generation(_) => Ok(()),
                Definition::ExchangeDelete(x) => v.delete_exchange(&x.exchange, false),
                Definition::QueueDelete(q) => {
                    v.delete_queue(&q.queue, false, false, None).map(|_| ())
                }
                Definition::QueueUnbind(b) => v.bind_queue(
                    &b.queue,
                    &b.exchange,
                    &b.routing_key,
                    &b.arguments,
                    false,
                    None,
                ),
                Definition::ExchangeUnbind(b) => v.bind_exchange(
                    &b.destination,
                    &b.source,
                    &b.routing_key,
                    &b.arguments,
                    false,
                ),
                Definition::Exchange(x) => v.declare_exchange(&ExchangeSpec {
                    name: &x.exchange,
                    kind: &x.kind,
                    passive: false,
                    durable: true,
                    auto_delete: x.auto_delete,
                    internal: x.internal,
                    arguments: &x.arguments,
                }),
                Definition::Queue(id, q) => v.restore_queue(id, &q).map(|n| {
                    queues += 1;
                    messages += n;
                }),
                Definition::QueueBind(b) => v.bind_queue(
                    &b.queue,
                    &b.exchange,
                    &b.routing_key,
                    &b.arguments,
                    true,
                    None,
                ),
                Definition::ExchangeBind(b) => v.bind_exchange(
                    &b.destination,
                    &b.source,
                    &b.routing_key,
                    &b.arguments,
                    true,
                ),
            };
            if let Err(e) = r {
                tracing::warn!(vhost = name, error = %e.text, "skipping a stored definition");
            }
        }
        v.loading.store(false, std::sync::atomic::Ordering::Relaxed);
        v.remove_orphan_logs();
        v.recover_delayed();
        // Compacts: one snapshot of what was recovered, and an empty journal after it.
        if let Err(e) = v.save(&v.defs.lock()) {
            // What was read stays valid on disk; each change will retry the rewrite.
            tracing::error!(vhost = name, error = %e, "cannot compact the definitions at boot");
        }
        tracing::info!(vhost = name, queues, messages, "vhost recovered");
        Ok(v)
    }

    fn with_storage(
        name: &str,
        storage: Option<Storage>,
        store: Option<Box<dyn DefinitionsStore>>,
        cluster: Option<Arc<Cluster>>,
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
            churn: Churn::default(),
            snapshot: ArcSwap::from_pointee(s.clone()),
            defs: Mutex::new(s),
            direct_reply: Mutex::new(HashMap::new()),
            storage,
            loading: std::sync::atomic::AtomicBool::new(false),
            store,
            max_queues: std::sync::atomic::AtomicU32::new(u32::MAX),
            policies: Mutex::new(Vec::new()),
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
        cluster: Arc<Cluster>,
    ) -> std::io::Result<Arc<VHost>> {
        std::fs::create_dir_all(storage.dir.join("queues"))?;
        let _ = std::fs::remove_dir_all(storage.dir.join("scratch"));
        Ok(Self::with_storage(name, Some(storage), None, Some(cluster)))
    }

    /// The cluster to propose a change to, unless this is the change being applied.
    fn replicated(&self) -> Option<&Arc<Cluster>> {
        self.cluster
            .as_ref()
            .filter(|_| crate::cluster::applying().is_none())
    }

    /// Makes a replicated change (every node runs this for each committed vhost entry).
    pub fn apply_method(self: &Arc<Self>, m: &Method, meta: Option<&QueueMeta>) -> AmqpResult<()> {
        let owner = meta.and_then(|q| q.owner);
        match m {
            Method::ExchangeDeclare(x) => self.declare_exchange(&ExchangeSpec {
                name: &x.exchange,
                kind: &x.kind,
                passive: false,
                durable: x.durable,
                auto_delete: x.auto_delete,
                internal: x.internal,
                arguments: &x.arguments,
            }),
            Method::ExchangeDelete(x) => self.delete_exchange(&x.exchange, x.if_unused),
            Method::QueueBind(b) => self.bind_queue(
                &b.queue,
                &b.exchange,
                &b.routing_key,
                &b.arguments,
                true,
                owner,
            ),
            Method::QueueUnbind(b) => self.bind_queue(
                &b.queue,
                &b.exchange,
                &b.routing_key,
                &b.arguments,
                false,
                owner,
            ),
            Method::ExchangeBind(b) => self.bind_exchange(
                &b.destination,
                &b.source,
                &b.routing_key,
                &b.arguments,
                true,
            ),
            Method::ExchangeUnbind(b) => self.bind_exchange(
                &b.destination,
                &b.source,
                &b.routing_key,
                &b.arguments,
                false,
            ),
            Method::QueueDeclare(q) => {
                let meta = meta.cloned().unwrap_or_default();
                self.declare_queue(&QueueSpec {
                    name: &q.queue,
                    passive: false,
                    durable: q.durable,
                    exclusive: q.exclusive,
                    auto_delete: q.auto_delete,
                    arguments: &q.arguments,
                    conn_id: meta.owner.unwrap_or(0),
                    server_named: meta.server_named,
                    home: Some(&meta.home),
                    members: (!meta.members.is_empty()).then_some((meta.group, &meta.members[..])),
                })
                .map(|_| ())
            }
            Method::QueueDelete(q) => self.delete_queue(&q.queue, false, false, owner).map(|d| {
                crate::channel::notify_cancelled(&d.consumers);
            }),
            other => Err(AmqpError::internal_error(format!(
                "not a definition: {other:?}"
            ))),
        }
    }

    /// Every exchange, queue and binding as the ops that recreate them (a Raft snapshot).
    pub fn replicated_definitions(&self) -> Vec<crate::cluster::MetaOp> {
        let defs = self.defs.lock();
        let enc = |m: Method| {
            let mut b = bytes::BytesMut::new();
            m.encode_payload(&mut b);
            b.to_vec()
        };
        let op = |m: Method, queue: Option<QueueMeta>| crate::cluster::MetaOp::Vhost {
            vhost: self.name.to_string(),
            method: enc(m),
            queue,
        };
        let mut out = Vec::new();
        let mut xs: Vec<_> = defs
            .table
            .exchanges
            .values()
            .filter(|x| !x.name.is_empty() && !x.name.starts_with("amq."))
            .collect();
        xs.sort_by(|a, b| a.name.cmp(&b.name));
        for x in xs {
            out.push(op(
                ExchangeDeclare {
                    exchange: (&*x.name).into(),
                    kind: x.type_name().into(),
                    durable: x.durable,
                    auto_delete: x.auto_delete,
                    internal: x.internal,
                    arguments: x.arguments.clone(),
                    ..Default::default()
                }
                .into(),
                None,
            ));
        }
        let me = self
            .cluster
            .as_ref()
            .map(|c| c.me.clone())
            .unwrap_or_default();
        let mut qs: Vec<_> = defs.queues.values().collect();
        qs.sort_by(|a, b| a.name().cmp(b.name()));
        for q in qs {
            let o = q.options();
            out.push(op(
                QueueDeclare {
                    queue: (&**q.name()).into(),
                    durable: o.durable,
                    exclusive: o.exclusive_owner.is_some(),
                    auto_delete: o.auto_delete,
                    arguments: o.arguments.clone(),
                    ..Default::default()
                }
                .into(),
                Some(QueueMeta {
                    home: q.home().unwrap_or_else(|| me.clone()),
                    owner: o.exclusive_owner,
                    server_named: true,
                    group: q.quorum().map(|r| r.group),
                    members: q.quorum().map(|r| r.members()).unwrap_or_default(),
                }),
            ));
        }
        let mut names: Vec<_> = defs.table.exchanges.keys().collect();
        names.sort();
        for name in names {
            for b in &defs.table.exchanges[name].bindings {
                let m: Method = match &b.destination {
                    Destination::Queue(q) => QueueBind {
                        queue: (&**q.name()).into(),
                        exchange: (&**name).into(),
                        routing_key: (&*b.routing_key).into(),
                        arguments: b.arguments.clone(),
                        ..Default::default()
                    }
                    .into(),
                    Destination::Exchange(d) => ExchangeBind {
                        destination: (&**d).into(),
                        source: (&**name).into(),
                        routing_key: (&*b.routing_key).into(),
                        arguments: b.arguments.clone(),
                        ..Default::default()
                    }
                    .into(),
                };
                let owner = match &b.destination {
                    Destination::Queue(q) => q.options().exclusive_owner,
                    _ => None,
                };
                out.push(op(
                    m,
                    owner.map(|o| QueueMeta {
                        owner: Some(o),
                        ..Default::default()
                    }),
                ));
            }
        }
        out
    }

    /// Deletes the queues and exchanges that `ops` (a snapshot's) do not declare, and every
    /// binding (the snapshot's are declared again after this).
    pub fn retain_only(self: &Arc<Self>, ops: &[crate::cluster::MetaOp]) {
        let mut queues = std::collections::HashSet::new();
        let mut exchanges = std::collections::HashSet::new();
        for op in ops {
            if let crate::cluster::MetaOp::Vhost { method, .. } = op {
                match Method::decode(&bytes::Bytes::copy_from_slice(method)) {
                    Ok(Method::QueueDeclare(q)) => {
                        queues.insert(q.queue.to_string());
                    }
                    Ok(Method::ExchangeDeclare(x)) => {
                        exchanges.insert(x.exchange.to_string());
                    }
                    _ => {}
                }
            }
        }
        let snap = self.snapshot();
        for q in snap.queues.keys() {
            if !queues.contains(&**q) {
                if let Ok(d) = self.delete_queue(q, false, false, None) {
                    crate::channel::notify_cancelled(&d.consumers);
                }
            }
        }
        for x in snap.table.exchanges.keys() {
            if !x.is_empty() && !x.starts_with("amq.") && !exchanges.contains(&**x) {
                let _ = self.delete_exchange(x, false);
            }
        }
        let mut defs = self.defs.lock();
        for x in defs.table.exchanges.values_mut() {
            if !x.bindings.is_empty() {
                let xm = Arc::make_mut(x);
                xm.bindings.clear();
                xm.bindings_changed();
            }
        }
        self.publish(&defs);
    }

    /// The most queues this vhost may hold (`None` = no limit; 0 = none may be declared).
    pub fn set_max_queues(&self, max: Option<u32>) {
        self.max_queues.store(
            max.unwrap_or(u32::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    pub fn snapshot(&self) -> arc_swap::Guard<Arc<Snapshot>> {
        self.snapshot.load()
    }

    fn publish(&self, defs: &Snapshot) {
        self.snapshot.store(Arc::new(defs.clone()));
    }

    /// Journals the changes to durable definitions (`ops`), then publishes the new snapshot.
    /// When they cannot be written, `defs` goes back to the published snapshot and the change
    /// fails with 541: a client never gets an ok for a definition a restart would lose.
    fn changed(&self, defs: &mut Snapshot, ops: Vec<Definition>) -> AmqpResult<()> {
        if !ops.is_empty() {
            if let Err(e) = self.journal(defs, &ops) {
                tracing::error!(vhost = %self.name, error = %e, "cannot write the definitions; change refused");
                *defs = Snapshot::clone(&self.snapshot.load());
                return Err(AmqpError::internal_error(format!(
                    "cannot write the definitions of vhost '{}': {e}",
                    self.name
                )));
            }
        }
        self.publish(defs);
        self.prune_delayed(defs);
        Ok(())
    }

    /// Records changes to durable definitions in the store (not while replaying it at boot).
    fn journal(&self, defs: &Snapshot, ops: &[Definition]) -> std::io::Result<()> {
        if self.loading.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        match &self.store {
            Some(store) => store.append(ops, &|| Self::all_definitions(defs)),
            None => Ok(()),
        }
    }

    /// Queues whose definition is kept across restarts (RabbitMQ drops exclusive ones).
    fn kept(q: &QueueRef) -> bool {
        q.options().durable && q.options().exclusive_owner.is_none()
    }

    /// Replaces what the store holds with every durable definition (a compaction).
    fn save(&self, defs: &Snapshot) -> std::io::Result<()> {
        if self.loading.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        match &self.store {
            Some(store) => store.compact(Self::all_definitions(defs)),
            None => Ok(()),
        }
    }

    /// Every durable definition, in the order recovery replays them: exchanges, queues, then
    /// bindings (each sorted by name, so equal states write equal files).
    fn all_definitions(defs: &Snapshot) -> Vec<Definition> {
        let mut out = Vec::new();
        let mut xs: Vec<_> = defs.table.exchanges.values().collect();
        xs.sort_by(|a, b| a.name.cmp(&b.name));
        out.extend(xs.into_iter().filter_map(|x| Self::exchange_def(x)));
        let mut qs: Vec<_> = defs.queues.values().collect();
        qs.sort_by(|a, b| a.name().cmp(b.name()));
        out.extend(qs.into_iter().filter_map(Self::queue_def));
        let mut names: Vec<_> = defs.table.exchanges.keys().collect();
        names.sort();
        for name in names {
            let x = &defs.table.exchanges[name];
            if !x.durable {
                continue;
            }
            for b in &x.bindings {
                if Self::dest_kept(defs, &b.destination) {
                    let (key, args) = (&b.routing_key, &b.arguments);
                    out.push(Self::binding_op(name, &b.destination, key, args, true));
                }
            }
        }
        out
    }

    /// How the definitions files keep an exchange; `None` for one they do not keep.
    fn exchange_def(x: &Exchange<QueueRef>) -> Option<Definition> {
        (x.durable && !x.name.is_empty() && !x.name.starts_with("amq.")).then(|| {
            Definition::Exchange(ExchangeDeclare {
                exchange: (&*x.name).into(),
                kind: x.type_name().into(),
                durable: true,
                auto_delete: x.auto_delete,
                internal: x.internal,
                arguments: x.arguments.clone(),
                ..Default::default()
            })
        })
    }

    /// How the definitions files keep a queue (with its log's id); `None` for one they do not.
    fn queue_def(q: &QueueRef) -> Option<Definition> {
        let id = q.store_id().filter(|_| Self::kept(q))?;
        Some(Definition::Queue(
            id,
            QueueDeclare {
                queue: (&**q.name()).into(),
                durable: true,
                auto_delete: q.options().auto_delete,
                arguments: q.options().arguments.clone(),
                ..Default::default()
            },
        ))
    }

    /// What backs a new or recovered queue: a durable queue's log `id` (opened here, with what
    /// it recovered), or a place for a scratch log. `None` without storage.
    fn backing(&self, durable_id: Option<u64>) -> Option<std::io::Result<Backing>> {
        let storage = self.storage.as_ref()?;
        let persister = storage.persister.clone();
        Some(match durable_id {
            Some(id) => {
                let dir = storage.dir.join("queues").join(format!("{id:016x}"));
                crate::queue::Log::open(&dir, crate::persist::stored_body_len).map(|(log, rec)| {
                    Backing {
                        persister,
                        durable: Some((id, log, rec)),
                        scratch_dir: None,
                    }
                })
            }
            None => Ok(Backing {
                persister,
                durable: None,
                scratch_dir: Some(
                    storage
                        .dir
                        .join("scratch")
                        .join(format!("{:016x}", rand::random::<u64>())),
                ),
            }),
        })
    }

    /// Creates or recovers the stream whose log is `queues/<id>` (streams need a data directory).
    fn open_stream(&self, name: Arc<str>, opts: QueueOptions, id: u64) -> AmqpResult<QueueRef> {
        let Some(storage) = self.storage.as_ref() else {
            return Err(AmqpError::internal_error(format!(
                "cannot create stream '{name}': the broker has no data directory"
            )));
        };
        let dir = storage.dir.join("queues").join(format!("{id:016x}"));
        crate::queue::stream::Stream::open(
            name.clone(),
            self.name.clone(),
            opts,
            id,
            dir,
            storage.persister.clone(),
        )
        .map(QueueRef::Stream)
        .map_err(|e| {
            AmqpError::internal_error(format!("cannot open the log of stream '{name}': {e}"))
        })
    }

    /// Recreates a durable queue from the definitions file with the messages in its log.
    fn restore_queue(self: &Arc<Self>, id: u64, d: &QueueDeclare) -> AmqpResult<u64> {
        let args = QueueArgs::parse(
            &d.arguments,
            &format!("queue '{}' in vhost '{}'", d.queue, self.name),
        )?;
        let opts = QueueOptions {
            durable: true,
            exclusive_owner: None,
            auto_delete: d.auto_delete,
            arguments: d.arguments.clone(),
            args,
        };
        if crate::queue_type::is_stream(&d.arguments) {
            let name: Arc<str> = (&*d.queue).into();
            let q = self.open_stream(name.clone(), opts, id)?;
            let n = q.message_count() as u64;
            let mut defs = self.defs.lock();
            defs.queues.insert(name, q);
            self.publish(&defs);
            return Ok(n);
        }
        let backing = match self.backing(Some(id)) {
            Some(Ok(b)) => Some(b),
            Some(Err(e)) => {
                return Err(AmqpError::internal_error(format!(
                    "cannot open the log of queue '{}': {e}",
                    d.queue
                )))
            }
            None => None,
        };
        let n = backing
            .as_ref()
            .and_then(|b| b.durable.as_ref())
            .map_or(0, |(_, _, rec)| rec.count as u64);
        let name: Arc<str> = (&*d.queue).into();
        let q = QueueRef::Local(Queue::with_log(
            name.clone(),
            self.name.clone(),
            opts,
            Arc::downgrade(self),
            backing,
        ));
        let mut defs = self.defs.lock();
        defs.queues.insert(name, q);
        self.publish(&defs);
        Ok(n)
    }

    /// Deletes queue log directories that no durable queue owns (left by non-durable state or
    /// a crash between creating a log and recording its queue).
    fn remove_orphan_logs(&self) {
        let Some(storage) = &self.storage else { return };
        let owned: std::collections::HashSet<String> = self
            .defs
            .lock()
            .queues
            .values()
            .filter_map(|q| q.store_id())
            .map(|id| format!("{id:016x}"))
            .collect();
        let Ok(entries) = std::fs::read_dir(storage.dir.join("queues")) else {
            return;
        };
        for e in entries.flatten() {
            if !owned.contains(e.file_name().to_string_lossy().as_ref()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }

    fn no_exchange(&self, name: &str) -> AmqpError {
        AmqpError::not_found(format!("no exchange '{name}' in vhost '{}'", self.name))
    }

    pub fn no_queue(&self, name: &str) -> AmqpError {
        AmqpError::not_found(format!("no queue '{name}' in vhost '{}'", self.name))
    }

    pub fn declare_exchange(&self, spec: &ExchangeSpec<'_>) -> AmqpResult<()> {
        if spec.name.is_empty() {
            return Err(AmqpError::access_refused(
                "operation not permitted on the default exchange",
            ));
        }
        if let (false, Some(c)) = (spec.passive, self.replicated()) {
            return c.vhost_op(
                &self.name,
                ExchangeDeclare {
                    exchange: spec.name.into(),
                    kind: spec.kind.into(),
                    durable: spec.durable,
                    auto_delete: spec.auto_delete,
                    internal: spec.internal,
                    arguments: spec.arguments.clone(),
                    ..Default::default()
                }
                .into(),
                None,
            );
        }
        let mut defs = self.defs.lock();
        if spec.passive {
            return if defs.table.exchanges.contains_key(spec.name) {
                Ok(())
            } else {
                Err(self.no_exchange(spec.name))
            };
        }
        let (kind, delayed) = parse_exchange_type(spec.kind, spec.arguments)?;
        if spec.name.is_empty() {
            return Err(AmqpError::access_refused(
                "operation not permitted on the default exchange",
            ));
        }
        if let Some(x) = defs.table.exchanges.get(spec.name) {
            let (n, v) = (spec.name, &*self.name);
            if x.kind != kind || x.delayed != delayed {
                return Err(inequivalent(
                    "exchange",
                    "type",
                    n,
                    v,
                    erl_atom(spec.kind),
                    erl_atom(x.type_name()),
                ));
            }
            if x.durable != spec.durable {
                return Err(inequivalent(
                    "exchange",
                    "durable",
                    n,
                    v,
                    spec.durable,
                    x.durable,
                ));
            }
            if x.auto_delete != spec.auto_delete {
                return Err(inequivalent(
                    "exchange",
                    "auto_delete",
                    n,
                    v,
                    spec.auto_delete,
                    x.auto_delete,
                ));
            }
            if x.internal != spec.internal {
                return Err(inequivalent(
                    "exchange",
                    "internal",
                    n,
                    v,
                    spec.internal,
                    x.internal,
                ));
            }
            check_args_equivalent_of(
                "exchange",
                &["alternate-exchange"],
                n,
                v,
                spec.arguments,
                &x.arguments,
            )?;
            return Ok(());
        }
        if spec.name.starts_with("amq.") {
            return Err(AmqpError::access_refused(format!(
                "exchange name '{}' contains reserved prefix 'amq.*'",
                spec.name
            )));
        }
        // A new exchange's alternate-exchange must be a longstr (checked on declare, not at
        // recovery).
        if !self.loading.load(std::sync::atomic::Ordering::Relaxed) {
            if let Some(v) = spec.arguments.get("alternate-exchange") {
                if !matches!(v, FieldValue::LongStr(_)) {
                    return Err(AmqpError::precondition_failed(format!(
                        "invalid type '{}' for arg 'alternate-exchange' in exchange '{}' in vhost '{}'",
                        crate::queue::type_name(v),
                        spec.name,
                        self.name
                    )));
                }
            }
        }
        let hash_on = match kind {
            ExchangeKind::ConsistentHash => consistent_hash_args(spec.arguments)?,
            _ => HashOn::RoutingKey,
        };
        let name: Arc<str> = spec.name.into();
        let x = Exchange {
            name: name.clone(),
            kind,
            delayed,
            durable: spec.durable,
            auto_delete: spec.auto_delete,
            internal: spec.internal,
            arguments: spec.arguments.clone(),
            bindings: Vec::new(),
            alternate: Self::alternate(&self.policies.lock(), spec.name, spec.arguments),
            ring: HashRing::new(hash_on),
            direct: Default::default(),
            topic: Default::default(),
            stats: Default::default(),
        };
        let op = Self::exchange_def(&x);
        defs.table.exchanges.insert(name, Arc::new(x));
        self.changed(&mut defs, op.into_iter().collect())?;
        tracing::info!(vhost = %self.name, exchange = spec.name, kind = spec.kind, "exchange declared");
        Ok(())
    }

    /// An exchange's alternate exchange: its own `alternate-exchange` argument, else that of
    /// the policy applying to it (RabbitMQ's order).
    fn alternate(policies: &[PolicyDef], name: &str, arguments: &FieldTable) -> Option<Arc<str>> {
        if let Some(ae) = arguments.get("alternate-exchange").and_then(|v| v.as_str()) {
            return Some(ae.into());
        }
        // The default exchange routes by queue name only; RabbitMQ never sends it to an AE.
        if name.is_empty() {
            return None;
        }
        crate::policy::alternate_exchange(policies, name).map(Arc::from)
    }

    /// Takes the vhost's policies and re-evaluates every exchange's alternate exchange.
    pub fn set_policies(&self, policies: Vec<PolicyDef>) {
        let mut defs = self.defs.lock();
        let mut changed = false;
        for x in defs.table.exchanges.values_mut() {
            let ae = Self::alternate(&policies, &x.name, &x.arguments);
            if ae != x.alternate {
                Arc::make_mut(x).alternate = ae;
                changed = true;
            }
        }
        *self.policies.lock() = policies;
        // Derived from arguments and policies at load, so nothing to write to disk.
        if changed {
            self.publish(&defs);
        }
    }

    pub fn delete_exchange(&self, name: &str, if_unused: bool) -> AmqpResult<()> {
        if name.is_empty() {
            return Err(AmqpError::access_refused(
                "operation not permitted on the default exchange",
            ));
        }
        if name.starts_with("amq.") {
            return Err(AmqpError::access_refused(format!(
                "deletion of system exchange '{name}' in vhost '{}' not allowed",
                self.name
            )));
        }
        if let Some(c) = self.replicated() {
            let m = ExchangeDelete {
                exchange: name.into(),
                if_unused,
                ..Default::default()
            };
            return c.vhost_op(&self.name, m.into(), None);
        }
        let mut defs = self.defs.lock();
        let Some(x) = defs.table.exchanges.get(name) else {
            return Ok(());
        };
        if if_unused && !x.bindings.is_empty() {
            return Err(AmqpError::precondition_failed(format!(
                "exchange '{name}' in vhost '{}' in use",
                self.name
            )));
        }
        let op = x.durable.then(|| {
            Definition::ExchangeDelete(ExchangeDelete {
                exchange: name.into(),
                ..Default::default()
            })
        });
        let mut ops: Vec<Definition> = op.into_iter().collect();
        defs.table.exchanges.remove(name);
        Self::remove_bindings_to(
            &mut defs,
            &|d| matches!(d, Destination::Exchange(e) if &**e == name),
            &mut ops,
        );
        self.changed(&mut defs, ops)?;
        tracing::info!(vhost = %self.name, exchange = name, "exchange deleted");
        Ok(())
    }

    /// Removes every binding whose destination matches; auto-delete exchanges left without
    /// bindings go too (repeatedly, since removing one can empty another).
    /// Durable exchanges that go this way are added to `ops` as deletions: the change that
    /// caused it may not be journaled itself (a transient queue's last binding).
    fn remove_bindings_to(
        defs: &mut Snapshot,
        pred: &dyn Fn(&Destination<QueueRef>) -> bool,
        ops: &mut Vec<Definition>,
    ) {
        let mut emptied: Vec<Arc<str>> = Vec::new();
        for x in defs.table.exchanges.values_mut() {
            if x.bindings.iter().any(|b| pred(&b.destination)) {
                let xm = Arc::make_mut(x);
                xm.bindings.retain(|b| !pred(&b.destination));
                xm.bindings_changed();
                if xm.auto_delete && xm.bindings.is_empty() {
                    emptied.push(xm.name.clone());
                }
            }
        }
        for name in emptied {
            Self::auto_delete(defs, &name, ops);
        }
    }

    /// Removes an auto-delete exchange left without bindings, and what that empties in turn.
    fn auto_delete(defs: &mut Snapshot, name: &Arc<str>, ops: &mut Vec<Definition>) {
        if let Some(x) = defs.table.exchanges.remove(name) {
            if x.durable {
                ops.push(Definition::ExchangeDelete(ExchangeDelete {
                    exchange: (&**name).into(),
                    ..Default::default()
                }));
            }
        }
        Self::remove_bindings_to(
            defs,
            &|d| matches!(d, Destination::Exchange(e) if e == name),
            ops,
        );
    }

    fn same_binding(
        b: &Binding<QueueRef>,
        dest: &Destination<QueueRef>,
        key: &str,
        args: &FieldTable,
    ) -> bool {
        let same_dest = match (&b.destination, dest) {
            (Destination::Queue(a), Destination::Queue(c)) => a.ptr_eq(c),
            (Destination::Exchange(a), Destination::Exchange(c)) => a == c,
            _ => false,
        };
        same_dest && &*b.routing_key == key && same_args(&b.arguments, args)
    }

    fn bind(
        &self,
        source: &str,
        dest_name: &str,
        dest: impl FnOnce(&Snapshot) -> AmqpResult<Destination<QueueRef>>,
        key: &str,
        args: &FieldTable,
        add: bool,
        conn_id: Option<u64>,
    ) -> AmqpResult<()> {
        if source.is_empty() || (dest_name.is_empty() && add) {
            return Err(AmqpError::access_refused(
                "operation not permitted on the default exchange",
            ));
        }
        let mut defs = self.defs.lock();
        // RabbitMQ looks the source up before the destination: with both missing, the 404
        // names the source exchange.
        if add && !defs.table.exchanges.contains_key(source) {
            return Err(self.no_exchange(source));
        }
        // Unbinding what does not exist is not an error in RabbitMQ.
        let dest = match dest(&defs) {
            Ok(d) => d,
            Err(_) if !add => return Ok(()),
            Err(e) => return Err(e),
        };
        let dest_kept = Self::dest_kept(&defs, &dest);
        let Some(x) = defs.table.exchanges.get_mut(source) else {
            return if add {
                Err(self.no_exchange(source))
            } else {
                Ok(())
            };
        };
        if add && x.kind == ExchangeKind::Headers {
            validate_x_match(args)?;
        }
        if add && x.kind == ExchangeKind::ConsistentHash {
            consistent_hash::parse_weight(key).map_err(AmqpError::precondition_failed)?;
        }
        // Then, both found and the binding valid, another connection's exclusive queue: 405.
        if let (true, Some(me), Destination::Queue(q)) = (add, conn_id, &dest) {
            if q.options().exclusive_owner.is_some_and(|o| o != me) {
                return Err(self.locked(q.name()));
            }
        }
        let op = (x.durable && dest_kept).then(|| Self::binding_op(source, &dest, key, args, add));
        let exists = x
            .bindings
            .iter()
            .position(|b| Self::same_binding(b, &dest, key, args));
        let mut ops: Vec<Definition> = op.into_iter().collect();
        match (add, exists) {
            (true, None) => {
                let xm = Arc::make_mut(x);
                xm.bindings.push(Binding {
                    destination: dest,
                    routing_key: key.into(),
                    arguments: args.clone(),
                });
                xm.bindings_changed();
            }
            (false, Some(i)) => {
                let xm = Arc::make_mut(x);
                xm.bindings.remove(i);
                xm.bindings_changed();
                if xm.auto_delete && xm.bindings.is_empty() {
                    let name = xm.name.clone();
                    Self::auto_delete(&mut defs, &name, &mut ops);
                }
            }
            _ => return Ok(()),
        }
        self.changed(&mut defs, ops)
    }

    /// Whether a binding from a durable exchange to `dest` is kept: to a kept queue, or to a
    /// durable exchange.
    fn dest_kept(defs: &Snapshot, dest: &Destination<QueueRef>) -> bool {
        match dest {
            Destination::Queue(q) => Self::kept(q),
            Destination::Exchange(d) => defs.table.exchanges.get(d).is_some_and(|dx| dx.durable),
        }
    }

    /// The record of a binding added or removed.
    fn binding_op(
        source: &str,
        dest: &Destination<QueueRef>,
        key: &str,
        args: &FieldTable,
        add: bool,
    ) -> Definition {
        let (source, key, arguments) = (source.into(), key.into(), args.clone());
        match (dest, add) {
            (Destination::Queue(q), true) => Definition::QueueBind(QueueBind {
                queue: (&**q.name()).into(),
                exchange: source,
                routing_key: key,
                arguments,
                ..Default::default()
            }),
            (Destination::Queue(q), false) => Definition::QueueUnbind(QueueUnbind {
                queue: (&**q.name()).into(),
                exchange: source,
                routing_key: key,
                arguments,
                ..Default::default()
            }),
            (Destination::Exchange(d), true) => Definition::ExchangeBind(ExchangeBind {
                destination: (&**d).into(),
                source,
                routing_key: key,
                arguments,
                ..Default::default()
            }),
            (Destination::Exchange(d), false) => Definition::ExchangeUnbind(ExchangeUnbind {
                destination: (&**d).into(),
                source,
                routing_key: key,
                arguments,
                ..Default::default()
            }),
        }
    }

    pub fn bind_queue(
        &self,
        queue: &str,
        exchange: &str,
        key: &str,
        args: &FieldTable,
        add: bool,
        conn_id: Option<u64>,
    ) -> AmqpResult<()> {
        if let Some(c) = self.replicated() {
            let m = bind_method(true, queue, exchange, key, args, add);
            let meta = conn_id.map(|o| QueueMeta {
                owner: Some(o),
                ..Default::default()
            });
            return c.vhost_op(&self.name, m, meta);
        }
        self.bind(
            exchange,
            "queue",
            |d| {
                d.queues
                    .get(queue)
                    .cloned()
                    .map(Destination::Queue)
                    .ok_or_else(|| self.no_queue(queue))
            },
            key,
            args,
            add,
            conn_id,
        )
    }

    pub fn bind_exchange(
        &self,
        destination: &str,
        source: &str,
        key: &str,
        args: &FieldTable,
        add: bool,
    ) -> AmqpResult<()> {
        if let Some(c) = self.replicated() {
            let m = bind_method(false, destination, source, key, args, add);
            return c.vhost_op(&self.name, m, None);
        }
        self.bind(
            source,
            destination,
            |d| {
                if d.table.exchanges.contains_key(destination) {
                    Ok(Destination::Exchange(destination.into()))
                } else {
                    Err(self.no_exchange(destination))
                }
            },
            key,
            args,
            add,
            None,
        )
    }

    /// Declares (or checks) a queue; returns it.
    pub fn declare_queue(self: &Arc<Self>, spec: &QueueSpec<'_>) -> AmqpResult<QueueRef> {
        if spec.passive && crate::cluster::applying().is_none() {
            if let Some(r) = self
                .defs
                .lock()
                .queues
                .get(spec.name)
                .and_then(|q| q.remote().cloned())
            {
                r.counts_checked()?;
            }
        }
        if self.cluster.is_some() && !spec.passive && crate::queue_type::is_stream(spec.arguments) {
            // A stream is local to one node and its log is not replicated yet.
            return Err(AmqpError::not_implemented(format!(
                "stream queues are not supported in a cluster yet (queue '{}' in vhost '{}')",
                spec.name, self.name
            )));
        }
        if let (false, Some(c)) = (spec.passive, self.replicated()) {
            let existing = self.defs.lock().queues.get(spec.name).cloned();
            // Redeclaring what exists needs no change: checked here, as a passive declare.
            if let Some(q) = existing {
                if let Some(r) = q.remote() {
                    // Its home must be up, as RabbitMQ checks with the queue's process.
                    r.counts_checked()?;
                }
                return self.declare_queue_once(spec);
            }
            let m = QueueDeclare {
                queue: spec.name.into(),
                durable: spec.durable,
                exclusive: spec.exclusive,
                auto_delete: spec.auto_delete,
                arguments: spec.arguments.clone(),
                ..Default::default()
            };
            let home = match spec.home {
                Some(h) => h.to_string(),
                // An exclusive queue lives with its connection.
                None if spec.exclusive => c.me.clone(),
                None => {
                    let policies = self.policies.lock();
                    let from_policy =
                        crate::policy::matching(&policies, spec.name, true).and_then(|p| {
                            ["queue-master-locator", "queue-leader-locator"]
                                .iter()
                                .find_map(|k| {
                                    p.definition
                                        .get(*k)
                                        .and_then(|v| v.as_str())
                                        .map(String::from)
                                })
                        });
                    let from_args = ["x-queue-master-locator", "x-queue-leader-locator"]
                        .iter()
                        .find_map(|k| {
                            spec.arguments
                                .get(k)
                                .and_then(|v| v.as_str())
                                .map(String::from)
                        });
                    drop(policies);
                    c.place(from_args.or(from_policy).as_deref())
                }
            };
            let members = if crate::queue_type::is_quorum(spec.arguments) {
                let size = crate::cluster::quorum::initial_group_size(spec.arguments)?;
                c.quorum_members(&home, size)
            } else if spec.exclusive || crate::queue_type::is_stream(spec.arguments) {
                Vec::new()
            } else {
                // A classic queue matched by an `ha-mode` policy (RabbitMQ's mirrored queues)
                // is replicated the same way, so older clusters' setups keep their guarantee.
                let policies = self.policies.lock();
                let ha = crate::policy::matching(&policies, spec.name, true)
                    .and_then(|p| crate::cluster::quorum::ha_members(&p.definition));
                drop(policies);
                match ha {
                    Some(crate::cluster::quorum::Ha::Size(n)) => c.quorum_members(&home, n),
                    Some(crate::cluster::quorum::Ha::Nodes(nodes)) => {
                        let first = if nodes.contains(&home) {
                            home.clone()
                        } else {
                            nodes[0].clone()
                        };
                        std::iter::once(first.clone())
                            .chain(nodes.into_iter().filter(|n| *n != first))
                            .collect()
                    }
                    None => Vec::new(),
                }
            };
            let meta = QueueMeta {
                home,
                owner: spec.exclusive.then_some(spec.conn_id),
                server_named: spec.server_named,
                group: None,
                members,
            };
            c.vhost_op(&self.name, m.into(), Some(meta))?;
            let q = self.defs.lock().queues.get(spec.name).cloned();
            self.churn.queue_declared.fetch_add(1, Relaxed);
            if let Some(r) = q.as_ref().and_then(|q| q.quorum()) {
                // declare-ok once the group has its first leader, as RabbitMQ waits for its
                // Ra cluster to start.
                let handle = tokio::runtime::Handle::current();
                let r = r.clone();
                let up = tokio::task::block_in_place(|| {
                    handle.block_on(r.wait_leader(crate::cluster::quorum::FIRST_LEADER_WAIT))
                });
                if !up {
                    return Err(r.unavailable());
                }
            }
            return q.ok_or_else(|| self.no_queue(spec.name));
        }
        let q = self.declare_queue_once(spec)?;
        self.churn.queue_declared.fetch_add(1, Relaxed);
        Ok(q)
    }

    fn declare_queue_once(self: &Arc<Self>, spec: &QueueSpec<'_>) -> AmqpResult<QueueRef> {
        // RabbitMQ checks the name before looking the queue up: a client-chosen 'amq.' name is
        // refused even when that queue exists (a server-named 'amq.gen-' one declared again).
        if !spec.passive && !spec.server_named && spec.name.starts_with("amq.") {
            return Err(AmqpError::access_refused(format!(
                "queue name '{}' contains reserved prefix 'amq.*'",
                spec.name
            )));
        }
        let mut defs = self.defs.lock();
        if let Some(q) = defs.queues.get(spec.name) {
            if let Some(owner) = q.options().exclusive_owner {
                if owner != spec.conn_id {
                    return Err(self.locked(spec.name));
                }
            }
            q.touch();
            if spec.passive {
                return Ok(q.clone());
            }
            let (n, v, o) = (spec.name, &*self.name, q.options());
            if o.durable != spec.durable {
                return Err(inequivalent(
                    "queue",
                    "durable",
                    n,
                    v,
                    spec.durable,
                    o.durable,
                ));
            }
            if o.exclusive_owner.is_some() != spec.exclusive {
                return Err(self.locked(spec.name));
            }
            if o.auto_delete != spec.auto_delete {
                return Err(inequivalent(
                    "queue",
                    "auto_delete",
                    n,
                    v,
                    spec.auto_delete,
                    o.auto_delete,
                ));
            }
            check_args_equivalent(n, v, spec.arguments, &o.arguments)?;
            return Ok(q.clone());
        }
        if spec.passive {
            return Err(self.no_queue(spec.name));
        }
        let max = self.max_queues.load(std::sync::atomic::Ordering::Relaxed);
        if max != u32::MAX
            && defs.queues.len() >= max as usize
            && !self.loading.load(std::sync::atomic::Ordering::Relaxed)
        {
            return Err(crate::admission::queue_limit_reached(
                spec.name, &self.name, max,
            ));
        }
        let args = crate::queue_type::check(spec, &self.name)?;
        let name: Arc<str> = spec.name.into();
        let options = QueueOptions {
            durable: spec.durable,
            exclusive_owner: spec.exclusive.then_some(spec.conn_id),
            auto_delete: spec.auto_delete,
            arguments: spec.arguments.clone(),
            args,
        };
        let remote_home = match (&self.cluster, spec.home) {
            (Some(c), Some(h)) if h != c.me => Some((c, h)),
            _ => None,
        };
        if let (Some(c), Some((group, members))) = (&self.cluster, spec.members) {
            // A replicated queue: every node holds the same handle; members run its group.
            let group = group.or_else(crate::cluster::applying).unwrap_or(0);
            let q = QueueRef::Quorum(crate::cluster::quorum::QuorumQueue::open(
                name.clone(),
                self.name.clone(),
                options,
                group,
                members.to_vec(),
                c,
                Arc::downgrade(self),
            ));
            defs.queues.insert(name, q.clone());
            self.publish(&defs);
            self.churn.queue_created.fetch_add(1, Relaxed);
            tracing::info!(vhost = %self.name, queue = spec.name, group = %format!("{group:016x}"), members = ?members, "quorum queue declared");
            return Ok(q);
        }
        if let Some((c, home)) = remote_home {
            let q = QueueRef::Remote(crate::cluster::remote::RemoteQueue::new(
                name.clone(),
                self.name.clone(),
                options,
                home.to_string(),
                c,
            ));
            defs.queues.insert(name, q.clone());
            self.publish(&defs);
            tracing::info!(vhost = %self.name, queue = spec.name, home, "queue declared");
            return Ok(q);
        }
        // Exclusive queues die with their connection, so their messages are never written.
        // A cluster's queue log is named after the Raft entry that declared it, so replaying
        // the log at restart finds the same log again.
        if crate::queue_type::is_stream(spec.arguments) {
            // Validated as durable, not exclusive: its log is always on disk.
            let q = self.open_stream(name.clone(), options, rand::random::<u64>())?;
            defs.queues.insert(name, q.clone());
            if let Err(e) = self.changed(&mut defs, Self::queue_def(&q).into_iter().collect()) {
                q.mark_deleted();
                return Err(e);
            }
            self.churn.queue_created.fetch_add(1, Relaxed);
            tracing::info!(vhost = %self.name, queue = spec.name, "stream declared");
            return Ok(q);
        }
        let durable_id = (spec.durable && !spec.exclusive)
            .then(|| crate::cluster::applying().unwrap_or_else(rand::random::<u64>));
        let backing = match self.backing(durable_id) {
            Some(Ok(b)) => Some(b),
            Some(Err(e)) => {
                return Err(AmqpError::internal_error(format!(
                    "cannot create the log of queue '{}': {e}",
                    spec.name
                )))
            }
            None => None,
        };
        let q = QueueRef::Local(Queue::with_log(
            name.clone(),
            self.name.clone(),
            options,
            Arc::downgrade(self),
            backing,
        ));
        defs.queues.insert(name, q.clone());
        if let Err(e) = self.changed(&mut defs, Self::queue_def(&q).into_iter().collect()) {
            q.mark_deleted(); // its new log goes with it
            return Err(e);
        }
        self.churn.queue_created.fetch_add(1, Relaxed);
        tracing::info!(vhost = %self.name, queue = spec.name, durable = spec.durable, exclusive = spec.exclusive, auto_delete = spec.auto_delete, "queue declared");
        Ok(q)
    }

    /// The queues a message published to `exchange` with `routing_key` reaches. Errors if the
    /// exchange is missing (404) or internal (403). `properties` is decoded only for a headers
    /// exchange.
    pub fn route(
        &self,
        exchange: &str,
        routing_key: &str,
        properties: &bytes::Bytes,
        out: &mut Vec<QueueRef>,
    ) -> AmqpResult<()> {
        self.route_keys(exchange, routing_key, &[], properties, out)
            .map(|_| ())
    }

    /// [`VHost::route`] with the extra routing keys of the `CC` and `BCC` headers.
    pub fn route_keys(
        &self,
        exchange: &str,
        routing_key: &str,
        extra_keys: &[ByteString],
        properties: &bytes::Bytes,
        out: &mut Vec<QueueRef>,
    ) -> AmqpResult<Option<u64>> {
        let snap = self.snapshot.load();
        let before = out.len();
        if exchange.is_empty() {
            self.default_stats.publish_in.add(1);
            for key in std::iter::once(routing_key).chain(extra_keys.iter().map(|k| &**k)) {
                let q = if let Some(q) = snap.queues.get(key) {
                    q.clone()
                } else if key.starts_with(DIRECT_REPLY_TO) {
                    // A reply whose requester is gone is dropped, as in RabbitMQ.
                    match self.direct_reply.lock().get(key) {
                        Some(q) => q.clone(),
                        None => continue,
                    }
                } else {
                    continue;
                };
                if !out.iter().any(|x| x.ptr_eq(&q)) {
                    out.push(q);
                }
            }
            if out.len() > before {
                self.default_stats.publish_out.add(1);
            }
            return Ok(None);
        }
        let stats = match snap.table.exchanges.get(exchange) {
            None => return Err(self.no_exchange(exchange)),
            Some(x) if x.internal => {
                return Err(AmqpError::access_refused(format!(
                    "cannot publish to internal exchange '{exchange}' in vhost '{}'",
                    self.name
                )))
            }
            Some(x) if x.delayed => {
                if let Some(d) = crate::delayed::requested_delay(properties) {
                    x.stats.publish_in.add(1);
                    return Ok(Some(d));
                }
                &x.stats
            }
            Some(x) => &x.stats,
        };
        stats.publish_in.add(1);
        let mut props = || warren_protocol::properties::BasicProperties::decode(properties).ok();
        snap.table
            .route_keys(exchange, routing_key, extra_keys, &mut props, out);
        if out.len() > before {
            stats.publish_out.add(1);
        }
        Ok(None)
    }

    /// Routes a delayed message that is due: by the exchange's bindings as they are now.
    pub fn route_due(&self, exchange: &str, msg: &Message, out: &mut Vec<QueueRef>) {
        let snap = self.snapshot.load();
        let Some(x) = snap.table.exchanges.get(exchange) else {
            return;
        };
        let props = &msg.properties;
        let mut decoded = || warren_protocol::properties::BasicProperties::decode(props).ok();
        let cc = decoded()
            .and_then(|p| p.headers)
            .and_then(|h| crate::message::header_routes(&h).ok())
            .unwrap_or_default();
        snap.table
            .route_keys(exchange, &msg.routing_key, &cc, &mut decoded, out);
        if !out.is_empty() {
            x.stats.publish_out.add(1);
        }
    }

    /// The store of delayed exchange `exchange`, opened on first use; `None` when there is no
    /// such exchange or it cannot be opened.
    pub fn delay_store(self: &Arc<Self>, exchange: &str) -> Option<Arc<DelayStore>> {
        let mut stores = self.delayed.lock();
        if let Some(s) = stores.get(exchange) {
            return Some(s.clone());
        }
        let snap = self.snapshot.load();
        let x = snap.table.exchanges.get(exchange).filter(|x| x.delayed)?;
        let dir = self.storage.as_ref().map(|st| {
            st.dir
                .join("delayed")
                .join(crate::delayed::dir_name(exchange))
        });
        let persister = self.storage.as_ref().map(|st| st.persister.clone());
        match DelayStore::open(self, exchange, false, dir, persister, x.durable) {
            Ok(s) => {
                stores.insert(x.name.clone(), s.clone());
                Some(s)
            }
            Err(e) => {
                tracing::error!(vhost = %self.name, exchange, error = %e, "cannot open the delayed message store");
                None
            }
        }
    }

    /// The store holding queue `queue`'s delayed retries, opened on first use.
    pub fn retry_store(self: &Arc<Self>, queue: &str) -> Option<Arc<DelayStore>> {
        let mut stores = self.retry.lock();
        if let Some(s) = stores.get(queue) {
            return Some(s.clone());
        }
        let q = self.snapshot.load().queues.get(queue)?.clone();
        let dir = self.storage.as_ref().map(|st| {
            st.dir
                .join("delayed")
                .join(format!("q-{}", crate::delayed::dir_name(queue)))
        });
        let persister = self.storage.as_ref().map(|st| st.persister.clone());
        let durable = q.options().durable;
        match DelayStore::open(self, queue, true, dir, persister, durable) {
            Ok(s) => {
                stores.insert(q.name().clone(), s.clone());
                Some(s)
            }
            Err(e) => {
                tracing::error!(vhost = %self.name, queue, error = %e, "cannot open the delayed retry store");
                None
            }
        }
    }

    /// Drops the stores of delayed exchanges and retrying queues that are gone (and their
    /// messages, as the plugin drops a deleted exchange's).
    fn prune_delayed(&self, defs: &Snapshot) {
        let mut stores = self.delayed.lock();
        if !stores.is_empty() {
            stores.retain(|name, store| {
                let keep = defs.table.exchanges.get(name).is_some_and(|x| x.delayed);
                if !keep {
                    store.destroy();
                }
                keep
            });
        }
        drop(stores);
        let mut stores = self.retry.lock();
        if !stores.is_empty() {
            stores.retain(|name, store| {
                let keep = defs.queues.contains_key(name);
                if !keep {
                    store.destroy();
                }
                keep
            });
        }
    }

    /// Messages held by delayed exchange `exchange`.
    pub fn delayed_count(&self, exchange: &str) -> u64 {
        self.delayed.lock().get(exchange).map_or(0, |s| s.len())
    }

    /// Opens every durable delayed exchange's store (recovering its messages) and removes the
    /// files of any other.
    fn recover_delayed(self: &Arc<Self>) {
        let Some(storage) = &self.storage else { return };
        let names: Vec<Arc<str>> = self
            .snapshot
            .load()
            .table
            .exchanges
            .values()
            .filter(|x| x.delayed && x.durable)
            .map(|x| x.name.clone())
            .collect();
        let mut keep = std::collections::HashSet::new();
        for n in names {
            if self.delay_store(&n).is_some() {
                keep.insert(crate::delayed::dir_name(&n));
            }
        }
        let Ok(entries) = std::fs::read_dir(storage.dir.join("delayed")) else {
            return;
        };
        for e in entries.flatten() {
            let dir = e.file_name().to_string_lossy().into_owned();
            if let Some(hash) = dir.strip_prefix("q-") {
                // A durable queue's retries: kept while the queue is.
                let name = std::fs::read_to_string(e.path().join("name")).unwrap_or_default();
                let durable = self
                    .snapshot
                    .load()
                    .queues
                    .get(name.as_str())
                    .is_some_and(|q| q.options().durable);
                if durable
                    && crate::delayed::dir_name(&name) == hash
                    && self.retry_store(&name).is_some()
                {
                    continue;
                }
            } else if keep.contains(&dir) {
                continue;
            }
            let _ = std::fs::remove_dir_all(e.path());
        }
    }

    /// Creates the private queue behind a channel's direct reply-to consumer.
    pub fn new_direct_reply_queue(self: &Arc<Self>) -> QueueRef {
        let name: Arc<str> = crate::channel::gen_name(&format!("{DIRECT_REPLY_TO}.")).into();
        let opts = QueueOptions {
            durable: false,
            exclusive_owner: None,
            auto_delete: false,
            arguments: FieldTable::new(),
            args: QueueArgs::default(),
        };
        let q = QueueRef::Local(Queue::new(
            name.clone(),
            self.name.clone(),
            opts,
            Arc::downgrade(self),
        ));
        self.direct_reply.lock().insert(name, q.clone());
        q
    }

    /// Whether `name` is a live direct reply-to pseudo-queue (its requester still consumes).
    pub fn direct_reply_exists(&self, name: &str) -> bool {
        self.direct_reply.lock().contains_key(name)
    }

    pub fn drop_direct_reply_queue(&self, name: &str) {
        if let Some(q) = self.direct_reply.lock().remove(name) {
            q.mark_deleted();
        }
    }

    /// Queues with messages that have deadlines, for the TTL sweeper.
    pub fn expiring_queues(&self) -> Vec<QueueRef> {
        self.snapshot
            .load()
            .queues
            .values()
            .filter(|q| q.may_expire())
            .cloned()
            .collect()
    }

    /// Deletes `x-expires` queues whose lease ran out.
    pub fn delete_unused(&self) {
        let now = crate::queue::now_ms();
        let due: Vec<QueueRef> = self
            .snapshot
            .load()
            .queues
            .values()
            .filter(|q| q.lease_expired(now))
            .cloned()
            .collect();
        for q in due {
            tracing::info!(vhost = %self.name, queue = %q.name(), "queue expired (x-expires)");
            let _ = self.delete_queue(q.name(), false, false, None);
        }
    }

    pub fn locked(&self, name: &str) -> AmqpError {
        AmqpError::resource_locked(format!(
            "cannot obtain exclusive access to locked queue '{name}' in vhost '{}'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.",
            self.name
        ))
    }

    pub fn queue(&self, name: &str) -> Option<QueueRef> {
        self.snapshot.load().queues.get(name).cloned()
    }

    /// Looks a queue up for use by `conn_id`: 404 if missing, 405 if another connection's
    /// exclusive queue.
    pub fn queue_for(&self, name: &str, conn_id: u64) -> AmqpResult<QueueRef> {
        let q = self.queue(name).ok_or_else(|| self.no_queue(name))?;
        match q.options().exclusive_owner {
            Some(owner) if owner != conn_id => Err(self.locked(name)),
            _ => Ok(q),
        }
    }

    /// Deletes a queue. Missing is not an error (RabbitMQ answers delete-ok with 0).
    pub fn delete_queue(
        &self,
        name: &str,
        if_unused: bool,
        if_empty: bool,
        conn_id: Option<u64>,
    ) -> AmqpResult<DeletedQueue> {
        if let Some(c) = self.replicated() {
            let Some(q) = self.defs.lock().queues.get(name).cloned() else {
                return Ok(DeletedQueue {
                    message_count: 0,
                    consumers: Vec::new(),
                });
            };
            if let (Some(owner), Some(me)) = (q.options().exclusive_owner, conn_id) {
                if owner != me {
                    return Err(self.locked(name));
                }
            }
            // A replicated queue led elsewhere is asked like a remote one (fresh counts).
            let remote = q.remote_leg();
            let message_count = match remote {
                Some(r) => {
                    let n = r.counts_checked()?;
                    if if_unused && n.consumers > 0 {
                        return Err(AmqpError::precondition_failed(format!(
                            "{} in use",
                            q.describe()
                        )));
                    }
                    if if_empty && n.messages > 0 {
                        return Err(AmqpError::precondition_failed(format!(
                            "{} not empty",
                            q.describe()
                        )));
                    }
                    n.messages
                }
                None => {
                    if if_unused && q.consumer_count() > 0 {
                        return Err(AmqpError::precondition_failed(format!(
                            "{} in use",
                            q.describe()
                        )));
                    }
                    if if_empty && q.message_count() > 0 {
                        return Err(AmqpError::precondition_failed(format!(
                            "{} not empty",
                            q.describe()
                        )));
                    }
                    q.message_count()
                }
            };
            let m = QueueDelete {
                queue: name.into(),
                ..Default::default()
            };
            c.vhost_op(&self.name, m.into(), None)?;
            return Ok(DeletedQueue {
                message_count,
                consumers: Vec::new(),
            });
        }
        let mut defs = self.defs.lock();
        let Some(q) = defs.queues.get(name).cloned() else {
            return Ok(DeletedQueue {
                message_count: 0,
                consumers: Vec::new(),
            });
        };
        if let (Some(owner), Some(me)) = (q.options().exclusive_owner, conn_id) {
            if owner != me {
                return Err(self.locked(name));
            }
        }
        if if_unused && q.consumer_count() > 0 {
            return Err(AmqpError::precondition_failed(format!(
                "{} in use",
                q.describe()
            )));
        }
        if if_empty && q.message_count() > 0 {
            return Err(AmqpError::precondition_failed(format!(
                "{} not empty",
                q.describe()
            )));
        }
        defs.queues.remove(name);
        let mut ops: Vec<Definition> = Self::kept(&q)
            .then(|| {
                Definition::QueueDelete(QueueDelete {
                    queue: name.into(),
                    ..Default::default()
                })
            })
            .into_iter()
            .collect();
        Self::remove_bindings_to(
            &mut defs,
            &|d| matches!(d, Destination::Queue(x) if x.ptr_eq(&q)),
            &mut ops,
        );
        self.changed(&mut defs, ops)?;
        drop(defs);
        let (message_count, consumers) = q.mark_deleted();
        self.churn.queue_deleted.fetch_add(1, Relaxed);
        tracing::info!(vhost = %self.name, queue = name, "queue deleted");
        Ok(DeletedQueue {
            message_count,
            consumers,
        })
    }
}

/// The vhost is its queues' owner: their dead letters are routed by its exchanges.
impl crate::queue::QueueOwner for VHost {
    fn route_dead_letter(
        &self,
        m: &Message,
        extra_keys: &[ByteString],
        out: &mut Vec<QueueRef>,
    ) -> crate::queue::DeadRoute {
        use crate::queue::DeadRoute;
        match self.route_keys(&m.exchange, &m.routing_key, extra_keys, &m.properties, out) {
            Ok(None) => DeadRoute::Routed,
            Ok(Some(delay)) => DeadRoute::Delay(delay),
            Err(_) => DeadRoute::NoExchange,
        }
    }

    fn hold_dead_letter(
        self: Arc<Self>,
        m: &Message,
        delay_ms: u64,
        confirm: Option<&Arc<crate::confirm::ConfirmHandle>>,
    ) -> Option<bool> {
        let store = self.delay_store(&m.exchange)?;
        Some(store.hold_dead_letter(m, delay_ms, confirm))
    }

    fn delete_unused_queue(&self, name: &str) {
        if let Ok(d) = self.delete_queue(name, false, false, None) {
            crate::channel::notify_cancelled(&d.consumers);
        }
    }
}
