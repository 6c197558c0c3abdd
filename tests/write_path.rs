//! The write path through the router with the stock Rust driver: the analysis's round counts
//! on 2…8 embedded shards, fallbacks of the proof, the "always" policy, write errors and
//! retryable resends after a lost shard connection.

mod common;

use bson::{doc, Bson, Document};
use common::{next_txn_number, TestCluster};
use sluice::config::Config;
use sluice::write::plan::Policy;

fn upserts(n: i32) -> Vec<Bson> {
    (0..n)
        .map(|i| {
            Bson::Document(doc! {
                "q": {"_id": {"productId": i, "storeId": 1}},
                "u": {"stock": i, "price": 100},
                "upsert": true,
            })
        })
        .collect()
}

/// One `update` command as a retryable write (`lsid` + `txnNumber`), as drivers send a bulk of
/// single-document updates.
async fn run_update(
    cl: &mongodb::Client,
    coll: &str,
    updates: Vec<Bson>,
    ordered: bool,
) -> Document {
    let mut session = cl.start_session().await.unwrap();
    cl.database("demo")
        .run_command(
            doc! {"update": coll, "updates": updates, "ordered": ordered, "txnNumber": next_txn_number()},
        )
        .session(&mut session)
        .await
        .unwrap()
}

async fn contents(cl: &mongodb::Client, coll: &str) -> Vec<Document> {
    let mut cursor = cl
        .database("demo")
        .collection::<Document>(coll)
        .find(doc! {})
        .await
        .unwrap();
    let mut out = Vec::new();
    while cursor.advance().await.unwrap() {
        out.push(cursor.deserialize_current().unwrap());
    }
    out.sort_by_key(|d| format!("{:?}", d.get("_id")));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_analysis_reproduced_on_2_to_8_shards() {
    for shards in 2..=8usize {
        let mut finals = Vec::new();
        for (policy, ordered) in [
            (Policy::Off, true),
            (Policy::RetrySafe, true),
            (Policy::RetrySafe, false),
        ] {
            let config = Config {
                ordered_rewrite: policy,
                ..Config::default()
            };
            let c = TestCluster::start_with(
                shards,
                &[("demo.store_inventory", doc! {"_id": "hashed"})],
                config,
            )
            .await;
            let cl = common::driver(c.addr(), "").await;
            let before = c.shard_command_total("update");
            let r = run_update(&cl, "store_inventory", upserts(1000), ordered).await;
            assert_eq!(r.get_i32("n").unwrap(), 1000);
            assert_eq!(r.get_array("upserted").unwrap().len(), 1000);
            let batches = (c.shard_command_total("update") - before) as f64;
            let p = 1.0 - 1.0 / shards as f64;
            let expected = 1.0 + 999.0 * p;
            let sigma = (999.0 * p * (1.0 - p)).sqrt();
            eprintln!("S={shards} {policy:?} ordered={ordered}: {batches} update child batches (formula {expected:.1})");
            match (policy, ordered) {
                (Policy::Off, true) => assert!(
                    (batches - expected).abs() <= 4.0 * sigma,
                    "S={shards} mongos rounds: {batches} child batches, formula {expected:.1} ± {sigma:.1}"
                ),
                _ => assert_eq!(batches, shards as f64, "S={shards} {policy:?} ordered={ordered}: one child batch per shard"),
            }
            finals.push(contents(&cl, "store_inventory").await);
            c.stop().await;
        }
        assert_eq!(finals[0].len(), 1000);
        assert_eq!(
            finals[0], finals[1],
            "S={shards}: rewrite leaves what mongos rounds leave"
        );
        assert_eq!(
            finals[0], finals[2],
            "S={shards}: unordered leaves the same"
        );
    }
}

#[tokio::test]
async fn the_proof_falls_back_to_mongos_rounds() {
    let c = TestCluster::start(
        3,
        &[
            ("demo.items", doc! {"_id": "hashed"}),
            ("demo.bysk", doc! {"sk": "hashed"}),
        ],
    )
    .await;
    let cl = common::driver(c.addr(), "").await;
    let inc: Vec<Bson> = (0..20)
        .map(|i| Bson::Document(doc! {"q": {"_id": i}, "u": {"$inc": {"n": 1}}, "upsert": true}))
        .collect();
    let twice: Vec<Bson> = (0..20)
        .map(|i| {
            Bson::Document(doc! {"q": {"_id": i % 10}, "u": {"$set": {"v": i}}, "upsert": true})
        })
        .collect();
    let by_key: Vec<Bson> = (0..20)
        .map(|i| Bson::Document(doc! {"q": {"sk": i}, "u": {"$set": {"v": i}}}))
        .collect();
    let mut broadcast: Vec<Bson> = (0..10)
        .map(|i| Bson::Document(doc! {"q": {"_id": i}, "u": {"$set": {"v": 1}}, "upsert": true}))
        .collect();
    broadcast.push(Bson::Document(
        doc! {"q": {"v": 1}, "u": {"$set": {"w": 2}}, "multi": true},
    ));
    let cases: Vec<(&str, Vec<Bson>)> = vec![
        ("items", inc),
        ("items", twice),
        ("bysk", by_key),
        ("items", broadcast),
    ];
    for (coll, updates) in cases {
        let (rounds_before, _, rewrites_before) = c.plans();
        run_update(&cl, coll, updates.clone(), true).await;
        let (rounds_after, _, rewrites_after) = c.plans();
        assert_eq!(
            rounds_after,
            rounds_before + 1,
            "mongos rounds for {updates:?}"
        );
        assert_eq!(rewrites_after, rewrites_before);
    }
    // And a provable bulk is rewritten.
    let (_, _, rewrites_before) = c.plans();
    let good: Vec<Bson> = (100..120)
        .map(|i| Bson::Document(doc! {"q": {"_id": i}, "u": {"$set": {"v": i}}, "upsert": true}))
        .collect();
    run_update(&cl, "items", good, true).await;
    assert_eq!(c.plans().2, rewrites_before + 1);
    c.stop().await;
}

#[tokio::test]
async fn always_keeps_each_documents_statements_in_order() {
    let config = Config {
        ordered_rewrite: Policy::Always,
        ..Config::default()
    };
    let c = TestCluster::start_with(3, &[("demo.items", doc! {"_id": "hashed"})], config).await;
    let cl = common::driver(c.addr(), "").await;
    let updates: Vec<Bson> = (0..60)
        .map(|i| {
            Bson::Document(doc! {"q": {"_id": i % 6}, "u": {"$set": {"last": i}}, "upsert": true})
        })
        .collect();
    let r = run_update(&cl, "items", updates, true).await;
    assert_eq!(r.get_i32("n").unwrap(), 60);
    assert_eq!(c.plans().2, 1, "rewritten despite repeated _ids");
    for d in contents(&cl, "items").await {
        let id = d.get_i32("_id").unwrap();
        assert_eq!(
            d.get_i32("last").unwrap(),
            54 + id,
            "the last statement on each _id wins"
        );
    }
    c.stop().await;
}

#[tokio::test]
async fn ordered_errors_look_the_same_under_every_policy() {
    for policy in [Policy::Off, Policy::RetrySafe, Policy::Always] {
        let config = Config {
            ordered_rewrite: policy,
            ..Config::default()
        };
        let c = TestCluster::start_with(3, &[("demo.items", doc! {"_id": "hashed"})], config).await;
        let cl = common::driver(c.addr(), "").await;
        let coll = cl.database("demo").collection::<Document>("items");
        coll.insert_one(doc! {"_id": 500}).await.unwrap();
        let docs: Vec<Document> = (0..1000).map(|i| doc! {"_id": i}).collect();
        let e = coll.insert_many(docs.clone()).await.unwrap_err();
        match *e.kind {
            mongodb::error::ErrorKind::InsertMany(ref im) => {
                let we = im.write_errors.as_ref().unwrap();
                assert_eq!(we.len(), 1, "{policy:?}");
                assert_eq!(we[0].index, 500);
                assert_eq!(we[0].code, 11000);
            }
            ref other => panic!("{policy:?}: {other:?}"),
        }
        // The raw reply: n counts only the statements before the error.
        let r = cl
            .database("demo")
            .run_command(doc! {"insert": "items", "documents": [{"_id": 2000}, {"_id": 500}, {"_id": 2001}], "ordered": true})
            .await
            .unwrap();
        assert_eq!(r.get_i32("n").unwrap(), 1, "{policy:?}");
        c.stop().await;
    }
}

#[tokio::test]
async fn retryable_child_batches_are_resent_after_a_closed_connection() {
    let c = TestCluster::start(3, &[("demo.items", doc! {"_id": "hashed"})]).await;
    let direct = c.direct(1).await;
    direct
        .database("admin")
        .run_command(doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["insert"], "closeConnection": true}})
        .await
        .unwrap();
    let cl = common::driver(c.addr(), "").await;
    let coll = cl.database("demo").collection::<Document>("items");
    let docs: Vec<Document> = (0..300).map(|i| doc! {"_id": i}).collect();
    coll.insert_many(docs).await.unwrap();
    assert_eq!(
        c.count_on_shards("demo", "items"),
        300,
        "every document exactly once"
    );

    // Without a retryable write the router reports the statements and lets the client decide.
    direct
        .database("admin")
        .run_command(doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["insert"], "closeConnection": true}})
        .await
        .unwrap();
    let plain = common::driver(c.addr(), "&retryWrites=false").await;
    let coll = plain.database("demo").collection::<Document>("items");
    let docs: Vec<Document> = (1000..1300).map(|i| doc! {"_id": i}).collect();
    let e = coll.insert_many(docs).ordered(false).await.unwrap_err();
    let mongodb::error::ErrorKind::InsertMany(ref im) = *e.kind else {
        panic!("{e:?}")
    };
    let we = im.write_errors.as_ref().unwrap();
    assert!(!we.is_empty());
    assert!(
        we.iter().all(|w| w.code == 6),
        "HostUnreachable for the lost child batch"
    );
    assert_eq!(
        c.count_on_shards("demo", "items"),
        300 + 300 - we.len(),
        "no write lost or doubled"
    );
    c.stop().await;
}

