//! Multi-document transactions through the stock Rust driver (`start_session`,
//! `start_transaction`, commit, abort, `and_run2`), against one embedded shard and through the
//! router: isolation, snapshot reads, abort, write conflicts (112 with
//! `TransientTransactionError`), commit retries, and the session errors mongod gives
//! (NoSuchTransaction, TransactionTooOld, TransactionCommitted, a command refused inside a
//! transaction).

mod common;

use bson::{doc, Bson, Document};
use common::{Raw, TestCluster};
use mongodb::{Client, Collection};
use sluice::embedded::{EmbeddedShard, ShardOptions};

const LABEL: &str = "TransientTransactionError";

async fn shard() -> EmbeddedShard {
    EmbeddedShard::start("127.0.0.1:0", ShardOptions::for_tests())
        .await
        .expect("shard starts")
}

/// The two deployments every scenario runs on: one shard directly, and a router in front of
/// two shards (the scenarios' collection is unsharded: it lives on its database's primary).
enum Target {
    Shard(EmbeddedShard),
    Router(TestCluster),
}

impl Target {
    async fn all() -> Vec<(Target, Client)> {
        let s = shard().await;
        let direct = common::direct(s.local_addr()).await;
        let c = TestCluster::start(2, &[("txn.sharded", doc! {"_id": "hashed"})]).await;
        let routed = common::driver(c.addr(), "").await;
        vec![(Target::Shard(s), direct), (Target::Router(c), routed)]
    }

    fn name(&self) -> &'static str {
        match self {
            Target::Shard(_) => "shard",
            Target::Router(_) => "router",
        }
    }

    async fn stop(self) {
        match self {
            Target::Shard(s) => s.shutdown().await,
            Target::Router(c) => c.stop().await,
        }
    }
}

fn coll(cl: &Client, name: &str) -> Collection<Document> {
    cl.database("txn").collection(name)
}

async fn ids(c: &Collection<Document>) -> Vec<Bson> {
    let docs = common::all(c.find(doc! {}).sort(doc! {"_id": 1}).await.unwrap()).await;
    docs.iter()
        .map(|d| d.get("_id").cloned().unwrap())
        .collect()
}

/// Every document of `c` as transaction `s` sees it.
async fn find_in(c: &Collection<Document>, s: &mut mongodb::ClientSession) -> Vec<Document> {
    let mut cursor = c.find(doc! {}).session(&mut *s).await.unwrap();
    let mut out = Vec::new();
    while cursor.advance(&mut *s).await.unwrap() {
        out.push(cursor.deserialize_current().unwrap());
    }
    out
}

