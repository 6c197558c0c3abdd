//! The router's `bulkWrite` (MongoDB 8.0): operations over several namespaces, each targeted
//! with its namespace's routing snapshot (or sent to its database's primary shard when the
//! collection is not sharded), planned by the same planner as `insert`/`update`/`delete`, and
//! sent as per-shard child `bulkWrite` commands.
//!
//! The proof applies across namespaces: an ordered bulk whose operations each target one shard,
//! whose identities are pairwise distinct within each namespace (an identity is the pair
//! namespace, `_id`), and whose operations are retry-safe goes out as ONE round, one ordered
//! child `bulkWrite` per shard; otherwise mongos's rounds. A child carries the client's whole
//! `nsInfo`, so the operations travel as the client's bytes with their `nsInfo` indexes
//! unchanged; as mongos (`BulkWriteOp::buildBulkCommandRequest`), each namespace the child has
//! operations for carries its versions for that shard: a sharded one its `shardVersion`, an
//! unsharded one the UNSHARDED `shardVersion` and its database's `databaseVersion` (with a
//! config server), so a shard that is no longer the primary refuses it (StaleDbVersion) and
//! the router retargets instead of writing where no one reads. Replies are merged item
//! by item (each child reports every operation it ran), so counts are exact whatever the plan;
//! an ordered reply is cut at its first error and inserts a rewritten bulk applied after that
//! error are undone, as for the other write commands (docs/design/bulk-write.md).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bson::{doc, oid::ObjectId, Bson, Document};
use bytes::Bytes;

use super::merge::{merge_write_concern_errors, ChildOutcome};
use super::plan::{self, PlanKind, Policy, Round};
use super::target::{self, Target, Targeted};
use super::{child_template, ClusterSender, PrimaryShard, Statements, WriteStats};
use crate::backend::limiter::OpKind;
use crate::cluster::Cluster;
use crate::command::bulk_write::{error_item, ok_item, BulkRequest, Summary, CURSOR_NS};
use crate::command::{CommandError, WriteKind};
use crate::routing::RoutingSnapshot;
use crate::value::error_codes::ErrorCode;
use crate::value::field::number_field;
use crate::wire::OpMsgBuilder;

/// Where one `nsInfo` namespace's operations go.
#[derive(Debug, Clone)]
pub enum NsRoute {
    /// A sharded collection: target each operation with this snapshot.
    Sharded(Arc<RoutingSnapshot>),
    /// An unsharded collection: every operation goes to the database's primary shard, with
    /// the versions it checks (UNSHARDED and the `databaseVersion`, with a config server).
    Unsharded(PrimaryShard),
}

/// Stale-routing codes a shard answers an operation with when its routing was out of date
/// (StaleConfig, StaleEpoch, StaleShardVersion, StaleDbVersion).
const STALE_CODES: &[i32] = &[13388, 150, 63, 249];

/// Rounds without progress before stale operations fail with NoProgressMade.
const MAX_ROUNDS_WITHOUT_PROGRESS: usize = 5;

/// What the router knows of a bulkWrite while running it.
struct Run<'a> {
    cluster: &'a Arc<Cluster>,
    bulk: &'a BulkRequest,
    routes: Vec<NsRoute>,
    /// Each operation's bytes (the client's, or re-encoded with a router-made `_id`).
    raws: Vec<Bytes>,
    /// Each operation's statement (an insert's document with its `_id`).
    statements: Vec<Document>,
    /// Whether an insert's `_id` came from the client.
    client_id: Vec<bool>,
    template: Document,
    retryable: bool,
    max_time: Option<std::time::Duration>,
}

fn is_ok(item: &Document) -> bool {
    item.get_f64("ok").ok() == Some(1.0)
}

fn is_stale(item: &Document) -> bool {
    !is_ok(item) && item.get_i32("code").is_ok_and(|c| STALE_CODES.contains(&c))
}

fn failed_item(idx: usize, kind: WriteKind, code: ErrorCode, message: &str) -> Document {
    error_item(idx, kind, &doc! {"code": code.0, "errmsg": message})
}

