//! The metric families of RabbitMQ 3.10's core metrics collector, grouped as it groups them
//! (the names `/metrics/detailed?family=` takes), and what each reads here. A group whose
//! source Warren does not have (the Erlang process reductions, the persister's file handle
//! cache, authentication attempts) is known, so asking for it is no error, and renders
//! nothing (docs/prometheus.md says why for each).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use warren_broker::channel::ChannelShared;
use warren_broker::queue::QueueRef;
use warren_broker::replicated::{RaftLog, ReplicatedQueue};
use warren_broker::server::Broker;
use warren_broker::tracking::ConnInfo;

use super::exposition::{value_of, Family, Prom, Scope, Snapshot};
use super::node;
use crate::stats_api::{hosted_here, node_message_values};

/// One family: per object, one sample per row; aggregated, one sample of their sum.
fn series(
    p: &mut Prom,
    scope: &Scope,
    name: &str,
    kind: &str,
    help: &str,
    rows: Vec<(Vec<(&str, &str)>, f64)>,
) {
    let name = format!("{}{name}", scope.prefix);
    p.family(&name, kind, help);
    if scope.per_object {
        for (labels, v) in rows {
            p.sample(&name, &labels, v);
        }
    } else {
        p.sample(&name, &[], rows.iter().fold(0.0, |t, (_, v)| t + v));
    }
}

/// Every family `scope` wants, in RabbitMQ's order.
pub fn render(b: &Broker, scope: &Scope, p: &mut Prom) {
    let s = Snapshot::take(b);
    for f in Family::ALL {
        if !scope.wants(f) {
            continue;
        }
        match f {
            Family::ConnectionChurn => node::churn(b, scope, p),
            Family::NodeCoarse => node::process(b, scope, true, false, p),
            Family::Node => node::process(b, scope, false, true, p),
            Family::Ra => raft(&s, scope, p),
            Family::QueueCoarse => queue_coarse(&s, scope, p),
            // A subset of queue_metrics: one of the two (RabbitMQ's mutually_exclusive_mf).
            Family::QueueConsumerCount if !scope.wants(Family::Queue) => {
                queue_consumers(&s, scope, p)
            }
            Family::Queue => {
                queue_consumers(&s, scope, p);
                queue_memory(&s, scope, p);
            }
            Family::Channel => channel(&s, scope, p),
            Family::ChannelExchange | Family::ChannelQueue => channel_counters(b, &s, scope, f, p),
            Family::ConnectionCoarse | Family::Connection => connection(&s, scope, f, p),
            Family::ChannelQueueExchange => queue_published(&s, scope, p),
            Family::AuthAttempt => auth_attempts(b, scope, p),
            // No source in Warren (docs/prometheus.md).
            Family::QueueConsumerCount
            | Family::NodePersister
            | Family::AuthAttemptDetailed
            | Family::ChannelProcess => {}
        }
    }
}

/// `auth_attempt_metrics`: AMQP 0-9-1 logins on this node, labelled by protocol as RabbitMQ
/// labels them (on every endpoint).
fn auth_attempts(b: &Broker, scope: &Scope, p: &mut Prom) {
    let a = &b.auth_attempts;
    for (name, help, v) in [
        (
            "auth_attempts_total",
            "Total number of authorization attempts",
            &a.attempts,
        ),
        (
            "auth_attempts_succeeded_total",
            "Total number of successful authentication attempts",
            &a.succeeded,
        ),
        (
            "auth_attempts_failed_total",
            "Total number of failed authentication attempts",
            &a.failed,
        ),
    ] {
        let name = format!("{}{name}", scope.prefix);
        p.family(&name, "counter", help);
        p.sample(&name, &[("protocol", "amqp091")], v.load(Relaxed));
    }
}

/// The queues this node reports, in vhosts `scope` shows.
fn shown_queues<'a>(s: &'a Snapshot, scope: &'a Scope) -> impl Iterator<Item = &'a QueueRef> {
    s.queues
        .iter()
        .filter(|(v, q)| hosted_here(q) && scope.shows_vhost(&v.name))
        .map(|(_, q)| q)
}

