//! The Warren management API: the subset of RabbitMQ's HTTP API that `warren ctl`, scripts and
//! monitoring need (same URLs, same JSON, same status codes), Prometheus' `/metrics` and the web
//! UI. It works over `warren-broker`'s public API and adds nothing to the message path.
//!
//! Layout (each module only uses the ones below it):
//! - [`http`]: the server, the router and authentication; a handler file per kind of object.
//! - [`ctl_api`]: the `/api/warren/…` endpoints `warren ctl` needs beyond RabbitMQ's URLs;
//!   [`ctl_rows`]: the rows of its listings.
//! - [`api_messages`]: publish and get through the API; [`health_api`]: health checks and
//!   `/api/nodes`; [`ui`]: the web UI's embedded assets.
//! - [`prometheus`]: `/metrics`, `/metrics/per-object` and `/metrics/detailed`.
//! - [`stats_api`]: `message_stats` with rates, this node's channel and consumer rows, and the
//!   rate sampler ([`run_sampler`]), which the binary runs beside the AMQP server.
//! - [`cluster_view`]: the cluster-wide listings (every node's connections, channels,
//!   consumers, queue figures and totals, asked over the links).
//! - [`api`]: the error type and reply helpers every handler shares.

pub mod api;
pub mod api_messages;
pub mod cluster_view;
pub mod ctl_api;
pub mod ctl_rows;
pub mod health_api;
pub mod http;
pub mod prometheus;
pub mod stats_api;
pub mod ui;

pub use http::serve;
pub use stats_api::run_sampler;
