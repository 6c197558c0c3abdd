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
//! aggregation's result is bounded by what the router can hold. An aggregation on an unsharded
//! collection whose pipeline reads a sharded one runs the same way from its first stage that
//! does ([`aggregate_unsharded`]), the stages before it on the primary shard.
//! `count` and `distinct` are merged. Results are served
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

mod body;
pub mod cursors;
pub mod foreign;
pub mod in_txn;
pub mod merge;
mod shard_io;
mod stream_merge;

use bson::{doc, Bson, Document, RawBsonRef, RawDocument, RawDocumentBuf};

use crate::cluster::Cluster;
use crate::command::{CommandError, CommandRequest};
use crate::engine::collation::{has_string, Collation};
use crate::engine::query::{Projection, SortSpec};
use crate::routing::filter::RawFilter;
use crate::routing::{FilterKeys, RoutingSnapshot};
use crate::value::error_codes::ErrorCode;
use crate::value::field::{number_field, truthy};
use crate::wire::{BsonDoc, Reply};

pub use body::ReadBody;
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

/// The shards a `find`'s filter must be sent to: read in place ([`RawFilter`]) when it pins
/// the full shard key by plain equality under the simple collation, as update and delete
/// filters are; any other filter is owned and read by [`collated_targets`], which decides.
fn find_targets(
    snap: &RoutingSnapshot,
    filter: &RawDocument,
    collation: Option<&Collation>,
) -> Result<Vec<String>, CommandError> {
    if collation.is_none() {
        if let Some(Ok(Some(shard))) = RawFilter::read(&snap.pattern, filter).map(|f| f.shard(snap))
        {
            return Ok(vec![shard.to_string()]);
        }
    }
    Ok(collated_targets(snap, &owned(filter)?, collation))
}

/// What every shard command of a read carries from the client's request, as mongos attaches
/// it: `$readPreference` (each shard picks its member by it), `readConcern` and `collation`,
/// each element copied as the client encoded it.
fn read_envelope(cmd: &mut RawDocumentBuf, body: &ReadBody<'_>) {
    for k in ["$readPreference", "readConcern", "collation"] {
        if let Some((name, v)) = body.element(k) {
            cmd.append(name, v);
        }
    }
}

/// The document field `field` of a `cmd` request, read in place: `{}` when absent or null,
/// mongod's TypeMismatch for any other type.
fn doc_field<'a>(
    body: &ReadBody<'a>,
    field: &str,
    cmd: &str,
) -> Result<&'a RawDocument, CommandError> {
    match body.get(field) {
        None | Some(RawBsonRef::Null) => Ok(crate::wire::empty_document()),
        Some(RawBsonRef::Document(d)) => Ok(d),
        Some(_) => Err(CommandError::new(
            ErrorCode::TypeMismatch,
            format!("BSON field '{cmd}.{field}' is the wrong type, expected type 'object'"),
        )),
    }
}

/// A document read in place, owned (for the readers that take a `Document`: targeting, sort
/// and projection parsing).
fn owned(d: &RawDocument) -> Result<Document, CommandError> {
    if d.as_bytes().len() == 5 {
        return Ok(Document::new());
    }
    Document::try_from(d).map_err(|e| CommandError::new(ErrorCode::InvalidBSON, e.to_string()))
}

/// An error encoding a command the router builds.
fn encode_error(e: impl std::fmt::Display) -> CommandError {
    CommandError::new(
        ErrorCode::InternalError,
        format!("cannot encode command: {e}"),
    )
}

/// What a `find` on a sharded collection sends each shard and how the router merges the
/// shards' replies, read from the request's body.
struct FindPlan<'a> {
    /// The filter, for targeting ([`find_targets`]).
    filter: &'a RawDocument,
    /// The shard's `find` (without `$db` and `shardVersion`), written from the client's
    /// elements: `find`, `filter`, `batchSize`, then `sort`, `limit`, `projection` when they
    /// apply, then each of `collation`, `hint`, `maxTimeMS`, `comment`, `readConcern`,
    /// `$readPreference` and `let` the client sent.
    command: RawDocumentBuf,
    sort: SortSpec,
    sort_doc: Document,
    skip: usize,
    limit: Option<usize>,
    /// The projection the router applies (`None` when the shards apply it).
    projection: Option<Projection>,
    /// The size of the router's first batch.
    first: usize,
    single: bool,
    partial: bool,
}

/// Options of a client's read that the shard's command carries as the client sent them, in
/// the order they are appended (a view's aggregation carries them too, `router::views`).
pub(crate) const CARRIED_OPTIONS: [&str; 7] = [
    "collation",
    "hint",
    "maxTimeMS",
    "comment",
    "readConcern",
    "$readPreference",
    "let",
];