fn queue_labels(q: &QueueRef) -> Vec<(&str, &str)> {
    vec![("vhost", &**q.vhost()), ("queue", &**q.name())]
}

fn queue_coarse(s: &Snapshot, scope: &Scope, p: &mut Prom) {
    let counts: Vec<(&QueueRef, f64, f64)> = shown_queues(s, scope)
        .map(|q| {
            (
                q,
                f64::from(q.message_count()),
                f64::from(q.unacked_count()),
            )
        })
        .collect();
    let rows = |f: fn(f64, f64) -> f64| {
        counts
            .iter()
            .map(|(q, r, u)| (queue_labels(q), f(*r, *u)))
            .collect()
    };
    series(
        p,
        scope,
        "queue_messages_ready",
        "gauge",
        "Messages ready to be delivered to consumers",
        rows(|r, _| r),
    );
    series(
        p,
        scope,
        "queue_messages_unacked",
        "gauge",
        "Messages delivered to consumers but not yet acknowledged",
        rows(|_, u| u),
    );
    series(
        p,
        scope,
        "queue_messages",
        "gauge",
        "Sum of ready and unacknowledged messages - total queue depth",
        rows(|r, u| r + u),
    );
}

fn queue_consumers(s: &Snapshot, scope: &Scope, p: &mut Prom) {
    let rows = shown_queues(s, scope)
        .map(|q| (queue_labels(q), f64::from(q.consumer_count())))
        .collect();
    series(
        p,
        scope,
        "queue_consumers",
        "gauge",
        "Consumers on a queue",
        rows,
    );
}

/// What a classic queue holds in memory and on disk: its ready messages' bytes and those paged
/// out. A quorum queue's or a stream's messages are in its log: these do not apply to them.
fn queue_memory(s: &Snapshot, scope: &Scope, p: &mut Prom) {
    let classic: Vec<(&QueueRef, u64, u32, u32)> = shown_queues(s, scope)
        .filter_map(|q| {
            let local = q.local()?;
            let (bytes, paged) = local.ready_bytes_and_paged();
            Some((q, bytes, paged, q.message_count()))
        })
        .collect();
    let rows = |f: fn(u64, u32, u32) -> f64| {
        classic
            .iter()
            .map(|(q, b, pg, r)| (queue_labels(q), f(*b, *pg, *r)))
            .collect()
    };
    series(
        p,
        scope,
        "queue_messages_ready_bytes",
        "gauge",
        "Size in bytes of ready messages",
        rows(|b, _, _| b as f64),
    );
    series(
        p,
        scope,
        "queue_messages_ready_ram",
        "gauge",
        "Ready messages stored in memory",
        rows(|_, pg, r| f64::from(r.saturating_sub(pg))),
    );
    series(
        p,
        scope,
        "queue_messages_paged_out",
        "gauge",
        "Messages paged out to disk",
        rows(|_, pg, _| f64::from(pg)),
    );
}

/// `channel_queue_exchange_metrics`: messages published to each queue (RabbitMQ keeps it per
/// channel, queue and exchange; Warren per queue: a classic queue or stream counts a publish
/// under its lock, a replicated queue's machine as it applies it).
fn queue_published(s: &Snapshot, scope: &Scope, p: &mut Prom) {
    let published = |q: &QueueRef| q.stats().map(|st| st.publish.load(Relaxed));
    let rows = shown_queues(s, scope)
        .filter_map(|q| Some((queue_labels(q), published(q)? as f64)))
        .collect();
    series(
        p,
        scope,
        "queue_messages_published_total",
        "counter",
        "Total number of messages published to queues",
        rows,
    );
}

