//! The embedded shard driven in-process: retryable-write resends, shard versions, injected
//! latency, and the speed of a plain 1,000-document insert.

mod common;

use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use common::Raw;
use sluice::embedded::{EmbeddedShard, ShardOptions};

async fn shard() -> EmbeddedShard {
    EmbeddedShard::start("127.0.0.1:0", ShardOptions::for_tests())
        .await
        .expect("shard starts")
}

/// Sends an insert with its documents as a kind-1 sequence.
async fn insert_seq(raw: &mut Raw, body: Document, docs: &[Document]) -> Document {
    raw.send(&common::msg_with_sequence(0, &body, "documents", docs, 77))
        .await;
    raw.read_msg().await.2
}

#[tokio::test]
async fn retryable_resend_is_not_applied_twice() {
    let s = shard().await;
    let mut raw = Raw::connect(s.local_addr()).await;
    let lsid = doc! {"id": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] })};
    let body = doc! {"insert": "c", "$db": "d", "lsid": lsid.clone(), "txnNumber": 1i64, "stmtIds": [10, 11, 12]};
    let docs: Vec<Document> = (0..3).map(|i| doc! {"_id": i}).collect();
    let first = insert_seq(&mut raw, body.clone(), &docs).await;
    assert_eq!(first.get_i32("n").unwrap(), 3, "{first}");
    // The same (lsid, txnNumber, stmtIds) again: the recorded results come back, nothing is
    // inserted twice, and no duplicate-key error appears.
    let again = insert_seq(&mut raw, body.clone(), &docs).await;
    assert_eq!(again.get_i32("n").unwrap(), 3, "{again}");
    assert!(!again.contains_key("writeErrors"), "{again}");
    assert_eq!(again.get_array("retriedStmtIds").unwrap().len(), 3);
    assert_eq!(s.service().count_documents("d", "c"), 3);

    // Updates: an $inc resent with the same statement id is applied once.
    let upd = doc! {"update": "c", "$db": "d", "lsid": lsid.clone(), "txnNumber": 2i64, "stmtIds": [0],
    "updates": [{"q": {"_id": 1}, "u": {"$inc": {"n": 1}}}]};
    for _ in 0..3 {
        let r = raw.command(&upd).await;
        assert_eq!(r.get_i32("n").unwrap(), 1, "{r}");
    }
    let found = raw
        .command(&doc! {"find": "c", "filter": {"_id": 1}, "$db": "d"})
        .await;
    let d = found
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap()[0]
        .as_document()
        .unwrap()
        .clone();
    assert_eq!(d.get_i32("n").unwrap(), 1);

    // An older txnNumber on the same session is refused.
    let old = doc! {"insert": "c", "$db": "d", "lsid": lsid, "txnNumber": 1i64, "documents": [{"_id": 9}]};
    let r = raw.command(&old).await;
    assert_eq!(r.get_i32("code").unwrap(), 225, "{r}");
    s.shutdown().await;
}

#[tokio::test]
async fn stale_shard_version_is_refused() {
    let s = shard().await;
    let mut raw = Raw::connect(s.local_addr()).await;
    let epoch = bson::oid::ObjectId::new();
    let v2 = doc! {"e": epoch, "t": bson::Timestamp { time: 1, increment: 0 }, "v": bson::Timestamp { time: 2, increment: 0 }};
    let v1 = doc! {"e": epoch, "t": bson::Timestamp { time: 1, increment: 0 }, "v": bson::Timestamp { time: 1, increment: 0 }};
    let r = raw
        .command(&doc! {"sluiceSetShardVersion": "d.c", "shardVersion": v2.clone(), "$db": "admin"})
        .await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0);
    let r = raw
        .command(&doc! {"insert": "c", "documents": [{"_id": 1}], "shardVersion": v1.clone(), "$db": "d"})
        .await;
    let e = r.get_array("writeErrors").unwrap()[0]
        .as_document()
        .unwrap()
        .clone();
    assert_eq!(e.get_i32("code").unwrap(), 13388);
    assert_eq!(e.get_str("ns").unwrap(), "d.c");
    assert_eq!(e.get_document("vReceived").unwrap(), &v1);
    assert_eq!(e.get_document("vWanted").unwrap(), &v2);
    assert_eq!(e.get_str("shardId").unwrap(), "shard0");
    assert_eq!(s.service().count_documents("d", "c"), 0);
    // The current version and unversioned writes are accepted.
    let r = raw
        .command(&doc! {"insert": "c", "documents": [{"_id": 1}], "shardVersion": v2, "$db": "d"})
        .await;
    assert_eq!(r.get_i32("n").unwrap(), 1);
    let r = raw
        .command(&doc! {"insert": "c", "documents": [{"_id": 2}], "$db": "d"})
        .await;
    assert_eq!(r.get_i32("n").unwrap(), 1);
    s.shutdown().await;
}

