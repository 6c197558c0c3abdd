//! The router's configuration: a TOML file (every field optional, unknown fields refused) with
//! command-line flags layered on top.
//!
//! ```toml
//! listen = "127.0.0.1:27017"
//! max_connections = 10000
//!
//! [log]
//! format = "text"
//! level = "info"
//! ```

use std::path::Path;

use serde::Deserialize;

/// Everything the router reads from its configuration file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address the router listens on for clients, `host:port`.
    pub listen: String,
    /// Most client connections open at once. A connection beyond it is accepted and closed at
    /// once (as mongod does), and logged.
    pub max_connections: usize,
    /// Length of the kernel's queue of connections not yet accepted.
    pub backlog: u32,
    /// Seconds that in-flight requests get to finish after SIGINT/SIGTERM before the
    /// remaining connections are closed.
    pub shutdown_timeout_secs: u64,
    /// Logging.
    pub log: LogConfig,
    /// Address of the Prometheus metrics endpoint (`http://ADDR/metrics`); empty disables it.
    pub metrics_listen: String,
    /// Where the router keeps its sharding metadata (written atomically on every change) so a
    /// restart routes exactly as before. Without it, metadata lives in memory only.
    pub metadata_path: Option<String>,
    /// The shards. Empty: the router runs alone and answers only its own commands.
    pub shards: Vec<ShardConfig>,
    /// The config server replica set that holds the cluster's routing metadata, as mongos's
    /// `--configdb`: `"<replica set>/host:port,host:port"` (port 27019 when omitted). With it
    /// the shards, databases and sharded collections come from the config server, so `shards`,
    /// `collections` and `metadata_path` must be empty (docs/design/config-server.md).
    pub configdb: Option<String>,
    /// Collections to shard at start-up (kept as they are if already sharded with this key).
    pub collections: Vec<CollectionConfig>,
    /// When an ORDERED bulk may be sent as one round of per-shard child batches:
    /// `"retry-safe"` (proven order-independent and retry-safe; the default), `"always"`
    /// (whenever every statement targets one shard) or `"off"` (mongos rounds).
    pub ordered_rewrite: Policy,
    /// Connections to each shard.
    pub pool: PoolConfig,
    /// The per-shard queue and adaptive execution limit.
    pub batching: BatchingConfig,
    /// Per-namespace overrides of `ordered_rewrite`, e.g. `"shop.ledger" = "off"`.
    pub ordered_rewrite_overrides: std::collections::BTreeMap<String, Policy>,
    /// Accept commands that only tests send (`getParameter` reports it as
    /// `enableTestCommands`): the router's own `failCommand` fail point (`configureFailPoint`,
    /// as mongos implements it on itself). Without it `configureFailPoint` is unknown (59).
    pub enable_test_commands: bool,
    /// Bytes a blocking aggregation stage run at the router (`$sort`, `$group` over the
    /// shards' results) may hold without `allowDiskUse`; beyond it the aggregation fails with
    /// 292, as mongod's 100 MiB limit does.
    pub stage_memory_bytes: usize,
    /// Client authentication, authorization and the cluster keyfile (docs/design/security.md).
    pub security: SecurityConfig,
    /// TLS on the listener and towards shards (docs/design/security.md).
    pub tls: TlsConfig,
    /// With `configdb`: milliseconds between the router's reports of itself to
    /// `config.mongos` (its `ping` and `up`); mongos reports every 10 s.
    pub uptime_report_interval_ms: u64,
}

