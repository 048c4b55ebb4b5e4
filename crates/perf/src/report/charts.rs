//! The charts of a report: a run's rates and latency percentiles over time, a sweep's or a
//! steps run's attempted vs achieved rate and latency, and the headline charts a doc shows.

use super::svg::fmt_tick;
use super::{Chart, Report, Series};
use crate::modes::RatePoint;
use crate::run::RunResult;

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

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;

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
}
