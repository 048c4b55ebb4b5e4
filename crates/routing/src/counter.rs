//! A counter bumped from many threads at once without sharing a cache line: one slot per
//! shard, a thread always uses the same shard, a read sums them. For statistics on the publish
//! path, where a plain atomic shared by every publisher would bounce between cores (nats-server
//! and the Linux kernel's percpu counters do the same).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[repr(align(64))]
#[derive(Default)]
struct Slot(AtomicU64);

pub struct Counter {
    slots: Box<[Slot]>,
}

/// A power of two at least the number of cores (at most 64).
fn shards() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, 64)
            .next_power_of_two()
    })
}

/// This thread's shard: threads take the next one in turn, once.
#[inline]
fn shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    SHARD.with(|s| *s)
}

impl Default for Counter {
    fn default() -> Self {
        Counter {
            slots: (0..shards()).map(|_| Slot::default()).collect(),
        }
    }
}

impl Counter {
    #[inline]
    pub fn add(&self, n: u64) {
        let i = shard() & (self.slots.len() - 1);
        self.slots[i].0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.slots.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counter({})", self.get())
    }
}

/// An exchange's message statistics, kept across the rebuilds a binding change makes.
#[derive(Debug, Default)]
pub struct ExchangeStats {
    /// Messages published to it.
    pub publish_in: Counter,
    /// Messages it routed to at least one queue.
    pub publish_out: Counter,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_what_every_thread_added() {
        let c = std::sync::Arc::new(Counter::default());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || (0..1000).for_each(|_| c.add(1)))
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().expect("joins"));
        c.add(5);
        assert_eq!(c.get(), 8005);
    }
}
