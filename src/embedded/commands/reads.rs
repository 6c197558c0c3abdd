//! `find`, `getMore`, `killCursors`, `count` and `distinct`.

use bson::{doc, Bson, Document};

use super::collection_name;
use crate::command::CommandRequest;
use crate::embedded::service::{lock, ShardService};
use crate::engine::matcher::Matcher;
use crate::engine::reads::{CountSpec, DistinctSpec, FindSpec};
use crate::engine::EngineError;
use crate::value::error_codes::ErrorCode;

/// The reply to a read whose result is `docs`: the first batch, the rest kept as a cursor.
pub(super) fn cursor_reply(
    svc: &ShardService,
    ns: String,
    docs: Vec<Document>,
    batch: usize,
    single_batch: bool,
) -> Document {
    svc.cursors.first_batch(ns, docs, batch, single_batch)
}

/// The documents of `db.coll` that match (by the `_id` index when the filter pins an `_id`);
/// for a view, those of its source through its pipeline.
pub(super) fn matching_documents(
    svc: &ShardService,
    db: &str,
    coll: &str,
    filter: &Document,
    matcher: &Matcher,
) -> Result<Vec<Document>, EngineError> {
    if let Some(docs) = crate::embedded::views::view_documents(svc, db, coll)? {
        return Ok(docs.into_iter().filter(|d| matcher.matches(d)).collect());
    }
    let data = svc.data();
    let cat = lock(&data);
    Ok(match cat.collection(db, coll) {
        Some(c) => c
            .find(filter, matcher)
            .into_iter()
            .filter_map(|rid| c.get(rid).cloned())
            .collect(),
        None => Vec::new(),
    })
}

pub(super) fn find(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let ns = format!("{}.{coll}", req.db);
    svc.check_version(&ns, body)?;
    let spec = FindSpec::parse(body)?;
    let docs = matching_documents(svc, &req.db, &coll, &spec.filter, &spec.matcher)?;
    let docs = spec.finish(docs);
    svc.bump_opcounter("query", 1);
    Ok(cursor_reply(
        svc,
        ns,
        docs,
        spec.batch_size,
        spec.single_batch,
    ))
}

pub(super) fn get_more(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let reply = svc.cursors.get_more(&req.db, body)?;
    svc.bump_opcounter("getmore", 1);
    Ok(reply)
}

pub(super) fn kill_cursors(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    match body.get(&req.name) {
        // A collection-less command's cursor (`db.aggregate`): drivers kill it by this name.
        Some(Bson::String(coll))
            if crate::limits::COLLECTIONLESS_CURSOR_COLLECTIONS.contains(&coll.as_str()) =>
        {
            crate::limits::check_cursor_namespace(&req.db, coll)
                .map_err(|m| EngineError::new(ErrorCode::InvalidNamespace, m))?;
        }
        _ => {
            collection_name(req, body)?;
        }
    }
    Ok(svc.cursors.kill(body)?)
}

pub(super) fn count(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let spec = CountSpec::parse(body)?;
    let docs = matching_documents(svc, &req.db, &coll, &spec.query, &spec.matcher)?;
    Ok(doc! {"n": spec.reply_count(docs.len())})
}

pub(super) fn distinct(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let spec = DistinctSpec::parse(body)?;
    let docs = matching_documents(svc, &req.db, &coll, &spec.query, &spec.matcher)?;
    Ok(doc! {"values": spec.values(&docs)})
}
