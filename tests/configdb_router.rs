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

    /// The `x` values of `db.coll` on shard `i`.
    fn xs(&self, i: usize, coll: &str) -> Vec<i64> {
        let mut v: Vec<i64> = self.shards[i]
            .service()
            .documents("app", coll)
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

    // Sharding DDL is not run by a --configdb router yet: refused, nothing half-done.
    for cmd in [
        doc! {"shardCollection": "app.d", "key": {"x": 1}},
        doc! {"dropDatabase": 1},
    ] {
        let db = if cmd.contains_key("dropDatabase") {
            "app"
        } else {
            "admin"
        };
        let e = client
            .database(db)
            .run_command(cmd.clone())
            .await
            .unwrap_err();
        assert_eq!(common::error_code(&e), 115, "{cmd}");
    }
    let e = c.drop().await.unwrap_err();
    assert_eq!(common::error_code(&e), 115);
    assert_eq!(
        c.count_documents(doc! {}).await.unwrap(),
        3,
        "nothing was dropped"
    );

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
    let mut during = 0usize;
    let mut before = Vec::new();
    let mut worst_during = std::time::Duration::ZERO;
    for w in writers {
        let r = w.await.unwrap();
        for (t, l) in &r.latencies {
            if *t >= began && *t - *l <= ended {
                during += 1;
                worst_during = worst_during.max(*l);
            } else if *t < began {
                before.push(*l);
            }
        }
        acked.extend(r.docs);
    }
    before.sort_unstable();
    let median_before = before.get(before.len() / 2).copied().unwrap_or_default();
    println!(
        "migration of 3000+ documents: {:?}; writes acknowledged while it ran: {during}; median write before {median_before:?}, slowest during {worst_during:?}; refreshes: A {} B {}",
        ended - began,
        stats(&a_state).collection_reads,
        stats(&b_state).collection_reads,
    );
    assert!(during > 0, "writes kept flowing during the migration");

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
