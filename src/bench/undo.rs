//! `undo`: what the ordered contract for inserts costs. A rewritten ordered insert that fails at
//! statement k has let the other shards insert their documents after k; before replying the
//! router deletes them again (each only while it is still the document inserted), so the
//! collection ends as mongos leaves it. This scenario times one ordered bulk of distinct-`_id`
//! inserts over three embedded shards with the error (a duplicate `_id` seeded beforehand) at
//! the first, middle and last statement and with no error, under the proven rewrite and under
//! mongos's rounds, and counts on the shards what the router sent besides the inserts (the
//! undo's `delete` child batches, and the `find`s that check a document that could not be
//! deleted). Each bulk's outcome is checked: the collection holds exactly the documents before
//! k. Figures are ratios to the same bulk without an error, on loopback and with 1 ms injected
//! per shard command (a network round trip).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::bail;
use bson::{doc, Bson, Document};

use super::fleet::{next_txn_number, Fleet, Latency, Progress, RouterSpec, Sharded, Stats};
use super::report::Report;
use crate::write::plan::Policy;

const SHARDS: usize = 3;

/// Where the bulk fails.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Case {
    /// No statement fails.
    Clean,
    /// Statement `k` (a duplicate `_id`) fails.
    ErrorAt(usize),
}

impl Case {
    fn label(self, n: usize) -> String {
        match self {
            Case::Clean => "no error".into(),
            Case::ErrorAt(0) => "error at the first statement".into(),
            Case::ErrorAt(k) if k + 1 == n => "error at the last statement".into(),
            Case::ErrorAt(k) => format!("error at statement {k}"),
        }
    }
}

/// One (latency, policy, case) cell.
#[derive(Debug, Clone)]
pub struct Cell {
    /// Injected per shard command.
    pub latency: Duration,
    /// The router's policy.
    pub policy: Policy,
    /// Where the bulk fails.
    pub case: Case,
    /// Wall time of the bulk (ms), per repetition.
    pub ms: Vec<f64>,
    /// `delete` + `find` commands the shards ran per bulk (the undo's own traffic).
    pub extra_commands: Vec<f64>,
    /// Inserts undone per bulk (`serverStatus().sluice.writes.undoneAfterError`).
    pub undone: Vec<f64>,
}

struct Setup {
    n: usize,
    reps: usize,
    latencies: Vec<Duration>,
}

fn setup(quick: bool) -> Setup {
    if quick {
        Setup {
            n: 200,
            reps: 2,
            latencies: vec![Duration::ZERO],
        }
    } else {
        Setup {
            n: 1000,
            reps: 15,
            latencies: vec![Duration::ZERO, Duration::from_millis(1)],
        }
    }
}

fn cases(n: usize) -> Vec<Case> {
    vec![
        Case::Clean,
        Case::ErrorAt(n - 1),
        Case::ErrorAt(n / 2),
        Case::ErrorAt(0),
    ]
}

fn policy_label(p: Policy) -> &'static str {
    match p {
        Policy::Off => "mongos rounds",
        _ => "proven rewrite",
    }
}

/// `serverStatus().sluice.writes.<field>` of the router.
async fn router_writes(fleet: &Fleet, field: &str) -> anyhow::Result<i64> {
    let status = fleet
        .client
        .database("admin")
        .run_command(doc! {"serverStatus": 1})
        .await?;
    let v = status
        .get_document("sluice")
        .and_then(|s| s.get_document("writes"))
        .ok()
        .and_then(|w| w.get(field).cloned());
    Ok(match v {
        Some(Bson::Int64(v)) => v,
        Some(Bson::Int32(v)) => v as i64,
        _ => 0,
    })
}

/// Runs one ordered insert of `n` documents into `coll` (a retryable write, as drivers send
/// it), with `_id` number `k` seeded first when the case fails there; checks the reply and
/// what the collection holds afterwards; returns the bulk's wall time.
async fn one_bulk(
    fleet: &Fleet,
    coll: &str,
    tag: &str,
    n: usize,
    case: Case,
) -> anyhow::Result<Duration> {
    let db = fleet.writer.database("bench");
    let id = |i: usize| format!("{tag}-{i}");
    if let Case::ErrorAt(k) = case {
        db.run_command(doc! {"insert": coll, "documents": [{"_id": id(k), "seeded": true}]})
            .await?;
    }
    let docs: Vec<Bson> = (0..n)
        .map(|i| Bson::Document(doc! {"_id": id(i), "v": i as i64}))
        .collect();
    let mut session = fleet.writer.start_session().await?;
    let start = Instant::now();
    let reply = db
        .run_command(doc! {"insert": coll, "documents": docs, "ordered": true, "txnNumber": next_txn_number()})
        .session(&mut session)
        .await?;
    let took = start.elapsed();
    let inserted = reply.get_i32("n").unwrap_or(-1) as i64;
    let expected = match case {
        Case::Clean => n,
        Case::ErrorAt(k) => k,
    } as i64;
    let errors = reply.get_array("writeErrors").map(|a| a.len()).unwrap_or(0);
    if inserted != expected || errors != usize::from(case != Case::Clean) {
        bail!("the bulk on bench.{coll} ({case:?}) answered {reply}");
    }
    let held = db
        .collection::<Document>(coll)
        .count_documents(doc! {})
        .await? as i64;
    let seeded = i64::from(case != Case::Clean);
    if held != expected + seeded {
        bail!("bench.{coll} holds {held} documents after {case:?}, mongos would leave {expected} + {seeded}");
    }
    Ok(took)
}

