//! A shard as the data path sees it: one server reached at its address (a pool), or a replica
//! set reached through its seed list — a [`ShardMonitor`] following its members and a pool per
//! member.
//!
//! [`Shard::send`] is the one way a request reaches a shard: it picks the member the request
//! needs (the primary for a write, a member matching the read preference for a read), waiting
//! for one while there is none (an election) up to the selection timeout or the request's own
//! deadline; reports what goes wrong to the monitor (a NotPrimary or shutdown error marks the
//! member Unknown and has every member checked at once; a network error marks it Unknown and
//! clears its pool); and resends the same frame after a failure when [`Resend`] allows it: a
//! retryable write (same `lsid`, `txnNumber` and `stmtIds`, so the member's session table makes
//! a statement it applied already a no-op), or a read. A write without a session number is
//! never resent once it may have reached a member. See `docs/design/replica-sets.md` §4–§5.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use bson::{Bson, Document, RawBsonRef, RawDocument};
use bytes::Bytes;

use super::topology::retry::{self, BatchFailure, BatchSession, MAX_RESENDS};
use super::topology::{
    ApplicationError, HostAddr, MonitorOptions, Need, Printer, ReadPreference, SeedList,
    ShardMonitor, TopologyError, TopologyVersion,
};
use super::{BackendError, PoolOptions, PooledConnection, ShardPool, ShardSecurity};
use crate::wire::BsonDoc;

/// How the replica-set core prints values in its messages: the project's value printer.
pub const PRINTER: Printer = Printer {
    document: crate::value::render::render_doc,
    value: crate::value::render::render_value,
    type_name: crate::value::field::type_name,
};

/// A cheap random number for picking among equally eligible members (splitmix64 over a
/// shared counter).
fn random() -> u64 {
    static STATE: AtomicU64 = AtomicU64::new(0x2545_f491_4f6c_dd1d);
    let mut x = STATE.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// When a request that failed is sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resend {
    /// A retryable write (`lsid` + `txnNumber`, not in a transaction): resent to the new
    /// primary after a network error or a retriable error, up to [`MAX_RESENDS`] times.
    RetryableWrite,
    /// A read (`find`, `aggregate`, `count`, …): sent again to a newly selected member after
    /// the same failures, up to [`MAX_RESENDS`] times.
    Read,
    /// A command that writes no user documents (DDL such as `dropDatabase` or `create`,
    /// administration): sent again to the new primary after a member refused it as not
    /// primary (NotWritablePrimary 10107, NotPrimaryNoSecondaryOk 13435), which it does before
    /// running it, up to [`MAX_RESENDS`] times, as mongos retries such commands on a shard's
    /// new primary. Otherwise as [`Resend::Never`].
    IfRefusedAsNotPrimary,
    /// Anything else (a write without a session number, a transaction's statement): sent
    /// again only when it never left Sluice (no connection could be made).
    Never,
}

/// The request's session as the resend rule sees it.
pub fn batch_session(body: &RawDocument) -> BatchSession {
    let has = |k: &str| matches!(body.get(k), Ok(Some(_)));
    BatchSession {
        lsid: has("lsid"),
        txn_number: has("txnNumber"),
        in_transaction: matches!(body.get("autocommit"), Ok(Some(RawBsonRef::Boolean(false))))
            || matches!(
                body.get("startTransaction"),
                Ok(Some(RawBsonRef::Boolean(true)))
            ),
    }
}

/// What a request needs a member for: the primary, or the read preference the body carries
/// (`$readPreference`; absent is `primary`). A malformed read preference is refused with
/// mongos's error.
pub fn need_of(body: &RawDocument) -> Result<Need, TopologyError> {
    need_of_field(
        crate::wire::get_field(body, "$readPreference")
            .ok()
            .flatten(),
    )
}

/// [`need_of`] of a command's `$readPreference` element already found (`None`: none).
pub fn need_of_field(read_preference: Option<RawBsonRef<'_>>) -> Result<Need, TopologyError> {
    match read_preference {
        Some(v) => {
            let v = Bson::try_from(v).map_err(|e| {
                TopologyError::new(
                    crate::value::error_codes::ErrorCode::FailedToParse,
                    format!("invalid $readPreference: {e}"),
                )
            })?;
            ReadPreference::from_bson(&v, &PRINTER).map(Need::Read)
        }
        _ => Ok(Need::Write),
    }
}

