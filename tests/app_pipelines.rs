//! The aggregation stages and expressions applications use, through the router with the stock
//! Rust driver, on a sharded collection and on an unsharded copy of it (which one embedded
//! shard runs whole: the oracle). Each pipeline must give the same documents on both (sorted
//! where the pipeline leaves the order open).

mod common;

use bson::{doc, Bson, Document};
use common::{error_code, TestCluster};

async fn setup() -> (TestCluster, mongodb::Client) {
    let c = TestCluster::start(3, &[("shop.orders", doc! {"_id": "hashed"})]).await;
    let cl = common::driver(c.addr(), "").await;
    let db = cl.database("shop");
    let orders: Vec<Document> = (0..90)
        .map(|i| {
            doc! {
                "_id": i,
                "cust": i % 7,
                "qty": (i * 13) % 17,
                "day": bson::DateTime::from_millis(1_700_000_000_000 + (i as i64 % 10) * 86_400_000),
                "tags": if i % 3 == 0 { vec!["a", "b"] } else { vec!["c"] },
            }
        })
        .collect();
    for coll in ["orders", "orders_plain"] {
        db.collection::<Document>(coll)
            .insert_many(orders.clone())
            .await
            .unwrap();
    }
    let customers: Vec<Document> = (0..7)
        .map(|i| doc! {"_id": i, "name": format!("c{i}"), "tier": i % 2})
        .collect();
    db.collection::<Document>("customers")
        .insert_many(customers)
        .await
        .unwrap();
    (c, cl)
}

async fn run(cl: &mongodb::Client, coll: &str, pipeline: &[Document]) -> Vec<Document> {
    let mut cursor = cl
        .database("shop")
        .collection::<Document>(coll)
        .aggregate(pipeline.to_vec())
        .await
        .unwrap_or_else(|e| panic!("{coll} {pipeline:?}: {e}"));
    let mut out = Vec::new();
    while cursor.advance().await.unwrap() {
        out.push(cursor.deserialize_current().unwrap());
    }
    out
}

/// Sorts documents by their canonical extended JSON, for pipelines whose order is open.
fn sorted(mut v: Vec<Document>) -> Vec<Document> {
    v.sort_by_key(|d| {
        Bson::Document(d.clone())
            .into_canonical_extjson()
            .to_string()
    });
    v
}

#[tokio::test]
async fn sharded_pipelines_match_one_shard() {
    let (_c, cl) = setup().await;
    let pipelines: Vec<(bool, Vec<Document>)> = vec![
        // (order defined by the pipeline, pipeline)
        (
            true,
            vec![
                doc! {"$match": {"qty": {"$gt": 10}}},
                doc! {"$lookup": {"from": "customers", "localField": "cust", "foreignField": "_id", "as": "c"}},
                doc! {"$sort": {"_id": 1}},
            ],
        ),
        (
            true,
            vec![
                doc! {"$lookup": {"from": "customers", "let": {"c": "$cust", "q": "$qty"}, "pipeline": [
                    {"$match": {"$expr": {"$and": [{"$eq": ["$_id", "$$c"]}, {"$lt": ["$$q", 5]}]}}},
                    {"$project": {"name": 1, "_id": 0, "at": {"$cond": [{"$lte": ["$$NOW", "$$NOW"]}, "now", "never"]}}},
                ], "as": "who"}},
                doc! {"$sort": {"_id": 1}},
                doc! {"$limit": 20},
            ],
        ),
        (
            false,
            vec![doc! {"$facet": {
                "byCust": [{"$sortByCount": "$cust"}, {"$sort": {"_id": 1}}],
                "total": [{"$count": "n"}],
                "big": [{"$match": {"qty": {"$gte": 15}}}, {"$sort": {"_id": 1}}, {"$project": {"_id": 1}}],
            }}],
        ),
        (
            true,
            vec![
                doc! {"$bucket": {"groupBy": "$qty", "boundaries": [0, 5, 10, 20], "default": "other", "output": {"n": {"$sum": 1}, "ids": {"$push": "$_id"}}}},
                doc! {"$project": {"n": 1, "ids": {"$size": "$ids"}}},
            ],
        ),
        (
            false,
            vec![
                doc! {"$replaceRoot": {"newRoot": {"k": "$cust", "t": {"$size": "$tags"}, "doc": "$$ROOT"}}},
            ],
        ),
        (
            false,
            vec![doc! {"$replaceWith": {"$mergeObjects": [{"q": "$qty"}, {"id": "$_id"}]}}],
        ),
        (
            false,
            vec![
                doc! {"$unionWith": {"coll": "customers", "pipeline": [{"$project": {"name": 1}}]}},
            ],
        ),
        (
            true,
            vec![
                doc! {"$setWindowFields": {"partitionBy": "$cust", "sortBy": {"_id": 1}, "output": {
                    "running": {"$sum": "$qty", "window": {"documents": ["unbounded", "current"]}},
                    "pair": {"$sum": "$qty", "window": {"documents": [-1, 0]}},
                    "rank": {"$rank": {}},
                    "prev": {"$shift": {"output": "$_id", "by": -1, "default": -1}},
                    "avgAll": {"$avg": "$qty"},
                }}},
                doc! {"$sort": {"_id": 1}},
            ],
        ),
        (
            true,
            vec![
                doc! {"$match": {"$expr": {"$gt": [{"$multiply": ["$qty", 2]}, "$cust"]}}},
                doc! {"$project": {"m": {"$map": {"input": "$tags", "as": "t", "in": {"$concat": ["$$t", "!"]}}},
                    "f": {"$filter": {"input": [1, 2, 3, 4], "cond": {"$gt": ["$$this", 2]}}},
                    "r": {"$reduce": {"input": [1, 2, 3], "initialValue": 0, "in": {"$add": ["$$value", "$$this"]}}},
                    "d": {"$dateToString": {"date": "$day", "format": "%Y-%m-%d"}},
                    "s": {"$switch": {"branches": [{"case": {"$gt": ["$qty", 8]}, "then": "hi"}], "default": "lo"}},
                    "l": {"$let": {"vars": {"x": 3}, "in": {"$add": ["$$x", "$qty"]}}},
                    "year": {"$year": "$day"},
                }},
                doc! {"$sort": {"_id": 1}},
            ],
        ),
    ];
    for (ordered, p) in pipelines {
        let sharded = run(&cl, "orders", &p).await;
        let plain = run(&cl, "orders_plain", &p).await;
        assert!(!plain.is_empty(), "{p:?}");
        if ordered {
            assert_eq!(sharded, plain, "{p:?}");
        } else {
            assert_eq!(sorted(sharded), sorted(plain), "{p:?}");
        }
    }
    // Spot checks against the data itself.
    let r = run(&cl, "orders_plain", &[doc! {"$lookup": {"from": "customers", "localField": "cust", "foreignField": "_id", "as": "c"}}, doc! {"$match": {"_id": 8}}]).await;
    assert_eq!(r[0].get_array("c").unwrap().len(), 1);
    assert_eq!(
        r[0].get_array("c").unwrap()[0]
            .as_document()
            .unwrap()
            .get_str("name")
            .unwrap(),
        "c1"
    );
    for coll in ["orders", "orders_plain"] {
        let s = run(&cl, coll, &[doc! {"$sample": {"size": 5}}]).await;
        assert_eq!(s.len(), 5);
        let ids: std::collections::BTreeSet<i32> =
            s.iter().map(|d| d.get_i32("_id").unwrap()).collect();
        assert_eq!(ids.len(), 5, "no document twice");
    }
}

