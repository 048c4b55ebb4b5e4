//! The flags, as clap declares them: PerfTest's, with PerfTest's names, defaults and meaning,
//! and Warren's own (modes and outputs). Declarations only; [`validate`](super::validate)
//! checks them against each other.

use clap::{ArgAction, Parser};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "warren perf",
    disable_help_flag = true,
    about = "AMQP 0-9-1 load generator that takes RabbitMQ PerfTest's flags (-h is the URI; help is --help)",
    after_help = "PerfTest's multi-letter short flags work as in PerfTest: -qp, -qpf, -qpt, -ad, -qa, -qq, -prsd, -ew.\n\
                  Latency is end to end: the producer writes a send timestamp into the first 12 bytes of every body."
)]
pub struct Args {
    /// Producer count.
    #[arg(short = 'x', long = "producers", default_value_t = 1)]
    pub producers: u32,
    /// Consumer count.
    #[arg(short = 'y', long = "consumers", default_value_t = 1)]
    pub consumers: u32,
    /// Queue name [default: a server-named queue per consumer].
    #[arg(short = 'u', long = "queue", allow_hyphen_values = true)]
    pub queue: Option<String>,
    /// Exchange name.
    #[arg(short = 'e', long = "exchange", default_value = "direct")]
    pub exchange: String,
    /// Exchange type.
    #[arg(short = 't', long = "type", default_value = "direct")]
    pub exchange_type: String,
    /// Routing key [default: a random UUID, or the queue name with --queue-pattern].
    #[arg(short = 'k', long = "routing-key", allow_hyphen_values = true)]
    pub routing_key: Option<String>,
    /// Message size in bytes (minimum 12: sequence number and send timestamp; 0, PerfTest's
    /// default, means 12).
    #[arg(short = 's', long = "size", default_value_t = 12)]
    pub size: usize,
    /// Rate limit of each producer, msg/s [default: no limit].
    #[arg(short = 'r', long = "rate")]
    pub rate: Option<f64>,
    /// With a rate: send the messages due in a train every N microseconds. 1000 (the default)
    /// is the runtime timer's tick; below it each paced producer has a thread of its own that
    /// wakes it, which costs CPU (measured in docs/benchmarks/notes) but keeps trains short, so
    /// a train's last message does not wait behind the rest of a millisecond's worth.
    #[arg(long = "pacing-us", default_value_t = 1000)]
    pub pacing_us: u64,
    /// Publishing interval in seconds (one message per interval per producer).
    #[arg(short = 'P', long = "publishing-interval")]
    pub publishing_interval: Option<f64>,
    /// Message flag: persistent (and durable queues) or mandatory; repeat for both.
    #[arg(short = 'f', long = "flag", value_parser = ["persistent", "mandatory"])]
    pub flags: Vec<String>,
    /// Publisher confirms with at most this many unconfirmed messages per producer (-1: off).
    #[arg(short = 'c', long = "confirm", default_value_t = -1, allow_negative_numbers = true)]
    pub confirm: i64,
    /// Consumer prefetch count (0: unlimited).
    #[arg(short = 'q', long = "qos", default_value_t = 0)]
    pub qos: u16,
    /// Consumers use automatic acknowledgement.
    #[arg(short = 'a', long = "autoack")]
    pub autoack: bool,
    /// Ack with multiple=true every N messages (0: ack each message).
    #[arg(short = 'A', long = "multi-ack-every", default_value_t = 0)]
    pub multi_ack_every: u32,
    /// Run duration in seconds [default: until -C/-D are reached, or Ctrl-C].
    #[arg(short = 'z', long = "time")]
    pub time: Option<u64>,
    /// Messages each producer sends (0: no limit).
    #[arg(short = 'C', long = "pmessages", default_value_t = 0)]
    pub pmessages: u64,
    /// Messages each consumer receives before it stops (0: no limit).
    #[arg(short = 'D', long = "cmessages", default_value_t = 0)]
    pub cmessages: u64,
    /// Connection URI(s), comma separated; connections are spread across them.
    #[arg(short = 'h', long = "uri", value_delimiter = ',')]
    pub uri: Vec<String>,
    /// Connection URIs, comma separated (PerfTest's -H; same as -h here).
    #[arg(short = 'H', long = "uris", value_delimiter = ',')]
    pub uris: Vec<String>,
    /// Queue name pattern (printf style, e.g. 'perf-test-%d'); producers and consumers are
    /// spread round-robin over the queues.
    #[arg(long = "queue-pattern")]
    pub queue_pattern: Option<String>,
    /// First index of --queue-pattern (inclusive).
    #[arg(long = "queue-pattern-from")]
    pub queue_pattern_from: Option<i64>,
    /// Last index of --queue-pattern (inclusive).
    #[arg(long = "queue-pattern-to")]
    pub queue_pattern_to: Option<i64>,
    /// Simulated processing time per message in each consumer, microseconds.
    #[arg(short = 'L', long = "consumer-latency", default_value_t = 0)]
    pub consumer_latency_us: u64,
    /// Each producer starts after a random delay of up to this many seconds.
    #[arg(long = "producer-random-start-delay", default_value_t = 0)]
    pub producer_random_start_delay_s: u64,
    /// Queue arguments, k=v,k=v (integers are sent as numbers, true/false as booleans).
    #[arg(long = "queue-args")]
    pub queue_args: Option<String>,
    /// basic.consume arguments, k=v,k=v (e.g. x-stream-offset=first for a stream).
    #[arg(long = "consumer-args")]
    pub consumer_args: Option<String>,
    /// Whether declared queues are auto-delete (true or false).
    #[arg(long = "auto-delete", default_value = "true", value_parser = parse_bool, action = ArgAction::Set)]
    pub auto_delete: bool,
    /// Use existing exchange and queues when they exist instead of declaring them.
    #[arg(short = 'p', long = "predeclared")]
    pub predeclared: bool,
    /// Quorum queues: x-queue-type=quorum, durable, not auto-delete (PerfTest's -qq); needs
    /// --queue or --queue-pattern (a broker names classic queues only).
    #[arg(long = "quorum-queue")]
    pub quorum_queue: bool,
    /// End the run when consumers have been idle for 1 s (empty or idle; both mean idle here).
    #[arg(long = "exit-when", value_parser = ["empty", "idle"])]
    pub exit_when: Option<String>,
    /// Sampling interval in seconds.
    #[arg(short = 'i', long = "interval", default_value_t = 1)]
    pub interval_s: u64,
    /// Test id printed on every line.
    #[arg(short = 'd', long = "id")]
    pub id: Option<String>,
    /// Accepted for PerfTest compatibility; no effect (one tokio runtime does all I/O).
    #[arg(long = "nio-threads", hide = true)]
    pub nio_threads: Option<String>,
    #[arg(long = "nio-thread-pool", hide = true)]
    pub nio_thread_pool: Option<String>,
    #[arg(long = "consumers-thread-pools", hide = true)]
    pub consumers_thread_pools: Option<String>,
    #[arg(long = "heartbeat-sender-threads", hide = true)]
    pub heartbeat_sender_threads: Option<String>,

