//! Vhost-scoped runtime parameters of the components that run above the broker (RabbitMQ's
//! `rabbit_runtime_parameters`): `shovel`, and whatever component a definitions import
//! carries. Kept as records (in `access.json`, replicated through the definitions command on a
//! cluster node); the component that owns a parameter validates its value when it is set
//! ([`Access::register_component`]) and runs what it describes, told of every change through
//! [`Access::parameters_changed`]. `vhost-limits` is a component too, but its values are the
//! vhost's limits (`limits.rs`), listed beside these.

use std::sync::Arc;

use serde_json::Value;

use super::{Access, MgmtError, ParameterDef, VHOST_LIMITS_COMPONENT};
use crate::definitions::op::{Applying, DefOp};

/// A component that owns runtime parameters: checks a value before it is recorded.
pub trait Component: Send + Sync {
    /// RabbitMQ's validation of `value` for parameter `name` in `vhost`: each problem as
    /// RabbitMQ words it.
    fn validate(&self, vhost: &str, name: &str, value: &Value) -> Result<(), Vec<String>>;
}

/// The management API's (and `warren ctl`'s) text for a refused value, as RabbitMQ's.
pub fn validation_failed(problems: &[String]) -> MgmtError {
    MgmtError::BadRequest(format!("Validation failed\n\n{}\n", problems.join("\n")))
}

impl Access {
    /// Makes `component`'s parameters settable, checked by `c`.
    pub fn register_component(&self, component: &str, c: Arc<dyn Component>) {
        self.components.write().insert(component.to_string(), c);
    }

