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

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use base64::Engine;
use parking_lot::RwLock;
use regex::Regex;
use serde::{Deserialize, Deserializer, Serialize};
use sha2::Digest;

use crate::config::Config;
use crate::error::AmqpError;

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

/// A vhost-scoped runtime parameter as RabbitMQ's definitions list it. Warren keeps only
/// component `vhost-limits` (name `limits`, value `{"max-connections": N, "max-queues": N}`).
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

pub type Limits = serde_json::Map<String, serde_json::Value>;

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
}

pub struct Access {
    inner: RwLock<Inner>,
    /// Moves on every change of users or permissions; channels drop cached decisions then.
    generation: AtomicU64,
    file: Option<PathBuf>,
    /// In a cluster, changes are proposed to it and made when applied (`cluster/mod.rs`).
    cluster: std::sync::OnceLock<Arc<crate::cluster::Cluster>>,
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

impl Access {
    /// Loads `<data_dir>/access.json`, or seeds it from the config on first boot.
    pub fn open(config: &Config) -> std::io::Result<Access> {
        std::fs::create_dir_all(&config.data_dir)?;
        let path = config.data_dir.join("access.json");
        let file = match warren_store::snapshot::read(&path)? {
            Some(bytes) => serde_json::from_slice::<AccessFile>(&bytes).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            })?,
            None => Self::seed(config),
        };
        let a = Access::from_file(file, Some(path)).map_err(|e| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, format!("access.json: {e}"))
        })?;
        // Rewriting what was read (or the seed, which the next boot recreates) loses nothing if
        // it fails; changes after boot retry and refuse themselves if it still fails.
        if let Err(e) = a.save(&a.inner.read()) {
            tracing::warn!(error = %e, "cannot rewrite access.json at boot");
        }
        Ok(a)
    }

    /// What the first boot starts from: the config's users and vhosts, each user with full
    /// permissions on each vhost.
    pub fn seed(config: &Config) -> AccessFile {
        let mut f = AccessFile::default();
        for v in &config.vhosts {
            f.vhosts.push(VhostDef {
                name: v.clone(),
                description: String::new(),
            });
        }
        for u in &config.users {
            f.users.push(UserDef {
                name: u.name.clone(),
                password_hash: hash_password(&u.password),
                hashing_algorithm: HASH_SHA256.into(),
                tags: u.tags.clone(),
                limits: Default::default(),
            });
            for v in &config.vhosts {
                f.permissions.push(full_permissions(&u.name, v));
            }
        }
        f
    }

    /// An in-memory registry (tests) or one backed by `file`.
    pub fn from_file(f: AccessFile, file: Option<PathBuf>) -> Result<Access, String> {
        let mut inner = Inner::default();
        for u in f.users {
            inner.users.insert(u.name.clone(), u);
        }
        for v in f.vhosts {
            inner.vhosts.insert(v.name.clone(), v);
        }
        for p in f.permissions {
            inner
                .grants
                .insert((p.user.clone(), p.vhost.clone()), Grant::new(p)?);
        }
        for p in f.policies {
            inner.policies.insert((p.vhost.clone(), p.name.clone()), p);
        }
        for p in f.parameters {
            if let (VHOST_LIMITS_COMPONENT, serde_json::Value::Object(l)) =
                (p.component.as_str(), p.value)
            {
                inner.vhost_limits.insert(p.vhost, l);
            }
        }
        Ok(Access {
            inner: RwLock::new(inner),
            generation: AtomicU64::new(1),
            file,
            cluster: std::sync::OnceLock::new(),
        })
    }

    pub fn set_cluster(&self, c: Arc<crate::cluster::Cluster>) {
        let _ = self.cluster.set(c);
    }

    /// The cluster to propose a change to, unless this is the change being applied.
    fn replicated(&self) -> Option<&Arc<crate::cluster::Cluster>> {
        self.cluster
            .get()
            .filter(|_| crate::cluster::applying().is_none())
    }

    /// Replaces everything (a cluster node restoring a metadata snapshot).
    pub fn replace(&self, f: AccessFile) -> Result<(), String> {
        let fresh = Access::from_file(f, None)?;
        let new = fresh.inner.into_inner();
        self.change(|i| {
            *i = new;
            Ok(())
        })
        .map_err(|e| e.to_string())
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn save(&self, inner: &Inner) -> std::io::Result<()> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let bytes = serde_json::to_vec_pretty(&Self::to_file(inner))?;
        // Called from the management API's handlers: the fsync must not hold up a worker.
        crate::definitions::off_worker(|| warren_store::snapshot::write_atomic(path, &bytes))
    }

    fn to_file(inner: &Inner) -> AccessFile {
        AccessFile {
            users: inner.users.values().cloned().collect(),
            vhosts: inner.vhosts.values().cloned().collect(),
            permissions: inner.grants.values().map(|g| g.def.clone()).collect(),
            policies: inner.policies.values().cloned().collect(),
            parameters: inner
                .vhost_limits
                .iter()
                .map(|(v, l)| ParameterDef {
                    vhost: v.clone(),
                    component: VHOST_LIMITS_COMPONENT.into(),
                    name: "limits".into(),
                    value: serde_json::Value::Object(l.clone()),
                })
                .collect(),
        }
    }

    /// Everything, as the definitions export lists it.
    pub fn export(&self) -> AccessFile {
        Self::to_file(&self.inner.read())
    }

    /// Runs a change under the write lock, then persists and bumps the generation.
    fn change<R>(
        &self,
        f: impl FnOnce(&mut Inner) -> Result<R, MgmtError>,
    ) -> Result<R, MgmtError> {
        let mut inner = self.inner.write();
        // Kept to undo a change that cannot be written: an ok must never name a user,
        // permission or policy that a restart would lose.
        let before = self.file.is_some().then(|| inner.clone());
        let r = f(&mut inner)?;
        if let Err(e) = self.save(&inner) {
            tracing::error!(error = %e, "cannot write access.json; change refused");
            if let Some(before) = before {
                *inner = before;
            }
            return Err(MgmtError::Internal(format!(
                "cannot write access.json: {e}"
            )));
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(r)
    }

    // ---- users ----

    /// The user named `name` if `password` is theirs.
    pub fn login(&self, name: &str, password: &str) -> Option<User> {
        let inner = self.inner.read();
        let u = inner.users.get(name)?;
        if u.password_hash.is_empty()
            || !verify_password(&u.password_hash, &u.hashing_algorithm, password)
        {
            return None;
        }
        Some(User {
            name: u.name.clone(),
            tags: u.tags.clone(),
            impersonator: u.tags.iter().any(|t| t == "impersonator"),
        })
    }

    pub fn user(&self, name: &str) -> Option<UserDef> {
        self.inner.read().users.get(name).cloned()
    }

    pub fn users(&self) -> Vec<UserDef> {
        self.inner.read().users.values().cloned().collect()
    }

    /// Creates or replaces a user (RabbitMQ's PUT /api/users/{name}).
    pub fn put_user(&self, u: UserDef) -> Result<(), MgmtError> {
        if let Some(c) = self.replicated() {
            return c.mgmt_op(crate::cluster::MetaOp::PutUser(u));
        }
        if u.name.is_empty() {
            return Err(MgmtError::BadRequest("user name must not be empty".into()));
        }
        if !u.password_hash.is_empty()
            && u.hashing_algorithm != HASH_SHA256
            && u.hashing_algorithm != HASH_SHA512
        {
            return Err(MgmtError::BadRequest(format!(
                "unsupported hashing algorithm '{}'",
                u.hashing_algorithm
            )));
        }
        let name = u.name.clone();
        let tags = u.tags.join(",");
        self.change(|i| {
            i.users.insert(u.name.clone(), u);
            Ok(())
        })?;
        tracing::info!(user = %name, tags = %tags, "user created or updated");
        Ok(())
    }

    pub fn delete_user(&self, name: &str) -> Result<(), MgmtError> {
        if let Some(c) = self.replicated() {
            return c.mgmt_op(crate::cluster::MetaOp::DeleteUser(name.into()));
        }
        self.change(|i| {
            i.users
                .remove(name)
                .ok_or_else(|| MgmtError::NotFound(format!("no user '{name}'")))?;
            i.grants.retain(|(u, _), _| u != name);
            Ok(())
        })?;
        tracing::info!(user = name, "user deleted");
        Ok(())
    }

    // ---- vhost records (the live vhosts are the broker's) ----

    pub fn vhost_names(&self) -> Vec<String> {
        self.inner.read().vhosts.keys().cloned().collect()
    }

    pub fn vhost_def(&self, name: &str) -> Option<VhostDef> {
        self.inner.read().vhosts.get(name).cloned()
    }

    /// Records a vhost; true if it is new.
    pub fn add_vhost(&self, def: VhostDef) -> Result<bool, MgmtError> {
        self.change(|i| Ok(i.vhosts.insert(def.name.clone(), def).is_none()))
    }

    /// Forgets a vhost with its permissions and policies.
    pub fn remove_vhost(&self, name: &str) -> Result<(), MgmtError> {
        self.change(|i| {
            i.vhosts.remove(name);
            i.grants.retain(|(_, v), _| v != name);
            i.policies.retain(|(v, _), _| v != name);
            i.vhost_limits.remove(name);
            Ok(())
        })
    }

    // ---- permissions ----

    pub fn set_permissions(&self, p: PermissionDef) -> Result<(), MgmtError> {
        if let Some(c) = self.replicated() {
            return c.mgmt_op(crate::cluster::MetaOp::SetPermissions(p));
        }
        let (user, vhost) = (p.user.clone(), p.vhost.clone());
        let g = Grant::new(p).map_err(MgmtError::BadRequest)?;
        self.change(|i| {
            if !i.users.contains_key(&user) {
                return Err(MgmtError::NotFound(format!("no user '{user}'")));
            }
            if !i.vhosts.contains_key(&vhost) {
                return Err(MgmtError::NotFound(format!("no vhost '{vhost}'")));
            }
            i.grants.insert((user.clone(), vhost.clone()), g);
            Ok(())
        })?;
        tracing::info!(user = %user, vhost = %vhost, "permissions set");
        Ok(())
    }

    pub fn clear_permissions(&self, user: &str, vhost: &str) -> Result<(), MgmtError> {
        if let Some(c) = self.replicated() {
            return c.mgmt_op(crate::cluster::MetaOp::ClearPermissions {
                user: user.into(),
                vhost: vhost.into(),
            });
        }
        self.change(|i| {
            i.grants
                .remove(&(user.to_string(), vhost.to_string()))
                .map(|_| ())
                .ok_or_else(|| {
                    MgmtError::NotFound(format!(
                        "no permissions for user '{user}' in vhost '{vhost}'"
                    ))
                })
        })?;
        tracing::info!(user, vhost, "permissions cleared");
        Ok(())
    }

    pub fn permissions(&self) -> Vec<PermissionDef> {
        self.inner
            .read()
            .grants
            .values()
            .map(|g| g.def.clone())
            .collect()
    }

    pub fn permission(&self, user: &str, vhost: &str) -> Option<PermissionDef> {
        self.inner
            .read()
            .grants
            .get(&(user.to_string(), vhost.to_string()))
            .map(|g| g.def.clone())
    }

    /// The user has some permission entry on the vhost (what connection.open checks).
    pub fn can_open(&self, user: &str, vhost: &str) -> bool {
        self.inner
            .read()
            .grants
            .contains_key(&(user.to_string(), vhost.to_string()))
    }

    pub fn permitted(&self, user: &str, vhost: &str, perm: Perm, name: &str) -> bool {
        let inner = self.inner.read();
        let Some(g) = inner.grants.get(&(user.to_string(), vhost.to_string())) else {
            return false;
        };
        let re = match perm {
            Perm::Configure => &g.configure,
            Perm::Write => &g.write,
            Perm::Read => &g.read,
        };
        re.as_ref().is_some_and(|r| r.is_match(name))
    }

    // ---- policies (validated by `policy`) ----

    pub fn policies(&self) -> Vec<PolicyDef> {
        self.inner.read().policies.values().cloned().collect()
    }

    pub fn policies_of(&self, vhost: &str) -> Vec<PolicyDef> {
        self.inner
            .read()
            .policies
            .values()
            .filter(|p| p.vhost == vhost)
            .cloned()
            .collect()
    }

    pub fn put_policy(&self, p: PolicyDef) -> Result<(), MgmtError> {
        if let Some(c) = self.replicated() {
            return c.mgmt_op(crate::cluster::MetaOp::PutPolicy(p));
        }
        self.change(|i| {
            if !i.vhosts.contains_key(&p.vhost) {
                return Err(MgmtError::NotFound(format!("no vhost '{}'", p.vhost)));
            }
            i.policies.insert((p.vhost.clone(), p.name.clone()), p);
            Ok(())
        })
    }

    pub fn delete_policy(&self, vhost: &str, name: &str) -> Result<(), MgmtError> {
        if let Some(c) = self.replicated() {
            return c.mgmt_op(crate::cluster::MetaOp::DeletePolicy {
                vhost: vhost.into(),
                name: name.into(),
            });
        }
        self.change(|i| {
            i.policies
                .remove(&(vhost.to_string(), name.to_string()))
                .map(|_| ())
                .ok_or_else(|| {
                    MgmtError::NotFound(format!("no policy '{name}' in vhost '{vhost}'"))
                })
        })
    }
}

