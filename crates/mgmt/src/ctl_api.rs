//! The management API's Warren endpoints, under `/api/warren/`: what `warren ctl` needs to stand
//! in for rabbitmqctl where RabbitMQ's HTTP API has no URL (rabbitmqctl talks Erlang
//! distribution instead). Reading takes a management user, as RabbitMQ's own listings do;
//! changing (stop_app, start_app, the watermark) an administrator. Listings carry what rabbitmqctl prints and
//! RabbitMQ's JSON lacks (pids; client properties in the client's order, with their types'
//! distinctions); `warren ctl` lays them out.
//!
//! | endpoint | answer |
//! |---|---|
//! | GET `connections`, `channels`, `consumers` | rows keyed by rabbitmqctl's column names |
//! | GET `status`, `environment` | the figures and settings `status` / `environment` print |
//! | PUT `vm_memory_high_watermark` | `{"fraction": F}` or `{"absolute": BYTES}`; in force at once |
//! | POST `stop_app`, `start_app` | 204 once done (connections closed / listeners bound) |

use std::sync::Arc;

use axum::extract::State;
use axum::routing::{get, post, put};
use axum::Router;
use serde_json::{json, Value};
use warren_broker::alarms::MemoryWatermark;
use warren_broker::node_status::file_descriptors;
use warren_broker::server::Broker;

use crate::api::{bad_request, no_content, ok_json, ApiError, ApiResult};
use crate::cluster_view::rows;

type B = State<Arc<Broker>>;

pub fn routes() -> Router<Arc<Broker>> {
    Router::new()
        .route("/api/warren/connections", get(connections))
        .route("/api/warren/channels", get(channels))
        .route("/api/warren/consumers", get(consumers))
        .route("/api/warren/status", get(status))
        .route("/api/warren/environment", get(environment))
        .route(
            "/api/warren/vm_memory_high_watermark",
            put(set_memory_watermark),
        )
        .route("/api/warren/stop_app", post(stop_app))
        .route("/api/warren/start_app", post(start_app))
        .route("/api/warren/cluster", get(cluster_status))
        .route("/api/warren/cluster/forget", post(forget_node))
        .route("/api/warren/cluster/join", post(join_cluster))
        .route("/api/warren/queues/members", post(queue_member))
        .route("/api/warren/queues/rebalance", post(rebalance))
}

/// rabbitmq-queues rebalance: `{"type": "all" | "quorum" | "classic", "vhost_pattern",
/// "queue_pattern"}` (regexes, default `.*`) -> `{"leaders": {node: replicated queues led}}`.
async fn rebalance(State(b): B, body: axum::body::Bytes) -> ApiResult {
    use warren_broker::cluster::quorum::rebalance::Kind;
    let v: Value = serde_json::from_slice(&body).map_err(|e| bad_request(e.to_string()))?;
    let kind = match v.get("type").and_then(Value::as_str).unwrap_or("all") {
        "all" => Kind::All,
        "quorum" => Kind::Quorum,
        "classic" => Kind::Classic,
        other => {
            return Err(bad_request(format!(
                "unknown queue type '{other}' (all, quorum or classic)"
            )))
        }
    };
    let pattern = |k: &str| {
        let p = v.get(k).and_then(Value::as_str).unwrap_or(".*");
        regex::Regex::new(p).map_err(|e| bad_request(format!("invalid {k} '{p}': {e}")))
    };
    let (vhosts, queues) = (pattern("vhost_pattern")?, pattern("queue_pattern")?);
    let keep = |v: &str, q: &str| vhosts.is_match(v) && queues.is_match(q);
    let leaders = match warren_broker::cluster::Cluster::of(&b) {
        Some(c) => c.rebalance(&b, kind, keep).await,
        // A single node leads every replicated queue it has.
        None => {
            let mut led = 0;
            for v in b.vhosts() {
                let s = v.snapshot();
                led += s
                    .queues
                    .values()
                    .filter(|q| q.group().is_some() && keep(&v.name, q.name()))
                    .count();
            }
            std::iter::once((b.config.node_name.clone(), led)).collect()
        }
    };
    ok_json(json!({ "leaders": leaders }))
}

