//! The catalog cache: databases, collections and the shard list, read from the config server on
//! first use and refreshed on demand, never more than once at a time per key.
//!
//! **Slots.** Each key (a database, a namespace, the shard list) has a slot: the last value read,
//! the demand it must meet (`at least version v`, or `forced`: whatever is cached is suspect) and
//! the refresh in flight. A lookup whose slot has a value and no demand returns at once. Otherwise
//! the first lookup starts the refresh as a task of its own (a cancelled request cannot strand the
//! others) and every lookup of the key waits for the same result on a `watch` channel.
//!
//! **Demands during a refresh.** A stale error that arrives while a refresh is in flight only
//! records its demand; the running refresh checks, when it finishes, whether its result meets every
//! demand that arrived meanwhile, and reads again if not (a bounded number of rounds) before
//! publishing. So N requests that meet one stale collection cause one read of the config server.
//!
//! **Failures.** A failed refresh keeps the previous value and the demand; its waiters get the
//! error and the next lookup tries again. Nothing is ever routed on a guess.
//!
//! **Reads.** A collection refresh reads incrementally from the cached collection version when it
//! holds the same generation, and fully otherwise; a read that does not fit (inconsistent,
//! `ConflictingOperationInProgress`) or a transient failure is retried, the retries as full reads.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::Document;
use tokio::sync::watch;

use crate::backend::topology::Printer;
use crate::sync::lock;
use crate::value::error_codes::ErrorCode;

use super::collection::{CollectionRouting, RefreshOutcome};
use super::documents::{ChunkEntry, CollectionEntry, DatabaseEntry, ShardEntry};
use super::error::MetadataError;
use super::request::{DatabaseRouting, RoutingInfo};
use super::stale::{collection_needs_refresh, database_needs_refresh, RefreshAction};
use super::version::{DatabaseVersion, ShardVersion};
pub use crate::metadata::source::{BoxFuture, CollectionRead, MetadataSource, Since};

/// How hard a refresh tries.
#[derive(Debug, Clone, Copy)]
pub struct RefreshPolicy {
    /// Reads per refresh when a read is inconsistent or fails transiently (mongos: 3).
    pub attempts: u32,
    /// Pause before a retried read, multiplied by the attempt number.
    pub backoff: Duration,
    /// Refresh rounds when demands arrive during a refresh or the config server is behind the
    /// version a shard wanted.
    pub rounds: u32,
}

impl Default for RefreshPolicy {
    fn default() -> Self {
        RefreshPolicy {
            attempts: 3,
            backoff: Duration::from_millis(20),
            rounds: 3,
        }
    }
}

/// The shard list of one read of `config.shards`.
#[derive(Debug, Clone, Default)]
pub struct ShardRegistry {
    shards: BTreeMap<String, ShardEntry>,
    invalid: Vec<(Option<String>, MetadataError)>,
}

impl ShardRegistry {
    fn from_documents(docs: &[Document], printer: &Printer) -> Self {
        let mut reg = ShardRegistry::default();
        for d in docs {
            match ShardEntry::from_document(d, printer) {
                Ok(s) => {
                    reg.shards.insert(s.id.clone(), s);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "config.shards document ignored");
                    reg.invalid
                        .push((d.get_str("_id").ok().map(str::to_string), e));
                }
            }
        }
        reg
    }

    /// The shard with this id.
    pub fn get(&self, id: &str) -> Option<&ShardEntry> {
        self.shards.get(id)
    }

    /// Every valid shard, by id.
    pub fn shards(&self) -> impl Iterator<Item = &ShardEntry> {
        self.shards.values()
    }

    /// The parse error of the shard document with this id, if it was malformed.
    pub fn error_for(&self, id: &str) -> Option<&MetadataError> {
        self.invalid
            .iter()
            .find(|(i, _)| i.as_deref() == Some(id))
            .map(|(_, e)| e)
    }
}

/// Counters of the cache's work.
#[derive(Debug, Default)]
struct Counters {
    collection_reads: AtomicU64,
    full: AtomicU64,
    incremental: AtomicU64,
    unchanged: AtomicU64,
    failed: AtomicU64,
    joined: AtomicU64,
    database_reads: AtomicU64,
    shard_reads: AtomicU64,
}

