//! The router in `--configdb` mode, through the stock driver: its shards, databases and chunks
//! come from a config server (an embedded shard holding `config.*` as a 6.0+ config server
//! writes it), child commands carry `shardVersion` / `databaseVersion` exactly as mongos 6.0+
//! sends them, and each stale answer a shard can give (StaleConfig 13388 after a migration or a
//! collection sharded elsewhere, StaleDbVersion 249 after a primary moved) refreshes the
//! router's cache and retargets, so the client never sees it.
//!
//! Most "migrations" here are done by hand, as a config server and its shards would leave
//! them: documents moved between shards, `config.chunks` rewritten with mongos's version
//! rules, and each shard told its new version (`sluiceSetShardVersion`, the embedded shard's
//! stand-in for loading its own filtering metadata). The last test moves a chunk the way a
//! cluster does (`moveChunk` through a router, `_configsvrMoveRange`, the donor and recipient
//! shard servers' clone, catch-up, critical section and commit) under live writes through
//! two routers.

mod common;

use common::{all, direct, ts};

use std::sync::Arc;

use bson::{doc, oid::ObjectId, Bson, Document, Timestamp, Uuid};
use sluice::config::Config;
use sluice::embedded::{EmbeddedShard, ShardOptions};
use sluice::frontend::RouterHandle;
use sluice::router::ShardedCluster;

const UUID: Uuid = Uuid::from_bytes([7; 16]);
const DB_UUID: Uuid = Uuid::from_bytes([8; 16]);
const COLL_TS: Timestamp = Timestamp {
    time: 100,
    increment: 1,
};

/// A config server, two shards and direct clients to each.
struct Fixture {
    config: EmbeddedShard,
    writer: mongodb::Client,
    shards: Vec<EmbeddedShard>,
    direct: Vec<mongodb::Client>,
    epoch: ObjectId,
}

fn chunk(min: Bson, max: Bson, shard: &str, major: u32, minor: u32) -> Document {
    common::chunk(UUID, min, max, shard, major, minor)
}

fn db_version(last_mod: i32) -> Document {
    doc! {"uuid": DB_UUID, "timestamp": ts(10, 1), "lastMod": last_mod}
}

impl Fixture {
    /// `app` (primary shard0) with `app.c` sharded on `{x: 1}`: (-inf, 0) on shard0 at 1|0,
    /// [0, 100) on shard1 at 1|1, [100, +inf) on shard1 at 1|2.
    async fn start() -> Fixture {
        let (config, _) = common::config_server("configRS").await;
        Fixture::populate(config, false).await
    }

    /// The same over a config server already started; with `shard_server`, the shards check
    /// requests against the config server's metadata themselves (`sluice shard --configdb`).
    async fn populate(config: EmbeddedShard, shard_server: bool) -> Fixture {
        let writer = direct(config.local_addr()).await;
        let options = ShardOptions {
            configdb: shard_server.then(|| format!("configRS/{}", config.local_addr())),
            ..ShardOptions::for_tests()
        };
        let shards = EmbeddedShard::start_many(2, options).await.unwrap();
        let mut clients = Vec::new();
        for s in &shards {
            clients.push(direct(s.local_addr()).await);
        }
        let f = Fixture {
            config,
            writer,
            shards,
            direct: clients,
            epoch: ObjectId::new(),
        };
        let shard_docs: Vec<Document> = f
            .shards
            .iter()
            .map(|s| {
                let name = s.service().name();
                doc! {"_id": name, "host": format!("{name}/{}", s.local_addr()), "state": 1, "topologyTime": ts(1, 1)}
            })
            .collect();
        f.insert("shards", shard_docs).await;
        f.insert(
            "databases",
            vec![doc! {"_id": "app", "primary": "shard0", "version": db_version(1)}],
        )
        .await;
        f.insert(
            "collections",
            vec![doc! {
                "_id": "app.c", "lastmodEpoch": f.epoch, "lastmod": bson::DateTime::now(),
                "timestamp": COLL_TS, "uuid": UUID, "key": {"x": 1}, "unique": false,
            }],
        )
        .await;
        f.insert(
            "chunks",
            vec![
                chunk(Bson::MinKey, Bson::Int64(0), "shard0", 1, 0),
                chunk(Bson::Int64(0), Bson::Int64(100), "shard1", 1, 1),
                chunk(Bson::Int64(100), Bson::MaxKey, "shard1", 1, 2),
            ],
        )
        .await;
        f
    }

    fn config_coll(&self, name: &str) -> mongodb::Collection<Document> {
        self.writer.database("config").collection(name)
    }

    async fn insert(&self, name: &str, docs: Vec<Document>) {
        self.config_coll(name).insert_many(docs).await.unwrap();
    }

    fn configdb(&self) -> String {
        format!("configRS/{}", self.config.local_addr())
    }

    /// A router in `--configdb` mode over this config server.
    async fn router(&self) -> (RouterHandle, Arc<ShardedCluster>, mongodb::Client) {
        let config = Config {
            listen: "127.0.0.1:0".into(),
            configdb: Some(self.configdb()),
            ..Config::default()
        };
        let sharded = sluice::router::configdb::bootstrap_configdb(
            &self.configdb(),
            config.pool_options().unwrap(),
            &config.batching,
        )
        .await
        .expect("router reads the config server");
        let router =
            sluice::router::start_router(config, vec!["sluice".into()], Some(sharded.clone()))
                .await
                .unwrap();
        let client = common::driver(router.local_addr(), "").await;
        (router, sharded, client)
    }

    /// Tells shard `i` the version it checks requests for `ns` (or, for a database name,
    /// `databaseVersion`) against.
    async fn set_version(&self, i: usize, ns: &str, version: Document) {
        let field = if ns.contains('.') {
            "shardVersion"
        } else {
            "databaseVersion"
        };
        self.direct[i]
            .database("admin")
            .run_command(doc! {"sluiceSetShardVersion": ns, field: version})
            .await
            .unwrap();
    }

    fn version(&self, major: u32, minor: u32) -> Document {
        doc! {"e": self.epoch, "t": COLL_TS, "v": ts(major, minor)}
    }

    /// The `x` values of `app.coll` on shard `i`.
    fn xs(&self, i: usize, coll: &str) -> Vec<i64> {
        self.xs_in(i, "app", coll)
    }

    /// The `x` values of `db.coll` on shard `i`.
    fn xs_in(&self, i: usize, db: &str, coll: &str) -> Vec<i64> {
        let mut v: Vec<i64> = self.shards[i]
            .service()
            .documents(db, coll)
            .iter()
            .filter_map(|d| d.get_i64("x").ok())
            .collect();
        v.sort_unstable();
        v
    }

    /// Moves [0, 100) of `app.c` from shard1 to shard0 as a migration leaves it: the
    /// documents copied then deleted on the donor, the chunk at 2|0 on the recipient, the
    /// donor's remaining chunk bumped to 2|1, both shards on their new versions.
    async fn migrate_low_chunk(&self) {
        // The shards are told first: from now on a request on the old versions is stale.
        self.set_version(0, "app.c", self.version(2, 0)).await;
        self.set_version(1, "app.c", self.version(2, 1)).await;
        self.move_low_chunk().await;
    }

    /// The documents and `config.chunks` of [`Fixture::migrate_low_chunk`], without telling
    /// the shards anything.
    async fn move_low_chunk(&self) {
        let donor = self.direct[1].database("app").collection::<Document>("c");
        let recipient = self.direct[0].database("app").collection::<Document>("c");
        let range = doc! {"x": {"$gte": 0i64, "$lt": 100i64}};
        let moving = all(donor.find(range.clone()).await.unwrap()).await;
        if !moving.is_empty() {
            recipient.insert_many(moving).await.unwrap();
        }
        donor.delete_many(range).await.unwrap();
        let chunks = self.config_coll("chunks");
        chunks
            .update_one(
                doc! {"min": {"x": 0i64}},
                doc! {"$set": {"shard": "shard0", "lastmod": ts(2, 0)}},
            )
            .await
            .unwrap();
        chunks
            .update_one(
                doc! {"min": {"x": 100i64}},
                doc! {"$set": {"lastmod": ts(2, 1)}},
            )
            .await
            .unwrap();
    }
}

