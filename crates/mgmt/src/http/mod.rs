//! The HTTP management API: the subset of RabbitMQ's (same URLs, same JSON shapes, same error
//! bodies) that `warren ctl` and scripts need. HTTP basic auth against the broker's users; any
//! of the tags administrator, management, monitoring or policymaker may read, administrator may
//! write (policymaker may also write policies and runtime parameters). Loopback-only users stay loopback-only here.
//! Figures are read on demand from the queues, and in a cluster from every node
//! (`cluster_view`); nothing here sits on the message path.
//!
//! This file holds the server, the router and the authentication every request passes; the
//! error and reply helpers every API module uses are in `crate::api`. The handlers are in a
//! file per kind of object: `overview` (and `whoami`, definitions), `users` (and permissions),
//! `vhosts`, `queues`, `exchanges` (and the binding listings), `bindings` (one exchange's or
//! queue's, adding and removing one), `connections`, `channels` (and consumers), `policies`,
//! `limits`, `parameters` (and shovels); `paging` sorts, filters and pages any list reply with RabbitMQ's query
//! parameters; the other API modules (`stats_api`, `cluster_view`, `ctl_api`, `health_api`,
//! `api_messages`, `ui`) sit beside this one. This file names the handlers only to route to
//! them; none of them imports it.

mod binding_key;
mod bindings;
mod channels;
mod connections;
pub(crate) mod exchanges;
mod limits;
mod overview;
pub(crate) mod paging;
mod parameters;
mod policies;
mod queues;
mod users;
mod vhosts;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use base64::Engine;
use serde_json::json;
use tower::Layer;
use warren_broker::server::Broker;
use warren_federation::Federation;
use warren_shovel::Shovels;

use crate::api::{not_found, ApiError, B};

use connections::{close_connection, get_connection, list_connections};
use exchanges::{
    delete_exchange, get_exchange, list_bindings, list_bindings_in, list_exchanges,
    list_exchanges_in, put_exchange,
};
use limits::{delete_limit, limits_of, list_limits, put_limit};
use overview::{get_definitions, overview, post_definitions, whoami};
use policies::{delete_policy, get_policy, list_policies, list_policies_in, put_policy};
use queues::{delete_queue, get_queue, list_queues, list_queues_in, purge_queue, put_queue};
use users::{
    delete_permission, delete_user, get_permission, get_user, list_permissions, list_users,
    put_permission, put_user, user_permissions,
};
use vhosts::{delete_vhost, get_vhost, list_vhosts, put_vhost, vhost_permissions};

/// Serves the API on `listener` until `shutdown` turns true.
pub async fn serve(
    broker: Arc<Broker>,
    shovels: Arc<Shovels>,
    federation: Arc<Federation>,
    listener: tokio::net::TcpListener,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let app = tower::util::MapRequestLayer::new(trim_trailing_slash)
        .layer(router(broker, shovels, federation));
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

pub fn router(broker: Arc<Broker>, shovels: Arc<Shovels>, federation: Arc<Federation>) -> Router {
    // Other nodes' management questions are answered by this layer.
    broker.set_local_view(Arc::new(crate::cluster_view::NodeView {
        shovels: shovels.clone(),
        federation: federation.clone(),
    }));
    let api = Router::new()
        .route("/api/overview", get(overview))
        .route(
            "/api/cluster-name",
            get(overview::get_cluster_name).put(overview::put_cluster_name),
        )
        .route(
            "/api/global-parameters",
            get(overview::list_global_parameters),
        )
        .route(
            "/api/global-parameters/{name}",
            get(overview::get_global_parameter).put(overview::put_global_parameter),
        )
        .route("/api/channels", get(channels::list_channels))
        .route("/api/channels/{name}", get(channels::get_channel))
        .route(
            "/api/vhosts/{name}/channels",
            get(channels::list_channels_in),
        )
        .route(
            "/api/connections/{name}/channels",
            get(channels::list_connection_channels),
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
            get(crate::health_api::check_quorum_critical),
        )
        .route(
            "/api/health/checks/node-is-mirror-sync-critical",
            get(crate::health_api::check_mirror_sync_critical),
        )
        .route(
            "/api/aliveness-test/{vhost}",
            get(crate::health_api::aliveness_test),
        )
        .route("/api/consumers", get(channels::list_consumers))
        .route("/api/consumers/{vhost}", get(channels::list_consumers_in))
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
        .route(
            "/api/bindings/{vhost}/e/{source}/{dtype}/{dest}",
            get(bindings::list_between).post(bindings::add_binding),
        )
        .route(
            "/api/bindings/{vhost}/e/{source}/{dtype}/{dest}/{props}",
            get(bindings::get_binding).delete(bindings::delete_binding),
        )
        .route(
            "/api/exchanges/{vhost}/{name}/bindings/{side}",
            get(bindings::exchange_bindings),
        )
        .route(
            "/api/queues/{vhost}/{name}/bindings",
            get(bindings::queue_bindings),
        )
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
        .route("/api/parameters", get(parameters::list_all))
        .route(
            "/api/parameters/{component}",
            get(parameters::list_component),
        )
        .route(
            "/api/parameters/{component}/{vhost}",
            get(parameters::list_in),
        )
        .route(
            "/api/parameters/{component}/{vhost}/{name}",
            get(parameters::get_one)
                .put(parameters::put_one)
                .delete(parameters::delete_one),
        )
        .route("/api/shovels", get(parameters::list_shovels))
        .route("/api/shovels/{vhost}", get(parameters::list_shovels_in))
        .route(
            "/api/shovels/vhost/{vhost}/{name}",
            get(parameters::get_shovel),
        )
        .route(
            "/api/shovels/vhost/{vhost}/{name}/restart",
            axum::routing::delete(parameters::restart_shovel),
        )
        .route("/api/federation-links", get(parameters::list_links))
        .route(
            "/api/federation-links/{vhost}",
            get(parameters::list_links_in),
        )
        .merge(crate::ctl_api::routes())
        .fallback(|| async { not_found() })
        .layer(axum::Extension(shovels))
        .layer(axum::Extension(federation))
        .layer(middleware::from_fn_with_state(broker.clone(), authenticate));
    // Prometheus scrapes without credentials, as it does RabbitMQ's plugin (port 15692 there).
    Router::new()
        .route("/metrics", get(crate::prometheus::metrics))
        .route(
            "/metrics/per-object",
            get(crate::prometheus::metrics_per_object),
        )
        .route(
            "/metrics/detailed",
            get(crate::prometheus::metrics_detailed),
        )
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
    // RabbitMQ's policymaker may also set and clear runtime parameters (shovels).
    let path = req.uri().path();
    let policy_write = (path.starts_with("/api/policies/") || path.starts_with("/api/parameters/"))
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