/// A snapshot of the cache's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Reads of a collection and its chunks from the config server.
    pub collection_reads: u64,
    /// Collection refreshes that built the routing from all chunks.
    pub full: u64,
    /// Collection refreshes that applied changed chunks to the cached routing.
    pub incremental: u64,
    /// Collection refreshes that found nothing changed.
    pub unchanged: u64,
    /// Refreshes (of any key) that failed.
    pub failed: u64,
    /// Lookups that waited for a refresh another lookup had started.
    pub joined: u64,
    /// Reads of a `config.databases` entry.
    pub database_reads: u64,
    /// Reads of `config.shards`.
    pub shard_reads: u64,
}

type Published<V> = Option<Result<V, MetadataError>>;

struct SlotState<V, W> {
    value: Option<V>,
    seq: u64,
    forced_at: Option<u64>,
    at_least: Option<W>,
    inflight: Option<watch::Receiver<Published<V>>>,
}

/// One key's cached value, demand and refresh in flight.
struct Slot<V, W> {
    state: Mutex<SlotState<V, W>>,
}

impl<V, W> Slot<V, W> {
    fn new() -> Self {
        Slot {
            state: Mutex::new(SlotState {
                value: None,
                seq: 0,
                forced_at: None,
                at_least: None,
                inflight: None,
            }),
        }
    }
}

/// How a slot's value is compared with a wanted version.
type Satisfies<V, W> = fn(&V, &W) -> bool;

/// A refresh of one key: from the cached value (if any) to a new one.
type RefreshFn<V> =
    Box<dyn FnMut(Option<V>) -> BoxFuture<'static, Result<V, MetadataError>> + Send>;

/// Publishes a refresh's result to its waiters and clears the slot's in-flight marker; if the
/// refresh task ends without a result (a panic), its drop does both with an error, so nobody
/// waits on a dead refresh and the next lookup starts a new one.
struct Publisher<V, W> {
    slot: Arc<Slot<V, W>>,
    tx: Option<watch::Sender<Published<V>>>,
}

impl<V, W> Publisher<V, W> {
    /// Publishes with the slot already locked by the caller.
    fn publish(&mut self, st: &mut SlotState<V, W>, result: Result<V, MetadataError>) {
        st.inflight = None;
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Some(result));
        }
    }
}

impl<V, W> Drop for Publisher<V, W> {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            lock(&self.slot.state).inflight = None;
            let _ = tx.send(Some(Err(refresh_lost())));
        }
    }
}

