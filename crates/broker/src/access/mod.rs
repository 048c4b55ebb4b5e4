//! Users, vhost records, permissions, policies and runtime limits as the broker holds them.
//!
//! All of it is kept in one JSON file, `<data_dir>/access.json`, in the shape of RabbitMQ's
//! definitions (`users` with their `limits`, `vhosts`, `permissions`, `policies`, and vhost
//! limits as `parameters` of component `vhost-limits`), rewritten atomically on every
//! change. The first boot (no file yet) seeds it from the config: its users, its vhosts, and
//! full permissions for each configured user on each configured vhost (as RabbitMQ's default
//! user gets on `/`).
//!
//! Passwords are stored as RabbitMQ stores them (`rabbit_password_hashing_sha256`:
//! base64(salt ++ sha256(salt ++ password)) with a 4-byte salt), so hashes exported from RabbitMQ
//! import and verify. Permission checks match unanchored regexes, as RabbitMQ's `re:run` does;
//! the empty pattern grants nothing. Channels cache positive decisions and drop the cache when
//! [`Access::generation`] moves.
//!
//! This file holds the records' types, the [`Access`] registry, password hashing and the
//! checks channels call ([`refused`], [`PermCache`]). Each other job is an `impl Access` block
//! in a file of its own:
//! - `store`: opening `access.json` (or seeding it), replacing it all, and `change`, which every
//!   mutation goes through (persisted before it is visible; proposed through the cluster's
//!   [`Proposer`] instead when this node is part of one).
//! - `users`: users (login, create, delete) and vhost records.
//! - `permissions`: setting, clearing and checking a user's permissions on a vhost.
//! - `policies`: policies as records (validated and applied by `policy`).
//! - `limits`: vhosts' and users' runtime limits as records (enforced by `admission`).
//!
//! The shared types stay here, not in a child: every child imports `super`, and this file imports
//! no child, so the split adds no import cycle. The one exception, `records` (users, vhosts,
//! permissions, policies, limits as RabbitMQ's definitions describe them, and [`MgmtError`]),
//! imports nothing, so this file re-exports it and the definitions command can name it.

mod globals;
pub use globals::{validate_global, CLUSTER_NAME};
mod limits;
mod parameters;
pub use parameters::{validation_failed, Component};
mod permissions;
mod policies;

mod store;
mod users;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use base64::Engine;
use parking_lot::RwLock;
use regex::Regex;
use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::definitions::proposer::Proposer;
pub use crate::definitions::records::{
    parse_tags, Limits, MgmtError, PermissionDef, PolicyDef, UserDef, VhostDef, HASH_SHA256,
    HASH_SHA512,
};
use crate::error::AmqpError;

/// A vhost-scoped runtime parameter as RabbitMQ's definitions list it: a vhost's limits
/// (component `vhost-limits`, name `limits`, value `{"max-connections": N, "max-queues": N}`)
/// or another component's parameter (`shovel`, ...; `parameters.rs`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ParameterDef {
    pub vhost: String,
    pub component: String,
    pub name: String,
    pub value: serde_json::Value,
}

pub const VHOST_LIMITS_COMPONENT: &str = "vhost-limits";
pub const MAX_CONNECTIONS: &str = "max-connections";
pub const MAX_QUEUES: &str = "max-queues";
pub const MAX_CHANNELS: &str = "max-channels";

/// Whose limits: a vhost's (`max-connections`, `max-queues`) or a user's (`max-connections`,
/// `max-channels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitScope {
    Vhost,
    User,
}

impl LimitScope {
    fn known(self) -> [&'static str; 2] {
        match self {
            LimitScope::Vhost => [MAX_CONNECTIONS, MAX_QUEUES],
            LimitScope::User => [MAX_CONNECTIONS, MAX_CHANNELS],
        }
    }
}

