//! Dynamic shovels, as RabbitMQ's `rabbitmq_shovel` runs them: a shovel is a runtime
//! parameter of component `shovel` (`params.rs` checks and reads it), and this node runs each
//! shovel it is to run (all of them on a single node; on a cluster, the one node that
//! rendezvous hashing picks among the members it can reach, so a shovel moves when its node
//! is lost; a node that reaches no majority of the members runs none). Each runs in a task of its own (`worker.rs`) that starts again after its
//! `reconnect-delay` when a connection fails, and deletes its parameter once its
//! `delete-after` is reached. A local end goes through the broker API (`local.rs`), a remote
//! one over AMQP 0-9-1 (`remote.rs`).

pub mod delivery;
pub mod local;
pub mod params;
pub mod props;
pub mod remote;
pub mod status;
pub mod uri;
pub mod worker;

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::task::JoinHandle;
use warren_broker::access::Component;
use warren_broker::server::Broker;

use crate::params::ShovelDef;
use crate::status::Status;
use crate::worker::{Ctx, Finished};

/// The runtime parameter component.
pub const COMPONENT: &str = "shovel";

/// How often the placement of shovels is checked again without a parameter change (a node
/// of the cluster lost or back).
const RECHECK: Duration = Duration::from_secs(2);

/// Checks a shovel's value when it is set.
struct ShovelComponent;

impl Component for ShovelComponent {
    fn validate(&self, _vhost: &str, name: &str, value: &Value) -> Result<(), Vec<String>> {
        params::validate(name, value)
    }
}

struct Running {
    value: Value,
    status: Arc<Mutex<Status>>,
    task: JoinHandle<()>,
}

/// The shovels this node runs.
pub struct Shovels {
    broker: Arc<Broker>,
    running: Mutex<HashMap<(String, String), Running>>,
}

impl Shovels {
    /// Registers the component (so shovel parameters can be set) and starts running them.
    /// Call before definitions are imported.
    pub fn start(broker: &Arc<Broker>) -> Arc<Shovels> {
        broker
            .access
            .register_component(COMPONENT, Arc::new(ShovelComponent));
        let s = Arc::new(Shovels {
            broker: broker.clone(),
            running: Mutex::new(HashMap::new()),
        });
        tokio::spawn(reconcile_on_changes(
            Arc::downgrade(&s),
            broker.access.parameters_changed(),
            RECHECK,
            |s: &Arc<Shovels>| s.reconcile(),
        ));
        s
    }

    /// Whether this node runs shovel `name` of `vhost`.
    fn runs_here(&self, vhost: &str, name: &str) -> bool {
        placed_here(&self.broker, &[vhost, name])
    }

    /// Starts the shovels this node is to run, stops those it is not (deleted, changed, or
    /// moved to another node).
    fn reconcile(self: &Arc<Self>) {
        let want: HashMap<(String, String), Value> = self
            .broker
            .access
            .parameters(Some(COMPONENT), None)
            .into_iter()
            .filter(|p| self.runs_here(&p.vhost, &p.name))
            .map(|p| ((p.vhost, p.name), p.value))
            .collect();
        let mut running = self.running.lock();
        running.retain(|key, r| {
            let keep = want.get(key) == Some(&r.value);
            if !keep {
                r.task.abort();
                tracing::info!(vhost = %key.0, shovel = %key.1, "shovel stopped");
            }
            keep
        });
        for (key, value) in want {
            if let std::collections::hash_map::Entry::Vacant(e) = running.entry(key) {
                let (vhost, name) = e.key().clone();
                e.insert(self.spawn(&vhost, &name, value));
            }
        }
    }

    fn spawn(self: &Arc<Self>, vhost: &str, name: &str, value: Value) -> Running {
        let status = Arc::new(Mutex::new(Status::default()));
        let ctx = Ctx {
            broker: self.broker.clone(),
            vhost: vhost.to_string(),
            name: name.to_string(),
            status: status.clone(),
        };
        let task = tokio::spawn(run_shovel(ctx, value.clone()));
        Running {
            value,
            status,
            task,
        }
    }

