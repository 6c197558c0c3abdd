//! Every `sluice bench` scenario runs in its quick mode, as a user would start it, and writes
//! results that say what the scenario is about. These check behaviour (child batches counted,
//! files written, every figure present), never timings: benchmarks report, tests check.

use std::path::{Path, PathBuf};
use std::process::Command;

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-bench-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Runs `sluice bench <scenario> --quick` and returns its JSON result.
fn run(scenario: &str) -> (PathBuf, serde_json::Value) {
    run_in(scenario, "static")
}

/// Runs `sluice bench <scenario> --quick --layout <layout>` and returns its JSON result (the
/// cluster layout's files are `<scenario>-cluster.*`).
fn run_in(scenario: &str, layout: &str) -> (PathBuf, serde_json::Value) {
    let out = out_dir(&format!("{scenario}-{layout}"));
    let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", scenario, "--quick", "--layout", layout, "--out"])
        .arg(&out)
        .status()
        .expect("sluice bench starts");
    assert!(
        status.success(),
        "sluice bench {scenario} --quick --layout {layout} failed: {status}"
    );
    let stem = match layout {
        "static" => scenario.to_string(),
        other => format!("{scenario}-{other}"),
    };
    let text = std::fs::read_to_string(out.join(format!("{stem}.json")))
        .expect("the scenario writes its JSON");
    let md = std::fs::read_to_string(out.join(format!("{stem}.md")))
        .expect("the scenario writes its Markdown");
    assert!(md.contains("|---"), "{stem}.md holds a table");
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    // Only the scenarios that take `--layout` name it; the others run the static layout.
    if layout != "static" || !v["layout"].is_null() {
        assert_eq!(
            v["layout"].as_str(),
            Some(layout),
            "{stem}.json names its layout"
        );
    }
    (out, v)
}

fn samples(v: &serde_json::Value) -> Vec<f64> {
    v["samples"]
        .as_array()
        .expect("samples")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

fn svg(dir: &Path, file: &str) {
    let s = std::fs::read_to_string(dir.join(file)).expect("chart written");
    assert!(
        s.starts_with("<svg") && s.contains("</svg>"),
        "{file} is an SVG"
    );
}

#[test]
fn rounds_counts_child_batches_on_the_shards() {
    let (dir, v) = run("rounds");
    check_rounds(&v);
    svg(&dir, "rounds.svg");
}

/// The same on the cluster layout: a config server, shard servers and a `--configdb` router,
/// the collections sharded through the router (a skewed `numInitialChunks` must come out
/// skewed, as in the static layout).
#[test]
fn rounds_counts_child_batches_on_the_cluster_layout() {
    let (dir, v) = run_in("rounds", "cluster");
    check_rounds(&v);
    svg(&dir, "rounds-cluster.svg");
}

fn check_rounds(v: &serde_json::Value) {
    let rows = v["rows"].as_array().expect("rows");
    assert!(rows.len() >= 3);
    assert!(
        rows.iter().any(|r| !r["num_initial_chunks"].is_null()),
        "a skewed placement is measured"
    );
    let n = v["n"].as_f64().expect("n");
    for r in rows {
        let shards = r["shards"].as_f64().expect("shards");
        let shares: f64 = r["shares"]
            .as_array()
            .expect("shares")
            .iter()
            .map(|p| p.as_f64().expect("share"))
            .sum();
        assert!((shares - 1.0).abs() < 1e-6, "shares cover the hash space");
        for x in samples(&r["rewrite"])
            .into_iter()
            .chain(samples(&r["unordered"]))
        {
            assert_eq!(x, shards, "one child batch per shard: {r}");
        }
        for x in samples(&r["mongos_rounds"]) {
            assert!(
                x > shards && x <= n,
                "mongos rounds send many child batches: {r}"
            );
        }
        let formula = r["formula"].as_f64().expect("formula");
        assert!(formula > 1.0 && formula < n);
        let shares: Vec<f64> = r["shares"]
            .as_array()
            .expect("shares")
            .iter()
            .map(|p| p.as_f64().expect("share"))
            .collect();
        assert_eq!(shares.len() as f64, shards, "one share per shard: {r}");
        let (lo, hi) = shares
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), p| (lo.min(*p), hi.max(*p)));
        if r["num_initial_chunks"].is_null() {
            assert!(hi - lo < 1e-6, "a uniform placement: {r}");
        } else {
            assert!(hi - lo > 0.1, "a skewed placement: {r}");
        }
    }
}

