//! Multi-document transactions on one shard, as a replica-set primary runs them
//! (`docs/design/transactions.md`).
//!
//! A transaction starts with the first command of a session that carries `lsid`, `txnNumber`,
//! `startTransaction: true` and `autocommit: false`; that command takes the snapshot: a private
//! copy of the catalog in which every collection keeps a journal of the documents the
//! transaction writes. Every statement of the transaction runs on that copy, so it sees the
//! snapshot and its own writes, and nobody else sees them. After each statement, the documents
//! it wrote for the first time are checked: one that changed in the shared catalog since the
//! snapshot, or that another open transaction already wrote, fails the statement with
//! WriteConflict (112) and aborts the transaction. `commitTransaction` checks every written
//! document once more and copies them into the shared catalog, all of them or none;
//! `abortTransaction` drops the copy.
//!
//! `prepareTransaction`, the first phase of a commit across shards, runs the commit's checks
//! without applying anything; the prepared transaction keeps its documents, commands outside it
//! on the namespaces it wrote wait until it ends ([`ShardService::prepare_gate`]), and
//! `commitTransaction` with a `commitTimestamp` applies it.
//!
//! The states, codes and labels are mongod's: NoSuchTransaction (251) for a number that was
//! aborted or never started, TransactionCommitted (256) to continue or abort a committed one,
//! a repeated `commitTransaction` answered ok, ConflictingOperationInProgress (117) to restart a
//! number, TransactionTooOld (225) for a number older than the session's newest,
//! OperationNotSupportedInTransaction (263) for a command transactions do not run, and
//! PreparedTransactionInProgress (267) to continue or restart a prepared one.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::{Bson, Document};

use super::ShardService;
use crate::command::CommandRequest;
use crate::embedded::store::{Catalog, Collection, DocIdentity};
use crate::engine::EngineError;
use crate::sync::lock;
use crate::value::compare::OrdBson;
use crate::value::error_codes::ErrorCode;

/// How long a transaction may stay open before the shard aborts it (mongod's
/// `transactionLifetimeLimitSeconds`, 60).
pub const TRANSACTION_LIFETIME: Duration = Duration::from_secs(60);

/// The commands a transaction may run (mongod's list, less those Sluice's shard does not have).
const ALLOWED: &[&str] = &[
    "find",
    "getMore",
    "killCursors",
    "insert",
    "update",
    "delete",
    "findAndModify",
    "findandmodify",
    "aggregate",
    "distinct",
    "create",
    "createIndexes",
    "bulkWrite",
    "commitTransaction",
    "abortTransaction",
    "prepareTransaction",
    "coordinateCommitTransaction",
];

pub use crate::backend::topology::retry::TRANSIENT_TRANSACTION_ERROR;

thread_local! {
    /// The catalog the data commands of the current transaction statement run on (set only
    /// for the duration of one synchronous command, see [`ShardService::data`]).
    static VIEW: RefCell<Option<Arc<Mutex<Catalog>>>> = const { RefCell::new(None) };
}

/// A transaction's copy (or a snapshot read's) as the catalog of the data commands run while it lives; cleared
/// when dropped, so a panic inside a command leaves no copy behind for the thread's next
/// command.
pub(super) struct ViewScope;

impl ViewScope {
    pub(super) fn enter(view: Arc<Mutex<Catalog>>) -> ViewScope {
        VIEW.with(|v| *v.borrow_mut() = Some(view));
        ViewScope
    }
}

impl Drop for ViewScope {
    fn drop(&mut self) {
        VIEW.with(|v| *v.borrow_mut() = None);
    }
}

/// A namespace and a document `_id`: what one transaction holds until it ends.
type DocKey = (String, OrdBson);

/// One open transaction.
#[derive(Debug)]
struct Open {
    /// The private copy of the catalog: the snapshot and the transaction's own writes.
    view: Arc<Mutex<Catalog>>,
    /// The collections of the snapshot, by UUID (to tell a collection dropped or recreated
    /// since from one the transaction created itself).
    snapshot: HashSet<bson::Uuid>,
    /// The documents this transaction has written and checked so far.
    held: BTreeSet<DocKey>,
    started: Instant,
}

/// Where a session's newest transaction stands.
#[derive(Debug)]
enum State {
    InProgress(Box<Open>),
    /// Prepared at this timestamp (`prepareTransaction`, the first phase of a commit across
    /// shards): its writes are checked and it keeps holding its documents until
    /// `commitTransaction` with a `commitTimestamp` or `abortTransaction` ends it. Statements
    /// outside it that touch a namespace it wrote wait until then ([`ShardService::prepare_gate`]).
    Prepared(Box<Open>, bson::Timestamp),
    Committed,
    Aborted,
}