#[tokio::test]
async fn injected_latency_and_concurrency_cap() {
    let s = EmbeddedShard::start(
        "127.0.0.1:0",
        ShardOptions {
            latency_per_command: Duration::from_millis(20),
            latency_per_document: Duration::from_millis(1),
            max_concurrency: Some(1),
            ..ShardOptions::default()
        },
    )
    .await
    .unwrap();
    let addr = s.local_addr();
    let docs: Vec<Document> = (0..30).map(|i| doc! {"_id": i}).collect();
    let start = Instant::now();
    let mut raw = Raw::connect(addr).await;
    insert_seq(&mut raw, doc! {"insert": "c", "$db": "d"}, &docs).await;
    assert!(
        start.elapsed() >= Duration::from_millis(50),
        "20 ms + 30 × 1 ms"
    );
    // Two pings are not data commands: no latency.
    let start = Instant::now();
    raw.command(&doc! {"ping": 1, "$db": "admin"}).await;
    assert!(start.elapsed() < Duration::from_millis(20));
    // With one slot, two concurrent finds run one after the other.
    let start = Instant::now();
    let a = tokio::spawn(async move {
        let mut r = Raw::connect(addr).await;
        r.command(&doc! {"find": "c", "$db": "d"}).await
    });
    let b = tokio::spawn(async move {
        let mut r = Raw::connect(addr).await;
        r.command(&doc! {"find": "c", "$db": "d"}).await
    });
    a.await.unwrap();
    b.await.unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(42),
        "two 21 ms finds serialised"
    );
    s.shutdown().await;
}

#[tokio::test]
async fn stock_driver_against_the_shard() {
    let s = shard().await;
    let client = mongodb::Client::with_uri_str(format!(
        "mongodb://{}/?directConnection=true",
        s.local_addr()
    ))
    .await
    .unwrap();
    let coll = client.database("d").collection::<Document>("c");
    let docs: Vec<Document> = (0..1000)
        .map(|i| doc! {"_id": i, "v": i % 7, "s": "x"})
        .collect();
    let start = Instant::now();
    coll.insert_many(docs).await.unwrap();
    let took = start.elapsed();
    eprintln!("1,000-document insert_many against the embedded shard took {took:?}");
    assert_eq!(coll.count_documents(doc! {"v": 3}).await.unwrap(), 143);
    let mut cursor = coll
        .find(doc! {})
        .sort(doc! {"_id": -1})
        .batch_size(100)
        .await
        .unwrap();
    let mut n = 0;
    while cursor.advance().await.unwrap() {
        n += 1;
    }
    assert_eq!(n, 1000);
    s.shutdown().await;
}

#[tokio::test]
async fn documents_over_16_mib_are_rejected() {
    let s = shard().await;
    let mut raw = Raw::connect(s.local_addr()).await;
    let big = doc! {"_id": 1, "blob": "x".repeat(16 * 1024 * 1024)};
    let small = doc! {"_id": 2};
    let r = insert_seq(
        &mut raw,
        doc! {"insert": "c", "$db": "d", "ordered": false},
        &[big, small],
    )
    .await;
    let errors = r.get_array("writeErrors").unwrap();
    assert_eq!(errors.len(), 1, "{r}");
    let e = errors[0].as_document().unwrap();
    assert_eq!(e.get_i32("index").unwrap(), 0);
    assert_eq!(e.get_i32("code").unwrap(), 10334);
    assert_eq!(r.get_i32("n").unwrap(), 1);
    assert_eq!(s.service().count_documents("d", "c"), 1);
    s.shutdown().await;
}

