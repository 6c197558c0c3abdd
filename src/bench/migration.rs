//! `migration`: what one chunk migration costs the clients of a router while they write. The
//! cluster layout (a config server, two shards in shard-server mode and a `--configdb` router,
//! each a process) with `bench.migration` sharded on `{_id: "hashed"}`; several tasks of the
//! stock Rust driver (retryable writes, the default) write through the router one document at a
//! time, alternating `insertOne` and `updateOne` with `upsert` by a fresh `_id`, each
//! operation's send time and latency recorded. After a warm period, one chunk at a time is moved
//! to the other shard with `moveChunk` through the router, as a user would, several times. Per
//! migration: the router's `sluice_routing_refreshes_total` (its Prometheus endpoint) before the
//! `moveChunk` and at the end of the window after it, the `moveChunk`'s wall time, and the
//! operations' latency p50 / p99 / max sent in the window before it, while it ran and in the
//! window after it. At the end: the errors the client saw, and every `_id` read from the shards
//! directly: each acknowledged document must be present exactly once, on the shard that owns its
//! hash in `config.chunks`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bson::{doc, Bson, Document};

use super::fleet::{quantile, Fleet, Latency, Layout, RouterSpec, Sharded, Stats};
use super::report::Report;
use crate::routing::hash::hash64;
use crate::write::plan::Policy;

const DB: &str = "bench";
const COLL: &str = "migration";

/// The run's size.
struct Params {
    /// Writing tasks.
    tasks: usize,
    /// Migrations, one after the other.
    migrations: usize,
    /// The warm period, and the length of the windows before and after each migration.
    window: Duration,
}

impl Params {
    fn of(quick: bool) -> Params {
        if quick {
            Params {
                tasks: 4,
                migrations: 2,
                window: Duration::from_millis(300),
            }
        } else {
            Params {
                tasks: 8,
                migrations: 5,
                window: Duration::from_secs(2),
            }
        }
    }
}

/// One operation of the workload.
#[derive(Debug, Clone, Copy)]
struct Op {
    sent: Instant,
    ms: f64,
    /// The hash of the `_id` written, when the write was acknowledged.
    acked_hash: Option<i64>,
}

/// What one writing task saw.
#[derive(Debug, Default)]
struct TaskLog {
    ops: Vec<Op>,
    acknowledged: Vec<String>,
    errors: Vec<String>,
}

/// Latency of the operations sent in one window.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    ops: usize,
    p50: f64,
    p99: f64,
    max: f64,
}

