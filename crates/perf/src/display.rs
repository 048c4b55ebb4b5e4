//! Console output: PerfTest-style lines on stdout; on a terminal also a live status line with a
//! progress bar for timed runs, redrawn below the scrolling lines.

use std::io::{IsTerminal, Write};

use crate::stats::{Sample, Summary};

pub struct Output {
    tty: bool,
    status_shown: bool,
    /// The HTML report rewritten while the runs go (`--report`), for watching them live.
    pub live: Option<Live>,
}

/// The live HTML report: the runs finished so far and the one in progress, rewritten every
/// sample interval with a refresh tag, until the final report replaces it.
pub struct Live {
    path: std::path::PathBuf,
    refresh_s: u64,
    report: crate::report::Report,
    warned: bool,
}

impl Live {
    pub fn new(path: std::path::PathBuf, refresh_s: u64, report: crate::report::Report) -> Live {
        Live {
            path,
            refresh_s,
            report,
            warned: false,
        }
    }

    /// The steps of a sweep or of `--steps` finished so far: the live report charts them as a
    /// sweep (attempted vs achieved vs latency), before the final report's own section.
    pub fn points(&mut self, points: Vec<crate::modes::RatePoint>) {
        self.report.sweep = Some(points);
    }

    /// A run finished: it stays in the live report.
    pub fn finished(&mut self, r: crate::run::RunResult) {
        self.report.runs.push(r);
    }

    /// Rewrites the file with `current` (the run in progress) after the finished runs.
    pub fn write(&mut self, current: crate::run::RunResult) {
        self.report.runs.push(current);
        let html = crate::report::html_live(&self.report, self.refresh_s);
        self.report.runs.pop();
        // Written beside and renamed, so a browser never loads half a file.
        let tmp = self.path.with_extension("html.tmp");
        let r = std::fs::write(&tmp, html).and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(e) = r {
            if !self.warned {
                eprintln!(
                    "warren perf: cannot write the live report {}: {e}",
                    self.path.display()
                );
                self.warned = true;
            }
        }
    }
}

impl Output {
    pub fn new() -> Output {
        Output {
            tty: std::io::stdout().is_terminal(),
            status_shown: false,
            live: None,
        }
    }

    pub fn is_tty(&self) -> bool {
        self.tty
    }

    /// A permanent line.
    pub fn line(&mut self, s: &str) {
        let mut out = std::io::stdout().lock();
        if self.status_shown {
            let _ = write!(out, "\r\x1b[2K");
            self.status_shown = false;
        }
        let _ = writeln!(out, "{s}");
        let _ = out.flush();
    }

    /// The live status line (terminal only).
    pub fn status(&mut self, s: &str) {
        if !self.tty {
            return;
        }
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "\r\x1b[2K{s}");
        let _ = out.flush();
        self.status_shown = true;
    }

    pub fn clear_status(&mut self) {
        if self.status_shown {
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "\r\x1b[2K");
            let _ = out.flush();
            self.status_shown = false;
        }
    }
}

impl Default for Output {
    fn default() -> Self {
        Output::new()
    }
}

/// One PerfTest-style interval line. Confirm latency only when confirms are on.
pub fn sample_line(id: &str, s: &Sample, confirms: bool) -> String {
    let mut line = format!(
        "id: {id}, time {:.3} s, sent: {:.0} msg/s, confirmed: {:.0} msg/s, nacked: {:.0} msg/s, returned: {:.0} msg/s, received: {:.0} msg/s",
        s.t_s, s.sent, s.confirmed, s.nacked, s.returned, s.received
    );
    if let Some(p) = &s.latency_us {
        line.push_str(&format!(
            ", min/median/75th/95th/99th consumer latency: {} µs",
            p.perftest()
        ));
    }
    if confirms {
        if let Some(p) = &s.confirm_latency_us {
            line.push_str(&format!(", confirm latency: {} µs", p.perftest()));
        }
    }
    line
}

