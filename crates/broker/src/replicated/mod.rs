//! A replicated queue run on the queue core ([`ReplicatedQueue`]): its Raft group's state
//! machine is `warren_queue::replicated::Machine`, applied on every member to the same entries
//! (docs/design/replicated-queues.md).
//!
//! - **Entries** (`entry.rs`) carry the leader's timestamp and a batch of operations: publishes
//!   with their stored messages, and the machine's commands (attach, settle, return, discard,
//!   cancel, get, purge, tick, ...). The leader gathers them as its channels ask and proposes a
//!   few entries at once (`propose.rs`).
//! - **Apply** (`sm.rs`) runs each operation on the machine. Every member computes the same
//!   outputs; the one that leads acts on them ([`ReplicatedQueue::act`]): deliveries to its
//!   consumers' channels, dead letters through the vhost. A publish's answer and an attach's,
//!   a get's or a purge's go back to whoever proposed it.
//! - **Bodies** stay in the group's log; the machine holds references (`bodies.rs`).
//! - **Consumers** are in the state: an attach names the consumer's node, its prefetch and
//!   whether it acks; the machine counts its credit and holds its deliveries until settled.
//!
//! What runs on it: every quorum queue, in a cluster or on a single node as a group of one
//! member, and every classic queue an `ha-mode` policy mirrors. Replicated queues an earlier
//! release wrote are carried over to it at boot (`legacy.rs`).
//!
//! `kind.rs` is the queue as the queue layer dispatches to it.

mod bodies;
mod consumers;
mod entry;
mod forward;
mod group;
mod kind;
pub(crate) mod legacy;
pub mod net;
mod propose;
mod sm;
pub mod stream;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use warren_queue::replicated::{Cmd, MachineConfig};

use crate::error::{AmqpError, AmqpResult};
use crate::queue::{Consumer, QueueArgs, QueueOptions, QueueOwner, QueuedMessage};

pub use net::GroupNet;
pub use propose::Pending;
use sm::GroupSm;
pub use warren_cluster::RaftLog;

/// How long a caller waits for the group (an attach, a get, a purge) before giving up.
const WAIT: Duration = Duration::from_secs(15);
/// How often a node that is no member asks who leads.
const LEADER_POLL: Duration = Duration::from_secs(1);

/// A consumer on this node, as the queue's leader hands it deliveries.
struct Local {
    c: Arc<Consumer>,
    /// Its attach is applied and the channel told the client (consume-ok): deliveries go
    /// straight to it. Until then they wait in `early`, so none precedes the consume-ok.
    attached: bool,
    early: Vec<QueuedMessage>,
    /// The number of the next delivery it has not had: one below it is a copy a new leader
    /// sent again, and is dropped.
    next: u64,
}

