//! Sharding administration through the router with the stock Rust driver: shardCollection's
//! pre-split and placement as MongoDB does it, the errors, config reads, hashing.

mod common;

use bson::{doc, Bson, Document};
use common::TestCluster;
use sluice::routing::hash64;

async fn client(c: &TestCluster) -> mongodb::Client {
    common::driver(c.addr(), "").await
}

#[tokio::test]
async fn shard_collection_presplits_like_mongodb() {
    let c = TestCluster::start(4, &[]).await;
    let cl = client(&c).await;
    let admin = cl.database("admin");
    let r = admin
        .run_command(doc! {"shardCollection": "app.items", "key": {"_id": "hashed"}})
        .await
        .unwrap();
    assert_eq!(r.get_str("collectionsharded").unwrap(), "app.items");
    let config = cl.database("config");
    let coll = config
        .collection::<Document>("collections")
        .find_one(doc! {"_id": "app.items"})
        .await
        .unwrap()
        .unwrap();
    let uuid = coll.get("uuid").unwrap().clone();
    let mut cursor = config
        .collection::<Document>("chunks")
        .find(doc! {"uuid": uuid})
        .sort(doc! {"min": 1})
        .await
        .unwrap();
    let mut chunks = Vec::new();
    while cursor.advance().await.unwrap() {
        chunks.push(cursor.deserialize_current().unwrap());
    }
    // 2 chunks per shard, contiguous runs over sorted shard ids, split at the formula's points.
    assert_eq!(chunks.len(), 8);
    let owners: Vec<&str> = chunks.iter().map(|d| d.get_str("shard").unwrap()).collect();
    assert_eq!(
        owners,
        ["shard0", "shard0", "shard1", "shard1", "shard2", "shard2", "shard3", "shard3"]
    );
    let mins: Vec<Bson> = chunks
        .iter()
        .map(|d| d.get_document("min").unwrap().get("_id").unwrap().clone())
        .collect();
    assert_eq!(mins[0], Bson::MinKey);
    assert_eq!(mins[4], Bson::Int64(0));
    assert_eq!(mins[1], Bson::Int64(-6917529027641081850));
    assert_eq!(
        chunks[7].get_document("max").unwrap().get("_id").unwrap(),
        &Bson::MaxKey
    );
    let versions: Vec<u32> = chunks
        .iter()
        .map(|d| d.get_timestamp("lastmod").unwrap().increment)
        .collect();
    assert_eq!(versions, (0..8).collect::<Vec<u32>>());

    // numInitialChunks is honoured.
    admin
        .run_command(
            doc! {"shardCollection": "app.few", "key": {"k": "hashed"}, "numInitialChunks": 3},
        )
        .await
        .unwrap();
    let snap = c.cluster.routing.get("app.few").unwrap().unwrap();
    assert_eq!(snap.chunks.len(), 3);
    // Every shard was given its version.
    let v = snap.shard_version("shard1");
    assert_eq!(v.get_object_id("e").unwrap(), snap.epoch);
    c.stop().await;
}

#[tokio::test]
async fn routing_places_keys_where_the_hash_says() {
    let c = TestCluster::start(3, &[("demo.store_inventory", doc! {"_id": "hashed"})]).await;
    let snap = c
        .cluster
        .routing
        .get("demo.store_inventory")
        .unwrap()
        .unwrap();
    let values = [
        Bson::Int32(42),
        Bson::String("abc".into()),
        Bson::Null,
        Bson::Document(doc! {"productId": 7, "storeId": 3}),
    ];
    for value in values {
        let h = hash64(&value);
        let key = sluice::routing::ShardKey(vec![Bson::Int64(h)]);
        let shard = snap.shard_for(&key).unwrap();
        // Chunks (3 shards, 6 chunks): shard0 < -3074457345618258602 <= shard1 < 3074457345618258602 <= shard2
        let by_bounds = if h < -3074457345618258602 {
            "shard0"
        } else if h < 3074457345618258602 {
            "shard1"
        } else {
            "shard2"
        };
        assert_eq!(shard, by_bounds, "{value:?} hashes to {h}");
    }
    c.stop().await;
}