/// Runs the scenario.
pub async fn run(quick: bool) -> anyhow::Result<Report> {
    let s = setup(quick);
    let cases = cases(s.n);
    let policies = [Policy::RetrySafe, Policy::Off];
    let mut progress = Progress::new(
        "undo",
        s.latencies.len() * policies.len() * cases.len() * s.reps,
    );
    let mut cells = Vec::new();
    for &latency in &s.latencies {
        for policy in policies {
            let collections: Vec<Sharded> = (0..cases.len() * s.reps)
                .map(|i| Sharded {
                    ns: format!("bench.i{i}"),
                    chunks: None,
                })
                .collect();
            let spec = RouterSpec::new(policy, collections);
            let shard_latency = Latency {
                per_command: latency,
                per_document: Duration::ZERO,
            };
            let fleet = Fleet::start(&[shard_latency; SHARDS], &spec).await?;
            let mut row: Vec<Cell> = cases
                .iter()
                .map(|&case| Cell {
                    latency,
                    policy,
                    case,
                    ms: Vec::new(),
                    extra_commands: Vec::new(),
                    undone: Vec::new(),
                })
                .collect();
            // Repetitions outermost, so that drift over time touches every case alike.
            for r in 0..s.reps {
                for (ci, cell) in row.iter_mut().enumerate() {
                    progress.step(&format!(
                        "{} ms per command, {}, {}, repetition {}",
                        latency.as_millis(),
                        policy_label(policy),
                        cell.case.label(s.n),
                        r + 1
                    ));
                    let coll = format!("i{}", r * cases.len() + ci);
                    let tag = format!("{}-{policy:?}-{ci}-{r}", latency.as_micros());
                    let before = fleet.shard_command_total("delete").await?
                        + fleet.shard_command_total("find").await?;
                    let undone = router_writes(&fleet, "undoneAfterError").await?;
                    let took = one_bulk(&fleet, &coll, &tag, s.n, cell.case).await?;
                    let after = fleet.shard_command_total("delete").await?
                        + fleet.shard_command_total("find").await?;
                    cell.ms.push(took.as_secs_f64() * 1e3);
                    cell.extra_commands.push((after - before) as f64);
                    cell.undone
                        .push((router_writes(&fleet, "undoneAfterError").await? - undone) as f64);
                }
            }
            fleet.stop().await?;
            cells.extend(row);
        }
    }
    progress.finish();
    Ok(report(s.n, s.reps, &cells))
}

/// The median time of the same (latency, policy) bulk without an error.
fn clean_median(cells: &[Cell], c: &Cell) -> f64 {
    cells
        .iter()
        .find(|x| x.latency == c.latency && x.policy == c.policy && x.case == Case::Clean)
        .map(|x| Stats::of(&x.ms).median)
        .unwrap_or(f64::NAN)
}

/// The median time of the same (latency, case) bulk under mongos's rounds.
fn rounds_median(cells: &[Cell], c: &Cell) -> f64 {
    cells
        .iter()
        .find(|x| x.latency == c.latency && x.policy == Policy::Off && x.case == c.case)
        .map(|x| Stats::of(&x.ms).median)
        .unwrap_or(f64::NAN)
}

fn report(n: usize, reps: usize, cells: &[Cell]) -> Report {
    let mut md = format!(
        "One ordered bulk of n = {n} inserts with distinct hashed `_id`s over {SHARDS} shards, {reps} repetitions per cell (median, and mean ± sample sd). The error is a duplicate `_id` seeded at statement k. \"Extra commands\" are the `delete` and `find` commands the shards ran during the bulk: the undo's own traffic. Ratios compare medians.\n\n| injected per shard command | plan | bulk | median ms | mean ± sd ms | vs. no error | vs. mongos rounds | extra commands per bulk | inserts undone per bulk |\n|---|---|---|---|---|---|---|---|---|\n"
    );
    for c in cells {
        let st = Stats::of(&c.ms);
        let _ = writeln!(
            md,
            "| {} ms | {} | {} | {:.2} | {:.2} ± {:.2} | {:.2}× | {:.3}× | {:.1} | {:.1} |",
            c.latency.as_millis(),
            policy_label(c.policy),
            c.case.label(n),
            st.median,
            st.mean,
            st.sd,
            st.median / clean_median(cells, c),
            st.median / rounds_median(cells, c),
            Stats::of(&c.extra_commands).mean,
            Stats::of(&c.undone).mean,
        );
    }
    let json = serde_json::json!({
        "scenario": "undo",
        "n": n,
        "shards": SHARDS,
        "repetitions": reps,
        "cells": cells.iter().map(|c| serde_json::json!({
            "latency_ms": c.latency.as_secs_f64() * 1e3,
            "policy": policy_label(c.policy),
            "case": c.case.label(n),
            "error_at": match c.case { Case::Clean => None, Case::ErrorAt(k) => Some(k) },
            "ms": {"samples": c.ms, "stats": Stats::of(&c.ms).json()},
            "vs_no_error": Stats::of(&c.ms).median / clean_median(cells, c),
            "vs_mongos_rounds": Stats::of(&c.ms).median / rounds_median(cells, c),
            "extra_commands": {"samples": c.extra_commands, "stats": Stats::of(&c.extra_commands).json()},
            "undone": {"samples": c.undone, "stats": Stats::of(&c.undone).json()},
        })).collect::<Vec<_>>(),
    });
    Report {
        name: "undo",
        json,
        markdown: md,
        charts: Vec::new(),
    }
}
