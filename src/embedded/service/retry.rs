//! Retryable writes: the records of each session's newest `txnNumber`, what each of its
//! statements did, so a resent statement returns its first outcome instead of running again.

use std::collections::HashMap;
use std::time::Duration;

use bson::{Bson, Document};

use super::ShardService;
use crate::command;
use crate::engine::EngineError;
use crate::sync::lock;
use crate::value::error_codes::ErrorCode;

/// What one statement of a retryable write did, kept so a resend returns it unchanged.
#[derive(Debug, Clone, PartialEq)]
pub enum StmtOutcome {
    /// An insert that succeeded.
    Inserted,
    /// An update: matched (or upserted), modified, upserted `_id`.
    Updated {
        /// Documents matched, or 1 for an upsert.
        n: i64,
        /// Documents changed.
        modified: i64,
        /// The `_id` of an upserted document.
        upserted: Option<Bson>,
    },
    /// A delete.
    Deleted {
        /// Documents removed.
        n: i64,
    },
    /// A whole reply (findAndModify).
    Reply(Document),
}

/// The retryable-write records of one session: its newest `txnNumber` and what each statement
/// of it did.
#[derive(Debug)]
pub(super) struct SessionRecord {
    txn_number: i64,
    statements: HashMap<i32, StmtOutcome>,
    pub(super) last_used: std::time::Instant,
}

impl Default for SessionRecord {
    fn default() -> Self {
        SessionRecord {
            txn_number: 0,
            statements: HashMap::new(),
            last_used: std::time::Instant::now(),
        }
    }
}

/// The retryable-write context of one command.
#[derive(Debug)]
pub struct RetryCtx {
    session: String,
    txn_number: i64,
    stmt_ids: Vec<i32>,
    /// Set when the `onPrimaryTransactionalWrite` fail point asked for the connection to be
    /// closed after a statement: the command's reply is not sent.
    close_after: std::sync::atomic::AtomicBool,
}

impl RetryCtx {
    /// The statement id of statement `i`.
    pub fn stmt_id(&self, i: usize) -> i32 {
        self.stmt_ids.get(i).copied().unwrap_or(i as i32)
    }

