//! The router in `--configdb` mode: MongoDB's config server is the routing authority.
//!
//! The shards come from `config.shards`, databases from `config.databases`, sharded
//! collections and their chunks from `config.collections` / `config.chunks`, all through the
//! catalog cache (`crate::metadata::configsvr`). The router keeps a mirror of the database
//! entries it has looked up in its metadata store, so the code shared with static mode reads
//! a database's primary shard the same way in both modes; the config server stays the only
//! authority (the mirror is replaced by what the cache holds on every request, and nothing is
//! created in it locally). docs/design/config-server.md, sections 4–8 and 12.

use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson, Document};

use crate::backend::PoolOptions;
use crate::cluster::Cluster;
use crate::command::CommandError;
use crate::metadata::configsvr::stale::{is_stale_code, MAX_STALE_RETRIES};
use crate::metadata::configsvr::{
    CatalogCache, CatalogRouting, ConfigDb, ConfigServerSource, DatabaseRouting, MetadataError,
    RequestVersions, ShardRegistry, PRINTER,
};
use crate::metadata::StaticStore;
use crate::routing::{RoutingTable, ShardInfo};
use crate::value::error_codes::ErrorCode;
use crate::wire::Reply;

use super::ShardedCluster;

/// First and longest wait between attempts to reach the config server at start-up.
pub const STARTUP_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(5));

/// The config server a `--configdb` router routes by.
#[derive(Debug)]
pub struct ConfigServer {
    /// The loader (and the connection internal commands are sent on).
    pub source: Arc<ConfigServerSource>,
    /// The catalog cache, as the routing table's source.
    pub routing: CatalogRouting,
}

impl ConfigServer {
    /// The catalog cache.
    pub fn cache(&self) -> &CatalogCache {
        self.routing.cache()
    }
}

fn command_error(e: MetadataError) -> CommandError {
    CommandError::new(e.code, e.message)
}