impl State {
    fn open(&self) -> Option<&Open> {
        match self {
            State::InProgress(o) | State::Prepared(o, _) => Some(o),
            _ => None,
        }
    }
}

#[derive(Debug)]
struct Session {
    txn_number: i64,
    state: State,
    last_used: Instant,
}

/// The transactions of one shard (shared by the members of an embedded replica set): each
/// session's newest transaction, and which transaction holds each written document.
#[derive(Debug, Default)]
pub struct Transactions {
    sessions: HashMap<String, Session>,
    holders: BTreeMap<DocKey, String>,
}

impl Transactions {
    /// Ends the open transaction of `session` (if any) as `to`, releasing what it holds.
    fn finish(&mut self, session: &str, to: State) {
        let Some(s) = self.sessions.get_mut(session) else {
            return;
        };
        if let State::InProgress(open) | State::Prepared(open, _) =
            std::mem::replace(&mut s.state, to)
        {
            for key in &open.held {
                self.holders.remove(key);
            }
        }
    }

    /// The namespaces prepared transactions of sessions other than `except` hold documents in.
    fn prepared_namespaces(&self, except: &str) -> HashSet<String> {
        self.sessions
            .iter()
            .filter(|(k, _)| k.as_str() != except)
            .filter_map(|(_, s)| match &s.state {
                State::Prepared(o, _) => Some(o.held.iter().map(|(ns, _)| ns.clone())),
                _ => None,
            })
            .flatten()
            .collect()
    }

    /// The namespaces the open (unprepared) transaction `txn` of `session` has written.
    fn written_namespaces(&self, session: &str, txn: i64) -> HashSet<String> {
        match self.sessions.get(session) {
            Some(Session {
                txn_number,
                state: State::InProgress(o),
                ..
            }) if *txn_number == txn => o.held.iter().map(|(ns, _)| ns.clone()).collect(),
            _ => HashSet::new(),
        }
    }

    /// Aborts the transactions open for longer than [`TRANSACTION_LIFETIME`], and forgets
    /// sessions unused for [`super::SESSION_IDLE_TIMEOUT`].
    fn reap(&mut self) {
        self.sessions.retain(|_, s| {
            s.state.open().is_some() || s.last_used.elapsed() < super::SESSION_IDLE_TIMEOUT
        });
        let expired: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, s)| {
                matches!(&s.state, State::InProgress(o) if o.started.elapsed() > TRANSACTION_LIFETIME)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in expired {
            self.finish(&k, State::Aborted);
        }
    }

    /// Aborts the open transactions of the sessions `lsids` names (`None`: of every session),
    /// as killing or ending a session does. A prepared transaction survives, as in mongod:
    /// only its coordinator's decision ends it.
    fn kill(&mut self, lsids: Option<&[Bson]>) {
        let keys: Vec<String> = match lsids {
            None => self.sessions.keys().cloned().collect(),
            Some(list) => list
                .iter()
                .filter_map(|l| l.as_document())
                .filter_map(|l| super::retry::session_key(l).ok())
                .collect(),
        };
        for k in keys {
            if matches!(self.sessions.get(&k), Some(s) if matches!(s.state, State::InProgress(_))) {
                self.finish(&k, State::Aborted);
            }
        }
    }

    /// Transactions open now (prepared ones included).
    pub fn open(&self) -> usize {
        self.sessions
            .values()
            .filter(|s| s.state.open().is_some())
            .count()
    }

    /// Transactions prepared now.
    pub fn prepared(&self) -> usize {
        self.sessions
            .values()
            .filter(|s| matches!(s.state, State::Prepared(..)))
            .count()
    }
}

/// The session fields of a command that belongs to a transaction.
#[derive(Debug)]
pub(super) struct TxnRequest {
    session: String,
    txn_number: i64,
    start: bool,
}

fn err(code: ErrorCode, msg: impl Into<String>) -> EngineError {
    EngineError::new(code, msg)
}

