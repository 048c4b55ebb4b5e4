//! Command line: PerfTest's flags with PerfTest's meaning, plus Warren's modes and outputs.
//!
//! PerfTest (Apache Commons CLI) has multi-letter short flags (`-qp`, `-qpf`, `-ad`, ...), which
//! clap cannot express; [`normalise`] rewrites them to their long forms before parsing. `-h` is
//! the URI, as in PerfTest, so help is only `--help`.

use std::ffi::OsString;

use clap::{ArgAction, Parser};
use warren_protocol::{FieldTable, FieldValue};

use crate::uri::AmqpUri;

/// PerfTest's multi-letter short flags and the long flag each one means.
const MULTI_LETTER: &[(&str, &str)] = &[
    ("-qp", "--queue-pattern"),
    ("-qpf", "--queue-pattern-from"),
    ("-qpt", "--queue-pattern-to"),
    ("-ad", "--auto-delete"),
    ("-qa", "--queue-args"),
    ("-ca", "--consumer-args"),
    ("-qq", "--quorum-queue"),
    ("-prsd", "--producer-random-start-delay"),
    ("-ew", "--exit-when"),
    ("-niot", "--nio-threads"),
    ("-niotp", "--nio-thread-pool"),
    ("-ctp", "--consumers-thread-pools"),
    ("-hst", "--heartbeat-sender-threads"),
];

/// Rewrites PerfTest's multi-letter short flags to long flags. Only whole arguments that are a
/// known flag are rewritten, so values are left alone.
pub fn normalise(args: Vec<OsString>) -> Vec<OsString> {
    args.into_iter()
        .map(|a| {
            match a
                .to_str()
                .and_then(|s| MULTI_LETTER.iter().find(|(short, _)| *short == s))
            {
                Some((_, long)) => OsString::from(*long),
                None => a,
            }
        })
        .collect()
}

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
    /// Message size in bytes (minimum 12: sequence number and send timestamp).
    #[arg(short = 's', long = "size", default_value_t = 12)]
    pub size: usize,
    /// Rate limit of each producer, msg/s [default: no limit].
    #[arg(short = 'r', long = "rate")]
    pub rate: Option<f64>,
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
    /// Quorum queues: x-queue-type=quorum, durable, not auto-delete (PerfTest's -qq).
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

/// The mode of a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    Single,
    /// Total rates in msg/s; `None` is unlimited.
    Sweep(Vec<Option<f64>>),
    Steps {
        from: f64,
        by: f64,
        to: Option<f64>,
    },
    Compare(AmqpUri),
}

/// How producers and consumers find their queues (PerfTest's topology handlers).
#[derive(Debug, Clone, PartialEq)]
pub enum Topology {
    /// One named queue (`-u`), or a server-named queue per consumer (`None`); one routing key.
    Fixed {
        queue: Option<String>,
        routing_key: String,
    },
    /// `--queue-pattern`: queues declared up front, each bound with its own name as routing key.
    Pattern { queues: Vec<String> },
}

/// A validated scenario: what one run does.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub uris: Vec<AmqpUri>,
    pub producers: u32,
    pub consumers: u32,
    pub exchange: String,
    pub exchange_type: String,
    pub topology: Topology,
    pub body_size: usize,
    /// Per producer, msg/s.
    pub rate: Option<f64>,
    pub persistent: bool,
    pub mandatory: bool,
    /// Max unconfirmed per producer; `None`: no confirms.
    pub confirm: Option<u32>,
    pub qos: u16,
    pub autoack: bool,
    pub multi_ack_every: u32,
    pub time_s: Option<u64>,
    pub pmessages: u64,
    pub cmessages: u64,
    pub consumer_latency_us: u64,
    pub producer_random_start_delay_s: u64,
    pub queue_args: FieldTable,
    pub consumer_args: FieldTable,
    pub durable: bool,
    pub auto_delete: bool,
    pub predeclared: bool,
    pub exit_when_idle: bool,
    pub interval_s: u64,
    pub id: String,
}

