//! Outputs: `--json` (every sample and summary), `--report` (one self-contained HTML page: inline
//! SVG charts drawn here, plus a little inline script for the sample tables and tooltips; no
//! network), and `--svg` (the headline charts stacked in one SVG file for docs).
//!
//! Every chart is `<svg class="chart" data-chart=ID data-points=N>` with one
//! `<g class="series" data-series=NAME data-points=K>` per series holding K `<circle>`s, so a
//! test (or a reader) can check what was drawn against the data.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

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

// ---------------------------------------------------------------------------------------------
// Charts

const W: f64 = 760.0;
const H: f64 = 300.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 130.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 46.0;
const COLORS: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf",
];

pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed, without markers (a reference line such as attempted = achieved).
    pub reference: bool,
}

pub struct Chart {
    pub id: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub log_y: bool,
    /// Category labels: point x values are indices into this.
    pub x_categories: Option<Vec<String>>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// 1, 2 or 5 times a power of ten, about `span / 5`.
pub fn nice_step(span: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / 5.0;
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    p * if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    }
}

fn fmt_tick(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e3 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

impl Chart {
    pub fn point_count(&self) -> usize {
        self.series
            .iter()
            .filter(|s| !s.reference)
            .map(|s| s.points.len())
            .sum()
    }

    pub fn svg(&self) -> String {
        let pw = W - LEFT - RIGHT;
        let ph = H - TOP - BOTTOM;
        let all: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .collect();
        let (mut x0, mut x1) = match &self.x_categories {
            Some(c) => (0.0, (c.len().max(1) - 1) as f64),
            None => all
                .iter()
                .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0))),
        };
        if all.is_empty() && self.x_categories.is_none() {
            (x0, x1) = (0.0, 1.0);
        }
        if self.x_categories.is_none() {
            x0 = x0.min(0.0); // time axes start at 0
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        let ymax_data = all.iter().map(|p| p.1).fold(0.0f64, f64::max);
        let (y0, y1, yticks): (f64, f64, Vec<f64>) = if self.log_y {
            let pos: Vec<f64> = all.iter().map(|p| p.1).filter(|v| *v > 0.0).collect();
            let lo = pos.iter().copied().fold(f64::MAX, f64::min);
            let hi = pos.iter().copied().fold(0.0f64, f64::max);
            let (lo, hi) = if pos.is_empty() {
                (1.0, 10.0)
            } else {
                (lo, hi)
            };
            let a = lo.log10().floor();
            let mut b = hi.log10().ceil();
            if b <= a {
                b = a + 1.0;
            }
            let ticks = (a as i32..=b as i32).map(|e| 10f64.powi(e)).collect();
            (a, b, ticks)
        } else {
            let step = nice_step(ymax_data.max(1e-9));
            let top = (ymax_data / step).ceil().max(1.0) * step;
            let n = (top / step).round() as usize;
            (0.0, top, (0..=n).map(|i| i as f64 * step).collect())
        };
        let ymap = |v: f64| -> f64 {
            let t = if self.log_y {
                (v.max(1e-12).log10() - y0) / (y1 - y0)
            } else {
                (v - y0) / (y1 - y0)
            };
            TOP + ph * (1.0 - t.clamp(0.0, 1.0))
        };
        let xmap = |v: f64| LEFT + pw * (v - x0) / (x1 - x0);
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-chart="{}" data-points="{}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{}" font-family="sans-serif" font-size="11">"#,
            esc(&self.id),
            self.point_count(),
            esc(&self.title)
        );
        let _ = write!(
            s,
            r##"<rect x="0" y="0" width="{W}" height="{H}" fill="#fff"/><text x="{}" y="18" font-size="14" font-weight="bold">{}</text>"##,
            LEFT,
            esc(&self.title)
        );
        // Grid and y ticks.
        for t in &yticks {
            let y = ymap(*t);
            let _ = write!(
                s,
                r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#e5e5e5"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0,
                fmt_tick(*t)
            );
        }
        // X ticks.
        match &self.x_categories {
            Some(cats) => {
                for (i, c) in cats.iter().enumerate() {
                    let x = xmap(i as f64);
                    let _ = write!(
                        s,
                        r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                        TOP + ph + 16.0,
                        esc(c)
                    );
                }
            }
            None => {
                let step = nice_step(x1 - x0);
                let mut t = (x0 / step).ceil() * step;
                while t <= x1 + 1e-9 {
                    let x = xmap(t);
                    let _ = write!(
                        s,
                        r##"<line x1="{x:.1}" x2="{x:.1}" y1="{}" y2="{:.1}" stroke="#999"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                        TOP + ph,
                        TOP + ph + 4.0,
                        TOP + ph + 16.0,
                        fmt_tick(t)
                    );
                    t += step;
                }
            }
        }
        let _ = write!(
            s,
            r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#999"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
            LEFT + pw / 2.0,
            H - 8.0,
            esc(&self.x_label),
            TOP + ph / 2.0,
            esc(&self.y_label)
        );
        for (i, se) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let pts: Vec<(f64, f64)> = se
                .points
                .iter()
                .copied()
                .filter(|p| p.0.is_finite() && p.1.is_finite())
                .collect();
            let d: String = pts
                .iter()
                .enumerate()
                .map(|(k, p)| {
                    format!(
                        "{}{:.1} {:.1}",
                        if k == 0 { "M" } else { " L" },
                        xmap(p.0),
                        ymap(p.1)
                    )
                })
                .collect();
            let dash = if se.reference {
                r#" stroke-dasharray="5 4""#
            } else {
                ""
            };
            let _ = write!(
                s,
                r#"<g class="{}" data-series="{}" data-points="{}">"#,
                if se.reference { "reference" } else { "series" },
                esc(&se.name),
                if se.reference { 0 } else { pts.len() }
            );
            if !d.is_empty() {
                let _ = write!(
                    s,
                    r#"<path d="{d}" fill="none" stroke="{color}" stroke-width="1.6"{dash}/>"#
                );
            }
            if !se.reference {
                for p in &pts {
                    let xl = match &self.x_categories {
                        Some(c) => c.get(p.0 as usize).cloned().unwrap_or_default(),
                        None => trim(p.0),
                    };
                    let _ = write!(
                        s,
                        r#"<circle cx="{:.1}" cy="{:.1}" r="2.6" fill="{color}" data-x="{}" data-y="{}"><title>{}: {} = {}</title></circle>"#,
                        xmap(p.0),
                        ymap(p.1),
                        p.0,
                        p.1,
                        esc(&se.name),
                        esc(&xl),
                        trim(p.1)
                    );
                }
            }
            let ly = TOP + 6.0 + 16.0 * i as f64;
            let _ = write!(
                s,
                r#"<line x1="{:.1}" x2="{:.1}" y1="{ly:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text></g>"#,
                W - RIGHT + 10.0,
                W - RIGHT + 28.0,
                W - RIGHT + 32.0,
                ly + 4.0,
                esc(&se.name)
            );
        }
        s.push_str("</svg>");
        s
    }
}