fn code(e: &mongodb::error::Error) -> i32 {
    common::command_code(e)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncommitted_writes_are_invisible_until_commit() {
    for (target, cl) in Target::all().await {
        let c = coll(&cl, "isolation");
        c.insert_one(doc! {"_id": 0}).await.unwrap();
        let mut s = cl.start_session().await.unwrap();
        s.start_transaction().await.unwrap();
        c.insert_one(doc! {"_id": 1}).session(&mut s).await.unwrap();
        c.update_one(doc! {"_id": 0}, doc! {"$set": {"x": 1}})
            .session(&mut s)
            .await
            .unwrap();
        // Inside: its own writes. Outside: nothing of them.
        let inside = find_in(&c, &mut s).await;
        assert_eq!(inside.len(), 2, "{}: {inside:?}", target.name());
        assert_eq!(ids(&c).await, vec![Bson::Int32(0)], "{}", target.name());
        let outside = c.find_one(doc! {"_id": 0}).await.unwrap().unwrap();
        assert!(!outside.contains_key("x"), "{}: {outside}", target.name());
        s.commit_transaction().await.unwrap();
        assert_eq!(ids(&c).await, vec![Bson::Int32(0), Bson::Int32(1)]);
        let after = c.find_one(doc! {"_id": 0}).await.unwrap().unwrap();
        assert_eq!(after.get_i32("x").unwrap(), 1, "{}", target.name());
        target.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_see_the_snapshot_of_the_first_operation() {
    for (target, cl) in Target::all().await {
        let c = coll(&cl, "snapshot");
        c.insert_one(doc! {"_id": 1, "v": 1}).await.unwrap();
        let mut s = cl.start_session().await.unwrap();
        s.start_transaction().await.unwrap();
        let first = c.find_one(doc! {"_id": 1}).session(&mut s).await.unwrap();
        assert_eq!(first.unwrap().get_i32("v").unwrap(), 1);
        // Written outside after the snapshot: neither the change nor the new document is seen.
        c.update_one(doc! {"_id": 1}, doc! {"$set": {"v": 2}})
            .await
            .unwrap();
        c.insert_one(doc! {"_id": 2, "v": 1}).await.unwrap();
        let again = find_in(&c, &mut s).await;
        assert_eq!(again, vec![doc! {"_id": 1, "v": 1}], "{}", target.name());
        s.commit_transaction().await.unwrap();
        let now = c.find_one(doc! {"_id": 1}).await.unwrap().unwrap();
        assert_eq!(now.get_i32("v").unwrap(), 2);
        target.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_discards_every_write() {
    for (target, cl) in Target::all().await {
        let c = coll(&cl, "abort");
        c.insert_many(vec![doc! {"_id": 1, "v": 1}, doc! {"_id": 2, "v": 2}])
            .await
            .unwrap();
        let mut s = cl.start_session().await.unwrap();
        s.start_transaction().await.unwrap();
        c.insert_one(doc! {"_id": 3}).session(&mut s).await.unwrap();
        c.update_one(doc! {"_id": 1}, doc! {"$set": {"v": 10}})
            .session(&mut s)
            .await
            .unwrap();
        c.delete_one(doc! {"_id": 2}).session(&mut s).await.unwrap();
        s.abort_transaction().await.unwrap();
        let docs = common::all(c.find(doc! {}).sort(doc! {"_id": 1}).await.unwrap()).await;
        assert_eq!(
            docs,
            vec![doc! {"_id": 1, "v": 1}, doc! {"_id": 2, "v": 2}],
            "{}",
            target.name()
        );
        // A new transaction on the session starts from the committed state.
        s.start_transaction().await.unwrap();
        let n = c.count_documents(doc! {}).session(&mut s).await.unwrap();
        assert_eq!(n, 2);
        s.commit_transaction().await.unwrap();
        target.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_to_one_document_conflict() {
    for (target, cl) in Target::all().await {
        let c = coll(&cl, "conflict");
        c.insert_many(vec![doc! {"_id": 1, "v": 0}, doc! {"_id": 2, "v": 0}])
            .await
            .unwrap();
        // Two transactions write the same document: the second gets WriteConflict, labelled,
        // and its transaction is gone.
        let mut a = cl.start_session().await.unwrap();
        let mut b = cl.start_session().await.unwrap();
        a.start_transaction().await.unwrap();
        b.start_transaction().await.unwrap();
        c.update_one(doc! {"_id": 1}, doc! {"$inc": {"v": 1}})
            .session(&mut a)
            .await
            .unwrap();
        let e = c
            .update_one(doc! {"_id": 1}, doc! {"$inc": {"v": 10}})
            .session(&mut b)
            .await
            .unwrap_err();
        assert_eq!(code(&e), 112, "{}: {e}", target.name());
        assert!(e.contains_label(LABEL), "{}: {e}", target.name());
        let e = b.commit_transaction().await.unwrap_err();
        assert_eq!(code(&e), 251, "{}: {e}", target.name());
        assert!(e.contains_label(LABEL), "{}: {e}", target.name());
        a.commit_transaction().await.unwrap();
        let d = c.find_one(doc! {"_id": 1}).await.unwrap().unwrap();
        assert_eq!(d.get_i32("v").unwrap(), 1, "{}", target.name());

        // A document changed outside since the transaction's snapshot: writing it conflicts.
        a.start_transaction().await.unwrap();
        c.find_one(doc! {"_id": 2}).session(&mut a).await.unwrap();
        c.update_one(doc! {"_id": 2}, doc! {"$set": {"v": 5}})
            .await
            .unwrap();
        let e = c
            .update_one(doc! {"_id": 2}, doc! {"$set": {"v": 6}})
            .session(&mut a)
            .await
            .unwrap_err();
        assert_eq!(code(&e), 112, "{}: {e}", target.name());
        assert!(e.contains_label(LABEL));
        let _ = a.abort_transaction().await;
        let d = c.find_one(doc! {"_id": 2}).await.unwrap().unwrap();
        assert_eq!(d.get_i32("v").unwrap(), 5);

        // Inserting the same new `_id` in two transactions conflicts too.
        a.start_transaction().await.unwrap();
        b.start_transaction().await.unwrap();
        c.insert_one(doc! {"_id": 9}).session(&mut a).await.unwrap();
        let e = c
            .insert_one(doc! {"_id": 9})
            .session(&mut b)
            .await
            .unwrap_err();
        assert_eq!(code(&e), 112, "{}: {e}", target.name());
        a.commit_transaction().await.unwrap();
        let _ = b.abort_transaction().await;
        assert_eq!(c.count_documents(doc! {"_id": 9}).await.unwrap(), 1);

        // A write outside any transaction to a document a transaction holds is not made to
        // wait (docs/design/transactions.md): it applies, and the transaction's commit then
        // fails with a labelled WriteConflict and applies nothing.
        a.start_transaction().await.unwrap();
        c.update_one(doc! {"_id": 1}, doc! {"$set": {"v": 100}})
            .session(&mut a)
            .await
            .unwrap();
        c.insert_one(doc! {"_id": 10})
            .session(&mut a)
            .await
            .unwrap();
        c.update_one(doc! {"_id": 1}, doc! {"$set": {"v": 7}})
            .await
            .unwrap();
        let e = a.commit_transaction().await.unwrap_err();
        assert_eq!(code(&e), 112, "{}: {e}", target.name());
        assert!(e.contains_label(LABEL), "{}: {e}", target.name());
        let d = c.find_one(doc! {"_id": 1}).await.unwrap().unwrap();
        assert_eq!(d.get_i32("v").unwrap(), 7, "{}", target.name());
        assert_eq!(c.count_documents(doc! {"_id": 10}).await.unwrap(), 0);
        target.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_may_be_retried_and_with_transaction_commits() {
    for (target, cl) in Target::all().await {
        let c = coll(&cl, "retry");
        let mut s = cl.start_session().await.unwrap();
        s.start_transaction().await.unwrap();
        c.insert_one(doc! {"_id": 1}).session(&mut s).await.unwrap();
        s.commit_transaction().await.unwrap();
        // A retried commit of a committed transaction answers ok and applies nothing twice.
        s.commit_transaction().await.unwrap();
        assert_eq!(ids(&c).await, vec![Bson::Int32(1)], "{}", target.name());

        // The convenient API: the callback's writes are committed together.
        let c2 = c.clone();
        s.start_transaction()
            .and_run2(async move |session| {
                c2.insert_one(doc! {"_id": 2})
                    .session(&mut *session)
                    .await?;
                c2.update_one(doc! {"_id": 1}, doc! {"$set": {"done": true}})
                    .session(&mut *session)
                    .await?;
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(ids(&c).await, vec![Bson::Int32(1), Bson::Int32(2)]);
        let d = c.find_one(doc! {"_id": 1}).await.unwrap().unwrap();
        assert!(d.get_bool("done").unwrap(), "{}", target.name());
        target.stop().await;
    }
}

/// A command of session `lsid` in transaction `txn` (`start`: its first).
fn txn_cmd(mut cmd: Document, lsid: &Document, txn: i64, start: bool) -> Document {
    cmd.insert("lsid", lsid.clone());
    cmd.insert("txnNumber", txn);
    if start {
        cmd.insert("startTransaction", true);
    }
    cmd.insert("autocommit", false);
    cmd
}

fn labels(reply: &Document) -> Vec<String> {
    reply
        .get_array("errorLabels")
        .map(|a| {
            a.iter()
                .filter_map(|l| l.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn session_errors_are_mongods() {
    let s = shard().await;
    let mut raw = Raw::connect(s.local_addr()).await;
    let lsid = doc! {"id": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![5; 16] })};
    let insert = |id: i32| doc! {"insert": "c", "documents": [{"_id": id}], "$db": "d"};
    let commit = doc! {"commitTransaction": 1, "$db": "admin"};
    let abort = doc! {"abortTransaction": 1, "$db": "admin"};

    // Nothing started: NoSuchTransaction, labelled.
    let r = raw.command(&txn_cmd(commit.clone(), &lsid, 1, false)).await;
    assert_eq!(r.get_i32("code").unwrap(), 251, "{r}");
    assert_eq!(labels(&r), vec![LABEL]);
    let r = raw.command(&txn_cmd(insert(1), &lsid, 1, false)).await;
    assert_eq!(r.get_i32("code").unwrap(), 251, "{r}");

    // Started and committed: a retried commit is ok; abort, continue and restart are refused.
    let r = raw.command(&txn_cmd(insert(1), &lsid, 2, true)).await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    for _ in 0..2 {
        let r = raw.command(&txn_cmd(commit.clone(), &lsid, 2, false)).await;
        assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    }
    let r = raw.command(&txn_cmd(abort.clone(), &lsid, 2, false)).await;
    assert_eq!(r.get_i32("code").unwrap(), 256, "{r}");
    let r = raw.command(&txn_cmd(insert(2), &lsid, 2, false)).await;
    assert_eq!(r.get_i32("code").unwrap(), 256, "{r}");
    let r = raw.command(&txn_cmd(insert(2), &lsid, 2, true)).await;
    assert_eq!(r.get_i32("code").unwrap(), 117, "{r}");

    // Older than the session's newest: TransactionTooOld.
    let r = raw.command(&txn_cmd(insert(3), &lsid, 1, true)).await;
    assert_eq!(r.get_i32("code").unwrap(), 225, "{r}");

    // Aborted: commit, abort and continue get NoSuchTransaction.
    let r = raw.command(&txn_cmd(insert(3), &lsid, 3, true)).await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    let r = raw.command(&txn_cmd(abort.clone(), &lsid, 3, false)).await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    for cmd in [commit.clone(), abort.clone(), insert(4)] {
        let r = raw.command(&txn_cmd(cmd, &lsid, 3, false)).await;
        assert_eq!(r.get_i32("code").unwrap(), 251, "{r}");
    }
    assert_eq!(s.service().count_documents("d", "c"), 1);

    // A command transactions do not run: refused, and the transaction is gone.
    let r = raw.command(&txn_cmd(insert(5), &lsid, 4, true)).await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    let r = raw
        .command(&txn_cmd(
            doc! {"count": "c", "query": {}, "$db": "d"},
            &lsid,
            4,
            false,
        ))
        .await;
    assert_eq!(r.get_i32("code").unwrap(), 263, "{r}");
    assert!(labels(&r).is_empty(), "{r}");
    let r = raw.command(&txn_cmd(commit.clone(), &lsid, 4, false)).await;
    assert_eq!(r.get_i32("code").unwrap(), 251, "{r}");

    // readConcern only on the first statement, writeConcern only on commit and abort, and
    // not on admin, config or local.
    let r = raw.command(&txn_cmd(insert(6), &lsid, 5, true)).await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    let mut with_rc = txn_cmd(insert(7), &lsid, 5, false);
    with_rc.insert("readConcern", doc! {"level": "snapshot"});
    let r = raw.command(&with_rc).await;
    assert_eq!(r.get_i32("code").unwrap(), 72, "{r}");
    let mut with_wc = txn_cmd(insert(8), &lsid, 6, true);
    with_wc.insert("writeConcern", doc! {"w": 1});
    let r = raw.command(&with_wc).await;
    assert_eq!(r.get_i32("code").unwrap(), 72, "{r}");
    let mut in_admin = txn_cmd(insert(9), &lsid, 7, true);
    in_admin.insert("$db", "admin");
    let r = raw.command(&in_admin).await;
    assert_eq!(r.get_i32("code").unwrap(), 50844, "{r}");
    let mut bad_level = txn_cmd(insert(10), &lsid, 8, true);
    bad_level.insert("readConcern", doc! {"level": "available"});
    let r = raw.command(&bad_level).await;
    assert_eq!(r.get_i32("code").unwrap(), 72, "{r}");
    assert_eq!(s.service().open_transactions(), 0);
    s.shutdown().await;
}

#[tokio::test]
async fn a_fail_point_error_inside_a_transaction_is_labelled() {
    let s = shard().await;
    let mut raw = Raw::connect(s.local_addr()).await;
    let lsid = doc! {"id": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![6; 16] })};
    for (code, transient) in [(112, true), (10107, true), (11000, false)] {
        let r = raw
            .command(&doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["insert"], "errorCode": code}, "$db": "admin"})
            .await;
        assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
        let r = raw
            .command(&txn_cmd(
                doc! {"insert": "c", "documents": [{"_id": 1}], "$db": "d"},
                &lsid,
                i64::from(code),
                true,
            ))
            .await;
        assert_eq!(r.get_i32("code").unwrap(), code, "{r}");
        let expected: Vec<String> = if transient {
            vec![LABEL.to_string()]
        } else {
            Vec::new()
        };
        assert_eq!(labels(&r), expected, "{code}: {r}");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_passes_statements_through_to_their_shard() {
    let c = TestCluster::start(2, &[("txn.sharded", doc! {"_id": "hashed"})]).await;
    let cl = common::driver(c.addr(), "").await;
    let sharded = coll(&cl, "sharded");
    // Two `_id`s owned by different shards, and one more on the first one's shard.
    let owner = |id: i32| c.owner("txn.sharded", &doc! {"_id": id});
    let a = 1;
    let b = (2..100).find(|i| owner(*i) != owner(a)).unwrap();
    let a2 = (2..100).find(|i| owner(*i) == owner(a)).unwrap();

    // Every statement on one shard: passed through, committed there.
    let mut s = cl.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    sharded
        .insert_one(doc! {"_id": a})
        .session(&mut s)
        .await
        .unwrap();
    sharded
        .insert_one(doc! {"_id": a2})
        .session(&mut s)
        .await
        .unwrap();
    assert_eq!(sharded.count_documents(doc! {}).await.unwrap(), 0);
    s.commit_transaction().await.unwrap();
    assert_eq!(sharded.count_documents(doc! {}).await.unwrap(), 2);
    assert_eq!(c.count_on_shards("txn", "sharded"), 2);

    // A cursor opened in the transaction is read on with getMore on the same shard.
    s.start_transaction().await.unwrap();
    let mut cursor = sharded
        .find(doc! {"_id": {"$in": [a, a2]}})
        .batch_size(1)
        .session(&mut s)
        .await
        .unwrap();
    let mut seen = 0;
    while cursor.advance(&mut s).await.unwrap() {
        seen += 1;
    }
    drop(cursor);
    assert_eq!(seen, 2);
    s.commit_transaction().await.unwrap();

    // A statement bound for a second shard brings it in; an update of one document that
    // targets both at once is refused, and the aborted transaction commits nothing on either.
    s.start_transaction().await.unwrap();
    sharded
        .update_one(doc! {"_id": a}, doc! {"$set": {"t": 1}})
        .session(&mut s)
        .await
        .unwrap();
    sharded
        .insert_one(doc! {"_id": b})
        .session(&mut s)
        .await
        .unwrap();
    let e = sharded
        .update_one(doc! {}, doc! {"$set": {"u": 1}})
        .session(&mut s)
        .await
        .unwrap_err();
    assert_eq!(common::error_code(&e), 263, "{e}");
    s.abort_transaction().await.unwrap();
    let d = sharded.find_one(doc! {"_id": a}).await.unwrap().unwrap();
    assert!(!d.contains_key("t"), "{d}");
    assert_eq!(sharded.count_documents(doc! {"_id": b}).await.unwrap(), 0);

    // A lost shard connection inside a transaction comes back labelled transient.
    let shard_of_a = c
        .shards
        .iter()
        .position(|sh| sh.service().name() == owner(a))
        .unwrap();
    let direct = c.direct(shard_of_a).await;
    direct
        .database("admin")
        .run_command(doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["update"], "closeConnection": true}})
        .await
        .unwrap();
    s.start_transaction().await.unwrap();
    let e = sharded
        .update_one(doc! {"_id": a}, doc! {"$set": {"t": 2}})
        .session(&mut s)
        .await
        .unwrap_err();
    assert!(e.contains_label(LABEL), "{e}");
    let _ = s.abort_transaction().await;
    let open: usize = c
        .shards
        .iter()
        .map(|sh| sh.service().open_transactions())
        .sum();
    assert_eq!(open, 0);
    c.stop().await;
}

/// Snapshot reads outside transactions (`readConcern: snapshot` on a session started with
/// `snapshot: true`): every read of the session sees the data as of its first read, on one
/// shard, on an unsharded collection through the router, and on a collection sharded across
/// two shards (where the router picks the time and says it back); a new snapshot session sees
/// the writes made since; a command that cannot read at a snapshot gets 72.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_reads_see_one_instant_across_shards() {
    for (target, cl) in Target::all().await {
        let names: &[&str] = match target {
            Target::Shard(_) => &["snap"],
            Target::Router(_) => &["snap", "sharded"],
        };
        for name in names {
            let c = coll(&cl, name);
            let docs: Vec<Document> = (1..=20).map(|i| doc! {"_id": i, "x": 1}).collect();
            c.insert_many(docs).await.unwrap();
            let mut s = cl.start_session().snapshot(true).await.unwrap();
            let mut cursor = c.find(doc! {}).session(&mut s).await.unwrap();
            let mut first = 0;
            while cursor.advance(&mut s).await.unwrap() {
                first += 1;
            }
            assert_eq!(first, 20, "{} {name}", target.name());

            // Writes after the snapshot's time, outside the session.
            c.update_many(doc! {}, doc! {"$set": {"x": 2}})
                .await
                .unwrap();
            c.insert_many((21..=30).map(|i| doc! {"_id": i, "x": 3}))
                .await
                .unwrap();
            c.delete_many(doc! {"_id": {"$lte": 5}}).await.unwrap();

            let seen = find_in(&c, &mut s).await;
            assert_eq!(
                seen.len(),
                20,
                "{} {name}: the snapshot's documents",
                target.name()
            );
            assert!(
                seen.iter().all(|d| d.get_i32("x").ok() == Some(1)),
                "{seen:?}"
            );
            let xs = c.distinct("x", doc! {}).session(&mut s).await.unwrap();
            assert_eq!(
                xs,
                vec![Bson::Int32(1)],
                "{} {name}: distinct",
                target.name()
            );
            let mut agg = c
                .aggregate(vec![doc! {"$group": {"_id": null, "n": {"$sum": 1}}}])
                .session(&mut s)
                .await
                .unwrap();
            assert!(agg.advance(&mut s).await.unwrap());
            let n = agg.deserialize_current().unwrap();
            assert_eq!(
                n.get_i32("n").ok(),
                Some(20),
                "{} {name}: aggregate",
                target.name()
            );
            drop(agg);

            // A new snapshot session reads the data as it is now.
            let mut fresh = cl.start_session().snapshot(true).await.unwrap();
            let now = find_in(&c, &mut fresh).await;
            assert_eq!(now.len(), 25, "{} {name}: now", target.name());

            // Commands that cannot read at a snapshot outside a transaction.
            let e = cl
                .database("txn")
                .run_command(doc! {"findAndModify": *name, "query": {"_id": 6}, "update": {"$set": {"y": 1}}, "readConcern": {"level": "snapshot"}})
                .await
                .unwrap_err();
            assert_eq!(code(&e), 72, "{} {name}: {e}", target.name());
            let e = cl
                .database("txn")
                .run_command(doc! {"count": *name, "readConcern": {"level": "snapshot"}})
                .await
                .unwrap_err();
            assert_eq!(code(&e), 72, "{} {name}: {e}", target.name());
        }
        target.stop().await;
    }
}

/// A router over two shards with `txn.sharded` hashed on `_id`, and two `_id`s owned by
/// different shards (with the index of each one's shard).
async fn two_shards() -> (TestCluster, Client, i32, i32, usize, usize) {
    let c = TestCluster::start(2, &[("txn.sharded", doc! {"_id": "hashed"})]).await;
    let cl = common::driver(c.addr(), "").await;
    let owner = |id: i32| c.owner("txn.sharded", &doc! {"_id": id});
    let a = 1;
    let b = (2..100).find(|i| owner(*i) != owner(a)).unwrap();
    let index = |id: i32| {
        c.shards
            .iter()
            .position(|sh| sh.service().name() == owner(id))
            .unwrap()
    };
    let (ia, ib) = (index(a), index(b));
    (c, cl, a, b, ia, ib)
}

fn open_on(c: &TestCluster) -> (usize, usize) {
    c.shards.iter().fold((0, 0), |(o, p), sh| {
        (
            o + sh.service().open_transactions(),
            p + sh.service().prepared_transactions(),
        )
    })
}

/// Writes on two shards in one transaction: each statement's shard joins it, the transaction
/// reads its own writes on both, nobody outside sees any of them before the commit, and the
/// commit (a two-phase commit: one `prepareTransaction` per shard) applies all of them. An
/// abort applies none. A second shard that was only read commits without a prepare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_across_two_shards_commits_atomically() {
    let (c, cl, a, b, _, _) = two_shards().await;
    let sharded = coll(&cl, "sharded");
    let mut s = cl.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    sharded
        .insert_one(doc! {"_id": a, "v": 1})
        .session(&mut s)
        .await
        .unwrap();
    sharded
        .insert_one(doc! {"_id": b, "v": 1})
        .session(&mut s)
        .await
        .unwrap();
    // Read-your-writes on both shards.
    for id in [a, b] {
        let d = sharded
            .find_one(doc! {"_id": id})
            .session(&mut s)
            .await
            .unwrap();
        assert_eq!(d, Some(doc! {"_id": id, "v": 1}));
    }
    // Outside: none of them.
    assert_eq!(sharded.count_documents(doc! {}).await.unwrap(), 0);
    assert_eq!(open_on(&c), (2, 0));
    s.commit_transaction().await.unwrap();
    assert_eq!(c.shard_command_total("prepareTransaction"), 2);
    assert_eq!(sharded.count_documents(doc! {}).await.unwrap(), 2);
    assert_eq!(open_on(&c), (0, 0));
    // A retried commit answers ok and applies nothing twice (it asks both shards again).
    s.commit_transaction().await.unwrap();
    assert_eq!(c.count_on_shards("txn", "sharded"), 2);
    let prepares = c.shard_command_total("prepareTransaction");

    // Abort: nothing of either shard's writes.
    s.start_transaction().await.unwrap();
    for id in [a, b] {
        sharded
            .update_one(doc! {"_id": id}, doc! {"$set": {"v": 2}})
            .session(&mut s)
            .await
            .unwrap();
    }
    s.abort_transaction().await.unwrap();
    assert_eq!(sharded.count_documents(doc! {"v": 1}).await.unwrap(), 2);
    assert_eq!(open_on(&c), (0, 0));

    // One shard written, the other only read: plain commits, no prepare.
    s.start_transaction().await.unwrap();
    sharded
        .update_one(doc! {"_id": a}, doc! {"$set": {"v": 3}})
        .session(&mut s)
        .await
        .unwrap();
    let other = sharded
        .find_one(doc! {"_id": b})
        .session(&mut s)
        .await
        .unwrap();
    assert_eq!(other, Some(doc! {"_id": b, "v": 1}));
    s.commit_transaction().await.unwrap();
    assert_eq!(c.shard_command_total("prepareTransaction"), prepares);
    assert_eq!(sharded.count_documents(doc! {"v": 3}).await.unwrap(), 1);
    assert_eq!(open_on(&c), (0, 0));
    c.stop().await;
}

/// A write conflict on the second shard: a statement that meets another transaction's
/// document fails with WriteConflict labelled transient; a document changed outside after the
/// transaction wrote it fails the prepare, so the commit aborts on both shards and comes back
/// NoSuchTransaction labelled transient, and `with_transaction` runs the whole again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_conflict_on_the_second_shard_aborts_the_whole() {
    let (c, cl, a, b, _, _) = two_shards().await;
    let sharded = coll(&cl, "sharded");
    sharded
        .insert_many([doc! {"_id": a, "n": 0}, doc! {"_id": b, "n": 0}])
        .await
        .unwrap();

    // Statement-level conflict on the second shard.
    let mut s1 = cl.start_session().await.unwrap();
    let mut s2 = cl.start_session().await.unwrap();
    s1.start_transaction().await.unwrap();
    sharded
        .update_one(doc! {"_id": a}, doc! {"$inc": {"n": 1}})
        .session(&mut s1)
        .await
        .unwrap();
    s2.start_transaction().await.unwrap();
    sharded
        .update_one(doc! {"_id": b}, doc! {"$inc": {"n": 10}})
        .session(&mut s2)
        .await
        .unwrap();
    let e = sharded
        .update_one(doc! {"_id": b}, doc! {"$inc": {"n": 1}})
        .session(&mut s1)
        .await
        .unwrap_err();
    assert_eq!(code(&e), 112, "{e}");
    assert!(e.contains_label(LABEL), "{e}");
    let _ = s1.abort_transaction().await;
    s2.abort_transaction().await.unwrap();
    assert_eq!(sharded.count_documents(doc! {"n": 0}).await.unwrap(), 2);
    assert_eq!(open_on(&c), (0, 0));

    // Commit-time conflict: the first attempt's prepare fails on b's shard, the retry commits.
    let attempts = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (inner, counter) = (sharded.clone(), attempts.clone());
    s1.start_transaction()
        .and_run2(async move |session| {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            for id in [a, b] {
                inner
                    .update_one(doc! {"_id": id}, doc! {"$inc": {"n": 1}})
                    .session(&mut *session)
                    .await?;
            }
            if n == 0 {
                inner
                    .update_one(doc! {"_id": b}, doc! {"$inc": {"outside": 1}})
                    .await?;
            }
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(attempts.load(std::sync::atomic::Ordering::SeqCst), 2);
    let da = sharded.find_one(doc! {"_id": a}).await.unwrap().unwrap();
    let db = sharded.find_one(doc! {"_id": b}).await.unwrap().unwrap();
    assert_eq!(da.get_i32("n").unwrap(), 1, "{da}");
    assert_eq!(db.get_i32("n").unwrap(), 1, "{db}");
    assert_eq!(db.get_i32("outside").unwrap(), 1, "{db}");
    assert_eq!(open_on(&c), (0, 0));
    c.stop().await;
}

/// A failure injected at `prepareTransaction` on one shard: the router aborts on every shard,
/// the commit fails with NoSuchTransaction labelled transient, and nothing is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_prepare_aborts_everywhere() {
    let (c, cl, a, b, _, ib) = two_shards().await;
    let sharded = coll(&cl, "sharded");
    c.direct(ib)
        .await
        .database("admin")
        .run_command(doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["prepareTransaction"], "errorCode": 8}})
        .await
        .unwrap();
    let mut s = cl.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    for id in [a, b] {
        sharded
            .insert_one(doc! {"_id": id})
            .session(&mut s)
            .await
            .unwrap();
    }
    let e = s.commit_transaction().await.unwrap_err();
    assert_eq!(code(&e), 251, "{e}");
    assert!(e.contains_label(LABEL), "{e}");
    assert_eq!(c.count_on_shards("txn", "sharded"), 0);
    assert_eq!(open_on(&c), (0, 0));
    c.stop().await;
}

/// `prepareTransaction` on one shard, as a coordinator sends it: a prepare timestamp; the
/// errors mongod gives for misuse; a prepared transaction's documents make a write outside it
/// wait until the commit, and a write of another transaction conflict; abort of a prepared
/// transaction applies nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_transaction_holds_its_documents_until_commit() {
    let s = shard().await;
    let mut raw = Raw::connect(s.local_addr()).await;
    let lsid = doc! {"id": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] })};
    let other = doc! {"id": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![8; 16] })};
    let prepare = doc! {"prepareTransaction": 1, "$db": "admin"};
    let commit = doc! {"commitTransaction": 1, "$db": "admin"};
    let abort = doc! {"abortTransaction": 1, "$db": "admin"};
    let insert = |id: i32| doc! {"insert": "c", "documents": [{"_id": id}], "$db": "d"};

    // Unknown, then aborted: NoSuchTransaction.
    let r = raw
        .command(&txn_cmd(prepare.clone(), &lsid, 1, false))
        .await;
    assert_eq!(r.get_i32("code").unwrap(), 251, "{r}");
    let r = raw.command(&txn_cmd(insert(1), &lsid, 1, true)).await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    let mut early = txn_cmd(commit.clone(), &lsid, 1, false);
    early.insert(
        "commitTimestamp",
        bson::Timestamp {
            time: 1,
            increment: 1,
        },
    );
    let r = raw.command(&early).await;
    assert_eq!(r.get_i32("code").unwrap(), 72, "{r}");
    let r = raw.command(&txn_cmd(abort.clone(), &lsid, 1, false)).await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    let r = raw
        .command(&txn_cmd(prepare.clone(), &lsid, 1, false))
        .await;
    assert_eq!(r.get_i32("code").unwrap(), 251, "{r}");

    // Prepared: statements, a commit without (or before) the prepare time are refused.
    let r = raw.command(&txn_cmd(insert(1), &lsid, 2, true)).await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    let r = raw
        .command(&txn_cmd(prepare.clone(), &lsid, 2, false))
        .await;
    let at = r.get_timestamp("prepareTimestamp").unwrap();
    let r = raw
        .command(&txn_cmd(prepare.clone(), &lsid, 2, false))
        .await;
    assert_eq!(r.get_timestamp("prepareTimestamp").unwrap(), at, "{r}");
    assert_eq!(s.service().prepared_transactions(), 1);
    let r = raw.command(&txn_cmd(commit.clone(), &lsid, 2, false)).await;
    assert_eq!(r.get_i32("code").unwrap(), 72, "{r}");
    let r = raw.command(&txn_cmd(insert(2), &lsid, 2, false)).await;
    assert_eq!(r.get_i32("code").unwrap(), 267, "{r}");
    let mut before = txn_cmd(commit.clone(), &lsid, 2, false);
    before.insert(
        "commitTimestamp",
        bson::Timestamp {
            time: at.time - 1,
            increment: 0,
        },
    );
    let r = raw.command(&before).await;
    assert_eq!(r.get_i32("code").unwrap(), 72, "{r}");
    // Another transaction writing the prepared document: WriteConflict.
    let r = raw.command(&txn_cmd(insert(1), &other, 1, true)).await;
    assert_eq!(r.get_i32("code").unwrap(), 112, "{r}");

    // A write outside waits for the commit, then sees its document.
    let direct = common::direct(s.local_addr()).await;
    let c: Collection<Document> = direct.database("d").collection("c");
    let outside = tokio::spawn(async move {
        c.update_one(doc! {"_id": 1}, doc! {"$set": {"after": true}})
            .await
            .map(|r| r.matched_count)
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!outside.is_finished(), "the outside write did not wait");
    assert_eq!(s.service().count_documents("d", "c"), 0);
    let mut at_commit = txn_cmd(commit.clone(), &lsid, 2, false);
    at_commit.insert("commitTimestamp", at);
    let r = raw.command(&at_commit).await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    assert_eq!(outside.await.unwrap().unwrap(), 1);
    assert_eq!(
        s.service().documents("d", "c"),
        vec![doc! {"_id": 1, "after": true}]
    );
    let r = raw
        .command(&txn_cmd(prepare.clone(), &lsid, 2, false))
        .await;
    assert_eq!(r.get_i32("code").unwrap(), 256, "{r}");

    // Abort of a prepared transaction: nothing applied, the documents released.
    let r = raw.command(&txn_cmd(insert(3), &lsid, 3, true)).await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    let r = raw
        .command(&txn_cmd(prepare.clone(), &lsid, 3, false))
        .await;
    assert!(r.get_timestamp("prepareTimestamp").is_ok(), "{r}");
    let r = raw.command(&txn_cmd(abort.clone(), &lsid, 3, false)).await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    assert_eq!(s.service().count_documents("d", "c"), 1);
    assert_eq!(s.service().open_transactions(), 0);
    s.shutdown().await;
}

