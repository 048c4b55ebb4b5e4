//! Prometheus metrics in the names, types, HELP texts and labels of RabbitMQ 3.10's
//! `rabbitmq_prometheus` plugin (its core metrics collector, the `rabbitmq_global_*` counters,
//! the alarm collector), on RabbitMQ's three endpoints:
//!
//! - `/metrics`: aggregated. Every family as one unlabelled sample per node, plus the
//!   totals, `rabbitmq_build_info`, `rabbitmq_identity_info`, the global counters and alarms.
//! - `/metrics/per-object`: the same families, one sample per object (`{vhost, queue}`,
//!   `{channel}`). It replaces `/metrics`; scraping both duplicates every node series, in
//!   RabbitMQ as here.
//! - `/metrics/detailed?family=F&vhost=V`: only the families asked for, per object, named
//!   `rabbitmq_detailed_*` so that it can be scraped beside `/metrics` without a clash; `vhost`
//!   keeps only those vhosts' queues. No totals and no identity here, as in 3.10.
//!
//! Layout (each file uses only those before it): `exposition.rs`, the text format, what a
//! scrape asked for ([`Scope`], RabbitMQ's groups of families: [`Family`]) and what it reads
//! of the broker; `node.rs`, the node's own series (identity, process, alarms, totals, global
//! counters); `families.rs`, every family and what each reads; this file, the endpoints. Nothing here is on the
//! message path: everything reads counters the broker keeps (`warren_broker::metrics`) or
//! takes a lock a scrape can afford (a queue's, a channel's confirms). docs/prometheus.md
//! lists what is exposed and what of RabbitMQ's does not apply.

mod exposition;
mod families;
mod node;

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use warren_broker::server::Broker;

pub use exposition::{Family, Prom, Scope};

/// The whole exposition for `scope`.
pub fn render(b: &Broker, scope: &Scope) -> String {
    let mut p = Prom::new();
    if !scope.is_detailed() {
        node::identity(b, &mut p);
    }
    families::render(b, scope, &mut p);
    if !scope.is_detailed() {
        node::totals(b, &mut p);
    }
    if !scope.per_object {
        node::global_counters(b, &mut p);
        node::alarms(b, &mut p);
    }
    p.out
}

fn prometheus_text(text: String) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

pub async fn metrics(State(b): State<Arc<Broker>>) -> Response {
    prometheus_text(render(&b, &Scope::aggregated()))
}

pub async fn metrics_per_object(State(b): State<Arc<Broker>>) -> Response {
    prometheus_text(render(&b, &Scope::per_object()))
}

pub async fn metrics_detailed(
    State(b): State<Arc<Broker>>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    match Scope::detailed(&query) {
        Ok(scope) => prometheus_text(render(&b, &scope)),
        Err(reason) => (StatusCode::BAD_REQUEST, format!("{reason}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests;
