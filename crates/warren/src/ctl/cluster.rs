//! The cluster and quorum queue membership: cluster_status, set_cluster_name, join_cluster,
//! forget_cluster_node, and rabbitmq-queues' add_member, delete_member, grow, shrink, rebalance.

use std::io::Write;

use clap::Args;
use serde_json::{json, Value};

use super::api::{fail, Api, Failure};
use super::view::{info, write_failed};
use super::VhostOpt;

/// A quorum queue or a stream, and a node (add_member, delete_member, add_replica,
/// delete_replica).
#[derive(Args)]
pub(super) struct MemberOpt {
    #[command(flatten)]
    v: VhostOpt,
    #[arg(value_name = "QUEUE")]
    queue: String,
    #[arg(value_name = "NODE")]
    node: String,
}

/// grow's arguments (its help is the doc comment on `Cmd::Grow`).
#[derive(Args)]
pub(super) struct GrowArgs {
    #[arg(value_name = "NODE")]
    node: String,
    #[arg(value_name = "all|even")]
    which: String,
    /// Only queues of vhosts matching this regex.
    #[arg(long = "vhost-pattern", default_value = ".*")]
    vhost_pattern: String,
    /// Only queues whose names match this regex.
    #[arg(long = "queue-pattern", default_value = ".*")]
    queue_pattern: String,
}

pub(super) fn cluster_status(api: &Api, quiet: bool, out: &mut impl Write) -> Result<(), Failure> {
    let s = api.must(
        "GET",
        "/api/warren/cluster",
        None,
        "the broker has no cluster endpoint".into(),
    )?;
    let node = s.get("node").and_then(Value::as_str).unwrap_or("");
    info(quiet, format!("Cluster status of node {node} ..."));
    write!(out, "{}", cluster_status_text(&s)).map_err(write_failed)
}

