//! One request may never crash, stall or poison Sluice: each test sends one hostile or
//! careless request (through the stock driver, or as raw frames) to a router in front of
//! embedded shards, checks mongod's answer, and then checks that the process still serves
//! other connections. The rows are those of the bad-input table in the README.

mod common;

use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use common::{assert_still_serving, error_code, Raw, TestCluster};
use sluice::wire::MsgFlags;

fn sharded() -> [(&'static str, Document); 1] {
    [("demo.items", doc! {"_id": "hashed"})]
}

fn message(e: &mongodb::error::Error) -> String {
    match *e.kind {
        mongodb::error::ErrorKind::Command(ref c) => c.message.clone(),
        ref other => panic!("not a command error: {other:?}"),
    }
}

/// The first write error of a write command's reply: (code, errmsg).
fn write_error(reply: &Document) -> (i32, String) {
    let e = reply
        .get_array("writeErrors")
        .unwrap_or_else(|_| panic!("no writeErrors in {reply}"))[0]
        .as_document()
        .unwrap()
        .clone();
    (
        e.get_i32("code").unwrap(),
        e.get_str("errmsg").unwrap().to_string(),
    )
}

/// Runs an aggregation with `pipeline` through `db` and returns its first batch.
async fn aggregate(
    db: &mongodb::Database,
    pipeline: Vec<Document>,
) -> Result<Vec<Document>, mongodb::error::Error> {
    let pipeline: Vec<Bson> = pipeline.into_iter().map(Bson::Document).collect();
    let reply = db
        .run_command(doc! {"aggregate": 1, "pipeline": pipeline, "cursor": {}})
        .await?;
    Ok(reply
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap()
        .iter()
        .map(|d| d.as_document().unwrap().clone())
        .collect())
}

/// Writes still work for another client after the hostile request.
async fn assert_cluster_serves(c: &TestCluster) {
    assert_still_serving(c.addr()).await;
    let other = common::driver(c.addr(), "").await;
    let r = other
        .database("demo")
        .run_command(doc! {"insert": "items", "documents": [{"_id": bson::oid::ObjectId::new()}]})
        .await
        .unwrap();
    assert_eq!(r.get_i32("n").unwrap(), 1, "{r}");
}

#[tokio::test]
async fn row01_mod_edge_cases_answer_like_mongod() {
    let c = TestCluster::start(3, &sharded()).await;
    let client = common::driver(c.addr(), "").await;
    let db = client.database("test");
    let out = aggregate(
        &db,
        vec![
            doc! {"$documents": [{"a": 1}]},
            doc! {"$project": {"_id": 0, "x": {"$mod": [i64::MIN, -1i64]}}},
        ],
    )
    .await
    .unwrap();
    assert_eq!(out, vec![doc! {"x": 0i64}]);
    let half: bson::Decimal128 = "0.5".parse().unwrap();
    let out = aggregate(
        &db,
        vec![
            doc! {"$documents": [{"a": 1}]},
            doc! {"$project": {"_id": 0, "x": {"$mod": [5, half]}}},
        ],
    )
    .await
    .unwrap();
    assert!(
        matches!(out[0].get("x"), Some(Bson::Decimal128(d)) if d.to_string().parse::<f64>().unwrap() == 0.0),
        "{out:?}"
    );
    let e = aggregate(
        &db,
        vec![
            doc! {"$documents": [{"a": 1}]},
            doc! {"$project": {"x": {"$mod": [5, 0]}}},
        ],
    )
    .await
    .unwrap_err();
    assert_eq!(
        (error_code(&e), message(&e).as_str()),
        (16610, "can't $mod by zero")
    );
    // The same edge cases on a shard's collection.
    let items = client.database("demo");
    items
        .run_command(doc! {"insert": "items", "documents": [{"_id": 1, "n": i64::MIN}]})
        .await
        .unwrap();
    let r = items
        .run_command(doc! {"aggregate": "items", "pipeline": [{"$project": {"m": {"$mod": ["$n", -1i64]}}}], "cursor": {}})
        .await
        .unwrap();
    let batch = r
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap();
    assert_eq!(batch[0].as_document().unwrap().get_i64("m").unwrap(), 0);
    assert_cluster_serves(&c).await;
    c.stop().await;
}

#[tokio::test]
async fn row02_long_add_fields_paths_are_refused() {
    let c = TestCluster::start(3, &sharded()).await;
    let client = common::driver(c.addr(), "").await;
    for parts in [20_000, 2_000] {
        let path = vec!["a"; parts].join(".");
        let e = aggregate(
            &client.database("test"),
            vec![
                doc! {"$documents": [{"a": 1}]},
                doc! {"$addFields": {path: 1}},
            ],
        )
        .await
        .unwrap_err();
        assert_eq!(
            (error_code(&e), message(&e).as_str()),
            (15, "FieldPath is too long")
        );
    }
    // On a shard's collection too.
    let db = client.database("demo");
    db.run_command(doc! {"insert": "items", "documents": [{"_id": 1}]})
        .await
        .unwrap();
    let path = vec!["a"; 20_000].join(".");
    let e = db
        .run_command(
            doc! {"aggregate": "items", "pipeline": [{"$addFields": {path: 1}}], "cursor": {}},
        )
        .await
        .unwrap_err();
    assert_eq!(error_code(&e), 15);
    assert_cluster_serves(&c).await;
    c.stop().await;
}

#[tokio::test]
async fn row03_stage_memory_and_document_size_are_bounded() {
    let c = TestCluster::start(3, &sharded()).await;
    let client = common::driver(c.addr(), "").await;
    let db = client.database("test");
    let big = "x".repeat(4 * 1024 * 1024);
    let arr: Vec<i32> = (0..3000).collect();
    let e = aggregate(
        &db,
        vec![
            doc! {"$documents": [{"big": big.clone(), "arr": arr}]},
            doc! {"$unwind": "$arr"},
        ],
    )
    .await
    .unwrap_err();
    assert_eq!(error_code(&e), 292, "{e}");
    let e = aggregate(
        &db,
        vec![
            doc! {"$documents": [{"big": big}]},
            doc! {"$set": {"copies": ["$$ROOT", "$$ROOT", "$$ROOT", "$$ROOT", "$$ROOT"]}},
        ],
    )
    .await
    .unwrap_err();
    assert_eq!(error_code(&e), 10334, "{e}");
    assert!(message(&e).starts_with("BSONObj size: "), "{e}");
    assert_cluster_serves(&c).await;
    c.stop().await;
}

#[tokio::test]
async fn row04_array_backfill_is_capped() {
    let c = TestCluster::start(3, &sharded()).await;
    let client = common::driver(c.addr(), "").await;
    let db = client.database("demo");
    db.run_command(doc! {"insert": "items", "documents": [{"_id": 1, "arr": []}]})
        .await
        .unwrap();
    for path in ["arr.2000000000", "arr.5000000"] {
        let r = db
            .run_command(
                doc! {"update": "items", "updates": [{"q": {"_id": 1}, "u": {"$set": {path: 1}}}]},
            )
            .await
            .unwrap();
        assert_eq!(
            write_error(&r),
            (34, "can't backfill more than 1500000 elements".to_string())
        );
    }
    let r = db
        .run_command(
            doc! {"update": "items", "updates": [{"q": {"_id": 1}, "u": {"$set": {"arr.3": 1}}}]},
        )
        .await
        .unwrap();
    assert_eq!(r.get_i32("nModified").unwrap(), 1);
    assert_cluster_serves(&c).await;
    c.stop().await;
}

#[tokio::test]
async fn row05_long_set_paths_are_refused() {
    let c = TestCluster::start(3, &sharded()).await;
    let client = common::driver(c.addr(), "").await;
    let db = client.database("demo");
    db.run_command(doc! {"insert": "items", "documents": [{"_id": 1}]})
        .await
        .unwrap();
    let path = vec!["a"; 20_000].join(".");
    let r = db
        .run_command(
            doc! {"update": "items", "updates": [{"q": {"_id": 1}, "u": {"$set": {path: 1}}}]},
        )
        .await
        .unwrap();
    assert_eq!(
        write_error(&r),
        (
            15,
            "Document exceeds maximum nesting depth of 100".to_string()
        )
    );
    assert_cluster_serves(&c).await;
    c.stop().await;
}

fn nested(levels: usize) -> Document {
    let mut d = doc! {"leaf": 1};
    for _ in 1..levels {
        d = doc! {"a": d};
    }
    d
}

#[tokio::test]
async fn row06_documents_nested_deeper_than_100_levels_are_refused_at_insert() {
    let c = TestCluster::start(3, &sharded()).await;
    let client = common::driver(c.addr(), "").await;
    let db = client.database("demo");
    let mut deep = nested(178);
    deep.insert("_id", 1);
    let r = db
        .run_command(doc! {"insert": "items", "documents": [deep]})
        .await
        .unwrap();
    assert_eq!(
        write_error(&r),
        (
            15,
            "cannot insert document because it exceeds 100 levels of nesting".to_string()
        )
    );
    assert_eq!(r.get_i32("n").unwrap(), 0);
    // The deepest document allowed goes in and comes back out.
    let mut ok = nested(100);
    ok.insert("_id", 2);
    let r = db
        .run_command(doc! {"insert": "items", "documents": [ok.clone()]})
        .await
        .unwrap();
    assert_eq!(r.get_i32("n").unwrap(), 1, "{r}");
    let found = db
        .run_command(doc! {"find": "items", "filter": {"_id": 2}})
        .await
        .unwrap();
    let batch = found
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap();
    assert_eq!(batch.len(), 1);
    // An update may not push a document past the limit either.
    let r = db
        .run_command(doc! {"update": "items", "updates": [{"q": {"_id": 2}, "u": {"$set": {"extra": nested(100)}}}]})
        .await
        .unwrap();
    assert_eq!(write_error(&r).0, 15);
    assert_cluster_serves(&c).await;
    c.stop().await;
}

#[tokio::test]
async fn row07_configure_fail_point_is_never_forwarded() {
    let c = TestCluster::start(3, &sharded()).await;
    let client = common::driver(c.addr(), "").await;
    for db in ["test", "demo", "admin"] {
        let e = client
            .database(db)
            .run_command(doc! {"configureFailPoint": "failCommand", "mode": "alwaysOn", "data": {"failCommands": ["insert", "find"], "errorCode": 11600}})
            .await
            .unwrap_err();
        assert_eq!(error_code(&e), 59);
        assert_eq!(message(&e), "no such command: 'configureFailPoint'");
    }
    // The shards (started with test commands) never saw it: inserts and finds still work.
    assert_eq!(c.shard_command_total("configureFailPoint"), 0);
    assert_cluster_serves(&c).await;
    let r = client
        .database("test")
        .run_command(doc! {"find": "x"})
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok").unwrap(), 1.0);
    c.stop().await;
}

#[tokio::test]
async fn row07_shards_refuse_test_commands_unless_enabled() {
    use sluice::embedded::{EmbeddedShard, ShardOptions};
    let plain = EmbeddedShard::start("127.0.0.1:0", ShardOptions::default())
        .await
        .unwrap();
    let mut raw = Raw::connect(plain.local_addr()).await;
    for cmd in [
        doc! {"configureFailPoint": "failCommand", "mode": "alwaysOn", "data": {"failCommands": ["insert"], "errorCode": 11600}, "$db": "admin"},
        doc! {"sluiceSetLatency": 1, "perCommandMicros": 1_000_000, "$db": "admin"},
    ] {
        let r = raw.command(&cmd).await;
        assert_eq!(r.get_i32("code").unwrap(), 59, "{r}");
    }
    let r = raw
        .command(&doc! {"noSuchCommandAtAll": 1, "$db": "admin"})
        .await;
    assert_eq!(r.get_i32("code").unwrap(), 59, "{r}");
    // As mongod counts them: commands it does not have are one `<UNKNOWN>` counter, so made-up
    // names cannot grow the table.
    let r = raw.command(&doc! {"serverStatus": 1, "$db": "admin"}).await;
    let commands = r
        .get_document("metrics")
        .and_then(|m| m.get_document("commands"))
        .unwrap();
    assert_eq!(commands.get_i64("<UNKNOWN>").unwrap(), 3, "{commands}");
    for name in [
        "configureFailPoint",
        "sluiceSetLatency",
        "noSuchCommandAtAll",
    ] {
        assert!(!commands.contains_key(name), "{commands}");
    }
    let r = raw
        .command(&doc! {"getParameter": 1, "enableTestCommands": 1, "$db": "admin"})
        .await;
    assert!(!r.get_bool("enableTestCommands").unwrap());
    let r = raw
        .command(&doc! {"insert": "c", "documents": [{"_id": 1}], "$db": "d"})
        .await;
    assert_eq!(r.get_i32("n").unwrap(), 1);
    plain.shutdown().await;

    let testing = EmbeddedShard::start("127.0.0.1:0", ShardOptions::for_tests())
        .await
        .unwrap();
    let mut raw = Raw::connect(testing.local_addr()).await;
    let r = raw
        .command(&doc! {"configureFailPoint": "failCommand", "mode": "off", "$db": "admin"})
        .await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    let r = raw
        .command(&doc! {"sluiceSetLatency": 1, "perCommandMicros": 1i64 << 62, "$db": "admin"})
        .await;
    assert_eq!(
        r.get_i32("code").unwrap(),
        2,
        "an absurd latency is refused: {r}"
    );
    testing.shutdown().await;
}

#[tokio::test]
async fn row08_internal_commands_never_reach_a_shard_from_a_client() {
    let c = TestCluster::start(3, &sharded()).await;
    let client = common::driver(c.addr(), "").await;
    // The router itself set each shard's version when it sharded the collection.
    let set_by_router = c.shard_command_total("sluiceSetShardVersion");
    let other_version = doc! {"e": bson::oid::ObjectId::new(), "t": bson::Timestamp { time: 1, increment: 1 }, "v": bson::Timestamp { time: 9, increment: 0 }};
    for (db, cmd) in [
        (
            "admin",
            doc! {"sluiceSetShardVersion": "demo.items", "shardVersion": other_version.clone()},
        ),
        (
            "demo",
            doc! {"sluiceSetShardVersion": "demo.items", "shardVersion": other_version},
        ),
        (
            "admin",
            doc! {"sluiceSetLatency": 1, "perCommandMicros": 1i64 << 62},
        ),
        (
            "demo",
            doc! {"sluiceSetLatency": 1, "perCommandMicros": 1i64 << 62},
        ),
        ("demo", doc! {"_shardsvrDropDatabase": 1}),
        (
            "admin",
            doc! {"_configsvrCommitChunkMigration": "demo.items"},
        ),
        ("demo", doc! {"someCommandNobodyKnows": 1}),
    ] {
        let name = cmd.keys().next().unwrap().clone();
        let e = client.database(db).run_command(cmd).await.unwrap_err();
        assert_eq!(error_code(&e), 59, "{name} on {db}");
        assert_eq!(message(&e), format!("no such command: '{name}'"));
    }
    assert_eq!(
        c.shard_command_total("sluiceSetShardVersion"),
        set_by_router,
        "no client's sluiceSetShardVersion reached a shard"
    );
    assert_eq!(c.shard_command_total("sluiceSetLatency"), 0);
    // Writes to the sharded collection are versioned and still accepted; nothing is slowed.
    let started = Instant::now();
    let docs: Vec<Bson> = (0..50).map(|i| Bson::Document(doc! {"_id": i})).collect();
    let r = client
        .database("demo")
        .run_command(doc! {"insert": "items", "documents": docs})
        .await
        .unwrap();
    assert_eq!(r.get_i32("n").unwrap(), 50, "{r}");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_cluster_serves(&c).await;
    c.stop().await;
}

#[tokio::test]
async fn row09_exhaust_hello_with_a_foreign_topology_version_does_not_spin() {
    let c = TestCluster::start(1, &[]).await;
    let mut raw = Raw::connect(c.addr()).await;
    let foreign = doc! {"processId": bson::oid::ObjectId::new(), "counter": 7i64};
    raw.send_msg(
        &doc! {"hello": 1, "topologyVersion": foreign, "maxAwaitTimeMS": 400, "$db": "admin"},
        MsgFlags::EXHAUST_ALLOWED,
    )
    .await;
    let started = Instant::now();
    let (_, flags, first) = raw.read_msg().await;
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "first reply at once"
    );
    assert_ne!(flags & MsgFlags::MORE_TO_COME, 0, "streaming");
    let current = first.get_document("topologyVersion").unwrap().clone();
    let mut replies = 1;
    while started.elapsed() < Duration::from_millis(1_300) {
        match tokio::time::timeout(Duration::from_millis(100), raw.read_msg()).await {
            Ok((_, _, r)) => {
                replies += 1;
                assert_eq!(r.get_document("topologyVersion").unwrap(), &current);
            }
            Err(_) => continue,
        }
    }
    // One immediate reply, then one per maxAwaitTimeMS: about 4 in 1.3 s, not thousands.
    assert!((2..=6).contains(&replies), "{replies} replies");
    drop(raw);
    assert_still_serving(c.addr()).await;
    c.stop().await;
}

