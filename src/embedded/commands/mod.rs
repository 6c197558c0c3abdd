//! The embedded shard's data commands: CRUD, cursors, aggregation and DDL, with mongod 8.0's
//! reply shapes.

use bson::{doc, Bson, Document};

use super::service::{lock, RetryCtx, ShardService, StmtOutcome};
use super::store::{check_namespace, Catalog, Collection};
use crate::command::CommandRequest;
use crate::engine::aggregate;
use crate::engine::matcher::Matcher;
use crate::engine::query::{Projection, SortSpec};
use crate::engine::reads::{
    count_argument, count_value, document_argument, request_variables, starts_with_documents,
    CountSpec, DistinctSpec, FindSpec, DEFAULT_BATCH,
};
use crate::engine::update::{
    prepare_insert, upsert_document_in, ApplyContext, ArrayFilters, Update,
};
use crate::engine::EngineError;
use crate::limits::{measure, MAX_STORED_DEPTH, MAX_WRITE_BATCH_SIZE};
use crate::value::error_codes::ErrorCode;
use crate::value::field::{number_field, truthy};
use crate::wire::MAX_BSON_OBJECT_SIZE;

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
    match req.name.as_str() {
        "insert" => insert(svc, req, body, retry),
        "update" => update(svc, req, body, retry),
        "delete" => delete(svc, req, body, retry),
        "bulkWrite" => super::bulk_write::bulk_write(svc, req, retry),
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
            lock(&svc.catalog).dbs.remove(&req.db);
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
        "renameCollection" => super::ddl::rename_collection(svc, req, body),
        other => Err(err(
            ErrorCode::CommandNotFound,
            format!("no such command: '{other}'"),
        )),
    }
}

fn ordered(body: &Document) -> bool {
    body.get("ordered").map(truthy).unwrap_or(true)
}

/// A write reply with its stale-config error, when the shard version does not match.
pub(super) fn stale_write_reply(e: EngineError, with_modified: bool) -> Document {
    let mut d = doc! {"n": 0};
    if with_modified {
        d.insert("nModified", 0);
    }
    d.insert("writeErrors", vec![Bson::Document(e.write_error(0))]);
    d
}

/// The parts every write command starts from.
struct WriteBatch {
    coll: String,
    ns: String,
    stmts: Vec<Document>,
    ordered: bool,
}

/// Reads a write command's collection, statements and `ordered`, and checks its shard version:
/// `Err(reply)` is the stale-config reply to send instead of running anything.
fn write_batch(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
    field: &str,
) -> Result<Result<WriteBatch, Document>, EngineError> {
    let coll = collection_name(req, body)?;
    let stmts = statements(req, field)?;
    if stmts.is_empty() || stmts.len() > MAX_WRITE_BATCH_SIZE {
        return Err(err(
            ErrorCode::InvalidLength,
            format!(
                "Write batch sizes must be between 1 and {MAX_WRITE_BATCH_SIZE}. Got {} operations.",
                stmts.len()
            ),
        ));
    }
    let ns = format!("{}.{coll}", req.db);
    if let Err(e) = svc.check_version(&ns, body) {
        return Ok(Err(stale_write_reply(e, field == "updates")));
    }
    Ok(Ok(WriteBatch {
        coll,
        ns,
        stmts,
        ordered: ordered(body),
    }))
}

/// The filter `q` of an update or delete statement (`cmd.field` names it in errors).
fn statement_filter<'a>(stmt: &'a Document, path: &str) -> Result<&'a Document, EngineError> {
    match stmt.get("q") {
        Some(Bson::Document(q)) => Ok(q),
        Some(_) => Err(err(
            ErrorCode::TypeMismatch,
            format!("BSON field '{path}.q' is the wrong type, expected type 'object'"),
        )),
        None => Err(err(
            ErrorCode(40414),
            format!("BSON field '{path}.q' is missing but a required field"),
        )),
    }
}

/// What the statements of a write batch did.
#[derive(Default)]
pub(super) struct BatchOutcome {
    /// Each statement that applied, now or in an earlier attempt, by index.
    pub(super) applied: Vec<(usize, StmtOutcome)>,
    /// The write errors, by index.
    pub(super) errors: Vec<Bson>,
    /// The statement ids a retry found already applied.
    pub(super) retried: Vec<i32>,
}

impl BatchOutcome {
    /// Completes a reply holding the counts with `writeErrors` and `retriedStmtIds`.
    fn finish(self, mut reply: Document) -> Document {
        if !self.errors.is_empty() {
            reply.insert("writeErrors", self.errors);
        }
        if !self.retried.is_empty() {
            reply.insert("retriedStmtIds", self.retried);
        }
        reply
    }
}

