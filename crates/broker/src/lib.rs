//! The Warren broker runtime: one tokio application wiring the pure codec (`warren-protocol`)
//! and routing (`warren-routing`) to sockets.
//!
//! Layout (a publish flows down, a delivery flows up):
//! - [`server`]: the broker, shutdown; [`app`]: listeners, accept loop, stop_app/start_app.
//! - [`connection`]: handshake, auth, tune, heartbeats, frame dispatch to channels, close.
//! - [`channel`]: publish assembly, consumers, acks, prefetch, confirms, tx.
//! - [`vhost`]: exchanges, queues and the routing snapshot publishers read without a lock.
//! - [`queue`]: one queue: ready messages, consumers, dispatch; one mutex per queue.
//! - [`outbox`]: a connection's pending output, written by its writer task in batches.
//! - [`confirm`]: publisher confirms; [`persist`]: group commit of durable queue logs;
//!   [`definitions`]: the durable definitions file.
//! - [`config`], [`limits`], [`error`], [`auth`]; [`node_status`]: the node object `/api/nodes`
//!   and cluster peers report.
//!
//! The HTTP management API is the `warren-mgmt` crate, over this crate's public API.

pub mod access;
pub mod admission;
pub mod alarms;
pub mod app;
pub mod auth;
pub mod channel;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod confirm;
pub mod connection;
pub mod consumer_timeout;
pub mod definitions;
pub mod delayed;
pub mod error;
pub mod export;
pub mod flow;
pub mod json;
pub mod limits;
pub mod message;
pub mod metrics;
pub mod node_status;
pub mod outbox;
pub mod persist;
pub mod policy;
pub mod queue;
pub mod replicated;
pub mod server;
pub mod tls;
pub mod tracking;
pub mod vhost;

pub use config::Config;
pub use server::Broker;
