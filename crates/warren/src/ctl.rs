//! `warren ctl`: rabbitmqctl's everyday commands, run against a live broker through its HTTP
//! management API. Listings print a tab-separated header line, then one row per item, as
//! rabbitmqctl does (its "Listing … " banner goes to stderr, so stdout stays parseable).
//! Exit status: 0 on success, 1 when the broker refused (unknown name, bad value), 69 when the
//! broker cannot be reached, 2 on bad usage.

use std::io::Write;

use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};

#[derive(Parser)]
pub struct CtlArgs {
    /// Management API base URL [default: http://localhost:15672].
    #[arg(long, value_name = "URL", global = true, conflicts_with = "node")]
    url: Option<String>,
    /// Broker host[:port] of the management API (port 15672 unless given).
    #[arg(long, short = 'n', value_name = "HOST[:PORT]", global = true)]
    node: Option<String>,
    #[arg(long, short = 'u', default_value = "guest", global = true)]
    username: String,
    #[arg(long, default_value = "guest", global = true)]
    password: String,
    /// Don't print the informational "Listing …" lines.
    #[arg(long, short = 'q', global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Args)]
struct VhostOpt {
    /// Virtual host.
    #[arg(short = 'p', long = "vhost", default_value = "/")]
    vhost: String,
}

#[derive(Subcommand)]
#[command(rename_all = "snake_case")]
enum Cmd {
    /// Creates a user (no tags, no permissions).
    AddUser {
        name: String,
        #[arg(id = "user_password", value_name = "PASSWORD")]
        password: String,
    },
    ChangePassword {
        name: String,
        #[arg(id = "user_password", value_name = "PASSWORD")]
        password: String,
    },
    DeleteUser {
        name: String,
    },
    /// Replaces a user's tags (none given: clears them).
    SetUserTags {
        name: String,
        tags: Vec<String>,
    },
    ListUsers,
    SetPermissions {
        #[command(flatten)]
        v: VhostOpt,
        user: String,
        configure: String,
        write: String,
        read: String,
    },
    ClearPermissions {
        #[command(flatten)]
        v: VhostOpt,
        user: String,
    },
    /// Permissions in a vhost.
    ListPermissions {
        #[command(flatten)]
        v: VhostOpt,
    },
    /// A user's permissions in every vhost.
    ListUserPermissions {
        user: String,
    },
    AddVhost {
        name: String,
    },
    DeleteVhost {
        name: String,
    },
    ListVhosts {
        columns: Vec<String>,
    },
    /// Columns: name messages messages_ready messages_unacknowledged consumers durable
    /// auto_delete exclusive arguments policy state type vhost [default: name messages].
    ListQueues {
        #[command(flatten)]
        v: VhostOpt,
        columns: Vec<String>,
    },
    /// Columns: name type durable auto_delete internal arguments vhost [default: name type].
    ListExchanges {
        #[command(flatten)]
        v: VhostOpt,
        columns: Vec<String>,
    },
    /// Columns: source_name source_kind destination_name destination_kind routing_key
    /// arguments vhost [default: all but vhost].
    ListBindings {
        #[command(flatten)]
        v: VhostOpt,
        columns: Vec<String>,
    },
    /// Columns: name user vhost peer_host peer_port host port channels state protocol
    /// connected_at [default: user peer_host peer_port state].
    ListConnections {
        columns: Vec<String>,
    },
    /// Closes a connection (by the name list_connections name shows) with 320 and a reason.
    CloseConnection {
        name: String,
        explanation: String,
    },
    PurgeQueue {
        #[command(flatten)]
        v: VhostOpt,
        name: String,
    },
    DeleteQueue {
        #[command(flatten)]
        v: VhostOpt,
        name: String,
        #[arg(long = "if-unused")]
        if_unused: bool,
        #[arg(long = "if-empty")]
        if_empty: bool,
    },
    /// DEFINITION is a JSON object, e.g. '{"max-length":10}'.
    SetPolicy {
        #[command(flatten)]
        v: VhostOpt,
        #[arg(long, default_value_t = 0)]
        priority: i64,
        #[arg(long = "apply-to", default_value = "all")]
        apply_to: String,
        name: String,
        pattern: String,
        definition: String,
    },
    ClearPolicy {
        #[command(flatten)]
        v: VhostOpt,
        name: String,
    },
    ListPolicies {
        #[command(flatten)]
        v: VhostOpt,
    },
    /// Replaces a vhost's limits; DEFINITION is a JSON object, e.g.
    /// '{"max-connections": 10, "max-queues": 5}' (negative: no limit).
    SetVhostLimits {
        #[command(flatten)]
        v: VhostOpt,
        definition: String,
    },
    ClearVhostLimits {
        #[command(flatten)]
        v: VhostOpt,
    },
    /// A vhost's limits as JSON; with --global, every vhost's.
    ListVhostLimits {
        #[command(flatten)]
        v: VhostOpt,
        #[arg(long)]
        global: bool,
    },
    /// Sets limits on a user (merged with those set); DEFINITION is a JSON object, e.g.
    /// '{"max-connections": 2, "max-channels": 5}' (negative: no limit).
    SetUserLimits {
        user: String,
        definition: String,
    },
    /// Clears one limit of a user (max-connections, max-channels), or all of them ("all").
    ClearUserLimits {
        user: String,
        limit: String,
    },
    /// A user's limits as JSON; with --global, every user's.
    ListUserLimits {
        #[arg(long, default_value = "guest")]
        user: String,
        #[arg(long)]
        global: bool,
    },
    /// Writes all definitions (RabbitMQ's JSON format) to FILE ("-" for stdout).
    ExportDefinitions {
        file: String,
    },
    /// Imports definitions (RabbitMQ's JSON format) from FILE ("-" for stdin).
    ImportDefinitions {
        file: String,
    },
}

/// Why a command failed, and the exit status that says so.
struct Failure {
    code: u8,
    message: String,
}

fn fail(message: impl Into<String>) -> Failure {
    Failure {
        code: 1,
        message: message.into(),
    }
}

struct Api {
    base: String,
    auth: String,
}

/// Percent-encodes one path segment (vhost `/` becomes `%2F`).
fn seg(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Api {
    /// Sends a request; `Ok(None)` is a 404.
    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Result<Option<Value>, Failure> {
        let url = format!("{}{path}", self.base);
        let mut req = ureq::request(method, &url)
            .set("authorization", &self.auth)
            .timeout(std::time::Duration::from_secs(30));
        for (k, v) in headers {
            req = req.set(k, v);
        }
        let r = match body {
            Some(b) => req
                .set("content-type", "application/json")
                .send_string(&b.to_string()),
            None => req.call(),
        };
        match r {
            Ok(resp) => {
                let text = resp
                    .into_string()
                    .map_err(|e| fail(format!("reading the reply: {e}")))?;
                if text.trim().is_empty() {
                    return Ok(Some(Value::Null));
                }
                serde_json::from_str(&text)
                    .map(Some)
                    .map_err(|e| fail(format!("the broker's reply is not JSON: {e}")))
            }
            Err(ureq::Error::Status(404, _)) => Ok(None),
            Err(ureq::Error::Status(code, resp)) => {
                let text = resp.into_string().unwrap_or_default();
                let reason = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| v.get("reason").cloned())
                    .map(|r| match r {
                        Value::String(s) => s,
                        other => other.to_string(),
                    })
                    .unwrap_or(text);
                Err(fail(match code {
                    401 => format!("access refused by the broker ({}): {reason}", self.base),
                    _ => format!("{reason} (HTTP {code})"),
                }))
            }
            Err(e) => Err(Failure {
                code: 69,
                message: format!(
                    "unable to reach the broker's management API at {}: {e}",
                    self.base
                ),
            }),
        }
    }

    fn get(&self, path: &str) -> Result<Option<Value>, Failure> {
        self.call("GET", path, None, &[])
    }

    fn must(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        missing: String,
    ) -> Result<Value, Failure> {
        self.call(method, path, body, &[])?
            .ok_or_else(|| fail(missing))
    }
}

pub fn main(args: CtlArgs) -> u8 {
    let base = match (&args.url, &args.node) {
        (Some(u), _) => u.trim_end_matches('/').to_string(),
        (None, Some(n)) if n.contains(':') => format!("http://{n}"),
        (None, Some(n)) => format!("http://{n}:15672"),
        (None, None) => "http://localhost:15672".to_string(),
    };
    use base64_lite::encode;
    let api = Api {
        base,
        auth: format!(
            "Basic {}",
            encode(format!("{}:{}", args.username, args.password).as_bytes())
        ),
    };
    let mut out = std::io::stdout().lock();
    match run(&api, args.command, args.quiet, &mut out) {
        Ok(()) => 0,
        Err(f) => {
            let _ = out.flush();
            eprintln!("Error: {}", f.message);
            f.code
        }
    }
}

fn info(quiet: bool, s: String) {
    if !quiet {
        eprintln!("{s}");
    }
}

/// A JSON value as rabbitmqctl prints it in a table cell.
fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
            let items: Vec<&str> = a.iter().filter_map(Value::as_str).collect();
            format!("[{}]", items.join(", "))
        }
        Some(Value::Object(o)) if o.is_empty() => "[]".into(),
        Some(other) => other.to_string(),
    }
}

