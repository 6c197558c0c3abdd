//! Reads on sharded collections: `find`, `aggregate`, `count`, `distinct`, with router-side
//! cursors (`getMore`, `killCursors`).
//!
//! A filter that pins the shard key goes to the owning shards, any other to every shard owning
//! chunks. `find` sends the sort, `limit + skip` and (when it keeps the sort fields) the
//! projection to each shard, k-way merges the shards' sorted results in MongoDB's order and
//! applies `skip` and `limit`, pulling a shard cursor's next batch only when a `getMore` needs
//! it, so memory is bounded by one batch per shard; `allowPartialResults` skips a shard that
//! cannot be reached.
//! `aggregate` splits the pipeline at its first stage that needs all the data
//! ([`merge::split_pipeline`]): the shard part runs on each shard, the router gathers the shard
//! parts into memory, merges them (sorted merge, `$group` re-grouping) and runs the rest, so an
//! aggregation's result is bounded by what the router can hold. `count` and `distinct` are merged. Results are served
//! through router cursors, reaped after 10 idle minutes together with their shard cursors.
//!
//! Documents pass through encoded: a shard's batch is kept as the slices of its reply that
//! hold each document, a sorted merge reads only the sort keys, and the cursor reply is written
//! from those bytes ([`cursors::cursor_reply`]); only the router's own projection and
//! aggregation stages decode documents.
//!
//! The module is split by concern: [`shard_io`] (one read on one shard, shard cursors),
//! [`stream_merge`] (the merge state machine behind a router cursor), [`cursors`] (the cursor
//! registry, `getMore`, `killCursors`, cursor replies), [`merge`] (the pure merges of
//! aggregations); this file serves the commands.

pub mod cursors;
pub mod foreign;
pub mod in_txn;
pub mod merge;
mod shard_io;
mod stream_merge;

use bson::{doc, Bson, Document};

use crate::cluster::Cluster;
use crate::command::{CommandError, CommandRequest};
use crate::engine::collation::{has_string, Collation};
use crate::engine::query::{Projection, SortSpec};
use crate::routing::{FilterKeys, RoutingSnapshot};
use crate::value::error_codes::ErrorCode;
use crate::value::field::{number_field, truthy};
use crate::wire::Reply;

use cursors::{FirstBatch, Source};
pub use cursors::{RouterCursors, MAX_BUFFERED_CURSOR_BYTES, MAX_ROUTER_CURSORS};
use shard_io::{drain, on_each, open_streams};
pub use shard_io::{read_one, read_one_at};
use stream_merge::{Merge, SortKeys};

/// Default first-batch size, as mongod and mongos.
const DEFAULT_BATCH: usize = 101;

/// The filter of a pipeline's leading `$match` (empty when it has none): what targets it.
pub(crate) fn leading_match(pipeline: &[Bson]) -> Document {
    pipeline
        .first()
        .and_then(|s| s.as_document())
        .and_then(|s| s.get_document("$match").ok())
        .cloned()
        .unwrap_or_default()
}

