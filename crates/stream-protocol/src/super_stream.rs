//! Super streams as RabbitMQ's `rabbit_stream_manager` makes them: a durable direct exchange
//! (argument `x-super-stream` true) bound to one stream per partition, each binding with the
//! partition's routing key and its place as `x-stream-partition-order`. The partitions are the
//! exchange's stream bindings in that order; a route is where the exchange sends a routing key.

use std::sync::Arc;

use bytes::Bytes;
use warren_broker::queue::QueueRef;
use warren_broker::vhost::{ExchangeSpec, QueueSpec, VHost};
use warren_protocol::{FieldTable, FieldValue};
use warren_routing::Destination;

pub const SUPER_STREAM_ARG: &str = "x-super-stream";
pub const PARTITION_ORDER_ARG: &str = "x-stream-partition-order";

/// Why a super stream was not made (RabbitMQ's reasons).
#[derive(Debug, PartialEq)]
pub enum Refused {
    /// An exchange or a queue of that name exists already.
    Exists(String),
    Invalid(String),
}

/// The partitions of the super stream `name`, in order; `None` when there is no such exchange.
pub fn partitions(v: &VHost, name: &str) -> Option<Vec<String>> {
    let snap = v.snapshot();
    let x = snap.table.exchanges.get(name)?;
    let mut parts: Vec<(i64, String)> = x
        .bindings
        .iter()
        .filter_map(|b| match &b.destination {
            Destination::Queue(q) if matches!(q, QueueRef::Stream(_)) => {
                let order = b
                    .arguments
                    .get(PARTITION_ORDER_ARG)
                    .and_then(FieldValue::as_i64)
                    .unwrap_or(i64::MAX);
                Some((order, q.name().to_string()))
            }
            _ => None,
        })
        .collect();
    parts.sort();
    parts.dedup_by(|a, b| a.1 == b.1);
    Some(parts.into_iter().map(|(_, n)| n).collect())
}

/// The streams the super stream `name` routes `key` to; `None` when there is no such exchange.
pub fn route(v: &VHost, name: &str, key: &str) -> Option<Vec<String>> {
    let snap = v.snapshot();
    let x = snap.table.exchanges.get(name)?;
    let mut out: Vec<String> = Vec::new();
    for b in &x.bindings {
        if let Destination::Queue(q @ QueueRef::Stream(_)) = &b.destination {
            if &*b.routing_key == key && !out.iter().any(|n| n == &**q.name()) {
                out.push(q.name().to_string());
            }
        }
    }
    Some(out)
}

/// Creates the super stream `name` with `partitions` bound by `keys` (one each), each stream
/// declared with `arguments` (`x-`-prefixed stream arguments). What was made is undone when a
/// step fails.
pub fn create(
    v: &Arc<VHost>,
    name: &str,
    partitions: &[String],
    keys: &[String],
    arguments: &FieldTable,
    conn_id: u64,
) -> Result<(), Refused> {
    if name.is_empty() || partitions.is_empty() || partitions.len() != keys.len() {
        return Err(Refused::Invalid(format!(
            "{name} is not a correct name for a super stream"
        )));
    }
    if v.snapshot().table.exchanges.contains_key(name) {
        return Err(Refused::Exists(format!(
            "there is already an exchange named {name}"
        )));
    }
    if let Some(q) = partitions.iter().find(|p| v.queue(p).is_some()) {
        return Err(Refused::Exists(format!(
            "there is already a queue named {q}"
        )));
    }
    let xargs = FieldTable(vec![(SUPER_STREAM_ARG.into(), FieldValue::Bool(true))]);
    v.declare_exchange(&ExchangeSpec {
        name,
        kind: "direct",
        passive: false,
        durable: true,
        auto_delete: false,
        internal: false,
        arguments: &xargs,
    })
    .map_err(|e| Refused::Invalid(e.text.to_string()))?;
    let mut qargs = FieldTable(vec![(
        "x-queue-type".into(),
        FieldValue::LongStr(Bytes::from_static(b"stream")),
    )]);
    qargs.0.extend(arguments.0.iter().cloned());
    let mut made: Vec<&str> = Vec::new();
    let mut result = Ok(());
    for (order, (p, key)) in partitions.iter().zip(keys).enumerate() {
        let declared = v.declare_queue(&QueueSpec {
            name: p,
            passive: false,
            durable: true,
            exclusive: false,
            auto_delete: false,
            arguments: &qargs,
            conn_id,
            server_named: false,
            home: None,
            members: None,
        });
        if let Err(e) = declared {
            result = Err(Refused::Invalid(e.text.to_string()));
            break;
        }
        made.push(p);
        let bargs = FieldTable(vec![(
            PARTITION_ORDER_ARG.into(),
            FieldValue::I64(order as i64),
        )]);
        if let Err(e) = v.bind_queue(p, name, key, &bargs, true, Some(conn_id)) {
            result = Err(Refused::Invalid(e.text.to_string()));
            break;
        }
    }
    if result.is_err() {
        for p in made {
            let _ = v.delete_queue(p, false, false, Some(conn_id));
        }
        let _ = v.delete_exchange(name, false);
    }
    result
}

/// Deletes the super stream `name`: its exchange and its partitions. False when there is no
/// such exchange.
pub fn delete(v: &VHost, name: &str, conn_id: u64) -> bool {
    let Some(parts) = partitions(v, name) else {
        return false;
    };
    let _ = v.delete_exchange(name, false);
    for p in parts {
        let _ = v.delete_queue(&p, false, false, Some(conn_id));
    }
    true
}
