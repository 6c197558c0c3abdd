//! Routing: shard key patterns, MongoDB's hashed-index hash, the chunk map, the routing table
//! cache and the metadata loaders.
//!
//! - [`hash`]: `hash64`, bit-exact with MongoDB's hashed indexes.
//! - [`shard_key`]: key patterns and the extraction of key values from documents and filters.
//! - [`filter`]: a filter's pinned key and `_id` read in place, for the write and read paths.
//! - [`chunks`]: the chunk map (lookup by upper bound), chunk versions, the initial pre-split.
//! - [`table`]: routing snapshots and the routing table cache.
//!
//! Where the metadata comes from is `crate::metadata`'s business.

pub mod chunks;
pub mod filter;
pub mod hash;
pub mod shard_key;
pub mod table;

pub use chunks::{Chunk, ChunkMap, ChunkVersion};
pub use hash::hash64;
pub use shard_key::{FilterKeys, ShardKey, ShardKeyPattern};
pub use table::{RoutingSnapshot, RoutingSource, RoutingTable, SnapshotLoader};

use crate::value::error_codes::ErrorCode;

/// A shard as the router knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardInfo {
    /// The shard id (`config.shards._id`).
    pub id: String,
    /// `host:port` of a single server, or a replica set's seed list (`"rs0/h1:p,h2:p"`).
    pub addr: String,
    /// Whether it understands `shardVersion` (embedded shards and mongod started as shard
    /// servers); a plain mongod rejects the field.
    pub shard_server: bool,
}

/// A routing error, reported to clients with its MongoDB code.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct RoutingError {
    /// The MongoDB code.
    pub code: ErrorCode,
    /// The message.
    pub message: String,
}

impl RoutingError {
    /// An error with this code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        RoutingError {
            code,
            message: message.into(),
        }
    }
}
