//! The embedded config server's side of cluster DDL: chunk splits and merges committed by the
//! shard that owns the chunks (`_configsvrCommitChunkSplit`, `_configsvrCommitChunksMerge`, with
//! MongoDB's version rules: every chunk a split or merge writes gets the collection version's
//! next minor version), the balancer's mode (`_configsvrBalancer*`, in `config.settings`), and
//! the `config.*` changes of the primary shard's DDL coordinators (a sharded collection
//! recorded or removed, a database removed). docs/design/config-server.md, §13.

use bson::{doc, oid::ObjectId, Bson, Document};

use crate::engine::EngineError;
use crate::routing::{ShardKey, ShardKeyPattern};
use crate::sync::lock;
use crate::value::compare::values_equal;
use crate::value::error_codes::ErrorCode;

use super::configsvr::{object_field, string_field};
use super::service::ShardService;
use super::store::{Catalog, RecordId};

fn records(catalog: &Catalog, coll: &str) -> Vec<(RecordId, Document)> {
    catalog
        .collection("config", coll)
        .map(|c| c.iter().map(|(rid, d)| (*rid, d.clone())).collect())
        .unwrap_or_default()
}

fn collection_entry(catalog: &Catalog, ns: &str) -> Option<(RecordId, Document)> {
    records(catalog, "collections")
        .into_iter()
        .find(|(_, d)| d.get_str("_id").ok() == Some(ns))
}

fn chunks_of(catalog: &Catalog, uuid: &Bson) -> Vec<(RecordId, Document)> {
    records(catalog, "chunks")
        .into_iter()
        .filter(|(_, d)| d.get("uuid").is_some_and(|u| values_equal(u, uuid)))
        .collect()
}

fn version_of(d: &Document) -> (u32, u32) {
    d.get_timestamp("lastmod")
        .map(|t| (t.time, t.increment))
        .unwrap_or((0, 0))
}

/// The collection version: the highest chunk version.
fn collection_version(chunks: &[(RecordId, Document)]) -> (u32, u32) {
    chunks
        .iter()
        .map(|(_, d)| version_of(d))
        .max()
        .unwrap_or((0, 0))
}

fn routing_error(e: crate::routing::RoutingError) -> EngineError {
    EngineError::new(e.code, e.message)
}

/// A sharded collection's entry, refusing an unknown one and a stale epoch.
fn sharded_entry(
    catalog: &Catalog,
    ns: &str,
    epoch: Option<&Bson>,
) -> Result<(Document, ShardKeyPattern), EngineError> {
    let Some((_, entry)) = collection_entry(catalog, ns) else {
        return Err(EngineError::new(
            ErrorCode::NamespaceNotSharded,
            format!("Collection {ns} is not sharded"),
        ));
    };
    if let Some(e) = epoch {
        if !entry
            .get("lastmodEpoch")
            .is_some_and(|x| values_equal(x, e))
        {
            return Err(EngineError::new(
                ErrorCode::StaleEpoch,
                format!("{ns} was dropped or sharded again: its epoch is not {e}"),
            ));
        }
    }
    let key = entry
        .get_document("key")
        .map_err(|_| EngineError::new(ErrorCode::InternalError, format!("{ns} has no key")))?;
    let pattern = ShardKeyPattern::parse(key).map_err(routing_error)?;
    Ok((entry, pattern))
}

fn shard_version_reply(entry: &Document, chunks: &[Document], shard: &str) -> Document {
    let v = chunks
        .iter()
        .filter(|d| d.get_str("shard").ok() == Some(shard))
        .map(version_of)
        .max()
        .unwrap_or((0, 0));
    doc! {"shardVersion": {
        "e": entry.get("lastmodEpoch").cloned().unwrap_or(Bson::Null),
        "t": entry.get("timestamp").cloned().unwrap_or(Bson::Null),
        "v": bson::Timestamp { time: v.0, increment: v.1 },
    }}
}

fn same_bound(d: &Document, field: &str, bound: &Document) -> bool {
    d.get(field)
        .is_some_and(|b| values_equal(b, &Bson::Document(bound.clone())))
}

