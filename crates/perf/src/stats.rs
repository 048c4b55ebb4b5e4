//! Counters and latency histograms shared by the client tasks, and the per-interval samples and
//! run summary computed from them.
//!
//! Tasks add to atomic counters and record latencies into one interval histogram per kind, taking
//! its lock once per read batch, not per message. The sampler swaps the interval histograms out
//! every interval and folds them into the run's totals.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::Serialize;

/// Latencies are recorded in microseconds, from 1 µs to an hour, 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("constant bounds are valid")
}

#[derive(Default)]
pub struct Counters {
    pub sent: AtomicU64,
    pub confirmed: AtomicU64,
    pub nacked: AtomicU64,
    pub returned: AtomicU64,
    pub received: AtomicU64,
}

/// Shared by every task of one run.
pub struct Stats {
    pub counters: Counters,
    /// When the last delivery arrived ([`crate::body::now_ns`]), for idle detection.
    pub last_receive_ns: AtomicU64,
    /// When the last producer finished sending, for the duration of a bounded run.
    pub last_send_done_ns: AtomicU64,
    latency_us: Mutex<Histogram<u64>>,
    confirm_us: Mutex<Histogram<u64>>,
    /// The first error a task hit; the run ends on it.
    pub error: Mutex<Option<String>>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            counters: Counters::default(),
            last_receive_ns: AtomicU64::new(0),
            last_send_done_ns: AtomicU64::new(0),
            latency_us: Mutex::new(new_histogram()),
            confirm_us: Mutex::new(new_histogram()),
            error: Mutex::new(None),
        }
    }
}

impl Stats {
    /// Consumer latencies in nanoseconds.
    pub fn record_latencies(&self, ns: &[u64]) {
        if ns.is_empty() {
            return;
        }
        let mut h = self.latency_us.lock();
        for v in ns {
            h.saturating_record((v / 1000).max(1));
        }
    }

    /// Confirm latencies in nanoseconds.
    pub fn record_confirms(&self, ns: &[u64]) {
        if ns.is_empty() {
            return;
        }
        let mut h = self.confirm_us.lock();
        for v in ns {
            h.saturating_record((v / 1000).max(1));
        }
    }

    pub fn fail(&self, msg: String) {
        let mut e = self.error.lock();
        if e.is_none() {
            *e = Some(msg);
        }
    }

    pub fn snapshot(&self) -> Counts {
        let c = &self.counters;
        Counts {
            sent: c.sent.load(Relaxed),
            confirmed: c.confirmed.load(Relaxed),
            nacked: c.nacked.load(Relaxed),
            returned: c.returned.load(Relaxed),
            received: c.received.load(Relaxed),
        }
    }

    /// Takes the interval histograms (consumer latency, confirm latency), leaving empty ones.
    pub fn take_interval(&self) -> (Histogram<u64>, Histogram<u64>) {
        let l = std::mem::replace(&mut *self.latency_us.lock(), new_histogram());
        let c = std::mem::replace(&mut *self.confirm_us.lock(), new_histogram());
        (l, c)
    }
}

/// Counter values at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Counts {
    pub sent: u64,
    pub confirmed: u64,
    pub nacked: u64,
    pub returned: u64,
    pub received: u64,
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    pub min: u64,
    pub p50: u64,
    pub p75: u64,
    pub p95: u64,
    pub p99: u64,
    pub max: u64,
}

impl Percentiles {
    pub fn of(h: &Histogram<u64>) -> Option<Percentiles> {
        if h.is_empty() {
            return None;
        }
        Some(Percentiles {
            min: h.min(),
            p50: h.value_at_quantile(0.50),
            p75: h.value_at_quantile(0.75),
            p95: h.value_at_quantile(0.95),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
        })
    }

    /// PerfTest's `min/median/75th/95th/99th` figure.
    pub fn perftest(&self) -> String {
        format!(
            "{}/{}/{}/{}/{}",
            self.min, self.p50, self.p75, self.p95, self.p99
        )
    }
}

/// One interval: rates in msg/s and the interval's latency percentiles.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds since the producers started, at the end of the interval.
    pub t_s: f64,
    pub sent: f64,
    pub confirmed: f64,
    pub nacked: f64,
    pub returned: f64,
    pub received: f64,
    pub latency_us: Option<Percentiles>,
    pub confirm_latency_us: Option<Percentiles>,
}

/// The whole run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub duration_s: f64,
    pub totals: Counts,
    pub send_rate: f64,
    pub confirm_rate: f64,
    pub receive_rate: f64,
    pub latency_us: Option<Percentiles>,
    pub confirm_latency_us: Option<Percentiles>,
}