impl<V, W> Slot<V, W>
where
    V: Clone + Send + Sync + 'static,
    W: Clone + Send + Sync + 'static,
{
    /// The value, refreshed first if a demand is pending or nothing is cached.
    async fn get(
        self: &Arc<Self>,
        satisfies: Satisfies<V, W>,
        policy: RefreshPolicy,
        counters: &Counters,
        refresh: impl FnOnce() -> RefreshFn<V>,
    ) -> Result<V, MetadataError> {
        let rx = {
            let mut st = lock(&self.state);
            if let Some(v) = &st.value {
                let at_least_met = st.at_least.as_ref().is_none_or(|w| satisfies(v, w));
                if st.forced_at.is_none() && at_least_met {
                    return Ok(v.clone());
                }
            }
            let live = st
                .inflight
                .as_ref()
                .filter(|rx| rx.has_changed().is_ok())
                .cloned();
            match live {
                Some(rx) => {
                    counters.joined.fetch_add(1, Ordering::Relaxed);
                    rx
                }
                None => {
                    let (tx, rx) = watch::channel(None);
                    st.inflight = Some(rx.clone());
                    let slot = self.clone();
                    tokio::spawn(slot.run(tx, satisfies, policy, refresh()));
                    rx
                }
            }
        };
        wait(rx).await
    }

    async fn run(
        self: Arc<Self>,
        tx: watch::Sender<Published<V>>,
        satisfies: Satisfies<V, W>,
        policy: RefreshPolicy,
        mut refresh: RefreshFn<V>,
    ) {
        let mut publisher = Publisher {
            slot: self.clone(),
            tx: Some(tx),
        };
        let mut round = 0;
        loop {
            round += 1;
            let (base, started) = {
                let st = lock(&self.state);
                (st.value.clone(), st.seq)
            };
            let result = refresh(base).await;
            // `Some(pause)`: read again (after the pause); `None`: publish.
            let again: Option<bool> = {
                let mut st = lock(&self.state);
                let mut again = None;
                if let Ok(v) = &result {
                    st.value = Some(v.clone());
                    if st.forced_at.is_some_and(|f| f <= started) {
                        st.forced_at = None;
                    }
                    if st.at_least.as_ref().is_some_and(|w| satisfies(v, w)) {
                        st.at_least = None;
                    }
                    let pending = st.forced_at.is_some() || st.at_least.is_some();
                    if pending && round < policy.rounds {
                        // A forced demand that arrived meanwhile reads again at once; a wanted
                        // version the config server did not have yet is given a moment.
                        again = Some(st.forced_at.is_none());
                    } else {
                        // Given up for now: the next stale error sets the demand again.
                        st.forced_at = None;
                        st.at_least = None;
                    }
                }
                if again.is_none() {
                    publisher.publish(&mut st, result.clone());
                }
                again
            };
            match again {
                Some(true) => tokio::time::sleep(policy.backoff * round).await,
                Some(false) => {}
                None => return,
            }
        }
    }

    /// Records a demand; `needs` decides from the cached value whether there is one.
    fn demand(
        &self,
        wanted: Option<W>,
        needs: impl FnOnce(Option<&V>, Option<&W>) -> bool,
        newer: fn(&W, &W) -> bool,
    ) {
        let mut st = lock(&self.state);
        if !needs(st.value.as_ref(), wanted.as_ref()) {
            return;
        }
        st.seq += 1;
        match wanted {
            None => st.forced_at = Some(st.seq),
            Some(w) => {
                let replace = st.at_least.as_ref().is_none_or(|old| newer(&w, old));
                if replace {
                    st.at_least = Some(w);
                }
            }
        }
    }
}

async fn wait<V: Clone>(mut rx: watch::Receiver<Published<V>>) -> Result<V, MetadataError> {
    match rx.wait_for(|p| p.is_some()).await {
        Ok(p) => match &*p {
            Some(r) => r.clone(),
            None => Err(refresh_lost()),
        },
        Err(_) => Err(refresh_lost()),
    }
}

fn refresh_lost() -> MetadataError {
    MetadataError::new(
        ErrorCode::InternalError,
        "the routing refresh ended without a result",
    )
}

type CollectionValue = Option<Arc<CollectionRouting>>;
type DatabaseValue = Option<Arc<DatabaseEntry>>;

fn collection_version(v: &CollectionValue) -> ShardVersion {
    v.as_ref()
        .map(|c| c.version())
        .unwrap_or_else(ShardVersion::unsharded)
}

fn collection_satisfies(v: &CollectionValue, w: &ShardVersion) -> bool {
    !w.is_newer_than(&collection_version(v))
}

fn database_satisfies(v: &DatabaseValue, w: &DatabaseVersion) -> bool {
    v.as_ref().is_some_and(|d| !w.is_newer_than(&d.version))
}

fn never(_: &Arc<ShardRegistry>, _: &()) -> bool {
    false
}

struct Inner {
    source: Arc<dyn MetadataSource>,
    printer: Printer,
    policy: RefreshPolicy,
    counters: Counters,
    shards: Arc<Slot<Arc<ShardRegistry>, ()>>,
    databases: Mutex<HashMap<String, Arc<Slot<DatabaseValue, DatabaseVersion>>>>,
    collections: Mutex<HashMap<String, Arc<Slot<CollectionValue, ShardVersion>>>>,
}

/// The router's cache of the cluster's routing metadata, read from the config server.
#[derive(Clone)]
pub struct CatalogCache {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CatalogCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogCache")
            .field("stats", &self.stats())
            .finish()
    }
}

impl CatalogCache {
    /// An empty cache over `source`; `printer` renders values in error messages.
    pub fn new(source: Arc<dyn MetadataSource>, printer: Printer) -> Self {
        Self::with_policy(source, printer, RefreshPolicy::default())
    }

