//! Cluster DDL through a `--configdb` router, sent as mongos 8.0 sends it
//! (docs/design/config-server.md, §13):
//!
//! - `shardCollection` → `_shardsvrCreateCollection` to the database's primary shard;
//! - `drop` of a sharded collection → `_shardsvrDropCollection`, `dropDatabase` →
//!   `_shardsvrDropDatabase`, both to the primary shard;
//! - `split` → `splitChunk` to the shard that owns the chunk, `mergeChunks` → `mergeChunks` to
//!   the shard that owns the range (each commits on the config server);
//! - `balancerStart` / `balancerStop` / `balancerStatus` → `_configsvrBalancer*` on the config
//!   server.
//!
//! Commands to the primary shard carry the database's version (`databaseVersion`); a
//! StaleDbVersion answer refreshes the database and sends the command again, at most
//! [`super::configdb::MAX_ATTEMPTS`] times, as does a lost connection or an answer saying the
//! shard's primary changed (the next primary resumes the coordinator, or the command joins
//! it). Afterwards the router forgets what it cached of
//! the collection or database, so its next request reads the config server.

use bson::{doc, Bson, Document};

use crate::backend::BackendError;
use crate::command::{CommandError, CommandRequest};
use crate::metadata::configsvr::stale::is_stale_code;
use crate::routing::{ShardKey, ShardKeyPattern};
use crate::value::error_codes::ErrorCode;

use super::ShardedCluster;

/// Fields of a config server's or shard's reply that the router does not pass on.
const NOT_PASSED_ON: &[&str] = &[
    "ok",
    "$clusterTime",
    "operationTime",
    "$configServerState",
    "$gleStats",
    "$topologyTime",
    "lastCommittedOpTime",
    "electionId",
    "opTime",
];

pub(super) fn passed_on(mut reply: Document) -> Document {
    for f in NOT_PASSED_ON {
        reply.remove(*f);
    }
    reply
}

fn reply_code(reply: &Document) -> Option<ErrorCode> {
    match reply.get("code") {
        Some(Bson::Int32(c)) => Some(ErrorCode(*c)),
        Some(Bson::Int64(c)) => Some(ErrorCode(*c as i32)),
        _ => None,
    }
}

/// Runs `command` on `db`'s primary shard with the database's version, creating the database
/// first when `create`. `None` when the database does not exist (and was not created).
async fn to_primary(
    sharded: &ShardedCluster,
    db: &str,
    command: &Document,
    create: bool,
) -> Result<Option<Document>, CommandError> {
    to_primary_on(sharded, db, db, command, create).await
}

/// [`to_primary`], the command run on the database `run_db` (`admin` for the commands that
/// name their database, as `_shardsvrMovePrimary` does).
async fn to_primary_on(
    sharded: &ShardedCluster,
    db: &str,
    run_db: &str,
    command: &Document,
    create: bool,
) -> Result<Option<Document>, CommandError> {
    let mut attempt = 1;
    loop {
        let Some(versions) = sharded.sync_database(db, create).await? else {
            return Ok(None);
        };
        let primary = sharded
            .metadata
            .database(db)
            .and_then(|d| d.get_str("primary").ok().map(str::to_string))
            .ok_or_else(|| {
                CommandError::new(
                    ErrorCode::NamespaceNotFound,
                    format!("database {db} not found"),
                )
            })?;
        let mut body = command.clone();
        if let Some(v) = versions.get("databaseVersion") {
            body.insert("databaseVersion", v.clone());
        }
        body.insert("writeConcern", doc! {"w": "majority"});
        body.insert("$db", run_db);
        let last = attempt >= super::configdb::MAX_ATTEMPTS;
        attempt += 1;
        let reply = match sharded.cluster.run_on(&primary, &body).await {
            Ok(reply) => reply,
            // The primary shard's primary went away: the command goes to the next one, whose
            // coordinator resumes the change (or the request joins it), as mongos resends
            // these coordinators' commands (their retry policy is idempotent).
            Err(e)
                if !last
                    && matches!(e, BackendError::Connect(_) | BackendError::Unreachable(_)) =>
            {
                tracing::debug!(shard = %primary, error = %e, "DDL sent again after a failure");
                tokio::time::sleep(PRIMARY_CHANGE_PAUSE).await;
                continue;
            }
            Err(e) => return Err(e.at(&primary).into()),
        };
        if reply.get_f64("ok").ok() == Some(1.0) {
            return Ok(Some(reply));
        }
        let code = reply_code(&reply);
        if !last && code.is_some_and(|c| primary_changed(c.0)) {
            tokio::time::sleep(PRIMARY_CHANGE_PAUSE).await;
            continue;
        }
        let stale = code.is_some_and(is_stale_code);
        if !stale || last {
            return Err(CommandError::from_shard_reply(&primary, &reply));
        }
        metrics::counter!("sluice_stale_retries_total").increment(1);
        sharded.on_stale(db, &reply);
    }
}

