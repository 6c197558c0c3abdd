//! What a shard's failure means, as data: which codes mark a member Unknown (NotPrimary and
//! shutdown families, network errors), which make a child batch eligible for a resend to the
//! new primary, and which error labels reach the client.
//!
//! mongos's rules (8.0's `AsyncRequestsSender` and `ErrorLabelBuilder`):
//!
//! - A child batch is resent only if it is a retryable write: it carries `lsid` and
//!   `txnNumber` and is not part of a transaction. Then the same batch — same `txnNumber`, same
//!   `stmtIds` — goes to the member that is primary after the failure, and the shard's session
//!   table turns a statement it already applied into a no-op returning the first result. That is
//!   the whole of "never applied twice"; a batch without `txnNumber` is never resent.
//! - The resend is triggered by a transport failure, or by a command-level error or a
//!   `writeConcernError` whose code is in the RetriableError category (or BalancerInterrupted).
//!   Statement errors (`writeErrors` of an `ok: 1` reply) are never looked at.
//! - At most [`MAX_RESENDS`] resends, each after waiting for a primary.
//! - Error labels from shards never reach the client: the shard labels its error
//!   `RetryableWriteError` for the router, which does the retrying itself. The router labels an
//!   error `RetryableWriteError` only when it is itself shutting down.

use crate::value::error_codes::ErrorCode;

/// How many times mongos resends a retryable child batch after a retriable failure
/// (`kMaxNumFailedHostRetryAttempts`). Each resend is the same batch to the current primary.
pub const MAX_RESENDS: u32 = 3;

/// The label drivers retry a write on.
pub const RETRYABLE_WRITE_ERROR: &str = "RetryableWriteError";
/// The label that tells a driver the failed attempt wrote nothing.
pub const NO_WRITES_PERFORMED: &str = "NoWritesPerformed";

/// The NotPrimaryError category: the member was not (or stopped being) primary.
const NOT_PRIMARY: [i32; 5] = [
    ErrorCode::NotWritablePrimary.0,
    ErrorCode::NotPrimaryNoSecondaryOk.0,
    ErrorCode::NotPrimaryOrSecondary.0,
    ErrorCode::PrimarySteppedDown.0,
    ErrorCode::InterruptedDueToReplStateChange.0,
];

/// The ShutdownError category: the member is going away.
const SHUTDOWN: [i32; 2] = [
    ErrorCode::ShutdownInProgress.0,
    ErrorCode::InterruptedAtShutdown.0,
];

/// The NetworkError category.
const NETWORK: [i32; 6] = [
    ErrorCode::HostUnreachable.0,
    ErrorCode::HostNotFound.0,
    ErrorCode::NetworkTimeout.0,
    ErrorCode::ConnectionPoolExpired.0,
    384, // ConnectionError
    ErrorCode::SocketException.0,
];

/// The NetworkTimeoutError category.
const NETWORK_TIMEOUT: [i32; 2] = [
    ErrorCode::NetworkTimeout.0,
    ErrorCode::NetworkInterfaceExceededTimeLimit.0,
];

/// The RetriableError category, as the newest server defines it. Codes a shard of an older
/// version never returns cost nothing; a retry is only ever made for a batch the shard's
/// session table protects.
const RETRIABLE: [i32; 25] = [
    ErrorCode::HostUnreachable.0,
    ErrorCode::HostNotFound.0,
    ErrorCode::NetworkTimeout.0,
    ErrorCode::ShutdownInProgress.0,
    ErrorCode::ReadConcernMajorityNotAvailableYet.0,
    ErrorCode::PrimarySteppedDown.0,
    ErrorCode::ExceededTimeLimit.0,
    ErrorCode::ConnectionPoolExpired.0,
    358, // InternalTransactionNotSupported
    384, // ConnectionError
    402, // ResourceExhausted
    406, // MigrationBlockingOperationCoordinatorCleaningUp
    407, // PooledConnectionAcquisitionExceededTimeLimit
    412, // UpdatesStillPending
    453, // InterruptedDueToReshardingCriticalSection
    462, // IngressRequestRateLimitExceeded
    ErrorCode::SocketException.0,
    ErrorCode::NotWritablePrimary.0,
    ErrorCode::InterruptedAtShutdown.0,
    ErrorCode::InterruptedDueToReplStateChange.0,
    ErrorCode::NotPrimaryNoSecondaryOk.0,
    ErrorCode::NotPrimaryOrSecondary.0,
    50915,    // BackupCursorOpenConflictWithCheckpoint
    91331,    // RetriableRemoteCommandFailure
    10045600, // InterruptedDueToFCVChange
];

