//! What only a router keeps about the cluster it routes to: the metadata store its routing
//! comes from, its own cursors over gathered results, the write coalescer and the write-path
//! statistics (`serverStatus().sluice.writes`). The shards' side of the cluster (pools, queues,
//! the routing table) is [`Cluster`], which the read and write paths are given; these pieces
//! are handed to them one by one, so neither the cluster nor a shard ever holds router state.

use std::sync::Arc;

use crate::cluster::Cluster;
use crate::config::BatchingConfig;
use crate::metadata::StaticStore;
use crate::read::RouterCursors;
use crate::write::coalesce::{CoalesceSettings, Coalescer};
use crate::write::WriteStats;

/// A sharded cluster as its router holds it.
#[derive(Debug)]
pub struct ShardedCluster {
    /// Shards, pools, queues and the routing table.
    pub cluster: Arc<Cluster>,
    /// Where the routing metadata comes from (and where sharding administration records it).
    pub metadata: Arc<StaticStore>,
    /// The router's own cursors over gathered results of sharded reads.
    pub cursors: RouterCursors,
    /// Write-path counters, reported under `serverStatus().sluice.writes`.
    pub writes: WriteStats,
    coalescer: Option<Coalescer>,
    /// The config server the routing comes from (`--configdb`); `None` when the metadata is
    /// the router's own.
    pub(super) config_server: Option<super::configdb::ConfigServer>,
}

impl ShardedCluster {
    /// After the router in front of it has stopped: closes the `--configdb` router's client of
    /// the config server (nothing to close otherwise).
    pub async fn close(&self) {
        if let Some(cs) = &self.config_server {
            cs.source.shutdown().await;
        }
    }

    /// The router's state over `cluster`, routed from `metadata`, coalescing inserts as
    /// `batching` says.
    pub fn new(
        cluster: Arc<Cluster>,
        metadata: Arc<StaticStore>,
        batching: &BatchingConfig,
    ) -> ShardedCluster {
        ShardedCluster {
            cluster,
            metadata,
            cursors: RouterCursors::default(),
            writes: WriteStats::default(),
            coalescer: Coalescer::new(CoalesceSettings {
                max_operations: batching.max_operations.max(1),
                max_bytes: batching.max_bytes.max(1),
                max_wait: std::time::Duration::from_micros(batching.max_wait_us),
            }),
            config_server: None,
        }
    }

    /// The same, routed by a config server (`--configdb`).
    pub fn with_config_server(mut self, config_server: super::configdb::ConfigServer) -> Self {
        self.config_server = Some(config_server);
        self
    }

    /// The config server the routing comes from, if any.
    pub fn config_server(&self) -> Option<&super::configdb::ConfigServer> {
        self.config_server.as_ref()
    }

    /// The write coalescer (`None` when `batching.max_wait_us` is 0).
    pub fn coalescer(&self) -> Option<&Coalescer> {
        self.coalescer.as_ref()
    }
}
