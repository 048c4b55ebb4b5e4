//! `warren ctl`: rabbitmqctl's everyday commands, run against a live broker through its HTTP
//! management API (RabbitMQ's URLs, plus `/api/warren/…` for what only rabbitmqctl does:
//! pids, stop_app/start_app, status, environment, the memory watermark). Listings print a
//! tab-separated header line, then one row per item, as rabbitmqctl does (its "Listing … "
//! banner goes to stderr, so stdout stays parseable); values are printed as rabbitmqctl prints
//! them (pids `<node.1.N.0>`, client properties as Erlang terms, protocol `{0,9,1}`).
//! Exit status: 0 on success, 1 when the broker refused (unknown name, bad value), 65 for an
//! argument rabbitmqctl also rejects (a watermark out of range), 69 when the broker cannot be
//! reached, 2 on bad usage.
//!
//! One file per group of commands, one function per command; `run` only dispatches.

mod api;
mod cluster;
mod connections;
mod definitions;
mod limits;
mod node;
mod parameters;
mod queues;
mod streams;
mod users;
mod vhosts;
mod view;

use std::io::Write;

use clap::{Args, Parser, Subcommand};

use api::{Api, Failure};
use view::View;

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
    SetPermissions(users::SetPermissionsArgs),
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
    CloseAllConnections(connections::CloseAllArgs),
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
    /// Names the cluster (every node reports NAME: cluster_status, the API, the UI, the
    /// metrics, the AMQP server properties).
    SetClusterName {
        #[arg(value_name = "NAME")]
        name: String,
    },
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
    AddMember(cluster::MemberOpt),
    /// Removes NODE from a quorum queue's members (rabbitmq-queues delete_member).
    DeleteMember(cluster::MemberOpt),
    /// Adds NODE to a stream's replicas (rabbitmq-streams add_replica).
    AddReplica(cluster::MemberOpt),
    /// Removes NODE from a stream's replicas (rabbitmq-streams delete_replica).
    DeleteReplica(cluster::MemberOpt),
    /// Adds NODE to every quorum queue (`all`), or to those with an even number of members
    /// (`even`), as rabbitmq-queues grow.
    Grow(cluster::GrowArgs),
    /// Spreads the leaders of replicated queues (all, quorum, or mirrored classic) over the
    /// running nodes by leadership transfer, as rabbitmq-queues rebalance; prints how many each
    /// node leads afterwards.
    Rebalance(cluster::RebalanceArgs),
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
    DeleteQueue(queues::DeleteQueueArgs),
    /// Makes super stream NAME (rabbitmq-streams add_super_stream): a direct exchange bound to
    /// a stream per partition (3 unless --partitions or --binding-keys say).
    AddSuperStream(streams::AddSuperStreamArgs),
    /// Deletes super stream NAME: its exchange and its partitions.
    DeleteSuperStream {
        #[command(flatten)]
        v: VhostOpt,
        name: String,
    },
    /// DEFINITION is a JSON object, e.g. '{"max-length":10}'.
    /// Sets runtime parameter NAME of COMPONENT (`shovel`, ...); VALUE is JSON.
    SetParameter {
        #[command(flatten)]
        v: VhostOpt,
        component: String,
        name: String,
        value: String,
    },
    ClearParameter {
        #[command(flatten)]
        v: VhostOpt,
        component: String,
        name: String,
    },
    ListParameters {
        #[command(flatten)]
        v: VhostOpt,
    },
    /// Every shovel of the cluster: its state, ends and counts.
    ShovelStatus,
    /// Every federation link of the cluster: its upstream, status and error.
    FederationStatus,
    /// Deletes shovel NAME (its parameter).
    DeleteShovel {
        #[command(flatten)]
        v: VhostOpt,
        name: String,
    },
    /// Restarts shovel NAME on the node that runs it.
    RestartShovel {
        #[command(flatten)]
        v: VhostOpt,
        name: String,
    },
    SetPolicy(vhosts::SetPolicyArgs),
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
    // stop_app waits for connections to close, start_app for listeners: up to 30 s each on
    // the broker's side, so the default leaves room for that.
    let timeout_s = args.timeout.unwrap_or(45).max(1);
    let api = Api::new(base, &args.username, &args.password, timeout_s);
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

