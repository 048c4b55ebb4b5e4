//! Runtime limits as records: a vhost's (`max-connections`, `max-queues`) and a user's
//! (`max-connections`, `max-channels`), read, set and cleared here, enforced by `admission`.

use super::{validate_limits, Access, LimitScope, Limits, MgmtError};
use crate::definitions::op::{Applying, DefOp};

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
        self.set_limits_at(scope, name, def, replace, None)
    }

    /// [`Access::set_limits`], or (`at`) the one a committed entry carries.
    pub fn set_limits_at(
        &self,
        scope: LimitScope,
        name: &str,
        def: &Limits,
        replace: bool,
        at: Option<Applying>,
    ) -> Result<(), MgmtError> {
        if let Some(c) = self.proposer(at) {
            return c.mgmt_change(DefOp::SetLimits {
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
        self.clear_limit_at(scope, name, key, None)
    }

    /// [`Access::clear_limit`], or (`at`) the one a committed entry carries.
    pub fn clear_limit_at(
        &self,
        scope: LimitScope,
        name: &str,
        key: Option<&str>,
        at: Option<Applying>,
    ) -> Result<(), MgmtError> {
        if let Some(c) = self.proposer(at) {
            return c.mgmt_change(DefOp::ClearLimit {
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
