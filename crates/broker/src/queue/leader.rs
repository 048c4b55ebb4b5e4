//! The leader leg of a replicated queue (`cluster/quorum`): the leader's queue that publishes
//! through the group's `Replicator`, takes committed publishes in, delivers only what the group
//! recorded as claimed, reads its paged tail back from the group's log, keeps its dead letters
//! in the group until their targets have them, and is retired when its node no longer leads.
//! The state it keeps beside the state machine (`repl`, `leader_leg`, `retired` on `Queue`;
//! `claims`, `want_claim`, `log_tail`, `publishing_at`, `forgot`, `dead_kept` on `Io`) and the
//! host's hooks on it stay with those types in `mod.rs`.
//!
//! Moved here as it was; the replicated-core issue replaces it next.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use super::dead_publish::unix_now_s;
use super::{dead_letter, Consumer, DeadRoute, Enqueued, Queue, QueueOptions, QueueOwner, Reason};
use crate::cluster::quorum::{LogPos, LogTail, Replicator};
use crate::confirm::ConfirmHandle;
use crate::message::Message;
use crate::metrics::bump;

impl Queue {
    /// Retires the leader's queue of a replicated queue (this node no longer leads): it stops
    /// replicating, so what it drops is not settled, refuses publishes, and is deleted.
    /// Returns its consumers, to be told of the cancel.
    pub fn retire(self: &Arc<Self>) -> Vec<Arc<Consumer>> {
        self.retired.store(true, Ordering::SeqCst);
        self.stop_replicating();
        self.mark_deleted().1
    }

