//! Virtual hosts: listing, creating (with their description) and deleting them, and a
//! vhost's permissions.

use axum::extract::{Path, Query, State};
use serde_json::{json, Value};
use warren_broker::access::{User, VhostDef};
use warren_broker::server::Broker;
use warren_broker::vhost::VHost;

use super::paging::{list_reply, ListParams};
use crate::api::{body_object, created, no_content, ok_json, str_field, vhost_of, ApiResult, B};

fn vhost_json(b: &Broker, v: &VHost) -> Value {
    let (mut ready, mut unacked) = (0u64, 0u64);
    for q in v.snapshot().queues.values() {
        ready += q.message_count() as u64;
        unacked += q.unacked_count() as u64;
    }
    let description = b
        .access
        .vhost_def(&v.name)
        .map(|d| d.description)
        .unwrap_or_default();
    json!({
        "name": &*v.name, "description": description, "tags": [],
        "metadata": {"description": description, "tags": []}, "tracing": false,
        "messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked,
    })
}

pub(super) async fn list_vhosts(State(b): B, Query(p): Query<ListParams>) -> ApiResult {
    list_reply(
        Value::Array(b.vhosts().iter().map(|v| vhost_json(&b, v)).collect()),
        &p,
    )
}

pub(super) async fn get_vhost(State(b): B, Path(name): Path<String>) -> ApiResult {
    let v = vhost_of(&b, &name)?;
    ok_json(vhost_json(&b, &v))
}

pub(super) async fn put_vhost(
    State(b): B,
    axum::Extension(u): axum::Extension<User>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult {
    let v = body_object(&body)?;
    let description = str_field(&v, "description").unwrap_or("").to_string();
    let new = b.add_vhost(VhostDef {
        name: name.clone(),
        description,
    })?;
    if new {
        // As RabbitMQ's API does: whoever creates a vhost gets full permissions on it.
        b.access
            .set_permissions(warren_broker::access::full_permissions(&u.name, &name))?;
    }
    created(new)
}

pub(super) async fn delete_vhost(State(b): B, Path(name): Path<String>) -> ApiResult {
    b.delete_vhost(&name)?;
    no_content()
}

pub(super) async fn vhost_permissions(State(b): B, Path(name): Path<String>) -> ApiResult {
    vhost_of(&b, &name)?;
    let ps: Vec<_> = b
        .access
        .permissions()
        .into_iter()
        .filter(|p| p.vhost == name)
        .collect();
    ok_json(json!(ps))
}
