//! `findAndModify`: one document found, then updated, replaced or removed.

use bson::{doc, Bson, Document};

use super::writes::{array_filters, check_updated};
use super::{collection_name, err};
use crate::command::CommandRequest;
use crate::embedded::service::{lock, RetryCtx, ShardService, StmtOutcome};
use crate::engine::matcher::Matcher;
use crate::engine::query::{Projection, SortSpec};
use crate::engine::reads::request_variables;
use crate::engine::update::{upsert_document_in, ApplyContext, Update};
use crate::engine::EngineError;
use crate::value::error_codes::ErrorCode;
use crate::value::field::truthy;

pub(super) fn find_and_modify(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
    retry: Option<&RetryCtx>,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let ns = format!("{}.{coll}", req.db);
    svc.check_version(&ns, body)?;
    if let Some(ctx) = retry {
        if let Some(StmtOutcome::Reply(r)) = svc.recorded(ctx, ctx.stmt_id(0)) {
            return Ok(r);
        }
        if let Some(e) = svc.txn_write_failpoint.fire(ctx) {
            return Err(e);
        }
    }
    let query = body.get_document("query").cloned().unwrap_or_default();
    let remove = body.get("remove").is_some_and(truthy);
    let want_new = body.get("new").is_some_and(truthy);
    let upsert = body.get("upsert").is_some_and(truthy);
    let upd = body.get("update");
    match (remove, upd) {
        (true, Some(_)) => return Err(err(ErrorCode::FailedToParse, "Cannot specify both an update and remove=true")),
        (false, None) => return Err(err(ErrorCode::FailedToParse, "Either an update or remove=true must be specified")),
        (true, None) if upsert => return Err(err(ErrorCode::FailedToParse, "Cannot specify both upsert=true and remove=true")),
        (true, None) if want_new => return Err(err(ErrorCode::FailedToParse, "Cannot specify both new=true and remove=true; 'remove' always returns the deleted document")),
        _ => {}
    }
    let sort = SortSpec::parse(&body.get_document("sort").cloned().unwrap_or_default())?;
    let projection = Projection::parse(&body.get_document("fields").cloned().unwrap_or_default())?;
    let vars = request_variables(body)?;
    let sort = sort.with_collation(vars.collation().cloned());
    let matcher = Matcher::parse_with(&query, &vars)?;
    let show = |d: &Document| match &projection {
        Some(p) => Bson::Document(p.apply_matched(d, Some(&matcher))),
        None => Bson::Document(d.clone()),
    };
    let data = svc.data();
    let mut cat = lock(&data);
    let mut candidates: Vec<(u64, Document)> = match cat.collection(&req.db, &coll) {
        Some(c) => c
            .find(&query, &matcher)
            .into_iter()
            .filter_map(|rid| c.get(rid).map(|d| (rid, d.clone())))
            .collect(),
        None => Vec::new(),
    };
    if !sort.is_empty() {
        candidates.sort_by(|a, b| sort.compare(&a.1, &b.1));
    }
    let found = candidates.into_iter().next();
    let reply = if remove {
        match found {
            Some((rid, d)) => {
                if let Some(c) = cat.existing_mut(&req.db, &coll) {
                    c.remove(rid);
                }
                doc! {"lastErrorObject": {"n": 1}, "value": show(&d)}
            }
            None => doc! {"lastErrorObject": {"n": 0}, "value": Bson::Null},
        }
    } else {
        let u = upd.unwrap_or(&Bson::Null);
        let upd = Update::parse(u)?;
        let filters = array_filters(body.get("arrayFilters"), &upd, u)?;
        let ctx = ApplyContext {
            query: Some(&matcher),
            array_filters: Some(&filters),
            vars: Some(&vars),
        };
        match found {
            Some((rid, old)) => {
                let mut new = old.clone();
                upd.apply_in(&mut new, false, &ctx)?;
                check_updated(&new)?;
                if new != old {
                    if let Some(c) = cat.existing_mut(&req.db, &coll) {
                        c.replace(&ns, rid, new.clone())?;
                    }
                }
                doc! {
                    "lastErrorObject": {"n": 1, "updatedExisting": true},
                    "value": if want_new { show(&new) } else { show(&old) },
                }
            }
            None if upsert => {
                let d = upsert_document_in(&query, &upd, &ctx)?;
                let id = d.get("_id").cloned().unwrap_or(Bson::Null);
                let (c, _) = cat.collection_mut(&req.db, &coll);
                c.insert(&ns, d.clone())?;
                doc! {
                    "lastErrorObject": {"n": 1, "updatedExisting": false, "upserted": id},
                    "value": if want_new { show(&d) } else { Bson::Null },
                }
            }
            None => {
                doc! {"lastErrorObject": {"n": 0, "updatedExisting": false}, "value": Bson::Null}
            }
        }
    };
    drop(cat);
    if let Some(ctx) = retry {
        svc.record(ctx, ctx.stmt_id(0), StmtOutcome::Reply(reply.clone()));
    }
    Ok(reply)
}
