//! Broker configuration: embedded defaults, overridden by a TOML file, overridden by flags.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;

use serde::Deserialize;

use crate::limits;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address the AMQP listener binds (loopback by default, like a fresh RabbitMQ on a dev box).
    pub amqp_bind: IpAddr,
    pub amqp_port: u16,
    pub http_bind: IpAddr,
    pub http_port: u16,
    /// RabbitMQ's stream protocol on this port (bound to `amqp_bind`), when set: off by
    /// default, as RabbitMQ's stream plugin is (it uses 5552).
    pub stream_port: Option<u16>,
    /// Where durable state lives.
    pub data_dir: PathBuf,
    /// Virtual hosts that exist at boot.
    pub vhosts: Vec<String>,
    pub users: Vec<UserConfig>,
    /// Users that may only log in from a loopback address (RabbitMQ's `loopback_users`).
    pub loopback_users: Vec<String>,
    /// Definitions (RabbitMQ's JSON) imported at boot, like RabbitMQ's `load_definitions`.
    pub definitions_file: Option<PathBuf>,
    pub limits: LimitsConfig,
    /// AMQPS on a second listener, when a certificate is configured.
    pub tls: Option<TlsConfig>,
    /// What connection.start announces as `product` and `version`.
    pub server_properties: ServerProperties,
    /// This node's name, as RabbitMQ's `rabbit@host`: in the management API, rabbitmqctl-style
    /// pids and `warren ctl`'s output; a cluster tells its nodes apart by it. Default
    /// `warren@<short hostname>`; a name without `@` gets `@<short hostname>` appended, as
    /// RabbitMQ does with RABBITMQ_NODENAME.
    pub node_name: String,
    /// Present: this node runs in a cluster (docs/clustering.md).
    pub cluster: Option<ClusterConfig>,
    /// RabbitMQ's `consumer_timeout`: a manual-ack delivery unacked this long (ms) times its
    /// consumer out, unless the consumer or its queue sets its own (docs/consumer-timeout.md).
    /// 0 disables it.
    pub consumer_timeout: u64,
    /// Accepted for the configurations of the releases that had it: replicated queues always
    /// run on the replicated queue machine (`replicated/`, docs/design/replicated-queues.md),
    /// so only `true` is taken; `false` (the earlier form, now removed) is refused.
    pub quorum_queues_on_machine: bool,
    /// RabbitMQ's `queue_master_locator` (rabbitmq.conf): where a new queue lives when neither
    /// its `x-queue-master-locator` / `x-queue-leader-locator` argument nor a policy says:
    /// `client-local` (the default), `min-masters`, `random`, `balanced`, `least-leaders`.
    /// Only a cluster has a choice.
    pub queue_master_locator: Option<String>,
    /// Threads that run connections, channels and queues (the async runtime's workers).
    /// Default: one per core this process may use ([`Config::worker_threads`]).
    pub workers: Option<usize>,
}

/// `[cluster]`: the inter-node link and how this node finds its cluster.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Where the inter-node link listens (RabbitMQ's distribution port is 25672).
    #[serde(default = "default_cluster_listen")]
    pub listen: std::net::SocketAddr,
    /// The address other nodes reach this one at; defaults to `listen`.
    #[serde(default)]
    pub advertise: Option<String>,
    /// Link addresses of the cluster's seed nodes (this node's own may be among them). On its
    /// first boot a node joins the cluster through them; the node whose address sorts first
    /// starts the cluster.
    #[serde(default)]
    pub peers: Vec<String>,
    /// The shared secret every node of the cluster holds (RabbitMQ's Erlang cookie); a node
    /// without it is refused. Else `cookie_file`, else `<data_dir>/.cookie` (made on first
    /// boot, as RabbitMQ makes `.erlang.cookie`).
    #[serde(default)]
    pub cookie: Option<String>,
    #[serde(default)]
    pub cookie_file: Option<PathBuf>,
}

