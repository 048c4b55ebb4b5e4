//! Federation, as RabbitMQ's `rabbitmq_federation` runs it: upstreams and upstream sets are
//! runtime parameters (`federation-upstream`, `federation-upstream-set`, checked by
//! `params.rs`), a policy with `federation-upstream` or `federation-upstream-set` federates the
//! exchanges it matches, and this node runs one link (`link.rs`) per federated exchange and
//! upstream that it is to run (placed as shovels are: `warren_shovel::placed_here`). A link
//! starts again after its upstream's `reconnect-delay` when it fails. Federated queues are not
//! here yet (docs/design/federation.md).

pub mod link;
pub mod params;
pub mod status;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Map, Value};
use tokio::task::JoinHandle;
use warren_broker::access::Component;
use warren_broker::server::Broker;

use crate::link::LinkCtx;
use crate::params::Upstream;
use crate::status::LinkStatus;

pub const UPSTREAM: &str = "federation-upstream";
pub const UPSTREAM_SET: &str = "federation-upstream-set";

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

/// (vhost, exchange, upstream name).
type Key = (String, String, String);

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

    /// The links the parameters and policies ask for now, by key: (upstream, policy name).
    fn wanted(&self) -> HashMap<Key, (Upstream, String)> {
        let b = &self.broker;
        let mut out = HashMap::new();
        for v in b.vhosts() {
            let vhost = v.name.to_string();
            let policies = b.access.policies_of(&vhost);
            // Matching every exchange against the patterns is for vhosts where federation is
            // asked for at all (the highest-priority policy still decides for each exchange).
            if !policies.iter().any(|p| {
                p.definition.contains_key(UPSTREAM) || p.definition.contains_key(UPSTREAM_SET)
            }) {
                continue;
            }
            let upstreams: HashMap<String, Value> = b
                .access
                .parameters(Some(UPSTREAM), Some(&vhost))
                .into_iter()
                .map(|p| (p.name, p.value))
                .collect();
            let snap = v.snapshot();
            for (name, x) in snap.table.exchanges.iter() {
                if name.is_empty() || name.starts_with("amq.") || x.internal {
                    continue;
                }
                let Some(p) = warren_broker::policy::matching(&policies, name, false) else {
                    continue;
                };
                let chosen: Vec<(String, Map<String, Value>)> = if let Some(u) =
                    p.definition.get(UPSTREAM).and_then(Value::as_str)
                {
                    vec![(u.to_string(), Map::new())]
                } else if let Some(set) = p.definition.get(UPSTREAM_SET).and_then(Value::as_str) {
                    if set == "all" {
                        upstreams.keys().map(|u| (u.clone(), Map::new())).collect()
                    } else {
                        b.access
                            .parameter(UPSTREAM_SET, &vhost, set)
                            .and_then(|v| v.as_array().cloned())
                            .unwrap_or_default()
                            .into_iter()
                            .filter_map(|e| {
                                let o = e.as_object()?.clone();
                                Some((o.get("upstream")?.as_str()?.to_string(), o))
                            })
                            .collect()
                    }
                } else {
                    continue;
                };
                for (u, overrides) in chosen {
                    let Some(value) = upstreams.get(&u) else {
                        continue;
                    };
                    let key = (vhost.clone(), name.to_string(), u.clone());
                    if !warren_shovel::placed_here(b, &[&key.0, &key.1, &key.2]) {
                        continue;
                    }
                    match Upstream::read(&u, value, &overrides) {
                        Ok(up) => {
                            out.insert(key, (up, p.name.clone()));
                        }
                        Err(e) => {
                            tracing::warn!(vhost, exchange = %name, upstream = u, error = %e, "federation upstream unusable")
                        }
                    }
                }
            }
        }
        out
    }

    fn reconcile(&self) {
        let want = self.wanted();
        let mut running = self.running.lock();
        running.retain(|key, r| {
            let keep = want
                .get(key)
                .is_some_and(|(up, policy)| *up == r.upstream && *policy == r.policy);
            if !keep {
                r.task.abort();
                tracing::info!(vhost = %key.0, exchange = %key.1, upstream = %key.2, "federation link stopped");
            }
            keep
        });
        for (key, (up, policy)) in want {
            if let std::collections::hash_map::Entry::Vacant(e) = running.entry(key) {
                let (vhost, exchange, _) = e.key().clone();
                let status = Arc::new(Mutex::new(LinkStatus::default()));
                let ctx = LinkCtx {
                    broker: self.broker.clone(),
                    vhost,
                    exchange,
                    policy: policy.clone(),
                    upstream: up.clone(),
                    status: status.clone(),
                };
                let task = tokio::spawn(run_link(ctx));
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
            .filter(|((v, _, _), _)| vhost.is_none_or(|x| x == v))
            .map(|(k, r)| (k.clone(), r.status.lock().row(node, &k.0, &k.1, &k.2)))
            .collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        rows.into_iter().map(|(_, v)| v).collect()
    }
}

/// One link for as long as this node runs it: after a failure, waits the upstream's
/// `reconnect-delay` and starts again.
async fn run_link(ctx: LinkCtx) {
    tracing::info!(vhost = %ctx.vhost, exchange = %ctx.exchange, upstream = %ctx.upstream.name, "federation link starting");
    let mut suffix = 'B';
    loop {
        ctx.status.lock().starting();
        if let Err(reason) = link::run(&ctx, &mut suffix).await {
            tracing::warn!(vhost = %ctx.vhost, exchange = %ctx.exchange, upstream = %ctx.upstream.name, %reason, "federation link failed");
            ctx.status.lock().failed(reason);
        }
        let delay = ctx.upstream.reconnect_delay.max(0.1);
        tokio::time::sleep(Duration::from_secs_f64(delay)).await;
    }
}