impl Access {
    // ---- runtime limits (enforced by `admission`) ----

    /// The limits set on vhost or user `name` (empty if none). `NotFound` if it does not exist.
    pub fn limits(&self, scope: LimitScope, name: &str) -> Result<Limits, MgmtError> {
        let inner = self.inner.read();
        match scope {
            LimitScope::Vhost if inner.vhosts.contains_key(name) => {
                Ok(inner.vhost_limits.get(name).cloned().unwrap_or_default())
            }
            LimitScope::User => inner
                .users
                .get(name)
                .map(|u| u.limits.clone())
                .ok_or_else(|| MgmtError::NotFound(format!("no user '{name}'"))),
            LimitScope::Vhost => Err(MgmtError::NotFound(format!("no vhost '{name}'"))),
        }
    }

    /// Every vhost or user with its limits (possibly none), by name.
    pub fn all_limits(&self, scope: LimitScope) -> Vec<(String, Limits)> {
        let inner = self.inner.read();
        match scope {
            LimitScope::Vhost => inner
                .vhost_limits
                .iter()
                .map(|(v, l)| (v.clone(), l.clone()))
                .collect(),
            LimitScope::User => inner
                .users
                .values()
                .map(|u| (u.name.clone(), u.limits.clone()))
                .collect(),
        }
    }

