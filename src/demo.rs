//! The embedded cluster `sluice demo --cluster` runs (and the tests start in process): an
//! embedded config server, embedded shards in shard-server mode, and one or more routers in
//! `--configdb` mode over them, as a MongoDB sharded cluster is laid out. The shards are added
//! through the config server (`_configsvrAddShard`, as `addShard` does), and the configured
//! collections are sharded through the first router (`_shardsvrCreateCollection` on the
//! database's primary shard). Memory only, not for production. docs/design/config-server.md,
//! §13.

use std::sync::Arc;

use bson::doc;

use crate::config::{CollectionConfig, Config};
use crate::embedded::{EmbeddedReplicaSet, EmbeddedShard, ReplicaSetOptions, ShardOptions};
use crate::frontend::RouterHandle;
use crate::router::ShardedCluster;

/// The replica set name of the demo's config server.
pub const CONFIG_SET_NAME: &str = "configRS";

/// A running embedded cluster.
#[derive(Debug)]
pub struct DemoCluster {
    /// The config server.
    pub config_server: EmbeddedShard,
    /// The shards, `shard0`, `shard1`, … (single servers; empty when the shards are
    /// replica sets).
    pub shards: Vec<EmbeddedShard>,
    /// The shards as replica sets, `shard0`, `shard1`, … (empty with single servers).
    pub sets: Vec<EmbeddedReplicaSet>,
    /// The routers, with the cluster each routes by.
    pub routers: Vec<(RouterHandle, Arc<ShardedCluster>)>,
    /// What the config server was started with (to start it again).
    config_options: ShardOptions,
}

