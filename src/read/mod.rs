//! Reads on sharded collections: `find`, `aggregate`, `count`, `distinct`, with router-side
//! cursors (`getMore`, `killCursors`).
//!
//! A filter that pins the shard key goes to the owning shards, any other to every shard owning
//! chunks. `find` sends the sort, `limit + skip` and (when it keeps the sort fields) the
//! projection to each shard, k-way merges the shards' sorted results in MongoDB's order and
//! applies `skip` and `limit`; `allowPartialResults` skips a shard that cannot be reached.
//! `aggregate` splits the pipeline at its first stage that needs all the data
//! ([`merge::split_pipeline`]): the shard part runs on each shard, the router merges (sorted
//! merge, `$group` re-grouping) and runs the rest. `count` and `distinct` are merged. Each
//! shard's part is drained into memory before merging, so a result is bounded by what the
//! router can hold; results are served through router cursors, reaped after 10 idle minutes.

pub mod merge;

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use bson::{doc, Bson, Document};

use crate::backend::limiter::{OpKind, Outcome};
use crate::backend::BackendError;
use crate::cluster::{Cluster, SlotRequest};
use crate::command::{number_field, truthy, CommandError, CommandRequest};
use crate::embedded::query::{Projection, SortSpec};
use crate::error_codes::ErrorCode;
use crate::order::values_equal;
use crate::routing::{FilterKeys, RoutingSnapshot};

/// Default first-batch size, as mongod and mongos.
const DEFAULT_BATCH: usize = 101;

/// A cursor the router serves from gathered results.
#[derive(Debug)]
struct RouterCursor {
    ns: String,
    remaining: VecDeque<Document>,
    owner: i64,
    last_used: std::time::Instant,
}

/// The router's open cursors on sharded collections.
#[derive(Debug)]
pub struct RouterCursors {
    cursors: Mutex<HashMap<i64, RouterCursor>>,
    idle_timeout: Mutex<std::time::Duration>,
}

impl Default for RouterCursors {
    fn default() -> Self {
        RouterCursors {
            cursors: Mutex::new(HashMap::new()),
            idle_timeout: Mutex::new(std::time::Duration::from_secs(600)),
        }
    }
}

fn engine_err(e: crate::embedded::EngineError) -> CommandError {
    CommandError::new(e.code, e.message)
}

/// The shards a filter must be sent to.
fn target_shards(snap: &RoutingSnapshot, filter: &Document) -> Vec<String> {
    match snap.pattern.extract_from_filter(filter) {
        FilterKeys::Keys(keys) => {
            let mut shards: Vec<String> = keys
                .iter()
                .filter_map(|k| snap.shard_for(k).map(|s| s.to_string()))
                .collect();
            shards.sort();
            shards.dedup();
            shards
        }
        FilterKeys::Untargetable => snap.chunks.shards().into_iter().collect(),
    }
}

/// Runs a cursor-returning command on each of `shards` at once and drains every cursor.
/// With `partial`, a shard that cannot be reached is skipped (and reported in the flag).
async fn fan_out(
    cluster: &Cluster,
    snap: &RoutingSnapshot,
    shards: Vec<String>,
    db: &str,
    coll: &str,
    command: &Document,
    partial: bool,
) -> Result<(Vec<Vec<Document>>, bool), CommandError> {
    let mut futures = Vec::new();
    for shard in shards {
        let mut cmd = command.clone();
        cmd.insert("$db", db);
        if cluster.is_shard_server(&shard) {
            cmd.insert("shardVersion", snap.shard_version(&shard));
        }
        futures.push(async move {
            let ns = format!("{db}.{coll}");
            let name = cmd.keys().next().cloned().unwrap_or_default();
            // The shard's queue and adaptive limit decide when the read may run.
            let work = SlotRequest {
                op: OpKind::Read,
                command: &name,
                ns: &ns,
                operations: 1,
                bytes: 0,
            };
            let permit = cluster.slot(&shard, work, None).await.map_err(|e| {
                (
                    false,
                    CommandError::new(ErrorCode::ExceededTimeLimit, e.to_string()),
                )
            })?;
            let result = cluster.run_on(&shard, &cmd).await;
            if let Some(p) = permit {
                p.finish(match &result {
                    Ok(_) => Outcome::Completed,
                    Err(BackendError::Timeout(_)) => Outcome::TimedOut,
                    Err(_) => Outcome::NotCounted,
                });
            }
            let reply = result.map_err(|e| {
                (
                    true,
                    CommandError::new(e.code(), format!("{e} (shard {shard})")),
                )
            })?;
            if reply.get_f64("ok").ok() != Some(1.0) {
                return Err((false, CommandError::from_shard_reply(&shard, &reply)));
            }
            let cursor = reply.get_document("cursor").cloned().unwrap_or_default();
            let mut out: Vec<Document> = cursor
                .get_array("firstBatch")
                .into_iter()
                .flatten()
                .filter_map(|d| d.as_document().cloned())
                .collect();
            let mut id = cursor.get_i64("id").unwrap_or(0);
            while id != 0 {
                let more = cluster
                    .run_on(
                        &shard,
                        &doc! {"getMore": id, "collection": coll, "batchSize": 10_000, "$db": db},
                    )
                    .await
                    .map_err(|e| {
                        (
                            true,
                            CommandError::new(e.code(), format!("{e} (shard {shard})")),
                        )
                    })?;
                if more.get_f64("ok").ok() != Some(1.0) {
                    return Err((false, CommandError::from_shard_reply(&shard, &more)));
                }
                let c = more.get_document("cursor").cloned().unwrap_or_default();
                out.extend(
                    c.get_array("nextBatch")
                        .into_iter()
                        .flatten()
                        .filter_map(|d| d.as_document().cloned()),
                );
                id = c.get_i64("id").unwrap_or(0);
            }
            Ok(out)
        });
    }
    let mut streams = Vec::new();
    let mut skipped = false;
    for r in crate::backend::join_all(futures).await {
        match r {
            Ok(docs) => streams.push(docs),
            Err((true, _)) if partial => skipped = true,
            Err((_, e)) => return Err(e),
        }
    }
    Ok((streams, skipped))
}

