//! Sharding administration through the router: `enableSharding`, `shardCollection`,
//! `listShards`, `flushRouterConfig`, `balancerStatus`, and reads of the `config` database
//! (with a config server, `shardCollection` goes to it: [`super::cluster_ddl`]).
//!
//! Choices where mongos differs or Sluice is narrower: `shardCollection` only shards an empty
//! collection (a non-empty one is refused with InvalidOptions, since moving existing data is
//! not implemented); sharding an already-sharded collection with the same key succeeds (as
//! mongos 5.0+ does) and with another key is AlreadyInitialized (23); the `config` database is
//! served read-only; Sluice has no balancer, so `balancerStatus` reports mode `off`.

use std::sync::Arc;

use bson::{doc, Bson, Document};

use crate::command::{CommandError, CommandRequest};
use crate::routing::chunks::initial_chunks;
use crate::routing::ShardKeyPattern;
use crate::value::error_codes::ErrorCode;
use crate::value::field::{number_field, truthy};

use super::ShardedCluster;

fn no_cluster() -> CommandError {
    CommandError::new(
        ErrorCode::IllegalOperation,
        "this router has no shards: start it with embedded shards (sluice demo) or a cluster configuration (sluice --config)",
    )
}

/// Serves a command on the `config` database: from the metadata store, or with a config
/// server forwarded to it, as mongos does ([`super::cluster_admin::config_read`]).
pub async fn config_read(
    cluster: Option<&Arc<ShardedCluster>>,
    req: &CommandRequest,
    router_name: &str,
    uptime_secs: i64,
) -> Result<Document, CommandError> {
    let Some(cluster) = cluster else {
        return Err(no_cluster());
    };
    if req.name == "dropDatabase" {
        return Err(CommandError::new(
            ErrorCode::IllegalOperation,
            "Cannot drop the config database",
        ));
    }
    if !crate::metadata::static_store::CONFIG_READS.contains(&req.name.as_str()) {
        return Err(CommandError::new(
            ErrorCode::IllegalOperation,
            format!(
                "Sluice serves the config database read-only; '{}' is not allowed on it",
                req.name
            ),
        ));
    }
    if cluster.has_config_server() {
        return super::cluster_admin::config_read(cluster, req).await;
    }
    cluster.metadata.touch_mongos(router_name, uptime_secs);
    cluster.metadata.config_read(req)
}

/// `enableSharding`: records the database (with a primary shard) if it is new; with a config
/// server, creates it there (`_configsvrCreateDatabase`, as mongos 8.0 does).
pub async fn enable_sharding(
    cluster: Option<&Arc<ShardedCluster>>,
    req: &CommandRequest,
) -> Result<Document, CommandError> {
    let cluster = cluster.ok_or_else(no_cluster)?;
    let body = req.body_document();
    let db = match body.get(&req.name) {
        Some(Bson::String(s)) => s.clone(),
        _ => return Err(CommandError::new(
            ErrorCode::TypeMismatch,
            "BSON field 'enableSharding.enableSharding' is the wrong type, expected type 'string'",
        )),
    };
    check_db_name(&db)?;
    let primary = body.get_str("primaryShard").ok();
    if cluster.has_config_server() {
        cluster.create_database(&db, primary).await?;
        return Ok(Document::new());
    }
    cluster.metadata.ensure_database(&db, primary)?;
    Ok(Document::new())
}

fn check_db_name(db: &str) -> Result<(), CommandError> {
    crate::limits::check_namespace(db, "x")
        .map_err(|message| CommandError::new(ErrorCode::InvalidNamespace, message))?;
    if matches!(db, "admin" | "config" | "local") {
        return Err(CommandError::new(
            ErrorCode::IllegalOperation,
            format!("can't shard {db} database"),
        ));
    }
    Ok(())
}

