//! A consumer of a queue on this node whose channel is on another: the [`LinkSink`] frames its
//! deliveries over the link within a window, and keeps them unacked until settled.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::BufMut;
use parking_lot::Mutex;

use super::wire::{put_message, K_CANCEL, K_DELIVER};
use crate::cluster::link::Link;
use crate::flow::SpaceWaiter;
use crate::queue::{Consumer, DeliverySink, Offer, Queue, QueuedMessage, Settled};

/// Deliveries in flight to one remote consumer before its node confirms them (frames them to
/// its channel, and not while that channel's output is full: `Proxy::withhold`): bounds the
/// consumer node's memory when the consumer has no prefetch.
const WINDOW: u32 = 1024;

/// A remote consumer's deliveries awaiting settlement.
#[derive(Default)]
pub(super) struct Unacked(pub(super) std::collections::VecDeque<(u64, Settled)>);

impl Unacked {
    pub(super) fn remove(&mut self, id: u64) -> Option<Settled> {
        if self.0.front().is_some_and(|(f, _)| *f == id) {
            return self.0.pop_front().map(|(_, m)| m);
        }
        let i = self.0.binary_search_by_key(&id, |(x, _)| *x).ok()?;
        self.0.remove(i).map(|(_, m)| m)
    }
}

/// A consumer of a queue here whose channel is on another node.
pub struct LinkSink {
    pub(super) link: Arc<Link>,
    /// The consumer's key on its node.
    pub(super) remote_key: u64,
    pub(super) queue: Arc<Queue>,
    pub(super) consumer: Mutex<Option<Arc<Consumer>>>,
    pub(super) next_delivery: AtomicU64,
    /// By delivery id, ascending (ids are handed out in order; acks mostly come in order).
    pub(super) unacked: Mutex<Unacked>,
    pub(super) in_flight: AtomicU32,
    /// Out of window: dispatch again when credit comes back.
    pub(super) waiting: AtomicBool,
    /// Deliveries start once the consume-ok is on its way.
    pub(super) started: AtomicBool,
}

impl DeliverySink for LinkSink {
    fn offer(&self, c: &Arc<Consumer>, _q: &Arc<Queue>, m: &QueuedMessage) -> Offer {
        if self.link.is_closed() || c.cancelled.load(Ordering::Relaxed) {
            return Offer::NoCredit;
        }
        if !self.started.load(Ordering::Acquire) {
            self.waiting.store(true, Ordering::Release);
            return Offer::NoCredit;
        }
        // A full window is this consumer's connection falling behind, as a full outbox is
        // for a local one: the queue may then hold back its publishers.
        if self.in_flight.load(Ordering::Relaxed) >= WINDOW {
            return Offer::OutboxFull;
        }
        let id = self.next_delivery.fetch_add(1, Ordering::Relaxed);
        if !c.no_ack {
            self.unacked
                .lock()
                .0
                .push_back((id, (Some(c.key), m.clone())));
        }
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.link.send_run(
            K_DELIVER,
            self.remote_key as u128,
            |b| b.put_u64(self.remote_key),
            |b| {
                let mut pre = [0u8; 9];
                pre[..8].copy_from_slice(&id.to_be_bytes());
                pre[8] = m.redelivered as u8;
                put_message(b, &pre, &m.msg)
            },
        );
        Offer::Delivered
    }

    /// Out of window: the queue dispatches again when credit comes back (`K_CREDIT`).
    fn wait_for_space(&self, _w: Arc<dyn SpaceWaiter>) -> bool {
        self.waiting.store(true, Ordering::Release);
        true
    }

    fn cancelled(&self, _c: &Consumer) {
        self.link.send(K_CANCEL, |b| b.put_u64(self.remote_key));
    }
}

impl LinkSink {
    pub(super) fn credit(&self, n: u32) {
        let left = self
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| {
                Some(x.saturating_sub(n))
            })
            .map_or(0, |x| x.saturating_sub(n));
        // Half a window at a time, so a dispatch delivers a batch, not one message.
        if left <= WINDOW / 2 && self.waiting.swap(false, Ordering::AcqRel) {
            self.queue.dispatch();
        }
    }

    /// Its consumer leaves the queue; what it was delivered stays unacked until settled. True
    /// if the queue is auto-delete and this was its last consumer: the caller deletes it.
    pub(super) fn remove(&self) -> bool {
        let Some(c) = self.consumer.lock().take() else {
            return false;
        };
        c.cancelled.store(true, Ordering::Relaxed);
        self.queue.remove_consumer(&c).auto_delete_now
    }
}

/// Deletes an auto-delete queue whose last consumer left, off the link's reader.
pub(super) fn spawn_delete(q: &Arc<Queue>) {
    let (name, owner) = (q.name.clone(), q.owner());
    tokio::spawn(async move {
        if let Some(o) = owner {
            tokio::task::block_in_place(|| o.delete_unused_queue(&name));
        }
    });
}
