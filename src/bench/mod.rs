//! `sluice bench <scenario>`: benchmarks that write a JSON result, a Markdown table and, where
//! a picture helps, an SVG chart into an output directory (see `docs/benchmarks.md`).
//!
//! The load scenarios (`rounds`, `bulkwrite`, `seed-table`, `overhead`, `security`, `undo`,
//! `connections`) start what they need from this very
//! binary: embedded shards as separate `sluice shard` processes and a router process, on
//! loopback, stopped afterwards; the load goes through the stock Rust driver. `overload` runs
//! the deterministic simulation of [`crate::backend::sim`]. `failover` runs a replica-set
//! shard, the router and the driver in this process and steps the primary down under load.
//! `migration` moves chunks between the cluster layout's shard processes under load. The micro-benchmarks are criterion
//! benchmarks (`cargo bench --bench micro`). Every scenario has a `--quick` mode, which CI
//! runs to prove that it still works; the figures worth quoting come from the full mode on a
//! release build.

pub mod bulk_rounds;
pub mod connections;
pub mod failover;
pub mod fleet;
pub mod forward;
pub mod migration;
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
    "migration",
    "connections",
];

/// The scenarios that run on the cluster layout whatever `--layout` says (a static router has
/// no chunk migrations).
pub const CLUSTER_SCENARIOS: &[&str] = &["migration"];

/// The scenarios that run on either [`fleet::Layout`] (the others on the static one only).
pub const LAYOUT_SCENARIOS: &[&str] = &["rounds", "seed-table"];

/// Runs one scenario on fleets of `layout` and writes its results into `out` (the cluster
/// layout's under `<scenario>-cluster.*`); returns its Markdown table.
pub async fn run(
    scenario: &str,
    quick: bool,
    layout: fleet::Layout,
    out: &Path,
) -> anyhow::Result<String> {
    if layout != fleet::Layout::Static
        && SCENARIOS.contains(&scenario)
        && !LAYOUT_SCENARIOS.contains(&scenario)
        && !CLUSTER_SCENARIOS.contains(&scenario)
    {
        anyhow::bail!(
            "--layout {} is for {} only; {scenario} runs on the static layout",
            layout.name(),
            LAYOUT_SCENARIOS.join(" and ")
        );
    }
    let report = match scenario {
        "rounds" => rounds::run(quick, layout).await?,
        "bulkwrite" => bulk_rounds::run(quick).await?,
        "seed-table" => seed::run(quick, layout).await?,
        "overhead" => overhead::run(quick).await?,
        "security" => security::run(quick).await?,
        "overload" => overload::report(quick),
        "undo" => undo::run(quick).await?,
        "failover" => failover::run(quick).await?,
        "migration" => migration::run(quick).await?,
        "connections" => connections::run(quick).await?,
        other => anyhow::bail!(
            "unknown benchmark scenario {other:?} (available: {})",
            SCENARIOS.join(", ")
        ),
    };
    report.write(out)
}
