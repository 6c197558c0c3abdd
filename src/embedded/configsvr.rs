//! The embedded config server (`sluice configsvr`, and in process): an embedded shard started
//! with [`super::ShardOptions::config_server`] holds the cluster's `config.*` documents on the
//! document engine, in the MongoDB 6.0+ schema, so a router reads them with the same loader
//! (majority `find`s) it uses against a real config server, and answers the config server's
//! internal commands by writing those documents.
//!
//! Served here: `_configsvrCreateDatabase` (the shape of MongoDB's `create_database.idl`:
//! `{_configsvrCreateDatabase: <db>, primaryShardId: <shard>?}` on `admin`, replying
//! `{databaseVersion}`), `_configsvrCommitChunkSplit` and `_configsvrCommitChunksMerge` (from
//! the shard that owns the chunks), `_configsvrAddShard` (async, in the service), `_configsvrBalancerStart` / `Stop` / `Status` (the mode in
//! `config.settings`), and the commits of the primary shard's DDL coordinators
//! (`_sluiceCommitShardCollection`, `_sluiceCommitDropCollection`,
//! `_sluiceCommitDropDatabase`: what MongoDB's coordinators write to `config.*` in one
//! transaction on the config server, applied here as one command under the catalog's lock).
//! Migrations are in [`super::migration`], `_configsvrRemoveShard` in [`super::remove_shard`].
//! With a metadata path, the `config` database is kept in a file ([`MetadataFile`]).
//! docs/design/config-server.md, §9 and §13.

use bson::{doc, Bson, Document};

use crate::command::CommandRequest;
use crate::engine::EngineError;
use crate::sync::lock;
use crate::value::error_codes::ErrorCode;

use super::service::ShardService;

/// The internal commands this config server answers.
const COMMANDS: &[&str] = &[
    "_configsvrCreateDatabase",
    "_configsvrCommitChunkSplit",
    "_configsvrCommitChunksMerge",
    "_configsvrBalancerStart",
    "_configsvrBalancerStop",
    "_configsvrBalancerStatus",
    "_sluiceCommitShardCollection",
    "_sluiceCommitDropCollection",
    "_sluiceCommitDropDatabase",
    "_sluiceCommitRenameCollection",
    "_sluiceCommitMovePrimary",
];

/// What a new config server holds before anything is added: `config.version` with the
/// cluster's id, as MongoDB's config server writes it when it starts.
pub fn seed(catalog: &mut super::store::Catalog) {
    let (version, _) = catalog.collection_mut("config", "version");
    if version.is_empty() {
        let _ = version.insert(
            "config.version",
            doc! {"_id": 1, "clusterId": bson::oid::ObjectId::new()},
        );
    }
}

/// Whether `name` is one of them.
pub fn serves(name: &str) -> bool {
    COMMANDS.contains(&name)
}

/// Runs one of [`COMMANDS`].
pub fn run(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    req.require_admin()?;
    match req.name.as_str() {
        "_configsvrCreateDatabase" => create_database(svc, body),
        "_configsvrCommitChunkSplit" => super::configsvr_ddl::commit_split(svc, body),
        "_configsvrCommitChunksMerge" => super::configsvr_ddl::commit_merge(svc, body),
        "_configsvrBalancerStart" | "_configsvrBalancerStop" | "_configsvrBalancerStatus" => {
            super::configsvr_ddl::balancer(svc, &req.name)
        }
        "_sluiceCommitShardCollection" => super::configsvr_ddl::commit_shard_collection(svc, body),
        "_sluiceCommitDropCollection" => super::configsvr_ddl::commit_drop_collection(svc, body),
        "_sluiceCommitDropDatabase" => super::configsvr_ddl::commit_drop_database(svc, body),
        "_sluiceCommitRenameCollection" => {
            super::configsvr_ddl::commit_rename_collection(svc, body)
        }
        "_sluiceCommitMovePrimary" => super::configsvr_ddl::commit_move_primary(svc, body),
        other => Err(EngineError::new(
            ErrorCode::CommandNotFound,
            format!("no such command: '{other}'"),
        )),
    }
}

