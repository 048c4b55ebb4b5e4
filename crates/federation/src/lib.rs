//! Federation, as RabbitMQ's `rabbitmq_federation` runs it: upstreams and upstream sets are
//! runtime parameters (`federation-upstream`, `federation-upstream-set`, checked by
//! `params.rs`), a policy with `federation-upstream`, `federation-upstream-set` or
//! `federation-upstream-pattern` federates the exchanges and queues it matches, and this node
//! runs one link per federated exchange or queue and upstream that it is to run: an
//! exchange's placed as shovels are (`warren_shovel::placed_here`), a queue's where the queue
//! is. `exchange_link.rs` and `queue_link.rs` are the two kinds; `forward.rs` their shared
//! downstream half, `probe.rs` what the upstream says of itself. A link starts again after
//! its upstream's `reconnect-delay` when it fails.

mod ctx;
pub mod exchange_link;
mod forward;
pub mod params;
pub mod probe;
pub mod queue_link;
pub mod status;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Map, Value};
use tokio::task::JoinHandle;
use warren_broker::access::Component;
use warren_broker::queue::QueueRef;
use warren_broker::server::Broker;

pub use crate::ctx::{Kind, LinkCtx};
use crate::params::Upstream;
use crate::status::LinkStatus;

pub const UPSTREAM: &str = "federation-upstream";
pub const UPSTREAM_SET: &str = "federation-upstream-set";
pub const UPSTREAM_PATTERN: &str = "federation-upstream-pattern";
/// The policy keys that federate what they match.
const FEDERATES: [&str; 3] = [UPSTREAM, UPSTREAM_SET, UPSTREAM_PATTERN];

/// How often exchanges and policies are checked again without a parameter change.
const RECHECK: Duration = Duration::from_secs(2);

struct UpstreamComponent;

impl Component for UpstreamComponent {
    fn validate(&self, _vhost: &str, name: &str, value: &Value) -> Result<(), Vec<String>> {
        params::validate_upstream(name, value)
    }
}

struct SetComponent;

impl Component for SetComponent {
    fn validate(&self, _vhost: &str, name: &str, value: &Value) -> Result<(), Vec<String>> {
        params::validate_set(name, value)
    }
}

/// (vhost, what, its name, upstream name).
type Key = (String, Kind, String, String);

struct Running {
    upstream: Upstream,
    policy: String,
    status: Arc<Mutex<LinkStatus>>,
    task: JoinHandle<()>,
}

/// The federation links this node runs.
pub struct Federation {
    broker: Arc<Broker>,
    running: Mutex<HashMap<Key, Running>>,
}

/// The upstreams (name, a set entry's overrides) a policy's definition names: one
/// (`federation-upstream`), a set's or all (`federation-upstream-set`), or those whose names
/// match a pattern (`federation-upstream-pattern`), as RabbitMQ's `rabbit_federation_upstream`
/// reads them.
fn chosen(
    b: &Broker,
    vhost: &str,
    definition: &Map<String, Value>,
    upstreams: &HashMap<String, Value>,
) -> Vec<(String, Map<String, Value>)> {
    let every = |keep: &dyn Fn(&str) -> bool| {
        upstreams
            .keys()
            .filter(|u| keep(u))
            .map(|u| (u.clone(), Map::new()))
            .collect()
    };
    if let Some(u) = definition.get(UPSTREAM).and_then(Value::as_str) {
        vec![(u.to_string(), Map::new())]
    } else if let Some(set) = definition.get(UPSTREAM_SET).and_then(Value::as_str) {
        if set == "all" {
            return every(&|_| true);
        }
        b.access
            .parameter(UPSTREAM_SET, vhost, set)
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|e| {
                let o = e.as_object()?.clone();
                Some((o.get("upstream")?.as_str()?.to_string(), o))
            })
            .collect()
    } else if let Some(pattern) = definition.get(UPSTREAM_PATTERN).and_then(Value::as_str) {
        match regex::Regex::new(pattern) {
            Ok(re) => every(&|u| re.is_match(u)),
            Err(_) => Vec::new(),
        }
    } else {
        Vec::new()
    }
}

/// Whether this node runs a federated queue's links: where the queue's state is (a classic
/// queue's home; a replicated queue's leader), which is where it is known to be starving.
fn queue_runs_here(q: &QueueRef) -> bool {
    match q {
        QueueRef::Local(_) => true,
        QueueRef::Stream(_) => false,
        QueueRef::Other(_) => q.home().is_none() && q.leader().is_some(),
    }
}

impl Federation {
    /// Registers the components and starts running the links. Call before definitions are
    /// imported.
    pub fn start(broker: &Arc<Broker>) -> Arc<Federation> {
        broker
            .access
            .register_component(UPSTREAM, Arc::new(UpstreamComponent));
        broker
            .access
            .register_component(UPSTREAM_SET, Arc::new(SetComponent));
        let f = Arc::new(Federation {
            broker: broker.clone(),
            running: Mutex::new(HashMap::new()),
        });
        tokio::spawn(warren_shovel::reconcile_on_changes(
            Arc::downgrade(&f),
            broker.access.parameters_changed(),
            RECHECK,
            |f: &Arc<Federation>| f.reconcile(),
        ));
        f
    }

