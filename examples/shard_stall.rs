//! A shard stopped with SIGSTOP under load, and what the router's adaptive limits do about it
//! (docs/design/adaptive-limit.md §12–§13).
//!
//! Two embedded shards as `sluice shard` processes and a router process (`sluice --config`,
//! its Prometheus endpoint on), all from the executable given by `--sluice`. The stock Rust
//! driver writes through the router: single inserts to each shard, `$inc`s on a counter of each
//! shard, and ordered and unordered bulks spanning both, each kind in `--tasks` tasks. After
//! `--before-secs` the second shard's process is stopped (SIGSTOP) for `--stall-secs`, then
//! continued (SIGCONT), and the run goes on for `--after-secs`. Every 100 ms the router's
//! `sluice_shard_adaptive_limit` and `sluice_shard_execution_latency_ratio` are read from its
//! endpoint.
//!
//! Printed: one line a second (limits, ratios, acknowledged operations per kind), then the
//! healthy shard's lowest limit after the stall began, and how long after SIGCONT the stalled
//! shard's single inserts were back at their rate before the stall (a one-second window at
//! 80 % of it at least), in seconds and in probe intervals.
//!
//! `cargo build --release && cargo build --example shard_stall &&
//! target/debug/examples/shard_stall --sluice target/release/sluice --after-secs 20`
//! (docs/design/adaptive-limit.md §12a has the figures).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use bson::{doc, Document};
use clap::Parser;
use sluice::bench::fleet::{chunk_ranges, IdsOn, Proc, Scratch};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Parser, Debug)]
struct Args {
    /// The sluice executable that runs the shards and the router.
    #[arg(long, default_value = "target/release/sluice")]
    sluice: PathBuf,
    /// Seconds of load before the stall (the limits settle after 1.25 probe intervals).
    #[arg(long, default_value_t = 15.0)]
    before_secs: f64,
    /// Seconds the second shard stays stopped.
    #[arg(long, default_value_t = 10.0)]
    stall_secs: f64,
    /// Seconds of load after SIGCONT.
    #[arg(long, default_value_t = 30.0)]
    after_secs: f64,
    /// Latency each shard adds to every data command, in microseconds.
    #[arg(long, default_value_t = 1000)]
    latency_us: u64,
    /// Tasks of each kind.
    #[arg(long, default_value_t = 4)]
    tasks: usize,
    /// The router's `ordered_rewrite` (`retry-safe`, `always` or `off`).
    #[arg(long, default_value = "retry-safe")]
    policy: String,
    /// The router's `batching.probe_interval_ms`.
    #[arg(long, default_value_t = 10_000)]
    probe_interval_ms: u64,
    /// `retryWrites` of the driver.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    retry_writes: bool,
}

/// The kinds of operation the workload runs.
const KINDS: [&str; 6] = [
    "insert-healthy",
    "inc-healthy",
    "insert-stalled",
    "inc-stalled",
    "ordered-both",
    "unordered-both",
];

/// One limit reading: (time, limit, ratio) per shard, mutations.
type Reading = (Instant, [f64; 2], [f64; 2]);

