//! `warren ctl`: rabbitmqctl's everyday commands, run against a live broker through its HTTP
//! management API (RabbitMQ's URLs, plus `/api/warren/…` for what only rabbitmqctl does:
//! pids, stop_app/start_app, status, environment, the memory watermark). Listings print a
//! tab-separated header line, then one row per item, as rabbitmqctl does (its "Listing … "
//! banner goes to stderr, so stdout stays parseable); values are printed as rabbitmqctl prints
//! them (pids `<node.1.N.0>`, client properties as Erlang terms, protocol `{0,9,1}`).
//! Exit status: 0 on success, 1 when the broker refused (unknown name, bad value), 65 for an
//! argument rabbitmqctl also rejects (a watermark out of range), 69 when the broker cannot be
//! reached, 2 on bad usage.

use std::io::Write;

use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};

#[derive(Parser)]
pub struct CtlArgs {
    /// Management API base URL [default: http://localhost:15672].
    #[arg(long, value_name = "URL", global = true)]
    url: Option<String>,
    /// HOST[:PORT] of the management API (port 15672 unless given). A value with '@' is an
    /// Erlang node name, as scripts pass to rabbitmqctl (`-n rabbit@myhost`): accepted and
    /// ignored, the API is then --url's or the default.
    #[arg(long, short = 'n', value_name = "HOST[:PORT]|NODE@HOST", global = true)]
    node: Option<String>,
    #[arg(long, short = 'u', default_value = "guest", global = true)]
    username: String,
    #[arg(long, default_value = "guest", global = true)]
    password: String,
    /// Don't print the informational "Listing …" lines.
    #[arg(long, short = 'q', global = true)]
    quiet: bool,
    /// As --quiet, and listings without their header line (rabbitmqctl's -s).
    #[arg(long, short = 's', global = true)]
    silent: bool,
    /// Listings without their header line.
    #[arg(long = "no-table-headers", global = true)]
    no_table_headers: bool,
    /// Seconds to wait for the broker's answer [default: 45, since stop_app and start_app
    /// wait up to 30 s for the listeners on the broker's side].
    #[arg(long, short = 't', value_name = "SECONDS", global = true)]
    timeout: Option<u64>,
    /// rabbitmqctl's long node names: accepted and ignored.
    #[arg(long, short = 'l', global = true)]
    longnames: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Args)]
struct VhostOpt {
    /// Virtual host.
    #[arg(short = 'p', long = "vhost", default_value = "/")]
    vhost: String,
}