#[tokio::test]
async fn row10_failed_transactions_leave_no_router_entries() {
    let c = TestCluster::start(3, &sharded()).await;
    let mut raw = Raw::connect(c.addr()).await;
    let huge_id = Bson::Binary(bson::Binary {
        subtype: bson::spec::BinarySubtype::Generic,
        bytes: vec![7; 1 << 20],
    });
    for i in 0..20i64 {
        let r = raw
            .command(&doc! {"insert": "t", "documents": [{"_id": i}], "lsid": {"id": huge_id.clone()}, "txnNumber": i, "startTransaction": true, "autocommit": false, "$db": "demo"})
            .await;
        assert_eq!(r.get_i32("code").unwrap(), 14, "{r}");
    }
    // Valid sessions whose first statement fails on the shard (a command transactions do not
    // run) leave nothing behind either.
    for i in 0..20u8 {
        let lsid = doc! {"id": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![i; 16] })};
        let r = raw
            .command(&doc! {"count": "t", "query": {"_id": 1}, "lsid": lsid, "txnNumber": 1i64, "startTransaction": true, "autocommit": false, "$db": "demo"})
            .await;
        assert_eq!(r.get_f64("ok").unwrap(), 0.0, "{r}");
    }
    assert_eq!(c.cluster.transactions.len(), 0);
    assert_cluster_serves(&c).await;
    c.stop().await;
}

