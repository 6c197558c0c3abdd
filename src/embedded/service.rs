//! The embedded shard's command handler: dispatch, the `failCommand` failpoint, injected
//! latency and the concurrency cap, `hello` as a replica-set primary, `serverStatus` with
//! per-command counters, shard versions and retryable-write records. The data
//! commands themselves are in [`super::commands`].

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

pub(super) use crate::sync::lock;
use std::time::Duration;

use bson::{doc, oid::ObjectId, Bson, Document};
use tokio::sync::Semaphore;

use super::store::Catalog;
use super::ShardOptions;
use crate::command::{
    self, hello, server_info, BoxFuture, ClientState, CommandRequest, Response, ServerState,
    Service,
};
use crate::engine::EngineError;
use crate::value::compare::values_equal;
use crate::value::error_codes::ErrorCode;

/// Commands that touch data: they pay the injected latency and take a concurrency slot.
const DATA_COMMANDS: &[&str] = &[
    "insert",
    "update",
    "delete",
    "bulkWrite",
    "find",
    "getMore",
    "aggregate",
    "count",
    "distinct",
    "findAndModify",
    "findandmodify",
];

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
struct SessionRecord {
    txn_number: i64,
    statements: HashMap<i32, StmtOutcome>,
    last_used: std::time::Instant,
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

/// How long a cursor may sit unread before the shard drops it, unless configured.
pub use crate::command::cursors::CURSOR_IDLE_TIMEOUT;

/// How often the shard's idle monitor looks for cursors and sessions past their timeout
/// (mongod's `clientCursorMonitorFrequencySecs`, 4 seconds), never less often than a quarter of
/// the cursor timeout.
const IDLE_MONITOR_PERIOD: Duration = Duration::from_secs(4);

/// Starts the task that drops idle cursors and idle sessions' retry records on a timer, as
/// mongod's cursor monitor does, so an abandoned cursor's buffered documents are released
/// without waiting for the cursor table to fill. The task holds the shard weakly and ends with
/// it.
pub fn spawn_idle_monitor(service: &Arc<ShardService>) {
    let weak = Arc::downgrade(service);
    let period = IDLE_MONITOR_PERIOD
        .min(service.options.cursor_timeout / 4)
        .max(Duration::from_millis(10));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(service) = weak.upgrade() else {
                return;
            };
            service.reap_idle();
        }
    });
}

/// Most cursors one shard keeps open; opening one more first reaps idle cursors, then drops
/// the least recently used one.
pub const MAX_OPEN_CURSORS: usize = 10_000;

/// Most sessions with retryable-write records one shard keeps; beyond it a new session is
/// refused with TooManyLogicalSessions (261) once sessions idle for longer than
/// [`SESSION_IDLE_TIMEOUT`] are reaped.
pub const MAX_SESSIONS: usize = 100_000;

/// How long a session's retryable-write records outlive its last use
/// (`logicalSessionTimeoutMinutes`, 30).
pub const SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

pub use crate::command::failpoint::TEST_ONLY_COMMANDS;

/// Largest latency `sluiceSetLatency` accepts, per command or per document.
const MAX_INJECTED_LATENCY_MICROS: i64 = 60_000_000;

/// Per-command counters (`metrics.commands.<name>`).
#[derive(Debug, Default, Clone, Copy)]
struct CommandCount {
    total: i64,
    failed: i64,
}

/// What a shard's data is: the catalog, the retryable-write records and the shard versions.
/// One shard owns its own; the members of an embedded replica set share one.
#[derive(Debug, Default, Clone)]
pub struct DataSet {
    catalog: Arc<Mutex<Catalog>>,
    sessions: Arc<Mutex<HashMap<String, SessionRecord>>>,
    versions: Arc<Mutex<HashMap<String, Document>>>,
}

impl DataSet {
    /// Every document of `db.coll`, in natural order.
    pub fn documents(&self, db: &str, coll: &str) -> Vec<Document> {
        lock(&self.catalog)
            .collection(db, coll)
            .map(|c| c.iter().map(|(_, d)| d.clone()).collect())
            .unwrap_or_default()
    }
}