/// `shardCollection`: pre-splits an empty collection with MongoDB's layout and records it.
pub async fn shard_collection(
    cluster: Option<&Arc<ShardedCluster>>,
    req: &CommandRequest,
) -> Result<Document, CommandError> {
    let cluster = cluster.ok_or_else(no_cluster)?;
    let body = req.body_document();
    let ns = match body.get(&req.name) {
        Some(Bson::String(s)) => s.clone(),
        _ => {
            return Err(CommandError::new(
                ErrorCode::TypeMismatch,
                "BSON field 'shardCollection.shardCollection' is the wrong type, expected type 'string'",
            ))
        }
    };
    let Some((db, coll)) = ns
        .split_once('.')
        .filter(|(d, c)| !d.is_empty() && !c.is_empty())
    else {
        return Err(CommandError::new(
            ErrorCode::InvalidNamespace,
            format!("Invalid namespace specified '{ns}'"),
        ));
    };
    check_db_name(db)?;
    crate::limits::check_namespace(db, coll)
        .map_err(|message| CommandError::new(ErrorCode::InvalidNamespace, message))?;
    let key = match body.get("key") {
        Some(Bson::Document(k)) => k.clone(),
        Some(_) => {
            return Err(CommandError::new(
                ErrorCode::TypeMismatch,
                "BSON field 'shardCollection.key' is the wrong type, expected type 'object'",
            ))
        }
        None => {
            return Err(CommandError::new(
                ErrorCode(40414),
                "BSON field 'shardCollection.key' is missing but a required field",
            ))
        }
    };
    let pattern = ShardKeyPattern::parse(&key)?;
    let unique = body.get("unique").is_some_and(truthy);
    if unique && pattern.has_hashed() {
        return Err(CommandError::new(
            ErrorCode::InvalidOptions,
            "Hashed shard keys cannot be declared unique. It's possible to ensure uniqueness on the hashed field by declaring an additional (non-hashed) unique index on the field.",
        ));
    }
    let shard_ids: Vec<String> = cluster
        .cluster
        .shards()
        .iter()
        .map(|s| s.id.clone())
        .collect();
    let num_initial = match body.get("numInitialChunks") {
        None => None,
        Some(_) => match number_field(&body, "numInitialChunks") {
            Some(n) if n > 0 && n <= 8192 * shard_ids.len().max(1) as i64 && n <= 1_000_000 => {
                if !pattern.is_hashed_prefix() {
                    return Err(CommandError::new(
                        ErrorCode::InvalidOptions,
                        "numInitialChunks is only supported when the collection is empty and has a hashed field as the shard key prefix",
                    ));
                }
                Some(n as u32)
            }
            Some(_) => {
                return Err(CommandError::new(
                    ErrorCode::InvalidOptions,
                    "numInitialChunks cannot be more than either: 8192 * number of shards; or 1,000,000, and must be positive",
                ))
            }
            None => return Err(CommandError::new(ErrorCode::TypeMismatch, "numInitialChunks must be a number")),
        },
    };

    if cluster.has_config_server() {
        return super::cluster_ddl::shard_collection(cluster, &ns, &pattern, unique, num_initial)
            .await;
    }
    if let Some(existing) = cluster.metadata.collection(&ns) {
        let same_key = existing.get_document("key").ok() == Some(&pattern.to_document());
        let same_unique = existing.get_bool("unique").unwrap_or(false) == unique;
        if same_key && same_unique {
            return Ok(doc! {"collectionsharded": &ns});
        }
        return Err(CommandError::new(
            ErrorCode(23),
            format!(
                "sharding already enabled for collection {ns} with options {}",
                crate::value::render::render_doc(
                    &doc! {"key": existing.get("key").cloned().unwrap_or(Bson::Null), "unique": existing.get_bool("unique").unwrap_or(false)}
                )
            ),
        ));
    }

    let database = cluster.metadata.ensure_database(db, None)?;
    let primary = database.get_str("primary").unwrap_or_default().to_string();

    // Only empty collections: ask every shard.
    for (shard, result) in cluster
        .cluster
        .run_on_all(&doc! {"count": coll, "$db": db})
        .await
    {
        let reply = result.map_err(|e| e.at(&shard))?;
        let n = number_field(&reply, "n").unwrap_or(0);
        if n > 0 {
            return Err(CommandError::new(
                ErrorCode::InvalidOptions,
                format!("Sluice only shards empty collections: {ns} already holds {n} documents on {shard}"),
            ));
        }
    }

    // Every shard gets the collection and the shard key index.
    let index_name = pattern.index_name();
    for shard in &shard_ids {
        let r = cluster
            .cluster
            .run_on(shard, &doc! {"create": coll, "$db": db})
            .await
            .map_err(|e| e.at(shard))?;
        if r.get_f64("ok").ok() != Some(1.0)
            && r.get_i32("code").ok() != Some(ErrorCode::NamespaceExists.0)
        {
            return Err(CommandError::from_shard_reply(shard, &r));
        }
        if pattern.to_document() != doc! {"_id": 1} {
            let r = cluster
                .cluster
                .run_on(shard, &doc! {"createIndexes": coll, "indexes": [{"key": pattern.to_document(), "name": &index_name}], "$db": db})
                .await
                .map_err(|e| e.at(shard))?;
            if r.get_f64("ok").ok() != Some(1.0) {
                return Err(CommandError::from_shard_reply(shard, &r));
            }
        }
    }

    let chunks = initial_chunks(&pattern, &shard_ids, &primary, num_initial);
    let snapshot = cluster
        .metadata
        .add_sharded_collection(&ns, &pattern, unique, &chunks)?;
    for shard in &shard_ids {
        if cluster.cluster.is_shard_server(shard) {
            let r = cluster
                .cluster
                .run_on(shard, &doc! {"sluiceSetShardVersion": &ns, "shardVersion": snapshot.shard_version(shard), "$db": "admin"})
                .await
                .map_err(|e| e.at(shard))?;
            if r.get_f64("ok").ok() != Some(1.0) {
                return Err(CommandError::from_shard_reply(shard, &r));
            }
        }
    }
    cluster.cluster.routing.reload(&ns, &[]).await?;
    Ok(doc! {"collectionsharded": &ns})
}

