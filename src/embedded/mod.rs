//! The embedded shard: an in-memory, mongod-compatible server behind the same wire codec and
//! frontend as the router. It exists for `sluice demo`, the tests and the benchmarks, because
//! no real mongod can be installed everywhere Sluice is tried. **Memory only, not for
//! production**: real deployments point Sluice at real mongod shards, so the engine's replies
//! (shapes, codes, messages) follow mongod 8.0's as closely as the tests can hold them.
//!
//! What it answers: `hello` as a replica-set primary (with `setName`), CRUD (`insert`,
//! `update`, `delete`, `bulkWrite`, `find`/`getMore`/`killCursors`, `count`, `distinct`, `findAndModify`,
//! `aggregate`), DDL (`create`, `drop`, `dropDatabase`, `listCollections`, `listDatabases`,
//! `createIndexes`, `listIndexes`, `dropIndexes`, `collStats`, `dbStats`, `collMod`, `validate`,
//! `dataSize`, `renameCollection`), `serverStatus` with
//! `metrics.commands.<name>.total`, retryable writes (`lsid` + `txnNumber` + `stmtIds`),
//! multi-document transactions (`service::txn`, docs/design/transactions.md),
//! shard versions (`shardVersion` checked against what `sluiceSetShardVersion` recorded),
//! MongoDB's `failCommand` failpoint, and injected latency and a concurrency cap to model a
//! slow or saturated shard.
//!
//! Modules: [`store`] (catalog, collections, unique indexes), [`service`] (the command
//! handler, by concern), [`commands`] (the data commands, one file per family),
//! [`bulk_write`], [`ddl`] (`collMod`, `validate`, `dataSize`, `renameCollection`),
//! [`pipeline_output`] (`$out`, `$merge`), [`replset`] (embedded replica sets), [`filtering`]
//! (shard-server mode), [`cluster_ddl`] (a shard server's side of cluster DDL) and
//! [`ddl_coordinator`] (its recorded, resumable progress), [`migration`],
//! [`configsvr`] and [`configsvr_ddl`] (the config server's commands). The query language,
//! updates and aggregation are the document engine's ([`crate::engine`]).

pub mod bulk_write;
pub mod cluster_ddl;
pub mod commands;
pub mod configsvr;
pub mod configsvr_ddl;
pub mod ddl;
pub mod ddl_coordinator;
pub mod filtering;
pub mod migration;
pub mod pipeline_output;
pub mod remove_shard;
pub mod replset;
pub mod service;
pub mod store;
pub mod views;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::frontend::RouterHandle;

pub use replset::{AfterWrite, EmbeddedReplicaSet, MemberRole, ReplicaSetOptions};
pub use service::ShardService;

