//! The modes beyond a single run: a rate sweep, growing-intensity steps, and a side-by-side
//! comparison of two brokers. Each is a series of ordinary runs.

use serde::Serialize;

use crate::cli::{Mode, Options, Scenario};
use crate::display::{micros, thousands, Output};
use crate::report::{self, Report};
use crate::run::{self, RunResult};

/// One step of a sweep or of --steps: attempted vs achieved vs latency.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RatePoint {
    /// Total attempted msg/s; `None`: unlimited.
    pub attempted: Option<f64>,
    pub sent: f64,
    pub received: f64,
    pub p50_us: Option<u64>,
    pub p99_us: Option<u64>,
    /// --steps only: whether the step held (received >= 95% of attempted, p99 within bound).
    pub held: Option<bool>,
}

impl RatePoint {
    pub fn of(r: &RunResult) -> RatePoint {
        RatePoint {
            attempted: r.attempted_rate,
            sent: r.summary.send_rate,
            received: r.summary.receive_rate,
            p50_us: r.summary.latency_us.map(|p| p.p50),
            p99_us: r.summary.latency_us.map(|p| p.p99),
            held: None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct StepsOutcome {
    pub p99_bound_ms: f64,
    /// The highest attempted rate that held; `None` if the first step failed.
    pub highest_held: Option<f64>,
    pub points: Vec<RatePoint>,
}

/// One figure of a comparison: medians over the rounds on each broker and their ratio A/B.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CompareRow {
    pub figure: String,
    pub a: Option<f64>,
    pub b: Option<f64>,
    pub ratio: Option<f64>,
}

/// Whether a step held: the consumers kept up (95% of the attempted rate) and p99 stayed within
/// the bound.
pub fn held(p: &RatePoint, bound_ms: f64) -> bool {
    let Some(attempted) = p.attempted else {
        return false;
    };
    p.received >= 0.95 * attempted && p.p99_us.is_some_and(|v| v as f64 <= bound_ms * 1000.0)
}

pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

type Figure = (&'static str, fn(&RunResult) -> Option<f64>);

const FIGURES: &[Figure] = &[
    ("send rate (msg/s)", |r| Some(r.summary.send_rate)),
    ("confirm rate (msg/s)", |r| {
        r.summary.confirm_latency_us.map(|_| r.summary.confirm_rate)
    }),
    ("receive rate (msg/s)", |r| Some(r.summary.receive_rate)),
    ("latency p50 (µs)", |r| {
        r.summary.latency_us.map(|p| p.p50 as f64)
    }),
    ("latency p99 (µs)", |r| {
        r.summary.latency_us.map(|p| p.p99 as f64)
    }),
    ("confirm latency p99 (µs)", |r| {
        r.summary.confirm_latency_us.map(|p| p.p99 as f64)
    }),
];

pub fn compare_rows(a: &[&RunResult], b: &[&RunResult]) -> Vec<CompareRow> {
    FIGURES
        .iter()
        .map(|(name, f)| {
            let ma = median(a.iter().filter_map(|r| f(r)).collect());
            let mb = median(b.iter().filter_map(|r| f(r)).collect());
            let ratio = match (ma, mb) {
                (Some(x), Some(y)) if y != 0.0 => Some(x / y),
                _ => None,
            };
            CompareRow {
                figure: name.to_string(),
                a: ma,
                b: mb,
                ratio,
            }
        })
        .collect()
}

fn fmt_rate(r: Option<f64>) -> String {
    r.map_or("unlimited".into(), thousands)
}

fn fmt_us(v: Option<u64>) -> String {
    v.map_or("-".into(), micros)
}

/// Runs what the options ask; returns the exit code.
pub async fn execute(o: Options) -> i32 {
    let mut out = Output::new();
    let mut report = Report::new(&o);
    if let Some(p) = &o.report {
        out.live = Some(crate::display::Live::new(
            p.clone(),
            o.scenario.interval_s,
            Report::new(&o),
        ));
    }
    let mut failed = false;
    match &o.mode {
        Mode::Single => match run::run(&o.scenario, "run", &mut out).await {
            Ok(r) => {
                failed |= r.error.is_some();
                report.runs.push(r);
            }
            Err(e) => return fail(&e),
        },
        Mode::Sweep(rates) => {
            let mut points = Vec::new();
            for rate in rates {
                let s = with_total_rate(&o.scenario, *rate);
                let label = format!("attempted {}", fmt_rate(*rate));
                out.line(&format!("== {label} msg/s for {} s", s.time_s.unwrap_or(0)));
                match run::run(&s, &label, &mut out).await {
                    Ok(r) => {
                        failed |= r.error.is_some();
                        points.push(RatePoint::of(&r));
                        if let Some(live) = &mut out.live {
                            live.points(points.clone());
                        }
                        report.runs.push(r);
                    }
                    Err(e) => {
                        eprintln!("warren perf: {label}: {e}");
                        failed = true;
                        break;
                    }
                }
            }
            out.line("attempted msg/s | sent msg/s | received msg/s | latency p50 | latency p99");
            for p in &points {
                out.line(&format!(
                    "{} | {} | {} | {} | {}",
                    fmt_rate(p.attempted),
                    thousands(p.sent),
                    thousands(p.received),
                    fmt_us(p.p50_us),
                    fmt_us(p.p99_us)
                ));
            }
            report.sweep = Some(points);
        }
        Mode::Steps { from, by, to } => {
            let mut points = Vec::new();
            let mut highest = None;
            let mut rate = *from;
            loop {
                if to.is_some_and(|t| rate > t + 1e-9) {
                    break;
                }
                let s = with_total_rate(&o.scenario, Some(rate));
                let label = format!("step {}", thousands(rate));
                out.line(&format!(
                    "== {label} msg/s for {} s (p99 bound {} ms)",
                    s.time_s.unwrap_or(0),
                    o.p99_bound_ms
                ));
                let r = match run::run(&s, &label, &mut out).await {
                    Ok(r) => r,
                    Err(e) => {
                        eprintln!("warren perf: {label}: {e}");
                        failed = true;
                        break;
                    }
                };
                let mut p = RatePoint::of(&r);
                let ok = held(&p, o.p99_bound_ms) && r.error.is_none();
                p.held = Some(ok);
                out.line(&format!(
                    "{label}: received {} msg/s, p99 {} -> {}",
                    thousands(p.received),
                    fmt_us(p.p99_us),
                    if ok { "held" } else { "not held" }
                ));
                points.push(p);
                if let Some(live) = &mut out.live {
                    live.points(points.clone());
                }
                report.runs.push(r);
                if !ok {
                    break;
                }
                highest = Some(rate);
                rate += by;
            }
            out.line(&match highest {
                Some(h) => format!(
                    "highest rate held with p99 <= {} ms: {} msg/s",
                    o.p99_bound_ms,
                    thousands(h)
                ),
                None => format!(
                    "no step held with p99 <= {} ms (first step {} msg/s)",
                    o.p99_bound_ms,
                    thousands(*from)
                ),
            });
            report.steps = Some(StepsOutcome {
                p99_bound_ms: o.p99_bound_ms,
                highest_held: highest,
                points,
            });
        }
        Mode::Compare(b_uri) => {
            let mut b = o.scenario.clone();
            b.uris = vec![b_uri.clone()];
            let a_name = o.scenario.uris[0].display();
            let b_name = b_uri.display();
            for round in 1..=o.rounds {
                for (side, s) in [("A", &o.scenario), ("B", &b)] {
                    let label = format!("{side} round {round}");
                    out.line(&format!("== {label}: {}", s.uris[0].display()));
                    match run::run(s, &label, &mut out).await {
                        Ok(r) => {
                            failed |= r.error.is_some();
                            report.runs.push(r);
                        }
                        Err(e) => {
                            eprintln!("warren perf: {label}: {e}");
                            failed = true;
                        }
                    }
                }
            }
            let side = |p: &str| {
                report
                    .runs
                    .iter()
                    .filter(|r| r.label.starts_with(p))
                    .collect::<Vec<_>>()
            };
            let rows = compare_rows(&side("A "), &side("B "));
            out.line(&format!(
                "A = {a_name}, B = {b_name}; medians of {} rounds",
                o.rounds
            ));
            out.line("figure | A | B | A/B");
            for r in &rows {
                let f = |v: Option<f64>| v.map_or("-".into(), thousands);
                out.line(&format!(
                    "{} | {} | {} | {}",
                    r.figure,
                    f(r.a),
                    f(r.b),
                    r.ratio.map_or("-".into(), |x| format!("{x:.2}"))
                ));
            }
            report.compare = Some(rows);
        }
    }
    if let Err(e) = report::write_outputs(&o, &report) {
        eprintln!("warren perf: {e}");
        return 1;
    }
    for r in &report.runs {
        if let Some(e) = &r.error {
            eprintln!("warren perf: {}: {e}", r.label);
        }
    }
    i32::from(failed)
}

fn fail(e: &str) -> i32 {
    eprintln!("warren perf: {e}");
    1
}

/// The scenario with a total rate split evenly over its producers.
fn with_total_rate(s: &Scenario, total: Option<f64>) -> Scenario {
    let mut s = s.clone();
    s.rate = total.map(|t| t / s.producers.max(1) as f64);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{Counts, Percentiles, Summary};

    fn result(label: &str, send: f64, p99: u64) -> RunResult {
        RunResult {
            label: label.into(),
            uri: "amqp://x".into(),
            attempted_rate: Some(1000.0),
            samples: vec![],
            summary: Summary {
                duration_s: 1.0,
                totals: Counts::default(),
                send_rate: send,
                confirm_rate: 0.0,
                receive_rate: send,
                latency_us: Some(Percentiles {
                    min: 1,
                    p50: p99 / 2,
                    p75: p99,
                    p95: p99,
                    p99,
                    max: p99,
                }),
                confirm_latency_us: None,
            },
            error: None,
            ended_by: "t".into(),
        }
    }

    #[test]
    fn medians_and_ratios() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
        let a = [
            result("A", 100.0, 10),
            result("A", 300.0, 30),
            result("A", 200.0, 20),
        ];
        let b = [
            result("B", 50.0, 40),
            result("B", 100.0, 40),
            result("B", 150.0, 40),
        ];
        let rows = compare_rows(&a.iter().collect::<Vec<_>>(), &b.iter().collect::<Vec<_>>());
        let send = &rows[0];
        assert_eq!(
            (send.a, send.b, send.ratio),
            (Some(200.0), Some(100.0), Some(2.0))
        );
        let p99 = rows
            .iter()
            .find(|r| r.figure.starts_with("latency p99"))
            .expect("p99");
        assert_eq!(p99.ratio, Some(0.5));
        let confirm = rows
            .iter()
            .find(|r| r.figure.starts_with("confirm rate"))
            .expect("c");
        assert_eq!(
            (confirm.a, confirm.ratio),
            (None, None),
            "no confirms: no figure"
        );
    }

    #[test]
    fn step_held_rules() {
        let mut p = RatePoint::of(&result("s", 1000.0, 5_000));
        assert!(held(&p, 10.0));
        assert!(!held(&p, 4.0), "p99 5 ms over a 4 ms bound");
        p.received = 900.0;
        assert!(!held(&p, 10.0), "consumers fell behind");
        p.attempted = None;
        assert!(!held(&p, 10.0));
    }
}