/// `_configsvrCommitChunkSplit {ns, collEpoch, collTimestamp, min, max, splitPoints, shard}`:
/// the chunk `[min, max)` of `shard` becomes one chunk per split point; each gets the next
/// minor version of the collection (the first keeps the chunk's `_id`). Replies with the
/// shard's new placement version.
pub fn commit_split(svc: &ShardService, body: &Document) -> Result<Document, EngineError> {
    const CMD: &str = "_configsvrCommitChunkSplit";
    let ns = string_field(body, CMD, CMD)?;
    let shard = string_field(body, CMD, "shard")?;
    let min = object_field(body, CMD, "min")?;
    let max = object_field(body, CMD, "max")?;
    let points: Vec<Document> = match body.get("splitPoints") {
        Some(Bson::Array(a)) => a
            .iter()
            .map(|p| match p {
                Bson::Document(d) => Ok(d.clone()),
                _ => Err(EngineError::new(
                    ErrorCode::TypeMismatch,
                    "splitPoints must be an array of documents",
                )),
            })
            .collect::<Result<_, _>>()?,
        _ => {
            return Err(EngineError::new(
                ErrorCode(40414),
                format!("BSON field '{CMD}.splitPoints' is missing but a required field"),
            ))
        }
    };
    if points.is_empty() {
        return Err(EngineError::new(
            ErrorCode::InvalidOptions,
            "need at least one split point",
        ));
    }
    let mut catalog = lock(&svc.catalog);
    let (entry, pattern) = sharded_entry(&catalog, ns, body.get("collEpoch"))?;
    let uuid = entry.get("uuid").cloned().unwrap_or(Bson::Null);
    let chunks = chunks_of(&catalog, &uuid);
    let Some((rid, chunk)) = chunks
        .iter()
        .find(|(_, d)| same_bound(d, "min", min) && same_bound(d, "max", max))
        .cloned()
    else {
        return Err(EngineError::new(
            ErrorCode::ConflictingOperationInProgress,
            format!("the chunk {min} - {max} of {ns} being split is no longer in config.chunks"),
        ));
    };
    if chunk.get_str("shard").ok() != Some(shard) {
        return Err(EngineError::new(
            ErrorCode::ConflictingOperationInProgress,
            format!("the chunk {min} - {max} of {ns} being split is not on {shard}"),
        ));
    }
    let lo = pattern.key_from_document(min).map_err(routing_error)?;
    let hi = pattern.key_from_document(max).map_err(routing_error)?;
    let mut previous: ShardKey = lo;
    for p in &points {
        let k = pattern.key_from_document(p).map_err(routing_error)?;
        if k <= previous || k >= hi {
            return Err(EngineError::new(
                ErrorCode::InvalidOptions,
                format!("split point {p} is not strictly inside the chunk {min} - {max} and after the previous one"),
            ));
        }
        previous = k;
    }
    let (major, mut minor) = collection_version(&chunks);
    let mut bounds = vec![min.clone()];
    bounds.extend(points.iter().cloned());
    bounds.push(max.clone());
    let coll = catalog
        .existing_mut("config", "chunks")
        .ok_or_else(|| EngineError::new(ErrorCode::InternalError, "config.chunks vanished"))?;
    for (i, w) in bounds.windows(2).enumerate() {
        minor += 1;
        let mut piece = chunk.clone();
        piece.insert("min", w[0].clone());
        piece.insert("max", w[1].clone());
        piece.insert(
            "lastmod",
            bson::Timestamp {
                time: major,
                increment: minor,
            },
        );
        if i == 0 {
            coll.replace("config.chunks", rid, piece)?;
        } else {
            piece.insert("_id", ObjectId::new());
            coll.insert("config.chunks", piece)?;
        }
    }
    let all: Vec<Document> = chunks_of(&catalog, &uuid)
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    Ok(shard_version_reply(&entry, &all, shard))
}