/// Rates over time: sent and received always; confirmed, nacked and returned when the run has
/// confirms or mandatory publishes (all zero otherwise).
pub fn rates_chart(r: &RunResult, idx: usize) -> Chart {
    let t = |f: fn(&crate::stats::Sample) -> f64| {
        r.samples.iter().map(|s| (s.t_s, f(s))).collect::<Vec<_>>()
    };
    let mut series = vec![Series {
        name: "sent".into(),
        points: t(|s| s.sent),
        reference: false,
    }];
    let t_ = &r.summary.totals;
    if r.summary.confirm_latency_us.is_some() || t_.confirmed + t_.nacked > 0 {
        series.push(Series {
            name: "confirmed".into(),
            points: t(|s| s.confirmed),
            reference: false,
        });
        series.push(Series {
            name: "nacked".into(),
            points: t(|s| s.nacked),
            reference: false,
        });
    }
    if t_.returned > 0 {
        series.push(Series {
            name: "returned".into(),
            points: t(|s| s.returned),
            reference: false,
        });
    }
    series.push(Series {
        name: "received".into(),
        points: t(|s| s.received),
        reference: false,
    });
    Chart {
        id: format!("rates-{idx}"),
        title: format!("{}: rates", r.label),
        x_label: "time (s)".into(),
        y_label: "msg/s".into(),
        series,
        log_y: false,
        x_categories: None,
    }
}

