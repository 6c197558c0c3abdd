//! The mutation run: many damaged messages against one `sluice demo` process (the router and
//! its embedded shards), checking that no message aborts it, stalls it or leaves memory behind.
//!
//! `make mutation-run MESSAGES=200000` (see docs/hardening.md). Each message starts from a
//! frame of the seed corpus (the bad-request table, ordinary commands, compressed and
//! checksummed frames) or from a command of the fuzz generator (`sluice::fuzz::Gen`), and gets
//! up to four mutations: bit flips, bytes set to boundary values, cuts, insertions, repeated
//! spans, a wrong length field. Several connections send at once, two thirds to the router and
//! one third straight to an embedded shard. After each message a `ping` follows on the same
//! connection: its reply (after any replies to the message) shows that the connection went on,
//! a close shows that the server gave the connection up (as mongod does on a fatal framing
//! error), and no answer within `--stall-secs` is a stall: the message is saved and the process
//! is probed on a fresh connection, where no answer is a hang and fails the run.
//!
//! At the end every connection is closed, the cursors its messages opened are killed (as a
//! driver kills the cursors it leaves unread), the databases the run created are dropped, and the
//! process's resident memory (VmRSS) must come back within `--rss-tolerance` of what it was
//! after the warm-up. The run fails if the process exits, hangs, or logs a panic.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bson::{doc, Document};
use clap::Parser;
use sluice::fuzz::Gen;
use sluice::wire::{OpMsgBuilder, MAX_MESSAGE_SIZE};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

#[derive(Debug, Parser)]
struct Args {
    /// Messages to send in all.
    #[arg(long, default_value_t = 200_000)]
    messages: u64,
    /// Connections sending at once.
    #[arg(long, default_value_t = 8)]
    connections: u64,
    /// Seed of the mutations (the same seed sends the same messages).
    #[arg(long, default_value_t = 13)]
    seed: u64,
    /// The `sluice` binary.
    #[arg(long, default_value = "target/release/sluice")]
    sluice: PathBuf,
    /// Seconds without an answer after which a connection counts as stalled.
    #[arg(long, default_value_t = 15)]
    stall_secs: u64,
    /// How far above its start RSS may end, as a fraction.
    #[arg(long, default_value_t = 0.20)]
    rss_tolerance: f64,
    /// Seconds to wait after the run before the last RSS reading (cursors idle for 10 minutes
    /// are reaped on the next cursor operation: past 600 s, one `find` per server runs first).
    #[arg(long, default_value_t = 20)]
    settle_secs: u64,
    /// Where stalled messages and the server's log go.
    #[arg(long, default_value = "target/mutation-run")]
    out: PathBuf,
}

/// xorshift64*: the same sequence for the same seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// What a message did to its connection.
#[derive(Default)]
struct Counts {
    sent: AtomicU64,
    /// The ping behind the message was answered: the connection went on.
    answered: AtomicU64,
    /// Replies to the message itself (before the ping's).
    replies: AtomicU64,
    /// Replies that opened a cursor (a non-zero `cursor.id`): held until killed or reaped.
    cursors: AtomicU64,
    /// The server closed the connection.
    closed: AtomicU64,
    /// The message declared more bytes than it had and the client closed mid-message.
    cut: AtomicU64,
    /// The message started an exhaust stream (replies with moreToCome): the client closed, as
    /// a driver does to end one.
    exhaust: AtomicU64,
    /// No answer in time on that connection (the process still answered others).
    stalls: AtomicU64,
}

/// A message to send: its bytes, and whether it stops mid-frame (the client then closes).
struct Mutant {
    bytes: Vec<u8>,
    cut: bool,
}

fn set_len(frame: &mut [u8], len: usize) {
    if frame.len() >= 4 {
        frame[..4].copy_from_slice(&(len as i32).to_le_bytes());
    }
}

