//! `connections`: what an idle client connection costs the router in resident memory. One
//! embedded shard and a router in their own processes; this process opens plain TCP
//! connections to the router and gives each a driver's handshake (`hello` with client
//! metadata and compressors), then leaves them idle, in two equal steps, reading the router's
//! `VmRSS` / `RssAnon` from `/proc/<pid>/status` after each once it has settled. The figure per
//! connection is marginal: the growth of the second step divided by its connections, so that
//! what the first connections cost once (thread arenas, tables sized on first use) cancels
//! out; the first step's figure is given too. A second kind of client sends one 40 KiB insert
//! before it goes idle (a read buffer that grew must not stay with an idle connection); each
//! kind has a router of its own. Then every connection is closed and the router's RSS read
//! again.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use bson::{doc, Document};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::fleet::{Fleet, Latency, Progress, RouterSpec, Sharded};
use super::report::Report;
use crate::value::field::number_field;
use crate::wire::OpMsgBuilder;
use crate::write::plan::Policy;

/// The router's resident memory, in KiB.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rss {
    /// `VmRSS`.
    pub total: u64,
    /// `RssAnon`: heap, stacks and other private memory.
    pub anon: u64,
}

/// Reads `VmRSS` and `RssAnon` of process `pid`.
pub fn rss_of(pid: u32) -> anyhow::Result<Rss> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("{path} has no {name}"))
    };
    Ok(Rss {
        total: field("VmRSS:")?,
        anon: field("RssAnon:")?,
    })
}

/// One OP_MSG command and its reply's body.
async fn command(stream: &mut TcpStream, id: i32, body: &Document) -> anyhow::Result<Document> {
    let bytes = body.to_vec()?;
    let frame = OpMsgBuilder::new(0, &bytes).finish(id, 0);
    stream.write_all(&frame).await?;
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await?;
    let len = i32::from_le_bytes(len);
    let len = usize::try_from(len)
        .ok()
        .filter(|l| (21..=48 * 1024 * 1024).contains(l))
        .ok_or_else(|| anyhow!("reply of {len} bytes"))?;
    let mut rest = vec![0u8; len - 4];
    stream.read_exact(&mut rest).await?;
    // Header (12 more bytes), flag bits (4), section kind 0 (1), then the body.
    let reply = Document::from_reader(&rest[17..])?;
    if number_field(&reply, "ok") != Some(1) {
        bail!("command failed: {reply}");
    }
    Ok(reply)
}

/// A connection with a driver's handshake done; with `write`, one 40 KiB insert after it.
async fn open(addr: SocketAddr, i: usize, write: bool) -> anyhow::Result<TcpStream> {
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let hello = doc! {
        "hello": 1,
        "helloOk": true,
        "client": {
            "driver": {"name": "sluice-bench", "version": env!("CARGO_PKG_VERSION")},
            "os": {"type": std::env::consts::OS, "architecture": std::env::consts::ARCH},
            "application": {"name": format!("idle-{i}")},
        },
        "compression": ["zstd", "snappy", "zlib"],
        "$db": "admin",
    };
    command(&mut s, 1, &hello).await?;
    if write {
        let insert = doc! {
            "insert": "idle",
            "documents": [{"_id": i as i64, "pad": "x".repeat(40 * 1024)}],
            "$db": "bench",
        };
        command(&mut s, 2, &insert).await?;
    }
    Ok(s)
}

/// Opens `n` connections, 64 at a time.
async fn open_many(
    addr: SocketAddr,
    from: usize,
    n: usize,
    write: bool,
) -> anyhow::Result<Vec<TcpStream>> {
    let mut out = Vec::with_capacity(n);
    let mut i = from;
    while i < from + n {
        let batch = (from + n - i).min(64);
        let mut opening = tokio::task::JoinSet::new();
        for j in i..i + batch {
            opening.spawn(open(addr, j, write));
        }
        while let Some(c) = opening.join_next().await {
            out.push(c??);
        }
        i += batch;
    }
    Ok(out)
}

