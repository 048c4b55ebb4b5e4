//! One exchange's or queue's bindings, and adding and removing a binding, at RabbitMQ's URLs:
//! `/api/exchanges/{vhost}/{name}/bindings/{source|destination}`,
//! `/api/queues/{vhost}/{name}/bindings`, and `/api/bindings/{vhost}/e/{source}/{q|e}/{dest}`
//! (GET lists the bindings between the two, POST adds one from `routing_key` and `arguments`:
//! 201 with its `Location`), then `…/{props}` (GET one, DELETE it). `props` is the binding's
//! `properties_key` from a listing ([`properties_key`]).

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use serde_json::Value;
use warren_broker::json::json_to_table;

use super::binding_key::has_props;
use super::binding_key::properties_key;
use super::exchanges::{bindings_of, exchange_name};
use crate::api::{
    bad_request, body_object, no_content, not_found, ok_json, vhost_of, ApiResult, B,
};

/// A path segment, percent-encoded (for the `Location` of a new binding).
fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn dest_kind(d: &str) -> Option<&'static str> {
    match d {
        "q" => Some("queue"),
        "e" => Some("exchange"),
        _ => None,
    }
}

/// The vhost's bindings that `keep` selects.
fn select(
    b: &B,
    vhost: &str,
    keep: impl Fn(&Value) -> bool,
) -> Result<Vec<Value>, crate::api::ApiError> {
    let v = vhost_of(&b.0, vhost)?;
    let Value::Array(all) = bindings_of(vec![v]) else {
        return Ok(Vec::new());
    };
    Ok(all.into_iter().filter(|x| keep(x)).collect())
}

fn exchange_exists(b: &B, vhost: &str, name: &str) -> bool {
    b.0.vhost(vhost).is_some_and(|v| {
        v.snapshot()
            .table
            .exchanges
            .contains_key(exchange_name(name))
    })
}

fn queue_exists(b: &B, vhost: &str, name: &str) -> bool {
    b.0.vhost(vhost).is_some_and(|v| v.queue(name).is_some())
}

/// Does the destination (`queue` or `exchange`) exist?
fn dest_exists(b: &B, vhost: &str, kind: &str, name: &str) -> bool {
    if kind == "queue" {
        queue_exists(b, vhost, name)
    } else {
        exchange_exists(b, vhost, name)
    }
}

fn is(v: &Value, key: &str, want: &str) -> bool {
    v.get(key).and_then(Value::as_str) == Some(want)
}

pub(super) async fn exchange_bindings(
    b: B,
    Path((vhost, name, side)): Path<(String, String, String)>,
) -> ApiResult {
    let field = match side.as_str() {
        "source" => "source",
        "destination" => "destination",
        _ => return Err(not_found()),
    };
    if !exchange_exists(&b, &vhost, &name) {
        return Err(not_found());
    }
    let name = exchange_name(&name);
    let list = select(&b, &vhost, |x| {
        is(x, field, name) && (field == "source" || is(x, "destination_type", "exchange"))
    })?;
    ok_json(Value::Array(list))
}

pub(super) async fn queue_bindings(b: B, Path((vhost, name)): Path<(String, String)>) -> ApiResult {
    if !queue_exists(&b, &vhost, &name) {
        return Err(not_found());
    }
    let list = select(&b, &vhost, |x| {
        is(x, "destination", &name) && is(x, "destination_type", "queue")
    })?;
    ok_json(Value::Array(list))
}

/// The bindings from `source` to `dest`, after checking both exist.
fn between(
    b: &B,
    vhost: &str,
    source: &str,
    d: &str,
    dest: &str,
) -> Result<(Vec<Value>, &'static str), crate::api::ApiError> {
    let kind = dest_kind(d).ok_or_else(not_found)?;
    if !exchange_exists(b, vhost, source) || !dest_exists(b, vhost, kind, dest) {
        return Err(not_found());
    }
    let source = exchange_name(source);
    let list = select(b, vhost, |x| {
        is(x, "source", source) && is(x, "destination", dest) && is(x, "destination_type", kind)
    })?;
    Ok((list, kind))
}

pub(super) async fn list_between(
    b: B,
    Path((vhost, source, d, dest)): Path<(String, String, String, String)>,
) -> ApiResult {
    ok_json(Value::Array(between(&b, &vhost, &source, &d, &dest)?.0))
}

pub(super) async fn add_binding(
    b: B,
    Path((vhost, source, d, dest)): Path<(String, String, String, String)>,
    body: axum::body::Bytes,
) -> ApiResult {
    let kind = between(&b, &vhost, &source, &d, &dest)?.1;
    let v = body_object(&body)?;
    let key = match v.get("routing_key") {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(bad_request("routing_key must be a string")),
    };
    let args_json = v.get("arguments").cloned().unwrap_or(Value::Null);
    let args = json_to_table(&args_json).map_err(bad_request)?;
    let vh = vhost_of(&b.0, &vhost)?;
    let src = exchange_name(&source);
    let r = if kind == "queue" {
        vh.bind_queue(&dest, src, key, &args, true, None)
    } else {
        vh.bind_exchange(&dest, src, key, &args, true)
    };
    r.map_err(|e| bad_request(e.text))?;
    let location = format!(
        "/api/bindings/{}/e/{}/{}/{}/{}",
        segment(&vhost),
        segment(&source),
        d,
        segment(&dest),
        segment(&properties_key(key, &args_json)),
    );
    let mut resp = StatusCode::CREATED.into_response();
    if let Ok(l) = location.parse() {
        resp.headers_mut().insert(header::LOCATION, l);
    }
    Ok(resp)
}

/// The binding from `source` to `dest` whose properties key is `props`.
fn one(
    b: &B,
    (vhost, source, d, dest, props): &(String, String, String, String, String),
) -> Result<(Value, &'static str), crate::api::ApiError> {
    let (list, kind) = between(b, vhost, source, d, dest)?;
    let found = list
        .into_iter()
        .find(|x| has_props(x, props))
        .ok_or_else(not_found)?;
    Ok((found, kind))
}

pub(super) async fn get_binding(
    b: B,
    Path(p): Path<(String, String, String, String, String)>,
) -> ApiResult {
    ok_json(one(&b, &p)?.0)
}

pub(super) async fn delete_binding(
    b: B,
    Path(p): Path<(String, String, String, String, String)>,
) -> ApiResult {
    let (found, kind) = one(&b, &p)?;
    let (vhost, source, _, dest, _) = &p;
    let key = found
        .get("routing_key")
        .and_then(Value::as_str)
        .unwrap_or("");
    let args =
        json_to_table(found.get("arguments").unwrap_or(&Value::Null)).map_err(bad_request)?;
    let vh = vhost_of(&b.0, vhost)?;
    let src = exchange_name(source);
    let r = if kind == "queue" {
        vh.bind_queue(dest, src, key, &args, false, None)
    } else {
        vh.bind_exchange(dest, src, key, &args, false)
    };
    r.map_err(|e| bad_request(e.text))?;
    no_content()
}
