//! `overhead`: what the router costs. A stock-driver load of single-document inserts and
//! `_id` finds, with several connections at once, runs straight against one embedded shard and
//! through a router in front of that shard, alternating in one run; the report gives the
//! ratios of throughput and of p50/p99 latency. Then the CPU instructions the router process
//! spends per routed document, counted by `valgrind --tool=callgrind` (instructions, not
//! seconds, so the figure repeats on a noisy machine): two runs that differ only in the number
//! of 1,000-document bulks, and the difference of their totals divided by the difference of
//! their documents, so that start-up and connection set-up cancel out.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use bson::{doc, Bson, Document};

use super::fleet::{
    quantile, timed_update, Fleet, Latency, Progress, RouterSpec, Scratch, Sharded, Stats,
};
use super::report::Report;
use crate::write::plan::Policy;

/// One timed load.
#[derive(Debug, Clone, Copy, Default)]
pub struct Load {
    /// Operations per second.
    pub throughput: f64,
    /// Median latency (ms).
    pub p50: f64,
    /// 99th percentile latency (ms).
    pub p99: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Insert,
    Find,
}

/// `n` operations from `concurrency` tasks, ids from `base`.
async fn load(
    cl: &mongodb::Client,
    coll: &str,
    op: Op,
    n: usize,
    concurrency: usize,
    base: i64,
) -> anyhow::Result<Load> {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let c = cl.database("bench").collection::<Document>(coll);
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, anyhow::Error>(lat);
                }
                let id = base + i as i64;
                let t = Instant::now();
                match op {
                    Op::Insert => {
                        c.insert_one(doc! {"_id": id, "v": i as i64, "pad": "0123456789abcdef0123456789abcdef"})
                            .await?;
                    }
                    Op::Find => {
                        if c.find_one(doc! {"_id": id}).await?.is_none() {
                            bail!("document {id} of bench.{} is missing", c.name());
                        }
                    }
                }
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
        }));
    }
    let mut all = Vec::with_capacity(n);
    for t in tasks {
        all.extend(t.await??);
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    Ok(Load {
        throughput: n as f64 / elapsed,
        p50: quantile(&all, 0.5),
        p99: quantile(&all, 0.99),
    })
}

/// Side-by-side runs of one operation: (direct, router) per round.
#[derive(Debug, Clone, Default)]
pub struct Pairs {
    /// Per round: straight to the shard.
    pub direct: Vec<Load>,
    /// Per round: through the router.
    pub routed: Vec<Load>,
}

impl Pairs {
    fn ratios(&self, f: fn(&Load) -> f64) -> Stats {
        let r: Vec<f64> = self
            .direct
            .iter()
            .zip(&self.routed)
            .map(|(d, r)| f(r) / f(d))
            .collect();
        Stats::of(&r)
    }
}

/// The instruction count of the router process for one workload.
#[derive(Debug, Clone, Default)]
pub struct Instructions {
    /// What the routed documents were.
    pub workload: &'static str,
    /// Documents per command.
    pub bulk: usize,
    /// Documents routed in the short and the long run.
    pub docs: (u64, u64),
    /// The router's total instructions in those runs.
    pub totals: (u64, u64),
}

impl Instructions {
    /// Marginal instructions per routed document.
    pub fn per_doc(&self) -> f64 {
        (self.totals.1 as f64 - self.totals.0 as f64) / (self.docs.1 - self.docs.0) as f64
    }
}

struct Setup {
    ops: usize,
    rounds: usize,
    concurrency: usize,
    bulk: usize,
    bulks: (usize, usize),
    single_ops: (usize, usize),
}

/// What the router under callgrind routes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Workload {
    InsertMany,
    OrderedUpserts,
    InsertOne,
}

impl Workload {
    fn label(self) -> &'static str {
        match self {
            Workload::InsertMany => "insert_many",
            Workload::OrderedUpserts => "ordered upserts",
            Workload::InsertOne => "insert_one",
        }
    }
}

