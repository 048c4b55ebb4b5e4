//! The management web UI: static assets embedded in the binary, served without credentials
//! (the pages log in against the HTTP API with the user's name and password, as RabbitMQ's do).

use std::sync::Arc;

use axum::Router;

use crate::server::Broker;

/// The UI's routes (`/` and its assets).
pub fn routes() -> Router<Arc<Broker>> {
    Router::new()
}