/// The transaction fields of a command: `None` when it is not part of a transaction (no
/// `autocommit` and not a commit or abort), an error when they are malformed as mongod refuses
/// them.
pub(super) fn transaction_request(
    name: &str,
    body: &Document,
) -> Result<Option<TxnRequest>, EngineError> {
    let autocommit = body.get("autocommit");
    let start = body.get("startTransaction");
    let end = matches!(
        name,
        "commitTransaction"
            | "abortTransaction"
            | "prepareTransaction"
            | "coordinateCommitTransaction"
    );
    if autocommit.is_none() && start.is_none() && !end {
        return Ok(None);
    }
    match autocommit {
        Some(Bson::Boolean(false)) => {}
        Some(Bson::Boolean(true)) => {
            return Err(err(
                ErrorCode::InvalidOptions,
                "Specifying autocommit=true is not allowed.",
            ))
        }
        Some(_) => return Err(err(
            ErrorCode::TypeMismatch,
            "BSON field 'OperationSessionInfo.autocommit' is the wrong type, expected type 'bool'",
        )),
        None if start.is_some() => {
            return Err(err(
                ErrorCode::InvalidOptions,
                "'startTransaction' field requires 'autocommit' field to also be specified",
            ))
        }
        None => {
            return Err(err(
                ErrorCode::InvalidOptions,
                format!("'{name}' can only be run with autocommit=false"),
            ))
        }
    }
    let start = match start {
        None => false,
        Some(Bson::Boolean(true)) => true,
        Some(Bson::Boolean(false)) => {
            return Err(err(
                ErrorCode::InvalidOptions,
                "Specifying startTransaction=false is not allowed.",
            ))
        }
        Some(_) => {
            return Err(err(
                ErrorCode::TypeMismatch,
                "BSON field 'OperationSessionInfo.startTransaction' is the wrong type, expected type 'bool'",
            ))
        }
    };
    let Ok(lsid) = body.get_document("lsid") else {
        return Err(err(
            ErrorCode::InvalidOptions,
            "Transaction numbers are only allowed on a replica set member or mongos",
        ));
    };
    let Some(txn_number) = crate::value::field::number_field(body, "txnNumber") else {
        return Err(err(
            ErrorCode::InvalidOptions,
            "'autocommit' field requires a transaction number to also be specified",
        ));
    };
    Ok(Some(TxnRequest {
        session: super::retry::session_key(lsid)?,
        txn_number,
        start,
    }))
}

/// The `errorLabels` mongod gives an error of a transaction's command: TransientTransactionError
/// when retrying the whole transaction is safe.
pub(super) fn label_transaction_error(e: &mut EngineError, name: &str, has_wce: bool) {
    let end = matches!(
        name,
        "commitTransaction"
            | "abortTransaction"
            | "prepareTransaction"
            | "coordinateCommitTransaction"
    );
    if !crate::backend::topology::retry::is_transient_transaction_error(e.code.0, has_wce, end) {
        return;
    }
    let mut extra = e.extra.take().unwrap_or_default();
    extra.insert("errorLabels", vec![TRANSIENT_TRANSACTION_ERROR]);
    e.extra = Some(extra);
}

/// `coordinateCommitTransaction`'s participant list: this shard answers only its recovery
/// form (an empty list: "what was decided?"), which a router that did not run the transaction
/// sends with a client's `recoveryToken`; coordinating a commit is the router's work here.
fn check_recovery(body: &Document) -> Result<(), EngineError> {
    match body.get("participants") {
        Some(Bson::Array(list)) if list.is_empty() => Ok(()),
        Some(Bson::Array(_)) => Err(err(
            ErrorCode::CommandNotSupported,
            "coordinateCommitTransaction with participants is not supported: only its recovery form (participants: []) is",
        )),
        Some(_) => Err(err(
            ErrorCode::TypeMismatch,
            "BSON field 'coordinateCommitTransaction.participants' is the wrong type, expected type 'array'",
        )),
        None => Err(err(
            ErrorCode(40414),
            "BSON field 'coordinateCommitTransaction.participants' is missing but a required field",
        )),
    }
}

fn write_conflict() -> EngineError {
    err(
        ErrorCode::WriteConflict,
        "Caused by :: Write conflict during plan execution and yielding is disabled. :: Please retry your operation or multi-document transaction.",
    )
}

/// Whether the document `id` of `ns` changed in the shared catalog since the snapshot in which
/// it had identity `base` (in the transaction's collection `view`).
fn changed_since(
    shared: &Catalog,
    snapshot: &HashSet<bson::Uuid>,
    db: &str,
    coll: &str,
    view: &Collection,
    id: &Bson,
    base: &Option<DocIdentity>,
) -> bool {
    match shared.collection(db, coll) {
        // Dropped since the snapshot; or never there, and created by the transaction.
        None => snapshot.contains(&view.uuid) || base.is_some(),
        Some(c) if c.uuid != view.uuid => true,
        Some(c) => c.identity(id) != *base,
    }
}