/// Reads the router's mutation limits and ratios of `shard0` and `shard1`.
async fn scrape(addr: SocketAddr) -> anyhow::Result<([f64; 2], [f64; 2])> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await?;
    let mut body = String::new();
    s.read_to_string(&mut body).await?;
    let mut limit = [f64::NAN; 2];
    let mut ratio = [f64::NAN; 2];
    for line in body.lines() {
        let target = if line.starts_with("sluice_shard_adaptive_limit{") {
            &mut limit
        } else if line.starts_with("sluice_shard_execution_latency_ratio{") {
            &mut ratio
        } else {
            continue;
        };
        if !line.contains("op=\"mutate\"") {
            continue;
        }
        let i = if line.contains("shard=\"shard0\"") {
            0
        } else if line.contains("shard=\"shard1\"") {
            1
        } else {
            continue;
        };
        if let Some(v) = line.rsplit(' ').next().and_then(|v| v.parse().ok()) {
            target[i] = v;
        }
    }
    Ok((limit, ratio))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn signal(pid: u32, sig: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill {sig} {pid} failed");
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let scratch = Scratch::new("shard-stall")?;
    let mut shards = Vec::new();
    for i in 0..2 {
        let a: Vec<String> = [
            "shard",
            "--port",
            "0",
            "--set-name",
            &format!("shard{i}"),
            "--log-level",
            "warn",
            "--latency-per-command",
            &format!("{}us", args.latency_us),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        shards.push(Proc::start(&args.sluice, &a).await?);
    }
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let mut toml = format!(
        "listen = \"127.0.0.1:0\"\nmetrics_listen = \"{metrics}\"\nordered_rewrite = \"{}\"\n\n[log]\nlevel = \"warn\"\n\n[batching]\nprobe_interval_ms = {}\n",
        args.policy, args.probe_interval_ms
    );
    for (i, s) in shards.iter().enumerate() {
        toml.push_str(&format!(
            "\n[[shards]]\nid = \"shard{i}\"\naddress = \"{}\"\n",
            s.addr
        ));
    }
    toml.push_str("\n[[collections]]\nns = \"test.c\"\nkey = '{\"_id\": \"hashed\"}'\n");
    let config = scratch.0.join("router.toml");
    std::fs::write(&config, toml)?;
    let router = Proc::start(
        &args.sluice,
        &["--config".to_string(), config.display().to_string()],
    )
    .await?;
    let client = mongodb::Client::with_uri_str(format!(
        "mongodb://{}/?maxPoolSize=200&retryWrites={}",
        router.addr, args.retry_writes
    ))
    .await?;
    let chunks = Arc::new(
        chunk_ranges(&client, "test.c")
            .await
            .context("reading test.c's chunks")?,
    );
    let coll = client.database("test").collection::<Document>("c");

    let acks: Arc<Mutex<Vec<(usize, Instant)>>> = Arc::default();
    let errors: Arc<Mutex<Vec<(usize, Instant, String)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for t in 0..args.tasks {
        for (kind, name) in KINDS.iter().enumerate() {
            let (coll, acks, errors, stop) =
                (coll.clone(), acks.clone(), errors.clone(), stop.clone());
            let mut healthy = IdsOn::new(&chunks, "shard0", &format!("{name}-{t}-a"));
            let mut stalled = IdsOn::new(&chunks, "shard1", &format!("{name}-{t}-b"));
            let counter_healthy = healthy.next_id();
            let counter_stalled = stalled.next_id();
            handles.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let r = match *name {
                        "insert-healthy" => coll
                            .insert_one(doc! {"_id": healthy.next_id()})
                            .await
                            .map(|_| ()),
                        "insert-stalled" => coll
                            .insert_one(doc! {"_id": stalled.next_id()})
                            .await
                            .map(|_| ()),
                        "inc-healthy" | "inc-stalled" => {
                            let id = if *name == "inc-healthy" {
                                &counter_healthy
                            } else {
                                &counter_stalled
                            };
                            coll.update_one(doc! {"_id": id}, doc! {"$inc": {"n": 1}})
                                .upsert(true)
                                .await
                                .map(|_| ())
                        }
                        _ => {
                            let docs: Vec<Document> = (0..4)
                                .flat_map(|_| [healthy.next_id(), stalled.next_id()])
                                .map(|id| doc! {"_id": id})
                                .collect();
                            coll.insert_many(docs)
                                .ordered(*name == "ordered-both")
                                .await
                                .map(|_| ())
                        }
                    };
                    match r {
                        Ok(()) => acks.lock().unwrap().push((kind, Instant::now())),
                        Err(e) => {
                            errors
                                .lock()
                                .unwrap()
                                .push((kind, Instant::now(), e.to_string()))
                        }
                    }
                }
            }));
        }
    }

    let readings: Arc<Mutex<Vec<Reading>>> = Arc::default();
    let sampler = {
        let (readings, stop) = (readings.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Ok((l, r)) = scrape(metrics).await {
                    readings.lock().unwrap().push((Instant::now(), l, r));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(args.before_secs)).await;
    let pid = shards[1].pid().ok_or_else(|| anyhow!("shard1 exited"))?;
    let stall_start = Instant::now();
    signal(pid, "-STOP")?;
    tokio::time::sleep(Duration::from_secs_f64(args.stall_secs)).await;
    signal(pid, "-CONT")?;
    let stall_end = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(args.after_secs)).await;
    stop.store(true, Ordering::Relaxed);
    let _ = tokio::time::timeout(Duration::from_secs(30), async {
        for h in handles {
            let _ = h.await;
        }
    })
    .await;
    let _ = sampler.await;

    let acks = acks.lock().unwrap().clone();
    let readings = readings.lock().unwrap().clone();
    let errors = errors.lock().unwrap().clone();
    let signed = |t: Instant| {
        if t >= stall_start {
            (t - stall_start).as_secs_f64()
        } else {
            -(stall_start - t).as_secs_f64()
        }
    };
    println!(
        "policy {}, shard latency {} us, {} tasks of each kind, stall {} s (t = 0 at SIGSTOP, SIGCONT at {:.2} s)",
        args.policy,
        args.latency_us,
        args.tasks,
        args.stall_secs,
        signed(stall_end)
    );
    println!(
        "{:>6} {:>7} {:>7} {:>8} {:>8}  acknowledged per second: {}",
        "t (s)",
        "limit0",
        "limit1",
        "ratio0",
        "ratio1",
        KINDS.join(" ")
    );
    let start = -(stall_start - t0).as_secs_f64().floor();
    let end = signed(stall_end) + args.after_secs;
    let mut s = start;
    while s < end {
        let in_sec = |t: Instant| {
            let x = signed(t);
            x >= s && x < s + 1.0
        };
        let rs: Vec<&Reading> = readings.iter().filter(|r| in_sec(r.0)).collect();
        let min = |f: &dyn Fn(&Reading) -> f64| {
            rs.iter()
                .map(|r| f(r))
                .filter(|v| !v.is_nan())
                .fold(f64::NAN, f64::min)
        };
        let max = |f: &dyn Fn(&Reading) -> f64| {
            rs.iter()
                .map(|r| f(r))
                .filter(|v| !v.is_nan())
                .fold(f64::NAN, f64::max)
        };
        let counts: Vec<String> = (0..KINDS.len())
            .map(|k| {
                acks.iter()
                    .filter(|(kind, t)| *kind == k && in_sec(*t))
                    .count()
                    .to_string()
            })
            .collect();
        println!(
            "{:>6.0} {:>7.3} {:>7.3} {:>8.2} {:>8.2}  {}",
            s,
            min(&|r| r.1[0]),
            min(&|r| r.1[1]),
            max(&|r| r.2[0]),
            max(&|r| r.2[1]),
            counts.join(" ")
        );
        s += 1.0;
    }
    // The healthy shard's limit before the stall and its lowest afterwards.
    let before = readings
        .iter()
        .rfind(|r| r.0 < stall_start)
        .map_or(f64::NAN, |r| r.1[0]);
    let lowest = readings
        .iter()
        .filter(|r| r.0 >= stall_start)
        .map(|r| r.1[0])
        .fold(f64::NAN, f64::min);
    println!("healthy shard's limit: {before} at SIGSTOP, lowest afterwards {lowest}");
    // Recovery: the stalled shard's single inserts per second before the stall, and the first
    // one-second window after SIGCONT at 80 % of it (windows sliding by 100 ms).
    let kind = KINDS
        .iter()
        .position(|k| *k == "insert-stalled")
        .unwrap_or(0);
    let count = |from: Instant, len: Duration| {
        acks.iter()
            .filter(|(k, t)| *k == kind && *t >= from && *t < from + len)
            .count() as f64
    };
    let window = Duration::from_secs(5);
    let rate = count(stall_start - window, window) / window.as_secs_f64();
    let mut back = None;
    let mut at = stall_end;
    while at + Duration::from_secs(1) <= stall_end + Duration::from_secs_f64(args.after_secs) {
        if count(at, Duration::from_secs(1)) >= 0.8 * rate {
            back = Some(at + Duration::from_secs(1) - stall_end);
            break;
        }
        at += Duration::from_millis(100);
    }
    match back {
        Some(d) => println!(
            "stalled shard's single inserts: {rate:.0}/s before the stall, back at 80 % {:.1} s after SIGCONT ({:.2} probe intervals)",
            d.as_secs_f64(),
            d.as_secs_f64() / (args.probe_interval_ms as f64 / 1000.0)
        ),
        None => println!(
            "stalled shard's single inserts: {rate:.0}/s before the stall, not back at 80 % within {} s",
            args.after_secs
        ),
    }
    let mut by_kind = vec![0; KINDS.len()];
    for (k, _, _) in &errors {
        by_kind[*k] += 1;
    }
    println!(
        "client-visible errors by kind: {by_kind:?}{}",
        errors
            .first()
            .map(|(_, t, e)| format!("; first at {:.2} s: {e}", signed(*t)))
            .unwrap_or_default()
    );
    drop(client);
    router.stop().await?;
    for s in shards {
        s.stop().await?;
    }
    Ok(())
}
