//! `sluice bench <scenario>`: benchmarks that write a JSON result, a Markdown table and, where
//! a picture helps, an SVG chart into an output directory.
//!
//! - `overload`: the adaptive limit against a fixed `max_in_flight` with 1, 2, 4 and 8 routers
//!   in front of one capacity-limited shard, on the deterministic simulation of
//!   [`crate::backend::sim`] (simulated time, so the numbers are the same on every machine).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::backend::sim::{self, SimResult};

/// One row of the overload benchmark.
#[derive(Debug, Clone)]
pub struct OverloadRow {
    /// Routers in front of the shard.
    pub routers: usize,
    /// With the fixed limit.
    pub fixed: SimResult,
    /// With the adaptive limit.
    pub adaptive: SimResult,
}

/// Runs the overload scenario; `quick` shortens the simulated time.
pub fn overload(quick: bool) -> Vec<OverloadRow> {
    let duration = if quick {
        Duration::from_secs(10)
    } else {
        Duration::from_secs(60)
    };
    [1usize, 2, 4, 8]
        .iter()
        .map(|&routers| {
            let cfg = |adaptive: bool| sim::overload_config(routers, adaptive, duration);
            eprintln!("overload: {routers} router(s)…");
            OverloadRow {
                routers,
                fixed: sim::run(&cfg(false)),
                adaptive: sim::run(&cfg(true)),
            }
        })
        .collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The Markdown table of an overload run.
pub fn overload_markdown(rows: &[OverloadRow]) -> String {
    let mut s = String::from(
        "Shard: 4 executions at once, 1 ms + 20 µs per statement per batch; 24,000 single-statement writes/s spread over the routers.\n\n| routers | fixed 16: p99 | fixed 16: shard queue | adaptive: p99 | adaptive: shard queue | throughput fixed / adaptive (stmt/s) |\n|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {:.1} ms | {:.1} | {:.1} ms | {:.1} | {:.0} / {:.0} |",
            r.routers,
            ms(r.fixed.p99),
            r.fixed.mean_shard_queue,
            ms(r.adaptive.p99),
            r.adaptive.mean_shard_queue,
            r.fixed.throughput,
            r.adaptive.throughput
        );
    }
    s
}

/// The JSON of an overload run.
pub fn overload_json(rows: &[OverloadRow]) -> serde_json::Value {
    let side = |r: &SimResult| {
        serde_json::json!({
            "throughput": r.throughput,
            "p50_ms": ms(r.p50),
            "p99_ms": ms(r.p99),
            "mean_shard_queue": r.mean_shard_queue,
            "mean_batch": r.mean_batch,
        })
    };
    serde_json::json!({
        "scenario": "overload",
        "shard": {"capacity": 4, "per_batch_ms": 1.0, "per_statement_us": 20.0},
        "offered_statements_per_s": 24000,
        "rows": rows.iter().map(|r| serde_json::json!({"routers": r.routers, "fixed": side(&r.fixed), "adaptive": side(&r.adaptive)})).collect::<Vec<_>>(),
    })
}

/// An SVG line chart of p99 latency against the number of routers.
pub fn overload_svg(rows: &[OverloadRow]) -> String {
    let (w, h, left, bottom, top, right) = (560.0, 320.0, 60.0, 40.0, 30.0, 20.0);
    let max = rows
        .iter()
        .map(|r| ms(r.fixed.p99).max(ms(r.adaptive.p99)))
        .fold(1.0, f64::max)
        * 1.1;
    let x = |i: usize| left + (w - left - right) * i as f64 / (rows.len().max(2) - 1) as f64;
    let y = |v: f64| h - bottom - (h - bottom - top) * v / max;
    let line = |f: &dyn Fn(&OverloadRow) -> f64| {
        rows.iter()
            .enumerate()
            .map(|(i, r)| format!("{:.1},{:.1}", x(i), y(f(r))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut s = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n");
    let _ = writeln!(s, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    let _ = writeln!(s, "<text x=\"{left}\" y=\"18\" font-size=\"14\">p99 write latency vs routers (simulated shard, 4 slots)</text>");
    let _ = writeln!(
        s,
        "<line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>",
        h - bottom,
        w - right,
        h - bottom
    );
    let _ = writeln!(
        s,
        "<line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"black\"/>",
        h - bottom
    );
    for (i, r) in rows.iter().enumerate() {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x(i),
            h - bottom + 16.0,
            r.routers
        );
    }
    for k in 0..=4 {
        let v = max * k as f64 / 4.0;
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0} ms</text>",
            left - 6.0,
            y(v) + 4.0
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">routers</text>",
        (left + w - right) / 2.0,
        h - 6.0
    );
    let _ = writeln!(
        s,
        "<polyline fill=\"none\" stroke=\"#c0392b\" stroke-width=\"2\" points=\"{}\"/>",
        line(&|r| ms(r.fixed.p99))
    );
    let _ = writeln!(
        s,
        "<polyline fill=\"none\" stroke=\"#2471a3\" stroke-width=\"2\" points=\"{}\"/>",
        line(&|r| ms(r.adaptive.p99))
    );
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" fill=\"#c0392b\">fixed max_in_flight = 16</text>",
        left + 10.0,
        top + 14.0
    );
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" fill=\"#2471a3\">adaptive limit</text>",
        left + 10.0,
        top + 30.0
    );
    s.push_str("</svg>\n");
    s
}

/// Runs `overload` and writes `overload.json`, `overload.md` and `overload.svg` into `out`.
pub fn run_overload(out: &Path, quick: bool) -> std::io::Result<String> {
    std::fs::create_dir_all(out)?;
    let rows = overload(quick);
    let md = overload_markdown(&rows);
    std::fs::write(out.join("overload.md"), &md)?;
    std::fs::write(
        out.join("overload.json"),
        serde_json::to_string_pretty(&overload_json(&rows)).unwrap_or_default(),
    )?;
    std::fs::write(out.join("overload.svg"), overload_svg(&rows))?;
    Ok(md)
}