/// rabbitmq-queues add_member / delete_member (grow and shrink are made of these):
/// `{"vhost", "queue", "node", "action": "add" | "delete"}`.
async fn queue_member(State(b): B, body: axum::body::Bytes) -> ApiResult {
    let c = warren_broker::cluster::Cluster::of(&b).ok_or_else(not_clustered)?;
    let v: Value = serde_json::from_slice(&body).map_err(|e| bad_request(e.to_string()))?;
    let field = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .map(String::from)
            .ok_or_else(|| bad_request(format!("[{{key_missing,{k}}}]")))
    };
    let (vhost, queue, node) = (field("vhost")?, field("queue")?, field("node")?);
    let add = match field("action")?.as_str() {
        "add" => true,
        "delete" => false,
        other => return Err(bad_request(format!("unknown action '{other}'"))),
    };
    c.change_queue_member(&vhost, &queue, &node, add).await?;
    no_content()
}

fn not_clustered() -> ApiError {
    bad_request("this node is not part of a cluster (no [cluster] section in its config)")
}

async fn cluster_status(State(b): B) -> ApiResult {
    match warren_broker::cluster::Cluster::of(&b) {
        Some(c) => {
            let mut s = c.status_json();
            s["cluster_name"] = json!(b.cluster_name());
            ok_json(s)
        }
        None => ok_json(json!({
            "cluster_name": b.cluster_name(),
            "node": b.config.node_name,
            "nodes": [{"name": b.config.node_name, "voter": true, "running": true}],
            "leader": b.config.node_name,
        })),
    }
}

async fn join_cluster(State(b): B, body: axum::body::Bytes) -> ApiResult {
    let c = warren_broker::cluster::Cluster::of(&b)
        .ok_or_else(not_clustered)?
        .clone();
    let v: Value = serde_json::from_slice(&body).map_err(|e| bad_request(e.to_string()))?;
    let node = v
        .get("node")
        .and_then(Value::as_str)
        .ok_or_else(|| bad_request("[{key_missing,node}]"))?;
    if b.app.running() {
        return Err(bad_request(format!(
            "the AMQP application is still running on node {}; stop it with stop_app first",
            b.config.node_name
        )));
    }
    c.join_cluster(&b, node).await.map_err(bad_request)?;
    no_content()
}

async fn forget_node(State(b): B, body: axum::body::Bytes) -> ApiResult {
    let c = warren_broker::cluster::Cluster::of(&b).ok_or_else(not_clustered)?;
    let v: Value = serde_json::from_slice(&body).map_err(|e| bad_request(e.to_string()))?;
    let node = v
        .get("node")
        .and_then(Value::as_str)
        .ok_or_else(|| bad_request("[{key_missing,node}]"))?;
    c.forget(node).await.map_err(bad_request)?;
    tracing::info!(node, "node removed from the cluster");
    no_content()
}

async fn connections(State(b): B) -> ApiResult {
    ok_json(Value::Array(rows(&b, "ctl_connections").await))
}

async fn channels(State(b): B) -> ApiResult {
    ok_json(Value::Array(rows(&b, "ctl_channels").await))
}

async fn consumers(State(b): B) -> ApiResult {
    ok_json(Value::Array(rows(&b, "ctl_consumers").await))
}

fn watermark_json(w: MemoryWatermark) -> Value {
    match w {
        MemoryWatermark::Fraction(f) => json!({ "fraction": f }),
        MemoryWatermark::Absolute(n) => json!({ "absolute": n }),
    }
}