/// `_configsvrCommitChunksMerge {ns, collUUID?, chunkRange: {min, max}, shard}`: the chunks of
/// `shard` that exactly cover `[min, max)` (contiguous, at least one) become one chunk at the
/// collection version's next minor version. A range that is already one chunk is answered as
/// merged.
pub fn commit_merge(svc: &ShardService, body: &Document) -> Result<Document, EngineError> {
    const CMD: &str = "_configsvrCommitChunksMerge";
    let ns = string_field(body, CMD, CMD)?;
    let shard = string_field(body, CMD, "shard")?;
    let range = object_field(body, CMD, "chunkRange")?;
    let min = object_field(range, "chunkRange", "min")?;
    let max = object_field(range, "chunkRange", "max")?;
    let mut catalog = lock(&svc.catalog);
    let (entry, pattern) = sharded_entry(&catalog, ns, None)?;
    let uuid = entry.get("uuid").cloned().unwrap_or(Bson::Null);
    if let Some(asked) = body.get("collUUID") {
        if !values_equal(asked, &uuid) {
            return Err(EngineError::new(
                ErrorCode::InvalidUUID,
                format!("{ns} was dropped or sharded again: its UUID is not {asked}"),
            ));
        }
    }
    let lo = pattern.key_from_document(min).map_err(routing_error)?;
    let hi = pattern.key_from_document(max).map_err(routing_error)?;
    if lo >= hi {
        return Err(EngineError::new(
            ErrorCode::InvalidOptions,
            format!("the range {min} - {max} is empty"),
        ));
    }
    let chunks = chunks_of(&catalog, &uuid);
    let mut parsed = Vec::with_capacity(chunks.len());
    for (rid, d) in &chunks {
        let cmin = d
            .get_document("min")
            .map_err(|_| EngineError::new(ErrorCode::InternalError, "a chunk has no min"))
            .and_then(|m| pattern.key_from_document(m).map_err(routing_error))?;
        let cmax = d
            .get_document("max")
            .map_err(|_| EngineError::new(ErrorCode::InternalError, "a chunk has no max"))
            .and_then(|m| pattern.key_from_document(m).map_err(routing_error))?;
        parsed.push((cmin, cmax, *rid, d.clone()));
    }
    parsed.sort_by(|a, b| a.0.cmp(&b.0));
    let overlapping: Vec<_> = parsed
        .iter()
        .filter(|(cmin, cmax, _, _)| *cmin < hi && *cmax > lo)
        .collect();
    let (Some(first), Some(last)) = (overlapping.first(), overlapping.last()) else {
        return Err(EngineError::new(
            ErrorCode::IllegalOperation,
            format!("no chunk of {ns} lies in {min} - {max}"),
        ));
    };
    if first.0 != lo || last.1 != hi {
        return Err(EngineError::new(
            ErrorCode::IllegalOperation,
            format!("could not merge chunks of {ns}: {min} - {max} does not start and end at chunk boundaries"),
        ));
    }
    if let Some((_, _, _, d)) = overlapping
        .iter()
        .find(|(_, _, _, d)| d.get_str("shard").ok() != Some(shard))
    {
        return Err(EngineError::new(
            ErrorCode::IllegalOperation,
            format!(
                "could not merge chunks of {ns}: the chunk from {} is on {}, not {shard}",
                d.get("min").cloned().unwrap_or(Bson::Null),
                d.get_str("shard").unwrap_or_default()
            ),
        ));
    }
    let all = |catalog: &Catalog| -> Vec<Document> {
        chunks_of(catalog, &uuid)
            .into_iter()
            .map(|(_, d)| d)
            .collect()
    };
    if overlapping.len() == 1 {
        return Ok(shard_version_reply(&entry, &all(&catalog), shard));
    }
    let (major, minor) = collection_version(&chunks);
    let mut merged = first.3.clone();
    merged.insert("max", max.clone());
    merged.insert(
        "lastmod",
        bson::Timestamp {
            time: major,
            increment: minor + 1,
        },
    );
    let rids: Vec<RecordId> = overlapping.iter().map(|c| c.2).collect();
    let first_rid = first.2;
    let coll = catalog
        .existing_mut("config", "chunks")
        .ok_or_else(|| EngineError::new(ErrorCode::InternalError, "config.chunks vanished"))?;
    coll.replace("config.chunks", first_rid, merged)?;
    for rid in rids.into_iter().skip(1) {
        coll.remove(rid);
    }
    Ok(shard_version_reply(&entry, &all(&catalog), shard))
}

/// `_configsvrBalancerStart` / `Stop` record the balancer's mode in `config.settings` (`full`
/// or `off`, with `stopped`), as MongoDB's config server does; `_configsvrBalancerStatus`
/// reports it (`full` when nothing was recorded, MongoDB's default). The embedded config server
/// runs no balancer rounds, so `numBalancerRounds` stays 0.
pub fn balancer(svc: &ShardService, command: &str) -> Result<Document, EngineError> {
    let mut catalog = lock(&svc.catalog);
    let current = records(&catalog, "settings")
        .into_iter()
        .find(|(_, d)| d.get_str("_id").ok() == Some("balancer"));
    let mode = match command {
        "_configsvrBalancerStart" => "full",
        "_configsvrBalancerStop" => "off",
        _ => {
            let mode = current
                .as_ref()
                .and_then(|(_, d)| d.get_str("mode").ok().map(str::to_string))
                .unwrap_or_else(|| "full".to_string());
            return Ok(doc! {"mode": mode, "inBalancerRound": false, "numBalancerRounds": 0i64});
        }
    };
    let setting = doc! {"_id": "balancer", "mode": mode, "stopped": mode == "off"};
    let (coll, _) = catalog.collection_mut("config", "settings");
    match current {
        Some((rid, _)) => coll.replace("config.settings", rid, setting)?,
        None => {
            coll.insert("config.settings", setting)?;
        }
    }
    Ok(Document::new())
}