    /// An empty cache with an explicit refresh policy.
    pub fn with_policy(
        source: Arc<dyn MetadataSource>,
        printer: Printer,
        policy: RefreshPolicy,
    ) -> Self {
        CatalogCache {
            inner: Arc::new(Inner {
                source,
                printer,
                policy,
                counters: Counters::default(),
                shards: Arc::new(Slot::new()),
                databases: Mutex::new(HashMap::new()),
                collections: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The shard list, loaded on first use.
    pub async fn shards(&self) -> Result<Arc<ShardRegistry>, MetadataError> {
        self.inner.clone().shards().await
    }

    /// One shard; an id the cached list lacks reloads the list once (a shard added since).
    pub async fn shard(&self, id: &str) -> Result<ShardEntry, MetadataError> {
        self.inner.clone().shard(id).await
    }

    /// Where `db` lives: `None` if it does not exist.
    pub async fn database(&self, db: &str) -> Result<Option<DatabaseRouting>, MetadataError> {
        if DatabaseRouting::is_fixed_name(db) {
            return Ok(Some(DatabaseRouting::Fixed));
        }
        Ok(self
            .inner
            .clone()
            .database(db)
            .await?
            .map(DatabaseRouting::Tracked))
    }

    /// The routing of `ns`: its database and, when tracked, its collection routing. A
    /// database that does not exist is `NamespaceNotFound`, as in mongos.
    pub async fn routing_info(&self, ns: &str) -> Result<RoutingInfo, MetadataError> {
        let db = match ns.split_once('.') {
            Some((db, coll)) if !db.is_empty() && !coll.is_empty() => db,
            _ => {
                return Err(MetadataError::new(
                    ErrorCode::InvalidNamespace,
                    format!("Invalid namespace specified '{ns}'"),
                ))
            }
        };
        let Some(database) = self.database(db).await? else {
            self.flush_collection(ns);
            return Err(MetadataError::new(
                ErrorCode::NamespaceNotFound,
                format!("database {db} not found"),
            ));
        };
        let collection = self.inner.clone().collection(ns).await?;
        Ok(RoutingInfo {
            ns: ns.to_string(),
            db: database,
            collection,
        })
    }

    /// A stale error about `ns` wanted `wanted` (`None`: refresh whatever is cached).
    pub fn on_stale_collection(&self, ns: &str, wanted: Option<ShardVersion>) {
        let slot = lock(&self.inner.collections).get(ns).cloned();
        if let Some(slot) = slot {
            slot.demand(
                wanted,
                |v, w| collection_needs_refresh(v.map(collection_version).as_ref(), w),
                |a, b| a.is_newer_than(b),
            );
        }
    }

    /// A stale error about `db` wanted `wanted` (`None`: refresh whatever is cached).
    pub fn on_stale_database(&self, db: &str, wanted: Option<DatabaseVersion>) {
        let slot = lock(&self.inner.databases).get(db).cloned();
        if let Some(slot) = slot {
            slot.demand(
                wanted,
                |v, w| database_needs_refresh(v.and_then(|d| d.as_ref()).map(|d| &d.version), w),
                |a, b| a.is_newer_than(b),
            );
        }
    }

    /// Applies what a stale error asked for.
    pub fn apply(&self, action: &RefreshAction) {
        match action {
            RefreshAction::Collection { ns, at_least } => self.on_stale_collection(ns, *at_least),
            RefreshAction::Database { db, at_least } => self.on_stale_database(db, *at_least),
        }
    }

    /// `flushRouterConfig` with no argument: forgets everything; the next use reloads.
    pub fn flush_all(&self) {
        lock(&self.inner.databases).clear();
        lock(&self.inner.collections).clear();
        self.inner.shards.demand(None, |_, _| true, |_, _| false);
    }

    /// Forgets the shard list (a shard was added); the next use reads `config.shards` again.
    pub fn flush_shards(&self) {
        self.inner.shards.demand(None, |_, _| true, |_, _| false);
    }

    /// `flushRouterConfig: "db"` (and `dropDatabase`): forgets the database and its collections.
    pub fn flush_database(&self, db: &str) {
        lock(&self.inner.databases).remove(db);
        let prefix = format!("{db}.");
        lock(&self.inner.collections).retain(|ns, _| !ns.starts_with(&prefix));
    }

    /// `flushRouterConfig: "db.coll"`: forgets the collection.
    pub fn flush_collection(&self, ns: &str) {
        lock(&self.inner.collections).remove(ns);
    }

    /// The collection version cached for `ns`, without loading anything: `None` when nothing
    /// is cached, UNSHARDED for an untracked collection.
    pub fn cached_version(&self, ns: &str) -> Option<ShardVersion> {
        let slot = lock(&self.inner.collections).get(ns).cloned()?;
        let st = lock(&slot.state);
        st.value.as_ref().map(collection_version)
    }

    /// The counters.
    pub fn stats(&self) -> CacheStats {
        let c = &self.inner.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CacheStats {
            collection_reads: l(&c.collection_reads),
            full: l(&c.full),
            incremental: l(&c.incremental),
            unchanged: l(&c.unchanged),
            failed: l(&c.failed),
            joined: l(&c.joined),
            database_reads: l(&c.database_reads),
            shard_reads: l(&c.shard_reads),
        }
    }
}

impl Inner {
    async fn shards(self: Arc<Self>) -> Result<Arc<ShardRegistry>, MetadataError> {
        let this = self.clone();
        self.shards
            .get(never, self.policy, &self.counters, move || {
                Box::new(move |_base| {
                    let this = this.clone();
                    Box::pin(async move { this.read_shards().await })
                })
            })
            .await
    }

    async fn read_shards(&self) -> Result<Arc<ShardRegistry>, MetadataError> {
        let docs = self
            .with_retries(|| {
                self.counters.shard_reads.fetch_add(1, Ordering::Relaxed);
                self.source.shards()
            })
            .await?;
        Ok(Arc::new(ShardRegistry::from_documents(
            &docs,
            &self.printer,
        )))
    }

    async fn shard(self: Arc<Self>, id: &str) -> Result<ShardEntry, MetadataError> {
        let reg = self.clone().shards().await?;
        if let Some(s) = reg.get(id) {
            return Ok(s.clone());
        }
        self.shards.demand(None, |_, _| true, |_, _| false);
        let reg = self.clone().shards().await?;
        if let Some(s) = reg.get(id) {
            return Ok(s.clone());
        }
        if let Some(e) = reg.error_for(id) {
            return Err(e.clone());
        }
        Err(MetadataError::new(
            ErrorCode::ShardNotFound,
            format!("Shard {id} not found"),
        ))
    }

    async fn database(self: Arc<Self>, db: &str) -> Result<DatabaseValue, MetadataError> {
        let slot = lock(&self.databases)
            .entry(db.to_string())
            .or_insert_with(|| Arc::new(Slot::new()))
            .clone();
        let this = self.clone();
        let name = db.to_string();
        slot.get(database_satisfies, self.policy, &self.counters, move || {
            Box::new(move |_base| {
                let this = this.clone();
                let name = name.clone();
                Box::pin(async move { this.read_database(&name).await })
            })
        })
        .await
    }

    async fn read_database(self: Arc<Self>, db: &str) -> Result<DatabaseValue, MetadataError> {
        let read = self
            .with_retries(|| {
                self.counters.database_reads.fetch_add(1, Ordering::Relaxed);
                self.source.database(db)
            })
            .await;
        let doc = match read {
            Ok(Some(doc)) => doc,
            Ok(None) => return Ok(None),
            Err(e) => {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        let checked = async {
            let entry = DatabaseEntry::from_document(&doc, &self.printer)?;
            self.clone().shard(&entry.primary).await.map_err(|e| {
                e.context(format!(
                    "The primary shard for database {db} does not exist"
                ))
            })?;
            Ok(Some(Arc::new(entry)))
        }
        .await;
        if checked.is_err() {
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
        }
        checked
    }

    fn collection_slot(&self, ns: &str) -> Arc<Slot<CollectionValue, ShardVersion>> {
        let mut map = lock(&self.collections);
        if let Some(s) = map.get(ns) {
            return s.clone();
        }
        if map.len() >= crate::routing::table::MAX_UNSHARDED_ENTRIES {
            map.retain(|_, slot| {
                let st = lock(&slot.state);
                st.inflight.is_some() || !matches!(st.value, Some(None))
            });
        }
        map.entry(ns.to_string())
            .or_insert_with(|| Arc::new(Slot::new()))
            .clone()
    }

    async fn collection(self: Arc<Self>, ns: &str) -> Result<CollectionValue, MetadataError> {
        let slot = self.collection_slot(ns);
        let this = self.clone();
        let name = ns.to_string();
        slot.get(
            collection_satisfies,
            self.policy,
            &self.counters,
            move || {
                Box::new(move |base| {
                    let this = this.clone();
                    let name = name.clone();
                    Box::pin(async move { this.refresh_collection(&name, base).await })
                })
            },
        )
        .await
    }

    /// One collection refresh: incremental from `base` when it is tracked, full otherwise and
    /// on every retry.
    async fn refresh_collection(
        self: Arc<Self>,
        ns: &str,
        base: Option<CollectionValue>,
    ) -> Result<CollectionValue, MetadataError> {
        let base = base.flatten();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let since = base.as_ref().filter(|_| attempt == 1).map(|b| Since {
                generation: b.entry.generation,
                version: b.collection_version,
            });
            self.counters
                .collection_reads
                .fetch_add(1, Ordering::Relaxed);
            metrics::counter!("sluice_routing_refreshes_total").increment(1);
            let result = match self.source.collection(ns, since).await {
                Ok(None) => Ok(None),
                Ok(Some(read)) => self.clone().build_collection(ns, base.as_ref(), read).await,
                Err(e) => Err(e),
            };
            match result {
                Err(e) if e.is_transient() && attempt < self.policy.attempts => {
                    tracing::debug!(ns, attempt, error = %e, "routing refresh read again");
                    tokio::time::sleep(self.policy.backoff * attempt).await;
                }
                Err(e) => {
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(ns, error = %e, "routing refresh failed; the previous routing is kept");
                    return Err(e);
                }
                Ok(v) => return Ok(v),
            }
        }
    }

    async fn build_collection(
        self: Arc<Self>,
        ns: &str,
        base: Option<&Arc<CollectionRouting>>,
        read: CollectionRead,
    ) -> Result<CollectionValue, MetadataError> {
        let p = &self.printer;
        let entry = CollectionEntry::from_document(&read.collection, p)?;
        if entry.ns != ns {
            return Err(MetadataError::new(
                ErrorCode::InternalError,
                format!("config.collections answered {} for {ns}", entry.ns),
            ));
        }
        let chunks = read
            .chunks
            .iter()
            .map(|d| ChunkEntry::from_document(d, &entry.pattern, ns, p))
            .collect::<Result<Vec<_>, _>>()?;
        let routing = match base {
            Some(b) if read.incremental => match b.apply_changes(entry, chunks, p)? {
                RefreshOutcome::Unchanged => {
                    self.counters.unchanged.fetch_add(1, Ordering::Relaxed);
                    return Ok(Some(b.clone()));
                }
                RefreshOutcome::Updated(r) => {
                    self.counters.incremental.fetch_add(1, Ordering::Relaxed);
                    *r
                }
            },
            _ => {
                let r = CollectionRouting::full(entry, chunks, p)?;
                self.counters.full.fetch_add(1, Ordering::Relaxed);
                r
            }
        };
        for shard in routing.shards() {
            self.clone().shard(shard).await.map_err(|e| {
                e.context(format!(
                    "Collection {ns} references shard which does not exist"
                ))
            })?;
        }
        Ok(Some(Arc::new(routing)))
    }

    /// Runs a read, retrying transient failures as the policy allows.
    async fn with_retries<'a, T, F>(&'a self, mut read: F) -> Result<T, MetadataError>
    where
        F: FnMut() -> BoxFuture<'a, Result<T, MetadataError>>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match read().await {
                Err(e) if e.is_transient() && attempt < self.policy.attempts => {
                    tokio::time::sleep(self.policy.backoff * attempt).await;
                }
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests;