/// How many times a request that never left Sluice (no connection to the member selected
/// could be made, or its handshake failed) is sent to the member selected next. Each such
/// attempt first waits for the monitor to find a member again, so the bound is a backstop; it
/// is kept apart from [`MAX_RESENDS`], which counts requests that may have been applied.
pub const MAX_UNSENT_ATTEMPTS: u32 = 5;

/// One shard: a single server or a replica set.
#[derive(Debug)]
pub struct Shard {
    id: String,
    addr: String,
    options: PoolOptions,
    child_batches: metrics::Counter,
    kind: Kind,
    /// Cursors of forwarded commands on a replica set's members: cursor id → the member that
    /// holds it (and when it was last used), so that `getMore` and `killCursors` go there.
    cursors: Mutex<HashMap<i64, (String, Instant)>>,
}

/// Pinned cursors a shard keeps before it forgets the ones idle longer than
/// [`PINNED_CURSOR_IDLE`] (a client that went away without killing its cursor).
const MAX_PINNED_CURSORS: usize = 10_000;
/// How long a pinned cursor may go unused before it may be forgotten (mongod's cursor
/// timeout).
const PINNED_CURSOR_IDLE: std::time::Duration = std::time::Duration::from_secs(600);

#[derive(Debug)]
enum Kind {
    Single(Arc<ShardPool>),
    ReplicaSet(ReplicaSet),
}

#[derive(Debug)]
struct ReplicaSet {
    seeds: SeedList,
    /// Started on first use (it spawns tasks, so it needs the runtime).
    monitor: OnceLock<ShardMonitor>,
    /// Shared with the monitor, which clears a member's pool when it marks it Unknown.
    pools: Arc<Mutex<HashMap<HostAddr, Arc<ShardPool>>>>,
}

impl Shard {
    /// The shard `id` at `addr`: `"rs0/h1:p,h2:p"` is a replica set, anything else one server
    /// reached as it is written (as before replica sets).
    pub fn new(id: &str, addr: &str, options: PoolOptions) -> Shard {
        let kind = match SeedList::parse(addr) {
            Ok(seeds) if seeds.is_replica_set() => Kind::ReplicaSet(ReplicaSet {
                seeds,
                monitor: OnceLock::new(),
                pools: Arc::new(Mutex::new(HashMap::new())),
            }),
            _ => Kind::Single(Arc::new(ShardPool::new(id, addr, options.clone()))),
        };
        Shard {
            id: id.to_string(),
            addr: addr.to_string(),
            child_batches: metrics::counter!("sluice_child_batches_total", "shard" => id.to_string()),
            options,
            kind,
            cursors: Mutex::new(HashMap::new()),
        }
    }

    /// Records that cursor `id` lives on `member` (replica sets only: a single server holds
    /// every cursor).
    pub fn pin_cursor(&self, id: i64, member: &str) {
        if !self.is_replica_set() || id == 0 {
            return;
        }
        let mut cursors = crate::sync::lock(&self.cursors);
        if cursors.len() >= MAX_PINNED_CURSORS {
            cursors.retain(|_, (_, used)| used.elapsed() < PINNED_CURSOR_IDLE);
        }
        if cursors.len() < MAX_PINNED_CURSORS {
            cursors.insert(id, (member.to_string(), Instant::now()));
        }
    }

    /// The member holding cursor `id`, if it was pinned.
    pub fn cursor_member(&self, id: i64) -> Option<String> {
        let mut cursors = crate::sync::lock(&self.cursors);
        let entry = cursors.get_mut(&id)?;
        entry.1 = Instant::now();
        Some(entry.0.clone())
    }

    /// Forgets cursor `id` (exhausted or killed).
    pub fn unpin_cursor(&self, id: i64) {
        crate::sync::lock(&self.cursors).remove(&id);
    }

    /// Sends `frame` to the member at `member` itself — no selection, no resend (a cursor's
    /// `getMore`: only that member holds the cursor); a failure is reported as any other.
    pub async fn send_to(
        &self,
        member: &str,
        frame: &Bytes,
        id: i32,
    ) -> Result<(BsonDoc, String), BackendError> {
        let mut conn = self.checkout_at(member).await?;
        let addr = HostAddr::parse(conn.addr()).ok();
        let result = conn.request(frame, id).await;
        let stale = conn.is_stale();
        drop(conn);
        if let Some(m) = &addr {
            match &result {
                Ok(reply) => {
                    if let Some((_, code, tv)) = reply_failure(reply) {
                        self.report(m, stale, &Failure::Reply(code, tv));
                    }
                }
                Err(e) => self.report(m, stale, &Failure::Network(e, false)),
            }
        }
        result.map(|r| (r, member.to_string()))
    }

