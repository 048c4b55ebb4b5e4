//! What the groups of replicated queues share across the cluster (each queue is one openraft
//! group of its own over its members, running the queue machine: `crate::replicated`): the
//! link services their Raft messages, leader questions and member changes travel as, member
//! changes (`members.rs`: `add_member` / `delete_member`), leadership transfers that spread the
//! leaders (`rebalance.rs`: `warren ctl rebalance`), and how an `ha-mode` policy picks a
//! mirrored classic queue's members.
//!
//! (The earlier form, a `Replica` of ids beside a classic queue on the leader, is gone; a node
//! carries a group it wrote over to the machine at boot: `replicated/legacy.rs`.)

mod members;
pub mod rebalance;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::Cluster;

/// Raft messages of a queue group: `[group u64][openraft rpc]`.
pub const SERVICE_QRAFT: u8 = 5;
/// Which node leads a queue group (asked by non-members): `[group u64]` -> the leader's name.
pub const SERVICE_QLEADER: u8 = 6;

/// Change a queue group's Raft membership, served by one of its members:
/// `[group u64][1 add | 2 remove][node name]`.
pub const SERVICE_QMEMBER: u8 = 7;

/// How long a declare waits for the new group to elect its first leader.
pub const FIRST_LEADER_WAIT: Duration = Duration::from_secs(15);

/// The group's leader as this member's Raft sees it (answers [`SERVICE_QLEADER`]).
pub fn raft_leader(meta: &warren_cluster::Meta) -> Option<String> {
    meta.status().leader_name().map(String::from)
}

/// A member's side of [`SERVICE_QMEMBER`].
pub async fn serve_member_change(c: &Arc<Cluster>, body: &[u8]) -> Result<Bytes, String> {
    if body.len() < 9 {
        return Err("short request".into());
    }
    let group = u64::from_be_bytes(body[..8].try_into().map_err(|_| "short request")?);
    let add = body[8] == 1;
    let name = String::from_utf8_lossy(&body[9..]).into_owned();
    let meta = c.groups.read().get(&group).cloned();
    let meta = meta.ok_or_else(|| format!("not a member of queue group {group:016x}"))?;
    change_group(c, &meta, &name, add).await?;
    Ok(Bytes::new())
}

async fn change_group(
    c: &Cluster,
    meta: &warren_cluster::Meta,
    name: &str,
    add: bool,
) -> Result<(), String> {
    if add {
        let addr = c
            .addr_of(name)
            .ok_or_else(|| format!("{name} is not a cluster member"))?;
        meta.add_voter(warren_cluster::Node {
            name: name.to_string(),
            addr,
        })
        .await
        .map_err(|e| e.to_string())
    } else {
        meta.remove(warren_cluster::node_id(name))
            .await
            .map_err(|e| e.to_string())
    }
}

/// How many members (or which) an `ha-mode` policy asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Ha {
    Size(usize),
    Nodes(Vec<String>),
}

/// RabbitMQ's `ha-mode` / `ha-params`: `all` (every node), `exactly` N (N nodes, the leader
/// included; 2 is taken as 3), `nodes` [names]. `None` without a (valid) `ha-mode`.
pub fn ha_members(definition: &serde_json::Map<String, serde_json::Value>) -> Option<Ha> {
    let params = definition.get("ha-params");
    match definition.get("ha-mode")?.as_str()? {
        "all" => Some(Ha::Size(usize::MAX)),
        // A Raft group of 2 cannot elect a leader once one member is gone, where RabbitMQ
        // promotes the mirror: 2 becomes 3, so losing one node loses nothing, as users expect.
        "exactly" => {
            let n = params?.as_i64().filter(|n| *n >= 1)?;
            Some(Ha::Size(if n == 2 { 3 } else { n as usize }))
        }
        "nodes" => {
            let nodes: Vec<String> = params?
                .as_array()?
                .iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect();
            (!nodes.is_empty()).then_some(Ha::Nodes(nodes))
        }
        _ => None,
    }
}