/// A damaged message: a seed frame or a generated command, then mutations.
fn mutant(rng: &mut Rng, seeds: &[Vec<u8>]) -> Mutant {
    let mut frame = if rng.below(2) == 0 {
        seeds[rng.below(seeds.len())].clone()
    } else {
        let n = 16 + rng.below(240);
        let input = rng.bytes(n);
        let body = Gen::new(&input).command();
        let bytes = body.to_vec().unwrap_or_default();
        OpMsgBuilder::new(0, &bytes).finish(1, 0).to_vec()
    };
    for _ in 0..rng.below(5) {
        let len = frame.len().max(1);
        let at = rng.below(len);
        match rng.below(7) {
            0 => {
                if let Some(b) = frame.get_mut(at) {
                    *b ^= 1 << rng.below(8);
                }
            }
            1 => {
                let v = [0x00, 0xff, 0x7f, 0x80, 0x01, 0x03, 0x04, 0x10][rng.below(8)];
                if let Some(b) = frame.get_mut(at) {
                    *b = v;
                }
            }
            2 => {
                // A 32-bit boundary value over a length or count field.
                let v: i32 = [0, -1, i32::MAX, i32::MIN, 16, 5, 1 << 24][rng.below(7)];
                if at + 4 <= frame.len() {
                    frame[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
            3 => frame.truncate(at),
            4 => {
                let n = 1 + rng.below(16);
                let extra = rng.bytes(n);
                frame.splice(at..at, extra);
            }
            5 => {
                let end = (at + 1 + rng.below(64)).min(frame.len());
                let span = frame[at..end].to_vec();
                frame.splice(at..at, span);
            }
            _ => {
                // Leave the damage to the length field below.
            }
        }
    }
    let actual = frame.len();
    if actual < 4 {
        // Not even a length field: the server waits for the rest, so the client closes.
        return Mutant {
            bytes: frame,
            cut: true,
        };
    }
    if rng.below(10) != 0 {
        // Usually a length field that matches, so the damage reaches the parsers.
        set_len(&mut frame, actual);
        return Mutant {
            bytes: frame,
            cut: false,
        };
    }
    let declared = match rng.below(4) {
        0 => rng.below(16),
        1 => actual.saturating_sub(1 + rng.below(8)),
        2 => actual + 1 + rng.below(100),
        _ => MAX_MESSAGE_SIZE + 1 + rng.below(1000),
    };
    set_len(&mut frame, declared);
    if declared < actual && declared >= 16 {
        // The server reads exactly `declared` bytes as the message.
        frame.truncate(declared);
    }
    let cut = declared > actual && declared <= MAX_MESSAGE_SIZE;
    Mutant { bytes: frame, cut }
}

fn ping(request_id: i32) -> Vec<u8> {
    let body = doc! {"ping": 1, "$db": "admin"};
    OpMsgBuilder::new(0, &body.to_vec().unwrap_or_default())
        .finish(request_id, 0)
        .to_vec()
}

/// Reads one frame: `None` when the server closed the connection (or sent garbage).
async fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.ok()?;
    let n = i32::from_le_bytes(len);
    if n < 16 || n as usize > MAX_MESSAGE_SIZE {
        return None;
    }
    let mut frame = len.to_vec();
    frame.resize(n as usize, 0);
    s.read_exact(&mut frame[4..]).await.ok()?;
    Some(frame)
}

/// What ended the wait after a message.
enum Reply {
    /// The probe's reply: the connection went on.
    Probe,
    /// A reply flagged moreToCome: an exhaust stream the server keeps sending.
    Exhaust,
    /// The server closed the connection.
    Closed,
}

/// Whether an OP_MSG reply opened a cursor.
/// The namespace and id of the cursor an OP_MSG reply opened, if it opened one.
fn opened_cursor(frame: &[u8]) -> Option<(String, i64)> {
    let reply = bson::RawDocument::from_bytes(frame.get(21..)?).ok()?;
    let cursor = reply.get_document("cursor").ok()?;
    let id = cursor.get_i64("id").ok().filter(|id| *id != 0)?;
    Some((cursor.get_str("ns").ok()?.to_string(), id))
}

/// Whether an OP_MSG reply has the moreToCome flag.
fn more_to_come(frame: &[u8]) -> bool {
    let op = i32::from_le_bytes([frame[12], frame[13], frame[14], frame[15]]);
    op == 2013 && frame.len() >= 20 && frame[16] & 2 != 0
}

fn response_to(frame: &[u8]) -> i32 {
    i32::from_le_bytes([frame[8], frame[9], frame[10], frame[11]])
}

/// Whether the process answers a ping on a fresh connection within `limit`.
async fn answers(addr: SocketAddr, limit: Duration) -> bool {
    tokio::time::timeout(limit, async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(&ping(1)).await.ok()?;
        read_frame(&mut s).await
    })
    .await
    .ok()
    .flatten()
    .is_some()
}

/// Runs commands on `addr` (warm-up and clean-up).
async fn run_commands(addr: SocketAddr, bodies: &[Document]) -> anyhow::Result<Vec<Document>> {
    let mut s = TcpStream::connect(addr).await?;
    let mut out = Vec::new();
    for (i, body) in bodies.iter().enumerate() {
        let frame = OpMsgBuilder::new(0, &body.to_vec()?).finish(i as i32 + 1, 0);
        s.write_all(&frame).await?;
        let reply = tokio::time::timeout(Duration::from_secs(30), read_frame(&mut s))
            .await?
            .ok_or_else(|| anyhow!("{addr} closed the connection on {body}"))?;
        // flags (4) + kind byte (1) after the header.
        out.push(bson::Document::from_reader(&reply[21..])?);
    }
    Ok(out)
}

/// The resident memory by kind (`RssAnon` is the heap and stacks, `RssFile` the mapped binary)
/// and the thread count, as `/proc/<pid>/status` has them.
fn memory_breakdown(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    ["RssAnon:", "RssFile:", "Threads:"]
        .iter()
        .filter_map(|k| {
            let v = status.lines().find_map(|l| l.strip_prefix(k))?;
            Some(format!("{} {}", k.trim_end_matches(':'), v.trim()))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("no VmRSS for {pid}"))
}

/// The demo process: the router's address and the shards'.
async fn start_demo(args: &Args) -> anyhow::Result<(Child, SocketAddr, Vec<SocketAddr>)> {
    std::fs::create_dir_all(&args.out)?;
    let log = std::fs::File::create(args.out.join("server.log"))?;
    let mut child = Command::new(&args.sluice)
        .args([
            "demo",
            // One router holding the metadata itself, as the run was first measured (no
            // embedded config server).
            "--static",
            "--port",
            "0",
            "--shards",
            "2",
            // Single-server shards: a message sent straight to a shard reaches its primary.
            "--members",
            "1",
            "--metrics-listen",
            "",
            "--log-level",
            "warn",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", args.sluice.display()))?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let mut router = None;
    let mut shards = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(rest) = line.split(" listening on ").nth(1) {
                router = rest.trim_end_matches('.').parse().ok();
            }
            // "Embedded shards (<what they are>): <shard>, <shard>"
            if let Some((_, rest)) = line
                .strip_prefix("Embedded shards (")
                .and_then(|l| l.split_once("): "))
            {
                shards = rest
                    .split(", ")
                    // "shard0 at <address>", or "shard0/<address>"
                    .filter_map(|s| {
                        let addr = match s.split_once(" at ") {
                            Some((_, a)) => a,
                            None => s.split_once('/')?.1,
                        };
                        addr.parse().ok()
                    })
                    .collect();
                return anyhow::Ok(());
            }
        }
        bail!("sluice demo exited before listening")
    })
    .await??;
    // Keep reading stdout so the process never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let router = router.ok_or_else(|| anyhow!("no router address"))?;
    if shards.is_empty() {
        bail!("no shard addresses");
    }
    Ok((child, router, shards))
}

/// What every sender shares.
struct Shared {
    /// The router first, then the shards.
    targets: Vec<SocketAddr>,
    seeds: Vec<Vec<u8>>,
    seed: u64,
    stall: Duration,
    counts: Counts,
    out: PathBuf,
    /// Cursors the messages opened (target, namespace, id): killed at the end, as a driver
    /// kills the cursors it leaves unread, so what they buffer does not count as kept memory.
    open_cursors: std::sync::Mutex<Vec<(usize, String, i64)>>,
}

/// One connection's share of the run.
async fn sender(id: u64, messages: u64, run: Arc<Shared>) -> anyhow::Result<()> {
    let (targets, seeds, counts, stall) = (&run.targets, &run.seeds, &run.counts, run.stall);
    let (seed, out) = (run.seed, &run.out);
    let mut rng = Rng::new(seed ^ (id << 32));
    let mut conns: Vec<Option<TcpStream>> = targets.iter().map(|_| None).collect();
    for n in 0..messages {
        // Two thirds to the router (targets[0]), the rest to a shard.
        let t = if rng.below(3) < 2 {
            0
        } else {
            1 + rng.below(targets.len() - 1)
        };
        let m = mutant(&mut rng, seeds);
        if conns[t].is_none() {
            conns[t] = Some(TcpStream::connect(targets[t]).await?);
        }
        let Some(s) = conns[t].as_mut() else { continue };
        counts.sent.fetch_add(1, Ordering::Relaxed);
        if s.write_all(&m.bytes).await.is_err() {
            counts.closed.fetch_add(1, Ordering::Relaxed);
            conns[t] = None;
            continue;
        }
        if m.cut {
            counts.cut.fetch_add(1, Ordering::Relaxed);
            conns[t] = None;
            continue;
        }
        let probe_id = 0x5000_0000 + (n % 0x1000_0000) as i32;
        let _ = s.write_all(&ping(probe_id)).await;
        let outcome = tokio::time::timeout(stall, async {
            loop {
                match read_frame(s).await {
                    Some(f) if response_to(&f) == probe_id => return Reply::Probe,
                    Some(f) if more_to_come(&f) => return Reply::Exhaust,
                    Some(f) => {
                        counts.replies.fetch_add(1, Ordering::Relaxed);
                        if let Some((ns, id)) = opened_cursor(&f) {
                            counts.cursors.fetch_add(1, Ordering::Relaxed);
                            if let Ok(mut open) = run.open_cursors.lock() {
                                open.push((t, ns, id));
                            }
                        }
                    }
                    None => return Reply::Closed,
                }
            }
        })
        .await;
        match outcome {
            Ok(Reply::Probe) => {
                counts.answered.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Reply::Exhaust) => {
                counts.exhaust.fetch_add(1, Ordering::Relaxed);
                conns[t] = None;
            }
            Ok(Reply::Closed) => {
                counts.closed.fetch_add(1, Ordering::Relaxed);
                conns[t] = None;
            }
            Err(_) => {
                counts.stalls.fetch_add(1, Ordering::Relaxed);
                let path = out.join(format!("stall-{id}-{n}.bin"));
                std::fs::write(&path, &m.bytes)?;
                eprintln!(
                    "stall: no answer in {stall:?} on {} ({})",
                    targets[t],
                    path.display()
                );
                if !answers(targets[t], Duration::from_secs(10)).await {
                    bail!("hang: {} no longer answers a fresh connection", targets[t]);
                }
                conns[t] = None;
            }
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (mut child, router, shards) = start_demo(&args).await?;
    let pid = child.id().ok_or_else(|| anyhow!("no pid"))?;
    let seeds: Vec<Vec<u8>> = sluice::fuzz::seeds()
        .into_iter()
        .filter(|s| s.target == "wire_decode")
        .map(|s| s.bytes[1..].to_vec())
        .collect();

    // Warm-up: what an ordinary client does first, so start-up allocations are behind us.
    let warm: Vec<Document> = (0..50)
        .map(|i| doc! {"insert": "warm", "documents": [{"_id": i, "a": i}], "$db": "warm"})
        .chain([doc! {"find": "warm", "filter": {}, "$db": "warm"}])
        .collect();
    run_commands(router, &warm).await?;
    for s in &shards {
        run_commands(*s, &[doc! {"ping": 1, "$db": "admin"}]).await?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_start = rss_kib(pid)?;
    let breakdown_start = memory_breakdown(pid);

    let mut targets = vec![router];
    targets.extend(&shards);
    let run = Arc::new(Shared {
        targets: targets.clone(),
        seeds,
        seed: args.seed,
        stall: Duration::from_secs(args.stall_secs),
        counts: Counts::default(),
        out: args.out.clone(),
        open_cursors: Default::default(),
    });
    let started = Instant::now();
    let peak = Arc::new(AtomicU64::new(rss_start));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            while let Ok(kib) = rss_kib(pid) {
                peak.fetch_max(kib, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let per = args.messages / args.connections;
    let mut tasks = Vec::new();
    for id in 0..args.connections {
        let n = per + u64::from(id < args.messages % args.connections);
        tasks.push(tokio::spawn(sender(id, n, run.clone())));
    }
    let progress = {
        let run = run.clone();
        let total = args.messages;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(30)).await;
                eprintln!(
                    "{} / {total} messages",
                    run.counts.sent.load(Ordering::Relaxed)
                );
            }
        })
    };
    let mut failure = None;
    for t in tasks {
        if let Err(e) = t.await? {
            failure.get_or_insert(e);
        }
    }
    progress.abort();
    let elapsed = started.elapsed();
    if let Ok(Some(status)) = child.try_wait() {
        bail!("sluice demo exited during the run: {status}");
    }
    if let Some(e) = failure {
        return Err(e);
    }

    // Every connection of the run is closed now; kill the cursors it left open and drop what
    // it stored.
    let rss_after_run = rss_kib(pid)?;
    let open_cursors = run
        .open_cursors
        .lock()
        .map(|open| open.clone())
        .unwrap_or_default();
    for (t, addr) in targets.iter().enumerate() {
        let kills: Vec<Document> = open_cursors
            .iter()
            .filter(|(target, _, _)| *target == t)
            .filter_map(|(_, ns, id)| {
                let (db, coll) = ns.split_once('.')?;
                Some(doc! {"killCursors": coll, "cursors": [*id], "$db": db})
            })
            .collect();
        run_commands(*addr, &kills).await?;
    }
    // Freed memory is given back once the process has been idle for a moment.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_after_kills = rss_kib(pid)?;
    for addr in &targets {
        let listed = run_commands(
            *addr,
            &[doc! {"listDatabases": 1, "nameOnly": true, "$db": "admin"}],
        )
        .await?;
        let names: Vec<String> = listed[0]
            .get_array("databases")
            .map(|dbs| {
                dbs.iter()
                    .filter_map(|d| d.as_document()?.get_str("name").ok().map(String::from))
                    .filter(|n| !matches!(n.as_str(), "admin" | "config" | "local" | "warm"))
                    .collect()
            })
            .unwrap_or_default();
        let drops: Vec<Document> = names
            .iter()
            .map(|n| doc! {"dropDatabase": 1, "$db": n})
            .collect();
        run_commands(*addr, &drops).await?;
    }
    // Give reaping its time, then take the lowest reading.
    let mut rss_end = u64::MAX;
    for _ in 0..args.settle_secs {
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss_end = rss_end.min(rss_kib(pid)?);
    }
    if args.settle_secs > 600 {
        for addr in &targets {
            run_commands(
                *addr,
                &[doc! {"find": "warm", "filter": {}, "batchSize": 1, "$db": "warm"}],
            )
            .await?;
        }
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            rss_end = rss_end.min(rss_kib(pid)?);
        }
    }
    if rss_end == u64::MAX {
        rss_end = rss_kib(pid)?;
    }
    sampler.abort();
    let breakdown_end = memory_breakdown(pid);
    // Connections each server still holds after the run's own are closed (the router's pooled
    // connections to the shards count on both sides, as one process serves them all).
    let mut held = Vec::new();
    for addr in &targets {
        let status = run_commands(*addr, &[doc! {"serverStatus": 1, "$db": "admin"}]).await?;
        let current = status[0]
            .get_document("connections")
            .ok()
            .and_then(|c| c.get_i32("current").ok())
            .unwrap_or(-1);
        // This connection is one of them.
        held.push((current - 1).to_string());
    }
    if let Ok(secs) = std::env::var("MUTATION_RUN_HOLD_SECS") {
        eprintln!("holding pid {pid} for {secs} s");
        tokio::time::sleep(Duration::from_secs(secs.parse().unwrap_or(0))).await;
    }
    let log = std::fs::read_to_string(args.out.join("server.log")).unwrap_or_default();
    let panics = log.lines().filter(|l| l.contains("panic")).count();
    let alive = answers(router, Duration::from_secs(10)).await;

    let counts = &run.counts;
    let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let growth = rss_end as f64 / rss_start as f64 - 1.0;
    println!("messages sent          {}", c(&counts.sent));
    println!("  connection went on   {}", c(&counts.answered));
    println!("  closed by the server {}", c(&counts.closed));
    println!("  cut mid-message      {}", c(&counts.cut));
    println!("  exhaust stream ended {}", c(&counts.exhaust));
    println!("  stalled              {}", c(&counts.stalls));
    println!("replies to messages    {}", c(&counts.replies));
    println!("  that opened a cursor {}", c(&counts.cursors));
    println!(
        "elapsed                {:.1} s ({:.0} messages/s)",
        elapsed.as_secs_f64(),
        c(&counts.sent) as f64 / elapsed.as_secs_f64()
    );
    println!("RSS start              {rss_start} KiB ({breakdown_start})");
    println!(
        "RSS peak               {} KiB",
        peak.load(Ordering::Relaxed)
    );
    println!("RSS after the run      {rss_after_run} KiB");
    println!("  its cursors killed   {rss_after_kills} KiB");
    println!(
        "RSS at the end         {rss_end} KiB ({:+.1} %)",
        growth * 100.0
    );
    println!("  by kind at the end   {breakdown_end}");
    println!(
        "connections held       {} (router, then each shard)",
        held.join(", ")
    );
    println!("panics logged          {panics}");
    println!("process answers        {alive}");
    let _ = child.kill().await;
    if !alive {
        bail!("the process no longer answers");
    }
    if panics > 0 {
        bail!(
            "{panics} panics logged (see {})",
            args.out.join("server.log").display()
        );
    }
    if c(&counts.stalls) > 0 {
        bail!(
            "{} stalled connections (messages in {})",
            c(&counts.stalls),
            args.out.display()
        );
    }
    if growth > args.rss_tolerance {
        bail!(
            "RSS ended {:.1} % above its start (at most {:.0} %)",
            growth * 100.0,
            args.rss_tolerance * 100.0
        );
    }
    Ok(())
}
