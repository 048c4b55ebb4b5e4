//! Publishing a queue's dead letters, once its lock is released: the copy each message leaves as
//! (`dead_letter::dead_lettered`), routed through the owner (the vhost) to its targets.

use std::sync::{Arc, Weak};

use super::{dead_letter, DeadRoute, Queue, QueueArgs, QueueOwner, Reason};
use crate::message::Message;

impl Queue {
    /// The copy of `msg` to publish to the dead-letter exchange, and its extra routing keys;
    /// none without one.
    pub fn dead_copy(
        &self,
        a: &QueueArgs,
        msg: &Message,
        reason: Reason,
        now_s: u64,
    ) -> Option<(Message, Vec<warren_protocol::ByteString>)> {
        let dlx = a.dead_letter_exchange.as_deref()?;
        Some(dead_letter::dead_lettered(
            msg,
            &self.name,
            reason,
            dlx,
            a.dead_letter_routing_key.as_deref(),
            now_s,
        ))
    }

    pub(super) fn publish_dead(&self, dead: Vec<(Arc<Message>, Reason)>) {
        route_dead_at_most_once(&self.owner, &self.name, &self.args(), dead);
    }
}

/// Routes the dead letters of queue `name` (its arguments `args`) through `owner`, without
/// waiting for their targets (at-most-once): a missing dead-letter exchange drops them, as in
/// RabbitMQ.
pub fn route_dead_at_most_once(
    owner: &Weak<dyn QueueOwner>,
    name: &str,
    args: &QueueArgs,
    dead: Vec<(Arc<Message>, Reason)>,
) {
    let Some(dlx) = args.dead_letter_exchange.as_deref() else {
        return;
    };
    let Some(owner) = owner.upgrade() else {
        return;
    };
    let now_s = crate::clock::unix_s();
    let mut targets = Vec::new();
    for (msg, reason) in dead {
        let (m, cc) = dead_letter::dead_lettered(
            &msg,
            name,
            reason,
            dlx,
            args.dead_letter_routing_key.as_deref(),
            now_s,
        );
        targets.clear();
        match owner.route_dead_letter(&m, &cc, &mut targets) {
            // A missing dead-letter exchange drops the message, as in RabbitMQ.
            DeadRoute::NoExchange => continue,
            DeadRoute::Delay(delay) => {
                owner.clone().hold_dead_letter(&m, delay, None);
                continue;
            }
            DeadRoute::Routed => {}
        }
        dead_letter::drop_cycles(&m.properties, &mut targets, |q| q.name());
        let m = Arc::new(m);
        for q in targets.drain(..) {
            q.publish(m.clone(), None);
        }
    }
}

/// Routes a dead letter kept for at-least-once dead-lettering (its copy `m` and extra routing
/// keys `cc`) through `owner`, and calls `done` once: `true` when every target queue has it
/// (on disk where it must be), or when it is dropped for good (every target a cycle); `false`
/// when it should be sent again later (unroutable, its exchange gone, a target refused it).
pub fn route_dead_kept(
    owner: &Arc<dyn QueueOwner>,
    m: &Arc<Message>,
    cc: &[warren_protocol::ByteString],
    done: impl FnOnce(bool) + Send + 'static,
) {
    let mut targets = Vec::new();
    match owner.route_dead_letter(m, cc, &mut targets) {
        DeadRoute::Routed if !targets.is_empty() => {}
        // To a delayed exchange: done once its store holds it (on disk for a persistent
        // message in a durable store).
        DeadRoute::Delay(delay) => {
            let h = crate::confirm::ConfirmHandle::then(done);
            match owner.clone().hold_dead_letter(m, delay, Some(&h)) {
                None => {
                    h.done(false);
                }
                Some(false) => {
                    h.done(true);
                }
                Some(true) => {}
            }
            return;
        }
        // Unroutable (or the exchange is gone): kept, and tried again.
        _ => return done(false),
    }
    dead_letter::drop_cycles(&m.properties, &mut targets, |q| q.name());
    if targets.is_empty() {
        // Every target was a cycle: dropped, as RabbitMQ drops it.
        return done(true);
    }
    let waits = targets.iter().filter(|q| q.stores(m)).count();
    if waits == 0 {
        for q in targets.drain(..) {
            q.publish(m.clone(), None);
        }
        return done(true);
    }
    let h = crate::confirm::ConfirmHandle::then_n(waits, done);
    for q in targets.drain(..) {
        let c = q.stores(m).then_some(&h);
        // Refused (full) or gone meanwhile: sent again, routed afresh.
        if q.publish(m.clone(), c) != super::Enqueued::Accepted && c.is_some() {
            h.done(false);
        }
    }
}
