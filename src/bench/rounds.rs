//! `rounds`: child batches per ordered bulk of distinct-`_id` upserts, counted on the shards
//! (`serverStatus().metrics.commands.update.total`), under mongos's rounds, the proven rewrite
//! and a client's unordered bulk, beside the analysis's `1 + (n − 1)(1 − Σ p_i²)`, where `p_i`
//! is shard *i*'s share of the hash space read back from the router's `config.chunks`.
//!
//! Uniform placements use the default 2 chunks per shard; skewed ones use a `numInitialChunks`
//! that the shards cannot divide evenly, so that some shards own one chunk more than others
//! (as MongoDB lays such chunks out).

use std::fmt::Write as _;

use super::fleet::{
    per_repetition, timed_update, upserts, Fleet, Latency, Layout, Progress, RouterSpec, Stats,
};
use super::report::{line_chart, Report, Series};
use crate::write::plan::Policy;

/// One placement's measurements.
#[derive(Debug, Clone)]
pub struct Row {
    /// Shards.
    pub shards: usize,
    /// `numInitialChunks`, when not the default.
    pub chunks: Option<u32>,
    /// Each shard's share of the hash space.
    pub shares: Vec<f64>,
    /// The analysis's expectation for mongos rounds.
    pub formula: f64,
    /// Child batches of mongos rounds, per repetition.
    pub mongos: Vec<f64>,
    /// Child batches of the proven rewrite, per repetition.
    pub rewrite: Vec<f64>,
    /// Child batches of the unordered bulk, per repetition.
    pub unordered: Vec<f64>,
    /// Shards that received documents, per rewrite repetition.
    pub touched: Vec<f64>,
}

/// `1 + (n − 1)(1 − Σ p_i²)`.
pub fn formula(n: usize, shares: &[f64]) -> f64 {
    let sum_sq: f64 = shares.iter().map(|p| p * p).sum();
    1.0 + (n as f64 - 1.0) * (1.0 - sum_sq)
}

struct Setup {
    n: usize,
    reps: usize,
    placements: Vec<(usize, Option<u32>)>,
}

fn setup(quick: bool) -> Setup {
    if quick {
        Setup {
            n: 200,
            reps: 1,
            placements: vec![(2, None), (3, None), (2, Some(3))],
        }
    } else {
        Setup {
            n: 1000,
            reps: 10,
            placements: vec![
                (2, None),
                (3, None),
                (4, None),
                (5, None),
                (6, None),
                (8, None),
                (2, Some(3)),
                (3, Some(4)),
                (5, Some(7)),
            ],
        }
    }
}

/// Runs the scenario on fleets of `layout`.
pub async fn run(quick: bool, layout: Layout) -> anyhow::Result<Report> {
    let s = setup(quick);
    let mut progress = Progress::new("rounds", s.placements.len() * 2 * s.reps);
    let mut rows = Vec::new();
    for &(shards, chunks) in &s.placements {
        let mut row = Row {
            shards,
            chunks,
            shares: Vec::new(),
            formula: 0.0,
            mongos: Vec::new(),
            rewrite: Vec::new(),
            unordered: Vec::new(),
            touched: Vec::new(),
        };
        for policy in [Policy::Off, Policy::RetrySafe] {
            let spec = RouterSpec::new(policy, per_repetition(s.reps, chunks)).in_layout(layout);
            let fleet = Fleet::start(&vec![Latency::default(); shards], &spec).await?;
            if row.shares.is_empty() {
                row.shares = fleet.hash_shares("bench.o0").await?;
                row.formula = formula(s.n, &row.shares);
            }
            for r in 0..s.reps {
                let plan = if policy == Policy::Off {
                    "mongos rounds"
                } else {
                    "rewrite + unordered"
                };
                progress.step(&format!(
                    "{shards} shards{}, {plan}, repetition {}",
                    chunks.map(|c| format!(" ({c} chunks)")).unwrap_or_default(),
                    r + 1
                ));
                let tag = format!("{shards}-{chunks:?}-{r}");
                let before = fleet.shard_command_total("update").await?;
                timed_update(
                    &fleet.writer,
                    "bench",
                    &format!("o{r}"),
                    upserts(&tag, s.n),
                    true,
                )
                .await?;
                let ordered = (fleet.shard_command_total("update").await? - before) as f64;
                if policy == Policy::Off {
                    row.mongos.push(ordered);
                    continue;
                }
                row.rewrite.push(ordered);
                let counts = fleet.counts_on_shards("bench", &format!("o{r}")).await?;
                row.touched
                    .push(counts.iter().filter(|c| **c > 0).count() as f64);
                let before = fleet.shard_command_total("update").await?;
                timed_update(
                    &fleet.writer,
                    "bench",
                    &format!("u{r}"),
                    upserts(&tag, s.n),
                    false,
                )
                .await?;
                row.unordered
                    .push((fleet.shard_command_total("update").await? - before) as f64);
            }
            fleet.stop().await?;
        }
        rows.push(row);
    }
    progress.finish();
    Ok(report(s.n, s.reps, layout, &rows))
}

