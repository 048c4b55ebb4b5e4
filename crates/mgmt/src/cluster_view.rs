//! The cluster-wide listings, as RabbitMQ's management shows them from whichever node serves
//! the request: each node lists what runs on it (its connections, channels and consumers, the
//! figures of the queues it hosts, its totals), asked over the links (`SERVICE_VIEW`, answered
//! by [`NodeView`]); the serving node joins the answers. Definitions (queues, exchanges,
//! bindings) are the same on every node and are read locally. A node that does not answer
//! within [`ASK_WAIT`] is left out: a queue it hosts is listed with its state and no counts
//! (`unknown`, never 0), as RabbitMQ lists a queue whose node is down.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use warren_broker::cluster::Cluster;
use warren_broker::queue::QueueRef;
use warren_broker::server::{Broker, LocalView};
use warren_federation::Federation;
use warren_shovel::Shovels;

use crate::ctl_rows;
use crate::stats_api::{self, connection_json, hosted_here};

/// How long the serving node waits for each other node's part.
pub const ASK_WAIT: Duration = Duration::from_secs(2);

/// A question to another node.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Ask {
    /// `connections`, `channels`, `consumers`, `queues`, `exchanges`, `overview`, `close`,
    /// `shovels`, `restart_shovel`, `federation_links`, or `warren ctl`'s `ctl_connections`, `ctl_channels`,
    /// `ctl_consumers`.
    view: String,
    /// `queues`, `exchanges`: only this vhost's; `close`: unused.
    #[serde(default)]
    vhost: Option<String>,
    /// `queues`, `exchanges`: only this one; `close`: the connection.
    #[serde(default)]
    name: Option<String>,
    /// `close`: the reason the client is told.
    #[serde(default)]
    reason: String,
}

/// This node's answers (registered with the broker by the router), with the shovels it runs.
pub struct NodeView {
    pub shovels: Arc<Shovels>,
    pub federation: Arc<Federation>,
}

impl LocalView for NodeView {
    fn answer(&self, b: &Broker, request: &[u8]) -> Result<Vec<u8>, String> {
        let ask: Ask = serde_json::from_slice(request).map_err(|e| e.to_string())?;
        let v = match ask.view.as_str() {
            "shovels" => Value::Array(self.shovels.status(ask.vhost.as_deref())),
            "federation_links" => Value::Array(self.federation.status(ask.vhost.as_deref())),
            "restart_shovel" => Value::Bool(self.shovels.restart(
                ask.vhost.as_deref().unwrap_or(""),
                ask.name.as_deref().unwrap_or(""),
            )),
            _ => local(b, &ask)?,
        };
        serde_json::to_vec(&v).map_err(|e| e.to_string())
    }
}

/// Asks every other node for `view` (`shovels`, `restart_shovel`, `federation_links`:
/// answered by [`NodeView`]).
pub(crate) async fn ask_others_view(
    b: &Broker,
    view: &str,
    vhost: Option<&str>,
    name: Option<&str>,
) -> Vec<(String, Value)> {
    let ask = Ask {
        view: view.into(),
        vhost: vhost.map(Into::into),
        name: name.map(Into::into),
        ..Default::default()
    };
    ask_others(b, &ask).await
}

fn local(b: &Broker, ask: &Ask) -> Result<Value, String> {
    Ok(match ask.view.as_str() {
        "connections" => Value::Array(connection_rows(b)),
        "channels" => Value::Array(stats_api::channel_rows(b)),
        "consumers" => Value::Array(stats_api::consumer_rows(b)),
        "ctl_connections" => Value::Array(ctl_rows::connection_rows(b)),
        "ctl_channels" => Value::Array(ctl_rows::channel_rows(b)),
        "ctl_consumers" => Value::Array(ctl_rows::consumer_rows(b)),
        "queues" => Value::Array(hosted_figures(b, ask.vhost.as_deref(), ask.name.as_deref())),
        "overview" => overview_part(b),
        "exchanges" => Value::Array(exchange_parts(b, ask.vhost.as_deref(), ask.name.as_deref())),
        "close" => Value::Bool(close_local(
            b,
            ask.name.as_deref().unwrap_or(""),
            &ask.reason,
        )),
        other => return Err(format!("unknown view '{other}'")),
    })
}

/// Asks every other node; the answers that came, by node.
async fn ask_others(b: &Broker, ask: &Ask) -> Vec<(String, Value)> {
    let Some(c) = Cluster::of(b) else {
        return Vec::new();
    };
    let request = serde_json::to_vec(ask).unwrap_or_default();
    c.gather(&request, ASK_WAIT)
        .await
        .into_iter()
        .filter_map(|(node, answer)| {
            let v = serde_json::from_slice::<Value>(&answer?).ok()?;
            Some((node, v))
        })
        .collect()
}