/// Every failure of the demo's start-up, as one message.
fn failed(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

impl DemoCluster {
    /// Starts the config server and `shards` single-server shards (from `shard` options, on
    /// loopback ports), adds the shards, then one router per configuration in `routers` (each
    /// with `argv` for `getCmdLineOpts`), and shards `collections` through the first router.
    ///
    /// A `security.users_file` / `roles_file` in the routers' configuration is the config
    /// server's: it holds the cluster's users and roles (in its `admin.system.users` and
    /// `admin.system.roles`, and in the files), and the routers read them from it.
    pub async fn start(
        shards: usize,
        shard: ShardOptions,
        routers: Vec<Config>,
        argv: Vec<String>,
        collections: &[CollectionConfig],
    ) -> Result<DemoCluster, String> {
        Self::start_with_members(shards, 1, shard, routers, argv, collections).await
    }

    /// As [`DemoCluster::start`], each shard a replica set of `members` members (embedded,
    /// sharing one data set) when `members` is more than 1, added by its seed list.
    pub async fn start_with_members(
        shards: usize,
        members: usize,
        shard: ShardOptions,
        mut routers: Vec<Config>,
        argv: Vec<String>,
        collections: &[CollectionConfig],
    ) -> Result<DemoCluster, String> {
        let files = routers
            .first()
            .map(|c| (c.security.users_file.clone(), c.security.roles_file.clone()))
            .unwrap_or_default();
        for r in &mut routers {
            r.security.users_file = None;
            r.security.roles_file = None;
        }
        let config_options = ShardOptions {
            set_name: CONFIG_SET_NAME.to_string(),
            config_server: true,
            users_file: files.0,
            roles_file: files.1,
            ..shard.clone()
        };
        let config_server = EmbeddedShard::start("127.0.0.1:0", config_options.clone())
            .await
            .map_err(|e| failed("cannot start the embedded config server", e))?;
        let configdb = format!("{CONFIG_SET_NAME}/{}", config_server.local_addr());
        let shard = ShardOptions {
            configdb: Some(configdb.clone()),
            ..shard
        };
        let mut cluster = DemoCluster {
            config_server,
            shards: Vec::new(),
            sets: Vec::new(),
            routers: Vec::new(),
            config_options,
        };
        if members > 1 {
            for i in 0..shards {
                let set = EmbeddedReplicaSet::start(ReplicaSetOptions {
                    members,
                    shard: ShardOptions {
                        set_name: format!("shard{i}"),
                        ..shard.clone()
                    },
                    ..ReplicaSetOptions::default()
                })
                .await
                .map_err(|e| failed("cannot start the embedded replica sets", e))?;
                cluster.sets.push(set);
            }
        } else {
            cluster.shards = EmbeddedShard::start_many(shards, shard)
                .await
                .map_err(|e| failed("cannot start the embedded shards", e))?;
        }
        let mut options = mongodb::options::ClientOptions::parse(format!(
            "mongodb://{}/?directConnection=true&serverSelectionTimeoutMS=10000&appName=sluice-demo",
            cluster.config_server.local_addr()
        ))
        .await
        .map_err(|e| failed("cannot reach the embedded config server", e))?;
        crate::metadata::configsvr::loader::secure_client_options(
            &mut options,
            &cluster.config_options.internal_security,
        );
        let client = mongodb::Client::with_options(options)
            .map_err(|e| failed("cannot reach the embedded config server", e))?;
        for host in cluster.shard_hosts() {
            client
                .database("admin")
                .run_command(doc! {"_configsvrAddShard": &host, "writeConcern": {"w": "majority"}})
                .await
                .map_err(|e| failed(&format!("cannot add the shard {host}"), e))?;
        }
        // Shut down, not dropped: a dropped client ends its sessions from a task of its own,
        // which outlives it.
        client.shutdown().await;
        for config in routers {
            cluster.start_router(config, argv.clone()).await?;
        }
        if let Some((_, first)) = cluster.routers.first() {
            crate::router::shard_collections(first, collections).await?;
        }
        Ok(cluster)
    }

    /// Each shard as `config.shards` lists it: `"<id>/<host:port>"`, or the replica set's
    /// seed list.
    pub fn shard_hosts(&self) -> Vec<String> {
        let single = self
            .shards
            .iter()
            .map(|s| format!("{}/{}", s.service().name(), s.local_addr()));
        single
            .chain(self.sets.iter().map(|s| s.seed_list()))
            .collect()
    }

    /// The config server as `--configdb` names it.
    pub fn configdb(&self) -> String {
        format!("{CONFIG_SET_NAME}/{}", self.config_server.local_addr())
    }

    /// Starts one more router over the cluster with `config` (its `listen` and settings).
    pub async fn start_router(
        &mut self,
        config: Config,
        argv: Vec<String>,
    ) -> Result<&(RouterHandle, Arc<ShardedCluster>), String> {
        let listen = config.listen.clone();
        let pool = config
            .pool_options()
            .map_err(|e| failed("invalid pool settings", e))?;
        let sharded =
            crate::router::configdb::bootstrap_configdb(&self.configdb(), pool, &config.batching)
                .await?;
        let handle = crate::router::start_router(config, argv, Some(sharded.clone()))
            .await
            .map_err(|e| failed(&format!("cannot listen on {listen}"), e))?;
        self.routers.push((handle, sharded));
        self.routers
            .last()
            .ok_or_else(|| "no router was started".to_string())
    }

    /// Stops the config server and starts it again on the same address with the same options
    /// (with a `metadata_path`, from what it persisted; otherwise empty).
    pub async fn restart_config_server(self) -> Result<DemoCluster, String> {
        let DemoCluster {
            config_server,
            shards,
            sets,
            routers,
            config_options,
        } = self;
        let addr = config_server.local_addr();
        config_server.shutdown().await;
        let config_server = EmbeddedShard::start(&addr.to_string(), config_options.clone())
            .await
            .map_err(|e| failed("cannot start the embedded config server again", e))?;
        Ok(DemoCluster {
            config_server,
            shards,
            sets,
            routers,
            config_options,
        })
    }

    /// Stops the routers, then the shards and the config server.
    pub async fn shutdown(self) {
        for (r, cluster) in self.routers {
            r.shutdown().await;
            cluster.close().await;
        }
        for s in self.shards {
            s.shutdown().await;
        }
        for s in self.sets {
            s.shutdown().await;
        }
        self.config_server.shutdown().await;
    }
}