impl Window {
    fn of(ops: &[Op], from: Instant, to: Instant) -> Window {
        let mut ms: Vec<f64> = ops
            .iter()
            .filter(|o| o.sent >= from && o.sent < to)
            .map(|o| o.ms)
            .collect();
        ms.sort_by(f64::total_cmp);
        Window {
            ops: ms.len(),
            p50: quantile(&ms, 0.5),
            p99: quantile(&ms, 0.99),
            max: ms.last().copied().unwrap_or(0.0),
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({"ops": self.ops, "p50_ms": self.p50, "p99_ms": self.p99, "max_ms": self.max})
    }
}

/// One migration, as measured.
#[derive(Debug, Clone)]
struct Migration {
    /// The chunk moved.
    chunk: Chunk,
    /// Acknowledged documents in the chunk when the `moveChunk` was sent (what it copied,
    /// besides the writes that arrived while it ran).
    documents: usize,
    from: String,
    to: String,
    started: Instant,
    move_ms: f64,
    refreshes_before: u64,
    refreshes_after: u64,
    before: Window,
    during: Window,
    after: Window,
}

/// A chunk of `bench.migration`: hash bounds (`i64::MIN` / `i64::MAX` stand for MinKey /
/// MaxKey, the latter inclusive) and bound values as stored, and its shard.
#[derive(Debug, Clone)]
struct Chunk {
    lo: i64,
    hi: i64,
    min: Bson,
    max: Bson,
    shard: String,
}

impl Chunk {
    fn owns(&self, h: i64) -> bool {
        h >= self.lo && (h < self.hi || (self.hi == i64::MAX && matches!(self.max, Bson::MaxKey)))
    }
}

/// The chunks of `ns` from `config.chunks` (through the router), in key order.
async fn chunks(client: &mongodb::Client, ns: &str) -> anyhow::Result<Vec<Chunk>> {
    let mut out = Vec::new();
    for c in super::fleet::config_chunks(client, ns).await? {
        let bound = |field: &str| -> anyhow::Result<(Bson, i64)> {
            let v = c
                .get_document(field)?
                .get("_id")
                .cloned()
                .ok_or_else(|| anyhow!("chunk without {field}._id: {c}"))?;
            let h = match &v {
                Bson::MinKey => i64::MIN,
                Bson::MaxKey => i64::MAX,
                Bson::Int64(h) => *h,
                other => bail!("unexpected chunk bound {other:?}"),
            };
            Ok((v, h))
        };
        let (min, lo) = bound("min")?;
        let (max, hi) = bound("max")?;
        out.push(Chunk {
            lo,
            hi,
            min,
            max,
            shard: c.get_str("shard")?.to_string(),
        });
    }
    out.sort_by_key(|c| c.lo);
    if out.is_empty() {
        bail!("{ns} has no chunks");
    }
    Ok(out)
}

/// A loopback port free now (bound, then released for the router's metrics endpoint).
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// `name`'s value in one scrape of the Prometheus endpoint at `addr` (0 before the router
/// first counts it: the exporter lists a counter once it has been incremented).
async fn scrape_counter(addr: SocketAddr, name: &str) -> anyhow::Result<u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        // The endpoint starts with the router; retry briefly until it answers.
        match tokio::net::TcpStream::connect(addr).await {
            Ok(mut s) => {
                s.write_all(
                    b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
                )
                .await?;
                let mut text = String::new();
                s.read_to_string(&mut text).await?;
                break text;
            }
            Err(e) if Instant::now() > deadline => {
                return Err(e).with_context(|| format!("no metrics endpoint at {addr}"))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    if !text.starts_with("HTTP/1.1 200") {
        bail!(
            "the metrics endpoint at {addr} answered {:?}",
            text.lines().next()
        );
    }
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix(name) {
            if rest.starts_with(' ') || rest.starts_with('{') {
                let v = rest
                    .rsplit(' ')
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
                    .ok_or_else(|| anyhow!("unreadable metrics line {line:?}"))?;
                return Ok(v as u64);
            }
        }
    }
    Ok(0)
}

/// One writing task: fresh `_id`s `t<task>-<n>`, an `insertOne` for even `n`, an `updateOne`
/// with `upsert` for odd ones, until `stop`.
async fn write_until(
    coll: mongodb::Collection<Document>,
    task: usize,
    stop: Arc<AtomicBool>,
) -> TaskLog {
    let mut log = TaskLog::default();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let id = format!("t{task}-{n}");
        let sent = Instant::now();
        let r = if n % 2 == 0 {
            coll.insert_one(doc! {"_id": &id, "n": n as i64})
                .await
                .map(|_| ())
        } else {
            coll.update_one(doc! {"_id": &id}, doc! {"$set": {"n": n as i64}})
                .upsert(true)
                .await
                .map(|_| ())
        };
        let ms = sent.elapsed().as_secs_f64() * 1000.0;
        let acked_hash = r.is_ok().then(|| hash64(&Bson::String(id.clone())));
        log.ops.push(Op {
            sent,
            ms,
            acked_hash,
        });
        match r {
            Ok(()) => log.acknowledged.push(id),
            Err(e) => log.errors.push(e.to_string()),
        }
        n += 1;
    }
    log
}

/// What the shards hold at the end, against what the client was told.
#[derive(Debug, Default)]
struct Check {
    acknowledged: usize,
    present: usize,
    lost: usize,
    duplicated: usize,
    misplaced: usize,
    per_shard: Vec<u64>,
    samples: Vec<String>,
}

