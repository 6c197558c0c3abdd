//! Write coalescing through the router: concurrent inserts without a session, or with an `lsid`
//! alone, share child batches while a batch of theirs is on its way to the shard, each client
//! still gets exactly its own reply, retryable writes and transactions are never merged, and a
//! lone insert on an idle shard is sent at once.
//!
//! The tests are made deterministic by observables, not by timing: the coalescer waits 60 s for
//! companions, so a group is sent when it is full (`max_operations`), and a failpoint holds one
//! insert on the shard so that the group is busy when the next one arrives.

mod common;

use std::time::Duration;

use bson::spec::BinarySubtype;
use bson::{doc, Binary, Bson, Document};
use common::{Raw, TestCluster};
use sluice::backend::limiter::OpKind;
use sluice::config::{BatchingConfig, Config};
use tokio::task::JoinHandle;

/// One shard (every insert is a candidate for the same child batch), companions awaited for
/// 60 s, a group full at `max_operations` statements.
async fn cluster(max_operations: usize) -> TestCluster {
    let config = Config {
        batching: BatchingConfig {
            max_wait_us: 60_000_000,
            max_operations,
            ..BatchingConfig::default()
        },
        ..Config::default()
    };
    TestCluster::start_with(1, &[("demo.items", doc! {"_id": "hashed"})], config).await
}

fn lsid(b: u8) -> Document {
    doc! {"id": Bson::Binary(Binary { subtype: BinarySubtype::Uuid, bytes: vec![b; 16] })}
}

/// Polls `done` until it holds (20 s at most: a bound against hanging, not a measure).
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..4000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never happened: {what}");
}

fn send(c: &TestCluster, body: Document) -> JoinHandle<Document> {
    let addr = c.addr();
    tokio::spawn(async move {
        let mut raw = Raw::connect(addr).await;
        raw.command(&body).await
    })
}

/// Sends an insert of `demo.items` that the shard holds for two seconds, and returns once the
/// router has it in flight: until it is answered the group is busy, so the next insert waits
/// for companions.
async fn hold_the_group_busy(c: &TestCluster) -> JoinHandle<Document> {
    let mut direct = Raw::connect(c.shards[0].local_addr()).await;
    direct
        .command(&doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["insert"], "blockConnection": true, "blockTimeMS": 2000}, "$db": "admin"})
        .await;
    let held = send(
        c,
        doc! {"insert": "items", "documents": [{"_id": -1}], "$db": "demo"},
    );
    let shard = c.cluster.shards()[0].id.clone();
    until("the held insert is in flight", || {
        c.cluster
            .queue(&shard)
            .is_some_and(|q| q.in_flight(OpKind::Mutate) == 1)
    })
    .await;
    held
}

/// Sends `first` and, once it waits for companions, the `rest` all at once; the replies in
/// order.
async fn first_waits_then_rest(
    c: &TestCluster,
    first: Document,
    rest: Vec<Document>,
) -> Vec<Document> {
    let coalescer = c.sharded.coalescer().expect("coalescing is on");
    let waits = coalescer.waits();
    let mut tasks = vec![send(c, first)];
    until("the first insert waits for companions", || {
        coalescer.waits() == waits + 1
    })
    .await;
    tasks.extend(rest.into_iter().map(|b| send(c, b)));
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test]
async fn inserts_without_sessions_share_child_batches() {
    // 20 requests of 2 statements: the group is full with all of them.
    let c = cluster(40).await;
    // A document that already exists: one client's insert will fail, alone.
    let mut seed = Raw::connect(c.addr()).await;
    seed.command(&doc! {"insert": "items", "documents": [{"_id": 7}], "$db": "demo"})
        .await;
    let before = c.shard_command_total("insert");
    let held = hold_the_group_busy(&c).await;
    let mut bodies: Vec<Document> = (0..20)
        .map(|i| doc! {"insert": "items", "documents": [{"_id": i}, {"_id": 100 + i}], "ordered": false, "$db": "demo"})
        .collect();
    let first = bodies.remove(0);
    let replies = first_waits_then_rest(&c, first, bodies).await;
    assert_eq!(held.await.unwrap().get_i32("n").unwrap(), 1);
    assert_eq!(
        c.shard_command_total("insert") - before,
        2,
        "the held insert, then the 20 requests in one child batch"
    );
    assert_eq!(c.sharded.coalescer().unwrap().merged_statements(), 38);
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
    assert_eq!(c.count_on_shards("demo", "items"), 41);
    c.stop().await;
}