/// A quorum queue and a node (add_member, delete_member).
#[derive(Args)]
struct MemberOpt {
    #[command(flatten)]
    v: VhostOpt,
    #[arg(value_name = "QUEUE")]
    queue: String,
    #[arg(value_name = "NODE")]
    node: String,
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
    /// Columns: pid name user vhost peer_host peer_port host port channels channel_max
    /// frame_max timeout state protocol auth_mechanism ssl connected_at client_properties
    /// [default: user peer_host peer_port state].
    ListConnections {
        columns: Vec<String>,
    },
    /// Closes a connection, named by its pid or its name (as list_connections shows them),
    /// with 320 CONNECTION_FORCED and the explanation as its reason.
    CloseConnection {
        #[arg(value_name = "PID|NAME")]
        connection: String,
        explanation: String,
    },
    /// Closes every connection of a vhost (or, with --global, of the node) with 320.
    CloseAllConnections {
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
    },
    /// Columns: pid connection name number user vhost consumer_count messages_unacknowledged
    /// prefetch_count global_prefetch_count confirm transactional
    /// [default: pid user consumer_count messages_unacknowledged].
    ListChannels {
        columns: Vec<String>,
    },
    /// Columns: queue_name channel_pid consumer_tag ack_required prefetch_count active
    /// activity_status arguments [default: all but activity_status].
    ListConsumers {
        #[command(flatten)]
        v: VhostOpt,
        columns: Vec<String>,
    },
    /// Stops serving AMQP (every connection gets 320, new ones are refused) without stopping
    /// the process; queues, messages and definitions stay, the HTTP API keeps answering.
    StopApp,
    /// Serves AMQP again on the same listeners, after stop_app.
    StartApp,
    /// The node's runtime, alarms, memory, disk, totals and listeners.
    Status,
    /// The cluster's members, which of them run, and the metadata (Raft) leader.
    ClusterStatus,
    /// Makes this node (its app stopped with stop_app, alone in its cluster) a member of the
    /// cluster that the node at ADDR (its inter-node link address, HOST:PORT) belongs to. As
    /// with RabbitMQ, joining resets the node: its own definitions and messages are dropped.
    JoinCluster {
        #[arg(value_name = "ADDR")]
        target: String,
    },
    /// Removes NODE (a node name) from the cluster; run it on another member.
    ForgetClusterNode {
        #[arg(value_name = "NODE")]
        member: String,
    },
    /// Adds NODE to a quorum queue's members (rabbitmq-queues add_member).
    AddMember(MemberOpt),
    /// Removes NODE from a quorum queue's members (rabbitmq-queues delete_member).
    DeleteMember(MemberOpt),
    /// Adds NODE to every quorum queue (`all`), or to those with an even number of members
    /// (`even`), as rabbitmq-queues grow.
    Grow {
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
    },
    /// Removes NODE from every quorum queue it is a member of (rabbitmq-queues shrink).
    Shrink {
        #[arg(value_name = "NODE")]
        node: String,
    },
    /// The settings in force, as Erlang terms under RabbitMQ's names where it has them.
    Environment,
    /// The memory alarm's threshold, in force at once: a FRACTION of RAM (0.0 to 1.0), or
    /// `absolute BYTES` (units k kiB M MiB G GiB = powers of 1024, kB MB GB = of 1000).
    #[command(name = "set_vm_memory_high_watermark")]
    SetVmMemoryHighWatermark {
        #[arg(
            value_name = "FRACTION | absolute BYTES",
            num_args = 1..=2,
            required = true,
            allow_hyphen_values = true
        )]
        args: Vec<String>,
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
    timeout: std::time::Duration,
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
            .timeout(self.timeout);
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
    // A node name (rabbit@host) is how scripts address rabbitmqctl; Warren's ctl reaches the
    // broker over HTTP, so it names nothing here.
    let api_host = args.node.as_deref().filter(|n| !n.contains('@'));
    let base = match (&args.url, api_host) {
        (Some(_), Some(_)) => {
            eprintln!("Error: --url and --node HOST[:PORT] both name the management API; give one");
            return 2;
        }
        (Some(u), None) => u.trim_end_matches('/').to_string(),
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
        // stop_app waits for connections to close, start_app for listeners: up to 30 s each
        // on the broker's side, so the default leaves room for that.
        timeout: std::time::Duration::from_secs(args.timeout.unwrap_or(45).max(1)),
    };
    let _ = args.longnames;
    let view = View {
        quiet: args.quiet || args.silent,
        headers: !(args.silent || args.no_table_headers),
    };
    let mut out = std::io::stdout().lock();
    match run(&api, args.command, view, &mut out) {
        Ok(()) => 0,
        Err(f) => {
            let _ = out.flush();
            if f.code == 65 {
                eprintln!("Error (argument validation): {}", f.message);
            } else {
                eprintln!("Error: {}", f.message);
            }
            f.code
        }
    }
}