    /// The value set at runtime for limit `key` of vhost or user `name`, if an integer is set.
    pub fn limit(&self, scope: LimitScope, name: &str, key: &str) -> Option<i64> {
        let inner = self.inner.read();
        let l = match scope {
            LimitScope::Vhost => inner.vhost_limits.get(name)?,
            LimitScope::User => &inner.users.get(name)?.limits,
        };
        l.get(key)?.as_i64()
    }

    /// Sets limits on a vhost or user: merged into those set (`replace`: instead of them, as
    /// rabbitmqctl set_vhost_limits does). Validated first, with RabbitMQ's texts.
    pub fn set_limits(
        &self,
        scope: LimitScope,
        name: &str,
        def: &Limits,
        replace: bool,
    ) -> Result<(), MgmtError> {
        if let Some(c) = self.replicated() {
            return c.mgmt_op(crate::cluster::MetaOp::SetLimits {
                user: scope == LimitScope::User,
                name: name.into(),
                def: def.clone(),
                replace,
            });
        }
        let def = validate_limits(scope, def).map_err(|e| {
            MgmtError::BadRequest(match scope {
                LimitScope::Vhost => format!("Validation failed\n\n{e}\n"),
                LimitScope::User => e,
            })
        })?;
        self.change_limits(scope, name, |l| {
            if replace {
                l.clear();
            }
            l.extend(def.clone());
        })?;
        tracing::info!(?scope, name, limits = %serde_json::Value::Object(def), "limits set");
        Ok(())
    }

