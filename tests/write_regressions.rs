//! One named test per write-path defect the differential test (`write_differential.rs`) found,
//! each the smallest bulk that showed it, run through the router over 2, 3 and 5 embedded
//! shards under every `ordered_rewrite` policy. Each asserts what a single mongod answers (the
//! oracle), or, where mongos 8.0 differs from a single mongod, what mongos answers; every
//! document is checked to sit on the shard that owns its key.
//!
//! `cid` is sharded on `{_id: "hashed"}`, `ck` on `{k: "hashed"}` with `_id` distinct from `k`.

mod common;

use bson::{doc, Bson, Document};
use common::{next_txn_number, TestCluster};
use sluice::config::Config;
use sluice::write::plan::Policy;

const DB: &str = "r";

fn configs() -> Vec<(usize, Policy)> {
    let mut out = Vec::new();
    for shards in [2, 3, 5] {
        for policy in [Policy::RetrySafe, Policy::Always, Policy::Off] {
            out.push((shards, policy));
        }
    }
    out
}

/// A router over `shards` embedded shards with `r.cid` and `r.ck` sharded, and a driver on it.
async fn start(shards: usize, policy: Policy) -> (TestCluster, mongodb::Client) {
    let config = Config {
        ordered_rewrite: policy,
        ..Config::default()
    };
    let c = TestCluster::start_with(
        shards,
        &[
            ("r.cid", doc! {"_id": "hashed"}),
            ("r.ck", doc! {"k": "hashed"}),
        ],
        config,
    )
    .await;
    let cl = common::driver(c.addr(), "").await;
    (c, cl)
}

/// Inserts `docs` through the router (unordered, each where its key belongs).
async fn seed(cl: &mongodb::Client, coll: &str, docs: Vec<Document>) {
    if docs.is_empty() {
        return;
    }
    let docs: Vec<Bson> = docs.into_iter().map(Bson::Document).collect();
    let r = run(
        cl,
        doc! {"insert": coll, "documents": docs.clone(), "ordered": false},
    )
    .await;
    assert_eq!(r.get_i32("n").unwrap() as usize, docs.len(), "seeded: {r}");
}

/// Runs a command on the test database without a retryable-write record; the reply of an
/// `ok: 1` command (write errors included).
async fn run(cl: &mongodb::Client, body: Document) -> Document {
    cl.database(DB)
        .run_command(body.clone())
        .await
        .unwrap_or_else(|e| panic!("{body}: {e}"))
}

/// Runs a command as a retryable write (a session and a `txnNumber`), as drivers send a bulk
/// of single-document writes.
async fn run_retryable(cl: &mongodb::Client, mut body: Document) -> Document {
    let mut session = cl.start_session().await.unwrap();
    body.insert("txnNumber", next_txn_number());
    cl.database(DB)
        .run_command(body.clone())
        .session(&mut session)
        .await
        .unwrap_or_else(|e| panic!("{body}: {e}"))
}

/// The code of a command that failed as a whole.
async fn refused(cl: &mongodb::Client, body: Document) -> i32 {
    match cl.database(DB).run_command(body.clone()).await {
        Ok(r) => panic!("{body} was accepted: {r}"),
        Err(e) => match *e.kind {
            mongodb::error::ErrorKind::Command(ref c) => c.code,
            ref other => panic!("{body}: {other:?}"),
        },
    }
}

/// `(index, code)` of each write error.
fn write_errors(r: &Document) -> Vec<(i32, i32)> {
    r.get_array("writeErrors")
        .map(|a| {
            a.iter()
                .filter_map(|e| e.as_document())
                .map(|e| (e.get_i32("index").unwrap(), e.get_i32("code").unwrap()))
                .collect()
        })
        .unwrap_or_default()
}

fn n(r: &Document) -> i32 {
    r.get_i32("n").unwrap()
}

fn n_modified(r: &Document) -> i32 {
    r.get_i32("nModified").unwrap()
}

/// The collection's documents, checked for placement, sorted by `_id`'s rendering.
fn contents(c: &TestCluster, coll: &str) -> Vec<Document> {
    let mut docs = c.placed_documents(DB, coll);
    docs.sort_by_key(|d| format!("{:?}", d.get("_id")));
    docs
}

fn by_id(docs: &[Document], id: i32) -> Option<&Document> {
    docs.iter().find(|d| d.get_i32("_id").ok() == Some(id))
}

