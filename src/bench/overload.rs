//! `overload`: the adaptive limit against a fixed `max_in_flight` with 1, 2, 4 and 8 routers in
//! front of one capacity-limited shard, on the deterministic simulation of
//! [`crate::backend::sim`] (simulated time, so the numbers are the same on every machine).

use std::fmt::Write as _;
use std::time::Duration;

use super::report::{line_chart, Report, Series};
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
    let series = |label: &str, color, f: &dyn Fn(&OverloadRow) -> f64| Series {
        label: label.to_string(),
        color,
        dashed: false,
        points: rows.iter().map(|r| (r.routers as f64, f(r))).collect(),
    };
    line_chart(
        "p99 write latency vs routers (simulated shard, 4 slots)",
        "routers",
        "ms",
        &[
            series("fixed max_in_flight = 16", "#c0392b", &|r| ms(r.fixed.p99)),
            series("adaptive limit", "#2471a3", &|r| ms(r.adaptive.p99)),
        ],
    )
}

/// Runs `overload` into a report (`overload.json`, `overload.md`, `overload.svg`).
pub fn report(quick: bool) -> Report {
    let rows = overload(quick);
    Report {
        name: "overload",
        json: overload_json(&rows),
        markdown: overload_markdown(&rows),
        charts: vec![("overload.svg".into(), overload_svg(&rows))],
    }
}
