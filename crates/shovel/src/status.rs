//! A shovel's status as `/api/shovels` and `warren ctl shovel_status` show it: RabbitMQ's
//! `starting`, `running` (with the URIs it connected to) and `terminated` (with the reason),
//! the time of the last change, and its counts.

use std::time::SystemTime;

use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Starting,
    Running,
    Terminated,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Running => "running",
            State::Terminated => "terminated",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Status {
    pub state: State,
    /// Why it terminated (the last failure).
    pub reason: Option<String>,
    pub since: SystemTime,
    /// The URIs it connected to (passwords hidden), while running.
    pub src_uri: Option<String>,
    pub dest_uri: Option<String>,
    /// Messages published to the destination since the shovel was created on this node.
    pub forwarded: u64,
    /// Published and not confirmed yet (`on-confirm`).
    pub pending: usize,
    /// What `delete-after` still allows, if set.
    pub remaining: Option<u64>,
}

impl Default for Status {
    fn default() -> Status {
        Status {
            state: State::Starting,
            reason: None,
            since: SystemTime::now(),
            src_uri: None,
            dest_uri: None,
            forwarded: 0,
            pending: 0,
            remaining: None,
        }
    }
}

impl Status {
    fn set(&mut self, state: State) {
        self.state = state;
        self.since = SystemTime::now();
    }

    pub fn starting(&mut self) {
        self.set(State::Starting);
        self.pending = 0;
    }

    pub fn running(&mut self, src_uri: String, dest_uri: String) {
        self.set(State::Running);
        self.reason = None;
        self.src_uri = Some(src_uri);
        self.dest_uri = Some(dest_uri);
    }

    pub fn terminated(&mut self, reason: String) {
        self.set(State::Terminated);
        self.reason = Some(reason);
        self.src_uri = None;
        self.dest_uri = None;
        self.pending = 0;
    }

    pub fn forwarded(&mut self, pending: usize, remaining: Option<u64>) {
        self.forwarded += 1;
        self.pending = pending;
        self.remaining = remaining;
    }

    pub fn settled(&mut self, pending: usize, remaining: Option<u64>) {
        self.pending = pending;
        self.remaining = remaining;
    }

    /// The `/api/shovels` row, as RabbitMQ's shovel management writes it (plus the counts).
    pub fn row(&self, node: &str, vhost: &str, name: &str, def: &Value) -> Value {
        let mut row = json!({
            "node": node,
            "timestamp": timestamp(self.since),
            "name": name,
            "vhost": vhost,
            "type": "dynamic",
            "state": self.state.as_str(),
            "forwarded": self.forwarded,
            "pending": self.pending,
        });
        let o = row.as_object_mut().expect("a JSON object");
        if let Some(r) = self.remaining {
            o.insert("remaining".into(), r.into());
        }
        match self.state {
            State::Terminated => {
                o.insert(
                    "reason".into(),
                    self.reason.clone().unwrap_or_default().into(),
                );
            }
            State::Running => {
                o.insert("src_uri".into(), self.src_uri.clone().into());
                o.insert("dest_uri".into(), self.dest_uri.clone().into());
                o.insert("src_protocol".into(), "amqp091".into());
                o.insert("dest_protocol".into(), "amqp091".into());
                for (key, field) in [
                    ("src-queue", "src_queue"),
                    ("src-exchange", "src_exchange"),
                    ("src-exchange-key", "src_exchange_key"),
                    ("dest-queue", "dest_queue"),
                    ("dest-exchange", "dest_exchange"),
                    ("dest-exchange-key", "dest_exchange_key"),
                ] {
                    if let Some(v) = def.get(key) {
                        o.insert(field.into(), v.clone());
                    }
                }
            }
            State::Starting => {}
        }
        row
    }
}

/// RabbitMQ's `YYYY-MM-DD H:MM:SS` (UTC; the hour is not padded, as RabbitMQ 3.10 writes it).
pub fn timestamp(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02} {}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 as a (year, month, day), Howard Hinnant's `civil_from_days`.
fn civil(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn timestamps_read_as_rabbitmq_writes_them() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_300_000);
        assert_eq!(timestamp(t), "2025-11-28 3:20:00");
        assert_eq!(timestamp(SystemTime::UNIX_EPOCH), "1970-01-01 0:00:00");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_300_000 + 12 * 3600);
        assert_eq!(timestamp(t), "2025-11-28 15:20:00");
    }
}