/// Row 1: an unordered multi-update failing on one shard must report its error (it was
/// reported as a success when another statement shared the child batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row1_a_failing_multi_update_reports_its_error() {
    for (shards, policy) in configs() {
        let (c, cl) = start(shards, policy).await;
        seed(
            &cl,
            "cid",
            vec![
                doc! {"_id": 3, "tag": "t", "n": "str"},
                doc! {"_id": 0, "tag": "x"},
            ],
        )
        .await;
        let r = run(
            &cl,
            doc! {"update": "cid", "ordered": false, "updates": [
                {"q": {"tag": "t"}, "u": {"$inc": {"n": 1}}, "multi": true},
                {"q": {"_id": 0}, "u": {"$set": {"w": 1}}},
            ]},
        )
        .await;
        let at = format!("{shards} shards, {policy:?}: {r}");
        assert_eq!(write_errors(&r), vec![(0, 14)], "{at}");
        assert_eq!((n(&r), n_modified(&r)), (1, 1), "{at}");
        let docs = contents(&c, "cid");
        assert_eq!(by_id(&docs, 0).unwrap().get_i32("w").ok(), Some(1), "{at}");
        assert_eq!(
            by_id(&docs, 3).unwrap().get_str("n").ok(),
            Some("str"),
            "{at}"
        );
        c.stop().await;
    }
}

/// Row 2: a shard whose child batch holds only a broadcast statement keeps its counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row2_a_broadcast_alone_in_its_child_batch_is_counted() {
    for (shards, policy) in configs() {
        let (c, cl) = start(shards, policy).await;
        seed(
            &cl,
            "cid",
            vec![
                doc! {"_id": 0, "tag": "t"},
                doc! {"_id": 1, "tag": "t"},
                doc! {"_id": 3, "tag": "x"},
            ],
        )
        .await;
        let r = run(
            &cl,
            doc! {"delete": "cid", "ordered": false, "deletes": [
                {"q": {"_id": 3}, "limit": 1},
                {"q": {"tag": "t"}, "limit": 0},
            ]},
        )
        .await;
        let at = format!("{shards} shards, {policy:?}: {r}");
        assert!(write_errors(&r).is_empty(), "{at}");
        assert_eq!(n(&r), 3, "{at}");
        assert!(contents(&c, "cid").is_empty(), "{at}");
        c.stop().await;
    }
}

/// Row 3: a single-document write whose filter spans several shards changes one document
/// (mongos 8.0's write without shard key), on `_id` and on another shard key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row3_a_single_write_over_several_shards_touches_one_document() {
    let ids: Vec<i32> = (0..10).collect();
    for (shards, policy) in configs() {
        let (c, cl) = start(shards, policy).await;
        for (coll, key) in [("cid", "_id"), ("ck", "k")] {
            let docs: Vec<Document> = ids.iter().map(|i| doc! {"_id": *i, "k": *i}).collect();
            seed(&cl, coll, docs).await;
            let at = format!("{shards} shards, {policy:?}, {coll}");
            for retryable in [false, true] {
                let body = doc! {"update": coll, "updates": [
                    {"q": {key: {"$in": ids.clone()}}, "u": {"$inc": {"w": 1}}},
                ]};
                let r = if retryable {
                    run_retryable(&cl, body).await
                } else {
                    run(&cl, body).await
                };
                assert_eq!((n(&r), n_modified(&r)), (1, 1), "{at}: {r}");
            }
            let touched: i32 = contents(&c, coll)
                .iter()
                .map(|d| d.get_i32("w").unwrap_or(0))
                .sum();
            assert_eq!(touched, 2, "{at}: two updates, one document each");
            let r = run(
                &cl,
                doc! {"delete": coll, "deletes": [{"q": {key: {"$in": ids.clone()}}, "limit": 1}]},
            )
            .await;
            assert_eq!(n(&r), 1, "{at}: {r}");
            assert_eq!(contents(&c, coll).len(), 9, "{at}");
        }
        c.stop().await;
    }
}

