//! `overhead`: what the router costs. A stock-driver load of single-document inserts and
//! `_id` finds, from 8 and from 64 tasks at once, runs over three lanes to one embedded shard,
//! alternating in one run: straight to the shard, through a plain TCP forwarder
//! ([`super::forward`], the hop with no logic: the physical limit of any router) and through
//! the router. The report gives router / forwarder and router / direct ratios of throughput
//! and the p50 latency the router adds over the forwarder, once with the processes where the
//! scheduler puts them and once with the router (or the forwarder) pinned to one core and the
//! shard and the load generator to the other, so that the ratio measures the router's work
//! rather than the scheduler's. Then the CPU instructions the router process spends per routed
//! document, counted by `valgrind --tool=callgrind` (instructions, not seconds, so the figure
//! repeats on a noisy machine): two runs that differ only in the number of commands, and the
//! difference of their totals divided by the difference of their documents, so that start-up
//! and connection set-up cancel out.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use bson::{doc, Bson, Document};

use super::fleet::{
    quantile, sluice_exe, timed_update, Fleet, Latency, Proc, Progress, RouterSpec, Scratch,
    Sharded, Stats,
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

/// The instruction count of the router process for one workload.
#[derive(Debug, Clone, Default)]
pub struct Instructions {
    /// What the routed documents were.
    pub workload: &'static str,
    /// Documents per command.
    pub bulk: usize,
    /// Documents routed in the short and the long run.
    pub docs: (u64, u64),
    /// The counted process's total instructions in those runs.
    pub totals: (u64, u64),
    /// Which process was counted.
    pub counted: Counted,
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
    clients: [usize; 2],
    bulk: usize,
    bulks: (usize, usize),
    single_ops: (usize, usize),
}

/// The process callgrind counts: the router, or the plain forwarder (the same operations
/// through the hop with no logic, so that the router's count can be read against the count of
/// any tokio proxy's floor: reading and writing the same bytes).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Counted {
    #[default]
    Router,
    Forwarder,
}

impl Counted {
    fn label(self) -> &'static str {
        match self {
            Counted::Router => "router",
            Counted::Forwarder => "forwarder",
        }
    }
}

/// What the router under callgrind routes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Workload {
    InsertMany,
    OrderedUpserts,
    InsertOne,
    FindOne,
}

/// Documents the `find_one` workload inserts before it reads (the same in the short and the
/// long run, so they cancel out of the difference).
const FIND_PREFILL: usize = 50;

impl Workload {
    fn label(self) -> &'static str {
        match self {
            Workload::InsertMany => "insert_many",
            Workload::OrderedUpserts => "ordered upserts",
            Workload::InsertOne => "insert_one",
            Workload::FindOne => "find_one by _id",
        }
    }
}

/// Runs the scenario.
pub async fn run(quick: bool) -> anyhow::Result<Report> {
    let s = if quick {
        Setup {
            ops: 500,
            rounds: 1,
            clients: [8, 64],
            bulk: 100,
            bulks: (1, 3),
            single_ops: (10, 30),
        }
    } else {
        Setup {
            ops: 10_000,
            rounds: 5,
            clients: [8, 64],
            bulk: 1000,
            bulks: (2, 12),
            single_ops: (200, 1200),
        }
    };
    check_valgrind().await?;
    // The instruction counts alone (no throughput lanes): what a change to the hot path is
    // judged by, in a fraction of the time.
    let cpu_only = std::env::var_os("SLUICE_BENCH_CPU_ONLY").is_some();
    let pin = pinning_available().await;
    let modes: Vec<bool> = if cpu_only {
        Vec::new()
    } else if pin {
        vec![false, true]
    } else {
        vec![false]
    };
    let loads_per_mode = s.rounds * s.clients.len() * 2 * 3;
    let mut progress = Progress::new("overhead", modes.len() * (loads_per_mode + 1) + 12);
    let mut lanes = Vec::new();
    for pinned in modes {
        lanes.push(side_by_side(&s, pinned, &mut progress).await?);
    }
    let mut counts = Vec::new();
    let workloads = [
        (Workload::InsertMany, s.bulk, s.bulks, Counted::Router),
        (Workload::OrderedUpserts, s.bulk, s.bulks, Counted::Router),
        (Workload::InsertOne, 1, s.single_ops, Counted::Router),
        (Workload::FindOne, 1, s.single_ops, Counted::Router),
        (Workload::InsertOne, 1, s.single_ops, Counted::Forwarder),
        (Workload::FindOne, 1, s.single_ops, Counted::Forwarder),
    ];
    for (workload, bulk, (short, long), counted) in workloads {
        let mut totals = Vec::new();
        for bulks in [short, long] {
            progress.step(&format!(
                "callgrind: {} under valgrind, {bulks} × {bulk} {}",
                counted.label(),
                workload.label()
            ));
            totals.push(match counted {
                Counted::Router => callgrind_run(workload, bulk, bulks).await?,
                Counted::Forwarder => callgrind_forwarder_run(workload, bulks).await?,
            });
        }
        counts.push(Instructions {
            workload: workload.label(),
            bulk,
            docs: ((short * bulk) as u64, (long * bulk) as u64),
            totals: (totals[0], totals[1]),
            counted,
        });
    }
    progress.finish();
    Ok(report(&s, &lanes, &counts))
}