/// `_sluiceCommitShardCollection {ns, collection, chunks}` (from the database's primary
/// shard): records a sharded collection, its chunks first and then its `config.collections`
/// entry (so a router never reads an entry without chunks). A collection recorded meanwhile
/// is answered with its entry (`existing`), for the primary to compare keys.
pub fn commit_shard_collection(
    svc: &ShardService,
    body: &Document,
) -> Result<Document, EngineError> {
    const CMD: &str = "_sluiceCommitShardCollection";
    let ns = string_field(body, CMD, CMD)?;
    let entry = object_field(body, CMD, "collection")?;
    let chunks = match body.get("chunks") {
        Some(Bson::Array(a)) if !a.is_empty() => a.clone(),
        _ => {
            return Err(EngineError::new(
                ErrorCode::InvalidOptions,
                format!("{CMD} needs the collection's chunks"),
            ))
        }
    };
    let db = ns.split('.').next().unwrap_or(ns);
    let mut catalog = lock(&svc.catalog);
    if let Some((_, existing)) = collection_entry(&catalog, ns) {
        return Ok(doc! {"existing": existing});
    }
    if !records(&catalog, "databases")
        .iter()
        .any(|(_, d)| d.get_str("_id").ok() == Some(db))
    {
        return Err(EngineError::new(
            ErrorCode::NamespaceNotFound,
            format!("database {db} not found"),
        ));
    }
    let (coll, _) = catalog.collection_mut("config", "chunks");
    for c in chunks {
        if let Bson::Document(c) = c {
            coll.insert("config.chunks", c)?;
        }
    }
    let (coll, _) = catalog.collection_mut("config", "collections");
    coll.insert("config.collections", entry.clone())?;
    Ok(Document::new())
}

/// Removes `ns`'s entry and chunks; whether it was there.
fn remove_collection(catalog: &mut Catalog, ns: &str) -> Result<bool, EngineError> {
    let Some((rid, entry)) = collection_entry(catalog, ns) else {
        return Ok(false);
    };
    let uuid = entry.get("uuid").cloned().unwrap_or(Bson::Null);
    if let Some(c) = catalog.existing_mut("config", "collections") {
        c.remove(rid);
    }
    let chunks: Vec<RecordId> = chunks_of(catalog, &uuid)
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    if let Some(c) = catalog.existing_mut("config", "chunks") {
        for r in chunks {
            c.remove(r);
        }
    }
    Ok(true)
}

/// `_sluiceCommitDropCollection: ns` (from the primary shard): the collection's entry, then its
/// chunks, leave `config.*`.
pub fn commit_drop_collection(
    svc: &ShardService,
    body: &Document,
) -> Result<Document, EngineError> {
    const CMD: &str = "_sluiceCommitDropCollection";
    let ns = string_field(body, CMD, CMD)?;
    let dropped = remove_collection(&mut lock(&svc.catalog), ns)?;
    Ok(doc! {"dropped": dropped})
}

/// `_sluiceCommitRenameCollection: from, to, dropTarget` (from the primary shard): the
/// sharded collection `from` is recorded as `to`, keeping its `uuid` and so its chunks, under a
/// new generation (`lastmodEpoch`, `timestamp`) so every router and shard holding the old one
/// reloads; a tracked `to` is removed first with `dropTarget`, else NamespaceExists. Replies with
/// the new generation.
pub fn commit_rename_collection(
    svc: &ShardService,
    body: &Document,
) -> Result<Document, EngineError> {
    const CMD: &str = "_sluiceCommitRenameCollection";
    let from = string_field(body, CMD, CMD)?.to_string();
    let to = string_field(body, CMD, "to")?.to_string();
    let drop_target = body
        .get("dropTarget")
        .is_some_and(crate::value::field::truthy);
    let now = svc.cluster_time();
    let mut catalog = lock(&svc.catalog);
    let Some((rid, mut entry)) = collection_entry(&catalog, &from) else {
        return Err(EngineError::new(
            ErrorCode::NamespaceNotSharded,
            format!("Collection {from} is not sharded"),
        ));
    };
    if collection_entry(&catalog, &to).is_some() {
        if !drop_target {
            return Err(EngineError::new(
                ErrorCode::NamespaceExists,
                "target namespace exists",
            ));
        }
        remove_collection(&mut catalog, &to)?;
    }
    let epoch = ObjectId::new();
    entry.insert("_id", to.as_str());
    entry.insert("lastmodEpoch", epoch);
    entry.insert("timestamp", now);
    entry.insert("lastmod", bson::DateTime::now());
    let colls = catalog
        .existing_mut("config", "collections")
        .ok_or_else(|| {
            EngineError::new(
                ErrorCode::NamespaceNotFound,
                "config.collections is missing",
            )
        })?;
    colls.remove(rid);
    colls.insert("config.collections", entry)?;
    Ok(doc! {"epoch": epoch, "timestamp": now})
}

