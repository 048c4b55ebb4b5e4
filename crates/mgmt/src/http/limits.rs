//! Runtime limits through RabbitMQ's `/api/vhost-limits` and `/api/user-limits`: one set of
//! handlers serves both (a `USER` const parameter).

use axum::extract::{Path, State};
use serde_json::{json, Value};
use warren_broker::access::LimitScope;

use crate::api::{bad_request, body_object, no_content, ok_json, ApiResult, B};

// ---- limits (RabbitMQ's /api/vhost-limits and /api/user-limits) ----
// Each handler serves both: `USER` picks the user's limits over the vhost's.

fn limit_scope(user: bool) -> LimitScope {
    if user {
        LimitScope::User
    } else {
        LimitScope::Vhost
    }
}

/// `[{"vhost": V, "value": {...}}]` or `[{"user": U, "value": {...}}]`, without empty ones.
fn limits_json(user: bool, rows: Vec<(String, warren_broker::access::Limits)>) -> ApiResult {
    let key = if user { "user" } else { "vhost" };
    ok_json(Value::Array(
        rows.into_iter()
            .filter(|(_, l)| !l.is_empty())
            .map(|(n, l)| json!({ key: n, "value": l }))
            .collect(),
    ))
}

pub(super) async fn list_limits<const USER: bool>(State(b): B) -> ApiResult {
    limits_json(USER, b.access.all_limits(limit_scope(USER)))
}

pub(super) async fn limits_of<const USER: bool>(
    State(b): B,
    Path(name): Path<String>,
) -> ApiResult {
    let l = b.access.limits(limit_scope(USER), &name)?;
    limits_json(USER, vec![(name, l)])
}

/// PUT `{"value": N}` sets one limit (merged with the others, as RabbitMQ's API does).
pub(super) async fn put_limit<const USER: bool>(
    State(b): B,
    Path((name, limit)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult {
    let v = body_object(&body)?;
    let Some(value) = v.get("value") else {
        return Err(bad_request("[{key_missing,value}]"));
    };
    let mut def = warren_broker::access::Limits::new();
    def.insert(limit, value.clone());
    b.access.set_limits(limit_scope(USER), &name, &def, false)?;
    b.limits_changed(limit_scope(USER), &name);
    no_content()
}

/// Limit `all` clears every limit (RabbitMQ's clear_user_limits U all).
pub(super) async fn delete_limit<const USER: bool>(
    State(b): B,
    Path((name, limit)): Path<(String, String)>,
) -> ApiResult {
    b.access
        .clear_limit(limit_scope(USER), &name, Some(&limit))?;
    b.limits_changed(limit_scope(USER), &name);
    no_content()
}
