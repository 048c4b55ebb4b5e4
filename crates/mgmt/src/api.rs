//! The management API's error type and replies, which every handler module uses (and which
//! imports none of them): [`ApiError`] with RabbitMQ's error bodies, the JSON and empty replies,
//! and the request-body and vhost lookups the handlers share.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use warren_broker::access::MgmtError;
use warren_broker::server::Broker;
use warren_broker::vhost::VHost;

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

pub(crate) fn created(new: bool) -> ApiResult {
    Ok(if new {
        StatusCode::CREATED
    } else {
        StatusCode::NO_CONTENT
    }
    .into_response())
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

pub(crate) fn str_field<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.get(k).and_then(Value::as_str)
}