/// Through the router: a document a prepared transaction holds on one shard makes an outside
/// write wait until the router's commit reaches that shard (the prepare is held open by a
/// fail point that delays the other shard's commit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outside_write_waits_for_a_prepared_transaction_through_the_router() {
    let (c, cl, a, b, ia, _) = two_shards().await;
    let sharded = coll(&cl, "sharded");
    sharded
        .insert_many([doc! {"_id": a, "n": 0}, doc! {"_id": b, "n": 0}])
        .await
        .unwrap();
    // a's shard answers its commit 600 ms late: until then, a is prepared there.
    c.direct(ia)
        .await
        .database("admin")
        .run_command(doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["commitTransaction"], "blockConnection": true, "blockTimeMS": 600}})
        .await
        .unwrap();
    let mut s = cl.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    for id in [a, b] {
        sharded
            .update_one(doc! {"_id": id}, doc! {"$inc": {"n": 1}})
            .session(&mut s)
            .await
            .unwrap();
    }
    let committing = tokio::spawn(async move { s.commit_transaction().await.map(|_| s) });
    // Wait until a's shard is prepared, then write a outside.
    for _ in 0..200 {
        if c.shards[ia].service().prepared_transactions() == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(c.shards[ia].service().prepared_transactions(), 1);
    let seen = sharded
        .find_one_and_update(doc! {"_id": a}, doc! {"$inc": {"n": 10}})
        .await
        .unwrap()
        .unwrap();
    // The outside write ran after the commit: it saw the transaction's increment.
    assert_eq!(seen.get_i32("n").unwrap(), 1, "{seen}");
    committing.await.unwrap().unwrap();
    let d = sharded.find_one(doc! {"_id": a}).await.unwrap().unwrap();
    assert_eq!(d.get_i32("n").unwrap(), 11, "{d}");
    c.stop().await;
}

