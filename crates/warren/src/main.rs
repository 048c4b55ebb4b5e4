//! `warren`: the one binary. `warren server` runs the broker.

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use warren_broker::{Broker, Config};

mod ctl;
mod data_lock;

/// jemalloc rather than glibc's malloc: after a soak (hundreds of connections, bodies up to
/// 200 KB) the live heap was back to 0.3 MiB but glibc kept ~200 MiB resident; jemalloc's
/// background threads return freed pages to the OS after its decay time. Without the `jemalloc`
/// feature (a heap profiling build) the system allocator serves.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "warren",
    version,
    about = "An AMQP 0-9-1 message broker that speaks RabbitMQ's dialect"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker. Embedded defaults: one node, AMQP on 127.0.0.1:5672, HTTP port 15672,
    /// data in ./warren-data, user guest/guest allowed from loopback only.
    Server(ServerArgs),
    /// Manage a running broker through its HTTP API, with rabbitmqctl's command names
    /// (add_user, set_permissions, list_queues name messages, export_definitions FILE, ...).
    Ctl(ctl::CtlArgs),
    /// Load generator with RabbitMQ PerfTest's flags (-x, -y, -u, -s, -r, -c, -q, -z, -h URI,
    /// ...), against Warren or any AMQP 0-9-1 broker. `warren perf --help` lists them.
    Perf(PerfArgs),
}

/// Everything after `perf` goes to warren-perf's own parser (PerfTest's `-h` is the URI).
#[derive(Parser)]
#[command(disable_help_flag = true)]
struct PerfArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    args: Vec<std::ffi::OsString>,
}

#[derive(Parser)]
struct ServerArgs {
    /// TOML file with listeners, data dir, users and limits; flags given here override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// TCP port for AMQP 0-9-1 clients [default: 5672].
    #[arg(long, value_name = "PORT")]
    amqp_port: Option<u16>,
    /// Address the AMQP listener binds [default: 127.0.0.1].
    #[arg(long, value_name = "ADDR")]
    amqp_bind: Option<IpAddr>,
    /// TCP port of the HTTP management API [default: 15672].
    #[arg(long, value_name = "PORT")]
    http_port: Option<u16>,
    /// Address the management API binds [default: 127.0.0.1].
    #[arg(long, value_name = "ADDR")]
    http_bind: Option<IpAddr>,
    /// TCP port for RabbitMQ's stream protocol (RabbitMQ uses 5552) [default: off].
    #[arg(long, value_name = "PORT")]
    stream_port: Option<u16>,
    /// Definitions (RabbitMQ's JSON format) to import at boot.
    #[arg(long, value_name = "FILE")]
    definitions: Option<PathBuf>,
    /// Directory for durable state [default: ./warren-data].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// This node's name, NAME@HOST (NAME alone gets @<short hostname>) [default: warren@<short
    /// hostname>].
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// Run as a cluster node: the inter-node link listens here (HOST:PORT) [config:
    /// cluster.listen].
    #[arg(long, value_name = "ADDR")]
    cluster_listen: Option<std::net::SocketAddr>,
    /// Link addresses of the cluster's seed nodes, comma-separated (HOST:PORT,...) [config:
    /// cluster.peers].
    #[arg(long, value_name = "ADDRS", value_delimiter = ',')]
    cluster_peers: Option<Vec<String>>,
    /// The cluster's shared secret [config: cluster.cookie; env WARREN_COOKIE; else
    /// <data_dir>/.cookie].
    #[arg(
        long,
        value_name = "SECRET",
        env = "WARREN_COOKIE",
        hide_env_values = true
    )]
    cluster_cookie: Option<String>,
}