/// Checks a limits definition as RabbitMQ's parameter validation does (known names, integer
/// values; a negative value means no limit) and returns it with numeric strings made numbers.
pub fn validate_limits(scope: LimitScope, def: &Limits) -> Result<Limits, String> {
    let known = scope.known();
    let unknown: Vec<String> = def
        .iter()
        .filter(|(k, _)| !known.contains(&k.as_str()))
        .map(|(k, v)| format!("{{<<\"{k}\">>,{v}}}"))
        .collect();
    if !unknown.is_empty() {
        let what = match scope {
            LimitScope::Vhost => "limits",
            LimitScope::User => "user-limits",
        };
        return Err(format!(
            "Unrecognised terms [{}] in {what}",
            unknown.join(",")
        ));
    }
    let mut out = Limits::new();
    for (k, v) in def {
        let n = v
            .as_i64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
            .ok_or_else(|| format!("{k} should be a number, actually was {v}"))?;
        out.insert(k.clone(), n.into());
    }
    Ok(out)
}

/// The persisted file: a subset of RabbitMQ's definitions document.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AccessFile {
    #[serde(default)]
    pub users: Vec<UserDef>,
    #[serde(default)]
    pub vhosts: Vec<VhostDef>,
    #[serde(default)]
    pub permissions: Vec<PermissionDef>,
    #[serde(default)]
    pub policies: Vec<PolicyDef>,
    #[serde(default)]
    pub parameters: Vec<ParameterDef>,
    #[serde(default)]
    pub global_parameters: Vec<GlobalParameterDef>,
}

/// A global runtime parameter as RabbitMQ's definitions list it (`cluster_name`, say).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GlobalParameterDef {
    pub name: String,
    pub value: serde_json::Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Perm {
    Configure,
    Write,
    Read,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Queue,
    Exchange,
}

impl Resource {
    fn as_str(self) -> &'static str {
        match self {
            Resource::Queue => "queue",
            Resource::Exchange => "exchange",
        }
    }
}

/// Compiled permission regexes; `None` is the empty pattern, which grants nothing.
#[derive(Clone)]
struct Grant {
    def: PermissionDef,
    configure: Option<Regex>,
    write: Option<Regex>,
    read: Option<Regex>,
}

impl Grant {
    fn new(def: PermissionDef) -> Result<Grant, String> {
        let c = |p: &str| -> Result<Option<Regex>, String> {
            if p.is_empty() {
                Ok(None)
            } else {
                Regex::new(p)
                    .map(Some)
                    .map_err(|e| format!("invalid regular expression '{p}': {e}"))
            }
        };
        Ok(Grant {
            configure: c(&def.configure)?,
            write: c(&def.write)?,
            read: c(&def.read)?,
            def,
        })
    }
}

#[derive(Default, Clone)]
struct Inner {
    users: BTreeMap<String, UserDef>,
    vhosts: BTreeMap<String, VhostDef>,
    /// By (user, vhost).
    grants: BTreeMap<(String, String), Grant>,
    /// By (vhost, name).
    policies: BTreeMap<(String, String), PolicyDef>,
    /// Runtime vhost limits by vhost (user limits live in `UserDef::limits`).
    vhost_limits: BTreeMap<String, Limits>,
    /// Global runtime parameters by name.
    globals: BTreeMap<String, serde_json::Value>,
    /// Other components' runtime parameters by (component, vhost, name) (`parameters.rs`).
    params: BTreeMap<(String, String, String), serde_json::Value>,
}

pub struct Access {
    inner: RwLock<Inner>,
    /// Moves on every change of users or permissions; channels drop cached decisions then.
    generation: AtomicU64,
    file: Option<PathBuf>,
    /// Where a change asked for goes, to be made when applied: the cluster, or a single
    /// node's applier (`server/apply.rs`).
    proposer: std::sync::OnceLock<Arc<dyn Proposer>>,
    /// The components whose parameters may be set, by name (`parameters.rs`).
    components: RwLock<BTreeMap<String, Arc<dyn Component>>>,
    /// Moves on every change of a runtime parameter or a policy.
    params_changed: tokio::sync::watch::Sender<u64>,
}

