//! Channels and consumers, listed from every node (`cluster_view`).

use axum::extract::{Path, Query, State};
use serde_json::Value;

use super::paging::{list_reply, ListParams};
use crate::api::{not_found, ok_json, vhost_of, ApiResult, B};
use crate::cluster_view::rows;

fn keep(all: Vec<Value>, f: impl Fn(&Value) -> bool) -> Value {
    Value::Array(all.into_iter().filter(|r| f(r)).collect())
}

pub(super) async fn list_channels(State(b): B, Query(p): Query<ListParams>) -> ApiResult {
    list_reply(Value::Array(rows(&b, "channels").await), &p)
}

pub(super) async fn list_channels_in(
    State(b): B,
    Path(vhost): Path<String>,
    Query(p): Query<ListParams>,
) -> ApiResult {
    let v = vhost_of(&b, &vhost)?;
    let all = rows(&b, "channels").await;
    list_reply(keep(all, |r| r["vhost"] == *v.name), &p)
}

pub(super) async fn list_connection_channels(State(b): B, Path(name): Path<String>) -> ApiResult {
    if !rows(&b, "connections")
        .await
        .iter()
        .any(|c| c["name"] == name)
    {
        return Err(not_found());
    }
    let all = rows(&b, "channels").await;
    ok_json(keep(all, |r| r["connection_details"]["name"] == name))
}

pub(super) async fn get_channel(State(b): B, Path(name): Path<String>) -> ApiResult {
    rows(&b, "channels")
        .await
        .into_iter()
        .find(|r| r["name"] == name)
        .map_or_else(|| Err(not_found()), ok_json)
}

pub(super) async fn list_consumers(State(b): B) -> ApiResult {
    ok_json(Value::Array(rows(&b, "consumers").await))
}

pub(super) async fn list_consumers_in(State(b): B, Path(vhost): Path<String>) -> ApiResult {
    let v = vhost_of(&b, &vhost)?;
    let all = rows(&b, "consumers").await;
    ok_json(keep(all, |r| r["queue"]["vhost"] == *v.name))
}
