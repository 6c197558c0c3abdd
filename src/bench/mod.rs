//! `sluice bench <scenario>`: benchmarks that write a JSON result, a Markdown table and, where
//! a picture helps, an SVG chart into an output directory (see `docs/benchmarks.md`).
//!
//! The load scenarios (`rounds`, `bulkwrite`, `seed-table`, `overhead`, `security`, `undo`) start what they need from this very
//! binary: embedded shards as separate `sluice shard` processes and a router process, on
//! loopback, stopped afterwards; the load goes through the stock Rust driver. `overload` runs
//! the deterministic simulation of [`crate::backend::sim`]. `failover` runs a replica-set
//! shard, the router and the driver in this process and steps the primary down under load. The micro-benchmarks are criterion
//! benchmarks (`cargo bench --bench micro`). Every scenario has a `--quick` mode, which CI
//! runs to prove that it still works; the figures worth quoting come from the full mode on a
//! release build.

pub mod bulk_rounds;
pub mod failover;
pub mod fleet;
pub mod forward;
pub mod overhead;
pub mod overload;
pub mod report;
pub mod rounds;
pub mod security;
pub mod seed;
pub mod undo;

use std::path::Path;

/// The scenarios `sluice bench` knows.
pub const SCENARIOS: &[&str] = &[
    "rounds",
    "bulkwrite",
    "seed-table",
    "overhead",
    "security",
    "overload",
    "undo",
    "failover",
];

/// Runs one scenario and writes its results into `out`; returns its Markdown table.
pub async fn run(scenario: &str, quick: bool, out: &Path) -> anyhow::Result<String> {
    let report = match scenario {
        "rounds" => rounds::run(quick).await?,
        "bulkwrite" => bulk_rounds::run(quick).await?,
        "seed-table" => seed::run(quick).await?,
        "overhead" => overhead::run(quick).await?,
        "security" => security::run(quick).await?,
        "overload" => overload::report(quick),
        "undo" => undo::run(quick).await?,
        "failover" => failover::run(quick).await?,
        other => anyhow::bail!(
            "unknown benchmark scenario {other:?} (available: {})",
            SCENARIOS.join(", ")
        ),
    };
    report.write(out)
}