impl ShardService {
    /// The catalog a data command works on: the current transaction's private copy while a
    /// transaction's statement runs, the shard's catalog otherwise.
    pub(in crate::embedded) fn data(&self) -> Arc<Mutex<Catalog>> {
        VIEW.with(|v| v.borrow().clone())
            .unwrap_or_else(|| self.catalog.clone())
    }

    /// `killSessions`, `killAllSessions`, `killAllSessionsByPattern`, `endSessions`: the
    /// transactions the sessions had open are aborted (what else a session holds here, its
    /// retryable-write records, outlives a kill).
    pub(super) fn kill_sessions(&self, name: &str, body: &Document) {
        let lsids = match name {
            "killSessions" | "endSessions" => match body.get(name) {
                Some(Bson::Array(a)) => Some(a.as_slice()),
                _ => Some(&[][..]),
            },
            _ => None,
        };
        lock(&self.transactions).kill(lsids);
    }

    /// Transactions open on this shard now.
    pub fn open_transactions(&self) -> usize {
        lock(&self.transactions).open()
    }

    /// Runs a command of a transaction: a statement, `commitTransaction` or
    /// `abortTransaction`.
    pub(super) fn run_transaction(
        &self,
        req: &CommandRequest,
        body: &Document,
        txn: TxnRequest,
    ) -> Result<Document, EngineError> {
        let name = req.name.as_str();
        if name == "coordinateCommitTransaction" {
            check_recovery(body)?;
        }
        let mut txns = lock(&self.transactions);
        txns.reap();
        let current = txns.sessions.get_mut(&txn.session).map(|s| {
            s.last_used = Instant::now();
            s.txn_number
        });
        if let Some(cur) = current {
            if txn.txn_number < cur {
                return Err(err(
                    ErrorCode::TransactionTooOld,
                    format!("Cannot start transaction {} on session {} because a newer transaction {cur} has already started.", txn.txn_number, txn.session),
                ));
            }
        }
        let prepared = matches!(
            txns.sessions.get(&txn.session),
            Some(s) if matches!(s.state, State::Prepared(..))
        );
        if !ALLOWED.contains(&name) {
            // The transaction does not survive a refused command (a prepared one does: only
            // its commit or abort ends it).
            if current == Some(txn.txn_number) && !prepared {
                txns.finish(&txn.session, State::Aborted);
            }
            return Err(err(
                ErrorCode::OperationNotSupportedInTransaction,
                format!("Cannot run '{name}' in a multi-document transaction."),
            ));
        }
        if txn.start {
            if current == Some(txn.txn_number) {
                return Err(err(
                    ErrorCode::ConflictingOperationInProgress,
                    format!("Cannot start a transaction at given transaction number {} on session {} because a transaction with the same number is in progress or has already ended.", txn.txn_number, txn.session),
                ));
            }
            if matches!(
                name,
                "commitTransaction"
                    | "abortTransaction"
                    | "prepareTransaction"
                    | "coordinateCommitTransaction"
            ) {
                return Err(err(
                    ErrorCode::NoSuchTransaction,
                    format!("Transaction {} has not been started.", txn.txn_number),
                ));
            }
            if prepared {
                return Err(err(
                    ErrorCode::PreparedTransactionInProgress,
                    format!("Cannot start transaction {} on session {} because the session's transaction is prepared", txn.txn_number, txn.session),
                ));
            }
            check_read_concern(body)?;
            txns.finish(&txn.session, State::Aborted);
            let shared = lock(&self.catalog);
            let snapshot = shared
                .dbs
                .values()
                .flat_map(|colls| colls.values().map(|c| c.uuid))
                .collect();
            let open = Open {
                view: Arc::new(Mutex::new(shared.journaled_copy())),
                snapshot,
                held: BTreeSet::new(),
                started: Instant::now(),
            };
            drop(shared);
            txns.sessions.insert(
                txn.session.clone(),
                Session {
                    txn_number: txn.txn_number,
                    state: State::InProgress(Box::new(open)),
                    last_used: Instant::now(),
                },
            );
        } else {
            let state = match txns.sessions.get(&txn.session) {
                Some(s) if s.txn_number == txn.txn_number => &s.state,
                _ => {
                    return Err(err(
                        ErrorCode::NoSuchTransaction,
                        format!("Given transaction number {} does not match any in-progress transactions. The active transaction number is {}", txn.txn_number, current.unwrap_or(-1)),
                    ))
                }
            };
            match (state, name) {
                (State::InProgress(_), "commitTransaction")
                    if body.contains_key("commitTimestamp") =>
                {
                    return Err(err(
                        ErrorCode::InvalidOptions,
                        "cannot provide commitTimestamp to unprepared transaction.",
                    ))
                }
                (State::InProgress(_), _) => {}
                (State::Prepared(_, at), "prepareTransaction") => {
                    // A retried prepare: the same answer.
                    return Ok(bson::doc! {"prepareTimestamp": *at});
                }
                (State::Prepared(..), "commitTransaction" | "abortTransaction") => {}
                (State::Prepared(..), "coordinateCommitTransaction") => {
                    // Its decision is the coordinating router's to make, not this shard's.
                    return Err(err(
                        ErrorCode::PreparedTransactionInProgress,
                        format!(
                            "Transaction {} is prepared and awaits its coordinator's decision",
                            txn.txn_number
                        ),
                    ));
                }
                (State::Prepared(..), _) => {
                    return Err(err(
                        ErrorCode::PreparedTransactionInProgress,
                        "Cannot call continue on a prepared transaction",
                    ))
                }
                (State::Committed, "commitTransaction" | "coordinateCommitTransaction") => {
                    return Ok(Document::new())
                }
                (State::Committed, _) => {
                    return Err(err(
                        ErrorCode::TransactionCommitted,
                        format!("Transaction {} has been committed.", txn.txn_number),
                    ))
                }
                (State::Aborted, _) => {
                    return Err(err(
                        ErrorCode::NoSuchTransaction,
                        format!("Transaction {} has been aborted.", txn.txn_number),
                    ))
                }
            }
        }
        match name {
            "commitTransaction" if prepared => self.commit_prepared(&mut txns, &txn.session, body),
            "commitTransaction" => self.commit(&mut txns, &txn.session),
            "prepareTransaction" => self.prepare(&mut txns, &txn.session),
            "coordinateCommitTransaction" => {
                // Recovery of a decision never made (mongod's answer when no coordinator
                // holds one): the transaction is aborted here, so no later commit can apply it.
                txns.finish(&txn.session, State::Aborted);
                Err(err(
                    ErrorCode::NoSuchTransaction,
                    format!(
                        "Transaction {} was aborted: no commit decision was made for it",
                        txn.txn_number
                    ),
                ))
            }
            "abortTransaction" => {
                txns.finish(&txn.session, State::Aborted);
                Ok(Document::new())
            }
            _ => {
                let outcome = self.statement(&mut txns, req, body, &txn);
                let failed = match &outcome {
                    Err(_) => true,
                    Ok(reply) => reply.contains_key("writeErrors"),
                };
                if failed {
                    txns.finish(&txn.session, State::Aborted);
                }
                outcome
            }
        }
    }