    /// Clears limit `key` of a vhost or user (`None` or `"all"`: every limit).
    pub fn clear_limit(
        &self,
        scope: LimitScope,
        name: &str,
        key: Option<&str>,
    ) -> Result<(), MgmtError> {
        if let Some(c) = self.replicated() {
            return c.mgmt_op(crate::cluster::MetaOp::ClearLimit {
                user: scope == LimitScope::User,
                name: name.into(),
                key: key.map(String::from),
            });
        }
        self.change_limits(scope, name, |l| match key {
            None | Some("all") => l.clear(),
            Some(k) => {
                l.remove(k);
            }
        })?;
        tracing::info!(?scope, name, limit = key.unwrap_or("all"), "limits cleared");
        Ok(())
    }

    fn change_limits(
        &self,
        scope: LimitScope,
        name: &str,
        f: impl FnOnce(&mut Limits),
    ) -> Result<(), MgmtError> {
        self.change(|i| {
            match scope {
                LimitScope::Vhost => {
                    if !i.vhosts.contains_key(name) {
                        return Err(MgmtError::NotFound(format!("no vhost '{name}'")));
                    }
                    let l = i.vhost_limits.entry(name.to_string()).or_default();
                    f(l);
                    if l.is_empty() {
                        i.vhost_limits.remove(name);
                    }
                }
                LimitScope::User => {
                    let u = i
                        .users
                        .get_mut(name)
                        .ok_or_else(|| MgmtError::NotFound(format!("no user '{name}'")))?;
                    f(&mut u.limits);
                }
            }
            Ok(())
        })
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
