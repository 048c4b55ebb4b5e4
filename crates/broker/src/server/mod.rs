//! The broker: configuration, users, vhosts, and the accept loop with graceful shutdown.
//! `apply`: the definitions command applied on this node (a cluster's committed entries, a
//! single node's changes).

pub mod apply;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::access::{Access, LimitScope, MgmtError, PolicyDef, VhostDef};
use crate::alarms::{Alarms, Thresholds};
use crate::auth::Users;
use crate::config::Config;
use crate::definitions::op::{Applying, DefOp};
use crate::definitions::proposer::Proposer;
use crate::persist::Persister;
use crate::tracking::ConnInfo;
use crate::vhost::{ClusterNode, Storage, VHost};

pub struct Broker {
    pub config: Config,
    pub users: Users,
    /// Users, permissions and policies (also reachable as `users.access`).
    pub access: Arc<Access>,
    vhosts: parking_lot::RwLock<HashMap<String, Arc<VHost>>>,
    /// Open connections, for the management API and forced closes.
    pub connections: parking_lot::Mutex<HashMap<u64, Arc<ConnInfo>>>,
    next_connection_id: AtomicU64,
    pub persister: Arc<Persister>,
    pub alarms: Arc<Alarms>,
    /// Connection and queue limits (node, per vhost, per user).
    pub admission: Arc<crate::admission::Admission>,
    /// Whether AMQP is served (stop_app / start_app).
    pub app: App,
    /// For status's uptime.
    pub started_at: std::time::Instant,
    /// Connections and channels opened and closed; the counts of deleted vhosts.
    pub churn: crate::metrics::Churn,
    /// Closed channels' counts of deleted vhosts (live vhosts keep their own).
    pub retired: crate::metrics::ChannelStats,
    /// The same for their [`crate::metrics::PublishStats`].
    pub retired_publish: crate::metrics::PublishStats,
    /// Authentication attempts (Prometheus' `rabbitmq_auth_attempts_*`).
    pub auth_attempts: crate::metrics::AuthAttempts,
    /// Samples for the management API's rates.
    pub rates: crate::metrics::Rates,
    /// Set when this node runs in a cluster (`[cluster]`).
    cluster: std::sync::OnceLock<Clustered>,
    /// Where a change of the definitions asked for on this node goes: the cluster, or a single
    /// node's [`apply::LocalApplier`]. The vhosts and the access registry hold it too.
    proposer: std::sync::OnceLock<Arc<dyn Proposer>>,
    /// What this node answers another node's management question with (set by the management
    /// layer above; `cluster/`'s `SERVICE_VIEW` asks it).
    local_view: std::sync::OnceLock<Arc<dyn LocalView>>,
}

/// This node's part of a cluster-wide management listing (its connections, channels,
/// consumers, the figures of the queues it runs): the management layer implements it, so a
/// peer's question (`cluster/`'s `SERVICE_VIEW`) is answered without the broker knowing the
/// listing's shape. The request and the answer are opaque bytes to the layers below.
pub trait LocalView: Send + Sync {
    fn answer(&self, b: &Broker, request: &[u8]) -> Result<Vec<u8>, String>;
}

impl Broker {
    /// Opens the data directory (recovering durable definitions and messages) and builds the
    /// broker. Vhost `v` lives in `<data_dir>/vhosts/<hex of v>`.
    pub fn new(config: Config) -> std::io::Result<Arc<Broker>> {
        // A cluster node's users, vhosts and definitions are the Raft log's, replayed once the
        // cluster starts (`cluster::Cluster::start`); nothing is read from the local files.
        let clustered = config.cluster.is_some();
        let access = Arc::new(if clustered {
            std::fs::create_dir_all(&config.data_dir)?;
            Access::from_file(Default::default(), None).map_err(std::io::Error::other)?
        } else {
            Access::open(&config)?
        });
        let users = Users::new(access.clone(), config.loopback_users.clone());
        let persister = Persister::start();
        let mut vhosts = HashMap::new();
        for v in access.vhost_names() {
            let vh = VHost::open(&v, Self::storage(&config, &persister, &v))?;
            vhosts.insert(v, vh);
        }
        let admission = crate::admission::Admission::new(&config.limits, access.clone());
        let first_connection_id = 1 + config.connection_id_base();
        let alarms = Alarms::new(
            Thresholds::from_limits(&config.limits),
            config.data_dir.clone(),
        );
        let b = Arc::new(Broker {
            config,
            users,
            access,
            vhosts: parking_lot::RwLock::new(vhosts),
            connections: parking_lot::Mutex::new(HashMap::new()),
            next_connection_id: AtomicU64::new(first_connection_id),
            persister,
            alarms,
            admission,
            app: App::default(),
            started_at: std::time::Instant::now(),
            churn: Default::default(),
            retired: Default::default(),
            retired_publish: Default::default(),
            auth_attempts: Default::default(),
            rates: Default::default(),
            cluster: std::sync::OnceLock::new(),
            proposer: std::sync::OnceLock::new(),
            local_view: std::sync::OnceLock::new(),
        });
        if !clustered {
            // Recovered: from now on each change is applied through the one applier.
            let local: Arc<dyn Proposer> = Arc::new(apply::LocalApplier(Arc::downgrade(&b)));
            let _ = b.proposer.set(local.clone());
            b.access.set_proposer(local.clone());
            for v in b.vhosts() {
                v.set_proposer(local.clone());
            }
        }
        for v in b.vhosts() {
            v.set_max_queues(b.admission.max_queues(&v.name));
        }
        for v in b.vhosts() {
            b.apply_policies(&v);
        }
        Ok(b)
    }

