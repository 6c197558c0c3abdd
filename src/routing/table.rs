//! Routing snapshots and the routing table cache.
//!
//! A [`RoutingSnapshot`] is one collection's immutable routing state (key pattern, epoch,
//! chunk map); the [`RoutingTable`] keeps them as `Arc`s in a `dashmap` keyed by namespace and
//! replaces them whole on refresh, so a lookup is a map read that never waits on I/O.

use std::sync::Arc;

use bson::{doc, oid::ObjectId, Document, Timestamp};
use dashmap::DashMap;

use super::{ChunkMap, RoutingError, ShardKey, ShardKeyPattern};

/// One sharded collection's routing state.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingSnapshot {
    /// `db.coll`.
    pub ns: String,
    /// The shard key pattern.
    pub pattern: ShardKeyPattern,
    /// Whether the shard key is unique.
    pub unique: bool,
    /// The collection epoch (`lastmodEpoch`).
    pub epoch: ObjectId,
    /// The collection generation timestamp.
    pub timestamp: Timestamp,
    /// The collection UUID.
    pub uuid: bson::Uuid,
    /// The chunks.
    pub chunks: ChunkMap,
}

impl RoutingSnapshot {
    /// A collection just sharded on `pattern` over `shard0`…`shard{n-1}`, with the initial
    /// chunks MongoDB lays out (see [`super::chunks::initial_chunks`]): what tests and
    /// benchmarks target against.
    pub fn initial(
        ns: &str,
        pattern: ShardKeyPattern,
        shards: usize,
    ) -> Result<RoutingSnapshot, RoutingError> {
        let ids: Vec<String> = (0..shards).map(|i| format!("shard{i}")).collect();
        let chunks = super::chunks::initial_chunks(&pattern, &ids, "shard0", None);
        RoutingSnapshot::with_chunks(ns, pattern, chunks)
    }

    /// A collection sharded on `pattern` with these chunks, a new epoch and generation 1|1.
    pub fn with_chunks(
        ns: &str,
        pattern: ShardKeyPattern,
        chunks: Vec<super::Chunk>,
    ) -> Result<RoutingSnapshot, RoutingError> {
        Ok(RoutingSnapshot {
            ns: ns.to_string(),
            chunks: ChunkMap::new(&pattern, chunks)?,
            pattern,
            unique: false,
            epoch: ObjectId::new(),
            timestamp: Timestamp {
                time: 1,
                increment: 1,
            },
            uuid: bson::Uuid::new(),
        })
    }

    pub fn shard_for(&self, key: &ShardKey) -> Option<&str> {
        self.chunks.find(key).map(|c| c.shard.as_str())
    }

    /// The `shardVersion` a child command to `shard` carries (MongoDB 6.0+ shape
    /// `{e, t, v}`).
    pub fn shard_version(&self, shard: &str) -> Document {
        doc! {
            "e": self.epoch,
            "t": self.timestamp,
            "v": self.chunks.shard_version(shard).timestamp(),
        }
    }

    /// [`RoutingSnapshot::shard_version`] encoded, written with its fixed layout (every child
    /// batch to a shard server carries one, so no document is built for it).
    pub fn shard_version_bytes(&self, shard: &str) -> bson::RawDocumentBuf {
        const LEN: usize = 4 + (3 + 12) + (3 + 8) + (3 + 8) + 1;
        let v = self.chunks.shard_version(shard).timestamp();
        let mut b = Vec::with_capacity(LEN);
        b.extend_from_slice(&(LEN as i32).to_le_bytes());
        b.extend_from_slice(b"\x07e\0");
        b.extend_from_slice(&self.epoch.bytes());
        for (name, t) in [(b"\x11t\0", self.timestamp), (b"\x11v\0", v)] {
            b.extend_from_slice(name);
            b.extend_from_slice(&t.increment.to_le_bytes());
            b.extend_from_slice(&t.time.to_le_bytes());
        }
        b.push(0);
        // The layout above is a well-formed document by construction; the check is on its
        // length and terminator only.
        bson::RawDocumentBuf::from_bytes(b).unwrap_or_default()
    }
}

/// How the routing table fills a miss: the routing state of a namespace, or `None` when it is
/// not sharded. The router builds it over its metadata source (`crate::metadata`); the table
/// does not know where the metadata lives.
pub type SnapshotLoader =
    Arc<dyn Fn(&str) -> Result<Option<RoutingSnapshot>, RoutingError> + Send + Sync>;

/// Most namespaces the cache remembers as unsharded; past it those entries are dropped (and
/// reloaded on use), so names a client makes up cannot grow the cache without bound.
/// Sharded namespaces are kept whatever their number: the metadata holds them anyway.
pub const MAX_UNSHARDED_ENTRIES: usize = 10_000;

/// A boxed future, as the routing source's methods return.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// A routing source that keeps its own cache and loads asynchronously: the config server's
/// catalog cache (`--configdb`). The table asks it on every lookup (it answers a cached
/// namespace without waiting) and tells it what the shards said when they found a request
/// stale.
pub trait RoutingSource: Send + Sync {
    /// The routing state of `ns` (`None` when unsharded), loaded on first use.
    fn snapshot<'a>(
        &'a self,
        ns: &'a str,
    ) -> BoxFuture<'a, Result<Option<Arc<RoutingSnapshot>>, RoutingError>>;

    /// A shard answered a request for `ns` with these stale errors (StaleConfig 13388,
    /// StaleEpoch 150, StaleDbVersion 249, as the shard sent them, `vWanted` and all): the
    /// next lookup reads what they ask for. No error document: reload whatever is cached.
    fn stale(&self, ns: &str, errors: &[Document]);

    /// Forgets everything (`flushRouterConfig`).
    fn flush(&self);
}

