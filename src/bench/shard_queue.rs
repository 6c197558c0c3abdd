//! `shard-queue`: the router in front of a capacity-limited shard, as a user meets it. One
//! embedded shard that takes 5 ms per command and runs at most 2 at once (about 400 commands/s
//! of capacity), a router in front, and many stock-driver clients inserting single documents
//! for a fixed time, with retryable writes on and off and with coalescing off
//! (`max_wait_us = 0`) and on (1,000): inserts/s, the insert commands the shard ran against the
//! documents written, p50 and p99. Then one client inserting one document at a time (an idle
//! shard) with coalescing off and on: the p50, which coalescing must not raise.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Document};

use super::fleet::{
    quantile, router_client, ClientAuth, Fleet, Latency, Progress, RouterSpec, Sharded,
};
use super::report::Report;
use crate::write::plan::Policy;

/// The shard's cost per command.
const SHARD_LATENCY: Duration = Duration::from_millis(5);
/// Data commands the shard runs at once.
const SHARD_CONCURRENCY: usize = 2;

/// One measured load.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lane {
    /// Concurrent clients.
    pub clients: usize,
    /// `retryWrites` of the clients.
    pub retry_writes: bool,
    /// The router's `batching.max_wait_us`.
    pub max_wait_us: u64,
    /// Inserts acknowledged per second.
    pub throughput: f64,
    /// Documents written.
    pub documents: i64,
    /// Insert commands the shard ran.
    pub shard_inserts: i64,
    /// Median latency (ms).
    pub p50: f64,
    /// 99th percentile latency (ms).
    pub p99: f64,
}

impl Lane {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "clients": self.clients,
            "retry_writes": self.retry_writes,
            "max_wait_us": self.max_wait_us,
            "inserts_per_s": self.throughput,
            "documents": self.documents,
            "shard_insert_commands": self.shard_inserts,
            "p50_ms": self.p50,
            "p99_ms": self.p99,
        })
    }
}

/// `clients` tasks inserting single documents into `bench.q` for `duration`, through a router
/// with `max_wait_us`, on a fleet of their own; the lane's figures.
async fn run_lane(
    clients: usize,
    retry_writes: bool,
    max_wait_us: u64,
    duration: Duration,
) -> anyhow::Result<Lane> {
    let mut spec = RouterSpec::new(
        Policy::Off,
        vec![Sharded {
            ns: "bench.q".into(),
            chunks: None,
        }],
    );
    spec.extra = format!("\n[batching]\nmax_wait_us = {max_wait_us}\n");
    let latency = Latency {
        per_command: SHARD_LATENCY,
        per_document: Duration::ZERO,
    };
    let fleet = Fleet::start_with_capacity(&[latency], Some(SHARD_CONCURRENCY), &spec).await?;
    let auth = ClientAuth {
        userinfo: String::new(),
        // One connection per client, as many clients would have.
        options: format!("&retryWrites={retry_writes}&maxPoolSize={}", clients.max(1)),
    };
    let client = router_client(fleet.router.addr, false, &auth).await?;
    let coll = client.database("bench").collection::<Document>("q");
    // Connections opened (and the routing loaded) before the clock starts.
    coll.find_one(doc! {}).await?;
    let before = fleet.shard_command_total("insert").await?;
    let next = Arc::new(AtomicI64::new(0));
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let coll = coll.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let id = next.fetch_add(1, Ordering::Relaxed);
                let t = Instant::now();
                coll.insert_one(doc! {"_id": id, "pad": "0123456789abcdef0123456789abcdef"})
                    .await?;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    let shard_inserts = fleet.shard_command_total("insert").await? - before;
    let documents = fleet
        .counts_on_shards("bench", "q")
        .await?
        .iter()
        .sum::<u64>() as i64;
    client.shutdown().await;
    fleet.stop().await?;
    Ok(Lane {
        clients,
        retry_writes,
        max_wait_us,
        throughput: all.len() as f64 / elapsed,
        documents,
        shard_inserts,
        p50: quantile(&all, 0.5),
        p99: quantile(&all, 0.99),
    })
}

/// The Markdown tables of a run.
pub fn markdown(saturated: &[Lane], idle: &[Lane]) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Shard: {} ms per command, {} at once (capacity {:.0} commands/s).\n",
        SHARD_LATENCY.as_millis(),
        SHARD_CONCURRENCY,
        SHARD_CONCURRENCY as f64 / SHARD_LATENCY.as_secs_f64()
    );
    let _ = writeln!(
        md,
        "| clients | retryWrites | max_wait_us | inserts/s | documents | shard insert commands | docs per command | p50 ms | p99 ms |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    for l in saturated.iter().chain(idle) {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.0} | {} | {} | {:.1} | {:.2} | {:.2} |",
            l.clients,
            l.retry_writes,
            l.max_wait_us,
            l.throughput,
            l.documents,
            l.shard_inserts,
            l.documents as f64 / l.shard_inserts.max(1) as f64,
            l.p50,
            l.p99
        );
    }
    md
}

/// Runs the scenario.
pub async fn run(quick: bool) -> anyhow::Result<Report> {
    let (clients, duration, idle_duration) = if quick {
        (16, Duration::from_secs(2), Duration::from_secs(1))
    } else {
        (200, Duration::from_secs(20), Duration::from_secs(10))
    };
    let mut progress = Progress::new("shard-queue", 6);
    let mut saturated = Vec::new();
    for retry_writes in [true, false] {
        for max_wait_us in [0, 1000] {
            progress.step(&format!(
                "{clients} clients, retryWrites={retry_writes}, max_wait_us={max_wait_us}"
            ));
            saturated.push(run_lane(clients, retry_writes, max_wait_us, duration).await?);
        }
    }
    let mut idle = Vec::new();
    for max_wait_us in [0, 1000] {
        progress.step(&format!("1 client, max_wait_us={max_wait_us}"));
        idle.push(run_lane(1, false, max_wait_us, idle_duration).await?);
    }
    progress.finish();
    Ok(Report {
        name: "shard-queue",
        json: serde_json::json!({
            "shard": {
                "latency_per_command_ms": SHARD_LATENCY.as_millis() as u64,
                "max_concurrency": SHARD_CONCURRENCY,
            },
            "duration_s": duration.as_secs(),
            "saturated": saturated.iter().map(Lane::json).collect::<Vec<_>>(),
            "idle": idle.iter().map(Lane::json).collect::<Vec<_>>(),
        }),
        markdown: markdown(&saturated, &idle),
        charts: Vec::new(),
    })
}