/// Everything a validated command line asks for.
#[derive(Debug, Clone)]
pub struct Options {
    pub scenario: Scenario,
    pub mode: Mode,
    pub p99_bound_ms: f64,
    pub rounds: u32,
    pub json: Option<std::path::PathBuf>,
    pub report: Option<std::path::PathBuf>,
    pub svg: Option<std::path::PathBuf>,
    /// The command line as given, for reports.
    pub command_line: String,
}

/// Parse outcome: options, or what to print and the exit code (help: 0, usage errors: 2).
pub enum Parsed {
    Run(Box<Options>),
    Exit { text: String, code: i32 },
}

/// Parses and validates `warren perf` arguments (without the program name).
pub fn parse(args: Vec<OsString>) -> Parsed {
    let command_line = args
        .iter()
        .map(|a| mask_password(&a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ");
    let mut argv = vec![OsString::from("warren perf")];
    argv.extend(normalise(args));
    let parsed = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            return Parsed::Exit {
                text: e.render().to_string(),
                code,
            };
        }
    };
    match validate(parsed, command_line) {
        Ok(o) => Parsed::Run(Box::new(o)),
        Err(msg) => Parsed::Exit {
            text: format!("error: {msg}\n\nFor more information, try '--help'.\n"),
            code: 2,
        },
    }
}

