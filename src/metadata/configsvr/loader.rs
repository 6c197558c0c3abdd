//! The [`MetadataSource`] that reads a config server replica set through the `mongodb` crate.
//!
//! Every read is a `find` on the `config` database with **majority** read concern, from the
//! **primary**, inside a causally consistent session that starts from the highest operation
//! time any earlier read observed (a router never reads an older catalog than it already read,
//! even across a config server failover). A collection refresh reads the `config.collections`
//! entry, its chunks (`{uuid, lastmod: {$gte: since}}` sorted by `lastmod`, or all of them when
//! the generation changed), then the entry again: if the generation moved in between, the read
//! is reported inconsistent (`ConflictingOperationInProgress`) and the cache reads again.
//!
//! The loader never writes to `config.*`.

use std::sync::Mutex;
use std::time::Duration;

use bson::{doc, Bson, Document, Timestamp};
use mongodb::options::{
    ClientOptions, DatabaseOptions, ReadConcern, ReadPreference, SelectionCriteria,
};
use mongodb::{Client, ClientSession, Database};

use crate::sync::lock;
use crate::value::error_codes::ErrorCode;

use super::cache::{BoxFuture, CollectionRead, MetadataSource, Since};
use super::configdb::ConfigDb;
use super::error::MetadataError;
use super::version::compare_timestamps;

/// How long a read waits for a reachable config primary before it fails.
pub const SERVER_SELECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// A config server, read through the stock driver.
#[derive(Debug)]
pub struct ConfigServerSource {
    client: Client,
    config: Database,
    name: String,
    operation_time: Mutex<Option<Timestamp>>,
}

impl ConfigServerSource {
    /// A source for `--configdb`: the driver discovers the replica set's members from the seeds
    /// and follows its primary. Nothing is contacted until the first read.
    pub async fn connect(configdb: &ConfigDb) -> Result<Self, MetadataError> {
        let mut options = ClientOptions::parse(configdb.uri())
            .await
            .map_err(|e| from_driver(&configdb.to_string(), e))?;
        options.app_name = Some("sluice".to_string());
        options.server_selection_timeout = Some(SERVER_SELECTION_TIMEOUT);
        Self::with_options(options)
    }

    /// [`ConfigServerSource::connect`] with the router's security towards its cluster: TLS
    /// (verified against the CA file, presenting the cluster certificate) and internal
    /// authentication (`__system@local` with SCRAM-SHA-256 over the keyfile's first key, or
    /// MONGODB-X509 with the cluster certificate), as towards the shards.
    pub async fn connect_secured(
        configdb: &ConfigDb,
        security: &crate::backend::ShardSecurity,
    ) -> Result<Self, MetadataError> {
        let mut options = ClientOptions::parse(configdb.uri())
            .await
            .map_err(|e| from_driver(&configdb.to_string(), e))?;
        options.app_name = Some("sluice".to_string());
        options.server_selection_timeout = Some(SERVER_SELECTION_TIMEOUT);
        secure_client_options(&mut options, security);
        Self::with_options(options)
    }