/// The shards a filter must be sent to.
pub(crate) fn target_shards(snap: &RoutingSnapshot, filter: &Document) -> Vec<String> {
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

/// The shards a read under the request's collation must be sent to: a collation other than
/// the simple one can hold equal strings that hash or range apart, so a filter with strings
/// targets every shard, as mongos does.
fn collated_targets(
    snap: &RoutingSnapshot,
    filter: &Document,
    collation: Option<&Collation>,
) -> Vec<String> {
    if collation.is_some() && has_string(&Bson::Document(filter.clone())) {
        return snap.chunks.shards().into_iter().collect();
    }
    target_shards(snap, filter)
}

/// What every shard command of a read carries from the client's request, as mongos attaches
/// it: `$readPreference` (each shard picks its member by it), `readConcern` and `collation`.
fn read_envelope(cmd: &mut Document, body: &Document) {
    for k in ["$readPreference", "readConcern", "collation"] {
        if let Some(v) = body.get(k) {
            cmd.insert(k, v.clone());
        }
    }
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

/// Serves a read on a sharded collection (`body`: the request's body as a document); `None`
/// if the command is not a read the router handles.
///
/// A snapshot read outside a transaction that names no `atClusterTime` is given one, as mongos
/// gives it for a read it sends to shards: one time for every shard, so they all read the same
/// instant, said back in the reply where drivers look for it (`cursor.atClusterTime`;
/// `atClusterTime` for `distinct`). The time is the latest cluster time of the shards that
/// own the collection's chunks, asked of them first: every write any of them completed is at
/// or before it, and each shard moves its clock up to it, so later writes come after it.
pub async fn read(
    cluster: &Cluster,
    cursors: &RouterCursors,
    primaries: &dyn foreign::Primaries,
    snap: &RoutingSnapshot,
    req: &CommandRequest,
    body: &Document,
    owner: i64,
) -> Option<Result<Reply, CommandError>> {
    if !needs_snapshot_time(&req.name, body) {
        return read_at(cluster, cursors, primaries, snap, req, body, owner).await;
    }
    let at = match snapshot_time(cluster, snap).await {
        Ok(t) => t,
        Err(e) => return Some(Err(e)),
    };
    let mut body = body.clone();
    let mut rc = body
        .get_document("readConcern")
        .cloned()
        .unwrap_or_default();
    rc.insert("atClusterTime", at);
    body.insert("readConcern", rc);
    let reply = read_at(cluster, cursors, primaries, snap, req, &body, owner).await?;
    Some(reply.map(|r| stamp_snapshot_time(r, at)))
}

/// A `find`, `aggregate` or `distinct` outside a transaction with snapshot read concern and
/// no `atClusterTime`.
fn needs_snapshot_time(name: &str, body: &Document) -> bool {
    matches!(name, "find" | "aggregate" | "distinct")
        && !crate::command::failpoint::in_transaction(name, body)
        && body.get_document("readConcern").is_ok_and(|rc| {
            rc.get_str("level").is_ok_and(|l| l == "snapshot") && !rc.contains_key("atClusterTime")
        })
}

/// The latest `$clusterTime` of the shards owning the collection's chunks.
async fn snapshot_time(
    cluster: &Cluster,
    snap: &RoutingSnapshot,
) -> Result<bson::Timestamp, CommandError> {
    let probe = doc! {"ping": 1, "$db": "admin"};
    let shards: Vec<String> = snap.chunks.shards().into_iter().collect();
    let replies = crate::backend::join_all(shards.iter().map(|s| cluster.run_on(s, &probe))).await;
    let mut latest: Option<bson::Timestamp> = None;
    for r in replies {
        let reply = r.map_err(|e| CommandError::new(e.code(), e.to_string()))?;
        let t = reply
            .get_document("$clusterTime")
            .ok()
            .and_then(|c| c.get_timestamp("clusterTime").ok())
            .or_else(|| reply.get_timestamp("operationTime").ok());
        if let Some(t) = t {
            if latest.is_none_or(|l| (t.time, t.increment) > (l.time, l.increment)) {
                latest = Some(t);
            }
        }
    }
    latest.ok_or_else(|| {
        CommandError::new(
            ErrorCode::SnapshotUnavailable,
            "no shard reported a cluster time to read at",
        )
    })
}

/// The reply of a snapshot read with the time it read at.
fn stamp_snapshot_time(reply: Reply, at: bson::Timestamp) -> Reply {
    let mut d = reply.into_document();
    crate::command::stamp_at_cluster_time(&mut d, at);
    Reply::Document(d)
}

#[allow(clippy::too_many_arguments)]
async fn read_at(
    cluster: &Cluster,
    cursors: &RouterCursors,
    primaries: &dyn foreign::Primaries,
    snap: &RoutingSnapshot,
    req: &CommandRequest,
    body: &Document,
    owner: i64,
) -> Option<Result<Reply, CommandError>> {
    let coll = body.get_str(&req.name).unwrap_or("").to_string();
    let db = req.db.clone();
    let ns = format!("{db}.{coll}");
    if matches!(
        req.name.as_str(),
        "find" | "aggregate" | "count" | "distinct"
    ) {
        if let Err(e) = crate::backend::shard::need_of(req.body.raw()) {
            return Some(Err(CommandError::new(e.code, e.message)));
        }
    }
    cursors.reap(cluster).await;
    let collation = match Collation::from_option(body.get("collation")) {
        Ok(c) => c,
        Err(e) => return Some(Err(CommandError::from(e))),
    };
    Some(match req.name.as_str() {
        "find" => async {
            let filter = doc_field(body, "filter", "find")?;
            let sort_doc = doc_field(body, "sort", "find")?;
            let sort = SortSpec::parse(&sort_doc).map_err(CommandError::from)?.with_collation(collation.clone());
            let projection_doc = doc_field(body, "projection", "find")?;
            let projection = Projection::parse(&projection_doc).map_err(CommandError::from)?;
            let skip = number_field(body, "skip").unwrap_or(0).max(0) as usize;
            let mut single = body.get("singleBatch").is_some_and(truthy);
            let limit = match number_field(body, "limit") {
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
            let batch = number_field(body, "batchSize").map(|b| b.max(0) as usize).unwrap_or(DEFAULT_BATCH);
            let first = if single { limit.unwrap_or(usize::MAX) } else { batch };
            // Each shard's first batch covers what the router's first batch may need.
            let shard_batch = first.min(100_000).saturating_add(skip).clamp(1, 100_000) as i64;
            let mut shard_cmd = doc! {"find": &coll, "filter": filter.clone(), "batchSize": shard_batch};
            if !sort_doc.is_empty() {
                shard_cmd.insert("sort", sort_doc.clone());
            }
            if let Some(l) = limit {
                shard_cmd.insert("limit", i64::try_from(l.saturating_add(skip)).unwrap_or(i64::MAX));
            }
            if push_projection {
                shard_cmd.insert("projection", projection_doc.clone());
            }
            for k in ["collation", "hint", "maxTimeMS", "comment", "readConcern", "$readPreference", "let"] {
                if let Some(v) = body.get(k) {
                    shard_cmd.insert(k, v.clone());
                }
            }
            let (streams, skipped) = open_streams(cluster, snap, collated_targets(snap, &filter, collation.as_deref()), &db, &coll, &shard_cmd, partial).await?;
            let merge = Merge::new(
                db.clone(),
                coll.clone(),
                streams,
                SortKeys::new(sort, &sort_doc),
                skip,
                limit,
                if push_projection { None } else { projection },
            );
            cursors
                .open(cluster, ns.clone(), Source::Streams(Box::new(merge)), FirstBatch { size: first, single, partial: skipped }, owner)
                .await
        }
        .await,
        "aggregate" => async {
            let pipeline = body.get_array("pipeline").cloned().map_err(|_| {
                CommandError::new(ErrorCode::TypeMismatch, "'pipeline' option must be specified as an array")
            })?;
            if body.get("cursor").is_none() && !body.get("explain").is_some_and(truthy) {
                return Err(CommandError::new(ErrorCode::FailedToParse, "The 'cursor' option is required, except for aggregate with the explain argument"));
            }
            let (stages, output) = crate::engine::output::split_output(&pipeline, &db).map_err(CommandError::from)?;
            if let Some(o) = &output {
                o.check_read_concern(body).map_err(CommandError::from)?;
            }
            let split = merge::split_pipeline(stages);
            let filter = leading_match(stages);
            let mut shard_cmd = doc! {"aggregate": &coll, "pipeline": split.shard_part.clone(), "cursor": {"batchSize": 10_000}};
            if let Some(l) = body.get("let") {
                shard_cmd.insert("let", l.clone());
            }
            read_envelope(&mut shard_cmd, body);
            let (streams, _) = open_streams(cluster, snap, collated_targets(snap, &filter, collation.as_deref()), &db, &coll, &shard_cmd, false).await?;
            let stage_memory = cluster.stage_memory();
            let streams = drain(cluster, &db, &coll, streams, stage_memory).await?;
            let merged = match &split.merge_sort {
                Some(sort) => merge::k_way_merge(&SortSpec::parse(sort).map_err(CommandError::from)?.with_collation(collation.clone()), streams),
                None => streams.into_iter().flatten().collect(),
            };
            let options = crate::engine::aggregate::AggregateOptions::for_request(stage_memory, body);
            let mut prefetched = foreign::Prefetched::default();
            for c in foreign::foreign_collections(&split.router_part) {
                let docs = foreign::fetch(cluster, primaries, &db, &c, stage_memory).await?;
                prefetched.0.insert((db.clone(), c), docs);
            }
            let vars = match body.get_document("let") {
                Ok(l) => crate::engine::aggregate::Variables::new().with_let(l, &Document::new()).map_err(CommandError::from)?,
                Err(_) => crate::engine::aggregate::Variables::new(),
            };
            let vars = vars.with_collation_option(body.get("collation")).map_err(CommandError::from)?;
            let env = crate::engine::aggregate::Env { db: db.clone(), vars, namespaces: Some(&prefetched) };
            let out = crate::engine::aggregate::run_in(&split.router_part, merged, &options, &env).map_err(CommandError::from)?;
            let out = match (&output, pipeline.last()) {
                (Some(o), Some(stage)) => {
                    let (tdb, tcoll) = o.target();
                    let is_merge = matches!(o, crate::engine::output::OutputStage::Merge(_));
                    foreign::write_output(cluster, primaries, tdb, tcoll, is_merge, stage, out).await?;
                    Vec::new()
                }
                _ => out,
            };
            let batch = body
                .get_document("cursor")
                .ok()
                .and_then(|c| number_field(c, "batchSize"))
                .map(|b| b.max(0) as usize)
                .unwrap_or(DEFAULT_BATCH);
            let mut encoded = std::collections::VecDeque::with_capacity(out.len());
            for d in &out {
                let bytes = d.to_vec().map_err(|e| CommandError::new(ErrorCode::InternalError, format!("cannot encode a result: {e}")))?;
                encoded.push_back(bytes::Bytes::from(bytes));
            }
            cursors
                .open(cluster, ns.clone(), Source::Buffered(encoded), FirstBatch { size: batch, single: false, partial: false }, owner)
                .await
        }
        .await,
        "count" => async {
            let query = doc_field(body, "query", "count")?;
            let skip = number_field(body, "skip").unwrap_or(0).max(0);
            let limit = number_field(body, "limit")
                .filter(|l| *l != 0)
                .map(|l| l.checked_abs().unwrap_or(i64::MAX));
            let mut cmd = doc! {"count": &coll, "query": query.clone()};
            if let Some(l) = limit {
                cmd.insert("limit", l.saturating_add(skip));
            }
            read_envelope(&mut cmd, body);
            let replies = on_each(cluster, snap, collated_targets(snap, &query, collation.as_deref()), &db, &cmd).await?;
            let total: i64 = replies
                .iter()
                .map(|r| number_field(r, "n").unwrap_or(0))
                .fold(0i64, i64::saturating_add);
            let mut n = total.saturating_sub(skip).max(0);
            if let Some(l) = limit {
                n = n.min(l);
            }
            Ok(doc! {"n": i32::try_from(n).map(Bson::Int32).unwrap_or(Bson::Int64(n))}.into())
        }
        .await,
        "distinct" => async {
            let key = body
                .get_str("key")
                .map_err(|_| CommandError::new(ErrorCode(40414), "BSON field 'distinct.key' is missing but a required field"))?
                .to_string();
            let query = doc_field(body, "query", "distinct")?;
            let mut cmd = doc! {"distinct": &coll, "key": &key, "query": query.clone()};
            read_envelope(&mut cmd, body);
            let replies = on_each(cluster, snap, collated_targets(snap, &query, collation.as_deref()), &db, &cmd).await?;
            let values = crate::engine::reads::distinct_values(
                replies.iter().flat_map(|r| r.get_array("values").into_iter().flatten().cloned()),
                collation.as_deref(),
            );
            Ok(doc! {"values": values}.into())
        }
        .await,
        _ => return None,
    })
}