fn default_cluster_listen() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], 25672))
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            listen: default_cluster_listen(),
            advertise: None,
            peers: Vec::new(),
            cookie: None,
            cookie_file: None,
        }
    }
}

impl ClusterConfig {
    /// The link address other nodes use for this node.
    pub fn address(&self) -> String {
        self.advertise
            .clone()
            .unwrap_or_else(|| self.listen.to_string())
    }
}

/// The short host name (before the first dot), `localhost` if it cannot be read.
pub fn short_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .and_then(|h| h.trim().split('.').next().map(str::to_string))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// `name` as a full node name: `name@<short hostname>` when it has no host part.
pub fn full_node_name(name: &str) -> String {
    if name.contains('@') {
        name.to_string()
    } else {
        format!("{name}@{}", short_hostname())
    }
}

/// The RabbitMQ version whose behaviour Warren follows (the management API's and Prometheus'
/// `rabbitmq_version`).
pub const RABBITMQ_COMPAT_VERSION: &str = "3.10.8";

/// `[server_properties]`: the `product` and `version` announced in connection.start (and as
/// `product_name` / `product_version` in /api/overview). Some applications and client tools
/// gate features on them (a RabbitMQ version check); they can be told "RabbitMQ" / "3.10.8".
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerProperties {
    pub product: String,
    /// A plain `x.y.z` (digits only): clients parse it as a version number.
    pub version: String,
}

