//! The node-wide documents: the overview (totals, listeners, churn), the cluster's name and the
//! global parameters, `whoami`, and the definitions export and import.

use axum::extract::{Path, State};
use serde_json::json;
use warren_broker::access::User;

use crate::api::{bad_request, body_object, no_content, not_found, ok_json, ApiResult, B};

/// The overview: every node's totals and rates summed (`cluster_view`), the definitions'
/// counts from this node (they are the same on every node).
pub(super) async fn overview(State(b): B) -> ApiResult {
    let parts = crate::cluster_view::overview_parts(&b).await;
    let (mut queues, mut exchanges) = (0, 0);
    for v in b.vhosts() {
        let s = v.snapshot();
        queues += s.queues.len();
        exchanges += s.table.exchanges.len();
    }
    let mut totals = parts["object_totals"].clone();
    totals["queues"] = json!(queues);
    totals["exchanges"] = json!(exchanges);
    ok_json(json!({
        "message_stats": parts["message_stats"],
        "churn_rates": parts["churn_rates"],
        "management_version": env!("CARGO_PKG_VERSION"),
        "rabbitmq_version": "3.10.8",
        "product_name": b.config.server_properties.product,
        "product_version": b.config.server_properties.version,
        "cluster_name": b.cluster_name(),
        "node": b.config.node_name,
        "object_totals": totals,
        "queue_totals": parts["queue_totals"],
        "listeners": parts["listeners"],
    }))
}

// ---- the cluster's name and the global parameters ----

pub(super) async fn get_cluster_name(State(b): B) -> ApiResult {
    ok_json(json!({ "name": b.cluster_name() }))
}

/// `PUT /api/cluster-name` with `{"name": N}`, as RabbitMQ's.
pub(super) async fn put_cluster_name(State(b): B, body: axum::body::Bytes) -> ApiResult {
    let v = body_object(&body)?;
    let name = v
        .get("name")
        .cloned()
        .ok_or_else(|| bad_request("[{key_missing,name}]"))?;
    b.access
        .set_global_parameter(warren_broker::access::CLUSTER_NAME, name)?;
    no_content()
}

pub(super) async fn list_global_parameters(State(b): B) -> ApiResult {
    ok_json(json!(b.access.global_parameters()))
}

pub(super) async fn get_global_parameter(State(b): B, Path(name): Path<String>) -> ApiResult {
    match b.access.global_parameter(&name) {
        Some(value) => ok_json(json!({ "name": name, "value": value })),
        None => Err(not_found()),
    }
}

/// `PUT /api/global-parameters/{name}` with `{"value": V}`.
pub(super) async fn put_global_parameter(
    State(b): B,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult {
    let v = body_object(&body)?;
    let value = v
        .get("value")
        .cloned()
        .ok_or_else(|| bad_request("[{key_missing,value}]"))?;
    b.access.set_global_parameter(&name, value)?;
    no_content()
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
