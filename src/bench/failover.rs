//! `failover`: what a step-down costs a client of a replica-set shard. One embedded
//! three-member replica set (its elections take the set's election delay, 200 ms unless told)
//! is the router's only shard, given as a seed list; one task of the stock Rust driver inserts
//! documents one after the other, as fast as they are acknowledged, while the primary is
//! stepped down every half second, 20 times (5 in `--quick`), once with retryable writes on
//! and once with them off. For each step-down: the time from the step-down to the first write
//! sent after it and acknowledged (necessarily by the new primary: the old one refuses writes
//! from the instant it steps down), and the errors the client saw for the writes sent between
//! that step-down and the next. At the end every acknowledged document must be present exactly
//! once, or the scenario fails. Router, set and driver run in this process.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bson::{doc, Document};

use super::fleet::Stats;
use super::report::Report;
use crate::config::{Config, ShardConfig};
use crate::embedded::{EmbeddedReplicaSet, ReplicaSetOptions, ShardOptions};

/// How long an election of the embedded set takes.
const ELECTION_DELAY: Duration = Duration::from_millis(200);
/// Time between two step-downs.
const PERIOD: Duration = Duration::from_millis(500);

/// One write of the workload.
#[derive(Debug, Clone)]
struct Write {
    sent: Instant,
    acked: Option<Instant>,
    id: i64,
}

/// The result of one mode (retryable writes on or off).
#[derive(Debug, Clone)]
pub struct ModeResult {
    /// Whether the driver used retryable writes.
    pub retryable: bool,
    /// Per step-down: milliseconds to the first acknowledged write sent after it.
    pub recovery_ms: Vec<f64>,
    /// Per step-down: client-visible errors among the writes sent before the next one.
    pub errors: Vec<f64>,
    /// Writes acknowledged in all.
    pub acknowledged: usize,
    /// The first error messages seen (at most 3), for the report.
    pub samples: Vec<String>,
}

async fn start(
    retryable: bool,
) -> anyhow::Result<(
    EmbeddedReplicaSet,
    crate::frontend::RouterHandle,
    mongodb::Client,
)> {
    let set = EmbeddedReplicaSet::start(ReplicaSetOptions {
        members: 3,
        election_delay: ELECTION_DELAY,
        shard: ShardOptions {
            set_name: "rs0".into(),
            ..ShardOptions::default()
        },
    })
    .await
    .context("cannot start the replica set")?;
    let mut config = Config {
        shards: vec![ShardConfig {
            id: "rs0".into(),
            address: set.seed_list(),
            shard_server: true,
        }],
        ..Config::default()
    };
    config.listen = "127.0.0.1:0".into();
    config
        .validate()
        .map_err(|e| anyhow::anyhow!(e.to_string()))?;
    let infos: Vec<crate::routing::ShardInfo> = config
        .shards
        .iter()
        .map(|s| crate::routing::ShardInfo {
            id: s.id.clone(),
            addr: s.address.clone(),
            shard_server: s.shard_server,
        })
        .collect();
    let sharded = crate::router::bootstrap(
        None,
        &infos,
        &[],
        config
            .pool_options()
            .map_err(|e| anyhow::anyhow!(e.to_string()))?,
        &config.batching,
    )
    .await
    .map_err(|e| anyhow::anyhow!(e))?;
    let router = crate::router::start_router(config, vec!["sluice".into()], Some(sharded))
        .await
        .context("cannot start the router")?;
    let uri = format!(
        "mongodb://{}/?retryWrites={retryable}&serverSelectionTimeoutMS=30000",
        router.local_addr()
    );
    let client = mongodb::Client::with_uri_str(uri).await?;
    Ok((set, router, client))
}