#[tokio::test]
async fn shard_collection_errors() {
    let c = TestCluster::start(2, &[("demo.taken", doc! {"_id": "hashed"})]).await;
    let cl = client(&c).await;
    let admin = cl.database("admin");
    let cases: Vec<(Document, i32)> = vec![
        (
            doc! {"shardCollection": "demo.a", "key": {"x": "hashed", "y": "hashed"}},
            2,
        ),
        (doc! {"shardCollection": "demo.a", "key": {"x": -1}}, 2),
        (
            doc! {"shardCollection": "demo.a", "key": {"x": "hashed"}, "unique": true},
            72,
        ),
        (
            doc! {"shardCollection": "demo.a", "key": {"x": 1}, "numInitialChunks": 4},
            72,
        ),
        (doc! {"shardCollection": "nodot", "key": {"x": 1}}, 73),
        (doc! {"shardCollection": "admin.x", "key": {"x": 1}}, 20),
        (doc! {"shardCollection": "demo.a"}, 40414),
        (
            doc! {"shardCollection": "demo.taken", "key": {"other": 1}},
            23,
        ),
    ];
    for (cmd, code) in cases {
        let e = admin.run_command(cmd.clone()).await.unwrap_err();
        assert_eq!(common::command_code(&e), code, "{cmd}");
    }
    // Same key again: accepted, as mongos does.
    admin
        .run_command(doc! {"shardCollection": "demo.taken", "key": {"_id": "hashed"}})
        .await
        .unwrap();

    // A non-empty collection is refused: put a document on one shard directly.
    let direct = c.direct(1).await;
    direct
        .database("demo")
        .collection::<Document>("full")
        .insert_one(doc! {"_id": 1})
        .await
        .unwrap();
    let e = admin
        .run_command(doc! {"shardCollection": "demo.full", "key": {"_id": "hashed"}})
        .await
        .unwrap_err();
    assert_eq!(common::command_code(&e), 72);
    assert!(
        e.to_string()
            .contains("already holds 1 documents on shard1"),
        "{e}"
    );
    assert!(c.cluster.routing.get("demo.full").unwrap().is_none());
    c.stop().await;
}

#[tokio::test]
async fn admin_commands_and_hashing_through_the_router() {
    let c = TestCluster::start(3, &[]).await;
    let cl = client(&c).await;
    let admin = cl.database("admin");
    let shards = admin.run_command(doc! {"listShards": 1}).await.unwrap();
    let ids: Vec<&str> = shards
        .get_array("shards")
        .unwrap()
        .iter()
        .map(|s| s.as_document().unwrap().get_str("_id").unwrap())
        .collect();
    assert_eq!(ids, ["shard0", "shard1", "shard2"]);
    admin
        .run_command(doc! {"enableSharding": "newdb"})
        .await
        .unwrap();
    let e = admin
        .run_command(doc! {"enableSharding": "bad.name"})
        .await
        .unwrap_err();
    assert_eq!(common::command_code(&e), 73);
    let flushed = admin
        .run_command(doc! {"flushRouterConfig": 1})
        .await
        .unwrap();
    assert!(flushed.get_bool("flushed").unwrap());
    assert!(c.cluster.routing.is_empty());

    // What mongosh's convertShardKeyToHashed sends.
    for (value, expected) in [
        (Bson::Int32(42), -944302157085130861i64),
        (Bson::String("abc".into()), 8478485326885698097),
    ] {
        let r = cl
            .database("_fakeDbForMongoshCSKTH")
            .run_command(doc! {
                "aggregate": 1,
                "pipeline": [{"$documents": [{}]}, {"$limit": 1}, {"$project": {"_id": {"$toHashedIndexKey": {"$literal": value}}}}],
                "cursor": {},
            })
            .await
            .unwrap();
        let first = r
            .get_document("cursor")
            .unwrap()
            .get_array("firstBatch")
            .unwrap()[0]
            .as_document()
            .unwrap()
            .clone();
        assert_eq!(first.get_i64("_id").unwrap(), expected);
    }

    // The config database is read-only.
    let e = cl
        .database("config")
        .collection::<Document>("chunks")
        .insert_one(doc! {"x": 1})
        .await
        .unwrap_err();
    assert_eq!(common::error_code(&e), 20);
    c.stop().await;
}