    /// The shard's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The shard's address as configured (a seed list for a replica set).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether the shard is a replica set whose members Sluice discovers.
    pub fn is_replica_set(&self) -> bool {
        matches!(self.kind, Kind::ReplicaSet(_))
    }

    /// Counts a write child batch sent to this shard (`sluice_child_batches_total`).
    pub fn count_child_batch(&self) {
        self.child_batches.increment(1);
    }

    /// The replica set's monitor (started now if it was not), `None` for a single server.
    pub fn monitor(&self) -> Option<&ShardMonitor> {
        match &self.kind {
            Kind::Single(_) => None,
            Kind::ReplicaSet(rs) => Some(rs.monitor.get_or_init(|| {
                let monitor = ShardMonitor::start(
                    &rs.seeds,
                    self.options.replica_set.clone(),
                    MonitorOptions {
                        connect_timeout: self.options.connect_timeout,
                        security: ShardSecurity {
                            tls: self.options.security.tls.clone(),
                            keyfile: None,
                            x509: false,
                            tls_files: None,
                        },
                    },
                );
                let pools = rs.pools.clone();
                monitor.on_pool_clear(Box::new(move |addr| {
                    if let Some(pool) = crate::sync::lock(&pools).get(addr) {
                        pool.clear();
                    }
                }));
                monitor
            })),
        }
    }

    /// The pool of the member at `addr` (made on first use).
    fn member_pool(&self, addr: &HostAddr) -> Arc<ShardPool> {
        match &self.kind {
            Kind::Single(p) => p.clone(),
            Kind::ReplicaSet(rs) => crate::sync::lock(&rs.pools)
                .entry(addr.clone())
                .or_insert_with(|| {
                    Arc::new(ShardPool::new(
                        &self.id,
                        &addr.to_string(),
                        self.options.clone(),
                    ))
                })
                .clone(),
        }
    }

    /// Opens the idle connections of the pool (of the primary, once one is known) and starts
    /// monitoring.
    pub async fn warm(&self) {
        match &self.kind {
            Kind::Single(p) => p.warm().await,
            Kind::ReplicaSet(_) => {
                if self.options.min_idle > 0 {
                    let deadline = Instant::now() + self.options.connect_timeout;
                    if let Ok(c) = self.checkout(&Need::Write, Some(deadline)).await {
                        let pool = c.pool().clone();
                        drop(c);
                        pool.warm().await;
                    }
                } else {
                    self.monitor();
                }
            }
        }
    }

    /// Idle connections over every member's pool.
    pub fn idle_count(&self) -> usize {
        match &self.kind {
            Kind::Single(p) => p.idle_count(),
            Kind::ReplicaSet(rs) => crate::sync::lock(&rs.pools)
                .values()
                .map(|p| p.idle_count())
                .sum(),
        }
    }

    /// A connection to a member that serves `need`, waiting for one (an election, a member
    /// coming back) until the selection timeout or `deadline`. A single server serves
    /// everything.
    pub async fn checkout(
        &self,
        need: &Need,
        deadline: Option<Instant>,
    ) -> Result<PooledConnection, BackendError> {
        let member = match &self.kind {
            Kind::Single(p) => return p.checkout().await,
            Kind::ReplicaSet(_) => {
                let Some(monitor) = self.monitor() else {
                    return Err(BackendError::Unreachable("no monitor".into()));
                };
                monitor
                    .select(need.clone(), deadline, random(), &PRINTER)
                    .await
                    .map_err(|e| BackendError::NoMember(e.code, e.message))?
            }
        };
        let pool = self.member_pool(&member);
        match pool.checkout().await {
            Ok(c) => Ok(c),
            Err(e) => {
                if matches!(e, BackendError::Connect(_)) {
                    self.report(&member, false, &Failure::Network(&e, true));
                }
                Err(e)
            }
        }
    }

    /// A connection to the member at `addr` (a cursor's `getMore` goes to the member that
    /// opened it, whatever it is now); for a single server, its pool.
    pub async fn checkout_at(&self, addr: &str) -> Result<PooledConnection, BackendError> {
        match &self.kind {
            Kind::Single(p) => p.checkout().await,
            Kind::ReplicaSet(_) => {
                let member = HostAddr::parse(addr).map_err(|e| {
                    BackendError::Unreachable(format!("invalid member {addr}: {}", e.message))
                })?;
                self.member_pool(&member).checkout().await
            }
        }
    }