/// The shards of a `config.shards` list as the router connects to them: each one's seed list
/// in its canonical form (a replica set's members are discovered from it and its primary
/// followed; a single `host:port` is reached as it is). An entry that does not parse is left
/// out (it is reported when something routes to it).
pub fn shard_infos(registry: &ShardRegistry) -> Vec<ShardInfo> {
    let mut out: Vec<ShardInfo> = registry
        .shards()
        .filter(|s| !s.seeds.hosts.is_empty())
        .map(|s| ShardInfo {
            id: s.id.clone(),
            addr: s.seeds.to_string(),
            shard_server: true,
        })
        .collect();
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

/// How long start-up waits for the config server's shard list before the router listens
/// anyway (it keeps trying in the background).
pub const STARTUP_WAIT: Duration = Duration::from_secs(2);

/// How often a router reads `config.shards` again on its own (mongos's shard registry
/// reloads on a period too); `addShard` through it, `flushRouterConfig`, and a database
/// primary or chunk owner it does not know make it read the list at once.
pub const SHARD_LIST_REFRESH: Duration = Duration::from_secs(30);

/// Connects to the config server `configdb` (mongos's `--configdb` form) and builds the
/// router's cluster over it. The shard list is read by a task that retries with backoff (100
/// ms doubling to 5 s, each failure logged) until the config server answers; start-up waits
/// for it at most [`STARTUP_WAIT`], so a router whose config server is down still listens,
/// answers `hello`, and fails routed commands with HostUnreachable (6) until then.
pub async fn bootstrap_configdb(
    configdb: &str,
    pool: PoolOptions,
    batching: &crate::config::BatchingConfig,
) -> Result<Arc<ShardedCluster>, String> {
    bootstrap_configdb_with(configdb, pool, batching, STARTUP_WAIT).await
}

/// [`bootstrap_configdb`] with an explicit start-up wait.
pub async fn bootstrap_configdb_with(
    configdb: &str,
    pool: PoolOptions,
    batching: &crate::config::BatchingConfig,
    startup_wait: Duration,
) -> Result<Arc<ShardedCluster>, String> {
    let configdb = ConfigDb::parse(configdb).map_err(|e| e.message)?;
    let source = Arc::new(
        ConfigServerSource::connect_secured(&configdb, &pool.security)
            .await
            .map_err(|e| e.message)?,
    );
    let cache = CatalogCache::new(source.clone(), PRINTER);
    let mirror = Arc::new(StaticStore::mirror());
    let routing = CatalogRouting::new(cache.clone(), PRINTER);
    let table = RoutingTable::with_source(Arc::new(routing.clone()));
    let cluster = Arc::new(Cluster::pending(table, pool, batching));
    let sharded = Arc::new(
        ShardedCluster::new(cluster.clone(), mirror.clone(), batching)
            .with_config_server(ConfigServer { source, routing }),
    );
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
    let name = configdb.to_string();
    let weak = Arc::downgrade(&sharded);
    tokio::spawn(async move {
        let mut wait = STARTUP_BACKOFF.0;
        let registry = loop {
            match cache.shards().await {
                Ok(r) => break r,
                Err(e) => {
                    tracing::warn!(config_server = %name, error = %e.message, retry_in = ?wait,
                        "cannot read the shard list from the config server; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(STARTUP_BACKOFF.1);
                }
            }
        };
        let shards = shard_infos(&registry);
        tracing::info!(config_server = %name, shards = shards.len(), "routing from the config server");
        if let Err(e) = mirror.set_shards(&shards) {
            tracing::warn!(error = %e.message, "cannot record the shard list");
        }
        cluster.install_shards(shards);
        cluster.warm_pools().await;
        let _ = ready_tx.send(());
        // Shards added later: the list is read again on a period.
        loop {
            tokio::time::sleep(SHARD_LIST_REFRESH).await;
            let Some(sharded) = weak.upgrade() else {
                return;
            };
            if let Err(e) = sharded.refresh_shards().await {
                tracing::warn!(error = %e.message, "cannot read the shard list again");
            }
        }
    });
    if tokio::time::timeout(startup_wait, ready_rx).await.is_err() {
        tracing::warn!(config_server = %configdb, "the config server has not answered yet; listening anyway");
    }
    Ok(sharded)
}

impl ShardedCluster {
    /// Brings the mirror of `db`'s `config.databases` entry up to date from the catalog
    /// cache (creating the database through the config server first when `create` and it
    /// does not exist, as mongos does on a first write). Returns the versions a command
    /// routed to the database's primary shard carries (`None` outside `--configdb` mode or
    /// for `admin`/`config`).
    pub async fn sync_database(
        &self,
        db: &str,
        create: bool,
    ) -> Result<Option<Document>, CommandError> {
        let Some(cs) = &self.config_server else {
            return Ok(None);
        };
        if !self.cluster.has_shards() {
            // Until the shard list arrives, say why it has not when the config server refuses
            // the read (18 when it refused this router's authentication), as a mongos that
            // cannot authenticate to its config server answers.
            cs.cache().shards().await.map_err(command_error)?;
            return Err(CommandError::new(
                ErrorCode::HostUnreachable,
                format!(
                    "the config server {} has not answered with the cluster's shards yet",
                    cs.source.name()
                ),
            ));
        }
        if DatabaseRouting::is_fixed_name(db) || db == "local" {
            return Ok(None);
        }
        let mut found = cs.cache().database(db).await.map_err(command_error)?;
        if found.is_none() && create {
            self.create_database(db, None).await?;
            found = cs.cache().database(db).await.map_err(command_error)?;
        }
        let Some(DatabaseRouting::Tracked(entry)) = found else {
            self.metadata.mirror_database(db, None);
            return Ok(None);
        };
        if self.cluster.pool(&entry.primary).is_none() {
            self.refresh_shards().await?;
        }
        self.metadata.mirror_database(
            db,
            Some(doc! {
                "_id": db,
                "primary": &entry.primary,
                "version": entry.version.to_document(),
            }),
        );
        let versions = RequestVersions {
            shard_version: Some(crate::metadata::configsvr::ShardVersion::unsharded()),
            database_version: Some(entry.version),
        };
        let mut fields = Document::new();
        versions.apply_to(&mut fields);
        Ok(Some(fields))
    }

    /// Reads `config.shards` again and adds the shards this router does not have yet (with a
    /// pool each) to its cluster and to the mirror `listShards` answers from.
    pub async fn refresh_shards(&self) -> Result<(), CommandError> {
        let Some(cs) = &self.config_server else {
            return Ok(());
        };
        cs.cache().flush_shards();
        let registry = cs.cache().shards().await.map_err(command_error)?;
        let shards = shard_infos(&registry);
        let added = self.cluster.add_shards(shards);
        if added > 0 {
            tracing::info!(added, "shards added from the config server's list");
            let all = self.cluster.shards().to_vec();
            self.metadata
                .set_shards(&all)
                .map_err(|e| CommandError::new(e.code, e.message))?;
        }
        Ok(())
    }

    /// Reads the shard list again when `snapshot` places chunks on a shard this router does
    /// not know yet (added after it started).
    pub async fn know_shards_of(
        &self,
        snapshot: &crate::routing::RoutingSnapshot,
    ) -> Result<(), CommandError> {
        if self.config_server.is_none() {
            return Ok(());
        }
        let unknown = snapshot
            .chunks
            .owners()
            .iter()
            .any(|s| self.cluster.pool(s).is_none());
        if unknown {
            self.refresh_shards().await?;
        }
        Ok(())
    }

    /// Creates `db` through the config server (`_configsvrCreateDatabase`, with the primary
    /// shard asked for, if any), then forgets what the cache held about it.
    pub async fn create_database(
        &self,
        db: &str,
        primary: Option<&str>,
    ) -> Result<Document, CommandError> {
        let Some(cs) = &self.config_server else {
            return Err(CommandError::new(
                ErrorCode::InternalError,
                "create_database needs a config server",
            ));
        };
        let mut cmd = doc! {"_configsvrCreateDatabase": db};
        if let Some(p) = primary {
            cmd.insert("primaryShardId", p);
        }
        let reply = cs
            .source
            .run_admin_command(cmd)
            .await
            .map_err(command_error)?;
        cs.cache().flush_database(db);
        Ok(reply)
    }

    /// Runs an internal command on the config server's primary (majority write concern).
    pub async fn config_server_command(&self, command: Document) -> Result<Document, CommandError> {
        let Some(cs) = &self.config_server else {
            return Err(CommandError::new(
                ErrorCode::InternalError,
                "no config server to send the command to",
            ));
        };
        cs.source
            .run_admin_command(command)
            .await
            .map_err(command_error)
    }

    /// Runs an internal command that takes no write concern on the config server's primary.
    pub async fn config_server_command_as_is(
        &self,
        command: Document,
    ) -> Result<Document, CommandError> {
        let Some(cs) = &self.config_server else {
            return Err(CommandError::new(
                ErrorCode::InternalError,
                "no config server to send the command to",
            ));
        };
        cs.source
            .run_admin_command_as_is(command)
            .await
            .map_err(command_error)
    }

    /// Makes the next request for `ns` read its routing from the config server again.
    pub fn forget_collection(&self, ns: &str) {
        if let Some(cs) = &self.config_server {
            cs.cache().flush_collection(ns);
        }
    }

    /// Where this router's users and roles are kept: the config server, in `--configdb`
    /// mode (the user and role commands run there; its `admin.system.users` and
    /// `admin.system.roles` are read on a period).
    pub fn user_store(&self) -> Option<crate::command::service::UserStore> {
        let cs = self.config_server.as_ref()?;
        Some(crate::command::service::UserStore::Remote(Arc::new(
            ConfigServerUsers(cs.source.clone()),
        )))
    }

    /// Whether the routing comes from a config server.
    pub fn has_config_server(&self) -> bool {
        self.config_server.is_some()
    }

    /// Tells the catalog cache what a shard's stale error about `ns` asked for.
    pub fn on_stale(&self, ns: &str, error: &Document) {
        let Some(cs) = &self.config_server else {
            return;
        };
        use crate::routing::RoutingSource;
        cs.routing.stale(ns, std::slice::from_ref(error));
    }
}

/// The stale error (StaleConfig 13388, StaleEpoch 150, StaleDbVersion 249) a routed command
/// ended with, as a document the catalog cache can read, if it ended with one.
///
/// A write passed through to a database's primary shard reports it as its first write error,
/// at index 0 (the shard checks versions before it applies any statement): only then is the
/// whole command safe to send again.
pub fn stale_error(result: &Result<Reply, CommandError>) -> Option<Document> {
    let code = |d: &Document| match d.get("code") {
        Some(Bson::Int32(c)) => Some(*c),
        Some(Bson::Int64(c)) => Some(*c as i32),
        _ => None,
    };
    let stale = |d: &Document| code(d).is_some_and(|c| is_stale_code(ErrorCode(c)));
    match result {
        Ok(reply) => {
            let is_error = reply.ok() == Some(0.0);
            if !is_error && !reply.contains_key("writeErrors") {
                return None;
            }
            let d = match reply {
                Reply::Document(d) => d.clone(),
                Reply::Raw(r) => Document::try_from(r.as_ref()).ok()?,
            };
            if is_error {
                return stale(&d).then_some(d);
            }
            let first = d
                .get_array("writeErrors")
                .ok()?
                .first()?
                .as_document()?
                .clone();
            let at_start = matches!(first.get("index"), Some(Bson::Int32(0) | Bson::Int64(0)));
            let none_applied = matches!(d.get("n"), Some(Bson::Int32(0) | Bson::Int64(0)) | None);
            (at_start && none_applied && stale(&first)).then_some(first)
        }
        Err(e) if is_stale_code(e.code) => {
            Some(doc! {"ok": 0.0, "code": e.code.0, "errmsg": &e.message})
        }
        _ => None,
    }
}

/// Most times one command is routed again after stale errors (`kMaxNumStaleVersionRetries`).
pub const MAX_ATTEMPTS: u32 = MAX_STALE_RETRIES;

/// A command that changes the sharding metadata (dropping a sharded collection or a database,
/// renaming a sharded collection), which in `--configdb` mode only the config server's DDL
/// coordinators may do; Sluice does not send those internal commands yet.
pub fn not_through_config_server(command: &str, target: &str) -> CommandError {
    CommandError::new(
        ErrorCode::CommandNotSupported,
        format!(
            "'{command}' of {target} changes the sharding metadata, which a router in --configdb mode does not do yet; run it through mongos"
        ),
    )
}

/// The config server as the keeper of a router's users and roles.
struct ConfigServerUsers(Arc<ConfigServerSource>);

impl crate::command::service::RemoteUsers for ConfigServerUsers {
    fn name(&self) -> String {
        self.0.name().to_string()
    }

    fn run<'a>(
        &'a self,
        db: &'a str,
        command: Document,
    ) -> crate::command::BoxFuture<'a, Result<Document, CommandError>> {
        Box::pin(async move {
            self.0
                .run_command_in(db, command)
                .await
                .map_err(command_error)
        })
    }

    fn load(
        &self,
    ) -> crate::command::BoxFuture<'_, Result<(Vec<Document>, Vec<Document>), String>> {
        Box::pin(async move {
            self.0
                .read_authorization()
                .await
                .map_err(|e| format!("{}: {}", e.code, e.message))
        })
    }
}
