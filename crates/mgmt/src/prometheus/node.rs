//! The node's own series: `rabbitmq_build_info` and `rabbitmq_identity_info`, the totals
//! (connections, channels, consumers, queues), the node families of the core collector
//! (churn, process and limits), the `rabbitmq_global_*` counters and the alarms.

use std::sync::atomic::Ordering::Relaxed;

use warren_broker::metrics::PublishStats;
use warren_broker::node_status::{file_descriptors, node_churn};
use warren_broker::server::Broker;

use super::exposition::{value_of, Prom, Scope, Snapshot};
use crate::stats_api::{hosted_here, node_message_values};

/// `rabbitmq_build_info` (the RabbitMQ version Warren follows, as the UI reports it, and the
/// product and version the server properties announce) and `rabbitmq_identity_info`, which the
/// dashboards join every query on.
pub fn identity(b: &Broker, p: &mut Prom) {
    let sp = &b.config.server_properties;
    let compat = warren_broker::config::RABBITMQ_COMPAT_VERSION;
    let warren = env!("CARGO_PKG_VERSION");
    p.family(
        "rabbitmq_build_info",
        "untyped",
        "RabbitMQ & Erlang/OTP version info",
    );
    p.sample(
        "rabbitmq_build_info",
        &[
            ("product_name", &sp.product),
            ("product_version", &sp.version),
            ("rabbitmq_version", compat),
            ("prometheus_plugin_version", compat),
            ("prometheus_client_version", warren),
            ("erlang_version", "none"),
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
            ("rabbitmq_cluster", &b.cluster_name()),
        ],
        1,
    );
}

/// The totals RabbitMQ counts from its tables: connections and channels open on this node,
/// consumers on its channels, queues it hosts.
pub fn totals(b: &Broker, p: &mut Prom) {
    let s = Snapshot::take(b);
    let queues = s.queues.iter().filter(|(_, q)| hosted_here(q)).count();
    p.one(
        "rabbitmq_connections",
        "gauge",
        "Connections currently open",
        s.conns.len(),
    );
    p.one(
        "rabbitmq_channels",
        "gauge",
        "Channels currently open",
        s.channels.len(),
    );
    p.one(
        "rabbitmq_consumers",
        "gauge",
        "Consumers currently connected",
        s.channel_consumers(),
    );
    p.one("rabbitmq_queues", "gauge", "Queues available", queues);
}

/// `connection_churn_metrics`.
pub fn churn(b: &Broker, scope: &Scope, p: &mut Prom) {
    let churn = node_churn(b);
    for (name, key, help) in [
        (
            "connections_opened_total",
            "connection_created",
            "Total number of connections opened",
        ),
        (
            "connections_closed_total",
            "connection_closed",
            "Total number of connections closed or terminated",
        ),
        (
            "channels_opened_total",
            "channel_created",
            "Total number of channels opened",
        ),
        (
            "channels_closed_total",
            "channel_closed",
            "Total number of channels closed",
        ),
        (
            "queues_declared_total",
            "queue_declared",
            "Total number of queues declared",
        ),
        (
            "queues_created_total",
            "queue_created",
            "Total number of queues created",
        ),
        (
            "queues_deleted_total",
            "queue_deleted",
            "Total number of queues deleted",
        ),
    ] {
        p.one(
            &format!("{}{name}", scope.prefix),
            "counter",
            help,
            value_of(&churn, key),
        );
    }
}

