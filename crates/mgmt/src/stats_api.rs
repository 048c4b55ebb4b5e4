//! What the management API reports of message flow: RabbitMQ's `message_stats` (with
//! `_details.rate`) on the overview, queues, exchanges and channels, the `/api/channels` and
//! `/api/consumers` listings, and the rate sampler (Prometheus' `/metrics` is in
//! `crate::prometheus`, which reads the node totals from here). Everything here reads counters
//! the message path keeps (the broker's `metrics.rs`); nothing here is on the message path.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use serde_json::{json, Value};
use warren_broker::channel::ChannelShared;
use warren_broker::metrics::{deliver_get, with_details, ChannelStats, SAMPLE_EVERY};
use warren_broker::node_status::node_churn;
use warren_broker::queue::{Consumer, QueueRef};
use warren_broker::server::Broker;
use warren_broker::tracking::ConnInfo;
use warren_broker::vhost::VHost;

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

/// Whether this node hosts `q`, as RabbitMQ's per-node figures count a queue: it runs it (a
/// classic queue, a stream) or leads its replicated group (a replicated queue's `home` is the
/// leader when that is another node, none when it is this one or is unknown yet).
pub fn hosted_here(q: &QueueRef) -> bool {
    match q {
        QueueRef::Local(_) | QueueRef::Stream(_) => true,
        QueueRef::Other(_) => q.home().is_none() && q.leader().is_some(),
    }
}

/// Ready and unacked messages over every queue this node hosts (the cluster's overview adds
/// up every node's).
fn queue_totals(b: &Broker) -> Vec<(&'static str, u64)> {
    let (mut ready, mut unacked) = (0u64, 0u64);
    for v in b.vhosts() {
        for q in v.snapshot().queues.values() {
            if b.cluster_handle().is_some() && !hosted_here(q) {
                continue;
            }
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

/// A connection in RabbitMQ's shape (`/api/connections`).
pub fn connection_json(c: &ConnInfo) -> Value {
    json!({
        "name": c.name, "node": &*c.node, "type": "network", "state": "running",
        "protocol": "AMQP 0-9-1", "auth_mechanism": "PLAIN",
        "user": c.user, "vhost": c.vhost,
        "host": c.local.ip().to_string(), "port": c.local.port(),
        "peer_host": c.peer.ip().to_string(), "peer_port": c.peer.port(),
        "connected_at": c.connected_at_ms, "channels": c.channels.load(Relaxed),
        "frame_max": c.frame_max.load(Relaxed), "timeout": c.heartbeat_s.load(Relaxed),
        "client_properties": c.client_properties_json(), "ssl": false,
        "recv_oct": c.recv_oct.load(Relaxed), "recv_cnt": c.recv_cnt.load(Relaxed),
        "send_oct": c.outbox.sent_octets.load(Relaxed),
        "send_cnt": c.outbox.writes.load(Relaxed),
    })
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
        "messages_unconfirmed": ch.confirms.unconfirmed(),
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

/// This node's channels, in connection then channel order.
pub fn channel_rows(b: &Broker) -> Vec<Value> {
    let on = consumers_by_channel(b);
    let mut rows = Vec::new();
    for c in open_connections(b) {
        for ch in c.channels() {
            rows.push(channel_json(b, &c, &ch, &on));
        }
    }
    rows
}

/// How many consumers this node's channels have (the overview's part of a node).
pub fn consumer_count(b: &Broker) -> usize {
    let on = consumers_by_channel(b);
    open_connections(b)
        .iter()
        .flat_map(|c| c.channels())
        .map(|ch| on.get(&addr(&ch)).copied().unwrap_or(0) as usize)
        .sum()
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

/// This node's consumers in RabbitMQ's shape; in a cluster, those whose channel is on this
/// node (a queue's home also holds stand-ins for other nodes' consumers).
pub fn consumer_rows(b: &Broker) -> Vec<Value> {
    let clustered = b.cluster_handle().is_some();
    let mut by_channel: HashMap<usize, (Arc<ConnInfo>, u16)> = HashMap::new();
    for c in open_connections(b) {
        for ch in c.channels() {
            by_channel.insert(addr(&ch), (c.clone(), ch.id));
        }
    }
    consumers_in(b.vhosts())
        .into_iter()
        .filter(|l| !clustered || by_channel.contains_key(&addr(&l.consumer.sink)))
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
        .collect()
}