#[tokio::test]
async fn row11_invalid_and_huge_names_are_refused_before_anything_is_recorded() {
    let c = TestCluster::start(3, &sharded()).await;
    let mut raw = Raw::connect(c.addr()).await;
    let cached = c.cluster.routing.len();
    let huge = "c".repeat(1 << 20);
    for _ in 0..5 {
        let r = raw
            .command(&doc! {"insert": huge.clone(), "documents": [{"_id": 1}], "$db": "demo"})
            .await;
        assert_eq!(
            r.get_i32("code").unwrap(),
            73,
            "{}",
            r.get_str("errmsg").unwrap_or("")
        );
        assert!(r.get_str("errmsg").unwrap().len() < 1000);
        let r = raw
            .command(&doc! {"find": huge.clone(), "$db": "demo"})
            .await;
        assert_eq!(r.get_i32("code").unwrap(), 73);
    }
    assert_eq!(c.cluster.routing.len(), cached, "no name was cached");
    for db in ["bad.name", "a/b", "$x", "with space"] {
        let r = raw
            .command(&doc! {"insert": "c", "documents": [{"_id": 1}], "$db": db})
            .await;
        assert_eq!(r.get_i32("code").unwrap(), 73, "{db}: {r}");
        assert_eq!(
            r.get_str("errmsg").unwrap(),
            format!("Invalid database name: '{db}'")
        );
        assert!(c.sharded.metadata.database(db).is_none());
    }
    for coll in ["$x", ".x", ""] {
        let r = raw
            .command(&doc! {"insert": coll, "documents": [{"_id": 1}], "$db": "fresh"})
            .await;
        assert_eq!(r.get_i32("code").unwrap(), 73, "{coll:?}: {r}");
    }
    assert!(c.sharded.metadata.database("fresh").is_none());
    // Names differing only in case.
    let r = raw
        .command(&doc! {"insert": "c", "documents": [{"_id": 1}], "$db": "Config"})
        .await;
    assert_eq!(r.get_i32("code").unwrap(), 13297, "{r}");
    assert_eq!(
        r.get_str("errmsg").unwrap(),
        "db already exists with different case already have: [config] trying to create [Config]"
    );
    raw.command(&doc! {"insert": "c", "documents": [{"_id": 1}], "$db": "Shop"})
        .await;
    let r = raw
        .command(&doc! {"insert": "c", "documents": [{"_id": 1}], "$db": "shop"})
        .await;
    assert_eq!(r.get_i32("code").unwrap(), 13297, "{r}");
    assert!(c.sharded.metadata.database("Config").is_none());
    assert!(c.sharded.metadata.database("shop").is_none());
    assert_eq!(c.count_on_shards("shop", "c"), 0);
    assert_cluster_serves(&c).await;
    c.stop().await;
}