    /// Runs one statement of the open transaction of `txn.session` on its private copy, then
    /// checks and takes the documents it wrote.
    fn statement(
        &self,
        txns: &mut Transactions,
        req: &CommandRequest,
        body: &Document,
        txn: &TxnRequest,
    ) -> Result<Document, EngineError> {
        if !txn.start && body.contains_key("readConcern") {
            return Err(err(
                ErrorCode::InvalidOptions,
                "Only the first command in a transaction may specify a readConcern",
            ));
        }
        if body.contains_key("writeConcern") {
            return Err(err(
                ErrorCode::InvalidOptions,
                "Cannot set write concern after starting a transaction.",
            ));
        }
        // `bulkWrite` runs on `admin`; the databases it writes are those of its `nsInfo`.
        let dbs: Vec<String> = if req.name == "bulkWrite" {
            req.statement_bytes("nsInfo")
                .unwrap_or_default()
                .iter()
                .filter_map(|b| Document::from_reader(&b[..]).ok())
                .filter_map(|n| {
                    let ns = n.get_str("ns").ok()?;
                    Some(ns.split('.').next().unwrap_or_default().to_string())
                })
                .collect()
        } else {
            vec![req.db.clone()]
        };
        if let Some(db) = dbs
            .iter()
            .find(|db| matches!(db.as_str(), "admin" | "config" | "local"))
        {
            return Err(err(
                ErrorCode::TransactionBannedDatabase,
                format!("Cannot run command against the '{db}' database in a transaction."),
            ));
        }
        let Transactions { sessions, holders } = txns;
        let Some(Session {
            state: State::InProgress(open),
            ..
        }) = sessions.get_mut(&txn.session)
        else {
            return Err(err(
                ErrorCode::NoSuchTransaction,
                format!("Transaction {} has been aborted.", txn.txn_number),
            ));
        };
        if req.name == "createIndexes" {
            let view = lock(&open.view);
            let coll = req.collection_name(body)?;
            if let Some(c) = view.collection(&req.db, &coll) {
                if open.snapshot.contains(&c.uuid) {
                    return Err(err(
                        ErrorCode::OperationNotSupportedInTransaction,
                        format!("Cannot create new indexes on existing collection {}.{coll} in a multi-document transaction.", req.db),
                    ));
                }
            }
        }
        let view = open.view.clone();
        let reply = {
            let _scope = ViewScope::enter(view.clone());
            crate::embedded::commands::run(self, req, body, None)
        }?;

        // The documents this statement wrote for the first time: each must be unchanged since
        // the snapshot and held by no other transaction.
        let shared = lock(&self.catalog);
        let view = lock(&view);
        let mut taken = Vec::new();
        for (db, colls) in &view.dbs {
            for (coll, c) in colls {
                let ns = format!("{db}.{coll}");
                for (id, base) in c.journal() {
                    let key = (ns.clone(), id.clone());
                    if open.held.contains(&key) {
                        continue;
                    }
                    let other = holders.get(&key).is_some_and(|s| *s != txn.session);
                    if other || changed_since(&shared, &open.snapshot, db, coll, c, &id.0, base) {
                        return Err(write_conflict());
                    }
                    taken.push(key);
                }
            }
        }
        for key in taken {
            holders.insert(key.clone(), txn.session.clone());
            open.held.insert(key);
        }
        Ok(reply)
    }