    /// Moves on every change of a runtime parameter or a policy (set, cleared, replaced by a
    /// snapshot).
    pub fn parameters_changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.params_changed.subscribe()
    }

    /// Parameters of components other than `vhost-limits`, optionally one component's, one
    /// vhost's.
    pub fn parameters(&self, component: Option<&str>, vhost: Option<&str>) -> Vec<ParameterDef> {
        self.inner
            .read()
            .params
            .iter()
            .filter(|((c, v, _), _)| {
                component.is_none_or(|x| x == c) && vhost.is_none_or(|x| x == v)
            })
            .map(|((c, v, n), value)| ParameterDef {
                vhost: v.clone(),
                component: c.clone(),
                name: n.clone(),
                value: value.clone(),
            })
            .collect()
    }

    pub fn parameter(&self, component: &str, vhost: &str, name: &str) -> Option<Value> {
        self.inner
            .read()
            .params
            .get(&(component.to_string(), vhost.to_string(), name.to_string()))
            .cloned()
    }

    /// Sets parameter `name` of `component` in `vhost`, once its component accepts `value`.
    pub fn set_parameter(
        &self,
        component: &str,
        vhost: &str,
        name: &str,
        value: Value,
    ) -> Result<(), MgmtError> {
        self.set_parameter_at(component, vhost, name, value, None)
    }

    /// [`Access::set_parameter`], or (`at`) the one a committed entry carries, which was
    /// checked where it was asked for.
    pub fn set_parameter_at(
        &self,
        component: &str,
        vhost: &str,
        name: &str,
        value: Value,
        at: Option<Applying>,
    ) -> Result<(), MgmtError> {
        if at.is_none() {
            self.check_parameter(component, vhost, name, &value)?;
        }
        if let Some(c) = self.proposer(at) {
            return c.mgmt_change(DefOp::SetParameter {
                component: component.into(),
                vhost: vhost.into(),
                name: name.into(),
                value,
            });
        }
        self.change(|i| {
            if !i.vhosts.contains_key(vhost) {
                return Err(MgmtError::NotFound(format!("no vhost '{vhost}'")));
            }
            i.params
                .insert((component.into(), vhost.into(), name.into()), value);
            Ok(())
        })?;
        self.params_changed.send_modify(|g| *g += 1);
        Ok(())
    }

    /// What RabbitMQ checks before it records a parameter: a name, a known component, a vhost
    /// that exists, a value its component accepts.
    fn check_parameter(
        &self,
        component: &str,
        vhost: &str,
        name: &str,
        value: &Value,
    ) -> Result<(), MgmtError> {
        if component == VHOST_LIMITS_COMPONENT {
            return Err(MgmtError::BadRequest(
                "vhost-limits are set through the vhost's limits".into(),
            ));
        }
        let Some(c) = self.components.read().get(component).cloned() else {
            return Err(validation_failed(&[format!(
                "component {component} not found"
            )]));
        };
        if !self.inner.read().vhosts.contains_key(vhost) {
            return Err(MgmtError::NotFound(format!("no vhost '{vhost}'")));
        }
        if name.is_empty() {
            return Err(validation_failed(&["a parameter needs a name".into()]));
        }
        c.validate(vhost, name, value)
            .map_err(|problems| validation_failed(&problems))
    }

    pub fn clear_parameter(
        &self,
        component: &str,
        vhost: &str,
        name: &str,
    ) -> Result<(), MgmtError> {
        self.clear_parameter_at(component, vhost, name, None)
    }

    /// [`Access::clear_parameter`], or (`at`) the one a committed entry carries.
    pub fn clear_parameter_at(
        &self,
        component: &str,
        vhost: &str,
        name: &str,
        at: Option<Applying>,
    ) -> Result<(), MgmtError> {
        if let Some(c) = self.proposer(at) {
            return c.mgmt_change(DefOp::ClearParameter {
                component: component.into(),
                vhost: vhost.into(),
                name: name.into(),
            });
        }
        self.change(|i| {
            i.params
                .remove(&(component.to_string(), vhost.to_string(), name.to_string()))
                .map(|_| ())
                .ok_or_else(|| {
                    MgmtError::NotFound(format!(
                        "no parameter '{name}' of component '{component}' in vhost '{vhost}'"
                    ))
                })
        })?;
        self.params_changed.send_modify(|g| *g += 1);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::access::{AccessFile, VhostDef};

    struct NeedsQueue;
    impl Component for NeedsQueue {
        fn validate(&self, _: &str, _: &str, v: &Value) -> Result<(), Vec<String>> {
            match v.get("queue") {
                Some(Value::String(_)) => Ok(()),
                _ => Err(vec!["Key \"queue\" not found in thing".into()]),
            }
        }
    }

    fn access() -> Access {
        let f = AccessFile {
            vhosts: vec![VhostDef {
                name: "/".into(),
                description: String::new(),
            }],
            ..Default::default()
        };
        Access::from_file(f, None).unwrap()
    }

    #[test]
    fn parameters_are_checked_by_their_component_and_kept() {
        let a = access();
        let changed = a.parameters_changed();
        let e = a.set_parameter("thing", "/", "p", json!({})).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Validation failed\n\ncomponent thing not found\n"
        );
        a.register_component("thing", Arc::new(NeedsQueue));
        let e = a.set_parameter("thing", "/", "p", json!({})).unwrap_err();
        assert!(matches!(e, MgmtError::BadRequest(ref t) if t.contains("\"queue\" not found")));
        let e = a
            .set_parameter("thing", "nope", "p", json!({"queue": "q"}))
            .unwrap_err();
        assert!(matches!(e, MgmtError::NotFound(_)));
        assert_eq!(*changed.borrow(), 0);
        a.set_parameter("thing", "/", "p", json!({"queue": "q"}))
            .unwrap();
        assert_eq!(*changed.borrow(), 1);
        assert_eq!(
            a.parameter("thing", "/", "p").unwrap(),
            json!({"queue": "q"})
        );
        assert_eq!(a.parameters(Some("thing"), Some("/")).len(), 1);
        assert!(a.parameters(Some("other"), None).is_empty());
        // Exported with the rest and read back.
        let f = a.export();
        assert!(f
            .parameters
            .iter()
            .any(|p| p.component == "thing" && p.name == "p"));
        let back = Access::from_file(f, None).unwrap();
        assert_eq!(
            back.parameter("thing", "/", "p").unwrap(),
            json!({"queue": "q"})
        );
        a.clear_parameter("thing", "/", "p").unwrap();
        assert!(matches!(
            a.clear_parameter("thing", "/", "p"),
            Err(MgmtError::NotFound(_))
        ));
        assert_eq!(*changed.borrow(), 2);
        // A vhost's parameters go with it.
        a.set_parameter("thing", "/", "p", json!({"queue": "q"}))
            .unwrap();
        a.remove_vhost("/").unwrap();
        assert!(a.parameters(None, None).is_empty());
    }
}