impl Default for ServerProperties {
    fn default() -> Self {
        ServerProperties {
            product: "Warren".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }
}

/// Whether `v` is `x.y.z` with each part a run of ASCII digits.
fn is_plain_version(v: &str) -> bool {
    let parts: Vec<&str> = v.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// `[tls]`: RabbitMQ's `ssl_options` (certfile, keyfile, cacertfile, verify,
/// fail_if_no_peer_cert) and its AMQPS listener (5671).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM: the server's certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// PEM: its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM: CAs that client certificates must chain to (for `verify_peer`).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    #[serde(default = "default_tls_port")]
    pub port: u16,
    /// Defaults to `amqp_bind`.
    #[serde(default)]
    pub bind: Option<IpAddr>,
    #[serde(default)]
    pub verify: TlsVerify,
    /// With `verify_peer`: refuse clients that present no certificate.
    #[serde(default)]
    pub fail_if_no_peer_cert: bool,
    /// RabbitMQ's stream protocol over TLS on this port (RabbitMQ uses 5551), with the same
    /// certificate and client checks.
    #[serde(default)]
    pub stream_port: Option<u16>,
}

fn default_tls_port() -> u16 {
    5671
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TlsVerify {
    #[default]
    VerifyNone,
    VerifyPeer,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    pub name: String,
    pub password: String,
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    pub channel_max: u16,
    pub frame_max: u32,
    pub heartbeat_s: u16,
    pub message_size_max_bytes: u64,
    /// Memory alarm at this fraction of RAM (RabbitMQ's vm_memory_high_watermark)...
    pub memory_high_watermark: f64,
    /// ...or at this many bytes of resident memory, if set.
    pub memory_high_watermark_bytes: Option<u64>,
    /// Disk alarm when the data dir's file system has less free space than this.
    pub disk_free_limit_bytes: u64,
    /// Open connections on the node (RabbitMQ's `connection_max`; 0 = no limit).
    pub connection_max: u32,
    /// From accept to connection.open; a client slower than this is dropped (RabbitMQ: 10 s).
    pub handshake_timeout_ms: u64,
    /// Unacked deliveries one channel may hold; past it deliveries to the channel wait for acks
    /// (0 = no limit, as RabbitMQ; prefetch is the per-consumer form).
    pub unacked_max_per_channel: u32,
    /// A socket write that makes no progress for this long closes the connection (RabbitMQ's
    /// `tcp_listen_options.send_timeout`, 15 s), so a client that stops reading is let go.
    pub send_timeout_ms: u64,
    /// Wait before answering a failed login, so guessing passwords is slow (RabbitMQ-like).
    pub auth_failure_delay_ms: u64,
    /// Per-vhost limits by vhost name (RabbitMQ's `max-connections`, `max-queues`).
    pub vhosts: HashMap<String, VhostLimits>,
    /// Per-user limits by user name (RabbitMQ's user `max-connections`, `max-channels`).
    pub users: HashMap<String, UserLimits>,
}

/// RabbitMQ's vhost limits; 0 = no limit.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VhostLimits {
    pub max_connections: u32,
    pub max_queues: u32,
}

/// RabbitMQ's user limits; 0 = no limit.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UserLimits {
    pub max_connections: u32,
    /// Open channels across all of the user's connections.
    pub max_channels: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            channel_max: limits::CHANNEL_MAX,
            frame_max: limits::FRAME_MAX,
            heartbeat_s: limits::HEARTBEAT_S,
            message_size_max_bytes: limits::MESSAGE_SIZE_MAX_BYTES,
            memory_high_watermark: limits::MEMORY_HIGH_WATERMARK,
            memory_high_watermark_bytes: None,
            disk_free_limit_bytes: limits::DISK_FREE_LIMIT_BYTES,
            connection_max: 0,
            handshake_timeout_ms: limits::HANDSHAKE_TIMEOUT_MS,
            unacked_max_per_channel: 0,
            send_timeout_ms: limits::SEND_TIMEOUT_MS,
            auth_failure_delay_ms: limits::AUTH_FAILURE_DELAY_MS,
            vhosts: HashMap::new(),
            users: HashMap::new(),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            amqp_bind: IpAddr::from([127, 0, 0, 1]),
            amqp_port: 5672,
            http_bind: IpAddr::from([127, 0, 0, 1]),
            http_port: 15672,
            stream_port: None,
            data_dir: PathBuf::from("./warren-data"),
            vhosts: vec!["/".to_string()],
            users: vec![UserConfig {
                name: "guest".into(),
                password: "guest".into(),
                tags: vec!["administrator".into()],
            }],
            loopback_users: vec!["guest".into()],
            definitions_file: None,
            limits: LimitsConfig::default(),
            tls: None,
            server_properties: ServerProperties::default(),
            node_name: full_node_name("warren"),
            cluster: None,
            consumer_timeout: limits::CONSUMER_TIMEOUT_MS,
            quorum_queues_on_machine: true,
            queue_master_locator: None,
            workers: None,
        }
    }
}

impl Config {
    /// This node's id for connection ids: exclusive queues name their owner by connection id,
    /// so ids must not repeat across nodes.
    pub fn connection_id_base(&self) -> u64 {
        if self.cluster.is_none() {
            return 0;
        }
        (warren_cluster::node_id(&self.node_name) & 0xFF_FFFF) << 40
    }