#[tokio::test]
async fn dropped_databases_leave_no_cached_names_behind() {
    let c = TestCluster::start(2, &sharded()).await;
    let mut raw = Raw::connect(c.addr()).await;
    let cached = c.cluster.routing.len();
    for i in 0..50 {
        let r = raw
            .command(&doc! {"insert": format!("c{i}"), "documents": [{"_id": 1}], "$db": "scratch"})
            .await;
        assert_eq!(r.get_i32("n").unwrap(), 1, "{r}");
    }
    assert!(
        c.cluster.routing.len() >= cached + 50,
        "each namespace is cached as unsharded"
    );
    let r = raw
        .command(&doc! {"dropDatabase": 1, "$db": "scratch"})
        .await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    assert_eq!(
        c.cluster.routing.len(),
        cached,
        "the dropped database's names are forgotten"
    );
    let r = raw
        .command(&doc! {"find": "c0", "filter": {}, "$db": "scratch"})
        .await;
    assert_eq!(
        r.get_document("cursor")
            .unwrap()
            .get_array("firstBatch")
            .unwrap()
            .len(),
        0
    );
    assert_cluster_serves(&c).await;
    c.stop().await;
}

#[tokio::test]
async fn row12_drop_database_of_admin_and_local_is_refused() {
    let c = TestCluster::start(3, &sharded()).await;
    let mut raw = Raw::connect(c.addr()).await;
    let r = raw.command(&doc! {"dropDatabase": 1, "$db": "admin"}).await;
    assert_eq!(
        (r.get_i32("code").unwrap(), r.get_str("errmsg").unwrap()),
        (20, "Cannot drop the admin database")
    );
    let r = raw.command(&doc! {"dropDatabase": 1, "$db": "local"}).await;
    assert_eq!(
        (r.get_i32("code").unwrap(), r.get_str("errmsg").unwrap()),
        (20, "Can't use 'local' database through mongos")
    );
    let r = raw
        .command(&doc! {"dropDatabase": 1, "$db": "config"})
        .await;
    assert_eq!(
        (r.get_i32("code").unwrap(), r.get_str("errmsg").unwrap()),
        (20, "Cannot drop the config database")
    );
    assert_eq!(c.shard_command_total("dropDatabase"), 0, "no shard saw it");
    assert_cluster_serves(&c).await;
    c.stop().await;
}