/// Where a load goes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Lane {
    /// Straight to the shard.
    Direct,
    /// Through the plain TCP forwarder.
    Forwarder,
    /// Through the router.
    Router,
}

impl Lane {
    fn label(self) -> &'static str {
        match self {
            Lane::Direct => "direct",
            Lane::Forwarder => "forwarder",
            Lane::Router => "routed",
        }
    }
}

/// One operation at one client count: the loads of each lane, per round.
#[derive(Debug, Clone)]
pub struct Cell {
    op: Op,
    /// Driver tasks at once.
    pub clients: usize,
    /// Per round: straight to the shard.
    pub direct: Vec<Load>,
    /// Per round: through the plain forwarder.
    pub forwarded: Vec<Load>,
    /// Per round: through the router.
    pub routed: Vec<Load>,
}

impl Cell {
    fn lane(&mut self, lane: Lane) -> &mut Vec<Load> {
        match lane {
            Lane::Direct => &mut self.direct,
            Lane::Forwarder => &mut self.forwarded,
            Lane::Router => &mut self.routed,
        }
    }

    /// Per round `f(a) / f(b)`.
    fn ratios(a: &[Load], b: &[Load], f: fn(&Load) -> f64) -> Stats {
        let r: Vec<f64> = a.iter().zip(b).map(|(a, b)| f(a) / f(b)).collect();
        Stats::of(&r)
    }

    /// Router / forwarder throughput, per round.
    fn vs_forwarder(&self) -> Stats {
        Cell::ratios(&self.routed, &self.forwarded, |l| l.throughput)
    }

    /// Router / direct throughput, per round.
    fn vs_direct(&self) -> Stats {
        Cell::ratios(&self.routed, &self.direct, |l| l.throughput)
    }

    /// Microseconds of p50 the router adds over the forwarder, per round.
    fn added_p50_us(&self) -> Stats {
        let d: Vec<f64> = self
            .routed
            .iter()
            .zip(&self.forwarded)
            .map(|(r, f)| (r.p50 - f.p50) * 1000.0)
            .collect();
        Stats::of(&d)
    }
}

/// Every cell of one placement of the processes.
#[derive(Debug, Clone)]
pub struct Lanes {
    /// Router and forwarder on one core, shard and load generator on the other.
    pub pinned: bool,
    /// Per operation and client count.
    pub cells: Vec<Cell>,
}

/// Whether processes can be pinned: `taskset` present and at least two cores.
async fn pinning_available() -> bool {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores >= 2
        && tokio::process::Command::new("taskset")
            .arg("-V")
            .output()
            .await
            .is_ok_and(|o| o.status.success())
}

/// Sets the CPU affinity of every thread of this process (the load generator; processes it
/// starts afterwards inherit it).
async fn pin_self(cpus: &str) -> anyhow::Result<()> {
    let ok = tokio::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &std::process::id().to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .await?
        .success();
    if !ok {
        bail!("taskset could not pin the benchmark to CPUs {cpus}");
    }
    Ok(())
}

/// A stock-driver client whose pool holds every task of the largest load.
async fn lane_client(addr: std::net::SocketAddr, direct: bool) -> anyhow::Result<mongodb::Client> {
    let uri = format!(
        "mongodb://{addr}/?serverSelectionTimeoutMS=20000&maxPoolSize=128{}",
        if direct { "&directConnection=true" } else { "" }
    );
    Ok(mongodb::Client::with_uri_str(uri).await?)
}

async fn side_by_side(s: &Setup, pinned: bool, progress: &mut Progress) -> anyhow::Result<Lanes> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if pinned {
        // The shard and this process (the load generator) on core 1; the router and the
        // forwarder, started below, on core 0.
        pin_self("1").await?;
    }
    let result = lanes(s, pinned, progress).await;
    if pinned {
        pin_self(&format!("0-{}", cores - 1)).await?;
    }
    result
}

