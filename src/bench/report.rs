//! Writing a scenario's results: JSON, a Markdown table and SVG charts.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;

/// What one scenario produced.
pub struct Report {
    /// File stem: `rounds` gives `rounds.json`, `rounds.md`, `rounds*.svg`.
    pub name: &'static str,
    /// The machine-readable result.
    pub json: serde_json::Value,
    /// The human one.
    pub markdown: String,
    /// Charts: (file name, SVG text).
    pub charts: Vec<(String, String)>,
}

impl Report {
    /// Writes the files into `out` (created if missing); returns the Markdown.
    pub fn write(&self, out: &Path) -> anyhow::Result<String> {
        std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
        let put = |file: String, text: &str| {
            let path = out.join(file);
            std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
        };
        put(
            format!("{}.json", self.name),
            &serde_json::to_string_pretty(&self.json)?,
        )?;
        put(format!("{}.md", self.name), &self.markdown)?;
        for (file, svg) in &self.charts {
            put(file.clone(), svg)?;
        }
        Ok(self.markdown.clone())
    }
}

/// A series of a line chart.
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Stroke colour.
    pub color: &'static str,
    /// Dashed line (a formula rather than a measurement).
    pub dashed: bool,
    /// Points (x, y).
    pub points: Vec<(f64, f64)>,
}

const W: f64 = 600.0;
const H: f64 = 340.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 44.0;

/// An SVG of `height` with a white background and `title` at `title_x`.
fn svg_open(title: &str, height: f64, title_x: f64) -> String {
    let mut s = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n");
    let _ = writeln!(s, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    let _ = writeln!(
        s,
        "<text x=\"{title_x}\" y=\"20\" font-size=\"14\">{}</text>",
        escape(title)
    );
    s
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A line chart with the x values of the first series as ticks, y from 0.
pub fn line_chart(title: &str, x_label: &str, y_unit: &str, series: &[Series]) -> String {
    let xs: Vec<f64> = series
        .first()
        .map(|s| s.points.iter().map(|p| p.0).collect())
        .unwrap_or_default();
    let all = series.iter().flat_map(|s| s.points.iter());
    let (x_min, x_max) = all.clone().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
        (lo.min(p.0), hi.max(p.0))
    });
    let y_max = all.map(|p| p.1).fold(1e-9, f64::max) * 1.1;
    let span = if x_max > x_min { x_max - x_min } else { 1.0 };
    let x = |v: f64| LEFT + (W - LEFT - RIGHT) * (v - x_min) / span;
    let y = |v: f64| H - BOTTOM - (H - BOTTOM - TOP) * v / y_max;
    let mut s = svg_open(title, H, LEFT);
    axes(&mut s);
    for v in &xs {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{v}</text>",
            x(*v),
            H - BOTTOM + 16.0
        );
    }
    for k in 0..=4 {
        let v = y_max * k as f64 / 4.0;
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{} {y_unit}</text>",
            LEFT - 6.0,
            y(v) + 4.0,
            tick(v)
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
        (LEFT + W - RIGHT) / 2.0,
        H - 8.0,
        escape(x_label)
    );
    for (i, ser) in series.iter().enumerate() {
        let pts: Vec<String> = ser
            .points
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.0), y(p.1)))
            .collect();
        let dash = if ser.dashed {
            " stroke-dasharray=\"6 4\""
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{dash} points=\"{}\"/>",
            ser.color,
            pts.join(" ")
        );
        if !ser.dashed {
            for p in &ser.points {
                let _ = writeln!(
                    s,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{}\"/>",
                    x(p.0),
                    y(p.1),
                    ser.color
                );
            }
        }
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" fill=\"{}\">{}</text>",
            LEFT + 10.0,
            TOP + 14.0 + 16.0 * i as f64,
            ser.color,
            escape(&ser.label)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn axes(s: &mut String) {
    let _ = writeln!(
        s,
        "<line x1=\"{LEFT}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>",
        H - BOTTOM,
        W - RIGHT,
        H - BOTTOM
    );
    let _ = writeln!(
        s,
        "<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{}\" stroke=\"black\"/>",
        H - BOTTOM
    );
}

fn tick(v: f64) -> String {
    if v >= 100.0 || v == 0.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// One bar of a bar chart.
pub struct Bar {
    /// Label left of the bar.
    pub label: String,
    /// Value (must be > 0: the axis is logarithmic).
    pub value: f64,
    /// Fill colour.
    pub color: &'static str,
}

/// Horizontal bars on a logarithmic axis (values spanning decades, like 41 ms and 2.8 s).
pub fn log_bar_chart(title: &str, unit: &str, bars: &[Bar]) -> String {
    let left = 230.0;
    let height = TOP + 22.0 * bars.len() as f64 + BOTTOM;
    let lo = bars
        .iter()
        .map(|b| b.value)
        .fold(f64::MAX, f64::min)
        .max(1e-9)
        .log10()
        .floor();
    let hi = bars
        .iter()
        .map(|b| b.value)
        .fold(1e-9, f64::max)
        .log10()
        .ceil()
        .max(lo + 1.0);
    let x = |v: f64| left + (W - left - RIGHT) * (v.max(1e-9).log10() - lo) / (hi - lo);
    let mut s = svg_open(title, height, 10.0);
    let base = height - BOTTOM;
    let mut d = lo;
    while d <= hi {
        let v = 10f64.powf(d);
        let _ = writeln!(
            s,
            "<line x1=\"{0:.1}\" y1=\"{TOP}\" x2=\"{0:.1}\" y2=\"{base}\" stroke=\"#ddd\"/>",
            x(v)
        );
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{} {unit}</text>",
            x(v),
            base + 16.0,
            tick(v)
        );
        d += 1.0;
    }
    for (i, b) in bars.iter().enumerate() {
        let top = TOP + 22.0 * i as f64 + 3.0;
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            left - 6.0,
            top + 12.0,
            escape(&b.label)
        );
        let _ = writeln!(
            s,
            "<rect x=\"{left}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"16\" fill=\"{}\"/>",
            (x(b.value) - left).max(1.0),
            b.color
        );
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            (x(b.value) + 4.0).min(W - RIGHT - 40.0),
            top + 12.0,
            tick(b.value)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_svg_with_every_series_and_bar() {
        let svg = line_chart(
            "t <1>",
            "shards",
            "",
            &[
                Series {
                    label: "measured".into(),
                    color: "#000",
                    dashed: false,
                    points: vec![(2.0, 500.0), (3.0, 667.0)],
                },
                Series {
                    label: "formula".into(),
                    color: "#111",
                    dashed: true,
                    points: vec![(2.0, 500.5), (3.0, 667.0)],
                },
            ],
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("t &lt;1&gt;"));
        let bars = log_bar_chart(
            "b",
            "ms",
            &[
                Bar {
                    label: "a".into(),
                    value: 41.0,
                    color: "#000",
                },
                Bar {
                    label: "b".into(),
                    value: 2800.0,
                    color: "#000",
                },
            ],
        );
        assert_eq!(bars.matches("<rect x=").count(), 2);
    }
}
