//! Reads through the router with the stock Rust driver, on a sharded and an unsharded
//! collection: results checked against what the data implies.

mod common;

use std::time::Duration;

use bson::{doc, Bson, Document};
use common::{all, error_code, TestCluster};
use mongodb::options::FindOptions;

async fn setup() -> (TestCluster, mongodb::Client) {
    let c = TestCluster::start(3, &[("shop.items", doc! {"_id": "hashed"})]).await;
    let cl = common::driver(c.addr(), "").await;
    for coll in ["items", "plain"] {
        let docs: Vec<Document> = (0..200)
            .map(|i| doc! {"_id": i, "g": i % 4, "v": i * 3 % 50, "name": format!("n{:03}", i)})
            .collect();
        cl.database("shop")
            .collection::<Document>(coll)
            .insert_many(docs)
            .await
            .unwrap();
    }
    (c, cl)
}

#[tokio::test]
async fn find_sorts_skips_limits_and_projects_like_one_collection() {
    let (c, cl) = setup().await;
    for coll in ["items", "plain"] {
        let col = cl.database("shop").collection::<Document>(coll);
        // Expected from the data: sort by v desc then _id asc, skip 7, limit 25.
        let mut expected: Vec<(i32, i32)> = (0..200).map(|i| (i * 3 % 50, i)).collect();
        expected.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let expected: Vec<i32> = expected
            .into_iter()
            .skip(7)
            .take(25)
            .map(|(_, i)| i)
            .collect();
        let got = all(col
            .find(doc! {"g": {"$in": [0, 1, 2, 3]}})
            .sort(doc! {"v": -1, "_id": 1})
            .skip(7)
            .limit(25)
            .projection(doc! {"name": 1})
            .batch_size(4)
            .await
            .unwrap())
        .await;
        let ids: Vec<i32> = got.iter().map(|d| d.get_i32("_id").unwrap()).collect();
        assert_eq!(ids, expected, "{coll}");
        assert!(
            got.iter()
                .all(|d| d.keys().count() == 2 && d.contains_key("name")),
            "{coll}: projection applied"
        );
        // Everything, paged in small batches.
        let every = all(col.find(doc! {}).batch_size(7).await.unwrap()).await;
        assert_eq!(every.len(), 200, "{coll}");
        // singleBatch: a negative limit.
        let opts = FindOptions::builder().limit(-3).build();
        let few = all(col.find(doc! {"g": 2}).with_options(opts).await.unwrap()).await;
        assert_eq!(few.len(), 3);
    }
    c.stop().await;
}

#[tokio::test]
async fn targeted_reads_go_to_one_shard() {
    let (c, cl) = setup().await;
    let db = cl.database("shop");
    let (stage, shards) =
        common::explain_shards(&db, doc! {"find": "items", "filter": {"_id": 42}}).await;
    assert_eq!(stage, "SINGLE_SHARD");
    assert_eq!(shards.len(), 1, "{shards:?}");
    let shard = shards[0].clone();
    let owner = c.cluster.routing.get("shop.items").unwrap().unwrap();
    let key =
        sluice::routing::ShardKey(vec![Bson::Int64(sluice::routing::hash64(&Bson::Int32(42)))]);
    assert_eq!(owner.shard_for(&key).unwrap(), shard);
    let one = db
        .collection::<Document>("items")
        .find_one(doc! {"_id": 42})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(one.get_i32("v").unwrap(), 42 * 3 % 50);
    let (stage, shards) =
        common::explain_shards(&db, doc! {"find": "items", "filter": {"g": 1}}).await;
    assert_eq!(stage, "SHARD_MERGE");
    assert_eq!(shards.len(), 3, "{shards:?}");
    c.stop().await;
}

