//! Write coalescing through the router: concurrent inserts without sessions share child
//! batches, each client still gets exactly its own reply, and retryable writes are never
//! merged.

mod common;

use bson::{doc, Document};
use common::{Raw, TestCluster};
use sluice::config::{BatchingConfig, Config};

async fn cluster() -> TestCluster {
    let config = Config {
        batching: BatchingConfig {
            max_wait_us: 50_000,
            ..BatchingConfig::default()
        },
        ..Config::default()
    };
    // One shard, so every insert is a candidate for the same child batch.
    TestCluster::start_with(1, &[("demo.items", doc! {"_id": "hashed"})], config).await
}

async fn concurrent_inserts(c: &TestCluster, bodies: Vec<Document>) -> Vec<Document> {
    let addr = c.addr();
    let tasks: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            tokio::spawn(async move {
                let mut raw = Raw::connect(addr).await;
                raw.command(&body).await
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test]
async fn inserts_without_sessions_share_child_batches() {
    let c = cluster().await;
    // A document that already exists: one client's insert will fail, alone.
    let mut seed = Raw::connect(c.addr()).await;
    seed.command(&doc! {"insert": "items", "documents": [{"_id": 7}], "$db": "demo"})
        .await;
    let before = c.shard_command_total("insert");
    let bodies: Vec<Document> = (0..20)
        .map(|i| doc! {"insert": "items", "documents": [{"_id": i}, {"_id": 100 + i}], "ordered": false, "$db": "demo"})
        .collect();
    let replies = concurrent_inserts(&c, bodies).await;
    let batches = c.shard_command_total("insert") - before;
    assert!(
        batches < 20,
        "20 requests reached the shard in {batches} child batches"
    );
    assert!(c.sharded.coalescer().unwrap().merged_statements() > 0);
    for (i, r) in replies.iter().enumerate() {
        if i == 7 {
            assert_eq!(r.get_i32("n").unwrap(), 1, "{r}");
            let e = r.get_array("writeErrors").unwrap();
            assert_eq!(e.len(), 1);
            let e = e[0].as_document().unwrap();
            assert_eq!(
                e.get_i32("index").unwrap(),
                0,
                "the index is the client's own"
            );
            assert_eq!(e.get_i32("code").unwrap(), 11000);
        } else {
            assert_eq!(r.get_i32("n").unwrap(), 2, "{i}: {r}");
            assert!(!r.contains_key("writeErrors"), "{i}: {r}");
        }
    }
    assert_eq!(c.count_on_shards("demo", "items"), 40);
    c.stop().await;
}

#[tokio::test]
async fn retryable_writes_are_never_merged() {
    let c = cluster().await;
    let before = c.shard_command_total("insert");
    let bodies: Vec<Document> = (0..10)
        .map(|i| {
            doc! {
                "insert": "items",
                "documents": [{"_id": i}],
                "lsid": {"id": bson::Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![i as u8; 16] })},
                "txnNumber": 1i64,
                "$db": "demo",
            }
        })
        .collect();
    let replies = concurrent_inserts(&c, bodies).await;
    assert!(replies.iter().all(|r| r.get_i32("n").unwrap() == 1));
    assert_eq!(
        c.shard_command_total("insert") - before,
        10,
        "one child batch per request"
    );
    assert_eq!(c.sharded.coalescer().unwrap().merged_statements(), 0);
    c.stop().await;
}