/// What the drivers send with `retryWrites=false`: an `lsid` on every acknowledged write, no
/// `txnNumber`. Two such inserts with different sessions share one child batch.
#[tokio::test]
async fn inserts_with_distinct_sessions_share_one_child_batch() {
    let c = cluster(4).await;
    let mut seed = Raw::connect(c.addr()).await;
    seed.command(&doc! {"insert": "items", "documents": [{"_id": 7}], "$db": "demo"})
        .await;
    let before = c.shard_command_total("insert");
    let held = hold_the_group_busy(&c).await;
    // A's first statement meets the seeded document; B's second meets A's second.
    let a = doc! {"insert": "items", "documents": [{"_id": 7}, {"_id": 1}], "ordered": false, "lsid": lsid(0xa), "$db": "demo"};
    let b = doc! {"insert": "items", "documents": [{"_id": 2}, {"_id": 1}], "ordered": false, "lsid": lsid(0xb), "$db": "demo"};
    let replies = first_waits_then_rest(&c, a, vec![b]).await;
    held.await.unwrap();
    assert_eq!(
        c.shard_command_total("insert") - before,
        2,
        "the held insert, then A and B in one child batch"
    );
    assert_eq!(c.sharded.coalescer().unwrap().merged_statements(), 2);
    for (r, own_index) in replies.iter().zip([0, 1]) {
        assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
        assert_eq!(r.get_i32("n").unwrap(), 1, "{r}");
        let e = r.get_array("writeErrors").unwrap();
        assert_eq!(e.len(), 1, "{r}");
        let e = e[0].as_document().unwrap();
        assert_eq!(e.get_i32("index").unwrap(), own_index, "{r}");
        assert_eq!(e.get_i32("code").unwrap(), 11000, "{r}");
    }
    // The router recorded both clients' sessions, as for writes it does not merge.
    let listed = seed
        .command(&doc! {"aggregate": 1, "pipeline": [{"$listLocalSessions": {"allUsers": true}}], "cursor": {}, "$db": "admin"})
        .await;
    let ids: Vec<Bson> = listed
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap()
        .iter()
        .filter_map(|d| {
            d.as_document()?
                .get_document("_id")
                .ok()?
                .get("id")
                .cloned()
        })
        .collect();
    for s in [0xa, 0xb] {
        let id = lsid(s).get("id").cloned().unwrap();
        assert!(ids.contains(&id), "session {s:#x} is not listed: {listed}");
    }
    let mut on_shard: Vec<i32> = c
        .placed_documents("demo", "items")
        .iter()
        .filter_map(|d| d.get_i32("_id").ok())
        .collect();
    on_shard.sort_unstable();
    assert_eq!(on_shard, vec![-1, 1, 2, 7]);
    c.stop().await;
}

/// Sends every body at once; each is answered with `n: 1`.
async fn each_inserts_one(c: &TestCluster, bodies: Vec<Document>) {
    let tasks: Vec<_> = bodies.into_iter().map(|b| send(c, b)).collect();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.get_i32("n").unwrap(), 1, "{r}");
    }
}

/// Retryable writes (`lsid` + `txnNumber`) are never merged, even while the group is busy and
/// two of them would fill it.
#[tokio::test]
async fn retryable_writes_are_never_merged() {
    let c = cluster(2).await;
    let before = c.shard_command_total("insert");
    let held = hold_the_group_busy(&c).await;
    let bodies: Vec<Document> = (0..2)
        .map(|i| doc! {"insert": "items", "documents": [{"_id": i}], "lsid": lsid(i as u8), "txnNumber": 1i64, "$db": "demo"})
        .collect();
    each_inserts_one(&c, bodies).await;
    held.await.unwrap();
    assert_eq!(
        c.shard_command_total("insert") - before,
        3,
        "one child batch per request"
    );
    assert_eq!(c.sharded.coalescer().unwrap().merged_statements(), 0);
    c.stop().await;
}

/// Statements of transactions are never merged, even while the group is busy and two of them
/// would fill it.
#[tokio::test]
async fn transaction_statements_are_never_merged() {
    let c = cluster(2).await;
    let held = hold_the_group_busy(&c).await;
    let bodies: Vec<Document> = (0..2)
        .map(|i| doc! {"insert": "items", "documents": [{"_id": i}], "lsid": lsid(i as u8), "txnNumber": 1i64, "startTransaction": true, "autocommit": false, "$db": "demo"})
        .collect();
    each_inserts_one(&c, bodies).await;
    held.await.unwrap();
    let mut raw = Raw::connect(c.addr()).await;
    for i in 0..2u8 {
        let r = raw
            .command(&doc! {"commitTransaction": 1, "lsid": lsid(i), "txnNumber": 1i64, "autocommit": false, "$db": "admin"})
            .await;
        assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    }
    assert_eq!(c.count_on_shards("demo", "items"), 3);
    let coalescer = c.sharded.coalescer().unwrap();
    assert_eq!(coalescer.merged_statements(), 0);
    assert_eq!(coalescer.waits(), 0, "no transaction statement waited");
    c.stop().await;
}

/// On an idle shard an insert is sent at once: with companions awaited for 60 s, single
/// inserts from the stock driver (`retryWrites=false`: an `lsid`, no `txnNumber`) one after
/// another complete, and none of them waited.
#[tokio::test]
async fn a_lone_insert_on_an_idle_shard_does_not_wait() {
    let c = cluster(128).await;
    let client = common::driver(c.addr(), "&retryWrites=false").await;
    let items = client.database("demo").collection::<Document>("items");
    let before = c.shard_command_total("insert");
    let inserts = async {
        for i in 0..5 {
            items.insert_one(doc! {"_id": i}).await.unwrap();
        }
    };
    // A bound against hanging (well under the 60 s a waiting insert would take), not a measure.
    tokio::time::timeout(Duration::from_secs(30), inserts)
        .await
        .expect("the inserts were sent without waiting for companions");
    assert_eq!(c.shard_command_total("insert") - before, 5);
    assert_eq!(c.sharded.coalescer().unwrap().waits(), 0);
    client.shutdown().await;
    c.stop().await;
}
