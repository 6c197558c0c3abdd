//! What a request carries to a shard: `shardVersion` and `databaseVersion`, exactly as mongos
//! 6.0+ attaches them.
//!
//! | target | `shardVersion` | `databaseVersion` |
//! |---|---|---|
//! | a tracked collection, any shard | `{e, t, v}`, `v` = that shard's placement version | — |
//! | an untracked collection, the primary shard | UNSHARDED | `{uuid, timestamp, lastMod}` |
//! | `admin`, `config` (fixed databases) | — | — |

use std::sync::Arc;

use bson::{Document, RawDocumentBuf};

use crate::value::error_codes::ErrorCode;

use super::collection::CollectionRouting;
use super::documents::DatabaseEntry;
use super::error::MetadataError;
use super::version::{DatabaseVersion, ShardVersion};

/// Where a database lives.
#[derive(Debug, Clone, PartialEq)]
pub enum DatabaseRouting {
    /// `admin` and `config`: on the config server, never versioned.
    Fixed,
    /// A database of `config.databases`.
    Tracked(Arc<DatabaseEntry>),
}

impl DatabaseRouting {
    /// Whether `db` is one of the fixed databases.
    pub fn is_fixed_name(db: &str) -> bool {
        db == "admin" || db == "config"
    }

    /// The primary shard's id (`None` for a fixed database).
    pub fn primary(&self) -> Option<&str> {
        match self {
            DatabaseRouting::Fixed => None,
            DatabaseRouting::Tracked(d) => Some(&d.primary),
        }
    }

    /// The database version (`None` for a fixed database).
    pub fn version(&self) -> Option<DatabaseVersion> {
        match self {
            DatabaseRouting::Fixed => None,
            DatabaseRouting::Tracked(d) => Some(d.version),
        }
    }
}

/// A namespace's routing as one request sees it, from the cache at one moment.
#[derive(Debug, Clone)]
pub struct RoutingInfo {
    /// The namespace.
    pub ns: String,
    /// The database.
    pub db: DatabaseRouting,
    /// The collection's routing when it is tracked; `None` when it lives on the primary.
    pub collection: Option<Arc<CollectionRouting>>,
}

impl RoutingInfo {
    /// The versions a request for this namespace carries to `shard`. An untracked collection
    /// lives on its database's primary only; targeting another shard with it is a bug of the
    /// caller, reported as `InternalError` rather than sent unversioned.
    pub fn versions_for(&self, shard: &str) -> Result<RequestVersions, MetadataError> {
        if let Some(c) = &self.collection {
            return Ok(RequestVersions {
                shard_version: Some(c.shard_version(shard)),
                database_version: None,
            });
        }
        match &self.db {
            DatabaseRouting::Fixed => Ok(RequestVersions::default()),
            DatabaseRouting::Tracked(d) if d.primary == shard => Ok(RequestVersions {
                shard_version: Some(ShardVersion::unsharded()),
                database_version: Some(d.version),
            }),
            DatabaseRouting::Tracked(d) => Err(MetadataError::new(
                ErrorCode::InternalError,
                format!(
                    "{} is not tracked and lives on its primary shard {}, not on {shard}",
                    self.ns, d.primary
                ),
            )),
        }
    }
}

/// The version fields of one child command.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestVersions {
    /// `shardVersion`, if the command carries one.
    pub shard_version: Option<ShardVersion>,
    /// `databaseVersion`, if the command carries one.
    pub database_version: Option<DatabaseVersion>,
}

impl RequestVersions {
    /// Sets the fields on a command document (replacing any the client sent: only the router
    /// may version a request).
    pub fn apply_to(&self, cmd: &mut Document) {
        cmd.remove("shardVersion");
        cmd.remove("databaseVersion");
        if let Some(v) = self.shard_version {
            cmd.insert("shardVersion", v.to_document());
        }
        if let Some(v) = self.database_version {
            cmd.insert("databaseVersion", v.to_document());
        }
    }

    /// Appends the fields to a raw command body being built (the zero-copy path builds child
    /// commands as raw BSON and never had the fields).
    pub fn append_to(&self, cmd: &mut RawDocumentBuf) -> Result<(), MetadataError> {
        let raw = |d: Document| {
            RawDocumentBuf::try_from(&d)
                .map_err(|e| MetadataError::new(ErrorCode::InternalError, e.to_string()))
        };
        if let Some(v) = self.shard_version {
            cmd.append(bson::raw::cstr!("shardVersion"), raw(v.to_document())?);
        }
        if let Some(v) = self.database_version {
            cmd.append(bson::raw::cstr!("databaseVersion"), raw(v.to_document())?);
        }
        Ok(())
    }
}