/// A replicated queue as this node runs it.
pub struct ReplicatedQueue {
    pub name: Arc<str>,
    pub vhost: Arc<str>,
    pub options: QueueOptions,
    args: arc_swap::ArcSwap<QueueArgs>,
    owner: Weak<dyn QueueOwner>,
    /// The id a single node's definitions record it under (a cluster's are in the metadata
    /// group); its group lives in `dir`.
    store_id: Option<u64>,
    dir: PathBuf,
    /// This node's name, as consumers' attaches name it.
    me: String,
    group: u64,
    members: parking_lot::RwLock<Vec<String>>,
    net: Arc<dyn GroupNet>,
    /// Machine keys of this process's consumers: `epoch ^ key` (a broker consumer key is
    /// unique in the process only; the machine's outlive it).
    epoch: u64,
    sm: Arc<GroupSm>,
    meta: std::sync::OnceLock<warren_cluster::Meta>,
    /// This node leads the group: it acts on what applies put out.
    leading: AtomicBool,
    /// When the queue was last used (an attach or a get applied, a redeclare here, this node
    /// taking over), on the monotonic clock: `x-expires` counts from it, on the leader.
    last_used: std::sync::atomic::AtomicU64,
    /// The member that leads, as this node last heard.
    leader: group::Leader,
    /// A node that is no member: the counts a member gave last, and when.
    counts: Mutex<Option<(std::time::Instant, net::Counts)>>,
    /// Publishes, deliveries, gets and acks, counted as each member applies them.
    pub stats: crate::metrics::QueueStats,
    consumers: Mutex<HashMap<u64, Local>>,
    /// Held while this node sends deliveries as leader (`act`, `take_over`): see `take_over`.
    send_order: Mutex<()>,
    /// This run's `Cmd::NodeDown` for this node is applied (`propose::announce_restart`).
    /// A single node's classic queue directory whose messages this group carries over: its
    /// files go once they are (`legacy.rs`).
    carried_from: Mutex<Option<PathBuf>>,
    restart_announced: AtomicBool,
    /// As the leader: the order of the entries other members send (`forward.rs`).
    order: forward::Order,
    /// Kept dead letters (at-least-once) on their way to their targets, by log place.
    dead_sending: Mutex<std::collections::HashSet<u64>>,
    pending: Mutex<Pending>,
    wake: tokio::sync::Notify,
    /// Publishes proposed and not yet answered, and their bytes (publishers stall past a bound).
    in_flight: AtomicUsize,
    in_flight_bytes: AtomicUsize,
    relieved: tokio::sync::Notify,
    deleted: AtomicBool,
    stop: tokio::sync::watch::Sender<bool>,
    /// Stops this node's current role (member or not): replaced for each role.
    role: Mutex<tokio::sync::watch::Sender<bool>>,
    /// Set once the group has stopped (after a stop).
    stopped: tokio::sync::watch::Sender<bool>,
    me_ref: Weak<ReplicatedQueue>,
}

impl std::fmt::Debug for ReplicatedQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReplicatedQueue({})", self.name)
    }
}

/// Priority levels a replicated queue may have, as RabbitMQ 4.3's quorum queues: 0 to 31.
pub const MAX_PRIORITY: u8 = 31;

/// The machine a quorum queue's declared arguments make.
fn machine_config(a: &QueueArgs) -> MachineConfig {
    MachineConfig {
        // Strict levels, as a classic priority queue's; a message above the top counts as it.
        max_priority: a.max_priority.map(|p| p.min(MAX_PRIORITY)),
        single_active_consumer: a.single_active_consumer,
        auto_delete: false,
        delivery_limit: a
            .delivery_limit
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        retry: backoff(a),
        keep_dead_letters: a.dead_letter_at_least_once(),
    }
}

/// The retry back-off (`x-delayed-retry-*`, a queue argument or a policy's) in the machine's
/// terms: its due times are in the state, so a new leader (or a restarted node) holds a
/// returned message until the same time.
pub(super) fn backoff(a: &QueueArgs) -> Option<warren_queue::replicated::Backoff> {
    use crate::queue::args::RetryOn;
    a.retry.map(|r| warren_queue::replicated::Backoff {
        on_reject: matches!(r.on, RetryOn::All | RetryOn::Failed),
        on_nack: matches!(r.on, RetryOn::All | RetryOn::Returned),
        min_ms: r.min_ms,
        max_ms: r.max_ms,
        multiplier: r.multiplier,
    })
}

/// Where a replicated queue lives: its group, its members, and how it reaches them.
pub struct Placement {
    /// The group's id, the same on every node.
    pub group: u64,
    /// Its members, the first bootstrapping the group.
    pub members: Vec<String>,
    /// This node's name.
    pub me: String,
    pub net: Arc<dyn GroupNet>,
    /// A single node's quorum queue of the earlier form, to carry over into this new group.
    pub carry: Option<legacy::Seed>,
}

impl Placement {
    /// A single node's queue: a group of one member.
    pub fn alone(group: u64, me: String) -> Placement {
        Placement {
            group,
            members: vec![me.clone()],
            me,
            net: Arc::new(net::Alone),
            carry: None,
        }
    }
}

/// How this node proposes: as a member, through its group; or through another node that is one.
#[derive(Clone)]
pub(super) enum Via {
    Member(warren_cluster::Meta),
    Forward,
}

