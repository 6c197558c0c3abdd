//! MongoDB's config server as the source of routing metadata (`--configdb`).
//!
//! The router reads `config.shards`, `config.databases`, `config.collections` and
//! `config.chunks` (MongoDB 6.0+ schema) with majority read concern, caches them per database and
//! per collection, attaches the versions it routed with to every request, and refreshes when a
//! shard says it is behind. `docs/design/config-server.md` describes the whole design.
//!
//! - [`documents`]: the `config.*` documents parsed, with mongod's errors for malformed ones.
//! - [`version`]: collection generations, shard versions (`{e, t, v}`), database versions.
//! - [`collection`]: one collection's routing; full builds and incremental refreshes, validated.
//! - [`request`]: the `shardVersion` / `databaseVersion` a request carries.
//! - [`stale`]: StaleConfig / StaleEpoch / StaleDbVersion read into refresh actions.
//! - [`cache`]: the catalog cache with single-flight refreshes, over a [`MetadataSource`].
//! - [`configdb`]: `--configdb "<rs>/host:port,…"` and its driver URI.
//! - [`loader`]: the [`MetadataSource`] that reads a config server through the `mongodb` crate.
//!
//! Everything but the loader is sans-IO or in-memory and tested without sockets.

pub mod cache;
pub mod collection;
pub mod configdb;
pub mod documents;
pub use super::error;
mod fields;
pub mod loader;
pub mod request;
pub mod routing;
pub mod stale;
pub mod version;

#[cfg(test)]
pub(crate) mod test_support;

pub use cache::{
    CacheStats, CatalogCache, CollectionRead, MetadataSource, RefreshPolicy, ShardRegistry, Since,
};
pub use collection::{CollectionRouting, RefreshOutcome};
pub use configdb::{ConfigDb, CONFIG_SERVER_PORT};
pub use documents::{ChunkEntry, CollectionEntry, DatabaseEntry, ShardEntry};
pub use error::MetadataError;
pub use loader::ConfigServerSource;
pub use request::{DatabaseRouting, RequestVersions, RoutingInfo};
pub use routing::CatalogRouting;
pub use stale::{RefreshAction, StaleError};
pub use version::{CollectionGeneration, DatabaseVersion, ShardVersion};

/// How values are printed in the config documents' error messages: the project's value
/// printer, as the router and the embedded shard-server mode lend it to this module.
pub const PRINTER: crate::backend::topology::Printer = crate::backend::shard::PRINTER;