/// Runs `count` statements in order as mongod does: a statement a retryable write already
/// applied is not run again and its recorded outcome counts; each new outcome is recorded;
/// the first error stops an ordered batch.
pub(super) fn run_statements(
    svc: &ShardService,
    retry: Option<&RetryCtx>,
    count: usize,
    ordered: bool,
    mut exec: impl FnMut(usize) -> Result<StmtOutcome, EngineError>,
) -> BatchOutcome {
    let mut out = BatchOutcome::default();
    for i in 0..count {
        if let Some(ctx) = retry {
            let sid = ctx.stmt_id(i);
            if let Some(done) = svc.recorded(ctx, sid) {
                out.retried.push(sid);
                out.applied.push((i, done));
                continue;
            }
        }
        match exec(i) {
            Ok(done) => {
                if let Some(ctx) = retry {
                    svc.record(ctx, ctx.stmt_id(i), done.clone());
                }
                out.applied.push((i, done));
            }
            Err(e) => {
                out.errors.push(Bson::Document(e.write_error(i)));
                if ordered {
                    break;
                }
            }
        }
    }
    out
}

/// Checks a document an update produced before it replaces the stored one: mongod's
/// storage validation (nesting) and size limit.
fn check_updated(d: &Document) -> Result<(), EngineError> {
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

fn insert(
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
    let mut cat = lock(&svc.catalog);
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

fn update(
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
    let mut cat = lock(&svc.catalog);
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

pub(super) fn update_one_statement(
    cat: &mut Catalog,
    db: &str,
    coll: &str,
    ns: &str,
    stmt: &Document,
    vars: &aggregate::Variables,
) -> Result<StmtOutcome, EngineError> {
    let q = statement_filter(stmt, "update.updates")?.clone();
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
            Some(SortSpec::parse(s)?)
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

fn delete(
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
    let mut cat = lock(&svc.catalog);
    let out = run_statements(svc, retry, parsed.len(), batch.ordered, |i| {
        let (q, limit) = parsed[i];
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
pub(super) fn delete_one_statement(
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

fn find_and_modify(
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
    let matcher = Matcher::parse_with(&query, &vars)?;
    let show = |d: &Document| match &projection {
        Some(p) => Bson::Document(p.apply_matched(d, Some(&matcher))),
        None => Bson::Document(d.clone()),
    };
    let mut cat = lock(&svc.catalog);
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

/// The reply to a read whose result is `docs`: the first batch, the rest kept as a cursor.
fn cursor_reply(
    svc: &ShardService,
    ns: String,
    docs: Vec<Document>,
    batch: usize,
    single_batch: bool,
) -> Document {
    svc.cursors.first_batch(ns, docs, batch, single_batch)
}

/// The documents of `db.coll` that match (by the `_id` index when the filter pins an `_id`).
fn matching_documents(
    svc: &ShardService,
    db: &str,
    coll: &str,
    filter: &Document,
    matcher: &Matcher,
) -> Vec<Document> {
    let cat = lock(&svc.catalog);
    match cat.collection(db, coll) {
        Some(c) => c
            .find(filter, matcher)
            .into_iter()
            .filter_map(|rid| c.get(rid).cloned())
            .collect(),
        None => Vec::new(),
    }
}

/// A statement's `arrayFilters`, parsed and checked against its update.
fn array_filters(v: Option<&Bson>, upd: &Update, u: &Bson) -> Result<ArrayFilters, EngineError> {
    let filters = match v {
        None | Some(Bson::Null) => ArrayFilters::default(),
        Some(Bson::Array(a)) => ArrayFilters::parse(a)?,
        Some(other) => {
            return Err(err(
                ErrorCode::TypeMismatch,
                format!(
                    "BSON field 'arrayFilters' is the wrong type '{}', expected type 'array'",
                    crate::value::field::type_name(other)
                ),
            ))
        }
    };
    filters.check_used(upd, u)?;
    Ok(filters)
}

fn find(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let ns = format!("{}.{coll}", req.db);
    svc.check_version(&ns, body)?;
    let spec = FindSpec::parse(body)?;
    let docs = matching_documents(svc, &req.db, &coll, &spec.filter, &spec.matcher);
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

fn get_more(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let reply = svc.cursors.get_more(&req.db, body)?;
    svc.bump_opcounter("getmore", 1);
    Ok(reply)
}

fn kill_cursors(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    collection_name(req, body)?;
    Ok(svc.cursors.kill(body)?)
}

fn count(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let spec = CountSpec::parse(body)?;
    let docs = matching_documents(svc, &req.db, &coll, &spec.query, &spec.matcher);
    Ok(doc! {"n": spec.reply_count(docs.len())})
}

fn distinct(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let spec = DistinctSpec::parse(body)?;
    let docs = matching_documents(svc, &req.db, &coll, &spec.query, &spec.matcher);
    Ok(doc! {"values": spec.values(&docs)})
}

fn aggregate_cmd(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = match body.get("aggregate") {
        Some(Bson::String(s)) => {
            check_namespace(&req.db, s)?;
            s.clone()
        }
        Some(Bson::Int32(1)) | Some(Bson::Int64(1)) | Some(Bson::Double(_))
            if starts_with_documents(body) =>
        {
            "$cmd.aggregate".to_string()
        }
        Some(Bson::Int32(1)) | Some(Bson::Int64(1)) | Some(Bson::Double(_)) => return Err(err(
            ErrorCode::InvalidNamespace,
            "collection-less aggregations ({aggregate: 1}) are supported by the embedded shard only with $documents",
        )),
        _ => {
            return Err(err(
                ErrorCode::InvalidNamespace,
                "Invalid collection name specified",
            ))
        }
    };
    let Ok(pipeline) = body.get_array("pipeline") else {
        return Err(err(
            ErrorCode::TypeMismatch,
            "'pipeline' option must be specified as an array",
        ));
    };
    let cursor_opts =
        match body.get("cursor") {
            Some(Bson::Document(c)) => c.clone(),
            _ if body.get("explain").is_some_and(truthy) => Document::new(),
            _ => return Err(err(
                ErrorCode::FailedToParse,
                "The 'cursor' option is required, except for aggregate with the explain argument",
            )),
        };
    let ns = format!("{}.{coll}", req.db);
    svc.check_version(&ns, body)?;
    let vars = request_variables(body)?;
    let coll_less = coll == "$cmd.aggregate";
    let (stages, output) = crate::engine::output::split_output(pipeline, &req.db)?;
    let docs = if coll_less {
        Vec::new()
    } else {
        matching_documents(svc, &req.db, &coll, &Document::new(), &Matcher::all())
    };
    let options = aggregate::AggregateOptions::for_request(svc.stage_memory(), body);
    let reader = super::pipeline_output::CatalogReader(svc);
    let env = aggregate::Env {
        db: req.db.clone(),
        vars,
        namespaces: Some(&reader),
    };
    let out = aggregate::run_in(stages, docs, &options, &env)?;
    svc.bump_opcounter("command", 1);
    if let Some(stage) = output {
        super::pipeline_output::write(svc, &stage, out, &env.vars)?;
        return Ok(cursor_reply(svc, ns, Vec::new(), 0, false));
    }
    let batch = count_argument(&cursor_opts, "batchSize")?.unwrap_or(DEFAULT_BATCH);
    Ok(cursor_reply(svc, ns, out, batch, false))
}

fn create(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let mut cat = lock(&svc.catalog);
    if cat.collection(&req.db, &coll).is_some() {
        return Err(err(
            ErrorCode::NamespaceExists,
            format!("Collection {}.{coll} already exists.", req.db),
        ));
    }
    let mut options = Document::new();
    for (k, v) in body {
        if k != "create" && !crate::command::GENERIC_ARGUMENTS.contains(&k.as_str()) {
            options.insert(k.clone(), v.clone());
        }
    }
    cat.dbs
        .entry(req.db.clone())
        .or_default()
        .insert(coll, Collection::new(options));
    Ok(Document::new())
}

fn drop_collection(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let ns = format!("{}.{coll}", req.db);
    let mut cat = lock(&svc.catalog);
    let removed = cat
        .dbs
        .get_mut(&req.db)
        .and_then(|colls| colls.remove(&coll));
    if cat.dbs.get(&req.db).is_some_and(|c| c.is_empty()) {
        cat.dbs.remove(&req.db);
    }
    drop_cursors(svc, &ns);
    Ok(match removed {
        Some(c) => doc! {"nIndexesWas": c.indexes().len() as i32, "ns": ns},
        None => Document::new(),
    })
}

fn drop_cursors(svc: &ShardService, ns: &str) {
    svc.cursors.drop_namespace(ns);
}

fn list_collections(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let filter = document_argument(body, "filter", "listCollections")?;
    let matcher = Matcher::parse(&filter)?;
    let name_only = body.get("nameOnly").is_some_and(truthy);
    let cat = lock(&svc.catalog);
    let mut out = Vec::new();
    if let Some(colls) = cat.dbs.get(&req.db) {
        for (name, c) in colls {
            let d = crate::engine::reads::collection_entry(name, &c.options, c.uuid, name_only);
            if matcher.matches(&d) {
                out.push(d);
            }
        }
    }
    drop(cat);
    Ok(cursor_reply(
        svc,
        format!("{}.$cmd.listCollections", req.db),
        out,
        usize::MAX,
        true,
    ))
}

fn list_databases(svc: &ShardService, body: &Document) -> Result<Document, EngineError> {
    let filter = document_argument(body, "filter", "listDatabases")?;
    let matcher = Matcher::parse(&filter)?;
    let name_only = body.get("nameOnly").is_some_and(truthy);
    let cat = lock(&svc.catalog);
    let mut dbs = Vec::new();
    let mut total = 0i64;
    for (name, colls) in &cat.dbs {
        let size: i64 = colls.values().map(|c| c.data_size() as i64).sum();
        let d = if name_only {
            doc! {"name": name}
        } else {
            doc! {"name": name, "sizeOnDisk": size, "empty": colls.values().all(|c| c.is_empty())}
        };
        if matcher.matches(&d) {
            total += size;
            dbs.push(d);
        }
    }
    let mut reply = doc! {"databases": dbs};
    if !name_only {
        reply.insert("totalSize", total);
        reply.insert("totalSizeMb", total / (1024 * 1024));
    }
    Ok(reply)
}

fn create_indexes(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let Ok(specs) = body.get_array("indexes") else {
        return Err(err(
            ErrorCode(40414),
            "BSON field 'createIndexes.indexes' is missing but a required field",
        ));
    };
    if specs.is_empty() {
        return Err(err(
            ErrorCode::BadValue,
            "Must specify at least one index to create",
        ));
    }
    let ns = format!("{}.{coll}", req.db);
    let mut cat = lock(&svc.catalog);
    let (c, created) = cat.collection_mut(&req.db, &coll);
    let before = c.indexes().len() as i32;
    let mut backup = c.clone();
    let mut any_new = false;
    for spec in specs {
        let Bson::Document(spec) = spec else {
            return Err(err(
                ErrorCode::TypeMismatch,
                "index specification must be an object",
            ));
        };
        match backup.create_index(&ns, spec) {
            Ok(new) => any_new |= new,
            Err(e) => return Err(e),
        }
    }
    std::mem::swap(c, &mut backup);
    let after = c.indexes().len() as i32;
    let mut reply = doc! {"numIndexesBefore": before, "numIndexesAfter": after, "createdCollectionAutomatically": created};
    if !any_new {
        reply.insert("note", "all indexes already exist");
    }
    Ok(reply)
}

fn list_indexes(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let ns = format!("{}.{coll}", req.db);
    let specs: Vec<Document> = {
        let cat = lock(&svc.catalog);
        let Some(c) = cat.collection(&req.db, &coll) else {
            return Err(err(
                ErrorCode::NamespaceNotFound,
                format!("ns does not exist: {ns}"),
            ));
        };
        c.indexes().iter().map(|i| i.spec.clone()).collect()
    };
    Ok(cursor_reply(svc, ns, specs, usize::MAX, true))
}

fn drop_indexes(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let ns = format!("{}.{coll}", req.db);
    let mut cat = lock(&svc.catalog);
    let Some(c) = cat.existing_mut(&req.db, &coll) else {
        return Err(err(
            ErrorCode::NamespaceNotFound,
            format!("ns not found {ns}"),
        ));
    };
    let was = c.indexes().len() as i32;
    match body.get("index") {
        Some(Bson::String(s)) if s == "*" => c.drop_all_indexes(),
        Some(Bson::Array(names)) => {
            for n in names {
                c.drop_index(n)?;
            }
        }
        Some(which) => c.drop_index(which)?,
        None => {
            return Err(err(
                ErrorCode(40414),
                "BSON field 'dropIndexes.index' is missing but a required field",
            ))
        }
    }
    Ok(doc! {"nIndexesWas": was})
}

fn coll_stats(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let ns = format!("{}.{coll}", req.db);
    let cat = lock(&svc.catalog);
    let (count, size, nindexes) = match cat.collection(&req.db, &coll) {
        Some(c) => (
            c.len() as i64,
            c.data_size() as i64,
            c.indexes().len() as i32,
        ),
        None => (0, 0, 0),
    };
    Ok(crate::engine::reads::coll_stats_reply(
        &ns, count, size, nindexes,
    ))
}

fn db_stats(svc: &ShardService, req: &CommandRequest) -> Result<Document, EngineError> {
    let cat = lock(&svc.catalog);
    let (mut colls, mut objects, mut size, mut indexes) = (0i64, 0i64, 0i64, 0i64);
    if let Some(db) = cat.dbs.get(&req.db) {
        for c in db.values() {
            colls += 1;
            objects += c.len() as i64;
            size += c.data_size() as i64;
            indexes += c.indexes().len() as i64;
        }
    }
    Ok(crate::engine::reads::db_stats_reply(
        &req.db, colls, objects, size, indexes,
    ))
}
