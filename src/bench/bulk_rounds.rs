//! `bulkwrite`: child commands per ordered `bulkWrite` (MongoDB 8.0) of distinct-`_id` upserts
//! over two sharded namespaces, counted on the shards (`serverStatus().metrics.commands
//! .bulkWrite.total`), under mongos's rounds (`ordered_rewrite = "off"`) and Sluice's proven
//! rewrite, beside the analysis's `1 + (n − 1)(1 − Σ p_i²)` (operations alternate between the
//! namespaces; a child `bulkWrite` carries both, so a round is a run of operations bound for one
//! shard whatever their namespace).

use std::fmt::Write as _;
use std::time::Instant;

use anyhow::bail;
use bson::{doc, Bson};

use super::fleet::{next_txn_number, Fleet, Latency, Progress, RouterSpec, Sharded, Stats};
use super::report::Report;
use super::rounds::formula;
use crate::write::plan::Policy;

/// The operations of one bulk: `n` upserts by `_id`, alternating between namespace 0 and 1.
fn operations(tag: &str, n: usize) -> Vec<Bson> {
    (0..n)
        .map(|i| {
            Bson::Document(doc! {
                "update": (i % 2) as i32,
                "filter": {"_id": format!("{tag}-{i}")},
                "updateMods": {"$set": {"stock": i as i64, "price": 100}},
                "upsert": true,
            })
        })
        .collect()
}

/// Runs one ordered `bulkWrite` as a retryable write and checks that every operation upserted.
async fn bulk_write(
    c: &mongodb::Client,
    namespaces: [&str; 2],
    ops: Vec<Bson>,
) -> anyhow::Result<std::time::Duration> {
    let n = ops.len() as i32;
    let mut session = c.start_session().await?;
    let start = Instant::now();
    let reply = c
        .database("admin")
        .run_command(doc! {
            "bulkWrite": 1,
            "ops": ops,
            "nsInfo": namespaces.iter().map(|ns| Bson::Document(doc! {"ns": *ns})).collect::<Vec<_>>(),
            "ordered": true,
            "errorsOnly": true,
            "txnNumber": next_txn_number(),
        })
        .session(&mut session)
        .await?;
    let took = start.elapsed();
    if reply.get_i32("nUpserted").ok() != Some(n) || reply.get_i32("nErrors").ok() != Some(0) {
        bail!(
            "the bulkWrite upserted {:?} of {n}: {reply}",
            reply.get("nUpserted")
        );
    }
    Ok(took)
}

/// Runs the scenario: 5 shards, 1,000 operations (200 in quick mode), 10 repetitions (1).
pub async fn run(quick: bool) -> anyhow::Result<Report> {
    let (shards, n, reps) = if quick { (5, 200, 1) } else { (5, 1000, 10) };
    let mut progress = Progress::new("bulkwrite", 2 * reps);
    let collections: Vec<Sharded> = (0..reps)
        .flat_map(|r| {
            ["a", "b"].map(|p| Sharded {
                ns: format!("bench.{p}{r}"),
                chunks: None,
            })
        })
        .collect();
    let mut mongos = Vec::new();
    let mut rewrite = Vec::new();
    let mut times = [Vec::new(), Vec::new()];
    let mut shares = Vec::new();
    for (k, policy) in [Policy::Off, Policy::RetrySafe].into_iter().enumerate() {
        let spec = RouterSpec::new(policy, collections.clone());
        let fleet = Fleet::start(&vec![Latency::default(); shards], &spec).await?;
        if shares.is_empty() {
            shares = fleet.hash_shares("bench.a0").await?;
        }
        for r in 0..reps {
            progress.step(&format!(
                "{}, repetition {}",
                if policy == Policy::Off {
                    "mongos rounds"
                } else {
                    "proven rewrite"
                },
                r + 1
            ));
            let (a, b) = (format!("bench.a{r}"), format!("bench.b{r}"));
            let before = fleet.shard_command_total("bulkWrite").await?;
            let took = bulk_write(
                &fleet.writer,
                [&a, &b],
                operations(&format!("{shards}-{r}"), n),
            )
            .await?;
            let children = (fleet.shard_command_total("bulkWrite").await? - before) as f64;
            times[k].push(took.as_secs_f64() * 1000.0);
            if policy == Policy::Off {
                mongos.push(children);
            } else {
                rewrite.push(children);
            }
        }
        fleet.stop().await?;
    }
    progress.finish();
    let f = formula(n, &shares);
    let cell = |xs: &[f64]| {
        let s = Stats::of(xs);
        format!("{:.1} ± {:.1} [{}–{}]", s.mean, s.sd, s.min, s.max)
    };
    let ms = |xs: &[f64]| {
        let s = Stats::of(xs);
        format!("{:.1} ± {:.1} [{:.1}–{:.1}]", s.mean, s.sd, s.min, s.max)
    };
    let mut md = format!(
        "One ordered `bulkWrite` of n = {n} upserts with distinct hashed `_id`s alternating between 2 namespaces, {shards} shards, {reps} repetition(s) (mean ± sample sd [min–max]). Child commands are the shards' own `bulkWrite` counts; wall time is the client's, on this build and machine.\n\n| plan | child bulkWrite commands | formula 1+(n−1)(1−Σp²) | wall ms per bulk |\n|---|---|---|---|\n"
    );
    let _ = writeln!(
        md,
        "| mongos rounds | {} | {f:.1} | {} |",
        cell(&mongos),
        ms(&times[0])
    );
    let _ = writeln!(
        md,
        "| Sluice proven rewrite | {} | 1 round | {} |",
        cell(&rewrite),
        ms(&times[1])
    );
    let json = serde_json::json!({
        "scenario": "bulkwrite",
        "n": n,
        "shards": shards,
        "namespaces": 2,
        "repetitions": reps,
        "shares": shares,
        "formula": f,
        "mongos_rounds": {"samples": mongos, "stats": Stats::of(&mongos).json()},
        "rewrite": {"samples": rewrite, "stats": Stats::of(&rewrite).json()},
        "wall_ms": {"mongos_rounds": times[0], "rewrite": times[1]},
    });
    Ok(Report {
        name: "bulkwrite",
        json,
        markdown: md,
        charts: Vec::new(),
    })
}