/// What the global output flags ask for.
#[derive(Clone, Copy)]
struct View {
    /// No informational banner lines.
    quiet: bool,
    /// Listings start with their header line.
    headers: bool,
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

/// Whether listings print their header line (-s and --no-table-headers drop it).
static HEADERS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

fn table(
    out: &mut impl Write,
    columns: &[&str],
    rows: &[Value],
    lookup: impl Fn(&Value, &str) -> Option<Value>,
) -> Result<(), Failure> {
    let io = |e: std::io::Error| fail(format!("writing output: {e}"));
    if HEADERS.load(std::sync::atomic::Ordering::Relaxed) {
        writeln!(out, "{}", columns.join("\t")).map_err(io)?;
    }
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

fn member_text(m: &MemberOpt) -> String {
    format!(
        "queue {} in vhost {} on node {} ...",
        m.queue, m.v.vhost, m.node
    )
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

fn run(api: &Api, cmd: Cmd, view: View, out: &mut impl Write) -> Result<(), Failure> {
    HEADERS.store(view.headers, std::sync::atomic::Ordering::Relaxed);
    let quiet = view.quiet;
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
                &cols,
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
            })?;
        }
        Cmd::CloseConnection {
            connection,
            explanation,
        } => {
            info(
                quiet,
                format!("Closing connection {connection}, reason: {explanation}..."),
            );
            let name = connection_name(api, &connection)?
                .ok_or_else(|| fail(format!("connection '{connection}' does not exist")))?;
            api.call(
                "DELETE",
                &format!("/api/connections/{}", seg(&name)),
                None,
                &[("x-reason", &explanation)],
            )?
            .ok_or_else(|| fail(format!("connection '{connection}' does not exist")))?;
        }
        Cmd::CloseAllConnections {
            v,
            global,
            limit,
            per_connection_delay,
            explanation,
        } => {
            let banner = match (global, limit) {
                (true, _) => format!(
                    "Closing all connections to node {} (across all vhosts), reason: {explanation}...",
                    node_name(api)?
                ),
                (false, 0) => format!(
                    "Closing all connections in vhost {}, reason: {explanation}...",
                    v.vhost
                ),
                (false, n) => format!(
                    "Closing {n} connections in vhost {}, reason: {explanation}...",
                    v.vhost
                ),
            };
            info(quiet, banner);
            let mut names: Vec<String> = list(api.get("/api/connections")?)
                .iter()
                .filter(|c| global || c.get("vhost").and_then(Value::as_str) == Some(&v.vhost))
                .filter_map(|c| c.get("name").and_then(Value::as_str).map(String::from))
                .collect();
            if !global && limit > 0 {
                names.truncate(limit);
            }
            let mut closed = 0;
            for (i, name) in names.iter().enumerate() {
                if i > 0 && per_connection_delay > 0 {
                    std::thread::sleep(std::time::Duration::from_millis(per_connection_delay));
                }
                let path = format!("/api/connections/{}", seg(name));
                // Gone meanwhile (closed by its client): nothing left to close.
                if api
                    .call("DELETE", &path, None, &[("x-reason", &explanation)])?
                    .is_some()
                {
                    closed += 1;
                }
            }
            writeln!(out, "Closed {closed} connections")
                .map_err(|e| fail(format!("writing output: {e}")))?;
        }
        Cmd::ListChannels { columns: cols } => {
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
                &cols,
                &["pid", "user", "consumer_count", "messages_unacknowledged"],
                &known,
                "channel",
            )?;
            info(quiet, "Listing channels ...".into());
            table(out, &cols, &list(api.get("/api/warren/channels")?), field)?;
        }
        Cmd::ListConsumers { v, columns: cols } => {
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
            let cols = columns(&cols, &default, &known, "consumer")?;
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
            })?;
        }
        Cmd::StopApp => {
            info(
                quiet,
                format!(
                    "Stopping rabbit application on node {} ...",
                    node_name(api)?
                ),
            );
            api.must(
                "POST",
                "/api/warren/stop_app",
                None,
                "the broker has no stop_app endpoint".into(),
            )?;
        }
        Cmd::StartApp => {
            info(quiet, format!("Starting node {} ...", node_name(api)?));
            api.must(
                "POST",
                "/api/warren/start_app",
                None,
                "the broker has no start_app endpoint".into(),
            )?;
        }
        Cmd::ClusterStatus => {
            let s = api.must(
                "GET",
                "/api/warren/cluster",
                None,
                "the broker has no cluster endpoint".into(),
            )?;
            let node = s.get("node").and_then(Value::as_str).unwrap_or("");
            info(quiet, format!("Cluster status of node {node} ..."));
            write!(out, "{}", cluster_status_text(&s))
                .map_err(|e| fail(format!("writing output: {e}")))?;
        }
        Cmd::JoinCluster { target } => {
            info(
                quiet,
                format!("Clustering node {} with {target}", node_name(api)?),
            );
            api.call(
                "POST",
                "/api/warren/cluster/join",
                Some(&json!({ "node": target })),
                &[],
            )?;
        }
        Cmd::AddMember(m) => {
            info(quiet, format!("Adding a replica for {}", member_text(&m)));
            member_change(api, &m.v.vhost, &m.queue, &m.node, true)?;
        }
        Cmd::DeleteMember(m) => {
            info(quiet, format!("Removing a replica of {}", member_text(&m)));
            member_change(api, &m.v.vhost, &m.queue, &m.node, false)?;
        }
        Cmd::Grow {
            node,
            which,
            vhost_pattern,
            queue_pattern,
        } => {
            if which != "all" && which != "even" {
                return Err(fail(format!("grow takes 'all' or 'even', not '{which}'")));
            }
            let vre = regex::Regex::new(&vhost_pattern)
                .map_err(|e| fail(format!("--vhost-pattern: {e}")))?;
            let qre = regex::Regex::new(&queue_pattern)
                .map_err(|e| fail(format!("--queue-pattern: {e}")))?;
            info(
                quiet,
                format!("Growing {which} quorum queues on {node} ..."),
            );
            writeln!(out, "vhost\tname\tsize\tresult").map_err(|e| fail(e.to_string()))?;
            for q in quorum_queues(api)? {
                let (vh, name, members) = q;
                if !vre.is_match(&vh) || !qre.is_match(&name) || members.contains(&node) {
                    continue;
                }
                if which == "even" && members.len() % 2 != 0 {
                    continue;
                }
                let r = member_change(api, &vh, &name, &node, true);
                let size = members.len() + usize::from(r.is_ok());
                let result = r.err().map_or("ok".to_string(), |e| e.message);
                writeln!(out, "{vh}\t{name}\t{size}\t{result}").map_err(|e| fail(e.to_string()))?;
            }
        }
        Cmd::Shrink { node } => {
            info(quiet, format!("Shrinking quorum queues on {node} ..."));
            writeln!(out, "vhost\tname\tsize\tresult").map_err(|e| fail(e.to_string()))?;
            for (vh, name, members) in quorum_queues(api)? {
                if !members.contains(&node) {
                    continue;
                }
                let r = member_change(api, &vh, &name, &node, false);
                let size = members.len() - usize::from(r.is_ok());
                let result = r.err().map_or("ok".to_string(), |e| e.message);
                writeln!(out, "{vh}\t{name}\t{size}\t{result}").map_err(|e| fail(e.to_string()))?;
            }
        }
        Cmd::ForgetClusterNode { member } => {
            info(quiet, format!("Removing node {member} from the cluster"));
            api.call(
                "POST",
                "/api/warren/cluster/forget",
                Some(&json!({ "node": member })),
                &[],
            )?;
        }
        Cmd::Status => {
            let s = api.must(
                "GET",
                "/api/warren/status",
                None,
                "the broker has no status endpoint".into(),
            )?;
            let node = s.get("node").and_then(Value::as_str).unwrap_or("");
            info(quiet, format!("Status of node {node} ..."));
            write!(out, "{}", status_text(&s)).map_err(|e| fail(format!("writing output: {e}")))?;
        }
        Cmd::Environment => {
            let env = api.must(
                "GET",
                "/api/warren/environment",
                None,
                "the broker has no environment endpoint".into(),
            )?;
            info(
                quiet,
                format!("Application environment of node {} ...", node_name(api)?),
            );
            writeln!(out, "{}", environment_text(&env))
                .map_err(|e| fail(format!("writing output: {e}")))?;
        }
        Cmd::SetVmMemoryHighWatermark { args } => {
            let (body, shown) = watermark_arg(&args)?;
            info(
                quiet,
                format!(
                    "Setting memory threshold on {} to {shown} ...",
                    node_name(api)?
                ),
            );
            api.must(
                "PUT",
                "/api/warren/vm_memory_high_watermark",
                Some(&body),
                "the broker has no vm_memory_high_watermark endpoint".into(),
            )?;
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

/// The node name the broker reports (for banners that name it, as rabbitmqctl's do).
fn node_name(api: &Api) -> Result<String, Failure> {
    let o = api.must(
        "GET",
        "/api/overview",
        None,
        "the broker has no overview".into(),
    )?;
    Ok(o.get("node")
        .and_then(Value::as_str)
        .unwrap_or("warren")
        .to_string())
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

/// A value of `/api/warren/…` as rabbitmqctl prints the Erlang term: a table
/// (`{"table": [[k, v], …]}`) is `[{"k",v},…]`, a list `[v,…]`, a string `"…"`.
fn erlang_term(v: &Value) -> String {
    match v {
        Value::Object(o) => match o.get("table") {
            Some(Value::Array(pairs)) => {
                let items: Vec<String> = pairs
                    .iter()
                    .map(|p| match p.as_array().map(Vec::as_slice) {
                        Some([k, v]) => format!(
                            "{{{},{}}}",
                            erlang_string(k.as_str().unwrap_or("")),
                            erlang_term(v)
                        ),
                        _ => erlang_term(p),
                    })
                    .collect();
                format!("[{}]", items.join(","))
            }
            _ => v.to_string(),
        },
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(erlang_term).collect::<Vec<_>>().join(",")
        ),
        Value::String(s) => erlang_string(s),
        Value::Null => "undefined".into(),
        other => other.to_string(),
    }
}

fn erlang_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Bytes as rabbitmqctl's status prints them: gigabytes (10^9) to 4 decimals.
fn gb(bytes: Option<u64>) -> String {
    match bytes {
        Some(b) => format!("{:?} gb", (b as f64 / 1e9 * 10_000.0).round() / 10_000.0),
        None => "unknown".into(),
    }
}

/// `rabbitmqctl status`'s sections, from `/api/warren/status`.
fn status_text(s: &Value) -> String {
    let u = |v: &Value, path: &[&str]| -> Option<u64> {
        path.iter().try_fold(v, |v, k| v.get(k))?.as_u64()
    };
    let t = |v: &Value, path: &[&str]| -> String {
        path.iter()
            .try_fold(v, |v, k| v.get(k))
            .map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .unwrap_or_default()
    };
    let node = t(s, &["node"]);
    let mut o = String::new();
    o.push_str("Runtime\n\n");
    o.push_str(&format!("OS PID: {}\n", t(s, &["os_pid"])));
    o.push_str("OS: Linux\n");
    o.push_str(&format!("Uptime (seconds): {}\n", t(s, &["uptime_s"])));
    o.push_str("Is under maintenance?: false\n");
    o.push_str(&format!(
        "RabbitMQ version: {}\n",
        t(s, &["rabbitmq_version"])
    ));
    o.push_str(&format!("Node name: {node}\n"));
    o.push_str(&format!("Warren version: {}\n", t(s, &["warren_version"])));
    o.push_str("\nAlarms\n\n");
    let alarm = |k: &str| s.get("alarms").and_then(|a| a.get(k)) == Some(&Value::Bool(true));
    if !alarm("memory") && !alarm("disk") {
        o.push_str("(none)\n");
    }
    if alarm("disk") {
        o.push_str(&format!("Free disk space alarm on node {node}\n"));
    }
    if alarm("memory") {
        o.push_str(&format!("Memory alarm on node {node}\n"));
    }
    o.push_str("\nMemory\n\n");
    o.push_str(&format!(
        "Total memory used: {}\n",
        gb(u(s, &["memory", "used_bytes"]))
    ));
    o.push_str(&format!(
        "Calculation strategy: {}\n",
        t(s, &["memory", "strategy"])
    ));
    let limit = gb(u(s, &["memory", "limit_bytes"]));
    let setting = match s.get("memory").and_then(|m| m.get("watermark")) {
        Some(w) if w.get("absolute").is_some() => gb(u(w, &["absolute"])),
        Some(w) => format!("{} of available memory", t(w, &["fraction"])),
        None => String::new(),
    };
    o.push_str(&format!(
        "Memory high watermark setting: {setting}, computed to: {limit}\n"
    ));
    o.push_str("\nFile Descriptors\n\n");
    o.push_str(&format!(
        "Total: {}, limit: {}\n",
        t(s, &["file_descriptors", "open"]),
        t(s, &["file_descriptors", "limit"])
    ));
    o.push_str("\nFree Disk Space\n\n");
    o.push_str(&format!(
        "Low free disk space watermark: {}\n",
        gb(u(s, &["disk", "limit_bytes"]))
    ));
    o.push_str(&format!(
        "Free disk space: {}\n",
        gb(u(s, &["disk", "free_bytes"]))
    ));
    o.push_str("\nTotals\n\n");
    o.push_str(&format!(
        "Connection count: {}\n",
        t(s, &["totals", "connections"])
    ));
    o.push_str(&format!("Queue count: {}\n", t(s, &["totals", "queues"])));
    o.push_str(&format!(
        "Virtual host count: {}\n",
        t(s, &["totals", "vhosts"])
    ));
    o.push_str("\nListeners\n\n");
    for l in list(s.get("listeners").cloned()) {
        o.push_str(&format!(
            "Interface: {}, port: {}, protocol: {}, purpose: {}\n",
            t(&l, &["interface"]),
            t(&l, &["port"]),
            t(&l, &["protocol"]),
            t(&l, &["purpose"])
        ));
    }
    o
}

/// `rabbitmqctl environment`'s layout of `[[app, [[key, term], …]], …]`.
fn environment_text(env: &Value) -> String {
    let apps: Vec<String> = list(Some(env.clone()))
        .iter()
        .map(|a| {
            let name = a.get(0).and_then(Value::as_str).unwrap_or("");
            let keys: Vec<String> = list(a.get(1).cloned())
                .iter()
                .map(|kv| {
                    format!(
                        "{{{},{}}}",
                        kv.get(0).and_then(Value::as_str).unwrap_or(""),
                        kv.get(1).and_then(Value::as_str).unwrap_or("")
                    )
                })
                .collect();
            format!("{{{name},\n     [{}]}}", keys.join(",\n      "))
        })
        .collect();
    format!("[{}]", apps.join(",\n "))
}

/// `set_vm_memory_high_watermark`'s arguments, checked as rabbitmqctl checks them (exit 65):
/// the request body, and the value as its banner shows it.
fn watermark_arg(args: &[String]) -> Result<(Value, String), Failure> {
    let bad = |why: &str| Failure {
        code: 65,
        message: format!("Bad argument{why}"),
    };
    match args {
        [f] => match f.parse::<f64>() {
            Ok(x) if (0.0..=1.0).contains(&x) => Ok((json!({ "fraction": x }), f.clone())),
            Ok(_) => Err(bad(
                ": The threshold should be a fraction between 0.0 and 1.0",
            )),
            Err(_) => Err(bad(".")),
        },
        [a, v] if a == "absolute" => {
            let digits = v.bytes().take_while(u8::is_ascii_digit).count();
            let (num, unit) = v.split_at(digits);
            let Ok(n) = num.parse::<u64>() else {
                return Err(bad("."));
            };
            let scale: u64 = match unit {
                "" => 1,
                "k" | "kiB" => 1 << 10,
                "M" | "MiB" => 1 << 20,
                "G" | "GiB" => 1 << 30,
                "kB" => 1_000,
                "MB" => 1_000_000,
                "GB" => 1_000_000_000,
                u if u.starts_with('.') => {
                    return Err(bad(": The threshold should be an integer."))
                }
                _ => return Err(bad(": Invalid units.")),
            };
            match n.checked_mul(scale) {
                Some(bytes) if bytes > 0 => {
                    Ok((json!({ "absolute": bytes }), format!("{v} bytes")))
                }
                _ => Err(bad(".")),
            }
        }
        _ => Err(bad(": give FRACTION or absolute BYTES")),
    }
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
