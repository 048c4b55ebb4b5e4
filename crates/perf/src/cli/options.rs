//! Validation: flags checked against each other (a contradiction is a usage error, exit 2,
//! rather than a run that measures something else) and turned into what a run needs: a
//! [`Scenario`] and a [`Mode`], with the outputs asked for, as [`Options`].

use warren_protocol::{FieldTable, FieldValue};

use super::args::Args;
use super::values::{format_pattern, parse_queue_args, parse_steps, parse_sweep, random_uuid};
use crate::uri::AmqpUri;

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
    /// With a rate: how often a producer sends the messages due.
    pub pacing: std::time::Duration,
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
    if !(10..=1_000_000).contains(&a.pacing_us) {
        return Err(format!(
            "--pacing-us must be between 10 and 1000000 microseconds, got {}",
            a.pacing_us
        ));
    }
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
    // PerfTest sends 12 bytes when asked for fewer; a run that silently measures another size
    // than the one asked for is worse than a clear refusal. 0, PerfTest's default, still means
    // the smallest body, so PerfTest command lines that spell it out keep working.
    if a.size != 0 && a.size < crate::body::HEADER_BYTES {
        return Err(format!(
            "--size {} is below the minimum of {} bytes: every message carries a 4-byte sequence number and an 8-byte send timestamp",
            a.size,
            crate::body::HEADER_BYTES
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
            if queue.is_none() {
                unnamed_queue_type(&queue_args, a.quorum_queue)?;
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
        pacing: std::time::Duration::from_micros(a.pacing_us),
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

/// Without `--queue` each consumer declares a server-named queue, and a broker names classic
/// queues only (RabbitMQ: 406 `Cannot declare a server-named queue for type
/// rabbit_quorum_queue`): a quorum or stream queue needs a name, given before connecting.
fn unnamed_queue_type(queue_args: &FieldTable, quorum_flag: bool) -> Result<(), String> {
    let kind = match queue_args.get("x-queue-type") {
        Some(FieldValue::LongStr(b)) => String::from_utf8_lossy(b).into_owned(),
        _ => return Ok(()),
    };
    if kind == "classic" {
        return Ok(());
    }
    let what = if quorum_flag {
        "--quorum-queue (-qq)".to_string()
    } else {
        format!("--queue-args x-queue-type={kind}")
    };
    Err(format!(
        "{what} needs a named queue: give --queue (-u) or --queue-pattern (-qp); \
         the broker cannot name a {kind} queue for each consumer"
    ))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

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
        assert!(err(&["--pacing-us", "5"]).contains("between 10 and 1000000"));
        assert!(err(&["--sweep", "--steps"]).contains("separate modes"));
        assert!(err(&["--sweep", "-r", "100"]).contains("drop --rate"));
        assert!(err(&["--sweep", "1000,fast"]).contains("fast"));
        assert!(err(&["--steps", "1000"]).contains("FROM:BY"));
        assert!(err(&["--compare", "amqp://localhost:5673"]).contains("bounded"));
        assert!(err(&["-h", "http://localhost"]).contains("amqp://"));
        assert!(err(&["-qa", "x-max-length"]).contains("key=value"));
        assert!(err(&["-z", "0"]).contains("--time"));
        let e = err(&["-s", "5"]);
        assert!(
            e.contains("--size 5 is below the minimum of 12 bytes"),
            "{e}"
        );
        assert!(err(&["-s", "11"]).contains("minimum of 12"));
        let e = err(&["-qq"]);
        assert!(
            e.contains("--quorum-queue (-qq) needs a named queue"),
            "{e}"
        );
        assert!(e.contains("--queue (-u)"), "{e}");
        assert!(
            err(&["-qa", "x-queue-type=stream", "-x", "0"]).contains("cannot name a stream queue")
        );
    }

    #[test]
    fn the_smallest_size_and_named_quorum_queues_are_accepted() {
        assert_eq!(
            opts(&["-s", "12"]).expect("12 bytes").scenario.body_size,
            12
        );
        assert_eq!(
            opts(&["-s", "13"]).expect("13 bytes").scenario.body_size,
            13
        );
        // PerfTest's default, spelled out: the smallest body.
        assert_eq!(
            opts(&["-s", "0"])
                .expect("0: the smallest")
                .scenario
                .body_size,
            12
        );
        assert!(opts(&["-qq", "-u", "q"]).is_ok());
        assert!(opts(&["-qq", "-qp", "q-%d", "-qpf", "1", "-qpt", "2"]).is_ok());
        assert!(opts(&["-qa", "x-queue-type=classic"]).is_ok());
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
}