    /// A source over explicit driver options (TLS, credentials, monitoring, timeouts).
    pub fn with_options(options: ClientOptions) -> Result<Self, MetadataError> {
        let name = match &options.repl_set_name {
            Some(set) => format!(
                "{set}/{}",
                options
                    .hosts
                    .iter()
                    .map(|h| h.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            None => options
                .hosts
                .iter()
                .map(|h| h.to_string())
                .collect::<Vec<_>>()
                .join(","),
        };
        let client = Client::with_options(options).map_err(|e| from_driver(&name, e))?;
        let config = client.database_with_options(
            "config",
            DatabaseOptions::builder()
                .read_concern(ReadConcern::majority())
                .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
                .build(),
        );
        Ok(ConfigServerSource {
            client,
            config,
            name,
            operation_time: Mutex::new(None),
        })
    }

    /// Ends the driver's monitors and connections. A client left to the runtime's end has its
    /// monitoring tasks cancelled under it, which the driver reports as a panic.
    /// Bounded: the driver's shutdown waits for its sessions and cursors to be dropped.
    pub async fn shutdown(&self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.client.clone().shutdown()).await;
    }

    /// Runs an internal command (`_configsvrCreateDatabase`, …) on the config server's
    /// primary, in the `admin` database, as mongos sends them: with a majority write concern.
    /// The reply of a command that failed is returned as the error it carries.
    pub async fn run_admin_command(
        &self,
        mut command: Document,
    ) -> Result<Document, MetadataError> {
        if !command.contains_key("writeConcern") {
            command.insert("writeConcern", doc! {"w": "majority"});
        }
        self.run_admin_command_as_is(command).await
    }

    /// [`ConfigServerSource::run_admin_command`] without adding a write concern, for the
    /// internal commands that take none (`_configsvrBalancerStatus`, …).
    pub async fn run_admin_command_as_is(
        &self,
        command: Document,
    ) -> Result<Document, MetadataError> {
        self.run_command_in("admin", command).await
    }

    /// Runs `command` as it is in the database `db` of the config server's primary (the
    /// router's forwarded reads of the `config` database).
    pub async fn run_command_in(
        &self,
        db: &str,
        command: Document,
    ) -> Result<Document, MetadataError> {
        let reply = self
            .client
            .database(db)
            .run_command(command)
            .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
            .await
            .map_err(|e| from_driver(&self.name, e))?;
        Ok(reply)
    }

    /// Reads every `admin.system.users` and `admin.system.roles` document (majority, from the
    /// primary, in one causally consistent session): the users and custom roles of the
    /// cluster, which mongos reads from the config server too.
    pub async fn read_authorization(
        &self,
    ) -> Result<(Vec<Document>, Vec<Document>), MetadataError> {
        let mut session = self.session().await?;
        let admin = self.client.database_with_options(
            "admin",
            DatabaseOptions::builder()
                .read_concern(ReadConcern::majority())
                .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
                .build(),
        );
        let mut out = (Vec::new(), Vec::new());
        for (coll, into) in [("system.users", &mut out.0), ("system.roles", &mut out.1)] {
            let mut cursor = admin
                .collection::<Document>(coll)
                .find(doc! {})
                .session(&mut session)
                .await
                .map_err(|e| from_driver(&self.name, e))?;
            while let Some(d) = cursor.next(&mut session).await {
                into.push(d.map_err(|e| from_driver(&self.name, e))?);
            }
        }
        self.note(&session);
        Ok(out)
    }

    /// The config server as `--configdb` named it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A causally consistent session that reads no older than any earlier read did.
    async fn session(&self) -> Result<ClientSession, MetadataError> {
        let mut session = self
            .client
            .start_session()
            .causal_consistency(true)
            .await
            .map_err(|e| from_driver(&self.name, e))?;
        if let Some(t) = *lock(&self.operation_time) {
            session.advance_operation_time(t);
        }
        Ok(session)
    }

    /// Remembers how far the session read.
    fn note(&self, session: &ClientSession) {
        if let Some(t) = session.operation_time() {
            let mut seen = lock(&self.operation_time);
            if seen.is_none_or(|s| compare_timestamps(t, s).is_gt()) {
                *seen = Some(t);
            }
        }
    }

    async fn find(
        &self,
        session: &mut ClientSession,
        collection: &str,
        filter: Document,
        sort: Option<Document>,
    ) -> Result<Vec<Document>, MetadataError> {
        let coll = self.config.collection::<Document>(collection);
        let mut find = coll.find(filter);
        if let Some(sort) = sort {
            find = find.sort(sort);
        }
        let mut cursor = find
            .session(&mut *session)
            .await
            .map_err(|e| from_driver(&self.name, e))?;
        let mut out = Vec::new();
        while let Some(d) = cursor.next(session).await {
            out.push(d.map_err(|e| from_driver(&self.name, e))?);
        }
        Ok(out)
    }

    async fn find_one(
        &self,
        session: &mut ClientSession,
        collection: &str,
        filter: Document,
    ) -> Result<Option<Document>, MetadataError> {
        Ok(self
            .find(session, collection, filter, None)
            .await?
            .into_iter()
            .next())
    }

    async fn read_collection(
        &self,
        ns: &str,
        since: Option<Since>,
    ) -> Result<Option<CollectionRead>, MetadataError> {
        let mut session = self.session().await?;
        let result = async {
            let Some(entry) = self
                .find_one(&mut session, "collections", doc! {"_id": ns})
                .await?
            else {
                return Ok(None);
            };
            let Some(uuid) = entry.get("uuid").cloned() else {
                // The parser reports the missing field, naming the document.
                return Ok(Some(CollectionRead {
                    collection: entry,
                    chunks: Vec::new(),
                    incremental: false,
                }));
            };
            let same_generation = since.filter(|s| {
                entry.get("lastmodEpoch") == Some(&Bson::ObjectId(s.generation.epoch))
                    && entry.get("timestamp") == Some(&Bson::Timestamp(s.generation.timestamp))
            });
            let mut filter = doc! {"uuid": uuid};
            if let Some(s) = same_generation {
                filter.insert("lastmod", doc! {"$gte": s.version.timestamp()});
            }
            let chunks = self
                .find(&mut session, "chunks", filter, Some(doc! {"lastmod": 1}))
                .await?;
            let again = self
                .find_one(&mut session, "collections", doc! {"_id": ns})
                .await?;
            let generation = |d: &Document| {
                (
                    d.get("lastmodEpoch").cloned(),
                    d.get("timestamp").cloned(),
                    d.get("uuid").cloned(),
                )
            };
            if again.as_ref().map(generation) != Some(generation(&entry)) {
                return Err(MetadataError::new(
                    ErrorCode::ConflictingOperationInProgress,
                    format!("collection {ns} changed while its chunks were read"),
                ));
            }
            Ok(Some(CollectionRead {
                collection: entry,
                chunks,
                incremental: same_generation.is_some(),
            }))
        }
        .await;
        self.note(&session);
        result
    }
}

impl MetadataSource for ConfigServerSource {
    fn shards(&self) -> BoxFuture<'_, Result<Vec<Document>, MetadataError>> {
        Box::pin(async move {
            let mut session = self.session().await?;
            let r = self.find(&mut session, "shards", doc! {}, None).await;
            self.note(&session);
            r
        })
    }

