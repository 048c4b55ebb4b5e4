//! Policies: listing, setting and deleting them (validated by `policy`).

use axum::extract::{Path, State};
use serde_json::{json, Value};
use warren_broker::access::PolicyDef;

use crate::api::{
    bad_request, body_object, created, no_content, not_found, ok_json, str_field, vhost_of,
    ApiResult, B,
};

pub(super) async fn list_policies(State(b): B) -> ApiResult {
    ok_json(json!(b.access.policies()))
}

pub(super) async fn list_policies_in(State(b): B, Path(vhost): Path<String>) -> ApiResult {
    vhost_of(&b, &vhost)?;
    ok_json(json!(b.access.policies_of(&vhost)))
}

pub(super) async fn get_policy(
    State(b): B,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult {
    let p = b
        .access
        .policies_of(&vhost)
        .into_iter()
        .find(|p| p.name == name)
        .ok_or_else(not_found)?;
    ok_json(json!(p))
}

pub(super) async fn put_policy(
    State(b): B,
    Path((vhost, name)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult {
    let v = body_object(&body)?;
    vhost_of(&b, &vhost)?;
    let Some(pattern) = str_field(&v, "pattern") else {
        return Err(bad_request("[{key_missing,pattern}]"));
    };
    let Some(Value::Object(definition)) = v.get("definition") else {
        return Err(bad_request("[{key_missing,definition}]"));
    };
    let priority = match v.get("priority") {
        None | Some(Value::Null) => 0,
        Some(p) => p
            .as_i64()
            .or_else(|| p.as_str().and_then(|s| s.parse().ok()))
            .ok_or_else(|| bad_request("priority must be an integer"))?,
    };
    let new = !b.access.policies_of(&vhost).iter().any(|p| p.name == name);
    b.put_policy(PolicyDef {
        vhost,
        name,
        pattern: pattern.to_string(),
        apply_to: str_field(&v, "apply-to").unwrap_or("all").to_string(),
        definition: definition.clone(),
        priority,
    })?;
    created(new)
}

pub(super) async fn delete_policy(
    State(b): B,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult {
    b.delete_policy(&vhost, &name)?;
    no_content()
}