    /// `restart_shovel`: stops it and starts it again at once. False if this node does not
    /// run it.
    pub fn restart(self: &Arc<Self>, vhost: &str, name: &str) -> bool {
        let mut running = self.running.lock();
        let key = (vhost.to_string(), name.to_string());
        let Some(r) = running.remove(&key) else {
            return false;
        };
        r.task.abort();
        let fresh = self.spawn(vhost, name, r.value);
        running.insert(key, fresh);
        tracing::info!(vhost, shovel = name, "shovel restarted");
        true
    }

    /// The `/api/shovels` rows of the shovels this node runs, optionally one vhost's.
    pub fn status(&self, vhost: Option<&str>) -> Vec<Value> {
        let node = &self.broker.config.node_name;
        let mut rows: Vec<Value> = self
            .running
            .lock()
            .iter()
            .filter(|((v, _), _)| vhost.is_none_or(|x| x == v))
            .map(|((v, n), r)| r.status.lock().row(node, v, n, &r.value))
            .collect();
        rows.sort_by(|a, b| {
            (a["vhost"].as_str(), a["name"].as_str())
                .cmp(&(b["vhost"].as_str(), b["name"].as_str()))
        });
        rows
    }
}

/// Whether this node is the one to run the task named by `key` (a shovel, a federation link):
/// always on a single node; on a cluster, the member with the highest rendezvous hash of `key`
/// among those this node reaches, and none if it reaches no majority of the members.
pub fn placed_here(b: &Broker, key: &[&str]) -> bool {
    let Some(cluster) = warren_broker::cluster::Cluster::of(b) else {
        return true;
    };
    let me = b.config.node_name.clone();
    let live: Vec<String> = b
        .cluster_handle()
        .map(|h| h.links().into_iter().map(|(n, _)| n).collect())
        .unwrap_or_default();
    let members: Vec<String> = cluster.members().into_iter().map(|n| n.name).collect();
    let reachable: Vec<&String> = members
        .iter()
        .filter(|n| **n == me || live.contains(n))
        .collect();
    // A node cut off from most of its cluster runs none: the majority's side runs them.
    if reachable.len() * 2 <= members.len() {
        return false;
    }
    let weight = |node: &str| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (key, node).hash(&mut h);
        h.finish()
    };
    reachable
        .into_iter()
        .max_by_key(|n| (weight(n), (*n).clone()))
        .map(String::as_str)
        == Some(me.as_str())
}

/// Runs `reconcile` now, on every change of the runtime parameters or policies (`changed`),
/// and every `every`, for as long as `owner` lives: the supervisor loop of the shovels and of
/// the federation links.
pub async fn reconcile_on_changes<T>(
    owner: std::sync::Weak<T>,
    mut changed: tokio::sync::watch::Receiver<u64>,
    every: Duration,
    reconcile: impl Fn(&Arc<T>),
) {
    loop {
        let Some(s) = owner.upgrade() else {
            return;
        };
        reconcile(&s);
        drop(s);
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// One shovel for as long as this node runs it: runs, and after a failure waits its
/// `reconnect-delay` and runs again (a delay of 0 leaves it terminated, as in RabbitMQ).
async fn run_shovel(ctx: Ctx, value: Value) {
    let def = match ShovelDef::parse(&ctx.name, &value) {
        Ok(d) => d,
        Err(problems) => {
            // Checked when it was set; a value an older build accepted can still fail here.
            ctx.status.lock().terminated(problems.join("; "));
            return;
        }
    };
    tracing::info!(vhost = %ctx.vhost, shovel = %ctx.name, "shovel starting");
    loop {
        ctx.status.lock().starting();
        match worker::run(&ctx, &def).await {
            Ok(Finished::DeleteAfter) => {
                tracing::info!(vhost = %ctx.vhost, shovel = %ctx.name, "shovel finished (delete-after); deleting it");
                if let Err(e) = ctx
                    .broker
                    .access
                    .clear_parameter(COMPONENT, &ctx.vhost, &ctx.name)
                {
                    tracing::warn!(vhost = %ctx.vhost, shovel = %ctx.name, error = %e, "cannot delete the finished shovel");
                }
                return;
            }
            Err(reason) => {
                tracing::warn!(vhost = %ctx.vhost, shovel = %ctx.name, %reason, "shovel terminated");
                ctx.status.lock().terminated(reason);
                if def.reconnect_delay <= 0.0 {
                    return;
                }
                tokio::time::sleep(Duration::from_secs_f64(def.reconnect_delay)).await;
            }
        }
    }
}