async fn lanes(s: &Setup, pinned: bool, progress: &mut Progress) -> anyhow::Result<Lanes> {
    let taskset = |args: Vec<String>| -> Vec<String> {
        if pinned {
            ["taskset", "-c", "0"]
                .into_iter()
                .map(String::from)
                .chain(args)
                .collect()
        } else {
            args
        }
    };
    let mut spec = RouterSpec::new(
        Policy::RetrySafe,
        vec![Sharded {
            ns: "bench.routed".into(),
            chunks: None,
        }],
    );
    spec.wrapper = taskset(Vec::new());
    progress.step(&format!(
        "starting the shard, the router and the forwarder{}",
        if pinned { " (pinned)" } else { "" }
    ));
    let fleet = Fleet::start(&[Latency::default()], &spec).await?;
    let exe = sluice_exe()?.display().to_string();
    let forward_args = taskset(vec![
        exe,
        "forward".into(),
        "--to".into(),
        fleet.shards[0].addr.to_string(),
    ]);
    let forwarder = Proc::start(std::path::Path::new(&forward_args[0]), &forward_args[1..]).await?;
    let clients = [
        (Lane::Direct, lane_client(fleet.shards[0].addr, true).await?),
        (Lane::Forwarder, lane_client(forwarder.addr, true).await?),
        (Lane::Router, lane_client(fleet.router.addr, false).await?),
    ];
    let most = s.clients.iter().copied().max().unwrap_or(1);
    // Warm every lane (connections, pools) with as many tasks as the largest load.
    for (lane, cl) in &clients {
        load(cl, &coll_of(*lane), Op::Insert, 4 * most, most, -100_000).await?;
    }
    let mut cells: Vec<Cell> = Vec::new();
    for &n in &s.clients {
        for op in [Op::Insert, Op::Find] {
            cells.push(Cell {
                op,
                clients: n,
                direct: Vec::new(),
                forwarded: Vec::new(),
                routed: Vec::new(),
            });
        }
    }
    for round in 0..s.rounds {
        for (ci, &n) in s.clients.iter().enumerate() {
            let base = ((round * s.clients.len() + ci) * s.ops) as i64;
            // Rotate which lane goes first, so that drift over the run favours none.
            let order: Vec<&(Lane, mongodb::Client)> =
                (0..3).map(|k| &clients[(round + k) % 3]).collect();
            for op in [Op::Insert, Op::Find] {
                for (lane, cl) in &order {
                    progress.step(&format!(
                        "round {}: {op:?} {} × {n}{}",
                        round + 1,
                        lane.label(),
                        if pinned { " (pinned)" } else { "" }
                    ));
                    let l = load(cl, &coll_of(*lane), op, s.ops, n, base).await?;
                    if let Some(c) = cells.iter_mut().find(|c| c.op == op && c.clients == n) {
                        c.lane(*lane).push(l);
                    }
                }
            }
        }
    }
    for (_, cl) in clients {
        cl.shutdown().await;
    }
    forwarder.stop().await?;
    fleet.stop().await?;
    Ok(Lanes { pinned, cells })
}

/// Each lane writes its own collection (the forwarder's and the direct lane's are on the same
/// shard).
fn coll_of(lane: Lane) -> String {
    lane.label().to_string()
}

/// The profiler the instruction counts come from.
pub(super) const VALGRIND: &str = "valgrind";

/// Fails with a clear message when valgrind is missing.
pub(super) async fn check_valgrind() -> anyhow::Result<()> {
    require_tool(
        VALGRIND,
        "--version",
        "the instruction count needs valgrind (Debian: apt-get install valgrind)",
    )
    .await
}

/// Fails with `missing` when `program arg` does not run successfully.
pub(super) async fn require_tool(program: &str, arg: &str, missing: &str) -> anyhow::Result<()> {
    let ok = tokio::process::Command::new(program)
        .arg(arg)
        .output()
        .await
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        bail!("{missing}");
    }
    Ok(())
}

/// A router sharding `ns` on `{_id: "hashed"}` (the default policy), run under callgrind
/// writing its counts to `out`.
pub(super) fn callgrind_router(ns: &str, out: &std::path::Path) -> RouterSpec {
    let mut spec = RouterSpec::new(
        Policy::RetrySafe,
        vec![Sharded {
            ns: ns.into(),
            chunks: None,
        }],
    );
    spec.wrapper = vec![
        VALGRIND.to_string(),
        "--tool=callgrind".into(),
        "--quiet".into(),
        format!("--callgrind-out-file={}", out.display()),
    ];
    spec
}