/// `amqp://user:secret@host` -> `amqp://user:***@host`, for reports (each URI of a list).
pub fn mask_password(arg: &str) -> String {
    arg.split(',')
        .map(|part| {
            let Some(rest) = part.strip_prefix("amqp://") else {
                return part.to_string();
            };
            match (rest.find(':'), rest.find('@')) {
                (Some(c), Some(at)) if c < at => {
                    format!("amqp://{}:***{}", &rest[..c], &rest[at..])
                }
                _ => part.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Checks for contradictions and turns flags into a [`Scenario`] and a [`Mode`].
pub fn validate(a: Args, command_line: String) -> Result<Options, String> {
    let mut uri_texts: Vec<String> = a.uri.iter().chain(a.uris.iter()).cloned().collect();
    uri_texts.retain(|u| !u.trim().is_empty());
    if uri_texts.is_empty() {
        uri_texts.push("amqp://localhost".into());
    }
    let uris = uri_texts
        .iter()
        .map(|u| AmqpUri::parse(u.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    if a.producers == 0 && a.consumers == 0 {
        return Err("nothing to do: --producers and --consumers are both 0".into());
    }
    if a.rate.is_some() && a.publishing_interval.is_some() {
        return Err("--rate and --publishing-interval both set the producer rate; give one".into());
    }
    let rate = match (a.rate, a.publishing_interval) {
        (Some(r), _) if !(r > 0.0 && r.is_finite()) => {
            return Err(format!("--rate must be a positive number, got {r}"))
        }
        (Some(r), _) => Some(r),
        (_, Some(p)) if !(p > 0.0 && p.is_finite()) => {
            return Err(format!(
                "--publishing-interval must be a positive number, got {p}"
            ))
        }
        (_, Some(p)) => Some(1.0 / p),
        _ => None,
    };
    let confirm = match a.confirm {
        -1 => None,
        n if n >= 1 && n <= u32::MAX as i64 => Some(n as u32),
        n => {
            return Err(format!(
                "--confirm must be -1 (off) or at least 1 unconfirmed message, got {n}"
            ))
        }
    };
    if a.autoack && a.multi_ack_every > 0 {
        return Err(
            "--autoack and --multi-ack-every contradict: with autoack nothing is acked".into(),
        );
    }
    if !a.autoack && a.qos > 0 && a.multi_ack_every > a.qos as u32 {
        return Err(format!(
            "--multi-ack-every {} is above --qos {}: consumers would stall waiting for messages the broker never sends",
            a.multi_ack_every, a.qos
        ));
    }
    if a.size > 128 * 1024 * 1024 {
        return Err(format!("--size {} is above 128 MiB", a.size));
    }
    if a.interval_s == 0 {
        return Err("--interval must be at least 1 second".into());
    }
    if a.time == Some(0) {
        return Err("--time must be at least 1 second".into());
    }
    let persistent = a.flags.iter().any(|f| f == "persistent") || a.quorum_queue;
    let mandatory = a.flags.iter().any(|f| f == "mandatory");
    let mut queue_args = match &a.queue_args {
        Some(s) => parse_queue_args(s)?,
        None => FieldTable::new(),
    };
    if a.quorum_queue {
        queue_args.insert("x-queue-type", FieldValue::LongStr("quorum".into()));
    }
    let auto_delete = a.auto_delete && !a.quorum_queue;
    let topology = match (&a.queue_pattern, &a.queue) {
        (Some(_), Some(_)) => {
            return Err("--queue and --queue-pattern contradict: give one".into());
        }
        (Some(pattern), None) => {
            let (Some(from), Some(to)) = (a.queue_pattern_from, a.queue_pattern_to) else {
                return Err(
                    "--queue-pattern needs --queue-pattern-from and --queue-pattern-to".into(),
                );
            };
            if from > to {
                return Err(format!(
                    "--queue-pattern-from {from} is above --queue-pattern-to {to}"
                ));
            }
            if to - from >= 100_000 {
                return Err("--queue-pattern range is above 100,000 queues".into());
            }
            if a.routing_key.is_some() {
                return Err("--routing-key and --queue-pattern contradict: with a pattern each queue's name is its routing key".into());
            }
            let queues = (from..=to)
                .map(|i| format_pattern(pattern, i))
                .collect::<Result<Vec<_>, _>>()?;
            Topology::Pattern { queues }
        }
        (None, queue) => {
            if a.queue_pattern_from.is_some() || a.queue_pattern_to.is_some() {
                return Err("--queue-pattern-from/--queue-pattern-to need --queue-pattern".into());
            }
            Topology::Fixed {
                queue: queue.clone(),
                routing_key: a.routing_key.clone().unwrap_or_else(random_uuid),
            }
        }
    };
    let modes = [a.sweep.is_some(), a.steps.is_some(), a.compare.is_some()]
        .iter()
        .filter(|b| **b)
        .count();
    if modes > 1 {
        return Err("--sweep, --steps and --compare are separate modes: give one".into());
    }
    let mode = if let Some(list) = &a.sweep {
        if rate.is_some() {
            return Err("--sweep sets the rate of each step; drop --rate".into());
        }
        if a.producers == 0 {
            return Err("--sweep needs at least one producer".into());
        }
        Mode::Sweep(parse_sweep(list)?)
    } else if let Some(spec) = &a.steps {
        if rate.is_some() {
            return Err("--steps sets the rate of each step; drop --rate".into());
        }
        if a.producers == 0 || a.consumers == 0 {
            return Err(
                "--steps needs producers and consumers (it measures end-to-end latency)".into(),
            );
        }
        if a.p99_bound_ms.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
            return Err("--p99-bound-ms must be positive".into());
        }
        let (from, by, to) = parse_steps(spec)?;
        Mode::Steps { from, by, to }
    } else if let Some(u) = &a.compare {
        if a.time.is_none() && a.pmessages == 0 && a.cmessages == 0 {
            return Err(
                "--compare needs a bounded run: give --time, --pmessages or --cmessages".into(),
            );
        }
        if a.rounds == 0 {
            return Err("--rounds must be at least 1".into());
        }
        Mode::Compare(AmqpUri::parse(u)?)
    } else {
        Mode::Single
    };
    let time_s = match mode {
        Mode::Sweep(_) | Mode::Steps { .. } => Some(a.time.unwrap_or(10)),
        _ => a.time,
    };
    let scenario = Scenario {
        uris,
        producers: a.producers,
        consumers: a.consumers,
        exchange: a.exchange,
        exchange_type: a.exchange_type,
        topology,
        body_size: a.size.max(crate::body::HEADER_BYTES),
        rate,
        persistent,
        mandatory,
        confirm,
        qos: a.qos,
        autoack: a.autoack,
        multi_ack_every: a.multi_ack_every,
        time_s,
        pmessages: a.pmessages,
        cmessages: a.cmessages,
        consumer_latency_us: a.consumer_latency_us,
        producer_random_start_delay_s: a.producer_random_start_delay_s,
        queue_args,
        consumer_args: match &a.consumer_args {
            Some(s) => parse_queue_args(s)?,
            None => FieldTable::new(),
        },
        durable: persistent,
        auto_delete,
        predeclared: a.predeclared,
        exit_when_idle: a.exit_when.is_some(),
        interval_s: a.interval_s,
        id: a.id.unwrap_or_else(|| "warren-perf".into()),
    };
    Ok(Options {
        scenario,
        mode,
        p99_bound_ms: a.p99_bound_ms,
        rounds: a.rounds,
        json: a.json,
        report: a.report,
        svg: a.svg,
        command_line,
    })
}

/// `k=v,k=v`; integers become signed 64-bit numbers (`l`), true/false booleans, the rest strings.
pub fn parse_queue_args(s: &str) -> Result<FieldTable, String> {
    let mut t = FieldTable::new();
    for pair in s.split(',').filter(|p| !p.trim().is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(format!(
                "--queue-args: '{pair}' is not key=value (expected e.g. x-max-length=10)"
            ));
        };
        let (k, v) = (k.trim(), v.trim());
        if k.is_empty() {
            return Err(format!("--queue-args: empty key in '{pair}'"));
        }
        let value = if let Ok(n) = v.parse::<i64>() {
            FieldValue::I64(n)
        } else if v == "true" || v == "false" {
            FieldValue::Bool(v == "true")
        } else {
            FieldValue::LongStr(bytes::Bytes::copy_from_slice(v.as_bytes()))
        };
        t.insert(k, value);
    }
    Ok(t)
}

/// Java's `String.format` for the one integer argument PerfTest passes: `%d`, `%Nd`, `%0Nd`,
/// `%s` and `%%`.
pub fn format_pattern(pattern: &str, i: i64) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = pattern.chars().peekable();
    let mut used = false;
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            out.push('%');
            continue;
        }
        let mut zero = false;
        let mut width = String::new();
        if chars.peek() == Some(&'0') {
            zero = true;
            chars.next();
        }
        while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            width.push(*d);
            chars.next();
        }
        let w: usize = if width.is_empty() {
            0
        } else {
            width
                .parse()
                .map_err(|_| format!("--queue-pattern '{pattern}': bad width"))?
        };
        match chars.next() {
            Some('d') | Some('s') => {
                used = true;
                if zero {
                    out.push_str(&format!("{i:0w$}"));
                } else {
                    out.push_str(&format!("{i:w$}"));
                }
            }
            other => {
                return Err(format!(
                    "--queue-pattern '{pattern}': unsupported conversion '%{}' (use %d, e.g. 'perf-test-%d')",
                    other.map(String::from).unwrap_or_default()
                ))
            }
        }
    }
    if !used {
        return Err(format!(
            "--queue-pattern '{pattern}' has no %d for the queue index"
        ));
    }
    Ok(out)
}

