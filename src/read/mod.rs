//! Reads on sharded collections: `find`, `aggregate`, `count`, `distinct`, with router-side
//! cursors (`getMore`, `killCursors`).
//!
//! This first version gathers at the router: a filter that pins the shard key goes to the
//! owning shards, any other to every shard owning chunks; each shard's matching documents are
//! fetched whole (its cursor drained), then the router sorts them in MongoDB's order, applies
//! `skip`, `limit` and the projection, or runs the whole aggregation pipeline itself (after
//! pushing a leading `$match` down to the shards). Results are exact; memory grows with the
//! result, so splitting pipelines and streaming k-way merges are the next step.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use bson::{doc, Bson, Document};

use crate::cluster::Cluster;
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
}

/// The router's open cursors on sharded collections.
#[derive(Debug, Default)]
pub struct RouterCursors {
    cursors: Mutex<HashMap<i64, RouterCursor>>,
}

fn engine_err(e: crate::embedded::EngineError) -> CommandError {
    CommandError::new(e.code, e.message)
}

fn shard_err(shard: &str, reply: &Document) -> CommandError {
    CommandError::new(
        ErrorCode(
            reply
                .get_i32("code")
                .unwrap_or(ErrorCode::OperationFailed.0),
        ),
        format!(
            "{} (shard {shard})",
            reply.get_str("errmsg").unwrap_or("read failed")
        ),
    )
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

/// Every document matching `filter` on the targeted shards (each shard's cursor drained).
async fn gather(
    cluster: &Cluster,
    snap: &RoutingSnapshot,
    db: &str,
    coll: &str,
    filter: &Document,
) -> Result<Vec<Document>, CommandError> {
    let shards = target_shards(snap, filter);
    let mut futures = Vec::new();
    for shard in shards {
        let version = cluster
            .is_shard_server(&shard)
            .then(|| snap.shard_version(&shard));
        let mut cmd = doc! {"find": coll, "filter": filter.clone(), "batchSize": 10_000, "$db": db};
        if let Some(v) = version {
            cmd.insert("shardVersion", v);
        }
        futures.push(async move {
            let mut out = Vec::new();
            let reply = cluster
                .run_on(&shard, &cmd)
                .await
                .map_err(|e| CommandError::new(e.code(), format!("{e} (shard {shard})")))?;
            if reply.get_f64("ok").ok() != Some(1.0) {
                return Err(shard_err(&shard, &reply));
            }
            let cursor = reply.get_document("cursor").cloned().unwrap_or_default();
            out.extend(
                cursor
                    .get_array("firstBatch")
                    .into_iter()
                    .flatten()
                    .filter_map(|d| d.as_document().cloned()),
            );
            let mut id = cursor.get_i64("id").unwrap_or(0);
            while id != 0 {
                let more = cluster
                    .run_on(
                        &shard,
                        &doc! {"getMore": id, "collection": coll, "batchSize": 10_000, "$db": db},
                    )
                    .await
                    .map_err(|e| CommandError::new(e.code(), format!("{e} (shard {shard})")))?;
                if more.get_f64("ok").ok() != Some(1.0) {
                    return Err(shard_err(&shard, &more));
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
            Ok::<_, CommandError>(out)
        });
    }
    let mut all = Vec::new();
    for r in join_all(futures).await {
        all.extend(r?);
    }
    Ok(all)
}

async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut out = Vec::with_capacity(futures.len());
    let mut pinned: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = (0..pinned.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in pinned.iter_mut().enumerate() {
            if done[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => done[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.extend(done.into_iter().flatten());
    out
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
    Some(match req.name.as_str() {
        "find" => {
            async {
                let filter = doc_field(&body, "filter", "find")?;
                let sort =
                    SortSpec::parse(&doc_field(&body, "sort", "find")?).map_err(engine_err)?;
                let projection = Projection::parse(&doc_field(&body, "projection", "find")?)
                    .map_err(engine_err)?;
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
                let mut docs = gather(cluster, snap, &db, &coll, &filter).await?;
                sort.sort(&mut docs);
                let docs: Vec<Document> = docs
                    .into_iter()
                    .skip(skip)
                    .take(limit.unwrap_or(usize::MAX))
                    .map(|d| projection.as_ref().map(|p| p.apply(&d)).unwrap_or(d))
                    .collect();
                let batch = number_field(&body, "batchSize")
                    .map(|b| b.max(0) as usize)
                    .unwrap_or(DEFAULT_BATCH);
                Ok(cluster.cursors.open(
                    ns.clone(),
                    docs,
                    if single { usize::MAX } else { batch },
                    single,
                    owner,
                    "firstBatch",
                ))
            }
            .await
        }
        "aggregate" => {
            async {
                let pipeline = body.get_array("pipeline").cloned().map_err(|_| {
                    CommandError::new(
                        ErrorCode::TypeMismatch,
                        "'pipeline' option must be specified as an array",
                    )
                })?;
                let (filter, rest) = match pipeline
                    .first()
                    .and_then(|s| s.as_document())
                    .and_then(|s| s.get_document("$match").ok())
                {
                    Some(m) => (m.clone(), pipeline[1..].to_vec()),
                    None => (Document::new(), pipeline.clone()),
                };
                let docs = gather(cluster, snap, &db, &coll, &filter).await?;
                let out = crate::embedded::aggregate::run(&rest, docs).map_err(engine_err)?;
                let batch = body
                    .get_document("cursor")
                    .ok()
                    .and_then(|c| number_field(c, "batchSize"))
                    .map(|b| b.max(0) as usize)
                    .unwrap_or(DEFAULT_BATCH);
                Ok(cluster
                    .cursors
                    .open(ns.clone(), out, batch, false, owner, "firstBatch"))
            }
            .await
        }
        "count" => {
            async {
                let query = doc_field(&body, "query", "count")?;
                let docs = gather(cluster, snap, &db, &coll, &query).await?;
                let skip = number_field(&body, "skip").unwrap_or(0).max(0) as usize;
                let mut n = docs.len().saturating_sub(skip);
                if let Some(l) = number_field(&body, "limit").filter(|l| *l != 0) {
                    n = n.min(l.unsigned_abs() as usize);
                }
                Ok(doc! {"n": n as i32})
            }
            .await
        }
        "distinct" => {
            async {
                let key = body
                    .get_str("key")
                    .map_err(|_| {
                        CommandError::new(
                            ErrorCode(40414),
                            "BSON field 'distinct.key' is missing but a required field",
                        )
                    })?
                    .to_string();
                let query = doc_field(&body, "query", "distinct")?;
                let docs = gather(cluster, snap, &db, &coll, &query).await?;
                let mut values: Vec<Bson> = Vec::new();
                for d in &docs {
                    for v in crate::embedded::path::lookup(d, &key).expanded() {
                        if !values.iter().any(|x| values_equal(x, v)) {
                            values.push(v.clone());
                        }
                    }
                }
                values.sort_by(crate::order::compare);
                Ok(doc! {"values": values})
            }
            .await
        }
        _ => return None,
    })
}