/// `ra_metrics`: each replicated queue this node is a member of (leader or follower), from its
/// group's openraft metrics. Aggregated, RabbitMQ sums them and averages the latency.
fn raft(s: &Snapshot, scope: &Scope, p: &mut Prom) {
    let members: Vec<(&QueueRef, RaftLog)> = s
        .queues
        .iter()
        .filter(|(v, _)| scope.shows_vhost(&v.name))
        .filter_map(|(_, q)| Some((q, q.downcast::<ReplicatedQueue>()?.raft_log()?)))
        .collect();
    let rows = |f: fn(&RaftLog) -> f64| {
        members
            .iter()
            .map(|(q, l)| (queue_labels(q), f(l)))
            .collect()
    };
    series(
        p,
        scope,
        "raft_term_total",
        "counter",
        "Current Raft term number",
        rows(|l| l.term as f64),
    );
    series(
        p,
        scope,
        "raft_log_snapshot_index",
        "gauge",
        "Raft log snapshot index",
        rows(|l| l.snapshot as f64),
    );
    series(
        p,
        scope,
        "raft_log_last_applied_index",
        "gauge",
        "Raft log last applied index",
        rows(|l| l.last_applied as f64),
    );
    series(
        p,
        scope,
        "raft_log_commit_index",
        "gauge",
        "Raft log commit index",
        rows(|l| l.committed as f64),
    );
    series(
        p,
        scope,
        "raft_log_last_written_index",
        "gauge",
        "Raft log last written index",
        rows(|l| l.last_written as f64),
    );
    // Measured where an entry is appended, on the leader: a follower has no sample.
    let latency: Vec<_> = members
        .iter()
        .filter(|(_, l)| l.commit_latency_us > 0)
        .map(|(q, l)| (queue_labels(q), l.commit_latency_us as f64 / 1e6))
        .collect();
    let name = format!("{}raft_entry_commit_latency_seconds", scope.prefix);
    p.family(&name, "gauge", "Time taken for a log entry to be committed");
    if scope.per_object {
        for (labels, v) in &latency {
            p.sample(&name, labels, v);
        }
    } else {
        let n = latency.len().max(1) as f64;
        p.sample(&name, &[], latency.iter().fold(0.0, |t, (_, v)| t + v) / n);
    }
}

fn channel(s: &Snapshot, scope: &Scope, p: &mut Prom) {
    type Read = fn(&Snapshot, &Arc<ChannelShared>) -> f64;
    let gauges: [(&str, &str, Read); 5] = [
        ("channel_consumers", "Consumers on a channel", |s, ch| {
            f64::from(s.consumers_of(ch))
        }),
        (
            "channel_messages_unacked",
            "Delivered but not yet acknowledged messages",
            |_, ch| ch.unacked_and_global_prefetch().0 as f64,
        ),
        (
            "channel_messages_unconfirmed",
            "Published but not yet confirmed messages",
            |_, ch| ch.confirms.unconfirmed() as f64,
        ),
        (
            "consumer_prefetch",
            "Limit of unacknowledged messages for each consumer",
            |_, ch| f64::from(ch.modes.prefetch_count.load(Relaxed)),
        ),
        (
            "channel_prefetch",
            "Total limit of unacknowledged messages for all consumers on a channel",
            |_, ch| f64::from(ch.unacked_and_global_prefetch().1),
        ),
    ];
    for (name, help, read) in gauges {
        let rows = s
            .channels
            .iter()
            .map(|(pid, ch)| (vec![("channel", pid.as_str())], read(s, ch)))
            .collect();
        series(p, scope, name, "gauge", help, rows);
    }
}

