//! A read that runs inside a transaction across several shards (a scatter `find`, `count`,
//! `distinct` or `aggregate`, a `getMore` of its router cursor): the same read path, with each
//! shard command made a statement of the transaction. Every command the read sends to a
//! shard while [`scope`] runs carries the session, `txnNumber` and `autocommit: false`; a
//! shard new to the transaction joins it (`startTransaction` and the first statement's
//! `readConcern`), as one-shard statements join in the router; a shard's first statement that
//! fails takes it out of the participants again. Nothing is resent to another member.

use bson::{Document, RawDocumentBuf};

use crate::cluster::{Cluster, Joined};
use crate::command::CommandError;
use crate::value::error_codes::ErrorCode;

/// The transaction a read's shard commands belong to.
#[derive(Debug, Clone)]
pub struct TxnStatement {
    /// The session's 16-byte id.
    pub session: [u8; 16],
    /// The client's `lsid` document.
    pub lsid: Document,
    /// The transaction's number.
    pub txn: i64,
    /// The client's statement carries `startTransaction: true`.
    pub starts: bool,
    /// The client's statement's own `readConcern`.
    pub read_concern: Option<Document>,
}

tokio::task_local! {
    static TXN: TxnStatement;
}

/// Runs `read` with every shard command it sends made a statement of `stmt`'s transaction.
pub async fn scope<F: std::future::Future>(stmt: TxnStatement, read: F) -> F::Output {
    TXN.scope(stmt, read).await
}

/// Whether the running read belongs to a transaction.
pub(super) fn active() -> bool {
    TXN.try_with(|_| ()).is_ok()
}

/// The shard command `bytes` for `shard` as a statement of the running read's transaction,
/// with how the shard joined it; `None` outside a transaction.
pub(super) fn statement(
    cluster: &Cluster,
    shard: &str,
    bytes: &[u8],
) -> Option<Result<(Vec<u8>, Joined), CommandError>> {
    let stmt = TXN.try_with(Clone::clone).ok()?;
    Some(make_statement(cluster, &stmt, shard, bytes))
}

fn make_statement(
    cluster: &Cluster,
    stmt: &TxnStatement,
    shard: &str,
    bytes: &[u8],
) -> Result<(Vec<u8>, Joined), CommandError> {
    let bad = |e: String| {
        CommandError::new(
            ErrorCode::InternalError,
            format!("cannot encode command: {e}"),
        )
    };
    let raw = bson::RawDocument::from_bytes(bytes).map_err(|e| bad(e.to_string()))?;
    let mut cmd = Document::try_from(raw).map_err(|e| bad(e.to_string()))?;
    let name = cmd.keys().next().cloned().unwrap_or_default();
    let joined = cluster.transactions.begin(
        stmt.session,
        stmt.txn,
        shard,
        false,
        stmt.read_concern.as_ref(),
    )?;
    for k in [
        "lsid",
        "txnNumber",
        "autocommit",
        "startTransaction",
        "readConcern",
    ] {
        cmd.remove(k);
    }
    cmd.insert("lsid", stmt.lsid.clone());
    cmd.insert("txnNumber", stmt.txn);
    cmd.insert("autocommit", false);
    // The transaction starts on this shard with this command (a `getMore` or `killCursors`
    // only ever reaches a shard whose command opened its cursor).
    let starts = joined.new_participant || (joined.first && stmt.starts);
    if starts && !matches!(name.as_str(), "getMore" | "killCursors") {
        cmd.insert("startTransaction", true);
        if let Some(rc) = &joined.read_concern {
            cmd.insert("readConcern", rc.clone());
        }
    }
    let out = RawDocumentBuf::try_from(&cmd).map_err(|e| bad(e.to_string()))?;
    Ok((out.into_bytes(), joined))
}

/// After a shard answered (`ok`) or failed a statement that joined it as `joined`: a shard
/// whose first statement failed does not have the transaction and leaves the participants
/// (the transaction's entry goes with its last participant).
pub(super) fn settle(cluster: &Cluster, shard: &str, joined: &Joined, ok: bool) {
    let Ok(stmt) = TXN.try_with(Clone::clone) else {
        return;
    };
    if !ok {
        cluster
            .transactions
            .join_failed(&stmt.session, stmt.txn, shard, joined);
    }
}
