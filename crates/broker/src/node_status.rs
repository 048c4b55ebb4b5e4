//! What a node reports of itself: RabbitMQ's node object (`/api/nodes`, and a cluster peer's
//! answer to `SERVICE_NODE`), the node's churn counters and its file descriptors. Read on
//! demand; nothing here is on the message path.

use serde_json::{json, Value};

use crate::metrics::Churn;
use crate::server::Broker;

/// RabbitMQ's node object, with what Warren measures.
pub fn node_json(b: &Broker) -> Value {
    let t = b.alarms.thresholds();
    let st = b.alarms.state();
    let (fd_used, fd_total) = file_descriptors();
    let connections = b.connections.lock().len();
    let exchange_types: Vec<Value> = ["direct", "fanout", "topic", "headers", "x-consistent-hash"]
        .iter()
        .map(|n| json!({"name": n, "enabled": true}))
        .collect();
    let mut v = json!({
        "name": b.config.node_name,
        "type": "disc",
        "running": true,
        "os_pid": std::process::id().to_string(),
        "mem_used": crate::alarms::resident_bytes().unwrap_or(0),
        "mem_limit": t.memory_bytes,
        "mem_alarm": st.memory,
        "mem_calculation_strategy": "rss",
        "disk_free": b.alarms.disk_free_bytes().unwrap_or(0),
        "disk_free_limit": t.disk_free_bytes,
        "disk_free_alarm": st.disk,
        "fd_used": fd_used.unwrap_or(0),
        "fd_total": fd_total.unwrap_or(0),
        "sockets_used": connections,
        "sockets_total": fd_total.unwrap_or(0),
        "proc_used": connections,
        "proc_total": fd_total.unwrap_or(0),
        "processors": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "uptime": b.started_at.elapsed().as_millis() as u64,
        "run_queue": 0,
        "partitions": [],
        // Warren's own: the open AMQP connections and the node's part in the metadata group.
        "connections": connections,
        "raft_role": b.cluster_handle().map_or("none", |c| c.raft_role()),
        "cluster_links": b.cluster_handle().map_or(json!([]), |c| {
            json!(c.links().into_iter().map(|(name, addr)| json!({"name": name, "peer_addr": addr})).collect::<Vec<_>>())
        }),
        "rates_mode": "basic",
        "net_ticktime": 60,
        "db_dir": b.config.data_dir.display().to_string(),
        "exchange_types": exchange_types,
        "auth_mechanisms": [
            {"name": "PLAIN", "enabled": true},
            {"name": "AMQPLAIN", "enabled": true},
        ],
        "applications": [{"name": "warren", "description": "Warren",
                          "version": env!("CARGO_PKG_VERSION")}],
    });
    // The node's churn, as RabbitMQ puts it on the node object.
    let churn = node_churn(b);
    if let (Value::Object(m), Value::Object(c)) = (
        &mut v,
        crate::metrics::with_details(&churn, &vec![0.0; churn.len()]),
    ) {
        m.extend(c);
    }
    v
}

/// Connections, channels and queues made and gone on this node.
pub fn node_churn(b: &Broker) -> Vec<(&'static str, u64)> {
    let total = Churn::default();
    total.absorb(&b.churn);
    for v in b.vhosts() {
        total.absorb(&v.churn);
    }
    total.values()
}

/// Open file descriptors and their soft limit, from /proc (None where it cannot be read).
pub fn file_descriptors() -> (Option<u64>, Option<u64>) {
    let open = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count() as u64);
    let limit = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("Max open files"))?;
            line["Max open files".len()..]
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        });
    (open, limit)
}
