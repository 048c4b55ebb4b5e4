//! Runtime parameters (RabbitMQ's `/api/parameters`), the shovels they describe
//! (`/api/shovels`, from the shovel management plugin) and the federation links
//! (`/api/federation-links`, from the federation management plugin). A parameter is checked by its
//! component (`shovel`); `vhost-limits` rows are the vhosts' limits, listed with the others.
//! Shovel status is cluster-wide: each node lists the shovels it runs (`cluster_view`).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Extension;
use serde_json::{json, Value};
use warren_broker::access::{LimitScope, MgmtError, ParameterDef, VHOST_LIMITS_COMPONENT};
use warren_broker::server::Broker;
use warren_federation::Federation;
use warren_shovel::Shovels;

use crate::api::{
    bad_request, body_object, created, no_content, not_found, ok_json, vhost_of, ApiResult, B,
};

/// Every parameter, optionally one component's, one vhost's, in RabbitMQ's row shape.
fn rows(b: &Broker, component: Option<&str>, vhost: Option<&str>) -> Vec<Value> {
    let limits = b
        .access
        .all_limits(LimitScope::Vhost)
        .into_iter()
        .filter(|(_, l)| !l.is_empty())
        .map(|(vhost, l)| ParameterDef {
            vhost,
            component: VHOST_LIMITS_COMPONENT.into(),
            name: "limits".into(),
            value: Value::Object(l),
        });
    let mut all: Vec<ParameterDef> = limits.chain(b.access.parameters(None, None)).collect();
    all.retain(|p| {
        component.is_none_or(|c| c == p.component) && vhost.is_none_or(|v| v == p.vhost)
    });
    all.sort_by(|a, b| (&a.component, &a.vhost, &a.name).cmp(&(&b.component, &b.vhost, &b.name)));
    all.into_iter()
        .map(|p| json!({"value": p.value, "vhost": p.vhost, "component": p.component, "name": p.name}))
        .collect()
}

pub(super) async fn list_all(State(b): B) -> ApiResult {
    ok_json(Value::Array(rows(&b, None, None)))
}

pub(super) async fn list_component(State(b): B, Path(component): Path<String>) -> ApiResult {
    ok_json(Value::Array(rows(&b, Some(&component), None)))
}

pub(super) async fn list_in(
    State(b): B,
    Path((component, vhost)): Path<(String, String)>,
) -> ApiResult {
    vhost_of(&b, &vhost)?;
    ok_json(Value::Array(rows(&b, Some(&component), Some(&vhost))))
}

pub(super) async fn get_one(
    State(b): B,
    Path((component, vhost, name)): Path<(String, String, String)>,
) -> ApiResult {
    rows(&b, Some(&component), Some(&vhost))
        .into_iter()
        .find(|r| r["name"] == name.as_str())
        .map_or_else(|| Err(not_found()), ok_json)
}

/// PUT `{"value": {...}}` (the row's other fields may come too, as RabbitMQ's UI sends them).
pub(super) async fn put_one(
    State(b): B,
    Path((component, vhost, name)): Path<(String, String, String)>,
    body: axum::body::Bytes,
) -> ApiResult {
    let v = body_object(&body)?;
    vhost_of(&b, &vhost)?;
    let Some(value) = v.get("value").cloned() else {
        return Err(bad_request("[{key_missing,value}]"));
    };
    if component == VHOST_LIMITS_COMPONENT {
        let Value::Object(l) = value else {
            return Err(bad_request("Validation failed\n\nlimits should be a map\n"));
        };
        b.access.set_limits(LimitScope::Vhost, &vhost, &l, true)?;
        b.limits_changed(LimitScope::Vhost, &vhost);
        return no_content();
    }
    let new = b.access.parameter(&component, &vhost, &name).is_none();
    b.access
        .set_parameter(&component, &vhost, &name, value)
        .map_err(|e| match e {
            MgmtError::BadRequest(reason) => bad_request(escape_html_tags(&reason)),
            other => other.into(),
        })?;
    tracing::info!(component, vhost, name, "parameter set");
    created(new)
}

