//! `_configsvrRemoveShard` on the embedded config server, what mongos's `removeShard` sends:
//! the first call marks the shard `draining` in `config.shards` and answers `started`; while
//! the shard still owns chunks or is the primary shard of a database, calls answer `ongoing`
//! with the `remaining` counts; once it owns neither, the call removes it from `config.shards`
//! and answers `completed`. Chunks are moved off a draining shard by this config server (what
//! MongoDB's balancer does for a draining shard), one migration at a time, to the shard that
//! owns the fewest chunks; databases whose primary it is are listed under `dbsToMove` for the
//! user to drop or move, as MongoDB's config server lists them. docs/design/config-server.md.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Bson, Document};

use crate::engine::EngineError;
use crate::sync::lock;
use crate::value::error_codes::ErrorCode;

use super::configsvr::string_field;
use super::migration::Migrations;
use super::store::Catalog;

/// Failed migrations in a row after which a drain stops (the next `removeShard` call starts
/// it again).
const MAX_FAILURES: usize = 20;

/// The shards being drained by a running task.
#[derive(Debug, Default)]
pub struct Drains {
    running: Mutex<HashSet<String>>,
}

fn docs(catalog: &Catalog, coll: &str) -> Vec<Document> {
    catalog
        .collection("config", coll)
        .map(|c| c.iter().map(|(_, d)| d.clone()).collect())
        .unwrap_or_default()
}

fn is_draining(shard: &Document) -> bool {
    shard
        .get("draining")
        .is_some_and(crate::value::field::truthy)
}

/// What is left on `id`: chunks, jumbo chunks, and the databases it is primary of.
fn remaining(catalog: &Catalog, id: &str) -> (i64, i64, Vec<String>) {
    let chunks: Vec<Document> = docs(catalog, "chunks")
        .into_iter()
        .filter(|c| c.get_str("shard").ok() == Some(id))
        .collect();
    let jumbo = chunks
        .iter()
        .filter(|c| c.get("jumbo").is_some_and(crate::value::field::truthy))
        .count();
    let mut dbs: Vec<String> = docs(catalog, "databases")
        .into_iter()
        .filter(|d| d.get_str("primary").ok() == Some(id))
        .filter_map(|d| d.get_str("_id").ok().map(str::to_string))
        .filter(|d| d != "local")
        .collect();
    dbs.sort();
    (chunks.len() as i64, jumbo as i64, dbs)
}

/// `_configsvrRemoveShard: <shard id or host>`.
pub fn remove_shard(
    catalog: &Arc<Mutex<Catalog>>,
    migrations: &Arc<Migrations>,
    drains: &Arc<Drains>,
    body: &Document,
) -> Result<Document, EngineError> {
    const CMD: &str = "_configsvrRemoveShard";
    let target = string_field(body, CMD, CMD)?.to_string();
    let mut guard = lock(catalog);
    let shards = docs(&guard, "shards");
    let Some(shard) = shards.iter().find(|s| {
        s.get_str("_id").ok() == Some(target.as_str())
            || s.get_str("host").ok() == Some(target.as_str())
    }) else {
        return Err(EngineError::new(
            ErrorCode::ShardNotFound,
            format!("Shard {target} not found"),
        ));
    };
    let id = shard.get_str("_id").unwrap_or_default().to_string();
    if shards.len() <= 1 {
        return Err(EngineError::new(
            ErrorCode::IllegalOperation,
            "Operation not allowed because it would remove the last shard",
        ));
    }
    let (chunks, jumbo, dbs) = remaining(&guard, &id);
    let dbs_to_move: Vec<Bson> = dbs.iter().map(|d| Bson::String(d.clone())).collect();
    let note = "you need to drop or movePrimary these databases";
    if !is_draining(shard) {
        if shards
            .iter()
            .filter(|s| s.get_str("_id").ok() != Some(id.as_str()))
            .all(is_draining)
        {
            return Err(EngineError::new(
                ErrorCode::IllegalOperation,
                "Operation not allowed because it would remove the last shard that is not draining",
            ));
        }
        set_draining(&mut guard, &id)?;
        drop(guard);
        start_drain(catalog, migrations, drains, &id);
        return Ok(doc! {
            "msg": "draining started successfully",
            "state": "started",
            "shard": &id,
            "note": note,
            "dbsToMove": dbs_to_move,
        });
    }
    if chunks > 0 || !dbs.is_empty() {
        drop(guard);
        if chunks > 0 {
            start_drain(catalog, migrations, drains, &id);
        }
        return Ok(doc! {
            "msg": "draining ongoing",
            "state": "ongoing",
            "remaining": {"chunks": chunks, "dbs": dbs.len() as i64, "jumboChunks": jumbo},
            "note": note,
            "dbsToMove": dbs_to_move,
        });
    }
    if let Some(c) = guard.existing_mut("config", "shards") {
        let rids: Vec<_> = c
            .iter()
            .filter(|(_, d)| d.get_str("_id").ok() == Some(id.as_str()))
            .map(|(rid, _)| *rid)
            .collect();
        for rid in rids {
            c.remove(rid);
        }
    }
    Ok(doc! {
        "msg": "removeshard completed successfully",
        "state": "completed",
        "shard": &id,
    })
}

