//! One run of a scenario: topology, consumers (started first, as PerfTest does), producers,
//! sampling every interval, end conditions, and the summary.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::body;
use crate::cli::{Scenario, Topology};
use crate::client::{ClientError, Conn, CHANNEL};
use crate::consumer::{self, ConsumerSpec};
use crate::display::{micros, progress, sample_line, summary_lines, thousands, Output};
use crate::producer::{self, ProducerSpec};
use crate::stats::{Sample, Sampler, Stats, Summary};
use crate::uri::AmqpUri;

/// Consumers that received nothing for this long count as idle (end of a bounded run).
const IDLE: Duration = Duration::from_secs(1);
const TICK: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub label: String,
    pub uri: String,
    /// Total attempted rate (all producers), msg/s; `None`: unlimited.
    pub attempted_rate: Option<f64>,
    pub samples: Vec<Sample>,
    pub summary: Summary,
    /// Why the run ended early, if it did.
    pub error: Option<String>,
    /// Why the run ended.
    pub ended_by: String,
}

/// What the run's end looks at.
struct Progress {
    producers_done: Arc<AtomicU32>,
    consumers_done: Arc<AtomicU32>,
}

fn uri_for(s: &Scenario, i: usize) -> &AmqpUri {
    &s.uris[i % s.uris.len()]
}

/// Exchanges that cannot or need not be declared.
fn predefined(exchange: &str) -> bool {
    exchange.is_empty() || exchange.starts_with("amq.")
}

async fn ensure_exchange(c: &mut Conn, s: &Scenario) -> Result<(), ClientError> {
    if predefined(&s.exchange) || (s.predeclared && c.exists(None, Some(&s.exchange)).await?) {
        return Ok(());
    }
    c.exchange_declare(&s.exchange, &s.exchange_type).await
}

/// Declares (unless predeclared and present) and binds one queue; returns its name.
async fn ensure_queue(
    c: &mut Conn,
    s: &Scenario,
    name: &str,
    routing_key: &str,
) -> Result<String, ClientError> {
    let name = if s.predeclared && !name.is_empty() && c.exists(Some(name), None).await? {
        name.to_string()
    } else {
        c.queue_declare(name, s.durable, s.auto_delete, &s.queue_args)
            .await?
    };
    if !predefined(&s.exchange) {
        c.queue_bind(&name, &s.exchange, routing_key).await?;
    }
    Ok(name)
}

/// Queues every client needs declared before any starts (PerfTest's `configureAllQueues`).
async fn setup(s: &Scenario) -> Result<(), ClientError> {
    let mut c = Conn::open(uri_for(s, 0), "warren-perf setup").await?;
    c.channel_open(CHANNEL).await?;
    ensure_exchange(&mut c, s).await?;
    match &s.topology {
        Topology::Pattern { queues } => {
            for q in queues {
                ensure_queue(&mut c, s, q, q).await?;
            }
        }
        // Declared once here even when consumers redeclare it: RabbitMQ 3.10 answers
        // basic.consume with 541 when several connections declare a new quorum queue at once
        // and consume before its Raft member has started.
        Topology::Fixed {
            queue: Some(q),
            routing_key,
        } => {
            ensure_queue(&mut c, s, q, routing_key).await?;
        }
        Topology::Fixed { .. } => {}
    }
    c.close().await;
    Ok(())
}

async fn open_consumer(s: Scenario, i: usize) -> Result<Conn, ClientError> {
    let mut c = Conn::open(uri_for(&s, i), &format!("warren-perf consumer {i}")).await?;
    c.channel_open(CHANNEL).await?;
    if s.qos > 0 {
        c.basic_qos(s.qos).await?;
    }
    let queue = match &s.topology {
        Topology::Pattern { queues } => queues[i % queues.len()].clone(),
        Topology::Fixed { queue, routing_key } => {
            ensure_exchange(&mut c, &s).await?;
            ensure_queue(&mut c, &s, queue.as_deref().unwrap_or(""), routing_key).await?
        }
    };
    c.basic_consume(&queue, s.autoack, &s.consumer_args).await?;
    Ok(c)
}

async fn open_producer(s: Scenario, i: usize) -> Result<Conn, ClientError> {
    let mut c = Conn::open(
        uri_for(&s, s.consumers as usize + i),
        &format!("warren-perf producer {i}"),
    )
    .await?;
    c.channel_open(CHANNEL).await?;
    if s.confirm.is_some() {
        c.confirm_select().await?;
    }
    Ok(c)
}