/// How an embedded shard behaves.
#[derive(Debug, Clone)]
pub struct ShardOptions {
    /// The replica set name `hello` reports (and the shard id the router knows it by).
    pub set_name: String,
    /// Time added to every data command (CRUD, aggregate).
    pub latency_per_command: Duration,
    /// Time added per statement written or document returned.
    pub latency_per_document: Duration,
    /// Most data commands executing at once (`None`: unlimited); the rest wait.
    pub max_concurrency: Option<usize>,
    /// Accept the commands only tests send (`configureFailPoint`, `sluiceSetLatency`), as
    /// mongod does with `enableTestCommands`; without it they are unknown commands (59).
    pub enable_test_commands: bool,
    /// Bytes a blocking aggregation stage may hold without `allowDiskUse` (292 beyond it).
    pub stage_memory_bytes: usize,
    /// The cluster keyfile: with it the shard requires authentication, as mongod started with
    /// `security.keyFile` does (authorization on; only `__system` may run internal commands).
    pub key_file: Option<String>,
    /// How members prove themselves (`clusterAuthMode`); with `x509` the shard requires
    /// authentication without a keyfile too, and takes a certificate naming a member of the
    /// cluster (its own certificate's `O`, `OU`, `DC`) for `__system`.
    pub cluster_auth_mode: crate::config::ClusterAuthMode,
    /// The shard's TLS listener settings (disabled by default).
    pub tls: crate::config::TlsConfig,
    /// How long a cursor may sit unread before the shard's cursor monitor drops it (mongod's
    /// `cursorTimeoutMillis`, 10 minutes by default).
    pub cursor_timeout: Duration,
    /// Run as a config server (`sluice configsvr`): `hello` reports `configsvr: 2` and the
    /// config server's internal commands are served on the `config.*` documents it holds.
    pub config_server: bool,
    /// Shard-server mode (`sluice shard --configdb …`): the config server whose metadata the
    /// shard checks requests' `shardVersion` / `databaseVersion` against ([`filtering`]).
    pub configdb: Option<String>,
    /// The users file (`security.users_file`): the users this server holds (the embedded
    /// config server of the cluster layout holds the cluster's users, as MongoDB's does).
    pub users_file: Option<String>,
    /// The roles file (`security.roles_file`) beside it.
    pub roles_file: Option<String>,
    /// Items of a `bulkWrite` reply's first batch when the command asks for no `batchSize`
    /// (`None`: all of them). mongod puts items past its 16 MB reply limit behind a cursor; a
    /// test sets this to reach that cursor with a few operations.
    pub bulk_write_batch_size: Option<usize>,
    /// With [`ShardOptions::config_server`]: the file the `config.*` documents are kept in,
    /// read at start-up and rewritten atomically after every command that changed them.
    pub metadata_path: Option<std::path::PathBuf>,
    /// How this server proves itself to the others of its cluster (a shard server to the
    /// config server and its peer shards, the config server to the shards): TLS and the
    /// keyfile's `__system` or x509, as [`crate::config::Config::pool_options`] makes them.
    pub internal_security: crate::backend::ShardSecurity,
}

impl Default for ShardOptions {
    fn default() -> Self {
        ShardOptions {
            set_name: "shard0".to_string(),
            latency_per_command: Duration::ZERO,
            latency_per_document: Duration::ZERO,
            max_concurrency: None,
            enable_test_commands: false,
            stage_memory_bytes: crate::limits::DEFAULT_STAGE_MEMORY_BYTES,
            key_file: None,
            cluster_auth_mode: crate::config::ClusterAuthMode::KeyFile,
            tls: crate::config::TlsConfig::default(),
            cursor_timeout: service::CURSOR_IDLE_TIMEOUT,
            config_server: false,
            configdb: None,
            users_file: None,
            roles_file: None,
            bulk_write_batch_size: None,
            metadata_path: None,
            internal_security: crate::backend::ShardSecurity::default(),
        }
    }
}

impl ShardOptions {
    /// What the shard requires of its clients, as mongod started with `security.keyFile` or
    /// `clusterAuthMode: x509`: authorization on, and the cluster's members known.
    fn protect(&self, config: &mut Config) {
        config.security.cluster_auth_mode = self.cluster_auth_mode;
        config.security.users_file = self.users_file.clone();
        config.security.roles_file = self.roles_file.clone();
        if let Some(key_file) = &self.key_file {
            config.security.key_file = Some(key_file.clone());
        }
        if self.key_file.is_some() || self.cluster_auth_mode == crate::config::ClusterAuthMode::X509
        {
            config.security.authorization = crate::config::Authorization::Enabled;
        }
    }

    /// The default options with test commands enabled (what the tests start shards with).
    pub fn for_tests() -> ShardOptions {
        ShardOptions {
            enable_test_commands: true,
            ..ShardOptions::default()
        }
    }
}

/// A running embedded shard.
#[derive(Debug)]
pub struct EmbeddedShard {
    handle: RouterHandle,
    service: Arc<ShardService>,
}

