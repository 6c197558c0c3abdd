//! `seed-table`: the analysis's latency table, measured. Five embedded shards inject 1 ms per
//! command and 0.2 ms per document; in the "slow" variant one shard injects ten times that.
//! One bulk of distinct-`_id` upserts is timed under mongos's rounds, the proven rewrite and a
//! client's unordered bulk, beside the analysis's figures and the physical limit: one wait on
//! the slowest shard for the documents it owns, both as the model computes it and measured by
//! sending those documents straight to that shard. Little's law turns each time into the
//! bulks in flight at the analysis's arrival rate of 20 bulks/s.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Context;
use bson::{doc, Bson, Document};

use super::fleet::{
    per_repetition, timed_update, upserts, Fleet, Latency, Layout, Progress, RouterSpec, Stats,
};
use super::report::{log_bar_chart, Bar, Report};
use crate::write::plan::Policy;

/// Bulks arriving per second in the analysis's Little's-law table.
pub const ARRIVALS_PER_S: f64 = 20.0;
const SHARDS: usize = 5;

/// The measurements of one variant (normal or one shard slow).
#[derive(Debug, Clone, Default)]
pub struct Variant {
    /// "normal" or "one shard slow".
    pub name: &'static str,
    /// Wall times (ms) per repetition: mongos rounds.
    pub mongos: Vec<f64>,
    /// … the proven rewrite.
    pub rewrite: Vec<f64>,
    /// … the client's unordered bulk.
    pub unordered: Vec<f64>,
    /// The model's limit (ms): max over shards of per-command + documents × per-document.
    pub limit_model: Vec<f64>,
    /// The slowest shard's documents sent straight to it (ms).
    pub limit_measured: Vec<f64>,
    /// Every shard's documents sent straight to it, all at once (ms).
    pub direct_all: Vec<f64>,
    /// The analysis's figures (ms): ordered, unordered (for n = 1,000).
    pub analysis: (f64, f64),
    /// One single-statement upsert straight to shard0 and to shard1 (ms, medians): what one
    /// round trip really costs here, against the model's 1.2 ms (12 ms on the slow shard).
    pub round_trip: (f64, f64),
}