/// rabbitmqctl cluster_status's sections, from `/api/warren/cluster`.
fn cluster_status_text(s: &Value) -> String {
    let names = |running: Option<bool>| -> String {
        s.get("nodes")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter(|n| running.is_none_or(|r| n.get("running") == Some(&Value::Bool(r))))
                    .filter_map(|n| n.get("name").and_then(Value::as_str))
                    .map(|n| format!("{n}\n"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let field = |k: &str| {
        s.get(k)
            .and_then(Value::as_str)
            .unwrap_or("(none)")
            .to_string()
    };
    format!(
        "Basics\n\nCluster name: {}\n\nDisk Nodes\n\n{}\nRunning Nodes\n\n{}\nMetadata leader (Raft)\n\n{}\n",
        field("cluster_name"),
        names(None),
        names(Some(true)),
        field("leader"),
    )
}

/// `set_cluster_name`, as rabbitmqctl's (`PUT /api/cluster-name`).
pub(super) fn set_cluster_name(api: &Api, quiet: bool, name: &str) -> Result<(), Failure> {
    info(quiet, format!("Setting cluster name to {name} ..."));
    api.call(
        "PUT",
        "/api/cluster-name",
        Some(&json!({ "name": name })),
        &[],
    )?;
    Ok(())
}

/// `join_cluster`: the broker, not ctl, refuses it while its AMQP app still runs.
pub(super) fn join_cluster(api: &Api, quiet: bool, target: &str) -> Result<(), Failure> {
    info(
        quiet,
        format!("Clustering node {} with {target}", api.node_name()?),
    );
    api.call(
        "POST",
        "/api/warren/cluster/join",
        Some(&json!({ "node": target })),
        &[],
    )?;
    Ok(())
}

pub(super) fn forget_cluster_node(api: &Api, quiet: bool, member: &str) -> Result<(), Failure> {
    info(quiet, format!("Removing node {member} from the cluster"));
    api.call(
        "POST",
        "/api/warren/cluster/forget",
        Some(&json!({ "node": member })),
        &[],
    )?;
    Ok(())
}

/// The end of add_member's and delete_member's banners.
fn member_text(m: &MemberOpt) -> String {
    format!(
        "queue {} in vhost {} on node {} ...",
        m.queue, m.v.vhost, m.node
    )
}

pub(super) fn add_member(api: &Api, quiet: bool, m: &MemberOpt) -> Result<(), Failure> {
    info(quiet, format!("Adding a replica for {}", member_text(m)));
    member_change(api, &m.v.vhost, &m.queue, &m.node, true)
}

pub(super) fn delete_member(api: &Api, quiet: bool, m: &MemberOpt) -> Result<(), Failure> {
    info(quiet, format!("Removing a replica of {}", member_text(m)));
    member_change(api, &m.v.vhost, &m.queue, &m.node, false)
}

/// One add_member / delete_member through `/api/warren/queues/members`.
fn member_change(
    api: &Api,
    vhost: &str,
    queue: &str,
    node: &str,
    add: bool,
) -> Result<(), Failure> {
    let action = if add { "add" } else { "delete" };
    api.call(
        "POST",
        "/api/warren/queues/members",
        Some(&json!({"vhost": vhost, "queue": queue, "node": node, "action": action})),
        &[],
    )?;
    Ok(())
}

/// Every quorum queue: (vhost, name, members).
fn quorum_queues(api: &Api) -> Result<Vec<(String, String, Vec<String>)>, Failure> {
    let rows = api.must("GET", "/api/queues", None, "no queue listing".into())?;
    let mut out = Vec::new();
    for q in rows.as_array().into_iter().flatten() {
        if q.get("type").and_then(Value::as_str) != Some("quorum") {
            continue;
        }
        let s = |k: &str| q.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let members = q
            .get("members")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|m| m.as_str().map(String::from))
            .collect();
        out.push((s("vhost"), s("name"), members));
    }
    Ok(out)
}

/// `grow`: one add_member per queue chosen; a row per queue with its new size and result
/// (a queue that refused does not stop the others).
pub(super) fn grow(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
    a: &GrowArgs,
) -> Result<(), Failure> {
    let (node, which) = (&a.node, &a.which);
    if which != "all" && which != "even" {
        return Err(fail(format!("grow takes 'all' or 'even', not '{which}'")));
    }
    let vre =
        regex::Regex::new(&a.vhost_pattern).map_err(|e| fail(format!("--vhost-pattern: {e}")))?;
    let qre =
        regex::Regex::new(&a.queue_pattern).map_err(|e| fail(format!("--queue-pattern: {e}")))?;
    info(
        quiet,
        format!("Growing {which} quorum queues on {node} ..."),
    );
    writeln!(out, "vhost\tname\tsize\tresult").map_err(|e| fail(e.to_string()))?;
    for q in quorum_queues(api)? {
        let (vh, name, members) = q;
        if !vre.is_match(&vh) || !qre.is_match(&name) || members.contains(node) {
            continue;
        }
        if which == "even" && members.len() % 2 != 0 {
            continue;
        }
        let r = member_change(api, &vh, &name, node, true);
        let size = members.len() + usize::from(r.is_ok());
        let result = r.err().map_or("ok".to_string(), |e| e.message);
        writeln!(out, "{vh}\t{name}\t{size}\t{result}").map_err(|e| fail(e.to_string()))?;
    }
    Ok(())
}

/// rebalance's arguments (its help is the doc comment on `Cmd::Rebalance`).
#[derive(Args)]
pub(super) struct RebalanceArgs {
    #[arg(value_name = "all|quorum|classic")]
    which: String,
    /// Only queues of vhosts matching this regex.
    #[arg(long = "vhost-pattern", default_value = ".*")]
    vhost_pattern: String,
    /// Only queues whose names match this regex.
    #[arg(long = "queue-pattern", default_value = ".*")]
    queue_pattern: String,
}

/// `rebalance`, as rabbitmq-queues': the broker moves leaders, and answers how many
/// replicated queues each running node leads afterwards (a row per node).
pub(super) fn rebalance(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
    a: &RebalanceArgs,
) -> Result<(), Failure> {
    let what = match a.which.as_str() {
        "all" => "all replicated queues",
        "quorum" => "quorum queues",
        "classic" => "mirrored classic queues",
        other => {
            return Err(fail(format!(
                "rebalance takes 'all', 'quorum' or 'classic', not '{other}'"
            )))
        }
    };
    info(quiet, format!("Re-balancing leaders of {what}..."));
    let body = json!({"type": a.which, "vhost_pattern": a.vhost_pattern,
                      "queue_pattern": a.queue_pattern});
    let r = api.must(
        "POST",
        "/api/warren/queues/rebalance",
        Some(&body),
        "the broker has no rebalance endpoint".into(),
    )?;
    writeln!(out, "node_name\tleaders").map_err(write_failed)?;
    if let Some(leaders) = r.get("leaders").and_then(Value::as_object) {
        for (node, n) in leaders {
            writeln!(out, "{node}\t{n}").map_err(write_failed)?;
        }
    }
    Ok(())
}

/// `shrink`: one delete_member per queue NODE is a member of, a row per queue as grow's.
pub(super) fn shrink(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
    node: &str,
) -> Result<(), Failure> {
    info(quiet, format!("Shrinking quorum queues on {node} ..."));
    writeln!(out, "vhost\tname\tsize\tresult").map_err(|e| fail(e.to_string()))?;
    for (vh, name, members) in quorum_queues(api)? {
        if !members.iter().any(|m| m == node) {
            continue;
        }
        let r = member_change(api, &vh, &name, node, false);
        let size = members.len() - usize::from(r.is_ok());
        let result = r.err().map_or("ok".to_string(), |e| e.message);
        writeln!(out, "{vh}\t{name}\t{size}\t{result}").map_err(|e| fail(e.to_string()))?;
    }
    Ok(())
}