#[tokio::test]
async fn unsharded_collections_pass_through_to_the_primary() {
    let c = TestCluster::start(3, &[]).await;
    let cl = common::driver(c.addr(), "").await;
    let coll = cl.database("plain").collection::<Document>("things");
    coll.insert_many((0..10).map(|i| doc! {"_id": i, "v": i}))
        .await
        .unwrap();
    coll.update_one(doc! {"_id": 3}, doc! {"$set": {"v": 30}})
        .await
        .unwrap();
    coll.delete_one(doc! {"_id": 4}).await.unwrap();
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 9);
    assert_eq!(
        coll.find_one(doc! {"_id": 3})
            .await
            .unwrap()
            .unwrap()
            .get_i32("v")
            .unwrap(),
        30
    );
    let primary = c
        .sharded
        .metadata
        .database("plain")
        .unwrap()
        .get_str("primary")
        .unwrap()
        .to_string();
    let on_primary = c
        .shards
        .iter()
        .find(|s| s.service().name() == primary)
        .unwrap();
    assert_eq!(on_primary.service().count_documents("plain", "things"), 9);
    c.stop().await;
}

#[tokio::test]
async fn targeting_errors_reach_the_client() {
    let c = TestCluster::start(2, &[("demo.items", doc! {"sk": "hashed"})]).await;
    let cl = common::driver(c.addr(), "").await;
    let first_error = |r: &Document| {
        r.get_array("writeErrors").unwrap()[0]
            .as_document()
            .unwrap()
            .get_i32("code")
            .unwrap()
    };
    // A multi-document upsert must pin the full shard key (mongos's 61).
    let r = run_update(
        &cl,
        "items",
        vec![Bson::Document(
            doc! {"q": {"x": 1}, "u": {"$set": {"a": 1}}, "upsert": true, "multi": true},
        )],
        true,
    )
    .await;
    assert_eq!(first_error(&r), 61);
    // A multi-document update may not write the shard key (72).
    let r = run_update(
        &cl,
        "items",
        vec![Bson::Document(
            doc! {"q": {"x": 1}, "u": {"$set": {"sk": 1}}, "multi": true},
        )],
        true,
    )
    .await;
    assert_eq!(first_error(&r), 72);
    // An array in the shard key (61).
    let r = cl
        .database("demo")
        .run_command(doc! {"insert": "items", "documents": [{"_id": 1, "sk": [1, 2]}]})
        .await
        .unwrap();
    assert_eq!(first_error(&r), 61);
    // Single-document writes without the shard key run as mongos 8.0 runs them (a write
    // without shard key): no refusal.
    let r = run_update(
        &cl,
        "items",
        vec![Bson::Document(
            doc! {"q": {"x": 1}, "u": {"$set": {"a": 1}}, "upsert": true},
        )],
        true,
    )
    .await;
    assert_eq!(r.get_i32("n").unwrap(), 1, "{r}");
    assert_eq!(r.get_array("upserted").unwrap().len(), 1);
    c.stop().await;
}