    /// Commits the open transaction of `session`: checks every document it wrote once more
    /// (a write outside any transaction may have changed one since), then copies them into
    /// the shared catalog, every one or none.
    fn commit(&self, txns: &mut Transactions, session: &str) -> Result<Document, EngineError> {
        let Some(Session {
            state: State::InProgress(open),
            ..
        }) = txns.sessions.get_mut(session)
        else {
            return Ok(Document::new());
        };
        let mut shared = lock(&self.catalog);
        let outcome = committed_collections(&shared, open).map(|replaced| {
            for (db, coll, c) in replaced {
                shared.dbs.entry(db).or_default().insert(coll, c);
            }
        });
        drop(shared);
        match outcome {
            Ok(_) => {
                txns.finish(session, State::Committed);
                Ok(Document::new())
            }
            Err(e) => {
                txns.finish(session, State::Aborted);
                Err(e)
            }
        }
    }

    /// `prepareTransaction`: the checks of a commit (every written document unchanged since
    /// the snapshot, the writes apply without a unique-index violation) without applying
    /// anything. A transaction that passes is prepared: it keeps its documents, and nothing
    /// outside it may write the namespaces it wrote until it ends, so its commit cannot fail.
    /// One that fails is aborted.
    fn prepare(&self, txns: &mut Transactions, session: &str) -> Result<Document, EngineError> {
        let checked = match txns.sessions.get(session) {
            Some(Session {
                state: State::InProgress(open),
                ..
            }) => committed_collections(&lock(&self.catalog), open).map(|_| ()),
            _ => Err(err(ErrorCode::NoSuchTransaction, "no transaction")),
        };
        if let Err(e) = checked {
            txns.finish(session, State::Aborted);
            return Err(e);
        }
        let at = self.state.clock.tick();
        if let Some(s) = txns.sessions.get_mut(session) {
            if let State::InProgress(open) = std::mem::replace(&mut s.state, State::Aborted) {
                s.state = State::Prepared(open, at);
            }
        }
        Ok(bson::doc! {"prepareTimestamp": at})
    }