/// `[security]`: who may connect and what they may do.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SecurityConfig {
    /// `"enabled"`: every command is checked against the authenticated user's built-in roles,
    /// and only the handshake and authentication commands run before authentication;
    /// `"disabled"` (the default, also for `sluice demo`): users may authenticate, nothing is
    /// checked.
    pub authorization: Authorization,
    /// A JSON array of `admin.system.users` documents (Extended JSON, as `mongoexport
    /// --jsonArray` writes them): the users clients authenticate as. `createUser`,
    /// `updateUser`, `dropUser` and `dropAllUsersFromDatabase` rewrite it (atomically, mode
    /// 0600). Unset: users live in memory only, starting with none.
    pub users_file: Option<String>,
    /// A JSON array of `admin.system.roles` documents: the custom roles of static and demo
    /// mode, rewritten by the role commands as the users file is. Unset: custom roles live in
    /// memory only, and with a users file `createRole` is refused (a user kept in the file
    /// must not hold a role the next start would not know).
    pub roles_file: Option<String>,
    /// How often a `--configdb` router reads the config server's users and roles again
    /// (mongos's `userCacheInvalidationIntervalSecs`, 30 by default, 1 at least): a user
    /// created, changed or dropped through another router is seen here at most this long
    /// after; changes made through this router are seen at once.
    pub user_cache_invalidation_interval_secs: Option<u64>,
    /// The cluster keyfile (mongod's `security.keyFile`): Sluice authenticates to its shards
    /// as `__system` with it, and accepts `__system` clients that prove it.
    pub key_file: Option<String>,
    /// How cluster members prove themselves to each other (mongod's
    /// `security.clusterAuthMode`): `"keyFile"` (the default: SCRAM as `__system` with the
    /// keyfile), `"sendKeyFile"` (send the keyfile, accept X.509 members too), `"sendX509"`
    /// (send the TLS certificate, accept both) or `"x509"` (X.509 only). X.509 membership is
    /// mongod's rule: a peer whose certificate subject has the `O`, `OU` and `DC` of this
    /// server's own certificate is `__system`.
    pub cluster_auth_mode: ClusterAuthMode,
}

/// `security.cluster_auth_mode`, as mongod's `clusterAuthMode`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
pub enum ClusterAuthMode {
    /// Members authenticate with the keyfile only.
    #[default]
    #[serde(rename = "keyFile")]
    KeyFile,
    /// Send the keyfile; accept the keyfile and X.509 members.
    #[serde(rename = "sendKeyFile")]
    SendKeyFile,
    /// Send the TLS certificate; accept the keyfile and X.509 members.
    #[serde(rename = "sendX509")]
    SendX509,
    /// X.509 members only.
    #[serde(rename = "x509")]
    X509,
}

impl ClusterAuthMode {
    /// Whether Sluice proves itself to shards with its certificate (else with the keyfile).
    pub fn sends_x509(self) -> bool {
        matches!(self, ClusterAuthMode::SendX509 | ClusterAuthMode::X509)
    }

    /// Whether a peer proving the keyfile is accepted as `__system`.
    pub fn accepts_keyfile(self) -> bool {
        self != ClusterAuthMode::X509
    }

    /// Whether a peer whose certificate names a cluster member is accepted as `__system`.
    pub fn accepts_x509(self) -> bool {
        self != ClusterAuthMode::KeyFile
    }
}

/// `security.authorization`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Authorization {
    /// Nothing is checked (the default).
    #[default]
    Disabled,
    /// Every command is checked.
    Enabled,
}

/// `[tls]`: the listener's TLS and Sluice's TLS towards shards.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// `"disabled"` (the default), `"allow"` (TLS and plain clients), `"prefer"` (both, and
    /// TLS to shards) or `"require"` (TLS clients only, TLS to shards), as mongod's
    /// `net.tls.mode`.
    pub mode: crate::auth::tls::TlsMode,
    /// PEM holding the server's certificate chain and private key (needed unless disabled):
    /// what clients are shown, and what Sluice presents to shards and config servers unless
    /// `cluster_file` is set.
    pub certificate_key_file: Option<String>,
    /// PEM holding the certificate chain and key Sluice presents on its own connections to
    /// shards and config servers (mongod's `net.tls.clusterFile`): the certificate of x509
    /// cluster authentication. Unset: `certificate_key_file`.
    pub cluster_file: Option<String>,
    /// PEM of the CA that client certificates (MONGODB-X509) and shard certificates must chain
    /// to. With it, clients are asked for a certificate.
    pub ca_file: Option<String>,
    /// With `ca_file`: accept clients that present no certificate.
    pub allow_connections_without_certificates: bool,
    /// Towards shards: accept any shard certificate (tests only).
    pub allow_invalid_certificates: bool,
    /// Towards shards: accept a valid certificate issued for another host name.
    pub allow_invalid_hostnames: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:27017".to_string(),
            max_connections: 10_000,
            backlog: 1024,
            shutdown_timeout_secs: 15,
            log: LogConfig::default(),
            metrics_listen: "127.0.0.1:9216".to_string(),
            metadata_path: None,
            shards: Vec::new(),
            configdb: None,
            collections: Vec::new(),
            ordered_rewrite: Policy::RetrySafe,
            pool: PoolConfig::default(),
            batching: BatchingConfig::default(),
            ordered_rewrite_overrides: Default::default(),
            enable_test_commands: false,
            stage_memory_bytes: crate::limits::DEFAULT_STAGE_MEMORY_BYTES,
            security: SecurityConfig::default(),
            tls: TlsConfig::default(),
            uptime_report_interval_ms: 10_000,
        }
    }
}