#[tokio::test]
async fn aggregation_count_and_distinct_merge_across_shards() {
    let (c, cl) = setup().await;
    for coll in ["items", "plain"] {
        let col = cl.database("shop").collection::<Document>(coll);
        assert_eq!(
            col.count_documents(doc! {"g": 1}).await.unwrap(),
            50,
            "{coll}"
        );
        assert_eq!(col.estimated_document_count().await.unwrap(), 200);
        let groups = all(col
            .aggregate(vec![
                doc! {"$match": {"v": {"$gte": 10}}},
                doc! {"$group": {"_id": "$g", "n": {"$sum": 1}, "s": {"$sum": "$v"}, "mn": {"$min": "$v"}, "mx": {"$max": "$v"}, "avg": {"$avg": "$v"}, "c": {"$count": {}}}},
                doc! {"$sort": {"_id": 1}},
            ])
            .await
            .unwrap())
        .await;
        assert_eq!(groups.len(), 4);
        for g in &groups {
            let key = g.get_i32("_id").unwrap();
            let vals: Vec<i32> = (0..200)
                .filter(|i| i % 4 == key)
                .map(|i| i * 3 % 50)
                .filter(|v| *v >= 10)
                .collect();
            assert_eq!(g.get_i32("n").unwrap() as usize, vals.len(), "{coll} {g}");
            assert_eq!(g.get_i32("s").unwrap(), vals.iter().sum::<i32>());
            assert_eq!(g.get_i32("mn").unwrap(), *vals.iter().min().unwrap());
            assert_eq!(g.get_i32("mx").unwrap(), *vals.iter().max().unwrap());
            assert_eq!(g.get_i32("c").unwrap() as usize, vals.len());
            let avg = vals.iter().sum::<i32>() as f64 / vals.len() as f64;
            assert!((g.get_f64("avg").unwrap() - avg).abs() < 1e-9);
        }
        let top = all(col
            .aggregate(vec![
                doc! {"$sort": {"v": -1, "_id": 1}},
                doc! {"$limit": 3},
                doc! {"$project": {"_id": 1}},
            ])
            .await
            .unwrap())
        .await;
        let ids: Vec<i32> = top.iter().map(|d| d.get_i32("_id").unwrap()).collect();
        assert_eq!(ids, [33, 83, 133], "{coll}: v = 49 for _id 33, 83, 133");
        let counted = all(col
            .aggregate(vec![doc! {"$match": {"g": 3}}, doc! {"$count": "n"}])
            .await
            .unwrap())
        .await;
        assert_eq!(counted, vec![doc! {"n": 50}]);
        let mut distinct: Vec<i32> = col
            .distinct("g", doc! {})
            .await
            .unwrap()
            .iter()
            .map(|v| v.as_i32().unwrap())
            .collect();
        distinct.sort();
        assert_eq!(distinct, [0, 1, 2, 3]);
        let e = col
            .aggregate(vec![doc! {"$lookup": {"from": "x", "as": "y"}}])
            .await
            .unwrap_err();
        assert!(e.to_string().contains("$lookup"), "{e}");
    }
    c.stop().await;
}

#[tokio::test]
async fn cursors_belong_to_their_connection_and_expire() {
    let (c, _cl) = setup().await;
    let mut a = common::Raw::connect(c.addr()).await;
    let mut b = common::Raw::connect(c.addr()).await;
    let r = a
        .command(&doc! {"find": "items", "batchSize": 5, "$db": "shop"})
        .await;
    let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    assert_ne!(id, 0);
    let stolen = b
        .command(&doc! {"getMore": id, "collection": "items", "$db": "shop"})
        .await;
    assert_eq!(
        stolen.get_i32("code").unwrap(),
        43,
        "another connection cannot read it"
    );
    let more = a
        .command(&doc! {"getMore": id, "collection": "items", "batchSize": 5, "$db": "shop"})
        .await;
    assert_eq!(
        more.get_document("cursor")
            .unwrap()
            .get_array("nextBatch")
            .unwrap()
            .len(),
        5
    );
    let killed = a
        .command(&doc! {"killCursors": "items", "cursors": [id], "$db": "shop"})
        .await;
    assert_eq!(killed.get_array("cursorsKilled").unwrap().len(), 1);
    let gone = a
        .command(&doc! {"getMore": id, "collection": "items", "$db": "shop"})
        .await;
    assert_eq!(gone.get_i32("code").unwrap(), 43);

    c.sharded
        .cursors
        .set_idle_timeout(Duration::from_millis(100));
    let r = a
        .command(&doc! {"find": "items", "batchSize": 5, "$db": "shop"})
        .await;
    let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let reaped = a
        .command(&doc! {"getMore": id, "collection": "items", "$db": "shop"})
        .await;
    assert_eq!(
        reaped.get_i32("code").unwrap(),
        43,
        "idle cursors are reaped"
    );
    assert!(c.sharded.cursors.is_empty());
    c.stop().await;
}