fn table(
    out: &mut impl Write,
    columns: &[&str],
    rows: &[Value],
    lookup: impl Fn(&Value, &str) -> Option<Value>,
) -> Result<(), Failure> {
    let io = |e: std::io::Error| fail(format!("writing output: {e}"));
    writeln!(out, "{}", columns.join("\t")).map_err(io)?;
    for r in rows {
        let cells: Vec<String> = columns
            .iter()
            .map(|c| cell(lookup(r, c).as_ref()))
            .collect();
        writeln!(out, "{}", cells.join("\t")).map_err(io)?;
    }
    Ok(())
}

fn columns<'a>(
    given: &'a [String],
    default: &[&'a str],
    known: &[&str],
    what: &str,
) -> Result<Vec<&'a str>, Failure> {
    let cols: Vec<&str> = if given.is_empty() {
        default.to_vec()
    } else {
        given.iter().map(String::as_str).collect()
    };
    for c in &cols {
        if !known.contains(c) {
            return Err(fail(format!(
                "unknown {what} column '{c}'; known: {}",
                known.join(", ")
            )));
        }
    }
    Ok(cols)
}

fn list(v: Option<Value>) -> Vec<Value> {
    match v {
        Some(Value::Array(a)) => a,
        _ => Vec::new(),
    }
}

