//! The registry's storage: opening `<data_dir>/access.json` (or seeding it from the config on
//! first boot), replacing everything (a cluster snapshot), and `change`, which every mutation
//! goes through: it is written before it is visible, and undone if it cannot be written. On a
//! cluster node, `replicated` names the [`Proposer`] a change is proposed through instead.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::config::Config;
use crate::definitions::op::Applying;
use crate::definitions::proposer::Proposer;

use super::{
    full_permissions, hash_password, Access, AccessFile, GlobalParameterDef, Grant, Inner,
    MgmtError, ParameterDef, UserDef, VhostDef, HASH_SHA256, VHOST_LIMITS_COMPONENT,
};

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
            match (p.component.as_str(), p.value) {
                (VHOST_LIMITS_COMPONENT, serde_json::Value::Object(l)) => {
                    inner.vhost_limits.insert(p.vhost, l);
                }
                (VHOST_LIMITS_COMPONENT, _) => {}
                (_, value) => {
                    inner.params.insert((p.component, p.vhost, p.name), value);
                }
            }
        }
        for g in f.global_parameters {
            inner.globals.insert(g.name, g.value);
        }
        Ok(Access {
            inner: RwLock::new(inner),
            generation: AtomicU64::new(1),
            file,
            proposer: std::sync::OnceLock::new(),
            components: RwLock::new(Default::default()),
            params_changed: tokio::sync::watch::Sender::new(0),
        })
    }

    /// Where its changes go from now on: the cluster, or a single node's applier
    /// (`server/apply.rs`), which makes each at once through the `*_at` methods.
    pub fn set_proposer(&self, p: Arc<dyn Proposer>) {
        let _ = self.proposer.set(p);
    }

    /// What to propose a change through, unless this is a change being applied (`at`).
    pub(super) fn proposer(&self, at: Option<Applying>) -> Option<&dyn Proposer> {
        self.proposer.get().filter(|_| at.is_none()).map(|p| &**p)
    }

    /// Replaces everything (a cluster node restoring a metadata snapshot).
    pub fn replace(&self, f: AccessFile) -> Result<(), String> {
        let fresh = Access::from_file(f, None)?;
        let new = fresh.inner.into_inner();
        self.change(|i| {
            *i = new;
            Ok(())
        })
        .map_err(|e| e.to_string())?;
        self.params_changed.send_modify(|g| *g += 1);
        Ok(())
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
                .chain(inner.params.iter().map(|((c, v, n), value)| ParameterDef {
                    vhost: v.clone(),
                    component: c.clone(),
                    name: n.clone(),
                    value: value.clone(),
                }))
                .collect(),
            global_parameters: inner
                .globals
                .iter()
                .map(|(name, value)| GlobalParameterDef {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
        }
    }

    /// Everything, as the definitions export lists it.
    pub fn export(&self) -> AccessFile {
        Self::to_file(&self.inner.read())
    }

    /// Runs a change under the write lock, then persists and bumps the generation.
    pub(super) fn change<R>(
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
}
