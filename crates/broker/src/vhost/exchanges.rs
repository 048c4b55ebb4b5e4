//! Declaring and deleting exchanges, and each exchange's alternate exchange (its own argument,
//! else the vhost's policy).

use std::sync::Arc;

use warren_protocol::method::{ExchangeDeclare, ExchangeDelete};
use warren_protocol::{FieldTable, FieldValue};
use warren_routing::consistent_hash::{self, HashOn};
use warren_routing::{Destination, Exchange, ExchangeKind, HashRing};

use super::equivalence::{check_args_equivalent_of, erl_atom, inequivalent};
use super::{ExchangeSpec, VHost};
use crate::access::PolicyDef;
use crate::definitions::op::Applying;
use crate::definitions::Definition;
use crate::error::{AmqpError, AmqpResult};

/// An exchange type and whether it is `x-delayed-message` (then the kind is its
/// `x-delayed-type`), with the plugin's errors.
fn parse_exchange_type(kind: &str, arguments: &FieldTable) -> AmqpResult<(ExchangeKind, bool)> {
    let unknown = |k: &str| AmqpError::command_invalid(format!("unknown exchange type '{k}'"));
    if kind != warren_routing::DELAYED_TYPE {
        return ExchangeKind::parse(kind)
            .map(|k| (k, false))
            .ok_or_else(|| unknown(kind));
    }
    match arguments.get("x-delayed-type").and_then(|v| v.as_str()) {
        Some(warren_routing::DELAYED_TYPE) => Err(AmqpError::precondition_failed(
            "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'",
        )),
        Some(inner) => ExchangeKind::parse(inner)
            .map(|k| (k, true))
            .ok_or_else(|| unknown(inner)),
        None => Err(AmqpError::precondition_failed(
            "Invalid argument, 'x-delayed-type' must be an existing exchange type",
        )),
    }
}

/// A consistent-hash exchange's arguments, refused as RabbitMQ's plugin refuses them.
fn consistent_hash_args(args: &FieldTable) -> AmqpResult<HashOn> {
    HashOn::from_arguments(args).map_err(|e| match e {
        consistent_hash::ArgsError::Invalid(text) => AmqpError::precondition_failed(text),
        // The plugin's validation crashes on a non-string value; RabbitMQ then closes the
        // connection with a bare 541.
        consistent_hash::ArgsError::NotAString => AmqpError {
            code: warren_protocol::reply::INTERNAL_ERROR,
            text: "INTERNAL_ERROR".into(),
            class_id: 0,
            method_id: 0,
        },
    })
}

impl VHost {
    pub(super) fn no_exchange(&self, name: &str) -> AmqpError {
        AmqpError::not_found(format!("no exchange '{name}' in vhost '{}'", self.name))
    }

    pub fn declare_exchange(&self, spec: &ExchangeSpec<'_>) -> AmqpResult<()> {
        self.declare_exchange_at(spec, None)
    }

    /// [`VHost::declare_exchange`], or (`at`) the declare a committed entry carries.
    pub(super) fn declare_exchange_at(
        &self,
        spec: &ExchangeSpec<'_>,
        at: Option<Applying>,
    ) -> AmqpResult<()> {
        if spec.name.is_empty() {
            return Err(AmqpError::access_refused(
                "operation not permitted on the default exchange",
            ));
        }
        if let (false, Some(c)) = (spec.passive, self.proposer(at)) {
            return c.vhost_change(
                &self.name,
                ExchangeDeclare {
                    exchange: spec.name.into(),
                    kind: spec.kind.into(),
                    durable: spec.durable,
                    auto_delete: spec.auto_delete,
                    internal: spec.internal,
                    arguments: spec.arguments.clone(),
                    ..Default::default()
                }
                .into(),
                None,
            );
        }
        let mut defs = self.defs.lock();
        if spec.passive {
            return if defs.table.exchanges.contains_key(spec.name) {
                Ok(())
            } else {
                Err(self.no_exchange(spec.name))
            };
        }
        let (kind, delayed) = parse_exchange_type(spec.kind, spec.arguments)?;
        if spec.name.is_empty() {
            return Err(AmqpError::access_refused(
                "operation not permitted on the default exchange",
            ));
        }
        if let Some(x) = defs.table.exchanges.get(spec.name) {
            let (n, v) = (spec.name, &*self.name);
            if x.kind != kind || x.delayed != delayed {
                return Err(inequivalent(
                    "exchange",
                    "type",
                    n,
                    v,
                    erl_atom(spec.kind),
                    erl_atom(x.type_name()),
                ));
            }
            if x.durable != spec.durable {
                return Err(inequivalent(
                    "exchange",
                    "durable",
                    n,
                    v,
                    spec.durable,
                    x.durable,
                ));
            }
            if x.auto_delete != spec.auto_delete {
                return Err(inequivalent(
                    "exchange",
                    "auto_delete",
                    n,
                    v,
                    spec.auto_delete,
                    x.auto_delete,
                ));
            }
            if x.internal != spec.internal {
                return Err(inequivalent(
                    "exchange",
                    "internal",
                    n,
                    v,
                    spec.internal,
                    x.internal,
                ));
            }
            check_args_equivalent_of(
                "exchange",
                &["alternate-exchange"],
                n,
                v,
                spec.arguments,
                &x.arguments,
            )?;
            return Ok(());
        }
        if spec.name.starts_with("amq.") {
            return Err(AmqpError::access_refused(format!(
                "exchange name '{}' contains reserved prefix 'amq.*'",
                spec.name
            )));
        }
        // A new exchange's alternate-exchange must be a longstr (checked on declare, not at
        // recovery).
        if !self.loading.load(std::sync::atomic::Ordering::Relaxed) {
            if let Some(v) = spec.arguments.get("alternate-exchange") {
                if !matches!(v, FieldValue::LongStr(_)) {
                    return Err(AmqpError::precondition_failed(format!(
                        "invalid type '{}' for arg 'alternate-exchange' in exchange '{}' in vhost '{}'",
                        crate::queue::type_name(v),
                        spec.name,
                        self.name
                    )));
                }
            }
        }
        if kind == ExchangeKind::FederationUpstream {
            warren_routing::federation::validate(spec.arguments)
                .map_err(AmqpError::precondition_failed)?;
        }
        let hash_on = match kind {
            ExchangeKind::ConsistentHash => consistent_hash_args(spec.arguments)?,
            _ => HashOn::RoutingKey,
        };
        let name: Arc<str> = spec.name.into();
        let x = Exchange {
            name: name.clone(),
            kind,
            delayed,
            durable: spec.durable,
            auto_delete: spec.auto_delete,
            internal: spec.internal,
            arguments: spec.arguments.clone(),
            bindings: Vec::new(),
            alternate: Self::alternate(&self.policies.lock(), spec.name, spec.arguments),
            ring: HashRing::new(hash_on),
            direct: Default::default(),
            topic: Default::default(),
            stats: Default::default(),
        };
        let op = Self::exchange_def(&x);
        defs.table.exchanges.insert(name, Arc::new(x));
        self.changed(&mut defs, op.into_iter().collect())?;
        tracing::info!(vhost = %self.name, exchange = spec.name, kind = spec.kind, "exchange declared");
        Ok(())
    }