/// A user who logged in: what connections keep of it.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub tags: Vec<String>,
    /// Tagged `impersonator`: may publish with any `user_id` (read per publish, so kept as a flag).
    pub impersonator: bool,
}

impl User {
    pub fn is_administrator(&self) -> bool {
        self.tags.iter().any(|t| t == "administrator")
    }
}

/// A fresh `rabbit_password_hashing_sha256` hash of `password`.
pub fn hash_password(password: &str) -> String {
    let salt: [u8; 4] = rand::random();
    let mut out = salt.to_vec();
    out.extend_from_slice(&sha2::Sha256::digest(
        [&salt[..], password.as_bytes()].concat(),
    ));
    base64::engine::general_purpose::STANDARD.encode(out)
}

/// Checks `password` against a stored hash in RabbitMQ's format. Compares without an early exit.
pub fn verify_password(hash: &str, algorithm: &str, password: &str) -> bool {
    let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(hash) else {
        return false;
    };
    if raw.len() < 5 {
        return false;
    }
    let (salt, want) = raw.split_at(4);
    let input = [salt, password.as_bytes()].concat();
    let got: Vec<u8> = match algorithm {
        HASH_SHA256 => sha2::Sha256::digest(&input).to_vec(),
        HASH_SHA512 => sha2::Sha512::digest(&input).to_vec(),
        _ => return false,
    };
    got.len() == want.len() && got.iter().zip(want).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0
}

/// A full-permission grant, as the config's users get at first boot.
pub fn full_permissions(user: &str, vhost: &str) -> PermissionDef {
    PermissionDef {
        user: user.into(),
        vhost: vhost.into(),
        configure: ".*".into(),
        write: ".*".into(),
        read: ".*".into(),
    }
}

/// RabbitMQ's 403 text for a refused resource.
pub fn refused(kind: Resource, name: &str, vhost: &str, user: &str) -> AmqpError {
    AmqpError::access_refused(format!(
        "access to {} '{name}' in vhost '{vhost}' refused for user '{user}'",
        kind.as_str()
    ))
}

/// The name RabbitMQ checks permissions against for the default exchange.
pub fn exchange_resource(name: &str) -> &str {
    if name.is_empty() {
        "amq.default"
    } else {
        name
    }
}

/// A channel's cache of granted (permission, resource, name) decisions, dropped when the
/// registry's generation moves. Only grants are cached: a refusal closes the channel anyway.
#[derive(Default)]
pub struct PermCache {
    generation: u64,
    granted: [ahash::AHashSet<Box<str>>; 6],
}

/// Past this many names a cache set is cleared rather than grown (names can be random).
const PERM_CACHE_MAX: usize = 1024;

