//! One chart as SVG: axes with round ticks (linear or log), category labels, a path and a
//! `<circle>` per point for each series (a reference series dashed, without points), and the
//! headline charts stacked in one file. Invariant: every chart is
//! `<svg class="chart" data-chart=ID data-points=N>` with one
//! `<g class="series" data-series=NAME data-points=K>` per series holding K circles, so what was
//! drawn can be checked against the data.

use std::fmt::Write as _;

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

/// Escapes text for SVG and HTML.
pub(super) fn esc(s: &str) -> String {
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

pub(super) fn fmt_tick(v: f64) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
