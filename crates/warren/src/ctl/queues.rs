//! A vhost's queues, exchanges and bindings: list_queues, list_exchanges, list_bindings,
//! purge_queue, delete_queue.

use std::io::Write;

use clap::Args;
use serde_json::json;

use super::api::{seg, Api, Failure};
use super::view::{columns, field, info, list, table};
use super::VhostOpt;

// Not a doc comment: clap would show it as delete_queue's help, which has none.
#[derive(Args)]
pub(super) struct DeleteQueueArgs {
    #[command(flatten)]
    v: VhostOpt,
    name: String,
    #[arg(long = "if-unused")]
    if_unused: bool,
    #[arg(long = "if-empty")]
    if_empty: bool,
}

pub(super) fn list_queues(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
    v: &VhostOpt,
    cols: &[String],
) -> Result<(), Failure> {
    let known = [
        "name",
        "messages",
        "messages_ready",
        "messages_unacknowledged",
        "consumers",
        "durable",
        "auto_delete",
        "exclusive",
        "arguments",
        "policy",
        "state",
        "type",
        "vhost",
    ];
    let cols = columns(cols, &["name", "messages"], &known, "queue")?;
    let rows = api.must(
        "GET",
        &format!("/api/queues/{}", seg(&v.vhost)),
        None,
        format!("vhost '{}' does not exist", v.vhost),
    )?;
    info(quiet, format!("Listing queues for vhost {} ...", v.vhost));
    table(out, &cols, &list(Some(rows)), field)
}

pub(super) fn list_exchanges(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
    v: &VhostOpt,
    cols: &[String],
) -> Result<(), Failure> {
    let known = [
        "name",
        "type",
        "durable",
        "auto_delete",
        "internal",
        "arguments",
        "vhost",
    ];
    let cols = columns(cols, &["name", "type"], &known, "exchange")?;
    let rows = api.must(
        "GET",
        &format!("/api/exchanges/{}", seg(&v.vhost)),
        None,
        format!("vhost '{}' does not exist", v.vhost),
    )?;
    info(
        quiet,
        format!("Listing exchanges for vhost {} ...", v.vhost),
    );
    table(out, &cols, &list(Some(rows)), field)
}

/// `list_bindings`: the API's source/destination fields under rabbitmqctl's column names.
pub(super) fn list_bindings(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
    v: &VhostOpt,
    cols: &[String],
) -> Result<(), Failure> {
    let known = [
        "source_name",
        "source_kind",
        "destination_name",
        "destination_kind",
        "routing_key",
        "arguments",
        "vhost",
    ];
    let cols = columns(cols, &known[..6], &known, "binding")?;
    let rows = api.must(
        "GET",
        &format!("/api/bindings/{}", seg(&v.vhost)),
        None,
        format!("vhost '{}' does not exist", v.vhost),
    )?;
    info(quiet, format!("Listing bindings for vhost {}...", v.vhost));
    table(out, &cols, &list(Some(rows)), |r, c| match c {
        "source_name" => field(r, "source"),
        "source_kind" => Some(json!("exchange")),
        "destination_name" => field(r, "destination"),
        "destination_kind" => field(r, "destination_type"),
        _ => field(r, c),
    })
}

pub(super) fn purge_queue(api: &Api, quiet: bool, v: &VhostOpt, name: &str) -> Result<(), Failure> {
    info(
        quiet,
        format!("Purging queue '{name}' in vhost '{}' ...", v.vhost),
    );
    let path = format!("/api/queues/{}/{}/contents", seg(&v.vhost), seg(name));
    api.must(
        "DELETE",
        &path,
        None,
        format!("queue '{name}' in vhost '{}' does not exist", v.vhost),
    )?;
    Ok(())
}

pub(super) fn delete_queue(api: &Api, quiet: bool, a: &DeleteQueueArgs) -> Result<(), Failure> {
    let DeleteQueueArgs {
        v,
        name,
        if_unused,
        if_empty,
    } = a;
    info(
        quiet,
        format!("Deleting queue '{name}' on vhost '{}' ...", v.vhost),
    );
    let path = format!(
        "/api/queues/{}/{}?if-unused={if_unused}&if-empty={if_empty}",
        seg(&v.vhost),
        seg(name)
    );
    api.must(
        "DELETE",
        &path,
        None,
        format!("queue '{name}' in vhost '{}' does not exist", v.vhost),
    )?;
    Ok(())
}