    /// `commitTransaction` of a prepared transaction: `commitTimestamp` is required, and may
    /// not be before the `prepareTimestamp`. The writes were checked at prepare and nothing
    /// has written their namespaces since, so they apply.
    fn commit_prepared(
        &self,
        txns: &mut Transactions,
        session: &str,
        body: &Document,
    ) -> Result<Document, EngineError> {
        let at = match body.get("commitTimestamp") {
            None => {
                return Err(err(
                    ErrorCode::InvalidOptions,
                    "commitTransaction must provide commitTimestamp to prepared transaction.",
                ))
            }
            Some(Bson::Timestamp(t)) => *t,
            Some(_) => {
                return Err(err(
                    ErrorCode::TypeMismatch,
                    "BSON field 'commitTransaction.commitTimestamp' is the wrong type, expected type 'timestamp'",
                ))
            }
        };
        let Some(Session {
            state: State::Prepared(open, prepared_at),
            ..
        }) = txns.sessions.get_mut(session)
        else {
            return Err(err(ErrorCode::NoSuchTransaction, "no prepared transaction"));
        };
        if at.time == 0 && at.increment == 0 {
            return Err(err(
                ErrorCode::InvalidOptions,
                "'commitTimestamp' cannot be null",
            ));
        }
        if (at.time, at.increment) < (prepared_at.time, prepared_at.increment) {
            return Err(err(
                ErrorCode::InvalidOptions,
                format!("'commitTimestamp' must be greater than or equal to 'prepareTimestamp'. commitTimestamp: {at:?}, prepareTimestamp: {prepared_at:?}"),
            ));
        }
        let mut shared = lock(&self.catalog);
        match committed_collections(&shared, open) {
            Ok(replaced) => {
                for (db, coll, c) in replaced {
                    shared.dbs.entry(db).or_default().insert(coll, c);
                }
                drop(shared);
                self.state.clock.advance_to(at);
                txns.finish(session, State::Committed);
                Ok(Document::new())
            }
            Err(e) => {
                // Cannot happen while the namespaces are held; kept prepared so the
                // coordinator's retry or abort still finds it.
                tracing::error!(error = %e.message, "a prepared transaction failed to commit");
                Err(e)
            }
        }
    }
}

/// The collections `open` (a transaction of the shard whose catalog is `shared`) would leave
/// behind on commit: a copy of each collection it wrote with its writes applied, and each
/// collection it created, whole. WriteConflict when a written document changed in `shared`
/// since the snapshot, a collection was dropped or created meanwhile; a unique-index
/// violation as the insert or replace reports it.
fn committed_collections(
    shared: &Catalog,
    open: &Open,
) -> Result<Vec<(String, String, Collection)>, EngineError> {
    let view = lock(&open.view);
    let mut replaced: Vec<(String, String, Collection)> = Vec::new();
    for (db, colls) in &view.dbs {
        for (coll, c) in colls {
            let created = !open.snapshot.contains(&c.uuid);
            if c.journal().next().is_none() && !created {
                continue;
            }
            let ns = format!("{db}.{coll}");
            for (id, base) in c.journal() {
                if changed_since(shared, &open.snapshot, db, coll, c, &id.0, base) {
                    return Err(write_conflict());
                }
            }
            let current = match shared.collection(db, coll) {
                // Created by the transaction: published whole, with its indexes.
                None if created => {
                    replaced.push((db.clone(), coll.clone(), c.clone().without_journal()));
                    continue;
                }
                // Created outside meanwhile too (or dropped since the snapshot).
                _ if created => return Err(write_conflict()),
                None => return Err(write_conflict()),
                Some(current) => current,
            };
            replaced.push((
                db.clone(),
                coll.clone(),
                apply_writes(current.clone(), c, &ns)?,
            ));
        }
    }
    Ok(replaced)
}

/// `current` (a copy of a shared collection) with the documents the transaction's collection
/// `view` wrote: removed ones removed, then the others replaced or inserted, in the order the
/// transaction wrote them.
fn apply_writes(
    mut current: Collection,
    view: &Collection,
    ns: &str,
) -> Result<Collection, EngineError> {
    let mut present = Vec::new();
    for (id, _) in view.journal() {
        match view.by_id(&id.0) {
            Some((rid, d)) => present.push((rid, d.clone())),
            None => {
                if let Some((rid, _)) = current.by_id(&id.0) {
                    current.remove(rid);
                }
            }
        }
    }
    present.sort_by_key(|(rid, _)| *rid);
    for (_, d) in present {
        let id = d.get("_id").cloned().unwrap_or(Bson::Null);
        match current.by_id(&id) {
            Some((rid, _)) => current.replace(ns, rid, d)?,
            None => {
                current.insert(ns, d)?;
            }
        }
    }
    Ok(current)
}

/// The first command's `readConcern`: `local`, `majority` or `snapshot` (or none), as mongod
/// allows in a transaction; `atClusterTime` only with `snapshot`.
fn check_read_concern(body: &Document) -> Result<(), EngineError> {
    let Some(rc) = body.get("readConcern") else {
        return Ok(());
    };
    let Bson::Document(rc) = rc else {
        return Err(err(
            ErrorCode::TypeMismatch,
            "BSON field 'readConcern' is the wrong type, expected type 'object'",
        ));
    };
    let level = rc.get_str("level").unwrap_or("local");
    if !matches!(level, "local" | "majority" | "snapshot") {
        return Err(err(
            ErrorCode::InvalidOptions,
            format!("The readConcern level must be either 'local' (default), 'majority' or 'snapshot' in order to run in a transaction, got '{level}'"),
        ));
    }
    if rc.contains_key("atClusterTime") && level != "snapshot" {
        return Err(err(
            ErrorCode::InvalidOptions,
            "readConcern level must be 'snapshot' in order to specify atClusterTime",
        ));
    }
    Ok(())
}