/// `listShards`: the metadata store's shard list, or with a config server its
/// `config.shards` (as mongos reads it).
pub async fn list_shards(cluster: Option<&Arc<ShardedCluster>>) -> Result<Document, CommandError> {
    let cluster = cluster.ok_or_else(no_cluster)?;
    if cluster.has_config_server() {
        return super::cluster_admin::list_shards(cluster).await;
    }
    let shards: Vec<Bson> = cluster
        .metadata
        .documents("shards")
        .into_iter()
        .map(Bson::Document)
        .collect();
    Ok(doc! {"shards": shards})
}

/// `moveChunk` (`{moveChunk: ns, find | bounds, to}`) and `moveRange` (`{moveRange: ns,
/// toShard, min, max?}`): sent to the config server as mongos 8.0 sends them
/// (`_configsvrMoveRange` with the chunk's bounds, majority write concern); afterwards this
/// router reloads the collection, as mongos does. Needs a config server (`--configdb`).
pub async fn move_chunk(
    cluster: Option<&Arc<ShardedCluster>>,
    req: &CommandRequest,
) -> Result<Document, CommandError> {
    let cluster = cluster.ok_or_else(no_cluster)?;
    let body = req.body_document();
    let cmd = req.name.as_str();
    let ns = match body.get(cmd) {
        Some(Bson::String(s)) => s.clone(),
        _ => {
            return Err(CommandError::new(
                ErrorCode::TypeMismatch,
                format!("BSON field '{cmd}.{cmd}' is the wrong type, expected type 'string'"),
            ))
        }
    };
    if !ns
        .split_once('.')
        .is_some_and(|(d, c)| !d.is_empty() && !c.is_empty())
    {
        return Err(CommandError::new(
            ErrorCode::InvalidNamespace,
            format!("Invalid namespace specified '{ns}'"),
        ));
    }
    if !cluster.has_config_server() {
        return Err(CommandError::new(
            ErrorCode::IllegalOperation,
            format!("{cmd} moves chunks through a config server: start the router with --configdb"),
        ));
    }
    let object = |field: &str| -> Result<Option<Document>, CommandError> {
        match body.get(field) {
            None => Ok(None),
            Some(Bson::Document(d)) => Ok(Some(d.clone())),
            Some(_) => Err(CommandError::new(
                ErrorCode::TypeMismatch,
                format!("BSON field '{cmd}.{field}' is the wrong type, expected type 'object'"),
            )),
        }
    };
    let to_field = if cmd == "moveRange" { "toShard" } else { "to" };
    let to = match body.get(to_field) {
        Some(Bson::String(s)) => s.clone(),
        Some(_) => {
            return Err(CommandError::new(
                ErrorCode::TypeMismatch,
                format!("BSON field '{cmd}.{to_field}' is the wrong type, expected type 'string'"),
            ))
        }
        None => {
            return Err(CommandError::new(
                ErrorCode(40414),
                format!("BSON field '{cmd}.{to_field}' is missing but a required field"),
            ))
        }
    };
    let snapshot = cluster.cluster.routing.lookup(&ns).await?.ok_or_else(|| {
        CommandError::new(
            ErrorCode::NamespaceNotSharded,
            format!("Can't execute {cmd} on unsharded collection {ns}"),
        )
    })?;
    let pattern = &snapshot.pattern;
    let (min, max, wait_for_delete, force) = if cmd == "moveRange" {
        let Some(min) = object("min")? else {
            return Err(CommandError::new(
                ErrorCode::InvalidOptions,
                "moveRange needs 'min': a range given by its max only is not supported by this version of Sluice",
            ));
        };
        (
            min,
            object("max")?,
            body.get("waitForDelete").is_some_and(truthy),
            body.get("forceJumbo").is_some_and(truthy),
        )
    } else {
        let find = object("find")?;
        let bounds = match body.get("bounds") {
            None => None,
            Some(Bson::Array(b)) => match b.as_slice() {
                [Bson::Document(lo), Bson::Document(hi)] => Some((lo.clone(), hi.clone())),
                _ => {
                    return Err(CommandError::new(
                        ErrorCode::InvalidOptions,
                        "bounds must be an array of two documents: [min, max]",
                    ))
                }
            },
            Some(_) => {
                return Err(CommandError::new(
                    ErrorCode::TypeMismatch,
                    format!("BSON field '{cmd}.bounds' is the wrong type, expected type 'array'"),
                ))
            }
        };
        let chunk = match (find, bounds) {
            (Some(find), None) => {
                let mut key = Vec::new();
                for f in pattern.fields() {
                    let Some(v) = find.get(&f.path) else {
                        return Err(CommandError::new(
                            ErrorCode::ShardKeyNotFound,
                            format!("no shard key found in chunk query {find}"),
                        ));
                    };
                    key.push(if f.hashed {
                        Bson::Int64(crate::routing::hash::hash64(v))
                    } else {
                        v.clone()
                    });
                }
                snapshot
                    .chunks
                    .find(&crate::routing::ShardKey(key))
                    .cloned()
            }
            (None, Some((lo, hi))) => {
                let exact = match (
                    pattern.key_from_document(&lo),
                    pattern.key_from_document(&hi),
                ) {
                    (Ok(lo), Ok(hi)) => snapshot
                        .chunks
                        .find(&lo)
                        .filter(|c| c.min == lo && c.max == hi)
                        .cloned(),
                    _ => None,
                };
                Some(exact.ok_or_else(|| {
                    CommandError::new(
                        ErrorCode::InvalidOptions,
                        format!("no chunk of {ns} has exactly the bounds {lo} - {hi}"),
                    )
                })?)
            }
            _ => {
                return Err(CommandError::new(
                    ErrorCode::InvalidOptions,
                    "need to specify either a find query, or both lower and upper bounds.",
                ))
            }
        };
        let chunk = chunk.ok_or_else(|| {
            CommandError::new(
                ErrorCode::InternalError,
                format!("{ns} has no chunk for that key"),
            )
        })?;
        (
            pattern.key_document(&chunk.min),
            Some(pattern.key_document(&chunk.max)),
            body.get("_waitForDelete").is_some_and(truthy),
            body.get("forceJumbo").is_some_and(truthy),
        )
    };
    let mut request = doc! {"_configsvrMoveRange": &ns, "toShard": &to, "min": min};
    if let Some(max) = max {
        request.insert("max", max);
    }
    request.insert("waitForDelete", wait_for_delete);
    request.insert("forceJumbo", if force { 1 } else { 0 });
    let started = std::time::Instant::now();
    let result = cluster.config_server_command(request).await;
    // Whatever the outcome, the next request reads the collection's routing again.
    cluster.forget_collection(&ns);
    result?;
    Ok(if cmd == "moveRange" {
        Document::new()
    } else {
        doc! {"millis": started.elapsed().as_millis() as i64}
    })
}

