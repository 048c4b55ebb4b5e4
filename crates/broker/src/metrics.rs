//! Message statistics for the management API (`message_stats` with rates) and Prometheus.
//!
//! Nothing here takes a lock on the message path. A counter bumped by one writer at a time
//! (a channel's own task, or whoever holds the lock it is kept under) is a plain load and store
//! ([`bump`]); counters bumped by every publisher at once (an exchange's) are sharded per core
//! (`warren_routing::counter::Counter`). Reads sum what they need when asked; rates come from
//! samples a background task takes every [`SAMPLE_EVERY`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{Map, Value};

/// How often rates are sampled (RabbitMQ's `collect_statistics_interval` is 5 s).
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Adds `n` to a counter that only one thread writes at a time (no locked instruction).
#[inline]
pub fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
}

/// One delivery (or basic.get) in its queue's or channel's counters: `ack_mode` or `no_ack`
/// (`deliver`/`deliver_no_ack`, or `get`/`get_no_ack`), and `redeliver`.
#[inline]
pub fn delivered(
    ack_mode: &AtomicU64,
    no_ack_mode: &AtomicU64,
    redeliver: &AtomicU64,
    no_ack: bool,
    redelivered: bool,
) {
    bump(if no_ack { no_ack_mode } else { ack_mode }, 1);
    if redelivered {
        bump(redeliver, 1);
    }
}

macro_rules! stats {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $field:ident),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Default)]
        pub struct $name {
            $($(#[$fm])* pub $field: AtomicU64,)*
        }

        impl $name {
            /// Every counter with RabbitMQ's name for it, in RabbitMQ's order.
            pub fn values(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($field), self.$field.load(Relaxed)),)*]
            }

            /// Adds another's counts (a closed channel's, into the node's totals).
            pub fn absorb(&self, other: &$name) {
                $(self.$field.fetch_add(other.$field.load(Relaxed), Relaxed);)*
            }
        }
    };
}

stats!(
    /// A queue's counts; bumped under the queue's lock.
    QueueStats {
        ack,
        deliver,
        deliver_no_ack,
        get,
        get_empty,
        get_no_ack,
        publish,
        redeliver,
    }
);

stats!(
    /// A channel's counts: `publish`, `confirm`, `ack`, `get_empty` and the unroutable ones by
    /// its connection's task; deliveries under its deliveries lock (`confirm` by whoever
    /// flushes confirms, so that one is added atomically).
    ChannelStats {
        ack,
        confirm,
        deliver,
        deliver_no_ack,
        drop_unroutable,
        get,
        get_empty,
        get_no_ack,
        publish,
        redeliver,
        return_unroutable,
    }
);

stats!(
    /// A channel's publishes as RabbitMQ's global counters (`rabbitmq_global_*`) count them, beyond
    /// its `message_stats`: bumped by its connection's task only.
    PublishStats {
        /// Publishes on a channel in confirm mode (`messages_received_confirm_total`).
        received_confirm,
        /// Publishes routed to at least one queue or stream, or held by a delayed exchange to
        /// be routed when due (`messages_routed_total`).
        routed,
    }
);

stats!(
    /// AMQP 0-9-1 authentication attempts on this node (RabbitMQ's `auth_attempt_metrics`):
    /// once per connection, at connection.start-ok.
    AuthAttempts {
        /// Every attempt with a known mechanism.
        attempts,
        failed,
        succeeded,
    }
);

stats!(
    /// Objects made and gone on this node (RabbitMQ's `churn_rates`); never per message.
    Churn {
        channel_closed,
        channel_created,
        connection_closed,
        connection_created,
        queue_created,
        queue_declared,
        queue_deleted,
    }
);

/// `deliver_get` as RabbitMQ sums it.
pub fn deliver_get(values: &[(&'static str, u64)]) -> u64 {
    values
        .iter()
        .filter(|(k, _)| matches!(*k, "deliver" | "deliver_no_ack" | "get" | "get_no_ack"))
        .map(|(_, v)| v)
        .sum()
}

/// Counter samples per object, for rates.
#[derive(Default)]
pub struct Rates {
    samples: Mutex<HashMap<String, Samples>>,
}

/// The two latest samples of an object's counters.
struct Samples {
    last: (Instant, Vec<u64>),
    prev: Option<(Instant, Vec<u64>)>,
}

impl Rates {
    /// Records a sample of every object in `objects`; objects not in it are forgotten.
    pub fn sample(&self, objects: Vec<(String, Vec<u64>)>) {
        let now = Instant::now();
        let mut old = std::mem::take(&mut *self.samples.lock());
        let fresh: HashMap<String, Samples> = objects
            .into_iter()
            .map(|(key, values)| {
                let prev = old.remove(&key).map(|s| s.last);
                (
                    key,
                    Samples {
                        last: (now, values),
                        prev,
                    },
                )
            })
            .collect();
        *self.samples.lock() = fresh;
    }

    /// Per-second rates of `values` (in the order sampled) against the newest sample at least
    /// one second old; zeros when there is none yet.
    pub fn rates(&self, key: &str, values: &[u64]) -> Vec<f64> {
        let now = Instant::now();
        let samples = self.samples.lock();
        let base = samples.get(key).and_then(|s| {
            let old_enough = |t: &Instant| now.duration_since(*t) >= Duration::from_secs(1);
            if old_enough(&s.last.0) {
                Some(&s.last)
            } else {
                s.prev.as_ref().filter(|p| old_enough(&p.0))
            }
        });
        match base {
            Some((t, before)) if before.len() == values.len() => {
                let dt = now.duration_since(*t).as_secs_f64();
                values
                    .iter()
                    .zip(before)
                    .map(|(v, b)| round(v.saturating_sub(*b) as f64 / dt))
                    .collect()
            }
            _ => vec![0.0; values.len()],
        }
    }
}

/// One decimal, as RabbitMQ prints rates.
fn round(r: f64) -> f64 {
    (r * 10.0).round() / 10.0
}

/// RabbitMQ's shape: each counter, and beside it `<name>_details: {"rate": r}`.
pub fn with_details(values: &[(&'static str, u64)], rates: &[f64]) -> Value {
    let mut m = Map::new();
    for (i, (k, v)) in values.iter().enumerate() {
        m.insert((*k).into(), (*v).into());
        let rate = rates.get(i).copied().unwrap_or(0.0);
        m.insert(format!("{k}_details"), serde_json::json!({ "rate": rate }));
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_come_from_a_sample_at_least_a_second_old() {
        let r = Rates::default();
        assert_eq!(r.rates("q", &[10]), vec![0.0], "no sample yet");
        r.sample(vec![("q".into(), vec![0])]);
        assert_eq!(
            r.rates("q", &[10]),
            vec![0.0],
            "the only sample is too recent"
        );
        std::thread::sleep(Duration::from_millis(1100));
        let rate = r.rates("q", &[11])[0];
        assert!((8.0..=10.1).contains(&rate), "{rate}");
        r.sample(vec![("other".into(), vec![1])]);
        assert_eq!(r.rates("q", &[20]), vec![0.0], "a gone object is forgotten");
    }

    #[test]
    fn details_sit_beside_each_counter() {
        let s = QueueStats::default();
        bump(&s.publish, 3);
        let v = with_details(&s.values(), &[0.0; 8]);
        assert_eq!(v["publish"], 3);
        assert_eq!(v["publish_details"]["rate"], 0.0);
    }
}
