//! Users and permissions: listing, creating, replacing and deleting users, and a user's or
//! all permissions.

use axum::extract::{Path, State};
use serde_json::{json, Value};
use warren_broker::access::{parse_tags, PermissionDef, UserDef};

use crate::api::{
    bad_request, body_object, created, no_content, not_found, ok_json, str_field, ApiError,
    ApiResult, B,
};

fn user_json(u: &UserDef) -> Value {
    json!({
        "name": u.name, "password_hash": u.password_hash,
        "hashing_algorithm": u.hashing_algorithm, "tags": u.tags, "limits": u.limits,
    })
}

pub(super) async fn list_users(State(b): B) -> ApiResult {
    ok_json(Value::Array(
        b.access.users().iter().map(user_json).collect(),
    ))
}

pub(super) async fn get_user(State(b): B, Path(name): Path<String>) -> ApiResult {
    let u = b.access.user(&name).ok_or_else(not_found)?;
    ok_json(user_json(&u))
}

pub(super) async fn put_user(
    State(b): B,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult {
    let v = body_object(&body)?;
    let existing = b.access.user(&name);
    let new = existing.is_none();
    let tags = match v.get("tags") {
        Some(Value::String(s)) => parse_tags(s),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|t| t.as_str().map(String::from))
            .collect(),
        None | Some(Value::Null) => existing
            .as_ref()
            .map(|u| u.tags.clone())
            .unwrap_or_default(),
        Some(_) => return Err(bad_request("tags must be a string or a list")),
    };
    let (hash, algo) = match (str_field(&v, "password"), str_field(&v, "password_hash")) {
        (Some(p), _) => (
            warren_broker::access::hash_password(p),
            warren_broker::access::HASH_SHA256.to_string(),
        ),
        (None, Some(h)) => (
            h.to_string(),
            str_field(&v, "hashing_algorithm")
                .unwrap_or(warren_broker::access::HASH_SHA256)
                .to_string(),
        ),
        // Tags only: the password stays as it was (a new user cannot log in with a password).
        (None, None) => existing
            .as_ref()
            .map(|u| (u.password_hash.clone(), u.hashing_algorithm.clone()))
            .unwrap_or_default(),
    };
    let algo = if algo.is_empty() {
        warren_broker::access::HASH_SHA256.to_string()
    } else {
        algo
    };
    b.access.put_user(UserDef {
        name,
        password_hash: hash,
        hashing_algorithm: algo,
        tags,
        limits: existing.map(|u| u.limits).unwrap_or_default(),
    })?;
    created(new)
}

pub(super) async fn delete_user(State(b): B, Path(name): Path<String>) -> ApiResult {
    b.access.delete_user(&name)?;
    b.close_user_connections(&name, &format!("user '{name}' is deleted"));
    no_content()
}

pub(super) async fn user_permissions(State(b): B, Path(name): Path<String>) -> ApiResult {
    b.access.user(&name).ok_or_else(not_found)?;
    let ps: Vec<_> = b
        .access
        .permissions()
        .into_iter()
        .filter(|p| p.user == name)
        .collect();
    ok_json(json!(ps))
}

// ---- permissions ----

pub(super) async fn list_permissions(State(b): B) -> ApiResult {
    ok_json(json!(b.access.permissions()))
}

pub(super) async fn get_permission(
    State(b): B,
    Path((vhost, user)): Path<(String, String)>,
) -> ApiResult {
    let p = b.access.permission(&user, &vhost).ok_or_else(not_found)?;
    ok_json(json!(p))
}

pub(super) async fn put_permission(
    State(b): B,
    Path((vhost, user)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult {
    let v = body_object(&body)?;
    if b.access.user(&user).is_none() || b.vhost(&vhost).is_none() {
        return Err(bad_request("vhost_or_user_not_found"));
    }
    let field = |k: &str| -> Result<String, ApiError> {
        str_field(&v, k)
            .map(String::from)
            .ok_or_else(|| bad_request(format!("[{{key_missing,{k}}}]")))
    };
    let new = b.access.permission(&user, &vhost).is_none();
    b.access.set_permissions(PermissionDef {
        user,
        vhost,
        configure: field("configure")?,
        write: field("write")?,
        read: field("read")?,
    })?;
    created(new)
}

pub(super) async fn delete_permission(
    State(b): B,
    Path((vhost, user)): Path<(String, String)>,
) -> ApiResult {
    b.access.clear_permissions(&user, &vhost)?;
    no_content()
}