/// `balancerStatus`: Sluice moves no chunks.
pub fn balancer_status() -> Document {
    doc! {"mode": "off", "inBalancerRound": false, "numBalancerRounds": 0i64}
}

/// A collection-less `aggregate` whose pipeline starts with `$documents` (what mongosh's
/// `convertShardKeyToHashed` sends), evaluated by the router itself.
pub fn local_documents_aggregate(
    req: &CommandRequest,
    stage_memory: usize,
) -> Option<Result<Document, CommandError>> {
    let body = req.body_document();
    if !matches!(
        body.get("aggregate"),
        Some(Bson::Int32(1) | Bson::Int64(1) | Bson::Double(_))
    ) {
        return None;
    }
    let pipeline = body.get_array("pipeline").ok()?;
    let first_is_documents = pipeline
        .first()
        .and_then(|s| s.as_document())
        .is_some_and(|s| s.contains_key("$documents"));
    if !first_is_documents {
        return None;
    }
    Some(local_aggregate(
        req,
        &body,
        pipeline,
        Vec::new(),
        stage_memory,
    ))
}

/// Runs `pipeline` over `docs` on the router and answers with the whole result in one batch
/// (the router keeps no cursor for it, so it must fit in one reply).
fn local_aggregate(
    req: &CommandRequest,
    body: &Document,
    pipeline: &[Bson],
    docs: Vec<Document>,
    stage_memory: usize,
) -> Result<Document, CommandError> {
    let options = crate::engine::aggregate::AggregateOptions::for_request(stage_memory, body);
    let docs = crate::sync::off_the_worker(|| {
        crate::engine::aggregate::run_with(pipeline, docs, &options)
    })?;
    let bytes: usize = docs.iter().map(|d| crate::limits::measure(d).bytes).sum();
    if bytes > crate::wire::MAX_BSON_OBJECT_SIZE {
        return Err(CommandError::new(
            ErrorCode::BSONObjectTooLarge,
            format!("the result of this collection-less aggregation ({bytes} bytes) does not fit in one reply of {} bytes", crate::wire::MAX_BSON_OBJECT_SIZE),
        ));
    }
    let batch: Vec<Bson> = docs.into_iter().map(Bson::Document).collect();
    Ok(
        doc! {"cursor": {"firstBatch": batch, "id": 0i64, "ns": format!("{}.$cmd.aggregate", req.db)}},
    )
}