fn load_config(args: &ServerArgs) -> anyhow::Result<Config> {
    let mut c = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config file {}", path.display()))?;
            Config::from_toml(&text)
                .map_err(|e| anyhow::anyhow!("invalid config file {}: {e}", path.display()))?
        }
        None => Config::default(),
    };
    if let Some(p) = args.amqp_port {
        c.amqp_port = p;
    }
    if let Some(a) = args.amqp_bind {
        c.amqp_bind = a;
    }
    if let Some(p) = args.http_port {
        c.http_port = p;
    }
    if let Some(a) = args.http_bind {
        c.http_bind = a;
    }
    if let Some(p) = args.stream_port {
        c.stream_port = Some(p);
    }
    if let Some(f) = &args.definitions {
        c.definitions_file = Some(f.clone());
    }
    if let Some(n) = &args.node_name {
        c.node_name = warren_broker::config::full_node_name(n);
        c.validate()
            .map_err(|e| anyhow::anyhow!("invalid --node-name: {e}"))?;
    }
    if let Some(d) = &args.data_dir {
        c.data_dir = d.clone();
    }
    if args.cluster_listen.is_some() || args.cluster_peers.is_some() {
        let cl = c.cluster.get_or_insert_with(Default::default);
        if let Some(l) = args.cluster_listen {
            cl.listen = l;
        }
        if let Some(p) = &args.cluster_peers {
            cl.peers = p.iter().filter(|s| !s.is_empty()).cloned().collect();
        }
    }
    if let (Some(cl), Some(k)) = (c.cluster.as_mut(), &args.cluster_cookie) {
        cl.cookie = Some(k.clone());
    }
    c.validate().map_err(|e| anyhow::anyhow!(e))?;
    Ok(c)
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // Its default reports a failed write with eprintln!, which panics when stderr is what
        // failed (a closed pipe, a full disk), killing the task that logged. Drop the line.
        .log_internal_errors(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WARREN_LOG")
                // openraft warns of what is routine for it (a vote or membership message
                // overtaken by a newer one, which it ignores): its errors only, unless asked.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=error")),
        )
        .init();
    let result = match cli.command {
        Command::Server(args) => run_server(args),
        Command::Ctl(args) => return std::process::ExitCode::from(ctl::main(args)),
        Command::Perf(args) => {
            return std::process::ExitCode::from(warren_perf::main(args.args).clamp(0, 255) as u8)
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("warren: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

fn run_server(args: ServerArgs) -> anyhow::Result<()> {
    let config = load_config(&args)?;
    let config_file = args.config.clone();
    // Before anything in the data directory is read or written: a second server on it would
    // overwrite the first one's logs.
    let _data_lock = data_lock::acquire(&config.data_dir)?;
    let workers = config.worker_threads();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let addr = std::net::SocketAddr::new(config.amqp_bind, config.amqp_port);
        // Every socket is bound first, so a port in use fails at once; "listening" is said only
        // once the data directory is open and everything serves.
        let listener = warren_broker::app::listen(addr).with_context(|| format!("cannot listen for AMQP on {addr}"))?;
        // AMQPS when a certificate is configured: a bad file fails startup with its name.
        let tls = match &config.tls {
            Some(t) => {
                let acceptor = warren_broker::tls::acceptor(t).map_err(anyhow::Error::msg)?;
                let addr = std::net::SocketAddr::new(t.bind.unwrap_or(config.amqp_bind), t.port);
                let l = warren_broker::app::listen(addr).with_context(|| format!("cannot listen for AMQPS on {addr}"))?;
                Some((l, acceptor, addr, t.verify))
            }
            None => None,
        };
        let stream = match config.stream_port {
            Some(port) => {
                let addr = std::net::SocketAddr::new(config.amqp_bind, port);
                let l = tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen for the stream protocol on {addr}"))?;
                Some((l, addr, None))
            }
            None => None,
        };
        let stream_tls = match config.tls.as_ref().and_then(|t| t.stream_port.map(|p| (t, p))) {
            Some((t, port)) => {
                let acceptor = warren_broker::tls::acceptor(t).map_err(anyhow::Error::msg)?;
                let addr = std::net::SocketAddr::new(t.bind.unwrap_or(config.amqp_bind), port);
                let l = tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen for the stream protocol over TLS on {addr}"))?;
                Some((l, addr, Some(acceptor)))
            }
            None => None,
        };
        let http_addr = std::net::SocketAddr::new(config.http_bind, config.http_port);
        let http = tokio::net::TcpListener::bind(http_addr)
            .await
            .with_context(|| format!("cannot listen for HTTP on {http_addr}"))?;
        let definitions = config.definitions_file.clone();
        // The data directory exists (its lock is held): logged absolute, so it can be found.
        let data_dir = std::fs::canonicalize(&config.data_dir).unwrap_or_else(|_| config.data_dir.clone());
        let broker = Broker::new(config).context("cannot open the data directory")?;
        if broker.config.cluster.is_some() {
            warren_broker::cluster::Cluster::start(&broker).await?;
        }
        // Before definitions are imported: their shovels and upstreams are checked by their
        // components.
        let shovels = warren_shovel::Shovels::start(&broker);
        let federation = warren_federation::Federation::start(&broker);
        if let Some(path) = definitions {
            let text = std::fs::read(&path)
                .with_context(|| format!("cannot read definitions file {}", path.display()))?;
            let doc: serde_json::Value = serde_json::from_slice(&text)
                .with_context(|| format!("invalid JSON in definitions file {}", path.display()))?;
            warren_broker::export::import(&broker, &doc)
                .map_err(|e| anyhow::anyhow!("cannot import definitions file {}: {e}", path.display()))?;
            tracing::info!(file = %path.display(), "definitions loaded");
        }
        let (tx, rx) = tokio::sync::watch::channel(false);
        let api = tokio::spawn(warren_mgmt::serve(broker.clone(), shovels, federation, http, rx.clone()));
        let tls_server = tls.map(|(l, a, addr, verify)| {
            tracing::info!(%addr, ?verify, "warren listening for AMQP 0-9-1 over TLS");
            tokio::spawn(warren_broker::tls::serve(broker.clone(), l, a, rx.clone()))
        });
        let groups = std::sync::Arc::new(warren_stream_protocol::sac::Groups::default());
        let stream_servers: Vec<_> = stream
            .into_iter()
            .chain(stream_tls)
            .map(|(l, addr, tls)| {
                tracing::info!(%addr, tls = tls.is_some(), "warren listening for the stream protocol");
                tokio::spawn(warren_stream_protocol::serve(broker.clone(), groups.clone(), l, tls, rx.clone()))
            })
            .collect();
        tracing::info!(url = %format!("http://{http_addr}/"), "management UI and HTTP API listening");
        // The management API's rates are sampled for as long as the AMQP server runs.
        let sampler = tokio::spawn(warren_mgmt::run_sampler(broker.clone()));
        tracing::info!(%addr, data_dir = %data_dir.display(), workers, version = env!("CARGO_PKG_VERSION"), "warren listening for AMQP 0-9-1");
        let server = tokio::spawn(warren_broker::app::serve(broker.clone(), listener, rx));
        let reloader = tokio::spawn(reload_on_sighup(broker.clone(), config_file));
        wait_for_signal().await;
        reloader.abort();
        tracing::info!("shutting down");
        let _ = tx.send(true);
        let _ = server.await;
        sampler.abort();
        if let Some(t) = tls_server {
            let _ = t.await;
        }
        for s in stream_servers {
            let _ = s.await;
        }
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), api).await;
        tracing::info!("stopped");
        Ok(())
    })
}

/// SIGHUP re-reads the config file's alarm thresholds (RabbitMQ changes them at runtime with
/// `rabbitmqctl set_vm_memory_high_watermark` / `set_disk_free_limit`).
async fn reload_on_sighup(broker: std::sync::Arc<Broker>, file: Option<PathBuf>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        return;
    };
    while hup.recv().await.is_some() {
        let Some(path) = &file else {
            tracing::info!("SIGHUP: no config file to reload");
            continue;
        };
        match std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|t| Config::from_toml(&t))
        {
            Ok(c) => broker
                .alarms
                .set_thresholds(warren_broker::alarms::Thresholds::from_limits(&c.limits)),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "SIGHUP: config not reloaded")
            }
        }
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