/// How long the router waits before sending a DDL command again after the primary shard's
/// primary changed (about an embedded election).
const PRIMARY_CHANGE_PAUSE: std::time::Duration = std::time::Duration::from_millis(250);

/// Codes with which a shard's member says it stopped being primary during a command: the
/// command is sent again to the new primary.
fn primary_changed(code: i32) -> bool {
    [
        ErrorCode::InterruptedDueToReplStateChange,
        ErrorCode::PrimarySteppedDown,
        ErrorCode::NotWritablePrimary,
        ErrorCode::NotPrimaryNoSecondaryOk,
        ErrorCode::ShutdownInProgress,
    ]
    .iter()
    .any(|c| c.0 == code)
}

/// `shardCollection` with a config server: `_shardsvrCreateCollection` to the primary shard
/// (which pre-splits, creates the collection on the shards and commits on the config server).
pub async fn shard_collection(
    sharded: &ShardedCluster,
    ns: &str,
    pattern: &ShardKeyPattern,
    unique: bool,
    num_initial_chunks: Option<u32>,
) -> Result<Document, CommandError> {
    let (db, coll) = ns.split_once('.').unwrap_or((ns, ""));
    let mut command = doc! {
        "_shardsvrCreateCollection": coll,
        "shardKey": pattern.to_document(),
        "unique": unique,
        "presplitHashedZones": false,
    };
    if let Some(n) = num_initial_chunks {
        command.insert("numInitialChunks", n as i64);
    }
    let result = to_primary(sharded, db, &command, true).await;
    sharded.forget_collection(ns);
    let reply = result?.ok_or_else(|| {
        CommandError::new(
            ErrorCode::NamespaceNotFound,
            format!("database {db} not found"),
        )
    })?;
    let mut out = doc! {"collectionsharded": ns};
    if let Some(uuid) = reply.get("collectionUUID") {
        out.insert("collectionUUID", uuid.clone());
    }
    Ok(out)
}

/// `drop` of a sharded collection with a config server: `_shardsvrDropCollection` to the
/// primary shard.
pub async fn drop_collection(sharded: &ShardedCluster, ns: &str) -> Result<Document, CommandError> {
    let (db, coll) = ns.split_once('.').unwrap_or((ns, ""));
    let result = to_primary(sharded, db, &doc! {"_shardsvrDropCollection": coll}, false).await;
    sharded.forget_collection(ns);
    result?;
    Ok(doc! {"ns": ns})
}