    /// Re-evaluates every queue and exchange of `vhost` against its policies (after a policy
    /// change, or at boot).
    pub fn apply_policies(&self, vhost: &VHost) {
        vhost.apply_policies(self.access.policies_of(&vhost.name));
    }

    /// Validates, stores and applies a policy.
    pub fn put_policy(&self, p: PolicyDef) -> Result<(), MgmtError> {
        self.put_policy_at(p, None)
    }

    /// [`Broker::put_policy`], or (`at`) the policy a committed entry carries.
    pub fn put_policy_at(&self, p: PolicyDef, at: Option<Applying>) -> Result<(), MgmtError> {
        crate::policy::validate(&p).map_err(MgmtError::BadRequest)?;
        let (vhost, name) = (p.vhost.clone(), p.name.clone());
        self.access.put_policy_at(p, at)?;
        tracing::info!(vhost = %vhost, policy = %name, "policy set");
        if let Some(v) = self.vhost(&vhost) {
            self.apply_policies(&v);
        }
        Ok(())
    }

    pub fn delete_policy(&self, vhost: &str, name: &str) -> Result<(), MgmtError> {
        self.delete_policy_at(vhost, name, None)
    }

    /// [`Broker::delete_policy`], or (`at`) the deletion a committed entry carries.
    pub fn delete_policy_at(
        &self,
        vhost: &str,
        name: &str,
        at: Option<Applying>,
    ) -> Result<(), MgmtError> {
        self.access.delete_policy_at(vhost, name, at)?;
        tracing::info!(vhost, policy = name, "policy cleared");
        if let Some(v) = self.vhost(vhost) {
            self.apply_policies(&v);
        }
        Ok(())
    }

    /// Vhost `v` lives in `<data_dir>/vhosts/<hex of v>`.
    fn vhost_dir(config: &Config, v: &str) -> std::path::PathBuf {
        let hex: String = v.bytes().map(|b| format!("{b:02x}")).collect();
        config.data_dir.join("vhosts").join(if hex.is_empty() {
            "00".to_string()
        } else {
            hex
        })
    }

    fn storage(config: &Config, persister: &Arc<Persister>, v: &str) -> Storage {
        Storage {
            dir: Self::vhost_dir(config, v),
            persister: persister.clone(),
            quorum_on_machine: Some(config.node_name.clone()),
        }
    }

