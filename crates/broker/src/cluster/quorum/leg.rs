//! The leader leg of a replicated queue: a classic queue host (`queue/`) run with this
//! module's replication hook (`queue/leader.rs`). [`LegHook`] publishes through the group's
//! `Replicator` and is retired when this node no longer leads; [`LegIo`], kept under the
//! queue's lock, delivers only what the group recorded as claimed, reads the paged tail back
//! from the group's log, settles what leaves for good through the group, and keeps
//! at-least-once dead letters in the group until their targets have them.
//!
//! Moved here from the queue host as it was; the replicated-core issue replaces it next.

use std::any::Any;
use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use warren_queue::{Effect, PagedIn};

use super::{LogPos, LogTail, Replicator};
use crate::confirm::ConfirmHandle;
use crate::message::Message;
use crate::queue::{
    Enqueued, LeaderCtx, LeaderHook, LeaderIo, Pending, Queue, QueuedMessage, Reason,
};

/// The leader's side that needs no queue lock.
pub(super) struct LegHook {
    /// Publishes go to the replicator and enter once committed; what leaves for good is
    /// settled through it. `None` once retired (its node no longer leads): a publish is then
    /// refused, never taken into a queue that is going (its confirm would be a lie).
    repl: arc_swap::ArcSwapOption<Replicator>,
}

impl LegHook {
    pub(super) fn new(repl: Arc<Replicator>) -> Arc<LegHook> {
        Arc::new(LegHook {
            repl: arc_swap::ArcSwapOption::new(Some(repl)),
        })
    }
}

impl LeaderHook for LegHook {
    fn publish(&self, msg: Arc<Message>, confirm: Option<&Arc<ConfirmHandle>>) -> Enqueued {
        match &*self.repl.load() {
            Some(r) => {
                r.submit(msg, confirm);
                Enqueued::Accepted
            }
            None => Enqueued::Rejected,
        }
    }

    fn replicating(&self) -> bool {
        self.repl.load().is_some()
    }

    fn pressured(&self) -> bool {
        self.repl.load().as_ref().is_some_and(|r| r.pressured())
    }

    fn stall(&self, max: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if let Some(r) = self.repl.load_full() {
                r.stall(max).await
            }
        })
    }

    fn returned(&self, seq: u64) -> Option<u32> {
        self.repl.load().as_ref().map(|r| r.returned(seq))
    }

    fn after_lock(&self, q: &Arc<Queue>, p: Pending) {
        if !p.dead_kept.is_empty() {
            self.dead_letter_kept(q, p.dead_kept);
        }
        if let Some(seq) = p.want_claim {
            if let Some(r) = &*self.repl.load() {
                r.want_claims(seq);
            }
        }
    }

    fn retire(&self) {
        self.repl.store(None);
    }
}

impl LegHook {
    /// At-least-once: each dead letter stays in the group (replicated, so a new leader sends it
    /// again) until every queue it is routed to has it; then its message is settled.
    fn dead_letter_kept(&self, q: &Queue, kept: Vec<(u64, Arc<Message>, Reason)>) {
        let Some(r) = self.repl.load_full() else {
            // Retired meanwhile: the group still holds them, for the next leader.
            return;
        };
        let args = q.args();
        let now_s = crate::clock::unix_s();
        for (id, msg, reason) in kept {
            match q.dead_copy(&args, &msg, reason, now_s) {
                Some((m, cc)) => r.dead_lettering(id, Arc::new(m), cc),
                // The dead-letter exchange went with a policy meanwhile: dropped, as then.
                None => r.settled(id),
            }
        }
        send_dead_kept(q, &r);
    }
}

/// The leader's state under the queue's lock.
pub(super) struct LegIo {
    hook: Arc<LegHook>,
    /// The messages the group has recorded as (possibly) delivered, which alone may be
    /// delivered for the first time, so that a new leader knows exactly which messages to
    /// mark redelivered. `None` once retired.
    claims: Option<HashSet<u64>>,
    /// The lowest unclaimed message an offer was held back for.
    want_claim: Option<u64>,
    /// The paged tail is read back from the group's log, not written to a log of its own.
    tail: LogTail,
    /// Where the committed message being published is in the group's log (it may start the
    /// tail); none for a message the log no longer has, which stays in memory.
    publishing_at: Option<LogPos>,
    /// At-least-once dead-lettering: the message just forgotten, settled unless its dead
    /// letter follows; and the dead letters kept in the group until their targets have them.
    forgot: Option<u64>,
    dead_kept: Vec<(u64, Arc<Message>, Reason)>,
}

impl LegIo {
    pub(super) fn new(hook: Arc<LegHook>, tail: LogTail) -> Box<LegIo> {
        Box::new(LegIo {
            hook,
            claims: Some(HashSet::new()),
            want_claim: None,
            tail,
            publishing_at: None,
            forgot: None,
            dead_kept: Vec::new(),
        })
    }

    fn settled(&self, seq: u64) {
        if let Some(r) = &*self.hook.repl.load() {
            r.settled(seq);
        }
    }
}

