//! Sluice: a MongoDB wire-protocol router, compatible with mongos.
//!
//! # Module map
//!
//! The crate is built in layers; a module imports only from its own layer or a lower one, and no
//! two modules import each other round a cycle. `tests/layers.rs` reads every `use crate::…`
//! under `src/` and fails on an import that breaks this, naming the file and the name.
//!
//! 1. [`value`]: BSON helpers every layer shares (MongoDB's comparison order, values rendered
//!    for messages, typed field readers, error codes); [`limits`]: the limits MongoDB enforces
//!    and the iterative measurements that check them; [`sync`]: the lock a panic cannot poison.
//! 2. [`wire`]: bytes to messages and back (OP_MSG, the legacy OP_QUERY handshake,
//!    OP_COMPRESSED), zero-copy views over `bytes::Bytes`; [`routing`]: shard key patterns,
//!    MongoDB's hashed key, chunk maps and routing snapshots; [`auth`]: the security core
//!    (SCRAM, X.509 subjects, users, built-in roles and per-command checks, TLS settings),
//!    sans-IO, served by the frontend and used by the backend towards shards.
//! 3. [`engine`]: the document engine (paths, the query matcher, sort, projection, update
//!    operators, aggregation) that the embedded shard stores with and the router merges with;
//!    [`backend`]: shard connections, pools, the per-shard queue and its adaptive limit, and the
//!    replica-set topology core.
//! 4. [`config`]: the TOML configuration, its defaults and the write policy.
//! 5. [`command`]: what every server shares — the request envelope and the write kinds, the
//!    error type, server state and information, `hello`, cursors over computed results;
//!    [`cluster`]: the router's view of its shards (pools, queues, the routing table, open
//!    transactions).
//! 6. [`read`]: targeted and scatter-gather reads, the merge and the router's cursors;
//!    [`write`]: targeting, the pure planner, child batches, reply merging; [`frontend`]: the
//!    listener and one task per client connection.
//! 7. [`embedded`]: the embedded shard, an in-memory mongod-compatible server for the demo, the
//!    tests and the benchmarks (memory only, not for production); [`metadata`]: where routing
//!    metadata comes from, behind one trait (`MetadataSource`): the static store the router
//!    holds itself (`--config`, `sluice demo`), which serves the `config` database on the
//!    engine, and the config server.
//! 8. [`router`]: the router's service — one dispatch, forwarding, sharding administration,
//!    start-up, and the router-only state (its cursors, the write coalescer, write statistics,
//!    the metadata store handle: `router::ShardedCluster`).
//! 9. [`bench`]: the `sluice bench` scenarios; [`demo`]: the embedded cluster of `sluice demo
//!    --cluster` (config server, shard servers, `--configdb` routers); [`fuzz`]: the fuzz
//!    targets' entry points (replayed by `cargo test`); `main.rs`: the command line.

pub mod auth;
pub mod backend;
pub mod bench;
pub mod cluster;
pub mod command;
pub mod config;
pub mod demo;
pub mod embedded;
pub mod engine;
pub mod frontend;
pub mod fuzz;
pub mod limits;
pub mod metadata;
pub mod read;
pub mod router;
pub mod routing;
pub mod sync;
pub mod value;
pub mod wire;
pub mod write;