/// Runs the scenario.
pub async fn run(quick: bool) -> anyhow::Result<Report> {
    let s = if quick {
        Setup {
            ops: 500,
            rounds: 1,
            concurrency: 8,
            bulk: 100,
            bulks: (1, 3),
            single_ops: (10, 30),
        }
    } else {
        Setup {
            ops: 10_000,
            rounds: 5,
            concurrency: 8,
            bulk: 1000,
            bulks: (2, 12),
            single_ops: (200, 1200),
        }
    };
    check_valgrind().await?;
    let mut progress = Progress::new("overhead", s.rounds * 4 + 6);
    let (insert, find) = side_by_side(&s, &mut progress).await?;
    let mut counts = Vec::new();
    let workloads = [
        (Workload::InsertMany, s.bulk, s.bulks),
        (Workload::OrderedUpserts, s.bulk, s.bulks),
        (Workload::InsertOne, 1, s.single_ops),
    ];
    for (workload, bulk, (short, long)) in workloads {
        let mut totals = Vec::new();
        for bulks in [short, long] {
            progress.step(&format!(
                "callgrind: router under valgrind, {bulks} × {bulk} {}",
                workload.label()
            ));
            totals.push(callgrind_run(workload, bulk, bulks).await?);
        }
        counts.push(Instructions {
            workload: workload.label(),
            bulk,
            docs: ((short * bulk) as u64, (long * bulk) as u64),
            totals: (totals[0], totals[1]),
        });
    }
    progress.finish();
    Ok(report(&s, &insert, &find, &counts))
}

async fn side_by_side(s: &Setup, progress: &mut Progress) -> anyhow::Result<(Pairs, Pairs)> {
    let spec = RouterSpec::new(
        Policy::RetrySafe,
        vec![Sharded {
            ns: "bench.routed".into(),
            chunks: None,
        }],
    );
    let fleet = Fleet::start(&[Latency::default()], &spec).await?;
    let (direct, routed) = (&fleet.shard_clients[0], &fleet.client);
    // Warm both paths (connections, pools) before measuring.
    load(direct, "direct", Op::Insert, 200, s.concurrency, -1000).await?;
    load(routed, "routed", Op::Insert, 200, s.concurrency, -1000).await?;
    let (mut insert, mut find) = (Pairs::default(), Pairs::default());
    for round in 0..s.rounds {
        let base = (round * s.ops) as i64;
        // Alternate which side goes first, so that drift over the run favours neither.
        let order: [(&str, &mongodb::Client); 2] = if round % 2 == 0 {
            [("direct", direct), ("routed", routed)]
        } else {
            [("routed", routed), ("direct", direct)]
        };
        for (op, pairs) in [(Op::Insert, &mut insert), (Op::Find, &mut find)] {
            for (name, cl) in order {
                progress.step(&format!("round {}: {op:?} {name}", round + 1));
                let l = load(cl, name, op, s.ops, s.concurrency, base).await?;
                if name == "direct" {
                    pairs.direct.push(l);
                } else {
                    pairs.routed.push(l);
                }
            }
        }
    }
    fleet.stop().await?;
    Ok((insert, find))
}

const VALGRIND: &str = "valgrind";

async fn check_valgrind() -> anyhow::Result<()> {
    let ok = tokio::process::Command::new(VALGRIND)
        .arg("--version")
        .output()
        .await
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        bail!("the instruction count needs valgrind (Debian: apt-get install valgrind)");
    }
    Ok(())
}

/// Starts two shards and a router under callgrind, routes `bulks` commands of `bulk`
/// documents and returns the router's total instructions.
async fn callgrind_run(workload: Workload, bulk: usize, bulks: usize) -> anyhow::Result<u64> {
    let scratch = Scratch::new("callgrind")?;
    let out = scratch.0.join("callgrind.out");
    let mut spec = RouterSpec::new(
        Policy::RetrySafe,
        vec![Sharded {
            ns: "bench.cpu".into(),
            chunks: None,
        }],
    );
    spec.wrapper = vec![
        VALGRIND.to_string(),
        "--tool=callgrind".into(),
        "--quiet".into(),
        format!("--callgrind-out-file={}", out.display()),
    ];
    let fleet = Fleet::start(&[Latency::default(); 2], &spec).await?;
    let cl = &fleet.client;
    let coll = cl.database("bench").collection::<Document>("cpu");
    for b in 0..bulks {
        if workload == Workload::InsertOne {
            coll.insert_one(doc! {"_id": b as i64, "v": 1, "pad": "0123456789abcdef"})
                .await?;
        } else if workload == Workload::OrderedUpserts {
            let updates: Vec<Bson> = (0..bulk)
                .map(|i| {
                    Bson::Document(doc! {
                        "q": {"_id": (b * bulk + i) as i64},
                        "u": {"$set": {"v": i as i64}},
                        "upsert": true,
                    })
                })
                .collect();
            timed_update(&fleet.writer, "bench", "cpu", updates, true).await?;
        } else {
            let docs: Vec<Document> = (0..bulk)
                .map(|i| doc! {"_id": (b * bulk + i) as i64, "v": i as i64, "pad": "0123456789abcdef"})
                .collect();
            let r = coll.insert_many(docs).await?;
            if r.inserted_ids.len() != bulk {
                bail!("insert_many inserted {} of {bulk}", r.inserted_ids.len());
            }
        }
    }
    fleet.stop().await?;
    let text = std::fs::read_to_string(&out)
        .with_context(|| format!("callgrind wrote no {}", out.display()))?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        })
        .ok_or_else(|| anyhow!("no instruction total in {}", out.display()))
}