#[tokio::test]
async fn row13_max_time_ms_is_honoured_against_a_stalled_shard() {
    let c = TestCluster::start(1, &sharded()).await;
    let mut direct = Raw::connect(c.shards[0].local_addr()).await;
    direct
        .command(&doc! {"configureFailPoint": "failCommand", "mode": "alwaysOn", "data": {"failCommands": ["find"], "blockConnection": true, "blockTimeMS": 10_000}, "$db": "admin"})
        .await;
    let mut raw = Raw::connect(c.addr()).await;
    // A sharded collection (the read path) and an unsharded one (forwarded).
    for coll in ["items", "plain"] {
        let started = Instant::now();
        let r = raw
            .command(&doc! {"find": coll, "filter": {}, "maxTimeMS": 1000, "$db": "demo"})
            .await;
        let took = started.elapsed();
        assert_eq!(r.get_i32("code").unwrap(), 50, "{r}");
        assert_eq!(r.get_str("codeName").unwrap(), "MaxTimeMSExpired");
        assert_eq!(
            r.get_str("errmsg").unwrap(),
            "operation exceeded time limit"
        );
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(5),
            "answered after {took:?}"
        );
    }
    let r = raw
        .command(&doc! {"find": "items", "maxTimeMS": "soon", "$db": "demo"})
        .await;
    assert_eq!(r.get_i32("code").unwrap(), 2);
    direct
        .command(&doc! {"configureFailPoint": "failCommand", "mode": "off", "$db": "admin"})
        .await;
    // The connections left waiting on the stalled shard were not reused: reads work again.
    let r = raw
        .command(&doc! {"find": "items", "filter": {}, "maxTimeMS": 5000, "$db": "demo"})
        .await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    assert_cluster_serves(&c).await;
    c.stop().await;
}

