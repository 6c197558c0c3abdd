//! Sluice: a MongoDB wire-protocol router, compatible with mongos.
//!
//! Layers, in the order a request meets them:
//!
//! - [`wire`]: bytes to messages and back (OP_MSG, the legacy OP_QUERY handshake,
//!   OP_COMPRESSED); zero-copy views over `bytes::Bytes`.
//! - [`frontend`]: the listener, one task per client connection, the handshake state of each
//!   connection, graceful shutdown.
//! - [`command`]: command dispatch and the commands the router answers itself (`hello`,
//!   `buildInfo`, `serverStatus`, …), each replying with mongos's shape.
//! - [`config`]: the TOML configuration and its defaults.
//! - [`embedded`]: the embedded shard, an in-memory mongod-compatible server for the demo, the
//!   tests and the benchmarks (memory only, not for production).
//! - [`order`]: MongoDB's cross-type comparison order for BSON values.
//!
//! [`fuzz`] holds the fuzz targets' entry points (replayed by `cargo test`).
//! [`error_codes`] holds the MongoDB error codes every layer replies with, [`limits`] the
//! limits MongoDB enforces (nesting depth, path length, batch size, stage memory) and the
//! iterative measurements that check them, [`sync`] the lock that a panic cannot poison.

pub mod auth;
pub mod backend;
pub mod bench;
pub mod cluster;
pub mod command;
pub mod config;
pub mod embedded;
pub mod error_codes;
pub mod frontend;
pub mod fuzz;
pub mod limits;
pub mod metadata;
pub mod order;
pub mod read;
pub mod routing;
pub mod sync;
pub mod wire;
pub mod write;