/// Row 4: an upsert whose filter spans several shards (or none: an empty `$in`) inserts one
/// document, where its generated `_id` belongs, and matches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row4_an_upsert_over_several_shards_inserts_one_document_where_it_belongs() {
    for (shards, policy) in configs() {
        let (c, cl) = start(shards, policy).await;
        let at = format!("{shards} shards, {policy:?}");
        for (round, ids) in [vec![1001, 1002, 1003, 1004], vec![]]
            .into_iter()
            .enumerate()
        {
            let r = run_retryable(
                &cl,
                doc! {"update": "cid", "updates": [
                    {"q": {"_id": {"$in": ids.clone()}}, "u": {"$set": {"w": 1}}, "upsert": true},
                ]},
            )
            .await;
            assert!(write_errors(&r).is_empty(), "{at}: {r}");
            assert_eq!(n(&r), 1, "{at}: upserted, not matched: {r}");
            assert_eq!(n_modified(&r), 0, "{at}: {r}");
            let up = r.get_array("upserted").unwrap();
            assert_eq!(up.len(), 1, "{at}: {r}");
            let id = up[0].as_document().unwrap().get("_id").unwrap().clone();
            assert!(matches!(id, Bson::ObjectId(_)), "{at}: a generated _id");
            let docs = contents(&c, "cid");
            assert_eq!(docs.len(), round + 1, "{at}: one document per upsert");
            assert!(docs.iter().any(|d| d.get("_id") == Some(&id)), "{at}");
        }
        c.stop().await;
    }
}

/// Row 5: `$rename` onto the shard key changes the key: the document ends where its new key
/// belongs, or (when that is another shard) the update is refused with 66 and nothing
/// changes; it never stays on a shard that does not own it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row5_rename_onto_the_shard_key_is_a_key_change() {
    for (shards, policy) in configs() {
        let (c, cl) = start(shards, policy).await;
        let at = format!("{shards} shards, {policy:?}");
        let home = c.owner("r.ck", &doc! {"k": 1});
        let near = (2..1000)
            .find(|v| c.owner("r.ck", &doc! {"k": *v}) == home)
            .unwrap();
        let away = (2..1000)
            .find(|v| c.owner("r.ck", &doc! {"k": *v}) != home)
            .unwrap();
        // The issue's literal case (`a: 2`), then one value of each kind.
        for (id, a) in [(1, 2), (2, near), (3, away)] {
            seed(&cl, "ck", vec![doc! {"_id": id, "k": 1, "a": a}]).await;
            let r = run(
                &cl,
                doc! {"update": "ck", "updates": [
                    {"q": {"k": 1, "_id": id}, "u": {"$rename": {"a": "k"}}},
                ]},
            )
            .await;
            let docs = contents(&c, "ck");
            let d = by_id(&docs, id).unwrap();
            if c.owner("r.ck", &doc! {"k": a}) == home {
                assert!(write_errors(&r).is_empty(), "{at}: {r}");
                assert_eq!((n(&r), n_modified(&r)), (1, 1), "{at}: {r}");
                assert_eq!(d, &doc! {"_id": id, "k": a}, "{at}");
                let found = run(&cl, doc! {"find": "ck", "filter": {"k": a, "_id": id}}).await;
                let batch = found
                    .get_document("cursor")
                    .unwrap()
                    .get_array("firstBatch")
                    .unwrap();
                assert_eq!(batch.len(), 1, "{at}: found by its new key");
            } else {
                assert_eq!(write_errors(&r), vec![(0, 66)], "{at}: {r}");
                assert_eq!(d, &doc! {"_id": id, "k": 1, "a": a}, "{at}: unchanged");
            }
        }
        c.stop().await;
    }
}

/// Row 6: an ordered bulk of updates without a retryable-write record, failing in the middle,
/// counts only the statements before the error (a child batch straddling the error must not
/// be counted whole); with a record it counts the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row6_ordered_updates_without_a_record_count_only_up_to_the_error() {
    for (shards, policy) in configs() {
        for retryable in [false, true] {
            let (c, cl) = start(shards, policy).await;
            let at = format!("{shards} shards, {policy:?}, retryable {retryable}");
            seed(
                &cl,
                "cid",
                vec![doc! {"_id": 0}, doc! {"_id": 1}, doc! {"_id": 3, "arr": 7}],
            )
            .await;
            let body = doc! {"update": "cid", "ordered": true, "updates": [
                {"q": {"_id": 0}, "u": {"$set": {"v": 1}}},
                {"q": {"_id": 3}, "u": {"$addToSet": {"arr": 1}}},
                {"q": {"_id": 1}, "u": {"$set": {"v": 1}}},
            ]};
            let r = if retryable {
                run_retryable(&cl, body).await
            } else {
                run(&cl, body).await
            };
            assert_eq!(write_errors(&r), vec![(1, 2)], "{at}: {r}");
            assert_eq!((n(&r), n_modified(&r)), (1, 1), "{at}: {r}");
            let docs = contents(&c, "cid");
            assert_eq!(by_id(&docs, 0).unwrap().get_i32("v").ok(), Some(1), "{at}");
            if policy == Policy::Off {
                assert!(!by_id(&docs, 1).unwrap().contains_key("v"), "{at}: {r}");
            }
            c.stop().await;
        }
    }
}