fn set_draining(catalog: &mut Catalog, id: &str) -> Result<(), EngineError> {
    let Some(c) = catalog.existing_mut("config", "shards") else {
        return Ok(());
    };
    let found: Vec<_> = c
        .iter()
        .filter(|(_, d)| d.get_str("_id").ok() == Some(id))
        .map(|(rid, d)| (*rid, d.clone()))
        .collect();
    for (rid, mut d) in found {
        d.insert("draining", true);
        c.replace("config.shards", rid, d)?;
    }
    Ok(())
}

/// The next chunk to move off `id` and where to: the shard (not draining) owning the fewest
/// chunks, ties by id. `None` when `id` owns no chunk, is no longer draining, or there is no
/// shard to move to.
fn next_move(catalog: &Catalog, id: &str) -> Option<Document> {
    let shards = docs(catalog, "shards");
    let me = shards.iter().find(|s| s.get_str("_id").ok() == Some(id))?;
    if !is_draining(me) {
        return None;
    }
    let chunks = docs(catalog, "chunks");
    let chunk = chunks.iter().find(|c| {
        c.get_str("shard").ok() == Some(id)
            && !c.get("jumbo").is_some_and(crate::value::field::truthy)
    })?;
    let load = |s: &str| {
        chunks
            .iter()
            .filter(|c| c.get_str("shard").ok() == Some(s))
            .count()
    };
    let mut targets: Vec<&str> = shards
        .iter()
        .filter(|s| !is_draining(s))
        .filter_map(|s| s.get_str("_id").ok())
        .collect();
    targets.sort_unstable();
    let to = targets.into_iter().min_by_key(|s| load(s))?;
    let uuid = chunk.get("uuid")?;
    let ns = docs(catalog, "collections")
        .into_iter()
        .find(|c| c.get("uuid") == Some(uuid))?
        .get_str("_id")
        .ok()?
        .to_string();
    Some(doc! {
        "_configsvrMoveRange": ns,
        "toShard": to,
        "min": chunk.get("min").cloned().unwrap_or(Bson::Null),
        "max": chunk.get("max").cloned().unwrap_or(Bson::Null),
        "waitForDelete": true,
    })
}

/// Starts moving `id`'s chunks away, unless a drain of it is running already.
fn start_drain(
    catalog: &Arc<Mutex<Catalog>>,
    migrations: &Arc<Migrations>,
    drains: &Arc<Drains>,
    id: &str,
) {
    if !lock(&drains.running).insert(id.to_string()) {
        return;
    }
    let (catalog, migrations, drains, id) = (
        catalog.clone(),
        migrations.clone(),
        drains.clone(),
        id.to_string(),
    );
    tokio::spawn(async move {
        let mut failures = 0;
        loop {
            let Some(command) = next_move(&lock(&catalog), &id) else {
                break;
            };
            match migrations.configsvr_move_range(&catalog, &command).await {
                Ok(_) => failures = 0,
                Err(e) => {
                    failures += 1;
                    tracing::warn!(shard = %id, error = %e.message, "a chunk of a draining shard did not move");
                    if failures >= MAX_FAILURES {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        lock(&drains.running).remove(&id);
    });
}