/// The rows of `view` from every node that answers: this node's first, then the others' in
/// node-name order.
pub async fn rows(b: &Broker, view: &str) -> Vec<Value> {
    let ask = Ask {
        view: view.into(),
        ..Default::default()
    };
    let mut out = match local(b, &ask) {
        Ok(Value::Array(a)) => a,
        _ => Vec::new(),
    };
    for (_, v) in ask_others(b, &ask).await {
        if let Value::Array(a) = v {
            out.extend(a);
        }
    }
    out
}

// ---- connections ----

/// This node's connections, oldest first, with their rates.
fn connection_rows(b: &Broker) -> Vec<Value> {
    stats_api::open_connections(b)
        .iter()
        .map(|c| {
            let mut row = connection_json(c);
            stats_api::add_connection_rates(b, c, &mut row);
            row
        })
        .collect()
}

fn close_local(b: &Broker, name: &str, reason: &str) -> bool {
    let c = b
        .connections
        .lock()
        .values()
        .find(|c| c.name == name)
        .cloned();
    match c {
        Some(c) => {
            tracing::info!(conn = c.id, name = %c.name, reason, "closing connection via the management API");
            c.force_close(reason);
            true
        }
        None => false,
    }
}

/// Closes connection `name` on whichever node has it; whether one did.
pub async fn close_anywhere(b: &Broker, name: &str, reason: &str) -> bool {
    if close_local(b, name, reason) {
        return true;
    }
    let ask = Ask {
        view: "close".into(),
        name: Some(name.into()),
        reason: reason.into(),
        ..Default::default()
    };
    ask_others(b, &ask)
        .await
        .iter()
        .any(|(_, closed)| closed.as_bool() == Some(true))
}

// ---- queues ----

/// A queue's counts and `message_stats`, as this node knows them.
pub fn queue_figures(b: &Broker, q: &QueueRef) -> Value {
    let ready = q.message_count();
    let unacked = q.unacked_count();
    json!({
        "messages": ready + unacked, "messages_ready": ready,
        "messages_unacknowledged": unacked, "consumers": q.consumer_count(),
        "message_stats": stats_api::queue_message_stats(b, q),
    })
}

/// The figures of the queues this node hosts (its classic queues and streams, the replicated
/// queues it leads), each with its vhost and name.
fn hosted_figures(b: &Broker, vhost: Option<&str>, name: Option<&str>) -> Vec<Value> {
    let mut out = Vec::new();
    for v in b.vhosts() {
        if vhost.is_some_and(|x| x != &*v.name) {
            continue;
        }
        for q in v.snapshot().queues.values() {
            if name.is_some_and(|n| n != &**q.name()) || !hosted_here(q) {
                continue;
            }
            let mut f = queue_figures(b, q);
            f["vhost"] = json!(&*v.name);
            f["name"] = json!(&**q.name());
            out.push(f);
        }
    }
    out
}

/// What other nodes answer to a per-object view (`queues`, `exchanges`) for one vhost's or one
/// object's (where given), by (vhost, name). Empty on a single node.
async fn parts_elsewhere(
    b: &Broker,
    view: &str,
    vhost: Option<&str>,
    name: Option<&str>,
) -> HashMap<(String, String), Vec<Value>> {
    let ask = Ask {
        view: view.into(),
        vhost: vhost.map(Into::into),
        name: name.map(Into::into),
        ..Default::default()
    };
    let mut out: HashMap<(String, String), Vec<Value>> = HashMap::new();
    for (_, v) in ask_others(b, &ask).await {
        for p in v.as_array().into_iter().flatten() {
            let key = |k: &str| p[k].as_str().unwrap_or_default().to_string();
            out.entry((key("vhost"), key("name")))
                .or_default()
                .push(p.clone());
        }
    }
    out
}

/// The figures other nodes give for the queues they host (one node each).
pub async fn figures_elsewhere(
    b: &Broker,
    vhost: Option<&str>,
    name: Option<&str>,
) -> HashMap<(String, String), Vec<Value>> {
    parts_elsewhere(b, "queues", vhost, name).await
}

/// Adds a queue's figures to its row: this node's where it hosts the queue (or is a member of
/// its group and no leader answered), the hosting node's otherwise; none (unknown) when that
/// node did not answer.
pub fn add_figures(
    b: &Broker,
    q: &QueueRef,
    elsewhere: &HashMap<(String, String), Vec<Value>>,
    row: &mut Value,
) {
    let Value::Object(m) = row else { return };
    let key = (q.vhost().to_string(), q.name().to_string());
    let figures = if Cluster::of(b).is_none() || hosted_here(q) {
        Some(queue_figures(b, q))
    } else if let Some(f) = elsewhere.get(&key).and_then(|f| f.first()) {
        Some(f.clone())
    } else if is_member(b, q) {
        Some(queue_figures(b, q))
    } else {
        None
    };
    if let Some(Value::Object(f)) = figures {
        for (k, v) in f {
            if k != "vhost" && k != "name" {
                m.insert(k, v);
            }
        }
    }
}

