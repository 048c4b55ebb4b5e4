//! Resource alarms, as RabbitMQ has them: a memory high watermark (default 0.4 of RAM, or an
//! absolute size) and a disk free limit (default 50 MB). While either is on, every connection
//! that publishes gets connection.blocked (if it announced the capability) and its socket is not
//! read until the alarm clears, so TCP pushes back on the publisher; consumers keep draining.
//! Thresholds are re-read from the config file on SIGHUP; the memory one is also set at runtime
//! by `warren ctl set_vm_memory_high_watermark` (through the management API).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::config::LimitsConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AlarmState {
    pub memory: bool,
    pub disk: bool,
}

impl AlarmState {
    pub fn any(&self) -> bool {
        self.memory || self.disk
    }

    /// The reason RabbitMQ puts in connection.blocked.
    pub fn reason(&self) -> &'static str {
        match (self.memory, self.disk) {
            (true, true) => "low on memory, low on disk space",
            (true, false) => "low on memory",
            _ => "low on disk space",
        }
    }
}

/// RabbitMQ's `vm_memory_high_watermark`: a fraction of RAM or an absolute size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemoryWatermark {
    Fraction(f64),
    Absolute(u64),
}

impl MemoryWatermark {
    /// The resident size at which the memory alarm goes on.
    pub fn bytes(self) -> u64 {
        match self {
            MemoryWatermark::Fraction(f) => {
                (total_memory_bytes().unwrap_or(u64::MAX / 2) as f64 * f) as u64
            }
            MemoryWatermark::Absolute(b) => b,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    pub memory_bytes: u64,
    pub disk_free_bytes: u64,
    /// What `memory_bytes` was computed from, as status reports it.
    pub memory_watermark: MemoryWatermark,
}

impl Thresholds {
    pub fn from_limits(l: &LimitsConfig) -> Thresholds {
        let memory_watermark = match l.memory_high_watermark_bytes {
            Some(b) => MemoryWatermark::Absolute(b),
            None => MemoryWatermark::Fraction(l.memory_high_watermark),
        };
        Thresholds {
            memory_bytes: memory_watermark.bytes(),
            disk_free_bytes: l.disk_free_limit_bytes,
            memory_watermark,
        }
    }
}

pub struct Alarms {
    tx: watch::Sender<AlarmState>,
    thresholds: Mutex<Thresholds>,
    data_dir: PathBuf,
}

impl Alarms {
    pub fn new(thresholds: Thresholds, data_dir: PathBuf) -> Arc<Alarms> {
        let (tx, _) = watch::channel(AlarmState::default());
        let a = Arc::new(Alarms {
            tx,
            thresholds: Mutex::new(thresholds),
            data_dir,
        });
        a.check();
        a
    }

    pub fn subscribe(&self) -> watch::Receiver<AlarmState> {
        self.tx.subscribe()
    }

    pub fn set_thresholds(&self, t: Thresholds) {
        tracing::info!(
            memory_high_watermark_bytes = t.memory_bytes,
            disk_free_limit_bytes = t.disk_free_bytes,
            "alarm thresholds set"
        );
        *self.thresholds.lock() = t;
        self.check();
    }

    /// rabbitmqctl's set_vm_memory_high_watermark: a new memory threshold, in force at once (the
    /// disk one stays). Until the next SIGHUP re-reads the config file, or a restart.
    pub fn set_memory_watermark(&self, w: MemoryWatermark) {
        let mut t = self.thresholds();
        t.memory_watermark = w;
        t.memory_bytes = w.bytes();
        self.set_thresholds(t);
    }

    pub fn thresholds(&self) -> Thresholds {
        *self.thresholds.lock()
    }

    pub fn state(&self) -> AlarmState {
        *self.tx.borrow()
    }

    /// Free space on the data directory's file system, if it can be read.
    pub fn disk_free_bytes(&self) -> Option<u64> {
        disk_free_bytes(&self.data_dir)
    }

    /// Samples memory and disk and flips the alarms (logged once per change).
    pub fn check(&self) {
        let t = *self.thresholds.lock();
        let rss = resident_bytes().unwrap_or(0);
        let free = disk_free_bytes(&self.data_dir).unwrap_or(u64::MAX);
        let now = AlarmState {
            memory: rss > t.memory_bytes,
            disk: free < t.disk_free_bytes,
        };
        let before = *self.tx.borrow();
        if now == before {
            return;
        }
        if now.memory != before.memory {
            if now.memory {
                tracing::warn!(
                    rss_bytes = rss,
                    limit_bytes = t.memory_bytes,
                    "memory alarm set: publishers blocked"
                );
            } else {
                tracing::info!(
                    rss_bytes = rss,
                    limit_bytes = t.memory_bytes,
                    "memory alarm cleared"
                );
            }
        }
        if now.disk != before.disk {
            if now.disk {
                tracing::warn!(
                    free_bytes = free,
                    limit_bytes = t.disk_free_bytes,
                    "disk alarm set: publishers blocked"
                );
            } else {
                tracing::info!(
                    free_bytes = free,
                    limit_bytes = t.disk_free_bytes,
                    "disk alarm cleared"
                );
            }
        }
        self.tx.send_replace(now);
    }

    pub async fn run(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_millis(crate::limits::ALARM_CHECK_MS));
        loop {
            tick.tick().await;
            self.check();
        }
    }
}

pub fn total_memory_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    kb_field(&s, "MemTotal:")
}