enum Loader {
    /// The metadata is the router's own (`--config`, `sluice demo`): read synchronously and
    /// cached here.
    Sync(SnapshotLoader),
    /// The metadata comes from a source with its own cache (`--configdb`).
    Async(Arc<dyn RoutingSource>),
}

/// The router's cache of routing snapshots.
pub struct RoutingTable {
    entries: DashMap<String, Option<Arc<RoutingSnapshot>>>,
    loader: Loader,
}

impl std::fmt::Debug for RoutingTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoutingTable")
            .field("entries", &self.entries.len())
            .finish()
    }
}

impl RoutingTable {
    /// An empty cache over `loader`.
    pub fn new(loader: SnapshotLoader) -> Self {
        RoutingTable {
            entries: DashMap::new(),
            loader: Loader::Sync(loader),
        }
    }

    /// A table over a source with its own cache (the config server's catalog cache).
    pub fn with_source(source: Arc<dyn RoutingSource>) -> Self {
        RoutingTable {
            entries: DashMap::new(),
            loader: Loader::Async(source),
        }
    }

    /// The routing state of `ns` (`None` when unsharded), loaded on first use. Over an
    /// asynchronous source this answers what the last [`RoutingTable::lookup`] saw (an error
    /// when nothing was looked up yet): the request path uses `lookup`.
    pub fn get(&self, ns: &str) -> Result<Option<Arc<RoutingSnapshot>>, RoutingError> {
        if let Some(e) = self.entries.get(ns) {
            return Ok(e.clone());
        }
        self.refresh(ns)
    }

    /// Reloads `ns` and replaces its snapshot whole (see [`RoutingTable::get`] for an
    /// asynchronous source; the request path uses [`RoutingTable::reload`]).
    pub fn refresh(&self, ns: &str) -> Result<Option<Arc<RoutingSnapshot>>, RoutingError> {
        let Loader::Sync(loader) = &self.loader else {
            return match self.entries.get(ns) {
                Some(e) => Ok(e.clone()),
                None => Err(RoutingError::new(
                    crate::value::error_codes::ErrorCode::InternalError,
                    format!("the routing of {ns} is loaded from the config server and was not looked up yet"),
                )),
            };
        };
        metrics::counter!("sluice_routing_refreshes_total").increment(1);
        let snap = loader(ns)?.map(Arc::new);
        self.remember(ns, snap.clone());
        Ok(snap)
    }

    fn remember(&self, ns: &str, snap: Option<Arc<RoutingSnapshot>>) {
        if snap.is_none() && self.entries.len() >= MAX_UNSHARDED_ENTRIES {
            self.entries.retain(|_, v| v.is_some());
            self.entries.shrink_to_fit();
        }
        self.entries.insert(ns.to_string(), snap);
    }

    /// The routing state of `ns`, from whichever source the table has: what the request path
    /// routes by.
    pub async fn lookup(&self, ns: &str) -> Result<Option<Arc<RoutingSnapshot>>, RoutingError> {
        match &self.loader {
            Loader::Sync(_) => self.get(ns),
            Loader::Async(source) => {
                let snap = source.snapshot(ns).await?;
                self.remember(ns, snap.clone());
                Ok(snap)
            }
        }
    }

    /// Reads `ns` again after a shard found a request stale (`errors`: its stale errors) and
    /// returns the new routing state.
    pub async fn reload(
        &self,
        ns: &str,
        errors: &[Document],
    ) -> Result<Option<Arc<RoutingSnapshot>>, RoutingError> {
        match &self.loader {
            Loader::Sync(_) => self.refresh(ns),
            Loader::Async(source) => {
                source.stale(ns, errors);
                self.lookup(ns).await
            }
        }
    }

    /// Whether the routing comes from a source with its own cache (the config server).
    pub fn is_async(&self) -> bool {
        matches!(self.loader, Loader::Async(_))
    }

    /// Forgets every cached snapshot (`flushRouterConfig`).
    pub fn flush(&self) {
        self.entries.clear();
        if let Loader::Async(source) = &self.loader {
            source.flush();
        }
    }

    /// Forgets every namespace of `db` (after `dropDatabase`): they are loaded again on use,
    /// so a client that creates and drops databases does not leave their names behind.
    pub fn forget_database(&self, db: &str) {
        let before = self.entries.len();
        self.entries
            .retain(|ns, _| ns.split_once('.').map(|(d, _)| d) != Some(db));
        if self.entries.len() < before {
            self.entries.shrink_to_fit();
        }
    }

    /// Number of cached namespaces.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixed_shard_version_layout_is_the_document_encoded() {
        let pattern = ShardKeyPattern::parse(&doc! {"_id": "hashed"}).expect("a key pattern");
        let mut snap = RoutingSnapshot::initial("d.c", pattern, 3).expect("a snapshot");
        snap.timestamp = Timestamp {
            time: 1_764_000_000,
            increment: 0xfedc_ba98,
        };
        for shard in ["shard0", "shard1", "shard2", "not-a-shard"] {
            assert_eq!(
                snap.shard_version_bytes(shard).as_bytes(),
                snap.shard_version(shard).to_vec().expect("encodes"),
                "{shard}"
            );
        }
    }
}
