//! Shard-server mode (`sluice shard --configdb …`): the embedded shard's filtering metadata is
//! the config server's, read through the same loader and catalog cache as the router's. A
//! request that carries `shardVersion` / `databaseVersion` is checked against it before the
//! command runs, as mongod checks it:
//!
//! - equal: the command runs;
//! - the request's version is newer than the shard's: the shard refreshes (it is the one
//!   behind) and checks again;
//! - otherwise StaleConfig (13388: `ns`, `vReceived`, `vWanted`, `shardId`) or StaleDbVersion
//!   (249: `db`, `vReceived`, `vWanted`), so the router refreshes and retargets.
//!
//! A shard learns of a migration or a DDL change the way mongod does after one:
//! `_flushRoutingTableCacheUpdates: <ns>` / `_flushDatabaseCacheUpdates: <db>` make it reload.
//!
//! The members of an embedded replica set each keep their own filtering metadata, as mongod's
//! do, and learn from one another ([`RoutingChanges`]): what one member forgets (its primary
//! after a migration or a DDL change), the others forget before their next check, as a mongod
//! secondary clears its filtering metadata when it replicates the primary's refresh. Without
//! it a secondary kept the routing of before a migration for ever and served a stale router's
//! read as current: the read missed the documents that had moved.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bson::{doc, Bson, Document};

use crate::engine::EngineError;
use crate::metadata::configsvr::{
    CatalogCache, ConfigDb, ConfigServerSource, DatabaseRouting, DatabaseVersion, MetadataError,
    ShardVersion, PRINTER,
};
use crate::value::error_codes::ErrorCode;

/// StaleConfig (13388) as a shard answers it: the namespace, the version received, the one the
/// shard wanted and the shard's id.
pub fn stale_config(ns: &str, received: &Bson, wanted: Document, shard: &str) -> EngineError {
    EngineError::new(
        ErrorCode::StaleConfig,
        format!("version mismatch detected for {ns}"),
    )
    .with_extra(doc! {
        "ns": ns,
        "vReceived": received.clone(),
        "vWanted": wanted,
        "shardId": shard,
    })
}

/// What one cached entry is: a collection's routing or a database's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Cached {
    Collection(String),
    Database(String),
}

/// The routing changes the members of one replica set tell one another (one per set, in its
/// shared data set; a single shard has one of its own): for each namespace or database, the
/// number of the last change a member made to it.
#[derive(Debug, Default)]
pub struct RoutingChanges {
    inner: Mutex<ChangeLog>,
}

#[derive(Debug, Default)]
struct ChangeLog {
    last: u64,
    changed: HashMap<Cached, u64>,
}

impl RoutingChanges {
    /// Records a change to `what`; its number.
    fn record(&self, what: Cached) -> u64 {
        let mut log = crate::sync::lock(&self.inner);
        log.last += 1;
        let n = log.last;
        log.changed.insert(what, n);
        n
    }

    /// What changed after change `seen`, and the number of the last change.
    fn since(&self, seen: u64) -> (Vec<Cached>, u64) {
        let log = crate::sync::lock(&self.inner);
        if log.last == seen {
            return (Vec::new(), seen);
        }
        let what = log
            .changed
            .iter()
            .filter(|(_, n)| **n > seen)
            .map(|(w, _)| w.clone())
            .collect();
        (what, log.last)
    }
}

/// The filtering metadata of a shard server.
#[derive(Debug)]
pub struct Filtering {
    configdb: String,
    security: crate::backend::ShardSecurity,
    cache: tokio::sync::OnceCell<(Arc<ConfigServerSource>, CatalogCache)>,
    /// The set's changes, and the last one this member has applied.
    changes: Arc<RoutingChanges>,
    seen: Mutex<u64>,
}

/// A metadata error as the shard answers it.
pub(super) fn engine_error(e: MetadataError) -> EngineError {
    EngineError::new(e.code, e.message)
}

impl Filtering {
    /// Filtering metadata read from the config server `configdb` (connected on first use),
    /// learning of the changes the other members of its set make through `changes`.
    pub fn new(
        configdb: &str,
        security: crate::backend::ShardSecurity,
        changes: Arc<RoutingChanges>,
    ) -> Self {
        Filtering {
            configdb: configdb.to_string(),
            security,
            cache: tokio::sync::OnceCell::new(),
            changes,
            seen: Mutex::new(0),
        }
    }

    /// Forgets what is cached of `what` here, and tells the set's other members to.
    fn forget(&self, what: Cached) {
        self.drop_cached(&what);
        let n = self.changes.record(what);
        let mut seen = crate::sync::lock(&self.seen);
        if *seen + 1 == n {
            *seen = n;
        }
    }

    fn drop_cached(&self, what: &Cached) {
        if let Some((_, cache)) = self.cache.get() {
            match what {
                Cached::Collection(ns) => cache.flush_collection(ns),
                Cached::Database(db) => cache.flush_database(db),
            }
        }
    }

    /// Forgets what this member caches of collection `ns` (it changed: a migration, a DDL
    /// command), and has the other members of its set forget it too.
    pub fn flush_collection(&self, ns: &str) {
        self.forget(Cached::Collection(ns.to_string()));
    }

