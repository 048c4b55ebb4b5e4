//! What the management API and Prometheus report of message flow: RabbitMQ's `message_stats`
//! (with `_details.rate`) on the overview, queues, exchanges and channels, the `/api/channels`
//! and `/api/consumers` listings, the rate sampler, and `/metrics` in the names and labels of
//! RabbitMQ's `rabbitmq_prometheus` plugin. Everything here reads counters the message path
//! keeps (the broker's `metrics.rs`); nothing here is on the message path.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::{json, Value};
use warren_broker::channel::ChannelShared;
use warren_broker::metrics::{deliver_get, with_details, ChannelStats, SAMPLE_EVERY};
use warren_broker::node_status::{file_descriptors, node_churn};
use warren_broker::queue::{Consumer, QueueRef};
use warren_broker::server::Broker;
use warren_broker::tracking::ConnInfo;
use warren_broker::vhost::VHost;

use crate::api::{not_found, ok_json, vhost_of, ApiResult, B};
use crate::http::paging::{list_reply, ListParams};

/// An `Arc`'s address, to match a consumer's sink with its channel (a local consumer's sink is
/// its channel).
pub fn addr<T: ?Sized>(p: &Arc<T>) -> usize {
    Arc::as_ptr(p) as *const () as usize
}

/// Consumers per channel (by the channel's address).
pub fn consumers_by_channel(b: &Broker) -> HashMap<usize, u32> {
    let mut on: HashMap<usize, u32> = HashMap::new();
    for v in b.vhosts() {
        for q in v.snapshot().queues.values() {
            for c in q.consumers() {
                *on.entry(addr(&c.sink)).or_default() += 1;
            }
        }
    }
    on
}

/// The open connections, oldest first.
pub fn open_connections(b: &Broker) -> Vec<Arc<ConnInfo>> {
    let mut cs: Vec<_> = b.connections.lock().values().cloned().collect();
    cs.sort_by_key(|c| c.id);
    cs
}

/// A channel's counters, with `deliver_get` as RabbitMQ adds it.
fn channel_values(s: &ChannelStats) -> Vec<(&'static str, u64)> {
    let mut v = s.values();
    let dg = deliver_get(&v);
    v.push(("deliver_get", dg));
    v.sort_by_key(|(k, _)| *k);
    v
}

/// The node's channel counters: every live channel's, and what closed channels left.
pub fn node_message_values(b: &Broker) -> Vec<(&'static str, u64)> {
    let total = ChannelStats::default();
    total.absorb(&b.retired);
    for v in b.vhosts() {
        total.absorb(&v.retired);
    }
    for c in open_connections(b) {
        for ch in c.channels() {
            total.absorb(&ch.stats);
        }
    }
    channel_values(&total)
}

fn queue_values(q: &QueueRef) -> Vec<(&'static str, u64)> {
    let mut v = q.stats().map(|s| s.values()).unwrap_or_default();
    let dg = deliver_get(&v);
    v.push(("deliver_get", dg));
    v.sort_by_key(|(k, _)| *k);
    v
}

fn exchange_values(x: &warren_routing::Exchange<QueueRef>) -> Vec<(&'static str, u64)> {
    vec![
        ("publish_in", x.stats.publish_in.get()),
        ("publish_out", x.stats.publish_out.get()),
    ]
}

/// Ready and unacked messages over every queue.
fn queue_totals(b: &Broker) -> Vec<(&'static str, u64)> {
    let (mut ready, mut unacked) = (0u64, 0u64);
    for v in b.vhosts() {
        for q in v.snapshot().queues.values() {
            ready += q.message_count() as u64;
            unacked += q.unacked_count() as u64;
        }
    }
    vec![
        ("messages", ready + unacked),
        ("messages_ready", ready),
        ("messages_unacknowledged", unacked),
    ]
}

fn queue_key(vhost: &str, name: &str) -> String {
    format!("q\0{vhost}\0{name}")
}

fn exchange_key(vhost: &str, name: &str) -> String {
    format!("x\0{vhost}\0{name}")
}

fn channel_key(conn: u64, ch: u16) -> String {
    format!("c\0{conn}\0{ch}")
}

fn connection_key(conn: u64) -> String {
    format!("n\0{conn}")
}

fn connection_octets(c: &ConnInfo) -> [u64; 2] {
    [c.recv_oct.load(Relaxed), c.outbox.sent_octets.load(Relaxed)]
}

