//! RabbitMQ's health checks (`/api/health/checks/…`, `/api/aliveness-test/{vhost}`), which
//! Kubernetes probes and monitoring scripts call, and the node listing (`/api/nodes`). A failed
//! check is 503 with RabbitMQ's body: `{"status":"failed","reason":…}`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde_json::{json, Value};
use warren_broker::node_status::node_json;
use warren_broker::server::Broker;

use crate::api::{not_found, ok_json, vhost_of, ApiResult, B};

fn failed(body: Value) -> ApiResult {
    Ok((StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response())
}

/// The resources in alarm, as RabbitMQ lists them.
fn alarms(b: &Broker) -> Vec<Value> {
    let st = b.alarms.state();
    let mut out = Vec::new();
    if st.memory {
        out.push(json!({"node": b.config.node_name, "resource": "memory"}));
    }
    if st.disk {
        out.push(json!({"node": b.config.node_name, "resource": "disk"}));
    }
    out
}

fn alarm_check(b: &Broker, reason: &str) -> ApiResult {
    let a = alarms(b);
    if a.is_empty() {
        ok_json(json!({"status": "ok"}))
    } else {
        failed(json!({"status": "failed", "reason": reason, "alarms": a}))
    }
}

pub async fn check_alarms(State(b): B) -> ApiResult {
    alarm_check(&b, "There are alarms in effect in the cluster")
}

pub async fn check_local_alarms(State(b): B) -> ApiResult {
    alarm_check(&b, "There are alarms in effect on the node")
}

/// The listeners serving now: (protocol, port). AMQP ones only while the app runs.
fn listeners(b: &Broker) -> Vec<(&'static str, u16)> {
    let mut out = Vec::new();
    if b.app.running() && b.app.status().listening > 0 {
        out.push(("amqp", b.config.amqp_port));
        if let Some(t) = &b.config.tls {
            out.push(("amqp/ssl", t.port));
        }
    }
    out.push(("http", b.config.http_port));
    out
}

pub async fn check_port_listener(State(b): B, Path(port): Path<String>) -> ApiResult {
    let Ok(port) = port.parse::<u16>() else {
        return Err(crate::api::bad_request(format!("Invalid port: {port}")));
    };
    let l = listeners(&b);
    if l.iter().any(|(_, p)| *p == port) {
        ok_json(json!({"status": "ok", "port": port}))
    } else {
        let ports: Vec<u16> = l.iter().map(|(_, p)| *p).collect();
        failed(json!({"status": "failed", "reason": "No active listener",
                      "missing": port, "ports": ports}))
    }
}

pub async fn check_protocol_listener(State(b): B, Path(protocol): Path<String>) -> ApiResult {
    let l = listeners(&b);
    if l.iter().any(|(p, _)| *p == protocol) {
        ok_json(json!({"status": "ok", "protocol": protocol}))
    } else {
        let protocols: Vec<&str> = l.iter().map(|(p, _)| *p).collect();
        failed(json!({"status": "failed", "reason": "No active listener",
                      "missing": protocol, "protocols": protocols}))
    }
}

pub async fn check_virtual_hosts(State(_b): B) -> ApiResult {
    // Every vhost Warren knows is open: they are opened with the broker or refused at creation.
    ok_json(json!({"status": "ok"}))
}

/// RabbitMQ's `node-is-quorum-critical`: fails (503, listing them) if a quorum queue with a
/// member here would lose its majority were this node shut down: as RabbitMQ's
/// `filter_quorum_critical`, its running members (this one included) are no more than a
/// majority of all (a queue of one member here is critical too).
pub async fn check_quorum_critical(State(b): B) -> ApiResult {
    let Some(c) = warren_broker::cluster::Cluster::of(&b) else {
        return ok_json(json!({"status": "ok", "reason": "single node cluster"}));
    };
    let me = b.config.node_name.as_str();
    let mut critical = Vec::new();
    for v in b.vhosts() {
        for q in v.snapshot().queues.values() {
            let Some((_, members)) = q.group() else {
                continue;
            };
            if !members.iter().any(|m| m == me) {
                continue;
            }
            let up = members.iter().filter(|m| c.running(m)).count();
            if up <= members.len() / 2 + 1 {
                critical.push(json!({
                    "name": &**q.name(),
                    "readable_name": format!("queue '{}' in vhost '{}'", q.name(), v.name),
                    "virtual_host": &*v.name,
                }));
            }
        }
    }
    if critical.is_empty() {
        return ok_json(json!({"status": "ok"}));
    }
    failed(json!({
        "status": "failed",
        "reason": "There are quorum queues that would lose their quorum if the target node is shut down",
        "queues": critical,
    }))
}

/// RabbitMQ's `node-is-mirror-sync-critical`: Warren has no classic mirrored queues (an
/// `ha-mode` policy makes replicated queues, which the quorum check covers), so none is
/// critical.
pub async fn check_mirror_sync_critical(State(b): B) -> ApiResult {
    if warren_broker::cluster::Cluster::of(&b).is_none() {
        return ok_json(json!({"status": "ok", "reason": "single node cluster"}));
    }
    ok_json(json!({"status": "ok"}))
}

/// RabbitMQ's aliveness test: declare `aliveness-test`, publish `test_message` to it through
/// the default exchange and get it back.
pub async fn aliveness_test(State(b): B, Path(vhost): Path<String>) -> ApiResult {
    let v = vhost_of(&b, &vhost)?;
    let args = warren_protocol::FieldTable::new();
    let spec = warren_broker::vhost::QueueSpec {
        name: "aliveness-test",
        passive: false,
        durable: false,
        exclusive: false,
        auto_delete: false,
        arguments: &args,
        conn_id: 0,
        server_named: false,
        home: None,
        members: None,
    };
    let failure = |reason: String| failed(json!({"status": "failed", "reason": reason}));
    let q = match v.declare_queue(&spec) {
        Ok(q) => q,
        Err(e) => return failure(e.text),
    };
    let msg = warren_broker::message::Message {
        exchange: "".into(),
        routing_key: "aliveness-test".into(),
        properties: bytes::Bytes::from_static(&[0, 0]),
        body: bytes::Bytes::from_static(b"test_message"),
        persistent: false,
        priority: None,
        expiration_ms: None,
        forwarded: warren_broker::message::Forwarded::NONE,
    };
    q.publish(Arc::new(msg), None);
    let mut body = None;
    if let Err(e) = q.get(false, |m, _| body = Some(m.msg.body.clone())) {
        return failure(e.text);
    }
    match body {
        Some(b) if &b[..] == b"test_message" => ok_json(json!({"status": "ok"})),
        _ => failure("the test message did not come back".into()),
    }
}

pub async fn list_nodes(State(b): B) -> ApiResult {
    match warren_broker::cluster::Cluster::of(&b) {
        Some(c) => ok_json(Value::Array(c.node_objects(node_json(&b)).await)),
        None => ok_json(json!([node_json(&b)])),
    }
}

pub async fn get_node(State(b): B, Path(name): Path<String>) -> ApiResult {
    if name != b.config.node_name {
        if let Some(c) = warren_broker::cluster::Cluster::of(&b) {
            return match c
                .node_objects(node_json(&b))
                .await
                .into_iter()
                .find(|n| n["name"] == name)
            {
                Some(n) => ok_json(n),
                None => Err(not_found()),
            };
        }
        return Err(not_found());
    }
    ok_json(node_json(&b))
}