/// Whether `code` says the member is not primary (any more): 10107, 13435, 13436, 189, 11602.
pub fn is_not_primary_code(code: i32) -> bool {
    NOT_PRIMARY.contains(&code)
}

/// Whether `code` says the member is shutting down: 91, 11600.
pub fn is_shutdown_code(code: i32) -> bool {
    SHUTDOWN.contains(&code)
}

/// Whether `code` is a network error (6, 7, 89, 317, 384, 9001).
pub fn is_network_code(code: i32) -> bool {
    NETWORK.contains(&code)
}

/// Whether `code` is a network timeout (89, 202).
pub fn is_network_timeout_code(code: i32) -> bool {
    NETWORK_TIMEOUT.contains(&code)
}

/// The label on an error after which the client may retry its whole transaction.
pub const TRANSIENT_TRANSACTION_ERROR: &str = "TransientTransactionError";

/// Whether an error with `code` of a transaction's command gets `TransientTransactionError`
/// (mongod's and mongos's `isTransientTransactionError`): write conflicts, lock timeouts,
/// snapshot and stale-routing errors always; a statement's retriable and NoSuchTransaction
/// errors too; a commit's or abort's NoSuchTransaction only without a write-concern error.
pub fn is_transient_transaction_error(code: i32, has_wce: bool, commit_or_abort: bool) -> bool {
    const ALWAYS: &[i32] = &[
        112,   // WriteConflict
        24,    // LockTimeout
        267,   // PreparedTransactionInProgress
        249,   // StaleDbVersion
        239,   // SnapshotTooOld
        246,   // SnapshotUnavailable
        311,   // StaleChunkHistory
        327,   // MigrationConflict
        63,    // StaleShardVersion
        150,   // StaleEpoch
        13388, // StaleConfig
        287,   // CannotImplicitlyCreateCollection
    ];
    if ALWAYS.contains(&code) {
        return true;
    }
    let no_such_transaction = code == ErrorCode::NoSuchTransaction.0;
    if commit_or_abort {
        no_such_transaction && !has_wce
    } else {
        no_such_transaction || is_retriable_code(code)
    }
}

/// Whether `code` is in the RetriableError category.
pub fn is_retriable_code(code: i32) -> bool {
    RETRIABLE.contains(&code)
}

/// Whether mongos resends a retryable write after `code` (`isMongosRetriableError`: the
/// RetriableError category plus BalancerInterrupted).
pub fn is_resend_code(code: i32) -> bool {
    is_retriable_code(code) || code == ErrorCode::BalancerInterrupted.0
}

/// What the write path knows about a child batch, for the resend rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSession {
    /// The batch carries `lsid`.
    pub lsid: bool,
    /// The batch carries `txnNumber`.
    pub txn_number: bool,
    /// The batch is part of a multi-statement transaction (`autocommit: false`), which the
    /// transaction's own protocol retries, never the router batch by batch.
    pub in_transaction: bool,
}

impl BatchSession {
    /// Whether the batch is a retryable write: safe to resend, because the shard remembers
    /// what it applied for this `lsid` and `txnNumber`.
    pub fn is_retryable_write(&self) -> bool {
        self.lsid && self.txn_number && !self.in_transaction
    }
}

