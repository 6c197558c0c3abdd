//! `insert`, `update` and `delete`, each on the shared batch loop of [`super::batch`], and the
//! one-statement update and delete that `bulkWrite` runs too.

use bson::{doc, Bson, Document};

use super::batch::{run_statements, statement_filter, write_batch, WriteBatch};
use super::err;
use crate::command::CommandRequest;
use crate::embedded::service::{lock, RetryCtx, ShardService, StmtOutcome};
use crate::embedded::store::Catalog;
use crate::engine::aggregate;
use crate::engine::matcher::Matcher;
use crate::engine::query::SortSpec;
use crate::engine::reads::{count_value, request_variables};
use crate::engine::update::{
    prepare_insert, upsert_document_in, ApplyContext, ArrayFilters, Update,
};
use crate::engine::EngineError;
use crate::limits::{measure, MAX_STORED_DEPTH};
use crate::value::error_codes::ErrorCode;
use crate::value::field::{number_field, truthy};
use crate::wire::MAX_BSON_OBJECT_SIZE;

/// Checks a document an update produced before it replaces the stored one: mongod's
/// storage validation (nesting) and size limit.
pub(super) fn check_updated(d: &Document) -> Result<(), EngineError> {
    let m = measure(d);
    if m.depth > MAX_STORED_DEPTH {
        return Err(crate::engine::update::too_deep());
    }
    if m.bytes > MAX_BSON_OBJECT_SIZE {
        return Err(err(
            ErrorCode::UpdatedDocumentTooLarge,
            format!("Resulting document after update is larger than {MAX_BSON_OBJECT_SIZE}"),
        ));
    }
    Ok(())
}

pub(super) fn insert(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
    retry: Option<&RetryCtx>,
) -> Result<Document, EngineError> {
    let batch = match write_batch(svc, req, body, "documents")? {
        Ok(batch) => batch,
        Err(stale) => return Ok(stale),
    };
    let WriteBatch {
        coll,
        ns,
        stmts: mut docs,
        ordered,
    } = batch;
    let data = svc.data();
    let mut cat = lock(&data);
    let (c, _) = cat.collection_mut(&req.db, &coll);
    let out = run_statements(svc, retry, docs.len(), ordered, |i| {
        prepare_insert(std::mem::take(&mut docs[i]))
            .and_then(|d| c.insert(&ns, d))
            .map(|_| StmtOutcome::Inserted)
    });
    drop(cat);
    let n = out.applied.len() as i32;
    svc.bump_opcounter("insert", n as i64);
    Ok(out.finish(doc! {"n": n}))
}

pub(super) fn update(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
    retry: Option<&RetryCtx>,
) -> Result<Document, EngineError> {
    let batch = match write_batch(svc, req, body, "updates")? {
        Ok(batch) => batch,
        Err(stale) => return Ok(stale),
    };
    // Statement shapes are checked before anything runs: a malformed statement fails the
    // whole command, as mongod's parser does.
    for stmt in &batch.stmts {
        crate::command::check_write_statement("update", stmt)?;
    }
    let vars = request_variables(body)?;
    let data = svc.data();
    let mut cat = lock(&data);
    let out = run_statements(svc, retry, batch.stmts.len(), batch.ordered, |i| {
        update_one_statement(
            &mut cat,
            &req.db,
            &batch.coll,
            &batch.ns,
            &batch.stmts[i],
            &vars,
        )
    });
    drop(cat);
    svc.bump_opcounter("update", batch.stmts.len() as i64);
    let (mut n, mut modified) = (0i64, 0i64);
    let mut upserted = Vec::new();
    for (i, done) in &out.applied {
        if let StmtOutcome::Updated {
            n: sn,
            modified: sm,
            upserted: su,
        } = done
        {
            n += sn;
            modified += sm;
            if let Some(id) = su {
                upserted.push(Bson::Document(doc! {"index": *i as i32, "_id": id.clone()}));
            }
        }
    }
    let mut reply = doc! {"n": count_value(n), "nModified": count_value(modified)};
    if !upserted.is_empty() {
        reply.insert("upserted", upserted);
    }
    Ok(out.finish(reply))
}

