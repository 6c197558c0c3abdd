//! Routing: shard key patterns, MongoDB's hashed-index hash, the chunk map, the routing table
//! cache and the metadata loaders.
//!
//! - [`hash`]: `hash64`, bit-exact with MongoDB's hashed indexes.
//! - [`shard_key`]: key patterns and the extraction of key values from documents and filters.
//! - [`chunks`]: the chunk map (lookup by upper bound), chunk versions, the initial pre-split.
//! - [`table`]: routing snapshots, the loader trait and the routing table cache.
//! - [`config_store`]: the embedded config store (MongoDB's `config.*` documents), persisted.

pub mod chunks;
pub mod config_store;
pub mod hash;
pub mod shard_key;
pub mod table;

pub use chunks::{Chunk, ChunkMap, ChunkVersion};
pub use config_store::{ConfigStore, ShardInfo};
pub use hash::hash64;
pub use shard_key::{FilterKeys, ShardKey, ShardKeyPattern};
pub use table::{MetadataLoader, RoutingSnapshot, RoutingTable};

use crate::value::error_codes::ErrorCode;

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