#[tokio::test]
async fn row14_write_batches_hold_at_most_100000_statements() {
    let c = TestCluster::start(1, &sharded()).await;
    let docs: Vec<Bson> = (0..100_001)
        .map(|i| Bson::Document(doc! {"_id": i}))
        .collect();
    let expected = "Write batch sizes must be between 1 and 100000. Got 100001 operations.";
    // Directly on the embedded shard.
    let mut direct = Raw::connect(c.shards[0].local_addr()).await;
    let r = direct
        .command(&doc! {"insert": "c", "documents": docs.clone(), "$db": "d"})
        .await;
    assert_eq!(
        (r.get_i32("code").unwrap(), r.get_str("errmsg").unwrap()),
        (16, expected)
    );
    assert_eq!(c.shards[0].service().count_documents("d", "c"), 0);
    // And through the router.
    let mut raw = Raw::connect(c.addr()).await;
    let r = raw
        .command(&doc! {"insert": "items", "documents": docs, "$db": "demo"})
        .await;
    assert_eq!(
        (r.get_i32("code").unwrap(), r.get_str("errmsg").unwrap()),
        (16, expected)
    );
    assert_eq!(c.count_on_shards("demo", "items"), 0);
    assert_cluster_serves(&c).await;
    c.stop().await;
}