impl ReplicatedQueue {
    /// The queue as this node runs it: a member opens (or creates) its group under `dir` in
    /// the background (its state restored from the last snapshot and the log after it; the
    /// first member bootstraps a new group); any node then proposes what its channels ask, and
    /// the node that leads acts on what applies put out.
    pub fn open(
        name: Arc<str>,
        vhost: Arc<str>,
        options: QueueOptions,
        store_id: Option<u64>,
        dir: PathBuf,
        owner: Weak<dyn QueueOwner>,
        at: Placement,
    ) -> Arc<ReplicatedQueue> {
        let sm = Arc::new(GroupSm::new(
            machine_config(&options.args),
            crate::queue::core_limits(&options.args),
            crate::queue::args::is_quorum(&options.arguments),
        ));
        let carried_from = at.carry.map(|seed| {
            sm.state.lock().legacy = Some(seed.legacy);
            seed.classic_dir
        });
        let q = Arc::new_cyclic(|me_ref| ReplicatedQueue {
            name,
            vhost,
            args: arc_swap::ArcSwap::from_pointee(options.args.clone()),
            options,
            owner,
            store_id,
            dir,
            me: at.me,
            group: at.group,
            members: parking_lot::RwLock::new(at.members),
            net: at.net,
            epoch: rand::random::<u64>() & !0xFFFF_FFFF,
            sm,
            meta: std::sync::OnceLock::new(),
            leading: AtomicBool::new(false),
            last_used: std::sync::atomic::AtomicU64::new(crate::clock::now_ms()),
            leader: group::Leader::default(),
            counts: Mutex::new(None),
            stats: Default::default(),
            consumers: Mutex::new(HashMap::new()),
            send_order: Mutex::new(()),
            order: forward::Order::default(),
            restart_announced: AtomicBool::new(false),
            carried_from: Mutex::new(carried_from),
            dead_sending: Mutex::new(std::collections::HashSet::new()),
            pending: Mutex::new(Pending::default()),
            wake: tokio::sync::Notify::new(),
            in_flight: AtomicUsize::new(0),
            in_flight_bytes: AtomicUsize::new(0),
            relieved: tokio::sync::Notify::new(),
            deleted: AtomicBool::new(false),
            stop: tokio::sync::watch::channel(false).0,
            role: Mutex::new(tokio::sync::watch::channel(false).0),
            stopped: tokio::sync::watch::channel(false).0,
            me_ref: me_ref.clone(),
        });
        let _ = q.sm.queue.set(Arc::downgrade(&q));
        // Consumers this node had attached before it restarted are gone: the proposing loop
        // says so before anything else (`propose::announce_restart`).
        tokio::spawn(q.clone().run());
        q
    }

    fn arc(&self) -> Option<Arc<ReplicatedQueue>> {
        self.me_ref.upgrade()
    }

    /// Its members now.
    pub fn members(&self) -> Vec<String> {
        self.members.read().clone()
    }

    /// This member's Raft log (Prometheus' `rabbitmq_raft_*`); None on a node that is no
    /// member, or before its group has opened.
    pub fn raft_log(&self) -> Option<warren_cluster::RaftLog> {
        self.meta.get().map(|m| m.raft_log())
    }

    /// The group's id.
    pub fn group(&self) -> u64 {
        self.group
    }

    /// The member that leads, as this node last heard.
    pub fn leader(&self) -> Option<String> {
        self.leader.get()
    }

    /// Waits until a member knows its leader (a fresh declare waits for the first election);
    /// at once on a node that is no member.
    pub async fn wait_leader(&self, max: Duration) -> bool {
        if !self.is_member() {
            return true;
        }
        self.leader.wait(max).await
    }

    /// No leader: the answer to what needs one.
    pub fn unavailable(&self) -> AmqpError {
        AmqpError::not_found(format!(
            "{} has no leader: a majority of its members ({}) is down, or an election is under way",
            self.describe(),
            self.members().join(", ")
        ))
    }