/// A commit whose second phase loses its connection to one shard: the client gets
/// `UnknownTransactionCommitResult` (not the transient label: the transaction must not run
/// again), and the retried commit finishes it on that shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_commit_outcome_is_labelled_and_a_retry_finishes_it() {
    let (c, cl, a, b, _, ib) = two_shards().await;
    let sharded = coll(&cl, "sharded");
    c.direct(ib)
        .await
        .database("admin")
        .run_command(doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["commitTransaction"], "closeConnection": true}})
        .await
        .unwrap();
    let mut s = cl.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    for id in [a, b] {
        sharded
            .insert_one(doc! {"_id": id})
            .session(&mut s)
            .await
            .unwrap();
    }
    let e = s.commit_transaction().await.unwrap_err();
    assert!(e.contains_label("UnknownTransactionCommitResult"), "{e}");
    assert!(!e.contains_label(LABEL), "{e}");
    assert_eq!(c.shards[ib].service().prepared_transactions(), 1);
    s.commit_transaction().await.unwrap();
    assert_eq!(c.count_on_shards("txn", "sharded"), 2);
    assert_eq!(open_on(&c), (0, 0));
    c.stop().await;
}

/// Runs one insert per `_id` in transaction `txn` through `router`; returns the commit the
/// client would send, with the `recoveryToken` of the last reply.
async fn statements(router: &mut Raw, lsid: &Document, txn: i64, ids: &[i32]) -> Document {
    let mut token = Document::new();
    for (k, id) in ids.iter().enumerate() {
        let insert = doc! {"insert": "sharded", "documents": [{"_id": id}], "$db": "txn"};
        let r = router.command(&txn_cmd(insert, lsid, txn, k == 0)).await;
        assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
        token = r.get_document("recoveryToken").unwrap().clone();
    }
    let mut cmd = txn_cmd(
        doc! {"commitTransaction": 1, "$db": "admin"},
        lsid,
        txn,
        false,
    );
    cmd.insert("recoveryToken", token);
    cmd
}

