//! Micro-benchmarks (criterion): `hash64`, OP_MSG decode and encode of a 1,000-document insert,
//! and targeting plus planning of a 1,000-statement ordered bulk.
//!
//! `cargo bench --bench micro` measures and then writes `micro.json` and `micro.md` into
//! `$SLUICE_BENCH_OUT` (default `bench-results/`) from criterion's estimates;
//! `cargo test --bench micro` runs every benchmark once as a test (what CI does).

use std::path::{Path, PathBuf};

use bson::{doc, rawdoc, Bson, Document, RawDocumentBuf};
use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput};
use sluice::routing::shard_key::ShardKeyPattern;
use sluice::routing::{hash64, RoutingSnapshot};
use sluice::wire::{OpMsg, OpMsgBuilder};
use sluice::write::plan::{plan, Policy};
use sluice::write::target::{target_insert, target_update};

const N: usize = 1000;

fn snapshot(shards: usize) -> RoutingSnapshot {
    let pattern = ShardKeyPattern::parse(&doc! {"_id": "hashed"}).expect("pattern");
    RoutingSnapshot::initial("demo.store_inventory", pattern, shards).expect("snapshot")
}

fn documents() -> Vec<RawDocumentBuf> {
    (0..N as i64)
        .map(|i| rawdoc! {"_id": {"productId": i, "storeId": 7}, "stock": i, "price": 100, "name": "widget"})
        .collect()
}

/// The OP_MSG a driver sends for `insert_many` of the documents (kind-1 section).
fn insert_message(docs: &[RawDocumentBuf]) -> Bytes {
    let body = rawdoc! {"insert": "store_inventory", "ordered": true, "$db": "demo"};
    let mut b = OpMsgBuilder::new(0, body.as_bytes());
    b.begin_sequence("documents");
    for d in docs {
        b.push_document(d.as_bytes());
    }
    b.finish(1, 0)
}

fn benches(c: &mut Criterion) {
    let values: Vec<Bson> = (0..N as i32).map(Bson::Int32).collect();
    let mut g = c.benchmark_group("hash64");
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("1000 int32", |b| {
        b.iter(|| values.iter().map(hash64).fold(0i64, |a, h| a ^ h))
    });
    let strings: Vec<Bson> = (0..N)
        .map(|i| Bson::String(format!("sku-{i:08}")))
        .collect();
    g.bench_function("1000 strings", |b| {
        b.iter(|| strings.iter().map(hash64).fold(0i64, |a, h| a ^ h))
    });
    g.finish();

    let docs = documents();
    let frame = insert_message(&docs);
    let mut g = c.benchmark_group("op_msg");
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("decode 1000-doc insert", |b| {
        b.iter(|| {
            let m = OpMsg::decode(&frame).expect("decode");
            m.sequence("documents").map(|s| s.documents.len())
        })
    });
    g.bench_function("encode 1000-doc insert", |b| {
        b.iter(|| insert_message(&docs).len())
    });
    g.finish();

    let mut g = c.benchmark_group("plan");
    g.throughput(Throughput::Elements(N as u64));
    for shards in [2usize, 5, 8] {
        let snap = snapshot(shards);
        g.bench_with_input(
            BenchmarkId::new("target+plan 1000 inserts", shards),
            &snap,
            |b, snap| {
                b.iter(|| {
                    let t: Vec<_> = docs.iter().map(|d| target_insert(snap, d, true)).collect();
                    let indexed: Vec<_> = t.iter().enumerate().collect();
                    plan(&indexed, true, Policy::RetrySafe, true).send_rounds()
                })
            },
        );
        let updates: Vec<Document> = (0..N as i64)
            .map(|i| doc! {"q": {"_id": {"productId": i, "storeId": 7}}, "u": {"$set": {"stock": i}}, "upsert": true})
            .collect();
        g.bench_with_input(
            BenchmarkId::new("target+plan 1000 upserts", shards),
            &snap,
            |b, snap| {
                b.iter(|| {
                    let t: Vec<_> = updates.iter().map(|u| target_update(snap, u)).collect();
                    let indexed: Vec<_> = t.iter().enumerate().collect();
                    plan(&indexed, true, Policy::RetrySafe, true).send_rounds()
                })
            },
        );
    }
    g.finish();
}

/// Criterion's estimate (ns per iteration) of every benchmark it saved under `dir`.
fn estimates(dir: &Path) -> Vec<(String, f64, f64, f64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.ends_with("new/estimates.json") {
                let (Ok(text), Some(parent)) = (std::fs::read_to_string(&p), p.parent()) else {
                    continue;
                };
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
                    continue;
                };
                let bench = std::fs::read_to_string(parent.join("benchmark.json"))
                    .ok()
                    .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                    .and_then(|b| b["full_id"].as_str().map(String::from))
                    .unwrap_or_else(|| parent.display().to_string());
                let mean = v["mean"]["point_estimate"].as_f64().unwrap_or(f64::NAN);
                let lo = v["mean"]["confidence_interval"]["lower_bound"]
                    .as_f64()
                    .unwrap_or(f64::NAN);
                let hi = v["mean"]["confidence_interval"]["upper_bound"]
                    .as_f64()
                    .unwrap_or(f64::NAN);
                out.push((bench, mean, lo, hi));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn write_summary(criterion_dir: &Path, out: &Path) -> std::io::Result<()> {
    let rows = estimates(criterion_dir);
    if rows.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(out)?;
    let mut md = String::from(
        "Criterion, release build; mean time per iteration (95 % confidence interval) and per element (1,000 elements per iteration).\n\n| benchmark | per iteration | per element |\n|---|---|---|\n",
    );
    for (name, mean, lo, hi) in &rows {
        md.push_str(&format!(
            "| {name} | {:.1} µs ({:.1}–{:.1}) | {:.0} ns |\n",
            mean / 1000.0,
            lo / 1000.0,
            hi / 1000.0,
            mean / N as f64
        ));
    }
    let json = serde_json::json!({
        "scenario": "micro",
        "elements_per_iteration": N,
        "rows": rows.iter().map(|(name, mean, lo, hi)| serde_json::json!({
            "benchmark": name, "mean_ns": mean, "ci95_ns": [lo, hi], "per_element_ns": mean / N as f64,
        })).collect::<Vec<_>>(),
    });
    std::fs::write(out.join("micro.md"), &md)?;
    std::fs::write(
        out.join("micro.json"),
        serde_json::to_string_pretty(&json).unwrap_or_default(),
    )?;
    println!("{md}");
    Ok(())
}

fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
    if measuring {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("target"));
        let out = std::env::var_os("SLUICE_BENCH_OUT")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("bench-results"));
        if let Err(e) = write_summary(&target.join("criterion"), &out) {
            eprintln!(
                "cannot write the micro-benchmark summary into {}: {e}",
                out.display()
            );
            std::process::exit(1);
        }
    }
}