/// Starts two shards and a router under callgrind, routes `bulks` commands of `bulk`
/// documents and returns the router's total instructions.
async fn callgrind_run(workload: Workload, bulk: usize, bulks: usize) -> anyhow::Result<u64> {
    let scratch = Scratch::new("callgrind")?;
    let out = scratch.0.join("callgrind.out");
    let spec = callgrind_router("bench.cpu", &out);
    let fleet = Fleet::start(&[Latency::default(); 2], &spec).await?;
    let cl = &fleet.client;
    let coll = cl.database("bench").collection::<Document>("cpu");
    match workload {
        Workload::InsertOne | Workload::FindOne => single_ops(&coll, workload, bulks).await?,
        Workload::OrderedUpserts => {
            for b in 0..bulks {
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
            }
        }
        Workload::InsertMany => {
            for b in 0..bulks {
                let docs: Vec<Document> = (0..bulk)
                    .map(|i| doc! {"_id": (b * bulk + i) as i64, "v": i as i64, "pad": "0123456789abcdef"})
                    .collect();
                let r = coll.insert_many(docs).await?;
                if r.inserted_ids.len() != bulk {
                    bail!("insert_many inserted {} of {bulk}", r.inserted_ids.len());
                }
            }
        }
    }
    fleet.stop().await?;
    callgrind_total(&out)
}

/// `ops` single-document operations of `workload` (`insert_one` or `find_one({_id})`, the
/// latter after inserting [`FIND_PREFILL`] documents) on `coll`.
async fn single_ops(
    coll: &mongodb::Collection<Document>,
    workload: Workload,
    ops: usize,
) -> anyhow::Result<()> {
    if workload == Workload::FindOne {
        for i in 0..FIND_PREFILL {
            coll.insert_one(doc! {"_id": i as i64, "v": 1, "pad": "0123456789abcdef"})
                .await?;
        }
    }
    for b in 0..ops {
        if workload == Workload::FindOne {
            let id = (b % FIND_PREFILL) as i64;
            if coll.find_one(doc! {"_id": id}).await?.is_none() {
                bail!("document {id} of {} is missing", coll.namespace());
            }
        } else {
            coll.insert_one(doc! {"_id": b as i64, "v": 1, "pad": "0123456789abcdef"})
                .await?;
        }
    }
    Ok(())
}

/// Starts one shard and a plain forwarder to it under callgrind, runs `ops` single-document
/// operations of `workload` through the forwarder and returns the forwarder's total
/// instructions.
async fn callgrind_forwarder_run(workload: Workload, ops: usize) -> anyhow::Result<u64> {
    let scratch = Scratch::new("callgrind")?;
    let out = scratch.0.join("callgrind.out");
    let fleet = Fleet::start(
        &[Latency::default()],
        &RouterSpec::new(Policy::RetrySafe, Vec::new()),
    )
    .await?;
    let args = vec![
        "--tool=callgrind".to_string(),
        "--quiet".into(),
        format!("--callgrind-out-file={}", out.display()),
        sluice_exe()?.display().to_string(),
        "forward".into(),
        "--to".into(),
        fleet.shards[0].addr.to_string(),
    ];
    let forwarder = Proc::start(std::path::Path::new(VALGRIND), &args).await?;
    let cl = lane_client(forwarder.addr, true).await?;
    let result = single_ops(&cl.database("bench").collection("cpu"), workload, ops).await;
    cl.shutdown().await;
    forwarder.stop().await?;
    fleet.stop().await?;
    result?;
    callgrind_total(&out)
}

/// The total instructions of a callgrind output file.
pub(super) fn callgrind_total(out: &std::path::Path) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(out)
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

