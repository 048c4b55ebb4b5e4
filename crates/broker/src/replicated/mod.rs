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
//! What runs on it today: a quorum queue on a single node, as a group of one member, when
//! `quorum_queues_on_machine` is set (off by default). A cluster's quorum queues are still
//! `cluster/quorum/`'s; they move here next (issue 31).
//!
//! `kind.rs` is the queue as the queue layer dispatches to it.

mod bodies;
mod entry;
mod kind;
mod propose;
mod sm;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use warren_queue::replicated::{Cmd, MachineConfig, Out, ReturnKind};

use crate::error::{AmqpError, AmqpResult};
use crate::message::Message;
use crate::queue::{Consumer, QueueArgs, QueueOptions, QueueOwner, QueueRef, QueuedMessage};

pub use propose::Pending;
use sm::{Act, GroupSm};

/// How long a caller waits for the group (an attach, a get, a purge) before giving up.
const WAIT: Duration = Duration::from_secs(15);

/// A consumer on this node, as the queue's leader hands it deliveries.
struct Local {
    c: Arc<Consumer>,
    /// Its attach is applied and the channel told the client (consume-ok): deliveries go
    /// straight to it. Until then they wait in `early`, so none precedes the consume-ok.
    attached: bool,
    early: Vec<QueuedMessage>,
}

/// A replicated queue as this node runs it.
pub struct ReplicatedQueue {
    pub name: Arc<str>,
    pub vhost: Arc<str>,
    pub options: QueueOptions,
    args: arc_swap::ArcSwap<QueueArgs>,
    owner: Weak<dyn QueueOwner>,
    /// The id the definitions record it under; its group lives in `dir`.
    store_id: u64,
    dir: PathBuf,
    /// This node's name, as consumers' attaches name it.
    me: String,
    /// Machine keys of this process's consumers: `epoch ^ key` (a broker consumer key is
    /// unique in the process only; the machine's outlive it).
    epoch: u64,
    sm: Arc<GroupSm>,
    meta: std::sync::OnceLock<warren_cluster::Meta>,
    /// This node leads the group: it acts on what applies put out.
    leading: AtomicBool,
    consumers: Mutex<HashMap<u64, Local>>,
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
    /// Set once the group has stopped (after a stop).
    stopped: tokio::sync::watch::Sender<bool>,
    me_ref: Weak<ReplicatedQueue>,
}

impl std::fmt::Debug for ReplicatedQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReplicatedQueue({})", self.name)
    }
}

/// The machine a quorum queue's declared arguments make.
fn machine_config(a: &QueueArgs) -> MachineConfig {
    MachineConfig {
        max_priority: a.max_priority,
        single_active_consumer: a.single_active_consumer,
        auto_delete: false,
        delivery_limit: a
            .delivery_limit
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        // Delayed retries stay with the channel's retry store for now (`channel/basic.rs`).
        retry: None,
        keep_dead_letters: a.dead_letter_at_least_once(),
    }
}

/// A group of one member reaches no other node.
struct NoPeers;

impl warren_cluster::Transport for NoPeers {
    fn call(
        &self,
        to: &warren_cluster::Node,
        _request: Vec<u8>,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<Vec<u8>, warren_cluster::TransportError>>
                + Send,
        >,
    > {
        let to = to.name.clone();
        Box::pin(async move {
            Err(warren_cluster::TransportError::Unreachable(
                to,
                "a single node's queue group has no peers".into(),
            ))
        })
    }
}

impl ReplicatedQueue {
    /// Opens (or creates) the queue's group of one member under `dir`, in the background:
    /// its state is restored from the last snapshot and the log after it; then it leads, and
    /// what it proposed before (consumers of an earlier run of this node) is taken back first.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        name: Arc<str>,
        vhost: Arc<str>,
        options: QueueOptions,
        store_id: u64,
        dir: PathBuf,
        owner: Weak<dyn QueueOwner>,
        me: String,
    ) -> Arc<ReplicatedQueue> {
        let sm = Arc::new(GroupSm::new(
            machine_config(&options.args),
            crate::queue::core_limits(&options.args),
        ));
        let q = Arc::new_cyclic(|me_ref| ReplicatedQueue {
            name,
            vhost,
            args: arc_swap::ArcSwap::from_pointee(options.args.clone()),
            options,
            owner,
            store_id,
            dir,
            me,
            epoch: rand::random::<u64>() & !0xFFFF_FFFF,
            sm,
            meta: std::sync::OnceLock::new(),
            leading: AtomicBool::new(false),
            consumers: Mutex::new(HashMap::new()),
            dead_sending: Mutex::new(std::collections::HashSet::new()),
            pending: Mutex::new(Pending::default()),
            wake: tokio::sync::Notify::new(),
            in_flight: AtomicUsize::new(0),
            in_flight_bytes: AtomicUsize::new(0),
            relieved: tokio::sync::Notify::new(),
            deleted: AtomicBool::new(false),
            stop: tokio::sync::watch::channel(false).0,
            stopped: tokio::sync::watch::channel(false).0,
            me_ref: me_ref.clone(),
        });
        let _ = q.sm.queue.set(Arc::downgrade(&q));
        // Consumers this node had attached before it restarted are gone: what they held goes
        // back before anything else this run proposes.
        q.push_cmd(
            Cmd::NodeDown {
                node: q.me.clone(),
            },
            None,
        );
        tokio::spawn(q.clone().run());
        q
    }