fn producer_spec(s: &Scenario, i: usize) -> ProducerSpec {
    let routing_key = match &s.topology {
        Topology::Pattern { queues } => queues[i % queues.len()].clone(),
        Topology::Fixed { routing_key, .. } => routing_key.clone(),
    };
    let start_delay = if s.producer_random_start_delay_s > 0 {
        Duration::from_millis(rand::random::<u64>() % (s.producer_random_start_delay_s * 1000 + 1))
    } else {
        Duration::ZERO
    };
    ProducerSpec {
        exchange: s.exchange.clone(),
        routing_key,
        mandatory: s.mandatory,
        persistent: s.persistent,
        body_size: s.body_size,
        rate: s.rate,
        pacing: s.pacing,
        confirm: s.confirm,
        limit: s.pmessages,
        start_delay,
    }
}

/// Opens `n` clients concurrently (a few hundred connections open in parallel, not in series).
async fn open_all<F, Fut>(n: u32, s: &Scenario, open: F) -> Result<Vec<Conn>, String>
where
    F: Fn(Scenario, usize) -> Fut,
    Fut: std::future::Future<Output = Result<Conn, ClientError>> + Send + 'static,
{
    let mut set = JoinSet::new();
    for i in 0..n as usize {
        let f = open(s.clone(), i);
        set.spawn(async move { (i, f.await) });
    }
    let mut conns: Vec<Option<Conn>> = (0..n).map(|_| None).collect();
    let mut first_err = None;
    while let Some(r) = set.join_next().await {
        match r {
            Ok((i, Ok(c))) => conns[i] = Some(c),
            Ok((i, Err(e))) => {
                first_err.get_or_insert(format!("client {i}: {e}"));
            }
            Err(e) => {
                first_err.get_or_insert(format!("client task failed: {e}"));
            }
        }
    }
    if let Some(e) = first_err {
        for c in conns.into_iter().flatten() {
            c.close().await;
        }
        return Err(e);
    }
    Ok(conns.into_iter().flatten().collect())
}