fn latencies(slow: bool) -> Vec<Latency> {
    let normal = Latency {
        per_command: Duration::from_millis(1),
        per_document: Duration::from_micros(200),
    };
    let mut v = vec![normal; SHARDS];
    if slow {
        v[0] = Latency {
            per_command: normal.per_command * 10,
            per_document: normal.per_document * 10,
        };
    }
    v
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs the scenario on fleets of `layout`.
pub async fn run(quick: bool, layout: Layout) -> anyhow::Result<Report> {
    let (n, reps) = if quick { (100, 1) } else { (1000, 5) };
    let mut progress = Progress::new("seed-table", 2 * 2 * reps);
    let mut variants = Vec::new();
    for (slow, name, analysis) in [
        (false, "normal", (1000.0, 41.0)),
        (true, "one shard slow", (2800.0, 410.0)),
    ] {
        let lat = latencies(slow);
        let mut v = Variant {
            name,
            analysis,
            ..Variant::default()
        };
        for policy in [Policy::Off, Policy::RetrySafe] {
            let spec = RouterSpec::new(policy, per_repetition(reps, None)).in_layout(layout);
            let fleet = Fleet::start(&lat, &spec).await?;
            for r in 0..reps {
                let tag = format!("{name}-{r}");
                if policy == Policy::Off {
                    progress.step(&format!("{name}: mongos rounds, repetition {}", r + 1));
                    let t = timed_update(
                        &fleet.writer,
                        "bench",
                        &format!("o{r}"),
                        upserts(&tag, n),
                        true,
                    )
                    .await?;
                    v.mongos.push(ms(t));
                    continue;
                }
                progress.step(&format!(
                    "{name}: rewrite, unordered, physical limit, repetition {}",
                    r + 1
                ));
                let coll = format!("o{r}");
                let t = timed_update(&fleet.writer, "bench", &coll, upserts(&tag, n), true).await?;
                v.rewrite.push(ms(t));
                let t = timed_update(
                    &fleet.writer,
                    "bench",
                    &format!("u{r}"),
                    upserts(&tag, n),
                    false,
                )
                .await?;
                v.unordered.push(ms(t));
                let mut shares = Vec::new();
                for shard in 0..fleet.shard_clients.len() {
                    shares.push(share_of(&fleet, shard, &coll).await?);
                }
                let (slowest, cost) = shares
                    .iter()
                    .enumerate()
                    .map(|(i, share)| (i, lat[i].cost(share.len() as u64)))
                    .max_by_key(|(_, c)| *c)
                    .context("no shards")?;
                v.limit_model.push(ms(cost));
                let alone = timed_update(
                    &fleet.shard_clients[slowest],
                    "bench",
                    &format!("direct{r}"),
                    shares[slowest].clone(),
                    false,
                )
                .await?;
                v.limit_measured.push(ms(alone));
                v.direct_all.push(direct_all(&fleet, shares, r).await?);
                if r == 0 {
                    v.round_trip = (
                        round_trip(&fleet.shard_clients[0]).await?,
                        round_trip(&fleet.shard_clients[1]).await?,
                    );
                }
            }
            fleet.stop().await?;
        }
        variants.push(v);
    }
    progress.finish();
    Ok(report(n, reps, layout, &variants))
}

/// The upserts that recreate what `shard` holds of `bench.coll`.
async fn share_of(fleet: &Fleet, shard: usize, coll: &str) -> anyhow::Result<Vec<Bson>> {
    let mut cursor = fleet.shard_clients[shard]
        .database("bench")
        .collection::<Document>(coll)
        .find(doc! {})
        .projection(doc! {"_id": 1, "stock": 1})
        .await?;
    let mut updates = Vec::new();
    while cursor.advance().await? {
        let d = cursor.deserialize_current()?;
        updates.push(Bson::Document(doc! {
            "q": {"_id": d.get("_id").cloned().unwrap_or(Bson::Null)},
            "u": {"$set": {"stock": d.get("stock").cloned().unwrap_or(Bson::Null), "price": 100}},
            "upsert": true,
        }));
    }
    Ok(updates)
}

/// Sends every shard its share straight and all at once, as a router that cost nothing would:
/// the limit on this machine, where the shards share its cores (ms).
async fn direct_all(fleet: &Fleet, shares: Vec<Vec<Bson>>, rep: usize) -> anyhow::Result<f64> {
    let target = format!("all{rep}");
    let start = std::time::Instant::now();
    let sends = fleet
        .shard_clients
        .iter()
        .zip(shares)
        .filter(|(_, s)| !s.is_empty())
        .map(|(c, s)| timed_update(c, "bench", &target, s, false));
    for r in crate::backend::join_all(sends).await {
        r?;
    }
    Ok(ms(start.elapsed()))
}

/// The median of 30 single-statement upserts straight to one shard (ms).
async fn round_trip(c: &mongodb::Client) -> anyhow::Result<f64> {
    let mut times = Vec::new();
    for i in 0..30 {
        let t = timed_update(
            c,
            "bench",
            "round_trip",
            upserts(&format!("rt{i}"), 1),
            true,
        )
        .await?;
        times.push(ms(t));
    }
    Ok(Stats::of(&times).median)
}

fn fmt_ms(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.2} s", v / 1000.0)
    } else {
        format!("{v:.1} ms")
    }
}