/// The operations of a child batch whose results a failed `getMore` lost: the shard ran the
/// child and reported `items` before the failure. They may or may not have been applied, so
/// each gets the failure as its error rather than being counted or silently left out
/// (mongos, too, reports a failed `getMore` as an error of the batch). An ordered child
/// reports its operations in order and stops at its first error: the first operation without
/// an item is the one the error belongs to, and none is lost when an error was already read.
/// An unordered child may have run every one of them.
fn unreported(ops: &[usize], items: &[(usize, Document)], ordered: bool) -> Vec<usize> {
    let reported: std::collections::HashSet<usize> = items.iter().map(|(i, _)| *i).collect();
    if ordered {
        if items.iter().any(|(_, d)| !is_ok(d)) {
            return Vec::new();
        }
        return ops
            .iter()
            .copied()
            .find(|i| !reported.contains(i))
            .into_iter()
            .collect();
    }
    ops.iter()
        .copied()
        .filter(|i| !reported.contains(i))
        .collect()
}

/// One operation's item from the items several shards returned for it (a multi-shard update or
/// delete): counts add up; one error, or errors with one code, pass through; different codes
/// become 65 MultipleErrorsOccurred, as mongos combines them.
fn combine(idx: usize, kind: WriteKind, parts: &[Document]) -> Document {
    let errors: Vec<&Document> = parts.iter().filter(|p| !is_ok(p)).collect();
    if let Some(first) = errors.first() {
        let code = |e: &Document| e.get_i32("code").unwrap_or(0);
        if errors.iter().all(|e| code(e) == code(first)) {
            let mut e = (*first).clone();
            e.insert("idx", idx as i32);
            return e;
        }
        let messages: Vec<&str> = errors
            .iter()
            .map(|e| e.get_str("errmsg").unwrap_or(""))
            .collect();
        let mut e = failed_item(
            idx,
            kind,
            ErrorCode::MultipleErrorsOccurred,
            &format!("multiple errors for op : {}", messages.join(" :: and :: ")),
        );
        e.insert(
            "errInfo",
            doc! {"causedBy": errors.iter().map(|e| Bson::Document((*e).clone())).collect::<Vec<_>>()},
        );
        return e;
    }
    let n: i64 = parts
        .iter()
        .map(|p| number_field(p, "n").unwrap_or(0))
        .sum();
    let upserted = parts
        .iter()
        .find_map(|p| p.get_document("upserted").ok()?.get("_id").cloned());
    let modified = (kind == WriteKind::Update).then(|| {
        parts
            .iter()
            .map(|p| number_field(p, "nModified").unwrap_or(0))
            .sum()
    });
    ok_item(idx, n, modified, upserted)
}

