//! Runtime parameters, shovels and federation: set_parameter, clear_parameter,
//! list_parameters (as rabbitmqctl's), shovel_status, delete_shovel and restart_shovel (as the
//! shovel plugin's rabbitmqctl commands), federation_status (the federation plugin's).

use std::io::Write;

use serde_json::Value;

use super::api::{fail, seg, Api, Failure};
use super::view::{field, info, list, table};
use super::VhostOpt;

pub(super) fn set_parameter(
    api: &Api,
    quiet: bool,
    v: &VhostOpt,
    component: &str,
    name: &str,
    value: &str,
) -> Result<(), Failure> {
    let value: Value =
        serde_json::from_str(value).map_err(|e| fail(format!("the value is not JSON: {e}")))?;
    info(
        quiet,
        format!(
            "Setting runtime parameter \"{name}\" for component \"{component}\" to \"{value}\" in vhost \"{}\" ...",
            v.vhost
        ),
    );
    let path = format!(
        "/api/parameters/{}/{}/{}",
        seg(component),
        seg(&v.vhost),
        seg(name)
    );
    api.must(
        "PUT",
        &path,
        Some(&serde_json::json!({ "value": value })),
        format!("vhost '{}' does not exist", v.vhost),
    )?;
    Ok(())
}

pub(super) fn clear_parameter(
    api: &Api,
    quiet: bool,
    v: &VhostOpt,
    component: &str,
    name: &str,
) -> Result<(), Failure> {
    info(
        quiet,
        format!(
            "Clearing runtime parameter \"{name}\" for component \"{component}\" on vhost \"{}\" ...",
            v.vhost
        ),
    );
    let path = format!(
        "/api/parameters/{}/{}/{}",
        seg(component),
        seg(&v.vhost),
        seg(name)
    );
    api.must(
        "DELETE",
        &path,
        None,
        "Parameter does not exist".to_string(),
    )?;
    Ok(())
}

pub(super) fn list_parameters(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
    v: &VhostOpt,
) -> Result<(), Failure> {
    let rows: Vec<Value> = list(api.get("/api/parameters")?)
        .into_iter()
        .filter(|r| r["vhost"] == v.vhost.as_str())
        .collect();
    info(
        quiet,
        format!("Listing runtime parameters for vhost \"{}\" ...", v.vhost),
    );
    table(out, &["component", "name", "value"], &rows, field)
}

/// rabbitmqctl shovel_status's columns, from `/api/shovels` rows.
const STATUS_COLUMNS: &[&str] = &[
    "name",
    "vhost",
    "type",
    "state",
    "source",
    "destination",
    "termination_reason",
    "destination_protocol",
    "source_protocol",
    "last_changed",
    "source_queue",
    "destination_queue",
    "forwarded",
    "pending",
    "remaining",
];

fn status_cell(r: &Value, c: &str) -> Option<Value> {
    let pick = |k: &str| r.get(k).cloned();
    match c {
        "source" => pick("src_uri"),
        "destination" => pick("dest_uri"),
        "termination_reason" => pick("reason"),
        "destination_protocol" => pick("dest_protocol"),
        "source_protocol" => pick("src_protocol"),
        "last_changed" => pick("timestamp"),
        "source_queue" => pick("src_queue").or_else(|| pick("src_exchange")),
        "destination_queue" => pick("dest_queue").or_else(|| pick("dest_exchange")),
        _ => pick(c),
    }
}

pub(super) fn shovel_status(api: &Api, quiet: bool, out: &mut impl Write) -> Result<(), Failure> {
    let rows = list(api.get("/api/shovels")?);
    info(quiet, "Shovel status on the cluster ...".to_string());
    table(out, STATUS_COLUMNS, &rows, status_cell)
}

pub(super) fn delete_shovel(
    api: &Api,
    quiet: bool,
    v: &VhostOpt,
    name: &str,
) -> Result<(), Failure> {
    info(
        quiet,
        format!("Deleting shovel {name} in vhost {}", v.vhost),
    );
    let path = format!("/api/parameters/shovel/{}/{}", seg(&v.vhost), seg(name));
    api.must(
        "DELETE",
        &path,
        None,
        format!(
            "Shovel with the given name was not found in vhost '{}'",
            v.vhost
        ),
    )?;
    Ok(())
}

pub(super) fn restart_shovel(
    api: &Api,
    quiet: bool,
    v: &VhostOpt,
    name: &str,
) -> Result<(), Failure> {
    info(
        quiet,
        format!("Restarting dynamic Shovel {name} in vhost {}", v.vhost),
    );
    let path = format!("/api/shovels/vhost/{}/{}/restart", seg(&v.vhost), seg(name));
    api.must(
        "DELETE",
        &path,
        None,
        format!(
            "Shovel with the given name was not found in vhost '{}'",
            v.vhost
        ),
    )?;
    Ok(())
}

/// rabbitmqctl federation_status's columns, from `/api/federation-links` rows.
const FEDERATION_COLUMNS: &[&str] = &[
    "type",
    "name",
    "vhost",
    "upstream",
    "status",
    "error",
    "uri",
    "timestamp",
    "upstream_exchange",
    "upstream_queue",
];

fn federation_cell(r: &Value, c: &str) -> Option<Value> {
    match c {
        "name" => r.get("exchange").or_else(|| r.get("queue")).cloned(),
        _ => r.get(c).cloned(),
    }
}

pub(super) fn federation_status(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let rows = list(api.get("/api/federation-links")?);
    info(quiet, "Listing federation links ...".to_string());
    table(out, FEDERATION_COLUMNS, &rows, federation_cell)
}