pub(super) fn string_field<'a>(
    body: &'a Document,
    command: &str,
    field: &str,
) -> Result<&'a str, EngineError> {
    match body.get(field) {
        Some(Bson::String(s)) => Ok(s),
        Some(v) => Err(EngineError::new(
            ErrorCode::TypeMismatch,
            format!(
                "BSON field '{command}.{field}' is the wrong type '{}', expected type 'string'",
                crate::value::field::type_name(v)
            ),
        )),
        None => Err(EngineError::new(
            ErrorCode(40414),
            format!("BSON field '{command}.{field}' is missing but a required field"),
        )),
    }
}

/// A required object field of an internal command, with mongod's errors for a missing field or
/// the wrong type.
pub(super) fn object_field<'a>(
    body: &'a Document,
    command: &str,
    field: &str,
) -> Result<&'a Document, EngineError> {
    match body.get(field) {
        Some(Bson::Document(d)) => Ok(d),
        Some(v) => Err(EngineError::new(
            ErrorCode::TypeMismatch,
            format!(
                "BSON field '{command}.{field}' is the wrong type '{}', expected type 'object'",
                crate::value::field::type_name(v)
            ),
        )),
        None => Err(EngineError::new(
            ErrorCode(40414),
            format!("BSON field '{command}.{field}' is missing but a required field"),
        )),
    }
}