    /// An exchange's alternate exchange: its own `alternate-exchange` argument, else that of
    /// the policy applying to it (RabbitMQ's order).
    fn alternate(policies: &[PolicyDef], name: &str, arguments: &FieldTable) -> Option<Arc<str>> {
        if let Some(ae) = arguments.get("alternate-exchange").and_then(|v| v.as_str()) {
            return Some(ae.into());
        }
        // The default exchange routes by queue name only; RabbitMQ never sends it to an AE.
        if name.is_empty() {
            return None;
        }
        crate::policy::alternate_exchange(policies, name).map(Arc::from)
    }

    /// Takes the vhost's policies and re-evaluates every queue's arguments in force and every
    /// exchange's alternate exchange (after a policy change, or at boot).
    pub fn apply_policies(&self, policies: Vec<PolicyDef>) {
        for q in self.snapshot().queues.values() {
            let p = crate::policy::matching(&policies, q.name(), true);
            q.set_effective_args(crate::policy::effective(
                &q.options().args,
                &q.options().arguments,
                p,
            ));
            if let Some(s) = q.stream() {
                s.set_policy(p.map(|p| &p.definition));
            }
        }
        self.set_policies(policies);
    }

    /// Takes the vhost's policies and re-evaluates every exchange's alternate exchange.
    pub fn set_policies(&self, policies: Vec<PolicyDef>) {
        let mut defs = self.defs.lock();
        let mut changed = false;
        for x in defs.table.exchanges.values_mut() {
            let ae = Self::alternate(&policies, &x.name, &x.arguments);
            if ae != x.alternate {
                Arc::make_mut(x).alternate = ae;
                changed = true;
            }
        }
        *self.policies.lock() = policies;
        // Derived from arguments and policies at load, so nothing to write to disk.
        if changed {
            self.publish_snapshot(&defs);
        }
    }

    pub fn delete_exchange(&self, name: &str, if_unused: bool) -> AmqpResult<()> {
        self.delete_exchange_at(name, if_unused, None)
    }

    /// [`VHost::delete_exchange`], or (`at`) the delete a committed entry carries.
    pub(super) fn delete_exchange_at(
        &self,
        name: &str,
        if_unused: bool,
        at: Option<Applying>,
    ) -> AmqpResult<()> {
        if name.is_empty() {
            return Err(AmqpError::access_refused(
                "operation not permitted on the default exchange",
            ));
        }
        if name.starts_with("amq.") {
            return Err(AmqpError::access_refused(format!(
                "deletion of system exchange '{name}' in vhost '{}' not allowed",
                self.name
            )));
        }
        if let Some(c) = self.proposer(at) {
            let m = ExchangeDelete {
                exchange: name.into(),
                if_unused,
                ..Default::default()
            };
            return c.vhost_change(&self.name, m.into(), None);
        }
        let mut defs = self.defs.lock();
        let Some(x) = defs.table.exchanges.get(name) else {
            return Ok(());
        };
        if if_unused && !x.bindings.is_empty() {
            return Err(AmqpError::precondition_failed(format!(
                "exchange '{name}' in vhost '{}' in use",
                self.name
            )));
        }
        let op = x.durable.then(|| {
            Definition::ExchangeDelete(ExchangeDelete {
                exchange: name.into(),
                ..Default::default()
            })
        });
        let mut ops: Vec<Definition> = op.into_iter().collect();
        defs.table.exchanges.remove(name);
        Self::remove_bindings_to(
            &mut defs,
            &|d| matches!(d, Destination::Exchange(e) if &**e == name),
            &mut ops,
        );
        self.changed(&mut defs, ops)?;
        tracing::info!(vhost = %self.name, exchange = name, "exchange deleted");
        Ok(())
    }
}