fn report(s: &Setup, insert: &Pairs, find: &Pairs, counts: &[Instructions]) -> Report {
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let mut md = format!(
        "One embedded shard (a separate process); the stock Rust driver runs {} operations from {} tasks at once, straight to the shard and through a router with only that shard, alternating, {} round(s). Ratios are routed / direct per round; the table gives their median [min–max]. Build: {profile}.\n\n| operation | direct: ops/s | routed: ops/s | throughput ratio | p50 direct / routed | p50 ratio | p99 direct / routed | p99 ratio |\n|---|---|---|---|---|---|---|---|\n",
        s.ops, s.concurrency, s.rounds
    );
    let med =
        |xs: &[Load], f: fn(&Load) -> f64| Stats::of(&xs.iter().map(f).collect::<Vec<_>>()).median;
    let range = |st: Stats| format!("{:.2} [{:.2}–{:.2}]", st.median, st.min, st.max);
    for (name, p) in [("insert_one", insert), ("find_one by _id", find)] {
        let _ = writeln!(
            md,
            "| {name} | {:.0} | {:.0} | {} | {:.2} / {:.2} ms | {} | {:.2} / {:.2} ms | {} |",
            med(&p.direct, |l| l.throughput),
            med(&p.routed, |l| l.throughput),
            range(p.ratios(|l| l.throughput)),
            med(&p.direct, |l| l.p50),
            med(&p.routed, |l| l.p50),
            range(p.ratios(|l| l.p50)),
            med(&p.direct, |l| l.p99),
            med(&p.routed, |l| l.p99),
            range(p.ratios(|l| l.p99)),
        );
    }
    let _ = writeln!(
        md,
        "\nRouter CPU per routed document, `valgrind --tool=callgrind` on the router process (two shards, {profile} build): the difference between a short and a long run, divided by the difference of their documents.\n\n| workload | documents per command | documents (short / long run) | instructions (short / long run) | instructions per document |\n|---|---|---|---|---|"
    );
    for c in counts {
        let _ = writeln!(
            md,
            "| {} | {} | {} / {} | {} / {} | {:.0} |",
            c.workload,
            c.bulk,
            c.docs.0,
            c.docs.1,
            c.totals.0,
            c.totals.1,
            c.per_doc()
        );
    }
    let pairs_json = |p: &Pairs| {
        let side = |xs: &[Load]| {
            xs.iter()
                .map(|l| serde_json::json!({"ops_per_s": l.throughput, "p50_ms": l.p50, "p99_ms": l.p99}))
                .collect::<Vec<_>>()
        };
        serde_json::json!({
            "direct": side(&p.direct),
            "routed": side(&p.routed),
            "throughput_ratio": p.ratios(|l| l.throughput).json(),
            "p50_ratio": p.ratios(|l| l.p50).json(),
            "p99_ratio": p.ratios(|l| l.p99).json(),
        })
    };
    let json = serde_json::json!({
        "scenario": "overhead",
        "build": profile,
        "operations": s.ops,
        "concurrency": s.concurrency,
        "rounds": s.rounds,
        "insert_one": pairs_json(insert),
        "find_one": pairs_json(find),
        "instructions": counts.iter().map(|c| serde_json::json!({
            "workload": c.workload,
            "bulk": c.bulk,
            "documents": [c.docs.0, c.docs.1],
            "totals": [c.totals.0, c.totals.1],
            "per_document": c.per_doc(),
        })).collect::<Vec<_>>(),
    });
    Report {
        name: "overhead",
        json,
        markdown: md,
        charts: Vec::new(),
    }
}