fn parse_rate(s: &str, what: &str) -> Result<f64, String> {
    let s = s.trim().replace('_', "");
    let (num, mult) = match s.strip_suffix(['k', 'K']) {
        Some(n) => (n.to_string(), 1000.0),
        None => (s.clone(), 1.0),
    };
    match num.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v * mult),
        _ => Err(format!("{what}: '{s}' is not a positive rate")),
    }
}

pub fn parse_sweep(list: &str) -> Result<Vec<Option<f64>>, String> {
    let steps = list
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| match s.trim() {
            "unlimited" | "max" => Ok(None),
            v => parse_rate(v, "--sweep").map(Some),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if steps.is_empty() {
        return Err("--sweep: no rates given".into());
    }
    Ok(steps)
}

pub fn parse_steps(spec: &str) -> Result<(f64, f64, Option<f64>), String> {
    let parts: Vec<&str> = spec.split(':').collect();
    if !(2..=3).contains(&parts.len()) {
        return Err(format!(
            "--steps '{spec}': expected FROM:BY or FROM:BY:TO (msg/s), e.g. 1000:1000:20000"
        ));
    }
    let from = parse_rate(parts[0], "--steps FROM")?;
    let by = parse_rate(parts[1], "--steps BY")?;
    let to = match parts.get(2) {
        Some(t) => Some(parse_rate(t, "--steps TO")?),
        None => None,
    };
    if let Some(t) = to {
        if t < from {
            return Err(format!("--steps: TO {t} is below FROM {from}"));
        }
    }
    Ok((from, by, to))
}

/// A random UUID (v4 layout), PerfTest's default routing key.
pub fn random_uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "{}-{}-{}-{}-{}",
        h(0..4),
        h(4..6),
        h(6..8),
        h(8..10),
        h(10..16)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(args: &[&str]) -> Result<Options, (String, i32)> {
        match parse(args.iter().map(OsString::from).collect()) {
            Parsed::Run(o) => Ok(*o),
            Parsed::Exit { text, code } => Err((text, code)),
        }
    }

    fn err(args: &[&str]) -> String {
        match opts(args) {
            Ok(o) => panic!("{args:?} accepted: {o:?}"),
            Err((text, code)) => {
                assert_eq!(code, 2, "{args:?}: {text}");
                text
            }
        }
    }

    #[test]
    fn defaults_follow_perftest() {
        let o = opts(&[]).expect("defaults");
        let s = o.scenario;
        assert_eq!((s.producers, s.consumers), (1, 1));
        assert_eq!(s.exchange, "direct");
        assert_eq!(s.exchange_type, "direct");
        assert_eq!(s.body_size, 12);
        assert_eq!(s.confirm, None);
        assert!(s.auto_delete && !s.durable && !s.autoack);
        assert_eq!(s.uris.len(), 1);
        assert_eq!(s.uris[0].port, 5672);
        assert_eq!(s.uris[0].vhost, "/");
        match s.topology {
            Topology::Fixed { queue, routing_key } => {
                assert_eq!(queue, None, "server-named queue without -u");
                assert_eq!(routing_key.len(), 36, "UUID routing key: {routing_key}");
            }
            t => panic!("{t:?}"),
        }
        assert_eq!(o.mode, Mode::Single);
    }

    #[test]
    fn h_is_the_uri_and_takes_several() {
        let o = opts(&[
            "-h",
            "amqp://u:p@127.0.0.1:5673/%2f,amqp://127.0.0.1:5674/v",
            "-x",
            "2",
        ])
        .expect("parses");
        let u = &o.scenario.uris;
        assert_eq!(u.len(), 2);
        assert_eq!(
            (u[0].user.as_str(), u[0].port, u[0].vhost.as_str()),
            ("u", 5673, "/")
        );
        assert_eq!((u[1].port, u[1].vhost.as_str()), (5674, "v"));
        assert_eq!(o.scenario.producers, 2);
    }

    #[test]
    fn published_cluster_sizing_command_parses() {
        let o = opts(&[
            "-x",
            "200",
            "-y",
            "200",
            "--queue-pattern",
            "perf-test-%d",
            "--queue-pattern-from",
            "1",
            "--queue-pattern-to",
            "100",
            "-f",
            "persistent",
            "-q",
            "1000",
            "-c",
            "1000",
            "-s",
            "1024",
            "--rate",
            "50",
            "--consumer-latency",
            "10000",
            "-z",
            "60",
        ])
        .expect("parses");
        let s = o.scenario;
        assert_eq!(
            (s.producers, s.consumers, s.qos, s.confirm),
            (200, 200, 1000, Some(1000))
        );
        assert!(s.persistent && s.durable);
        assert_eq!(
            (s.body_size, s.rate, s.consumer_latency_us, s.time_s),
            (1024, Some(50.0), 10000, Some(60))
        );
        let Topology::Pattern { queues } = s.topology else {
            panic!("pattern")
        };
        assert_eq!(queues.len(), 100);
        assert_eq!(
            (queues[0].as_str(), queues[99].as_str()),
            ("perf-test-1", "perf-test-100")
        );
    }

    #[test]
    fn multi_letter_short_flags() {
        let o = opts(&[
            "-qp",
            "q-%03d",
            "-qpf",
            "1",
            "-qpt",
            "3",
            "-ad",
            "false",
            "-qa",
            "x-max-length=10,x-overflow=reject-publish,x-single-active-consumer=true",
            "-prsd",
            "2",
            "-ew",
            "empty",
            "-niot",
            "4",
            "-niotp",
            "6",
            "-ctp",
            "2",
            "-hst",
            "2",
            "-f",
            "persistent",
            "-f",
            "mandatory",
        ])
        .expect("parses");
        let s = o.scenario;
        let Topology::Pattern { queues } = &s.topology else {
            panic!("pattern")
        };
        assert_eq!(queues, &["q-001", "q-002", "q-003"]);
        assert!(!s.auto_delete && s.persistent && s.mandatory && s.exit_when_idle);
        assert_eq!(s.producer_random_start_delay_s, 2);
        assert_eq!(s.queue_args.get("x-max-length"), Some(&FieldValue::I64(10)));
        assert_eq!(
            s.queue_args.get("x-overflow"),
            Some(&FieldValue::LongStr("reject-publish".into()))
        );
        assert_eq!(
            s.queue_args.get("x-single-active-consumer"),
            Some(&FieldValue::Bool(true))
        );
        let o = opts(&["-qq", "-u", "q"]).expect("quorum");
        assert!(o.scenario.durable && !o.scenario.auto_delete);
        assert_eq!(
            o.scenario.queue_args.get("x-queue-type"),
            Some(&FieldValue::LongStr("quorum".into()))
        );
    }

    #[test]
    fn values_that_look_like_flags_are_values() {
        // Only whole arguments are rewritten: a routing key "-qp" stays what it is.
        assert_eq!(
            normalise(vec!["-k".into(), "x-qp".into(), "-qp".into()]),
            vec![
                OsString::from("-k"),
                "x-qp".into(),
                "--queue-pattern".into()
            ]
        );
        let o = opts(&["-k", "qp", "-u", "-qp-"]).expect("plain values");
        let Topology::Fixed { routing_key, queue } = o.scenario.topology else {
            panic!()
        };
        assert_eq!(
            (routing_key.as_str(), queue.as_deref()),
            ("qp", Some("-qp-"))
        );
    }

    #[test]
    fn help_is_long_only() {
        match parse(vec!["--help".into()]) {
            Parsed::Exit { text, code } => {
                assert_eq!(code, 0);
                assert!(
                    text.contains("--producers") && text.contains("--queue-pattern"),
                    "{text}"
                );
            }
            Parsed::Run(_) => panic!("--help ran"),
        }
        // -h without a value is an error, not help.
        assert!(err(&["-h"]).contains("-h"));
    }

    #[test]
    fn unknown_and_contradictory_flags_exit_2() {
        assert!(err(&["--no-such-flag"]).contains("--no-such-flag"));
        assert!(err(&["-x", "many"]).contains("many"));
        assert!(err(&["-f", "fast"]).contains("fast"));
        assert!(err(&["-ad", "maybe"]).contains("maybe"));
        assert!(err(&["-x", "0", "-y", "0"]).contains("nothing to do"));
        assert!(err(&["-u", "q", "-qp", "q-%d", "-qpf", "1", "-qpt", "2"]).contains("contradict"));
        assert!(err(&["-qp", "q-%d"]).contains("--queue-pattern-from"));
        assert!(err(&["-qp", "q-%d", "-qpf", "5", "-qpt", "2"]).contains("above"));
        assert!(err(&["-qp", "q", "-qpf", "1", "-qpt", "2"]).contains("%d"));
        assert!(err(&["-qpf", "1"]).contains("need --queue-pattern"));
        assert!(err(&["-a", "-A", "10"]).contains("autoack"));
        assert!(err(&["-q", "10", "-A", "100"]).contains("stall"));
        assert!(err(&["-c", "0"]).contains("--confirm"));
        assert!(err(&["-r", "10", "-P", "1"]).contains("give one"));
        assert!(err(&["-r", "0"]).contains("positive"));
        assert!(err(&["-r", "-5"]).contains("-5"));
        assert!(err(&["--sweep", "--steps"]).contains("separate modes"));
        assert!(err(&["--sweep", "-r", "100"]).contains("drop --rate"));
        assert!(err(&["--sweep", "1000,fast"]).contains("fast"));
        assert!(err(&["--steps", "1000"]).contains("FROM:BY"));
        assert!(err(&["--compare", "amqp://localhost:5673"]).contains("bounded"));
        assert!(err(&["-h", "http://localhost"]).contains("amqp://"));
        assert!(err(&["-qa", "x-max-length"]).contains("key=value"));
        assert!(err(&["-z", "0"]).contains("--time"));
    }

    #[test]
    fn sweep_and_steps_values() {
        let o = opts(&["--sweep"]).expect("default list");
        assert_eq!(
            o.mode,
            Mode::Sweep(vec![
                Some(1000.0),
                Some(5000.0),
                Some(10000.0),
                Some(20000.0),
                Some(40000.0),
                Some(80000.0),
                None
            ])
        );
        assert_eq!(o.scenario.time_s, Some(10), "steps default to 10 s");
        let o = opts(&["--sweep", "1k,2500,unlimited", "-z", "3"]).expect("list");
        assert_eq!(o.mode, Mode::Sweep(vec![Some(1000.0), Some(2500.0), None]));
        assert_eq!(o.scenario.time_s, Some(3));
        let o = opts(&["--steps", "500:250:2000", "--p99-bound-ms", "20"]).expect("steps");
        assert_eq!(
            o.mode,
            Mode::Steps {
                from: 500.0,
                by: 250.0,
                to: Some(2000.0)
            }
        );
        assert_eq!(o.p99_bound_ms, 20.0);
        let o = opts(&[
            "--compare",
            "amqp://localhost:5673",
            "-z",
            "5",
            "--rounds",
            "2",
        ])
        .expect("cmp");
        assert!(matches!(o.mode, Mode::Compare(ref u) if u.port == 5673));
    }

    #[test]
    fn passwords_are_masked_in_the_recorded_command() {
        assert_eq!(
            mask_password("amqp://u:s3cret@h:5672/%2f,amqp://h2"),
            "amqp://u:***@h:5672/%2f,amqp://h2"
        );
        let o = opts(&["-h", "amqp://u:s3cret@h:5672/%2f"]).expect("ok");
        assert!(!o.command_line.contains("s3cret"), "{}", o.command_line);
        assert_eq!(o.scenario.uris[0].password, "s3cret");
    }

    #[test]
    fn pattern_formatting() {
        assert_eq!(
            format_pattern("perf-test-%d", 7).as_deref(),
            Ok("perf-test-7")
        );
        assert_eq!(format_pattern("q%04d", 7).as_deref(), Ok("q0007"));
        assert_eq!(format_pattern("q%3d", 7).as_deref(), Ok("q  7"));
        assert_eq!(format_pattern("100%%-%s", 7).as_deref(), Ok("100%-7"));
        assert!(format_pattern("q-%x", 1).is_err());
    }

    #[test]
    fn uuid_shape() {
        let u = random_uuid();
        let parts: Vec<_> = u.split('-').map(str::len).collect();
        assert_eq!(parts, vec![8, 4, 4, 4, 12], "{u}");
        assert!(u.as_bytes()[14] == b'4');
    }
}