/// `_sluiceCommitDropDatabase: db` (from the primary shard): every sharded collection of `db`
/// and then the database's entry leave `config.*`; replies with the collections removed.
pub fn commit_drop_database(svc: &ShardService, body: &Document) -> Result<Document, EngineError> {
    const CMD: &str = "_sluiceCommitDropDatabase";
    let db = string_field(body, CMD, CMD)?;
    let prefix = format!("{db}.");
    let mut catalog = lock(&svc.catalog);
    let namespaces: Vec<String> = records(&catalog, "collections")
        .into_iter()
        .filter_map(|(_, d)| d.get_str("_id").ok().map(str::to_string))
        .filter(|ns| ns.starts_with(&prefix))
        .collect();
    for ns in &namespaces {
        remove_collection(&mut catalog, ns)?;
    }
    let entry = records(&catalog, "databases")
        .into_iter()
        .find(|(_, d)| d.get_str("_id").ok() == Some(db));
    if let (Some((rid, _)), Some(c)) = (entry, catalog.existing_mut("config", "databases")) {
        c.remove(rid);
    }
    Ok(doc! {"collections": namespaces})
}

/// `_sluiceCommitMovePrimary: db, to` (from the database's old primary shard, once it cloned
/// the unsharded collections to `to`): the database's entry names `to` as its primary and
/// takes the next `lastMod` of its version (same `uuid` and `timestamp`), so every router and
/// shard holding the old version is answered StaleDbVersion. Replies `{databaseVersion}`.
pub fn commit_move_primary(svc: &ShardService, body: &Document) -> Result<Document, EngineError> {
    const CMD: &str = "_sluiceCommitMovePrimary";
    let db = string_field(body, CMD, CMD)?;
    let to = string_field(body, CMD, "to")?;
    let mut catalog = lock(&svc.catalog);
    let Some((rid, mut entry)) = records(&catalog, "databases")
        .into_iter()
        .find(|(_, d)| d.get_str("_id").ok() == Some(db))
    else {
        return Err(EngineError::new(
            ErrorCode::NamespaceNotFound,
            format!("database {db} not found"),
        ));
    };
    let mut version = entry.get_document("version").cloned().unwrap_or_default();
    let last_mod = version.get_i32("lastMod").unwrap_or(0);
    version.insert("lastMod", last_mod + 1);
    entry.insert("primary", to);
    entry.insert("version", version.clone());
    let Some(c) = catalog.existing_mut("config", "databases") else {
        return Err(EngineError::new(
            ErrorCode::InternalError,
            "config.databases is missing",
        ));
    };
    c.remove(rid);
    c.insert("config.databases", entry)?;
    Ok(doc! {"databaseVersion": version})
}

/// Whether the shard `id` on `host` is in `config.shards` already (`true`), absent (`false`),
/// or its name or host taken by another shard (IllegalOperation).
fn already_added(catalog: &Catalog, id: &str, host: &str) -> Result<bool, EngineError> {
    let existing = records(catalog, "shards");
    if let Some((_, d)) = existing
        .iter()
        .find(|(_, d)| d.get_str("_id").ok() == Some(id))
    {
        if d.get_str("host").ok() == Some(host) {
            return Ok(true);
        }
        return Err(EngineError::new(
            ErrorCode::IllegalOperation,
            format!("A shard already exists with the name {id} and another host"),
        ));
    }
    if let Some((_, d)) = existing
        .iter()
        .find(|(_, d)| d.get_str("host").ok() == Some(host))
    {
        return Err(EngineError::new(
            ErrorCode::IllegalOperation,
            format!(
                "{host} is already a shard, named {}",
                d.get_str("_id").unwrap_or_default()
            ),
        ));
    }
    Ok(false)
}

