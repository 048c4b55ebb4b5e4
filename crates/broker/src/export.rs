//! Definitions import and export as JSON in RabbitMQ's format (`GET/POST /api/definitions`,
//! `warren ctl export_definitions/import_definitions`, `warren server --definitions FILE`).
//! Users keep their `password_hash` and `hashing_algorithm`, so users exported from RabbitMQ
//! log in to Warren with their passwords. Only durable queues and exchanges (and the bindings
//! between them) are exported, as RabbitMQ does. Limits travel as RabbitMQ 3.10 writes them:
//! a user's in its `limits`, a vhost's as a `parameters` entry of component `vhost-limits`;
//! import also reads the `limits` that newer RabbitMQ versions put on vhost objects. Global
//! parameters (`cluster_name`) travel both ways.

use serde_json::{json, Value};
use warren_routing::Destination;

use crate::access::{
    GlobalParameterDef, LimitScope, Limits, PermissionDef, PolicyDef, UserDef, VhostDef,
};
use crate::json::{json_to_table, table_to_json};
use crate::server::Broker;
use crate::vhost::{ExchangeSpec, QueueSpec};

pub fn export(broker: &Broker) -> Value {
    let a = broker.access.export();
    let (mut queues, mut exchanges, mut bindings) = (Vec::new(), Vec::new(), Vec::new());
    for v in broker.vhosts() {
        let snap = v.snapshot();
        let mut qs: Vec<_> = snap
            .queues
            .values()
            .filter(|q| q.options().durable && q.options().exclusive_owner.is_none())
            .collect();
        qs.sort_by(|a, b| a.name().cmp(b.name()));
        for q in qs {
            queues.push(json!({
                "name": &**q.name(), "vhost": &*v.name, "durable": true,
                "auto_delete": q.options().auto_delete,
                "arguments": table_to_json(&q.options().arguments),
            }));
        }
        let mut xs: Vec<_> = snap.table.exchanges.values().collect();
        xs.sort_by(|a, b| a.name.cmp(&b.name));
        for x in xs {
            if !x.durable || x.name.is_empty() || x.name.starts_with("amq.") {
                continue;
            }
            exchanges.push(json!({
                "name": &*x.name, "vhost": &*v.name, "type": x.type_name(), "durable": true,
                "auto_delete": x.auto_delete, "internal": x.internal,
                "arguments": table_to_json(&x.arguments),
            }));
        }
        let mut xs: Vec<_> = snap
            .table
            .exchanges
            .values()
            .filter(|x| x.durable)
            .collect();
        xs.sort_by(|a, b| a.name.cmp(&b.name));
        for x in xs {
            for b in &x.bindings {
                let (dest, kind) = match &b.destination {
                    Destination::Queue(q)
                        if q.options().durable && q.options().exclusive_owner.is_none() =>
                    {
                        (q.name().clone(), "queue")
                    }
                    Destination::Exchange(e)
                        if snap.table.exchanges.get(e).is_some_and(|d| d.durable) =>
                    {
                        (e.clone(), "exchange")
                    }
                    _ => continue,
                };
                bindings.push(json!({
                    "source": &*x.name, "vhost": &*v.name, "destination": &*dest,
                    "destination_type": kind, "routing_key": &*b.routing_key,
                    "arguments": table_to_json(&b.arguments),
                }));
            }
        }
    }
    json!({
        "rabbit_version": "3.10.8",
        "rabbitmq_version": "3.10.8",
        "product_name": broker.config.server_properties.product,
        "product_version": broker.config.server_properties.version,
        "users": a.users,
        "vhosts": a.vhosts,
        "permissions": a.permissions,
        "topic_permissions": [],
        "parameters": a.parameters,
        "global_parameters": a.global_parameters,
        "policies": a.policies,
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    })
}

fn list<T: serde::de::DeserializeOwned>(doc: &Value, key: &str) -> Result<Vec<T>, String> {
    match doc.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| format!("'{key}': {e}")),
    }
}

fn field<'a>(o: &'a Value, k: &str) -> &'a str {
    o.get(k).and_then(Value::as_str).unwrap_or("")
}

fn flag(o: &Value, k: &str, default: bool) -> bool {
    o.get(k).and_then(Value::as_bool).unwrap_or(default)
}

/// Limits as definitions files write them: an object, or (newer RabbitMQ's vhost objects) a
/// list of `[name, value]` pairs or one-key objects, `[]` when none.
fn limits_of(v: &Value) -> Limits {
    match v {
        Value::Object(o) => o.clone(),
        Value::Array(items) => items
            .iter()
            .flat_map(|i| match i {
                Value::Object(o) => o.clone().into_iter().collect::<Vec<_>>(),
                Value::Array(p) if p.len() == 2 => match p[0].as_str() {
                    Some(k) => vec![(k.to_string(), p[1].clone())],
                    None => Vec::new(),
                },
                _ => Vec::new(),
            })
            .collect(),
        _ => Limits::new(),
    }
}