/// Turns counter snapshots and interval histograms into samples and a summary.
pub struct Sampler {
    last: Counts,
    last_t_s: f64,
    total_latency: Histogram<u64>,
    total_confirm: Histogram<u64>,
    pub samples: Vec<Sample>,
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler {
            last: Counts::default(),
            last_t_s: 0.0,
            total_latency: new_histogram(),
            total_confirm: new_histogram(),
            samples: Vec::new(),
        }
    }
}

impl Sampler {
    /// Closes the interval ending at `t_s` with the counters then; returns the new sample.
    pub fn sample(
        &mut self,
        t_s: f64,
        now: Counts,
        latency: &Histogram<u64>,
        confirm: &Histogram<u64>,
    ) -> &Sample {
        let dt = (t_s - self.last_t_s).max(1e-9);
        let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
        let s = Sample {
            t_s,
            sent: rate(now.sent, self.last.sent),
            confirmed: rate(now.confirmed, self.last.confirmed),
            nacked: rate(now.nacked, self.last.nacked),
            returned: rate(now.returned, self.last.returned),
            received: rate(now.received, self.last.received),
            latency_us: Percentiles::of(latency),
            confirm_latency_us: Percentiles::of(confirm),
        };
        self.fold(latency, confirm);
        self.last = now;
        self.last_t_s = t_s;
        self.samples.push(s);
        &self.samples[self.samples.len() - 1]
    }

    /// Adds latencies recorded after the last interval (the tail of the run) to the totals only.
    pub fn fold(&mut self, latency: &Histogram<u64>, confirm: &Histogram<u64>) {
        // Same bounds on both sides, so add cannot fail.
        let _ = self.total_latency.add(latency);
        let _ = self.total_confirm.add(confirm);
    }

    pub fn summary(&self, duration_s: f64, totals: Counts) -> Summary {
        let d = duration_s.max(1e-9);
        Summary {
            duration_s,
            totals,
            send_rate: totals.sent as f64 / d,
            confirm_rate: totals.confirmed as f64 / d,
            receive_rate: totals.received as f64 / d,
            latency_us: Percentiles::of(&self.total_latency),
            confirm_latency_us: Percentiles::of(&self.total_confirm),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_deltas_over_the_interval() {
        let mut s = Sampler::default();
        let empty = new_histogram();
        let c1 = Counts {
            sent: 1000,
            received: 800,
            ..Default::default()
        };
        let a = s.sample(1.0, c1, &empty, &empty).clone();
        assert_eq!((a.sent, a.received, a.confirmed), (1000.0, 800.0, 0.0));
        assert_eq!(a.latency_us, None);
        let c2 = Counts {
            sent: 3000,
            received: 2800,
            confirmed: 500,
            nacked: 2,
            returned: 4,
        };
        let b = s.sample(1.5, c2, &empty, &empty).clone();
        assert_eq!((b.sent, b.received), (4000.0, 4000.0), "2000 in 0.5 s");
        assert_eq!((b.confirmed, b.nacked, b.returned), (1000.0, 4.0, 8.0));
        let sum = s.summary(2.0, c2);
        assert_eq!(
            (sum.send_rate, sum.receive_rate, sum.confirm_rate),
            (1500.0, 1400.0, 250.0)
        );
    }

    #[test]
    fn percentiles_from_recorded_nanoseconds() {
        let stats = Stats::default();
        // 1..=100 ms in ns: p50 = 50 ms, p99 = 99 ms, recorded as µs.
        let ns: Vec<u64> = (1..=100).map(|ms| ms * 1_000_000).collect();
        stats.record_latencies(&ns);
        stats.record_latencies(&[10]); // below 1 µs counts as 1 µs
        let (l, c) = stats.take_interval();
        assert!(c.is_empty());
        let p = Percentiles::of(&l).expect("recorded");
        assert_eq!(p.min, 1);
        let close = |v: u64, want: u64| v.abs_diff(want) * 1000 <= want; // 3 significant digits
        assert!(close(p.p50, 50_000), "{p:?}");
        assert!(close(p.p99, 99_000), "{p:?}");
        assert!(close(p.max, 100_000), "{p:?}");
        assert_eq!(p.perftest().split('/').count(), 5);
        // The interval histogram is empty after take; totals keep everything.
        let (l2, _) = stats.take_interval();
        assert!(l2.is_empty());
        let mut s = Sampler::default();
        s.sample(1.0, Counts::default(), &l, &c);
        s.fold(&l, &c);
        let sum = s.summary(1.0, Counts::default());
        assert_eq!(sum.latency_us.map(|p| p.min), Some(1));
        assert_eq!(sum.confirm_latency_us, None);
    }

    #[test]
    fn first_error_wins() {
        let s = Stats::default();
        s.fail("a".into());
        s.fail("b".into());
        assert_eq!(s.error.lock().as_deref(), Some("a"));
    }
}
