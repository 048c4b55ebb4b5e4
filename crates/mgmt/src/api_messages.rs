//! The management API's message endpoints, as RabbitMQ 3.10 answers them: publish to an
//! exchange (`POST /api/exchanges/{vhost}/{name}/publish`) and get messages from a queue
//! (`POST /api/queues/{vhost}/{name}/get`), for the web UI and for scripts. They go through the
//! same routing and queue calls a channel makes, with the API user's permissions.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use base64::Engine;
use bytes::{Bytes, BytesMut};
use serde_json::{json, Map, Value};
use warren_broker::access::{Perm, PermCache, Resource, User};
use warren_broker::message::Message;
use warren_broker::queue::args::parse_expiration;
use warren_protocol::properties::BasicProperties;
use warren_protocol::ByteString;

use crate::api::{bad_request, body_object, ok_json, vhost_of, ApiError, ApiResult, B};
use crate::http::exchanges::exchange_name;

/// An AMQP refusal as RabbitMQ's API words it: `404 NOT_FOUND - no exchange 'x' in vhost '/'`.
fn refused(e: warren_broker::error::AmqpError) -> ApiError {
    bad_request(format!("{} {}", e.code, e.text))
}

/// RabbitMQ's answer to missing keys: `[{key_missing,properties},{key_missing,payload}]`.
fn require(v: &Value, keys: &[&str]) -> Result<(), ApiError> {
    let missing: Vec<String> = keys
        .iter()
        .filter(|k| v.get(**k).is_none())
        .map(|k| format!("{{key_missing,{k}}}"))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(bad_request(format!("[{}]", missing.join(","))))
    }
}

/// The AMQP properties a JSON object names (RabbitMQ's keys).
fn properties_from_json(v: &Value) -> Result<BasicProperties, ApiError> {
    let Some(o) = v.as_object() else {
        // RabbitMQ writes an empty property list as `[]`.
        return match v.as_array() {
            Some(a) if a.is_empty() => Ok(BasicProperties::default()),
            _ => Err(bad_request("properties must be an object")),
        };
    };
    let s = |k: &str| -> Result<Option<ByteString>, ApiError> {
        match o.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(x)) => Ok(Some(ByteString::from(x.as_str()))),
            Some(_) => Err(bad_request(format!("property {k} must be a string"))),
        }
    };
    let n = |k: &str| -> Result<Option<u64>, ApiError> {
        match o.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_u64()
                .map(Some)
                .ok_or_else(|| bad_request(format!("property {k} must be a number"))),
        }
    };
    let small = |k: &str| -> Result<Option<u8>, ApiError> {
        n(k)?
            .map(|x| {
                u8::try_from(x).map_err(|_| bad_request(format!("property {k} is out of range")))
            })
            .transpose()
    };
    let headers = match o.get("headers") {
        None | Some(Value::Null) => None,
        Some(h) => Some(warren_broker::json::json_to_table(h).map_err(bad_request)?),
    };
    Ok(BasicProperties {
        content_type: s("content_type")?,
        content_encoding: s("content_encoding")?,
        headers,
        delivery_mode: small("delivery_mode")?,
        priority: small("priority")?,
        correlation_id: s("correlation_id")?,
        reply_to: s("reply_to")?,
        expiration: s("expiration")?,
        message_id: s("message_id")?,
        timestamp: n("timestamp")?,
        kind: s("type")?,
        user_id: s("user_id")?,
        app_id: s("app_id")?,
        cluster_id: s("cluster_id")?,
    })
}

