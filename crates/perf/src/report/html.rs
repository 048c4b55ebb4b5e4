//! The HTML report: one self-contained page (inline SVG charts, inline style and a little
//! inline script for the sample tables and tooltips; no network), final or live (reloading
//! while the runs go). The report's JSON is embedded for the script, with `</` escaped so it
//! cannot close the script element.

use std::fmt::Write as _;

use super::svg::esc;
use super::{latency_chart, rates_chart, sweep_charts, Report};
use crate::modes::RatePoint;
use crate::run::RunResult;

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
    use super::super::testutil::*;
    use super::super::{headline_charts, stacked_svg, ScenarioInfo};
    use super::*;

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