    /// The leader's queue of a replicated queue (`cluster/quorum/`), replicating through
    /// `repl`: no log of its own, its paged tail is read back from the group's log (`tail`).
    pub fn leader<O: QueueOwner + 'static>(
        name: Arc<str>,
        vhost: Arc<str>,
        options: QueueOptions,
        owner: Weak<O>,
        repl: Arc<Replicator>,
        tail: LogTail,
    ) -> Arc<Queue> {
        Self::build(name, vhost, options, owner, None, Some((repl, tail)))
    }

    /// A new leader's queue takes over the replica's messages as a paged tail: `count` of
    /// `bytes`, ids in `runs`, read back from the log from `from`; `seen` may have been
    /// delivered by an earlier leader. Ids go on from `next_id`.
    pub fn recover_tail(
        self: &Arc<Self>,
        next_id: u64,
        from: LogPos,
        runs: std::collections::VecDeque<(u64, u64)>,
        seen: std::collections::HashSet<u64>,
        count: usize,
        bytes: u64,
    ) {
        self.locked(|q, st, host| {
            if let Some(t) = &mut host.io.log_tail {
                t.recover(from, runs, seen);
            }
            st.recover(next_id, count, bytes, host);
            q.may_expire.store(st.may_expire(), Ordering::Relaxed);
        })
    }

    /// Stops replicating: the queue is being retired, and what it drops must not be settled.
    fn stop_replicating(&self) {
        self.repl.store(None);
        self.state.lock().io.claims = None;
    }

    /// The group recorded these messages as delivered: they may go out now.
    pub fn claimed(self: &Arc<Self>, ids: impl IntoIterator<Item = u64>) {
        self.locked(|_, st, host| {
            if let Some(c) = &mut host.io.claims {
                c.extend(ids);
            }
            st.dispatch(host);
        })
    }

    /// An earlier leader may have delivered these: their next delivery says so.
    pub fn mark_redelivered(self: &Arc<Self>, ids: impl IntoIterator<Item = u64>) {
        let mut st = self.state.lock();
        for id in ids {
            st.core.mark_redelivered(id);
        }
    }

    /// Deliveries the consumers could take now beyond the ready messages (a guess at how many
    /// of the next publishes go straight out, so they are claimed with their enqueue).
    pub fn spare_credit(&self) -> usize {
        let st = self.state.lock();
        let mut spare = 0usize;
        for c in st.core.consumers() {
            spare = spare.saturating_add(if c.no_ack || c.prefetch == 0 {
                usize::MAX / 4
            } else {
                c.prefetch.saturating_sub(c.outstanding) as usize
            });
        }
        spare.saturating_sub(st.core.ready_len())
    }

    /// A committed publish of a replicated queue, numbered `id` by its log; false if the queue
    /// refused it (full, reject-publish) or is gone.
    pub fn apply_committed(
        self: &Arc<Self>,
        id: u64,
        at: Option<LogPos>,
        msg: Arc<Message>,
        redelivered: bool,
    ) -> bool {
        self.locked(|q, st, host| {
            host.io.outbox_bound = false;
            host.io.publishing_at = at;
            let published = st.publish_as(id, msg, redelivered, host);
            host.io.publishing_at = None;
            match published {
                warren_queue::Published::Accepted { .. } => bump(&q.stats.publish, 1),
                _ => return false,
            }
            q.after_publish(st, host);
            true
        })
    }

    /// At-least-once: each dead letter stays in the group (replicated, so a new leader sends it
    /// again) until every queue it is routed to has it; then its message is settled.
    pub(super) fn dead_letter_kept(&self, kept: Vec<(u64, Arc<Message>, Reason)>) {
        let Some(r) = self.repl.load_full() else {
            // Retired meanwhile: the group still holds them, for the next leader.
            return;
        };
        let args = self.args();
        let now_s = unix_now_s();
        for (id, msg, reason) in kept {
            match self.dead_copy(&args, &msg, reason, now_s) {
                Some((m, cc)) => r.dead_lettering(id, Arc::new(m), cc),
                // The dead-letter exchange went with a policy meanwhile: dropped, as then.
                None => r.settled(id),
            }
        }
        self.send_dead_kept(&r);
    }

    /// Routes the kept dead letters not yet on their way (new, unroutable or refused before).
    pub fn send_dead_kept(&self, r: &Arc<Replicator>) {
        let Some(owner) = self.owner.upgrade() else {
            return;
        };
        let mut targets = Vec::new();
        for (id, m, cc) in r.dead_to_send() {
            targets.clear();
            match owner.route_dead_letter(&m, &cc, &mut targets) {
                DeadRoute::Routed if !targets.is_empty() => {}
                // To a delayed exchange: settled once its store holds it (on disk for a
                // persistent message in a durable store).
                DeadRoute::Delay(delay) => {
                    let rr = r.clone();
                    let done = ConfirmHandle::then(move |ok| rr.dead_done(id, ok));
                    match owner.clone().hold_dead_letter(&m, delay, Some(&done)) {
                        None => r.dead_unsent(id),
                        Some(false) => {
                            done.done(true);
                        }
                        Some(true) => {}
                    }
                    continue;
                }
                // Unroutable (or the exchange is gone): kept, and tried again.
                _ => {
                    r.dead_unsent(id);
                    continue;
                }
            }
            dead_letter::drop_cycles(&m.properties, &mut targets, |q| q.name());
            if targets.is_empty() {
                // Every target was a cycle: dropped, as RabbitMQ drops it.
                r.dead_done(id, true);
                continue;
            }
            let waits = targets.iter().filter(|q| q.stores(&m)).count();
            if waits == 0 {
                for q in targets.drain(..) {
                    q.publish(m.clone(), None);
                }
                r.dead_done(id, true);
                continue;
            }
            let rr = r.clone();
            let done = ConfirmHandle::then_n(waits, move |ok| rr.dead_done(id, ok));
            for q in targets.drain(..) {
                let h = q.stores(&m).then_some(&done);
                // Refused (full) or gone meanwhile: sent again, routed afresh.
                if q.publish(m.clone(), h) != Enqueued::Accepted && h.is_some() {
                    done.done(false);
                }
            }
        }
    }
}