/// This process's resident memory (what the memory alarm compares, RabbitMQ's `rss` strategy).
pub fn resident_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    kb_field(&s, "VmRSS:")
}

fn kb_field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

fn disk_free_bytes(dir: &std::path::Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(s.blocks_available() as u64 * s.fragment_size() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        assert!(resident_bytes().is_some_and(|b| b > 0));
        assert!(total_memory_bytes().is_some_and(|b| b > 0));
        assert!(disk_free_bytes(std::path::Path::new("/")).is_some());
        assert_eq!(kb_field("VmRSS:\t  1234 kB\n", "VmRSS:"), Some(1234 * 1024));
    }

    #[test]
    fn thresholds_trip_and_clear() {
        let a = Alarms::new(
            Thresholds {
                memory_bytes: u64::MAX,
                disk_free_bytes: 0,
                memory_watermark: MemoryWatermark::Absolute(u64::MAX),
            },
            PathBuf::from("/"),
        );
        let rx = a.subscribe();
        assert!(!rx.borrow().any());
        a.set_thresholds(Thresholds {
            memory_bytes: 1,
            disk_free_bytes: 0,
            memory_watermark: MemoryWatermark::Absolute(1),
        });
        assert!(rx.borrow().memory);
        assert_eq!(rx.borrow().reason(), "low on memory");
        a.set_thresholds(Thresholds {
            memory_bytes: u64::MAX,
            disk_free_bytes: u64::MAX,
            memory_watermark: MemoryWatermark::Absolute(u64::MAX),
        });
        assert!(!rx.borrow().memory && rx.borrow().disk);
    }

    #[test]
    fn memory_watermark_set_at_runtime_keeps_the_disk_limit() {
        let a = Alarms::new(
            Thresholds {
                memory_bytes: u64::MAX,
                disk_free_bytes: 7,
                memory_watermark: MemoryWatermark::Absolute(u64::MAX),
            },
            PathBuf::from("/"),
        );
        a.set_memory_watermark(MemoryWatermark::Fraction(0.0));
        assert!(a.state().memory, "a zero watermark is always exceeded");
        let t = a.thresholds();
        assert_eq!((t.memory_bytes, t.disk_free_bytes), (0, 7));
        a.set_memory_watermark(MemoryWatermark::Absolute(u64::MAX));
        assert!(!a.state().memory);
        let ram = total_memory_bytes().expect("meminfo");
        assert_eq!(MemoryWatermark::Fraction(0.5).bytes(), ram / 2);
    }
}
