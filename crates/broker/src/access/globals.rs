//! Global runtime parameters (RabbitMQ's `global_parameters`): `cluster_name` and whatever a
//! definitions import carries, kept and exported as they came.

use serde_json::Value;

use super::{Access, GlobalParameterDef, MgmtError};
use crate::definitions::op::{Applying, DefOp};

/// The parameter that names the cluster (`rabbitmqctl set_cluster_name`).
pub const CLUSTER_NAME: &str = "cluster_name";

impl Access {
    pub fn global_parameter(&self, name: &str) -> Option<Value> {
        self.inner.read().globals.get(name).cloned()
    }

    pub fn global_parameters(&self) -> Vec<GlobalParameterDef> {
        self.inner
            .read()
            .globals
            .iter()
            .map(|(name, value)| GlobalParameterDef {
                name: name.clone(),
                value: value.clone(),
            })
            .collect()
    }

    /// Sets global parameter `name`; `cluster_name` must be a non-empty string.
    pub fn set_global_parameter(&self, name: &str, value: Value) -> Result<(), MgmtError> {
        self.set_global_parameter_at(name, value, None)
    }

    /// [`Access::set_global_parameter`], or (`at`) the one a committed entry carries.
    pub fn set_global_parameter_at(
        &self,
        name: &str,
        value: Value,
        at: Option<Applying>,
    ) -> Result<(), MgmtError> {
        validate_global(name, &value).map_err(MgmtError::BadRequest)?;
        if let Some(c) = self.proposer(at) {
            return c.mgmt_change(DefOp::SetGlobalParameter {
                name: name.into(),
                value,
            });
        }
        self.change(|i| {
            i.globals.insert(name.into(), value);
            Ok(())
        })
    }
}

/// RabbitMQ's checks: a name, and for `cluster_name` a non-empty string.
pub fn validate_global(name: &str, value: &Value) -> Result<(), String> {
    if name.is_empty() {
        return Err("a global parameter needs a name".into());
    }
    if name == CLUSTER_NAME {
        match value.as_str() {
            Some(s) if !s.trim().is_empty() => {}
            Some(_) => return Err("the cluster name cannot be empty".into()),
            None => {
                return Err(format!(
                    "cluster_name must be a string, actually was {value}"
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_name_is_a_non_empty_string_and_is_exported() {
        let a = Access::from_file(Default::default(), None).unwrap();
        assert!(a
            .set_global_parameter(CLUSTER_NAME, Value::from(""))
            .is_err());
        assert!(a
            .set_global_parameter(CLUSTER_NAME, Value::from(3))
            .is_err());
        assert!(a.global_parameter(CLUSTER_NAME).is_none());
        a.set_global_parameter(CLUSTER_NAME, Value::from("prod-eu"))
            .unwrap();
        assert_eq!(a.global_parameter(CLUSTER_NAME).unwrap(), "prod-eu");
        let f = a.export();
        assert_eq!(f.global_parameters.len(), 1);
        let back = Access::from_file(f, None).unwrap();
        assert_eq!(back.global_parameter(CLUSTER_NAME).unwrap(), "prod-eu");
    }
}