/// Properties as RabbitMQ's API shows them: only those set, and `[]` when none is.
fn properties_to_json(raw: &Bytes) -> Value {
    let Ok(p) = BasicProperties::decode(raw) else {
        return json!([]);
    };
    let text = |b: &Option<ByteString>| b.as_ref().map(|x| Value::String(x.to_string()));
    let fields: [(&str, Option<Value>); 14] = [
        ("content_type", text(&p.content_type)),
        ("content_encoding", text(&p.content_encoding)),
        (
            "headers",
            p.headers.as_ref().map(warren_broker::json::table_to_json),
        ),
        ("delivery_mode", p.delivery_mode.map(Value::from)),
        ("priority", p.priority.map(Value::from)),
        ("correlation_id", text(&p.correlation_id)),
        ("reply_to", text(&p.reply_to)),
        ("expiration", text(&p.expiration)),
        ("message_id", text(&p.message_id)),
        ("timestamp", p.timestamp.map(Value::from)),
        ("type", text(&p.kind)),
        ("user_id", text(&p.user_id)),
        ("app_id", text(&p.app_id)),
        ("cluster_id", text(&p.cluster_id)),
    ];
    let m: Map<String, Value> = fields
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
        .collect();
    if m.is_empty() {
        json!([])
    } else {
        Value::Object(m)
    }
}