/// The per-shard queue and adaptive execution limit (docs/design/adaptive-limit.md).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BatchingConfig {
    /// Statements that make a child batch full (full batches bypass the adaptive limit).
    pub max_operations: usize,
    /// Bytes that make a child batch full.
    pub max_bytes: usize,
    /// Microseconds an insert that needs no session of its own may wait for companions from
    /// other requests to share its child batch; 0 disables coalescing.
    pub max_wait_us: u64,
    /// Simultaneous executions per shard, mutations and reads together.
    pub max_in_flight: usize,
    /// Lowest adaptive limit; 0 lets it fall to a quarter of a batch. Set it equal to
    /// `max_in_flight` to fix the limit.
    pub min_in_flight: usize,
    /// Milliseconds a batch may wait in a shard's queue; then it fails with ExceededTimeLimit
    /// (262). A client's `maxTimeMS` ends its request sooner, with MaxTimeMSExpired (50).
    pub queue_timeout_ms: u64,
    /// Milliseconds between probes (doubled while a probe's pause would exceed 2.5% of it).
    pub probe_interval_ms: u64,
}

impl Default for BatchingConfig {
    fn default() -> Self {
        BatchingConfig {
            max_operations: 128,
            max_bytes: 4 * 1024 * 1024,
            max_wait_us: 1_000,
            max_in_flight: 16,
            min_in_flight: 0,
            queue_timeout_ms: 5_000,
            probe_interval_ms: 10_000,
        }
    }
}

impl BatchingConfig {
    /// The limiter's settings.
    pub fn limiter(&self) -> crate::backend::limiter::LimiterSettings {
        crate::backend::limiter::LimiterSettings {
            max_in_flight: self.max_in_flight.max(1),
            min_in_flight: self.min_in_flight.min(self.max_in_flight.max(1)),
            max_operations: self.max_operations.max(1),
            max_bytes: self.max_bytes.max(1),
            probe_interval: std::time::Duration::from_millis(self.probe_interval_ms.max(100)),
        }
    }
}

/// Settings of each shard's connection pool.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Most connections open to one shard at once; further requests wait for one.
    pub max_size: usize,
    /// Connections opened at start-up and kept ready.
    pub min_idle: usize,
    /// Milliseconds allowed to connect and shake hands (and to wait for a free connection).
    pub connect_timeout_ms: u64,
    /// Milliseconds allowed for one request to a shard.
    pub request_timeout_ms: u64,
    /// Replica-set shards: milliseconds between two checks of a member (`hello`) when nothing
    /// changes (at least 500); members that support it are followed by awaitable `hello` and
    /// report a change at once.
    pub heartbeat_frequency_ms: u64,
    /// Replica-set shards: reads go to a member within this many milliseconds of the nearest
    /// eligible one.
    pub local_threshold_ms: u64,
    /// Replica-set shards: milliseconds a request waits for a member that serves it (a new
    /// primary after an election) before it fails with FailedToSatisfyReadPreference (133).
    pub server_selection_timeout_ms: u64,
    /// Replica-set shards: follow members by awaitable `hello` where they support it (false:
    /// poll every heartbeat).
    pub streaming_monitor: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_size: 64,
            min_idle: 0,
            connect_timeout_ms: 5_000,
            request_timeout_ms: 60_000,
            heartbeat_frequency_ms: 10_000,
            local_threshold_ms: 15,
            server_selection_timeout_ms: 15_000,
            streaming_monitor: true,
        }
    }
}

impl PoolConfig {
    /// The backend's pool options.
    pub fn options(&self) -> crate::backend::PoolOptions {
        crate::backend::PoolOptions {
            max_size: self.max_size.max(1),
            min_idle: self.min_idle.min(self.max_size),
            connect_timeout: std::time::Duration::from_millis(self.connect_timeout_ms),
            request_timeout: std::time::Duration::from_millis(self.request_timeout_ms),
            security: Default::default(),
            replica_set: crate::backend::topology::TopologySettings {
                heartbeat_frequency: std::time::Duration::from_millis(self.heartbeat_frequency_ms),
                local_threshold: std::time::Duration::from_millis(self.local_threshold_ms),
                find_host_timeout: std::time::Duration::from_millis(
                    self.server_selection_timeout_ms,
                ),
                streaming: self.streaming_monitor,
                ..Default::default()
            },
        }
    }
}