/// A statement that is not well formed refuses the whole command before anything runs, as
/// mongod and mongos do (14 for a non-document `q`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_statement_refuses_the_whole_command() {
    for (shards, policy) in configs() {
        let (c, cl) = start(shards, policy).await;
        let at = format!("{shards} shards, {policy:?}");
        seed(&cl, "cid", vec![doc! {"_id": 0}]).await;
        for ordered in [true, false] {
            let code = refused(
                &cl,
                doc! {"update": "cid", "ordered": ordered, "updates": [
                    {"q": {"_id": 0}, "u": {"$set": {"v": 1}}},
                    {"q": 5, "u": {"$set": {"v": 1}}},
                ]},
            )
            .await;
            assert_eq!(code, 14, "{at}");
            let code = refused(
                &cl,
                doc! {"delete": "cid", "ordered": ordered, "deletes": [
                    {"q": {"_id": 0}, "limit": 1},
                    {"q": "x", "limit": 1},
                ]},
            )
            .await;
            assert_eq!(code, 14, "{at}");
        }
        assert_eq!(
            contents(&c, "cid"),
            vec![doc! {"_id": 0}],
            "{at}: nothing applied"
        );
        c.stop().await;
    }
}

/// `$set` of the shard key (or `_id`) to the value it already has is no key change: accepted,
/// as mongos 4.2+ accepts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setting_the_shard_key_to_its_own_value_is_accepted() {
    for (shards, policy) in configs() {
        let (c, cl) = start(shards, policy).await;
        let at = format!("{shards} shards, {policy:?}");
        seed(&cl, "cid", vec![doc! {"_id": 0}]).await;
        seed(&cl, "ck", vec![doc! {"_id": 1, "k": 1}]).await;
        let r = run(
            &cl,
            doc! {"update": "cid", "updates": [{"q": {"_id": 0}, "u": {"$set": {"_id": 0, "v": 1}}}]},
        )
        .await;
        assert!(write_errors(&r).is_empty(), "{at}: {r}");
        assert_eq!((n(&r), n_modified(&r)), (1, 1), "{at}: {r}");
        for q in [doc! {"k": 1, "_id": 1}, doc! {"k": 1}, doc! {"_id": 1}] {
            let r = run(
                &cl,
                doc! {"update": "ck", "updates": [{"q": q.clone(), "u": {"$set": {"k": 1}}}]},
            )
            .await;
            assert!(write_errors(&r).is_empty(), "{at}, {q}: {r}");
            assert_eq!((n(&r), n_modified(&r)), (1, 0), "{at}, {q}: {r}");
        }
        assert_eq!(contents(&c, "ck"), vec![doc! {"_id": 1, "k": 1}], "{at}");
        c.stop().await;
    }
}

/// A replacement carrying another `_id` that matches nothing changes nothing: `n: 0`, no error
/// (the shard, not a router pre-check, decides about documents that exist).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_with_another_id_that_matches_nothing_is_a_no_op() {
    for (shards, policy) in configs() {
        let (c, cl) = start(shards, policy).await;
        let at = format!("{shards} shards, {policy:?}");
        let r = run(
            &cl,
            doc! {"update": "cid", "updates": [{"q": {"_id": 5}, "u": {"_id": 6, "x": 1}}]},
        )
        .await;
        assert!(write_errors(&r).is_empty(), "{at}: {r}");
        assert_eq!((n(&r), n_modified(&r)), (0, 0), "{at}: {r}");
        let r = run(
            &cl,
            doc! {"update": "ck", "updates": [{"q": {"k": 5}, "u": {"k": 6, "x": 1}}]},
        )
        .await;
        assert!(write_errors(&r).is_empty(), "{at}: {r}");
        assert_eq!((n(&r), n_modified(&r)), (0, 0), "{at}: {r}");
        assert!(contents(&c, "cid").is_empty() && contents(&c, "ck").is_empty());
        c.stop().await;
    }
}