/// The name of an `aggregate`'s first stage, read from the raw body (nothing is decoded).
pub fn first_stage(req: &CommandRequest) -> Option<String> {
    let pipeline = req.body.raw().get_array("pipeline").ok()?;
    let first = pipeline.into_iter().next()?.ok()?.as_document()?;
    let (name, _) = first.into_iter().next()?.ok()?;
    Some(name.to_string())
}

/// `aggregate` with `$listLocalSessions` first: the sessions of the router's own cache
/// (`{aggregate: 1}` on any database, as mongos answers it), then the rest of the pipeline on
/// the router.
pub fn list_local_sessions(
    state: &crate::command::ServerState,
    req: &CommandRequest,
) -> Result<Document, CommandError> {
    if req.namespace.is_some() {
        return Err(CommandError::new(
            ErrorCode::InvalidNamespace,
            "$listLocalSessions must be run against the database with {aggregate: 1}, not a collection",
        ));
    }
    let body = req.body_document();
    let pipeline = body.get_array("pipeline").map_err(|_| {
        CommandError::new(
            ErrorCode::TypeMismatch,
            "'pipeline' option must be specified as an array",
        )
    })?;
    let spec = pipeline
        .first()
        .and_then(|s| s.as_document())
        .and_then(|s| s.get("$listLocalSessions"))
        .cloned()
        .unwrap_or(Bson::Null);
    let users = crate::command::sessions::parse_list_sessions("$listLocalSessions", &spec)?;
    let docs = state.sessions.list(users.as_deref());
    local_aggregate(
        req,
        &body,
        &pipeline[1..],
        docs,
        state.config.stage_memory_bytes,
    )
}