/// Imports a definitions document. Users, vhosts, permissions and policies are created or
/// replaced; queues, exchanges and bindings are declared (an existing queue or exchange with
/// other properties is an error naming it). Stops at the first error.
pub fn import(broker: &Broker, doc: &Value) -> Result<(), String> {
    if !doc.is_object() {
        return Err("definitions must be a JSON object".into());
    }
    let users: Vec<UserDef> = list(doc, "users")?;
    let vhosts: Vec<VhostDef> = list(doc, "vhosts")?;
    let raw_vhosts: Vec<Value> = list(doc, "vhosts")?;
    let parameters: Vec<Value> = list(doc, "parameters")?;
    let perms: Vec<PermissionDef> = list(doc, "permissions")?;
    let policies: Vec<PolicyDef> = list(doc, "policies")?;
    let queues: Vec<Value> = list(doc, "queues")?;
    let exchanges: Vec<Value> = list(doc, "exchanges")?;
    let bindings: Vec<Value> = list(doc, "bindings")?;
    let globals: Vec<GlobalParameterDef> = list(doc, "global_parameters")?;
    for g in globals {
        broker
            .access
            .set_global_parameter(&g.name, g.value)
            .map_err(|e| format!("global parameter '{}': {e}", g.name))?;
    }
    let mut limits = Vec::new();
    for u in users {
        if !u.limits.is_empty() {
            limits.push((LimitScope::User, u.name.clone(), u.limits.clone()));
        }
        broker.access.put_user(u).map_err(|e| e.to_string())?;
    }
    for v in vhosts {
        broker.add_vhost(v).map_err(|e| e.to_string())?;
    }
    for v in &raw_vhosts {
        let l = v.get("limits").map(limits_of).unwrap_or_default();
        if !l.is_empty() {
            limits.push((LimitScope::Vhost, field(v, "name").to_string(), l));
        }
    }
    for p in &parameters {
        if field(p, "component") == crate::access::VHOST_LIMITS_COMPONENT {
            let l = p.get("value").map(limits_of).unwrap_or_default();
            limits.push((LimitScope::Vhost, field(p, "vhost").to_string(), l));
        }
    }
    for (scope, name, l) in limits {
        broker
            .access
            .set_limits(scope, &name, &l, true)
            .map_err(|e| format!("limits of '{name}': {e}"))?;
        broker.limits_changed(scope, &name);
    }
    for p in perms {
        broker
            .access
            .set_permissions(p)
            .map_err(|e| e.to_string())?;
    }
    for p in policies {
        broker.put_policy(p).map_err(|e| e.to_string())?;
    }
    // Other components' parameters (shovels, ...), checked by their components.
    for p in &parameters {
        let (component, name) = (field(p, "component"), field(p, "name"));
        if component != crate::access::VHOST_LIMITS_COMPONENT {
            let value = p.get("value").cloned().unwrap_or(Value::Null);
            broker
                .access
                .set_parameter(component, field(p, "vhost"), name, value)
                .map_err(|e| format!("parameter '{name}' of component '{component}': {e}"))?;
        }
    }
    let vhost = |o: &Value| {
        let name = field(o, "vhost");
        broker
            .vhost(name)
            .ok_or_else(|| format!("vhost '{name}' does not exist"))
    };
    for x in &exchanges {
        let v = vhost(x)?;
        let args = json_to_table(x.get("arguments").unwrap_or(&Value::Null))?;
        v.declare_exchange(&ExchangeSpec {
            name: field(x, "name"),
            kind: field(x, "type"),
            passive: false,
            durable: flag(x, "durable", true),
            auto_delete: flag(x, "auto_delete", false),
            internal: flag(x, "internal", false),
            arguments: &args,
        })
        .map_err(|e| e.text)?;
    }
    // RabbitMQ 3.10 skips these with a warning (and the bindings to them), rather than
    // failing the whole import.
    let mut skipped: Vec<&str> = Vec::new();
    for q in &queues {
        let (v, name) = (vhost(q)?, field(q, "name"));
        if name.starts_with("amq.") {
            tracing::warn!(
                queue = name,
                "skipping import of a queue whose name begins with 'amq.'"
            );
            skipped.push(name);
            continue;
        }
        let args = json_to_table(q.get("arguments").unwrap_or(&Value::Null))?;
        let q = v
            .declare_queue(&QueueSpec {
                name,
                passive: false,
                durable: flag(q, "durable", true),
                exclusive: false,
                auto_delete: flag(q, "auto_delete", false),
                arguments: &args,
                conn_id: 0,
                server_named: false,
                home: None,
                members: None,
            })
            .map_err(|e| e.text)?;
        crate::policy::apply(&broker.access, &q);
    }
    for b in &bindings {
        let v = vhost(b)?;
        let args = json_to_table(b.get("arguments").unwrap_or(&Value::Null))?;
        let (src, dst, key) = (
            field(b, "source"),
            field(b, "destination"),
            field(b, "routing_key"),
        );
        if field(b, "destination_type") == "queue" && skipped.contains(&dst) {
            continue;
        }
        let r = if field(b, "destination_type") == "exchange" {
            v.bind_exchange(dst, src, key, &args, true)
        } else {
            v.bind_queue(dst, src, key, &args, true, None)
        };
        r.map_err(|e| e.text)?;
    }
    tracing::info!("definitions imported");
    Ok(())
}