    /// Joins the cluster `c` (`cluster/` calls it once at boot).
    pub fn set_cluster<C: ClusterNode + ClusterHandle + 'static>(&self, c: Arc<C>) {
        self.access.set_proposer(c.clone());
        let _ = self.proposer.set(c.clone());
        let _ = self.cluster.set(Clustered {
            node: c.clone(),
            handle: c,
        });
    }

    /// The cluster as the vhosts use it, when this node runs in one.
    pub fn cluster_node(&self) -> Option<&Arc<dyn ClusterNode>> {
        self.cluster.get().map(|c| &c.node)
    }

    /// The cluster as the node object and the layers above see it (`cluster::Cluster::of`).
    pub fn cluster_handle(&self) -> Option<&Arc<dyn ClusterHandle>> {
        self.cluster.get().map(|c| &c.handle)
    }

    /// What to propose a change through (the cluster, or the single node's applier), unless
    /// this is a change being applied (`at`).
    fn proposer(&self, at: Option<Applying>) -> Option<&dyn Proposer> {
        self.proposer.get().filter(|_| at.is_none()).map(|p| &**p)
    }

    pub fn vhost(&self, name: &str) -> Option<Arc<VHost>> {
        self.vhosts.read().get(name).cloned()
    }

    /// Every vhost, sorted by name.
    pub fn vhosts(&self) -> Vec<Arc<VHost>> {
        let mut v: Vec<_> = self.vhosts.read().values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Creates a vhost (a no-op if it exists); true if it is new.
    pub fn add_vhost(&self, def: VhostDef) -> Result<bool, MgmtError> {
        self.add_vhost_at(def, None)
    }

    /// [`Broker::add_vhost`], or (`at`) the one a committed entry carries.
    pub fn add_vhost_at(&self, def: VhostDef, at: Option<Applying>) -> Result<bool, MgmtError> {
        let name = def.name.clone();
        if name.is_empty() {
            return Err(MgmtError::BadRequest("vhost name must not be empty".into()));
        }
        if let Some(c) = self.proposer(at) {
            let new = self.vhost(&name).is_none();
            c.mgmt_change(DefOp::AddVhost(def))?;
            return Ok(new);
        }
        let mut map = self.vhosts.write();
        if map.contains_key(&name) {
            self.access.add_vhost(def)?;
            return Ok(false);
        }
        let vh = match self.cluster_node() {
            Some(c) => VHost::clustered(
                &name,
                Self::storage(&self.config, &self.persister, &name),
                c.clone(),
            ),
            None => VHost::open(&name, Self::storage(&self.config, &self.persister, &name)),
        }
        .map_err(|e| MgmtError::BadRequest(format!("cannot create vhost '{name}': {e}")))?;
        vh.set_max_queues(self.admission.max_queues(&name));
        if let (None, Some(p)) = (self.cluster_node(), self.proposer.get()) {
            vh.set_proposer(p.clone());
        }
        // Recorded before it serves anyone: a vhost access.json cannot keep is not created.
        if let Err(e) = self.access.add_vhost(def) {
            drop(vh);
            let _ = std::fs::remove_dir_all(Self::vhost_dir(&self.config, &name));
            return Err(e);
        }
        map.insert(name.clone(), vh);
        drop(map);
        tracing::info!(vhost = %name, "vhost created");
        Ok(true)
    }

    /// Applies a change of vhost or user `name`'s runtime limits (made in `access`): a vhost's
    /// queue limit is cached by the vhost. Connection and channel limits are read at each check.
    pub fn limits_changed(&self, scope: LimitScope, name: &str) {
        if let (LimitScope::Vhost, Some(v)) = (scope, self.vhost(name)) {
            v.set_max_queues(self.admission.max_queues(name));
        }
    }

    /// Deletes a vhost: its connections are closed (320), its queues and exchanges deleted with
    /// their stored messages, its permissions and policies forgotten.
    pub fn delete_vhost(&self, name: &str) -> Result<(), MgmtError> {
        self.delete_vhost_at(name, None)
    }

    /// [`Broker::delete_vhost`], or (`at`) the one a committed entry carries.
    pub fn delete_vhost_at(&self, name: &str, at: Option<Applying>) -> Result<(), MgmtError> {
        if let Some(c) = self.proposer(at) {
            if self.vhost(name).is_none() {
                return Err(MgmtError::NotFound(format!("no vhost '{name}'")));
            }
            return c.mgmt_change(DefOp::DeleteVhost(name.into()));
        }
        let mut map = self.vhosts.write();
        let Some(vh) = map.get(name).cloned() else {
            return Err(MgmtError::NotFound(format!("no vhost '{name}'")));
        };
        // Forgotten on disk first: if that fails, the vhost stays, whole.
        self.access.remove_vhost(name)?;
        map.remove(name);
        drop(map);
        let reason = format!("vhost '{name}' is deleted");
        for c in self.connections.lock().values() {
            if c.vhost == name {
                c.force_close(&reason);
            }
        }
        for q in vh.snapshot().queues.keys().cloned().collect::<Vec<_>>() {
            if let Ok(d) = vh.delete_queue_at(&q, false, false, None, at) {
                crate::queue::notify_cancelled(&d.consumers);
            }
        }
        // Node totals never go down: what the vhost counted stays with the node.
        self.churn.absorb(&vh.churn);
        self.retired.absorb(&vh.retired);
        self.retired_publish.absorb(&vh.retired_publish);
        let dir = Self::vhost_dir(&self.config, name);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(vhost = name, error = %e, "cannot remove the vhost's directory");
            }
        }
        tracing::info!(vhost = name, "vhost deleted");
        Ok(())
    }

    /// Closes every connection of `user` (deleted), as RabbitMQ does.
    pub fn close_user_connections(&self, user: &str, reason: &str) {
        for c in self.connections.lock().values() {
            if c.user == user {
                c.force_close(reason);
            }
        }
    }

    pub fn next_connection_id(&self) -> u64 {
        self.next_connection_id.fetch_add(1, Ordering::Relaxed)
    }
}