pub async fn publish(
    State(b): B,
    axum::Extension(user): axum::Extension<User>,
    Path((vhost, name)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult {
    let v = body_object(&body)?;
    require(
        &v,
        &["properties", "routing_key", "payload", "payload_encoding"],
    )?;
    let vh = vhost_of(&b, &vhost)?;
    let exchange = exchange_name(&name);
    let routing_key = v["routing_key"]
        .as_str()
        .ok_or_else(|| bad_request("routing_key must be a string"))?;
    let payload = v["payload"]
        .as_str()
        .ok_or_else(|| bad_request("payload must be a string"))?;
    let body: Bytes = match v["payload_encoding"].as_str() {
        Some("string") => Bytes::copy_from_slice(payload.as_bytes()),
        Some("base64") => base64::engine::general_purpose::STANDARD
            .decode(payload)
            .map_err(|e| bad_request(format!("payload is not base64: {e}")))?
            .into(),
        _ => {
            return Err(bad_request(
                "payload_encoding must be \"string\" or \"base64\"",
            ))
        }
    };
    let props = properties_from_json(&v["properties"])?;
    let mut perms = PermCache::default();
    let resource = if exchange.is_empty() {
        "amq.default"
    } else {
        exchange
    };
    perms
        .check(
            &b.access,
            &user.name,
            &vh.name,
            Perm::Write,
            Resource::Exchange,
            resource,
        )
        .map_err(refused)?;
    let expiration_ms = match &props.expiration {
        Some(e) => Some(parse_expiration(e).map_err(|e| bad_request(e.text))?),
        None => None,
    };
    let mut raw = BytesMut::new();
    props.encode(&mut raw);
    let msg = Message {
        exchange: ByteString::from(exchange),
        routing_key: ByteString::from(routing_key),
        properties: raw.freeze(),
        body,
        persistent: props.delivery_mode == Some(2),
        priority: props.priority,
        expiration_ms,
        forwarded: warren_broker::message::Forwarded::NONE,
    };
    let mut targets = Vec::new();
    let delay = vh
        .route_keys(
            &msg.exchange,
            &msg.routing_key,
            &[],
            &msg.properties,
            &mut targets,
        )
        .map_err(refused)?;
    if let Some(delay) = delay {
        // Held for later: RabbitMQ's API reports such a message as not routed.
        if let Some(store) = vh.delay_store(&msg.exchange) {
            store.hold(msg, delay, None);
        }
        return ok_json(json!({ "routed": false }));
    }
    let routed = !targets.is_empty();
    let msg = Arc::new(msg);
    for q in targets {
        q.publish(msg.clone(), None);
    }
    ok_json(json!({ "routed": routed }))
}

/// What a get does with the messages it took: (requeue, settle as acked).
fn ack_mode(mode: &str) -> Result<(bool, bool), ApiError> {
    match mode {
        "ack_requeue_true" => Ok((true, true)),
        "ack_requeue_false" => Ok((false, true)),
        "reject_requeue_true" => Ok((true, false)),
        "reject_requeue_false" => Ok((false, false)),
        other => Err(bad_request(format!(
            "ackmode must be ack_requeue_true, ack_requeue_false, reject_requeue_true or reject_requeue_false, got {other:?}"
        ))),
    }
}

pub async fn get(
    State(b): B,
    axum::Extension(user): axum::Extension<User>,
    Path((vhost, name)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult {
    let v = body_object(&body)?;
    require(&v, &["count", "ackmode", "encoding"])?;
    let count = v["count"]
        .as_u64()
        .ok_or_else(|| bad_request("count must be a number"))?;
    let (requeue, acked) = ack_mode(v["ackmode"].as_str().unwrap_or(""))?;
    let base64_always = match v["encoding"].as_str() {
        Some("auto") => false,
        Some("base64") => true,
        _ => return Err(bad_request("encoding must be \"auto\" or \"base64\"")),
    };
    let truncate = v.get("truncate").and_then(Value::as_u64);
    let vh = vhost_of(&b, &vhost)?;
    let q = vh.queue(&name).ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            json!({"error": "not_found",
                   "reason": format!("NOT_FOUND - no queue '{name}' in vhost '{}'", vh.name)}),
        )
    })?;
    let mut perms = PermCache::default();
    perms
        .check(
            &b.access,
            &user.name,
            &vh.name,
            Perm::Read,
            Resource::Queue,
            &name,
        )
        .map_err(refused)?;
    // Every message is taken before any goes back, so a requeueing get never sees one twice.
    let mut taken = Vec::new();
    let mut rows = Vec::new();
    for _ in 0..count {
        let got = q.get(true, |m, left| {
            taken.push((None, m.clone()));
            let full = &m.msg.body;
            let shown = match truncate {
                Some(t) if (t as usize) < full.len() => &full[..t as usize],
                _ => &full[..],
            };
            let (payload, encoding) = match std::str::from_utf8(shown) {
                Ok(s) if !base64_always => (s.to_string(), "string"),
                _ => (
                    base64::engine::general_purpose::STANDARD.encode(shown),
                    "base64",
                ),
            };
            rows.push(json!({
                "payload_bytes": full.len(),
                "redelivered": m.redelivered,
                "exchange": m.msg.exchange.to_string(),
                "routing_key": m.msg.routing_key.to_string(),
                "message_count": left,
                "properties": properties_to_json(&m.msg.properties),
                "payload": payload,
                "payload_encoding": encoding,
            }));
        });
        match got {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                // A remote queue whose home went down: what was taken goes back.
                q.requeue(taken);
                return Err(crate::api::ApiError(
                    axum::http::StatusCode::NOT_FOUND,
                    json!({"error": "not_found", "reason": e.text}),
                ));
            }
        }
    }
    match (requeue, acked) {
        (true, _) => q.requeue(taken),
        (false, true) => q.settle(taken, true),
        (false, false) => q.discard(taken, true),
    }
    ok_json(Value::Array(rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_round_trip_and_empty_is_a_list() {
        let p = properties_from_json(&json!({
            "delivery_mode": 2, "headers": {"h": 1}, "content_type": "text/plain", "type": "t"
        }))
        .expect("valid");
        let mut raw = BytesMut::new();
        p.encode(&mut raw);
        let back = properties_to_json(&raw.freeze());
        assert_eq!(back["delivery_mode"], 2);
        assert_eq!(back["headers"]["h"], 1);
        assert_eq!(back["content_type"], "text/plain");
        assert_eq!(back["type"], "t");
        let mut raw = BytesMut::new();
        properties_from_json(&json!([]))
            .expect("an empty list")
            .encode(&mut raw);
        assert_eq!(properties_to_json(&raw.freeze()), json!([]));
        assert!(properties_from_json(&json!({"delivery_mode": "x"})).is_err());
    }
}
