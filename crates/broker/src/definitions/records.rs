//! The records the registry keeps, as RabbitMQ's definitions describe them: users, vhosts,
//! permissions, policies, runtime limits, and the error a management change answers. A leaf
//! module (it imports nothing from the crate), so the definitions command
//! (`definitions::op::DefOp`) can carry them while `Access` holds the interface that proposes
//! it, without an import cycle.

use serde::{Deserialize, Deserializer, Serialize};

pub const HASH_SHA256: &str = "rabbit_password_hashing_sha256";
pub const HASH_SHA512: &str = "rabbit_password_hashing_sha512";

/// A user as RabbitMQ's definitions describe it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct UserDef {
    pub name: String,
    #[serde(default)]
    pub password_hash: String,
    #[serde(default = "default_hashing")]
    pub hashing_algorithm: String,
    /// RabbitMQ 3.9+ writes a list; older exports a comma-separated string. Both are read.
    #[serde(default, deserialize_with = "tags_either")]
    pub tags: Vec<String>,
    #[serde(default)]
    pub limits: serde_json::Map<String, serde_json::Value>,
}

fn default_hashing() -> String {
    HASH_SHA256.to_string()
}

fn tags_either<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Tags {
        List(Vec<String>),
        Text(String),
    }
    Ok(match Tags::deserialize(d)? {
        Tags::List(v) => v,
        Tags::Text(s) => parse_tags(&s),
    })
}

/// Tags as given to `set_user_tags` or the HTTP API: comma- or space-separated.
pub fn parse_tags(s: &str) -> Vec<String> {
    s.split([',', ' '])
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(String::from)
        .collect()
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct VhostDef {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PermissionDef {
    pub user: String,
    pub vhost: String,
    pub configure: String,
    pub write: String,
    pub read: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PolicyDef {
    pub vhost: String,
    pub name: String,
    pub pattern: String,
    #[serde(rename = "apply-to", default = "default_apply_to")]
    pub apply_to: String,
    pub definition: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    pub priority: i64,
}

fn default_apply_to() -> String {
    "all".to_string()
}

pub type Limits = serde_json::Map<String, serde_json::Value>;

/// An error of a management operation, with the HTTP status it maps to.
#[derive(Debug, Clone, PartialEq)]
pub enum MgmtError {
    NotFound(String),
    BadRequest(String),
    /// The change could not be persisted; it was not applied.
    Internal(String),
    /// A cluster without a majority cannot record the change (HTTP 503).
    Unavailable(String),
}

impl std::fmt::Display for MgmtError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MgmtError::NotFound(s)
            | MgmtError::BadRequest(s)
            | MgmtError::Internal(s)
            | MgmtError::Unavailable(s) => f.write_str(s),
        }
    }
}