/// How long stop_app / start_app wait for every listener's report.
const REPORT_WAIT: Duration = Duration::from_secs(30);

/// Whether AMQP is served, as stop_app/start_app asked, and what the listeners did about it.
pub struct App {
    /// stop_app sets false, start_app true; each listener loop watches it.
    pub(crate) want: watch::Sender<bool>,
    pub(crate) status: watch::Sender<AppStatus>,
}

#[derive(Debug, Clone, Default)]
pub struct AppStatus {
    /// Listener loops running (AMQP, and AMQPS when configured).
    pub listeners: usize,
    /// Of those, bound and accepting now.
    pub listening: usize,
    /// Why the last start_app could not bind a listener.
    pub error: Option<String>,
}

impl Default for App {
    fn default() -> Self {
        App {
            want: watch::Sender::new(true),
            status: watch::Sender::new(AppStatus::default()),
        }
    }
}

impl App {
    /// False between stop_app and start_app.
    pub fn running(&self) -> bool {
        *self.want.borrow()
    }

    pub fn status(&self) -> AppStatus {
        self.status.borrow().clone()
    }

    /// Stops serving AMQP; returns once every listener is closed and has seen its
    /// connections close (or waited for them, bounded).
    pub async fn stop(&self) -> Result<(), String> {
        self.want.send_replace(false);
        self.wait(|s| s.listening == 0).await.map(|_| ())
    }

    /// Serves AMQP again; returns once every listener is bound, or with the bind error.
    pub async fn start(&self) -> Result<(), String> {
        self.status.send_modify(|s| s.error = None);
        // Also when already true: a listener whose bind failed tries again.
        self.want.send_replace(true);
        let s = self
            .wait(|s| s.error.is_some() || s.listening == s.listeners)
            .await?;
        match s.error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn wait(&self, done: impl FnMut(&AppStatus) -> bool) -> Result<AppStatus, String> {
        let mut rx = self.status.subscribe();
        let waited = tokio::time::timeout(REPORT_WAIT, async {
            rx.wait_for(done).await.map(|s| s.clone())
        })
        .await;
        match waited {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(_)) => Err("the broker is shutting down".into()),
            Err(_) => Err(format!(
                "the listeners did not answer within {} s",
                REPORT_WAIT.as_secs()
            )),
        }
    }
}

impl Broker {
    /// The cluster's name, the same from every node: the `cluster_name` global parameter (a
    /// cluster's first leader sets it to its own name; `warren ctl set_cluster_name` changes
    /// it), or this node's name where it is unset (a single node).
    pub fn cluster_name(&self) -> String {
        self.access
            .global_parameter(crate::access::CLUSTER_NAME)
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_else(|| self.config.node_name.clone())
    }

    /// Sets what answers other nodes' management questions (once; later calls are ignored).
    pub fn set_local_view(&self, v: Arc<dyn LocalView>) {
        let _ = self.local_view.set(v);
    }

    /// This node's answer to a management question, if the management layer runs here.
    pub fn local_view(&self, request: &[u8]) -> Result<Vec<u8>, String> {
        match self.local_view.get() {
            Some(v) => v.answer(self, request),
            None => Err("no management view on this node".into()),
        }
    }
}

/// What the broker holds of its cluster, beside the vhosts' [`ClusterNode`]: what the node
/// object shows, and the cluster itself for the layers above that know its type (the management
/// API, `warren ctl`: `cluster::Cluster::of`). `cluster/` implements it; the broker names no
/// cluster type.
pub trait ClusterHandle: Send + Sync {
    /// This node's part in the metadata (Raft) group: `leader`, `follower`, `learner`, or
    /// `none` (not in the membership).
    fn raft_role(&self) -> &'static str;
    /// This node's live links to its peers: (peer name, peer address).
    fn links(&self) -> Vec<(String, String)>;
    /// The cluster, for a downcast to its type.
    fn as_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync>;
}

/// The cluster this node runs in, as the vhosts and as the layers above see it.
struct Clustered {
    node: Arc<dyn ClusterNode>,
    handle: Arc<dyn ClusterHandle>,
}