/// `movePrimary: db, to: shard` (admin only) with a config server, as mongos 8.0 sends it:
/// `{_shardsvrMovePrimary: db, to}` on `admin` of the database's primary shard, with the
/// database's version and majority write concern; the router then forgets the database, so
/// its next command reads the new primary. Other routers learn it from StaleDbVersion.
pub async fn move_primary(
    sharded: Option<&ShardedCluster>,
    req: &CommandRequest,
) -> Result<Document, CommandError> {
    req.require_admin()?;
    let body = req.body_document();
    let db = match body.get(&req.name) {
        Some(Bson::String(db)) if !db.is_empty() => db.clone(),
        Some(Bson::String(_)) => {
            return Err(CommandError::new(
                ErrorCode::InvalidNamespace,
                "invalid db name specified: ",
            ))
        }
        _ => {
            return Err(CommandError::new(
                ErrorCode::TypeMismatch,
                format!(
                    "BSON field '{0}.{0}' is the wrong type, expected type 'string'",
                    req.name
                ),
            ))
        }
    };
    let to = match body.get("to") {
        Some(Bson::String(to)) => to.clone(),
        Some(_) => {
            return Err(CommandError::new(
                ErrorCode::TypeMismatch,
                "BSON field 'movePrimary.to' is the wrong type, expected type 'string'",
            ))
        }
        None => {
            return Err(CommandError::new(
                ErrorCode::IdlMissingField,
                "BSON field 'movePrimary.to' is missing but a required field",
            ))
        }
    };
    let Some(sharded) = sharded.filter(|s| s.has_config_server()) else {
        return Err(needs_config_server("movePrimary"));
    };
    let result = to_primary_on(
        sharded,
        &db,
        "admin",
        &doc! {"_shardsvrMovePrimary": &db, "to": &to},
        false,
    )
    .await;
    if let Some(cs) = sharded.config_server() {
        cs.cache().flush_database(&db);
    }
    sharded.cluster.routing.forget_database(&db);
    sharded.metadata.mirror_database(&db, None);
    match result? {
        Some(_) => Ok(Document::new()),
        None => Err(CommandError::new(
            ErrorCode::NamespaceNotFound,
            format!("Database {db} not found"),
        )),
    }
}

/// `dropDatabase` with a config server: `_shardsvrDropDatabase` to the primary shard; a
/// database the config server does not know is answered `{}` (nothing to drop).
pub async fn drop_database(sharded: &ShardedCluster, db: &str) -> Result<Document, CommandError> {
    if matches!(db, "admin" | "config") {
        return Err(CommandError::new(
            ErrorCode::IllegalOperation,
            format!("Cannot drop the {db} database"),
        ));
    }
    let result = to_primary(sharded, db, &doc! {"_shardsvrDropDatabase": 1}, false).await;
    if let Some(cs) = sharded.config_server() {
        cs.cache().flush_database(db);
    }
    sharded.cluster.routing.forget_database(db);
    sharded.metadata.mirror_database(db, None);
    Ok(match result? {
        Some(_) => doc! {"dropped": db},
        None => Document::new(),
    })
}

fn namespace_arg(req: &CommandRequest, body: &Document) -> Result<String, CommandError> {
    let cmd = req.name.as_str();
    match body.get(cmd) {
        Some(Bson::String(s))
            if s.split_once('.')
                .is_some_and(|(d, c)| !d.is_empty() && !c.is_empty()) =>
        {
            Ok(s.clone())
        }
        Some(Bson::String(s)) => Err(CommandError::new(
            ErrorCode::InvalidNamespace,
            format!("Invalid namespace specified '{s}'"),
        )),
        _ => Err(CommandError::new(
            ErrorCode::TypeMismatch,
            format!("BSON field '{cmd}.{cmd}' is the wrong type, expected type 'string'"),
        )),
    }
}

fn needs_config_server(cmd: &str) -> CommandError {
    CommandError::new(
        ErrorCode::IllegalOperation,
        format!("{cmd} changes chunks through a config server: start the router with --configdb"),
    )
}

async fn sharded_snapshot(
    sharded: &ShardedCluster,
    cmd: &str,
    ns: &str,
) -> Result<std::sync::Arc<crate::routing::RoutingSnapshot>, CommandError> {
    sharded.cluster.routing.lookup(ns).await?.ok_or_else(|| {
        CommandError::new(
            ErrorCode::NamespaceNotSharded,
            format!("Can't execute {cmd} on unsharded collection {ns}"),
        )
    })
}

