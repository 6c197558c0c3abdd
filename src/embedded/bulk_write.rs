//! The embedded shard's `bulkWrite` (MongoDB 8.0): operations over several namespaces run in
//! order through the same statement code and the same batch loop as `insert`, `update` and
//! `delete` (so retryable writes, ordered stops and error shapes are theirs), then reported one
//! item per operation behind a cursor, as mongod reports them.

use bson::{Bson, Document};

use super::commands::{delete_one_statement, run_statements, update_one_statement};
use super::service::{lock, RetryCtx, ShardService, StmtOutcome};
use crate::command::bulk_write::{self, error_item, ok_item, Summary};
use crate::command::{CommandRequest, WriteKind};
use crate::engine::reads::request_variables;
use crate::engine::update::prepare_insert;
use crate::engine::EngineError;
use crate::value::error_codes::ErrorCode;
use crate::value::field::number_field;

/// Runs a `bulkWrite`. A namespace whose `shardVersion` does not match what this shard was
/// given fails each of its operations with StaleConfig, so the router can retarget them;
/// `checked` holds, by `nsInfo` index, what a shard server's own check found (see
/// [`check_namespaces`]).
pub fn bulk_write(
    svc: &ShardService,
    req: &CommandRequest,
    retry: Option<&RetryCtx>,
    checked: &[Option<EngineError>],
) -> Result<Document, EngineError> {
    let bulk = bulk_write::parse(req)?;
    let vars = request_variables(&bulk.options)?;
    let stale: Vec<Option<EngineError>> = bulk
        .ns_info
        .iter()
        .zip(&bulk.namespaces)
        .enumerate()
        .map(|(k, (entry, ns))| {
            checked
                .get(k)
                .cloned()
                .flatten()
                .or_else(|| svc.check_version(ns, entry).err())
        })
        .collect();
    let data = svc.data();
    let mut cat = lock(&data);
    let out = run_statements(svc, retry, bulk.ops.len(), bulk.ordered, |i| {
        let op = &bulk.ops[i];
        if let Some(e) = &stale[op.ns] {
            return Err(e.clone());
        }
        if retry.is_some() && op.multi() {
            return Err(EngineError::new(
                ErrorCode::InvalidOptions,
                "Cannot use retryable writes with multi=true",
            ));
        }
        let ns = &bulk.namespaces[op.ns];
        let (db, coll) = bulk.names(i);
        match op.kind {
            WriteKind::Insert => {
                let (c, _) = cat.collection_mut(db, coll);
                prepare_insert(op.statement.clone())
                    .and_then(|d| c.insert(ns, d))
                    .map(|_| StmtOutcome::Inserted)
            }
            WriteKind::Update => update_one_statement(&mut cat, db, coll, ns, &op.statement, &vars),
            WriteKind::Delete => {
                let q = op.statement.get_document("q").cloned().unwrap_or_default();
                let limit = number_field(&op.statement, "limit").unwrap_or(1);
                let vars = vars.with_collation_option(op.statement.get("collation"))?;
                delete_one_statement(&mut cat, db, coll, &q, limit, &vars)
            }
        }
    });
    drop(cat);
    for (kind, counter) in [
        (WriteKind::Insert, "insert"),
        (WriteKind::Update, "update"),
        (WriteKind::Delete, "delete"),
    ] {
        let n = out
            .applied
            .iter()
            .filter(|(i, _)| bulk.ops[*i].kind == kind)
            .count();
        if n > 0 {
            svc.bump_opcounter(counter, n as i64);
        }
    }
    let mut items: Vec<(usize, Document)> = out
        .applied
        .iter()
        .map(|(i, done)| {
            let item = match done {
                StmtOutcome::Updated {
                    n,
                    modified,
                    upserted,
                } => ok_item(*i, *n, Some(*modified), upserted.clone()),
                StmtOutcome::Deleted { n } => ok_item(*i, *n, None, None),
                _ => ok_item(*i, 1, None, None),
            };
            (*i, item)
        })
        .collect();
    for e in &out.errors {
        if let Bson::Document(e) = e {
            let i = number_field(e, "index").unwrap_or(0) as usize;
            let kind = bulk.ops.get(i).map_or(WriteKind::Insert, |op| op.kind);
            items.push((i, error_item(i, kind, e)));
        }
    }
    items.sort_by_key(|(i, _)| *i);
    let mut summary = Summary::default();
    for (i, item) in &items {
        summary.count(bulk.ops[*i].kind, item);
    }
    let mut reply = summary.reply(
        items.into_iter().map(|(_, d)| d).collect(),
        bulk.errors_only,
    );
    // `cursor.batchSize` (or the shard's test setting): the first batch, the rest behind a
    // cursor on this member.
    let batch_size = bulk
        .options
        .get_document("cursor")
        .ok()
        .and_then(|c| number_field(c, "batchSize"))
        .and_then(|n| usize::try_from(n).ok())
        .or(svc.options.bulk_write_batch_size);
    if let Some(n) = batch_size {
        let batch: Vec<Document> = reply
            .get_document("cursor")
            .ok()
            .and_then(|c| c.get_array("firstBatch").ok())
            .map(|a| a.iter().filter_map(|b| b.as_document().cloned()).collect())
            .unwrap_or_default();
        let cursor = svc
            .cursors
            .first_batch(bulk_write::CURSOR_NS.to_string(), batch, n, false);
        if let Ok(c) = cursor.get_document("cursor") {
            reply.insert("cursor", c.clone());
        }
    }
    if !out.retried.is_empty() {
        reply.insert("retriedStmtIds", out.retried);
    }
    Ok(reply)
}

/// A shard server's check of each `nsInfo` entry's `shardVersion` / `databaseVersion` against
/// its filtering metadata, as it checks a single-namespace write's: first it waits while any
/// namespace that carries a version is in a critical section (a migration's, a DDL
/// coordinator's) and then holds the gate critical sections are entered through, as
/// `insert`, `update` and `delete` do; then it returns the gate with the error each
/// namespace's operations fail with, by `nsInfo` index (`None` where the versions match or
/// none was sent). A request that does not parse is checked by nothing here: [`bulk_write`]
/// refuses it.
pub async fn check_namespaces<'m>(
    filtering: &super::filtering::Filtering,
    migrations: &'m super::migration::Migrations,
    shard: &str,
    req: &CommandRequest,
) -> (
    Option<tokio::sync::RwLockReadGuard<'m, ()>>,
    Vec<Option<EngineError>>,
) {
    let Ok(bulk) = bulk_write::parse(req) else {
        return (None, Vec::new());
    };
    let versioned: Vec<&str> = bulk
        .ns_info
        .iter()
        .zip(&bulk.namespaces)
        .filter(|(entry, _)| {
            entry.contains_key("shardVersion") || entry.contains_key("databaseVersion")
        })
        .map(|(_, ns)| ns.as_str())
        .collect();
    let gate = if versioned.is_empty() {
        None
    } else {
        Some(migrations.enter_all(&versioned).await)
    };
    let mut out = Vec::new();
    for (entry, ns) in bulk.ns_info.iter().zip(&bulk.namespaces) {
        out.push(filtering.check(shard, ns, entry).await.err());
    }
    (gate, out)
}
