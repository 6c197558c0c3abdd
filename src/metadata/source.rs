//! The one interface routing metadata comes through, whatever holds it.

use std::future::Future;
use std::pin::Pin;

use bson::Document;

use super::configsvr::version::CollectionGeneration;
use super::error::MetadataError;
use crate::routing::ChunkVersion;

/// A boxed future, so [`MetadataSource`] can be used as a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The cached collection version a refresh reads from: chunks with `lastmod ≥ version`, if the
/// collection still has this generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Since {
    /// The cached generation.
    pub generation: CollectionGeneration,
    /// The cached collection version.
    pub version: ChunkVersion,
}

/// One read of a tracked collection.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectionRead {
    /// Its `config.collections` document.
    pub collection: Document,
    /// Its `config.chunks` documents, sorted by `lastmod`.
    pub chunks: Vec<Document>,
    /// Whether `chunks` holds only those with `lastmod ≥` the version asked for (the entry kept
    /// the generation asked for); otherwise it holds all of them.
    pub incremental: bool,
}

/// Where routing metadata comes from: the `config.*` documents the router routes by, raw,
/// parsed by whoever caches them. The static store ([`super::StaticStore`], `--config` and
/// `sluice demo`) answers from the documents it holds; the config-server source
/// ([`super::configsvr::ConfigServerSource`], `--configdb`) reads a config server through the
/// `mongodb` crate; the catalog cache's tests implement it in memory.
pub trait MetadataSource: Send + Sync + 'static {
    /// Every `config.shards` document.
    fn shards(&self) -> BoxFuture<'_, Result<Vec<Document>, MetadataError>>;

    /// The `config.databases` document of `db`, if it exists.
    fn database<'a>(
        &'a self,
        db: &'a str,
    ) -> BoxFuture<'a, Result<Option<Document>, MetadataError>>;

    /// The `config.collections` document of `ns` and its chunks (all of them, or those since
    /// `since` when the entry still has `since.generation`); `None` when `ns` is not tracked.
    fn collection<'a>(
        &'a self,
        ns: &'a str,
        since: Option<Since>,
    ) -> BoxFuture<'a, Result<Option<CollectionRead>, MetadataError>>;
}