#[tokio::test]
async fn out_and_merge_write_the_target() {
    let (_c, cl) = setup().await;
    let db = cl.database("shop");
    for coll in ["orders", "orders_plain"] {
        let target = format!("totals_{coll}");
        let r = run(
            &cl,
            coll,
            &[
                doc! {"$group": {"_id": "$cust", "q": {"$sum": "$qty"}}},
                doc! {"$out": &target},
            ],
        )
        .await;
        assert!(r.is_empty());
        let t = db.collection::<Document>(&target);
        assert_eq!(t.count_documents(doc! {}).await.unwrap(), 7, "{coll}");
        // $merge: keep the totals, add a field from the customers.
        run(&cl, "customers", &[
            doc! {"$project": {"name": 1}},
            doc! {"$merge": {"into": &target, "whenMatched": "merge", "whenNotMatched": "discard"}},
        ]).await;
        let one = t.find_one(doc! {"_id": 3}).await.unwrap().unwrap();
        assert_eq!(one.get_str("name").unwrap(), "c3");
        assert!(one.contains_key("q"));
        let e = db
            .collection::<Document>(coll)
            .aggregate(vec![
                doc! {"$project": {"_id": 1}},
                doc! {"$merge": {"into": &target, "whenMatched": "fail"}},
            ])
            .await
            .unwrap_err();
        assert_eq!(error_code(&e), 11000, "{e}");
        let e = db
            .collection::<Document>(coll)
            .aggregate(vec![doc! {"$out": "x"}, doc! {"$match": {}}])
            .await
            .unwrap_err();
        assert_eq!(error_code(&e), 40601, "{e}");
    }
    // $out into a sharded collection is refused as mongos refuses it.
    for source in ["orders", "orders_plain"] {
        let e = db
            .collection::<Document>(source)
            .aggregate(vec![doc! {"$out": "orders"}])
            .await
            .unwrap_err();
        assert_eq!(error_code(&e), 28769, "{e}");
    }
    assert_eq!(
        db.collection::<Document>("orders")
            .count_documents(doc! {})
            .await
            .unwrap(),
        90
    );
}

#[tokio::test]
async fn expr_and_let_in_find_and_bad_stages() {
    let (_c, cl) = setup().await;
    let db = cl.database("shop");
    for coll in ["orders", "orders_plain"] {
        let r = db
            .run_command(doc! {"find": coll, "filter": {"$expr": {"$eq": ["$qty", "$$want"]}}, "let": {"want": 4}})
            .await
            .unwrap();
        let batch = r
            .get_document("cursor")
            .unwrap()
            .get_array("firstBatch")
            .unwrap();
        let expected = (0..90).filter(|i| (i * 13) % 17 == 4).count();
        assert_eq!(batch.len(), expected, "{coll}");
        let e = db
            .collection::<Document>(coll)
            .aggregate(vec![
                doc! {"$bucket": {"groupBy": "$qty", "boundaries": [5, 1]}},
            ])
            .await
            .unwrap_err();
        assert_eq!(error_code(&e), 40194, "{e}");
        let e = db
            .collection::<Document>(coll)
            .aggregate(vec![doc! {"$project": {"x": "$$nope"}}])
            .await
            .unwrap_err();
        assert_eq!(error_code(&e), 17276, "{e}");
    }
}