/// One shard of the cluster.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShardConfig {
    /// The shard id (`config.shards._id`), e.g. `"shard0"`.
    pub id: String,
    /// `host:port` of a single server (a `sluice shard` process or a mongod), or a replica
    /// set's seed list, `"rs0/host1:27018,host2:27018"`, whose members Sluice discovers and
    /// whose primary it follows.
    pub address: String,
    /// Whether the shard understands `shardVersion` on requests: true for `sluice shard` and
    /// for mongod started as a shard server (`--shardsvr`); false for a plain mongod, which
    /// rejects the field.
    #[serde(default = "default_true")]
    pub shard_server: bool,
}

fn default_true() -> bool {
    true
}

/// A collection sharded at start-up.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CollectionConfig {
    /// `db.collection`.
    pub ns: String,
    /// The shard key as a JSON document, e.g. `'{"_id": "hashed"}'` (a string, so that the
    /// order of compound key fields is kept).
    pub key: String,
    /// Whether the shard key is unique (not allowed for hashed keys).
    #[serde(default)]
    pub unique: bool,
    /// Initial chunks for a hashed key (default: 2 per shard).
    #[serde(default)]
    pub num_initial_chunks: Option<u32>,
}

impl CollectionConfig {
    /// The key as a BSON document.
    pub fn key_document(&self) -> Result<bson::Document, ConfigError> {
        let v: serde_json::Value = serde_json::from_str(&self.key).map_err(|e| {
            ConfigError::Invalid(format!(
                "collection {}: key {:?} is not JSON: {e}",
                self.ns, self.key
            ))
        })?;
        match bson::Bson::try_from(v) {
            Ok(bson::Bson::Document(d)) => Ok(d),
            _ => Err(ConfigError::Invalid(format!(
                "collection {}: key {:?} must be a JSON object",
                self.ns, self.key
            ))),
        }
    }
}

