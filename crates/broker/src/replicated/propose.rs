//! Proposing: what this node's channels ask of the queue waits in [`Pending`] until the
//! proposing loop takes it as one entry; a few entries are in flight at once (each a group
//! commit), and each is finished once applied: publishes confirmed or refused, callers
//! answered. The loop also proposes the passing of time (`Cmd::Tick`) when the machine has
//! something due, as `rabbit_fifo`'s leader does.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use warren_queue::replicated::{Cmd, Out};

use super::entry::{self, Builder, MAX_SLOTS};
use super::ReplicatedQueue;
use crate::confirm::ConfirmHandle;
use crate::message::Message;

/// Publishes proposed in one entry at most, and their bytes.
const BATCH_MSGS: usize = 2048;
const BATCH_BYTES: usize = 1 << 20;
/// Entries in flight at once.
const PIPELINE: usize = 4;
/// Publishes waiting for the group beyond which publishers stall.
const PRESSURE_MSGS: usize = 16_384;
const PRESSURE_BYTES: usize = 16 << 20;
/// How often the loop looks whether the machine has something due.
const TICK_CHECK: Duration = Duration::from_millis(100);
/// Kept dead letters that could not be routed are sent again every this many checks (1 s).
const DEAD_LETTER_RETRY: u32 = 10;
/// After an entry that failed, how long the next ones wait.
const FAILED_PAUSE: Duration = Duration::from_millis(100);
/// A consumers' node unreachable this long is down (see `down_unreachable`).
const NODE_DOWN_AFTER: Duration = Duration::from_secs(10);

/// One operation waiting to be proposed, and who waits for its answer.
enum Waiting {
    Publish {
        msg: Arc<Message>,
        confirm: Option<Arc<ConfirmHandle>>,
        size: usize,
    },
    Cmd {
        cmd: Cmd,
        reply: Option<tokio::sync::oneshot::Sender<Answer>>,
    },
}

/// A command's answer: the outputs that answer it, and the stored bodies of what gets in its
/// entry took, by seq.
pub(super) struct Answer {
    pub outs: Vec<Out>,
    pub got: Vec<(u64, Vec<u8>)>,
}

#[derive(Default)]
pub struct Pending {
    ops: VecDeque<Waiting>,
    /// Settlements (settle, return, discard, lease): they go first into the next entry, ahead
    /// of publishes and commands waiting before them. They name deliveries already made, so
    /// nothing waiting before them changes what they do, and a consumer's credit comes back
    /// one entry later rather than behind every publish queued meanwhile.
    settles: VecDeque<Waiting>,
}

/// A settlement: its consumer's credit comes back when it is applied.
fn settles(cmd: &Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Settle { .. } | Cmd::Return { .. } | Cmd::Discard { .. } | Cmd::Lease { .. }
    )
}

/// An entry's answer to come: the apply's reply.
type Fut = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Vec<u8>, warren_cluster::ProposeError>> + Send>,
>;

/// An entry in flight: its operations' waiters, in order.
struct Proposed {
    ops: Vec<Waiting>,
}

fn size_of(m: &Message) -> usize {
    m.body.len() + m.properties.len() + 64
}

impl ReplicatedQueue {
    pub(super) fn push_cmd(&self, cmd: Cmd, reply: Option<tokio::sync::oneshot::Sender<Answer>>) {
        let mut p = self.pending.lock();
        let lane = if settles(&cmd) {
            &mut p.settles
        } else {
            &mut p.ops
        };
        lane.push_back(Waiting::Cmd { cmd, reply });
        drop(p);
        self.wake.notify_one();
    }

    /// A publish; its confirm completes once its entry is applied.
    pub(super) fn push_publish(&self, msg: Arc<Message>, confirm: Option<&Arc<ConfirmHandle>>) {
        let size = size_of(&msg);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.in_flight_bytes.fetch_add(size, Ordering::Relaxed);
        self.pending.lock().ops.push_back(Waiting::Publish {
            msg,
            confirm: confirm.cloned(),
            size,
        });
        self.wake.notify_one();
    }