/// Latency percentiles over time (ms, log scale); a point per sample that had deliveries.
pub fn latency_chart(r: &RunResult, idx: usize, confirm: bool) -> Chart {
    type Pick = fn(&crate::stats::Percentiles) -> u64;
    let picks: [(&str, Pick); 5] = [
        ("min", |p| p.min),
        ("p50", |p| p.p50),
        ("p75", |p| p.p75),
        ("p95", |p| p.p95),
        ("p99", |p| p.p99),
    ];
    let series = picks
        .iter()
        .map(|(name, f)| Series {
            name: name.to_string(),
            points: r
                .samples
                .iter()
                .filter_map(|s| {
                    let p = if confirm {
                        s.confirm_latency_us
                    } else {
                        s.latency_us
                    };
                    p.map(|p| (s.t_s, f(&p) as f64 / 1000.0))
                })
                .collect(),
            reference: false,
        })
        .collect();
    let what = if confirm { "confirm" } else { "consumer" };
    Chart {
        id: format!(
            "{}-{idx}",
            if confirm {
                "confirm-latency"
            } else {
                "latency"
            }
        ),
        title: format!("{}: {what} latency percentiles", r.label),
        x_label: "time (s)".into(),
        y_label: "ms (log scale)".into(),
        series,
        log_y: true,
        x_categories: None,
    }
}

/// Attempted vs achieved (msg/s) and attempted vs latency, one point per step.
pub fn sweep_charts(points: &[RatePoint], title: &str) -> Vec<Chart> {
    let cats: Vec<String> = points
        .iter()
        .map(|p| p.attempted.map_or("unlimited".into(), fmt_tick))
        .collect();
    let idx = |f: fn(&RatePoint) -> Option<f64>| {
        points
            .iter()
            .enumerate()
            .filter_map(|(i, p)| f(p).map(|v| (i as f64, v)))
            .collect::<Vec<_>>()
    };
    let rates = Chart {
        id: "sweep-rates".into(),
        title: format!("{title}: attempted vs achieved"),
        x_label: "attempted msg/s".into(),
        y_label: "achieved msg/s".into(),
        series: vec![
            Series {
                name: "attempted".into(),
                points: idx(|p| p.attempted),
                reference: true,
            },
            Series {
                name: "sent".into(),
                points: idx(|p| Some(p.sent)),
                reference: false,
            },
            Series {
                name: "received".into(),
                points: idx(|p| Some(p.received)),
                reference: false,
            },
        ],
        // Log scale: "unlimited" is often orders of magnitude above the fixed steps.
        log_y: true,
        x_categories: Some(cats.clone()),
    };
    let latency = Chart {
        id: "sweep-latency".into(),
        title: format!("{title}: attempted vs latency"),
        x_label: "attempted msg/s".into(),
        y_label: "ms (log scale)".into(),
        series: vec![
            Series {
                name: "p50".into(),
                points: idx(|p| p.p50_us.map(|v| v as f64 / 1000.0)),
                reference: false,
            },
            Series {
                name: "p99".into(),
                points: idx(|p| p.p99_us.map(|v| v as f64 / 1000.0)),
                reference: false,
            },
        ],
        log_y: true,
        x_categories: Some(cats),
    };
    vec![rates, latency]
}

/// The charts a doc wants: the sweep/steps charts, or the (first) run's rates and latency.
pub fn headline_charts(r: &Report) -> Vec<Chart> {
    if let Some(p) = &r.sweep {
        return sweep_charts(p, "sweep");
    }
    if let Some(s) = &r.steps {
        return sweep_charts(&s.points, "steps");
    }
    let mut v = Vec::new();
    let runs: Vec<&RunResult> = if r.compare.is_some() {
        // First round on each broker.
        r.runs.iter().take(2).collect()
    } else {
        r.runs.iter().take(1).collect()
    };
    for (i, run) in runs.into_iter().enumerate() {
        v.push(rates_chart(run, i));
        v.push(latency_chart(run, i, false));
    }
    v
}