    /// Ready, unacked and consumers as this member's machine has them.
    pub fn local_counts(&self) -> net::Counts {
        let st = self.sm.state.lock();
        let m = &st.machine;
        (
            m.ready_len() as u32,
            m.checked_out() as u32,
            m.consumer_count() as u32,
        )
    }

    /// The counts: this member's, or (no member) a member's, asked at most every second.
    pub fn counts(&self) -> net::Counts {
        if self.is_member() {
            return self.local_counts();
        }
        if let Some((at, c)) = *self.counts.lock() {
            if at.elapsed() < Duration::from_secs(1) {
                return c;
            }
        }
        let (net, group, members) = (self.net.clone(), self.group, self.members());
        let got = tokio::runtime::Handle::try_current()
            .ok()
            .and_then(|h| tokio::task::block_in_place(|| h.block_on(net.counts(group, members))));
        let c = got.unwrap_or_default();
        *self.counts.lock() = Some((std::time::Instant::now(), c));
        c
    }

    pub(super) fn is_member(&self) -> bool {
        self.members.read().contains(&self.me)
    }

    /// This node's roles, one after the other: a member's (`serve`) or a proposer's through
    /// the members, until the queue is stopped or deleted; a change of members switches roles.
    async fn run(self: Arc<Self>) {
        loop {
            let (tx, rx) = tokio::sync::watch::channel(false);
            *self.role.lock() = tx;
            if *self.stop.borrow() {
                break;
            }
            let member = self.is_member();
            if member {
                self.clone().serve(rx).await;
            } else {
                tokio::spawn(self.clone().poll_leader(rx.clone()));
                self.clone().propose_loop(Via::Forward, rx).await;
            }
            if *self.stop.borrow() {
                break;
            }
            if member && !self.is_member() {
                // No longer a member: its copy goes.
                tracing::info!(queue = %self.name, vhost = %self.vhost, "this node left the queue's group");
                self.sm.reset();
                let _ = std::fs::remove_dir_all(self.dir.parent().unwrap_or(&self.dir));
            }
        }
        self.fail_pending();
        self.stopped.send_replace(true);
    }

    /// Stops the group (its state stays on disk) and waits until it has.
    pub async fn close(&self) {
        self.stop_all();
        let mut s = self.stopped.subscribe();
        let _ = s.wait_for(|s| *s).await;
    }

    fn stop_all(&self) {
        // `send_replace`: the flag is read, not awaited (`send` keeps no value without a
        // receiver).
        self.stop.send_replace(true);
        self.role.lock().send_replace(true);
    }

    /// The members changed (a committed metadata entry, on every node): a node that joins the
    /// group starts a member's role, one that leaves stops it and drops its copy.
    pub fn set_members(&self, members: Vec<String>) {
        let was = self.is_member();
        *self.members.write() = members;
        if was != self.is_member() && !self.is_deleted() {
            self.role.lock().send_replace(true);
        }
    }