#[tokio::test]
async fn unacknowledged_writes_reach_the_shards_without_a_reply() {
    use sluice::wire::MsgFlags;
    let c = TestCluster::start(3, &[("demo.items", doc! {"_id": "hashed"})]).await;
    let mut raw = common::Raw::connect(c.addr()).await;
    let body = doc! {"insert": "items", "$db": "demo", "writeConcern": {"w": 0}, "ordered": false};
    let docs: Vec<_> = (0..50).map(|i| doc! {"_id": i}).collect();
    raw.send(&common::msg_with_sequence(
        MsgFlags::MORE_TO_COME,
        &body,
        "documents",
        &docs,
        1,
    ))
    .await;
    // The next reply on the connection answers the ping, not the insert.
    let id = raw.send_msg(&doc! {"ping": 1, "$db": "admin"}, 0).await;
    let (h, _, _) = raw.read_msg().await;
    assert_eq!(h.response_to, id);
    // The shards were written with w: 1, so the router knew every child batch landed.
    let mut n = 0;
    for _ in 0..50 {
        n = c.count_on_shards("demo", "items");
        if n == 50 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(n, 50);
    c.stop().await;
}

#[tokio::test]
async fn stale_routing_is_retried_then_gives_up_with_no_progress() {
    let c = TestCluster::start(2, &[("demo.items", doc! {"_id": "hashed"})]).await;
    let cl = common::driver(c.addr(), "").await;
    // A shard that believes in another collection version refuses every versioned write.
    let other = doc! {"e": bson::oid::ObjectId::new(), "t": bson::Timestamp { time: 1, increment: 1 }, "v": bson::Timestamp { time: 9, increment: 0 }};
    let direct = c.direct(0).await;
    direct
        .database("admin")
        .run_command(doc! {"sluiceSetShardVersion": "demo.items", "shardVersion": other})
        .await
        .unwrap();
    let before = c.shard_command_total("insert");
    let r = cl
        .database("demo")
        .run_command(doc! {"insert": "items", "documents": (0..20).map(|i| Bson::Document(doc! {"_id": i})).collect::<Vec<_>>(), "ordered": false})
        .await
        .unwrap();
    let errors = r.get_array("writeErrors").unwrap();
    assert!(!errors.is_empty());
    for e in errors {
        assert_eq!(
            e.as_document().unwrap().get_i32("code").unwrap(),
            82,
            "NoProgressMade"
        );
    }
    assert_eq!(r.get_i32("n").unwrap() as usize + errors.len(), 20);
    // The router refreshed and retried 5 times before giving up.
    assert!(c.shard_command_total("insert") - before >= 6);

    // Once the shard agrees with the metadata again, the same write goes through.
    let snap = c.cluster.routing.get("demo.items").unwrap().unwrap();
    direct
        .database("admin")
        .run_command(doc! {"sluiceSetShardVersion": "demo.items", "shardVersion": snap.shard_version("shard0")})
        .await
        .unwrap();
    let r = cl
        .database("demo")
        .run_command(doc! {"insert": "items", "documents": (100..120).map(|i| Bson::Document(doc! {"_id": i})).collect::<Vec<_>>()})
        .await
        .unwrap();
    assert_eq!(r.get_i32("n").unwrap(), 20);
    c.stop().await;
}