/// The embedded shard's command handler.
#[derive(Debug)]
pub struct ShardService {
    state: Arc<ServerState>,
    options: ShardOptions,
    address: Mutex<String>,
    election_id: ObjectId,
    pub(super) catalog: Arc<Mutex<Catalog>>,
    pub(super) cursors: command::cursors::DocumentCursors,
    sessions: Arc<Mutex<HashMap<String, SessionRecord>>>,
    failpoints: crate::command::failpoint::FailPoints,
    pub(super) versions: Arc<Mutex<HashMap<String, Document>>>,
    member: Option<super::replset::MemberLink>,
    counts: Mutex<BTreeMap<String, CommandCount>>,
    opcounters: Mutex<BTreeMap<&'static str, i64>>,
    latency: Mutex<(Duration, Duration)>,
    slots: Option<Semaphore>,
    filtering: Option<Arc<super::filtering::Filtering>>,
    migrations: Arc<super::migration::Migrations>,
}

impl ShardService {
    /// A shard with these options.
    pub fn new(state: Arc<ServerState>, options: ShardOptions) -> Self {
        Self::with_data(state, options, DataSet::default(), None)
    }

    /// A shard over `data`; with `member`, a member of an embedded replica set.
    pub fn with_data(
        state: Arc<ServerState>,
        options: ShardOptions,
        data: DataSet,
        member: Option<super::replset::MemberLink>,
    ) -> Self {
        let slots = options.max_concurrency.map(|n| Semaphore::new(n.max(1)));
        let latency = (options.latency_per_command, options.latency_per_document);
        let cursors = command::cursors::DocumentCursors::with_idle_timeout(options.cursor_timeout);
        let filtering = options
            .configdb
            .as_deref()
            .map(|c| Arc::new(super::filtering::Filtering::new(c)));
        ShardService {
            state,
            options,
            address: Mutex::new(String::new()),
            election_id: ObjectId::new(),
            catalog: data.catalog,
            cursors,
            sessions: data.sessions,
            failpoints: Default::default(),
            versions: data.versions,
            member,
            counts: Mutex::new(BTreeMap::new()),
            opcounters: Mutex::new(BTreeMap::new()),
            latency: Mutex::new(latency),
            slots,
            filtering,
            migrations: Arc::default(),
        }
    }

    /// Records the address the shard listens on (for `hello`'s `me`, `hosts`, `primary`).
    pub fn set_address(&self, addr: SocketAddr) {
        *lock(&self.address) = addr.to_string();
    }

    /// Bytes a blocking aggregation stage may hold without `allowDiskUse`.
    pub fn stage_memory(&self) -> usize {
        self.options.stage_memory_bytes
    }

    /// The server's cluster time now (what it stamps writes with).
    pub fn cluster_time(&self) -> bson::Timestamp {
        self.state.clock.now()
    }

    /// The shard's name (its replica set name).
    pub fn name(&self) -> &str {
        &self.options.set_name
    }

    /// `metrics.commands.<name>.total` for one command.
    pub fn command_total(&self, name: &str) -> i64 {
        lock(&self.counts).get(name).map(|c| c.total).unwrap_or(0)
    }

    /// Drops cursors unread for longer than the cursor timeout and sessions' retry records
    /// unused for longer than [`SESSION_IDLE_TIMEOUT`].
    pub fn reap_idle(&self) {
        self.cursors.reap_idle();
        lock(&self.sessions).retain(|_, r| r.last_used.elapsed() < SESSION_IDLE_TIMEOUT);
    }

    /// How long a cursor may sit unread before it is dropped.
    pub fn cursor_timeout(&self) -> Duration {
        self.options.cursor_timeout
    }

    /// Cursors open on this shard.
    pub fn open_cursors(&self) -> usize {
        self.cursors.len()
    }

    /// Documents currently in `db.coll`.
    pub fn count_documents(&self, db: &str, coll: &str) -> usize {
        lock(&self.catalog)
            .collection(db, coll)
            .map(|c| c.len())
            .unwrap_or(0)
    }

    /// Every document of `db.coll`, in natural order (for in-process readers such as the
    /// tests).
    pub fn documents(&self, db: &str, coll: &str) -> Vec<Document> {
        lock(&self.catalog)
            .collection(db, coll)
            .map(|c| c.iter().map(|(_, d)| d.clone()).collect())
            .unwrap_or_default()
    }