/// Runs a plain command (`count`, `distinct`) on each targeted shard.
async fn on_each(
    cluster: &Cluster,
    snap: &RoutingSnapshot,
    shards: Vec<String>,
    db: &str,
    command: &Document,
) -> Result<Vec<Document>, CommandError> {
    let mut out = Vec::new();
    let futures: Vec<_> = shards
        .into_iter()
        .map(|shard| {
            let mut cmd = command.clone();
            cmd.insert("$db", db);
            if cluster.is_shard_server(&shard) {
                cmd.insert("shardVersion", snap.shard_version(&shard));
            }
            async move {
                let reply = cluster
                    .run_on(&shard, &cmd)
                    .await
                    .map_err(|e| CommandError::new(e.code(), format!("{e} (shard {shard})")))?;
                if reply.get_f64("ok").ok() != Some(1.0) {
                    return Err(CommandError::from_shard_reply(&shard, &reply));
                }
                Ok(reply)
            }
        })
        .collect();
    for r in crate::backend::join_all(futures).await {
        out.push(r?);
    }
    Ok(out)
}

fn doc_field(body: &Document, field: &str, cmd: &str) -> Result<Document, CommandError> {
    match body.get(field) {
        None | Some(Bson::Null) => Ok(Document::new()),
        Some(Bson::Document(d)) => Ok(d.clone()),
        Some(_) => Err(CommandError::new(
            ErrorCode::TypeMismatch,
            format!("BSON field '{cmd}.{field}' is the wrong type, expected type 'object'"),
        )),
    }
}

impl RouterCursors {
    /// Changes how long an unused cursor lives (10 minutes by default).
    pub fn set_idle_timeout(&self, t: std::time::Duration) {
        *self.idle_timeout.lock().unwrap_or_else(|p| p.into_inner()) = t;
    }

    /// Open cursors.
    pub fn len(&self) -> usize {
        self.cursors.lock().map(|c| c.len()).unwrap_or(0)
    }

    /// Whether no cursor is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops cursors unused for longer than the idle timeout.
    pub fn reap(&self) {
        let timeout = *self.idle_timeout.lock().unwrap_or_else(|p| p.into_inner());
        let mut cursors = self.cursors.lock().unwrap_or_else(|p| p.into_inner());
        cursors.retain(|_, c| c.last_used.elapsed() < timeout);
    }