/// Logging settings.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `"text"` for people, `"json"` for log pipelines (one JSON object a line).
    pub format: LogFormat,
    /// A `tracing` filter: `"info"`, `"debug"`, `"sluice=debug,info"`, …; `RUST_LOG` wins
    /// when set.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            level: "info".to_string(),
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// A configuration that could not be used. Each variant's message says what failed and leaves
/// the why to its source, so a report that prints the chain (`anyhow` in `main`) says each
/// thing once.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("invalid configuration in {path}")]
    Parse {
        /// The file.
        path: String,
        /// Why.
        source: toml::de::Error,
    },
    /// A value is out of range.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// The ordered-rewrite policy of a namespace.
    pub fn rewrite_policy(&self, ns: &str) -> Policy {
        self.ordered_rewrite_overrides
            .get(ns)
            .copied()
            .unwrap_or(self.ordered_rewrite)
    }

    /// The shard pools' settings with what Sluice proves itself with to shards: TLS when
    /// `tls.mode` is `prefer` or `require` (verified against `tls.ca_file`, presenting
    /// `tls.certificate_key_file`), and the keyfile's `__system` when `security.key_file` is set.
    pub fn pool_options(&self) -> Result<crate::backend::PoolOptions, ConfigError> {
        let mut options = self.pool.options();
        let read = |path: &str, what: &str| {
            std::fs::read(path)
                .map_err(|e| ConfigError::Invalid(format!("cannot read {what} {path}: {e}")))
        };
        let mode = self.security.cluster_auth_mode;
        match &self.security.key_file {
            Some(path) if !mode.sends_x509() => {
                let keyfile = crate::auth::keyfile::KeyFile::load(Path::new(path))
                    .map_err(|e| ConfigError::Invalid(e.message))?;
                options.security.keyfile = Some(std::sync::Arc::new(keyfile));
            }
            _ => {}
        }
        // The certificate presented to shards: the cluster certificate, else the server's.
        let outgoing_cert = self
            .tls
            .cluster_file
            .as_ref()
            .or(self.tls.certificate_key_file.as_ref());
        if mode.sends_x509() {
            if !self.tls.mode.outgoing_tls() || outgoing_cert.is_none() {
                return Err(ConfigError::Invalid(
                    "security.cluster_auth_mode sendX509 and x509 need TLS towards the shards \
                     (tls.mode prefer or require) and tls.cluster_file or \
                     tls.certificate_key_file"
                        .into(),
                ));
            }
            options.security.x509 = true;
        }
        if self.tls.mode.outgoing_tls() {
            let ca = match &self.tls.ca_file {
                Some(p) => Some(read(p, "the CA file")?),
                None => None,
            };
            let cert = match (&self.tls.cluster_file, outgoing_cert) {
                (Some(p), _) => Some(read(p, "the cluster certificate file")?),
                (None, Some(p)) => Some(read(p, "the certificate key file")?),
                (None, None) => None,
            };
            let client = crate::auth::tls::client_config(&crate::auth::tls::ClientTlsSettings {
                ca_pem: ca.as_deref(),
                certificate_key_pem: cert.as_deref(),
                allow_invalid_certificates: self.tls.allow_invalid_certificates,
                allow_invalid_hostnames: self.tls.allow_invalid_hostnames,
            })
            .map_err(|e| ConfigError::Invalid(e.message))?;
            options.security.tls = Some(client);
            options.security.tls_files = Some(crate::backend::TlsFiles {
                ca_file: self.tls.ca_file.as_ref().map(std::path::PathBuf::from),
                certificate_key_file: outgoing_cert.map(std::path::PathBuf::from),
                allow_invalid_certificates: self.tls.allow_invalid_certificates,
            });
        }
        Ok(options)
    }

    /// Reads and checks a configuration file.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let config: Config = toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.display().to_string(),
            source,
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks values that the types alone do not constrain.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.tls.mode.accepts_tls() && self.tls.certificate_key_file.is_none() {
            return Err(ConfigError::Invalid(format!(
                "tls.mode = \"{}\" needs tls.certificate_key_file",
                self.tls.mode
            )));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::Invalid(
                "max_connections must be at least 1".into(),
            ));
        }
        if self.pool.heartbeat_frequency_ms < 500 {
            return Err(ConfigError::Invalid(format!(
                "pool.heartbeat_frequency_ms = {} is below the minimum of 500",
                self.pool.heartbeat_frequency_ms
            )));
        }
        if self.configdb.is_some() {
            let static_part = [
                (!self.shards.is_empty(), "shards"),
                (!self.collections.is_empty(), "collections"),
                (self.metadata_path.is_some(), "metadata_path"),
            ];
            if let Some((_, what)) = static_part.iter().find(|(set, _)| *set) {
                return Err(ConfigError::Invalid(format!(
                    "configdb and {what} are mutually exclusive: with a config server the \
                     cluster's shards, databases and collections come from it"
                )));
            }
            let files = [
                (self.security.users_file.is_some(), "security.users_file"),
                (self.security.roles_file.is_some(), "security.roles_file"),
            ];
            if let Some((_, what)) = files.iter().find(|(set, _)| *set) {
                return Err(ConfigError::Invalid(format!(
                    "configdb and {what} are mutually exclusive: with a config server the \
                     users and roles are its admin.system.users and admin.system.roles"
                )));
            }
        }
        let mut ids = std::collections::BTreeSet::new();
        for s in &self.shards {
            if s.id.is_empty() || !ids.insert(s.id.clone()) {
                return Err(ConfigError::Invalid(format!(
                    "shard id {:?} is empty or repeated",
                    s.id
                )));
            }
            if s.address
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse::<u16>().ok())
                .is_none()
            {
                return Err(ConfigError::Invalid(format!(
                    "shard {}: address {:?} is not host:port or a replica set's seed list",
                    s.id, s.address
                )));
            }
            if let Err(e) = crate::backend::topology::SeedList::parse(&s.address) {
                return Err(ConfigError::Invalid(format!(
                    "shard {}: address {:?}: {}",
                    s.id, s.address, e.message
                )));
            }
        }
        for c in &self.collections {
            if c.ns
                .split_once('.')
                .is_none_or(|(d, c)| d.is_empty() || c.is_empty())
            {
                return Err(ConfigError::Invalid(format!(
                    "collection {:?} is not db.collection",
                    c.ns
                )));
            }
            c.key_document()?;
        }
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(ConfigError::Invalid(format!(
                "listen = {:?} is not an address of the form ip:port",
                self.listen
            )));
        }
        Ok(())
    }
}