/// `channel_exchange_metrics` and `channel_queue_metrics`: (metric, counter, help).
const CHANNEL_EXCHANGE: &[(&str, &str, &str)] = &[
    ("channel_messages_published_total", "publish", "Total number of messages published into an exchange on a channel"),
    ("channel_messages_confirmed_total", "confirm", "Total number of messages published into an exchange and confirmed on the channel"),
    ("channel_messages_unroutable_returned_total", "return_unroutable", "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable"),
    ("channel_messages_unroutable_dropped_total", "drop_unroutable", "Total number of messages published as non-mandatory into an exchange and dropped as unroutable"),
];
const CHANNEL_QUEUE: &[(&str, &str, &str)] = &[
    (
        "channel_get_ack_total",
        "get",
        "Total number of messages fetched with basic.get in manual acknowledgement mode",
    ),
    (
        "channel_get_total",
        "get_no_ack",
        "Total number of messages fetched with basic.get in automatic acknowledgement mode",
    ),
    (
        "channel_messages_delivered_ack_total",
        "deliver",
        "Total number of messages delivered to consumers in manual acknowledgement mode",
    ),
    (
        "channel_messages_delivered_total",
        "deliver_no_ack",
        "Total number of messages delivered to consumers in automatic acknowledgement mode",
    ),
    (
        "channel_messages_redelivered_total",
        "redeliver",
        "Total number of messages redelivered to consumers",
    ),
    (
        "channel_messages_acked_total",
        "ack",
        "Total number of messages acknowledged by consumers",
    ),
    (
        "channel_get_empty_total",
        "get_empty",
        "Total number of times basic.get operations fetched no message",
    ),
];

/// The channel counters. Aggregated they are the node's totals, closed channels included, so
/// they never go down (RabbitMQ's sum only live channels, and drop when one closes).
fn channel_counters(b: &Broker, s: &Snapshot, scope: &Scope, f: Family, p: &mut Prom) {
    let table = match f {
        Family::ChannelExchange => CHANNEL_EXCHANGE,
        _ => CHANNEL_QUEUE,
    };
    let per_channel: Vec<(&str, Vec<(&'static str, u64)>)> = if scope.per_object {
        s.channels
            .iter()
            .map(|(pid, ch)| (pid.as_str(), ch.stats.values()))
            .collect()
    } else {
        Vec::new()
    };
    let node = (!scope.per_object).then(|| node_message_values(b));
    for (name, key, help) in table {
        let name = format!("{}{name}", scope.prefix);
        p.family(&name, "counter", help);
        match &node {
            Some(node) => p.sample(&name, &[], value_of(node, key)),
            None => {
                for (pid, values) in &per_channel {
                    p.sample(&name, &[("channel", pid)], value_of(values, key));
                }
            }
        }
    }
}

/// `connection_coarse_metrics` and `connection_metrics`, labelled as RabbitMQ labels a
/// connection's process: `channel="<pid>"`.
fn connection(s: &Snapshot, scope: &Scope, f: Family, p: &mut Prom) {
    type Read = fn(&ConnInfo) -> f64;
    let coarse: [(&str, &str, &str, Read); 2] = [
        (
            "connection_incoming_bytes_total",
            "counter",
            "Total number of bytes received on a connection",
            |c| c.recv_oct.load(Relaxed) as f64,
        ),
        (
            "connection_outgoing_bytes_total",
            "counter",
            "Total number of bytes sent on a connection",
            |c| c.outbox.sent_octets.load(Relaxed) as f64,
        ),
    ];
    let metrics: [(&str, &str, &str, Read); 2] = [
        (
            "connection_incoming_packets_total",
            "counter",
            "Total number of packets received on a connection",
            |c| c.recv_cnt.load(Relaxed) as f64,
        ),
        (
            "connection_channels",
            "gauge",
            "Channels on a connection",
            |c| c.channels().len() as f64,
        ),
    ];
    let table = match f {
        Family::ConnectionCoarse => coarse,
        _ => metrics,
    };
    let pids: Vec<String> = s.conns.iter().map(|c| c.pid()).collect();
    for (name, kind, help, read) in table {
        let rows = s
            .conns
            .iter()
            .zip(&pids)
            .map(|(c, pid)| (vec![("channel", pid.as_str())], read(c)))
            .collect();
        series(p, scope, name, kind, help, rows);
    }
}