/// How a child batch failed, as the resend rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchFailure {
    /// No reply (the connection failed or timed out): the batch may or may not have been
    /// applied.
    Network,
    /// `ok: 0` with this code.
    Command(i32),
    /// `ok: 1` with a `writeConcernError` of this code (its statements were applied; the
    /// write concern was not satisfied).
    WriteConcern(i32),
}

/// Whether to resend a child batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resend {
    /// Wait for a primary, then send the same batch (same `txnNumber` and `stmtIds`) to it.
    ToPrimary,
    /// Keep the failure: it becomes the statements' error.
    No,
}

/// The resend rule of mongos's write path: a retryable write whose batch failed with a
/// network error or a resend code, and which has been resent fewer than [`MAX_RESENDS`] times,
/// is resent to the primary; anything else is final.
pub fn resend_decision(
    session: BatchSession,
    failure: BatchFailure,
    resends_so_far: u32,
) -> Resend {
    if !session.is_retryable_write() || resends_so_far >= MAX_RESENDS {
        return Resend::No;
    }
    let eligible = match failure {
        BatchFailure::Network => true,
        BatchFailure::Command(code) | BatchFailure::WriteConcern(code) => is_resend_code(code),
    };
    if eligible {
        Resend::ToPrimary
    } else {
        Resend::No
    }
}

/// What the router knows when it labels an error for the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LabelContext {
    /// The request is a retryable write (`txnNumber`, no `autocommit`), or a transaction's
    /// `commitTransaction` / `abortTransaction`.
    pub retryable_write_or_commit: bool,
    /// The router itself is shutting down.
    pub router_shutting_down: bool,
}

