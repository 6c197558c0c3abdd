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
#[derive(Debug, Clone)]
pub struct RetryCtx {
    session: String,
    txn_number: i64,
    stmt_ids: Vec<i32>,
}

impl RetryCtx {
    /// The statement id of statement `i`.
    pub fn stmt_id(&self, i: usize) -> i32 {
        self.stmt_ids.get(i).copied().unwrap_or(i as i32)
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