impl PermCache {
    pub fn check(
        &mut self,
        access: &Access,
        user: &str,
        vhost: &str,
        perm: Perm,
        kind: Resource,
        name: &str,
    ) -> Result<(), AmqpError> {
        let g = access.generation();
        if g != self.generation {
            self.granted.iter_mut().for_each(|s| s.clear());
            self.generation = g;
        }
        let set = &mut self.granted[perm as usize * 2 + kind as usize];
        if set.contains(name) {
            return Ok(());
        }
        if !access.permitted(user, vhost, perm, name) {
            return Err(refused(kind, name, vhost, user));
        }
        if set.len() >= PERM_CACHE_MAX {
            set.clear();
        }
        set.insert(name.into());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn verifies_a_hash_exported_by_rabbitmq() {
        // probeu / secret1, exported by RabbitMQ 3.10.8.
        assert!(verify_password(
            "ZMxFk8ASgWCnMazyJikjcF+qRkrwSVF82S06D/jmieBuNXuS",
            HASH_SHA256,
            "secret1"
        ));
        assert!(!verify_password(
            "ZMxFk8ASgWCnMazyJikjcF+qRkrwSVF82S06D/jmieBuNXuS",
            HASH_SHA256,
            "secret2"
        ));
        let h = hash_password("pw");
        assert!(verify_password(&h, HASH_SHA256, "pw"));
        assert!(!verify_password("not base64!", HASH_SHA256, "pw"));
    }

    #[test]
    fn permissions_are_unanchored_regexes_and_empty_grants_nothing() {
        let a = Access::from_file(Access::seed(&Config::default()), None).expect("seed");
        a.put_user(UserDef {
            name: "u".into(),
            password_hash: hash_password("p"),
            hashing_algorithm: HASH_SHA256.into(),
            tags: vec![],
            limits: Default::default(),
        })
        .expect("user");
        a.set_permissions(PermissionDef {
            user: "u".into(),
            vhost: "/".into(),
            configure: "^cfg".into(),
            write: "w".into(),
            read: "".into(),
        })
        .expect("perms");
        assert!(a.permitted("u", "/", Perm::Configure, "cfgq"));
        assert!(!a.permitted("u", "/", Perm::Configure, "xcfg"));
        assert!(a.permitted("u", "/", Perm::Write, "aw"));
        assert!(!a.permitted("u", "/", Perm::Read, "anything"));
        assert!(a.login("u", "p").is_some());
        assert!(a.login("u", "q").is_none());
        let mut cache = PermCache::default();
        let e = cache
            .check(&a, "u", "/", Perm::Read, Resource::Queue, "q")
            .expect_err("refused");
        assert_eq!(
            e.text,
            "ACCESS_REFUSED - access to queue 'q' in vhost '/' refused for user 'u'"
        );
        assert!(a
            .set_permissions(PermissionDef {
                user: "u".into(),
                vhost: "/".into(),
                configure: "(".into(),
                write: "".into(),
                read: "".into(),
            })
            .is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(clippy::unwrap_used)]
    async fn a_cluster_nodes_change_is_proposed_and_made_when_applied() {
        use crate::definitions::op::{Applying, DefOp};
        use crate::definitions::proposer::tests::FakeProposer;
        let dir = std::env::temp_dir().join(format!("warren-access-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("access.json");
        let seed = Access::seed(&Config::default());
        let a = Access::from_file(seed, Some(path.clone())).unwrap();
        let user = |name: &str| UserDef {
            name: name.into(),
            password_hash: hash_password("p"),
            hashing_algorithm: HASH_SHA256.into(),
            tags: vec![],
            limits: Default::default(),
        };
        let written =
            || -> AccessFile { serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap() };
        // A single node makes the change at once and writes it before it answers.
        a.put_user(user("single")).unwrap();
        assert!(written().users.iter().any(|u| u.name == "single"));
        // A cluster node proposes it; nothing changes here until it is applied.
        let p = FakeProposer::new();
        a.set_proposer(p.clone());
        a.put_user(user("u")).unwrap();
        a.delete_user("single").unwrap();
        let ops: Vec<DefOp> = std::mem::take(&mut *p.ops.lock());
        assert!(
            matches!(&ops[..], [DefOp::PutUser(u), DefOp::DeleteUser(d)] if u.name == "u" && d == "single")
        );
        assert!(a.user("u").is_none() && a.user("single").is_some());
        // Applied: made here (and written), not proposed again.
        a.put_user_at(user("u"), Some(Applying::entry(7))).unwrap();
        a.delete_user_at("single", Some(Applying::entry(8)))
            .unwrap();
        assert!(p.ops.lock().is_empty());
        assert!(a.user("u").is_some() && a.user("single").is_none());
        let names: Vec<String> = written().users.into_iter().map(|u| u.name).collect();
        assert!(names.contains(&"u".to_string()) && !names.contains(&"single".to_string()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn tags_read_as_list_or_text() {
        let u: UserDef = serde_json::from_str(
            r#"{"name":"a","password_hash":"","tags":"administrator,management"}"#,
        )
        .expect("text tags");
        assert_eq!(u.tags, vec!["administrator", "management"]);
        let u: UserDef =
            serde_json::from_str(r#"{"name":"a","tags":["monitoring"]}"#).expect("list");
        assert_eq!(u.tags, vec!["monitoring"]);
        assert_eq!(u.hashing_algorithm, HASH_SHA256);
    }
}
