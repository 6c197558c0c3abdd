//! The set-up and statement loop every write command shares (`insert`, `update`, `delete`, and
//! `bulkWrite` in [`crate::embedded::bulk_write`]): collection, statements, `ordered`, the shard
//! version check, and retryable-write records per statement.

use bson::{doc, Bson, Document};

use super::{collection_name, err, statements};
use crate::command::CommandRequest;
use crate::embedded::service::{RetryCtx, ShardService, StmtOutcome};
use crate::engine::EngineError;
use crate::limits::MAX_WRITE_BATCH_SIZE;
use crate::value::error_codes::ErrorCode;
use crate::value::field::truthy;

fn ordered(body: &Document) -> bool {
    body.get("ordered").map(truthy).unwrap_or(true)
}

/// A write reply with its stale-config error, when the shard version does not match.
pub(in crate::embedded) fn stale_write_reply(e: EngineError, with_modified: bool) -> Document {
    let mut d = doc! {"n": 0};
    if with_modified {
        d.insert("nModified", 0);
    }
    d.insert("writeErrors", vec![Bson::Document(e.write_error(0))]);
    d
}

/// The parts every write command starts from.
pub(super) struct WriteBatch {
    pub(super) coll: String,
    pub(super) ns: String,
    pub(super) stmts: Vec<Document>,
    pub(super) ordered: bool,
}

/// Reads a write command's collection, statements and `ordered`, and checks its shard version:
/// `Err(reply)` is the stale-config reply to send instead of running anything.
pub(super) fn write_batch(
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
pub(super) fn statement_filter<'a>(
    stmt: &'a Document,
    path: &str,
) -> Result<&'a Document, EngineError> {
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
pub(in crate::embedded) struct BatchOutcome {
    /// Each statement that applied, now or in an earlier attempt, by index.
    pub(in crate::embedded) applied: Vec<(usize, StmtOutcome)>,
    /// The write errors, by index.
    pub(in crate::embedded) errors: Vec<Bson>,
    /// The statement ids a retry found already applied.
    pub(in crate::embedded) retried: Vec<i32>,
}

impl BatchOutcome {
    /// Completes a reply holding the counts with `writeErrors` and `retriedStmtIds`.
    pub(super) fn finish(self, mut reply: Document) -> Document {
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
pub(in crate::embedded) fn run_statements(
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
        let refused = retry.and_then(|ctx| svc.txn_write_failpoint.fire(ctx));
        let outcome = match refused {
            Some(e) => Err(e),
            None => exec(i),
        };
        match outcome {
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