pub fn stacked_svg(charts: &[Chart]) -> String {
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{}" viewBox="0 0 {W} {}">"#,
        H * charts.len() as f64,
        H * charts.len() as f64
    );
    for (i, c) in charts.iter().enumerate() {
        let inner = c
            .svg()
            .replacen("<svg ", &format!(r#"<svg y="{}" "#, H * i as f64), 1);
        s.push_str(&inner);
    }
    s.push_str("</svg>\n");
    s
}

// ---------------------------------------------------------------------------------------------
// HTML

const STYLE: &str = "body{font-family:sans-serif;margin:24px;color:#222;max-width:1000px}\
code{background:#f4f4f4;padding:2px 4px}table{border-collapse:collapse;margin:8px 0}\
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f4f4f4}\
td:first-child,th:first-child{text-align:left}svg.chart{display:block;margin:10px 0}\
circle:hover{r:5}details{margin:8px 0}#tip{position:fixed;background:#333;color:#fff;\
padding:3px 6px;font-size:12px;border-radius:3px;pointer-events:none;display:none}";

/// Builds the per-run sample tables from the embedded data and adds tooltips; marks the body
/// `data-rendered` when done.
const SCRIPT: &str = r#"
(function () {
  var data = JSON.parse(document.getElementById('perf-data').textContent);
  function us(p, k) { return p ? p[k] : ''; }
  data.runs.forEach(function (run, i) {
    var host = document.getElementById('samples-' + i);
    if (!host) return;
    var t = document.createElement('table');
    t.className = 'samples';
    var head = ['t (s)', 'sent/s', 'confirmed/s', 'nacked/s', 'returned/s', 'received/s',
                'min µs', 'p50 µs', 'p75 µs', 'p95 µs', 'p99 µs'];
    var thead = t.createTHead().insertRow();
    head.forEach(function (h) { var c = document.createElement('th'); c.textContent = h; thead.appendChild(c); });
    var body = t.createTBody();
    run.samples.forEach(function (s) {
      var r = body.insertRow();
      [s.t_s.toFixed(1), s.sent.toFixed(0), s.confirmed.toFixed(0), s.nacked.toFixed(0),
       s.returned.toFixed(0), s.received.toFixed(0), us(s.latency_us, 'min'), us(s.latency_us, 'p50'),
       us(s.latency_us, 'p75'), us(s.latency_us, 'p95'), us(s.latency_us, 'p99')]
        .forEach(function (v) { r.insertCell().textContent = v; });
    });
    host.appendChild(t);
  });
  var tip = document.getElementById('tip');
  document.querySelectorAll('svg.chart circle').forEach(function (c) {
    c.addEventListener('mouseenter', function (e) {
      tip.textContent = c.querySelector('title').textContent;
      tip.style.left = (e.clientX + 12) + 'px'; tip.style.top = (e.clientY + 12) + 'px';
      tip.style.display = 'block';
    });
    c.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
  });
  document.body.setAttribute('data-rendered', String(document.querySelectorAll('svg.chart').length));
})();
"#;

fn summary_table(r: &RunResult) -> String {
    let s = &r.summary;
    let lat = |p: Option<crate::stats::Percentiles>| {
        p.map_or("-".into(), |p| {
            format!("{} / {} / {} / {} / {}", p.min, p.p50, p.p75, p.p95, p.p99)
        })
    };
    let t = &s.totals;
    format!(
        "<table class=\"summary\"><tr><th>duration</th><th>sent</th><th>confirmed</th><th>nacked</th>\
         <th>returned</th><th>received</th><th>send rate</th><th>receive rate</th></tr>\
         <tr><td>{:.1} s</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0} msg/s</td><td>{:.0} msg/s</td></tr></table>\
         <table><tr><th>latency µs</th><th>min / p50 / p75 / p95 / p99</th></tr>\
         <tr><td>consumer</td><td>{}</td></tr><tr><td>confirm</td><td>{}</td></tr></table>",
        s.duration_s,
        t.sent,
        t.confirmed,
        t.nacked,
        t.returned,
        t.received,
        s.send_rate,
        s.receive_rate,
        lat(s.latency_us),
        lat(s.confirm_latency_us)
    )
}

fn points_table(points: &[RatePoint]) -> String {
    let mut s = String::from(
        "<table class=\"points\"><tr><th>attempted msg/s</th><th>sent msg/s</th><th>received msg/s</th>\
         <th>p50 µs</th><th>p99 µs</th><th>held</th></tr>",
    );
    for p in points {
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{:.0}</td><td>{:.0}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            p.attempted
                .map_or("unlimited".into(), |a| format!("{a:.0}")),
            p.sent,
            p.received,
            p.p50_us.map_or("-".into(), |v| v.to_string()),
            p.p99_us.map_or("-".into(), |v| v.to_string()),
            p.held.map_or("", |h| if h { "yes" } else { "no" })
        );
    }
    s.push_str("</table>");
    s
}

