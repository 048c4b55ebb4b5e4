//! Exchanges and bindings: listing, declaring and deleting exchanges (the default one is
//! `amq.default` in URLs), and listing bindings.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use serde_json::{json, Value};
use warren_broker::json::{json_to_table, table_to_json};
use warren_broker::queue::QueueRef;
use warren_broker::server::Broker;
use warren_broker::vhost::{ExchangeSpec, VHost};
use warren_routing::Destination;

use super::paging::{list_reply, ListParams};
use crate::api::{
    bad_request, body_object, created, no_content, not_found, ok_json, str_field, vhost_of,
    ApiResult, B,
};
use crate::cluster_view::{add_exchange_parts, exchange_parts_elsewhere};

fn exchange_json(b: &Broker, vhost: &str, x: &warren_routing::Exchange<QueueRef>) -> Value {
    let mut v = json!({
        "name": &*x.name, "vhost": vhost, "type": x.type_name(), "durable": x.durable,
        "auto_delete": x.auto_delete, "internal": x.internal,
        "arguments": table_to_json(&x.arguments),
        "message_stats": crate::stats_api::exchange_message_stats(b, vhost, x),
    });
    if x.delayed {
        // The plugin's `messages_delayed` (its management extension shows it per exchange).
        let n = b.vhost(vhost).map_or(0, |vh| vh.delayed_count(&x.name));
        v["messages_delayed"] = json!(n);
    }
    v
}

/// The exchanges of `vhosts` (`one_vhost`: when it is one), each with every node's counters.
async fn exchanges_of(b: &Broker, vhosts: Vec<Arc<VHost>>, one_vhost: Option<&str>) -> Value {
    let elsewhere = exchange_parts_elsewhere(b, one_vhost, None).await;
    let mut out = Vec::new();
    for v in vhosts {
        let s = v.snapshot();
        let mut xs: Vec<_> = s.table.exchanges.values().collect();
        xs.sort_by(|a, b| a.name.cmp(&b.name));
        for x in xs {
            let mut row = exchange_json(b, &v.name, x);
            add_exchange_parts(
                &mut row,
                elsewhere.get(&(v.name.to_string(), x.name.to_string())),
            );
            out.push(row);
        }
    }
    Value::Array(out)
}

/// The URL name of the default exchange is `amq.default`.
pub(crate) fn exchange_name(n: &str) -> &str {
    if n == "amq.default" {
        ""
    } else {
        n
    }
}

pub(super) async fn list_exchanges(State(b): B, Query(p): Query<ListParams>) -> ApiResult {
    list_reply(exchanges_of(&b, b.vhosts(), None).await, &p)
}

pub(super) async fn list_exchanges_in(
    State(b): B,
    Path(vhost): Path<String>,
    Query(p): Query<ListParams>,
) -> ApiResult {
    list_reply(
        exchanges_of(&b, vec![vhost_of(&b, &vhost)?], Some(&vhost)).await,
        &p,
    )
}

pub(super) async fn get_exchange(
    State(b): B,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult {
    let v = vhost_of(&b, &vhost)?;
    let s = v.snapshot();
    let x = s
        .table
        .exchanges
        .get(exchange_name(&name))
        .ok_or_else(not_found)?;
    let mut row = exchange_json(&b, &v.name, x);
    let elsewhere = exchange_parts_elsewhere(&b, Some(&vhost), Some(&x.name)).await;
    add_exchange_parts(
        &mut row,
        elsewhere.get(&(v.name.to_string(), x.name.to_string())),
    );
    ok_json(row)
}

pub(super) async fn put_exchange(
    State(b): B,
    Path((vhost, name)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult {
    let v = body_object(&body)?;
    let vh = vhost_of(&b, &vhost)?;
    let args = json_to_table(v.get("arguments").unwrap_or(&Value::Null)).map_err(bad_request)?;
    let existed = vh.snapshot().table.exchanges.contains_key(name.as_str());
    vh.declare_exchange(&ExchangeSpec {
        name: exchange_name(&name),
        kind: str_field(&v, "type").unwrap_or("direct"),
        passive: false,
        durable: v.get("durable").and_then(Value::as_bool).unwrap_or(true),
        auto_delete: v
            .get("auto_delete")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        internal: v.get("internal").and_then(Value::as_bool).unwrap_or(false),
        arguments: &args,
    })
    .map_err(|e| bad_request(e.text))?;
    created(!existed)
}

pub(super) async fn delete_exchange(
    State(b): B,
    Path((vhost, name)): Path<(String, String)>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> ApiResult {
    let vh = vhost_of(&b, &vhost)?;
    if !vh
        .snapshot()
        .table
        .exchanges
        .contains_key(exchange_name(&name))
    {
        return Err(not_found());
    }
    vh.delete_exchange(
        exchange_name(&name),
        q.get("if-unused").is_some_and(|v| v == "true"),
    )
    .map_err(|e| bad_request(e.text))?;
    no_content()
}

// ---- bindings ----

pub(super) fn bindings_of(vhosts: Vec<Arc<VHost>>) -> Value {
    let mut out = Vec::new();
    for v in vhosts {
        let s = v.snapshot();
        // The default exchange's implicit binding to every queue, listed as RabbitMQ lists it.
        let mut qs: Vec<_> = s.queues.keys().collect();
        qs.sort();
        for q in qs {
            out.push(json!({
                "source": "", "vhost": &*v.name, "destination": &**q,
                "destination_type": "queue", "routing_key": &**q, "arguments": {},
                "properties_key": super::binding_key::properties_key(q, &Value::Null),
            }));
        }
        let mut xs: Vec<_> = s.table.exchanges.values().collect();
        xs.sort_by(|a, b| a.name.cmp(&b.name));
        for x in xs {
            for b in &x.bindings {
                let (dest, kind) = match &b.destination {
                    Destination::Queue(q) => (q.name().clone(), "queue"),
                    Destination::Exchange(e) => (e.clone(), "exchange"),
                };
                let arguments = table_to_json(&b.arguments);
                out.push(json!({
                    "source": &*x.name, "vhost": &*v.name, "destination": &*dest,
                    "destination_type": kind, "routing_key": &*b.routing_key,
                    "properties_key": super::binding_key::properties_key(&b.routing_key, &arguments),
                    "arguments": arguments,
                }));
            }
        }
    }
    Value::Array(out)
}

pub(super) async fn list_bindings(State(b): B) -> ApiResult {
    ok_json(bindings_of(b.vhosts()))
}

pub(super) async fn list_bindings_in(State(b): B, Path(vhost): Path<String>) -> ApiResult {
    ok_json(bindings_of(vec![vhost_of(&b, &vhost)?]))
}
