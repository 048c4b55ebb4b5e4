//! Users and their permissions: add_user, change_password, delete_user, set_user_tags,
//! list_users, set_permissions, clear_permissions, list_permissions, list_user_permissions.

use std::io::Write;

use clap::Args;
use serde_json::json;

use super::api::{fail, seg, Api, Failure};
use super::view::{field, info, list, table};
use super::VhostOpt;

// Not a doc comment: clap would show it as set_permissions' help, which has none.
#[derive(Args)]
pub(super) struct SetPermissionsArgs {
    #[command(flatten)]
    v: VhostOpt,
    user: String,
    configure: String,
    write: String,
    read: String,
}

/// `add_user`: refused if the user exists (the API's PUT would replace it).
pub(super) fn add_user(api: &Api, quiet: bool, name: &str, password: &str) -> Result<(), Failure> {
    if api.get(&format!("/api/users/{}", seg(name)))?.is_some() {
        return Err(fail(format!("user '{name}' already exists")));
    }
    info(quiet, format!("Adding user \"{name}\" ..."));
    api.call(
        "PUT",
        &format!("/api/users/{}", seg(name)),
        Some(&json!({"password": password, "tags": ""})),
        &[],
    )?;
    Ok(())
}

/// `change_password`: a PUT of the user with its tags as they are.
pub(super) fn change_password(
    api: &Api,
    quiet: bool,
    name: &str,
    password: &str,
) -> Result<(), Failure> {
    let path = format!("/api/users/{}", seg(name));
    let u = api.must("GET", &path, None, format!("user '{name}' does not exist"))?;
    info(quiet, format!("Changing password for user \"{name}\" ..."));
    let tags = u.get("tags").cloned().unwrap_or(json!([]));
    api.call(
        "PUT",
        &path,
        Some(&json!({"password": password, "tags": tags})),
        &[],
    )?;
    Ok(())
}

pub(super) fn delete_user(api: &Api, quiet: bool, name: &str) -> Result<(), Failure> {
    info(quiet, format!("Deleting user \"{name}\" ..."));
    api.must(
        "DELETE",
        &format!("/api/users/{}", seg(name)),
        None,
        format!("user '{name}' does not exist"),
    )?;
    Ok(())
}

/// `set_user_tags`: refused for an unknown user (the API's PUT would create one).
pub(super) fn set_user_tags(
    api: &Api,
    quiet: bool,
    name: &str,
    tags: &[String],
) -> Result<(), Failure> {
    let path = format!("/api/users/{}", seg(name));
    api.must("GET", &path, None, format!("user '{name}' does not exist"))?;
    info(
        quiet,
        format!(
            "Setting tags for user \"{name}\" to [{}] ...",
            tags.join(", ")
        ),
    );
    api.call("PUT", &path, Some(&json!({"tags": tags})), &[])?;
    Ok(())
}

pub(super) fn list_users(api: &Api, quiet: bool, out: &mut impl Write) -> Result<(), Failure> {
    info(quiet, "Listing users ...".into());
    table(
        out,
        &["user", "tags"],
        &list(api.get("/api/users")?),
        |r, c| match c {
            "user" => field(r, "name"),
            _ => field(r, c),
        },
    )
}

/// `set_permissions`: the API's "vhost_or_user_not_found" said as rabbitmqctl says it.
pub(super) fn set_permissions(
    api: &Api,
    quiet: bool,
    a: &SetPermissionsArgs,
) -> Result<(), Failure> {
    let (v, user) = (&a.v, &a.user);
    info(
        quiet,
        format!(
            "Setting permissions for user \"{user}\" in vhost \"{}\" ...",
            v.vhost
        ),
    );
    let body = json!({"configure": a.configure, "write": a.write, "read": a.read});
    let path = format!("/api/permissions/{}/{}", seg(&v.vhost), seg(user));
    api.call("PUT", &path, Some(&body), &[]).map_err(|f| {
        if f.message.contains("vhost_or_user_not_found") {
            fail(format!(
                "user '{user}' or vhost '{}' does not exist",
                v.vhost
            ))
        } else {
            f
        }
    })?;
    Ok(())
}

pub(super) fn clear_permissions(
    api: &Api,
    quiet: bool,
    v: &VhostOpt,
    user: &str,
) -> Result<(), Failure> {
    info(
        quiet,
        format!(
            "Clearing permissions for user \"{user}\" in vhost \"{}\" ...",
            v.vhost
        ),
    );
    let path = format!("/api/permissions/{}/{}", seg(&v.vhost), seg(user));
    api.must(
        "DELETE",
        &path,
        None,
        format!("no permissions for user '{user}' in vhost '{}'", v.vhost),
    )?;
    Ok(())
}

/// `list_permissions`: every user's permissions in one vhost.
pub(super) fn list_permissions(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
    v: &VhostOpt,
) -> Result<(), Failure> {
    let path = format!("/api/vhosts/{}/permissions", seg(&v.vhost));
    let rows = api.must(
        "GET",
        &path,
        None,
        format!("vhost '{}' does not exist", v.vhost),
    )?;
    info(
        quiet,
        format!("Listing permissions for vhost \"{}\" ...", v.vhost),
    );
    table(
        out,
        &["user", "configure", "write", "read"],
        &list(Some(rows)),
        field,
    )
}

/// `list_user_permissions`: one user's permissions in every vhost.
pub(super) fn list_user_permissions(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
    user: &str,
) -> Result<(), Failure> {
    let path = format!("/api/users/{}/permissions", seg(user));
    let rows = api.must("GET", &path, None, format!("user '{user}' does not exist"))?;
    info(
        quiet,
        format!("Listing permissions for user \"{user}\" ..."),
    );
    table(
        out,
        &["vhost", "configure", "write", "read"],
        &list(Some(rows)),
        field,
    )
}
