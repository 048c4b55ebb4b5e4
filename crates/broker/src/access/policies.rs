//! Policies as records: listing, setting and deleting them (validated and applied to queues
//! and exchanges by `policy`).

use super::{Access, MgmtError, PolicyDef};
use crate::definitions::op::{Applying, DefOp};

impl Access {
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
        self.put_policy_at(p, None)
    }

    /// [`Access::put_policy`], or (`at`) the one a committed entry carries.
    pub fn put_policy_at(&self, p: PolicyDef, at: Option<Applying>) -> Result<(), MgmtError> {
        if let Some(c) = self.proposer(at) {
            return c.mgmt_change(DefOp::PutPolicy(p));
        }
        self.change(|i| {
            if !i.vhosts.contains_key(&p.vhost) {
                return Err(MgmtError::NotFound(format!("no vhost '{}'", p.vhost)));
            }
            i.policies.insert((p.vhost.clone(), p.name.clone()), p);
            Ok(())
        })?;
        // Federation follows its policy keys.
        self.params_changed.send_modify(|g| *g += 1);
        Ok(())
    }

    pub fn delete_policy(&self, vhost: &str, name: &str) -> Result<(), MgmtError> {
        self.delete_policy_at(vhost, name, None)
    }

    /// [`Access::delete_policy`], or (`at`) the one a committed entry carries.
    pub fn delete_policy_at(
        &self,
        vhost: &str,
        name: &str,
        at: Option<Applying>,
    ) -> Result<(), MgmtError> {
        if let Some(c) = self.proposer(at) {
            return c.mgmt_change(DefOp::DeletePolicy {
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
        })?;
        self.params_changed.send_modify(|g| *g += 1);
        Ok(())
    }
}