/// When an ordered bulk may be rewritten into one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Rewrite when every statement targets one shard, every statement has a distinct
    /// identity, and every statement is retry-safe (the default).
    #[default]
    RetrySafe,
    /// Rewrite whenever every statement targets one shard; the client accepts unordered
    /// failure semantics.
    Always,
    /// Never rewrite: mongos rounds for every ordered bulk.
    Off,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configdb_excludes_the_static_cluster() {
        let c: Config = toml::from_str("configdb = \"configRS/cfg1:27019,cfg2:27019\"\n").unwrap();
        assert_eq!(
            c.configdb.as_deref(),
            Some("configRS/cfg1:27019,cfg2:27019")
        );
        c.validate().unwrap();
        for extra in [
            "[[shards]]\nid = \"shard0\"\naddress = \"127.0.0.1:27018\"\n",
            "metadata_path = \"/tmp/m.bson\"\n",
            "[[collections]]\nns = \"a.b\"\nkey = '{\"_id\": \"hashed\"}'\n",
            "[security]\nusers_file = \"users.json\"\n",
            "[security]\nroles_file = \"roles.json\"\n",
        ] {
            let text = format!("configdb = \"configRS/cfg1:27019\"\n{extra}");
            let c: Config = toml::from_str(&text).unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("mutually exclusive"), "{e}");
        }
    }

    #[test]
    fn defaults_and_overrides() {
        let c: Config = toml::from_str("max_connections = 5\n[log]\nformat = \"json\"\n").unwrap();
        assert_eq!(c.max_connections, 5);
        assert_eq!(c.log.format, LogFormat::Json);
        assert_eq!(c.listen, "127.0.0.1:27017");
        c.validate().unwrap();
    }

    #[test]
    fn shipped_example_is_the_defaults() {
        let c: Config = toml::from_str(include_str!("../configs/sluice.toml")).unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn cluster_example_parses() {
        let c: Config = toml::from_str(include_str!("../configs/cluster.toml")).unwrap();
        c.validate().unwrap();
        assert_eq!(c.shards.len(), 3);
        assert_eq!(
            c.collections[0].key_document().unwrap(),
            bson::doc! {"_id": "hashed"}
        );
        let demo: Config = toml::from_str(include_str!("../configs/demo.toml")).unwrap();
        demo.validate().unwrap();
        assert!(demo
            .collections
            .iter()
            .any(|c| c.ns == "demo.store_inventory"));
        let compound = CollectionConfig {
            ns: "a.b".into(),
            key: r#"{"region": 1, "_id": "hashed"}"#.into(),
            unique: false,
            num_initial_chunks: None,
        };
        let keys: Vec<String> = compound.key_document().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["region", "_id"], "field order is kept");
    }

    #[test]
    fn rewrite_policy_overrides() {
        let c: Config = toml::from_str(
            "ordered_rewrite = \"always\"\n[ordered_rewrite_overrides]\n\"a.b\" = \"off\"\n",
        )
        .unwrap();
        assert_eq!(c.rewrite_policy("a.b"), Policy::Off);
        assert_eq!(c.rewrite_policy("a.c"), Policy::Always);
        assert_eq!(Config::default().rewrite_policy("x.y"), Policy::RetrySafe);
        assert!(toml::from_str::<Config>("ordered_rewrite = \"sometimes\"").is_err());
    }

    #[test]
    fn a_file_error_says_its_cause_once() {
        use std::error::Error as _;
        let dir = std::env::temp_dir().join(format!("sluice-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.toml");
        std::fs::write(&bad, "max_conections = 5\n").unwrap();
        for (path, cause) in [
            (dir.join("missing.toml"), "No such file"),
            (bad, "max_conections"),
        ] {
            let e = Config::from_file(&path).unwrap_err();
            let mut chain = vec![e.to_string()];
            let mut source = e.source();
            while let Some(s) = source {
                chain.push(s.to_string());
                source = s.source();
            }
            assert_eq!(chain.len(), 2, "{chain:?}");
            assert!(chain[0].contains(&path.display().to_string()), "{chain:?}");
            assert!(
                !chain[0].contains(cause),
                "the cause is the source's to say: {chain:?}"
            );
            assert!(chain[1].contains(cause), "{chain:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert!(toml::from_str::<Config>("max_conections = 5").is_err());
        assert!(toml::from_str::<Config>("[log]\ncolour = true").is_err());
    }

    #[test]
    fn bad_values_are_refused() {
        let c = Config {
            listen: "nowhere".into(),
            ..Config::default()
        };
        assert!(c.validate().is_err());
        let c = Config {
            max_connections: 0,
            ..Config::default()
        };
        assert!(c.validate().is_err());
    }
}