/// A pipeline that computes for a long time (its cost grows with what it asks: here a `$reduce`
/// over a range, for eight documents) runs beside the other connections instead of in front of
/// them: with more such requests at once than the runtime has workers, another connection's
/// pings are still answered at once. Before, each held the worker it ran on, and with two of
/// them a `ping` waited up to 12 s (`sluice demo`, release build). Through the router (which
/// runs a collection-less pipeline itself) and on the embedded shard directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row15_a_long_computation_does_not_hold_up_other_connections() {
    let c = TestCluster::start(1, &sharded()).await;
    pings_beside_long_pipelines(c.addr()).await;
    pings_beside_long_pipelines(c.shards[0].local_addr()).await;
    assert_cluster_serves(&c).await;
    c.stop().await;
}

/// Runs three long pipelines at once on `addr` (the test runtime has two workers) and, beside
/// them, pings on another connection: each ping must take under a quarter of one pipeline.
async fn pings_beside_long_pipelines(addr: std::net::SocketAddr) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let heavy = doc! {
        "aggregate": 1,
        "pipeline": [
            {"$documents": (0..8).map(|i| Bson::Document(doc! {"i": i})).collect::<Vec<_>>()},
            {"$project": {"s": {"$reduce": {
                "input": {"$range": [0, 50_000]},
                "initialValue": 0,
                "in": {"$add": ["$$value", "$$this"]},
            }}}},
            {"$count": "n"},
        ],
        "cursor": {},
        "$db": "demo",
    };
    let mut ping = Raw::connect(addr).await;
    // One alone first: how long it takes on this machine, which the pings are measured against.
    let mut raw = Raw::connect(addr).await;
    let t = Instant::now();
    let r = raw.command(&heavy).await;
    let batch = r
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap();
    assert_eq!(
        batch[0].as_document().unwrap().get_i32("n").unwrap(),
        8,
        "{r}"
    );
    let alone = t.elapsed();
    assert!(
        alone >= Duration::from_millis(100),
        "too quick to show anything: {alone:?}"
    );
    // Three at once, each repeated until the pings are done.
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (stop, started, heavy) = (stop.clone(), started.clone(), heavy.clone());
        tasks.push(tokio::spawn(async move {
            let mut raw = Raw::connect(addr).await;
            let mut done = 0;
            started.fetch_add(1, Ordering::SeqCst);
            while !stop.load(Ordering::SeqCst) {
                let r = raw.command(&heavy).await;
                assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
                done += 1;
            }
            done
        }));
    }
    while started.load(Ordering::SeqCst) < 3 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(alone / 4).await;
    let until = Instant::now() + (alone * 3).max(Duration::from_secs(1));
    let (mut worst, mut pings) = (Duration::ZERO, 0);
    while Instant::now() < until {
        let t = Instant::now();
        let r = ping.command(&doc! {"ping": 1, "$db": "admin"}).await;
        assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
        worst = worst.max(t.elapsed());
        pings += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut heavy_done = 0;
    for t in tasks {
        heavy_done += t.await.unwrap();
    }
    assert!(heavy_done >= 3, "the long requests ran: {heavy_done}");
    assert!(
        worst < alone / 4,
        "{addr}: a ping waited {worst:?} ({pings} pings) beside requests taking {alone:?} each"
    );
}
