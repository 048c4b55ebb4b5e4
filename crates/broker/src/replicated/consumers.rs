//! A replicated queue's consumers on this node, and what the leader does with what applies
//! put out: a delivery goes to its consumer's node (this one, or another over the links), which
//! drops one it has had; a dead letter is routed through the vhost, and kept in the group
//! until its targets have it when the queue dead-letters at least once.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use warren_queue::replicated::{Cmd, Out, ReturnKind};

use super::net::Delivery;
use super::sm::{self, Act};
use super::{Local, ReplicatedQueue};
use crate::error::{AmqpError, AmqpResult};
use crate::message::Message;
use crate::queue::{Consumer, QueueRef, QueuedMessage};

impl ReplicatedQueue {
    /// Acts on what an apply put out, as the leader.
    pub(super) fn act(&self, acts: Vec<Act>) {
        let _order = self.send_order.lock();
        for a in acts {
            match a {
                Act::Deliver { node, d } => self.hand(&node, d),
                Act::DeadLetter(m, reason, None) => {
                    crate::queue::route_dead_at_most_once(
                        &self.owner,
                        &self.name,
                        &self.args(),
                        vec![(m, reason)],
                    );
                }
                Act::DeadLetter(m, reason, Some(place)) => self.send_kept(place, &m, reason),
                Act::TimedOut {
                    node,
                    consumer,
                    timeout_ms,
                } => {
                    if node == self.me {
                        self.timed_out_local(consumer, timeout_ms);
                    } else {
                        self.net.timed_out(&node, self.group, consumer, timeout_ms);
                    }
                }
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
    }

    /// A delivery to its consumer's node.
    fn hand(&self, node: &str, d: Delivery) {
        if node == self.me {
            self.deliver_local(d);
        } else {
            self.net.deliver(node, self.group, d);
        }
    }

    /// Taking over as leader: every consumer gets again what it holds (its node drops what it
    /// has had), and kept dead letters are routed.
    ///
    /// Ordered before every delivery this node makes as leader: it takes `send_order` (which
    /// `act` takes to send) before it starts acting, so a new delivery never reaches a
    /// consumer's node ahead of the older ones sent again here (the node would drop those as
    /// had, by number, and they would stay held and never delivered).
    pub(super) fn take_over(&self) {
        let _order = self.send_order.lock();
        let log = self.sm.log.get();
        let resend: Vec<(String, Delivery)> = {
            let mut st = self.sm.state.lock();
            // Applies from here on act; what was applied before is in the machine's holds.
            self.leading.store(true, Ordering::Release);
            let sm::State {
                machine, bodies, ..
            } = &mut *st;
            let mut out = Vec::new();
            for (consumer, node) in machine.attached() {
                for r in machine.held_since(consumer, None) {
                    let Some(msg) = sm::body(bodies, log, r.seq, &r.msg, self.sm.counted) else {
                        continue;
                    };
                    let d = Delivery {
                        consumer,
                        delivery: r.delivery,
                        seq: r.seq,
                        redelivered: r.redelivered,
                        msg,
                    };
                    out.push((node.to_string(), d));
                }
            }
            out
        };
        for (node, d) in resend {
            self.hand(&node, d);
        }
        self.resend_kept();
    }

    /// The machine timed out a consumer on this node: its channel cancels it (or closes).
    pub fn timed_out_local(&self, consumer: u64, timeout_ms: u64) {
        let Some(l) = self.consumers.lock().remove(&consumer) else {
            return;
        };
        tracing::debug!(queue = %self.name, vhost = %self.vhost, consumer_tag = %l.c.tag, timeout_ms, "the queue timed a consumer out");
        l.c.sink.timed_out(&l.c, timeout_ms);
    }

    /// A delivery for a consumer on this node (from the leader here, or over a link).
    pub fn deliver_local(&self, d: Delivery) {
        let Some(me) = self.arc() else { return };
        let qm = QueuedMessage {
            seq: d.seq,
            msg: d.msg,
            redelivered: d.redelivered,
            expires_at_ms: None,
            logged: true,
        };
        let mut consumers = self.consumers.lock();
        let taken = match consumers.get_mut(&d.consumer) {
            // Had it already (a new leader sends again what a consumer holds).
            Some(l) if d.delivery < l.next => return,
            Some(l) => {
                l.next = d.delivery + 1;
                if l.attached {
                    l.c.sink.push(&l.c, QueueRef::Other(me.clone()), &qm)
                } else {
                    l.early.push(qm);
                    true
                }
            }
            // Cancelled meanwhile (or from before this node restarted): back to the queue.
            None => false,
        };
        drop(consumers);
        if !taken {
            self.push_cmd(
                Cmd::Return {
                    consumer: d.consumer,
                    seqs: vec![d.seq],
                    kind: ReturnKind::Released,
                },
                None,
            );
        }
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
            // Resolved by the channel at basic.consume; the machine times it out.
            timeout_ms: c.timeout_ms,
        };
        self.consumers.lock().insert(
            key,
            Local {
                c: c.clone(),
                attached: false,
                early: Vec::new(),
                next: 0,
            },
        );
        let refused = match self.call(Cmd::Attach(attach)) {
            Ok(a) => a.outs.into_iter().find_map(|o| match o {
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
    /// Returns once the group applied the cancel (the leader delivers nothing more to it; what
    /// it made before finds no consumer here and goes back), so the cancel-ok comes after,
    /// as on a single node; or after the wait for an answer if the group has no leader.
    pub fn detach(&self, c: &Arc<Consumer>) {
        let key = self.machine_key(Some(c.key));
        if self.consumers.lock().remove(&key).is_some() {
            let _ = self.call(Cmd::Cancel { consumer: key });
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
            self.push_cmd(
                Cmd::DeadDone {
                    places: vec![place],
                },
                None,
            );
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
                q.push_cmd(
                    Cmd::DeadDone {
                        places: vec![place],
                    },
                    None,
                );
            } else {
                q.dead_sending.lock().remove(&place);
            }
        });
    }

    /// Sends again the kept dead letters not on their way: unroutable or refused before, or
    /// left by an earlier leader (or an earlier run of this node).
    pub(super) fn resend_kept(&self) {
        if !self.leads() {
            return;
        }
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
}