/// This node is a member of the queue's replicated group (its counts are its own state's).
fn is_member(b: &Broker, q: &QueueRef) -> bool {
    q.group()
        .is_some_and(|(_, members)| members.contains(&b.config.node_name))
}

// ---- exchanges ----

/// This node's counters of the exchanges published to through it (an exchange routes on the
/// node its publisher is connected to, so each node counts its own part).
fn exchange_parts(b: &Broker, vhost: Option<&str>, name: Option<&str>) -> Vec<Value> {
    let mut out = Vec::new();
    for v in b.vhosts() {
        if vhost.is_some_and(|x| x != &*v.name) {
            continue;
        }
        let s = v.snapshot();
        for x in s.table.exchanges.values() {
            if name.is_some_and(|n| n != &*x.name) {
                continue;
            }
            let delayed = if x.delayed {
                v.delayed_count(&x.name)
            } else {
                0
            };
            if x.stats.publish_in.get() == 0 && x.stats.publish_out.get() == 0 && delayed == 0 {
                continue;
            }
            let mut part = json!({
                "vhost": &*v.name, "name": &*x.name,
                "message_stats": stats_api::exchange_message_stats(b, &v.name, x),
            });
            if x.delayed {
                part["messages_delayed"] = json!(delayed);
            }
            out.push(part);
        }
    }
    out
}

/// The other nodes' counters of exchanges (one vhost's, or one exchange's), by (vhost, name).
pub async fn exchange_parts_elsewhere(
    b: &Broker,
    vhost: Option<&str>,
    name: Option<&str>,
) -> HashMap<(String, String), Vec<Value>> {
    parts_elsewhere(b, "exchanges", vhost, name).await
}

/// Adds other nodes' counters (and delayed messages) of an exchange to its row.
pub fn add_exchange_parts(row: &mut Value, parts: Option<&Vec<Value>>) {
    for p in parts.into_iter().flatten() {
        add_json(&mut row["message_stats"], &p["message_stats"]);
        if row.get("messages_delayed").is_some() {
            add_json(&mut row["messages_delayed"], &p["messages_delayed"]);
        }
    }
}

// ---- the overview ----

/// This node's part of the overview: what runs here, and its listeners.
fn overview_part(b: &Broker) -> Value {
    let (message_stats, queue_totals, churn_rates) = stats_api::overview_stats(b);
    let conns = stats_api::open_connections(b);
    let channels: u64 = conns
        .iter()
        .map(|c| c.channels.load(std::sync::atomic::Ordering::Relaxed) as u64)
        .sum();
    json!({
        "message_stats": message_stats,
        "queue_totals": queue_totals,
        "churn_rates": churn_rates,
        "object_totals": {
            "connections": conns.len(),
            "channels": channels,
            "consumers": stats_api::consumer_count(b),
        },
        "listeners": listeners(b),
    })
}

fn listeners(b: &Broker) -> Value {
    let c = &b.config;
    json!([
        {"node": c.node_name, "protocol": "amqp", "ip_address": c.amqp_bind.to_string(), "port": c.amqp_port},
        {"node": c.node_name, "protocol": "http", "ip_address": c.http_bind.to_string(), "port": c.http_port},
    ])
}

/// The overview's cluster-wide parts: every node's parts summed (counts and rates), its
/// listeners listed.
pub async fn overview_parts(b: &Broker) -> Value {
    let ask = Ask {
        view: "overview".into(),
        ..Default::default()
    };
    let mut total = overview_part(b);
    for (_, part) in ask_others(b, &ask).await {
        for k in [
            "message_stats",
            "queue_totals",
            "churn_rates",
            "object_totals",
        ] {
            add_json(&mut total[k], &part[k]);
        }
        if let (Value::Array(all), Value::Array(more)) =
            (&mut total["listeners"], &part["listeners"])
        {
            all.extend(more.iter().cloned());
        }
    }
    total
}

/// Adds `v`'s numbers into `acc`'s, key by key (rates and counts alike).
fn add_json(acc: &mut Value, v: &Value) {
    match (acc, v) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, bv) in b {
                match a.get_mut(k) {
                    Some(av) => add_json(av, bv),
                    None => {
                        a.insert(k.clone(), bv.clone());
                    }
                }
            }
        }
        (a @ Value::Number(_), Value::Number(b)) => {
            *a = match (a.as_u64(), b.as_u64()) {
                (Some(x), Some(y)) => json!(x + y),
                _ => json!(a.as_f64().unwrap_or(0.0) + b.as_f64().unwrap_or(0.0)),
            };
        }
        _ => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parts_add_up_key_by_key() {
        let mut a = json!({"publish": 3, "publish_details": {"rate": 1.5}, "only_a": 1});
        add_json(
            &mut a,
            &json!({"publish": 4, "publish_details": {"rate": 0.25}, "only_b": 2}),
        );
        assert_eq!(a["publish"], 7);
        assert_eq!(a["publish_details"]["rate"], 1.75);
        assert_eq!(a["only_a"], 1);
        assert_eq!(a["only_b"], 2);
    }
}