fn placement(row: &Row) -> String {
    let shares: Vec<String> = row.shares.iter().map(|p| format!("{p:.3}")).collect();
    match row.chunks {
        None => format!("uniform ({})", shares.join(", ")),
        Some(c) => format!("{c} chunks: {}", shares.join(", ")),
    }
}

fn cell(xs: &[f64]) -> String {
    let s = Stats::of(xs);
    if xs.len() > 1 {
        format!("{:.1} ± {:.1} [{}–{}]", s.mean, s.sd, s.min, s.max)
    } else {
        format!("{:.0}", s.mean)
    }
}

fn report(n: usize, reps: usize, layout: Layout, rows: &[Row]) -> Report {
    let mut md = format!(
        "n = {n} ordered upserts with distinct hashed `_id`s per bulk, {reps} repetition(s) per cell (mean ± sample sd [min–max]). Child batches are the shards' own `update` command counts. Layout: {}.\n\n| shards | placement (hash-space share per shard) | formula 1+(n−1)(1−Σp²) | mongos rounds | vs formula | proven rewrite | client unordered | shards touched |\n|---|---|---|---|---|---|---|---|\n",
        layout_text(layout)
    );
    for r in rows {
        let mean = Stats::of(&r.mongos).mean;
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} | {} | {:+.1} % | {} | {} | {} |",
            r.shards,
            placement(r),
            r.formula,
            cell(&r.mongos),
            100.0 * (mean - r.formula) / r.formula,
            cell(&r.rewrite),
            cell(&r.unordered),
            cell(&r.touched),
        );
    }
    let json = serde_json::json!({
        "scenario": "rounds",
        "layout": layout.name(),
        "n": n,
        "repetitions": reps,
        "rows": rows.iter().map(|r| serde_json::json!({
            "shards": r.shards,
            "num_initial_chunks": r.chunks,
            "shares": r.shares,
            "formula": r.formula,
            "mongos_rounds": {"samples": r.mongos, "stats": Stats::of(&r.mongos).json()},
            "rewrite": {"samples": r.rewrite, "stats": Stats::of(&r.rewrite).json()},
            "unordered": {"samples": r.unordered, "stats": Stats::of(&r.unordered).json()},
            "shards_touched": r.touched,
        })).collect::<Vec<_>>(),
    });
    let uniform: Vec<&Row> = rows.iter().filter(|r| r.chunks.is_none()).collect();
    let series = |label: &str, color, dashed, f: &dyn Fn(&Row) -> f64| Series {
        label: label.to_string(),
        color,
        dashed,
        points: uniform.iter().map(|r| (r.shards as f64, f(r))).collect(),
    };
    let chart = line_chart(
        &format!("Child batches for one ordered bulk of {n} upserts"),
        "shards",
        "",
        &[
            series("formula 1 + (n−1)(1 − 1/S)", "#7f8c8d", true, &|r| {
                r.formula
            }),
            series("mongos rounds (measured)", "#c0392b", false, &|r| {
                Stats::of(&r.mongos).mean
            }),
            series("proven rewrite (measured)", "#2471a3", false, &|r| {
                Stats::of(&r.rewrite).mean
            }),
        ],
    );
    let name = match layout {
        Layout::Static => "rounds",
        Layout::Cluster => "rounds-cluster",
    };
    Report {
        name,
        json,
        markdown: md,
        charts: vec![(format!("{name}.svg"), chart)],
    }
}

/// What `layout` starts, for the results' text.
pub fn layout_text(layout: Layout) -> &'static str {
    match layout {
        Layout::Static => "static (one `sluice --config` router holding the shards and collections in its configuration)",
        Layout::Cluster => "cluster (a `sluice configsvr` config server, the shards in shard-server mode, a `--configdb` router; shards added and collections sharded through the router)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_analysis_table() {
        for (s, want) in [
            (2, 500.5),
            (3, 667.0),
            (4, 750.25),
            (5, 800.2),
            (6, 833.5),
            (8, 875.125),
        ] {
            let shares = vec![1.0 / s as f64; s];
            assert!((formula(1000, &shares) - want).abs() < 1e-9, "S={s}");
        }
        assert!((formula(1000, &[2.0 / 3.0, 1.0 / 3.0]) - 445.0).abs() < 1e-9);
    }
}