    /// Publishes wait for the group beyond what it keeps up with.
    pub(super) fn pressured(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) >= PRESSURE_MSGS
            || self.in_flight_bytes.load(Ordering::Relaxed) >= PRESSURE_BYTES
    }

    pub(super) async fn stall(&self, max: Duration) {
        crate::flow::wait_relief(&self.relieved, || self.pressured(), max).await
    }

    /// The next entry: the operations waiting, up to a batch's bounds.
    fn take_entry(&self) -> Option<(Vec<u8>, Proposed)> {
        let mut p = self.pending.lock();
        if p.ops.is_empty() && p.settles.is_empty() {
            return None;
        }
        let mut b = Builder::new(crate::clock::unix_ms());
        let mut ops = Vec::new();
        for w in p.settles.drain(..) {
            if let Waiting::Cmd { cmd, .. } = &w {
                b.cmd(cmd);
            }
            ops.push(w);
        }
        let (mut msgs, mut bytes) = (0, 0);
        while let Some(w) = p.ops.front() {
            if let Waiting::Publish { size, .. } = w {
                if msgs > 0 && (msgs == BATCH_MSGS.min(MAX_SLOTS) || bytes + size > BATCH_BYTES) {
                    break;
                }
                msgs += 1;
                bytes += size;
            }
            let Some(w) = p.ops.pop_front() else { break };
            match &w {
                Waiting::Publish { msg, .. } => b.publish(msg),
                Waiting::Cmd { cmd, .. } => b.cmd(cmd),
            }
            ops.push(w);
        }
        Some((b.finish(), Proposed { ops }))
    }

    /// Proposes what waits, a few entries in flight, until stopped or deleted.
    pub(super) async fn propose_loop(
        self: Arc<Self>,
        via: super::Via,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut in_flight: VecDeque<(Fut, Proposed)> = VecDeque::new();
        let mut tick = tokio::time::interval(TICK_CHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks = 0u32;
        // This loop's numbering of the entries it sends to another member that leads.
        let mut stream = super::forward::Stream::new();
        // Consumers' nodes found unreachable, and since when.
        let mut unreachable: std::collections::HashMap<String, std::time::Instant> =
            Default::default();
        if !self.announce_restart(&via, &mut stream, &mut stop).await {
            return;
        }
        // After an entry that failed, the next ones wait a little: a leader that just died
        // refuses at once, and what failed is proposed again.
        let mut pause_until = tokio::time::Instant::now();
        loop {
            while in_flight.len() < PIPELINE && tokio::time::Instant::now() >= pause_until {
                let Some((cmd, proposed)) = self.take_entry() else {
                    break;
                };
                let fut = self.send(&via, &mut stream, cmd).await;
                in_flight.push_back((fut, proposed));
            }
            let room = in_flight.len() < PIPELINE;
            tokio::select! {
                r = async { in_flight.front_mut().expect("checked").0.as_mut().await }, if !in_flight.is_empty() => {
                    if r.is_err() {
                        pause_until = tokio::time::Instant::now() + FAILED_PAUSE;
                    }
                    if let Some((_, p)) = in_flight.pop_front() {
                        self.finish(p, r);
                    }
                }
                _ = self.wake.notified(), if room => {}
                _ = tokio::time::sleep_until(pause_until), if room && tokio::time::Instant::now() < pause_until => {}
                _ = tick.tick() => {
                    self.tick_if_due();
                    // Kept dead letters not on their way: at once on taking over, then each
                    // `DEAD_LETTER_RETRY`.
                    if ticks.is_multiple_of(DEAD_LETTER_RETRY) {
                        self.resend_kept();
                        self.down_unreachable(&via, &mut unreachable);
                    }
                    ticks = ticks.wrapping_add(1);
                }
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        // Stopped (or this node's role changed): entries in flight have no known outcome, so
        // their publishes are nacked; what waits stays for the next role.
        for (_, p) in in_flight.drain(..) {
            self.finish(
                p,
                Err(warren_cluster::ProposeError::Unavailable(
                    "the queue stopped".into(),
                )),
            );
        }
    }

    /// Once per run of this node, before anything else it proposes: the consumers it had
    /// attached before it restarted are gone (`Cmd::NodeDown`), what they held goes back.
    /// Alone and waited for, so that it is never applied after an attach of this run (an
    /// entry in flight that fails is proposed again, after later ones that did not). False
    /// when stopped first.
    async fn announce_restart(
        &self,
        via: &super::Via,
        stream: &mut super::forward::Stream,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> bool {
        while !self.restart_announced.load(Ordering::Acquire) {
            let mut b = Builder::new(crate::clock::unix_ms());
            b.cmd(&Cmd::NodeDown {
                node: self.me.clone(),
            });
            let fut = self.send(via, stream, b.finish()).await;
            let applied = tokio::select! {
                r = fut => r.is_ok(),
                _ = stop.wait_for(|s| *s) => return false,
            };
            if applied {
                self.restart_announced.store(true, Ordering::Release);
            } else {
                tokio::time::sleep(FAILED_PAUSE).await;
            }
        }
        true
    }

    /// Submits an entry: on the leader, to its group; elsewhere to the leader directly when
    /// this node knows it and reaches it, answered once it applied the entry (this member's
    /// own apply may come later: a confirm needs the commit, not this copy); else through
    /// Raft's forwarding or a member.
    async fn send(
        &self,
        via: &super::Via,
        stream: &mut super::forward::Stream,
        cmd: Vec<u8>,
    ) -> Fut {
        let leader = self
            .leader()
            .filter(|l| *l != self.me && self.net.node_up(l));
        match (via, leader) {
            (super::Via::Member(meta), leader) => match meta.submit(cmd).await {
                Ok(f) => Box::pin(f),
                // Back as it went (not copied: the only reference).
                Err(cmd) => match (leader, Vec::from(cmd)) {
                    (Some(l), cmd) => self.propose_at(&l, stream, cmd),
                    (None, cmd) => {
                        let m = meta.clone();
                        Box::pin(async move { m.propose_at_leader(cmd).await })
                    }
                },
            },
            (super::Via::Forward, Some(l)) => self.propose_at(&l, stream, cmd),
            (super::Via::Forward, None) => {
                let (net, group, members) = (self.net.clone(), self.group, self.members());
                Box::pin(async move {
                    net.forward(group, members, cmd)
                        .await
                        .map_err(warren_cluster::ProposeError::Unavailable)
                })
            }
        }
    }

    /// Sends `entry` to `leader`, the next number of `stream`.
    fn propose_at(&self, leader: &str, stream: &mut super::forward::Stream, entry: Vec<u8>) -> Fut {
        let seq = stream.take();
        let f = self
            .net
            .propose_at(leader, self.group, stream.id, seq, entry);
        Box::pin(async move { f.await.map_err(warren_cluster::ProposeError::Unavailable) })
    }

    /// The queue stopped: what still waits is refused, so no publisher waits for ever.
    pub(super) fn fail_pending(&self) {
        let rest: Vec<Waiting> = {
            let mut p = self.pending.lock();
            let settles = std::mem::take(&mut p.settles);
            settles.into_iter().chain(p.ops.drain(..)).collect()
        };
        self.finish(
            Proposed { ops: rest },
            Err(warren_cluster::ProposeError::Unavailable(
                "the queue stopped".into(),
            )),
        );
    }

    /// Proposes a tick when the machine has something due (a deadline, a held-back return,
    /// a consumer timeout).
    fn tick_if_due(&self) {
        if !self.leads() {
            return;
        }
        let due = self.sm.state.lock().machine.next_due();
        if due.is_some_and(|d| d <= crate::clock::unix_ms()) {
            let ticking = self
                .pending
                .lock()
                .ops
                .iter()
                .any(|w| matches!(w, Waiting::Cmd { cmd: Cmd::Tick, .. }));
            if !ticking {
                self.push_cmd(Cmd::Tick, None);
            }
        }
    }

    /// As the leader: a node holding consumers that has been unreachable for `NODE_DOWN_AFTER`
    /// is suspected (`Cmd::Unreachable`): what its consumers hold goes back to the queue, as
    /// RabbitMQ's quorum queue returns a lost node's checked-out messages, and they get nothing
    /// until the node is reachable again (`Cmd::Reachable`): then they receive again, without
    /// consuming anew. (A node that restarts says so itself: `Cmd::NodeDown`.)
    fn down_unreachable(
        &self,
        via: &super::Via,
        unreachable: &mut std::collections::HashMap<String, std::time::Instant>,
    ) {
        if !self.leads() {
            unreachable.clear();
            return;
        }
        // A member answers the group's heartbeats (a paused node keeps its links open but
        // does not); any node, its link to this one.
        let status = match via {
            super::Via::Member(meta) => Some(meta.status()),
            super::Via::Forward => None,
        };
        let up = |n: &str| {
            let answers = status
                .as_ref()
                .and_then(|s| s.members.iter().find(|m| m.node.name == n))
                .and_then(|m| m.reachable);
            answers.unwrap_or(true) && self.net.node_up(n)
        };
        let nodes: Vec<(String, bool, bool)> = {
            let st = self.sm.state.lock();
            st.machine
                .consumer_nodes()
                .into_iter()
                .filter(|(n, _)| *n != self.me)
                .map(|(n, (active, suspected))| (n.to_string(), active, suspected))
                .collect()
        };
        unreachable.retain(|n, _| nodes.iter().any(|(m, active, _)| m == n && *active));
        for (n, active, suspected) in nodes {
            if up(&n) {
                unreachable.remove(&n);
                if suspected {
                    tracing::info!(queue = %self.name, vhost = %self.vhost, node = %n, "a node with consumers is reachable again: they receive again");
                    self.push_cmd(Cmd::Reachable { node: n }, None);
                }
                continue;
            }
            if !active {
                continue;
            }
            let since = *unreachable
                .entry(n.clone())
                .or_insert_with(std::time::Instant::now);
            if since.elapsed() >= NODE_DOWN_AFTER {
                tracing::info!(queue = %self.name, vhost = %self.vhost, node = %n, "a node with consumers is unreachable: what they hold goes back to the queue");
                unreachable.remove(&n);
                self.push_cmd(Cmd::Unreachable { node: n }, None);
            }
        }
    }

    /// Answers an entry's waiters from its apply's reply; without one (not committed in time,
    /// the queue stopped) publishes are nacked and callers get no answer.
    fn finish(&self, p: Proposed, r: Result<Vec<u8>, warren_cluster::ProposeError>) {
        let failed = r.is_err();
        let reply = match r {
            Ok(b) => entry::decode_reply(&b),
            Err(e) => {
                if !p.ops.is_empty() && !self.is_deleted() {
                    tracing::warn!(queue = %self.name, vhost = %self.vhost, error = %e, "a replicated queue entry was not applied; its publishes are nacked");
                }
                None
            }
        };
        let (outs, got) = reply.map_or_else(Default::default, |r| (r.outs, r.got));
        let mut replies = outs.into_iter();
        let (mut n, mut bytes) = (0, 0);
        let mut confirms = Vec::new();
        let mut again = Vec::new();
        for w in p.ops {
            let outs = replies.next().unwrap_or_default();
            match w {
                // Without an answer the entry may or may not have been applied. A command no
                // caller waits for (a settle, return, discard, cancel, down, tick, ...) does the
                // same applied twice, so it is proposed again: an ack lost with a dying leader
                // would leave its message held for good. A publish is not (it would be
                // enqueued twice): it is nacked, and its publisher decides.
                Waiting::Cmd { cmd, reply: None } if failed => {
                    again.push(Waiting::Cmd { cmd, reply: None })
                }
                Waiting::Publish { confirm, size, .. } => {
                    n += 1;
                    bytes += size;
                    if let Some(h) = confirm {
                        let ok = outs.iter().any(|o| matches!(o, Out::Accepted { .. }));
                        confirms.push((h, ok));
                    }
                }
                Waiting::Cmd { reply, .. } => {
                    // Unanswered, a caller says the group did not answer.
                    if let Some(tx) = reply.filter(|_| !failed) {
                        let _ = tx.send(Answer {
                            outs,
                            got: got.clone(),
                        });
                    }
                }
            }
        }
        if !again.is_empty() {
            let mut pending = self.pending.lock();
            for w in again.into_iter().rev() {
                pending.ops.push_front(w);
            }
            drop(pending);
            self.wake.notify_one();
        }
        crate::confirm::complete_all(confirms);
        let was = self.pressured();
        self.in_flight.fetch_sub(n, Ordering::Relaxed);
        self.in_flight_bytes.fetch_sub(bytes, Ordering::Relaxed);
        if was && !self.pressured() {
            self.relieved.notify_waiters();
        }
    }
}