#[tokio::test]
async fn a_find_the_shards_answer_in_one_batch_registers_no_router_cursor() {
    let (c, cl) = setup().await;
    let col = cl.database("shop").collection::<Document>("items");
    // The stock driver's `find_one({_id})`: one shard, one document, its cursor closed.
    let one = col.find_one(doc! {"_id": 42}).await.unwrap().unwrap();
    assert_eq!(one.get_i32("v").unwrap(), 42 * 3 % 50);
    assert!(
        c.sharded.cursors.is_empty(),
        "find_one left a router cursor"
    );
    // Every shard's results in its first batch (50 documents over 3 shards): id 0, no cursor.
    let mut a = common::Raw::connect(c.addr()).await;
    let r = a
        .command(&doc! {"find": "items", "filter": {"g": 2}, "$db": "shop"})
        .await;
    let cursor = r.get_document("cursor").unwrap();
    assert_eq!(cursor.get_i64("id").unwrap(), 0);
    assert_eq!(cursor.get_array("firstBatch").unwrap().len(), 50);
    assert!(
        c.sharded.cursors.is_empty(),
        "an exhausted find left a router cursor"
    );
    // A shard that keeps its cursor open (more than a batch of 5 left): the router keeps one.
    let r = a
        .command(&doc! {"find": "items", "filter": {"g": 2}, "batchSize": 5, "$db": "shop"})
        .await;
    let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
    assert_ne!(id, 0);
    assert_eq!(c.sharded.cursors.len(), 1);
    let rest = a
        .command(&doc! {"getMore": id, "collection": "items", "$db": "shop"})
        .await;
    let rest = rest.get_document("cursor").unwrap();
    assert_eq!(rest.get_array("nextBatch").unwrap().len(), 45);
    assert_eq!(rest.get_i64("id").unwrap(), 0);
    assert!(
        c.sharded.cursors.is_empty(),
        "the exhausted cursor is forgotten"
    );
    c.stop().await;
}

#[tokio::test]
async fn a_lost_shard_fails_cleanly_or_is_skipped_with_allow_partial_results() {
    let (mut c, cl) = setup().await;
    let db = cl.database("shop");
    let lost = c.shards.remove(1);
    let lost_name = lost.service().name().to_string();
    let on_lost = lost.service().count_documents("shop", "items");
    lost.shutdown().await;
    let e = db
        .run_command(doc! {"find": "items", "filter": {}})
        .await
        .unwrap_err();
    assert_eq!(error_code(&e), 6, "HostUnreachable");
    assert!(e.to_string().contains(&lost_name), "{e}");
    let r = db
        .run_command(
            doc! {"find": "items", "filter": {}, "allowPartialResults": true, "batchSize": 1000},
        )
        .await
        .unwrap();
    let cursor = r.get_document("cursor").unwrap();
    assert!(cursor.get_bool("partialResultsReturned").unwrap());
    assert_eq!(cursor.get_array("firstBatch").unwrap().len(), 200 - on_lost);
    c.stop().await;
}

