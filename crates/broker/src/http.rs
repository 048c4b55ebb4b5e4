//! The HTTP management API: the subset of RabbitMQ's (same URLs, same JSON shapes, same error
//! bodies) that `warren ctl` and scripts need. HTTP basic auth against the broker's users; any
//! of the tags administrator, management, monitoring or policymaker may read, administrator may
//! write (policymaker may also write policies). Loopback-only users stay loopback-only here.
//! Figures are read on demand from the queues; nothing here sits on the message path.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use base64::Engine;
use serde_json::{json, Value};
use tower::Layer;
use warren_routing::Destination;

use crate::access::{
    parse_tags, LimitScope, MgmtError, PermissionDef, PolicyDef, User, UserDef, VhostDef,
};
use crate::json::{json_to_table, table_to_json};
use crate::queue::QueueRef;
use crate::server::Broker;
use crate::vhost::{ExchangeSpec, QueueSpec, VHost};

pub(crate) type B = State<Arc<Broker>>;

/// An API error with RabbitMQ's body shape.
#[derive(Debug)]
pub struct ApiError(pub StatusCode, pub Value);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.0, Json(self.1)).into_response();
        if self.0 == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                "www-authenticate",
                axum::http::HeaderValue::from_static("Basic realm=\"Warren Management\""),
            );
        }
        r
    }
}

pub(crate) fn not_found() -> ApiError {
    ApiError(
        StatusCode::NOT_FOUND,
        json!({"error": "Object Not Found", "reason": "Not Found"}),
    )
}

pub(crate) fn bad_request(reason: impl Into<String>) -> ApiError {
    ApiError(
        StatusCode::BAD_REQUEST,
        json!({"error": "bad_request", "reason": reason.into()}),
    )
}

impl From<MgmtError> for ApiError {
    fn from(e: MgmtError) -> Self {
        match e {
            MgmtError::NotFound(_) => not_found(),
            MgmtError::BadRequest(r) => bad_request(r),
            MgmtError::Internal(r) => ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": "internal_error", "reason": r}),
            ),
            MgmtError::Unavailable(r) => ApiError(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "unavailable", "reason": r}),
            ),
        }
    }
}

pub(crate) type ApiResult = Result<Response, ApiError>;

pub(crate) fn ok_json(v: Value) -> ApiResult {
    Ok(Json(v).into_response())
}

