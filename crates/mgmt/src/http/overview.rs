//! The node-wide documents: the overview (totals, listeners, churn), `whoami`, and the
//! definitions export and import.

use axum::extract::State;
use serde_json::json;
use warren_broker::access::User;

use crate::api::{bad_request, body_object, no_content, ok_json, ApiResult, B};

pub(super) async fn overview(State(b): B) -> ApiResult {
    // Before the connections lock below: these take it too.
    let (message_stats, queue_totals, churn_rates) = crate::stats_api::overview_stats(&b);
    let (mut queues, mut exchanges, mut consumers) = (0, 0, 0u64);
    for v in b.vhosts() {
        let s = v.snapshot();
        queues += s.queues.len();
        exchanges += s.table.exchanges.len();
        for q in s.queues.values() {
            consumers += q.consumer_count() as u64;
        }
    }
    let conns = b.connections.lock();
    let channels: u64 = conns
        .values()
        .map(|c| c.channels.load(std::sync::atomic::Ordering::Relaxed) as u64)
        .sum();
    ok_json(json!({
        "message_stats": message_stats,
        "churn_rates": churn_rates,
        "management_version": env!("CARGO_PKG_VERSION"),
        "rabbitmq_version": "3.10.8",
        "product_name": b.config.server_properties.product,
        "product_version": b.config.server_properties.version,
        "cluster_name": "warren",
        "node": b.config.node_name,
        "object_totals": {
            "connections": conns.len(), "channels": channels, "exchanges": exchanges,
            "queues": queues, "consumers": consumers,
        },
        "queue_totals": queue_totals,
        "listeners": [
            {"node": b.config.node_name, "protocol": "amqp", "ip_address": b.config.amqp_bind.to_string(), "port": b.config.amqp_port},
            {"node": b.config.node_name, "protocol": "http", "ip_address": b.config.http_bind.to_string(), "port": b.config.http_port},
        ],
    }))
}

pub(super) async fn whoami(axum::Extension(u): axum::Extension<User>) -> ApiResult {
    ok_json(json!({"name": u.name, "tags": u.tags}))
}

// ---- definitions ----

pub(super) async fn get_definitions(State(b): B) -> ApiResult {
    ok_json(warren_broker::export::export(&b))
}

pub(super) async fn post_definitions(State(b): B, body: axum::body::Bytes) -> ApiResult {
    let v = body_object(&body)?;
    warren_broker::export::import(&b, &v).map_err(bad_request)?;
    no_content()
}
