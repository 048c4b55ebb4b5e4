//! A federation link's status as `/api/federation-links` and `warren ctl federation_status`
//! show it (RabbitMQ's `rabbit_federation_status` rows: `starting`, `running`, `error` with the
//! reason).

use std::time::SystemTime;

use serde_json::{json, Value};
use warren_shovel::uri::Remote;

#[derive(Debug, Clone)]
pub struct LinkStatus {
    /// `starting`, `running` or `error`.
    pub status: &'static str,
    pub error: Option<String>,
    pub since: SystemTime,
    /// While running: the upstream's URI (without credentials), exchange, queue and internal
    /// exchange.
    pub uri: Option<String>,
    pub upstream_exchange: Option<String>,
    pub upstream_queue: Option<String>,
    pub internal_exchange: Option<String>,
    /// Messages moved since the link started on this node.
    pub forwarded: u64,
    /// What an exchange link made on its upstream (where, its queue, its internal
    /// exchange): deleted when the link is no longer wanted.
    pub made_upstream: Option<(Remote, String, String)>,
}

impl Default for LinkStatus {
    fn default() -> LinkStatus {
        LinkStatus {
            status: "starting",
            error: None,
            since: SystemTime::now(),
            uri: None,
            upstream_exchange: None,
            upstream_queue: None,
            internal_exchange: None,
            forwarded: 0,
            made_upstream: None,
        }
    }
}

impl LinkStatus {
    pub fn starting(&mut self) {
        self.status = "starting";
        self.since = SystemTime::now();
    }

    pub fn running(&mut self, uri: String, exchange: String, queue: String, internal: String) {
        self.status = "running";
        self.error = None;
        self.since = SystemTime::now();
        self.uri = Some(uri);
        self.upstream_exchange = Some(exchange);
        self.upstream_queue = Some(queue);
        self.internal_exchange = Some(internal);
    }

    pub fn failed(&mut self, reason: String) {
        self.status = "error";
        self.error = Some(reason);
        self.since = SystemTime::now();
    }

    /// The `/api/federation-links` row of a link federating the exchange or queue (`kind`)
    /// `name`.
    pub fn row(&self, node: &str, vhost: &str, kind: &str, name: &str, upstream: &str) -> Value {
        let mut row = json!({
            "node": node,
            "vhost": vhost,
            "type": kind,
            kind: name,
            "upstream": upstream,
            "status": self.status,
            "timestamp": warren_shovel::status::timestamp(self.since),
            "forwarded": self.forwarded,
        });
        let o = row.as_object_mut().expect("a JSON object");
        if let Some(e) = &self.error {
            o.insert("error".into(), e.clone().into());
        }
        if self.status == "running" {
            o.insert("uri".into(), self.uri.clone().into());
            if kind == "exchange" {
                o.insert(
                    "upstream_exchange".into(),
                    self.upstream_exchange.clone().into(),
                );
            }
            o.insert("upstream_queue".into(), self.upstream_queue.clone().into());
        }
        row
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_links_row_names_its_queue() {
        let mut s = LinkStatus::default();
        s.running("amqp://h".into(), String::new(), "uq".into(), String::new());
        let row = s.row("n1", "/", "queue", "q1", "up1");
        assert_eq!(row["type"], "queue");
        assert_eq!(row["queue"], "q1");
        assert_eq!(row["upstream_queue"], "uq");
        assert!(row.get("upstream_exchange").is_none());
        assert!(row.get("exchange").is_none());
        let row = s.row("n1", "/", "exchange", "x1", "up1");
        assert_eq!(row["exchange"], "x1");
    }
}