/// Runs the scenario once against its URIs.
pub async fn run(s: &Scenario, label: &str, out: &mut Output) -> Result<RunResult, String> {
    let uri = s
        .uris
        .iter()
        .map(AmqpUri::display)
        .collect::<Vec<_>>()
        .join(",");
    setup(s).await.map_err(|e| format!("setup on {uri}: {e}"))?;
    let consumers = open_all(s.consumers, s, open_consumer).await?;
    let producers = match open_all(s.producers, s, open_producer).await {
        Ok(p) => p,
        Err(e) => {
            for c in consumers {
                c.close().await;
            }
            return Err(e);
        }
    };

    let stats = Arc::new(Stats::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let prog = Progress {
        producers_done: Arc::new(AtomicU32::new(0)),
        consumers_done: Arc::new(AtomicU32::new(0)),
    };
    let mut tasks = JoinSet::new();
    let cspec = ConsumerSpec {
        autoack: s.autoack,
        multi_ack_every: s.multi_ack_every,
        limit: s.cmessages,
        latency: Duration::from_micros(s.consumer_latency_us),
    };
    for (i, c) in consumers.into_iter().enumerate() {
        let (spec, stats, stop, done) = (
            cspec.clone(),
            stats.clone(),
            stop_rx.clone(),
            prog.consumers_done.clone(),
        );
        tasks.spawn(async move {
            if let Err(e) = consumer::run(c, spec, stats.clone(), stop).await {
                stats.fail(format!("consumer {i}: {e}"));
            }
            done.fetch_add(1, Relaxed);
        });
    }
    let start = Instant::now();
    let start_ns = body::now_ns();
    stats.last_receive_ns.store(start_ns, Relaxed);
    for (i, c) in producers.into_iter().enumerate() {
        let (spec, stats, stop, done) = (
            producer_spec(s, i),
            stats.clone(),
            stop_rx.clone(),
            prog.producers_done.clone(),
        );
        tasks.spawn(async move {
            if let Err(e) = producer::run(c, spec, stats.clone(), stop).await {
                stats.fail(format!("producer {i}: {e}"));
            }
            stats.last_send_done_ns.fetch_max(body::now_ns(), Relaxed);
            done.fetch_add(1, Relaxed);
        });
    }

    let mut sampler = Sampler::default();
    let interval = Duration::from_secs(s.interval_s);
    let mut next_sample = start + interval;
    let mut producers_done_at: Option<Instant> = None;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let ended_by = loop {
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = &mut ctrl_c => break "interrupted (Ctrl-C)".to_string(),
        }
        let now = Instant::now();
        let elapsed = now - start;
        if now >= next_sample {
            let (l, c) = stats.take_interval();
            let sample = sampler.sample(elapsed.as_secs_f64(), stats.snapshot(), &l, &c);
            out.line(&sample_line(&s.id, sample, s.confirm.is_some()));
            if let Some(live) = &mut out.live {
                live.write(RunResult {
                    label: label.to_string(),
                    uri: uri.clone(),
                    attempted_rate: s.rate.map(|r| r * s.producers as f64),
                    samples: sampler.samples.clone(),
                    summary: sampler.summary(elapsed.as_secs_f64(), stats.snapshot()),
                    error: None,
                    ended_by: "running".into(),
                });
            }
            while next_sample <= now {
                next_sample += interval;
            }
        }
        if out.is_tty() {
            let c = stats.snapshot();
            let last = sampler.samples.last();
            out.status(&format!(
                "{label} {} | sent {} recv {} | {}/s recv | p99 {}",
                progress(elapsed.as_secs_f64(), s.time_s, 30),
                thousands(c.sent as f64),
                thousands(c.received as f64),
                thousands(last.map_or(0.0, |l| l.received)),
                last.and_then(|l| l.latency_us)
                    .map_or("-".into(), |p| micros(p.p99)),
            ));
        }
        if let Some(e) = stats.error.lock().clone() {
            break format!("error: {e}");
        }
        if let Some(t) = s.time_s {
            if elapsed >= Duration::from_secs(t) {
                break format!("reached time limit ({t} s)");
            }
        }
        let pdone = prog.producers_done.load(Relaxed) == s.producers;
        let cdone = prog.consumers_done.load(Relaxed) == s.consumers;
        if pdone && producers_done_at.is_none() {
            producers_done_at = Some(now);
        }
        let last_rx = stats.last_receive_ns.load(Relaxed);
        let idle = Duration::from_nanos(body::now_ns().saturating_sub(last_rx)) >= IDLE;
        let bounded_p = s.producers == 0 || s.pmessages > 0;
        let bounded_c = s.cmessages > 0;
        if s.producers > 0 && s.consumers > 0 && bounded_c && cdone {
            break "consumers reached their message count".into();
        }
        if bounded_p && pdone && (s.consumers == 0 || cdone) && (s.producers > 0 || bounded_c) {
            break "producers reached their message count".into();
        }
        // Consumers with a -D count are waited for; others until they go quiet.
        if bounded_p
            && !bounded_c
            && s.producers > 0
            && pdone
            && idle
            && producers_done_at.is_some_and(|t| now - t >= IDLE)
        {
            break "producers done and consumers idle".into();
        }
        if s.exit_when_idle && s.consumers > 0 && idle {
            break "consumers idle (--exit-when)".into();
        }
        if s.producers == 0 && bounded_c && cdone {
            break "consumers reached their message count".into();
        }
    };
    // A run that ended on idle consumers ended at its last message, not after the idle wait.
    let duration = if ended_by.contains("idle") {
        let end = stats
            .last_receive_ns
            .load(Relaxed)
            .max(stats.last_send_done_ns.load(Relaxed));
        Duration::from_nanos(end.saturating_sub(start_ns).max(1))
    } else {
        start.elapsed()
    };
    let _ = stop_tx.send(true);
    out.clear_status();
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(5), drain)
        .await
        .is_err()
    {
        tasks.abort_all();
    }
    let (l, c) = stats.take_interval();
    sampler.fold(&l, &c);
    let totals = stats.snapshot();
    let summary = sampler.summary(duration.as_secs_f64(), totals);
    out.line(&format!("id: {}, test stopped ({ended_by})", s.id));
    for line in summary_lines(&s.id, &summary) {
        out.line(&line);
    }
    let error = stats.error.lock().clone();
    let result = RunResult {
        label: label.to_string(),
        uri,
        attempted_rate: s.rate.map(|r| r * s.producers as f64),
        samples: sampler.samples,
        summary,
        error,
        ended_by,
    };
    if let Some(live) = &mut out.live {
        live.finished(result.clone());
    }
    Ok(result)
}
