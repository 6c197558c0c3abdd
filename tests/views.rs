//! Views through the stock Rust driver, on one embedded shard and through the router (the view
//! and its source are unsharded: they live on the database's primary shard, where mongos sends
//! their commands too): `create` with `viewOn`, reads through the view's pipeline (`find` with
//! filter, sort, skip, limit and projection; `count` as `estimatedDocumentCount` sends it;
//! `distinct`; `aggregate`; `$lookup` from a view), chains of views, `listCollections`,
//! redefinition with `collMod`, `drop`, and mongod's errors: writes and index commands on a view
//! (166), a cycle (5), a bad definition.

mod common;

use bson::{doc, Bson, Document};
use common::TestCluster;
use mongodb::Client;
use sluice::embedded::{EmbeddedShard, ShardOptions};

async fn scenario(cl: &Client, label: &str) {
    let db = cl.database("views");
    let base = db.collection::<Document>("people");
    base.insert_many(
        (1..=10).map(
            |i| doc! {"_id": i, "age": 10 * i, "team": if i % 2 == 0 { "even" } else { "odd" }},
        ),
    )
    .await
    .unwrap();
    db.run_command(doc! {"create": "adults", "viewOn": "people", "pipeline": [{"$match": {"age": {"$gte": 30}}}, {"$project": {"team": 1, "age": 1}}]})
        .await
        .unwrap();
    let adults = db.collection::<Document>("adults");

    // find with everything a find can carry, through the view's pipeline.
    let found: Vec<Document> = common::all(
        adults
            .find(doc! {"team": "even"})
            .sort(doc! {"age": -1})
            .skip(1)
            .limit(2)
            .projection(doc! {"age": 1})
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        found,
        vec![doc! {"_id": 8, "age": 80}, doc! {"_id": 6, "age": 60}],
        "{label}: find"
    );
    assert_eq!(
        adults.estimated_document_count().await.unwrap(),
        8,
        "{label}: count"
    );
    assert_eq!(
        adults.count_documents(doc! {"team": "odd"}).await.unwrap(),
        4,
        "{label}: countDocuments"
    );
    let mut teams = adults.distinct("team", doc! {}).await.unwrap();
    teams.sort_by_key(|b| b.to_string());
    assert_eq!(
        teams,
        vec![Bson::from("even"), Bson::from("odd")],
        "{label}: distinct"
    );
    let grouped: Vec<Document> = common::all(
        adults
            .aggregate(vec![
                doc! {"$group": {"_id": "$team", "n": {"$sum": 1}}},
                doc! {"$sort": {"_id": 1}},
            ])
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        grouped,
        vec![doc! {"_id": "even", "n": 4}, doc! {"_id": "odd", "n": 4}],
        "{label}: aggregate"
    );

    // A view on a view, and a view read by $lookup.
    db.run_command(
        doc! {"create": "old", "viewOn": "adults", "pipeline": [{"$match": {"age": {"$gte": 90}}}]},
    )
    .await
    .unwrap();
    let old = db.collection::<Document>("old");
    assert_eq!(
        old.estimated_document_count().await.unwrap(),
        2,
        "{label}: chain"
    );
    let joined: Vec<Document> = common::all(
        base.aggregate(vec![
            doc! {"$match": {"_id": 10}},
            doc! {"$lookup": {"from": "old", "localField": "_id", "foreignField": "_id", "as": "o"}},
            doc! {"$project": {"n": {"$size": "$o"}}},
        ])
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(
        joined,
        vec![doc! {"_id": 10, "n": 1}],
        "{label}: $lookup from a view"
    );

    // The view follows its source.
    base.insert_one(doc! {"_id": 11, "age": 110, "team": "odd"})
        .await
        .unwrap();
    assert_eq!(
        old.estimated_document_count().await.unwrap(),
        3,
        "{label}: live"
    );

    // listCollections lists views as views.
    let specs: Vec<Document> = common::all(
        db.run_cursor_command(doc! {"listCollections": 1, "filter": {"type": "view"}})
            .await
            .unwrap(),
    )
    .await;
    let mut names: Vec<&str> = specs.iter().map(|s| s.get_str("name").unwrap()).collect();
    names.sort();
    assert_eq!(names, vec!["adults", "old"], "{label}: listCollections");
    let adults_spec = specs
        .iter()
        .find(|s| s.get_str("name").ok() == Some("adults"))
        .unwrap();
    assert_eq!(
        adults_spec
            .get_document("options")
            .unwrap()
            .get_str("viewOn")
            .unwrap(),
        "people"
    );
    assert!(adults_spec
        .get_document("info")
        .unwrap()
        .get_bool("readOnly")
        .unwrap());

    // Writes and index commands get 166.
    let code = |e: mongodb::error::Error| common::command_code(&e);
    for cmd in [
        doc! {"insert": "adults", "documents": [{"_id": 99}]},
        doc! {"update": "adults", "updates": [{"q": {}, "u": {"$set": {"x": 1}}}]},
        doc! {"delete": "adults", "deletes": [{"q": {}, "limit": 0}]},
        doc! {"findAndModify": "adults", "query": {}, "remove": true},
        doc! {"createIndexes": "adults", "indexes": [{"key": {"age": 1}, "name": "age_1"}]},
    ] {
        let e = db.run_command(cmd.clone()).await.unwrap_err();
        assert_eq!(code(e), 166, "{label}: {cmd}");
    }
    assert_eq!(
        base.count_documents(doc! {}).await.unwrap(),
        11,
        "{label}: nothing written"
    );

    // A cycle, a bad definition, a name taken.
    let e = db
        .run_command(doc! {"collMod": "adults", "viewOn": "old"})
        .await
        .unwrap_err();
    assert_eq!(code(e), 5, "{label}: cycle");
    let e = db
        .run_command(doc! {"create": "bad", "viewOn": "people", "pipeline": [{"$out": "x"}]})
        .await
        .unwrap_err();
    assert_eq!(code(e), 167, "{label}: $out in a view");
    let e = db
        .run_command(doc! {"create": "adults", "viewOn": "people"})
        .await
        .unwrap_err();
    assert_eq!(code(e), 48, "{label}: exists");

    // Redefine, then drop.
    db.run_command(doc! {"collMod": "adults", "viewOn": "people", "pipeline": [{"$match": {"age": {"$lt": 30}}}]})
        .await
        .unwrap();
    assert_eq!(
        adults.estimated_document_count().await.unwrap(),
        2,
        "{label}: collMod"
    );
    old.drop().await.unwrap();
    adults.drop().await.unwrap();
    let left: Vec<String> = db.list_collection_names().await.unwrap();
    assert_eq!(left, vec!["people".to_string()], "{label}: dropped");
    db.drop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_on_one_shard() {
    let s = EmbeddedShard::start("127.0.0.1:0", ShardOptions::for_tests())
        .await
        .unwrap();
    let cl = common::direct(s.local_addr()).await;
    scenario(&cl, "shard").await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_through_the_router() {
    let c = TestCluster::start(2, &[]).await;
    let cl = common::driver(c.addr(), "").await;
    scenario(&cl, "router").await;
    c.stop().await;
}

/// A view whose source is sharded: the primary shard answers 169 with the resolved view and
/// the router runs the read on the sharded source, in the shape of the command sent; a cursor
/// on the view continues with `getMore` under the view's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_on_a_sharded_collection() {
    let c = TestCluster::start(3, &[("views.people", doc! {"_id": "hashed"})]).await;
    let cl = common::driver(c.addr(), "").await;
    let db = cl.database("views");
    let base = db.collection::<Document>("people");
    base.insert_many(
        (1..=300).map(
            |i| doc! {"_id": i, "age": i % 100, "team": if i % 2 == 0 { "even" } else { "odd" }},
        ),
    )
    .await
    .unwrap();
    assert!(
        (0..3)
            .filter(|i| c.shards[*i].service().count_documents("views", "people") > 0)
            .count()
            > 1,
        "the source is spread over the shards"
    );
    db.run_command(doc! {"create": "adults", "viewOn": "people", "pipeline": [{"$match": {"age": {"$gte": 50}}}]})
        .await
        .unwrap();
    let adults = db.collection::<Document>("adults");
    assert_eq!(adults.estimated_document_count().await.unwrap(), 150);
    assert_eq!(
        adults.count_documents(doc! {"team": "odd"}).await.unwrap(),
        75
    );
    let mut teams = adults.distinct("team", doc! {}).await.unwrap();
    teams.sort_by_key(|b| b.to_string());
    assert_eq!(teams, vec![Bson::from("even"), Bson::from("odd")]);
    // A find whose results take several batches: getMore names the view.
    let found = common::all(
        adults
            .find(doc! {"team": "even"})
            .sort(doc! {"_id": 1})
            .batch_size(10)
            .projection(doc! {"age": 1})
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(found.len(), 75);
    assert_eq!(found[0], doc! {"_id": 50, "age": 50});
    assert!(found
        .windows(2)
        .all(|w| w[0].get_i32("_id").unwrap() < w[1].get_i32("_id").unwrap()));
    let grouped = common::all(
        adults
            .aggregate(vec![
                doc! {"$group": {"_id": "$team", "n": {"$sum": 1}}},
                doc! {"$sort": {"_id": 1}},
            ])
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        grouped,
        vec![doc! {"_id": "even", "n": 75}, doc! {"_id": "odd", "n": 75}]
    );
    c.stop().await;
}