/// [`FindPlan`] of a `find` on `coll`.
fn find_plan<'a>(
    body: &ReadBody<'a>,
    coll: &str,
    collation: Option<std::sync::Arc<Collation>>,
) -> Result<FindPlan<'a>, CommandError> {
    let filter_raw = doc_field(body, "filter", "find")?;
    let sort_raw = doc_field(body, "sort", "find")?;
    let sort_doc = owned(sort_raw)?;
    let sort = SortSpec::parse(&sort_doc)
        .map_err(CommandError::from)?
        .with_collation(collation);
    let projection_raw = doc_field(body, "projection", "find")?;
    let projection_doc = owned(projection_raw)?;
    let projection = Projection::parse(&projection_doc).map_err(CommandError::from)?;
    let skip = body.number("skip").unwrap_or(0).max(0) as usize;
    let mut single = body.truthy("singleBatch");
    let limit = match body.number("limit") {
        Some(l) if l < 0 => {
            single = true;
            Some(l.unsigned_abs() as usize)
        }
        Some(0) | None => None,
        Some(l) => Some(l as usize),
    };
    let partial = body.truthy("allowPartialResults");
    // The projection goes to the shards when the router does not need the fields it drops to
    // sort.
    let push_projection = projection.as_ref().is_some_and(|p| {
        sort_doc
            .keys()
            .all(|k| p.apply(&doc! {k.clone(): 1}).contains_key(k.as_str()))
    });
    let batch = body
        .number("batchSize")
        .map(|b| b.max(0) as usize)
        .unwrap_or(DEFAULT_BATCH);
    let first = if single {
        limit.unwrap_or(usize::MAX)
    } else {
        batch
    };
    // Each shard's first batch covers what the router's first batch may need.
    let shard_batch = first.min(100_000).saturating_add(skip).clamp(1, 100_000) as i64;
    // Room for what is appended: at most the body's own elements and three numbers.
    let mut command = crate::wire::document_with_room(
        crate::wire::empty_document(),
        body.raw().as_bytes().len() + 64,
    );
    command.append(bson::raw::cstr!("find"), coll);
    command.append(bson::raw::cstr!("filter"), filter_raw);
    command.append(bson::raw::cstr!("batchSize"), shard_batch);
    if !sort_doc.is_empty() {
        command.append(bson::raw::cstr!("sort"), sort_raw);
    }
    if let Some(l) = limit {
        command.append(
            bson::raw::cstr!("limit"),
            i64::try_from(l.saturating_add(skip)).unwrap_or(i64::MAX),
        );
    }
    if push_projection {
        command.append(bson::raw::cstr!("projection"), projection_raw);
    }
    for k in CARRIED_OPTIONS {
        if let Some((name, v)) = body.element(k) {
            command.append(name, v);
        }
    }
    Ok(FindPlan {
        filter: filter_raw,
        command,
        sort,
        sort_doc,
        skip,
        limit,
        projection: if push_projection { None } else { projection },
        first,
        single,
        partial,
    })
}

/// Serves a read on a sharded collection (`body`: the request's body, read in place); `None`
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
    body: &ReadBody<'_>,
    owner: i64,
) -> Option<Result<Reply, CommandError>> {
    if !needs_snapshot_time(&req.name, body) {
        return read_at(cluster, cursors, primaries, snap, req, body, owner).await;
    }
    let at = match snapshot_time(cluster, snap).await {
        Ok(t) => t,
        Err(e) => return Some(Err(e)),
    };
    // The options with the time, read from their encoding (a rare path: an owned copy).
    let mut stamped = body.to_document();
    let mut rc = stamped
        .get_document("readConcern")
        .cloned()
        .unwrap_or_default();
    rc.insert("atClusterTime", at);
    stamped.insert("readConcern", rc);
    let stamped = match stamped.to_vec() {
        Ok(bytes) => CommandRequest::new(
            req.db.clone(),
            BsonDoc::from_encoded(bytes),
            Vec::new(),
            req.legacy,
        ),
        Err(e) => return Some(Err(encode_error(e))),
    };
    let mut normalized = None;
    let stamped_body = match ReadBody::of(&stamped, &mut normalized) {
        Ok(b) => b,
        Err(e) => return Some(Err(e)),
    };
    let reply = read_at(cluster, cursors, primaries, snap, req, &stamped_body, owner).await?;
    Some(reply.map(|r| stamp_snapshot_time(r, at)))
}

/// The `aggregate` each shard is sent: `aggregate`, the shard part of the pipeline and a
/// 10,000-document first batch, then the client's `let` and [`read_envelope`].
fn aggregate_command(
    body: &ReadBody<'_>,
    coll: &str,
    shard_part: &[Bson],
) -> Result<RawDocumentBuf, CommandError> {
    let cmd = doc! {"aggregate": coll, "pipeline": shard_part, "cursor": {"batchSize": 10_000}};
    let mut cmd = RawDocumentBuf::try_from(&cmd).map_err(encode_error)?;
    if let Some((name, l)) = body.element("let") {
        cmd.append(name, l);
    }
    read_envelope(&mut cmd, body);
    Ok(cmd)
}

