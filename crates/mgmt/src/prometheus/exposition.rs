//! The exposition's building blocks every part of the module shares: the text format writer
//! ([`Prom`]), what a scrape asked for ([`Scope`], [`Family`]), and what it reads of the
//! broker, once ([`Snapshot`]).

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;

use warren_broker::channel::ChannelShared;
use warren_broker::queue::QueueRef;
use warren_broker::server::Broker;
use warren_broker::tracking::ConnInfo;
use warren_broker::vhost::VHost;

use crate::stats_api::{addr, consumers_by_channel, open_connections};

/// The metric name prefix of `/metrics` and `/metrics/per-object`.
pub(crate) const PREFIX: &str = "rabbitmq_";
/// The prefix of `/metrics/detailed`, so it never clashes with `/metrics`.
pub(crate) const DETAILED_PREFIX: &str = "rabbitmq_detailed_";

/// Which endpoint is rendered, and for `/metrics/detailed` what it was asked for.
pub struct Scope {
    /// One sample per object (per-object and detailed) rather than per node.
    pub per_object: bool,
    /// `rabbitmq_` or `rabbitmq_detailed_`.
    pub(crate) prefix: &'static str,
    /// The families asked for; `None`: all (`/metrics`, `/metrics/per-object`).
    families: Option<BTreeSet<Family>>,
    /// `vhost=` of `/metrics/detailed`: only these vhosts' queues; `None`: every vhost.
    vhosts: Option<BTreeSet<String>>,
}

impl Scope {
    pub fn aggregated() -> Scope {
        Scope {
            per_object: false,
            prefix: PREFIX,
            families: None,
            vhosts: None,
        }
    }

    pub fn per_object() -> Scope {
        Scope {
            per_object: true,
            ..Scope::aggregated()
        }
    }

    /// `/metrics/detailed` from its query: `family` and `vhost`, each repeatable, as RabbitMQ
    /// takes them. A family RabbitMQ does not know, or any other parameter, is an error.
    pub fn detailed(query: &[(String, String)]) -> Result<Scope, String> {
        let mut families = BTreeSet::new();
        let mut vhosts = BTreeSet::new();
        for (k, v) in query {
            match k.as_str() {
                "family" => {
                    families.insert(Family::from_name(v).ok_or_else(|| {
                        format!(
                            "unknown metric family {v:?}; RabbitMQ's families are: {}",
                            Family::ALL
                                .iter()
                                .map(|f| f.name())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    })?);
                }
                "vhost" => {
                    vhosts.insert(v.clone());
                }
                other => {
                    return Err(format!(
                    "unknown query parameter {other:?}: /metrics/detailed takes family and vhost"
                ))
                }
            }
        }
        Ok(Scope {
            per_object: true,
            prefix: DETAILED_PREFIX,
            families: Some(families),
            vhosts: (!vhosts.is_empty()).then_some(vhosts),
        })
    }

    pub(crate) fn wants(&self, f: Family) -> bool {
        self.families.as_ref().is_none_or(|s| s.contains(&f))
    }

    pub(crate) fn is_detailed(&self) -> bool {
        self.families.is_some()
    }

    /// Whether a queue of `vhost` is shown.
    pub(crate) fn shows_vhost(&self, vhost: &str) -> bool {
        self.vhosts.as_ref().is_none_or(|s| s.contains(vhost))
    }
}

/// The text exposition format, as RabbitMQ prints it (TYPE, then HELP, then the samples).
pub struct Prom {
    pub(crate) out: String,
}

/// A sample's labels.
type Labels<'a> = &'a [(&'a str, &'a str)];

impl Prom {
    pub(crate) fn new() -> Prom {
        Prom {
            out: String::with_capacity(16 * 1024),
        }
    }

    /// A family's header; `name` has its prefix.
    pub(crate) fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# TYPE {name} {kind}\n# HELP {name} {help}");
    }