    fn arc(&self) -> Option<Arc<ReplicatedQueue>> {
        self.me_ref.upgrade()
    }

    /// Opens the group, bootstraps it if new, waits to lead, then proposes until stopped.
    async fn run(self: Arc<Self>) {
        self.clone().serve().await;
        self.stopped.send_replace(true);
    }

    /// Stops the group (its state stays on disk) and waits until it has.
    pub async fn close(&self) {
        let _ = self.stop.send(true);
        let mut s = self.stopped.subscribe();
        let _ = s.wait_for(|s| *s).await;
    }

    async fn serve(self: Arc<Self>) {
        let me = warren_cluster::Node {
            name: self.me.clone(),
            addr: String::new(),
        };
        let meta = match warren_cluster::Meta::open(
            &self.dir,
            me,
            self.sm.clone(),
            Arc::new(NoPeers),
            warren_cluster::MetaConfig {
                election_timeout_min_ms: 150,
                election_timeout_max_ms: 300,
                heartbeat_ms: 50,
                propose_timeout: Duration::from_secs(10),
                snapshot_after: 1024,
            },
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
        if !meta.is_initialized() {
            if let Err(e) = meta.initialize().await {
                tracing::error!(queue = %self.name, vhost = %self.vhost, error = %e, "cannot start the queue's group");
                return;
            }
        }
        let _ = self.meta.set(meta.clone());
        let mut status = meta.watch();
        let mut stop = self.stop.subscribe();
        loop {
            let leads = {
                let s = status.borrow_and_update();
                s.leader == Some(s.id)
            };
            if leads {
                break;
            }
            let stopped = tokio::select! {
                r = status.changed() => r.is_err(),
                _ = stop.wait_for(|s| *s) => true,
            };
            if stopped {
                meta.shutdown().await;
                return;
            }
        }
        self.leading.store(true, Ordering::Release);
        self.clone().propose_loop(meta.clone(), stop.clone()).await;
        self.leading.store(false, Ordering::Release);
        meta.shutdown().await;
        if self.deleted.load(Ordering::Acquire) {
            // `queues/<id>/group`: the queue's directory goes with it.
            let _ = std::fs::remove_dir_all(self.dir.parent().unwrap_or(&self.dir));
        }
    }

    /// Whether this node acts on what applies put out.
    pub(super) fn leads(&self) -> bool {
        self.leading.load(Ordering::Acquire)
    }

    /// The machine key of a consumer of this process (or of its gets: `key` none).
    fn machine_key(&self, key: Option<u64>) -> u64 {
        self.epoch ^ key.map_or(0xFFFF_FFFF, |k| k & 0x7FFF_FFFF)
    }

    /// Acts on what an apply put out, as the leader: hands deliveries to consumers' channels
    /// and routes dead letters.
    fn act(&self, acts: Vec<Act>) {
        let Some(me) = self.arc() else { return };
        let mut back: Vec<(u64, u64)> = Vec::new();
        let mut consumers = self.consumers.lock();
        for a in acts {
            match a {
                Act::Deliver {
                    consumer,
                    seq,
                    msg,
                    redelivered,
                } => {
                    let qm = QueuedMessage {
                        seq,
                        msg,
                        redelivered,
                        expires_at_ms: None,
                        logged: true,
                    };
                    match consumers.get_mut(&consumer) {
                        Some(l) if !l.attached => l.early.push(qm),
                        Some(l) => {
                            if !l.c.sink.push(&l.c, QueueRef::Other(me.clone()), &qm) {
                                back.push((consumer, seq));
                            }
                        }
                        // Cancelled meanwhile: back to the queue.
                        None => back.push((consumer, seq)),
                    }
                }
                Act::DeadLetter(m, reason, None) => {
                    crate::queue::route_dead_at_most_once(
                        &self.owner,
                        &self.name,
                        &self.args(),
                        vec![(m, reason)],
                    );
                }
                Act::DeadLetter(m, reason, Some(place)) => self.send_kept(place, &m, reason),
                Act::Lost { consumer, seq } => {
                    tracing::error!(queue = %self.name, vhost = %self.vhost, seq, "a delivery's body is missing from the queue's log; it is dropped");
                    self.push_cmd(
                        Cmd::Discard {
                            consumer,
                            seqs: vec![seq],
                        },
                        None,
                    );
                }
            }
        }
        drop(consumers);
        for (consumer, seq) in back {
            self.push_cmd(
                Cmd::Return {
                    consumer,
                    seqs: vec![seq],
                    kind: ReturnKind::Released,
                },
                None,
            );
        }
    }

    /// Routes a kept dead letter (at-least-once) unless it is on its way already; once its
    /// targets have it, the group forgets it; else it is sent again later
    /// ([`ReplicatedQueue::resend_kept`]).
    fn send_kept(&self, place: u64, msg: &Message, reason: warren_queue::Reason) {
        if !self.dead_sending.lock().insert(place) {
            return;
        }
        let args = self.args();
        let (Some(owner), Some(dlx)) = (self.owner.upgrade(), args.dead_letter_exchange.as_deref())
        else {
            // No dead-letter exchange any more (a policy went): dropped, as then.
            self.push_cmd(Cmd::DeadDone { places: vec![place] }, None);
            return;
        };
        let (m, cc) = crate::queue::dead_letter::dead_lettered(
            msg,
            &self.name,
            reason,
            dlx,
            args.dead_letter_routing_key.as_deref(),
            crate::clock::unix_s(),
        );
        let me = self.me_ref.clone();
        crate::queue::route_dead_kept(&owner, &Arc::new(m), &cc, move |ok| {
            let Some(q) = me.upgrade() else { return };
            if ok {
                // Stays "on its way" until the group has forgotten it.
                q.push_cmd(Cmd::DeadDone { places: vec![place] }, None);
            } else {
                q.dead_sending.lock().remove(&place);
            }
        });
    }

    /// Sends again the kept dead letters not on their way: unroutable or refused before, or
    /// left by an earlier leader (or an earlier run of this node).
    fn resend_kept(&self) {
        let log = self.sm.log.get();
        let todo: Vec<(u64, Message, warren_queue::Reason)> = {
            let mut st = self.sm.state.lock();
            let sm::State {
                machine, bodies, ..
            } = &mut *st;
            let mut sending = self.dead_sending.lock();
            // Those the group has forgotten are done.
            let kept: std::collections::HashSet<u64> =
                machine.kept_dead().map(|(r, _)| r.index).collect();
            sending.retain(|p| kept.contains(p));
            machine
                .kept_dead()
                .filter(|(r, _)| !sending.contains(&r.index))
                .filter_map(|(r, reason)| {
                    let b = bodies.stored(r.index, log)?;
                    Some((r.index, crate::persist::decode_message(&b)?.0, reason))
                })
                .collect()
        };
        for (place, m, reason) in todo {
            self.send_kept(place, &m, reason);
        }
    }

    /// Proposes `cmd` and waits for its answer, from a synchronous caller (a channel's
    /// consume, get or purge).
    fn call(&self, cmd: Cmd) -> AmqpResult<Vec<Out>> {
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
        let consumers = self
            .consumers
            .lock()
            .drain()
            .map(|(_, l)| l.c)
            .collect();
        let _ = self.stop.send(true);
        self.wake.notify_one();
        (ready, consumers)
    }

    /// Takes `c` on: attached through the group; `on_added` (the consume-ok) runs before any
    /// delivery reaches it.
    pub fn attach(&self, c: Arc<Consumer>, on_added: &mut dyn FnMut()) -> AmqpResult<()> {
        let key = self.machine_key(Some(c.key));
        let attach = warren_queue::replicated::Attach {
            key,
            node: self.me.clone(),
            priority: c.priority,
            prefetch: u32::from(c.prefetch),
            no_ack: c.no_ack,
            exclusive: c.exclusive,
            // Consumer timeouts stay with the channel (`channel/expiry.rs`) for now.
            timeout_ms: None,
        };
        self.consumers.lock().insert(
            key,
            Local {
                c: c.clone(),
                attached: false,
                early: Vec::new(),
            },
        );
        let answer = self.call(Cmd::Attach(attach));
        let refused = match answer {
            Ok(outs) => outs.into_iter().find_map(|o| match o {
                Out::Attached(r) => Some(r),
                _ => None,
            }),
            Err(e) => {
                self.consumers.lock().remove(&key);
                return Err(e);
            }
        };
        match refused {
            Some(Ok(())) => {}
            Some(Err(warren_queue::ConsumeRefused::Exclusive)) => {
                self.consumers.lock().remove(&key);
                return Err(AmqpError::access_refused(format!(
                    "{} in exclusive use",
                    self.describe()
                )));
            }
            _ => {
                self.consumers.lock().remove(&key);
                return Err(AmqpError::not_found(format!("no {}", self.describe())));
            }
        }
        on_added();
        let me = self.arc();
        let mut back = Vec::new();
        let mut consumers = self.consumers.lock();
        if let Some(l) = consumers.get_mut(&key) {
            l.attached = true;
            for qm in std::mem::take(&mut l.early) {
                let pushed = me
                    .as_ref()
                    .is_some_and(|me| l.c.sink.push(&l.c, QueueRef::Other(me.clone()), &qm));
                if !pushed {
                    back.push(qm.seq);
                }
            }
        }
        drop(consumers);
        if !back.is_empty() {
            self.push_cmd(
                Cmd::Return {
                    consumer: key,
                    seqs: back,
                    kind: ReturnKind::Released,
                },
                None,
            );
        }
        Ok(())
    }

    /// `c` stops receiving; what it holds stays with its channel, which settles or returns it.
    pub fn detach(&self, c: &Arc<Consumer>) {
        let key = self.machine_key(Some(c.key));
        if self.consumers.lock().remove(&key).is_some() {
            self.push_cmd(Cmd::Cancel { consumer: key }, None);
        }
    }
}