impl EmbeddedShard {
    /// Starts a shard on `listen` (`127.0.0.1:0` for an ephemeral port).
    pub async fn start(listen: &str, options: ShardOptions) -> std::io::Result<EmbeddedShard> {
        let mut config = Config {
            listen: listen.to_string(),
            tls: options.tls.clone(),
            ..Config::default()
        };
        options.protect(&mut config);
        let data = service::DataSet::default();
        let file = match (&options.metadata_path, options.config_server) {
            (Some(path), true) => {
                let file = configsvr::MetadataFile::new(path);
                file.load(&mut crate::sync::lock(data.catalog()))?;
                Some(file)
            }
            _ => None,
        };
        let mut made: Option<Arc<ShardService>> = None;
        let handle = crate::frontend::start_service(
            config,
            vec!["sluice".into(), "shard".into()],
            |state| {
                let s = Arc::new(
                    ShardService::with_data(state, options, data, None).with_metadata_file(file),
                );
                made = Some(s.clone());
                s
            },
        )
        .await?;
        let service = made.ok_or_else(|| std::io::Error::other("shard service was not created"))?;
        // What the start-up wrote (a new config server's cluster id) is kept from the start.
        service.persist_metadata()?;
        service.set_address(handle.local_addr());
        service::spawn_idle_monitor(&service);
        Ok(EmbeddedShard { handle, service })
    }

    /// Starts one member of an embedded replica set on `listener`, over the set's shared
    /// data. A stopped member closes every connection at once (no grace period), as a killed
    /// mongod does.
    pub(crate) async fn start_member(
        listener: tokio::net::TcpListener,
        options: ShardOptions,
        data: service::DataSet,
        member: replset::MemberLink,
    ) -> std::io::Result<EmbeddedShard> {
        let mut config = Config {
            listen: listener.local_addr()?.to_string(),
            tls: options.tls.clone(),
            shutdown_timeout_secs: 0,
            ..Config::default()
        };
        options.protect(&mut config);
        let mut made: Option<Arc<ShardService>> = None;
        let handle = crate::frontend::start_service_on_listener(
            listener,
            config,
            vec!["sluice".into(), "shard".into()],
            |state| {
                let s = Arc::new(ShardService::with_data(state, options, data, Some(member)));
                made = Some(s.clone());
                s
            },
        )?;
        let service = made.ok_or_else(|| std::io::Error::other("shard service was not created"))?;
        service.set_address(handle.local_addr());
        service::spawn_idle_monitor(&service);
        if let Some(donor) = service.shard_server() {
            ddl_coordinator::spawn_recovery(donor, cluster_ddl::resume, Arc::downgrade(&service));
        }
        Ok(EmbeddedShard { handle, service })
    }

    /// Starts `n` shards on ephemeral loopback ports, named `shard0`, `shard1`, ….
    pub async fn start_many(n: usize, base: ShardOptions) -> std::io::Result<Vec<EmbeddedShard>> {
        let mut shards = Vec::with_capacity(n);
        for i in 0..n {
            let options = ShardOptions {
                set_name: format!("shard{i}"),
                ..base.clone()
            };
            shards.push(EmbeddedShard::start("127.0.0.1:0", options).await?);
        }
        Ok(shards)
    }

    /// The address the shard listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.handle.local_addr()
    }

    /// The shard's command handler (for in-process inspection).
    pub fn service(&self) -> &Arc<ShardService> {
        &self.service
    }

    /// Stops the shard.
    pub async fn shutdown(self) {
        self.handle.shutdown().await;
    }

    /// Waits until the shard stops.
    pub async fn wait(self) {
        self.handle.wait().await;
    }
}

/// Parses a duration such as `1ms`, `200us`, `0.2ms`, `2s` or `500ns`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected a number and a unit such as 1ms"))?;
    let nanos = match unit.trim() {
        "ns" => value,
        "us" | "µs" => value * 1e3,
        "ms" | "" => value * 1e6,
        "s" => value * 1e9,
        other => {
            return Err(format!(
                "invalid duration unit {other:?} in {s:?} (ns, us, ms, s)"
            ))
        }
    };
    if !nanos.is_finite() || nanos < 0.0 {
        return Err(format!("invalid duration {s:?}"));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1ms").unwrap(), Duration::from_millis(1));
        assert_eq!(parse_duration("0.2ms").unwrap(), Duration::from_micros(200));
        assert_eq!(parse_duration("200us").unwrap(), Duration::from_micros(200));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("1 parsec").is_err());
    }
}