pub(crate) fn no_content() -> ApiResult {
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn created(new: bool) -> ApiResult {
    Ok(if new {
        StatusCode::CREATED
    } else {
        StatusCode::NO_CONTENT
    }
    .into_response())
}

/// Serves the API on `listener` until `shutdown` turns true.
pub async fn serve(
    broker: Arc<Broker>,
    listener: tokio::net::TcpListener,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let app = tower::util::MapRequestLayer::new(trim_trailing_slash).layer(router(broker));
    let r = axum::serve(
        listener,
        axum::ServiceExt::<Request>::into_make_service_with_connect_info::<SocketAddr>(app),
    )
    .with_graceful_shutdown(async move {
        let _ = shutdown.wait_for(|v| *v).await;
    })
    .await;
    if let Err(e) = r {
        tracing::error!(error = %e, "management API stopped");
    }
}

/// RabbitMQ's router answers a path with one trailing slash as the path without it
/// (`/api/queues/%2F/` lists the vhost's queues), and client libraries call it that way. axum
/// matches exact paths, so the slash is cut before routing, once: `/api/overview//` stays a 404,
/// as in RabbitMQ (tower-http's `NormalizePath` would cut them all).
fn trim_trailing_slash(mut req: Request) -> Request {
    let uri = req.uri();
    let path = uri.path();
    if path.len() <= 1 || !path.ends_with('/') {
        return req;
    }
    let trimmed = &path[..path.len() - 1];
    let path_and_query = match uri.query() {
        Some(q) => format!("{trimmed}?{q}"),
        None => trimmed.to_string(),
    };
    let mut parts = uri.clone().into_parts();
    // Cutting a '/' off a valid URI leaves a valid one; were it refused, the request would
    // simply be routed as it came.
    if let Ok(pq) = path_and_query.parse() {
        parts.path_and_query = Some(pq);
        if let Ok(u) = axum::http::Uri::from_parts(parts) {
            *req.uri_mut() = u;
        }
    }
    req
}

pub fn router(broker: Arc<Broker>) -> Router {
    use crate::stats_api as stats;
    let api = Router::new()
        .route("/api/overview", get(overview))
        .route("/api/channels", get(stats::list_channels))
        .route("/api/channels/{name}", get(stats::get_channel))
        .route("/api/vhosts/{name}/channels", get(stats::list_channels_in))
        .route(
            "/api/connections/{name}/channels",
            get(stats::list_connection_channels),
        )
        .route(
            "/api/exchanges/{vhost}/{name}/publish",
            post(crate::api_messages::publish),
        )
        .route(
            "/api/queues/{vhost}/{name}/get",
            post(crate::api_messages::get),
        )
        .route("/api/nodes", get(crate::health_api::list_nodes))
        .route("/api/nodes/{name}", get(crate::health_api::get_node))
        .route(
            "/api/health/checks/alarms",
            get(crate::health_api::check_alarms),
        )
        .route(
            "/api/health/checks/local-alarms",
            get(crate::health_api::check_local_alarms),
        )
        .route(
            "/api/health/checks/port-listener/{port}",
            get(crate::health_api::check_port_listener),
        )
        .route(
            "/api/health/checks/protocol-listener/{protocol}",
            get(crate::health_api::check_protocol_listener),
        )
        .route(
            "/api/health/checks/virtual-hosts",
            get(crate::health_api::check_virtual_hosts),
        )
        .route(
            "/api/health/checks/node-is-quorum-critical",
            get(crate::health_api::check_single_node),
        )
        .route(
            "/api/health/checks/node-is-mirror-sync-critical",
            get(crate::health_api::check_single_node),
        )
        .route(
            "/api/aliveness-test/{vhost}",
            get(crate::health_api::aliveness_test),
        )
        .route("/api/consumers", get(stats::list_consumers))
        .route("/api/consumers/{vhost}", get(stats::list_consumers_in))
        .route("/api/whoami", get(whoami))
        .route("/api/users", get(list_users))
        .route(
            "/api/users/{name}",
            get(get_user).put(put_user).delete(delete_user),
        )
        .route("/api/users/{name}/permissions", get(user_permissions))
        .route("/api/vhosts", get(list_vhosts))
        .route(
            "/api/vhosts/{name}",
            get(get_vhost).put(put_vhost).delete(delete_vhost),
        )
        .route("/api/vhosts/{name}/permissions", get(vhost_permissions))
        .route("/api/permissions", get(list_permissions))
        .route(
            "/api/permissions/{vhost}/{user}",
            get(get_permission)
                .put(put_permission)
                .delete(delete_permission),
        )
        .route("/api/queues", get(list_queues))
        .route("/api/queues/{vhost}", get(list_queues_in))
        .route(
            "/api/queues/{vhost}/{name}",
            get(get_queue).put(put_queue).delete(delete_queue),
        )
        .route(
            "/api/queues/{vhost}/{name}/contents",
            axum::routing::delete(purge_queue),
        )
        .route("/api/exchanges", get(list_exchanges))
        .route("/api/exchanges/{vhost}", get(list_exchanges_in))
        .route(
            "/api/exchanges/{vhost}/{name}",
            get(get_exchange).put(put_exchange).delete(delete_exchange),
        )
        .route("/api/bindings", get(list_bindings))
        .route("/api/bindings/{vhost}", get(list_bindings_in))
        .route("/api/connections", get(list_connections))
        .route(
            "/api/connections/{name}",
            get(get_connection).delete(close_connection),
        )
        .route("/api/policies", get(list_policies))
        .route("/api/policies/{vhost}", get(list_policies_in))
        .route(
            "/api/policies/{vhost}/{name}",
            get(get_policy).put(put_policy).delete(delete_policy),
        )
        .route("/api/vhost-limits", get(list_limits::<false>))
        .route("/api/vhost-limits/{name}", get(limits_of::<false>))
        .route(
            "/api/vhost-limits/{name}/{limit}",
            put(put_limit::<false>).delete(delete_limit::<false>),
        )
        .route("/api/user-limits", get(list_limits::<true>))
        .route("/api/user-limits/{name}", get(limits_of::<true>))
        .route(
            "/api/user-limits/{name}/{limit}",
            put(put_limit::<true>).delete(delete_limit::<true>),
        )
        .route(
            "/api/definitions",
            get(get_definitions).post(post_definitions),
        )
        .merge(crate::ctl_api::routes())
        .fallback(|| async { not_found() })
        .layer(middleware::from_fn_with_state(broker.clone(), authenticate));
    // Prometheus scrapes without credentials, as it does RabbitMQ's plugin (port 15692 there).
    Router::new()
        .route("/metrics", get(stats::metrics))
        .route("/metrics/per-object", get(stats::metrics_per_object))
        .merge(crate::ui::routes())
        .merge(api)
        .with_state(broker)
}

/// Basic auth; the user goes into the request's extensions.
async fn authenticate(
    State(b): B,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut req: Request,
    next: Next,
) -> Response {
    let unauthorized = |reason: &str| {
        ApiError(
            StatusCode::UNAUTHORIZED,
            json!({"error": "not_authorized", "reason": reason}),
        )
        .into_response()
    };
    let creds = req
        .headers()
        .get("authorization")
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Basic "))
        .and_then(|c| {
            base64::engine::general_purpose::STANDARD
                .decode(c.trim())
                .ok()
        })
        .and_then(|c| String::from_utf8(c).ok());
    let Some((name, password)) = creds.as_deref().and_then(|c| c.split_once(':')) else {
        return unauthorized("Not_Authorized");
    };
    let Some(user) = b.access.login(name, password) else {
        tracing::warn!(%peer, user = name, "management API login failed");
        return unauthorized("Login failed");
    };
    if b.config.loopback_users.iter().any(|u| u == name) && !peer.ip().is_loopback() {
        return unauthorized("User can only log in via localhost");
    }
    let tags = ["administrator", "management", "monitoring", "policymaker"];
    if !user.tags.iter().any(|t| tags.contains(&t.as_str())) {
        return ApiError(
            StatusCode::UNAUTHORIZED,
            json!({"error": "not_authorised", "reason": "Not management user"}),
        )
        .into_response();
    }
    let write = req.method() != Method::GET && req.method() != Method::HEAD;
    let policy_write = req.uri().path().starts_with("/api/policies/")
        && user.tags.iter().any(|t| t == "policymaker");
    if write && !user.is_administrator() && !policy_write {
        return ApiError(
            StatusCode::UNAUTHORIZED,
            json!({"error": "not_authorised", "reason": "Not administrator user"}),
        )
        .into_response();
    }
    req.extensions_mut().insert(user);
    next.run(req).await
}

pub(crate) fn vhost_of(b: &Broker, name: &str) -> Result<Arc<VHost>, ApiError> {
    b.vhost(name).ok_or_else(not_found)
}

pub(crate) fn body_object(body: &[u8]) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    let v: Value =
        serde_json::from_slice(body).map_err(|e| bad_request(format!("invalid JSON: {e}")))?;
    if !v.is_object() {
        return Err(bad_request("the body must be a JSON object"));
    }
    Ok(v)
}