#[test]
fn bulkwrite_counts_child_bulk_write_commands_on_the_shards() {
    let (_, v) = run("bulkwrite");
    let shards = v["shards"].as_f64().expect("shards");
    let n = v["n"].as_f64().expect("n");
    assert_eq!(v["namespaces"].as_f64(), Some(2.0));
    for x in samples(&v["rewrite"]) {
        assert_eq!(x, shards, "one child bulkWrite per shard: {v}");
    }
    for x in samples(&v["mongos_rounds"]) {
        assert!(x > shards && x <= n, "mongos rounds send many: {v}");
    }
}

#[test]
fn seed_table_times_every_plan_beside_the_limit() {
    let (dir, v) = run("seed-table");
    check_seed_table(&v);
    svg(&dir, "seed-table.svg");
}

#[test]
fn seed_table_times_every_plan_on_the_cluster_layout() {
    let (dir, v) = run_in("seed-table", "cluster");
    check_seed_table(&v);
    svg(&dir, "seed-table-cluster.svg");
}

/// The other scenarios run on the static layout only, and say so instead of ignoring the flag.
#[test]
fn the_cluster_layout_is_refused_where_it_is_not_measured() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "bench",
            "bulkwrite",
            "--quick",
            "--layout",
            "cluster",
            "--out",
        ])
        .arg(out_dir("bulkwrite-refused"))
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--layout cluster is for rounds and seed-table only"),
        "{err}"
    );
}

fn check_seed_table(v: &serde_json::Value) {
    let variants = v["variants"].as_array().expect("variants");
    assert_eq!(variants.len(), 2);
    for var in variants {
        for k in [
            "mongos_rounds_ms",
            "rewrite_ms",
            "unordered_ms",
            "limit_model_ms",
            "limit_measured_ms",
            "direct_all_ms",
        ] {
            let xs = samples(&var[k]);
            assert!(!xs.is_empty() && xs.iter().all(|x| *x > 0.0), "{k}: {var}");
        }
        assert!(var["bulks_in_flight"]["rewrite"].as_f64().expect("L") > 0.0);
        assert!(var["round_trip_ms"]["shard0"].as_f64().expect("rt") > 0.0);
    }
}

#[test]
fn overhead_compares_direct_forwarded_and_routed_and_counts_instructions() {
    let (_, v) = run("overhead");
    let lanes = v["lanes"].as_array().expect("lanes");
    // insert_one and find_one at 8 and 64 clients, at least unpinned.
    assert!(lanes.len() >= 4, "{lanes:?}");
    for cell in lanes {
        for side in ["direct", "forwarder", "routed"] {
            let runs = cell[side].as_array().expect("runs");
            assert!(!runs.is_empty(), "{cell}");
            for r in runs {
                assert!(r["ops_per_s"].as_f64().expect("ops") > 0.0);
            }
        }
        assert!(
            cell["router_vs_forwarder_throughput"]["median"]
                .as_f64()
                .expect("ratio")
                > 0.0
        );
        assert!(cell["added_p50_us_over_forwarder"]["median"].is_number());
    }
    for op in ["insert_one", "find_one by _id"] {
        for clients in [8, 64] {
            assert!(
                lanes
                    .iter()
                    .any(|c| c["operation"] == op && c["clients"] == clients),
                "no {op} × {clients} lane"
            );
        }
    }
    for op in ["insert_one", "find_one"] {
        for side in ["direct", "routed"] {
            let runs = v[op][side].as_array().expect("runs");
            assert!(!runs.is_empty());
            for r in runs {
                assert!(r["ops_per_s"].as_f64().expect("ops") > 0.0);
                assert!(r["p99_ms"].as_f64().expect("p99") >= r["p50_ms"].as_f64().expect("p50"));
            }
        }
        assert!(v[op]["throughput_ratio"]["median"].as_f64().expect("ratio") > 0.0);
    }
    let counts = v["instructions"].as_array().expect("instructions");
    assert_eq!(counts.len(), 6, "four router workloads, two forwarder ones");
    // The forwarder's count is the floor the router's is read against: it parses nothing, so
    // it must count fewer instructions per operation than the router.
    for op in ["insert_one", "find_one by _id"] {
        let per = |process: &str| {
            counts
                .iter()
                .find(|c| c["process"] == process && c["workload"] == op)
                .and_then(|c| c["per_document"].as_f64())
                .unwrap_or_else(|| panic!("no {process} count for {op}: {counts:?}"))
        };
        assert!(
            per("forwarder") > 0.0 && per("forwarder") < per("router"),
            "{op}"
        );
    }
    for c in counts {
        let totals: Vec<u64> = c["totals"]
            .as_array()
            .expect("totals")
            .iter()
            .map(|t| t.as_u64().expect("total"))
            .collect();
        assert!(
            totals[1] > totals[0] && totals[0] > 100_000,
            "callgrind counted the process: {c}"
        );
        assert!(c["per_document"].as_f64().expect("per doc") > 0.0);
    }
}

