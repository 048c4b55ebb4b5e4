//! The rows of `warren ctl`'s listings (`/api/warren/connections`, `channels`, `consumers`):
//! this node's, under rabbitmqctl's column names, with pids and client properties in the
//! client's order. `cluster_view` asks every node for its rows.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use serde_json::{json, Value};
use warren_broker::server::Broker;
use warren_broker::tracking::ConnInfo;
use warren_protocol::{FieldTable, FieldValue};

use crate::stats_api::{addr, connection_json, open_connections};

/// A field table in the client's order, keeping what JSON objects would lose: a table is
/// `{"table": [[key, value], ...]}`, an array a JSON array; other values as the broker's
/// `json.rs` maps them.
fn ordered_table(t: &FieldTable) -> Value {
    let pairs: Vec<Value> =
        t.0.iter()
            .map(|(k, v)| json!([&**k, ordered_value(v)]))
            .collect();
    json!({ "table": pairs })
}

fn ordered_value(v: &FieldValue) -> Value {
    match v {
        FieldValue::Table(t) => ordered_table(t),
        FieldValue::Array(a) => Value::Array(a.iter().map(ordered_value).collect()),
        other => warren_broker::json::value_to_json(other),
    }
}

/// This node's connections, as `list_connections` shows them.
pub fn connection_rows(b: &Broker) -> Vec<Value> {
    open_connections(b)
        .iter()
        .map(|c| {
            let mut row = connection_json(c);
            row["pid"] = json!(c.pid());
            row["client_properties"] = ordered_table(&c.client_table);
            row["channel_max"] = json!(b.config.limits.channel_max);
            row
        })
        .collect()
}

/// Every open channel's pid, by the address of its shared half (which consumers' sinks are).
fn channel_pids(conns: &[Arc<ConnInfo>]) -> HashMap<usize, String> {
    let mut pids = HashMap::new();
    for c in conns {
        for ch in c.channels() {
            pids.insert(addr(&ch), c.channel_pid(ch.id));
        }
    }
    pids
}

/// This node's channels, as `list_channels` shows them.
pub fn channel_rows(b: &Broker) -> Vec<Value> {
    let consumers_on = crate::stats_api::consumers_by_channel(b);
    let mut rows = Vec::new();
    for c in open_connections(b) {
        for ch in c.channels() {
            let (unacked, global_prefetch) = ch.unacked_and_global_prefetch();
            rows.push(json!({
                "pid": c.channel_pid(ch.id),
                "connection": c.pid(),
                "name": format!("{} ({})", c.name, ch.id),
                "number": ch.id,
                "user": c.user,
                "vhost": c.vhost,
                "consumer_count": consumers_on.get(&addr(&ch)).copied().unwrap_or(0),
                "messages_unacknowledged": unacked,
                "prefetch_count": ch.modes.prefetch_count.load(Relaxed),
                "global_prefetch_count": global_prefetch,
                "confirm": ch.modes.confirm.load(Relaxed),
                "transactional": ch.modes.transactional.load(Relaxed),
            }));
        }
    }
    rows
}

/// This node's consumers, as `list_consumers` shows them; in a cluster, those whose channel
/// is on this node.
pub fn consumer_rows(b: &Broker) -> Vec<Value> {
    let pids = channel_pids(&open_connections(b));
    let clustered = b.cluster_handle().is_some();
    crate::stats_api::consumers_in(b.vhosts())
        .into_iter()
        .filter(|l| !clustered || pids.contains_key(&addr(&l.consumer.sink)))
        .map(|l| {
            let c = &l.consumer;
            let mut args = FieldTable::new();
            // Warren keeps a consumer's x-priority, not the arguments table it came in.
            if c.priority != 0 {
                args.insert("x-priority", FieldValue::I64(c.priority));
            }
            json!({
                "vhost": &*l.vhost.name,
                "queue_name": &**l.queue.name(),
                "channel_pid": pids.get(&addr(&c.sink)).cloned().unwrap_or_default(),
                "consumer_tag": &*c.tag,
                "ack_required": !c.no_ack,
                "prefetch_count": c.prefetch,
                "exclusive": c.exclusive,
                "active": l.active,
                "activity_status": l.status,
                "arguments": ordered_table(&args),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_table_keeps_order_and_nesting() {
        let mut inner = FieldTable::new();
        inner.insert("z", FieldValue::Bool(true));
        inner.insert("a", FieldValue::I32(1));
        let mut t = FieldTable::new();
        t.insert("product", FieldValue::str("x"));
        t.insert("capabilities", FieldValue::Table(inner));
        t.insert(
            "list",
            FieldValue::Array(vec![
                FieldValue::str("a"),
                FieldValue::Table(FieldTable::new()),
            ]),
        );
        assert_eq!(
            ordered_table(&t),
            json!({"table": [
                ["product", "x"],
                ["capabilities", {"table": [["z", true], ["a", 1]]}],
                ["list", ["a", {"table": []}]],
            ]})
        );
    }
}