fn str_field<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.get(k).and_then(Value::as_str)
}

// ---- overview ----

async fn overview(State(b): B) -> ApiResult {
    // Before the connections lock below: these take it too.
    let (message_stats, queue_totals, churn_rates) = crate::stats_api::overview_stats(&b);
    let (mut queues, mut exchanges, mut consumers) = (0, 0, 0u64);
    for v in b.vhosts() {
        let s = v.snapshot();
        queues += s.queues.len();
        exchanges += s.table.exchanges.len();
        for q in s.queues.values() {
            consumers += q.consumer_count() as u64;
        }
    }
    let conns = b.connections.lock();
    let channels: u64 = conns
        .values()
        .map(|c| c.channels.load(std::sync::atomic::Ordering::Relaxed) as u64)
        .sum();
    ok_json(json!({
        "message_stats": message_stats,
        "churn_rates": churn_rates,
        "management_version": env!("CARGO_PKG_VERSION"),
        "rabbitmq_version": "3.10.8",
        "product_name": b.config.server_properties.product,
        "product_version": b.config.server_properties.version,
        "cluster_name": "warren",
        "node": b.config.node_name,
        "object_totals": {
            "connections": conns.len(), "channels": channels, "exchanges": exchanges,
            "queues": queues, "consumers": consumers,
        },
        "queue_totals": queue_totals,
        "listeners": [
            {"node": b.config.node_name, "protocol": "amqp", "ip_address": b.config.amqp_bind.to_string(), "port": b.config.amqp_port},
            {"node": b.config.node_name, "protocol": "http", "ip_address": b.config.http_bind.to_string(), "port": b.config.http_port},
        ],
    }))
}