impl Fixture {
    /// movePrimary of `app` to shard1 as the config server commits it: `app.plain` copied to
    /// shard1 and dropped on shard0, `config.databases` on the new primary at lastMod 2.
    async fn move_primary(&self) {
        let moved = self.shards[0].service().documents("app", "plain");
        self.direct[1]
            .database("app")
            .collection::<Document>("plain")
            .insert_many(moved)
            .await
            .unwrap();
        self.direct[0]
            .database("app")
            .collection::<Document>("plain")
            .drop()
            .await
            .unwrap();
        self.config_coll("databases")
            .update_one(
                doc! {"_id": "app"},
                doc! {"$set": {"primary": "shard1", "version": db_version(2)}},
            )
            .await
            .unwrap();
    }
}

fn stats(s: &ShardedCluster) -> sluice::metadata::configsvr::CacheStats {
    s.config_server().expect("a config server").cache().stats()
}

#[tokio::test]
async fn routes_by_the_config_servers_chunks_with_mongos_versions() {
    let f = Fixture::start().await;
    let (router, sharded, client) = f.router().await;
    assert_eq!(
        sharded
            .cluster
            .shards()
            .iter()
            .map(|s| (s.id.as_str(), s.addr.clone()))
            .collect::<Vec<_>>(),
        vec![
            ("shard0", format!("shard0/{}", f.shards[0].local_addr())),
            ("shard1", format!("shard1/{}", f.shards[1].local_addr()))
        ],
        "the shards are config.shards' seed lists: each a replica set followed by its monitor"
    );
    assert!(sharded.cluster.pool("shard0").unwrap().is_replica_set());
    // Each shard checks the exact versions mongos 6.0+ would send: {e, t, v} with that
    // shard's placement version on the sharded collection; UNSHARDED plus the database
    // version on the primary shard for an unsharded one.
    f.set_version(0, "app.c", f.version(1, 0)).await;
    f.set_version(1, "app.c", f.version(1, 2)).await;
    f.set_version(0, "app", db_version(1)).await;
    f.set_version(
        0,
        "app.plain",
        doc! {"e": ObjectId::from_bytes([0; 12]), "t": ts(0, 0), "v": ts(0, 0)},
    )
    .await;

    let c = client.database("app").collection::<Document>("c");
    c.insert_many(vec![
        doc! {"_id": 1, "x": -5i64},
        doc! {"_id": 2, "x": 5i64},
        doc! {"_id": 3, "x": 500i64},
    ])
    .await
    .unwrap();
    assert_eq!(f.xs(0, "c"), vec![-5]);
    assert_eq!(f.xs(1, "c"), vec![5, 500]);
    let plain = client.database("app").collection::<Document>("plain");
    plain.insert_one(doc! {"_id": 1, "x": 1i64}).await.unwrap();
    assert_eq!(f.xs(0, "plain"), vec![1], "on the primary shard");
    assert_eq!(f.xs(1, "plain"), Vec::<i64>::new());
    assert_eq!(all(c.find(doc! {}).await.unwrap()).await.len(), 3);
    let one = c.find_one(doc! {"x": 5i64}).await.unwrap().expect("found");
    assert_eq!(one.get_i32("_id").unwrap(), 2);
    assert_eq!(plain.count_documents(doc! {}).await.unwrap(), 1);
    assert_eq!(stats(&sharded).failed, 0);

    // flushRouterConfig forgets the cache: the next use reads the config server again.
    let reads = stats(&sharded).collection_reads;
    client
        .database("admin")
        .run_command(doc! {"flushRouterConfig": 1})
        .await
        .unwrap();
    assert_eq!(c.count_documents(doc! {}).await.unwrap(), 3);
    assert!(stats(&sharded).collection_reads > reads);

    // A client may not send the config server's or the shards' internal commands.
    for name in ["_configsvrCreateDatabase", "_shardsvrCreateCollection"] {
        let e = client
            .database("admin")
            .run_command(doc! {name: "app"})
            .await
            .unwrap_err();
        assert_eq!(common::error_code(&e), 59, "{name}");
    }
    router.shutdown().await;
}

#[tokio::test]
async fn stale_config_after_a_migration_retargets_writes_and_reads() {
    let f = Fixture::start().await;
    f.set_version(0, "app.c", f.version(1, 0)).await;
    f.set_version(1, "app.c", f.version(1, 2)).await;
    let (ra, a_state, a) = f.router().await;
    let (rb, b_state, b) = f.router().await;
    let ca = a.database("app").collection::<Document>("c");
    let cb = b.database("app").collection::<Document>("c");
    ca.insert_many(vec![
        doc! {"x": 5i64},
        doc! {"x": 50i64},
        doc! {"x": 150i64},
    ])
    .await
    .unwrap();
    // Router B caches the routing too.
    assert_eq!(cb.count_documents(doc! {}).await.unwrap(), 3);
    assert_eq!(f.xs(1, "c"), vec![5, 50, 150]);

    f.migrate_low_chunk().await;
    let refreshed = stats(&a_state).incremental;
    // A's write goes to the donor on 1|2 and is refused stale (vWanted 2|1): A refreshes
    // and retargets the statement to shard0, which now owns [0, 100).
    ca.insert_many(vec![doc! {"x": 7i64}, doc! {"x": 170i64}])
        .await
        .unwrap();
    assert_eq!(f.xs(0, "c"), vec![5, 7, 50]);
    assert_eq!(f.xs(1, "c"), vec![150, 170]);
    assert!(
        stats(&a_state).incremental > refreshed,
        "the stale write refreshed A incrementally"
    );

    // B's reads still route by 1|x: the donor refuses them stale, B refreshes, and the
    // client sees every document once.
    let xs: Vec<i64> = all(cb.find(doc! {}).sort(doc! {"x": 1}).await.unwrap())
        .await
        .iter()
        .map(|d| d.get_i64("x").unwrap())
        .collect();
    assert_eq!(xs, vec![5, 7, 50, 150, 170]);
    let found = cb.find_one(doc! {"x": 50i64}).await.unwrap();
    assert!(
        found.is_some(),
        "the moved document is found on its new shard"
    );
    assert!(stats(&b_state).collection_reads >= 2);

    // An update by shard key through B lands on the recipient, exactly once.
    cb.update_one(doc! {"x": 7i64}, doc! {"$set": {"seen": true}})
        .await
        .unwrap();
    let seen = f.shards[0]
        .service()
        .documents("app", "c")
        .into_iter()
        .filter(|d| d.get_bool("seen").unwrap_or(false))
        .count();
    assert_eq!(seen, 1);
    ra.shutdown().await;
    rb.shutdown().await;
}

#[tokio::test]
async fn a_collection_sharded_elsewhere_is_routed_by_its_chunks_on_first_use() {
    let f = Fixture::start().await;
    let (router, _state, client) = f.router().await;
    let later = client.database("app").collection::<Document>("later");
    later.insert_one(doc! {"x": -1i64}).await.unwrap();
    assert_eq!(f.xs(0, "later"), vec![-1], "unsharded: on the primary");

    // Another router shards app.later: (-inf, 0) stays on shard0, [0, +inf) on shard1.
    let epoch = ObjectId::new();
    let uuid = Uuid::from_bytes([9; 16]);
    f.insert(
        "collections",
        vec![doc! {
            "_id": "app.later", "lastmodEpoch": epoch, "lastmod": bson::DateTime::now(),
            "timestamp": ts(200, 1), "uuid": uuid, "key": {"x": 1}, "unique": false,
        }],
    )
    .await;
    let mut low = chunk(Bson::MinKey, Bson::Int64(0), "shard0", 1, 0);
    let mut high = chunk(Bson::Int64(0), Bson::MaxKey, "shard1", 1, 1);
    low.insert("uuid", uuid);
    high.insert("uuid", uuid);
    f.insert("chunks", vec![low, high]).await;
    f.set_version(
        0,
        "app.later",
        doc! {"e": epoch, "t": ts(200, 1), "v": ts(1, 0)},
    )
    .await;
    f.set_version(
        1,
        "app.later",
        doc! {"e": epoch, "t": ts(200, 1), "v": ts(1, 1)},
    )
    .await;

    // This router still has it as unsharded: the primary refuses UNSHARDED (StaleConfig with
    // the collection's version), the router loads the collection and routes by its chunks.
    later.insert_one(doc! {"x": 5i64}).await.unwrap();
    assert_eq!(f.xs(1, "later"), vec![5]);
    assert_eq!(f.xs(0, "later"), vec![-1]);
    router.shutdown().await;
}