/// Reads every `_id` of the collection from each shard directly and checks it against the
/// acknowledged writes and the final `config.chunks`.
async fn check(fleet: &Fleet, acknowledged: &[String]) -> anyhow::Result<Check> {
    let table = chunks(&fleet.client, &format!("{DB}.{COLL}")).await?;
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Check {
        acknowledged: acknowledged.len(),
        ..Check::default()
    };
    for (i, c) in fleet.shard_clients.iter().enumerate() {
        let shard = &fleet.shard_ids[i];
        let mut cursor = c
            .database(DB)
            .collection::<Document>(COLL)
            .find(doc! {})
            .projection(doc! {"_id": 1})
            .await?;
        let mut here = 0u64;
        while cursor.advance().await? {
            let d = cursor.deserialize_current()?;
            let id = d
                .get("_id")
                .cloned()
                .ok_or_else(|| anyhow!("a document without _id on {shard}"))?;
            here += 1;
            let h = hash64(&id);
            let owner = table.iter().find(|c| c.owns(h)).map(|c| c.shard.as_str());
            if owner != Some(shard.as_str()) {
                out.misplaced += 1;
                if out.samples.len() < 3 {
                    out.samples
                        .push(format!("{id} on {shard}, owned by {owner:?}"));
                }
            }
            let key = match id {
                Bson::String(s) => s,
                other => other.to_string(),
            };
            *seen.entry(key).or_insert(0) += 1;
        }
        out.per_shard.push(here);
    }
    out.present = seen.len();
    for id in acknowledged {
        match seen.get(id).copied().unwrap_or(0) {
            1 => {}
            0 => {
                out.lost += 1;
                if out.samples.len() < 3 {
                    out.samples.push(format!("{id} acknowledged, not found"));
                }
            }
            n => {
                out.duplicated += 1;
                if out.samples.len() < 3 {
                    out.samples.push(format!("{id} present {n} times"));
                }
            }
        }
    }
    Ok(out)
}

