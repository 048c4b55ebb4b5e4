//! The consumer timeout (docs/consumer-timeout.md), kept apart from the message path:
//! deliveries unacked past their deadline are taken back, and a publish to the lease exchange
//! moves deadlines later.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::deliveries::finish;
use super::{remove_consumer, Channel, Settle, Unacked};
use crate::consumer_timeout::{self as timeout, LeaseTarget};
use crate::error::{AmqpError, AmqpResult};
use crate::queue::{Consumer, DeliverySink};
use crate::vhost::VHost;

impl Channel {
    /// Whether the connection's timer must keep checking this channel: a manual-ack consumer,
    /// or deliveries awaiting ack.
    pub fn awaits_acks(&self) -> bool {
        self.consumers.values().any(|c| !c.no_ack)
            || !self.shared.deliveries.lock().unacked.is_empty()
    }

    /// Takes back deliveries unacked past their timeout, `now` being [`timeout::now_ms`]. With
    /// `cancel_notify` each timed-out consumer is cancelled (basic.cancel) and all of its unacked
    /// deliveries requeued; the channel stays open. Without it the channel must be closed: the
    /// error to close it with is returned (closing requeues everything). Timed-out basic.get
    /// deliveries are requeued either way. Returns the earliest deadline still ahead.
    pub fn expire_deliveries(
        &mut self,
        now: u64,
        cancel_notify: bool,
        conn: u64,
        vhost: &Arc<VHost>,
    ) -> AmqpResult<Option<u64>> {
        let global = self.default_consumer_timeout;
        let mut next: Option<u64> = None;
        // Timed-out consumers with their timeout; timed-out basic.get deliveries by tag.
        let mut expired: Vec<(Arc<Consumer>, u64, bool)> = Vec::new();
        let mut gets: Vec<u64> = Vec::new();
        let taken: Vec<Unacked> = {
            let mut d = self.shared.deliveries.lock();
            // Consumers their queue timed out (what they held is back in it already).
            for (key, t) in std::mem::take(&mut d.timed_out_by_queue) {
                if let Some(c) = self.consumers.values().find(|c| c.key == key) {
                    if !expired.iter().any(|(x, ..)| x.key == key) {
                        expired.push((c.clone(), t, false));
                    }
                }
            }
            if d.unacked.is_empty() && expired.is_empty() {
                return Ok(None);
            }
            // A consumer's timeout is resolved once per check, not per delivery.
            let mut timeouts: ahash::AHashMap<u64, Option<u64>> = ahash::AHashMap::new();
            for u in &d.unacked {
                // Its queue times its consumers (and tells the channel, above).
                if u.consumer.is_some() && u.queue.times_consumers() {
                    continue;
                }
                let t = match &u.consumer {
                    Some(c) => *timeouts.entry(c.key).or_insert_with(|| {
                        timeout::effective(c.timeout_ms, c.queue.args().consumer_timeout_ms, global)
                    }),
                    None => timeout::effective(None, u.queue.args().consumer_timeout_ms, global),
                };
                let Some(t) = t else { continue };
                let deadline = u.stamp.saturating_add(t);
                if now < deadline {
                    next = Some(next.map_or(deadline, |n| n.min(deadline)));
                    continue;
                }
                match &u.consumer {
                    Some(c) if !expired.iter().any(|(x, ..)| x.key == c.key) => {
                        expired.push((c.clone(), t, false))
                    }
                    Some(_) => {}
                    None => gets.push(u.tag),
                }
            }
            if !cancel_notify {
                if let Some((c, t, _)) = expired.first() {
                    tracing::info!(conn, channel = self.id(), vhost = %vhost.name, queue = %c.queue.name(), consumer_tag = %c.tag, timeout_ms = t, "consumer timed out: closing the channel (the client lacks consumer_cancel_notify)");
                    return Err(AmqpError::precondition_failed(timeout::timed_out_text(
                        self.id(),
                        *t,
                    )));
                }
            }
            if expired.is_empty() && gets.is_empty() {
                return Ok(next);
            }
            // Marked under this lock: a delivery that raced past the mark is taken back at a
            // later check, without a second basic.cancel.
            for (c, _, newly) in expired.iter_mut() {
                *newly = !c.cancelled.swap(true, Ordering::Relaxed);
            }
            let all = std::mem::take(&mut d.unacked);
            let mut taken = Vec::new();
            for u in all {
                let gone = match &u.consumer {
                    Some(c) => expired.iter().any(|(x, ..)| x.key == c.key),
                    None => gets.binary_search(&u.tag).is_ok(),
                };
                if gone {
                    taken.push(u);
                } else {
                    d.unacked.push_back(u);
                }
            }
            for u in &taken {
                if u.consumer.is_some() {
                    d.global_unacked = d.global_unacked.saturating_sub(1);
                }
                d.reclaimed.insert(u.tag);
            }
            while d.reclaimed.len() > crate::limits::RECLAIMED_TAGS_MAX {
                d.reclaimed.pop_first();
            }
            taken
        };
        for (c, t, newly) in &expired {
            if self
                .consumers
                .get(&c.tag)
                .is_some_and(|x| Arc::ptr_eq(x, c))
            {
                self.consumers.remove(&c.tag);
            }
            // One the client had cancelled already is not cancelled again.
            if *newly {
                self.shared.cancelled(c);
                remove_consumer(vhost, c);
            }
            let requeued = taken
                .iter()
                .filter(|u| u.consumer.as_ref().is_some_and(|x| x.key == c.key))
                .count();
            tracing::info!(conn, channel = self.id(), vhost = %vhost.name, queue = %c.queue.name(), consumer_tag = %c.tag, timeout_ms = t, requeued, cancelled = *newly, "consumer timed out: deliveries requeued");
        }
        if !gets.is_empty() {
            tracing::info!(conn, channel = self.id(), vhost = %vhost.name, requeued = gets.len(), "basic.get deliveries timed out: requeued");
        }
        // What a queue that times its consumers took back is in it already.
        let taken = taken
            .into_iter()
            .filter(|u| !(u.consumer.is_some() && u.queue.times_consumers()))
            .collect();
        finish(taken, Settle::Requeue);
        if self.shared.capped() {
            self.kick_consumers();
        }
        Ok(next)
    }

