//! The embedded shard's command handler, by concern: [`dispatch`] (the order a command goes
//! through, `hello` as a replica-set primary, the `failCommand` failpoint), [`retry`]
//! (retryable-write records), [`versions`] (shard versions), [`latency`] (injected latency and
//! the concurrency cap), [`status`] (`serverStatus` and per-command counters), [`txn`]
//! (multi-document transactions) and [`idle`] (the cursor and session monitor). The data commands themselves are in [`super::commands`].

mod dispatch;
mod idle;
mod latency;
mod retry;
mod snapshot;
mod status;
mod txn;
mod versions;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

pub(super) use crate::sync::lock;
use std::time::Duration;

use bson::{oid::ObjectId, Document};
use tokio::sync::Semaphore;

use super::store::Catalog;
use super::ShardOptions;
use crate::command::{self, hello, ServerState};
use crate::engine::EngineError;

/// How long a cursor may sit unread before the shard drops it, unless configured.
pub use crate::command::cursors::CURSOR_IDLE_TIMEOUT;

pub use crate::command::failpoint::TEST_ONLY_COMMANDS;

pub use idle::{spawn_idle_monitor, MAX_OPEN_CURSORS};
use retry::SessionRecord;
pub use retry::{RetryCtx, StmtOutcome, TxnWriteFailPoint, MAX_SESSIONS, SESSION_IDLE_TIMEOUT};
use status::CommandCount;
pub use txn::{Transactions, TRANSACTION_LIFETIME, TRANSIENT_TRANSACTION_ERROR};

/// What a shard's data is: the catalog, the retryable-write records and the shard versions.
/// One shard owns its own; the members of an embedded replica set share one.
#[derive(Debug, Default, Clone)]
pub struct DataSet {
    catalog: Arc<Mutex<Catalog>>,
    sessions: Arc<Mutex<HashMap<String, SessionRecord>>>,
    versions: Arc<Mutex<HashMap<String, Document>>>,
    transactions: Arc<Mutex<Transactions>>,
    prepare_gate: Arc<tokio::sync::RwLock<()>>,
    snapshots: Arc<Mutex<snapshot::SnapshotHistory>>,
    routing_changes: Arc<super::filtering::RoutingChanges>,
    /// The critical sections and migrations: part of the replicated state, as MongoDB's
    /// `config.collection_critical_sections` is, so a member that becomes primary holds the
    /// critical sections its set entered (made by the first member that starts).
    migrations: Arc<std::sync::OnceLock<Arc<super::migration::Migrations>>>,
}

impl DataSet {
    /// The catalog (to load it before the data set is served).
    pub fn catalog(&self) -> &Arc<Mutex<Catalog>> {
        &self.catalog
    }

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
    pub(in crate::embedded) options: ShardOptions,
    address: Mutex<String>,
    election_id: ObjectId,
    pub(super) catalog: Arc<Mutex<Catalog>>,
    pub(super) cursors: command::cursors::DocumentCursors,
    sessions: Arc<Mutex<HashMap<String, SessionRecord>>>,
    failpoints: crate::command::failpoint::FailPoints,
    pub(in crate::embedded) txn_write_failpoint: TxnWriteFailPoint,
    pub(super) versions: Arc<Mutex<HashMap<String, Document>>>,
    transactions: Arc<Mutex<Transactions>>,
    prepare_gate: Arc<tokio::sync::RwLock<()>>,
    snapshots: Arc<Mutex<snapshot::SnapshotHistory>>,
    member: Option<super::replset::MemberLink>,
    counts: Mutex<BTreeMap<String, CommandCount>>,
    opcounters: Mutex<BTreeMap<&'static str, i64>>,
    latency: Mutex<(Duration, Duration)>,
    slots: Option<Semaphore>,
    filtering: Option<Arc<super::filtering::Filtering>>,
    migrations: Arc<super::migration::Migrations>,
    metadata_file: Option<super::configsvr::MetadataFile>,
    pub(super) drains: Arc<super::remove_shard::Drains>,
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
        let filtering = options.configdb.as_deref().map(|c| {
            Arc::new(super::filtering::Filtering::new(
                c,
                options.internal_security.clone(),
                data.routing_changes.clone(),
            ))
        });
        let migrations = data
            .migrations
            .get_or_init(|| {
                Arc::new(super::migration::Migrations::with_security(
                    options.internal_security.clone(),
                ))
            })
            .clone();
        if options.config_server {
            super::configsvr::seed(&mut lock(&data.catalog));
        }
        ShardService {
            state,
            options,
            address: Mutex::new(String::new()),
            election_id: ObjectId::new(),
            catalog: data.catalog,
            cursors,
            sessions: data.sessions,
            failpoints: Default::default(),
            txn_write_failpoint: TxnWriteFailPoint::default(),
            versions: data.versions,
            transactions: data.transactions,
            prepare_gate: data.prepare_gate,
            snapshots: data.snapshots,
            member,
            counts: Mutex::new(BTreeMap::new()),
            opcounters: Mutex::new(BTreeMap::new()),
            latency: Mutex::new(latency),
            slots,
            filtering,
            migrations,
            metadata_file: None,
            drains: Arc::default(),
        }
    }

    /// A config server keeping its `config.*` documents in `file` (already loaded).
    pub fn with_metadata_file(mut self, file: Option<super::configsvr::MetadataFile>) -> Self {
        self.metadata_file = file;
        self
    }

    /// Writes the config metadata to its file now, if the server keeps one.
    pub fn persist_metadata(&self) -> std::io::Result<()> {
        match &self.metadata_file {
            Some(file) => file.persist(&self.catalog),
            None => Ok(()),
        }
    }

    /// What a shard server's cluster commands need of it; `None` without a config server.
    pub(crate) fn shard_server(&self) -> Option<super::migration::Donor> {
        self.filtering.as_ref().map(|f| self.donor(f))
    }

    pub(super) fn donor(
        &self,
        filtering: &Arc<super::filtering::Filtering>,
    ) -> super::migration::Donor {
        super::migration::Donor {
            catalog: self.catalog.clone(),
            migrations: self.migrations.clone(),
            filtering: filtering.clone(),
            name: self.name().to_string(),
            member: self.member.clone(),
        }
    }

    /// The address the shard listens on (`host:port`).
    pub fn address(&self) -> String {
        lock(&self.address).clone()
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

    /// What `hello` reports about this shard's replica set.
    fn member(&self) -> hello::ReplicaSetMember {
        hello::ReplicaSetMember {
            set_name: self.options.set_name.clone(),
            me: lock(&self.address).clone(),
            election_id: self.election_id,
            last_write: self.state.clock.now(),
        }
    }
}