#[tokio::test]
async fn stale_db_version_after_the_primary_moved_retargets() {
    let f = Fixture::start().await;
    let (router, state, client) = f.router().await;
    f.set_version(0, "app", db_version(1)).await;
    let plain = client.database("app").collection::<Document>("plain");
    plain.insert_one(doc! {"x": 1i64}).await.unwrap();
    assert_eq!(f.xs(0, "plain"), vec![1]);

    // movePrimary to shard1, as the config server commits it: a new database version; the
    // old primary refuses the old one.
    f.set_version(0, "app", db_version(2)).await;
    f.set_version(1, "app", db_version(2)).await;
    f.move_primary().await;
    let db_reads = stats(&state).database_reads;

    plain.insert_one(doc! {"x": 2i64}).await.unwrap();
    assert_eq!(
        f.xs(1, "plain"),
        vec![1, 2],
        "the write followed the primary"
    );
    assert_eq!(f.xs(0, "plain"), Vec::<i64>::new());
    assert!(stats(&state).database_reads > db_reads);
    let n = plain.count_documents(doc! {}).await.unwrap();
    assert_eq!(n, 2);
    router.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_config_server_at_start_up_fails_routed_commands_until_it_answers() {
    // A port nothing listens on yet.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let configdb = format!("configRS/127.0.0.1:{port}");
    let config = Config {
        listen: "127.0.0.1:0".into(),
        configdb: Some(configdb.clone()),
        ..Config::default()
    };
    let sharded = sluice::router::configdb::bootstrap_configdb_with(
        &configdb,
        config.pool_options().unwrap(),
        &config.batching,
        std::time::Duration::from_millis(200),
    )
    .await
    .expect("the router starts without its config server");
    let router = sluice::router::start_router(config, vec!["sluice".into()], Some(sharded.clone()))
        .await
        .unwrap();
    let client = common::driver(router.local_addr(), "").await;
    let hello = client
        .database("admin")
        .run_command(doc! {"hello": 1})
        .await
        .expect("hello answers");
    assert_eq!(hello.get_str("msg").ok(), Some("isdbgrid"));
    let c = client.database("app").collection::<Document>("c");
    let e = c.insert_one(doc! {"x": 1i64}).await.unwrap_err();
    assert_eq!(common::error_code(&e), 6, "HostUnreachable: {e}");
    let e = c.find_one(doc! {}).await.unwrap_err();
    assert_eq!(common::error_code(&e), 6, "HostUnreachable: {e}");

    // The config server comes up: the router reads the shard list and routes.
    let config_server = EmbeddedShard::start(
        &format!("127.0.0.1:{port}"),
        ShardOptions {
            set_name: "configRS".into(),
            config_server: true,
            ..ShardOptions::for_tests()
        },
    )
    .await
    .unwrap();
    let f = Fixture::populate(config_server, false).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match c.insert_one(doc! {"x": 5i64}).await {
            Ok(_) => break,
            Err(e) => {
                assert_eq!(common::error_code(&e), 6, "{e}");
                assert!(
                    std::time::Instant::now() < deadline,
                    "still unreachable: {e}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
    assert_eq!(f.xs(1, "c"), vec![5]);
    router.shutdown().await;
}

#[tokio::test]
async fn databases_are_created_through_the_config_server() {
    let f = Fixture::start().await;
    let hello = f
        .writer
        .database("admin")
        .run_command(doc! {"hello": 1})
        .await
        .unwrap();
    assert_eq!(hello.get_i32("configsvr").ok(), Some(2));
    assert_eq!(hello.get_str("setName").ok(), Some("configRS"));
    let (router, _state, client) = f.router().await;

    // A first write to a new database creates it on the config server: its primary is the
    // shard that is primary of the fewest databases (shard1: shard0 has `app`).
    client
        .database("fresh")
        .collection::<Document>("items")
        .insert_one(doc! {"x": 1i64})
        .await
        .unwrap();
    let entry = f
        .config_coll("databases")
        .find_one(doc! {"_id": "fresh"})
        .await
        .unwrap()
        .expect("config.databases has the new database");
    assert_eq!(entry.get_str("primary").unwrap(), "shard1");
    assert_eq!(
        entry
            .get_document("version")
            .unwrap()
            .get_i32("lastMod")
            .ok(),
        Some(1)
    );
    assert_eq!(
        f.shards[1].service().documents("fresh", "items").len(),
        1,
        "the write went to the new primary"
    );

    // enableSharding with a primary shard, through the config server.
    client
        .database("admin")
        .run_command(doc! {"enableSharding": "other", "primaryShard": "shard0"})
        .await
        .unwrap();
    let other = f
        .config_coll("databases")
        .find_one(doc! {"_id": "other"})
        .await
        .unwrap()
        .expect("created");
    assert_eq!(other.get_str("primary").unwrap(), "shard0");
    let e = client
        .database("admin")
        .run_command(doc! {"enableSharding": "third", "primaryShard": "shardX"})
        .await
        .unwrap_err();
    assert_eq!(common::error_code(&e), 70, "ShardNotFound: {e}");
    let e = client
        .database("admin")
        .run_command(doc! {"enableSharding": "other", "primaryShard": "shard1"})
        .await
        .unwrap_err();
    assert_eq!(common::error_code(&e), 48, "NamespaceExists: {e}");
    router.shutdown().await;
}

/// What a shard does after a migration or DDL commit touching it: reload its metadata.
async fn flush_shard(f: &Fixture, i: usize, command: &str, target: &str) {
    f.direct[i]
        .database("admin")
        .run_command(doc! {command: target})
        .await
        .unwrap();
}

#[tokio::test]
async fn shard_servers_check_versions_against_the_config_server() {
    let (config, _) = common::config_server("configRS").await;
    let f = Fixture::populate(config, true).await;
    let (ra, _a_state, a) = f.router().await;
    let (rb, _b_state, b) = f.router().await;
    let ca = a.database("app").collection::<Document>("c");
    ca.insert_many(vec![
        doc! {"x": -5i64},
        doc! {"x": 5i64},
        doc! {"x": 50i64},
        doc! {"x": 150i64},
    ])
    .await
    .unwrap();
    assert_eq!(f.xs(0, "c"), vec![-5]);
    assert_eq!(f.xs(1, "c"), vec![5, 50, 150]);
    let cb = b.database("app").collection::<Document>("c");
    assert_eq!(cb.count_documents(doc! {}).await.unwrap(), 4);

    // A migration of [0, 100) to shard0, committed on the config server; both shards reload
    // their metadata as donor and recipient do after the commit. No version is set by hand.
    f.move_low_chunk().await;
    for i in 0..2 {
        flush_shard(&f, i, "_flushRoutingTableCacheUpdates", "app.c").await;
    }

    // Router A's write on 1|2 is refused by the donor (StaleConfig, vWanted 2|1) and
    // retargeted; router B's reads on the old routing are refused and retried.
    ca.insert_one(doc! {"x": 7i64}).await.unwrap();
    assert_eq!(f.xs(0, "c"), vec![-5, 5, 7, 50]);
    assert_eq!(f.xs(1, "c"), vec![150]);
    let xs: Vec<i64> = all(cb.find(doc! {}).sort(doc! {"x": 1}).await.unwrap())
        .await
        .iter()
        .map(|d| d.get_i64("x").unwrap())
        .collect();
    assert_eq!(xs, vec![-5, 5, 7, 50, 150]);

    // The database's primary moves to shard1: the old primary refuses the old database
    // version (StaleDbVersion) and the write follows the primary.
    let plain = a.database("app").collection::<Document>("plain");
    plain.insert_one(doc! {"x": 1i64}).await.unwrap();
    assert_eq!(f.xs(0, "plain"), vec![1]);
    f.move_primary().await;
    for i in 0..2 {
        flush_shard(&f, i, "_flushDatabaseCacheUpdates", "app").await;
    }
    plain.insert_one(doc! {"x": 2i64}).await.unwrap();
    assert_eq!(f.xs(1, "plain"), vec![1, 2]);
    assert_eq!(f.xs(0, "plain"), Vec::<i64>::new());
    ra.shutdown().await;
    rb.shutdown().await;
}

/// What one writer had acknowledged: `_id` → (`x`, increments acknowledged), and how long
/// each write took, with when it ended.
#[derive(Default)]
struct Acked {
    docs: std::collections::HashMap<i64, (i64, i64)>,
    latencies: Vec<(std::time::Instant, std::time::Duration)>,
}

/// Writes through `coll` until `stop`: single inserts, ordered bulks of five, and `$inc`
/// updates by shard key of documents it inserted earlier; every write must succeed.
async fn write_until(
    coll: mongodb::Collection<Document>,
    writer: i64,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Acked {
    let mut acked = Acked::default();
    let mut i: i64 = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let started = std::time::Instant::now();
        let id = writer * 1_000_000 + i;
        let x = i % 200;
        match i % 3 {
            0 => {
                coll.insert_one(doc! {"_id": id, "x": x, "n": 0i64})
                    .await
                    .expect("single insert during the migration");
                acked.docs.insert(id, (x, 0));
                i += 1;
            }
            1 => {
                let docs: Vec<Document> = (0..5)
                    .map(|k| doc! {"_id": id + k, "x": (i + k) % 200, "n": 0i64})
                    .collect();
                coll.insert_many(docs)
                    .await
                    .expect("ordered bulk during the migration");
                for k in 0..5 {
                    acked.docs.insert(id + k, ((i + k) % 200, 0));
                }
                i += 5;
            }
            _ => {
                let target = writer * 1_000_000 + (i * 7919) % i.max(1);
                if let Some(&(x, _)) = acked.docs.get(&target) {
                    let r = coll
                        .update_one(doc! {"x": x, "_id": target}, doc! {"$inc": {"n": 1i64}})
                        .await
                        .expect("update during the migration");
                    assert_eq!(r.matched_count, 1, "document {target} found");
                    if let Some(e) = acked.docs.get_mut(&target) {
                        e.1 += 1;
                    }
                }
                i += 1;
            }
        }
        acked
            .latencies
            .push((std::time::Instant::now(), started.elapsed()));
    }
    acked
}

#[tokio::test]
async fn a_migration_under_live_writes_through_two_routers_keeps_every_acknowledged_write_once() {
    let (config, _) = common::config_server("configRS").await;
    let f = Fixture::populate(config, true).await;
    let (ra, a_state, a) = f.router().await;
    let (rb, b_state, b) = f.router().await;
    let (rc, c_state, c) = f.router().await;
    let ca = a.database("app").collection::<Document>("c");
    let cb = b.database("app").collection::<Document>("c");
    let cc = c.database("app").collection::<Document>("c");
    // Data in the chunk that moves, [0, 100) on shard1.
    let seed: Vec<Document> = (0..3000i64)
        .map(|i| doc! {"_id": -1 - i, "x": i % 100, "n": 0i64})
        .collect();
    ca.insert_many(seed).await.unwrap();
    // Router C caches the routing and then stays idle through the migration.
    assert_eq!(cc.count_documents(doc! {}).await.unwrap(), 3000);
    let b_reads = stats(&b_state).collection_reads;

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers = vec![
        tokio::spawn(write_until(ca.clone(), 1, stop.clone())),
        tokio::spawn(write_until(cb.clone(), 2, stop.clone())),
        tokio::spawn(write_until(ca.clone(), 3, stop.clone())),
        tokio::spawn(write_until(cb.clone(), 4, stop.clone())),
    ];
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (a_before, b_before) = (
        stats(&a_state).collection_reads,
        stats(&b_state).collection_reads,
    );
    let began = std::time::Instant::now();
    let reply = a
        .database("admin")
        .run_command(doc! {"moveChunk": "app.c", "find": {"x": 50i64}, "to": "shard0"})
        .await
        .expect("moveChunk through router A");
    let ended = std::time::Instant::now();
    assert!(reply.get_i64("millis").is_ok(), "{reply}");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acked = std::collections::HashMap::new();
    let mut during = Vec::new();
    let mut before = Vec::new();
    for w in writers {
        let r = w.await.unwrap();
        for (t, l) in &r.latencies {
            if *t >= began && *t - *l <= ended {
                during.push(*l);
            } else if *t < began {
                before.push(*l);
            }
        }
        acked.extend(r.docs);
    }
    before.sort_unstable();
    during.sort_unstable();
    let median = |v: &[std::time::Duration]| v.get(v.len() / 2).copied().unwrap_or_default();
    let worst_during = during.last().copied().unwrap_or_default();
    // docs/design/config-server.md §13 records these (`-- --nocapture` prints them).
    println!(
        "migration of 3000+ documents under 4 writers: {:?}; writes acknowledged while it ran: {}; write latency before: median {:?}; during: median {:?}, slowest {:?} (added: {:?}); collection reloads the migration caused: router A {}, router B {}",
        ended - began,
        during.len(),
        median(&before),
        median(&during),
        worst_during,
        worst_during.saturating_sub(median(&before)),
        stats(&a_state).collection_reads - a_before,
        stats(&b_state).collection_reads - b_before,
    );
    assert!(
        !during.is_empty(),
        "writes kept flowing during the migration"
    );

    // config.chunks: [0, 100) moved to shard0 at 2|0, the donor's other chunk at 2|1.
    let chunks = f.config_coll("chunks");
    let moved = chunks
        .find_one(doc! {"min": {"x": 0i64}})
        .await
        .unwrap()
        .expect("the moved chunk");
    assert_eq!(moved.get_str("shard").unwrap(), "shard0");
    assert_eq!(moved.get_timestamp("lastmod").unwrap(), ts(2, 0));
    let kept = chunks
        .find_one(doc! {"min": {"x": 100i64}})
        .await
        .unwrap()
        .expect("the donor's chunk");
    assert_eq!(kept.get_str("shard").unwrap(), "shard1");
    assert_eq!(kept.get_timestamp("lastmod").unwrap(), ts(2, 1));

    // Every acknowledged document exactly once, on the shard that owns its chunk now, with
    // every acknowledged update applied.
    let mut seen = std::collections::HashMap::new();
    for (i, shard) in f.shards.iter().enumerate() {
        for d in shard.service().documents("app", "c") {
            let id = d.get_i64("_id").unwrap();
            let x = d.get_i64("x").unwrap();
            let owner = if x < 0 || (0..100).contains(&x) { 0 } else { 1 };
            assert_eq!(i, owner, "document {d} is on the shard owning its chunk");
            assert!(seen.insert(id, d).is_none(), "document {id} exists once");
        }
    }
    assert_eq!(seen.len(), acked.len() + 3000);
    for (id, (x, n)) in &acked {
        let d = seen
            .get(id)
            .unwrap_or_else(|| panic!("acknowledged {id} lost"));
        assert_eq!(d.get_i64("x").unwrap(), *x);
        assert_eq!(d.get_i64("n").unwrap(), *n, "updates of {id}");
    }

    // Router B met the migration through stale answers and refreshed.
    assert!(stats(&b_state).collection_reads > b_reads);
    // Router C still routes by 1|x: its write to the donor is refused stale (the donor wants
    // 2|1) and retargeted to the recipient; its reads see every document once.
    let c_reads = stats(&c_state).collection_reads;
    cc.insert_one(doc! {"_id": 42i64, "x": 42i64})
        .await
        .unwrap();
    assert!(f.xs(0, "c").contains(&42));
    assert!(!f.xs(1, "c").contains(&42));
    assert!(stats(&c_state).collection_reads > c_reads);
    assert_eq!(
        cc.count_documents(doc! {}).await.unwrap() as usize,
        acked.len() + 3001
    );

    // A migration to the shard that already owns the chunk is a no-op; a chunk that does
    // not exist or a shard that does not exist are refused.
    a.database("admin")
        .run_command(doc! {"moveChunk": "app.c", "find": {"x": 50i64}, "to": "shard0"})
        .await
        .unwrap();
    let e = a
        .database("admin")
        .run_command(doc! {"moveChunk": "app.c", "find": {"x": 50i64}, "to": "shardX"})
        .await
        .unwrap_err();
    assert_eq!(common::error_code(&e), 70, "ShardNotFound: {e}");
    let e = a
        .database("admin")
        .run_command(
            doc! {"moveChunk": "app.c", "bounds": [{"x": 1i64}, {"x": 2i64}], "to": "shard1"},
        )
        .await
        .unwrap_err();
    assert_eq!(common::error_code(&e), 72, "InvalidOptions: {e}");
    let e = a
        .database("admin")
        .run_command(doc! {"moveChunk": "app.plain", "find": {"x": 1i64}, "to": "shard1"})
        .await
        .unwrap_err();
    assert_eq!(common::error_code(&e), 118, "NamespaceNotSharded: {e}");
    ra.shutdown().await;
    rb.shutdown().await;
    rc.shutdown().await;
}

impl Fixture {
    /// `config.chunks` of `ns` as `(min, max, shard, lastmod)`, by `min`, read on the config
    /// server.
    async fn chunks_of(&self, ns: &str) -> Vec<(Document, Document, String, Timestamp)> {
        let Some(entry) = self
            .config_coll("collections")
            .find_one(doc! {"_id": ns})
            .await
            .unwrap()
        else {
            return Vec::new();
        };
        let uuid = entry.get("uuid").cloned().unwrap();
        let chunks = all(self
            .config_coll("chunks")
            .find(doc! {"uuid": uuid})
            .sort(doc! {"min": 1})
            .await
            .unwrap())
        .await;
        chunks
            .into_iter()
            .map(|c| {
                (
                    c.get_document("min").unwrap().clone(),
                    c.get_document("max").unwrap().clone(),
                    c.get_str("shard").unwrap().to_string(),
                    c.get_timestamp("lastmod").unwrap(),
                )
            })
            .collect()
    }
}

async fn admin(client: &mongodb::Client, command: Document) -> mongodb::error::Result<Document> {
    client.database("admin").run_command(command).await
}

/// shardCollection, split, mergeChunks, drop and dropDatabase through `--configdb` routers, as
/// mongos 8.0 sends them (`_shardsvrCreateCollection`, `splitChunk`, `mergeChunks`,
/// `_shardsvrDropCollection`, `_shardsvrDropDatabase` to the shards, which commit on the
/// config server): router A changes the metadata, router B routes by it on first use.
#[tokio::test]
async fn cluster_ddl_through_one_router_is_routed_by_another() {
    let (config, _) = common::config_server("configRS").await;
    let f = Fixture::populate(config, true).await;
    let (ra, _a_state, a) = f.router().await;
    let (rb, _b_state, b) = f.router().await;

    // A hashed key: MongoDB's pre-split, two chunks per shard, recorded on the config server.
    let reply = admin(
        &a,
        doc! {"shardCollection": "ddl.h", "key": {"_id": "hashed"}},
    )
    .await
    .unwrap();
    assert_eq!(reply.get_str("collectionsharded").unwrap(), "ddl.h");
    let chunks = f.chunks_of("ddl.h").await;
    assert_eq!(chunks.len(), 4);
    let owners: Vec<&str> = chunks.iter().map(|c| c.2.as_str()).collect();
    assert_eq!(owners, vec!["shard0", "shard0", "shard1", "shard1"]);
    assert_eq!(chunks[0].0, doc! {"_id": Bson::MinKey});
    // Router B has never seen ddl.h: its writes spread by the chunks A created.
    let hb = b.database("ddl").collection::<Document>("h");
    hb.insert_many((0..200i64).map(|i| doc! {"_id": i}).collect::<Vec<_>>())
        .await
        .unwrap();
    let on0 = f.shards[0].service().documents("ddl", "h").len();
    let on1 = f.shards[1].service().documents("ddl", "h").len();
    assert_eq!(on0 + on1, 200);
    assert!(on0 > 50 && on1 > 50, "{on0} / {on1}");
    let ha = a.database("ddl").collection::<Document>("h");
    assert_eq!(ha.count_documents(doc! {}).await.unwrap(), 200);
    // Again with the same key: as the first time; with another key: AlreadyInitialized.
    admin(
        &b,
        doc! {"shardCollection": "ddl.h", "key": {"_id": "hashed"}},
    )
    .await
    .unwrap();
    let e = admin(&b, doc! {"shardCollection": "ddl.h", "key": {"x": 1}})
        .await
        .unwrap_err();
    assert_eq!(common::error_code(&e), 23);

    // A range key on a collection that already holds documents: one chunk, on the primary.
    let ra_coll = a.database("ddl").collection::<Document>("r");
    ra_coll
        .insert_many((0..100i64).map(|x| doc! {"x": x}).collect::<Vec<_>>())
        .await
        .unwrap();
    let primary = f
        .config_coll("databases")
        .find_one(doc! {"_id": "ddl"})
        .await
        .unwrap()
        .unwrap()
        .get_str("primary")
        .unwrap()
        .to_string();
    let (p, other) = if primary == "shard0" { (0, 1) } else { (1, 0) };
    admin(&a, doc! {"shardCollection": "ddl.r", "key": {"x": 1}})
        .await
        .unwrap();
    let chunks = f.chunks_of("ddl.r").await;
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].2, primary);
    assert_eq!(chunks[0].3, ts(1, 0));

    // split at 50 (the shard commits it: 1|1 and 1|2), then move [50, +inf) to the other
    // shard; router B's writes follow.
    admin(&a, doc! {"split": "ddl.r", "middle": {"x": 50i64}})
        .await
        .unwrap();
    let chunks = f.chunks_of("ddl.r").await;
    assert_eq!(chunks.len(), 2);
    assert_eq!(chunks[0].1, doc! {"x": 50i64});
    assert_eq!((chunks[0].3, chunks[1].3), (ts(1, 1), ts(1, 2)));
    let e = admin(&a, doc! {"split": "ddl.r", "middle": {"x": 50i64}})
        .await
        .unwrap_err();
    assert_eq!(
        common::error_code(&e),
        72,
        "a split at a chunk boundary is refused"
    );
    let other_name = format!("shard{other}");
    admin(
        &a,
        doc! {"moveChunk": "ddl.r", "find": {"x": 70i64}, "to": &other_name},
    )
    .await
    .unwrap();
    let rb_coll = b.database("ddl").collection::<Document>("r");
    rb_coll
        .insert_many((100..120i64).map(|x| doc! {"x": x}).collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(f.xs_in(other, "ddl", "r"), (50..120).collect::<Vec<i64>>());
    assert_eq!(f.xs_in(p, "ddl", "r"), (0..50).collect::<Vec<i64>>());

    // mergeChunks: [MinKey, 50) split at 25 and merged back; a range across two shards is
    // refused.
    admin(&b, doc! {"split": "ddl.r", "middle": {"x": 25i64}})
        .await
        .unwrap();
    assert_eq!(f.chunks_of("ddl.r").await.len(), 3);
    admin(
        &b,
        doc! {"mergeChunks": "ddl.r", "bounds": [{"x": Bson::MinKey}, {"x": 50i64}]},
    )
    .await
    .unwrap();
    let chunks = f.chunks_of("ddl.r").await;
    assert_eq!(chunks.len(), 2);
    assert_eq!(chunks[0].0, doc! {"x": Bson::MinKey});
    assert_eq!(chunks[0].1, doc! {"x": 50i64});
    let e = admin(
        &b,
        doc! {"mergeChunks": "ddl.r", "bounds": [{"x": Bson::MinKey}, {"x": Bson::MaxKey}]},
    )
    .await
    .unwrap_err();
    assert_eq!(common::error_code(&e), 20);
    // Both routers still read every document once.
    assert_eq!(ra_coll.count_documents(doc! {}).await.unwrap(), 120);
    assert_eq!(rb_coll.count_documents(doc! {}).await.unwrap(), 120);

    // drop through B: gone from config.* and from every shard; A (on the old routing) reads
    // nothing.
    rb_coll.drop().await.unwrap();
    assert!(f.chunks_of("ddl.r").await.is_empty());
    assert_eq!(f.xs_in(0, "ddl", "r"), Vec::<i64>::new());
    assert_eq!(f.xs_in(1, "ddl", "r"), Vec::<i64>::new());
    assert_eq!(ra_coll.count_documents(doc! {}).await.unwrap(), 0);

    // dropDatabase through A: the database and ddl.h leave config.* and every shard.
    a.database("ddl").drop().await.unwrap();
    assert!(f
        .config_coll("databases")
        .find_one(doc! {"_id": "ddl"})
        .await
        .unwrap()
        .is_none());
    assert!(f.chunks_of("ddl.h").await.is_empty());
    assert_eq!(f.shards[0].service().documents("ddl", "h").len(), 0);
    assert_eq!(f.shards[1].service().documents("ddl", "h").len(), 0);
    assert_eq!(hb.count_documents(doc! {}).await.unwrap(), 0);
    ra.shutdown().await;
    rb.shutdown().await;
}

/// balancerStart / balancerStop / balancerStatus go to the config server
/// (`_configsvrBalancer*`, the mode kept in `config.settings`), and no client can send the
/// internal commands of cluster DDL through the router.
#[tokio::test]
async fn the_balancer_mode_is_the_config_servers_and_internal_commands_are_refused() {
    let (config, _) = common::config_server("configRS").await;
    let f = Fixture::populate(config, true).await;
    let (ra, _a_state, a) = f.router().await;
    let (rb, _b_state, b) = f.router().await;
    let status = admin(&a, doc! {"balancerStatus": 1}).await.unwrap();
    assert_eq!(status.get_str("mode").unwrap(), "full");
    admin(&a, doc! {"balancerStop": 1}).await.unwrap();
    let setting = f
        .config_coll("settings")
        .find_one(doc! {"_id": "balancer"})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(setting.get_str("mode").unwrap(), "off");
    let status = admin(&b, doc! {"balancerStatus": 1}).await.unwrap();
    assert_eq!(status.get_str("mode").unwrap(), "off");
    assert!(status.get("$clusterTime").is_some());
    admin(&b, doc! {"balancerStart": 1}).await.unwrap();
    let status = admin(&a, doc! {"balancerStatus": 1}).await.unwrap();
    assert_eq!(status.get_str("mode").unwrap(), "full");

    for internal in [
        doc! {"_shardsvrCreateCollection": "c", "shardKey": {"x": 1}},
        doc! {"_shardsvrDropDatabase": 1},
        doc! {"_shardsvrDropCollection": "c"},
        doc! {"_configsvrCommitChunkSplit": "app.c"},
        doc! {"_configsvrBalancerStop": 1},
        doc! {"_configsvrCreateDatabase": "x"},
        doc! {"_sluiceCommitDropDatabase": "app"},
        doc! {"splitChunk": "app.c"},
    ] {
        for db in ["admin", "app"] {
            let e = a
                .database(db)
                .run_command(internal.clone())
                .await
                .unwrap_err();
            assert_eq!(common::error_code(&e), 59, "{internal}");
        }
    }
    assert!(f
        .config_coll("databases")
        .find_one(doc! {"_id": "app"})
        .await
        .unwrap()
        .is_some());
    ra.shutdown().await;
    rb.shutdown().await;
}

/// The embedded cluster of `sluice demo --cluster`: `shards` shard servers, `routers` routers
/// in `--configdb` mode, and `demo.items` (and `demo.other`) sharded on `{_id: "hashed"}`
/// (two chunks per shard).
async fn demo_cluster(shards: usize, routers: usize) -> sluice::demo::DemoCluster {
    demo_cluster_with(shards, 1, routers).await
}

/// [`demo_cluster`] with each shard a replica set of `members` (more than 1).
async fn demo_cluster_with(
    shards: usize,
    members: usize,
    routers: usize,
) -> sluice::demo::DemoCluster {
    let collections: Config = toml::from_str(
        r#"
[[collections]]
ns = "demo.items"
key = '{"_id": "hashed"}'

[[collections]]
ns = "demo.other"
key = '{"_id": "hashed"}'
"#,
    )
    .unwrap();
    let configs = (0..routers)
        .map(|_| Config {
            listen: "127.0.0.1:0".into(),
            ..Config::default()
        })
        .collect();
    sluice::demo::DemoCluster::start_with_members(
        shards,
        members,
        ShardOptions::for_tests(),
        configs,
        vec!["sluice".into()],
        &collections.collections,
    )
    .await
    .expect("the embedded cluster starts")
}

async fn router_client(c: &sluice::demo::DemoCluster, i: usize) -> mongodb::Client {
    common::driver(c.routers[i].0.local_addr(), "").await
}

/// Reads of the `config` database through a `--configdb` router are the config server's, as
/// with mongos: queries, counts and every batch of a cursor, including documents only the
/// config server holds; writes to it are refused.
#[tokio::test]
async fn config_reads_through_a_configdb_router_are_the_config_servers() {
    let cluster = demo_cluster(2, 1).await;
    let client = router_client(&cluster, 0).await;
    let config = client.database("config");
    let entry = config
        .collection::<Document>("collections")
        .find_one(doc! {"_id": "demo.items"})
        .await
        .unwrap()
        .expect("demo.items is in config.collections");
    let uuid = entry.get("uuid").cloned().unwrap();
    let chunks = config.collection::<Document>("chunks");
    let all_chunks = all(chunks
        .find(doc! {"uuid": uuid.clone()})
        .batch_size(1)
        .await
        .unwrap())
    .await;
    assert_eq!(
        all_chunks.len(),
        4,
        "every batch of the config server's cursor"
    );
    assert_eq!(
        chunks
            .count_documents(doc! {"uuid": uuid.clone(), "shard": "shard1"})
            .await
            .unwrap(),
        2
    );
    let owner = chunks
        .find_one(
            doc! {"uuid": uuid, "min": {"$lte": {"_id": 0i64}}, "max": {"$gt": {"_id": 0i64}}},
        )
        .await
        .unwrap()
        .expect("a chunk holds 0");
    assert_eq!(owner.get_str("shard").unwrap(), "shard1");
    // A document only the config server holds is read through the router.
    direct(cluster.config_server.local_addr())
        .await
        .database("config")
        .collection::<Document>("settings")
        .insert_one(doc! {"_id": "probe", "x": 1})
        .await
        .unwrap();
    let probe = config
        .collection::<Document>("settings")
        .find_one(doc! {"_id": "probe"})
        .await
        .unwrap();
    assert_eq!(probe.unwrap().get_i32("x").unwrap(), 1);
    assert_eq!(
        config
            .collection::<Document>("shards")
            .count_documents(doc! {})
            .await
            .unwrap(),
        2
    );
    let e = config
        .collection::<Document>("settings")
        .insert_one(doc! {"_id": "nope"})
        .await
        .unwrap_err();
    assert_eq!(common::error_code(&e), 20);
    cluster.shutdown().await;
}

/// A shard added after the routers started (`addShard` through router A, which sends
/// `_configsvrAddShard`) is routed to by A at once and by router B when its routing first
/// places a chunk there.
#[tokio::test]
async fn a_shard_added_after_start_up_is_routed_to_by_every_router() {
    let cluster = demo_cluster(2, 2).await;
    let (a, b) = (
        router_client(&cluster, 0).await,
        router_client(&cluster, 1).await,
    );
    let new = EmbeddedShard::start(
        "127.0.0.1:0",
        ShardOptions {
            set_name: "shard2".into(),
            configdb: Some(cluster.configdb()),
            ..ShardOptions::for_tests()
        },
    )
    .await
    .unwrap();
    let reply = admin(
        &a,
        doc! {"addShard": format!("shard2/{}", new.local_addr())},
    )
    .await
    .unwrap();
    assert_eq!(reply.get_str("shardAdded").unwrap(), "shard2");
    let listed = admin(&a, doc! {"listShards": 1}).await.unwrap();
    assert_eq!(listed.get_array("shards").unwrap().len(), 3);
    // Again: as the first time. The config server is no shard.
    admin(
        &a,
        doc! {"addShard": format!("shard2/{}", new.local_addr())},
    )
    .await
    .unwrap();
    let e = admin(
        &a,
        doc! {"addShard": format!("configRS/{}", cluster.config_server.local_addr())},
    )
    .await
    .unwrap_err();
    assert_eq!(common::error_code(&e), 96);

    let items_a = a.database("demo").collection::<Document>("items");
    items_a
        .insert_many((0..100i64).map(|i| doc! {"_id": i}).collect::<Vec<_>>())
        .await
        .unwrap();
    admin(
        &a,
        doc! {"moveChunk": "demo.items", "find": {"_id": 0i64}, "to": "shard2"},
    )
    .await
    .unwrap();
    let on_new = new.service().documents("demo", "items").len();
    assert!(on_new > 0, "the chunk of 0 moved to shard2");
    // Router B never heard of shard2: its reads and writes get there.
    let items_b = b.database("demo").collection::<Document>("items");
    assert_eq!(items_b.count_documents(doc! {}).await.unwrap(), 100);
    items_b
        .insert_many((100..200i64).map(|i| doc! {"_id": i}).collect::<Vec<_>>())
        .await
        .unwrap();
    assert!(new.service().documents("demo", "items").len() > on_new);
    assert_eq!(items_a.count_documents(doc! {}).await.unwrap(), 200);
    let listed = admin(&b, doc! {"listShards": 1}).await.unwrap();
    assert_eq!(listed.get_array("shards").unwrap().len(), 3);
    cluster.shutdown().await;
    new.shutdown().await;
}

/// `flushRouterConfig: "db.coll"` forgets that collection only, `"db"` that database's
/// collections, `1` everything: counted by the collection reads the router's cache makes.
#[tokio::test]
async fn flush_router_config_forgets_only_what_it_names() {
    let cluster = demo_cluster(2, 1).await;
    let client = router_client(&cluster, 0).await;
    let sharded = cluster.routers[0].1.clone();
    let items = client.database("demo").collection::<Document>("items");
    let other = client.database("demo").collection::<Document>("other");
    let read_both = || async {
        items.count_documents(doc! {}).await.unwrap();
        other.count_documents(doc! {}).await.unwrap();
        stats(&sharded).collection_reads
    };
    let start = read_both().await;
    assert_eq!(read_both().await, start, "both cached");
    for (target, reads) in [
        (Bson::String("demo.items".into()), 1),
        (Bson::String("demo".into()), 2),
        (Bson::Int32(1), 2),
    ] {
        let before = stats(&sharded).collection_reads;
        admin(&client, doc! {"flushRouterConfig": target.clone()})
            .await
            .unwrap();
        assert_eq!(read_both().await - before, reads, "{target}");
    }
    cluster.shutdown().await;
}

/// `(hashed min, hashed max, shard)` of each chunk of `demo.items`, from the config server.
async fn hashed_chunks(cluster: &sluice::demo::DemoCluster) -> Vec<(Bson, Bson, String)> {
    let config = direct(cluster.config_server.local_addr())
        .await
        .database("config");
    let entry = config
        .collection::<Document>("collections")
        .find_one(doc! {"_id": "demo.items"})
        .await
        .unwrap()
        .unwrap();
    all(config
        .collection::<Document>("chunks")
        .find(doc! {"uuid": entry.get("uuid").cloned().unwrap()})
        .await
        .unwrap())
    .await
    .into_iter()
    .map(|c| {
        (
            c.get_document("min").unwrap().get("_id").cloned().unwrap(),
            c.get_document("max").unwrap().get("_id").cloned().unwrap(),
            c.get_str("shard").unwrap().to_string(),
        )
    })
    .collect()
}

/// Every `demo.items` document on the shards, by `_id`, with the shard holding it; asserts
/// that none is on two shards and each is on the shard owning its chunk.
async fn placed_once_on_owners(
    cluster: &sluice::demo::DemoCluster,
) -> std::collections::HashMap<i64, String> {
    let chunks = hashed_chunks(cluster).await;
    let mut seen = std::collections::HashMap::new();
    for s in &cluster.shards {
        for d in s.service().documents("demo", "items") {
            let id = d.get_i64("_id").unwrap();
            let shard = s.service().name().to_string();
            assert!(
                seen.insert(id, shard.clone()).is_none(),
                "{id} is on two shards"
            );
            assert_eq!(
                owner_of(&chunks, id),
                shard,
                "{id} is on the shard owning its chunk"
            );
        }
    }
    seen
}

fn owner_of(chunks: &[(Bson, Bson, String)], id: i64) -> String {
    let h = sluice::routing::hash64(&Bson::Int64(id));
    let above = |b: &Bson| match b {
        Bson::MinKey => true,
        Bson::Int64(v) => *v <= h,
        _ => false,
    };
    let below = |b: &Bson| match b {
        Bson::MaxKey => true,
        Bson::Int64(v) => h < *v,
        _ => false,
    };
    chunks
        .iter()
        .find(|(lo, hi, _)| above(lo) && below(hi))
        .map(|c| c.2.clone())
        .expect("a chunk owns every hash")
}

/// Inserts `{_id: from, from + 1, …}` through `client` until `stop`; returns the `_id`s
/// acknowledged (every insert must succeed).
fn insert_until(
    client: mongodb::Client,
    from: i64,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Vec<i64>> {
    tokio::spawn(async move {
        let coll = client.database("demo").collection::<Document>("items");
        let mut acked = Vec::new();
        let mut id = from;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            coll.insert_one(doc! {"_id": id, "v": 1})
                .await
                .unwrap_or_else(|e| panic!("insert of {id} failed: {e}"));
            acked.push(id);
            id += 1;
        }
        acked
    })
}

/// A router stopped in the middle of a workload and started again routes as before: the
/// config server is the routing authority, so the new router reads the migration the cluster
/// made meanwhile, and every acknowledged write (through the other router all along, and
/// through both routers' lives) is present once, on the shard that owns its chunk.
#[tokio::test]
async fn a_router_restarted_mid_workload_routes_as_before() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut cluster = demo_cluster(2, 2).await;
    let a = router_client(&cluster, 0).await;
    let stop_a = Arc::new(AtomicBool::new(false));
    let stop_b = Arc::new(AtomicBool::new(false));
    let writer_a = insert_until(a.clone(), 0, stop_a.clone());
    let writer_b = insert_until(router_client(&cluster, 1).await, 1_000_000, stop_b.clone());
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;

    // Router B goes away mid-workload; the cluster moves a chunk while it is down.
    stop_b.store(true, Ordering::Relaxed);
    let mut acked = writer_b.await.unwrap();
    let (router_b, _) = cluster.routers.remove(1);
    router_b.shutdown().await;
    admin(
        &a,
        doc! {"moveChunk": "demo.items", "find": {"_id": 0i64}, "to": "shard0"},
    )
    .await
    .unwrap();

    // Started again, it routes by the config server's chunks as they are now.
    cluster
        .start_router(
            Config {
                listen: "127.0.0.1:0".into(),
                ..Config::default()
            },
            vec!["sluice".into()],
        )
        .await
        .unwrap();
    let b = router_client(&cluster, 1).await;
    let stop_b = Arc::new(AtomicBool::new(false));
    let writer_b = insert_until(b.clone(), 2_000_000, stop_b.clone());
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    admin(
        &b,
        doc! {"moveChunk": "demo.items", "find": {"_id": 0i64}, "to": "shard1"},
    )
    .await
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    stop_a.store(true, Ordering::Relaxed);
    stop_b.store(true, Ordering::Relaxed);
    acked.extend(writer_a.await.unwrap());
    acked.extend(writer_b.await.unwrap());
    assert!(acked.len() > 20, "the workload ran: {}", acked.len());

    let seen = placed_once_on_owners(&cluster).await;
    for id in &acked {
        assert!(seen.contains_key(id), "acknowledged {id} is missing");
    }
    assert_eq!(seen.len(), acked.len());
    let through_b = b.database("demo").collection::<Document>("items");
    assert_eq!(
        through_b.count_documents(doc! {}).await.unwrap() as usize,
        acked.len()
    );
    cluster.shutdown().await;
}

/// `(total, failed)` `find`s of each secondary of each set (primaries as `None`).
async fn secondary_finds(c: &sluice::demo::DemoCluster) -> Vec<Option<(i64, i64)>> {
    let mut out = Vec::new();
    for s in &c.sets {
        let p = s.primary().expect("a primary");
        for i in 0..s.hosts().len() {
            out.push(if i == p {
                None
            } else {
                Some((
                    s.command_total(i, "find").await,
                    s.command_failed(i, "find").await,
                ))
            });
        }
    }
    out
}

/// After a chunk migration through router A, router B (which has not heard of it) reads with
/// `readPreference: secondary`. Every secondary had served B before, so each holds the
/// routing of before the migration, as B does: a secondary must not serve B's stale version
/// as current (it would miss the documents that moved), but learn of the migration as a
/// mongod secondary does from its primary, answer StaleConfig (13388), and B refreshes and
/// retries, as for a primary's StaleConfig. The client sees every document once, and only
/// secondaries served the reads.
#[tokio::test]
async fn a_secondarys_stale_config_after_a_migration_makes_the_router_refresh() {
    let cluster = demo_cluster_with(2, 3, 2).await;
    let a = router_client(&cluster, 0).await;
    let b = router_client(&cluster, 1).await;
    let b_state = cluster.routers[1].1.clone();
    a.database("demo")
        .collection::<Document>("items")
        .insert_many((0..200i64).map(|i| doc! {"_id": i}))
        .await
        .unwrap();
    let secondary = mongodb::options::SelectionCriteria::ReadPreference(
        mongodb::options::ReadPreference::Secondary { options: None },
    );
    let items_b = b.database("demo").collection::<Document>("items");
    let read_b = |filter: Document| async {
        let docs = all(items_b
            .find(filter)
            .selection_criteria(secondary.clone())
            .await
            .expect("a read on secondaries through router B"))
        .await;
        let mut ids: Vec<i64> = docs.iter().map(|d| d.get_i64("_id").unwrap()).collect();
        ids.sort_unstable();
        ids
    };
    let every: Vec<i64> = (0..200).collect();
    // B reads on secondaries until every secondary has served it (each caches the routing).
    let start = secondary_finds(&cluster).await;
    let limit = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        assert_eq!(read_b(doc! {}).await, every);
        let now = secondary_finds(&cluster).await;
        if start.iter().zip(&now).all(|(s, n)| match (s, n) {
            (Some((s, _)), Some((n, _))) => n > s,
            _ => true,
        }) {
            break;
        }
        assert!(
            std::time::Instant::now() < limit,
            "some secondary never served B"
        );
    }
    // Move the chunk of _id 0 to the other shard through router A.
    let owner = cluster
        .sets
        .iter()
        .position(|s| {
            s.documents("demo", "items")
                .iter()
                .any(|d| d.get_i64("_id").ok() == Some(0))
        })
        .expect("a shard holds _id 0");
    let to = cluster.sets[1 - owner].name().to_string();
    a.database("admin")
        .run_command(doc! {"moveChunk": "demo.items", "find": {"_id": 0i64}, "to": &to})
        .await
        .expect("moveChunk through router A");
    let reloads = stats(&b_state).collection_reads;
    let before = secondary_finds(&cluster).await;
    let primaries_before: Vec<i64> = {
        let mut v = Vec::new();
        for s in &cluster.sets {
            v.push(s.command_total(s.primary().unwrap(), "find").await);
        }
        v
    };
    // B, stale, reads on secondaries: the moved document (B targets its old owner), and
    // every document, once.
    for _ in 0..4 {
        assert_eq!(
            read_b(doc! {"_id": 0i64}).await,
            vec![0],
            "router B finds _id 0"
        );
        assert_eq!(
            read_b(doc! {}).await,
            every,
            "router B reads every document once"
        );
    }
    let after = secondary_finds(&cluster).await;
    let stale_answers: i64 = before
        .iter()
        .zip(&after)
        .filter_map(|(b, a)| Some(a.as_ref()?.1 - b.as_ref()?.1))
        .sum();
    assert!(
        stale_answers >= 1,
        "a secondary answered StaleConfig: {before:?} → {after:?}"
    );
    assert!(
        stats(&b_state).collection_reads > reloads,
        "router B reloaded the collection's routing"
    );
    for (k, s) in cluster.sets.iter().enumerate() {
        assert_eq!(
            s.command_total(s.primary().unwrap(), "find").await,
            primaries_before[k],
            "{}: no read on the primary",
            s.name()
        );
    }
    cluster.shutdown().await;
}

/// Client `bulkWrite`s (MongoDB 8.0, the stock driver's `Client::bulk_write`) of four inserts
/// each into `demo.items` through `client` until `stop`, `_id`s from `from`; the `_id`s
/// acknowledged (every bulkWrite must succeed).
fn bulk_write_until(
    client: mongodb::Client,
    from: i64,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Vec<i64>> {
    use mongodb::options::InsertOneModel;
    tokio::spawn(async move {
        let mut acked = Vec::new();
        let mut id = from;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let models: Vec<mongodb::options::WriteModel> = (id..id + 4)
                .map(|i| {
                    InsertOneModel::builder()
                        .namespace(mongodb::Namespace::new("demo", "items"))
                        .document(doc! {"_id": i})
                        .build()
                        .into()
                })
                .collect();
            let r = client
                .bulk_write(models)
                .await
                .unwrap_or_else(|e| panic!("bulkWrite of {id}..{} failed: {e}", id + 4));
            assert_eq!(r.inserted_count, 4);
            acked.extend(id..id + 4);
            id += 4;
        }
        acked
    })
}

/// `bulkWrite`s through router B racing chunk migrations through router A: the donor's
/// critical section holds a versioned `bulkWrite` as it holds `insert` (it waits, then is
/// answered StaleConfig and the router retargets it), so every acknowledged document is
/// afterwards present exactly once, on the shard owning its chunk. Without the wait a
/// bulkWrite landing on the donor after its last catch-up round is deleted with the range.
#[tokio::test]
async fn bulk_writes_racing_migrations_land_once_on_the_chunks_owner() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let cluster = demo_cluster(2, 2).await;
    let a = router_client(&cluster, 0).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..6i64 {
        writers.push(bulk_write_until(
            router_client(&cluster, 1).await,
            w * 1_000_000,
            stop.clone(),
        ));
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    for _ in 0..4 {
        let owner = owner_of(&hashed_chunks(&cluster).await, 0);
        let to = if owner == "shard0" {
            "shard1"
        } else {
            "shard0"
        };
        admin(
            &a,
            doc! {"moveChunk": "demo.items", "find": {"_id": 0i64}, "to": to},
        )
        .await
        .unwrap();
        assert_eq!(owner_of(&hashed_chunks(&cluster).await, 0), to);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(w.await.unwrap());
    }
    assert!(acked.len() > 40, "the workload ran: {}", acked.len());

    let seen = placed_once_on_owners(&cluster).await;
    let missing: Vec<&i64> = acked.iter().filter(|id| !seen.contains_key(id)).collect();
    assert!(missing.is_empty(), "acknowledged but missing: {missing:?}");
    assert_eq!(seen.len(), acked.len());
    cluster.shutdown().await;
}