/// A commit sent to another router with the `recoveryToken` of the last reply recovers the
/// decision, as mongos does, and never makes one:
/// - a transaction no router committed (one shard, or two) is aborted everywhere and the
///   client gets NoSuchTransaction labelled `TransientTransactionError`, nothing applied;
/// - a transaction the first router committed is answered ok, applied once;
/// - a transaction prepared on every participant whose router went away before the second
///   phase (commit was the only decision left) is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_through_another_router_recovers_the_decision() {
    let (c, _cl, a, b, _, _) = two_shards().await;
    // The other router only ends transactions here: it needs the shards, not the collection's
    // metadata (a second static router would give the shards a different version of it).
    let other = c.another_router(&[]).await;
    let mut first = Raw::connect(c.addr()).await;
    let mut second = Raw::connect(other.local_addr()).await;
    let lsid = doc! {"id": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![9; 16] })};
    let commit = |txn: i64| {
        txn_cmd(
            doc! {"commitTransaction": 1, "$db": "admin"},
            &lsid,
            txn,
            false,
        )
    };
    let owner = |id: i32| c.owner("txn.sharded", &doc! {"_id": id});
    // From `from` on, the first `_id` on `a`'s shard and the first on `b`'s.
    let ids = |from: i32| {
        let on = |of: i32| (from..).find(|i| owner(*i) == owner(of)).unwrap();
        vec![on(a), on(b)]
    };

    // Never committed: one shard, then two.
    for (txn, ids) in [(1, vec![a]), (2, ids(100))] {
        let cmd = statements(&mut first, &lsid, txn, &ids).await;
        let r = second.command(&cmd).await;
        assert_eq!(r.get_i32("code").ok(), Some(251), "transaction {txn}: {r}");
        assert_eq!(labels(&r), ["TransientTransactionError"], "{r}");
        assert_eq!(open_on(&c), (0, 0), "transaction {txn}");
        assert_eq!(c.count_on_shards("txn", "sharded"), 0, "transaction {txn}");
        // The first router's own commit finds nothing to commit either.
        let r = first.command(&commit(txn)).await;
        assert_eq!(r.get_i32("code").ok(), Some(251), "transaction {txn}: {r}");
    }

    // Committed by the first router: the retry through the second is ok, applied once.
    let cmd = statements(&mut first, &lsid, 3, &ids(200)).await;
    let r = first.command(&commit(3)).await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    let r = second.command(&cmd).await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    assert_eq!(c.count_on_shards("txn", "sharded"), 2);

    // Prepared everywhere by a router that went no further: the second router commits it.
    let cmd = statements(&mut first, &lsid, 4, &ids(300)).await;
    for shard in &c.shards {
        let mut direct = Raw::connect(shard.local_addr()).await;
        let prepare = txn_cmd(
            doc! {"prepareTransaction": 1, "$db": "admin"},
            &lsid,
            4,
            false,
        );
        let r = direct.command(&prepare).await;
        assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    }
    assert_eq!(open_on(&c).1, 2);
    let r = second.command(&cmd).await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
    assert_eq!(open_on(&c), (0, 0));
    assert_eq!(c.count_on_shards("txn", "sharded"), 4);

    // A client may not send the shards' recovery command through a router.
    let recover = doc! {"coordinateCommitTransaction": 1, "participants": [], "$db": "admin"};
    let r = second.command(&txn_cmd(recover, &lsid, 4, false)).await;
    assert_eq!(r.get_i32("code").ok(), Some(59), "{r}");
    other.shutdown().await;
    c.stop().await;
}