/// Runs `command` on the `admin` database of `shard` and returns its reply, or its error.
async fn on_shard(
    sharded: &ShardedCluster,
    shard: &str,
    mut command: Document,
) -> Result<Document, CommandError> {
    command.insert("$db", "admin");
    let reply = sharded
        .cluster
        .run_on(shard, &command)
        .await
        .map_err(|e| e.at(shard))?;
    if reply.get_f64("ok").ok() != Some(1.0) {
        return Err(CommandError::from_shard_reply(shard, &reply));
    }
    Ok(reply)
}

/// An error mongos answers with `errmsg` alone (its `split` is an errmsg command); Sluice gives
/// it InvalidOptions (72) as well, since a stock driver cannot read an error without a code.
fn split_form(message: impl Into<String>) -> CommandError {
    CommandError::new(ErrorCode::InvalidOptions, message)
}

/// An optional field of `split` that must be `kind` when present (an empty one counts as
/// absent, as mongos's field parser has it).
fn split_field<'a>(
    body: &'a Document,
    field: &str,
    array: bool,
) -> Result<Option<&'a Bson>, CommandError> {
    match body.get(field) {
        None => Ok(None),
        Some(Bson::Document(d)) if !array => Ok((!d.is_empty()).then_some(&body[field])),
        Some(Bson::Array(a)) if array => Ok((!a.is_empty()).then_some(&body[field])),
        Some(v) => Err(split_form(format!(
            "wrong type for '{field}' field, expected {}, found {field}: {v}",
            if array { "array" } else { "object" }
        ))),
    }
}

/// `split`: `{split: ns, middle}` splits the chunk holding `middle` there; `{split: ns, find}`
/// the chunk holding the document `find` names by its shard key, and `{split: ns, bounds:
/// [min, max]}` the chunk with exactly those bounds, both at the median key the owning shard
/// finds (`splitVector` with `force`, as mongos asks). The split itself is done by the shard
/// that owns the chunk (`splitChunk`, committed on the config server as
/// `_configsvrCommitChunkSplit`). `middle` and `bounds` are whole shard keys, in hashed values
/// for a hashed field, as mongos takes them. Checks and messages in mongos's order.
pub async fn split(
    sharded: Option<&ShardedCluster>,
    req: &CommandRequest,
) -> Result<Document, CommandError> {
    let body = req.body_document();
    let ns = namespace_arg(req, &body)?;
    let Some(sharded) = sharded.filter(|s| s.has_config_server()) else {
        return Err(needs_config_server("split"));
    };
    let snapshot = sharded_snapshot(sharded, "split", &ns).await?;
    let find = split_field(&body, "find", false)?;
    let bounds = split_field(&body, "bounds", true)?;
    let bounds = match bounds {
        Some(Bson::Array(b)) => {
            let (Some(lo), Some(hi)) = (b.first(), b.get(1)) else {
                return Err(split_form("upper bound not specified"));
            };
            Some((lo, hi))
        }
        _ => None,
    };
    if find.is_some() && bounds.is_some() {
        return Err(split_form(
            "cannot specify bounds and find at the same time",
        ));
    }
    let middle = split_field(&body, "middle", false)?;
    if find.is_none() && bounds.is_none() && middle.is_none() {
        return Err(split_form("need to specify find/bounds or middle"));
    }
    if find.is_some() && middle.is_some() {
        return Err(split_form("cannot specify find and middle together"));
    }
    if bounds.is_some() && middle.is_some() {
        return Err(split_form("cannot specify bounds and middle together"));
    }
    let pattern = &snapshot.pattern;
    let whole_key = |d: &Bson| -> Option<ShardKey> {
        let Bson::Document(d) = d else { return None };
        if d.len() != pattern.fields().len() {
            return None;
        }
        pattern.key_from_document(d).ok()
    };
    let (chunk, split_key) = if let Some(Bson::Document(find)) = find {
        let key = match pattern.extract_from_filter(find) {
            crate::routing::FilterKeys::Keys(keys) if keys.len() == 1 => keys[0].clone(),
            _ => {
                return Err(split_form(format!(
                    "no shard key found in chunk query {find}"
                )))
            }
        };
        (snapshot.chunks.find(&key).cloned(), None)
    } else if let Some((lo, hi)) = bounds {
        let (Some(min), Some(max)) = (whole_key(lo), whole_key(hi)) else {
            return Err(split_form(format!(
                "shard key bounds [{lo},{hi}) are not valid for shard key pattern {}",
                pattern.to_document()
            )));
        };
        let chunk = snapshot.chunks.find(&min).cloned();
        if !chunk.as_ref().is_some_and(|c| c.min == min && c.max == max) {
            return Err(split_form(format!(
                "no chunk found with the shard key bounds [{}, {})",
                pattern.key_document(&min),
                pattern.key_document(&max)
            )));
        }
        (chunk, None)
    } else {
        let m = middle.cloned().unwrap_or(Bson::Null);
        let Some(key) = whole_key(&m) else {
            return Err(split_form(format!(
                "new split key {m} is not valid for shard key pattern {}",
                pattern.to_document()
            )));
        };
        let chunk = snapshot.chunks.find(&key).cloned();
        if let Some(c) = &chunk {
            if c.min == key || c.max == key {
                return Err(split_form(format!(
                    "new split key {m} is a boundary key of existing chunk [{},{})",
                    pattern.key_document(&c.min),
                    pattern.key_document(&c.max)
                )));
            }
        }
        (chunk, Some(key))
    };
    let chunk = chunk.ok_or_else(|| {
        CommandError::new(
            ErrorCode::InternalError,
            format!("{ns} has no chunk for that key"),
        )
    })?;
    let split_key = match split_key {
        Some(k) => pattern.key_document(&k),
        None => median_key(sharded, &ns, pattern, &chunk).await?,
    };
    let command = doc! {
        "splitChunk": &ns,
        "from": &chunk.shard,
        "keyPattern": pattern.to_document(),
        "epoch": snapshot.epoch,
        "timestamp": snapshot.timestamp,
        "min": pattern.key_document(&chunk.min),
        "max": pattern.key_document(&chunk.max),
        "splitKeys": [split_key],
    };
    let result = on_shard(sharded, &chunk.shard, command).await;
    sharded.forget_collection(&ns);
    result?;
    Ok(Document::new())
}