/// The scenario (always on the cluster layout: a static router has no migrations).
pub async fn run(quick: bool) -> anyhow::Result<Report> {
    let p = Params::of(quick);
    let ns = format!("{DB}.{COLL}");
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let mut spec = RouterSpec::new(
        Policy::Off,
        vec![Sharded {
            ns: ns.clone(),
            chunks: None,
        }],
    )
    .in_layout(Layout::Cluster);
    spec.metrics_listen = metrics.to_string();
    eprintln!(
        "migration: cluster layout, 2 shards, {} writing tasks, {} migrations",
        p.tasks, p.migrations
    );
    let fleet = Fleet::start(&[Latency::default(); 2], &spec).await?;
    let coll = fleet.client.database(DB).collection::<Document>(COLL);
    let admin = fleet.client.database("admin");

    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..p.tasks)
        .map(|t| tokio::spawn(write_until(coll.clone(), t, stop.clone())))
        .collect();
    let mut migrations = Vec::with_capacity(p.migrations);
    // Warm period: pools open, the router's routing loaded.
    tokio::time::sleep(p.window).await;
    let mut outcome: anyhow::Result<()> = Ok(());
    for k in 0..p.migrations {
        // The window before this migration.
        tokio::time::sleep(p.window).await;
        let step = async {
            // Alternately from each shard, so that both keep chunks and load.
            let table = chunks(&fleet.client, &ns).await?;
            let donor = &fleet.shard_ids[k % fleet.shard_ids.len()];
            let on_donor: Vec<&Chunk> = table.iter().filter(|c| c.shard == *donor).collect();
            let chunk = match on_donor.len() {
                0 => &table[k % table.len()],
                n => on_donor[(k / 2) % n],
            };
            let to = fleet
                .shard_ids
                .iter()
                .find(|s| **s != chunk.shard)
                .ok_or_else(|| anyhow!("no shard to move to"))?
                .clone();
            let refreshes_before =
                scrape_counter(metrics, "sluice_routing_refreshes_total").await?;
            let started = Instant::now();
            admin
                .run_command(doc! {
                    "moveChunk": &ns,
                    "bounds": [{"_id": chunk.min.clone()}, {"_id": chunk.max.clone()}],
                    "to": &to,
                })
                .await
                .with_context(|| format!("moveChunk {k} to {to} through the router"))?;
            let move_ms = started.elapsed().as_secs_f64() * 1000.0;
            // The window after it.
            tokio::time::sleep(p.window).await;
            let refreshes_after = scrape_counter(metrics, "sluice_routing_refreshes_total").await?;
            anyhow::Ok(Migration {
                chunk: chunk.clone(),
                documents: 0,
                from: chunk.shard.clone(),
                to,
                started,
                move_ms,
                refreshes_before,
                refreshes_after,
                before: Window::default(),
                during: Window::default(),
                after: Window::default(),
            })
        };
        match step.await {
            Ok(m) => {
                eprintln!(
                    "migration: [{}/{}] {} → {} in {:.0} ms",
                    k + 1,
                    p.migrations,
                    m.from,
                    m.to,
                    m.move_ms
                );
                migrations.push(m);
            }
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut logs = Vec::new();
    for t in tasks {
        logs.push(t.await?);
    }
    outcome?;
    let ops: Vec<Op> = logs.iter().flat_map(|l| l.ops.iter().copied()).collect();
    let acknowledged: Vec<String> = logs
        .iter()
        .flat_map(|l| l.acknowledged.iter().cloned())
        .collect();
    let errors: Vec<String> = logs.iter().flat_map(|l| l.errors.iter().cloned()).collect();
    for m in &mut migrations {
        let done = m.started + Duration::from_secs_f64(m.move_ms / 1000.0);
        let from = m.started.checked_sub(p.window).unwrap_or(m.started);
        m.before = Window::of(&ops, from, m.started);
        m.during = Window::of(&ops, m.started, done);
        m.after = Window::of(&ops, done, done + p.window);
        m.documents = ops
            .iter()
            .filter(|o| o.sent < m.started)
            .filter_map(|o| o.acked_hash)
            .filter(|h| m.chunk.owns(*h))
            .count();
    }
    let checked = check(&fleet, &acknowledged).await?;
    fleet.stop().await?;
    Ok(report(&p, &migrations, &checked, ops.len(), &errors))
}

fn report(
    p: &Params,
    migrations: &[Migration],
    checked: &Check,
    ops: usize,
    errors: &[String],
) -> Report {
    let refreshes: Vec<f64> = migrations
        .iter()
        .map(|m| m.refreshes_after.saturating_sub(m.refreshes_before) as f64)
        .collect();
    let move_ms: Vec<f64> = migrations.iter().map(|m| m.move_ms).collect();
    let windows: [(&str, WindowOf); 3] = [
        ("before", |m| m.before),
        ("during", |m| m.during),
        ("after", |m| m.after),
    ];
    let mut md = String::new();
    let _ = writeln!(
        md,
        "The cluster layout (a config server, 2 shards in shard-server mode, a `--configdb` \
         router, each a process); `{DB}.{COLL}` sharded on `{{_id: \"hashed\"}}`, {} driver tasks \
         writing one document at a time through the router (insertOne / updateOne with upsert \
         by a fresh `_id`, retryable writes); {} migrations of one chunk each with `moveChunk` \
         through the router, {} ms apart, windows of {} ms before and after each.\n",
        p.tasks,
        p.migrations,
        2 * p.window.as_millis(),
        p.window.as_millis()
    );
    let _ = writeln!(
        md,
        "| migration | chunk | documents in it | moveChunk (ms) | router refreshes | before p50 / p99 / max (ms) | during p50 / p99 / max (ms) | after p50 / p99 / max (ms) |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---:|---|---|---|");
    let w = |w: &Window| format!("{:.2} / {:.2} / {:.1} ({} ops)", w.p50, w.p99, w.max, w.ops);
    for (i, m) in migrations.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {} | {} → {} | {} | {:.0} | {} → {} (+{}) | {} | {} | {} |",
            i + 1,
            m.from,
            m.to,
            m.documents,
            m.move_ms,
            m.refreshes_before,
            m.refreshes_after,
            m.refreshes_after.saturating_sub(m.refreshes_before),
            w(&m.before),
            w(&m.during),
            w(&m.after)
        );
    }
    let mv = Stats::of(&move_ms);
    let rf = Stats::of(&refreshes);
    let median: fn(&Stats) -> f64 = |s| s.median;
    let worst: fn(&Stats) -> f64 = |s| s.max;
    for (label, pick) in [("median", median), ("worst", worst)] {
        let _ = writeln!(
            md,
            "| **{label}** | | | {:.0} | +{} | {} | {} | {} |",
            pick(&mv),
            pick(&rf),
            triple(migrations, windows[0].1, pick),
            triple(migrations, windows[1].1, pick),
            triple(migrations, windows[2].1, pick)
        );
    }
    let added = |f: fn(&Window) -> f64| {
        Stats::of(
            &migrations
                .iter()
                .map(|m| f(&m.during) - f(&m.before))
                .collect::<Vec<_>>(),
        )
    };
    let (a50, a99, amax) = (added(|w| w.p50), added(|w| w.p99), added(|w| w.max));
    let _ = writeln!(
        md,
        "\nAdded latency while a chunk moves (during − before, median over the migrations / \
         worst): p50 {:+.2} / {:+.2} ms, p99 {:+.2} / {:+.2} ms, max {:+.1} / {:+.1} ms.",
        a50.median, a50.max, a99.median, a99.max, amax.median, amax.max
    );
    let _ = writeln!(
        md,
        "\n{ops} operations, {} client-visible errors; {} acknowledged documents: {} lost, {} \
         duplicated; {} documents on the shards ({}), {} on a shard that does not own its chunk.",
        errors.len(),
        checked.acknowledged,
        checked.lost,
        checked.duplicated,
        checked.present,
        checked
            .per_shard
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(" + "),
        checked.misplaced
    );
    if let Some(e) = errors.first() {
        let _ = writeln!(md, "\nAn error the client saw: `{}`", e.replace('`', "'"));
    }
    if let Some(s) = checked.samples.first() {
        let _ = writeln!(md, "\nA document out of place: {s}");
    }
    let summary: serde_json::Map<String, serde_json::Value> = windows
        .iter()
        .map(|(name, f)| {
            (
                name.to_string(),
                serde_json::json!({
                    "p50_ms": over(migrations, |m| f(m).p50).json(),
                    "p99_ms": over(migrations, |m| f(m).p99).json(),
                    "max_ms": over(migrations, |m| f(m).max).json(),
                }),
            )
        })
        .collect();
    Report {
        name: "migration",
        json: serde_json::json!({
            "layout": "cluster",
            "shards": 2,
            "tasks": p.tasks,
            "window_ms": p.window.as_millis() as u64,
            "migrations": migrations.iter().map(|m| serde_json::json!({
                "from": m.from,
                "to": m.to,
                "documents": m.documents,
                "move_ms": m.move_ms,
                "refreshes_before": m.refreshes_before,
                "refreshes_after": m.refreshes_after,
                "refreshes": m.refreshes_after.saturating_sub(m.refreshes_before),
                "before": m.before.json(),
                "during": m.during.json(),
                "after": m.after.json(),
            })).collect::<Vec<_>>(),
            "summary": {
                "move_ms": mv.json(),
                "refreshes": rf.json(),
                "latency": summary,
                "added_during_ms": {"p50": a50.json(), "p99": a99.json(), "max": amax.json()},
            },
            "operations": ops,
            "client_errors": errors.len(),
            "error_samples": errors.iter().take(3).collect::<Vec<_>>(),
            "documents": {
                "acknowledged": checked.acknowledged,
                "present": checked.present,
                "lost": checked.lost,
                "duplicated": checked.duplicated,
                "misplaced": checked.misplaced,
                "per_shard": checked.per_shard,
                "samples": checked.samples,
            },
        }),
        markdown: md,
        charts: Vec::new(),
    }
}

/// Which window of a migration.
type WindowOf = fn(&Migration) -> Window;

/// A figure of each migration, over all of them.
fn over(migrations: &[Migration], f: impl Fn(&Migration) -> f64) -> Stats {
    Stats::of(&migrations.iter().map(f).collect::<Vec<_>>())
}

/// `p50 / p99 / max` of one window, each summarised over the migrations by `pick`.
fn triple(migrations: &[Migration], window: WindowOf, pick: fn(&Stats) -> f64) -> String {
    format!(
        "{:.2} / {:.2} / {:.1}",
        pick(&over(migrations, |m| window(m).p50)),
        pick(&over(migrations, |m| window(m).p99)),
        pick(&over(migrations, |m| window(m).max))
    )
}