async fn whoami(axum::Extension(u): axum::Extension<User>) -> ApiResult {
    ok_json(json!({"name": u.name, "tags": u.tags}))
}

// ---- users ----

fn user_json(u: &UserDef) -> Value {
    json!({
        "name": u.name, "password_hash": u.password_hash,
        "hashing_algorithm": u.hashing_algorithm, "tags": u.tags, "limits": u.limits,
    })
}

async fn list_users(State(b): B) -> ApiResult {
    ok_json(Value::Array(
        b.access.users().iter().map(user_json).collect(),
    ))
}

async fn get_user(State(b): B, Path(name): Path<String>) -> ApiResult {
    let u = b.access.user(&name).ok_or_else(not_found)?;
    ok_json(user_json(&u))
}

async fn put_user(State(b): B, Path(name): Path<String>, body: axum::body::Bytes) -> ApiResult {
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
            crate::access::hash_password(p),
            crate::access::HASH_SHA256.to_string(),
        ),
        (None, Some(h)) => (
            h.to_string(),
            str_field(&v, "hashing_algorithm")
                .unwrap_or(crate::access::HASH_SHA256)
                .to_string(),
        ),
        // Tags only: the password stays as it was (a new user cannot log in with a password).
        (None, None) => existing
            .as_ref()
            .map(|u| (u.password_hash.clone(), u.hashing_algorithm.clone()))
            .unwrap_or_default(),
    };
    let algo = if algo.is_empty() {
        crate::access::HASH_SHA256.to_string()
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

async fn delete_user(State(b): B, Path(name): Path<String>) -> ApiResult {
    b.access.delete_user(&name)?;
    b.close_user_connections(&name, &format!("user '{name}' is deleted"));
    no_content()
}

async fn user_permissions(State(b): B, Path(name): Path<String>) -> ApiResult {
    b.access.user(&name).ok_or_else(not_found)?;
    let ps: Vec<_> = b
        .access
        .permissions()
        .into_iter()
        .filter(|p| p.user == name)
        .collect();
    ok_json(json!(ps))
}

// ---- vhosts ----

fn vhost_json(b: &Broker, v: &VHost) -> Value {
    let (mut ready, mut unacked) = (0u64, 0u64);
    for q in v.snapshot().queues.values() {
        ready += q.message_count() as u64;
        unacked += q.unacked_count() as u64;
    }
    let description = b
        .access
        .vhost_def(&v.name)
        .map(|d| d.description)
        .unwrap_or_default();
    json!({
        "name": &*v.name, "description": description, "tags": [],
        "metadata": {"description": description, "tags": []}, "tracing": false,
        "messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked,
    })
}

async fn list_vhosts(State(b): B) -> ApiResult {
    ok_json(Value::Array(
        b.vhosts().iter().map(|v| vhost_json(&b, v)).collect(),
    ))
}

async fn get_vhost(State(b): B, Path(name): Path<String>) -> ApiResult {
    let v = vhost_of(&b, &name)?;
    ok_json(vhost_json(&b, &v))
}

async fn put_vhost(
    State(b): B,
    axum::Extension(u): axum::Extension<User>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult {
    let v = body_object(&body)?;
    let description = str_field(&v, "description").unwrap_or("").to_string();
    let new = b.add_vhost(VhostDef {
        name: name.clone(),
        description,
    })?;
    if new {
        // As RabbitMQ's API does: whoever creates a vhost gets full permissions on it.
        b.access
            .set_permissions(crate::access::full_permissions(&u.name, &name))?;
    }
    created(new)
}

async fn delete_vhost(State(b): B, Path(name): Path<String>) -> ApiResult {
    b.delete_vhost(&name)?;
    no_content()
}

async fn vhost_permissions(State(b): B, Path(name): Path<String>) -> ApiResult {
    vhost_of(&b, &name)?;
    let ps: Vec<_> = b
        .access
        .permissions()
        .into_iter()
        .filter(|p| p.vhost == name)
        .collect();
    ok_json(json!(ps))
}

// ---- permissions ----

async fn list_permissions(State(b): B) -> ApiResult {
    ok_json(json!(b.access.permissions()))
}

async fn get_permission(State(b): B, Path((vhost, user)): Path<(String, String)>) -> ApiResult {
    let p = b.access.permission(&user, &vhost).ok_or_else(not_found)?;
    ok_json(json!(p))
}

async fn put_permission(
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

async fn delete_permission(State(b): B, Path((vhost, user)): Path<(String, String)>) -> ApiResult {
    b.access.clear_permissions(&user, &vhost)?;
    no_content()
}

// ---- queues ----

fn queue_json(b: &Broker, q: &QueueRef) -> Value {
    let ready = q.message_count();
    let unacked = q.unacked_count();
    let policy = crate::policy::matching(&b.access.policies_of(q.vhost()), q.name(), true).cloned();
    let mut out = json!({
        "name": &**q.name(), "vhost": &**q.vhost(), "durable": q.options().durable,
        "auto_delete": q.options().auto_delete, "exclusive": q.options().exclusive_owner.is_some(),
        "arguments": table_to_json(&q.options().arguments),
        "messages": ready + unacked, "messages_ready": ready,
        "messages_unacknowledged": unacked, "consumers": q.consumer_count(),
        "policy": policy.as_ref().map(|p| p.name.clone()),
        "effective_policy_definition": policy.map(|p| Value::Object(p.definition)).unwrap_or(json!({})),
        "state": if q.remote().is_some_and(|r| !b.cluster().is_some_and(|c| c.running(&r.home))) { "down" } else { "running" },
        "type": q.type_name(), "node": q.home().unwrap_or_else(|| b.config.node_name.clone()),
        "message_stats": crate::stats_api::queue_message_stats(b, q),
    });
    if let Some(r) = q.quorum() {
        // RabbitMQ's quorum queue fields: its leader, its members, the members running.
        let members = r.members();
        let online: Vec<&String> = members
            .iter()
            .filter(|m| b.cluster().is_some_and(|c| c.running(m)))
            .collect();
        let leader = r.leader();
        if r.mirrored() {
            // A mirrored classic queue, as RabbitMQ 3.10 lists one.
            let mirrors: Vec<&String> = members
                .iter()
                .filter(|m| Some(*m) != leader.as_ref())
                .collect();
            out["slave_nodes"] = json!(mirrors);
            out["synchronised_slave_nodes"] = json!(mirrors
                .iter()
                .filter(|m| online.contains(m))
                .collect::<Vec<_>>());
        } else {
            out["members"] = json!(members);
            out["online"] = json!(online);
        }
        out["leader"] = json!(leader);
    }
    out
}

fn queues_of(b: &Broker, vhosts: Vec<Arc<VHost>>) -> Value {
    let mut out = Vec::new();
    for v in vhosts {
        let s = v.snapshot();
        let mut qs: Vec<_> = s.queues.values().collect();
        qs.sort_by(|a, b| a.name().cmp(b.name()));
        out.extend(qs.into_iter().map(|q| queue_json(b, q)));
    }
    Value::Array(out)
}

async fn list_queues(State(b): B) -> ApiResult {
    ok_json(queues_of(&b, b.vhosts()))
}

async fn list_queues_in(State(b): B, Path(vhost): Path<String>) -> ApiResult {
    let v = vhost_of(&b, &vhost)?;
    ok_json(queues_of(&b, vec![v]))
}

async fn get_queue(State(b): B, Path((vhost, name)): Path<(String, String)>) -> ApiResult {
    let q = vhost_of(&b, &vhost)?.queue(&name).ok_or_else(not_found)?;
    ok_json(queue_json(&b, &q))
}

async fn put_queue(
    State(b): B,
    Path((vhost, name)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult {
    let v = body_object(&body)?;
    let vh = vhost_of(&b, &vhost)?;
    let args = json_to_table(v.get("arguments").unwrap_or(&Value::Null)).map_err(bad_request)?;
    let existed = vh.queue(&name).is_some();
    let q = vh
        .declare_queue(&QueueSpec {
            name: &name,
            passive: false,
            durable: v.get("durable").and_then(Value::as_bool).unwrap_or(true),
            exclusive: false,
            auto_delete: v
                .get("auto_delete")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            arguments: &args,
            conn_id: 0,
            server_named: false,
            home: None,
            members: None,
        })
        .map_err(|e| bad_request(e.text))?;
    crate::policy::apply(&b.access, &q);
    created(!existed)
}

async fn delete_queue(
    State(b): B,
    Path((vhost, name)): Path<(String, String)>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> ApiResult {
    let vh = vhost_of(&b, &vhost)?;
    vh.queue(&name).ok_or_else(not_found)?;
    let flag = |k: &str| q.get(k).is_some_and(|v| v == "true");
    let d = vh
        .delete_queue(&name, flag("if-unused"), flag("if-empty"), None)
        .map_err(|e| bad_request(e.text))?;
    crate::channel::notify_cancelled(&d.consumers);
    no_content()
}

async fn purge_queue(State(b): B, Path((vhost, name)): Path<(String, String)>) -> ApiResult {
    let q = vhost_of(&b, &vhost)?.queue(&name).ok_or_else(not_found)?;
    let n = q.purge();
    tracing::info!(vhost = %vhost, queue = %name, messages = n, "queue purged via the management API");
    no_content()
}

// ---- exchanges ----

fn exchange_json(b: &Broker, vhost: &str, x: &warren_routing::Exchange<QueueRef>) -> Value {
    let mut v = json!({
        "name": &*x.name, "vhost": vhost, "type": x.type_name(), "durable": x.durable,
        "auto_delete": x.auto_delete, "internal": x.internal,
        "arguments": table_to_json(&x.arguments),
        "message_stats": crate::stats_api::exchange_message_stats(b, vhost, x),
    });
    if x.delayed {
        // The plugin's `messages_delayed` (its management extension shows it per exchange).
        let n = b.vhost(vhost).map_or(0, |vh| vh.delayed_count(&x.name));
        v["messages_delayed"] = json!(n);
    }
    v
}

fn exchanges_of(b: &Broker, vhosts: Vec<Arc<VHost>>) -> Value {
    let mut out = Vec::new();
    for v in vhosts {
        let s = v.snapshot();
        let mut xs: Vec<_> = s.table.exchanges.values().collect();
        xs.sort_by(|a, b| a.name.cmp(&b.name));
        out.extend(xs.into_iter().map(|x| exchange_json(b, &v.name, x)));
    }
    Value::Array(out)
}

/// The URL name of the default exchange is `amq.default`.
pub(crate) fn exchange_name(n: &str) -> &str {
    if n == "amq.default" {
        ""
    } else {
        n
    }
}

async fn list_exchanges(State(b): B) -> ApiResult {
    ok_json(exchanges_of(&b, b.vhosts()))
}

async fn list_exchanges_in(State(b): B, Path(vhost): Path<String>) -> ApiResult {
    ok_json(exchanges_of(&b, vec![vhost_of(&b, &vhost)?]))
}

async fn get_exchange(State(b): B, Path((vhost, name)): Path<(String, String)>) -> ApiResult {
    let v = vhost_of(&b, &vhost)?;
    let s = v.snapshot();
    let x = s
        .table
        .exchanges
        .get(exchange_name(&name))
        .ok_or_else(not_found)?;
    ok_json(exchange_json(&b, &v.name, x))
}

async fn put_exchange(
    State(b): B,
    Path((vhost, name)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult {
    let v = body_object(&body)?;
    let vh = vhost_of(&b, &vhost)?;
    let args = json_to_table(v.get("arguments").unwrap_or(&Value::Null)).map_err(bad_request)?;
    let existed = vh.snapshot().table.exchanges.contains_key(name.as_str());
    vh.declare_exchange(&ExchangeSpec {
        name: exchange_name(&name),
        kind: str_field(&v, "type").unwrap_or("direct"),
        passive: false,
        durable: v.get("durable").and_then(Value::as_bool).unwrap_or(true),
        auto_delete: v
            .get("auto_delete")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        internal: v.get("internal").and_then(Value::as_bool).unwrap_or(false),
        arguments: &args,
    })
    .map_err(|e| bad_request(e.text))?;
    created(!existed)
}

async fn delete_exchange(
    State(b): B,
    Path((vhost, name)): Path<(String, String)>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> ApiResult {
    let vh = vhost_of(&b, &vhost)?;
    if !vh
        .snapshot()
        .table
        .exchanges
        .contains_key(exchange_name(&name))
    {
        return Err(not_found());
    }
    vh.delete_exchange(
        exchange_name(&name),
        q.get("if-unused").is_some_and(|v| v == "true"),
    )
    .map_err(|e| bad_request(e.text))?;
    no_content()
}

// ---- bindings ----

fn bindings_of(vhosts: Vec<Arc<VHost>>) -> Value {
    let mut out = Vec::new();
    for v in vhosts {
        let s = v.snapshot();
        // The default exchange's implicit binding to every queue, listed as RabbitMQ lists it.
        let mut qs: Vec<_> = s.queues.keys().collect();
        qs.sort();
        for q in qs {
            out.push(json!({
                "source": "", "vhost": &*v.name, "destination": &**q,
                "destination_type": "queue", "routing_key": &**q, "arguments": {},
                "properties_key": &**q,
            }));
        }
        let mut xs: Vec<_> = s.table.exchanges.values().collect();
        xs.sort_by(|a, b| a.name.cmp(&b.name));
        for x in xs {
            for b in &x.bindings {
                let (dest, kind) = match &b.destination {
                    Destination::Queue(q) => (q.name().clone(), "queue"),
                    Destination::Exchange(e) => (e.clone(), "exchange"),
                };
                out.push(json!({
                    "source": &*x.name, "vhost": &*v.name, "destination": &*dest,
                    "destination_type": kind, "routing_key": &*b.routing_key,
                    "arguments": table_to_json(&b.arguments),
                    "properties_key": if b.routing_key.is_empty() { "~".to_string() } else { b.routing_key.to_string() },
                }));
            }
        }
    }
    Value::Array(out)
}

async fn list_bindings(State(b): B) -> ApiResult {
    ok_json(bindings_of(b.vhosts()))
}

async fn list_bindings_in(State(b): B, Path(vhost): Path<String>) -> ApiResult {
    ok_json(bindings_of(vec![vhost_of(&b, &vhost)?]))
}

// ---- connections ----

pub(crate) fn connection_json(c: &crate::tracking::ConnInfo) -> Value {
    use std::sync::atomic::Ordering::Relaxed;
    json!({
        "name": c.name, "node": &*c.node, "type": "network", "state": "running",
        "protocol": "AMQP 0-9-1", "auth_mechanism": "PLAIN",
        "user": c.user, "vhost": c.vhost,
        "host": c.local.ip().to_string(), "port": c.local.port(),
        "peer_host": c.peer.ip().to_string(), "peer_port": c.peer.port(),
        "connected_at": c.connected_at_ms, "channels": c.channels.load(Relaxed),
        "frame_max": c.frame_max.load(Relaxed), "timeout": c.heartbeat_s.load(Relaxed),
        "client_properties": c.client_properties, "ssl": false,
        "recv_oct": c.recv_oct.load(Relaxed), "recv_cnt": c.recv_cnt.load(Relaxed),
        "send_oct": c.outbox.sent_octets.load(Relaxed),
        "send_cnt": c.outbox.writes.load(Relaxed),
    })
}

async fn list_connections(State(b): B) -> ApiResult {
    let mut cs: Vec<_> = b.connections.lock().values().cloned().collect();
    cs.sort_by_key(|c| c.id);
    ok_json(Value::Array(
        cs.iter()
            .map(|c| {
                let mut row = connection_json(c);
                crate::stats_api::add_connection_rates(&b, c, &mut row);
                row
            })
            .collect(),
    ))
}

fn find_connection(b: &Broker, name: &str) -> Result<Arc<crate::tracking::ConnInfo>, ApiError> {
    b.connections
        .lock()
        .values()
        .find(|c| c.name == name)
        .cloned()
        .ok_or_else(not_found)
}

async fn get_connection(State(b): B, Path(name): Path<String>) -> ApiResult {
    let c = find_connection(&b, &name)?;
    let mut row = connection_json(&c);
    crate::stats_api::add_connection_rates(&b, &c, &mut row);
    ok_json(row)
}

async fn close_connection(State(b): B, Path(name): Path<String>, headers: HeaderMap) -> ApiResult {
    let c = find_connection(&b, &name)?;
    let reason = headers
        .get("x-reason")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("Closed via management plugin");
    tracing::info!(conn = c.id, name = %c.name, reason, "closing connection via the management API");
    c.force_close(reason);
    no_content()
}

// ---- policies ----

async fn list_policies(State(b): B) -> ApiResult {
    ok_json(json!(b.access.policies()))
}

async fn list_policies_in(State(b): B, Path(vhost): Path<String>) -> ApiResult {
    vhost_of(&b, &vhost)?;
    ok_json(json!(b.access.policies_of(&vhost)))
}

async fn get_policy(State(b): B, Path((vhost, name)): Path<(String, String)>) -> ApiResult {
    let p = b
        .access
        .policies_of(&vhost)
        .into_iter()
        .find(|p| p.name == name)
        .ok_or_else(not_found)?;
    ok_json(json!(p))
}

async fn put_policy(
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
    crate::policy::put(
        &b,
        PolicyDef {
            vhost,
            name,
            pattern: pattern.to_string(),
            apply_to: str_field(&v, "apply-to").unwrap_or("all").to_string(),
            definition: definition.clone(),
            priority,
        },
    )?;
    created(new)
}

async fn delete_policy(State(b): B, Path((vhost, name)): Path<(String, String)>) -> ApiResult {
    crate::policy::delete(&b, &vhost, &name)?;
    no_content()
}

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
fn limits_json(user: bool, rows: Vec<(String, crate::access::Limits)>) -> ApiResult {
    let key = if user { "user" } else { "vhost" };
    ok_json(Value::Array(
        rows.into_iter()
            .filter(|(_, l)| !l.is_empty())
            .map(|(n, l)| json!({ key: n, "value": l }))
            .collect(),
    ))
}

async fn list_limits<const USER: bool>(State(b): B) -> ApiResult {
    limits_json(USER, b.access.all_limits(limit_scope(USER)))
}

async fn limits_of<const USER: bool>(State(b): B, Path(name): Path<String>) -> ApiResult {
    let l = b.access.limits(limit_scope(USER), &name)?;
    limits_json(USER, vec![(name, l)])
}

/// PUT `{"value": N}` sets one limit (merged with the others, as RabbitMQ's API does).
async fn put_limit<const USER: bool>(
    State(b): B,
    Path((name, limit)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult {
    let v = body_object(&body)?;
    let Some(value) = v.get("value") else {
        return Err(bad_request("[{key_missing,value}]"));
    };
    let mut def = crate::access::Limits::new();
    def.insert(limit, value.clone());
    b.access.set_limits(limit_scope(USER), &name, &def, false)?;
    b.limits_changed(limit_scope(USER), &name);
    no_content()
}

/// Limit `all` clears every limit (RabbitMQ's clear_user_limits U all).
async fn delete_limit<const USER: bool>(
    State(b): B,
    Path((name, limit)): Path<(String, String)>,
) -> ApiResult {
    b.access
        .clear_limit(limit_scope(USER), &name, Some(&limit))?;
    b.limits_changed(limit_scope(USER), &name);
    no_content()
}

// ---- definitions ----

async fn get_definitions(State(b): B) -> ApiResult {
    ok_json(crate::export::export(&b))
}

async fn post_definitions(State(b): B, body: axum::body::Bytes) -> ApiResult {
    let v = body_object(&body)?;
    crate::export::import(&b, &v).map_err(bad_request)?;
    no_content()
}