    fn database<'a>(
        &'a self,
        db: &'a str,
    ) -> BoxFuture<'a, Result<Option<Document>, MetadataError>> {
        Box::pin(async move {
            let mut session = self.session().await?;
            let r = self
                .find_one(&mut session, "databases", doc! {"_id": db})
                .await;
            self.note(&session);
            r
        })
    }

    fn collection<'a>(
        &'a self,
        ns: &'a str,
        since: Option<Since>,
    ) -> BoxFuture<'a, Result<Option<CollectionRead>, MetadataError>> {
        Box::pin(self.read_collection(ns, since))
    }
}

/// A driver error as the router reports it: a server's own error keeps its code; failing to
/// reach the config server is `HostUnreachable`.
fn from_driver(name: &str, e: mongodb::error::Error) -> MetadataError {
    use mongodb::error::ErrorKind;
    match e.kind.as_ref() {
        ErrorKind::Command(c) => MetadataError::new(ErrorCode(c.code), c.message.clone()),
        ErrorKind::ServerSelection { message, .. } => MetadataError::new(
            ErrorCode::HostUnreachable,
            format!("unable to reach the config server {name}: {message}"),
        ),
        ErrorKind::Io(io) => MetadataError::new(
            ErrorCode::HostUnreachable,
            format!("error reading from the config server {name}: {io}"),
        ),
        ErrorKind::ConnectionPoolCleared { message, .. } => MetadataError::new(
            ErrorCode::HostUnreachable,
            format!("connection to the config server {name} lost: {message}"),
        ),
        ErrorKind::Authentication { message, .. } => MetadataError::new(
            ErrorCode::AuthenticationFailed,
            format!("authentication to the config server {name} failed: {message}"),
        ),
        ErrorKind::InvalidArgument { message, .. } => {
            MetadataError::new(ErrorCode::BadValue, message.clone())
        }
        _ => MetadataError::new(
            ErrorCode::InternalError,
            format!("reading the config server {name}: {e}"),
        ),
    }
}

/// Driver options made to prove who the connecting server is to its cluster, as towards the
/// shards: TLS (verified against the CA file, presenting the cluster certificate) and internal
/// authentication (`__system@local` with SCRAM-SHA-256 over the keyfile's first key, or
/// MONGODB-X509 with the cluster certificate). Nothing changes without them.
pub fn secure_client_options(
    options: &mut ClientOptions,
    security: &crate::backend::ShardSecurity,
) {
    use mongodb::options::{AuthMechanism, Credential, Tls, TlsOptions};
    if let Some(files) = &security.tls_files {
        options.tls = Some(Tls::Enabled(
            TlsOptions::builder()
                .ca_file_path(files.ca_file.clone())
                .cert_key_file_path(files.certificate_key_file.clone())
                .allow_invalid_certificates(Some(files.allow_invalid_certificates))
                .build(),
        ));
    }
    if security.x509 {
        options.credential = Some(
            Credential::builder()
                .mechanism(AuthMechanism::MongoDbX509)
                .build(),
        );
    } else if let Some(keyfile) = &security.keyfile {
        options.credential = Some(
            Credential::builder()
                .username(crate::auth::INTERNAL_USER.to_string())
                .source(crate::auth::INTERNAL_DB.to_string())
                .password(keyfile.primary().to_string())
                .mechanism(AuthMechanism::ScramSha256)
                .build(),
        );
    }
}