    /// Reports a failure seen on a connection to `addr`. `stale`: its pool was cleared since
    /// it was checked out, so a broken connection is old news (the clear already accounted
    /// for it). An error the member answered is reported whatever the connection's age: it
    /// says what the member is now (a NotPrimary refusal after a step-down), and its
    /// `topologyVersion` already lets the monitor ignore what it knows; ignoring it would
    /// leave the member primary in the topology and send the resend straight back to it.
    fn report(&self, addr: &HostAddr, stale: bool, failure: &Failure<'_>) {
        let Some(monitor) = self.monitor() else {
            return;
        };
        if stale && matches!(failure, Failure::Network(..)) {
            return;
        }
        let Some(generation) =
            monitor.with_topology(|t| t.member(addr).map(|m| m.pool_generation()))
        else {
            return;
        };
        let error = match failure {
            Failure::Network(e, during_handshake) => ApplicationError::Network {
                generation,
                during_handshake: *during_handshake,
                timeout: matches!(e, BackendError::Timeout(_)),
            },
            Failure::Reply(code, tv) => ApplicationError::Command {
                generation,
                code: *code,
                topology_version: *tv,
            },
        };
        // The monitor clears the member's pool when the update says so.
        monitor.report_application_error(addr, &error);
    }

    /// Sends the encoded request `frame` (request id `id`) to a member that serves `need` and
    /// returns its reply as it came; after a failure, reports it and sends the same frame
    /// again as `resend` allows. A reply with an error is returned as a reply when it is
    /// final; a request that never got one fails with the last transport error, or with the
    /// selection's error when no member could be found. The reply comes with the address of
    /// the member that sent it.
    pub async fn send(
        &self,
        frame: &Bytes,
        id: i32,
        need: &Need,
        deadline: Option<Instant>,
        resend: Resend,
    ) -> Result<(BsonDoc, String), BackendError> {
        let rs = self.is_replica_set();
        let mut resends: u32 = 0;
        // Attempts that never left Sluice (no connection could be made, the handshake
        // failed): they count apart from the resends, which are for requests that may have
        // been applied; see `docs/design/replica-sets.md` §5.
        let mut unsent: u32 = 0;
        loop {
            let may_resend = |failure: BatchFailure, resends: u32| -> bool {
                if !rs {
                    // A single server: as before replica sets, a retryable write is resent
                    // once after a network error, to the same address.
                    return resend == Resend::RetryableWrite
                        && failure == BatchFailure::Network
                        && resends < 1;
                }
                match resend {
                    Resend::RetryableWrite => {
                        let session = BatchSession {
                            lsid: true,
                            txn_number: true,
                            in_transaction: false,
                        };
                        retry::resend_decision(session, failure, resends)
                            == retry::Resend::ToPrimary
                    }
                    Resend::Read => {
                        resends < MAX_RESENDS
                            && match failure {
                                BatchFailure::Network => true,
                                BatchFailure::Command(c) | BatchFailure::WriteConcern(c) => {
                                    retry::is_retriable_code(c)
                                }
                            }
                    }
                    Resend::IfRefusedAsNotPrimary => {
                        resends < MAX_RESENDS
                            && matches!(
                                failure,
                                BatchFailure::Command(c)
                                    if c == crate::value::error_codes::ErrorCode::NotWritablePrimary.0
                                        || c == crate::value::error_codes::ErrorCode::NotPrimaryNoSecondaryOk.0
                            )
                    }
                    Resend::Never => false,
                }
            };
            let mut conn = match self.checkout(need, deadline).await {
                Ok(c) => c,
                Err(e @ BackendError::NoMember(..)) => return Err(e),
                // Never sent: any request may go again (to the member selected next).
                Err(e) if rs && !e.maybe_applied() && unsent < MAX_UNSENT_ATTEMPTS => {
                    tracing::debug!(shard = %self.id, error = %e, "cannot reach the member; selecting again");
                    unsent += 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            // The member is read from the address only when a failure is reported to the
            // monitor: a reply without one (the hot path) needs no parse.
            match conn.request(frame, id).await {
                Ok(reply) => {
                    let Some((failure, code, tv)) = reply_failure(&reply) else {
                        return Ok((reply, conn.addr().to_string()));
                    };
                    let addr = conn.addr().to_string();
                    let member = HostAddr::parse(&addr).ok();
                    let stale = conn.is_stale();
                    drop(conn);
                    if let Some(m) = &member {
                        self.report(m, stale, &Failure::Reply(code, tv));
                    }
                    if !may_resend(failure, resends) {
                        return Ok((reply, addr));
                    }
                    tracing::debug!(shard = %self.id, code, "resending after a retriable error");
                }
                Err(e) => {
                    let member = HostAddr::parse(conn.addr()).ok();
                    let stale = conn.is_stale();
                    drop(conn);
                    if let Some(m) = &member {
                        self.report(m, stale, &Failure::Network(&e, false));
                    }
                    if !may_resend(BatchFailure::Network, resends) {
                        return Err(e);
                    }
                    tracing::debug!(shard = %self.id, error = %e, "resending after a network error");
                }
            }
            resends += 1;
        }
    }

    /// Runs one command on the primary (a single server: on it), resending a retryable write
    /// or a read as [`Shard::send`] does.
    pub async fn run_command(&self, body: &Document) -> Result<Document, BackendError> {
        let bytes = body
            .to_vec()
            .map_err(|e| BackendError::Protocol(format!("cannot encode command: {e}")))?;
        let id = PooledConnection::next_request_id();
        let frame = crate::wire::OpMsgBuilder::new(0, &bytes).finish(id, 0);
        let raw = RawDocument::from_bytes(&bytes)
            .map_err(|e| BackendError::Protocol(format!("cannot encode command: {e}")))?;
        let need = need_of(raw).map_err(|e| BackendError::NoMember(e.code, e.message))?;
        let session = batch_session(raw);
        let resend = if matches!(need, Need::Read(_)) {
            Resend::Read
        } else if session.is_retryable_write() {
            Resend::RetryableWrite
        } else if session.in_transaction || body.keys().next().is_some_and(|n| writes_documents(n))
        {
            Resend::Never
        } else {
            Resend::IfRefusedAsNotPrimary
        };
        self.send(&frame, id, &need, None, resend)
            .await
            .map(|(r, _)| r.to_document())
    }
}

/// Whether a command named `name` writes user documents (its statements are not resent
/// without a session number, as mongos does not).
pub fn writes_documents(name: &str) -> bool {
    matches!(
        name,
        "insert" | "update" | "delete" | "findAndModify" | "findandmodify" | "bulkWrite"
    )
}

/// A failure as the monitor is told it.
enum Failure<'a> {
    /// No reply (the flag: while connecting).
    Network(&'a BackendError, bool),
    /// A reply with an error code (command-level or write concern) and the member's
    /// `topologyVersion` if it sent one.
    Reply(i32, Option<TopologyVersion>),
}

/// The failure a reply reports, if any: `ok: 0` with its code, or a `writeConcernError`.
fn reply_failure(reply: &BsonDoc) -> Option<(BatchFailure, i32, Option<TopologyVersion>)> {
    let raw = reply.raw();
    // One walk for what either answer needs: `writeConcernError` is usually absent, so the
    // walk goes to the end of the reply anyway and finds the others on the way.
    let [ok, code, wce, tv] =
        crate::wire::get_fields(raw, ["ok", "code", "writeConcernError", "topologyVersion"]);
    let ok = match ok {
        Ok(Some(RawBsonRef::Double(d))) => d == 1.0,
        Ok(Some(RawBsonRef::Int32(i))) => i == 1,
        Ok(Some(RawBsonRef::Int64(i))) => i == 1,
        Ok(Some(RawBsonRef::Boolean(b))) => b,
        _ => false,
    };
    let code_of = |code: bson::error::Result<Option<RawBsonRef<'_>>>| match code {
        Ok(Some(RawBsonRef::Int32(c))) => Some(c),
        Ok(Some(RawBsonRef::Int64(c))) => i32::try_from(c).ok(),
        Ok(Some(RawBsonRef::Double(c))) => Some(c as i32),
        _ => None,
    };
    let tv = || match tv {
        Ok(Some(RawBsonRef::Document(d))) => Document::try_from(d)
            .ok()
            .and_then(|d| TopologyVersion::from_document(&d)),
        _ => None,
    };
    if !ok {
        let code = code_of(code)?;
        return Some((BatchFailure::Command(code), code, tv()));
    }
    let Ok(Some(RawBsonRef::Document(wce))) = wce else {
        return None;
    };
    let code = code_of(crate::wire::get_field(wce, "code"))?;
    Some((BatchFailure::WriteConcern(code), code, tv()))
}
