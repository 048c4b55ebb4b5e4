//! Permissions: setting and clearing a user's configure/write/read patterns on a vhost, and
//! checking a name against them (unanchored regexes; the empty pattern grants nothing).

use super::{Access, Grant, MgmtError, Perm, PermissionDef};
use crate::definitions::op::{Applying, DefOp};

impl Access {
    // ---- permissions ----

    pub fn set_permissions(&self, p: PermissionDef) -> Result<(), MgmtError> {
        self.set_permissions_at(p, None)
    }

    /// [`Access::set_permissions`], or (`at`) the one a committed entry carries.
    pub fn set_permissions_at(
        &self,
        p: PermissionDef,
        at: Option<Applying>,
    ) -> Result<(), MgmtError> {
        if let Some(c) = self.proposer(at) {
            return c.mgmt_change(DefOp::SetPermissions(p));
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
        self.clear_permissions_at(user, vhost, None)
    }

    /// [`Access::clear_permissions`], or (`at`) the one a committed entry carries.
    pub fn clear_permissions_at(
        &self,
        user: &str,
        vhost: &str,
        at: Option<Applying>,
    ) -> Result<(), MgmtError> {
        if let Some(c) = self.proposer(at) {
            return c.mgmt_change(DefOp::ClearPermissions {
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
}