#[test]
fn shard_queue_counts_the_shards_inserts_against_the_documents() {
    let (_dir, v) = run("shard-queue");
    let lanes = |k: &str| v[k].as_array().expect("lanes").clone();
    let (saturated, idle) = (lanes("saturated"), lanes("idle"));
    assert_eq!(
        saturated.len(),
        4,
        "retryWrites on and off, coalescing off and on"
    );
    assert_eq!(idle.len(), 2, "one client, coalescing off and on");
    for l in saturated.iter().chain(&idle) {
        let docs = l["documents"].as_i64().expect("documents");
        let commands = l["shard_insert_commands"].as_i64().expect("commands");
        assert!(
            docs > 0 && l["inserts_per_s"].as_f64().expect("rate") > 0.0,
            "{l}"
        );
        assert!(
            l["p50_ms"].as_f64().is_some() && l["p99_ms"].as_f64().is_some(),
            "{l}"
        );
        let merges = l["retry_writes"] == false && l["max_wait_us"].as_u64() > Some(0);
        if merges {
            assert!(commands <= docs, "{l}");
        } else {
            // Retryable writes are never merged; `max_wait_us = 0` merges nothing.
            assert_eq!(commands, docs, "{l}");
        }
    }
}

#[test]
fn overload_compares_the_limits() {
    let (dir, v) = run("overload");
    assert_eq!(v["rows"].as_array().expect("rows").len(), 4);
    svg(&dir, "overload.svg");
}

#[test]
fn undo_counts_the_compensation_and_nothing_without_an_error() {
    let (_dir, v) = run("undo");
    let cells = v["cells"].as_array().expect("cells");
    assert_eq!(cells.len(), 8, "4 cases under 2 plans");
    let n = v["n"].as_f64().expect("n");
    for c in cells {
        let extra = samples(&c["extra_commands"]);
        let undone = samples(&c["undone"]);
        let rewrite = c["policy"] == "proven rewrite";
        match c["error_at"].as_f64() {
            // Without an error, or with nothing after it, the router sends nothing more.
            None => assert!(extra.iter().chain(&undone).all(|x| *x == 0.0), "{c}"),
            Some(k) if k + 1.0 == n => {
                assert!(extra.iter().chain(&undone).all(|x| *x == 0.0), "{c}")
            }
            // An error early in a rewritten bulk: the other shards' later inserts are undone
            // with one delete per shard that applied any (the failing shard stopped at k).
            Some(_) if rewrite => {
                assert!(undone.iter().all(|x| *x > 0.0), "{c}");
                assert!(extra.iter().all(|x| *x >= 1.0 && *x <= 2.0), "{c}");
            }
            // mongos rounds stop at the error: nothing to undo.
            Some(_) => assert!(extra.iter().chain(&undone).all(|x| *x == 0.0), "{c}"),
        }
        assert!(c["vs_no_error"].as_f64().expect("ratio") > 0.0, "{c}");
    }
}

#[test]
fn an_unknown_scenario_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "nosuch", "--out"])
        .arg(out_dir("nosuch"))
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown benchmark scenario"));
}

#[test]
fn failover_measures_every_step_down_and_retryable_writes_see_no_error() {
    let (_dir, v) = run("failover");
    let modes = v["modes"].as_array().expect("modes");
    assert_eq!(modes.len(), 2, "{v}");
    for m in modes {
        let recovery = samples(&m["recovery_ms"]);
        let errors = samples(&m["errors_per_step_down"]);
        assert_eq!(recovery.len(), 5, "{m}");
        assert_eq!(errors.len(), 5, "{m}");
        assert!(recovery.iter().all(|x| *x > 0.0), "{m}");
        if m["retryable_writes"].as_bool() == Some(true) {
            assert!(
                errors.iter().all(|x| *x == 0.0),
                "retryable writes: no error {m}"
            );
        }
    }
}

#[test]
fn security_counts_what_scram_and_tls_add_per_write_and_per_new_client() {
    let (_, v) = run("security");
    let counts = v["counts"].as_array().expect("counts");
    let modes = [
        "plain",
        "SCRAM-SHA-256, authorization on",
        "TLS",
        "TLS + SCRAM-SHA-256",
    ];
    for mode in modes {
        for workload in ["insert_one", "new client + ping"] {
            let c = counts
                .iter()
                .find(|c| c["mode"] == mode && c["workload"] == workload)
                .unwrap_or_else(|| panic!("no {workload} count under {mode}"));
            assert!(c["per_operation"].as_f64().expect("per op") > 0.0, "{c}");
            assert!(c["added_over_plain"].is_number(), "{c}");
            if workload == "new client + ping" {
                // Every new client opens at least its monitor and one pooled connection.
                let conns = c["connections_per_operation"]
                    .as_f64()
                    .expect("connections");
                assert!(conns >= 1.0, "{c}");
            }
        }
    }
}