/// Runs `step_downs` step-downs under the single-insert workload.
pub async fn measure(retryable: bool, step_downs: usize) -> anyhow::Result<ModeResult> {
    let (set, router, client) = start(retryable).await?;
    let coll = client.database("bench").collection::<Document>("failover");
    coll.insert_one(doc! {"_id": -1i64}).await?;
    let writes: Arc<Mutex<Vec<Write>>> = Arc::default();
    let errors: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (writes, errors, stop, coll) =
            (writes.clone(), errors.clone(), stop.clone(), coll.clone());
        tokio::spawn(async move {
            let mut id = 0i64;
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                let r = coll.insert_one(doc! {"_id": id}).await;
                let acked = r.is_ok().then(Instant::now);
                if let Err(e) = r {
                    crate::sync::lock(&errors).push((sent, e.to_string()));
                }
                crate::sync::lock(&writes).push(Write { sent, acked, id });
                id += 1;
            }
        })
    };
    let mut downs = Vec::with_capacity(step_downs);
    for _ in 0..step_downs {
        tokio::time::sleep(PERIOD).await;
        if set
            .wait_for_primary(Duration::from_secs(10))
            .await
            .is_none()
        {
            bail!("the set elected no primary");
        }
        let t0 = Instant::now();
        // Frozen for less than two periods: the set always has an electable member.
        if set.step_down(Duration::from_millis(900)) {
            downs.push(t0);
        }
    }
    tokio::time::sleep(PERIOD).await;
    stop.store(true, Ordering::Relaxed);
    writer.await?;
    let writes = crate::sync::lock(&writes).clone();
    let errors = crate::sync::lock(&errors).clone();
    let mut result = ModeResult {
        retryable,
        recovery_ms: Vec::new(),
        errors: Vec::new(),
        acknowledged: writes.iter().filter(|w| w.acked.is_some()).count(),
        samples: errors.iter().take(3).map(|(_, m)| m.clone()).collect(),
    };
    for (k, t0) in downs.iter().enumerate() {
        let next = downs.get(k + 1).copied();
        let first = writes
            .iter()
            .filter(|w| w.sent >= *t0)
            .filter_map(|w| w.acked)
            .min();
        let Some(first) = first else {
            bail!("no write was acknowledged after step-down {k}");
        };
        result
            .recovery_ms
            .push(first.duration_since(*t0).as_secs_f64() * 1000.0);
        let in_window = errors
            .iter()
            .filter(|(sent, _)| *sent >= *t0 && next.is_none_or(|n| *sent < n))
            .count();
        result.errors.push(in_window as f64);
    }
    // Every acknowledged write is present exactly once.
    let docs = set.documents("bench", "failover");
    let mut seen = std::collections::HashMap::new();
    for d in &docs {
        if let Ok(id) = d.get_i64("_id") {
            *seen.entry(id).or_insert(0usize) += 1;
        }
    }
    for w in writes.iter().filter(|w| w.acked.is_some()) {
        match seen.get(&w.id) {
            Some(1) => {}
            n => bail!("acknowledged write {} is present {n:?} times", w.id),
        }
    }
    // The driver's client is shut down before the servers it talks to: dropped instead, it
    // ends its sessions from a task of its own after the router is gone.
    client.shutdown().await;
    router.shutdown().await;
    set.shutdown().await;
    Ok(result)
}

/// The scenario.
pub async fn run(quick: bool) -> anyhow::Result<Report> {
    let step_downs = if quick { 5 } else { 20 };
    let mut results = Vec::new();
    for retryable in [true, false] {
        eprintln!(
            "failover: {step_downs} step-downs, retryable writes {}",
            if retryable { "on" } else { "off" }
        );
        results.push(measure(retryable, step_downs).await?);
    }
    let mut md = String::new();
    let _ = writeln!(
        md,
        "One three-member embedded replica set behind the router (election delay {} ms), one \
         driver inserting one document at a time; {step_downs} step-downs, one every {} ms.\n",
        ELECTION_DELAY.as_millis(),
        PERIOD.as_millis()
    );
    let _ = writeln!(
        md,
        "| retryable writes | step-down → first acknowledged write, median (ms) | worst (ms) | client-visible errors per step-down (mean) | worst | writes acknowledged |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|");
    let mut json = Vec::new();
    for r in &results {
        let rec = Stats::of(&r.recovery_ms);
        let err = Stats::of(&r.errors);
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.0} | {:.2} | {:.0} | {} |",
            if r.retryable { "on" } else { "off" },
            rec.median,
            rec.max,
            err.mean,
            err.max,
            r.acknowledged
        );
        json.push(serde_json::json!({
            "retryable_writes": r.retryable,
            "step_downs": r.recovery_ms.len(),
            "recovery_ms": {"samples": r.recovery_ms, "stats": rec.json()},
            "errors_per_step_down": {"samples": r.errors, "stats": err.json()},
            "acknowledged": r.acknowledged,
            "error_samples": r.samples,
        }));
    }
    if let Some(r) = results.iter().find(|r| !r.samples.is_empty()) {
        let _ = writeln!(
            md,
            "\nAn error the client saw with retryable writes {}: `{}`",
            if r.retryable { "on" } else { "off" },
            r.samples[0].replace('`', "'")
        );
    }
    Ok(Report {
        name: "failover",
        json: serde_json::json!({
            "election_delay_ms": ELECTION_DELAY.as_millis() as u64,
            "period_ms": PERIOD.as_millis() as u64,
            "modes": json,
        }),
        markdown: md,
        charts: Vec::new(),
    })
}