/// PerfTest's summary lines (so its summary parsers read ours), then the totals.
pub fn summary_lines(id: &str, s: &Summary) -> Vec<String> {
    let mut v = vec![
        format!("id: {id}, sending rate avg: {:.0} msg/s", s.send_rate),
        format!("id: {id}, receiving rate avg: {:.0} msg/s", s.receive_rate),
    ];
    if let Some(p) = &s.latency_us {
        v.push(format!(
            "id: {id}, consumer latency min/median/75th/95th/99th {} µs",
            p.perftest()
        ));
    }
    if let Some(p) = &s.confirm_latency_us {
        v.push(format!(
            "id: {id}, confirm latency min/median/75th/95th/99th {} µs",
            p.perftest()
        ));
    }
    let t = &s.totals;
    v.push(format!(
        "id: {id}, totals in {:.1} s: sent {}, confirmed {}, nacked {}, returned {}, received {}",
        s.duration_s, t.sent, t.confirmed, t.nacked, t.returned, t.received
    ));
    v
}

/// `[#######-------] 12/30 s` or, for an untimed run, `12 s`.
pub fn progress(elapsed_s: f64, total_s: Option<u64>, width: usize) -> String {
    match total_s {
        Some(t) if t > 0 => {
            let frac = (elapsed_s / t as f64).clamp(0.0, 1.0);
            let filled = (frac * width as f64).round() as usize;
            format!(
                "[{}{}] {:>3.0}/{t} s",
                "#".repeat(filled),
                "-".repeat(width - filled),
                elapsed_s.min(t as f64)
            )
        }
        _ => format!("{elapsed_s:.0} s"),
    }
}

/// A rate for humans: 1234567.0 -> "1,234,567".
pub fn thousands(v: f64) -> String {
    let n = v.round() as i64;
    let s = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

/// Microseconds for humans: "850 µs", "12.3 ms", "4.20 s".
pub fn micros(us: u64) -> String {
    if us < 1000 {
        format!("{us} µs")
    } else if us < 1_000_000 {
        format!("{:.1} ms", us as f64 / 1000.0)
    } else {
        format!("{:.2} s", us as f64 / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{Counts, Percentiles};

    #[test]
    fn lines_match_perftest_wording() {
        let p = Percentiles {
            min: 1,
            p50: 2,
            p75: 3,
            p95: 4,
            p99: 5,
            max: 6,
        };
        let s = Sample {
            t_s: 1.0,
            sent: 10.0,
            confirmed: 9.0,
            nacked: 0.0,
            returned: 0.0,
            received: 8.0,
            latency_us: Some(p),
            confirm_latency_us: Some(p),
        };
        assert_eq!(
            sample_line("t", &s, true),
            "id: t, time 1.000 s, sent: 10 msg/s, confirmed: 9 msg/s, nacked: 0 msg/s, returned: 0 msg/s, received: 8 msg/s, min/median/75th/95th/99th consumer latency: 1/2/3/4/5 µs, confirm latency: 1/2/3/4/5 µs"
        );
        let sum = Summary {
            duration_s: 2.0,
            totals: Counts::default(),
            send_rate: 5.4,
            confirm_rate: 0.0,
            receive_rate: 5.6,
            latency_us: Some(p),
            confirm_latency_us: None,
        };
        let l = summary_lines("t", &sum);
        assert_eq!(l[0], "id: t, sending rate avg: 5 msg/s");
        assert_eq!(l[1], "id: t, receiving rate avg: 6 msg/s");
        assert_eq!(
            l[2],
            "id: t, consumer latency min/median/75th/95th/99th 1/2/3/4/5 µs"
        );
    }

    #[test]
    fn progress_and_numbers() {
        assert_eq!(progress(5.0, Some(10), 10), "[#####-----]   5/10 s");
        assert_eq!(progress(50.0, Some(10), 4), "[####]  10/10 s");
        assert_eq!(progress(3.2, None, 10), "3 s");
        assert_eq!(thousands(1234567.4), "1,234,567");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(micros(850), "850 µs");
        assert_eq!(micros(12_345), "12.3 ms");
        assert_eq!(micros(4_200_000), "4.20 s");
    }
}