pub fn html(r: &Report) -> String {
    page(r, None)
}

/// The report while the runs go: the page reloads itself every `refresh_s` seconds and says so.
pub fn html_live(r: &Report, refresh_s: u64) -> String {
    page(r, Some(refresh_s))
}

fn page(r: &Report, refresh_s: Option<u64>) -> String {
    let mut s = String::new();
    let (refresh, banner) = match refresh_s {
        Some(n) => (
            format!("<meta http-equiv=\"refresh\" content=\"{n}\">"),
            format!("<p id=\"live\"><b>Running</b>: this page reloads every {n} s until the run ends.</p>\n"),
        ),
        None => (String::new(), String::new()),
    };
    let _ = write!(
        s,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">{refresh}<title>warren perf: {}</title><style>{STYLE}</style></head>\n<body data-mode=\"{}\">\n<h1>warren perf report</h1>\n{banner}<p><code>{}</code></p>\n<p>{} producers, {} consumers, {} byte messages, against {}</p>\n",
        esc(r.mode),
        r.mode,
        esc(&r.command),
        r.scenario.producers,
        r.scenario.consumers,
        r.scenario.body_size,
        esc(&r.scenario.uris.join(", "))
    );
    if let Some(p) = &r.sweep {
        s.push_str("<section id=\"sweep\"><h2>Rate sweep: attempted vs achieved vs latency</h2>");
        s.push_str(&points_table(p));
        for c in sweep_charts(p, "sweep") {
            s.push_str(&c.svg());
        }
        s.push_str("</section>\n");
    }
    if let Some(st) = &r.steps {
        let _ = write!(
            s,
            "<section id=\"steps\"><h2>Growing intensity (p99 bound {} ms)</h2><p>Highest rate held: <b>{}</b></p>",
            st.p99_bound_ms,
            st.highest_held
                .map_or("none".into(), |h| format!("{h:.0} msg/s"))
        );
        s.push_str(&points_table(&st.points));
        for c in sweep_charts(&st.points, "steps") {
            s.push_str(&c.svg());
        }
        s.push_str("</section>\n");
    }
    if let Some(rows) = &r.compare {
        s.push_str("<section id=\"compare\"><h2>Comparison (medians over rounds)</h2><table class=\"compare\"><tr><th>figure</th><th>A</th><th>B</th><th>A/B</th></tr>");
        for row in rows {
            let f = |v: Option<f64>| v.map_or("-".into(), |x| format!("{x:.0}"));
            let _ = write!(
                s,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&row.figure),
                f(row.a),
                f(row.b),
                row.ratio.map_or("-".into(), |x| format!("{x:.2}"))
            );
        }
        s.push_str("</table></section>\n");
    }
    for (i, run) in r.runs.iter().enumerate() {
        let _ = write!(
            s,
            "<section class=\"run\" data-run=\"{i}\" data-samples=\"{}\"><h2>{} <small>{}</small></h2><p>ended: {}</p>",
            run.samples.len(),
            esc(&run.label),
            esc(&run.uri),
            esc(&run.ended_by)
        );
        if let Some(e) = &run.error {
            let _ = write!(s, "<p class=\"error\"><b>error:</b> {}</p>", esc(e));
        }
        s.push_str(&summary_table(run));
        s.push_str(&rates_chart(run, i).svg());
        s.push_str(&latency_chart(run, i, false).svg());
        if run.summary.confirm_latency_us.is_some() {
            s.push_str(&latency_chart(run, i, true).svg());
        }
        let _ = writeln!(
            s,
            "<details><summary>per-interval samples</summary><div id=\"samples-{i}\"></div></details></section>"
        );
    }
    let json = serde_json::to_string(r)
        .unwrap_or_else(|_| "{\"runs\":[]}".into())
        .replace("</", "<\\/");
    let _ = write!(
        s,
        "<div id=\"tip\"></div>\n<script type=\"application/json\" id=\"perf-data\">{json}</script>\n<script>{SCRIPT}</script>\n</body></html>\n"
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
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

    fn count(hay: &str, needle: &str) -> usize {
        hay.matches(needle).count()
    }

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(100.0), 20.0);
        assert_eq!(nice_step(7.0), 2.0);
        assert_eq!(nice_step(30_000.0), 10_000.0);
        assert_eq!(nice_step(0.0), 1.0);
        assert_eq!(fmt_tick(20_000.0), "20k");
        assert_eq!(fmt_tick(1_500_000.0), "1.5M");
        assert_eq!(fmt_tick(0.01), "0.01");
    }

    #[test]
    fn charts_have_a_point_per_sample() {
        let r = fake_run(5);
        let rates = rates_chart(&r, 0);
        assert_eq!(rates.series.len(), 2, "sent and received only");
        let svg = rates.svg();
        assert_eq!(count(&svg, "<circle"), 10);
        assert!(
            svg.contains(r#"data-chart="rates-0" data-points="10""#),
            "{svg}"
        );
        assert!(svg.contains("run &lt;1&gt;"), "escaped title");
        let lat = latency_chart(&r, 0, false).svg();
        assert_eq!(
            count(&lat, "<circle"),
            5 * 4,
            "4 samples with latency, 5 percentiles"
        );
        assert!(lat.contains(r#"data-series="p99" data-points="4""#));
    }

    #[test]
    fn sweep_chart_has_a_point_per_step_and_a_reference_line() {
        let pts: Vec<RatePoint> = [Some(1000.0), Some(5000.0), None]
            .iter()
            .map(|a| RatePoint {
                attempted: *a,
                sent: a.unwrap_or(9000.0),
                received: a.unwrap_or(8000.0),
                p50_us: Some(100),
                p99_us: Some(900),
                held: None,
            })
            .collect();
        let charts = sweep_charts(&pts, "sweep");
        let svg = charts[0].svg();
        assert!(svg.contains(r#"data-series="sent" data-points="3""#));
        assert!(svg.contains(r#"class="reference" data-series="attempted""#));
        assert!(svg.contains(">unlimited<"));
        assert_eq!(count(&svg, "<circle"), 6);
        assert_eq!(count(&charts[1].svg(), "<circle"), 6);
    }

    #[test]
    fn html_is_self_contained() {
        let mut rep = Report {
            tool: "warren perf",
            version: "0",
            command: "warren perf -z 5 </script>".into(),
            mode: "single",
            scenario: ScenarioInfo {
                uris: vec!["amqp://guest@localhost:5672/%2f".into()],
                producers: 1,
                consumers: 1,
                exchange: "direct".into(),
                exchange_type: "direct".into(),
                queues: vec![],
                routing_key: None,
                body_size: 12,
                rate_per_producer: None,
                persistent: false,
                mandatory: false,
                confirm: None,
                qos: 0,
                autoack: true,
                multi_ack_every: 0,
                time_s: Some(5),
                pmessages: 0,
                cmessages: 0,
                consumer_latency_us: 0,
            },
            runs: vec![fake_run(3)],
            sweep: None,
            steps: None,
            compare: None,
        };
        let page = html(&rep);
        assert!(
            !page.contains("src=") && !page.contains("<link"),
            "no external resources"
        );
        assert_eq!(
            count(&page, "</script>"),
            2,
            "the command's </script> is escaped"
        );
        assert_eq!(count(&page, "class=\"chart\""), 2);
        rep.runs.push(fake_run(2));
        let svg = stacked_svg(&headline_charts(&rep));
        assert_eq!(count(&svg, "class=\"chart\""), 2, "first run only");
        assert!(svg.starts_with("<svg xmlns"));
        assert!(
            !page.contains("http-equiv"),
            "the final report does not reload"
        );
        // Live: it reloads, says so, and charts the steps done so far.
        rep.sweep = Some(rep.runs.iter().map(crate::modes::RatePoint::of).collect());
        let live = html_live(&rep, 2);
        assert!(live.contains(r#"<meta http-equiv="refresh" content="2">"#));
        assert!(live.contains(r#"id="live""#));
        assert!(live.contains(r#"<section id="sweep">"#));
    }
}