/// An `insert` inside a transaction whose documents live on two shards is split into one
/// child per shard: all of it commits together; a duplicate key on the second shard comes back
/// as a write error at the document's index in the client's command, and nothing is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_across_shards_in_a_transaction_is_split() {
    let (c, cl, a, b, ia, ib) = two_shards().await;
    let sharded = coll(&cl, "sharded");
    let mut s = cl.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    let docs: Vec<Document> = (100..110).map(|i| doc! {"_id": i}).collect();
    let r = sharded.insert_many(docs).session(&mut s).await.unwrap();
    assert_eq!(r.inserted_ids.len(), 10);
    assert_eq!(sharded.count_documents(doc! {}).await.unwrap(), 0);
    s.commit_transaction().await.unwrap();
    assert_eq!(sharded.count_documents(doc! {}).await.unwrap(), 10);
    for i in [ia, ib] {
        assert!(c.shards[i].service().count_documents("txn", "sharded") > 0);
    }

    sharded.insert_one(doc! {"_id": b}).await.unwrap();
    s.start_transaction().await.unwrap();
    let e = sharded
        .insert_many([doc! {"_id": a}, doc! {"_id": b}])
        .session(&mut s)
        .await
        .unwrap_err();
    match *e.kind {
        mongodb::error::ErrorKind::InsertMany(ref f) => {
            let we = f.write_errors.as_ref().unwrap();
            assert_eq!(we.len(), 1, "{e}");
            assert_eq!((we[0].index, we[0].code), (1, 11000), "{e}");
        }
        _ => panic!("{e}"),
    }
    let _ = s.abort_transaction().await;
    assert_eq!(sharded.count_documents(doc! {"_id": a}).await.unwrap(), 0);
    assert_eq!(open_on(&c), (0, 0));
    c.stop().await;
}

