//! Leading a queue's group: building the leader's queue from the replica and installing it as
//! this node's leg, and retiring that leg when this node no longer leads.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::leg::{self, LegHook, LegIo};
use super::{DeadKept, LogPos, LogTail, QuorumQueue};
use crate::cluster::ClusterQueue;
use crate::message::Message;
use crate::queue::{Consumer, Queue, QueueRef};

impl QuorumQueue {
    /// This node leads: its queue is built from the replica, its messages read back from the
    /// log as they are needed (all of them a paged tail); the messages an earlier leader
    /// claimed for delivery are marked redelivered.
    pub(super) fn lead(self: &Arc<Self>) {
        let Some(log) = self.meta.lock().as_ref().map(|m| m.log().clone()) else {
            return;
        };
        let tail = LogTail::new(
            log,
            self.sm.applied.clone(),
            self.repl.clone(),
            !self.mirrored(),
        );
        let hook = LegHook::new(self.repl.clone());
        let q = Queue::leader(
            self.name.clone(),
            self.vhost.clone(),
            self.options.clone(),
            self.vhost_ref.clone(),
            hook.clone(),
            LegIo::new(hook, tail),
        );
        q.set_effective_args((**self.args.load()).clone());
        let r = self.sm.replica.lock();
        // Under the replica's lock: every entry applied from here on knows this epoch.
        self.repl
            .epoch
            .store(rand::random::<u64>() | 1, Ordering::Relaxed);
        *self.repl.returns.lock() = r.returns.clone();
        // Claims still on their way are an earlier leg's: it may have delivered those.
        let pending_claims = self.repl.claiming.lock().clone();
        // Only what an earlier leader claimed (or that came back) may have been delivered; the
        // rest is new to every consumer.
        let seen = |id: &u64| {
            r.delivered.contains(id) || r.returns.contains_key(id) || pending_claims.contains(id)
        };
        let mut refused = Vec::new();
        // Dead letters an earlier leader kept (at-least-once) are sent again, not queued.
        {
            let mut dead = self.repl.dead.lock();
            dead.clear();
            for (id, (data, cc)) in &r.dead {
                if let Some((msg, _)) = crate::persist::decode_message(data) {
                    let kept = DeadKept {
                        msg: Arc::new(msg),
                        cc: cc.clone(),
                        sent: false,
                    };
                    dead.insert(*id, kept);
                }
            }
        }
        // Bodies from a snapshot of an earlier version come first, from memory.
        for (id, data) in r.legacy.iter().filter(|(id, _)| !r.dead.contains_key(id)) {
            match crate::persist::decode_message(data) {
                Some((msg, _)) => {
                    let n = r.returns.get(id).copied().unwrap_or(0);
                    let msg = self.delivery_form(msg, n);
                    if !leg::apply_committed(&q, *id, None, msg, seen(id)) {
                        refused.push(*id);
                    }
                }
                None => {
                    tracing::warn!(queue = %self.name, id, "skipping a replicated message that does not decode");
                    refused.push(*id);
                }
            }
        }
        let mut runs: VecDeque<(u64, u64)> = VecDeque::new();
        let (mut count, mut bytes) = (0usize, 0u64);
        let mut seen_ids = HashSet::new();
        for id in r
            .ids_from(0)
            .filter(|id| !r.legacy.contains_key(id) && !r.dead.contains_key(id))
        {
            match runs.back_mut() {
                Some(run) if run.1 + 1 == id => run.1 = id,
                _ => runs.push_back((id, id)),
            }
            count += 1;
            bytes += u64::from(r.sizes[(id - r.base) as usize]);
            if seen(&id) {
                seen_ids.insert(id);
            }
        }
        // From the newest checkpoint before them all, else the snapshot restored, else the
        // group's first entry.
        let (index, next_id) = r.release().or(r.start).map_or((0, 0), |(i, n)| (i + 1, n));
        let from = LogPos {
            index,
            first_id: next_id,
            next_id,
        };
        leg::recover_tail(&q, r.next_id, from, runs, seen_ids, count, bytes);
        self.leg.store(Some(Arc::new(QueueRef::Local(q.clone()))));
        drop(r);
        for id in refused {
            self.repl.settled(id);
        }
        leg::send_dead_kept(&q, &self.repl);
    }

    /// A message as the leader's queue holds it: a quorum queue's deliveries carry
    /// `x-delivery-count` (0 on the first), as RabbitMQ 3.10's do; a mirrored classic queue's
    /// do not.
    pub(super) fn delivery_form(&self, msg: Message, returns: u32) -> Arc<Message> {
        if self.mirrored() {
            return Arc::new(msg);
        }
        Arc::new(crate::message::with_delivery_count(
            &msg,
            u64::from(returns),
        ))
    }

    /// The leader's queue, when this node leads.
    pub(super) fn local_leg(&self) -> Option<Arc<Queue>> {
        match self.leg.load().as_deref() {
            Some(QueueRef::Local(q)) => Some(q.clone()),
            _ => None,
        }
    }

    /// Drops the current leg: its consumers here are cancelled (they consume again, from the
    /// new leader); a local queue stops replicating first, so what it drops is not settled.
    pub(super) fn retire_leg(&self) {
        crate::queue::notify_cancelled(&self.take_leg());
    }

    /// Takes the leg away and retires it; returns its consumers here.
    pub(super) fn take_leg(&self) -> Vec<Arc<Consumer>> {
        match self.leg.swap(None).as_deref() {
            Some(QueueRef::Local(q)) => q.retire(),
            Some(r) => match r.remote() {
                Some(r) => r.mark_deleted().1,
                None => Vec::new(),
            },
            None => Vec::new(),
        }
    }
}
