//! Cluster administration through a `--configdb` router, as mongos does it: reads of the
//! `config` database forwarded to the config server, `addShard` (`_configsvrAddShard`) and the
//! shard list read again when it changed, and `flushRouterConfig` of everything, one database
//! or one collection. docs/design/config-server.md, §13.

use bson::{doc, Bson, Document};

use crate::command::{CommandError, CommandRequest};
use crate::value::error_codes::ErrorCode;

use super::ShardedCluster;

/// Fields of a client's command that are the client's session with the router, not the
/// config server's (the router's own connection sends its own).
const SESSION_FIELDS: &[&str] = &[
    "$db",
    "lsid",
    "txnNumber",
    "$clusterTime",
    "$readPreference",
    "autocommit",
    "startTransaction",
    "apiVersion",
    "apiStrict",
    "apiDeprecationErrors",
];

/// Most bytes of documents one forwarded `config` read gathers (the whole result is one
/// reply, with no cursor left open on the config server).
const MAX_CONFIG_READ_BYTES: usize = crate::wire::MAX_BSON_OBJECT_SIZE;

/// A read of the `config` database with a config server: sent to the config server's primary
/// (as mongos sends them), every batch gathered into the first so no cursor stays open on
/// the config server; the reply without the config server's own fields.
pub async fn config_read(
    sharded: &ShardedCluster,
    req: &CommandRequest,
) -> Result<Document, CommandError> {
    let Some(cs) = sharded.config_server() else {
        return Err(CommandError::new(
            ErrorCode::InternalError,
            "no config server to read from",
        ));
    };
    let mut command = req.body_document();
    for f in SESSION_FIELDS {
        command.remove(*f);
    }
    let source = &cs.source;
    let error = |e: crate::metadata::configsvr::MetadataError| CommandError::new(e.code, e.message);
    let mut reply = source
        .run_command_in("config", command)
        .await
        .map_err(error)?;
    let cursor = match reply.get_document_mut("cursor") {
        Ok(c) => c,
        Err(_) => return Ok(super::cluster_ddl::passed_on(reply)),
    };
    let mut id = cursor.get_i64("id").unwrap_or(0);
    let ns = cursor.get_str("ns").unwrap_or_default().to_string();
    let coll = ns
        .split_once('.')
        .map_or(ns.as_str(), |(_, c)| c)
        .to_string();
    let mut batch: Vec<Bson> = cursor
        .get_array("firstBatch")
        .map(|a| a.to_vec())
        .unwrap_or_default();
    let mut bytes: usize = batch
        .iter()
        .filter_map(Bson::as_document)
        .map(|d| crate::limits::measure(d).bytes)
        .sum();
    while id != 0 {
        let more = source
            .run_command_in("config", doc! {"getMore": id, "collection": &coll})
            .await
            .map_err(error)?;
        let c = more.get_document("cursor").map_err(|_| {
            CommandError::new(
                ErrorCode::InternalError,
                "the config server's getMore reply has no cursor",
            )
        })?;
        id = c.get_i64("id").unwrap_or(0);
        for d in c
            .get_array("nextBatch")
            .map(|a| a.as_slice())
            .unwrap_or(&[])
        {
            bytes += d
                .as_document()
                .map_or(0, |d| crate::limits::measure(d).bytes);
            batch.push(d.clone());
        }
        if bytes > MAX_CONFIG_READ_BYTES {
            if id != 0 {
                let _ = source
                    .run_command_in("config", doc! {"killCursors": &coll, "cursors": [id]})
                    .await;
            }
            return Err(CommandError::new(
                ErrorCode::BSONObjectTooLarge,
                format!("the result of this read of config.{coll} ({bytes} bytes so far) does not fit in one reply of {MAX_CONFIG_READ_BYTES} bytes: narrow it"),
            ));
        }
    }
    cursor.insert("firstBatch", batch);
    cursor.insert("id", 0i64);
    Ok(super::cluster_ddl::passed_on(reply))
}

/// `listShards` with a config server: its `config.shards`.
pub async fn list_shards(sharded: &ShardedCluster) -> Result<Document, CommandError> {
    let req = CommandRequest::from_document("config", &doc! {"find": "shards", "$db": "config"})?;
    let reply = config_read(sharded, &req).await?;
    let shards = reply
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .cloned()
        .unwrap_or_default();
    Ok(doc! {"shards": shards})
}

