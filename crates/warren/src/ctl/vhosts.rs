//! Virtual hosts and their policies: add_vhost, delete_vhost, list_vhosts, set_policy,
//! clear_policy, list_policies.

use std::io::Write;

use clap::Args;
use serde_json::{json, Value};

use super::api::{fail, seg, Api, Failure};
use super::view::{columns, field, info, list, table};
use super::VhostOpt;

/// set_policy's arguments (its help is the variant's doc comment on `Cmd::SetPolicy`).
#[derive(Args)]
pub(super) struct SetPolicyArgs {
    #[command(flatten)]
    v: VhostOpt,
    #[arg(long, default_value_t = 0)]
    priority: i64,
    #[arg(long = "apply-to", default_value = "all")]
    apply_to: String,
    name: String,
    pattern: String,
    definition: String,
}

/// `add_vhost`: refused if the vhost exists (the API's PUT would succeed silently).
pub(super) fn add_vhost(api: &Api, quiet: bool, name: &str) -> Result<(), Failure> {
    if api.get(&format!("/api/vhosts/{}", seg(name)))?.is_some() {
        return Err(fail(format!("vhost '{name}' already exists")));
    }
    info(quiet, format!("Adding vhost \"{name}\" ..."));
    api.call(
        "PUT",
        &format!("/api/vhosts/{}", seg(name)),
        Some(&json!({})),
        &[],
    )?;
    Ok(())
}

pub(super) fn delete_vhost(api: &Api, quiet: bool, name: &str) -> Result<(), Failure> {
    info(quiet, format!("Deleting vhost \"{name}\" ..."));
    api.must(
        "DELETE",
        &format!("/api/vhosts/{}", seg(name)),
        None,
        format!("vhost '{name}' does not exist"),
    )?;
    Ok(())
}

pub(super) fn list_vhosts(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
    cols: &[String],
) -> Result<(), Failure> {
    let cols = columns(
        cols,
        &["name"],
        &[
            "name",
            "description",
            "messages",
            "messages_ready",
            "messages_unacknowledged",
            "tracing",
        ],
        "vhost",
    )?;
    info(quiet, "Listing vhosts ...".into());
    table(out, &cols, &list(api.get("/api/vhosts")?), field)
}

/// `set_policy`: the definition is checked to be JSON before anything is sent.
pub(super) fn set_policy(api: &Api, quiet: bool, a: &SetPolicyArgs) -> Result<(), Failure> {
    let SetPolicyArgs {
        v,
        priority,
        apply_to,
        name,
        pattern,
        definition,
    } = a;
    let def: Value = serde_json::from_str(definition)
        .map_err(|e| fail(format!("the policy definition is not valid JSON: {e}")))?;
    info(quiet, format!("Setting policy \"{name}\" for pattern \"{pattern}\" to \"{definition}\" with priority \"{priority}\" for vhost \"{}\" ...", v.vhost));
    let body =
        json!({"pattern": pattern, "definition": def, "priority": priority, "apply-to": apply_to});
    let path = format!("/api/policies/{}/{}", seg(&v.vhost), seg(name));
    api.must(
        "PUT",
        &path,
        Some(&body),
        format!("vhost '{}' does not exist", v.vhost),
    )?;
    Ok(())
}

pub(super) fn clear_policy(
    api: &Api,
    quiet: bool,
    v: &VhostOpt,
    name: &str,
) -> Result<(), Failure> {
    info(
        quiet,
        format!("Clearing policy \"{name}\" on vhost \"{}\" ...", v.vhost),
    );
    let path = format!("/api/policies/{}/{}", seg(&v.vhost), seg(name));
    api.must(
        "DELETE",
        &path,
        None,
        format!("policy '{name}' in vhost '{}' does not exist", v.vhost),
    )?;
    Ok(())
}

pub(super) fn list_policies(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
    v: &VhostOpt,
) -> Result<(), Failure> {
    let path = format!("/api/policies/{}", seg(&v.vhost));
    let rows = api.must(
        "GET",
        &path,
        None,
        format!("vhost '{}' does not exist", v.vhost),
    )?;
    info(
        quiet,
        format!("Listing policies for vhost \"{}\" ...", v.vhost),
    );
    table(
        out,
        &[
            "vhost",
            "name",
            "pattern",
            "apply-to",
            "definition",
            "priority",
        ],
        &list(Some(rows)),
        field,
    )
}