/// A multi-document update that fails on one shard reports the error and, as mongos does, the
/// counts of the shards where it succeeded (their documents stay updated).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_update_failing_on_one_shard_sums_the_others() {
    for (shards, policy) in configs() {
        let (c, cl) = start(shards, policy).await;
        let at = format!("{shards} shards, {policy:?}");
        let bad = 0;
        let bad_shard = c.owner("r.cid", &doc! {"_id": bad});
        let good: Vec<i32> = (1..1000)
            .filter(|i| c.owner("r.cid", &doc! {"_id": *i}) != bad_shard)
            .take(4)
            .collect();
        let mut docs = vec![doc! {"_id": bad, "tag": "t", "n": "str"}];
        docs.extend(good.iter().map(|i| doc! {"_id": *i, "tag": "t", "n": 1}));
        seed(&cl, "cid", docs).await;
        for ordered in [true, false] {
            let r = run(
                &cl,
                doc! {"update": "cid", "ordered": ordered, "updates": [
                    {"q": {"tag": "t"}, "u": {"$inc": {"n": 1}}, "multi": true},
                ]},
            )
            .await;
            assert_eq!(write_errors(&r), vec![(0, 14)], "{at}: {r}");
            assert_eq!((n(&r), n_modified(&r)), (4, 4), "{at}: {r}");
        }
        let docs = contents(&c, "cid");
        for i in &good {
            assert_eq!(by_id(&docs, *i).unwrap().get_i32("n").ok(), Some(3), "{at}");
        }
        c.stop().await;
    }
}

/// The ordered contract for inserts: an ordered insert failing at k leaves exactly the
/// documents before k, under every policy (inserts other shards applied after k are removed
/// again), so an application that fixes document k and resends k… succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_insert_error_leaves_nothing_after_it_and_the_resend_succeeds() {
    for (shards, policy) in configs() {
        let (c, cl) = start(shards, policy).await;
        let at = format!("{shards} shards, {policy:?}");
        let k = 7;
        seed(&cl, "cid", vec![doc! {"_id": k, "seeded": true}]).await;
        let docs: Vec<Bson> = (0..40).map(|i| Bson::Document(doc! {"_id": i})).collect();
        let before = c.plans();
        let mut session = cl.start_session().await.unwrap();
        let txn = next_txn_number();
        let r = cl
            .database(DB)
            .run_command(doc! {"insert": "cid", "ordered": true, "documents": docs.clone(), "txnNumber": txn})
            .session(&mut session)
            .await
            .unwrap();
        let rewritten = c.plans().2 > before.2;
        assert_eq!(rewritten, policy != Policy::Off, "{at}: the plan");
        assert_eq!(write_errors(&r), vec![(k, 11000)], "{at}: {r}");
        assert_eq!(n(&r), k, "{at}: {r}");
        let e = r.get_array("writeErrors").unwrap()[0]
            .as_document()
            .unwrap();
        assert!(!e.contains_key("errInfo"), "{at}: everything undone: {r}");
        let ids = || -> Vec<i32> {
            contents(&c, "cid")
                .iter()
                .map(|d| d.get_i32("_id").unwrap())
                .collect()
        };
        let mut expected: Vec<i32> = (0..=k).collect();
        expected.sort_by_key(|i| format!("{:?}", Bson::Int32(*i)));
        assert_eq!(
            ids(),
            expected,
            "{at}: the documents before k, and the seed"
        );
        // A driver resending the very same command (same session and transaction number, as
        // after a lost reply) gets the same answer and leaves the same documents.
        let same = cl
            .database(DB)
            .run_command(doc! {"insert": "cid", "ordered": true, "documents": docs.clone(), "txnNumber": txn})
            .session(&mut session)
            .await
            .unwrap();
        assert_eq!(write_errors(&same), vec![(k, 11000)], "{at}: {same}");
        assert_eq!(n(&same), k, "{at}: {same}");
        assert_eq!(ids(), expected, "{at}: after the resend");
        // The application's recovery: fix document k, resend k… in order.
        let mut rest = vec![Bson::Document(doc! {"_id": 1000 + k})];
        rest.extend(docs[k as usize + 1..].iter().cloned());
        let r = run_retryable(
            &cl,
            doc! {"insert": "cid", "ordered": true, "documents": rest},
        )
        .await;
        assert!(write_errors(&r).is_empty(), "{at}: the resend: {r}");
        assert_eq!(n(&r), 40 - k, "{at}: {r}");
        assert_eq!(contents(&c, "cid").len(), 41, "{at}");
        let stats = &c.sharded.writes;
        let undone = stats
            .undone_after_error
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(undone > 0, rewritten, "{at}: {undone} undone");
        c.stop().await;
    }
}

