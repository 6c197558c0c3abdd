//! Routing: shard key patterns, MongoDB's hashed-index hash, the chunk map, the routing table
//! cache and the metadata loaders.

pub mod hash;

pub use hash::hash64;