    pub(crate) fn sample(&mut self, name: &str, labels: Labels<'_>, value: impl std::fmt::Display) {
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

    /// A family with one unlabelled sample.
    pub(crate) fn one(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        value: impl std::fmt::Display,
    ) {
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

/// A group of families, by RabbitMQ's name for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    ConnectionChurn,
    NodeCoarse,
    Node,
    NodePersister,
    Ra,
    AuthAttempt,
    AuthAttemptDetailed,
    QueueCoarse,
    QueueConsumerCount,
    Queue,
    Channel,
    ChannelExchange,
    ChannelProcess,
    ChannelQueue,
    ConnectionCoarse,
    Connection,
    ChannelQueueExchange,
}

impl Family {
    /// Every group, in RabbitMQ's order.
    pub const ALL: [Family; 17] = [
        Family::ConnectionChurn,
        Family::NodeCoarse,
        Family::Node,
        Family::NodePersister,
        Family::Ra,
        Family::AuthAttempt,
        Family::AuthAttemptDetailed,
        Family::QueueCoarse,
        Family::QueueConsumerCount,
        Family::Queue,
        Family::Channel,
        Family::ChannelExchange,
        Family::ChannelProcess,
        Family::ChannelQueue,
        Family::ConnectionCoarse,
        Family::Connection,
        Family::ChannelQueueExchange,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Family::ConnectionChurn => "connection_churn_metrics",
            Family::NodeCoarse => "node_coarse_metrics",
            Family::Node => "node_metrics",
            Family::NodePersister => "node_persister_metrics",
            Family::Ra => "ra_metrics",
            Family::AuthAttempt => "auth_attempt_metrics",
            Family::AuthAttemptDetailed => "auth_attempt_detailed_metrics",
            Family::QueueCoarse => "queue_coarse_metrics",
            Family::QueueConsumerCount => "queue_consumer_count",
            Family::Queue => "queue_metrics",
            Family::Channel => "channel_metrics",
            Family::ChannelExchange => "channel_exchange_metrics",
            Family::ChannelProcess => "channel_process_metrics",
            Family::ChannelQueue => "channel_queue_metrics",
            Family::ConnectionCoarse => "connection_coarse_metrics",
            Family::Connection => "connection_metrics",
            Family::ChannelQueueExchange => "channel_queue_exchange_metrics",
        }
    }

    pub fn from_name(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// What one scrape reads of the broker, once.
pub struct Snapshot {
    pub conns: Vec<Arc<ConnInfo>>,
    /// Open channels with their pids, in connection then channel order.
    pub channels: Vec<(String, Arc<ChannelShared>)>,
    /// Every queue this node knows (hosted here or not; see `stats_api::hosted_here`).
    pub queues: Vec<(Arc<VHost>, QueueRef)>,
    /// Consumers per channel (by the channel's address).
    consumers_on: HashMap<usize, u32>,
}

impl Snapshot {
    pub fn take(b: &Broker) -> Snapshot {
        let conns = open_connections(b);
        let channels = conns
            .iter()
            .flat_map(|c| {
                c.channels()
                    .into_iter()
                    .map(|ch| (c.channel_pid(ch.id), ch))
            })
            .collect();
        let queues = b
            .vhosts()
            .into_iter()
            .flat_map(|v| {
                let s = v.snapshot();
                let mut qs: Vec<_> = s.queues.values().cloned().collect();
                qs.sort_by(|a, b| a.name().cmp(b.name()));
                qs.into_iter().map(move |q| (v.clone(), q))
            })
            .collect();
        Snapshot {
            conns,
            channels,
            queues,
            consumers_on: consumers_by_channel(b),
        }
    }

    pub(crate) fn consumers_of(&self, ch: &Arc<ChannelShared>) -> u32 {
        self.consumers_on.get(&addr(ch)).copied().unwrap_or(0)
    }

    /// Consumers on this node's channels (RabbitMQ counts a consumer where its channel is).
    pub fn channel_consumers(&self) -> u64 {
        self.channels
            .iter()
            .map(|(_, ch)| u64::from(self.consumers_of(ch)))
            .sum()
    }
}

pub fn value_of(values: &[(&'static str, u64)], key: &str) -> u64 {
    values
        .iter()
        .find(|(k, _)| *k == key)
        .map_or(0, |(_, v)| *v)
}
