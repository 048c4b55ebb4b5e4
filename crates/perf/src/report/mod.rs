//! Outputs: `--json` (every sample and summary), `--report` (one self-contained HTML page: inline
//! SVG charts drawn here, plus a little inline script for the sample tables and tooltips; no
//! network), and `--svg` (the headline charts stacked in one SVG file for docs).
//!
//! Every chart is `<svg class="chart" data-chart=ID data-points=N>` with one
//! `<g class="series" data-series=NAME data-points=K>` per series holding K `<circle>`s, so a
//! test (or a reader) can check what was drawn against the data.
//!
//! By job: this file holds the [`Report`] (what `--json` writes and the pages are made from) and
//! writes the outputs asked for; `svg` draws one [`Chart`] (axes, ticks, series, the counts a
//! test reads); `charts` turns runs and rate steps into charts; `html` lays out the page.
//! Everything is re-exported here.

mod charts;
mod html;
mod svg;

use std::path::Path;

use serde::Serialize;

pub use charts::{headline_charts, latency_chart, rates_chart, sweep_charts};
pub use html::{html, html_live};
pub use svg::{nice_step, stacked_svg, Chart, Series};

use crate::cli::{Mode, Options, Scenario, Topology};
use crate::modes::{CompareRow, RatePoint, StepsOutcome};
use crate::run::RunResult;

#[derive(Debug, Serialize)]
pub struct ScenarioInfo {
    pub uris: Vec<String>,
    pub producers: u32,
    pub consumers: u32,
    pub exchange: String,
    pub exchange_type: String,
    pub queues: Vec<String>,
    pub routing_key: Option<String>,
    pub body_size: usize,
    pub rate_per_producer: Option<f64>,
    pub persistent: bool,
    pub mandatory: bool,
    pub confirm: Option<u32>,
    pub qos: u16,
    pub autoack: bool,
    pub multi_ack_every: u32,
    pub time_s: Option<u64>,
    pub pmessages: u64,
    pub cmessages: u64,
    pub consumer_latency_us: u64,
}

impl ScenarioInfo {
    fn of(s: &Scenario) -> ScenarioInfo {
        let (queues, routing_key) = match &s.topology {
            Topology::Pattern { queues } => (queues.clone(), None),
            Topology::Fixed { queue, routing_key } => {
                (queue.iter().cloned().collect(), Some(routing_key.clone()))
            }
        };
        ScenarioInfo {
            uris: s.uris.iter().map(|u| u.display()).collect(),
            producers: s.producers,
            consumers: s.consumers,
            exchange: s.exchange.clone(),
            exchange_type: s.exchange_type.clone(),
            queues,
            routing_key,
            body_size: s.body_size,
            rate_per_producer: s.rate,
            persistent: s.persistent,
            mandatory: s.mandatory,
            confirm: s.confirm,
            qos: s.qos,
            autoack: s.autoack,
            multi_ack_every: s.multi_ack_every,
            time_s: s.time_s,
            pmessages: s.pmessages,
            cmessages: s.cmessages,
            consumer_latency_us: s.consumer_latency_us,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub tool: &'static str,
    pub version: &'static str,
    pub command: String,
    pub mode: &'static str,
    pub scenario: ScenarioInfo,
    pub runs: Vec<RunResult>,
    pub sweep: Option<Vec<RatePoint>>,
    pub steps: Option<StepsOutcome>,
    pub compare: Option<Vec<CompareRow>>,
}

impl Report {
    pub fn new(o: &Options) -> Report {
        Report {
            tool: "warren perf",
            version: env!("CARGO_PKG_VERSION"),
            command: format!("warren perf {}", o.command_line),
            mode: match o.mode {
                Mode::Single => "single",
                Mode::Sweep(_) => "sweep",
                Mode::Steps { .. } => "steps",
                Mode::Compare(_) => "compare",
            },
            scenario: ScenarioInfo::of(&o.scenario),
            runs: Vec::new(),
            sweep: None,
            steps: None,
            compare: None,
        }
    }
}

pub fn write_outputs(o: &Options, r: &Report) -> Result<(), String> {
    let write = |path: &Path, text: String| {
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    if let Some(p) = &o.json {
        let text = serde_json::to_string_pretty(r).map_err(|e| format!("JSON: {e}"))?;
        write(p, text)?;
    }
    if let Some(p) = &o.report {
        write(p, html(r))?;
    }
    if let Some(p) = &o.svg {
        write(p, stacked_svg(&headline_charts(r)))?;
    }
    Ok(())
}

/// What the tests of every part share: a run with `n` samples, and a substring count.
#[cfg(test)]
mod testutil {
    use crate::run::RunResult;
    use crate::stats::{Counts, Percentiles, Sample, Summary};

    pub fn fake_run(n: usize) -> RunResult {
        let p = Percentiles {
            min: 100,
            p50: 200,
            p75: 300,
            p95: 400,
            p99: 500,
            max: 600,
        };
        RunResult {
            label: "run <1>".into(),
            uri: "amqp://guest@localhost:5672/%2f".into(),
            attempted_rate: None,
            samples: (0..n)
                .map(|i| Sample {
                    t_s: i as f64 + 1.0,
                    sent: 1000.0 + i as f64,
                    confirmed: 0.0,
                    nacked: 0.0,
                    returned: 0.0,
                    received: 990.0,
                    // The first interval had no deliveries.
                    latency_us: (i > 0).then_some(p),
                    confirm_latency_us: None,
                })
                .collect(),
            summary: Summary {
                duration_s: n as f64,
                totals: Counts {
                    sent: 10,
                    received: 10,
                    ..Default::default()
                },
                send_rate: 1000.0,
                confirm_rate: 0.0,
                receive_rate: 990.0,
                latency_us: Some(p),
                confirm_latency_us: None,
            },
            error: None,
            ended_by: "reached time limit".into(),
        }
    }

    pub(super) fn count(hay: &str, needle: &str) -> usize {
        hay.matches(needle).count()
    }
}