fn field(r: &Value, c: &str) -> Option<Value> {
    r.get(c).cloned()
}

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
                writeln!(out, "{l}").map_err(|e| fail(format!("writing output: {e}")))?;
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

fn run(api: &Api, cmd: Cmd, quiet: bool, out: &mut impl Write) -> Result<(), Failure> {
    match cmd {
        Cmd::AddUser { name, password } => {
            if api.get(&format!("/api/users/{}", seg(&name)))?.is_some() {
                return Err(fail(format!("user '{name}' already exists")));
            }
            info(quiet, format!("Adding user \"{name}\" ..."));
            api.call(
                "PUT",
                &format!("/api/users/{}", seg(&name)),
                Some(&json!({"password": password, "tags": ""})),
                &[],
            )?;
        }
        Cmd::ChangePassword { name, password } => {
            let path = format!("/api/users/{}", seg(&name));
            let u = api.must("GET", &path, None, format!("user '{name}' does not exist"))?;
            info(quiet, format!("Changing password for user \"{name}\" ..."));
            let tags = u.get("tags").cloned().unwrap_or(json!([]));
            api.call(
                "PUT",
                &path,
                Some(&json!({"password": password, "tags": tags})),
                &[],
            )?;
        }
        Cmd::DeleteUser { name } => {
            info(quiet, format!("Deleting user \"{name}\" ..."));
            api.must(
                "DELETE",
                &format!("/api/users/{}", seg(&name)),
                None,
                format!("user '{name}' does not exist"),
            )?;
        }
        Cmd::SetUserTags { name, tags } => {
            let path = format!("/api/users/{}", seg(&name));
            api.must("GET", &path, None, format!("user '{name}' does not exist"))?;
            info(
                quiet,
                format!(
                    "Setting tags for user \"{name}\" to [{}] ...",
                    tags.join(", ")
                ),
            );
            api.call("PUT", &path, Some(&json!({"tags": tags})), &[])?;
        }
        Cmd::ListUsers => {
            info(quiet, "Listing users ...".into());
            table(
                out,
                &["user", "tags"],
                &list(api.get("/api/users")?),
                |r, c| match c {
                    "user" => field(r, "name"),
                    _ => field(r, c),
                },
            )?;
        }
        Cmd::SetPermissions {
            v,
            user,
            configure,
            write,
            read,
        } => {
            info(
                quiet,
                format!(
                    "Setting permissions for user \"{user}\" in vhost \"{}\" ...",
                    v.vhost
                ),
            );
            let body = json!({"configure": configure, "write": write, "read": read});
            let path = format!("/api/permissions/{}/{}", seg(&v.vhost), seg(&user));
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
        }
        Cmd::ClearPermissions { v, user } => {
            info(
                quiet,
                format!(
                    "Clearing permissions for user \"{user}\" in vhost \"{}\" ...",
                    v.vhost
                ),
            );
            let path = format!("/api/permissions/{}/{}", seg(&v.vhost), seg(&user));
            api.must(
                "DELETE",
                &path,
                None,
                format!("no permissions for user '{user}' in vhost '{}'", v.vhost),
            )?;
        }
        Cmd::ListPermissions { v } => {
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
            )?;
        }
        Cmd::ListUserPermissions { user } => {
            let path = format!("/api/users/{}/permissions", seg(&user));
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
            )?;
        }
        Cmd::AddVhost { name } => {
            if api.get(&format!("/api/vhosts/{}", seg(&name)))?.is_some() {
                return Err(fail(format!("vhost '{name}' already exists")));
            }
            info(quiet, format!("Adding vhost \"{name}\" ..."));
            api.call(
                "PUT",
                &format!("/api/vhosts/{}", seg(&name)),
                Some(&json!({})),
                &[],
            )?;
        }
        Cmd::DeleteVhost { name } => {
            info(quiet, format!("Deleting vhost \"{name}\" ..."));
            api.must(
                "DELETE",
                &format!("/api/vhosts/{}", seg(&name)),
                None,
                format!("vhost '{name}' does not exist"),
            )?;
        }
        Cmd::ListVhosts { columns: cols } => {
            let cols = columns(
                &cols,
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
            table(out, &cols, &list(api.get("/api/vhosts")?), field)?;
        }
        Cmd::ListQueues { v, columns: cols } => {
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
            let cols = columns(&cols, &["name", "messages"], &known, "queue")?;
            let rows = api.must(
                "GET",
                &format!("/api/queues/{}", seg(&v.vhost)),
                None,
                format!("vhost '{}' does not exist", v.vhost),
            )?;
            info(quiet, format!("Listing queues for vhost {} ...", v.vhost));
            table(out, &cols, &list(Some(rows)), field)?;
        }
        Cmd::ListExchanges { v, columns: cols } => {
            let known = [
                "name",
                "type",
                "durable",
                "auto_delete",
                "internal",
                "arguments",
                "vhost",
            ];
            let cols = columns(&cols, &["name", "type"], &known, "exchange")?;
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
            table(out, &cols, &list(Some(rows)), field)?;
        }
        Cmd::ListBindings { v, columns: cols } => {
            let known = [
                "source_name",
                "source_kind",
                "destination_name",
                "destination_kind",
                "routing_key",
                "arguments",
                "vhost",
            ];
            let cols = columns(&cols, &known[..6], &known, "binding")?;
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
            })?;
        }
        Cmd::ListConnections { columns: cols } => {
            let known = [
                "name",
                "user",
                "vhost",
                "peer_host",
                "peer_port",
                "host",
                "port",
                "channels",
                "state",
                "protocol",
                "connected_at",
            ];
            let cols = columns(
                &cols,
                &["user", "peer_host", "peer_port", "state"],
                &known,
                "connection",
            )?;
            info(quiet, "Listing connections ...".into());
            table(out, &cols, &list(api.get("/api/connections")?), field)?;
        }
        Cmd::CloseConnection { name, explanation } => {
            info(
                quiet,
                format!("Closing connection {name}, reason: {explanation}..."),
            );
            api.call(
                "DELETE",
                &format!("/api/connections/{}", seg(&name)),
                None,
                &[("x-reason", &explanation)],
            )?
            .ok_or_else(|| fail(format!("connection '{name}' does not exist")))?;
        }
        Cmd::PurgeQueue { v, name } => {
            info(
                quiet,
                format!("Purging queue '{name}' in vhost '{}' ...", v.vhost),
            );
            let path = format!("/api/queues/{}/{}/contents", seg(&v.vhost), seg(&name));
            api.must(
                "DELETE",
                &path,
                None,
                format!("queue '{name}' in vhost '{}' does not exist", v.vhost),
            )?;
        }
        Cmd::DeleteQueue {
            v,
            name,
            if_unused,
            if_empty,
        } => {
            info(
                quiet,
                format!("Deleting queue '{name}' on vhost '{}' ...", v.vhost),
            );
            let path = format!(
                "/api/queues/{}/{}?if-unused={if_unused}&if-empty={if_empty}",
                seg(&v.vhost),
                seg(&name)
            );
            api.must(
                "DELETE",
                &path,
                None,
                format!("queue '{name}' in vhost '{}' does not exist", v.vhost),
            )?;
        }
        Cmd::SetPolicy {
            v,
            priority,
            apply_to,
            name,
            pattern,
            definition,
        } => {
            let def: Value = serde_json::from_str(&definition)
                .map_err(|e| fail(format!("the policy definition is not valid JSON: {e}")))?;
            info(quiet, format!("Setting policy \"{name}\" for pattern \"{pattern}\" to \"{definition}\" with priority \"{priority}\" for vhost \"{}\" ...", v.vhost));
            let body = json!({"pattern": pattern, "definition": def, "priority": priority, "apply-to": apply_to});
            let path = format!("/api/policies/{}/{}", seg(&v.vhost), seg(&name));
            api.must(
                "PUT",
                &path,
                Some(&body),
                format!("vhost '{}' does not exist", v.vhost),
            )?;
        }
        Cmd::ClearPolicy { v, name } => {
            info(
                quiet,
                format!("Clearing policy \"{name}\" on vhost \"{}\" ...", v.vhost),
            );
            let path = format!("/api/policies/{}/{}", seg(&v.vhost), seg(&name));
            api.must(
                "DELETE",
                &path,
                None,
                format!("policy '{name}' in vhost '{}' does not exist", v.vhost),
            )?;
        }
        Cmd::ListPolicies { v } => {
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
            )?;
        }
        Cmd::SetVhostLimits { v, definition } => {
            info(
                quiet,
                format!(
                    "Setting vhost limits to \"{definition}\" for vhost \"{}\" ...",
                    v.vhost
                ),
            );
            let old = limit_names(&limits_of(api, "vhost-limits", &v.vhost, "vhost")?);
            let set = put_limits(api, "vhost-limits", &v.vhost, &definition, "vhost")?;
            // rabbitmqctl replaces the whole definition: what it does not name is cleared.
            for l in old.iter().filter(|l| !set.contains(l)) {
                delete_limit(api, "vhost-limits", &v.vhost, l, "vhost")?;
            }
        }
        Cmd::ClearVhostLimits { v } => {
            info(quiet, format!("Clearing vhost \"{}\" limits ...", v.vhost));
            for l in limit_names(&limits_of(api, "vhost-limits", &v.vhost, "vhost")?) {
                delete_limit(api, "vhost-limits", &v.vhost, &l, "vhost")?;
            }
        }
        Cmd::ListVhostLimits { v, global } => {
            if global {
                info(quiet, "Listing limits for all vhosts ...".into());
                list_limits(api, out, "vhost-limits", "vhost", None)?;
            } else {
                info(
                    quiet,
                    format!("Listing limits for vhost \"{}\" ...", v.vhost),
                );
                list_limits(api, out, "vhost-limits", "vhost", Some(&v.vhost))?;
            }
        }
        Cmd::SetUserLimits { user, definition } => {
            info(
                quiet,
                format!("Setting user limits to \"{definition}\" for user \"{user}\" ..."),
            );
            put_limits(api, "user-limits", &user, &definition, "user")?;
        }
        Cmd::ClearUserLimits { user, limit } => {
            info(
                quiet,
                if limit == "all" {
                    format!("Clearing all limits for user \"{user}\" ...")
                } else {
                    format!("Clearing \"{limit}\" limit for user \"{user}\" ...")
                },
            );
            delete_limit(api, "user-limits", &user, &limit, "user")?;
        }
        Cmd::ListUserLimits { user, global } => {
            if global {
                info(quiet, "Listing limits for all users ...".into());
                list_limits(api, out, "user-limits", "user", None)?;
            } else {
                info(quiet, format!("Listing limits for user \"{user}\" ..."));
                list_limits(api, out, "user-limits", "user", Some(&user))?;
            }
        }
        Cmd::ExportDefinitions { file } => {
            let defs = api.must(
                "GET",
                "/api/definitions",
                None,
                "the broker has no definitions endpoint".into(),
            )?;
            let text = serde_json::to_string_pretty(&defs).map_err(|e| fail(e.to_string()))?;
            if file == "-" {
                writeln!(out, "{text}").map_err(|e| fail(format!("writing output: {e}")))?;
            } else {
                std::fs::write(&file, text + "\n")
                    .map_err(|e| fail(format!("cannot write {file}: {e}")))?;
                info(quiet, format!("Exported definitions to \"{file}\""));
            }
        }
        Cmd::ImportDefinitions { file } => {
            let text = if file == "-" {
                std::io::read_to_string(std::io::stdin())
                    .map_err(|e| fail(format!("reading stdin: {e}")))?
            } else {
                std::fs::read_to_string(&file)
                    .map_err(|e| fail(format!("cannot read {file}: {e}")))?
            };
            let defs: Value = serde_json::from_str(&text)
                .map_err(|e| fail(format!("{file} is not valid JSON: {e}")))?;
            info(quiet, format!("Importing definitions from \"{file}\" ..."));
            api.call("POST", "/api/definitions", Some(&defs), &[])?;
        }
    }
    Ok(())
}

/// Standard base64 for the basic-auth header (the one place the binary needs it).
mod base64_lite {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(input: &[u8]) -> String {
        let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
        for chunk in input.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    #[cfg(test)]
    #[test]
    fn known_values() {
        assert_eq!(encode(b"guest:guest"), "Z3Vlc3Q6Z3Vlc3Q=");
        assert_eq!(encode(b"a"), "YQ==");
        assert_eq!(encode(b"ab"), "YWI=");
    }
}