/// `migration` runs on the cluster layout whatever `--layout` says: a chunk moved under
/// retryable single writes through the router costs the client no error, every acknowledged
/// document is on the shards exactly once and on the shard owning its chunk, and every figure
/// the closing note quotes (refreshes, moveChunk time, latency windows) is there.
#[test]
fn migration_moves_chunks_under_writes_without_errors_or_lost_documents() {
    let out = out_dir("migration");
    let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "migration", "--quick", "--out"])
        .arg(&out)
        .status()
        .expect("sluice bench starts");
    assert!(
        status.success(),
        "sluice bench migration --quick failed: {status}"
    );
    let md = std::fs::read_to_string(out.join("migration.md")).expect("migration.md written");
    assert!(md.contains("|---"), "migration.md holds a table");
    let text = std::fs::read_to_string(out.join("migration.json")).expect("migration.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(v["layout"].as_str(), Some("cluster"), "{v}");
    assert_eq!(v["shards"].as_u64(), Some(2), "{v}");
    let migrations = v["migrations"].as_array().expect("migrations");
    assert_eq!(migrations.len(), 2, "{v}");
    for m in migrations {
        assert_ne!(m["from"], m["to"], "{m}");
        assert!(m["move_ms"].as_f64().expect("move_ms") > 0.0, "{m}");
        assert!(m["documents"].is_u64(), "{m}");
        let before = m["refreshes_before"].as_u64().expect("refreshes_before");
        let after = m["refreshes_after"].as_u64().expect("refreshes_after");
        // The router's routing is loaded before anything is moved, and the writes after a
        // migration find it stale at least once.
        assert!(before >= 1, "{m}");
        assert!(
            after > before,
            "the router refreshed after the migration: {m}"
        );
        assert_eq!(m["refreshes"].as_u64(), Some(after - before), "{m}");
        for w in ["before", "during", "after"] {
            for f in ["ops", "p50_ms", "p99_ms", "max_ms"] {
                assert!(m[w][f].is_number(), "{w}.{f} in {m}");
            }
        }
        assert!(
            m["before"]["ops"].as_u64().expect("ops") > 0,
            "writes before: {m}"
        );
        assert!(
            m["after"]["ops"].as_u64().expect("ops") > 0,
            "writes after: {m}"
        );
    }
    // Both directions: each shard gave a chunk.
    assert_ne!(migrations[0]["from"], migrations[1]["from"], "{v}");
    for f in ["move_ms", "refreshes"] {
        assert!(v["summary"][f]["median"].is_number(), "summary.{f}: {v}");
    }
    for w in ["before", "during", "after"] {
        assert!(
            v["summary"]["latency"][w]["p99_ms"]["max"].is_number(),
            "{v}"
        );
    }
    assert_eq!(
        v["client_errors"].as_u64(),
        Some(0),
        "retryable writes: no error {v}"
    );
    let docs = &v["documents"];
    let acknowledged = docs["acknowledged"].as_u64().expect("acknowledged");
    assert!(acknowledged > 0, "{v}");
    assert_eq!(v["operations"].as_u64(), Some(acknowledged), "{v}");
    assert_eq!(docs["lost"].as_u64(), Some(0), "{v}");
    assert_eq!(docs["duplicated"].as_u64(), Some(0), "{v}");
    assert_eq!(docs["misplaced"].as_u64(), Some(0), "{v}");
    assert_eq!(docs["present"].as_u64(), Some(acknowledged), "{v}");
    let per_shard: Vec<u64> = docs["per_shard"]
        .as_array()
        .expect("per_shard")
        .iter()
        .map(|n| n.as_u64().expect("count"))
        .collect();
    assert_eq!(per_shard.len(), 2, "{v}");
    assert_eq!(per_shard.iter().sum::<u64>(), acknowledged, "{v}");
}

#[test]
fn connections_reads_the_routers_memory_at_every_step() {
    let (_dir, v) = run("connections");
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2, "handshake only, and an insert before idling");
    for r in rows {
        let rss = &r["rss_kib"];
        for step in ["before", "after_step_1", "after_step_2", "after_closing"] {
            assert!(rss[step].as_f64().expect(step) > 0.0, "{r}");
        }
        // Connections held open cost something; the figure is a finite number either way.
        assert!(
            r["kib_per_connection_marginal"]
                .as_f64()
                .expect("marginal")
                .is_finite(),
            "{r}"
        );
    }
}