async fn status(State(b): B) -> ApiResult {
    let t = b.alarms.thresholds();
    let alarms = b.alarms.state();
    let (fds, fd_limit) = file_descriptors();
    let queues: usize = b.vhosts().iter().map(|v| v.snapshot().queues.len()).sum();
    let running = b.app.running() && b.app.status().listening > 0;
    let mut listeners = Vec::new();
    if running {
        listeners.push(
            json!({"interface": b.config.amqp_bind.to_string(), "port": b.config.amqp_port,
            "protocol": "amqp", "purpose": "AMQP 0-9-1"}),
        );
        if let Some(tls) = &b.config.tls {
            listeners.push(
                json!({"interface": tls.bind.unwrap_or(b.config.amqp_bind).to_string(),
                "port": tls.port, "protocol": "amqp/ssl", "purpose": "AMQP 0-9-1 over TLS"}),
            );
        }
    }
    listeners.push(
        json!({"interface": b.config.http_bind.to_string(), "port": b.config.http_port,
        "protocol": "http", "purpose": "HTTP API"}),
    );
    ok_json(json!({
        "node": b.config.node_name,
        "os_pid": std::process::id(),
        "uptime_s": b.started_at.elapsed().as_secs(),
        "rabbitmq_version": "3.10.8",
        "product_name": b.config.server_properties.product,
        "product_version": b.config.server_properties.version,
        "warren_version": env!("CARGO_PKG_VERSION"),
        "running": running,
        "data_dir": b.config.data_dir.display().to_string(),
        "alarms": {"memory": alarms.memory, "disk": alarms.disk},
        "memory": {
            "used_bytes": warren_broker::alarms::resident_bytes(),
            "strategy": "rss",
            "watermark": watermark_json(t.memory_watermark),
            "limit_bytes": t.memory_bytes,
        },
        "file_descriptors": {"open": fds, "limit": fd_limit},
        "disk": {"free_bytes": b.alarms.disk_free_bytes(), "limit_bytes": t.disk_free_bytes},
        "totals": {
            "connections": b.connections.lock().len(),
            "queues": queues,
            "vhosts": b.vhosts().len(),
        },
        "listeners": listeners,
    }))
}

/// An Erlang string ("…", a charlist as rabbitmqctl prints paths and addresses).
fn erl_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// An Erlang binary (<<"…">>, as RabbitMQ keeps user names).
fn erl_bin(s: &str) -> String {
    format!("<<{}>>", erl_str(s))
}

fn erl_list(items: impl IntoIterator<Item = String>) -> String {
    format!("[{}]", items.into_iter().collect::<Vec<_>>().join(","))
}