    /// A member: opens the group, bootstraps it if new and this is its first member, follows
    /// who leads, and proposes until stopped.
    async fn serve(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        let what = self.describe();
        let meta = match group::open(
            &self.dir,
            &self.me,
            &self.members(),
            self.group,
            self.sm.clone(),
            &self.net,
            &what,
        )
        .await
        {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(queue = %self.name, vhost = %self.vhost, error = %e, "cannot open the queue's group");
                return;
            }
        };
        let _ = self.sm.log.set(meta.log().clone());
        let _ = self.meta.set(meta.clone());
        tokio::spawn(self.clone().follow(meta.clone(), stop.clone()));
        self.clone()
            .propose_loop(Via::Member(meta.clone()), stop)
            .await;
        self.leading.store(false, Ordering::Release);
        self.net.register(self.group, None);
        meta.shutdown().await;
        if self.deleted.load(Ordering::Acquire) {
            // `queues/<id>/group`: the queue's directory goes with it.
            let _ = std::fs::remove_dir_all(self.dir.parent().unwrap_or(&self.dir));
        }
    }

    /// A node that is no member asks the members who leads, every `LEADER_POLL`.
    async fn poll_leader(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        self.leader
            .poll(&self.net, self.group, || self.members(), LEADER_POLL, stop)
            .await
    }

    /// Follows who leads the group. On taking over, this node sends every consumer what it
    /// holds (its node drops what it has had) and routes the kept dead letters: what the old
    /// leader committed but had not sent yet reaches its consumer, and no consumer is cancelled.
    async fn follow(
        self: Arc<Self>,
        meta: warren_cluster::Meta,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut status = meta.watch();
        loop {
            let (leads, leader) = {
                let s = status.borrow_and_update();
                (s.leader == Some(s.id), s.leader_name().map(String::from))
            };
            self.leader.set(leader);
            let was = self.leads();
            if leads && !was {
                self.touch();
                tracing::info!(queue = %self.name, vhost = %self.vhost, "this node leads the replicated queue");
                // Sets `leading` itself, in order with the applies.
                self.take_over();
                if self.sm.state.lock().legacy.is_some() {
                    tokio::spawn(self.clone().carry_over(meta.clone()));
                }
            } else if !leads {
                self.leading.store(false, Ordering::Release);
            }
            let stopped = tokio::select! {
                r = status.changed() => r.is_err(),
                _ = stop.wait_for(|s| *s) => true,
            };
            if stopped {
                return;
            }
        }
    }

    /// The queue was used now (see `last_used`).
    pub fn touch(&self) {
        self.last_used
            .store(crate::clock::now_ms(), Ordering::Relaxed);
    }

    /// A declare on this node of an `x-expires` queue: every member starts the lease again
    /// (this one too), before the declare-ok.
    pub fn touch_members(&self) {
        if self.args().expires_ms.is_none() {
            return;
        }
        self.touch();
        let (net, group, members) = (self.net.clone(), self.group, self.members());
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            tokio::task::block_in_place(|| h.block_on(net.touch(group, members)));
        }
    }

    /// An `x-expires` queue unused for its lease, as its leader sees it: no consumers, no get
    /// and no redeclare since.
    pub fn lease_expired(&self, now: u64) -> bool {
        let Some(ms) = self.args().expires_ms else {
            return false;
        };
        self.leads()
            && self.local_counts().2 == 0
            && now.saturating_sub(self.last_used.load(Ordering::Relaxed)) >= ms
    }

    /// Whether this node acts on what applies put out.
    pub(super) fn leads(&self) -> bool {
        self.leading.load(Ordering::Acquire)
    }

    /// The machine key of a consumer of this process (or of its gets: `key` none).
    fn machine_key(&self, key: Option<u64>) -> u64 {
        self.epoch ^ key.map_or(0xFFFF_FFFF, |k| k & 0x7FFF_FFFF)
    }

    /// Proposes `cmd` and waits for its answer, from a synchronous caller (a channel's
    /// consume, get or purge).
    fn call(&self, cmd: Cmd) -> AmqpResult<propose::Answer> {
        if self.is_deleted() {
            return Err(AmqpError::not_found(format!("no {}", self.describe())));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.push_cmd(cmd, Some(tx));
        let got = tokio::runtime::Handle::try_current().ok().and_then(|h| {
            tokio::task::block_in_place(|| {
                h.block_on(async { tokio::time::timeout(WAIT, rx).await.ok()?.ok() })
            })
        });
        got.ok_or_else(|| {
            AmqpError::internal_error(format!(
                "{} did not answer in time: its group did not commit the request",
                self.describe()
            ))
        })
    }

    pub fn describe(&self) -> String {
        format!("queue '{}' in vhost '{}'", self.name, self.vhost)
    }

    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    pub fn args(&self) -> arc_swap::Guard<Arc<QueueArgs>> {
        self.args.load()
    }

    /// Deleted: stops proposing, then the group stops and its files go.
    pub fn mark_deleted(&self) -> (u32, Vec<Arc<Consumer>>) {
        let ready = self.sm.state.lock().machine.ready_len() as u32;
        self.deleted.store(true, Ordering::Release);
        let consumers = self.consumers.lock().drain().map(|(_, l)| l.c).collect();
        self.stop_all();
        self.wake.notify_one();
        (ready, consumers)
    }
}