    fn open(
        &self,
        ns: String,
        docs: Vec<Document>,
        batch: usize,
        single: bool,
        owner: i64,
        first_field: &str,
    ) -> Document {
        let mut remaining: VecDeque<Document> = docs.into();
        let take = batch.min(remaining.len());
        let first: Vec<Bson> = remaining.drain(..take).map(Bson::Document).collect();
        let id = if remaining.is_empty() || single {
            0i64
        } else {
            let mut cursors = self.cursors.lock().unwrap_or_else(|p| p.into_inner());
            let mut id;
            loop {
                id = (bson::oid::ObjectId::new()
                    .bytes()
                    .iter()
                    .fold(0u64, |a, b| a.wrapping_mul(131).wrapping_add(*b as u64))
                    >> 2) as i64
                    ^ (std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.subsec_nanos() as i64)
                        .unwrap_or(7));
                if id > 0 && !cursors.contains_key(&id) {
                    break;
                }
            }
            cursors.insert(
                id,
                RouterCursor {
                    ns: ns.clone(),
                    remaining,
                    owner,
                    last_used: std::time::Instant::now(),
                },
            );
            id
        };
        doc! {"cursor": {first_field: first, "id": id, "ns": ns}}
    }

    /// `getMore` on a router cursor; a cursor belongs to the connection that opened it.
    pub fn get_more(&self, req: &CommandRequest, owner: i64) -> Result<Document, CommandError> {
        let body = req.body_document();
        let Some(Bson::Int64(id)) = body.get("getMore").cloned() else {
            return Err(CommandError::new(
                ErrorCode::TypeMismatch,
                "BSON field 'getMore.getMore' is the wrong type, expected type 'long'",
            ));
        };
        let ns = format!("{}.{}", req.db, body.get_str("collection").unwrap_or(""));
        let batch = number_field(&body, "batchSize")
            .filter(|b| *b > 0)
            .map(|b| b as usize)
            .unwrap_or(usize::MAX);
        self.reap();
        let mut cursors = self.cursors.lock().unwrap_or_else(|p| p.into_inner());
        let Some(c) = cursors.get_mut(&id).filter(|c| c.owner == owner) else {
            return Err(CommandError::new(
                ErrorCode::CursorNotFound,
                format!("cursor id {id} not found"),
            ));
        };
        if c.ns != ns {
            return Err(CommandError::new(ErrorCode::Unauthorized, format!("Requested getMore on namespace '{ns}', but cursor belongs to a different namespace {}", c.ns)));
        }
        let take = batch.min(c.remaining.len());
        let next: Vec<Bson> = c.remaining.drain(..take).map(Bson::Document).collect();
        c.last_used = std::time::Instant::now();
        let next_id = if c.remaining.is_empty() {
            cursors.remove(&id);
            0
        } else {
            id
        };
        Ok(doc! {"cursor": {"nextBatch": next, "id": next_id, "ns": ns}})
    }

    /// `killCursors` on router cursors.
    pub fn kill(&self, req: &CommandRequest, owner: i64) -> Document {
        let body = req.body_document();
        let mut killed = Vec::new();
        let mut not_found = Vec::new();
        let mut cursors = self.cursors.lock().unwrap_or_else(|p| p.into_inner());
        for id in body.get_array("cursors").into_iter().flatten() {
            if let Bson::Int64(id) = id {
                if cursors.get(id).is_some_and(|c| c.owner == owner) {
                    cursors.remove(id);
                    killed.push(*id);
                } else {
                    not_found.push(*id);
                }
            }
        }
        doc! {"cursorsKilled": killed, "cursorsNotFound": not_found, "cursorsAlive": [], "cursorsUnknown": []}
    }
}