    /// The links the parameters and policies ask this node for now, by key: (upstream, policy
    /// name); and the keys of the links they ask for anywhere.
    fn wanted(&self) -> (HashMap<Key, (Upstream, String)>, HashSet<Key>) {
        let b = &self.broker;
        let mut out = HashMap::new();
        let mut anywhere = HashSet::new();
        for v in b.vhosts() {
            let vhost = v.name.to_string();
            let policies = b.access.policies_of(&vhost);
            // Matching every exchange and queue against the patterns is for vhosts where
            // federation is asked for at all (the highest-priority policy still decides for
            // each).
            if !policies
                .iter()
                .any(|p| FEDERATES.iter().any(|k| p.definition.contains_key(*k)))
            {
                continue;
            }
            let upstreams: HashMap<String, Value> = b
                .access
                .parameters(Some(UPSTREAM), Some(&vhost))
                .into_iter()
                .map(|p| (p.name, p.value))
                .collect();
            let snap = v.snapshot();
            let exchanges = snap
                .table
                .exchanges
                .iter()
                .filter(|(name, x)| !name.is_empty() && !name.starts_with("amq.") && !x.internal)
                .map(|(name, _)| (Kind::Exchange, name.to_string()));
            let queues = snap
                .queues
                .values()
                .filter(|q| queue_runs_here(q))
                .map(|q| (Kind::Queue, q.name().to_string()));
            for (kind, name) in exchanges.chain(queues).collect::<Vec<_>>() {
                let Some(p) =
                    warren_broker::policy::matching(&policies, &name, kind == Kind::Queue)
                else {
                    continue;
                };
                for (u, overrides) in chosen(b, &vhost, &p.definition, &upstreams) {
                    let Some(value) = upstreams.get(&u) else {
                        continue;
                    };
                    let key = (vhost.clone(), kind, name.clone(), u.clone());
                    anywhere.insert(key.clone());
                    // An exchange's links go to one node by its name; a queue's run where
                    // the queue is.
                    if kind == Kind::Exchange
                        && !warren_shovel::placed_here(b, &[&key.0, &key.2, &key.3])
                    {
                        continue;
                    }
                    match Upstream::read(&u, value, &overrides) {
                        Ok(up) => {
                            out.insert(key, (up, p.name.clone()));
                        }
                        Err(e) => {
                            tracing::warn!(vhost, %name, upstream = u, error = %e, "federation upstream unusable")
                        }
                    }
                }
            }
        }
        (out, anywhere)
    }

    fn reconcile(&self) {
        let (want, anywhere) = self.wanted();
        let mut running = self.running.lock();
        running.retain(|key, r| {
            let keep = want
                .get(key)
                .is_some_and(|(up, policy)| *up == r.upstream && *policy == r.policy);
            if !keep {
                r.task.abort();
                tracing::info!(vhost = %key.0, kind = key.1.as_str(), name = %key.2, upstream = %key.3, "federation link stopped");
                // Stopped for good (not moved to another node, not restarted with new
                // settings): what it made upstream goes, as RabbitMQ's link deletes it.
                let made = r.status.lock().made_upstream.take();
                if let Some((remote, queue, internal)) = made {
                    if !anywhere.contains(key) && !r.upstream.keep_resources {
                        tokio::spawn(async move {
                            if let Err(e) =
                                exchange_link::clean_up(&remote, &queue, &internal).await
                            {
                                tracing::warn!(%queue, error = %e, "federation link clean-up failed");
                            }
                        });
                    }
                }
            }
            keep
        });
        for (key, (up, policy)) in want {
            if let std::collections::hash_map::Entry::Vacant(e) = running.entry(key) {
                let (vhost, kind, name, _) = e.key().clone();
                let status = Arc::new(Mutex::new(LinkStatus::default()));
                let ctx = LinkCtx {
                    broker: self.broker.clone(),
                    vhost,
                    name,
                    policy: policy.clone(),
                    upstream: up.clone(),
                    status: status.clone(),
                };
                let task = tokio::spawn(run_link(ctx, kind));
                e.insert(Running {
                    upstream: up,
                    policy,
                    status,
                    task,
                });
            }
        }
    }

    /// The `/api/federation-links` rows of the links this node runs, optionally one vhost's.
    pub fn status(&self, vhost: Option<&str>) -> Vec<Value> {
        let node = &self.broker.config.node_name;
        let mut rows: Vec<(Key, Value)> = self
            .running
            .lock()
            .iter()
            .filter(|((v, ..), _)| vhost.is_none_or(|x| x == v))
            .map(|(k, r)| {
                let row = r.status.lock().row(node, &k.0, k.1.as_str(), &k.2, &k.3);
                (k.clone(), row)
            })
            .collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        rows.into_iter().map(|(_, v)| v).collect()
    }
}

/// One link for as long as this node runs it: after a failure, waits the upstream's
/// `reconnect-delay` and starts again.
async fn run_link(ctx: LinkCtx, kind: Kind) {
    let what = kind.as_str();
    tracing::info!(vhost = %ctx.vhost, kind = what, name = %ctx.name, upstream = %ctx.upstream.name, "federation link starting");
    let mut suffix = 'B';
    loop {
        ctx.status.lock().starting();
        let ran = match kind {
            Kind::Exchange => exchange_link::run(&ctx, &mut suffix).await,
            Kind::Queue => queue_link::run(&ctx).await,
        };
        if let Err(reason) = ran {
            tracing::warn!(vhost = %ctx.vhost, kind = what, name = %ctx.name, upstream = %ctx.upstream.name, %reason, "federation link failed");
            ctx.status.lock().failed(reason);
        }
        let delay = ctx.upstream.reconnect_delay.max(0.1);
        tokio::time::sleep(Duration::from_secs_f64(delay)).await;
    }
}