#[tokio::test]
async fn transaction_statements_reach_the_shards_they_target() {
    let (c, cl) = setup().await;
    let db = cl.database("shop");
    let lsid = doc! {"id": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![3; 16] })};
    // Statements that target one shard pass through to it and run there.
    db.run_command(doc! {"find": "items", "filter": {"_id": 5}, "lsid": lsid.clone(), "txnNumber": 1i64, "startTransaction": true, "autocommit": false})
        .await
        .unwrap();
    // A read that needs several shards at once runs on each of them, each joining the
    // transaction, and is merged as outside transactions.
    let r = db
        .run_command(doc! {"find": "items", "filter": {"g": 1}, "lsid": lsid.clone(), "txnNumber": 2i64, "startTransaction": true, "autocommit": false})
        .await
        .unwrap();
    assert!(r.get_document("cursor").is_ok(), "{r}");
    let token = r.get_document("recoveryToken").unwrap();
    let participants = token.get_array("participants").unwrap().len();
    assert_eq!(participants, c.shards.len(), "{r}");
    // An insert whose documents live on several shards is split, one child per shard (its
    // shards join the transaction).
    let r = db
        .run_command(doc! {"insert": "items", "documents": [{"_id": 1000}, {"_id": 1001}, {"_id": 1002}, {"_id": 1003}], "lsid": lsid.clone(), "txnNumber": 3i64, "startTransaction": true, "autocommit": false})
        .await
        .unwrap();
    assert_eq!(r.get_i32("n").unwrap(), 4, "{r}");
    // Each kind of statement is targeted by what it reads the shard key from: an update or
    // delete by each statement's `q`, a count or distinct by its `query`, a findAndModify by
    // its `query`. One shard passes through (and runs); several run on each shard for a read
    // (`distinct`) or a write whose every statement may touch many documents (a delete with
    // `limit: 0`), and are refused by the router (263) for an update of one document or a
    // findAndModify.
    let one_and_many: [(Document, Document); 4] = [
        (
            doc! {"update": "items", "updates": [{"q": {"_id": 5}, "u": {"$set": {"t": 1}}}]},
            doc! {"update": "items", "updates": [{"q": {"g": 1}, "u": {"$set": {"t": 1}}}]},
        ),
        (
            doc! {"delete": "items", "deletes": [{"q": {"_id": 5}, "limit": 1}]},
            doc! {"delete": "items", "deletes": [{"q": {"g": 1}, "limit": 0}]},
        ),
        (
            doc! {"distinct": "items", "key": "v", "query": {"_id": 5}},
            doc! {"distinct": "items", "key": "v", "query": {"g": 1}},
        ),
        (
            doc! {"findAndModify": "items", "query": {"_id": 5}, "update": {"$set": {"t": 1}}},
            doc! {"findAndModify": "items", "query": {"g": 1}, "update": {"$set": {"t": 1}}},
        ),
    ];
    let mut txn = 10i64;
    for (one, many) in one_and_many {
        let runs = many.contains_key("distinct") || many.contains_key("delete");
        let refused = (!runs).then_some(263);
        for (mut cmd, code) in [(one, None), (many, refused)] {
            txn += 1;
            cmd.insert("lsid", lsid.clone());
            cmd.insert("txnNumber", txn);
            cmd.insert("startTransaction", true);
            cmd.insert("autocommit", false);
            let r = db.run_command(cmd.clone()).await;
            match code {
                None => assert!(r.is_ok(), "{cmd}: {r:?}"),
                Some(code) => assert_eq!(error_code(&r.unwrap_err()), code, "{cmd}"),
            }
        }
    }
    let r = cl
        .database("admin")
        .run_command(
            doc! {"commitTransaction": 1, "lsid": lsid, "txnNumber": 99i64, "autocommit": false},
        )
        .await
        .unwrap_err();
    assert_eq!(error_code(&r), 251);
    c.stop().await;
}

#[tokio::test]
async fn ddl_on_sharded_collections_reaches_every_shard() {
    let (c, cl) = setup().await;
    let col = cl.database("shop").collection::<Document>("items");
    col.create_index(mongodb::IndexModel::builder().keys(doc! {"g": 1}).build())
        .await
        .unwrap();
    for i in 0..c.shards.len() {
        let direct = c.direct(i).await;
        let names = direct
            .database("shop")
            .collection::<Document>("items")
            .list_index_names()
            .await
            .unwrap();
        assert!(names.contains(&"g_1".to_string()), "{names:?}");
    }
    let stats = cl
        .database("shop")
        .run_command(doc! {"collStats": "items"})
        .await
        .unwrap();
    assert!(stats.get_bool("sharded").unwrap());
    assert_eq!(stats.get_i64("count").unwrap(), 200);
    assert_eq!(stats.get_document("shards").unwrap().len(), 3);
    let dbs = cl.list_database_names().await.unwrap();
    assert!(dbs.contains(&"shop".to_string()));
    cl.database("shop").drop().await.unwrap();
    assert!(
        c.sharded.metadata.collection("shop.items").is_none(),
        "metadata dropped"
    );
    assert_eq!(c.count_on_shards("shop", "items"), 0);
    assert_eq!(c.count_on_shards("shop", "plain"), 0);
    c.stop().await;
}