    /// [`Filtering::flush_collection`] for a database's routing.
    pub fn flush_database(&self, db: &str) {
        self.forget(Cached::Database(db.to_string()));
    }

    /// Forgets what the set's other members changed since this one last looked.
    fn catch_up(&self) {
        let mut seen = crate::sync::lock(&self.seen);
        let (changed, last) = self.changes.since(*seen);
        for what in &changed {
            self.drop_cached(what);
        }
        *seen = last;
    }

    async fn connected(&self) -> Result<&(Arc<ConfigServerSource>, CatalogCache), EngineError> {
        self.cache
            .get_or_try_init(|| async {
                let configdb = ConfigDb::parse(&self.configdb).map_err(engine_error)?;
                let source = Arc::new(
                    ConfigServerSource::connect_secured(&configdb, &self.security)
                        .await
                        .map_err(engine_error)?,
                );
                Ok::<_, EngineError>((source.clone(), CatalogCache::new(source, PRINTER)))
            })
            .await
    }

    /// The shard's catalog cache (connected to the config server on first use).
    pub(super) async fn cache(&self) -> Result<&CatalogCache, EngineError> {
        Ok(&self.connected().await?.1)
    }

    /// Runs an internal command on the config server's primary (majority write concern).
    pub(super) async fn run_on_config_server(
        &self,
        command: Document,
    ) -> Result<Document, EngineError> {
        self.connected()
            .await?
            .0
            .run_admin_command(command)
            .await
            .map_err(engine_error)
    }

    /// Whether `ns` is a sharded collection (tracked by the config server). A config server
    /// that cannot answer is an error, not an unsharded collection.
    pub async fn is_sharded(&self, ns: &str) -> Result<bool, EngineError> {
        match self.cache().await?.routing_info(ns).await {
            Ok(info) => Ok(info.collection.is_some()),
            Err(e) if e.code == ErrorCode::NamespaceNotFound => Ok(false),
            Err(e) => Err(engine_error(e)),
        }
    }

    /// The placement version this shard (`shard`) has for `ns`: its chunks' highest version,
    /// UNSHARDED for an untracked collection.
    async fn wanted(&self, shard: &str, ns: &str) -> Result<ShardVersion, EngineError> {
        match self.cache().await?.routing_info(ns).await {
            Ok(info) => Ok(info
                .collection
                .map_or(ShardVersion::unsharded(), |c| c.shard_version(shard))),
            Err(e) if e.code == ErrorCode::NamespaceNotFound => Ok(ShardVersion::unsharded()),
            Err(e) => Err(engine_error(e)),
        }
    }

    async fn database_version(&self, db: &str) -> Result<Option<DatabaseVersion>, EngineError> {
        Ok(
            match self
                .cache()
                .await?
                .database(db)
                .await
                .map_err(engine_error)?
            {
                Some(DatabaseRouting::Tracked(d)) => Some(d.version),
                _ => None,
            },
        )
    }

    /// Checks the versions a request for `ns` carries (see the module's rules).
    pub async fn check(&self, shard: &str, ns: &str, body: &Document) -> Result<(), EngineError> {
        self.catch_up();
        let db = ns.split('.').next().unwrap_or(ns);
        if let Some(raw) = body.get("databaseVersion") {
            let received = DatabaseVersion::from_bson(raw, &PRINTER).map_err(engine_error)?;
            let mut wanted = self.database_version(db).await?;
            if wanted.is_none_or(|w| received.is_newer_than(&w)) {
                self.cache().await?.on_stale_database(db, Some(received));
                wanted = self.database_version(db).await?;
            }
            if wanted != Some(received) {
                let mut extra = doc! {"db": db, "vReceived": raw.clone()};
                if let Some(w) = wanted {
                    extra.insert("vWanted", w.to_document());
                }
                return Err(EngineError::new(
                    ErrorCode::StaleDbVersion,
                    format!("version mismatch detected for {db}"),
                )
                .with_extra(extra));
            }
        }
        let Some(raw) = body.get("shardVersion") else {
            return Ok(());
        };
        let received = ShardVersion::from_bson(raw, &PRINTER).map_err(engine_error)?;
        let mut wanted = self.wanted(shard, ns).await?;
        if received != wanted && received.is_newer_than(&wanted) {
            self.cache().await?.on_stale_collection(ns, Some(received));
            wanted = self.wanted(shard, ns).await?;
        }
        if received == wanted {
            return Ok(());
        }
        Err(stale_config(ns, raw, wanted.to_document(), shard))
    }

    /// `_flushRoutingTableCacheUpdates: <ns>` and `_flushDatabaseCacheUpdates: <db>`: forget
    /// what is cached, so the next request reads the config server again.
    pub async fn flush(&self, command: &str, body: &Document) -> Result<Document, EngineError> {
        let Some(Bson::String(target)) = body.get(command) else {
            return Err(EngineError::new(
                ErrorCode::TypeMismatch,
                format!(
                    "BSON field '{command}.{command}' is the wrong type, expected type 'string'"
                ),
            ));
        };
        self.cache().await?;
        if command == "_flushDatabaseCacheUpdates" {
            self.flush_database(target);
        } else {
            self.flush_collection(target);
        }
        Ok(Document::new())
    }
}