/// The labels the client sees for an error with `code` (and the write-concern error's code):
/// a shard's `RetryableWriteError` and `NoWritesPerformed` are dropped (the router retried, or
/// decided not to); other shard labels (a transaction's `TransientTransactionError`, …) pass
/// through; `RetryableWriteError` is added only for the router's own shutdown, as mongos
/// does.
pub fn client_labels<S: AsRef<str>>(
    shard_labels: &[S],
    code: Option<i32>,
    ctx: LabelContext,
) -> Vec<String> {
    let mut out: Vec<String> = shard_labels
        .iter()
        .map(|l| l.as_ref())
        .filter(|l| *l != RETRYABLE_WRITE_ERROR && *l != NO_WRITES_PERFORMED)
        .map(str::to_string)
        .collect();
    let own_shutdown =
        code.is_some_and(|c| is_shutdown_code(c) || c == ErrorCode::CallbackCanceled.0);
    if ctx.retryable_write_or_commit && ctx.router_shutting_down && own_shutdown {
        out.push(RETRYABLE_WRITE_ERROR.to_string());
    }
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const RETRYABLE: BatchSession = BatchSession {
        lsid: true,
        txn_number: true,
        in_transaction: false,
    };

    #[test]
    fn transient_transaction_errors_are_mongods() {
        // Always transient: a write conflict, on a statement and on a commit.
        assert!(is_transient_transaction_error(112, false, false));
        assert!(is_transient_transaction_error(112, false, true));
        // A retriable code: transient on a statement, not on a commit (it is retried there).
        assert!(is_transient_transaction_error(10107, false, false));
        assert!(!is_transient_transaction_error(10107, false, true));
        // NoSuchTransaction on a commit: transient only without a write-concern error.
        assert!(is_transient_transaction_error(251, false, true));
        assert!(!is_transient_transaction_error(251, true, true));
        // Not transient: a duplicate key, a refused command.
        assert!(!is_transient_transaction_error(11000, false, false));
        assert!(!is_transient_transaction_error(263, false, false));
    }

    #[test]
    fn the_issue_codes_are_state_changes() {
        for code in [10107, 13435, 13436, 189, 11602] {
            assert!(is_not_primary_code(code), "{code}");
            assert!(is_retriable_code(code), "{code}");
        }
        for code in [91, 11600] {
            assert!(is_shutdown_code(code), "{code}");
            assert!(is_retriable_code(code), "{code}");
        }
        for code in [6, 7, 89, 9001] {
            assert!(is_network_code(code), "{code}");
        }
        assert!(is_network_timeout_code(89));
        assert!(!is_network_timeout_code(6));
        for code in [11000, 64, 50, 202, 2, 13388] {
            assert!(!is_retriable_code(code), "{code}");
            assert!(!is_not_primary_code(code), "{code}");
        }
    }

    #[test]
    fn retryable_writes_are_resent_after_retriable_failures() {
        for f in [
            BatchFailure::Network,
            BatchFailure::Command(10107),
            BatchFailure::Command(11600),
            BatchFailure::Command(91),
            BatchFailure::Command(194),
            BatchFailure::WriteConcern(189),
            BatchFailure::WriteConcern(11602),
        ] {
            assert_eq!(resend_decision(RETRYABLE, f, 0), Resend::ToPrimary, "{f:?}");
            assert_eq!(resend_decision(RETRYABLE, f, 2), Resend::ToPrimary, "{f:?}");
            assert_eq!(
                resend_decision(RETRYABLE, f, MAX_RESENDS),
                Resend::No,
                "{f:?}"
            );
        }
    }

    #[test]
    fn final_failures_are_not_resent() {
        for f in [
            BatchFailure::Command(11000),
            BatchFailure::Command(50),
            BatchFailure::Command(13388),
            BatchFailure::WriteConcern(64),
            BatchFailure::WriteConcern(100),
        ] {
            assert_eq!(resend_decision(RETRYABLE, f, 0), Resend::No, "{f:?}");
        }
    }

    #[test]
    fn batches_without_a_session_number_are_never_resent() {
        let plain = BatchSession {
            lsid: true,
            txn_number: false,
            in_transaction: false,
        };
        let no_lsid = BatchSession {
            lsid: false,
            txn_number: true,
            in_transaction: false,
        };
        let txn = BatchSession {
            in_transaction: true,
            ..RETRYABLE
        };
        for s in [plain, no_lsid, txn] {
            assert!(!s.is_retryable_write());
            for f in [BatchFailure::Network, BatchFailure::Command(10107)] {
                assert_eq!(resend_decision(s, f, 0), Resend::No, "{s:?} {f:?}");
            }
        }
    }

    #[test]
    fn shard_retry_labels_never_reach_the_client() {
        let ctx = LabelContext {
            retryable_write_or_commit: true,
            router_shutting_down: false,
        };
        assert!(client_labels(&["RetryableWriteError"], Some(11600), ctx).is_empty());
        assert!(
            client_labels(&["RetryableWriteError", "NoWritesPerformed"], Some(91), ctx).is_empty()
        );
        assert_eq!(
            client_labels(&["TransientTransactionError"], Some(112), ctx),
            vec!["TransientTransactionError"]
        );
        let none: [&str; 0] = [];
        assert!(client_labels(&none, Some(10107), ctx).is_empty());
    }

    #[test]
    fn the_router_labels_its_own_shutdown() {
        let shutting = LabelContext {
            retryable_write_or_commit: true,
            router_shutting_down: true,
        };
        let none: [&str; 0] = [];
        assert_eq!(
            client_labels(&none, Some(91), shutting),
            vec!["RetryableWriteError"]
        );
        assert_eq!(
            client_labels(&["RetryableWriteError"], Some(11600), shutting),
            vec!["RetryableWriteError"]
        );
        assert!(client_labels(&none, Some(10107), shutting).is_empty());
        let not_retryable = LabelContext {
            retryable_write_or_commit: false,
            ..shutting
        };
        assert!(client_labels(&none, Some(91), not_retryable).is_empty());
    }
}