/// An abandoned cursor is dropped by the shard's idle monitor once its timeout passes, without
/// another cursor being opened (mongod's cursor monitor); a getMore on it then answers 43
/// CursorNotFound, and a cursor still being read is kept.
#[tokio::test]
async fn a_collectionless_aggregate_cursor_is_killed_by_its_namespace() {
    let s = EmbeddedShard::start("127.0.0.1:0", ShardOptions::for_tests())
        .await
        .expect("shard starts");
    let mut raw = Raw::connect(s.local_addr()).await;
    let r = raw
        .command(&doc! {"aggregate": 1, "pipeline": [{"$documents": [{"arr": (0..300).collect::<Vec<i32>>()}]}, {"$unwind": "$arr"}], "cursor": {"batchSize": 2}, "$db": "d"})
        .await;
    let cursor = r.get_document("cursor").unwrap();
    assert_eq!(cursor.get_str("ns").unwrap(), "d.$cmd.aggregate");
    let id = cursor.get_i64("id").unwrap();
    assert_ne!(id, 0);
    assert_eq!(s.service().open_cursors(), 1);
    // What a driver sends for a `db.aggregate` cursor it leaves unread.
    let r = raw
        .command(&doc! {"killCursors": "$cmd.aggregate", "cursors": [id], "$db": "d"})
        .await;
    assert_eq!(
        r.get_array("cursorsKilled").unwrap(),
        &vec![Bson::Int64(id)],
        "{r}"
    );
    assert_eq!(
        s.service().open_cursors(),
        0,
        "its buffered documents are released"
    );
    let r = raw
        .command(&doc! {"killCursors": "$x", "cursors": [id], "$db": "d"})
        .await;
    assert_eq!(r.get_i32("code").unwrap(), 73, "{r}");
}

#[tokio::test]
async fn idle_cursors_are_reaped_on_a_timer() {
    let options = ShardOptions {
        cursor_timeout: Duration::from_millis(400),
        ..ShardOptions::for_tests()
    };
    let s = EmbeddedShard::start("127.0.0.1:0", options)
        .await
        .expect("shard starts");
    let mut raw = Raw::connect(s.local_addr()).await;
    let docs: Vec<Document> = (0..100).map(|i| doc! {"_id": i}).collect();
    let r = insert_seq(&mut raw, doc! {"insert": "c", "$db": "d"}, &docs).await;
    assert_eq!(r.get_i32("n").unwrap(), 100, "{r}");
    let find = doc! {"find": "c", "batchSize": 1, "$db": "d"};
    let abandoned = raw.command(&find).await;
    let abandoned = abandoned
        .get_document("cursor")
        .unwrap()
        .get_i64("id")
        .unwrap();
    let kept = raw.command(&find).await;
    let kept = kept.get_document("cursor").unwrap().get_i64("id").unwrap();
    assert_ne!(abandoned, 0);
    assert_eq!(s.service().open_cursors(), 2);

    // Read `kept` every 100 ms until the monitor has run; `abandoned` is never read.
    let get_more = |id: i64| doc! {"getMore": id, "collection": "c", "batchSize": 1, "$db": "d"};
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let r = raw.command(&get_more(kept)).await;
        assert_eq!(
            r.get_f64("ok").unwrap_or(0.0),
            1.0,
            "kept cursor was dropped: {r}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        if s.service().open_cursors() == 1 {
            break;
        }
    }
    assert_eq!(
        s.service().open_cursors(),
        1,
        "the idle cursor is still open"
    );
    let r = raw.command(&get_more(abandoned)).await;
    assert_eq!(r.get_i32("code").unwrap(), 43, "{r}");
    let r = raw.command(&get_more(kept)).await;
    assert_eq!(r.get_f64("ok").unwrap_or(0.0), 1.0, "{r}");
    s.shutdown().await;
}