    /// Replaces the contents of `db.coll` with `docs` (in-process writers only).
    pub fn set_documents(
        &self,
        db: &str,
        coll: &str,
        docs: Vec<Document>,
    ) -> Result<(), EngineError> {
        let mut fresh = super::store::Collection::new(Document::new());
        let ns = format!("{db}.{coll}");
        for d in docs {
            fresh.insert(&ns, d)?;
        }
        lock(&self.catalog)
            .dbs
            .entry(db.to_string())
            .or_default()
            .insert(coll.to_string(), fresh);
        Ok(())
    }

    pub(super) fn bump_opcounter(&self, name: &'static str, by: i64) {
        *lock(&self.opcounters).entry(name).or_insert(0) += by;
    }

    fn count_command(&self, name: &str, failed: bool) {
        let mut counts = lock(&self.counts);
        let c = counts.entry(name.to_string()).or_default();
        c.total += 1;
        if failed {
            c.failed += 1;
        }
    }

    /// The retryable-write context of a write command, if it carries `lsid` + `txnNumber`.
    /// A `txnNumber` older than the session's newest is refused, as mongod does.
    fn retry_ctx(&self, body: &Document, n: usize) -> Result<Option<RetryCtx>, EngineError> {
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
    pub(super) fn recorded(&self, ctx: &RetryCtx, stmt_id: i32) -> Option<StmtOutcome> {
        let sessions = lock(&self.sessions);
        let rec = sessions.get(&ctx.session)?;
        if rec.txn_number != ctx.txn_number {
            return None;
        }
        rec.statements.get(&stmt_id).cloned()
    }

    /// Records what a statement did.
    pub(super) fn record(&self, ctx: &RetryCtx, stmt_id: i32, outcome: StmtOutcome) {
        let mut sessions = lock(&self.sessions);
        let rec = sessions.entry(ctx.session.clone()).or_default();
        if rec.txn_number == ctx.txn_number {
            rec.statements.insert(stmt_id, outcome);
        }
    }

    /// Checks a versioned request against the version this shard was given for `ns`.
    pub(super) fn check_version(&self, ns: &str, body: &Document) -> Result<(), EngineError> {
        let versions = lock(&self.versions);
        let db = ns.split('.').next().unwrap_or(ns);
        if let (Some(received), Some(wanted)) = (body.get("databaseVersion"), versions.get(db)) {
            if !values_equal(received, &Bson::Document(wanted.clone())) {
                return Err(EngineError::new(
                    ErrorCode::StaleDbVersion,
                    format!("version mismatch detected for {db}"),
                )
                .with_extra(doc! {
                    "db": db,
                    "vReceived": received.clone(),
                    "vWanted": wanted.clone(),
                }));
            }
        }
        let Some(received) = body.get("shardVersion") else {
            return Ok(());
        };
        let Some(wanted) = versions.get(ns) else {
            return Ok(());
        };
        if values_equal(received, &Bson::Document(wanted.clone())) {
            return Ok(());
        }
        Err(super::filtering::stale_config(
            ns,
            received,
            wanted.clone(),
            &self.options.set_name,
        ))
    }

    /// What `hello` reports about this shard's replica set.
    fn member(&self) -> hello::ReplicaSetMember {
        hello::ReplicaSetMember {
            set_name: self.options.set_name.clone(),
            me: lock(&self.address).clone(),
            election_id: self.election_id,
            last_write: self.state.clock.now(),
        }
    }

    fn server_status(&self) -> Document {
        let mut d = server_info::server_status(&self.state);
        d.insert("process", "mongod");
        let repl = match &self.member {
            Some(m) => m.repl_status(),
            None => doc! {"setName": &self.options.set_name, "isWritablePrimary": true},
        };
        d.insert("repl", repl);
        let mut commands = Document::new();
        for (name, c) in lock(&self.counts).iter() {
            commands.insert(name.clone(), doc! {"failed": c.failed, "total": c.total});
        }
        let mut ops = doc! {"insert": 0i64, "query": 0i64, "update": 0i64, "delete": 0i64, "getmore": 0i64, "command": 0i64};
        for (k, v) in lock(&self.opcounters).iter() {
            ops.insert(*k, *v);
        }
        d.insert("opcounters", ops);
        d.insert("metrics", doc! {"commands": commands});
        d
    }

    async fn run(
        &self,
        client: &mut ClientState,
        req: &CommandRequest,
    ) -> Result<Option<Document>, EngineError> {
        let name = req.name.as_str();
        if TEST_ONLY_COMMANDS.contains(&name) && !self.options.enable_test_commands {
            return Err(EngineError::new(
                ErrorCode::CommandNotFound,
                format!("no such command: '{name}'"),
            ));
        }
        let body = req.body_document();
        let failpoint = if name == "configureFailPoint" {
            None
        } else {
            self.failpoints.fire(client, name)
        };
        if let Some(fp) = &failpoint {
            if let Some(block) = fp.block {
                tokio::time::sleep(block).await;
            }
            if fp.close_connection {
                return Ok(None);
            }
            if let Some(e) = fp.error(name, &body) {
                let mut err = EngineError::new(e.code, e.message);
                if !e.labels.is_empty() {
                    err = err.with_extra(doc! {"errorLabels": e.labels});
                }
                return Err(err);
            }
        }

        if let Some(member) = &self.member {
            member.check(name, &body)?;
        }
        if self.options.config_server {
            match name {
                "_configsvrMoveRange" => {
                    check_admin(req)?;
                    return self
                        .migrations
                        .configsvr_move_range(&self.catalog, &body)
                        .await
                        .map(Some);
                }
                "_configsvrCommitChunkMigration" => {
                    check_admin(req)?;
                    return super::migration::commit_chunk_migration(
                        &self.catalog,
                        &body,
                        self.cluster_time(),
                    )
                    .map(Some);
                }
                _ => {}
            }
        }
        // Held while a versioned request runs, so no critical section begins under it.
        let mut _versioned = None;
        if let Some(filtering) = &self.filtering {
            match name {
                "_flushRoutingTableCacheUpdates" | "_flushDatabaseCacheUpdates" => {
                    return filtering.flush(name, &body).await.map(Some);
                }
                "_shardsvrMoveRange" => {
                    check_admin(req)?;
                    let donor = super::migration::Donor {
                        catalog: self.catalog.clone(),
                        migrations: self.migrations.clone(),
                        filtering: filtering.clone(),
                        name: self.name().to_string(),
                    };
                    return super::migration::move_range(donor, body).await.map(Some);
                }
                _ if super::cluster_ddl::COMMANDS.contains(&name) => {
                    let shard = super::migration::Donor {
                        catalog: self.catalog.clone(),
                        migrations: self.migrations.clone(),
                        filtering: filtering.clone(),
                        name: self.name().to_string(),
                    };
                    return super::cluster_ddl::run(shard, req, body).await.map(Some);
                }
                "_recvChunkStart" => {
                    check_admin(req)?;
                    return self.migrations.recv_start(&body).map(Some);
                }
                "_sluiceRecvChunkMods" => {
                    check_admin(req)?;
                    return self.migrations.recv_mods(&body).map(Some);
                }
                "_recvChunkCommit" => {
                    check_admin(req)?;
                    return self
                        .migrations
                        .recv_commit(&self.catalog, &body)
                        .await
                        .map(Some);
                }
                "_recvChunkAbort" => {
                    check_admin(req)?;
                    return self.migrations.recv_abort(&self.catalog, &body).map(Some);
                }
                "_recvChunkReleaseCritSec" => {
                    check_admin(req)?;
                    return self
                        .migrations
                        .recv_release(filtering, &body)
                        .await
                        .map(Some);
                }
                _ => {}
            }
            if let Some(ns) = req.namespace.as_deref() {
                if body.contains_key("shardVersion") || body.contains_key("databaseVersion") {
                    _versioned = Some(self.migrations.enter(ns).await);
                }
                if let Err(e) = filtering.check(self.name(), ns, &body).await {
                    // Writes report it as the first statement's error, as mongod does.
                    if matches!(name, "insert" | "update" | "delete") {
                        return Ok(Some(super::commands::stale_write_reply(
                            e,
                            name == "update",
                        )));
                    }
                    return Err(e);
                }
            }
        }

        let _slot = if DATA_COMMANDS.contains(&name) {
            let permit = match &self.slots {
                Some(s) => s.acquire().await.ok(),
                None => None,
            };
            let (per_cmd, per_doc) = *lock(&self.latency);
            let docs = super::commands::statement_count(req) as u32;
            let delay = per_cmd + per_doc * docs;
            if !delay.is_zero() {
                precise_sleep(delay).await;
            }
            permit
        } else {
            None
        };

        if body
            .get("startTransaction")
            .is_some_and(crate::value::field::truthy)
            || matches!(body.get("autocommit"), Some(Bson::Boolean(false)))
            || matches!(name, "commitTransaction" | "abortTransaction")
        {
            return Err(EngineError::new(
                ErrorCode::IllegalOperation,
                "Transactions are not supported by the embedded shard (it is a test and demo backend); real mongod shards run them",
            ));
        }
        let mut reply = match name {
            "hello" | "isMaster" | "ismaster" => {
                if let Some(link) = &self.member {
                    link.await_change(&body, self.state.shutdown_signal()).await;
                }
                let member = self.member();
                let mut d =
                    hello::hello(&self.state, client, req, hello::Role::Primary(&member)).await?;
                if let Some(link) = &self.member {
                    link.hello_fields(name, &mut d);
                }
                if self.options.config_server {
                    // mongod started with `--configsvr` (`ClusterRole::ConfigServer`).
                    d.insert("configsvr", 2);
                }
                d
            }
            "ping" => Document::new(),
            "buildInfo" | "buildinfo" => {
                let mut b = server_info::build_info();
                b.insert("storageEngines", vec!["memory"]);
                b
            }
            "serverStatus" => self.server_status(),
            "getParameter" => server_info::get_parameter(
                req,
                &server_info::Parameters {
                    enable_test_commands: self.options.enable_test_commands,
                    stage_memory_bytes: self.options.stage_memory_bytes,
                },
            )?,
            "getLog" => server_info::get_log(req)?,
            "whatsmyuri" => doc! {"you": client.peer.to_string()},
            "connectionStatus" => server_info::connection_status(req),
            "endSessions" => server_info::end_sessions(req)?,
            // The shard's sessions hold only retryable-write history, which outlives a kill.
            "killAllSessions" | "killAllSessionsByPattern" | "killSessions" => Document::new(),
            "getCmdLineOpts" => server_info::get_cmd_line_opts(&self.state),
            "configureFailPoint" => self.failpoints.configure(&body)?,
            "sluiceSetShardVersion" => self.set_shard_version(&body)?,
            _ if self.options.config_server && super::configsvr::serves(name) => {
                super::configsvr::run(self, req, &body)?
            }
            "sluiceSetLatency" => self.set_latency(&body)?,
            "replSetStepDown" | "replSetFreeze" | "replSetGetStatus" if self.member.is_some() => {
                let member = self.member.as_ref().ok_or_else(|| {
                    EngineError::new(ErrorCode::InternalError, "not a replica set member")
                })?;
                if req.db != "admin" {
                    return Err(EngineError::new(
                        ErrorCode::Unauthorized,
                        format!("{name} may only be run against the admin database."),
                    ));
                }
                match name {
                    "replSetStepDown" => member.step_down(&body)?,
                    "replSetFreeze" => member.freeze(&body)?,
                    _ => member.status(),
                }
            }
            _ => {
                let retry = if matches!(
                    name,
                    "insert"
                        | "update"
                        | "delete"
                        | "bulkWrite"
                        | "findAndModify"
                        | "findandmodify"
                ) {
                    let n = super::commands::statement_count(req);
                    self.retry_ctx(&body, n)?
                } else {
                    None
                };
                let reply = super::commands::run(self, req, &body, retry.as_ref())?;
                if let Some(member) = &self.member {
                    if super::replset::is_write(name) {
                        match member.take_after_write() {
                            Some(super::replset::AfterWrite::CloseConnection) => return Ok(None),
                            Some(super::replset::AfterWrite::StepDown) => {
                                member.step_down_now(Duration::from_secs(10));
                                return Err(EngineError::new(
                                    ErrorCode::InterruptedDueToReplStateChange,
                                    "operation was interrupted because a replica set state change occurred",
                                ));
                            }
                            None => {}
                        }
                    }
                }
                reply
            }
        };
        if let Some(fp) = &failpoint {
            fp.decorate(name, &body, &mut reply);
        }
        Ok(Some(reply))
    }

    fn set_shard_version(&self, body: &Document) -> Result<Document, EngineError> {
        let ns = body.get_str("sluiceSetShardVersion").map_err(|_| {
            EngineError::new(
                ErrorCode::TypeMismatch,
                "sluiceSetShardVersion takes a namespace string",
            )
        })?;
        // `{sluiceSetShardVersion: "db", databaseVersion: {uuid, timestamp, lastMod}}`: the
        // database version this shard checks `databaseVersion` against.
        let field = if ns.contains('.') {
            "shardVersion"
        } else {
            "databaseVersion"
        };
        match body.get(field) {
            Some(Bson::Document(v)) => {
                lock(&self.versions).insert(ns.to_string(), v.clone());
            }
            Some(Bson::Null) | None => {
                lock(&self.versions).remove(ns);
            }
            Some(_) => {
                return Err(EngineError::new(
                    ErrorCode::TypeMismatch,
                    "shardVersion must be a document {e, t, v}",
                ))
            }
        }
        Ok(Document::new())
    }

    fn set_latency(&self, body: &Document) -> Result<Document, EngineError> {
        let micros = |field: &str| {
            let v = crate::value::field::number_field(body, field).unwrap_or(0);
            if !(0..=MAX_INJECTED_LATENCY_MICROS).contains(&v) {
                return Err(EngineError::new(
                    ErrorCode::BadValue,
                    format!("{field} must be between 0 and {MAX_INJECTED_LATENCY_MICROS}"),
                ));
            }
            Ok(v as u64)
        };
        let per_cmd = micros("perCommandMicros")?;
        let per_doc = micros("perDocumentMicros")?;
        *lock(&self.latency) = (
            Duration::from_micros(per_cmd),
            Duration::from_micros(per_doc),
        );
        Ok(Document::new())
    }
}

/// Internal commands run on `admin` only.
fn check_admin(req: &CommandRequest) -> Result<(), EngineError> {
    if req.db != "admin" {
        return Err(EngineError::new(
            ErrorCode::Unauthorized,
            format!("{} may only be run against the admin database.", req.name),
        ));
    }
    Ok(())
}

/// The key of a session's records: its `lsid.id`, a UUID ([`command::session_id`]), in hex.
fn session_key(lsid: &Document) -> Result<String, EngineError> {
    let id = command::session_id(lsid)?;
    Ok(id.iter().map(|x| format!("{x:02x}")).collect())
}

/// Labels a replica-set member's error `RetryableWriteError` when the command is a retryable
/// write (or a commit or abort) and the code is in the RetriableError category, as mongod does
/// for its clients, so a driver connected to the set retries a write refused by a member that
/// stepped down.
fn label_retryable_write_error(e: &mut EngineError, name: &str, body: &Document) {
    if !crate::command::failpoint::is_retryable_command(name, body)
        || !crate::backend::topology::retry::is_retriable_code(e.code.0)
    {
        return;
    }
    let mut extra = e.extra.take().unwrap_or_default();
    if !extra.contains_key("errorLabels") {
        extra.insert(
            "errorLabels",
            vec![crate::backend::topology::retry::RETRYABLE_WRITE_ERROR],
        );
    }
    e.extra = Some(extra);
}

/// Waits `delay` with the precision of the OS's sleep (tens of microseconds) rather than the
/// async timer's millisecond ticks, which would add up to a millisecond to every injected
/// latency and distort the modelled round trips; the wait runs on the blocking pool.
async fn precise_sleep(delay: Duration) {
    if tokio::task::spawn_blocking(move || std::thread::sleep(delay))
        .await
        .is_err()
    {
        tokio::time::sleep(delay).await;
    }
}

impl Service for ShardService {
    fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    fn handle<'a>(
        &'a self,
        client: &'a mut ClientState,
        req: &'a CommandRequest,
    ) -> BoxFuture<'a, Response> {
        Box::pin(async move {
            let mut result = self.run(client, req).await;
            if let (Err(e), Some(_)) = (&mut result, &self.member) {
                label_retryable_write_error(e, &req.name, &req.body_document());
            }
            let mut reply = match result {
                Ok(None) => {
                    self.count_command(&req.name, true);
                    return Response::CloseConnection;
                }
                Ok(Some(mut d)) => {
                    self.count_command(&req.name, false);
                    d.insert("ok", 1.0);
                    d
                }
                Err(e) => {
                    self.count_command(&req.name, true);
                    e.to_reply()
                }
            };
            command::append_cluster_time(&self.state, &mut reply);
            Response::Reply(reply)
        })
    }
}