fn report(s: &Setup, lanes: &[Lanes], counts: &[Instructions]) -> Report {
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let mut md = format!(
        "One embedded shard (a separate process); the stock Rust driver runs {} operations from 8 and from 64 tasks at once over three lanes to that shard: straight to it, through a plain TCP forwarder (`copy_bidirectional`, no parsing) and through a router with only that shard; the lanes alternate, {} round(s). Ratios are taken per round; the table gives their median [min–max]. \"pinned\": the router and the forwarder on CPU 0, the shard and the load generator on CPU 1. Build: {profile}.\n\n| placement | operation | clients | direct: ops/s | forwarder: ops/s | router: ops/s | router / forwarder | router / direct | p50 forwarder / router | p50 added over forwarder | p99 forwarder / router |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
        s.ops, s.rounds
    );
    let med =
        |xs: &[Load], f: fn(&Load) -> f64| Stats::of(&xs.iter().map(f).collect::<Vec<_>>()).median;
    let range = |st: Stats| format!("{:.2} [{:.2}–{:.2}]", st.median, st.min, st.max);
    for l in lanes {
        for c in &l.cells {
            let added = c.added_p50_us();
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {} | {} | {:.3} / {:.3} ms | {:.0} µs [{:.0}–{:.0}] | {:.2} / {:.2} ms |",
                if l.pinned { "pinned" } else { "unpinned" },
                op_label(c.op),
                c.clients,
                med(&c.direct, |l| l.throughput),
                med(&c.forwarded, |l| l.throughput),
                med(&c.routed, |l| l.throughput),
                range(c.vs_forwarder()),
                range(c.vs_direct()),
                med(&c.forwarded, |l| l.p50),
                med(&c.routed, |l| l.p50),
                added.median,
                added.min,
                added.max,
                med(&c.forwarded, |l| l.p99),
                med(&c.routed, |l| l.p99),
            );
        }
    }
    let _ = writeln!(
        md,
        "\nRouter CPU per routed document, `valgrind --tool=callgrind` on the router process (two shards, {profile} build): the difference between a short and a long run, divided by the difference of their documents. The forwarder rows count the plain forwarder instead (one shard behind it), for the same single-document operations.\n\n| process | workload | documents per command | documents (short / long run) | instructions (short / long run) | instructions per document |\n|---|---|---|---|---|---|"
    );
    for c in counts {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} / {} | {} / {} | {:.0} |",
            c.counted.label(),
            c.workload,
            c.bulk,
            c.docs.0,
            c.docs.1,
            c.totals.0,
            c.totals.1,
            c.per_doc()
        );
    }
    for workload in [Workload::InsertOne, Workload::FindOne] {
        let of = |counted| {
            counts
                .iter()
                .find(|c| c.counted == counted && c.workload == workload.label())
                .map(Instructions::per_doc)
        };
        if let (Some(r), Some(f)) = (of(Counted::Router), of(Counted::Forwarder)) {
            let _ = writeln!(
                md,
                "\n{}: router / forwarder instructions {:.2} ({r:.0} / {f:.0}).",
                workload.label(),
                r / f
            );
        }
    }
    let side = |xs: &[Load]| {
        xs.iter()
            .map(|l| serde_json::json!({"ops_per_s": l.throughput, "p50_ms": l.p50, "p99_ms": l.p99}))
            .collect::<Vec<_>>()
    };
    let cell_json = |pinned: bool, c: &Cell| {
        serde_json::json!({
            "pinned": pinned,
            "operation": op_label(c.op),
            "clients": c.clients,
            "direct": side(&c.direct),
            "forwarder": side(&c.forwarded),
            "routed": side(&c.routed),
            "router_vs_forwarder_throughput": c.vs_forwarder().json(),
            "router_vs_direct_throughput": c.vs_direct().json(),
            "added_p50_us_over_forwarder": c.added_p50_us().json(),
        })
    };
    // The unpinned 8-client cells under the keys earlier results used.
    let legacy = |op: Op| {
        lanes
            .iter()
            .filter(|l| !l.pinned)
            .flat_map(|l| &l.cells)
            .find(|c| c.op == op && c.clients == 8)
            .map(|c| {
                serde_json::json!({
                    "direct": side(&c.direct),
                    "routed": side(&c.routed),
                    "throughput_ratio": c.vs_direct().json(),
                    "p50_ratio": Cell::ratios(&c.routed, &c.direct, |l| l.p50).json(),
                    "p99_ratio": Cell::ratios(&c.routed, &c.direct, |l| l.p99).json(),
                })
            })
            .unwrap_or(serde_json::Value::Null)
    };
    let json = serde_json::json!({
        "scenario": "overhead",
        "build": profile,
        "operations": s.ops,
        "clients": s.clients,
        "rounds": s.rounds,
        "insert_one": legacy(Op::Insert),
        "find_one": legacy(Op::Find),
        "lanes": lanes
            .iter()
            .flat_map(|l| l.cells.iter().map(|c| cell_json(l.pinned, c)))
            .collect::<Vec<_>>(),
        "instructions": counts.iter().map(|c| serde_json::json!({
            "process": c.counted.label(),
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

fn op_label(op: Op) -> &'static str {
    match op {
        Op::Insert => "insert_one",
        Op::Find => "find_one by _id",
    }
}