/// `node_coarse_metrics` (what the node uses) and `node_metrics` (its limits); the Erlang VM's
/// (processes, garbage collection, schedulers) do not apply.
pub fn process(b: &Broker, scope: &Scope, coarse: bool, limits: bool, p: &mut Prom) {
    let (open_fds, max_fds) = file_descriptors();
    let (open_fds, max_fds) = (open_fds.unwrap_or(0), max_fds.unwrap_or(0));
    let thresholds = b.alarms.thresholds();
    let sockets = b.connections.lock().len();
    let pre = scope.prefix;
    if coarse {
        let rss = warren_broker::alarms::resident_bytes().unwrap_or(0);
        let disk = b.alarms.disk_free_bytes().unwrap_or(0);
        for (name, help, v) in [
            ("process_open_fds", "Open file descriptors", open_fds),
            (
                "process_open_tcp_sockets",
                "Open TCP sockets",
                sockets as u64,
            ),
            ("process_resident_memory_bytes", "Memory used in bytes", rss),
            (
                "disk_space_available_bytes",
                "Disk space available in bytes",
                disk,
            ),
        ] {
            p.one(&format!("{pre}{name}"), "gauge", help, v);
        }
    }
    if limits {
        let uptime = b.started_at.elapsed().as_secs_f64();
        for (name, help, v) in [
            (
                "process_max_fds",
                "Open file descriptors limit",
                max_fds as f64,
            ),
            (
                "process_max_tcp_sockets",
                "Open TCP sockets limit",
                max_fds as f64,
            ),
            (
                "resident_memory_limit_bytes",
                "Memory high watermark in bytes",
                thresholds.memory_bytes as f64,
            ),
            (
                "disk_space_available_limit_bytes",
                "Free disk space low watermark in bytes",
                thresholds.disk_free_bytes as f64,
            ),
            ("erlang_uptime_seconds", "Node uptime", uptime),
        ] {
            p.one(&format!("{pre}{name}"), "gauge", help, v);
        }
    }
}

/// The alarms, as `rabbitmq_prometheus`'s alarm collector reports them (on `/metrics` only).
pub fn alarms(b: &Broker, p: &mut Prom) {
    let alarms = b.alarms.state();
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

/// RabbitMQ's global counters (`rabbit_global_counters`), labelled `protocol="amqp091"`: the
/// node's totals since it started, closed channels included, so they only grow. RabbitMQ
/// splits the delivery counters by `queue_type` too; Warren counts them per channel only.
pub fn global_counters(b: &Broker, p: &mut Prom) {
    let node = node_message_values(b);
    let v = |k: &str| value_of(&node, k);
    let publish = PublishStats::default();
    publish.absorb(&b.retired_publish);
    for vh in b.vhosts() {
        publish.absorb(&vh.retired_publish);
    }
    let s = Snapshot::take(b);
    let mut publishers = 0u64;
    for (_, ch) in &s.channels {
        publish.absorb(&ch.publish_stats);
        publishers += u64::from(ch.stats.publish.load(Relaxed) > 0);
    }
    let protocol = [("protocol", "amqp091")];
    let counters: [(&str, &str, &str, u64); 16] = [
        ("messages_received_total", "counter", "Total number of messages received from publishers", v("publish")),
        ("messages_received_confirm_total", "counter", "Total number of messages received from publishers expecting confirmations", publish.received_confirm.load(Relaxed)),
        ("messages_routed_total", "counter", "Total number of messages routed to queues or streams", publish.routed.load(Relaxed)),
        ("messages_unroutable_dropped_total", "counter", "Total number of messages published as non-mandatory into an exchange and dropped as unroutable", v("drop_unroutable")),
        ("messages_unroutable_returned_total", "counter", "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable", v("return_unroutable")),
        ("messages_confirmed_total", "counter", "Total number of messages confirmed to publishers", v("confirm")),
        ("publishers", "gauge", "Current number of publishers", publishers),
        ("consumers", "gauge", "Current number of consumers", s.channel_consumers()),
        ("messages_delivered_total", "counter", "Total number of messages delivered to consumers", v("deliver_get")),
        ("messages_delivered_consume_manual_ack_total", "counter", "Total number of messages delivered to consumers using basic.consume with manual acknowledgment", v("deliver")),
        ("messages_delivered_consume_auto_ack_total", "counter", "Total number of messages delivered to consumers using basic.consume with automatic acknowledgment", v("deliver_no_ack")),
        ("messages_delivered_get_manual_ack_total", "counter", "Total number of messages delivered to consumers using basic.get with manual acknowledgment", v("get")),
        ("messages_delivered_get_auto_ack_total", "counter", "Total number of messages delivered to consumers using basic.get with automatic acknowledgment", v("get_no_ack")),
        ("messages_get_empty_total", "counter", "Total number of times basic.get operations fetched no message", v("get_empty")),
        ("messages_redelivered_total", "counter", "Total number of messages redelivered to consumers", v("redeliver")),
        ("messages_acknowledged_total", "counter", "Total number of messages acknowledged by consumers", v("ack")),
    ];
    for (name, kind, help, value) in counters {
        let name = format!("rabbitmq_global_{name}");
        p.family(&name, kind, help);
        p.sample(&name, &protocol, value);
    }
}