    /// Whether the connection is to be closed instead of answering.
    pub fn close_after(&self) -> bool {
        self.close_after.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// mongod's `onPrimaryTransactionalWrite` fail point (test commands only): it acts on each
/// statement a retryable write runs (not on one a retry finds already applied). With
/// `failBeforeCommitExceptionCode` the statement fails with that code and is not applied;
/// with `closeConnection` (true unless given false) the connection is closed after the
/// command instead of answering. Modes: `alwaysOn`, `off`, `{times: n}`, `{skip: n}`.
#[derive(Debug, Default)]
pub struct TxnWriteFailPoint {
    state: std::sync::Mutex<Option<TxnWriteAction>>,
}

#[derive(Debug, Clone)]
struct TxnWriteAction {
    /// `None`: every time.
    times: Option<u64>,
    skip: u64,
    close_connection: bool,
    fail_code: Option<i32>,
}

impl TxnWriteFailPoint {
    /// `configureFailPoint: "onPrimaryTransactionalWrite"`; replies `{count}` (1 if it was on).
    pub fn configure(&self, body: &Document) -> Result<Document, EngineError> {
        use crate::value::field::{number_field, truthy};
        let mut state = lock(&self.state);
        let previously = i32::from(state.is_some());
        let (times, skip) = match body.get("mode") {
            Some(Bson::String(m)) if m == "off" => {
                *state = None;
                return Ok(bson::doc! {"count": previously});
            }
            Some(Bson::String(m)) if m == "alwaysOn" => (None, 0),
            Some(Bson::Document(m)) if m.contains_key("times") => match number_field(m, "times") {
                Some(n) if n > 0 => (Some(n as u64), 0),
                _ => {
                    *state = None;
                    return Ok(bson::doc! {"count": previously});
                }
            },
            Some(Bson::Document(m)) if m.contains_key("skip") => {
                (None, number_field(m, "skip").unwrap_or(0).max(0) as u64)
            }
            _ => {
                return Err(EngineError::new(
                    ErrorCode::BadValue,
                    "mode must be \"alwaysOn\", \"off\", {times: <n>} or {skip: <n>}",
                ))
            }
        };
        let data = body.get_document("data").cloned().unwrap_or_default();
        *state = Some(TxnWriteAction {
            times,
            skip,
            close_connection: data.get("closeConnection").is_none_or(truthy),
            fail_code: number_field(&data, "failBeforeCommitExceptionCode").map(|c| c as i32),
        });
        Ok(bson::doc! {"count": previously})
    }

    /// Called before a retryable write's statement runs: the error it must fail with, if any;
    /// `ctx` is told to close the connection when the fail point says so.
    pub fn fire(&self, ctx: &RetryCtx) -> Option<EngineError> {
        let mut state = lock(&self.state);
        let action = state.as_mut()?;
        if action.skip > 0 {
            action.skip -= 1;
            return None;
        }
        let fired = action.clone();
        if let Some(n) = action.times.as_mut() {
            *n -= 1;
            if *n == 0 {
                *state = None;
            }
        }
        if fired.close_connection {
            ctx.close_after
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        fired.fail_code.map(|code| {
            EngineError::new(
                ErrorCode(code),
                format!(
                    "Failing write for {}:{} due to failPoint.",
                    ctx.session, ctx.txn_number
                ),
            )
        })
    }
}

/// Most sessions with retryable-write records one shard keeps; beyond it a new session is
/// refused with TooManyLogicalSessions (261) once sessions idle for longer than
/// [`SESSION_IDLE_TIMEOUT`] are reaped.
pub const MAX_SESSIONS: usize = 100_000;

/// How long a session's retryable-write records outlive its last use
/// (`logicalSessionTimeoutMinutes`, 30).
pub const SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

impl ShardService {
    /// The retryable-write context of a write command, if it carries `lsid` + `txnNumber`.
    /// A `txnNumber` older than the session's newest is refused, as mongod does.
    pub(super) fn retry_ctx(
        &self,
        body: &Document,
        n: usize,
    ) -> Result<Option<RetryCtx>, EngineError> {
        let (Ok(lsid), Some(txn)) = (
            body.get_document("lsid"),
            crate::value::field::number_field(body, "txnNumber"),
        ) else {
            return Ok(None);
        };
        let session = session_key(lsid)?;
        let stmt_ids: Vec<i32> = match body.get("stmtIds") {
            Some(Bson::Array(ids)) => ids
                .iter()
                .map(|v| match v {
                    Bson::Int32(i) => *i,
                    Bson::Int64(i) => *i as i32,
                    _ => -1,
                })
                .collect(),
            _ => {
                let first = crate::value::field::number_field(body, "stmtId").unwrap_or(0) as i32;
                (0..n as i32).map(|i| first.wrapping_add(i)).collect()
            }
        };
        let mut sessions = lock(&self.sessions);
        if !sessions.contains_key(&session) && sessions.len() >= MAX_SESSIONS {
            sessions.retain(|_, r| r.last_used.elapsed() < SESSION_IDLE_TIMEOUT);
            if sessions.len() >= MAX_SESSIONS {
                return Err(EngineError::new(
                    ErrorCode::TooManyLogicalSessions,
                    format!("Unable to add session into the cache because the number of active sessions is too high ({MAX_SESSIONS})"),
                ));
            }
        }
        let rec = sessions.entry(session.clone()).or_default();
        rec.last_used = std::time::Instant::now();
        if txn < rec.txn_number {
            return Err(EngineError::new(
                ErrorCode(225),
                format!("Retryable write with txnNumber {txn} is prohibited on session {session} because a newer retryable write with txnNumber {} has already started on this session.", rec.txn_number),
            ));
        }
        if txn > rec.txn_number {
            rec.txn_number = txn;
            rec.statements.clear();
        }
        Ok(Some(RetryCtx {
            session,
            txn_number: txn,
            stmt_ids,
            close_after: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// What statement `stmt_id` of this retryable write already did, if it ran.
    pub(in crate::embedded) fn recorded(
        &self,
        ctx: &RetryCtx,
        stmt_id: i32,
    ) -> Option<StmtOutcome> {
        let sessions = lock(&self.sessions);
        let rec = sessions.get(&ctx.session)?;
        if rec.txn_number != ctx.txn_number {
            return None;
        }
        rec.statements.get(&stmt_id).cloned()
    }

    /// Records what a statement did.
    pub(in crate::embedded) fn record(&self, ctx: &RetryCtx, stmt_id: i32, outcome: StmtOutcome) {
        let mut sessions = lock(&self.sessions);
        let rec = sessions.entry(ctx.session.clone()).or_default();
        if rec.txn_number == ctx.txn_number {
            rec.statements.insert(stmt_id, outcome);
        }
    }
}

/// The key of a session's records: its `lsid.id`, a UUID ([`command::session_id`]), in hex.
pub(super) fn session_key(lsid: &Document) -> Result<String, EngineError> {
    let id = command::session_id(lsid)?;
    Ok(id.iter().map(|x| format!("{x:02x}")).collect())
}
