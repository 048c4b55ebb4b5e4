//! Connections: listing them, one by name, and closing one (with the reason from the
//! `X-Reason` header).

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use serde_json::{json, Value};
use warren_broker::server::Broker;

use super::paging::{list_reply, ListParams};
use crate::api::{no_content, not_found, ok_json, ApiError, ApiResult, B};

pub(crate) fn connection_json(c: &warren_broker::tracking::ConnInfo) -> Value {
    use std::sync::atomic::Ordering::Relaxed;
    json!({
        "name": c.name, "node": &*c.node, "type": "network", "state": "running",
        "protocol": "AMQP 0-9-1", "auth_mechanism": "PLAIN",
        "user": c.user, "vhost": c.vhost,
        "host": c.local.ip().to_string(), "port": c.local.port(),
        "peer_host": c.peer.ip().to_string(), "peer_port": c.peer.port(),
        "connected_at": c.connected_at_ms, "channels": c.channels.load(Relaxed),
        "frame_max": c.frame_max.load(Relaxed), "timeout": c.heartbeat_s.load(Relaxed),
        "client_properties": c.client_properties, "ssl": false,
        "recv_oct": c.recv_oct.load(Relaxed), "recv_cnt": c.recv_cnt.load(Relaxed),
        "send_oct": c.outbox.sent_octets.load(Relaxed),
        "send_cnt": c.outbox.writes.load(Relaxed),
    })
}

pub(super) async fn list_connections(State(b): B, Query(p): Query<ListParams>) -> ApiResult {
    let mut cs: Vec<_> = b.connections.lock().values().cloned().collect();
    cs.sort_by_key(|c| c.id);
    list_reply(
        Value::Array(
            cs.iter()
                .map(|c| {
                    let mut row = connection_json(c);
                    crate::stats_api::add_connection_rates(&b, c, &mut row);
                    row
                })
                .collect(),
        ),
        &p,
    )
}

fn find_connection(
    b: &Broker,
    name: &str,
) -> Result<Arc<warren_broker::tracking::ConnInfo>, ApiError> {
    b.connections
        .lock()
        .values()
        .find(|c| c.name == name)
        .cloned()
        .ok_or_else(not_found)
}

pub(super) async fn get_connection(State(b): B, Path(name): Path<String>) -> ApiResult {
    let c = find_connection(&b, &name)?;
    let mut row = connection_json(&c);
    crate::stats_api::add_connection_rates(&b, &c, &mut row);
    ok_json(row)
}

pub(super) async fn close_connection(
    State(b): B,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult {
    let c = find_connection(&b, &name)?;
    let reason = headers
        .get("x-reason")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("Closed via management plugin");
    tracing::info!(conn = c.id, name = %c.name, reason, "closing connection via the management API");
    c.force_close(reason);
    no_content()
}