/// `_configsvrAddShard: "<rs>/host:port,…" | "host:port"` (`name` optional), what mongos's
/// `addShard` sends: the config server asks the shard who it is (`hello`: a replica set, not a
/// config server, the set name the connection string names), then records it in
/// `config.shards` as `{_id: name (the set name by default), host: "<set>/<hosts>", state: 1,
/// topologyTime}`. Adding the same shard again answers as the first time; another shard under a
/// taken name is refused. Before recording it, the config server gives the shard its identity
/// (`_shardsvrAddShard {shardIdentity: {shardName, clusterId, configsvrConnectionString}}` with
/// majority write concern, as MongoDB's does); a shard that refuses it is not added. Replies
/// `{shardAdded: name}`. (An embedded shard is still given the config server when it starts,
/// `sluice shard --configdb`.)
pub async fn add_shard(
    svc: &ShardService,
    peers: &super::migration::Migrations,
    body: &Document,
) -> Result<Document, EngineError> {
    const CMD: &str = "_configsvrAddShard";
    let connection = string_field(body, CMD, CMD)?.to_string();
    let name = match body.get("name") {
        None => None,
        Some(_) => Some(string_field(body, CMD, "name")?.to_string()),
    };
    let (named_set, hosts) = match connection.split_once('/') {
        Some((set, hosts)) => (Some(set.to_string()), hosts.to_string()),
        None => (None, connection.clone()),
    };
    let first = hosts
        .split(',')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    if first.is_empty() {
        return Err(EngineError::new(
            ErrorCode::FailedToParse,
            format!("Invalid connection string {connection}"),
        ));
    }
    let hello = peers
        .run_on(&first, doc! {"hello": 1})
        .await
        .map_err(|e| {
            EngineError::new(
                ErrorCode::OperationFailed,
                format!("failed to run command {{hello: 1}} when attempting to add shard {connection} :: caused by :: {}", e.message),
            )
        })?;
    if hello.contains_key("configsvr") {
        return Err(EngineError::new(
            ErrorCode::OperationFailed,
            format!("Cannot add {connection} as a shard since it is a config server"),
        ));
    }
    let Ok(set) = hello.get_str("setName").map(str::to_string) else {
        return Err(EngineError::new(
            ErrorCode::OperationFailed,
            format!("{connection} is not a replica set: a shard must be one"),
        ));
    };
    if named_set.as_ref().is_some_and(|n| *n != set) {
        return Err(EngineError::new(
            ErrorCode::OperationFailed,
            format!(
                "the replica set name in the connection string does not match {first}'s set name {set}"
            ),
        ));
    }
    let id = name.unwrap_or_else(|| set.clone());
    let host = format!("{set}/{hosts}");
    if already_added(&lock(&svc.catalog), &id, &host)? {
        return Ok(doc! {"shardAdded": &id});
    }
    // The shard learns who it is before the cluster lists it, as MongoDB's config server
    // tells it (`_shardsvrAddShard`, the shape of `add_shard_cmd.idl`).
    let cluster_id = records(&lock(&svc.catalog), "version")
        .into_iter()
        .find_map(|(_, d)| d.get_object_id("clusterId").ok())
        .ok_or_else(|| EngineError::new(ErrorCode::InternalError, "config.version is missing"))?;
    let identity = doc! {
        "_shardsvrAddShard": 1,
        "shardIdentity": {
            "shardName": &id,
            "clusterId": cluster_id,
            "configsvrConnectionString": format!("{}/{}", svc.name(), svc.address()),
        },
        "writeConcern": {"w": "majority"},
    };
    peers.run_on(&host, identity).await.map_err(|e| {
        EngineError::new(
            e.code,
            format!(
                "failed to give {connection} its shard identity :: caused by :: {}",
                e.message
            ),
        )
    })?;
    let now = svc.cluster_time();
    let mut catalog = lock(&svc.catalog);
    if already_added(&catalog, &id, &host)? {
        return Ok(doc! {"shardAdded": &id});
    }
    let (coll, _) = catalog.collection_mut("config", "shards");
    coll.insert(
        "config.shards",
        doc! {"_id": &id, "host": &host, "state": 1, "topologyTime": now},
    )?;
    Ok(doc! {"shardAdded": &id})
}