impl LeaderIo for LegIo {
    fn hold_back(&mut self, m: &QueuedMessage) -> bool {
        let Some(claims) = &self.claims else {
            return false;
        };
        if m.redelivered || claims.contains(&m.seq) {
            return false;
        }
        // Delivered once the group records the claim (`claimed`).
        let w = self.want_claim.get_or_insert(m.seq);
        *w = (*w).min(m.seq);
        true
    }

    fn got(&mut self, seq: u64) {
        if self.claims.as_ref().is_some_and(|c| !c.contains(&seq)) {
            if let Some(r) = &*self.hook.repl.load() {
                r.claim_now(seq);
            }
        }
    }

    fn page_in(
        &mut self,
        q: &Queue,
        remaining: usize,
        now: &mut dyn FnMut() -> u64,
        out: &mut Vec<QueuedMessage>,
    ) -> PagedIn {
        let ttl = q.args().message_ttl_ms;
        self.tail.read(remaining, ttl, now, out)
    }

    fn can_page(&self) -> bool {
        self.publishing_at.is_some()
    }

    fn effect<'e>(
        &mut self,
        q: &Queue,
        e: Effect<'e, Arc<Message>>,
    ) -> Option<Effect<'e, Arc<Message>>> {
        if let Some(seq) = self.forgot.take() {
            // The state machine dead-letters right after it forgets the same message.
            if let Effect::DeadLetter(m, reason) = e {
                self.dead_kept.push((seq, m, reason));
                return None;
            }
            self.settled(seq);
        }
        match e {
            Effect::Append { entry, paged: true } => {
                self.tail.push(entry.seq, entry.expires_at_ms);
                None
            }
            Effect::Forget { seq } => {
                if let Some(claims) = &mut self.claims {
                    claims.remove(&seq);
                    if self.hook.replicating() {
                        if q.args().dead_letter_at_least_once() {
                            self.forgot = Some(seq);
                        } else {
                            self.settled(seq);
                        }
                    }
                }
                Some(e)
            }
            Effect::PageOut { from_seq } => {
                // `can_page` said yes only with a place to read from.
                if let Some(at) = self.publishing_at.filter(|a| a.is(from_seq)) {
                    self.tail.start(at);
                }
                None
            }
            Effect::ForgetTail { .. } => {
                // A retired queue settles nothing.
                self.tail.forget(self.hook.replicating());
                None
            }
            e => Some(e),
        }
    }

    fn take_pending(&mut self) -> Option<Pending> {
        if let Some(seq) = self.forgot.take() {
            self.settled(seq);
        }
        if self.want_claim.is_none() && self.dead_kept.is_empty() {
            return None;
        }
        Some(Pending {
            want_claim: self.want_claim.take(),
            dead_kept: std::mem::take(&mut self.dead_kept),
        })
    }

    fn retire(&mut self) {
        self.claims = None;
    }

    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
}

fn leg_io<'a>(l: &'a mut LeaderCtx<'_, '_>) -> &'a mut LegIo {
    l.io()
        .as_any()
        .downcast_mut()
        .expect("a quorum leg's queue has a quorum leg's state")
}

/// A committed publish of a replicated queue, numbered `id` by its log (at `at` in it); false
/// if the queue refused it (full, reject-publish) or is gone.
pub(super) fn apply_committed(
    q: &Arc<Queue>,
    id: u64,
    at: Option<LogPos>,
    msg: Arc<Message>,
    redelivered: bool,
) -> bool {
    q.with_leader(|l| {
        leg_io(l).publishing_at = at;
        let ok = l.publish_as(id, msg, redelivered);
        leg_io(l).publishing_at = None;
        ok
    })
}

/// A new leader's queue takes over the replica's messages as a paged tail: `count` of
/// `bytes`, ids in `runs`, read back from the log from `from`; `seen` may have been delivered
/// by an earlier leader. Ids go on from `next_id`.
pub(super) fn recover_tail(
    q: &Arc<Queue>,
    next_id: u64,
    from: LogPos,
    runs: VecDeque<(u64, u64)>,
    seen: HashSet<u64>,
    count: usize,
    bytes: u64,
) {
    q.with_leader(|l| {
        leg_io(l).tail.recover(from, runs, seen);
        l.recover(next_id, count, bytes);
    })
}

/// The group recorded these messages as delivered: they may go out now.
pub(super) fn claimed(q: &Arc<Queue>, ids: impl IntoIterator<Item = u64>) {
    q.with_leader(|l| {
        if let Some(c) = &mut leg_io(l).claims {
            c.extend(ids);
        }
        l.dispatch();
    })
}

/// Routes the kept dead letters not yet on their way (new, unroutable or refused before).
pub(super) fn send_dead_kept(q: &Queue, r: &Arc<Replicator>) {
    let Some(owner) = q.owner() else {
        return;
    };
    for (id, m, cc) in r.dead_to_send() {
        let rr = r.clone();
        crate::queue::route_dead_kept(&owner, &m, &cc, move |ok| rr.dead_done(id, ok));
    }
}