    /// The runtime's worker threads: `workers`, else one per core this process may use (as
    /// RabbitMQ runs one scheduler per core). On the 2-core machine, with the load generator on
    /// the same cores, one worker gave PerfTest and lavinmqperf about 10% more (S2P under
    /// PerfTest: 36k against 33k msg/s) and `warren perf`, whose generator needs little CPU,
    /// about 10% less (docs/benchmarks/notes/2026-11-27-persistent-confirms-and-workers.md);
    /// a broker alone on its machine has no generator to leave a core to.
    pub fn worker_threads(&self) -> usize {
        self.workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    pub fn from_toml(text: &str) -> Result<Config, String> {
        let mut c: Config = toml::from_str(text).map_err(|e| e.to_string())?;
        c.node_name = full_node_name(&c.node_name);
        c.validate()?;
        Ok(c)
    }

    pub fn validate(&self) -> Result<(), String> {
        if !self.quorum_queues_on_machine {
            return Err(
                "quorum_queues_on_machine = false is no longer supported: replicated \
                 queues always run on the replicated queue machine (the earlier form was \
                 removed; queues it wrote are carried over at boot); remove the setting"
                    .into(),
            );
        }
        if let Some(l) = &self.queue_master_locator {
            const KNOWN: [&str; 5] = [
                "client-local",
                "min-masters",
                "random",
                "balanced",
                "least-leaders",
            ];
            if !KNOWN.contains(&l.as_str()) {
                return Err(format!(
                    "queue_master_locator must be one of {}, not '{l}'",
                    KNOWN.join(", ")
                ));
            }
        }
        if self.workers == Some(0) {
            return Err("workers must be at least 1".into());
        }
        if self.limits.frame_max != 0
            && self.limits.frame_max < warren_protocol::frame::FRAME_MIN_SIZE
        {
            return Err(format!(
                "limits.frame_max must be 0 or at least {}",
                warren_protocol::frame::FRAME_MIN_SIZE
            ));
        }
        if !(self.limits.memory_high_watermark > 0.0 && self.limits.memory_high_watermark <= 1.0) {
            return Err("limits.memory_high_watermark must be a fraction of RAM in (0, 1]".into());
        }
        if self.limits.handshake_timeout_ms == 0 || self.limits.send_timeout_ms == 0 {
            return Err(
                "limits.handshake_timeout_ms and limits.send_timeout_ms must be above 0".into(),
            );
        }
        if let Some(t) = &self.tls {
            if t.verify == TlsVerify::VerifyPeer && t.ca_file.is_none() {
                return Err("tls.verify = \"verify_peer\" needs tls.ca_file".into());
            }
            if t.port == self.amqp_port && t.bind.unwrap_or(self.amqp_bind) == self.amqp_bind {
                return Err("tls.port must differ from amqp_port".into());
            }
        }
        let (name, host) = self
            .node_name
            .split_once('@')
            .unwrap_or((&self.node_name, "x"));
        if name.is_empty()
            || host.is_empty()
            || host.contains('@')
            || self
                .node_name
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(format!(
                "node_name must be NAME@HOST (or NAME) without spaces, got {:?}",
                self.node_name
            ));
        }
        if let Some(c) = &self.cluster {
            if c.cookie.as_deref() == Some("") {
                return Err("cluster.cookie must not be empty".into());
            }
            for p in &c.peers {
                if p.rsplit_once(':')
                    .and_then(|(_, port)| port.parse::<u16>().ok())
                    .is_none()
                {
                    return Err(format!("cluster.peers: {p:?} is not HOST:PORT"));
                }
            }
        }
        if self.vhosts.is_empty() {
            return Err("at least one vhost must be configured".into());
        }
        if self.server_properties.product.is_empty() {
            return Err("server_properties.product must not be empty".into());
        }
        if !is_plain_version(&self.server_properties.version) {
            return Err(format!(
                "server_properties.version must be a plain x.y.z version of digits (such as \"3.10.8\"), got {:?}",
                self.server_properties.version
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_overrides_defaults() {
        let c = Config::from_toml(
            "amqp_port = 6000\n[limits]\nheartbeat_s = 5\n[[users]]\nname='a'\npassword='b'\n",
        )
        .expect("valid");
        assert_eq!(c.amqp_port, 6000);
        assert_eq!(c.limits.heartbeat_s, 5);
        assert_eq!(c.limits.channel_max, limits::CHANNEL_MAX);
        assert_eq!(c.users.len(), 1);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        assert!(Config::from_toml("amqp_prot = 1").is_err());
        assert!(Config::from_toml("[limits]\nframe_max = 100").is_err());
        assert!(Config::from_toml("[limits.vhosts.'/']\nmax_queus = 1").is_err());
        assert!(Config::from_toml("[limits]\nsend_timeout_ms = 0").is_err());
        // The earlier form of replicated queues is gone: only `true` is taken.
        assert!(Config::from_toml("quorum_queues_on_machine = true").is_ok());
        let e = Config::from_toml("quorum_queues_on_machine = false").expect_err("refused");
        assert!(e.contains("no longer supported"), "{e}");
    }

    #[test]
    fn node_name_defaults_to_the_host_and_gets_one_appended() {
        let host = short_hostname();
        assert_eq!(Config::default().node_name, format!("warren@{host}"));
        let c = Config::from_toml("node_name = \"rabbit\"\n").expect("valid");
        assert_eq!(c.node_name, format!("rabbit@{host}"));
        let c = Config::from_toml("node_name = \"n1@box\"\n").expect("valid");
        assert_eq!(c.node_name, "n1@box");
        assert!(Config::from_toml("node_name = \"n1@\"\n").is_err());
    }

    #[test]
    fn server_properties_default_and_override() {
        let c = Config::default();
        assert_eq!(c.server_properties.product, "Warren");
        assert!(c.validate().is_ok(), "the crate's own version is x.y.z");
        let c = Config::from_toml(
            "[server_properties]\nproduct = \"RabbitMQ\"\nversion = \"3.10.8\"\n",
        )
        .expect("valid");
        assert_eq!(c.server_properties.product, "RabbitMQ");
        assert_eq!(c.server_properties.version, "3.10.8");
        for bad in [
            "3.10",
            "3.10.8-rc1",
            "v3.10.8",
            "3..8",
            "",
            "3.10.8.1",
            "３.1.0",
        ] {
            let text = format!("[server_properties]\nversion = {bad:?}\n");
            assert!(Config::from_toml(&text).is_err(), "{bad:?} accepted");
        }
        assert!(Config::from_toml("[server_properties]\nproduct = \"\"\n").is_err());
        assert!(Config::from_toml("[server_properties]\nplatform = \"x\"\n").is_err());
    }

    #[test]
    fn queue_master_locator_takes_rabbitmqs_locators_only() {
        assert_eq!(Config::default().queue_master_locator, None);
        let c = Config::from_toml("queue_master_locator = \"min-masters\"\n").expect("valid");
        assert_eq!(c.queue_master_locator.as_deref(), Some("min-masters"));
        let e = Config::from_toml("queue_master_locator = \"elsewhere\"\n").expect_err("refused");
        assert!(e.contains("queue_master_locator must be one of"), "{e}");
    }

    #[test]
    fn workers_default_to_the_cores_and_zero_is_refused() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(Config::default().worker_threads(), cores);
        let c = Config::from_toml("workers = 3\n").expect("valid");
        assert_eq!(c.worker_threads(), 3);
        let e = Config::from_toml("workers = 0\n").expect_err("refused");
        assert!(e.contains("workers must be at least 1"), "{e}");
    }

    #[test]
    fn consumer_timeout_defaults_to_rabbitmqs_and_zero_disables() {
        assert_eq!(Config::default().consumer_timeout, 1_800_000);
        let c = Config::from_toml("consumer_timeout = 0\n").expect("valid");
        assert_eq!(c.consumer_timeout, 0);
        let c = Config::from_toml("consumer_timeout = 1500\n").expect("valid");
        assert_eq!(c.consumer_timeout, 1500);
        assert!(Config::from_toml("consumer_timeout = -1\n").is_err());
        assert!(Config::from_toml("consumer_timeout = \"30m\"\n").is_err());
    }

    #[test]
    fn per_vhost_and_user_limits() {
        let c = Config::from_toml(
            "[limits]\nconnection_max = 9\n[limits.vhosts.'/']\nmax_queues = 5\n[limits.users.guest]\nmax_connections = 2\n",
        )
        .expect("valid");
        assert_eq!(c.limits.connection_max, 9);
        assert_eq!(c.limits.vhosts["/"].max_queues, 5);
        assert_eq!(c.limits.vhosts["/"].max_connections, 0);
        assert_eq!(c.limits.users["guest"].max_connections, 2);
    }
}
