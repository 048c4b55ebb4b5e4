//! Vhost and user limits: set_vhost_limits, clear_vhost_limits, list_vhost_limits,
//! set_user_limits, clear_user_limits, list_user_limits. Both kinds live under the same API
//! shape (`/api/{vhost,user}-limits/NAME/LIMIT`), so they share the helpers here.

use std::io::Write;

use serde_json::{json, Value};

use super::api::{fail, seg, Api, Failure};
use super::view::{field, info, list, table, write_failed};
use super::VhostOpt;

/// The limits set on one vhost or user (`kind`: "vhost-limits" or "user-limits").
fn limits_of(api: &Api, kind: &str, name: &str, what: &str) -> Result<Value, Failure> {
    let rows = api.must(
        "GET",
        &format!("/api/{kind}/{}", seg(name)),
        None,
        format!("{what} '{name}' does not exist"),
    )?;
    Ok(list(Some(rows))
        .into_iter()
        .find_map(|r| r.get("value").cloned())
        .unwrap_or_else(|| json!({})))
}

/// The names of the limits in a limits object.
fn limit_names(limits: &Value) -> Vec<String> {
    limits
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// Sets each limit in `definition` (a JSON object) with one PUT per limit, as the HTTP API
/// takes them; returns the names set.
fn put_limits(
    api: &Api,
    kind: &str,
    name: &str,
    definition: &str,
    what: &str,
) -> Result<Vec<String>, Failure> {
    let def: Value = serde_json::from_str(definition)
        .map_err(|e| fail(format!("the limits definition is not valid JSON: {e}")))?;
    let Value::Object(def) = def else {
        return Err(fail("the limits definition must be a JSON object"));
    };
    for (limit, value) in &def {
        let path = format!("/api/{kind}/{}/{}", seg(name), seg(limit));
        api.must(
            "PUT",
            &path,
            Some(&json!({ "value": value })),
            format!("{what} '{name}' does not exist"),
        )?;
    }
    Ok(def.keys().cloned().collect())
}

/// Clears one limit of a vhost or user.
fn delete_limit(api: &Api, kind: &str, name: &str, limit: &str, what: &str) -> Result<(), Failure> {
    let path = format!("/api/{kind}/{}/{}", seg(name), seg(limit));
    api.must(
        "DELETE",
        &path,
        None,
        format!("{what} '{name}' does not exist"),
    )?;
    Ok(())
}

/// `list_vhost_limits` / `list_user_limits`: one JSON object for `name`, or with `global` a
/// `{key}\tlimits` table of every vhost or user with limits, as rabbitmqctl prints them.
fn list_limits(
    api: &Api,
    out: &mut impl Write,
    kind: &str,
    key: &str,
    name: Option<&str>,
) -> Result<(), Failure> {
    match name {
        Some(name) => {
            let l = limits_of(api, kind, name, key)?;
            if l.as_object().is_some_and(|o| !o.is_empty()) {
                writeln!(out, "{l}").map_err(write_failed)?;
            }
            Ok(())
        }
        None => table(
            out,
            &[key, "limits"],
            &list(api.get(&format!("/api/{kind}"))?),
            |r, c| match c {
                "limits" => r.get("value").map(|v| Value::String(v.to_string())),
                _ => field(r, c),
            },
        ),
    }
}

/// `set_vhost_limits`: replaces the whole definition, as rabbitmqctl does.
pub(super) fn set_vhost_limits(
    api: &Api,
    quiet: bool,
    v: &VhostOpt,
    definition: &str,
) -> Result<(), Failure> {
    info(
        quiet,
        format!(
            "Setting vhost limits to \"{definition}\" for vhost \"{}\" ...",
            v.vhost
        ),
    );
    let old = limit_names(&limits_of(api, "vhost-limits", &v.vhost, "vhost")?);
    let set = put_limits(api, "vhost-limits", &v.vhost, definition, "vhost")?;
    // rabbitmqctl replaces the whole definition: what it does not name is cleared.
    for l in old.iter().filter(|l| !set.contains(l)) {
        delete_limit(api, "vhost-limits", &v.vhost, l, "vhost")?;
    }
    Ok(())
}

pub(super) fn clear_vhost_limits(api: &Api, quiet: bool, v: &VhostOpt) -> Result<(), Failure> {
    info(quiet, format!("Clearing vhost \"{}\" limits ...", v.vhost));
    for l in limit_names(&limits_of(api, "vhost-limits", &v.vhost, "vhost")?) {
        delete_limit(api, "vhost-limits", &v.vhost, &l, "vhost")?;
    }
    Ok(())
}

pub(super) fn list_vhost_limits(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
    v: &VhostOpt,
    global: bool,
) -> Result<(), Failure> {
    if global {
        info(quiet, "Listing limits for all vhosts ...".into());
        list_limits(api, out, "vhost-limits", "vhost", None)
    } else {
        info(
            quiet,
            format!("Listing limits for vhost \"{}\" ...", v.vhost),
        );
        list_limits(api, out, "vhost-limits", "vhost", Some(&v.vhost))
    }
}

/// `set_user_limits`: merged with the limits already set, as rabbitmqctl does.
pub(super) fn set_user_limits(
    api: &Api,
    quiet: bool,
    user: &str,
    definition: &str,
) -> Result<(), Failure> {
    info(
        quiet,
        format!("Setting user limits to \"{definition}\" for user \"{user}\" ..."),
    );
    put_limits(api, "user-limits", user, definition, "user")?;
    Ok(())
}

/// `clear_user_limits`: one limit, or "all" (which the API takes as a limit name).
pub(super) fn clear_user_limits(
    api: &Api,
    quiet: bool,
    user: &str,
    limit: &str,
) -> Result<(), Failure> {
    info(
        quiet,
        if limit == "all" {
            format!("Clearing all limits for user \"{user}\" ...")
        } else {
            format!("Clearing \"{limit}\" limit for user \"{user}\" ...")
        },
    );
    delete_limit(api, "user-limits", user, limit, "user")
}

pub(super) fn list_user_limits(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
    user: &str,
    global: bool,
) -> Result<(), Failure> {
    if global {
        info(quiet, "Listing limits for all users ...".into());
        list_limits(api, out, "user-limits", "user", None)
    } else {
        info(quiet, format!("Listing limits for user \"{user}\" ..."));
        list_limits(api, out, "user-limits", "user", Some(user))
    }
}