    /// Write every per-second sample and the summary to FILE as JSON.
    #[arg(long = "json", value_name = "FILE")]
    pub json: Option<std::path::PathBuf>,
    /// Write a self-contained HTML report with charts to FILE.
    #[arg(long = "report", value_name = "FILE")]
    pub report: Option<std::path::PathBuf>,
    /// Write the charts as one SVG file (for docs).
    #[arg(long = "svg", value_name = "FILE")]
    pub svg: Option<std::path::PathBuf>,
    /// Rate attempted vs achieved vs latency: run each total rate (msg/s, or "unlimited") for
    /// -z seconds [default list: 1000,5000,10000,20000,40000,80000,unlimited; -z default 10].
    #[arg(long = "sweep", value_name = "RATES", num_args = 0..=1, default_missing_value = DEFAULT_SWEEP)]
    pub sweep: Option<String>,
    /// Growing intensity: total rate FROM, FROM+BY, ... (up to TO) for -z seconds each, until a
    /// step is not held; reports the highest rate held with p99 under --p99-bound-ms.
    #[arg(long = "steps", value_name = "FROM:BY[:TO]", num_args = 0..=1, default_missing_value = "1000:1000")]
    pub steps: Option<String>,
    /// Latency bound for --steps, milliseconds.
    #[arg(long = "p99-bound-ms", default_value_t = 100.0)]
    pub p99_bound_ms: f64,
    /// Run the same scenario against this second broker, alternately, and print the ratios.
    #[arg(long = "compare", value_name = "URI2")]
    pub compare: Option<String>,
    /// Rounds of --compare (each round runs A then B).
    #[arg(long = "rounds", default_value_t = 3)]
    pub rounds: u32,
    /// Print help.
    #[arg(long = "help", action = ArgAction::Help)]
    pub help: Option<bool>,
}

pub const DEFAULT_SWEEP: &str = "1000,5000,10000,20000,40000,80000,unlimited";

fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("expected true or false, got '{s}'")),
    }
}
