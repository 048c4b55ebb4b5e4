//! Client connections, their channels and consumers: list_connections, close_connection,
//! close_all_connections, list_channels, list_consumers.

use std::io::Write;

use clap::Args;
use serde_json::{json, Value};

use super::api::{fail, seg, Api, Failure};
use super::view::{columns, erlang_term, field, info, list, table, write_failed};
use super::VhostOpt;

/// close_all_connections' arguments (its help is the doc comment on
/// `Cmd::CloseAllConnections`).
#[derive(Args)]
pub(super) struct CloseAllArgs {
    #[command(flatten)]
    v: VhostOpt,
    /// Every vhost's connections.
    #[arg(long)]
    global: bool,
    /// Close at most this many (0: all).
    #[arg(long, default_value_t = 0)]
    limit: usize,
    /// Milliseconds to wait between two closes.
    #[arg(long = "per-connection-delay", default_value_t = 0)]
    per_connection_delay: u64,
    explanation: String,
}

/// `list_connections`, from `/api/warren/connections` (which has the pids and the client
/// properties as rabbitmqctl prints them).
pub(super) fn list_connections(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
    cols: &[String],
) -> Result<(), Failure> {
    let known = [
        "pid",
        "name",
        "user",
        "vhost",
        "peer_host",
        "peer_port",
        "host",
        "port",
        "channels",
        "channel_max",
        "frame_max",
        "timeout",
        "state",
        "protocol",
        "auth_mechanism",
        "ssl",
        "connected_at",
        "client_properties",
    ];
    let cols = columns(
        cols,
        &["user", "peer_host", "peer_port", "state"],
        &known,
        "connection",
    )?;
    info(quiet, "Listing connections ...".into());
    let rows = list(api.get("/api/warren/connections")?);
    table(out, &cols, &rows, |r, c| match c {
        "client_properties" => r.get(c).map(|t| Value::String(erlang_term(t))),
        // rabbitmqctl prints the protocol version as an Erlang tuple.
        "protocol" => Some(json!("{0,9,1}")),
        _ => field(r, c),
    })
}

/// The name of the connection `id` names: its pid (`<…>`, as list_connections pid prints it)
/// or its name. None if no open connection has it.
fn connection_name(api: &Api, id: &str) -> Result<Option<String>, Failure> {
    if !id.starts_with('<') {
        return Ok(Some(id.to_string()));
    }
    Ok(list(api.get("/api/warren/connections")?)
        .iter()
        .find(|c| c.get("pid").and_then(Value::as_str) == Some(id))
        .and_then(|c| c.get("name").and_then(Value::as_str).map(String::from)))
}

/// `close_connection`: the explanation travels in the `x-reason` header, as the API takes it.
pub(super) fn close_connection(
    api: &Api,
    quiet: bool,
    connection: &str,
    explanation: &str,
) -> Result<(), Failure> {
    info(
        quiet,
        format!("Closing connection {connection}, reason: {explanation}..."),
    );
    let name = connection_name(api, connection)?
        .ok_or_else(|| fail(format!("connection '{connection}' does not exist")))?;
    api.call(
        "DELETE",
        &format!("/api/connections/{}", seg(&name)),
        None,
        &[("x-reason", explanation)],
    )?
    .ok_or_else(|| fail(format!("connection '{connection}' does not exist")))?;
    Ok(())
}

/// `close_all_connections`' banner, which names the node when every vhost's are closed.
fn close_all_banner(api: &Api, a: &CloseAllArgs) -> Result<String, Failure> {
    let explanation = &a.explanation;
    Ok(match (a.global, a.limit) {
        (true, _) => format!(
            "Closing all connections to node {} (across all vhosts), reason: {explanation}...",
            api.node_name()?
        ),
        (false, 0) => format!(
            "Closing all connections in vhost {}, reason: {explanation}...",
            a.v.vhost
        ),
        (false, n) => format!(
            "Closing {n} connections in vhost {}, reason: {explanation}...",
            a.v.vhost
        ),
    })
}

/// `close_all_connections`: one DELETE per connection; prints how many it closed.
pub(super) fn close_all_connections(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
    a: &CloseAllArgs,
) -> Result<(), Failure> {
    info(quiet, close_all_banner(api, a)?);
    let mut names: Vec<String> = list(api.get("/api/connections")?)
        .iter()
        .filter(|c| a.global || c.get("vhost").and_then(Value::as_str) == Some(&a.v.vhost))
        .filter_map(|c| c.get("name").and_then(Value::as_str).map(String::from))
        .collect();
    if !a.global && a.limit > 0 {
        names.truncate(a.limit);
    }
    let mut closed = 0;
    for (i, name) in names.iter().enumerate() {
        if i > 0 && a.per_connection_delay > 0 {
            std::thread::sleep(std::time::Duration::from_millis(a.per_connection_delay));
        }
        let path = format!("/api/connections/{}", seg(name));
        // Gone meanwhile (closed by its client): nothing left to close.
        if api
            .call("DELETE", &path, None, &[("x-reason", &a.explanation)])?
            .is_some()
        {
            closed += 1;
        }
    }
    writeln!(out, "Closed {closed} connections").map_err(write_failed)
}

pub(super) fn list_channels(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
    cols: &[String],
) -> Result<(), Failure> {
    let known = [
        "pid",
        "connection",
        "name",
        "number",
        "user",
        "vhost",
        "consumer_count",
        "messages_unacknowledged",
        "prefetch_count",
        "global_prefetch_count",
        "confirm",
        "transactional",
    ];
    let cols = columns(
        cols,
        &["pid", "user", "consumer_count", "messages_unacknowledged"],
        &known,
        "channel",
    )?;
    info(quiet, "Listing channels ...".into());
    table(out, &cols, &list(api.get("/api/warren/channels")?), field)
}

/// `list_consumers`: every consumer from `/api/warren/consumers`, those of the vhost kept.
pub(super) fn list_consumers(
    api: &Api,
    quiet: bool,
    out: &mut impl Write,
    v: &VhostOpt,
    cols: &[String],
) -> Result<(), Failure> {
    let known = [
        "queue_name",
        "channel_pid",
        "consumer_tag",
        "ack_required",
        "prefetch_count",
        "active",
        "activity_status",
        "arguments",
    ];
    let default = [
        "queue_name",
        "channel_pid",
        "consumer_tag",
        "ack_required",
        "prefetch_count",
        "active",
        "arguments",
    ];
    let cols = columns(cols, &default, &known, "consumer")?;
    if api
        .get(&format!("/api/vhosts/{}", seg(&v.vhost)))?
        .is_none()
    {
        return Err(fail(format!("vhost '{}' does not exist", v.vhost)));
    }
    info(quiet, format!("Listing consumers in vhost {} ...", v.vhost));
    let rows: Vec<Value> = list(api.get("/api/warren/consumers")?)
        .into_iter()
        .filter(|c| c.get("vhost").and_then(Value::as_str) == Some(&v.vhost))
        .collect();
    table(out, &cols, &rows, |r, c| match c {
        "arguments" => r.get(c).map(|t| Value::String(erlang_term(t))),
        _ => field(r, c),
    })
}