/// The key near the middle of `chunk`'s documents, from the shard that owns it (`splitVector`
/// with `force`, as mongos asks); CannotSplit (106) when the chunk has no such key.
async fn median_key(
    sharded: &ShardedCluster,
    ns: &str,
    pattern: &crate::routing::ShardKeyPattern,
    chunk: &crate::routing::Chunk,
) -> Result<Document, CommandError> {
    let reply = on_shard(
        sharded,
        &chunk.shard,
        doc! {
            "splitVector": ns,
            "keyPattern": pattern.to_document(),
            "min": pattern.key_document(&chunk.min),
            "max": pattern.key_document(&chunk.max),
            "force": true,
        },
    )
    .await?;
    match reply.get_array("splitKeys").ok().and_then(|k| k.first()) {
        Some(Bson::Document(k)) => Ok(k.clone()),
        _ => Err(CommandError::new(
            ErrorCode::CannotSplit,
            "Unable to find median in chunk because chunk is indivisible.",
        )),
    }
}

/// `mergeChunks {mergeChunks: ns, bounds: [min, max]}`: the chunks exactly covering the range,
/// all on one shard, become one (`mergeChunks` to that shard, committed on the config server
/// as `_configsvrCommitChunksMerge`).
pub async fn merge_chunks(
    sharded: Option<&ShardedCluster>,
    req: &CommandRequest,
) -> Result<Document, CommandError> {
    let body = req.body_document();
    let ns = namespace_arg(req, &body)?;
    let Some(sharded) = sharded.filter(|s| s.has_config_server()) else {
        return Err(needs_config_server("mergeChunks"));
    };
    let (min, max) = match body.get("bounds") {
        Some(Bson::Array(b)) => match b.as_slice() {
            [Bson::Document(lo), Bson::Document(hi)] if !lo.is_empty() && !hi.is_empty() => {
                (lo.clone(), hi.clone())
            }
            [_, _] => {
                return Err(CommandError::new(
                    ErrorCode::InvalidOptions,
                    "no min key or max key specified",
                ))
            }
            _ => {
                return Err(CommandError::new(
                    ErrorCode::InvalidOptions,
                    "only a min and max bound may be specified",
                ))
            }
        },
        Some(_) => {
            return Err(CommandError::new(
                ErrorCode::TypeMismatch,
                "BSON field 'mergeChunks.bounds' is the wrong type, expected type 'array'",
            ))
        }
        None => {
            return Err(CommandError::new(
                ErrorCode::InvalidOptions,
                "no bounds were specified",
            ))
        }
    };
    let snapshot = sharded_snapshot(sharded, "mergeChunks", &ns).await?;
    let pattern = &snapshot.pattern;
    let invalid = || {
        CommandError::new(
            ErrorCode::InvalidOptions,
            format!(
                "shard key bounds [{min},{max}) are not valid for shard key pattern {}",
                pattern.to_document()
            ),
        )
    };
    let lo = pattern.key_from_document(&min).map_err(|_| invalid())?;
    pattern.key_from_document(&max).map_err(|_| invalid())?;
    let first = snapshot.chunks.find(&lo).cloned().ok_or_else(invalid)?;
    let config = sharded
        .config_server()
        .map(|cs| cs.source.name().to_string())
        .unwrap_or_default();
    let command = doc! {
        "mergeChunks": &ns,
        "bounds": [min, max],
        "config": config,
        "shardName": &first.shard,
        "epoch": snapshot.epoch,
        "timestamp": snapshot.timestamp,
    };
    let result = on_shard(sharded, &first.shard, command).await;
    sharded.forget_collection(&ns);
    result?;
    Ok(Document::new())
}