pub(in crate::embedded) fn update_one_statement(
    cat: &mut Catalog,
    db: &str,
    coll: &str,
    ns: &str,
    stmt: &Document,
    vars: &aggregate::Variables,
) -> Result<StmtOutcome, EngineError> {
    let q = statement_filter(stmt, "update.updates")?.clone();
    let vars = &vars.with_collation_option(stmt.get("collation"))?;
    let Some(u) = stmt.get("u") else {
        return Err(err(
            ErrorCode(40414),
            "BSON field 'update.updates.u' is missing but a required field",
        ));
    };
    let multi = stmt.get("multi").is_some_and(truthy);
    let upsert = stmt.get("upsert").is_some_and(truthy);
    let upd = Update::parse(u)?;
    if multi && upd.is_replacement() {
        return Err(err(
            ErrorCode::FailedToParse,
            "multi update is not supported for replacement-style update",
        ));
    }
    let filters = array_filters(stmt.get("arrayFilters"), &upd, u)?;
    let matcher = Matcher::parse_with(&q, vars)?;
    let ctx = ApplyContext {
        query: Some(&matcher),
        array_filters: Some(&filters),
        vars: Some(vars),
    };
    let sort = match stmt.get("sort") {
        Some(Bson::Document(s)) if !s.is_empty() => {
            if multi {
                return Err(err(
                    ErrorCode::FailedToParse,
                    "Cannot specify sort with multi=true",
                ));
            }
            Some(SortSpec::parse(s)?.with_collation(vars.collation().cloned()))
        }
        _ => None,
    };
    let mut rids = match cat.collection(db, coll) {
        Some(c) => c.find(&q, &matcher),
        None => Vec::new(),
    };
    if let (Some(sort), Some(c)) = (&sort, cat.collection(db, coll)) {
        rids.sort_by(|a, b| match (c.get(*a), c.get(*b)) {
            (Some(x), Some(y)) => sort.compare(x, y),
            _ => std::cmp::Ordering::Equal,
        });
    }
    if rids.is_empty() {
        if !upsert {
            return Ok(StmtOutcome::Updated {
                n: 0,
                modified: 0,
                upserted: None,
            });
        }
        let d = upsert_document_in(&q, &upd, &ctx)?;
        let id = d.get("_id").cloned().unwrap_or(Bson::Null);
        let (c, _) = cat.collection_mut(db, coll);
        c.insert(ns, d)?;
        return Ok(StmtOutcome::Updated {
            n: 1,
            modified: 0,
            upserted: Some(id),
        });
    }
    let Some(c) = cat.existing_mut(db, coll) else {
        return Ok(StmtOutcome::Updated {
            n: 0,
            modified: 0,
            upserted: None,
        });
    };
    let targets = if multi {
        rids
    } else {
        rids.into_iter().take(1).collect()
    };
    let (mut n, mut modified) = (0, 0);
    for rid in targets {
        let Some(old) = c.get(rid).cloned() else {
            continue;
        };
        let mut new = old.clone();
        upd.apply_in(&mut new, false, &ctx)?;
        check_updated(&new)?;
        n += 1;
        if new != old {
            c.replace(ns, rid, new)?;
            modified += 1;
        }
    }
    Ok(StmtOutcome::Updated {
        n,
        modified,
        upserted: None,
    })
}

pub(super) fn delete(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
    retry: Option<&RetryCtx>,
) -> Result<Document, EngineError> {
    let batch = match write_batch(svc, req, body, "deletes")? {
        Ok(batch) => batch,
        Err(stale) => return Ok(stale),
    };
    // Statement shapes are checked before anything runs: a malformed statement fails the
    // whole command, as mongod's parser does.
    let parsed: Vec<(&Document, i64)> = batch
        .stmts
        .iter()
        .map(|stmt| -> Result<(&Document, i64), EngineError> {
            crate::command::check_write_statement("delete", stmt)?;
            let q = statement_filter(stmt, "delete.deletes")?;
            Ok((q, number_field(stmt, "limit").unwrap_or(0)))
        })
        .collect::<Result<_, _>>()?;
    let vars = request_variables(body)?;
    let data = svc.data();
    let mut cat = lock(&data);
    let out = run_statements(svc, retry, parsed.len(), batch.ordered, |i| {
        let (q, limit) = parsed[i];
        let vars = vars.with_collation_option(batch.stmts[i].get("collation"))?;
        delete_one_statement(&mut cat, &req.db, &batch.coll, q, limit, &vars)
    });
    drop(cat);
    svc.bump_opcounter("delete", parsed.len() as i64);
    let n: i64 = out
        .applied
        .iter()
        .map(|(_, done)| match done {
            StmtOutcome::Deleted { n } => *n,
            _ => 0,
        })
        .sum();
    Ok(out.finish(doc! {"n": count_value(n)}))
}

/// Runs one delete statement (filter `q`, `limit` 0 or 1).
pub(in crate::embedded) fn delete_one_statement(
    cat: &mut Catalog,
    db: &str,
    coll: &str,
    q: &Document,
    limit: i64,
    vars: &aggregate::Variables,
) -> Result<StmtOutcome, EngineError> {
    let matcher = Matcher::parse_with(q, vars)?;
    let Some(c) = cat.existing_mut(db, coll) else {
        return Ok(StmtOutcome::Deleted { n: 0 });
    };
    let mut rids = c.find(q, &matcher);
    if limit == 1 {
        rids.truncate(1);
    }
    let removed = rids
        .into_iter()
        .filter(|rid| c.remove(*rid).is_some())
        .count();
    Ok(StmtOutcome::Deleted { n: removed as i64 })
}

/// A statement's `arrayFilters`, parsed and checked against its update.
pub(super) fn array_filters(
    v: Option<&Bson>,
    upd: &Update,
    u: &Bson,
) -> Result<ArrayFilters, EngineError> {
    ArrayFilters::of_statement(v, upd, u)
}
