//! A stream's consumers: adding one at its start offset (RabbitMQ's checks first), removing
//! one, and the credit its acks give back. Each consumer reads in its own task (`read`).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use crate::error::{AmqpError, AmqpResult};
use crate::queue::{Consumer, Settled};

use super::read::first_at_or_after;
use super::{Reader, StartAt, Stream};

impl Stream {
    /// Adds a consumer starting at `start`; `on_added` sends consume-ok before any delivery.
    pub fn add_consumer(
        self: &Arc<Self>,
        c: Arc<Consumer>,
        start: StartAt,
        on_added: impl FnOnce(),
    ) -> AmqpResult<()> {
        // RabbitMQ's order: the prefetch first, then the ack mode.
        if c.prefetch == 0 {
            return Err(AmqpError::precondition_failed(format!(
                "consumer prefetch count is not set for '{}'",
                self.describe()
            )));
        }
        if c.no_ack {
            return Err(AmqpError::not_implemented(format!(
                "automatic acknowledgement not supported by stream queues {}",
                self.describe()
            )));
        }
        let from = {
            let g = self.inner.lock();
            if g.deleted {
                return Err(AmqpError::not_found(format!("no {}", self.describe())));
            }
            let first = g.log.first_offset();
            match start {
                StartAt::First => first,
                StartAt::Next => g.log.next_offset(),
                StartAt::Last if g.log.written() > first => g.log.last_chunk().max(first),
                StartAt::Last => g.log.next_offset(),
                StartAt::Offset(n) => n.max(first),
                StartAt::Time(ms) => match g.log.plan_at_time(ms) {
                    None => g.log.written(),
                    Some(plan) => {
                        // Read without the lock would race retention for nothing: this is once
                        // per consume, at most one index step of a segment.
                        let written = g.log.written();
                        drop(g);
                        first_at_or_after(&plan, ms).unwrap_or(written)
                    }
                },
            }
        };
        let reader = Arc::new(Reader {
            credit: AtomicU32::new(u32::from(c.prefetch)),
            consumer: c,
            wake: tokio::sync::Notify::new(),
            at_end: AtomicBool::new(false),
        });
        self.readers.lock().push(reader.clone());
        on_added();
        tokio::spawn(self.clone().serve(reader, from));
        Ok(())
    }

    pub fn remove_consumer(&self, c: &Arc<Consumer>) {
        let mut rs = self.readers.lock();
        if let Some(i) = rs.iter().position(|r| r.consumer.key == c.key) {
            let r = rs.swap_remove(i);
            r.wake.notify_one();
        }
    }

    pub fn consumers(&self) -> Vec<Arc<Consumer>> {
        self.readers
            .lock()
            .iter()
            .map(|r| r.consumer.clone())
            .collect()
    }

    pub fn consumer_count(&self) -> u32 {
        self.readers.lock().len() as u32
    }

    pub fn unacked_count(&self) -> u32 {
        self.readers
            .lock()
            .iter()
            .map(|r| {
                u32::from(r.consumer.prefetch).saturating_sub(r.credit.load(Ordering::Relaxed))
            })
            .sum()
    }

    /// Acks (and anything else that ends a delivery) give the consumer its credit back.
    pub fn settle(&self, msgs: impl IntoIterator<Item = Settled>) {
        let mut counts: Vec<(u64, u32)> = Vec::new();
        let mut n = 0;
        for (key, _) in msgs {
            n += 1;
            let Some(key) = key else { continue };
            match counts.iter_mut().find(|(k, _)| *k == key) {
                Some(c) => c.1 += 1,
                None => counts.push((key, 1)),
            }
        }
        self.stats.ack.fetch_add(n, Ordering::Relaxed);
        let rs = self.readers.lock();
        for (key, k) in counts {
            if let Some(r) = rs.iter().find(|r| r.consumer.key == key) {
                let before = r.credit.fetch_add(k, Ordering::AcqRel);
                if before == 0 {
                    r.wake.notify_one();
                }
            }
        }
    }

    /// Lets every consumer try again (room opened under a channel-wide limit).
    pub fn dispatch(&self) {
        for r in self.readers.lock().iter() {
            r.wake.notify_one();
        }
    }
}

/// A stream whose consumer's output drained wakes its consumers (`flow.rs`).
impl crate::flow::SpaceWaiter for Stream {
    fn space(self: Arc<Self>) {
        self.dispatch()
    }
}