impl Run<'_> {
    fn kind(&self, i: usize) -> WriteKind {
        self.bulk.ops[i].kind
    }

    fn ns(&self, i: usize) -> &str {
        &self.bulk.namespaces[self.bulk.ops[i].ns]
    }

    /// Targets operation `i`; its identity is scoped to its namespace.
    fn target(&self, i: usize) -> Targeted {
        let op = &self.bulk.ops[i];
        let stmt = &self.statements[i];
        let mut t = match &self.routes[op.ns] {
            NsRoute::Sharded(snap) => match op.kind {
                WriteKind::Insert => match bson::RawDocumentBuf::try_from(stmt) {
                    Ok(raw) => target::target_insert(snap, &raw, self.client_id[i]),
                    Err(e) => Targeted {
                        target: Target::Error {
                            code: ErrorCode::InvalidBSON,
                            message: e.to_string(),
                        },
                        identity: None,
                        retry_safe: false,
                    },
                },
                WriteKind::Update => target::target_update(snap, stmt),
                WriteKind::Delete => target::target_delete(snap, stmt),
            },
            NsRoute::Unsharded(primary) => {
                let id = (op.kind == WriteKind::Insert && self.client_id[i])
                    .then(|| stmt.get("_id"))
                    .flatten();
                target::target_unsharded(op.kind, stmt, id, &primary.shard)
            }
        };
        t.identity = t
            .identity
            .map(|id| Bson::Array(vec![Bson::String(self.ns(i).to_string()), id]));
        t
    }

    /// The child `bulkWrite` for `shard` holding operations `ops` (global indexes, in order).
    fn encode(
        &self,
        shard: &str,
        ops: &[usize],
        ordered: bool,
    ) -> Result<(Bytes, i32), CommandError> {
        let cannot = |e: bson::error::Error| {
            CommandError::new(
                ErrorCode::InternalError,
                format!("cannot encode child bulkWrite: {e}"),
            )
        };
        let mut body = bson::RawDocumentBuf::try_from(&self.template).map_err(cannot)?;
        body.append(bson::raw::cstr!("ordered"), ordered);
        body.append(bson::raw::cstr!("errorsOnly"), false);
        if self.retryable {
            let mut ids = bson::RawArrayBuf::new();
            for i in ops {
                ids.push(self.bulk.stmt_id(*i));
            }
            body.append(bson::raw::cstr!("stmtIds"), ids);
        }
        let mut b = OpMsgBuilder::new(0, body.as_bytes());
        b.begin_sequence("nsInfo");
        let mut targeted = vec![false; self.bulk.ns_info.len()];
        for i in ops {
            if let Some(t) = targeted.get_mut(self.bulk.ops[*i].ns) {
                *t = true;
            }
        }
        for (k, entry) in self.bulk.ns_info.iter().enumerate() {
            let mut e = Document::new();
            for (key, v) in entry {
                if !matches!(key.as_str(), "shardVersion" | "databaseVersion") {
                    e.insert(key.clone(), v.clone());
                }
            }
            // Versions only for the namespaces this child writes, as mongos sets them from
            // each targeted operation's endpoint.
            if targeted[k] {
                match &self.routes[k] {
                    NsRoute::Sharded(snap) => {
                        if self.cluster.is_shard_server(shard) {
                            e.insert("shardVersion", snap.shard_version(shard));
                        }
                    }
                    NsRoute::Unsharded(primary) if primary.shard == shard => {
                        e.extend(primary.versions.clone());
                    }
                    NsRoute::Unsharded(_) => {}
                }
            }
            b.push_document(&e.to_vec().map_err(cannot)?);
        }
        b.begin_sequence("ops");
        for i in ops {
            b.push_document(&self.raws[*i]);
        }
        let id = crate::backend::PooledConnection::next_request_id();
        Ok((b.finish(id, 0), id))
    }

    /// Sends one child `bulkWrite` and returns, for each operation it reported, its item (with
    /// the global index), and the child's write concern error. A failed child fails its first
    /// operation (ordered) or all of them (unordered).
    async fn send(
        &self,
        shard: &str,
        ops: &[usize],
        ordered: bool,
    ) -> (Vec<(usize, Document)>, Option<Document>) {
        let fail_all = |code: ErrorCode, message: &str| {
            let failed: Vec<(usize, Document)> = ops
                .iter()
                .take(if ordered { 1 } else { ops.len() })
                .map(|i| (*i, failed_item(*i, self.kind(*i), code, message)))
                .collect();
            (failed, None)
        };
        let (frame, id) = match self.encode(shard, ops, ordered) {
            Ok(f) => f,
            Err(e) => return fail_all(e.code, &e.message),
        };
        let bytes: usize = ops.iter().map(|i| self.raws[*i].len()).sum();
        let work = crate::cluster::SlotRequest {
            op: OpKind::Mutate,
            command: "bulkWrite",
            ns: CURSOR_NS,
            operations: ops.len(),
            bytes,
        };
        let (outcome, member) = super::send_frame_from(
            self.cluster,
            shard,
            work,
            self.max_time,
            self.retryable,
            &frame,
            id,
        )
        .await;
        let reply = match outcome {
            ChildOutcome::Failed { code, message } => return fail_all(code, &message),
            ChildOutcome::Reply(r) => r,
            ChildOutcome::Raw(r) => super::merge::owned_reply(r.raw()),
        };
        if !is_ok(&reply) {
            let code = ErrorCode(reply.get_i32("code").unwrap_or(ErrorCode::InternalError.0));
            let message = format!("{} (shard {shard})", reply.get_str("errmsg").unwrap_or(""));
            return fail_all(code, &message);
        }
        let wce = reply.get_document("writeConcernError").ok().cloned();
        let mut items = Vec::new();
        let mut take = |batch: Option<&Vec<Bson>>| {
            for item in batch.into_iter().flatten() {
                let Some(item) = item.as_document() else {
                    continue;
                };
                let local = number_field(item, "idx").unwrap_or(-1);
                let Some(&global) = usize::try_from(local).ok().and_then(|l| ops.get(l)) else {
                    continue;
                };
                let mut item = item.clone();
                item.insert("idx", global as i32);
                items.push((global, item));
            }
        };
        let cursor = reply.get_document("cursor").ok();
        take(cursor.and_then(|c| c.get_array("firstBatch").ok()));
        let mut cursor_id = cursor.and_then(|c| number_field(c, "id")).unwrap_or(0);
        let mut failed_get_more = None;
        // Replies too large for one message continue behind the shard's cursor, on the member
        // that opened it (a replica set's primary may have changed since).
        while cursor_id != 0 {
            let get_more =
                doc! {"getMore": cursor_id, "collection": "$cmd.bulkWrite", "$db": "admin"};
            let at = member.as_deref();
            match crate::read::read_one_at(self.cluster, shard, at, CURSOR_NS, &get_more).await {
                Ok(r) => {
                    let c = r.get_document("cursor").ok();
                    take(c.and_then(|c| c.get_array("nextBatch").ok()));
                    cursor_id = c.and_then(|c| number_field(c, "id")).unwrap_or(0);
                }
                Err(e) => {
                    failed_get_more = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failed_get_more {
            let message = format!("{} (reading the results of a child bulkWrite)", e.message);
            for i in unreported(ops, &items, ordered) {
                items.push((i, failed_item(i, self.kind(i), e.code, &message)));
            }
        }
        (items, wce)
    }

    /// A single-document update or delete no one shard can run alone (write without shard
    /// key): found first, then written by its `_id`, through the executor's lookup.
    async fn lookup(&self, i: usize, shards: Vec<String>) -> (Document, Option<Document>) {
        let kind = self.kind(i);
        let NsRoute::Sharded(snap) = &self.routes[self.bulk.ops[i].ns] else {
            return (
                failed_item(
                    i,
                    kind,
                    ErrorCode::InternalError,
                    "lookup on an unsharded collection",
                ),
                None,
            );
        };
        let (db, coll) = self.bulk.names(i);
        let mut template = doc! {kind.command(): coll, "$db": db};
        for k in [
            "writeConcern",
            "bypassDocumentValidation",
            "comment",
            "lsid",
            "txnNumber",
            "let",
        ] {
            if let Some(v) = self.template.get(k) {
                template.insert(k, v.clone());
            }
        }
        let raw = match self.statements[i].to_vec() {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                return (
                    failed_item(i, kind, ErrorCode::BadValue, &e.to_string()),
                    None,
                )
            }
        };
        let stmts = Statements {
            raw: vec![raw],
            client_id: vec![false],
        };
        let template = match bson::RawDocumentBuf::try_from(&template) {
            Ok(t) => t,
            Err(e) => {
                return (
                    failed_item(i, kind, ErrorCode::InternalError, &e.to_string()),
                    None,
                )
            }
        };
        let sender = ClusterSender {
            cluster: self.cluster,
            coalescer: None,
            ns: self.ns(i).to_string(),
            max_time: self.max_time,
            kind,
            template,
            stmts: &stmts,
            retryable: self.retryable,
            client_stmt_ids: Some(vec![self.bulk.stmt_id(i)]),
        };
        let result = super::ChildSender::run_lookup(&sender, snap, 0, shards).await;
        let reply = match result.outcome {
            ChildOutcome::Failed { code, message } => {
                return (failed_item(i, kind, code, &message), None)
            }
            ChildOutcome::Reply(r) => r,
            ChildOutcome::Raw(r) => super::merge::owned_reply(r.raw()),
        };
        let wce = reply.get_document("writeConcernError").ok().cloned();
        if !is_ok(&reply) {
            let code = ErrorCode(reply.get_i32("code").unwrap_or(ErrorCode::InternalError.0));
            return (
                failed_item(i, kind, code, reply.get_str("errmsg").unwrap_or("")),
                wce,
            );
        }
        if let Some(e) = reply
            .get_array("writeErrors")
            .ok()
            .and_then(|e| e.first())
            .and_then(|e| e.as_document())
        {
            return (error_item(i, kind, e), wce);
        }
        let upserted = reply
            .get_array("upserted")
            .ok()
            .and_then(|u| u.first())
            .and_then(|u| u.as_document())
            .and_then(|u| u.get("_id").cloned());
        let n = number_field(&reply, "n").unwrap_or(0);
        let modified =
            (kind == WriteKind::Update).then(|| number_field(&reply, "nModified").unwrap_or(0));
        (ok_item(i, n, modified, upserted), wce)
    }

    /// Deletes what inserts `late` inserted, each only while it is still the document inserted;
    /// returns those undone.
    async fn undo_inserts(&self, late: &[usize]) -> Vec<usize> {
        let mut by_shard: std::collections::BTreeMap<String, Vec<(usize, Bytes)>> =
            Default::default();
        for &i in late {
            let Target::One(shard) = self.target(i).target else {
                continue;
            };
            let op = doc! {
                "delete": self.bulk.ops[i].ns as i32,
                "filter": super::undo_filter(self.statements[i].clone()),
                "multi": false,
            };
            if let Ok(b) = op.to_vec() {
                by_shard.entry(shard).or_default().push((i, Bytes::from(b)));
            }
        }
        let mut template = Document::new();
        for (k, v) in &self.template {
            if !matches!(k.as_str(), "txnNumber" | "stmtIds" | "stmtId") {
                template.insert(k.clone(), v.clone());
            }
        }
        let undo = Run {
            cluster: self.cluster,
            bulk: self.bulk,
            routes: self.routes.clone(),
            raws: self.raws.clone(),
            statements: Vec::new(),
            client_id: Vec::new(),
            template,
            retryable: false,
            max_time: self.max_time,
        };
        let futures = by_shard.into_iter().map(|(shard, items)| {
            let undo = &undo;
            async move {
                // The undo child's operations stand in for the inserts at the same indexes.
                let mut raws = undo.raws.clone();
                for (i, b) in &items {
                    raws[*i] = b.clone();
                }
                let run = Run {
                    raws,
                    routes: undo.routes.clone(),
                    template: undo.template.clone(),
                    statements: Vec::new(),
                    client_id: Vec::new(),
                    ..*undo
                };
                let ops: Vec<usize> = items.iter().map(|(i, _)| *i).collect();
                let (results, _) = run.send(&shard, &ops, false).await;
                results
                    .into_iter()
                    .filter(|(_, item)| is_ok(item) && number_field(item, "n") == Some(1))
                    .map(|(i, _)| i)
                    .collect::<Vec<usize>>()
            }
        });
        let mut undone: Vec<usize> = crate::backend::join_all(futures)
            .await
            .into_iter()
            .flatten()
            .collect();
        undone.sort_unstable();
        undone
    }
}

/// Runs a router `bulkWrite` whose namespaces resolve to `routes` (one per `nsInfo` entry) and
/// returns the client's reply (without `ok`). `refresh` reloads a namespace's route after a
/// shard answered its operations with stale routing (given those answers, so that the cache
/// refreshes what they name: the collection, or the database for StaleDbVersion).
pub async fn execute<'r>(
    cluster: &Arc<Cluster>,
    stats: &WriteStats,
    policy: Policy,
    bulk: &BulkRequest,
    routes: Vec<NsRoute>,
    refresh: &(dyn Fn(String, Vec<Document>) -> crate::frontend::BoxFuture<'r, Option<NsRoute>>
          + Sync
          + 'r),
) -> Result<Document, CommandError> {
    let n = bulk.ops.len();
    let retryable = bulk.options.contains_key("lsid") && bulk.options.contains_key("txnNumber");
    let mut template = child_template(&bulk.options);
    for k in ["errorsOnly", "cursor"] {
        template.remove(k);
    }
    let max_time = number_field(&bulk.options, "maxTimeMS")
        .filter(|m| *m > 0)
        .map(|m| std::time::Duration::from_millis(m as u64));
    let mut raws = Vec::with_capacity(n);
    let mut statements = Vec::with_capacity(n);
    let mut client_id = Vec::with_capacity(n);
    for op in &bulk.ops {
        if op.kind == WriteKind::Insert && !op.statement.contains_key("_id") {
            // As mongos: the router gives the document an ObjectId _id, first.
            let mut d = doc! {"_id": ObjectId::new()};
            d.extend(op.statement.clone());
            let re = doc! {"insert": op.ns as i32, "document": d.clone()};
            let bytes = re
                .to_vec()
                .map_err(|e| CommandError::new(ErrorCode::InvalidBSON, e.to_string()))?;
            raws.push(Bytes::from(bytes));
            statements.push(d);
            client_id.push(false);
        } else {
            raws.push(op.raw.clone());
            statements.push(op.statement.clone());
            client_id.push(op.kind == WriteKind::Insert);
        }
    }
    let mut run = Run {
        cluster,
        bulk,
        routes,
        raws,
        statements,
        client_id,
        template,
        retryable,
        max_time,
    };
    let ordered = bulk.ordered;
    let mut items: Vec<Option<Document>> = vec![None; n];
    let mut wces: Vec<(String, Document)> = Vec::new();
    let mut pending: Vec<usize> = (0..n).collect();
    let mut chosen: Option<PlanKind> = None;
    let mut rounds_without_progress = 0;
    let first_error = |items: &[Option<Document>]| {
        items
            .iter()
            .position(|i| i.as_ref().is_some_and(|d| !is_ok(d)))
    };
    loop {
        let targeted: Vec<Targeted> = pending.iter().map(|&i| run.target(i)).collect();
        let indexed: Vec<(usize, &Targeted)> =
            pending.iter().copied().zip(targeted.iter()).collect();
        // Each operation's result is reported on its own: counts are always exact.
        let p = plan::plan(&indexed, ordered, policy, true);
        if chosen.is_none() {
            chosen = Some(p.kind);
            stats.count_plan(p.kind);
        }
        for round in p.rounds {
            match round {
                Round::Fail(i) => {
                    if let Some((
                        _,
                        Targeted {
                            target: Target::Error { code, message },
                            ..
                        },
                    )) = indexed.iter().find(|(j, _)| *j == i)
                    {
                        items[i] = Some(failed_item(i, run.kind(i), *code, message));
                    }
                }
                Round::Lookup(i, shards) => {
                    stats.rounds.fetch_add(1, Ordering::Relaxed);
                    stats.lookups.fetch_add(1, Ordering::Relaxed);
                    stats.child_batches.fetch_add(1, Ordering::Relaxed);
                    let (item, wce) = run.lookup(i, shards).await;
                    if let Some(w) = wce {
                        wces.push((run.ns(i).to_string(), w));
                    }
                    items[i] = Some(item);
                }
                Round::Send(work) => {
                    stats.rounds.fetch_add(1, Ordering::Relaxed);
                    let run_ref = &run;
                    let futures = work.iter().map(|w| async move {
                        (
                            w.shard.clone(),
                            run_ref.send(&w.shard, &w.statements, ordered).await,
                        )
                    });
                    let mut parts: std::collections::BTreeMap<usize, Vec<Document>> =
                        Default::default();
                    for (shard, (results, wce)) in crate::backend::join_all(futures).await {
                        stats.child_batches.fetch_add(1, Ordering::Relaxed);
                        if let Some(w) = wce {
                            wces.push((shard, w));
                        }
                        for (i, item) in results {
                            parts.entry(i).or_default().push(item);
                        }
                    }
                    for (i, ps) in parts {
                        items[i] = Some(combine(i, run.kind(i), &ps));
                    }
                }
            }
            let stopped = items.iter().flatten().any(|d| !is_ok(d));
            if ordered && stopped {
                break;
            }
        }
        // Operations a shard refused for stale routing are retargeted with fresh routing.
        let stale: Vec<usize> = (0..n)
            .filter(|&i| items[i].as_ref().is_some_and(is_stale))
            .collect();
        if stale.is_empty() {
            break;
        }
        let real_error_first = match (first_error(&items), stale.first()) {
            (Some(e), Some(&s)) => e < s,
            _ => false,
        };
        if ordered && real_error_first {
            break;
        }
        let finished_before = items.iter().filter(|i| i.is_some()).count() - stale.len();
        let mut refreshed = true;
        let mut namespaces: Vec<usize> = stale.iter().map(|&i| bulk.ops[i].ns).collect();
        namespaces.sort_unstable();
        namespaces.dedup();
        for k in namespaces {
            let errors: Vec<Document> = stale
                .iter()
                .filter(|&&i| bulk.ops[i].ns == k)
                .filter_map(|&i| items[i].clone())
                .collect();
            match refresh(bulk.namespaces[k].clone(), errors).await {
                Some(r) => run.routes[k] = r,
                None => refreshed = false,
            }
        }
        rounds_without_progress += 1;
        if !refreshed || rounds_without_progress >= MAX_ROUNDS_WITHOUT_PROGRESS {
            for &i in &stale {
                items[i] = Some(failed_item(
                    i,
                    run.kind(i),
                    ErrorCode::NoProgressMade,
                    &format!("No progress was made executing bulkWrite ops in after {rounds_without_progress} rounds ({} ops completed in last round)", finished_before),
                ));
            }
            break;
        }
        for &i in &stale {
            items[i] = None;
        }
        // Ordered: every operation not run yet is planned again, in order.
        pending = (0..n).filter(|&i| items[i].is_none()).collect();
        if !ordered {
            pending.retain(|i| stale.contains(i));
        }
    }
    let cut = if ordered { first_error(&items) } else { None };
    if let Some(k) = cut {
        let late: Vec<usize> = ((k + 1)..n)
            .filter(|&i| items[i].as_ref().is_some_and(is_ok))
            .collect();
        if !late.is_empty() && chosen == Some(PlanKind::Rewrite) {
            let inserts: Vec<usize> = late
                .iter()
                .copied()
                .filter(|&i| run.kind(i) == WriteKind::Insert)
                .collect();
            let undone = if inserts.is_empty() {
                Vec::new()
            } else {
                run.undo_inserts(&inserts).await
            };
            stats
                .undone_after_error
                .fetch_add(undone.len() as u64, Ordering::Relaxed);
            metrics::counter!("sluice_rewrite_undone_after_error_total")
                .increment(undone.len() as u64);
            let left = late.len() - undone.len();
            stats
                .applied_after_error
                .fetch_add(left as u64, Ordering::Relaxed);
            metrics::counter!("sluice_rewrite_applied_after_error_total").increment(left as u64);
            let not_undone: Vec<&usize> = inserts.iter().filter(|i| !undone.contains(i)).collect();
            if !not_undone.is_empty() {
                tracing::warn!(indexes = ?not_undone, "inserts of a rewritten bulkWrite applied after its first error could not be undone");
            }
        }
    }
    let limit = cut.map_or(n, |k| k + 1);
    let mut summary = Summary::default();
    let mut out = Vec::new();
    for (i, item) in items.into_iter().enumerate().take(limit) {
        if let Some(item) = item {
            summary.count(bulk.ops[i].kind, &item);
            out.push(item);
        }
    }
    let mut reply = summary.reply(out, bulk.errors_only);
    if let Some(w) = merge_write_concern_errors(&wces) {
        reply.insert("writeConcernError", w);
    }
    Ok(reply)
}