/// The shard answers `hello` as a replica-set primary through the same builder as the router:
/// the fields both report have the same values and types (`connectionId` an Int32, the wire
/// versions and limits alike), and only the role's own fields differ.
#[tokio::test]
async fn hello_shares_the_routers_fields() {
    let s = shard().await;
    let router = common::start_router().await;
    let mut to_shard = Raw::connect(s.local_addr()).await;
    let mut to_router = Raw::connect(router.local_addr()).await;
    let ask = doc! {"hello": 1, "helloOk": true, "$db": "admin"};
    let from_shard = to_shard.command(&ask).await;
    let from_router = to_router.command(&ask).await;
    for field in [
        "isWritablePrimary",
        "helloOk",
        "maxBsonObjectSize",
        "maxMessageSizeBytes",
        "maxWriteBatchSize",
        "logicalSessionTimeoutMinutes",
        "minWireVersion",
        "maxWireVersion",
    ] {
        assert_eq!(
            from_shard.get(field),
            from_router.get(field),
            "{field}: shard {from_shard} router {from_router}"
        );
    }
    for reply in [&from_shard, &from_router] {
        assert!(
            matches!(reply.get("connectionId"), Some(Bson::Int32(_))),
            "{reply}"
        );
    }
    assert_eq!(from_router.get_str("msg").unwrap(), "isdbgrid");
    assert!(!from_shard.contains_key("msg"), "{from_shard}");
    let me = from_shard.get_str("me").unwrap();
    assert_eq!(from_shard.get_str("primary").unwrap(), me);
    assert_eq!(
        from_shard.get_str("setName").unwrap(),
        ShardOptions::for_tests().set_name
    );
    router.shutdown().await;
    s.shutdown().await;
}

/// mongod's `onPrimaryTransactionalWrite` fail point, as the drivers' retryable-writes tests
/// set it: a statement failed before commit and the connection closed is retried by the driver
/// and applied once; failing every attempt leaves nothing; with the connection kept open and
/// the first statement skipped, the second statement's failure is its write error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_transactional_write_fail_point_acts_per_statement() {
    let s = shard().await;
    let cl = common::direct(s.local_addr()).await;
    let c = cl.database("fp").collection::<Document>("c");
    let admin = cl.database("admin");
    let set = |mode: Document, data: Document| {
        let admin = admin.clone();
        async move {
            admin
                .run_command(doc! {"configureFailPoint": "onPrimaryTransactionalWrite", "mode": mode, "data": data})
                .await
                .unwrap();
        }
    };
    set(doc! {"times": 1}, doc! {"failBeforeCommitExceptionCode": 1}).await;
    c.insert_one(doc! {"_id": 1}).await.expect("retried once");
    assert_eq!(c.count_documents(doc! {"_id": 1}).await.unwrap(), 1);

    // Committed, then the connection closed: the retry finds it applied.
    set(doc! {"times": 1}, doc! {}).await;
    c.update_one(doc! {"_id": 1}, doc! {"$inc": {"n": 1}})
        .await
        .expect("retried once");
    let d = c.find_one(doc! {"_id": 1}).await.unwrap().unwrap();
    assert_eq!(d.get_i32("n").ok(), Some(1), "applied exactly once: {d}");

    set(doc! {"times": 2}, doc! {"failBeforeCommitExceptionCode": 1}).await;
    assert!(
        c.insert_one(doc! {"_id": 2}).await.is_err(),
        "both attempts fail"
    );
    assert_eq!(c.count_documents(doc! {"_id": 2}).await.unwrap(), 0);

    set(
        doc! {"skip": 1},
        doc! {"closeConnection": false, "failBeforeCommitExceptionCode": 1},
    )
    .await;
    let e = c
        .insert_many(vec![doc! {"_id": 3}, doc! {"_id": 4}])
        .await
        .unwrap_err();
    let mongodb::error::ErrorKind::InsertMany(ref f) = *e.kind else {
        panic!("a bulk write error: {e}");
    };
    let errors = f.write_errors.as_ref().expect("write errors");
    assert_eq!((errors[0].index, errors[0].code), (1, 1), "{e}");
    set(doc! {"times": 0}, doc! {}).await;
    assert_eq!(
        c.count_documents(doc! {"_id": {"$in": [3, 4]}})
            .await
            .unwrap(),
        1
    );
    s.shutdown().await;
}
