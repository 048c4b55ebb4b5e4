//! Queues: listing them with their figures, declaring, deleting and purging them.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use serde_json::{json, Value};
use warren_broker::cluster::ClusterQueue;
use warren_broker::json::{json_to_table, table_to_json};
use warren_broker::queue::QueueRef;
use warren_broker::server::Broker;
use warren_broker::vhost::{QueueSpec, VHost};

use super::paging::{list_reply, ListParams};
use crate::api::{
    bad_request, body_object, created, no_content, not_found, ok_json, vhost_of, ApiResult, B,
};
use crate::cluster_view::figures_elsewhere;

/// A queue's row: its definition and state here, its figures from the node that hosts it
/// (`elsewhere`: what the other nodes gave; none when its node does not answer).
fn queue_json(
    b: &Broker,
    q: &QueueRef,
    elsewhere: &HashMap<(String, String), Vec<Value>>,
) -> Value {
    let policy =
        warren_broker::policy::matching(&b.access.policies_of(q.vhost()), q.name(), true).cloned();
    let mut out = json!({
        "name": &**q.name(), "vhost": &**q.vhost(), "durable": q.options().durable,
        "auto_delete": q.options().auto_delete, "exclusive": q.options().exclusive_owner.is_some(),
        "arguments": table_to_json(&q.options().arguments),
        "policy": policy.as_ref().map(|p| p.name.clone()),
        "effective_policy_definition": policy.map(|p| Value::Object(p.definition)).unwrap_or(json!({})),
        "state": if q.remote().is_some_and(|r| !warren_broker::cluster::Cluster::of(b).is_some_and(|c| c.running(&r.home))) { "down" } else { "running" },
        "type": q.type_name(), "node": q.home().unwrap_or_else(|| b.config.node_name.clone()),
    });
    crate::cluster_view::add_figures(b, q, elsewhere, &mut out);
    if let Some((_, members)) = q.group() {
        // RabbitMQ's quorum queue fields: its leader, its members, the members running.
        let online: Vec<&String> = members
            .iter()
            .filter(|m| warren_broker::cluster::Cluster::of(b).is_some_and(|c| c.running(m)))
            .collect();
        let leader = q.leader();
        if q.mirrored() {
            // A mirrored classic queue, as RabbitMQ 3.10 lists one.
            let mirrors: Vec<&String> = members
                .iter()
                .filter(|m| Some(*m) != leader.as_ref())
                .collect();
            out["slave_nodes"] = json!(mirrors);
            out["synchronised_slave_nodes"] = json!(mirrors
                .iter()
                .filter(|m| online.contains(m))
                .collect::<Vec<_>>());
        } else {
            out["members"] = json!(members);
            out["online"] = json!(online);
        }
        out["leader"] = json!(leader);
    }
    out
}

async fn queues_of(b: &Broker, vhosts: Vec<Arc<VHost>>, one_vhost: Option<&str>) -> Value {
    let elsewhere = figures_elsewhere(b, one_vhost, None).await;
    let mut out = Vec::new();
    for v in vhosts {
        let s = v.snapshot();
        let mut qs: Vec<_> = s.queues.values().collect();
        qs.sort_by(|a, b| a.name().cmp(b.name()));
        out.extend(qs.into_iter().map(|q| queue_json(b, q, &elsewhere)));
    }
    Value::Array(out)
}

pub(super) async fn list_queues(State(b): B, Query(p): Query<ListParams>) -> ApiResult {
    list_reply(queues_of(&b, b.vhosts(), None).await, &p)
}

pub(super) async fn list_queues_in(
    State(b): B,
    Path(vhost): Path<String>,
    Query(p): Query<ListParams>,
) -> ApiResult {
    let v = vhost_of(&b, &vhost)?;
    list_reply(queues_of(&b, vec![v], Some(&vhost)).await, &p)
}

pub(super) async fn get_queue(
    State(b): B,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult {
    let q = vhost_of(&b, &vhost)?.queue(&name).ok_or_else(not_found)?;
    let elsewhere = figures_elsewhere(&b, Some(&vhost), Some(&name)).await;
    ok_json(queue_json(&b, &q, &elsewhere))
}

pub(super) async fn put_queue(
    State(b): B,
    Path((vhost, name)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult {
    let v = body_object(&body)?;
    let vh = vhost_of(&b, &vhost)?;
    let args = json_to_table(v.get("arguments").unwrap_or(&Value::Null)).map_err(bad_request)?;
    let existed = vh.queue(&name).is_some();
    let q = vh
        .declare_queue(&QueueSpec {
            name: &name,
            passive: false,
            durable: v.get("durable").and_then(Value::as_bool).unwrap_or(true),
            exclusive: false,
            auto_delete: v
                .get("auto_delete")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            arguments: &args,
            conn_id: 0,
            server_named: false,
            home: None,
            members: None,
        })
        .map_err(|e| bad_request(e.text))?;
    warren_broker::policy::apply(&b.access, &q);
    created(!existed)
}

pub(super) async fn delete_queue(
    State(b): B,
    Path((vhost, name)): Path<(String, String)>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> ApiResult {
    let vh = vhost_of(&b, &vhost)?;
    vh.queue(&name).ok_or_else(not_found)?;
    let flag = |k: &str| q.get(k).is_some_and(|v| v == "true");
    let d = vh
        .delete_queue(&name, flag("if-unused"), flag("if-empty"), None)
        .map_err(|e| bad_request(e.text))?;
    warren_broker::queue::notify_cancelled(&d.consumers);
    no_content()
}

pub(super) async fn purge_queue(
    State(b): B,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult {
    let q = vhost_of(&b, &vhost)?.queue(&name).ok_or_else(not_found)?;
    let n = q.purge();
    tracing::info!(vhost = %vhost, queue = %name, messages = n, "queue purged via the management API");
    no_content()
}