/// Runs one command: each is a function in the file of its group.
fn run(api: &Api, cmd: Cmd, view: View, out: &mut impl Write) -> Result<(), Failure> {
    view::HEADERS.store(view.headers, std::sync::atomic::Ordering::Relaxed);
    let q = view.quiet;
    match cmd {
        Cmd::AddUser { name, password } => users::add_user(api, q, &name, &password),
        Cmd::ChangePassword { name, password } => users::change_password(api, q, &name, &password),
        Cmd::DeleteUser { name } => users::delete_user(api, q, &name),
        Cmd::SetUserTags { name, tags } => users::set_user_tags(api, q, &name, &tags),
        Cmd::ListUsers => users::list_users(api, q, out),
        Cmd::SetPermissions(a) => users::set_permissions(api, q, &a),
        Cmd::ClearPermissions { v, user } => users::clear_permissions(api, q, &v, &user),
        Cmd::ListPermissions { v } => users::list_permissions(api, q, out, &v),
        Cmd::ListUserPermissions { user } => users::list_user_permissions(api, q, out, &user),
        Cmd::AddVhost { name } => vhosts::add_vhost(api, q, &name),
        Cmd::DeleteVhost { name } => vhosts::delete_vhost(api, q, &name),
        Cmd::ListVhosts { columns } => vhosts::list_vhosts(api, q, out, &columns),
        Cmd::ListQueues { v, columns } => queues::list_queues(api, q, out, &v, &columns),
        Cmd::ListExchanges { v, columns } => queues::list_exchanges(api, q, out, &v, &columns),
        Cmd::ListBindings { v, columns } => queues::list_bindings(api, q, out, &v, &columns),
        Cmd::ListConnections { columns } => connections::list_connections(api, q, out, &columns),
        Cmd::CloseConnection {
            connection,
            explanation,
        } => connections::close_connection(api, q, &connection, &explanation),
        Cmd::CloseAllConnections(a) => connections::close_all_connections(api, q, out, &a),
        Cmd::ListChannels { columns } => connections::list_channels(api, q, out, &columns),
        Cmd::ListConsumers { v, columns } => connections::list_consumers(api, q, out, &v, &columns),
        Cmd::StopApp => node::stop_app(api, q),
        Cmd::StartApp => node::start_app(api, q),
        Cmd::Status => node::status(api, q, out),
        Cmd::ClusterStatus => cluster::cluster_status(api, q, out),
        Cmd::SetClusterName { name } => cluster::set_cluster_name(api, q, &name),
        Cmd::JoinCluster { target } => cluster::join_cluster(api, q, &target),
        Cmd::ForgetClusterNode { member } => cluster::forget_cluster_node(api, q, &member),
        Cmd::AddMember(m) => cluster::add_member(api, q, &m),
        Cmd::DeleteMember(m) => cluster::delete_member(api, q, &m),
        Cmd::AddReplica(m) => cluster::add_member(api, q, &m),
        Cmd::DeleteReplica(m) => cluster::delete_member(api, q, &m),
        Cmd::Grow(a) => cluster::grow(api, q, out, &a),
        Cmd::Rebalance(a) => cluster::rebalance(api, q, out, &a),
        Cmd::Shrink { node } => cluster::shrink(api, q, out, &node),
        Cmd::Environment => node::environment(api, q, out),
        Cmd::SetVmMemoryHighWatermark { args } => node::set_vm_memory_high_watermark(api, q, &args),
        Cmd::PurgeQueue { v, name } => queues::purge_queue(api, q, &v, &name),
        Cmd::DeleteQueue(a) => queues::delete_queue(api, q, &a),
        Cmd::AddSuperStream(a) => streams::add_super_stream(api, q, &a),
        Cmd::DeleteSuperStream { v, name } => streams::delete_super_stream(api, q, &v, &name),
        Cmd::SetParameter {
            v,
            component,
            name,
            value,
        } => parameters::set_parameter(api, q, &v, &component, &name, &value),
        Cmd::ClearParameter { v, component, name } => {
            parameters::clear_parameter(api, q, &v, &component, &name)
        }
        Cmd::ListParameters { v } => parameters::list_parameters(api, q, out, &v),
        Cmd::ShovelStatus => parameters::shovel_status(api, q, out),
        Cmd::FederationStatus => parameters::federation_status(api, q, out),
        Cmd::DeleteShovel { v, name } => parameters::delete_shovel(api, q, &v, &name),
        Cmd::RestartShovel { v, name } => parameters::restart_shovel(api, q, &v, &name),
        Cmd::SetPolicy(a) => vhosts::set_policy(api, q, &a),
        Cmd::ClearPolicy { v, name } => vhosts::clear_policy(api, q, &v, &name),
        Cmd::ListPolicies { v } => vhosts::list_policies(api, q, out, &v),
        Cmd::SetVhostLimits { v, definition } => limits::set_vhost_limits(api, q, &v, &definition),
        Cmd::ClearVhostLimits { v } => limits::clear_vhost_limits(api, q, &v),
        Cmd::ListVhostLimits { v, global } => limits::list_vhost_limits(api, q, out, &v, global),
        Cmd::SetUserLimits { user, definition } => {
            limits::set_user_limits(api, q, &user, &definition)
        }
        Cmd::ClearUserLimits { user, limit } => limits::clear_user_limits(api, q, &user, &limit),
        Cmd::ListUserLimits { user, global } => {
            limits::list_user_limits(api, q, out, &user, global)
        }
        Cmd::ExportDefinitions { file } => definitions::export_definitions(api, q, out, &file),
        Cmd::ImportDefinitions { file } => definitions::import_definitions(api, q, &file),
    }
}