fn report(n: usize, reps: usize, layout: Layout, variants: &[Variant]) -> Report {
    let med = |xs: &[f64]| Stats::of(xs).median;
    let mut md = format!(
        "5 embedded shards (separate processes) inject 1 ms per command + 0.2 ms per document; \"one shard slow\": shard0 injects 10 ms + 2 ms. One ordered bulk of n = {n} distinct-`_id` upserts through the router (stock Rust driver); medians of {reps} repetition(s) [min–max]. Bulks in flight by Little's law at {ARRIVALS_PER_S} bulks/s. Layout: {}.\n\nThe physical limit is one wait on the slowest shard for the documents it owns: the model's figure, and the same upserts sent straight to that shard alone. A router that cost nothing would send every shard its share at once: that is measured too (\"all shards direct\"), and on a 2-core machine that hosts five shards it is slower than the slowest shard alone, because the shards' CPU work after the injected wait shares the cores.\n\n| case | plan | wall time | analysis (n = 1,000) | vs slowest shard alone | vs all shards direct | bulks in flight |\n|---|---|---|---|---|---|---|\n",
        super::rounds::layout_text(layout)
    );
    for v in variants {
        let alone = med(&v.limit_measured);
        let all = med(&v.direct_all);
        for (plan, xs, analysis) in [
            ("mongos rounds", &v.mongos, fmt_ms(v.analysis.0)),
            (
                "proven rewrite",
                &v.rewrite,
                format!("{} (as unordered)", fmt_ms(v.analysis.1)),
            ),
            ("client unordered", &v.unordered, fmt_ms(v.analysis.1)),
        ] {
            let s = Stats::of(xs);
            let _ = writeln!(
                md,
                "| {} | {plan} | {} [{}–{}] | {analysis} | {:.2}× | {:.2}× | {:.1} |",
                v.name,
                fmt_ms(s.median),
                fmt_ms(s.min),
                fmt_ms(s.max),
                s.median / alone,
                s.median / all,
                ARRIVALS_PER_S * s.median / 1000.0,
            );
        }
    }
    md.push_str("\n| case | limit: model | slowest shard alone | all shards direct, at once |\n|---|---|---|---|\n");
    for v in variants {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            v.name,
            fmt_ms(med(&v.limit_model)),
            fmt_ms(med(&v.limit_measured)),
            fmt_ms(med(&v.direct_all)),
        );
    }
    md.push_str("\nWhat one round trip costs on this machine (a single-statement upsert straight to a shard, median of 30), against the model's 1 ms + 0.2 ms:\n\n| case | shard0 | shard1 |\n|---|---|---|\n");
    for v in variants {
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            v.name,
            fmt_ms(v.round_trip.0),
            fmt_ms(v.round_trip.1)
        );
    }
    let json = serde_json::json!({
        "scenario": "seed-table",
        "layout": layout.name(),
        "n": n,
        "repetitions": reps,
        "shards": SHARDS,
        "latency": {"per_command_ms": 1.0, "per_document_ms": 0.2, "slow_factor": 10},
        "arrivals_per_s": ARRIVALS_PER_S,
        "variants": variants.iter().map(|v| serde_json::json!({
            "name": v.name,
            "analysis_ms": {"ordered": v.analysis.0, "unordered": v.analysis.1},
            "mongos_rounds_ms": {"samples": v.mongos, "stats": Stats::of(&v.mongos).json()},
            "rewrite_ms": {"samples": v.rewrite, "stats": Stats::of(&v.rewrite).json()},
            "unordered_ms": {"samples": v.unordered, "stats": Stats::of(&v.unordered).json()},
            "limit_model_ms": {"samples": v.limit_model, "stats": Stats::of(&v.limit_model).json()},
            "limit_measured_ms": {"samples": v.limit_measured, "stats": Stats::of(&v.limit_measured).json()},
            "direct_all_ms": {"samples": v.direct_all, "stats": Stats::of(&v.direct_all).json()},
            "rewrite_over_direct_all": med(&v.rewrite) / med(&v.direct_all),
            "rewrite_over_limit": med(&v.rewrite) / med(&v.limit_measured),
            "round_trip_ms": {"shard0": v.round_trip.0, "shard1": v.round_trip.1},
            "bulks_in_flight": {
                "mongos_rounds": ARRIVALS_PER_S * med(&v.mongos) / 1000.0,
                "rewrite": ARRIVALS_PER_S * med(&v.rewrite) / 1000.0,
                "unordered": ARRIVALS_PER_S * med(&v.unordered) / 1000.0,
            },
        })).collect::<Vec<_>>(),
    });
    let mut bars = Vec::new();
    for v in variants {
        for (plan, color, xs) in [
            ("mongos rounds", "#c0392b", &v.mongos),
            ("proven rewrite", "#2471a3", &v.rewrite),
            ("unordered", "#5dade2", &v.unordered),
            ("slowest shard alone", "#7f8c8d", &v.limit_measured),
            ("all shards direct", "#b3b6b7", &v.direct_all),
        ] {
            bars.push(Bar {
                label: format!("{}: {plan}", v.name),
                value: med(xs),
                color,
            });
        }
    }
    let chart = log_bar_chart(
        &format!("One bulk of {n} upserts, 5 shards (log scale)"),
        "ms",
        &bars,
    );
    let name = match layout {
        Layout::Static => "seed-table",
        Layout::Cluster => "seed-table-cluster",
    };
    Report {
        name,
        json,
        markdown: md,
        charts: vec![(format!("{name}.svg"), chart)],
    }
}