/// `balancerStart`, `balancerStop`, `balancerStatus`: `_configsvrBalancerStart` / `Stop` /
/// `Status` on the config server, its reply passed on. Without a config server Sluice has no
/// balancer: the status is `off` and starting or stopping it is refused.
pub async fn balancer(
    sharded: Option<&ShardedCluster>,
    req: &CommandRequest,
) -> Result<Document, CommandError> {
    let name = req.name.as_str();
    req.require_admin()?;
    let Some(sharded) = sharded.filter(|s| s.has_config_server()) else {
        if name == "balancerStatus" {
            return Ok(super::sharding::balancer_status());
        }
        return Err(CommandError::new(
            ErrorCode::IllegalOperation,
            format!("{name}: a router without a config server (--configdb) has no balancer"),
        ));
    };
    let command = match name {
        "balancerStart" => "_configsvrBalancerStart",
        "balancerStop" => "_configsvrBalancerStop",
        _ => "_configsvrBalancerStatus",
    };
    let reply = sharded
        .config_server_command_as_is(doc! {command: 1})
        .await?;
    Ok(passed_on(reply))
}

/// `renameCollection` of a sharded collection through a config server: `{_shardsvrRenameCollection:
/// from, to, dropTarget}` with the database's version to the database's primary shard (as
/// mongos 5.0+ sends it), which renames it on every shard and records it on the config server;
/// then this router forgets both names.
pub async fn rename_sharded(
    sharded: &ShardedCluster,
    from: &str,
    to: &str,
    drop_target: bool,
) -> Result<Document, CommandError> {
    let db = from.split('.').next().unwrap_or_default();
    let command = doc! {
        "_shardsvrRenameCollection": from,
        "to": to,
        "dropTarget": drop_target,
        "stayTemp": false,
    };
    let result = to_primary(sharded, db, &command, false).await;
    sharded.forget_collection(from);
    sharded.forget_collection(to);
    result?.ok_or_else(|| {
        CommandError::new(
            ErrorCode::NamespaceNotFound,
            format!("Source collection {from} does not exist"),
        )
    })?;
    Ok(doc! {"ok": 1.0})
}
