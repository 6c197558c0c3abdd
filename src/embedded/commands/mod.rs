//! The embedded shard's data commands: CRUD, cursors, aggregation and DDL, with mongod 8.0's
//! reply shapes, one file per command family; [`run`] dispatches to them.

mod aggregation;
mod batch;
mod catalog;
mod find_and_modify;
mod indexes;
mod reads;
mod writes;

use bson::{doc, Document};

use super::service::{lock, RetryCtx, ShardService};
use crate::command::CommandRequest;
use crate::engine::EngineError;
use crate::value::error_codes::ErrorCode;

use aggregation::aggregate_cmd;
pub(super) use batch::{run_statements, stale_write_reply};
use catalog::{coll_stats, create, db_stats, drop_collection, list_collections, list_databases};
use find_and_modify::find_and_modify;
use indexes::{create_indexes, drop_indexes, list_indexes};
use reads::{count, distinct, find, get_more, kill_cursors};
use writes::{delete, insert, update};
pub(super) use writes::{delete_one_statement, update_one_statement};

fn err(code: ErrorCode, msg: impl Into<String>) -> EngineError {
    EngineError::new(code, msg)
}

/// The statements of a write command (from its document sequence or its body array).
fn statements(req: &CommandRequest, field: &str) -> Result<Vec<Document>, EngineError> {
    let raw = req.statement_bytes(field)?;
    raw.iter()
        .map(|b| {
            Document::from_reader(&b[..]).map_err(|e| err(ErrorCode::InvalidBSON, e.to_string()))
        })
        .collect()
}

/// How many statements a write carries (1 for anything else), for latency injection and
/// retryable-write statement ids.
pub fn statement_count(req: &CommandRequest) -> usize {
    req.statement_count().unwrap_or(1)
}

/// The collection a command names in its first field.
fn collection_name(req: &CommandRequest, body: &Document) -> Result<String, EngineError> {
    Ok(req.collection_name(body)?)
}

/// Runs one data or DDL command.
pub fn run(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
    retry: Option<&RetryCtx>,
) -> Result<Document, EngineError> {
    if super::views::needs_collection(&req.name) {
        if let Ok(coll) = req.collection_name(body) {
            super::views::check_not_view(&lock(&svc.data()), &req.name, &req.db, &coll)?;
        }
    }
    match req.name.as_str() {
        "insert" => insert(svc, req, body, retry),
        "update" => update(svc, req, body, retry),
        "delete" => delete(svc, req, body, retry),
        "bulkWrite" => super::bulk_write::bulk_write(svc, req, retry, &[]),
        "findAndModify" | "findandmodify" => find_and_modify(svc, req, body, retry),
        "find" => find(svc, req, body),
        "getMore" => get_more(svc, req, body),
        "killCursors" => kill_cursors(svc, req, body),
        "count" => count(svc, req, body),
        "distinct" => distinct(svc, req, body),
        "aggregate" => aggregate_cmd(svc, req, body),
        "create" => create(svc, req, body),
        "drop" => drop_collection(svc, req, body),
        "dropDatabase" => {
            lock(&svc.data()).dbs.remove(&req.db);
            Ok(doc! {"dropped": &req.db})
        }
        "listCollections" => list_collections(svc, req, body),
        "listDatabases" => list_databases(svc, body),
        "createIndexes" => create_indexes(svc, req, body),
        "listIndexes" => list_indexes(svc, req, body),
        "dropIndexes" | "deleteIndexes" => drop_indexes(svc, req, body),
        "collStats" => coll_stats(svc, req, body),
        "dbStats" => db_stats(svc, req),
        "collMod" => super::ddl::coll_mod(svc, req, body),
        "validate" => super::ddl::validate(svc, req, body),
        "dataSize" | "datasize" => super::ddl::data_size(svc, body),
        "splitVector" => super::ddl::split_vector(svc, body),
        "renameCollection" => super::ddl::rename_collection(svc, req, body),
        other => Err(err(
            ErrorCode::CommandNotFound,
            format!("no such command: '{other}'"),
        )),
    }
}