/// Adds `recv_oct_details` and `send_oct_details` (rates) to a connection's JSON.
pub fn add_connection_rates(b: &Broker, c: &ConnInfo, row: &mut Value) {
    let rates = b.rates.rates(&connection_key(c.id), &connection_octets(c));
    row["recv_oct_details"] = json!({ "rate": rates[0] });
    row["send_oct_details"] = json!({ "rate": rates[1] });
}

/// `values` with their rates from the sample kept under `key`.
fn stats_json(b: &Broker, key: &str, values: &[(&'static str, u64)]) -> Value {
    let nums: Vec<u64> = values.iter().map(|(_, v)| *v).collect();
    with_details(values, &b.rates.rates(key, &nums))
}

/// The overview's `message_stats`, `queue_totals` (with rates) and `churn_rates`.
pub fn overview_stats(b: &Broker) -> (Value, Value, Value) {
    (
        stats_json(b, "overview", &node_message_values(b)),
        stats_json(b, "queue_totals", &queue_totals(b)),
        stats_json(b, "churn", &node_churn(b)),
    )
}

pub fn queue_message_stats(b: &Broker, q: &QueueRef) -> Value {
    stats_json(b, &queue_key(q.vhost(), q.name()), &queue_values(q))
}

pub fn exchange_message_stats(
    b: &Broker,
    vhost: &str,
    x: &warren_routing::Exchange<QueueRef>,
) -> Value {
    stats_json(b, &exchange_key(vhost, &x.name), &exchange_values(x))
}

/// Takes a sample of every object's counters, for the rates of the next reads.
pub fn sample(b: &Broker) {
    let mut objects = vec![
        ("overview".to_string(), nums(&node_message_values(b))),
        ("queue_totals".to_string(), nums(&queue_totals(b))),
        ("churn".to_string(), nums(&node_churn(b))),
    ];
    for v in b.vhosts() {
        let s = v.snapshot();
        for q in s.queues.values() {
            objects.push((queue_key(&v.name, q.name()), nums(&queue_values(q))));
        }
        for x in s.table.exchanges.values() {
            objects.push((exchange_key(&v.name, &x.name), nums(&exchange_values(x))));
        }
    }
    for c in open_connections(b) {
        objects.push((connection_key(c.id), connection_octets(&c).to_vec()));
        for ch in c.channels() {
            objects.push((channel_key(c.id, ch.id), nums(&channel_values(&ch.stats))));
        }
    }
    b.rates.sample(objects);
}

fn nums(values: &[(&'static str, u64)]) -> Vec<u64> {
    values.iter().map(|(_, v)| *v).collect()
}

/// Samples every [`SAMPLE_EVERY`] for as long as it runs (the binary runs it beside the AMQP
/// server, from its start until it has stopped).
pub async fn run_sampler(b: Arc<Broker>) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        sample(&b);
    }
}

// ---- /api/channels, /api/consumers ----

fn channel_json(
    b: &Broker,
    c: &ConnInfo,
    ch: &Arc<ChannelShared>,
    consumers_on: &HashMap<usize, u32>,
) -> Value {
    let (unacked, global_prefetch) = ch.unacked_and_global_prefetch();
    json!({
        "name": format!("{} ({})", c.name, ch.id),
        "number": ch.id,
        "node": &*c.node,
        "user": c.user,
        "user_who_performed_action": c.user,
        "vhost": c.vhost,
        "connection_details": {
            "name": c.name, "peer_host": c.peer.ip().to_string(), "peer_port": c.peer.port(),
        },
        "consumer_count": consumers_on.get(&addr(ch)).copied().unwrap_or(0),
        "messages_unacknowledged": unacked,
        "messages_unconfirmed": 0,
        "messages_uncommitted": 0,
        "acks_uncommitted": 0,
        "prefetch_count": ch.modes.prefetch_count.load(Relaxed),
        "global_prefetch_count": global_prefetch,
        "confirm": ch.modes.confirm.load(Relaxed),
        "transactional": ch.modes.transactional.load(Relaxed),
        "state": "running",
        "message_stats": stats_json(b, &channel_key(c.id, ch.id), &channel_values(&ch.stats)),
    })
}

/// Every open channel whose connection passes `keep`, in connection then channel order.
fn channels_where(b: &Broker, keep: impl Fn(&ConnInfo) -> bool) -> Vec<Value> {
    let on = consumers_by_channel(b);
    let mut rows = Vec::new();
    for c in open_connections(b).iter().filter(|c| keep(c)) {
        for ch in c.channels() {
            rows.push(channel_json(b, c, &ch, &on));
        }
    }
    rows
}

pub async fn list_channels(State(b): B, Query(p): Query<ListParams>) -> ApiResult {
    list_reply(Value::Array(channels_where(&b, |_| true)), &p)
}

pub async fn list_channels_in(
    State(b): B,
    Path(vhost): Path<String>,
    Query(p): Query<ListParams>,
) -> ApiResult {
    let v = vhost_of(&b, &vhost)?;
    list_reply(Value::Array(channels_where(&b, |c| c.vhost == *v.name)), &p)
}

pub async fn list_connection_channels(State(b): B, Path(name): Path<String>) -> ApiResult {
    if !b.connections.lock().values().any(|c| c.name == name) {
        return Err(not_found());
    }
    ok_json(Value::Array(channels_where(&b, |c| c.name == name)))
}

pub async fn get_channel(State(b): B, Path(name): Path<String>) -> ApiResult {
    let on = consumers_by_channel(&b);
    for c in open_connections(&b) {
        for ch in c.channels() {
            if format!("{} ({})", c.name, ch.id) == name {
                return ok_json(channel_json(&b, &c, &ch, &on));
            }
        }
    }
    Err(not_found())
}

/// A consumer as the listings show it.
pub struct Listed {
    pub vhost: Arc<VHost>,
    pub queue: QueueRef,
    pub consumer: Arc<Consumer>,
    pub active: bool,
    /// RabbitMQ's `activity_status`.
    pub status: &'static str,
}

/// Every consumer of `vhosts`: queues by name, each queue's consumers in dispatch order (with a
/// single active consumer, the first is the active one).
pub fn consumers_in(vhosts: Vec<Arc<VHost>>) -> Vec<Listed> {
    let mut out = Vec::new();
    for v in vhosts {
        let s = v.snapshot();
        let mut qs: Vec<_> = s.queues.values().collect();
        qs.sort_by(|a, b| a.name().cmp(b.name()));
        for q in qs {
            let single_active = q.options().args.single_active_consumer;
            for (i, c) in q.consumers().into_iter().enumerate() {
                let active = !single_active || i == 0;
                out.push(Listed {
                    vhost: v.clone(),
                    queue: q.clone(),
                    consumer: c,
                    active,
                    status: match (single_active, active) {
                        (false, _) => "up",
                        (true, true) => "single_active",
                        (true, false) => "waiting",
                    },
                });
            }
        }
    }
    out
}

/// Every consumer of the vhosts given, in RabbitMQ's shape.
fn consumers_of(b: &Broker, vhosts: Vec<Arc<VHost>>) -> Value {
    let mut by_channel: HashMap<usize, (Arc<ConnInfo>, u16)> = HashMap::new();
    for c in open_connections(b) {
        for ch in c.channels() {
            by_channel.insert(addr(&ch), (c.clone(), ch.id));
        }
    }
    let rows = consumers_in(vhosts)
        .into_iter()
        .map(|l| {
            let c = &l.consumer;
            let channel_details = match by_channel.get(&addr(&c.sink)) {
                Some((conn, number)) => json!({
                    "connection_name": conn.name,
                    "name": format!("{} ({number})", conn.name),
                    "node": &*conn.node,
                    "number": number,
                    "peer_host": conn.peer.ip().to_string(),
                    "peer_port": conn.peer.port(),
                    "user": conn.user,
                }),
                None => json!({}),
            };
            let mut arguments = serde_json::Map::new();
            if c.priority != 0 {
                arguments.insert("x-priority".into(), c.priority.into());
            }
            if let Some(t) = c.timeout_ms {
                arguments.insert("x-consumer-timeout".into(), t.into());
            }
            json!({
                "arguments": arguments,
                "ack_required": !c.no_ack,
                "active": l.active,
                "activity_status": l.status,
                "channel_details": channel_details,
                "consumer_tag": &*c.tag,
                "exclusive": c.exclusive,
                "prefetch_count": c.prefetch,
                "queue": {"name": &**l.queue.name(), "vhost": &*l.vhost.name},
            })
        })
        .collect();
    Value::Array(rows)
}

pub async fn list_consumers(State(b): B) -> ApiResult {
    ok_json(consumers_of(&b, b.vhosts()))
}

pub async fn list_consumers_in(State(b): B, Path(vhost): Path<String>) -> ApiResult {
    ok_json(consumers_of(&b, vec![vhost_of(&b, &vhost)?]))
}

// ---- Prometheus ----

/// One metric family in the text exposition format, as RabbitMQ prints it (TYPE, then HELP).
struct Prom {
    out: String,
}

impl Prom {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# TYPE {name} {kind}\n# HELP {name} {help}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }
}

/// A label value with `\`, `"` and newlines escaped, as the text format requires.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn value_of(values: &[(&'static str, u64)], key: &str) -> u64 {
    values
        .iter()
        .find(|(k, _)| *k == key)
        .map_or(0, |(_, v)| *v)
}

/// The channel counters RabbitMQ exports: (metric, our counter, help).
const CHANNEL_COUNTERS: &[(&str, &str, &str)] = &[
    ("rabbitmq_channel_messages_published_total", "publish", "Total number of messages published into an exchange on a channel"),
    ("rabbitmq_channel_messages_confirmed_total", "confirm", "Total number of messages published into an exchange and confirmed on the channel"),
    ("rabbitmq_channel_messages_unroutable_dropped_total", "drop_unroutable", "Total number of messages published as non-mandatory into an exchange and dropped as unroutable"),
    ("rabbitmq_channel_messages_unroutable_returned_total", "return_unroutable", "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable"),
    ("rabbitmq_channel_get_ack_total", "get", "Total number of messages fetched with basic.get in manual acknowledgement mode"),
    ("rabbitmq_channel_get_total", "get_no_ack", "Total number of messages fetched with basic.get in automatic acknowledgement mode"),
    ("rabbitmq_channel_messages_delivered_ack_total", "deliver", "Total number of messages delivered to consumers in manual acknowledgement mode"),
    ("rabbitmq_channel_messages_delivered_total", "deliver_no_ack", "Total number of messages delivered to consumers in automatic acknowledgement mode"),
    ("rabbitmq_channel_messages_redelivered_total", "redeliver", "Total number of messages redelivered to consumers"),
    ("rabbitmq_channel_messages_acked_total", "ack", "Total number of messages acknowledged by consumers"),
    ("rabbitmq_channel_get_empty_total", "get_empty", "Total number of times basic.get operations fetched no message"),
];

/// `/metrics` (aggregated: one unlabelled sample per family, as RabbitMQ's default endpoint)
/// or `/metrics/per-object` (queue families labelled `{vhost, queue}`, channel families
/// `{channel}`). Unlike RabbitMQ's, the channel counters include closed channels, so they never
/// go down and Prometheus's `rate()` sees no reset when a channel closes; and per object they
/// are per channel, not per channel and queue or channel and exchange as RabbitMQ keeps them:
/// those pairs would cost a lookup per message (docs/management.md).
fn render(b: &Broker, per_object: bool) -> String {
    let mut p = Prom {
        out: String::with_capacity(16 * 1024),
    };
    let version = &b.config.server_properties.version;
    p.family(
        "rabbitmq_build_info",
        "untyped",
        "RabbitMQ & Erlang/OTP version info",
    );
    p.sample(
        "rabbitmq_build_info",
        &[
            ("rabbitmq_version", version),
            ("prometheus_plugin_version", version),
            ("prometheus_client_version", "warren"),
            ("erlang_version", "none"),
            ("product", &b.config.server_properties.product),
        ],
        1,
    );
    p.family(
        "rabbitmq_identity_info",
        "untyped",
        "RabbitMQ node & cluster identity info",
    );
    p.sample(
        "rabbitmq_identity_info",
        &[
            ("rabbitmq_node", &b.config.node_name),
            ("rabbitmq_cluster", "warren"),
            ("rabbitmq_cluster_permanent_id", "warren"),
        ],
        1,
    );

    let conns = open_connections(b);
    let channels: u64 = conns.iter().map(|c| c.channels().len() as u64).sum();
    let vhosts = b.vhosts();
    let queues: Vec<(Arc<VHost>, QueueRef)> = vhosts
        .iter()
        .flat_map(|v| {
            let s = v.snapshot();
            s.queues
                .values()
                .map(|q| (v.clone(), q.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    let counts: Vec<(u64, u64, u64)> = queues
        .iter()
        .map(|(_, q)| {
            (
                q.message_count() as u64,
                q.unacked_count() as u64,
                q.consumer_count() as u64,
            )
        })
        .collect();
    p.one(
        "rabbitmq_connections",
        "gauge",
        "Connections currently open",
        conns.len(),
    );
    p.one(
        "rabbitmq_channels",
        "gauge",
        "Channels currently open",
        channels,
    );
    p.one(
        "rabbitmq_consumers",
        "gauge",
        "Consumers currently connected",
        counts.iter().map(|c| c.2).sum::<u64>(),
    );
    p.one("rabbitmq_queues", "gauge", "Queues available", queues.len());
    let churn = node_churn(b);
    for (metric, key, help) in [
        (
            "rabbitmq_connections_opened_total",
            "connection_created",
            "Total number of connections opened",
        ),
        (
            "rabbitmq_connections_closed_total",
            "connection_closed",
            "Total number of connections closed or terminated",
        ),
        (
            "rabbitmq_channels_opened_total",
            "channel_created",
            "Total number of channels opened",
        ),
        (
            "rabbitmq_channels_closed_total",
            "channel_closed",
            "Total number of channels closed",
        ),
        (
            "rabbitmq_queues_declared_total",
            "queue_declared",
            "Total number of queues declared",
        ),
        (
            "rabbitmq_queues_created_total",
            "queue_created",
            "Total number of queues created",
        ),
        (
            "rabbitmq_queues_deleted_total",
            "queue_deleted",
            "Total number of queues deleted",
        ),
    ] {
        p.one(metric, "counter", help, value_of(&churn, key));
    }

    // Queues.
    type QueueMetric = (
        &'static str,
        &'static str,
        &'static str,
        fn(&(u64, u64, u64)) -> u64,
    );
    let queue_gauges: [QueueMetric; 4] = [
        (
            "rabbitmq_queue_messages_ready",
            "gauge",
            "Messages ready to be delivered to consumers",
            |c| c.0,
        ),
        (
            "rabbitmq_queue_messages_unacked",
            "gauge",
            "Messages delivered to consumers but not yet acknowledged",
            |c| c.1,
        ),
        (
            "rabbitmq_queue_messages",
            "gauge",
            "Sum of ready and unacknowledged messages - total queue depth",
            |c| c.0 + c.1,
        ),
        (
            "rabbitmq_queue_consumers",
            "gauge",
            "Consumers on a queue",
            |c| c.2,
        ),
    ];
    for (metric, kind, help, f) in queue_gauges {
        p.family(metric, kind, help);
        if per_object {
            for ((v, q), c) in queues.iter().zip(&counts) {
                p.sample(metric, &[("vhost", &v.name), ("queue", q.name())], f(c));
            }
        } else {
            p.sample(metric, &[], counts.iter().map(f).sum::<u64>());
        }
    }
    p.family(
        "rabbitmq_queue_messages_published_total",
        "counter",
        "Total number of messages published to queues",
    );
    let published = |q: &QueueRef| q.stats().map_or(0, |s| s.publish.load(Relaxed));
    if per_object {
        for (v, q) in &queues {
            p.sample(
                "rabbitmq_queue_messages_published_total",
                &[("vhost", &v.name), ("queue", q.name())],
                published(q),
            );
        }
    } else {
        let n: u64 = queues.iter().map(|(_, q)| published(q)).sum();
        p.sample("rabbitmq_queue_messages_published_total", &[], n);
    }

    // Channels.
    let on = consumers_by_channel(b);
    let node = node_message_values(b);
    let live: Vec<(String, Arc<ChannelShared>)> = conns
        .iter()
        .flat_map(|c| {
            c.channels()
                .into_iter()
                .map(|ch| (c.channel_pid(ch.id), ch))
        })
        .collect();
    let per_channel: Vec<Vec<(&'static str, u64)>> = if per_object {
        live.iter()
            .map(|(_, ch)| channel_values(&ch.stats))
            .collect()
    } else {
        Vec::new()
    };
    for (metric, key, help) in CHANNEL_COUNTERS {
        p.family(metric, "counter", help);
        if per_object {
            for ((pid, _), v) in live.iter().zip(&per_channel) {
                p.sample(metric, &[("channel", pid)], value_of(v, key));
            }
        } else {
            p.sample(metric, &[], value_of(&node, key));
        }
    }
    p.family(
        "rabbitmq_channel_consumers",
        "gauge",
        "Consumers on a channel",
    );
    p.family(
        "rabbitmq_channel_messages_unacked",
        "gauge",
        "Delivered but not yet acknowledged messages",
    );
    p.family(
        "rabbitmq_channel_messages_unconfirmed",
        "gauge",
        "Published but not yet confirmed messages",
    );
    p.family(
        "rabbitmq_channel_prefetch",
        "gauge",
        "Total limit of unacknowledged messages for all consumers on a channel",
    );
    if per_object {
        for (pid, ch) in &live {
            let labels = [("channel", pid.as_str())];
            let (unacked, global_prefetch) = ch.unacked_and_global_prefetch();
            p.sample(
                "rabbitmq_channel_consumers",
                &labels,
                on.get(&addr(ch)).copied().unwrap_or(0),
            );
            p.sample("rabbitmq_channel_messages_unacked", &labels, unacked);
            p.sample("rabbitmq_channel_messages_unconfirmed", &labels, 0);
            p.sample("rabbitmq_channel_prefetch", &labels, global_prefetch);
        }
    } else {
        p.sample(
            "rabbitmq_channel_consumers",
            &[],
            on.values().map(|n| *n as u64).sum::<u64>(),
        );
        let (unacked, prefetch) = live.iter().fold((0, 0u64), |(u, p), (_, ch)| {
            let (n, g) = ch.unacked_and_global_prefetch();
            (u + n, p + u64::from(g))
        });
        p.sample("rabbitmq_channel_messages_unacked", &[], unacked);
        p.sample("rabbitmq_channel_messages_unconfirmed", &[], 0);
        p.sample("rabbitmq_channel_prefetch", &[], prefetch);
    }

    // The process, memory, disk and alarms.
    let (open_fds, max_fds) = file_descriptors();
    let (open_fds, max_fds) = (open_fds.unwrap_or(0), max_fds.unwrap_or(0));
    let rss = warren_broker::alarms::resident_bytes().unwrap_or(0);
    let thresholds = b.alarms.thresholds();
    let alarms = b.alarms.state();
    p.one(
        "rabbitmq_process_resident_memory_bytes",
        "gauge",
        "Memory used in bytes",
        rss,
    );
    p.one(
        "rabbitmq_resident_memory_limit_bytes",
        "gauge",
        "Memory high watermark in bytes",
        thresholds.memory_bytes,
    );
    p.one(
        "rabbitmq_disk_space_available_bytes",
        "gauge",
        "Disk space available in bytes",
        b.alarms.disk_free_bytes().unwrap_or(0),
    );
    p.one(
        "rabbitmq_disk_space_available_limit_bytes",
        "gauge",
        "Free disk space low watermark in bytes",
        thresholds.disk_free_bytes,
    );
    p.one(
        "rabbitmq_process_open_fds",
        "gauge",
        "Open file descriptors",
        open_fds,
    );
    p.one(
        "rabbitmq_process_max_fds",
        "gauge",
        "Open file descriptors limit",
        max_fds,
    );
    p.one(
        "rabbitmq_process_open_tcp_sockets",
        "gauge",
        "Open TCP sockets",
        conns.len(),
    );
    p.one(
        "rabbitmq_process_max_tcp_sockets",
        "gauge",
        "Open TCP sockets limit",
        max_fds,
    );
    if !per_object {
        p.one(
            "rabbitmq_alarms_memory_used_watermark",
            "untyped",
            "is 1 if VM memory watermark alarm is in effect",
            u8::from(alarms.memory),
        );
        p.one(
            "rabbitmq_alarms_free_disk_space_watermark",
            "untyped",
            "is 1 if free disk space watermark alarm is in effect",
            u8::from(alarms.disk),
        );
        p.one(
            "rabbitmq_alarms_file_descriptor_limit",
            "untyped",
            "is 1 if file descriptor limit alarm is in effect",
            0,
        );
    }
    p.out
}

fn prometheus_text(text: String) -> axum::response::Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

pub async fn metrics(State(b): State<Arc<Broker>>) -> axum::response::Response {
    prometheus_text(render(&b, false))
}

pub async fn metrics_per_object(State(b): State<Arc<Broker>>) -> axum::response::Response {
    prometheus_text(render(&b, true))
}