/// An insert the router could not remove again (its shard refused the delete) is reported in
/// the first error's `errInfo.appliedAfterError` and stays; nothing else is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inserts_that_cannot_be_undone_are_reported() {
    let (c, cl) = start(2, Policy::RetrySafe).await;
    let ids: Vec<i32> = (0..20).collect();
    let shard_of = |i: i32| c.owner("r.cid", &doc! {"_id": i});
    // The failing statement k on one shard, later statements on the other.
    let k = ids[1..]
        .iter()
        .copied()
        .find(|i| shard_of(*i) == shard_of(0))
        .unwrap();
    let other = c
        .shards
        .iter()
        .find(|s| s.service().name() != shard_of(k))
        .unwrap();
    let late: Vec<i32> = ids
        .iter()
        .copied()
        .filter(|i| *i > k && shard_of(*i) == other.service().name())
        .collect();
    assert!(!late.is_empty());
    seed(&cl, "cid", vec![doc! {"_id": k}]).await;
    let direct = mongodb::Client::with_uri_str(format!(
        "mongodb://{}/?directConnection=true",
        other.local_addr()
    ))
    .await
    .unwrap();
    direct
        .database("admin")
        .run_command(
            doc! {"configureFailPoint": "failCommand", "mode": {"times": 1},
            "data": {"failCommands": ["delete"], "errorCode": 91}},
        )
        .await
        .unwrap();
    let docs: Vec<Bson> = ids
        .iter()
        .map(|i| Bson::Document(doc! {"_id": *i}))
        .collect();
    let r = run_retryable(
        &cl,
        doc! {"insert": "cid", "ordered": true, "documents": docs},
    )
    .await;
    assert_eq!(write_errors(&r), vec![(k, 11000)], "{r}");
    assert_eq!(n(&r), k, "{r}");
    let e = r.get_array("writeErrors").unwrap()[0]
        .as_document()
        .unwrap();
    let reported: Vec<i32> = e
        .get_document("errInfo")
        .and_then(|i| i.get_array("appliedAfterError"))
        .unwrap_or_else(|_| panic!("{r}"))
        .iter()
        .map(|v| v.as_i32().unwrap())
        .collect();
    assert_eq!(reported, late, "{r}");
    let present: Vec<i32> = contents(&c, "cid")
        .iter()
        .map(|d| d.get_i32("_id").unwrap())
        .collect();
    for i in &ids {
        let expected = *i <= k || late.contains(i);
        assert_eq!(present.contains(i), expected, "_id {i}: {present:?}");
    }
    let stats = &c.sharded.writes;
    assert_eq!(
        stats
            .applied_after_error
            .load(std::sync::atomic::Ordering::Relaxed),
        late.len() as u64
    );
    c.stop().await;
}

/// mongos's own difference from a single mongod on a collection sharded on another field:
/// `_id` is unique per shard only, so two documents with one `_id` can live on two shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_shard_id_uniqueness_on_a_non_id_shard_key() {
    let (c, cl) = start(2, Policy::RetrySafe).await;
    let home = c.owner("r.ck", &doc! {"k": 0});
    let away = (1..1000)
        .find(|v| c.owner("r.ck", &doc! {"k": *v}) != home)
        .unwrap();
    let r = run(
        &cl,
        doc! {"insert": "ck", "documents": [{"_id": 1, "k": 0}, {"_id": 1, "k": away}]},
    )
    .await;
    assert!(write_errors(&r).is_empty(), "{r}");
    assert_eq!(n(&r), 2);
    let same = run(
        &cl,
        doc! {"insert": "ck", "documents": [{"_id": 1, "k": 0}]},
    )
    .await;
    assert_eq!(write_errors(&same), vec![(0, 11000)], "{same}");
    assert_eq!(contents(&c, "ck").len(), 2);
    c.stop().await;
}
