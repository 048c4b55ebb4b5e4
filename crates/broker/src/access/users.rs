//! Users (login, create or replace, delete) and vhost records (the live vhosts are the
//! broker's; these are what `access.json` and the definitions list).

use super::{
    verify_password, Access, MgmtError, User, UserDef, VhostDef, HASH_SHA256, HASH_SHA512,
};
use crate::definitions::op::{Applying, DefOp};

impl Access {
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
        self.put_user_at(u, None)
    }

    /// [`Access::put_user`], or (`at`) the one a committed entry carries.
    pub fn put_user_at(&self, u: UserDef, at: Option<Applying>) -> Result<(), MgmtError> {
        if let Some(c) = self.proposer(at) {
            return c.mgmt_change(DefOp::PutUser(u));
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
        self.delete_user_at(name, None)
    }

    /// [`Access::delete_user`], or (`at`) the one a committed entry carries.
    pub fn delete_user_at(&self, name: &str, at: Option<Applying>) -> Result<(), MgmtError> {
        if let Some(c) = self.proposer(at) {
            return c.mgmt_change(DefOp::DeleteUser(name.into()));
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

    /// Forgets a vhost with its permissions, policies and runtime parameters.
    pub fn remove_vhost(&self, name: &str) -> Result<(), MgmtError> {
        self.change(|i| {
            i.vhosts.remove(name);
            i.grants.retain(|(_, v), _| v != name);
            i.policies.retain(|(v, _), _| v != name);
            i.vhost_limits.remove(name);
            i.params.retain(|(_, v, _), _| v != name);
            Ok(())
        })?;
        self.params_changed.send_modify(|g| *g += 1);
        Ok(())
    }
}