    /// A publish to [`LEASE_EXCHANGE`]: moves the named deliveries' deadlines to the requested
    /// time from now (never earlier). Malformed requests and unknown tags are ignored; with
    /// confirms on it is confirmed like any publish.
    pub(super) fn extend_lease(&mut self, routing_key: &str, body: &[u8]) {
        if self.confirm {
            self.next_publish_seq += 1;
            self.confirms.settled(self.next_publish_seq - 1, true);
        }
        let Some(lease) = timeout::parse_lease(routing_key, body) else {
            tracing::debug!(
                channel = self.id(),
                routing_key,
                "malformed lease extension ignored"
            );
            return;
        };
        let (now, global) = (timeout::now_ms(), self.default_consumer_timeout);
        // Deliveries of queues that time their consumers: the queue extends them.
        let mut by_queue: Vec<(crate::queue::QueueRef, u64, Vec<u64>)> = Vec::new();
        let mut extend = |u: &mut Unacked| {
            if let Some(c) = u.consumer.as_ref().filter(|_| u.queue.times_consumers()) {
                match by_queue.iter_mut().find(|(_, k, _)| *k == c.key) {
                    Some((_, _, seqs)) => seqs.push(u.msg.seq),
                    None => by_queue.push((u.queue.clone(), c.key, vec![u.msg.seq])),
                }
                return;
            }
            let t = match &u.consumer {
                Some(c) => {
                    timeout::effective(c.timeout_ms, c.queue.args().consumer_timeout_ms, global)
                }
                None => timeout::effective(None, u.queue.args().consumer_timeout_ms, global),
            };
            if let Some(t) = t {
                u.stamp = timeout::extended_stamp(u.stamp, now, t, lease.extend_ms);
            }
        };
        let mut d = self.shared.deliveries.lock();
        match lease.target {
            LeaseTarget::All => d.unacked.iter_mut().for_each(&mut extend),
            LeaseTarget::Tag(tag) => {
                if let Ok(i) = d.unacked.binary_search_by_key(&tag, |u| u.tag) {
                    extend(&mut d.unacked[i]);
                }
            }
        }
        drop(d);
        for (q, key, seqs) in by_queue {
            q.extend_lease(key, seqs, lease.extend_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    use bytes::Bytes;
    use warren_protocol::{FieldTable, FieldValue};

    use crate::message::Message;
    use crate::outbox::Outbox;
    use crate::queue::QueueRef;
    use crate::vhost::QueueSpec;

    fn setup(args: FieldTable) -> (Arc<VHost>, QueueRef, Channel) {
        let vhost = VHost::new("/");
        let q = vhost
            .declare_queue(&QueueSpec {
                name: "q",
                passive: false,
                durable: false,
                exclusive: false,
                auto_delete: false,
                arguments: &args,
                conn_id: 1,
                server_named: false,
                home: None,
                members: None,
            })
            .expect("declare");
        let mut ch = Channel::new(1, Outbox::new(131_072));
        ch.default_consumer_timeout = 0;
        (vhost, q, ch)
    }

    fn consume(
        ch: &mut Channel,
        q: &QueueRef,
        tag: &str,
        timeout_ms: Option<u64>,
    ) -> Arc<Consumer> {
        let c = Arc::new(Consumer {
            key: crate::queue::consumer_key(),
            tag: tag.into(),
            sink: ch.shared.clone(),
            queue: q.clone(),
            no_ack: false,
            exclusive: false,
            priority: 0,
            prefetch: 0,
            cancelled: AtomicBool::new(false),
            timeout_ms,
        });
        q.add_consumer(c.clone(), || {}).expect("consume");
        ch.consumers.insert(c.tag.clone(), c.clone());
        c
    }

    fn publish(q: &QueueRef, n: usize) {
        for i in 0..n {
            q.publish(
                Arc::new(Message {
                    exchange: "".into(),
                    routing_key: "q".into(),
                    properties: Bytes::from_static(&[0, 0]),
                    body: Bytes::from(i.to_string()),
                    persistent: false,
                    priority: None,
                    expiration_ms: None,
                    forwarded: crate::message::Forwarded::NONE,
                }),
                None,
            );
        }
    }

    /// (tag, consumer tag, redelivered) of the channel's unacked deliveries.
    fn unacked(ch: &Channel) -> Vec<(u64, String, bool)> {
        let d = ch.shared.deliveries.lock();
        d.unacked
            .iter()
            .map(|u| {
                let c = u
                    .consumer
                    .as_ref()
                    .map_or(String::new(), |c| c.tag.to_string());
                (u.tag, c, u.msg.redelivered)
            })
            .collect()
    }

    #[test]
    fn a_timed_out_consumer_is_cancelled_and_all_its_deliveries_requeued() {
        let (vhost, q, mut ch) = setup(FieldTable::new());
        let quick = consume(&mut ch, &q, "quick", Some(1000));
        consume(&mut ch, &q, "patient", None);
        publish(&q, 4);
        let before = unacked(&ch);
        assert_eq!(before.len(), 4);
        let quick_tags: Vec<u64> = before
            .iter()
            .filter(|u| u.1 == "quick")
            .map(|u| u.0)
            .collect();
        assert_eq!(quick_tags.len(), 2);
        let now = timeout::now_ms();
        let next = ch
            .expire_deliveries(now + 500, true, 1, &vhost)
            .expect("open");
        assert!(
            next.is_some_and(|d| d > now + 500 && d <= now + 1000),
            "{next:?}"
        );
        assert_eq!(unacked(&ch).len(), 4, "nothing expired yet");
        // The patient consumer has no timeout at all (the broker's is off here).
        let next = ch
            .expire_deliveries(now + 2000, true, 1, &vhost)
            .expect("open");
        assert_eq!(next, None);
        assert!(quick.cancelled.load(Ordering::Relaxed));
        assert!(!ch.consumers.contains_key("quick") && ch.consumers.contains_key("patient"));
        assert_eq!(q.consumer_count(), 1);
        // Requeued, then redelivered to the other consumer, flagged.
        let after = unacked(&ch);
        assert_eq!(after.len(), 4);
        assert!(after.iter().all(|u| u.1 == "patient"));
        assert_eq!(after.iter().filter(|u| u.2).count(), 2);
        // Late settles of reclaimed tags are ignored; an unknown tag is still an error.
        assert!(ch
            .shared
            .take(quick_tags[0], false)
            .expect("ignored")
            .is_empty());
        assert!(
            ch.shared.take(quick_tags[0], false).is_err(),
            "forgotten once used"
        );
        assert!(ch.shared.take(99, false).is_err());
        assert!(
            ch.shared.take(quick_tags[1], true).is_ok(),
            "multiple up to a reclaimed tag"
        );
    }

    /// Acks in order (the oldest first), out of order, multiple and "all", and tags not (or
    /// no longer) outstanding refused.
    #[test]
    fn acks_take_what_they_name() {
        let (_vhost, q, mut ch) = setup(FieldTable::new());
        consume(&mut ch, &q, "c", None);
        publish(&q, 6);
        let tags = |v: Vec<super::Unacked>| v.iter().map(|u| u.tag).collect::<Vec<_>>();
        let all: Vec<u64> = unacked(&ch).iter().map(|u| u.0).collect();
        assert_eq!(all.len(), 6);
        let t = |i: usize| all[i];
        assert_eq!(tags(ch.shared.take(t(0), false).expect("oldest")), [t(0)]);
        assert_eq!(
            tags(ch.shared.take(t(3), false).expect("out of order")),
            [t(3)]
        );
        assert!(ch.shared.take(t(3), false).is_err(), "taken already");
        assert_eq!(
            tags(ch.shared.take(t(4), true).expect("multiple")),
            [t(1), t(2), t(4)]
        );
        assert!(
            ch.shared.take(t(4), true).is_err(),
            "multiple up to a taken tag"
        );
        assert!(ch.shared.take(99, true).is_err());
        assert_eq!(tags(ch.shared.take(0, true).expect("all")), [t(5)]);
        assert!(unacked(&ch).is_empty());
    }

    #[test]
    fn without_cancel_notify_the_channel_is_closed_with_rabbitmqs_text() {
        let mut args = FieldTable::new();
        args.insert("x-consumer-timeout", FieldValue::I32(1000));
        let (vhost, q, mut ch) = setup(args);
        let c = consume(&mut ch, &q, "c", None);
        publish(&q, 1);
        let now = timeout::now_ms();
        let e = ch
            .expire_deliveries(now + 2000, false, 1, &vhost)
            .expect_err("close");
        assert_eq!(e.code, 406);
        assert_eq!(
            e.text,
            format!("PRECONDITION_FAILED - {}", timeout::timed_out_text(1, 1000))
        );
        assert!(
            !c.cancelled.load(Ordering::Relaxed),
            "the close releases it"
        );
        assert_eq!(unacked(&ch).len(), 1);
    }

    #[test]
    fn a_lease_postpones_expiry_and_never_shortens_it() {
        let (vhost, q, mut ch) = setup(FieldTable::new());
        let c = consume(&mut ch, &q, "c", Some(1000));
        publish(&q, 2);
        let now = timeout::now_ms();
        ch.extend_lease("", b"5000");
        ch.extend_lease("1", b"100");
        ch.extend_lease("77", b"");
        let next = ch
            .expire_deliveries(now + 2000, true, 1, &vhost)
            .expect("open");
        assert!(next.is_some_and(|d| d >= now + 5000), "{next:?}");
        assert!(!c.cancelled.load(Ordering::Relaxed));
        ch.expire_deliveries(now + 60_000, true, 1, &vhost)
            .expect("open");
        assert!(c.cancelled.load(Ordering::Relaxed));
        assert_eq!(q.message_count(), 2);
    }

    #[test]
    fn a_timed_out_basic_get_is_requeued_and_the_channel_kept() {
        let mut args = FieldTable::new();
        args.insert("x-consumer-timeout", FieldValue::I32(1000));
        let (vhost, q, mut ch) = setup(args);
        publish(&q, 1);
        let shared = ch.shared.clone();
        let got = q
            .get(true, |m, left| shared.deliver_get(&q, m, left, false))
            .expect("get");
        assert!(got && q.message_count() == 0);
        let now = timeout::now_ms();
        ch.expire_deliveries(now + 2000, false, 1, &vhost)
            .expect("kept open");
        assert_eq!(q.message_count(), 1);
        assert!(ch
            .shared
            .take(1, false)
            .expect("late ack ignored")
            .is_empty());
    }
}