/// Serves a read on a sharded collection; `None` if the command is not a read the router
/// handles.
pub async fn read(
    cluster: &Cluster,
    snap: &RoutingSnapshot,
    req: &CommandRequest,
    owner: i64,
) -> Option<Result<Document, CommandError>> {
    let body = req.body_document();
    let coll = body.get_str(&req.name).unwrap_or("").to_string();
    let db = req.db.clone();
    let ns = format!("{db}.{coll}");
    cluster.cursors.reap();
    Some(match req.name.as_str() {
        "find" => async {
            let filter = doc_field(&body, "filter", "find")?;
            let sort_doc = doc_field(&body, "sort", "find")?;
            let sort = SortSpec::parse(&sort_doc).map_err(engine_err)?;
            let projection_doc = doc_field(&body, "projection", "find")?;
            let projection = Projection::parse(&projection_doc).map_err(engine_err)?;
            let skip = number_field(&body, "skip").unwrap_or(0).max(0) as usize;
            let mut single = body.get("singleBatch").is_some_and(truthy);
            let limit = match number_field(&body, "limit") {
                Some(l) if l < 0 => {
                    single = true;
                    Some(l.unsigned_abs() as usize)
                }
                Some(0) | None => None,
                Some(l) => Some(l as usize),
            };
            let partial = body.get("allowPartialResults").is_some_and(truthy);
            // The projection goes to the shards when the router does not need the fields it
            // drops to sort.
            let push_projection = projection.is_some()
                && sort_doc.keys().all(|k| {
                    let p = Projection::parse(&projection_doc).ok().flatten();
                    p.is_some_and(|p| p.apply(&doc! {k.clone(): 1}).contains_key(k.as_str()))
                });
            let mut shard_cmd = doc! {"find": &coll, "filter": filter.clone(), "batchSize": 10_000};
            if !sort_doc.is_empty() {
                shard_cmd.insert("sort", sort_doc.clone());
            }
            if let Some(l) = limit {
                shard_cmd.insert("limit", (l + skip) as i64);
            }
            if push_projection {
                shard_cmd.insert("projection", projection_doc.clone());
            }
            for k in ["collation", "hint", "maxTimeMS", "comment", "readConcern"] {
                if let Some(v) = body.get(k) {
                    shard_cmd.insert(k, v.clone());
                }
            }
            let (streams, skipped) = fan_out(cluster, snap, target_shards(snap, &filter), &db, &coll, &shard_cmd, partial).await?;
            let merged = if sort.is_empty() { streams.into_iter().flatten().collect() } else { merge::k_way_merge(&sort, streams) };
            let docs: Vec<Document> = merged
                .into_iter()
                .skip(skip)
                .take(limit.unwrap_or(usize::MAX))
                .map(|d| match (&projection, push_projection) {
                    (Some(p), false) => p.apply(&d),
                    _ => d,
                })
                .collect();
            let batch = number_field(&body, "batchSize").map(|b| b.max(0) as usize).unwrap_or(DEFAULT_BATCH);
            let mut reply = cluster.cursors.open(ns.clone(), docs, if single { usize::MAX } else { batch }, single, owner, "firstBatch");
            if skipped {
                if let Ok(c) = reply.get_document_mut("cursor") {
                    c.insert("partialResultsReturned", true);
                }
            }
            Ok(reply)
        }
        .await,
        "aggregate" => async {
            let pipeline = body.get_array("pipeline").cloned().map_err(|_| {
                CommandError::new(ErrorCode::TypeMismatch, "'pipeline' option must be specified as an array")
            })?;
            if body.get("cursor").is_none() && !body.get("explain").is_some_and(truthy) {
                return Err(CommandError::new(ErrorCode::FailedToParse, "The 'cursor' option is required, except for aggregate with the explain argument"));
            }
            let split = merge::split_pipeline(&pipeline);
            let filter = pipeline
                .first()
                .and_then(|s| s.as_document())
                .and_then(|s| s.get_document("$match").ok())
                .cloned()
                .unwrap_or_default();
            let shard_cmd = doc! {"aggregate": &coll, "pipeline": split.shard_part.clone(), "cursor": {"batchSize": 10_000}};
            let (streams, _) = fan_out(cluster, snap, target_shards(snap, &filter), &db, &coll, &shard_cmd, false).await?;
            let merged = match &split.merge_sort {
                Some(sort) => merge::k_way_merge(&SortSpec::parse(sort).map_err(engine_err)?, streams),
                None => streams.into_iter().flatten().collect(),
            };
            let out = crate::embedded::aggregate::run(&split.router_part, merged).map_err(engine_err)?;
            let batch = body
                .get_document("cursor")
                .ok()
                .and_then(|c| number_field(c, "batchSize"))
                .map(|b| b.max(0) as usize)
                .unwrap_or(DEFAULT_BATCH);
            Ok(cluster.cursors.open(ns.clone(), out, batch, false, owner, "firstBatch"))
        }
        .await,
        "count" => async {
            let query = doc_field(&body, "query", "count")?;
            let skip = number_field(&body, "skip").unwrap_or(0).max(0);
            let limit = number_field(&body, "limit").filter(|l| *l != 0).map(|l| l.abs());
            let mut cmd = doc! {"count": &coll, "query": query.clone()};
            if let Some(l) = limit {
                cmd.insert("limit", l + skip);
            }
            let replies = on_each(cluster, snap, target_shards(snap, &query), &db, &cmd).await?;
            let total: i64 = replies.iter().map(|r| number_field(r, "n").unwrap_or(0)).sum();
            let mut n = (total - skip).max(0);
            if let Some(l) = limit {
                n = n.min(l);
            }
            Ok(doc! {"n": i32::try_from(n).map(Bson::Int32).unwrap_or(Bson::Int64(n))})
        }
        .await,
        "distinct" => async {
            let key = body
                .get_str("key")
                .map_err(|_| CommandError::new(ErrorCode(40414), "BSON field 'distinct.key' is missing but a required field"))?
                .to_string();
            let query = doc_field(&body, "query", "distinct")?;
            let cmd = doc! {"distinct": &coll, "key": &key, "query": query.clone()};
            let replies = on_each(cluster, snap, target_shards(snap, &query), &db, &cmd).await?;
            let mut values: Vec<Bson> = Vec::new();
            for r in &replies {
                for v in r.get_array("values").into_iter().flatten() {
                    if !values.iter().any(|x| values_equal(x, v)) {
                        values.push(v.clone());
                    }
                }
            }
            values.sort_by(crate::order::compare);
            Ok(doc! {"values": values})
        }
        .await,
        _ => return None,
    })
}