/// `[[app, [[key, term], ...]], ...]`: the settings in force, under RabbitMQ's application
/// and key names where RabbitMQ has the setting (`warren` for the others), each value already
/// an Erlang term as `rabbitmqctl environment` prints it.
async fn environment(State(b): B) -> ApiResult {
    let c = &b.config;
    let l = &c.limits;
    let watermark = match b.alarms.thresholds().memory_watermark {
        MemoryWatermark::Fraction(f) => format!("{f:?}"),
        MemoryWatermark::Absolute(n) => format!("{{absolute,{n}}}"),
    };
    let mut rabbit = vec![
        ("channel_max", l.channel_max.to_string()),
        (
            "connection_max",
            match l.connection_max {
                0 => "infinity".to_string(),
                n => n.to_string(),
            },
        ),
        ("disk_free_limit", l.disk_free_limit_bytes.to_string()),
        ("frame_max", l.frame_max.to_string()),
        ("handshake_timeout", l.handshake_timeout_ms.to_string()),
        ("heartbeat", l.heartbeat_s.to_string()),
        (
            "loopback_users",
            erl_list(c.loopback_users.iter().map(|u| erl_bin(u))),
        ),
        ("max_message_size", l.message_size_max_bytes.to_string()),
    ];
    if let Some(t) = &c.tls {
        let bind = t.bind.unwrap_or(c.amqp_bind).to_string();
        rabbit.push((
            "ssl_listeners",
            format!("[{{{},{}}}]", erl_str(&bind), t.port),
        ));
        let mut opts = vec![
            format!(
                "{{certfile,{}}}",
                erl_str(&t.cert_file.display().to_string())
            ),
            format!("{{keyfile,{}}}", erl_str(&t.key_file.display().to_string())),
        ];
        if let Some(ca) = &t.ca_file {
            opts.push(format!(
                "{{cacertfile,{}}}",
                erl_str(&ca.display().to_string())
            ));
        }
        let verify = match t.verify {
            warren_broker::config::TlsVerify::VerifyNone => "verify_none",
            warren_broker::config::TlsVerify::VerifyPeer => "verify_peer",
        };
        opts.push(format!("{{verify,{verify}}}"));
        opts.push(format!(
            "{{fail_if_no_peer_cert,{}}}",
            t.fail_if_no_peer_cert
        ));
        rabbit.push(("ssl_options", erl_list(opts)));
    }
    rabbit.extend([
        (
            "tcp_listen_options",
            format!(
                "[{{backlog,1024}},{{nodelay,true}},{{recbuf,{}}},{{send_timeout,{}}}]",
                warren_broker::limits::SOCKET_RECV_BUFFER_BYTES,
                l.send_timeout_ms
            ),
        ),
        (
            "tcp_listeners",
            format!(
                "[{{{},{}}}]",
                erl_str(&c.amqp_bind.to_string()),
                c.amqp_port
            ),
        ),
        ("vm_memory_calculation_strategy", "rss".to_string()),
        ("vm_memory_high_watermark", watermark),
    ]);
    let management = vec![(
        "tcp_config",
        format!(
            "[{{ip,{}}},{{port,{}}}]",
            erl_str(&c.http_bind.to_string()),
            c.http_port
        ),
    )];
    let mut warren = vec![
        ("auth_failure_delay", l.auth_failure_delay_ms.to_string()),
        ("data_dir", erl_str(&c.data_dir.display().to_string())),
    ];
    if let Some(f) = &c.definitions_file {
        warren.push(("definitions_file", erl_str(&f.display().to_string())));
    }
    warren.extend([
        (
            "server_properties",
            format!(
                "[{{product,{}}},{{version,{}}}]",
                erl_bin(&c.server_properties.product),
                erl_bin(&c.server_properties.version)
            ),
        ),
        (
            "unacked_max_per_channel",
            l.unacked_max_per_channel.to_string(),
        ),
    ]);
    let app = |name: &str, keys: Vec<(&str, String)>| json!([name, keys]);
    ok_json(json!([
        app("rabbit", rabbit),
        app("rabbitmq_management", management),
        app("warren", warren),
    ]))
}

async fn set_memory_watermark(State(b): B, body: axum::body::Bytes) -> ApiResult {
    let v = crate::api::body_object(&body)?;
    let w = match (v.get("fraction"), v.get("absolute")) {
        (Some(f), None) => match f.as_f64() {
            Some(f) if (0.0..=1.0).contains(&f) => MemoryWatermark::Fraction(f),
            _ => {
                return Err(bad_request(
                    "The threshold should be a fraction between 0.0 and 1.0",
                ))
            }
        },
        (None, Some(n)) => match n.as_u64() {
            Some(n) if n > 0 => MemoryWatermark::Absolute(n),
            _ => {
                return Err(bad_request(
                    "The threshold should be an integer above 0 (bytes).",
                ))
            }
        },
        _ => {
            return Err(bad_request(
                "give either \"fraction\" or \"absolute\" (bytes)",
            ))
        }
    };
    b.alarms.set_memory_watermark(w);
    no_content()
}

fn app_error(reason: String) -> ApiError {
    ApiError(
        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
        json!({"error": "internal_error", "reason": reason}),
    )
}

async fn stop_app(State(b): B) -> ApiResult {
    tracing::info!("stop_app: closing AMQP listeners and connections");
    b.app.stop().await.map_err(app_error)?;
    no_content()
}

async fn start_app(State(b): B) -> ApiResult {
    tracing::info!("start_app");
    b.app.start().await.map_err(app_error)?;
    no_content()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erlang_terms() {
        assert_eq!(erl_bin("gu\"est"), "<<\"gu\\\"est\">>");
        assert_eq!(erl_list(["1".to_string(), "2".to_string()]), "[1,2]");
    }
}