/// The `count` each shard is sent: `count`, the client's `query`, `limit` (the client's limit
/// plus its skip) when there is one, then [`read_envelope`].
fn count_command(
    body: &ReadBody<'_>,
    coll: &str,
    query: &RawDocument,
    limit: Option<i64>,
) -> RawDocumentBuf {
    let mut cmd = RawDocumentBuf::new();
    cmd.append(bson::raw::cstr!("count"), coll);
    cmd.append(bson::raw::cstr!("query"), query);
    if let Some(l) = limit {
        cmd.append(bson::raw::cstr!("limit"), l);
    }
    read_envelope(&mut cmd, body);
    cmd
}

/// The `distinct` each shard is sent: `distinct`, `key`, the client's `query`, then
/// [`read_envelope`].
fn distinct_command(
    body: &ReadBody<'_>,
    coll: &str,
    key: &str,
    query: &RawDocument,
) -> RawDocumentBuf {
    let mut cmd = RawDocumentBuf::new();
    cmd.append(bson::raw::cstr!("distinct"), coll);
    cmd.append(bson::raw::cstr!("key"), key);
    cmd.append(bson::raw::cstr!("query"), query);
    read_envelope(&mut cmd, body);
    cmd
}

/// A `find`, `aggregate` or `distinct` outside a transaction with snapshot read concern and
/// no `atClusterTime`.
fn needs_snapshot_time(name: &str, body: &ReadBody<'_>) -> bool {
    // `failpoint::in_transaction` on the body's fields.
    let in_transaction = body.get("txnNumber").is_some()
        && (body.get("autocommit").is_some()
            || matches!(name, "commitTransaction" | "abortTransaction"));
    matches!(name, "find" | "aggregate" | "distinct")
        && !in_transaction
        && body.document("readConcern").is_some_and(|rc| {
            matches!(rc.get("level"), Ok(Some(RawBsonRef::String("snapshot"))))
                && !matches!(rc.get("atClusterTime"), Ok(Some(_)))
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
    body: &ReadBody<'_>,
    owner: i64,
) -> Option<Result<Reply, CommandError>> {
    let coll = body.str(&req.name).unwrap_or("").to_string();
    let db = req.db.clone();
    let ns = format!("{db}.{coll}");
    let mut need = None;
    if matches!(
        req.name.as_str(),
        "find" | "aggregate" | "count" | "distinct"
    ) {
        // A body read in place holds the request's own elements: its `$readPreference` is
        // taken from there rather than looked up by another walk of the request.
        let found = if std::ptr::eq(body.raw(), req.body.raw()) {
            crate::backend::shard::need_of_field(body.get("$readPreference"))
        } else {
            crate::backend::shard::need_of(req.body.raw())
        };
        match found {
            Ok(n) => need = Some(n),
            Err(e) => return Some(Err(CommandError::new(e.code, e.message))),
        }
    }
    // The shard commands carry the client's `$readPreference` element as it is when the body
    // is read in place: what the shards' members are chosen by is what was just read.
    let need = need.filter(|_| std::ptr::eq(body.raw(), req.body.raw()));
    let need = need.as_ref();
    cursors.reap(cluster).await;
    let collation = match Collation::from_option(body.owned("collation").as_ref()) {
        Ok(c) => c,
        Err(e) => return Some(Err(CommandError::from(e))),
    };
    Some(match req.name.as_str() {
        "find" => async {
            let plan = find_plan(body, &coll, collation.clone())?;
            let targets = find_targets(snap, plan.filter, collation.as_deref())?;
            let (streams, skipped) = open_streams(cluster, snap, targets, &db, &coll, &ns, &plan.command, need, plan.partial).await?;
            let merge = Merge::new(
                db.clone(),
                coll.clone(),
                streams,
                SortKeys::new(plan.sort, &plan.sort_doc),
                plan.skip,
                plan.limit,
                plan.projection,
            );
            cursors
                .open(cluster, ns.clone(), Source::Streams(Box::new(merge)), FirstBatch { size: plan.first, single: plan.single, partial: skipped }, owner)
                .await
        }
        .await,
        "aggregate" => async {
            // The aggregation stages read an owned document; the shard command copies elements.
            let read_body = body;
            let owned_body = read_body.to_document();
            let body = &owned_body;
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
            let shard_cmd = aggregate_command(read_body, &coll, &split.shard_part)?;
            let (streams, _) = open_streams(cluster, snap, collated_targets(snap, &filter, collation.as_deref()), &db, &coll, &ns, &shard_cmd, need, false).await?;
            let stage_memory = cluster.stage_memory();
            let streams = drain(cluster, &db, &coll, streams, stage_memory).await?;
            let merged = match &split.merge_sort {
                Some(sort) => merge::k_way_merge(&SortSpec::parse(sort).map_err(CommandError::from)?.with_collation(collation.clone()), streams),
                None => streams.into_iter().flatten().collect(),
            };
            finish_aggregate(cluster, cursors, primaries, &db, ns.clone(), body, &pipeline, output.as_ref(), &split.router_part, merged, owner).await
        }
        .await,
        "count" => async {
            let query_raw = doc_field(body, "query", "count")?;
            let query = owned(query_raw)?;
            let skip = body.number("skip").unwrap_or(0).max(0);
            let limit = body.number("limit")
                .filter(|l| *l != 0)
                .map(|l| l.checked_abs().unwrap_or(i64::MAX));
            let cmd = count_command(body, &coll, query_raw, limit.map(|l| l.saturating_add(skip)));
            let replies = on_each(cluster, snap, collated_targets(snap, &query, collation.as_deref()), &db, &cmd, need).await?;
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
                .str("key")
                .ok_or_else(|| CommandError::new(ErrorCode(40414), "BSON field 'distinct.key' is missing but a required field"))?;
            let query_raw = doc_field(body, "query", "distinct")?;
            let query = owned(query_raw)?;
            let cmd = distinct_command(body, &coll, key, query_raw);
            let replies = on_each(cluster, snap, collated_targets(snap, &query, collation.as_deref()), &db, &cmd, need).await?;
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

/// The router's part of an aggregation, once the documents it runs over are gathered
/// (`merged`): the collections its `$lookup`/`$graphLookup`/`$unionWith` stages read fetched
/// through the router, `router_part` run with the request's `let` and collation, the output
/// stage (when the pipeline ends in `$out`/`$merge`) written, and the results served through
/// a router cursor.
#[allow(clippy::too_many_arguments)]
async fn finish_aggregate(
    cluster: &Cluster,
    cursors: &RouterCursors,
    primaries: &dyn foreign::Primaries,
    db: &str,
    ns: String,
    body: &Document,
    pipeline: &[Bson],
    output: Option<&crate::engine::output::OutputStage>,
    router_part: &[Bson],
    merged: Vec<Document>,
    owner: i64,
) -> Result<Reply, CommandError> {
    let stage_memory = cluster.stage_memory();
    let options = crate::engine::aggregate::AggregateOptions::for_request(stage_memory, body);
    let mut prefetched = foreign::Prefetched::default();
    for c in foreign::foreign_collections(router_part) {
        let docs = foreign::fetch(cluster, primaries, db, &c, stage_memory).await?;
        prefetched.0.insert((db.to_string(), c), docs);
    }
    let vars = match body.get_document("let") {
        Ok(l) => crate::engine::aggregate::Variables::new()
            .with_let(l, &Document::new())
            .map_err(CommandError::from)?,
        Err(_) => crate::engine::aggregate::Variables::new(),
    };
    let vars = vars
        .with_collation_option(body.get("collation"))
        .map_err(CommandError::from)?;
    let env = crate::engine::aggregate::Env {
        db: db.to_string(),
        vars,
        namespaces: Some(&prefetched),
    };
    let out = crate::sync::off_the_worker(|| {
        crate::engine::aggregate::run_in(router_part, merged, &options, &env)
    })
    .map_err(CommandError::from)?;
    let out = match (output, pipeline.last()) {
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
        let bytes = d.to_vec().map_err(|e| {
            CommandError::new(
                ErrorCode::InternalError,
                format!("cannot encode a result: {e}"),
            )
        })?;
        encoded.push_back(bytes::Bytes::from(bytes));
    }
    cursors
        .open(
            cluster,
            ns,
            Source::Buffered(encoded),
            FirstBatch {
                size: batch,
                single: false,
                partial: false,
            },
            owner,
        )
        .await
}

/// Options of a client's `aggregate` that the part of it sent to the primary shard carries.
const UNSHARDED_PREFIX_OPTIONS: [&str; 8] = [
    "let",
    "collation",
    "hint",
    "maxTimeMS",
    "comment",
    "readConcern",
    "$readPreference",
    "allowDiskUse",
];

/// The index of the first stage of `stages` that reads (itself, or in a `$facet` or
/// sub-pipeline of it) a sharded collection of `db`, as the routing table knows it.
async fn first_sharded_reader(
    cluster: &Cluster,
    db: &str,
    stages: &[Bson],
) -> Result<Option<usize>, CommandError> {
    for (i, stage) in stages.iter().enumerate() {
        for coll in foreign::foreign_collections(std::slice::from_ref(stage)) {
            if cluster
                .routing
                .lookup(&format!("{db}.{coll}"))
                .await?
                .is_some()
            {
                return Ok(Some(i));
            }
        }
    }
    Ok(None)
}

/// An `aggregate` on an unsharded collection (or a view the primary shard resolves) whose
/// pipeline reads a sharded collection, as mongos runs it: the primary shard holds only its
/// own part of the sharded collection, so the stages before the first one that reads a sharded
/// collection run on the primary shard, and the rest at the router, with the collections they
/// read fetched through the router (a sharded one from every shard owning chunks), as the
/// router part of an aggregation on a sharded collection runs. `None` when no stage reads a
/// sharded collection (or the request is one the primary shard answers as it is: an
/// `explain`, a malformed request, a view on a sharded collection): the caller forwards it
/// whole, at no extra cost.
pub async fn aggregate_unsharded(
    cluster: &Cluster,
    cursors: &RouterCursors,
    primaries: &dyn foreign::Primaries,
    req: &CommandRequest,
    body: &Document,
    owner: i64,
) -> Option<Result<Reply, CommandError>> {
    let db = req.db.as_str();
    if matches!(db, "admin" | "local" | "config") || body.get("explain").is_some_and(truthy) {
        return None;
    }
    let pipeline = body.get_array("pipeline").ok()?;
    body.get_document("cursor").ok()?;
    let (stages, output) = crate::engine::output::split_output(pipeline, db).ok()?;
    let at = match first_sharded_reader(cluster, db, stages).await {
        Ok(at) => at?,
        Err(e) => return Some(Err(e)),
    };
    let target = body.get("aggregate")?.clone();
    let ns = match &target {
        Bson::String(coll) => format!("{db}.{coll}"),
        _ => format!("{db}.$cmd.aggregate"),
    };
    let result = async {
        if let Some(o) = &output {
            o.check_read_concern(body).map_err(CommandError::from)?;
        }
        let shard = primaries.primary(db, false)?;
        let mut cmd = doc! {"aggregate": target, "pipeline": stages[..at].to_vec(), "cursor": {"batchSize": 10_000}};
        for k in UNSHARDED_PREFIX_OPTIONS {
            if let Some(v) = body.get(k) {
                cmd.insert(k, v.clone());
            }
        }
        cmd.insert("$db", db);
        let (reply, member) = shard_io::read_at(cluster, &shard, None, &ns, &cmd)
            .await
            .map_err(shard_io::ReadFailure::into_error)?;
        let (buffer, cursor_id) = shard_io::batch_of(&reply, "firstBatch");
        let stream = shard_io::ShardStream {
            buffer,
            cursor_id,
            shard,
            member,
        };
        let coll = ns.split_once('.').map_or("", |(_, c)| c);
        let merged: Vec<Document> = drain(cluster, db, coll, vec![stream], cluster.stage_memory())
            .await?
            .into_iter()
            .flatten()
            .collect();
        finish_aggregate(
            cluster,
            cursors,
            primaries,
            db,
            ns.clone(),
            body,
            pipeline,
            output.as_ref(),
            &stages[at..],
            merged,
            owner,
        )
        .await
    }
    .await;
    match result {
        // A view on a sharded collection: the primary shard answers the whole request with
        // the resolved view, which the caller runs through the sharded read path.
        Err(e) if e.code == ErrorCode::CommandOnShardedViewNotSupportedOnMongod => None,
        r => Some(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::raw::cstr;
    use bson::spec::BinarySubtype;
    use bson::{Binary, Regex, Timestamp};

    /// The request a body makes, as the frontend builds it.
    fn request(body: &RawDocument) -> CommandRequest {
        CommandRequest::new(
            "db".into(),
            BsonDoc::from_encoded(body.as_bytes().to_vec()),
            Vec::new(),
            false,
        )
    }

    fn raw(d: Document) -> RawDocumentBuf {
        RawDocumentBuf::try_from(&d).expect("encodes")
    }

    type Verdict<T> = Result<T, (ErrorCode, String)>;

    fn verdict<T>(r: Result<T, CommandError>) -> Verdict<T> {
        r.map_err(|e| (e.code, e.message))
    }

    /// `doc_field` as the read path had it, on the owned options document.
    fn owned_doc_field(body: &Document, field: &str, cmd: &str) -> Result<Document, CommandError> {
        match body.get(field) {
            None | Some(Bson::Null) => Ok(Document::new()),
            Some(Bson::Document(d)) => Ok(d.clone()),
            Some(_) => Err(CommandError::new(
                ErrorCode::TypeMismatch,
                format!("BSON field '{cmd}.{field}' is the wrong type, expected type 'object'"),
            )),
        }
    }

    /// What a `find` was sent to the shards as, and merged with, when the read path read the
    /// owned options document: its code, unchanged. The shard command, then (the filter,
    /// skip, limit, the first batch, single batch, partial results, whether the router
    /// projects).
    #[allow(clippy::type_complexity)]
    fn owned_find(
        body: &Document,
        coll: &str,
    ) -> Result<
        (
            Document,
            Document,
            usize,
            Option<usize>,
            usize,
            bool,
            bool,
            bool,
        ),
        CommandError,
    > {
        let filter = owned_doc_field(body, "filter", "find")?;
        let sort_doc = owned_doc_field(body, "sort", "find")?;
        SortSpec::parse(&sort_doc).map_err(CommandError::from)?;
        let projection_doc = owned_doc_field(body, "projection", "find")?;
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
        let push_projection = projection.is_some()
            && sort_doc.keys().all(|k| {
                let p = Projection::parse(&projection_doc).ok().flatten();
                p.is_some_and(|p| p.apply(&doc! {k.clone(): 1}).contains_key(k.as_str()))
            });
        let batch = number_field(body, "batchSize")
            .map(|b| b.max(0) as usize)
            .unwrap_or(DEFAULT_BATCH);
        let first = if single {
            limit.unwrap_or(usize::MAX)
        } else {
            batch
        };
        let shard_batch = first.min(100_000).saturating_add(skip).clamp(1, 100_000) as i64;
        let mut shard_cmd = doc! {"find": coll, "filter": filter.clone(), "batchSize": shard_batch};
        if !sort_doc.is_empty() {
            shard_cmd.insert("sort", sort_doc.clone());
        }
        if let Some(l) = limit {
            shard_cmd.insert(
                "limit",
                i64::try_from(l.saturating_add(skip)).unwrap_or(i64::MAX),
            );
        }
        if push_projection {
            shard_cmd.insert("projection", projection_doc.clone());
        }
        for k in [
            "collation",
            "hint",
            "maxTimeMS",
            "comment",
            "readConcern",
            "$readPreference",
            "let",
        ] {
            if let Some(v) = body.get(k) {
                shard_cmd.insert(k, v.clone());
            }
        }
        let router_projects = projection.is_some() && !push_projection;
        Ok((
            shard_cmd,
            filter,
            skip,
            limit,
            first,
            single,
            partial,
            router_projects,
        ))
    }

    /// `read_envelope` as it was, on owned documents.
    fn owned_envelope(cmd: &mut Document, body: &Document) {
        for k in ["$readPreference", "readConcern", "collation"] {
            if let Some(v) = body.get(k) {
                cmd.insert(k, v.clone());
            }
        }
    }

    /// A body with `fields` in order, names repeating as given.
    fn with_fields(fields: &[(&'static str, Bson)]) -> RawDocumentBuf {
        let mut d = RawDocumentBuf::new();
        for (k, v) in fields {
            let k = <&bson::raw::CStr>::try_from(*k).expect("a key");
            d.append(k, bson::RawBson::try_from(v.clone()).expect("converts"));
        }
        d
    }

    fn find_bodies() -> Vec<RawDocumentBuf> {
        let uuid = Binary {
            subtype: BinarySubtype::Uuid,
            bytes: vec![7; 16],
        };
        let cluster_time = doc! {"clusterTime": Timestamp { time: 9, increment: 2 }, "signature": {"hash": Binary { subtype: BinarySubtype::Generic, bytes: vec![0; 20] }, "keyId": 0_i64}};
        let unsorted = Bson::RegularExpression(Regex {
            pattern: bson::raw::CString::try_from("^a").expect("a pattern"),
            options: bson::raw::CString::try_from("mi").expect("options"),
        });
        let mut bodies = vec![
            // A driver's `find_one({_id})`.
            raw(
                doc! {"find": "c", "filter": {"_id": 5}, "limit": 1_i64, "singleBatch": true, "lsid": {"id": uuid.clone()}, "$clusterTime": cluster_time.clone(), "$db": "db"},
            ),
            raw(doc! {"find": "c"}),
            raw(doc! {"find": "c", "filter": null, "sort": null, "projection": null, "$db": "db"}),
            raw(doc! {"find": "c", "filter": {}, "sort": {}, "projection": {}}),
            raw(
                doc! {"find": "c", "filter": {"a": {"$gt": 1}, "b": [1, "x", {"c": null}]}, "sort": {"a": 1, "b": -1}, "projection": {"a": 1, "b": 1}, "skip": 3, "limit": 10, "batchSize": 2},
            ),
            // A projection that drops a sort field stays at the router.
            raw(doc! {"find": "c", "sort": {"a": 1}, "projection": {"b": 1}}),
            raw(doc! {"find": "c", "sort": {"b": 1}, "projection": {"a": 0}}),
            raw(doc! {"find": "c", "projection": {"a": 1, "_id": 0}}),
            raw(doc! {"find": "c", "limit": -3, "batchSize": 0, "allowPartialResults": true}),
            raw(doc! {"find": "c", "limit": 0, "singleBatch": false, "skip": -4}),
            raw(doc! {"find": "c", "limit": 2.0, "skip": 5_i64, "batchSize": 7.9}),
            raw(doc! {"find": "c", "singleBatch": 1, "batchSize": 200_000, "skip": 10}),
            raw(
                doc! {"find": "c", "filter": {"s": "x"}, "hint": {"a": 1}, "collation": {"locale": "fr", "strength": 2}, "let": {"x": 1, "y": {"z": "w"}}, "readConcern": {"level": "majority"}, "$readPreference": {"mode": "secondaryPreferred", "maxStalenessSeconds": 120}, "maxTimeMS": 500, "comment": "why", "lsid": {"id": uuid.clone()}, "txnNumber": 3_i64, "$db": "db"},
            ),
            raw(doc! {"find": "c", "hint": "a_1", "comment": {"tag": 1}, "maxTimeMS": 0}),
            raw(
                doc! {"find": "c", "readConcern": {"level": "snapshot", "atClusterTime": Timestamp { time: 5, increment: 1 }}},
            ),
            raw(doc! {"find": "c", "filter": {"_id": {"$in": [1, 2, 3]}}, "limit": 1}),
            raw(
                doc! {"find": "c", "filter": {"d": bson::DateTime::from_millis(7), "o": bson::oid::ObjectId::from_bytes([1; 12]), "n": bson::Decimal128::from_bytes([2; 16]), "m": Bson::MinKey}},
            ),
            // Errors: the same code and message either way.
            raw(doc! {"find": "c", "filter": 5}),
            raw(doc! {"find": "c", "sort": "x"}),
            raw(doc! {"find": "c", "sort": {"a": "up"}}),
            raw(doc! {"find": "c", "projection": 3}),
            raw(doc! {"find": "c", "projection": {"a": 1, "b": 0}}),
        ];
        // A field named twice: the owned document kept the last value at the first place.
        bodies.push(with_fields(&[
            ("find", "c".into()),
            ("filter", Bson::Document(doc! {"_id": 1})),
            ("limit", 1.into()),
            ("filter", Bson::Document(doc! {"_id": 2})),
            ("limit", 4.into()),
        ]));
        bodies.push(with_fields(&[
            ("find", "c".into()),
            ("$clusterTime", Bson::Document(cluster_time.clone())),
            ("$clusterTime", Bson::Document(cluster_time)),
        ]));
        // A regular expression whose options an owned copy sorts, in the filter and in `let`.
        bodies.push(with_fields(&[
            ("find", "c".into()),
            ("filter", Bson::Document(doc! {"a": unsorted.clone()})),
        ]));
        bodies.push(with_fields(&[
            ("find", "c".into()),
            ("let", Bson::Document(doc! {"r": unsorted})),
        ]));
        // A field named twice inside the filter.
        let mut filter = RawDocumentBuf::new();
        filter.append(cstr!("a"), 1);
        filter.append(cstr!("a"), 2);
        let mut body = RawDocumentBuf::new();
        body.append(cstr!("find"), "c");
        body.append(cstr!("filter"), filter);
        bodies.push(body);
        bodies
    }

    /// The shard command and the merge of every `find` shape are what reading the owned options
    /// document gave: the same bytes to the shards, the same filter to target with, the same
    /// batches, and the same error for a bad option.
    #[test]
    fn find_commands_are_the_owned_paths_bytes() {
        for body in find_bodies() {
            let req = request(&body);
            let old = verdict(owned_find(&req.options_document(), "c")).map(
                |(cmd, filter, skip, limit, first, single, partial, projects)| {
                    let bytes = cmd.to_vec().expect("encodes");
                    (bytes, filter, skip, limit, first, single, partial, projects)
                },
            );
            let mut normalized = None;
            let read_body = ReadBody::of(&req, &mut normalized).expect("reads");
            let new = verdict(find_plan(&read_body, "c", None)).map(|p| {
                (
                    p.command.into_bytes(),
                    owned(p.filter).expect("the filter converts"),
                    p.skip,
                    p.limit,
                    p.first,
                    p.single,
                    p.partial,
                    p.projection.is_some(),
                )
            });
            let shown = Document::try_from(body.as_ref()).map(|d| d.to_string());
            assert_eq!(new, old, "{shown:?}");
        }
    }

    /// `count`, `distinct` and `aggregate` (a view's reads among them: an aggregation the router
    /// builds from the view's pipeline and the client's options) send the shards the bytes
    /// their owned commands had.
    #[test]
    fn count_distinct_and_aggregate_commands_are_the_owned_paths_bytes() {
        let envelope = doc! {"collation": {"locale": "en"}, "readConcern": {"level": "local"}, "$readPreference": {"mode": "nearest"}, "let": {"v": 2}};
        for options in [Document::new(), envelope] {
            let mut count = doc! {"count": "c", "query": {"a": 1}, "limit": -2, "skip": 1};
            let mut distinct = doc! {"distinct": "c", "key": "k", "query": {"b": {"$ne": null}}};
            // What `read_resolved_view` asks the read path for a `find` on a view.
            let mut view = doc! {"aggregate": "c", "pipeline": [{"$match": {"x": 1}}, {"$project": {"x": 1}}, {"$match": {"a": 1}}], "cursor": {"batchSize": 3}, "$db": "db"};
            for d in [&mut count, &mut distinct, &mut view] {
                d.extend(options.clone());
            }
            let req = request(&raw(count));
            let body = req.options_document();
            let mut old = doc! {"count": "c", "query": {"a": 1}, "limit": 3_i64};
            owned_envelope(&mut old, &body);
            let mut normalized = None;
            let read_body = ReadBody::of(&req, &mut normalized).expect("reads");
            let query = doc_field(&read_body, "query", "count").expect("a document");
            let new = count_command(&read_body, "c", query, Some(3));
            assert_eq!(new.as_bytes(), old.to_vec().expect("encodes"));

            let req = request(&raw(distinct));
            let body = req.options_document();
            let mut old = doc! {"distinct": "c", "key": "k", "query": {"b": {"$ne": null}}};
            owned_envelope(&mut old, &body);
            let mut normalized = None;
            let read_body = ReadBody::of(&req, &mut normalized).expect("reads");
            let query = doc_field(&read_body, "query", "distinct").expect("a document");
            let new = distinct_command(&read_body, "c", "k", query);
            assert_eq!(new.as_bytes(), old.to_vec().expect("encodes"));

            let req = request(&raw(view));
            let body = req.options_document();
            let pipeline = body.get_array("pipeline").expect("a pipeline").clone();
            let split = merge::split_pipeline(&pipeline);
            let mut old = doc! {"aggregate": "c", "pipeline": split.shard_part.clone(), "cursor": {"batchSize": 10_000}};
            if let Some(l) = body.get("let") {
                old.insert("let", l.clone());
            }
            owned_envelope(&mut old, &body);
            let mut normalized = None;
            let read_body = ReadBody::of(&req, &mut normalized).expect("reads");
            let new = aggregate_command(&read_body, "c", &split.shard_part).expect("encodes");
            assert_eq!(new.as_bytes(), old.to_vec().expect("encodes"));
        }
    }

    /// A `find`'s filter read in place goes to the shards the owned filter goes to, for every
    /// key pattern and filter shape (the write path's targeting shapes), and a collation other
    /// than the simple one is still decided on the owned filter.
    #[test]
    fn find_targets_in_place_are_the_owned_targets() {
        use crate::routing::ShardKeyPattern;
        let patterns = [
            doc! {"_id": "hashed"},
            doc! {"_id": 1},
            doc! {"sk": "hashed"},
            doc! {"a.b": "hashed"},
            doc! {"region": 1, "_id": "hashed"},
        ];
        let filters = [
            doc! {},
            doc! {"_id": 7},
            doc! {"_id": 7_i64},
            doc! {"_id": 7.5},
            doc! {"_id": "x-7"},
            doc! {"_id": bson::oid::ObjectId::from_bytes([3; 12])},
            doc! {"_id": {"$eq": 7}},
            doc! {"_id": {"$eq": 7, "$ne": 8}},
            doc! {"_id": [1, 2]},
            doc! {"_id": {"$in": [1, 2]}},
            doc! {"_id": {"$gt": 1}},
            doc! {"_id": null},
            doc! {"_id": {"p": 1}},
            doc! {"_id": 7, "x": {"$gt": 1}},
            doc! {"$and": [{"_id": 7}]},
            doc! {"sk": 1, "_id": 9},
            doc! {"a.b": 1},
            doc! {"a": {"b": 1}},
            doc! {"a.b.c": 1},
            doc! {"region": "eu", "_id": {"$eq": 2}},
            doc! {"region": "eu"},
        ];
        let mut in_place = 0;
        for key in &patterns {
            let snap =
                RoutingSnapshot::initial("d.c", ShardKeyPattern::parse(key).unwrap(), 3).unwrap();
            for filter in &filters {
                let bytes = raw(filter.clone());
                let got = find_targets(&snap, &bytes, None).expect("targets");
                assert_eq!(got, collated_targets(&snap, filter, None), "{key} {filter}");
                if matches!(
                    RawFilter::read(&snap.pattern, &bytes).map(|f| f.shard(&snap)),
                    Some(Ok(Some(_)))
                ) {
                    in_place += 1;
                    assert_eq!(got.len(), 1, "{key} {filter}");
                }
            }
        }
        assert!(in_place >= 10, "{in_place} filters targeted in place");
        // Under a collation a filter with a string goes to every shard, read in place or not.
        let snap = RoutingSnapshot::initial(
            "d.c",
            ShardKeyPattern::parse(&doc! {"_id": "hashed"}).unwrap(),
            3,
        )
        .unwrap();
        let collation =
            Collation::from_option(Some(&Bson::Document(doc! {"locale": "fr", "strength": 2})))
                .unwrap()
                .expect("a collation");
        let filter = doc! {"_id": "x"};
        assert_eq!(
            find_targets(&snap, &raw(filter.clone()), Some(collation.as_ref())).unwrap(),
            collated_targets(&snap, &filter, Some(collation.as_ref()))
        );
        assert_eq!(
            find_targets(&snap, &raw(filter), Some(collation.as_ref()))
                .unwrap()
                .len(),
            3
        );
    }
}