/// `addShard: "<rs>/host:port,…" | "host:port"` (`name` optional): `_configsvrAddShard` on the
/// config server, then this router reads the shard list again. Replies `{shardAdded}`.
pub async fn add_shard(
    sharded: Option<&ShardedCluster>,
    req: &CommandRequest,
) -> Result<Document, CommandError> {
    req.require_admin()?;
    let Some(sharded) = sharded.filter(|s| s.has_config_server()) else {
        return Err(CommandError::new(
            ErrorCode::IllegalOperation,
            "addShard records a shard on the config server: start the router with --configdb (a router started with --config lists its shards in its configuration file)",
        ));
    };
    let body = req.body_document();
    let host = match body.get(&req.name) {
        Some(Bson::String(s)) if !s.is_empty() => s.clone(),
        _ => {
            return Err(CommandError::new(
                ErrorCode::TypeMismatch,
                "BSON field 'addShard.addShard' is the wrong type, expected type 'string'",
            ))
        }
    };
    let mut command = doc! {"_configsvrAddShard": &host};
    match body.get("name") {
        None => {}
        Some(Bson::String(n)) => {
            command.insert("name", n.clone());
        }
        Some(_) => {
            return Err(CommandError::new(
                ErrorCode::TypeMismatch,
                "BSON field 'addShard.name' is the wrong type, expected type 'string'",
            ))
        }
    }
    let reply = sharded.config_server_command(command).await?;
    sharded.refresh_shards().await?;
    let mut out = Document::new();
    if let Some(added) = reply.get("shardAdded") {
        out.insert("shardAdded", added.clone());
    }
    Ok(out)
}

/// `flushRouterConfig`: `1` / `true` (or nothing) forgets everything and reads the shard
/// list again; `"db"` forgets one database and its collections; `"db.coll"` one collection.
pub async fn flush_router_config(
    sharded: Option<&ShardedCluster>,
    req: &CommandRequest,
) -> Result<Document, CommandError> {
    let Some(sharded) = sharded else {
        return Ok(doc! {"flushed": true});
    };
    let body = req.body_document();
    let target = match body.get(&req.name) {
        Some(Bson::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Bson::String(_)) => {
            return Err(CommandError::new(
                ErrorCode::InvalidNamespace,
                "flushRouterConfig needs a database or collection name, or 1",
            ))
        }
        _ => None,
    };
    let Some(cs) = sharded.config_server() else {
        sharded.cluster.routing.flush();
        return Ok(doc! {"flushed": true});
    };
    match target {
        None => {
            sharded.cluster.routing.flush();
            sharded.refresh_shards().await?;
        }
        Some(t) if t.contains('.') => {
            cs.cache().flush_collection(&t);
        }
        Some(db) => {
            cs.cache().flush_database(&db);
        }
    }
    Ok(doc! {"flushed": true})
}

/// `removeShard: "<shard id>"`: `_configsvrRemoveShard` on the config server with majority
/// write concern, its reply passed on (`started`, `ongoing` with `remaining`, `completed`);
/// once it is `completed` this router reads the shard list again.
pub async fn remove_shard(
    sharded: Option<&ShardedCluster>,
    req: &CommandRequest,
) -> Result<Document, CommandError> {
    req.require_admin()?;
    let body = req.body_document();
    let target = match body.get(&req.name) {
        Some(Bson::String(s)) => s.clone(),
        _ => {
            return Err(CommandError::new(
                ErrorCode::TypeMismatch,
                format!("Field '{}' must be of type string", req.name),
            ))
        }
    };
    let Some(sharded) = sharded.filter(|s| s.has_config_server()) else {
        return Err(CommandError::new(
            ErrorCode::IllegalOperation,
            "removeShard drains a shard through the config server: start the router with --configdb (a router started with --config lists its shards in its configuration file)",
        ));
    };
    let reply = sharded
        .config_server_command(doc! {"_configsvrRemoveShard": &target})
        .await?;
    if reply.get_str("state").ok() == Some("completed") {
        sharded.refresh_shards().await?;
    }
    Ok(super::cluster_ddl::passed_on(reply))
}