/// How long a prepare waits for another prepared transaction to release the namespaces it
/// wrote before it fails with WriteConflict: two transactions prepared in opposite orders on
/// two shards would otherwise wait for each other forever.
const PREPARE_WAIT: Duration = Duration::from_millis(500);

/// What a command holds while it runs, against prepares: a command outside transactions holds
/// the gate shared (no transaction can become prepared while it reads or writes), a
/// `prepareTransaction` holds it alone (no such command is half-way through).
#[derive(Debug)]
pub(super) enum PrepareGuard {
    Shared(#[allow(dead_code)] tokio::sync::OwnedRwLockReadGuard<()>),
    Exclusive(#[allow(dead_code)] tokio::sync::OwnedRwLockWriteGuard<()>),
}

/// The namespaces a command outside transactions reads or writes, `db.coll`.
fn command_namespaces(req: &CommandRequest) -> Vec<String> {
    if req.name == "bulkWrite" {
        return req
            .statement_bytes("nsInfo")
            .unwrap_or_default()
            .iter()
            .filter_map(|b| Document::from_reader(&b[..]).ok())
            .filter_map(|n| n.get_str("ns").ok().map(str::to_string))
            .collect();
    }
    req.namespace.iter().cloned().collect()
}

impl ShardService {
    /// Waits, as mongod's prepare conflicts make an operation wait, until no transaction of
    /// another session that is prepared holds documents in a namespace the command touches:
    /// a command outside transactions (its namespace), the commit of an unprepared
    /// transaction or a `prepareTransaction` (the namespaces the transaction wrote). The wait
    /// is per namespace, where mongod's is per document. Returns what the command holds while
    /// it runs. A command outside transactions waits up to its `maxTimeMS` (then
    /// MaxTimeMSExpired) or [`TRANSACTION_LIFETIME`] (then LockTimeout); a prepare up to
    /// [`PREPARE_WAIT`] (then WriteConflict: the coordinator aborts and the client retries).
    pub(super) async fn prepare_gate(
        &self,
        req: &CommandRequest,
        txn: Option<&TxnRequest>,
    ) -> Result<Option<PrepareGuard>, EngineError> {
        let name = req.name.as_str();
        let (namespaces, own): (HashSet<String>, &str) = match txn {
            None => (command_namespaces(req).into_iter().collect(), ""),
            Some(t) if matches!(name, "commitTransaction" | "prepareTransaction") => (
                lock(&self.transactions).written_namespaces(&t.session, t.txn_number),
                t.session.as_str(),
            ),
            Some(_) => return Ok(None),
        };
        let exclusive = txn.is_some() && name == "prepareTransaction";
        if namespaces.is_empty() && !exclusive {
            return Ok(None);
        }
        let limit = if exclusive {
            PREPARE_WAIT
        } else {
            crate::command::max_time(req.body.raw())
                .ok()
                .flatten()
                .unwrap_or(TRANSACTION_LIFETIME)
        };
        let deadline = Instant::now() + limit;
        loop {
            let guard = if exclusive {
                // Commands outside transactions that are running (a long `getMore` with
                // `maxAwaitTimeMS`, say) are waited for no longer than the prepare waits.
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, self.prepare_gate.clone().write_owned()).await {
                    Ok(g) => PrepareGuard::Exclusive(g),
                    Err(_) => return Err(write_conflict()),
                }
            } else {
                PrepareGuard::Shared(self.prepare_gate.clone().read_owned().await)
            };
            let busy = {
                let txns = lock(&self.transactions);
                let prepared = txns.prepared_namespaces(own);
                namespaces.iter().any(|ns| prepared.contains(ns))
            };
            if !busy {
                return Ok(match txn {
                    Some(_) if !exclusive => None,
                    _ => Some(guard),
                });
            }
            drop(guard);
            if Instant::now() >= deadline {
                return Err(if exclusive {
                    write_conflict()
                } else if limit == TRANSACTION_LIFETIME {
                    err(
                        ErrorCode::LockTimeout,
                        format!("{name} waited too long for a prepared transaction to end"),
                    )
                } else {
                    err(ErrorCode::MaxTimeMSExpired, "operation exceeded time limit")
                });
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Transactions prepared on this shard now.
    pub fn prepared_transactions(&self) -> usize {
        lock(&self.transactions).prepared()
    }
}
