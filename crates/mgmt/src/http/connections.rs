//! Connections: listing them (every node's), one by name, and closing one (with the reason
//! from the `X-Reason` header) on whichever node has it.

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use serde_json::Value;

use super::paging::{list_reply, ListParams};
use crate::api::{no_content, not_found, ok_json, ApiResult, B};
use crate::cluster_view::{close_anywhere, rows};

pub(super) async fn list_connections(State(b): B, Query(p): Query<ListParams>) -> ApiResult {
    list_reply(Value::Array(rows(&b, "connections").await), &p)
}

pub(super) async fn get_connection(State(b): B, Path(name): Path<String>) -> ApiResult {
    rows(&b, "connections")
        .await
        .into_iter()
        .find(|r| r["name"] == name)
        .map_or_else(|| Err(not_found()), ok_json)
}

pub(super) async fn close_connection(
    State(b): B,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult {
    let reason = headers
        .get("x-reason")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("Closed via management plugin");
    if !close_anywhere(&b, &name, reason).await {
        return Err(not_found());
    }
    no_content()
}
