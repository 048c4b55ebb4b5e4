//! A consumer on this node of a queue on another: the [`Proxy`] hands the home's deliveries to
//! the consumer's channel and withholds their credit while that channel's output is full.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::BufMut;
use parking_lot::Mutex;

use super::queue::RemoteQueue;
use super::wire::K_CREDIT;
use crate::cluster::link::Link;
use crate::queue::{Consumer, QueueRef, QueuedMessage};

/// A consumer on this node of a remote queue.
pub struct Proxy {
    pub(super) consumer: Arc<Consumer>,
    pub(super) queue: Arc<RemoteQueue>,
    /// Deliveries that came before the consume-ok was sent (`Some` until then).
    pub(super) early: Mutex<Option<Vec<QueuedMessage>>>,
    /// Credit for deliveries taken while the consumer's connection output was full: owed to
    /// the home over this link once it drains, so a consumer that does not read holds at most
    /// a window on this node, not whatever its queue has.
    pub(super) withheld: Mutex<Option<(Arc<Link>, u32)>>,
    /// While its cancel waits for the home's `K_CANCEL_OK`: completed by it (or by the link's
    /// loss). Deliveries that arrive meanwhile were made before the home removed the consumer.
    pub(super) cancelling: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    /// Set once its cancel is asked (read per delivery: no lock on the delivery path).
    pub(super) cancel_asked: AtomicBool,
    /// Deliveries the home made that the channel's channel-wide prefetch holds back (the home
    /// counts only this consumer's prefetch), in order: handed over as acks make room
    /// ([`Proxy::flush`], when the channel kicks its queues), returned if the consumer goes.
    pub(super) held: Mutex<std::collections::VecDeque<QueuedMessage>>,
    /// Whether `held` has any (kept under its lock): a delivery reads this, not the lock.
    pub(super) holding: AtomicBool,
}

/// Its consumer's output drained: the withheld credit goes home.
impl crate::flow::SpaceWaiter for Proxy {
    fn space(self: Arc<Self>) {
        self.release_credit()
    }
}

impl Proxy {
    /// Sends the withheld credit home (the consumer's output drained).
    pub fn release_credit(&self) {
        if let Some((link, n)) = self.withheld.lock().take() {
            link.send(K_CREDIT, |b| {
                b.put_u64(self.consumer.key);
                b.put_u32(n);
            });
        }
    }

    /// Credit for `n` deliveries just pushed: withheld while the consumer's output is full.
    /// False if it is not: the caller credits them with the rest of the read.
    pub(super) fn withhold(self: &Arc<Self>, link: &Arc<Link>, n: u32) -> bool {
        if n == 0 || !self.held_back() {
            return false;
        }
        {
            let mut w = self.withheld.lock();
            match w.as_mut() {
                Some((l, owed)) if Arc::ptr_eq(l, link) => *owed += n,
                _ => *w = Some((link.clone(), n)),
            }
        }
        // Drained between the check and the record: its wake found nothing to release.
        if !self.held_back() {
            self.release_credit();
        }
        true
    }

    /// While the consumer's output is full: registered to release the credit once it drains
    /// (`flow.rs`). False if it has room.
    fn held_back(self: &Arc<Self>) -> bool {
        let sink = &self.consumer.sink;
        sink.output_full() && sink.wait_for_space(self.clone())
    }

    pub(super) fn deliver(self: &Arc<Self>, m: &QueuedMessage) {
        let q = QueueRef::Other(self.queue.clone());
        // Made before the home removed the consumer, being cancelled: back to the queue, never
        // to the client after its cancel-ok. A no-ack one cannot go back (the home forgot it
        // when it sent it): the client gets it, before the cancel-ok.
        if !self.consumer.no_ack && self.cancel_asked.load(Ordering::Acquire) {
            q.requeue([(Some(self.consumer.key), m.clone())]);
            return;
        }
        // Behind the ones held back, in order.
        if self.holding.load(Ordering::Acquire) {
            let mut held = self.held.lock();
            held.push_back(m.clone());
            self.flush_locked(&mut held);
            return;
        }
        match self
            .consumer
            .sink
            .push_limited(&self.consumer, q.clone(), m)
        {
            Some(true) => {}
            None => {
                {
                    let mut held = self.held.lock();
                    held.push_back(m.clone());
                    self.holding.store(true, Ordering::Release);
                }
                self.queue.hold(self);
                // Room made between the refusal and the record: its kick found nothing held.
                self.flush();
            }
            // The channel is closing: back to the queue at once.
            Some(false) if !self.consumer.no_ack => {
                q.requeue([(Some(self.consumer.key), m.clone())]);
            }
            Some(false) => {}
        }
    }

    /// Hands held deliveries over while the channel-wide prefetch has room; true if some are
    /// still held.
    pub(super) fn flush(&self) -> bool {
        let mut held = self.held.lock();
        self.flush_locked(&mut held)
    }

    fn flush_locked(&self, held: &mut std::collections::VecDeque<QueuedMessage>) -> bool {
        let q = QueueRef::Other(self.queue.clone());
        while let Some(m) = held.pop_front() {
            match self
                .consumer
                .sink
                .push_limited(&self.consumer, q.clone(), &m)
            {
                Some(true) => {}
                None => {
                    held.push_front(m);
                    self.holding.store(true, Ordering::Release);
                    return true;
                }
                Some(false) if !self.consumer.no_ack => {
                    q.requeue([(Some(self.consumer.key), m)]);
                }
                Some(false) => {}
            }
        }
        self.holding.store(false, Ordering::Release);
        false
    }

    /// What it holds, taken (its consumer goes: they go back to the queue).
    pub(super) fn take_held(&self) -> Vec<QueuedMessage> {
        let mut held = self.held.lock();
        self.holding.store(false, Ordering::Release);
        held.drain(..).collect()
    }
}