pub(super) async fn delete_one(
    State(b): B,
    Path((component, vhost, name)): Path<(String, String, String)>,
) -> ApiResult {
    vhost_of(&b, &vhost)?;
    if component == VHOST_LIMITS_COMPONENT {
        b.access.clear_limit(LimitScope::Vhost, &vhost, None)?;
        b.limits_changed(LimitScope::Vhost, &vhost);
        return no_content();
    }
    b.access.clear_parameter(&component, &vhost, &name)?;
    tracing::info!(component, vhost, name, "parameter cleared");
    no_content()
}

/// RabbitMQ's management API escapes a validation reason's `<`, `>` and `&` (its Erlang terms
/// print binaries as `<<"...">>`), and clients show it so.
fn escape_html_tags(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

// ---- shovels ----

type S = Extension<Arc<Shovels>>;

/// This node's rows of `view` (`local`) and every other node's that answers, optionally one
/// vhost's: the shovels and the federation links each node runs.
async fn cluster_rows(
    b: &Broker,
    view: &str,
    mut local: Vec<Value>,
    vhost: Option<&str>,
) -> Vec<Value> {
    for (_, v) in crate::cluster_view::ask_others_view(b, view, vhost, None).await {
        if let Value::Array(a) = v {
            local.extend(a);
        }
    }
    local
}

async fn shovel_rows(b: &Broker, s: &Shovels, vhost: Option<&str>) -> Vec<Value> {
    cluster_rows(b, "shovels", s.status(vhost), vhost).await
}

pub(super) async fn list_shovels(State(b): B, Extension(s): S) -> ApiResult {
    ok_json(Value::Array(shovel_rows(&b, &s, None).await))
}

pub(super) async fn list_shovels_in(
    State(b): B,
    Extension(s): S,
    Path(vhost): Path<String>,
) -> ApiResult {
    vhost_of(&b, &vhost)?;
    ok_json(Value::Array(shovel_rows(&b, &s, Some(&vhost)).await))
}

pub(super) async fn get_shovel(
    State(b): B,
    Extension(s): S,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult {
    shovel_rows(&b, &s, Some(&vhost))
        .await
        .into_iter()
        .find(|r| r["name"] == name.as_str())
        .map_or_else(|| Err(not_found()), ok_json)
}

/// `DELETE /api/shovels/vhost/{vhost}/{name}/restart`, on whichever node runs it.
pub(super) async fn restart_shovel(
    State(b): B,
    Extension(s): S,
    Path((vhost, name)): Path<(String, String)>,
) -> ApiResult {
    if b.access
        .parameter(warren_shovel::COMPONENT, &vhost, &name)
        .is_none()
    {
        return Err(not_found());
    }
    if s.restart(&vhost, &name) {
        return no_content();
    }
    let answers =
        crate::cluster_view::ask_others_view(&b, "restart_shovel", Some(&vhost), Some(&name)).await;
    if answers.iter().any(|(_, v)| v.as_bool() == Some(true)) {
        no_content()
    } else {
        Err(not_found())
    }
}

// ---- federation links ----

type F = Extension<Arc<Federation>>;

async fn link_rows(b: &Broker, f: &Federation, vhost: Option<&str>) -> Vec<Value> {
    cluster_rows(b, "federation_links", f.status(vhost), vhost).await
}

pub(super) async fn list_links(State(b): B, Extension(f): F) -> ApiResult {
    ok_json(Value::Array(link_rows(&b, &f, None).await))
}

pub(super) async fn list_links_in(
    State(b): B,
    Extension(f): F,
    Path(vhost): Path<String>,
) -> ApiResult {
    vhost_of(&b, &vhost)?;
    ok_json(Value::Array(link_rows(&b, &f, Some(&vhost)).await))
}