/// Waits until the router's RSS has not moved for a second (at most 10 s), then reads it.
async fn settled(pid: u32) -> anyhow::Result<Rss> {
    let mut last = rss_of(pid)?;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = rss_of(pid)?;
        if now.total == last.total {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}

/// One kind of client: RSS before, after each step and after closing.
struct Row {
    label: &'static str,
    step: usize,
    before: Rss,
    first: Rss,
    second: Rss,
    closed: Rss,
}

impl Row {
    fn first_per_conn(&self) -> f64 {
        (self.first.total as f64 - self.before.total as f64) / self.step as f64
    }

    fn marginal_per_conn(&self) -> f64 {
        (self.second.total as f64 - self.first.total as f64) / self.step as f64
    }

    fn marginal_anon_per_conn(&self) -> f64 {
        (self.second.anon as f64 - self.first.anon as f64) / self.step as f64
    }
}

/// Runs the scenario.
pub async fn run(quick: bool) -> anyhow::Result<Report> {
    let step = if quick { 100 } else { 1000 };
    let kinds = [
        ("handshake only", false),
        ("one 40 KiB insert, then idle", true),
    ];
    let mut progress = Progress::new("connections", kinds.len() * 3);
    let spec = RouterSpec::new(
        Policy::RetrySafe,
        vec![Sharded {
            ns: "bench.idle".into(),
            chunks: None,
        }],
    );
    let mut rows = Vec::new();
    for (label, write) in kinds {
        // A router of its own for each kind, so that neither reuses what the other freed.
        let fleet = Fleet::start(&[Latency::default()], &spec).await?;
        let pid = fleet
            .router
            .pid()
            .ok_or_else(|| anyhow!("the router process has no pid"))?;
        let addr = fleet.router.addr;
        let before = settled(pid).await?;
        let mut conns = open_many(addr, 0, step, write).await?;
        let first = settled(pid).await?;
        progress.step(label);
        conns.extend(open_many(addr, step, step, write).await?);
        let second = settled(pid).await?;
        progress.step(label);
        drop(conns);
        let closed = settled(pid).await?;
        progress.step(label);
        rows.push(Row {
            label,
            step,
            before,
            first,
            second,
            closed,
        });
        fleet.stop().await?;
    }
    progress.finish();
    Ok(report(&rows))
}

fn report(rows: &[Row]) -> Report {
    let mut md = String::from(
        "Router resident memory (KiB) with idle client connections: each connection made a driver's handshake (and, in the second row, one 40 KiB insert) and then stayed open and idle. Per connection: the growth of the second step of connections divided by its size (marginal), and of the first step (which also pays one-time growth).\n\n| client | connections per step | RSS before | after step 1 | after step 2 | after closing | KiB per connection, marginal (anon) | KiB per connection, step 1 |\n|---|---|---|---|---|---|---|---|\n",
    );
    let mut json = Vec::new();
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {:.1} ({:.1}) | {:.1} |",
            r.label,
            r.step,
            r.before.total,
            r.first.total,
            r.second.total,
            r.closed.total,
            r.marginal_per_conn(),
            r.marginal_anon_per_conn(),
            r.first_per_conn()
        );
        json.push(serde_json::json!({
            "client": r.label,
            "connections_per_step": r.step,
            "rss_kib": {
                "before": r.before.total,
                "after_step_1": r.first.total,
                "after_step_2": r.second.total,
                "after_closing": r.closed.total,
            },
            "anon_kib": {
                "before": r.before.anon,
                "after_step_1": r.first.anon,
                "after_step_2": r.second.anon,
                "after_closing": r.closed.anon,
            },
            "kib_per_connection_marginal": r.marginal_per_conn(),
            "anon_kib_per_connection_marginal": r.marginal_anon_per_conn(),
            "kib_per_connection_step_1": r.first_per_conn(),
        }));
    }
    Report {
        name: "connections",
        json: serde_json::json!({ "rows": json }),
        markdown: md,
        charts: Vec::new(),
    }
}