/// Every `_id` of `c` as transaction `s` sees it, read with a `find` across both shards in
/// batches of `batch` (each shard's cursor continued with getMores inside the transaction).
async fn ids_in(c: &Collection<Document>, s: &mut mongodb::ClientSession, batch: u32) -> Vec<Bson> {
    let mut cursor = c
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .batch_size(batch)
        .session(&mut *s)
        .await
        .unwrap();
    let mut out = Vec::new();
    while cursor.advance(&mut *s).await.unwrap() {
        out.push(
            cursor
                .deserialize_current()
                .unwrap()
                .get("_id")
                .cloned()
                .unwrap(),
        );
    }
    out
}

/// Reads that need both shards at once run inside a transaction: a scatter `find` (with
/// getMores), `countDocuments`' aggregate and `distinct` each reach both shards as
/// statements of the transaction, see its own uncommitted writes on both and not another
/// session's; an `update_many` and a `delete_many` without the shard key change documents on
/// both shards; and the commit (two-phase: both shards wrote) applies the writes; a transaction
/// whose first statement is a scatter read, aborted, leaves nothing; one shard's error comes
/// back with its labels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scatter_statements_run_inside_a_transaction() {
    let (c, cl, _, _, ia, ib) = two_shards().await;
    let sharded = coll(&cl, "sharded");
    // Another session's transaction writes on both shards and stays open.
    let mut other = cl.start_session().await.unwrap();
    other.start_transaction().await.unwrap();
    let theirs: Vec<Document> = (500..510).map(|i| doc! {"_id": i}).collect();
    sharded
        .insert_many(theirs)
        .session(&mut other)
        .await
        .unwrap();

    let mut s = cl.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    let ours: Vec<Document> = (300..310).map(|i| doc! {"_id": i}).collect();
    sharded.insert_many(ours).session(&mut s).await.unwrap();
    for i in [ia, ib] {
        assert!(c.shards[i].service().open_transactions() >= 2);
    }
    let expected: Vec<Bson> = (300..310).map(Bson::Int32).collect();
    // A batch of 2: each shard's cursor holds more, fetched by getMores in the transaction.
    assert_eq!(ids_in(&sharded, &mut s, 2).await, expected);
    assert_eq!(
        sharded
            .count_documents(doc! {})
            .session(&mut s)
            .await
            .unwrap(),
        10
    );
    let n = sharded
        .count_documents(doc! {"_id": {"$gte": 305}})
        .session(&mut s)
        .await
        .unwrap();
    assert_eq!(n, 5);
    let mut values = sharded
        .distinct("_id", doc! {})
        .session(&mut s)
        .await
        .unwrap();
    values.sort_by_key(|v| v.as_i32());
    assert_eq!(values, expected);
    // An update of many documents without the shard key changes them on both shards.
    let r = sharded
        .update_many(doc! {}, doc! {"$set": {"w": 1}})
        .session(&mut s)
        .await
        .unwrap();
    assert_eq!((r.matched_count, r.modified_count), (10, 10));
    // Nobody outside sees either transaction's writes.
    assert_eq!(sharded.count_documents(doc! {}).await.unwrap(), 0);
    let prepares = c.shard_command_total("prepareTransaction");
    s.commit_transaction().await.unwrap();
    assert_eq!(c.shard_command_total("prepareTransaction"), prepares + 2);
    assert_eq!(ids(&sharded).await, expected);
    assert_eq!(sharded.count_documents(doc! {"w": 1}).await.unwrap(), 10);
    other.abort_transaction().await.unwrap();
    assert_eq!(sharded.count_documents(doc! {}).await.unwrap(), 10);

    // A transaction that starts with a scatter read: both shards join it with its snapshot.
    s.start_transaction().await.unwrap();
    assert_eq!(ids_in(&sharded, &mut s, 3).await, expected);
    sharded
        .insert_many((600..604).map(|i| doc! {"_id": i}))
        .session(&mut s)
        .await
        .unwrap();
    let r = sharded
        .delete_many(doc! {"_id": {"$lt": 302}})
        .session(&mut s)
        .await
        .unwrap();
    assert_eq!(r.deleted_count, 2);
    assert_eq!(
        sharded
            .count_documents(doc! {})
            .session(&mut s)
            .await
            .unwrap(),
        12
    );
    s.abort_transaction().await.unwrap();
    assert_eq!(ids(&sharded).await, expected);
    assert_eq!(open_on(&c), (0, 0));

    // One shard's error reaches the client with the shard's labels.
    c.direct(ia)
        .await
        .database("admin")
        .run_command(doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["find"], "errorCode": 112}})
        .await
        .unwrap();
    s.start_transaction().await.unwrap();
    let e = sharded.find(doc! {}).session(&mut s).await.unwrap_err();
    assert_eq!(code(&e), 112, "{e}");
    assert!(e.contains_label(LABEL), "{e}");
    let _ = s.abort_transaction().await;
    assert_eq!(open_on(&c), (0, 0));
    c.stop().await;
}