/// `_configsvrCreateDatabase`: records `db` in `config.databases` with a primary shard (the
/// one asked for, or the shard that is primary of the fewest databases, ties by id) and a
/// new database version; an existing database is answered with its version (an existing one
/// with another primary than the one asked for is NamespaceExists, as the config server
/// refuses it).
fn create_database(svc: &ShardService, body: &Document) -> Result<Document, EngineError> {
    const CMD: &str = "_configsvrCreateDatabase";
    let db = string_field(body, CMD, CMD)?.to_string();
    let wanted = match body.get("primaryShardId") {
        None => None,
        Some(_) => Some(string_field(body, CMD, "primaryShardId")?.to_string()),
    };
    crate::limits::check_database_name(&db)
        .map_err(|m| EngineError::new(ErrorCode::InvalidNamespace, m))?;
    if matches!(db.as_str(), "admin" | "config" | "local") {
        return Err(EngineError::new(
            ErrorCode::InvalidOptions,
            format!("Cannot manually create database '{db}'"),
        ));
    }
    let now = svc.cluster_time();
    let mut catalog = lock(&svc.catalog);
    let shards: Vec<String> = catalog
        .collection("config", "shards")
        .map(|c| {
            c.iter()
                .filter_map(|(_, d)| d.get_str("_id").ok().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    // A shard being removed is not given a new database.
    let draining: Vec<String> = catalog
        .collection("config", "shards")
        .map(|c| {
            c.iter()
                .filter(|(_, d)| d.get("draining").is_some_and(crate::value::field::truthy))
                .filter_map(|(_, d)| d.get_str("_id").ok().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let databases: Vec<Document> = catalog
        .collection("config", "databases")
        .map(|c| c.iter().map(|(_, d)| d.clone()).collect())
        .unwrap_or_default();
    if let Some(existing) = databases
        .iter()
        .find(|d| d.get_str("_id").ok() == Some(&db))
    {
        let primary = existing.get_str("primary").unwrap_or_default();
        if wanted.as_deref().is_some_and(|w| w != primary) {
            return Err(EngineError::new(
                ErrorCode::NamespaceExists,
                format!("database {db} already exists with primary shard {primary}"),
            ));
        }
        let version = existing.get("version").cloned().unwrap_or(Bson::Null);
        return Ok(doc! {"databaseVersion": version});
    }
    if let Some(other) = databases
        .iter()
        .filter_map(|d| d.get_str("_id").ok())
        .find(|n| n.eq_ignore_ascii_case(&db) && *n != db)
    {
        return Err(EngineError::new(
            ErrorCode::DatabaseDifferCase,
            format!("database already exists with different case already have: [{other}] trying to create [{db}]"),
        ));
    }
    let primary = match wanted {
        Some(w) if shards.contains(&w) => w,
        Some(w) => {
            return Err(EngineError::new(
                ErrorCode::ShardNotFound,
                format!("Shard {w} not found"),
            ))
        }
        None => {
            let load = |s: &String| {
                databases
                    .iter()
                    .filter(|d| d.get_str("primary").ok() == Some(s.as_str()))
                    .count()
            };
            let mut candidates: Vec<String> = shards
                .iter()
                .filter(|s| !draining.contains(s))
                .cloned()
                .collect();
            candidates.sort();
            candidates
                .into_iter()
                .min_by_key(|s| load(s))
                .ok_or_else(|| {
                    EngineError::new(
                        ErrorCode::ShardNotFound,
                        format!("Database {db} could not be created: the cluster has no shards"),
                    )
                })?
        }
    };
    let version = doc! {"uuid": bson::Uuid::new(), "timestamp": now, "lastMod": 1};
    let (coll, _) = catalog.collection_mut("config", "databases");
    coll.insert(
        "config.databases",
        doc! {"_id": &db, "primary": primary, "version": version.clone()},
    )?;
    Ok(doc! {"databaseVersion": version})
}

/// The version of the metadata file's layout.
const FILE_FORMAT: i32 = 1;

/// Where an embedded config server keeps its `config.*` documents, and the bytes it wrote
/// last (a command that changed nothing writes nothing).
#[derive(Debug)]
pub struct MetadataFile {
    path: std::path::PathBuf,
    written: std::sync::Mutex<Vec<u8>>,
}

impl MetadataFile {
    /// The file at `path` (not read yet).
    pub fn new(path: impl Into<std::path::PathBuf>) -> MetadataFile {
        MetadataFile {
            path: path.into(),
            written: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Reads the file into `catalog`'s `config` database; a missing file is an empty one. A
    /// file that does not parse, or holds a document the catalog refuses, is an error naming
    /// the file (and the collection and document).
    pub fn load(&self, catalog: &mut super::store::Catalog) -> std::io::Result<()> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("cannot read {}: {e}", self.path.display()),
                ))
            }
        };
        let bad = |what: String| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {what}", self.path.display()),
            )
        };
        let root = Document::from_reader(&mut bytes.as_slice())
            .map_err(|e| bad(format!("not a metadata file: {e}")))?;
        match root.get("format") {
            Some(Bson::Int32(FILE_FORMAT)) => {}
            other => return Err(bad(format!("unknown format {other:?}"))),
        }
        let config = root
            .get_document("config")
            .map_err(|_| bad("no config document".into()))?;
        for (name, docs) in config {
            let Bson::Array(docs) = docs else {
                return Err(bad(format!("config.{name} is not an array")));
            };
            let ns = format!("config.{name}");
            let (coll, _) = catalog.collection_mut("config", name);
            for d in docs {
                let Bson::Document(d) = d else {
                    return Err(bad(format!("{ns} holds a non-document: {d}")));
                };
                coll.insert(&ns, d.clone())
                    .map_err(|e| bad(format!("{ns} refuses {d}: {}", e.message)))?;
            }
        }
        *lock(&self.written) = bytes;
        Ok(())
    }

    /// Writes `catalog`'s `config` database to the file atomically (temporary file, fsync,
    /// rename) when it differs from what was written last. The caller holds no catalog lock.
    pub fn persist(
        &self,
        catalog: &std::sync::Mutex<super::store::Catalog>,
    ) -> std::io::Result<()> {
        // Held across the snapshot and the write, so a later snapshot is never overwritten
        // by an earlier one.
        let mut written = lock(&self.written);
        let mut config = Document::new();
        {
            let catalog = lock(catalog);
            if let Some(colls) = catalog.dbs.get("config") {
                for (name, coll) in colls {
                    let docs: Vec<Bson> = coll
                        .iter()
                        .map(|(_, d)| Bson::Document(d.clone()))
                        .collect();
                    config.insert(name.clone(), docs);
                }
            }
        }
        let root = doc! {"format": FILE_FORMAT, "config": config};
        let bytes = root.to_vec().map_err(std::io::Error::other)?;
        if bytes == *written {
            return Ok(());
        }
        crate::metadata::static_store::write_atomically(&self.path, &bytes).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "cannot persist the config metadata to {}: {e}",
                    self.path.display()
                ),
            )
        })?;
        *written = bytes;
        Ok(())
    }
}

/// Whether command `name` may change `config.*` on a config server (what is persisted after).
pub fn may_write(name: &str) -> bool {
    super::replset::is_write(name)
        || name == "bulkWrite"
        || name.starts_with("_configsvr")
        || name.starts_with("_sluiceCommit")
}
