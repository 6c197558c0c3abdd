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

/// The date operators with time zones, `$dateAdd`/`$dateDiff`/`$dateTrunc`, `$regexFind`/
/// `$regexFindAll`, the N accumulators and `$top`/`$bottom`, `$bucketAuto` and `$graphLookup`:
/// the sharded collection gives what the one-shard oracle gives, and spot checks hold the
/// values mongod computes.
#[tokio::test]
async fn newer_stages_and_operators_match_one_shard() {
    let (_c, cl) = setup().await;
    let dt = |s: &str| Bson::DateTime(bson::DateTime::parse_rfc3339_str(s).unwrap());
    let pipelines: Vec<(bool, Vec<Document>)> = vec![
        (
            true,
            vec![
                doc! {"$project": {
                    "h": {"$hour": {"date": "$day", "timezone": "+05:30"}},
                    "dom": {"$dayOfMonth": {"date": "$day", "timezone": "+05:30"}},
                    "utcDom": {"$dayOfMonth": {"date": "$day", "timezone": "UTC"}},
                    "isoWeek": {"$isoWeek": "$day"},
                    "isoYear": {"$isoWeekYear": "$day"},
                    "s": {"$dateToString": {"date": "$day", "format": "%Y-%m-%d %H:%M %z %Z", "timezone": "-02:00"}},
                    "plain": {"$dateToString": {"date": "$day", "timezone": "+01:00"}},
                    "day": {"$dateTrunc": {"date": "$day", "unit": "day"}},
                    "dayPlus5": {"$dateTrunc": {"date": "$day", "unit": "day", "timezone": "+05:00"}},
                    "week": {"$dateTrunc": {"date": "$day", "unit": "week"}},
                    "weekMon": {"$dateTrunc": {"date": "$day", "unit": "week", "startOfWeek": "Monday"}},
                    "twoMonths": {"$dateTrunc": {"date": "$day", "unit": "month", "binSize": 2}},
                    "quarterHour": {"$dateTrunc": {"date": "$day", "unit": "minute", "binSize": 15}},
                    "later": {"$dateAdd": {"startDate": "$day", "unit": "month", "amount": "$qty"}},
                    "earlier": {"$dateSubtract": {"startDate": "$day", "unit": "hour", "amount": 30}},
                    "days": {"$dateDiff": {"startDate": "$day", "endDate": {"$dateAdd": {"startDate": "$day", "unit": "day", "amount": "$cust"}}, "unit": "day"}},
                    "find": {"$regexFind": {"input": {"$concat": ["order-", {"$toString": "$_id"}, "-x", {"$toString": "$cust"}]}, "regex": "(\\d+)-x(\\d)"}},
                    "all": {"$regexFindAll": {"input": {"$concat": ["a", {"$toString": "$qty"}, "b", {"$toString": "$_id"}]}, "regex": "\\d+"}},
                }},
                doc! {"$sort": {"_id": 1}},
            ],
        ),
        (
            false,
            vec![
                doc! {"$sort": {"_id": 1}},
                doc! {"$group": {
                    "_id": "$cust",
                    "top2": {"$topN": {"n": 2, "sortBy": {"qty": -1, "_id": 1}, "output": "$_id"}},
                    "top": {"$top": {"sortBy": {"qty": -1, "_id": 1}, "output": ["$_id", "$qty"]}},
                    "bottom": {"$bottom": {"sortBy": {"qty": -1, "_id": 1}, "output": "$_id"}},
                    "bottom3": {"$bottomN": {"n": 3, "sortBy": {"qty": -1, "_id": 1}, "output": "$_id"}},
                    "first3": {"$firstN": {"input": "$_id", "n": 3}},
                    "last2": {"$lastN": {"input": "$_id", "n": 2}},
                    "max3": {"$maxN": {"input": "$qty", "n": 3}},
                    "min2": {"$minN": {"input": "$qty", "n": 2}},
                    "sd": {"$stdDevPop": "$qty"},
                    "merged": {"$mergeObjects": {"$arrayToObject": [[["k", "$_id"]]]}},
                }},
            ],
        ),
        (
            true,
            vec![doc! {"$bucketAuto": {"groupBy": "$_id", "buckets": 3}}],
        ),
        (
            true,
            vec![
                doc! {"$bucketAuto": {"groupBy": {"$add": ["$_id", 1]}, "buckets": 3, "granularity": "POWERSOF2", "output": {"n": {"$sum": 1}, "q": {"$max": "$qty"}}}},
            ],
        ),
        (
            true,
            vec![doc! {"$bucketAuto": {"groupBy": "$qty", "buckets": 4, "granularity": "E12"}}],
        ),
        (
            true,
            vec![
                doc! {"$bucketAuto": {"groupBy": "$qty", "buckets": 5, "output": {"ids": {"$push": "$_id"}}}},
                doc! {"$project": {"n": {"$size": "$ids"}}},
            ],
        ),
        (
            true,
            vec![
                doc! {"$graphLookup": {"from": "orders_plain", "startWith": "$qty", "connectFromField": "cust", "connectToField": "_id", "as": "g", "maxDepth": 1, "depthField": "d"}},
                doc! {"$unwind": "$g"},
                doc! {"$project": {"to": "$g._id", "d": "$g.d"}},
                doc! {"$sort": {"_id": 1, "to": 1}},
            ],
        ),
    ];
    let mut results = Vec::new();
    for (ordered, p) in pipelines {
        let sharded = run(&cl, "orders", &p).await;
        let plain = run(&cl, "orders_plain", &p).await;
        assert!(!plain.is_empty(), "{p:?}");
        if ordered {
            assert_eq!(sharded, plain, "{p:?}");
        } else {
            assert_eq!(sorted(sharded), sorted(plain.clone()), "{p:?}");
        }
        results.push(sorted_by_id(plain));
    }
    // Order 0: 2023-11-14T22:13:20Z (a Tuesday), qty 0, cust 0.
    let o = &results[0][0];
    assert_eq!(o.get_i32("h").unwrap(), 3);
    assert_eq!(o.get_i32("dom").unwrap(), 15);
    assert_eq!(o.get_i32("utcDom").unwrap(), 14);
    assert_eq!(o.get_i32("isoWeek").unwrap(), 46);
    assert_eq!(o.get_i32("isoYear").unwrap(), 2023);
    assert_eq!(o.get_str("s").unwrap(), "2023-11-14 20:13 -0200 -120");
    assert_eq!(o.get_str("plain").unwrap(), "2023-11-14T23:13:20.000");
    assert_eq!(o.get("day"), Some(&dt("2023-11-14T00:00:00Z")));
    assert_eq!(o.get("dayPlus5"), Some(&dt("2023-11-14T19:00:00Z")));
    assert_eq!(o.get("week"), Some(&dt("2023-11-12T00:00:00Z")));
    assert_eq!(o.get("weekMon"), Some(&dt("2023-11-13T00:00:00Z")));
    assert_eq!(o.get("twoMonths"), Some(&dt("2023-11-01T00:00:00Z")));
    assert_eq!(o.get("quarterHour"), Some(&dt("2023-11-14T22:00:00Z")));
    assert_eq!(o.get("later"), Some(&dt("2023-11-14T22:13:20Z")));
    assert_eq!(o.get("earlier"), Some(&dt("2023-11-13T16:13:20Z")));
    assert_eq!(o.get_i64("days").unwrap(), 0);
    let o = &results[0][1];
    // Order 1: qty 13, cust 1, 2023-11-15T22:13:20Z; plus 13 months.
    assert_eq!(o.get("later"), Some(&dt("2024-12-15T22:13:20Z")));
    assert_eq!(o.get_i64("days").unwrap(), 1);
    assert_eq!(
        o.get_document("find").unwrap(),
        &doc! {"match": "1-x1", "idx": 6, "captures": ["1", "1"]}
    );
    assert_eq!(
        o.get_array("all").unwrap(),
        &vec![
            Bson::Document(doc! {"match": "13", "idx": 1, "captures": []}),
            Bson::Document(doc! {"match": "1", "idx": 4, "captures": []}),
        ]
    );
    // The accumulators against the data.
    let orders: Vec<(i32, i32, i32)> = (0..90).map(|i| (i, i % 7, (i * 13) % 17)).collect();
    for g in &results[1] {
        let c = g.get_i32("_id").unwrap();
        let mut mine: Vec<(i32, i32)> = orders
            .iter()
            .filter(|o| o.1 == c)
            .map(|o| (o.0, o.2))
            .collect();
        let ids = |v: &[(i32, i32)]| -> Vec<Bson> { v.iter().map(|o| Bson::Int32(o.0)).collect() };
        assert_eq!(g.get_array("first3").unwrap(), &ids(&mine[..3]));
        assert_eq!(g.get_array("last2").unwrap(), &ids(&mine[mine.len() - 2..]));
        let mut qtys: Vec<i32> = mine.iter().map(|o| o.1).collect();
        qtys.sort();
        let max3: Vec<Bson> = qtys.iter().rev().take(3).map(|q| Bson::Int32(*q)).collect();
        assert_eq!(g.get_array("max3").unwrap(), &max3);
        let min2: Vec<Bson> = qtys.iter().take(2).map(|q| Bson::Int32(*q)).collect();
        assert_eq!(g.get_array("min2").unwrap(), &min2);
        mine.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        assert_eq!(g.get_array("top2").unwrap(), &ids(&mine[..2]));
        assert_eq!(
            g.get_array("top").unwrap(),
            &vec![Bson::Int32(mine[0].0), Bson::Int32(mine[0].1)]
        );
        assert_eq!(g.get_i32("bottom").unwrap(), mine[mine.len() - 1].0);
        assert_eq!(
            g.get_array("bottom3").unwrap(),
            &ids(&mine[mine.len() - 3..])
        );
        let n = qtys.len() as f64;
        let mean = qtys.iter().map(|q| *q as f64).sum::<f64>() / n;
        let sd = (qtys.iter().map(|q| (*q as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!((g.get_f64("sd").unwrap() - sd).abs() < 1e-9);
        assert_eq!(g.get_document("merged").unwrap().len(), 1);
    }
    // $bucketAuto boundaries as mongod computes them.
    let b = &results[2];
    let bounds: Vec<(Bson, Bson, i32)> = b
        .iter()
        .map(|d| {
            let id = d.get_document("_id").unwrap();
            (
                id.get("min").unwrap().clone(),
                id.get("max").unwrap().clone(),
                d.get_i32("count").unwrap(),
            )
        })
        .collect();
    assert_eq!(
        bounds,
        vec![
            (Bson::Int32(0), Bson::Int32(30), 30),
            (Bson::Int32(30), Bson::Int32(60), 30),
            (Bson::Int32(60), Bson::Int32(89), 30),
        ]
    );
    let p2: Vec<(Bson, Bson, i32)> = results[3]
        .iter()
        .map(|d| {
            let id = d.get_document("_id").unwrap();
            (
                id.get("min").unwrap().clone(),
                id.get("max").unwrap().clone(),
                d.get_i32("n").unwrap(),
            )
        })
        .collect();
    assert_eq!(
        p2,
        vec![
            (Bson::Double(0.5), Bson::Int32(32), 31),
            (Bson::Int32(32), Bson::Int32(64), 32),
            (Bson::Int32(64), Bson::Int32(128), 27),
        ]
    );
    let total: i32 = results[4].iter().map(|d| d.get_i32("count").unwrap()).sum();
    assert_eq!(total, 90);
    let total: i32 = results[5].iter().map(|d| d.get_i32("n").unwrap()).sum();
    assert_eq!(total, 90);
    // $graphLookup from order 1 (qty 13): order 13 at depth 0, then its customer's order 6.
    let g: Vec<(i32, i64)> = results[6]
        .iter()
        .filter(|d| d.get_i32("_id").unwrap() == 1)
        .map(|d| (d.get_i32("to").unwrap(), d.get_i64("d").unwrap()))
        .collect();
    assert_eq!(g, vec![(6, 1), (13, 0)]);
}

/// Documents sorted by `_id` (the `$group` results come in no defined order).
fn sorted_by_id(mut v: Vec<Document>) -> Vec<Document> {
    v.sort_by(|a, b| bson_order(a.get("_id"), b.get("_id")));
    v
}

fn bson_order(a: Option<&Bson>, b: Option<&Bson>) -> std::cmp::Ordering {
    match (a, b) {
        (Some(Bson::Int32(x)), Some(Bson::Int32(y))) => x.cmp(y),
        _ => std::cmp::Ordering::Equal,
    }
}

/// mongod's errors for the new operators' bad arguments, and 40485 for a time zone name that
/// is neither a fixed offset nor in the time zone database.
#[tokio::test]
async fn newer_operators_refuse_bad_arguments() {
    let (_c, cl) = setup().await;
    let db = cl.database("shop");
    for (expr, code) in [
        (
            doc! {"$hour": {"date": "$day", "timezone": "Mars/Olympus"}},
            40485,
        ),
        (doc! {"$hour": {"date": "$day", "timezone": "+5"}}, 40485),
        (doc! {"$hour": {"date": "$day", "timezone": 5}}, 40517),
        (
            doc! {"$dateTrunc": {"date": "$day", "unit": "fortnight"}},
            9,
        ),
        (
            doc! {"$dateTrunc": {"date": "$day", "unit": "day", "binSize": 0}},
            5439018,
        ),
        (
            doc! {"$dateTrunc": {"date": "$qty", "unit": "day"}},
            5439012,
        ),
        (doc! {"$dateTrunc": {"unit": "day"}}, 5439009),
        (
            doc! {"$dateAdd": {"startDate": "$day", "unit": "day", "amount": 1.5}},
            5166405,
        ),
        (
            doc! {"$dateAdd": {"startDate": "$day", "unit": "day"}},
            5166402,
        ),
        (
            doc! {"$dateAdd": {"startDate": "$qty", "unit": "day", "amount": 1}},
            5166403,
        ),
        (
            doc! {"$dateDiff": {"startDate": "$day", "endDate": "$qty", "unit": "day"}},
            5166307,
        ),
        (
            doc! {"$dateDiff": {"startDate": "$day", "endDate": "$day", "unit": "week", "startOfWeek": "someday"}},
            5439016,
        ),
        (doc! {"$regexFind": {"input": 5, "regex": "a"}}, 51104),
        (
            doc! {"$regexFind": {"input": "a", "regex": "(", "options": ""}},
            51111,
        ),
        (
            doc! {"$regexFindAll": {"input": "a", "regex": "a", "flags": "i"}},
            31024,
        ),
    ] {
        for coll in ["orders", "orders_plain"] {
            let e = db
                .collection::<Document>(coll)
                .aggregate(vec![doc! {"$project": {"x": expr.clone()}}])
                .await
                .unwrap_err();
            assert_eq!(error_code(&e), code, "{coll} {expr}: {e}");
        }
    }
    // The Olson names of UTC are UTC; a null time zone is a null result.
    let r = run(&cl, "orders_plain", &[
        doc! {"$match": {"_id": 0}},
        doc! {"$project": {"a": {"$hour": {"date": "$day", "timezone": "Etc/UTC"}}, "b": {"$hour": {"date": "$day", "timezone": "Etc/GMT+2"}}, "n": {"$dateTrunc": {"date": "$day", "unit": "day", "timezone": null}}}},
    ]).await;
    assert_eq!(r[0], doc! {"_id": 0, "a": 22, "b": 20, "n": Bson::Null});
    for (stage, code) in [
        (doc! {"$bucketAuto": {"groupBy": "$qty"}}, 40246),
        (
            doc! {"$bucketAuto": {"groupBy": "$qty", "buckets": 0}},
            40243,
        ),
        (
            doc! {"$bucketAuto": {"groupBy": "qty", "buckets": 2}},
            40239,
        ),
        (
            doc! {"$bucketAuto": {"groupBy": "$qty", "buckets": 2, "granularity": "R7"}},
            40257,
        ),
        (
            doc! {"$bucketAuto": {"groupBy": "$tags", "buckets": 2, "granularity": "R5"}},
            40258,
        ),
        (
            doc! {"$bucketAuto": {"groupBy": "$qty", "buckets": 2, "size": 1}},
            40245,
        ),
        (
            doc! {"$graphLookup": {"from": "customers", "startWith": "$cust", "connectFromField": "a", "as": "x"}},
            40105,
        ),
        (
            doc! {"$graphLookup": {"from": "customers", "startWith": "$cust", "connectFromField": "a", "connectToField": "_id", "as": "x", "maxDepth": -1}},
            40101,
        ),
        (
            doc! {"$group": {"_id": null, "t": {"$topN": {"n": 0, "sortBy": {"a": 1}, "output": "$a"}}}},
            5787908,
        ),
        (
            doc! {"$group": {"_id": null, "t": {"$firstN": {"input": "$a"}}}},
            5787906,
        ),
    ] {
        for coll in ["orders", "orders_plain"] {
            let e = db
                .collection::<Document>(coll)
                .aggregate(vec![stage.clone()])
                .await
                .unwrap_err();
            assert_eq!(error_code(&e), code, "{coll} {stage}: {e}");
        }
    }
}

/// `$merge` into a sharded collection: the router writes the results through its own write
/// path (matched by the target's shard key and `_id` unless `on` says otherwise), from a
/// sharded source and from an unsharded one, with each `whenMatched`/`whenNotMatched` mode and
/// mongod's errors.
#[tokio::test]
async fn merge_into_a_sharded_collection_writes_through_the_router() {
    let c = TestCluster::start(
        3,
        &[
            ("shop.orders", doc! {"_id": "hashed"}),
            ("shop.summary", doc! {"k": "hashed"}),
        ],
    )
    .await;
    let cl = common::driver(c.addr(), "").await;
    let db = cl.database("shop");
    let orders: Vec<Document> = (0..90)
        .map(|i| doc! {"_id": i, "cust": i % 7, "qty": (i * 13) % 17})
        .collect();
    for coll in ["orders", "orders_plain"] {
        db.collection::<Document>(coll)
            .insert_many(orders.clone())
            .await
            .unwrap();
    }
    let expected = |times: i32| -> Vec<Document> {
        (0..7)
            .map(|c| {
                let q: i32 = (0..90).filter(|i| i % 7 == c).map(|i| (i * 13) % 17).sum();
                doc! {"_id": c, "k": c, "q": q * times}
            })
            .collect()
    };
    let summary = db.collection::<Document>("summary");
    let totals = doc! {"$group": {"_id": "$cust", "q": {"$sum": "$qty"}}};
    let keyed = doc! {"$set": {"k": "$_id"}};
    for source in ["orders", "orders_plain"] {
        summary.delete_many(doc! {}).await.unwrap();
        let r = run(
            &cl,
            source,
            &[
                totals.clone(),
                keyed.clone(),
                doc! {"$merge": {"into": "summary"}},
            ],
        )
        .await;
        assert!(r.is_empty());
        let got = common::all(summary.find(doc! {}).sort(doc! {"_id": 1}).await.unwrap()).await;
        let strip = |v: Vec<Document>| -> Vec<Document> {
            v.into_iter()
                .map(|d| doc! {"_id": d.get("_id").cloned().unwrap(), "k": d.get("k").cloned().unwrap(), "q": d.get("q").cloned().unwrap()})
                .collect()
        };
        assert_eq!(strip(got), expected(1), "{source}");
        // whenMatched: merge adds fields; discard drops what matches nothing.
        run(&cl, source, &[
            totals.clone(),
            keyed.clone(),
            doc! {"$project": {"k": 1, "seen": {"$literal": true}}},
            doc! {"$merge": {"into": "summary", "whenMatched": "merge", "whenNotMatched": "discard"}},
        ]).await;
        assert_eq!(
            summary.count_documents(doc! {"seen": true}).await.unwrap(),
            7
        );
        // A whenMatched pipeline with $$new: the totals doubled.
        run(&cl, source, &[
            totals.clone(),
            keyed.clone(),
            doc! {"$merge": {"into": "summary", "whenMatched": [{"$set": {"q": {"$add": ["$q", "$$new.q"]}}}]}},
        ]).await;
        let got = common::all(summary.find(doc! {}).sort(doc! {"_id": 1}).await.unwrap()).await;
        assert_eq!(strip(got), expected(2), "{source}");
        // keepExisting leaves matches alone and inserts the rest.
        run(
            &cl,
            source,
            &[
                totals.clone(),
                doc! {"$set": {"k": {"$add": ["$_id", 100]}, "_id": {"$add": ["$_id", 100]}}},
                doc! {"$merge": {"into": "summary", "whenMatched": "keepExisting"}},
            ],
        )
        .await;
        assert_eq!(
            summary.count_documents(doc! {}).await.unwrap(),
            14,
            "{source}"
        );
        for (stages, code) in [
            (
                vec![
                    totals.clone(),
                    keyed.clone(),
                    doc! {"$merge": {"into": "summary", "whenMatched": "fail"}},
                ],
                11000,
            ),
            (
                vec![totals.clone(), doc! {"$merge": {"into": "summary"}}],
                51132,
            ),
            (
                vec![
                    totals.clone(),
                    doc! {"$set": {"k": 999, "_id": 999}},
                    doc! {"$merge": {"into": "summary", "whenNotMatched": "fail"}},
                ],
                13113,
            ),
        ] {
            let e = db
                .collection::<Document>(source)
                .aggregate(stages.clone())
                .await
                .unwrap_err();
            assert_eq!(error_code(&e), code, "{source} {stages:?}: {e}");
        }
    }
}

/// Runs `pipeline` on the sharded collection and on its unsharded copy, checks both give the
/// same documents (sorted by `_id` first, so the pipeline's own order need not be total) and
/// returns them.
async fn same_on_both(cl: &mongodb::Client, pipeline: &[Document]) -> Vec<Document> {
    let sharded = sorted_by_id(run(cl, "orders", pipeline).await);
    let plain = sorted_by_id(run(cl, "orders_plain", pipeline).await);
    assert_eq!(sharded, plain, "{pipeline:?}");
    sharded
}

/// The code each collection answers for `pipeline`, which must fail.
async fn failure_code(cl: &mongodb::Client, pipeline: &[Document]) -> i32 {
    let db = cl.database("shop");
    let mut codes = Vec::new();
    for coll in ["orders", "orders_plain"] {
        let e = db
            .collection::<Document>(coll)
            .aggregate(pipeline.to_vec())
            .await
            .unwrap_err();
        codes.push(error_code(&e));
    }
    assert_eq!(codes[0], codes[1], "{pipeline:?}");
    codes[0]
}

/// `$sortArray` sorts whole values in MongoDB's comparison order or by fields of its
/// elements, on a sharded collection as on one shard, with mongod's codes for bad arguments.
#[tokio::test]
async fn sort_array_matches_one_shard() {
    let (_c, cl) = setup().await;
    let r = same_on_both(
        &cl,
        &[doc! {"$project": {
            "up": {"$sortArray": {"input": ["$qty", "$cust", {"$toString": "$_id"}, null, "$tags"], "sortBy": 1}},
            "down": {"$sortArray": {"input": "$tags", "sortBy": -1}},
            "byField": {"$sortArray": {"input": [{"k": "$qty", "i": 1}, {"k": "$cust", "i": 2}, {"k": 5, "i": 3}], "sortBy": {"k": -1, "i": 1}}},
            "none": {"$sortArray": {"input": "$missing", "sortBy": 1}},
        }}],
    )
    .await;
    assert_eq!(r.len(), 90);
    for d in &r {
        let id = d.get_i32("_id").unwrap();
        let (qty, cust) = ((id * 13) % 17, id % 7);
        let (lo, hi) = (qty.min(cust), qty.max(cust));
        let tags: Vec<Bson> = if id % 3 == 0 {
            vec!["a".into(), "b".into()]
        } else {
            vec!["c".into()]
        };
        assert_eq!(
            d.get_array("up").unwrap(),
            &vec![
                Bson::Null,
                lo.into(),
                hi.into(),
                id.to_string().into(),
                Bson::Array(tags.clone())
            ],
            "{d}"
        );
        let mut down = tags;
        down.reverse();
        assert_eq!(d.get_array("down").unwrap(), &down);
        let mut keyed = [(qty, 1), (cust, 2), (5, 3)];
        keyed.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let want: Vec<Bson> = keyed
            .iter()
            .map(|(k, i)| Bson::Document(doc! {"k": k, "i": i}))
            .collect();
        assert_eq!(d.get_array("byField").unwrap(), &want);
        assert_eq!(d.get("none"), Some(&Bson::Null));
    }
    for (expr, code) in [
        (doc! {"$sortArray": "$tags"}, 2942500),
        (
            doc! {"$sortArray": {"input": "$tags", "sortBy": 1, "by": 1}},
            2942501,
        ),
        (doc! {"$sortArray": {"sortBy": 1}}, 2942502),
        (doc! {"$sortArray": {"input": "$tags"}}, 2942503),
        (doc! {"$sortArray": {"input": "$qty", "sortBy": 1}}, 2942504),
        (
            doc! {"$sortArray": {"input": "$tags", "sortBy": 0}},
            2942506,
        ),
        (
            doc! {"$sortArray": {"input": "$tags", "sortBy": {"a": 2}}},
            15975,
        ),
        (
            doc! {"$sortArray": {"input": "$tags", "sortBy": {"a": "up"}}},
            15974,
        ),
    ] {
        assert_eq!(
            failure_code(&cl, &[doc! {"$project": {"x": expr.clone()}}]).await,
            code,
            "{expr}"
        );
    }
}

/// `$median` and `$percentile` (`method: "approximate"`) as `$group` accumulators, window
/// functions and expressions give the input value at mongod's rank, ignore non-numbers, give
/// null without numbers, and refuse bad `p` and `method` with mongod's codes.
#[tokio::test]
async fn median_and_percentile_match_one_shard() {
    let (_c, cl) = setup().await;
    let rank = |n: usize, p: f64| -> usize {
        if p >= 1.0 {
            n - 1
        } else {
            ((n as f64 * p).ceil() as usize).max(1) - 1
        }
    };
    let groups = same_on_both(
        &cl,
        &[doc! {"$group": {
            "_id": "$cust",
            "m": {"$median": {"input": "$qty", "method": "approximate"}},
            "p": {"$percentile": {"input": "$qty", "p": [0, 0.1, 0.5, 0.9, 1], "method": "approximate"}},
            "none": {"$median": {"input": "$tags", "method": "approximate"}},
        }}],
    )
    .await;
    assert_eq!(groups.len(), 7);
    for g in &groups {
        let cust = g.get_i32("_id").unwrap();
        let mut qtys: Vec<i32> = (0..90)
            .filter(|i| i % 7 == cust)
            .map(|i| (i * 13) % 17)
            .collect();
        qtys.sort();
        let at = |p: f64| Bson::Double(qtys[rank(qtys.len(), p)] as f64);
        assert_eq!(g.get("m"), Some(&at(0.5)), "{g}");
        assert_eq!(
            g.get_array("p").unwrap(),
            &vec![at(0.0), at(0.1), at(0.5), at(0.9), at(1.0)]
        );
        assert_eq!(g.get("none"), Some(&Bson::Null));
    }
    // As a window function: the running median of a customer's quantities by _id.
    let w = same_on_both(
        &cl,
        &[
            doc! {"$match": {"cust": 3}},
            doc! {"$setWindowFields": {"partitionBy": "$cust", "sortBy": {"_id": 1}, "output": {
                "run": {"$median": {"input": "$qty", "method": "approximate"}, "window": {"documents": ["unbounded", "current"]}},
            }}},
        ],
    )
    .await;
    let mut seen = Vec::new();
    for d in &w {
        seen.push(d.get_i32("qty").unwrap());
        let mut s = seen.clone();
        s.sort();
        assert_eq!(
            d.get("run"),
            Some(&Bson::Double(s[rank(s.len(), 0.5)] as f64)),
            "{d}"
        );
    }
    // As expressions, over an array or a number.
    let e = same_on_both(
        &cl,
        &[
            doc! {"$match": {"_id": {"$lt": 5}}},
            doc! {"$project": {
                "m": {"$median": {"input": ["$qty", "$cust", "$_id", "x"], "method": "approximate"}},
                "p": {"$percentile": {"input": "$qty", "p": [0.25, 0.75], "method": "approximate"}},
                "empty": {"$percentile": {"input": [], "p": [0.5], "method": "approximate"}},
            }},
        ],
    )
    .await;
    for d in &e {
        let id = d.get_i32("_id").unwrap();
        let mut v = [(id * 13) % 17, id % 7, id];
        v.sort();
        assert_eq!(d.get("m"), Some(&Bson::Double(v[1] as f64)), "{d}");
        let q = Bson::Double(((id * 13) % 17) as f64);
        assert_eq!(d.get_array("p").unwrap(), &vec![q.clone(), q]);
        assert_eq!(d.get_array("empty").unwrap(), &vec![Bson::Null]);
    }
    for (stage, code) in [
        (
            doc! {"$group": {"_id": null, "m": {"$median": "$qty"}}},
            7436100,
        ),
        (
            doc! {"$group": {"_id": null, "m": {"$percentile": "$qty"}}},
            7429703,
        ),
        (
            doc! {"$group": {"_id": null, "m": {"$median": {"input": "$qty", "method": "continuous"}}}},
            2,
        ),
        (
            doc! {"$group": {"_id": null, "m": {"$median": {"input": "$qty"}}}},
            40414,
        ),
        (
            doc! {"$group": {"_id": null, "m": {"$percentile": {"input": "$qty", "p": "$qty", "method": "approximate"}}}},
            7750300,
        ),
        (
            doc! {"$group": {"_id": null, "m": {"$percentile": {"input": "$qty", "p": [], "method": "approximate"}}}},
            7750301,
        ),
        (
            doc! {"$group": {"_id": null, "m": {"$percentile": {"input": "$qty", "p": ["a"], "method": "approximate"}}}},
            7750302,
        ),
        (
            doc! {"$group": {"_id": null, "m": {"$percentile": {"input": "$qty", "p": [1.5], "method": "approximate"}}}},
            7750303,
        ),
        (doc! {"$project": {"m": {"$median": [1, 2]}}}, 7436201),
        (
            doc! {"$project": {"m": {"$percentile": {"input": "$qty", "p": [0.5], "method": "approximate", "x": 1}}}},
            40415,
        ),
    ] {
        assert_eq!(
            failure_code(&cl, std::slice::from_ref(&stage)).await,
            code,
            "{stage}"
        );
    }
}

/// `$dateToParts` and `$dateFromParts`: calendar and ISO week parts in a time zone, the round
/// trip between them, mongod's carry of out-of-range parts and its codes for bad arguments.
#[tokio::test]
async fn date_parts_match_one_shard() {
    let (_c, cl) = setup().await;
    let r = same_on_both(
        &cl,
        &[
            doc! {"$set": {
                "p": {"$dateToParts": {"date": "$day", "timezone": "+05:30"}},
                "iso": {"$dateToParts": {"date": "$day", "iso8601": true}},
            }},
            doc! {"$set": {
                "back": {"$dateFromParts": {
                    "year": "$p.year", "month": "$p.month", "day": "$p.day", "hour": "$p.hour",
                    "minute": "$p.minute", "second": "$p.second", "millisecond": "$p.millisecond",
                    "timezone": "+05:30"}},
                "isoBack": {"$dateFromParts": {
                    "isoWeekYear": "$iso.isoWeekYear", "isoWeek": "$iso.isoWeek",
                    "isoDayOfWeek": "$iso.isoDayOfWeek", "hour": "$iso.hour", "minute": "$iso.minute",
                    "second": "$iso.second", "millisecond": "$iso.millisecond"}},
                "carried": {"$dateFromParts": {"year": 2023, "month": {"$add": ["$qty", 1]}, "day": {"$subtract": [0, "$cust"]}}},
            }},
        ],
    )
    .await;
    assert_eq!(r.len(), 90);
    for d in &r {
        let id = d.get_i32("_id").unwrap();
        let day = d.get_datetime("day").unwrap();
        assert_eq!(d.get_datetime("back").unwrap(), day, "{d}");
        assert_eq!(d.get_datetime("isoBack").unwrap(), day, "{d}");
        // 1_700_000_000_000 is 2023-11-14T22:13:20Z: 03:43:20 on the 15th at +05:30.
        let p = d.get_document("p").unwrap();
        assert_eq!(p.get_i32("hour").unwrap(), 3);
        assert_eq!(p.get_i32("minute").unwrap(), 43);
        assert_eq!(p.get_i32("day").unwrap(), 15 + (id % 10));
        let iso = d.get_document("iso").unwrap();
        assert_eq!(iso.get_i32("isoWeekYear").unwrap(), 2023);
        assert_eq!(iso.get_i32("hour").unwrap(), 22);
        // Month qty+1 of 2023 (carried into 2024 past December), day -cust: cust + 1 days
        // before the first of that month.
        let qty = (id * 13) % 17;
        let months = 2023 * 12 + qty;
        let (y, m) = (months / 12, months % 12 + 1);
        let first = bson::DateTime::parse_rfc3339_str(format!("{y:04}-{m:02}-01T00:00:00Z"))
            .unwrap()
            .timestamp_millis();
        assert_eq!(
            d.get_datetime("carried").unwrap().timestamp_millis(),
            first - (id % 7 + 1) as i64 * 86_400_000,
            "{d}"
        );
    }
    for (expr, code) in [
        (doc! {"$dateFromParts": "$day"}, 40519),
        (doc! {"$dateFromParts": {"year": 2020, "week": 1}}, 40518),
        (doc! {"$dateFromParts": {"month": 1}}, 40516),
        (doc! {"$dateFromParts": {"year": 2020, "isoWeek": 1}}, 40489),
        (
            doc! {"$dateFromParts": {"isoWeekYear": 2020, "month": 1}},
            40525,
        ),
        (doc! {"$dateFromParts": {"year": "$tags"}}, 40515),
        (doc! {"$dateFromParts": {"year": 0}}, 40523),
        (doc! {"$dateFromParts": {"isoWeekYear": 10000}}, 31095),
        (doc! {"$dateFromParts": {"year": 2020, "day": 40000}}, 31034),
        (
            doc! {"$dateFromParts": {"year": 2020, "timezone": 1}},
            40517,
        ),
        (doc! {"$dateToParts": ["$day"]}, 40524),
        (doc! {"$dateToParts": {"date": "$day", "iso": true}}, 40520),
        (doc! {"$dateToParts": {"iso8601": true}}, 40522),
        (
            doc! {"$dateToParts": {"date": "$day", "iso8601": "yes"}},
            40521,
        ),
        (doc! {"$dateToParts": {"date": "$qty"}}, 16006),
        (
            doc! {"$dateToParts": {"date": "$day", "timezone": "Mars/Olympus"}},
            40485,
        ),
    ] {
        assert_eq!(
            failure_code(&cl, &[doc! {"$project": {"x": expr.clone()}}]).await,
            code,
            "{expr}"
        );
    }
}

/// Runs `pipeline` on both collections and compares them as sets of documents (generated
/// documents have no `_id`, and documents tied on the stage's sort come in the order the
/// shards return them).
async fn same_set_on_both(cl: &mongodb::Client, pipeline: &[Document]) -> Vec<Document> {
    let sharded = sorted(run(cl, "orders", pipeline).await);
    let plain = sorted(run(cl, "orders_plain", pipeline).await);
    assert_eq!(sharded, plain, "{pipeline:?}");
    sharded
}

/// `$densify` and `$fill` run after the router's merge, over every document, and give what one
/// shard gives over the whole collection; bad specifications get mongod's codes.
#[tokio::test]
async fn densify_and_fill_match_one_shard() {
    let (_c, cl) = setup().await;
    // Each customer's quantities densified between its own lowest and highest.
    let r = same_set_on_both(
        &cl,
        &[
            doc! {"$project": {"_id": 0, "cust": 1, "qty": 1}},
            doc! {"$densify": {"field": "qty", "partitionByFields": ["cust"], "range": {"step": 1, "bounds": "partition"}}},
        ],
    )
    .await;
    for cust in 0..7 {
        let orig: Vec<i32> = (0..90)
            .filter(|i| i % 7 == cust)
            .map(|i| (i * 13) % 17)
            .collect();
        let (lo, hi) = (*orig.iter().min().unwrap(), *orig.iter().max().unwrap());
        let mut got: Vec<i32> = r
            .iter()
            .filter(|d| d.get_i32("cust").unwrap() == cust)
            .map(|d| d.get_i32("qty").unwrap())
            .collect();
        got.sort();
        let mut want = orig.clone();
        want.extend((lo..=hi).filter(|q| !orig.contains(q)));
        want.sort();
        assert_eq!(got, want, "customer {cust}");
    }
    // "full" bounds: every customer gets every quantity from the lowest to the highest of all.
    let r = same_set_on_both(
        &cl,
        &[
            doc! {"$match": {"qty": {"$lt": 8}}},
            doc! {"$group": {"_id": {"cust": "$cust", "qty": "$qty"}}},
            doc! {"$replaceWith": "$_id"},
            doc! {"$densify": {"field": "qty", "partitionByFields": ["cust"], "range": {"step": 2, "bounds": "full"}}},
        ],
    )
    .await;
    for cust in 0..7 {
        let orig: std::collections::BTreeSet<i32> = (0..90)
            .filter(|i| i % 7 == cust)
            .map(|i| (i * 13) % 17)
            .filter(|q| *q < 8)
            .collect();
        let mut want: Vec<i32> = orig.iter().copied().collect();
        want.extend((0..8).step_by(2).filter(|q| !orig.contains(q)));
        want.sort();
        let mut got: Vec<i32> = r
            .iter()
            .filter(|d| d.get_i32("cust").unwrap() == cust)
            .map(|d| d.get_i32("qty").unwrap())
            .collect();
        got.sort();
        assert_eq!(got, want, "customer {cust}");
    }
    // Dates by 12 hours within explicit bounds: the half days between the order days.
    let first = bson::DateTime::from_millis(1_700_000_000_000);
    let last = bson::DateTime::from_millis(1_700_000_000_000 + 3 * 86_400_000);
    let r = same_set_on_both(
        &cl,
        &[
            doc! {"$match": {"cust": 0}},
            doc! {"$project": {"_id": 0, "day": 1}},
            doc! {"$densify": {"field": "day", "range": {"step": 12, "unit": "hour", "bounds": [first, last]}}},
            doc! {"$match": {"day": {"$lt": last}}},
        ],
    )
    .await;
    let generated: Vec<i64> = r
        .iter()
        .map(|d| d.get_datetime("day").unwrap().timestamp_millis())
        .filter(|t| (t - 1_700_000_000_000) % 86_400_000 != 0)
        .collect();
    assert_eq!(
        generated,
        (0..3)
            .map(|k| 1_700_000_000_000 + k * 86_400_000 + 43_200_000)
            .collect::<Vec<_>>()
    );
    // $fill over densified gaps: carried forward, interpolated, or a value.
    let r = same_set_on_both(
        &cl,
        &[
            doc! {"$match": {"cust": 2}},
            doc! {"$group": {"_id": "$qty", "n": {"$sum": 1}}},
            doc! {"$project": {"_id": 0, "qty": "$_id", "n": 1, "m": "$n", "z": "$n"}},
            doc! {"$densify": {"field": "qty", "range": {"step": 1, "bounds": "full"}}},
            doc! {"$fill": {"sortBy": {"qty": 1}, "output": {"n": {"method": "locf"}, "m": {"method": "linear"}, "z": {"value": -1}}}},
        ],
    )
    .await;
    let present: std::collections::BTreeMap<i32, i32> = {
        let mut m = std::collections::BTreeMap::new();
        for i in (0..90).filter(|i| i % 7 == 2) {
            *m.entry((i * 13) % 17).or_insert(0) += 1;
        }
        m
    };
    for d in &r {
        let q = d.get_i32("qty").unwrap();
        match present.get(&q) {
            Some(n) => {
                assert_eq!(d.get_i32("n").unwrap(), *n);
                assert_eq!(d.get_i32("z").unwrap(), *n);
            }
            None => {
                let (pq, pn) = present.range(..q).next_back().unwrap();
                let (nq, nn) = present.range(q..).next().unwrap();
                assert_eq!(d.get_i32("n").unwrap(), *pn, "{d}");
                assert_eq!(d.get_i32("z").unwrap(), -1, "{d}");
                let want = *pn as f64 + (q - pq) as f64 * ((nn - pn) as f64 / (nq - pq) as f64);
                assert!((d.get_f64("m").unwrap() - want).abs() < 1e-9, "{d}");
            }
        }
    }
    for (stage, code) in [
        (doc! {"$densify": {"field": "qty"}}, 40414),
        (
            doc! {"$densify": {"field": "qty", "range": {"step": -1, "bounds": "full"}}},
            5733401,
        ),
        (
            doc! {"$densify": {"field": "qty", "range": {"step": 1, "bounds": "partition"}}},
            5733408,
        ),
        (
            doc! {"$densify": {"field": "qty", "range": {"step": 1, "bounds": [5, 1]}}},
            5733402,
        ),
        (
            doc! {"$densify": {"field": "tags", "range": {"step": 1, "bounds": "full"}}},
            5733201,
        ),
        (
            doc! {"$densify": {"field": "day", "range": {"step": 1, "bounds": "full"}}},
            6053600,
        ),
        (doc! {"$fill": {"output": {}}}, 6050203),
        (
            doc! {"$fill": {"output": {"qty": {"method": "nearest"}}}},
            6050202,
        ),
        (
            doc! {"$fill": {"output": {"qty": {"method": "linear"}}}},
            605001,
        ),
        (
            doc! {"$fill": {"sortBy": {"cust": 1}, "output": {"qty": {"method": "linear"}}}},
            6050106,
        ),
    ] {
        assert_eq!(
            failure_code(&cl, std::slice::from_ref(&stage)).await,
            code,
            "{stage}"
        );
    }
}

/// Whether `got` is a number within a relative 1e-9 of `want` (the engine sums and divides in
/// another order than the plain formulas below).
fn near(got: Option<&Bson>, want: f64) -> bool {
    let g = match got {
        Some(Bson::Double(d)) => *d,
        Some(Bson::Int32(i)) => *i as f64,
        Some(Bson::Int64(i)) => *i as f64,
        _ => return false,
    };
    (g - want).abs() <= 1e-9 * want.abs().max(1.0)
}

/// `$expMovingAvg`, `$derivative`, `$integral`, `$covariancePop` and `$covarianceSamp` over each
/// customer's orders by `_id`: the sharded collection gives what one shard gives, and both give
/// the values the plain formulas give.
#[tokio::test]
async fn series_window_functions_match_one_shard_and_the_formulas() {
    let (_c, cl) = setup().await;
    let out = same_on_both(
        &cl,
        &[doc! {"$setWindowFields": {"partitionBy": "$cust", "sortBy": {"_id": 1}, "output": {
            "ema": {"$expMovingAvg": {"input": "$qty", "N": 3}},
            "emaA": {"$expMovingAvg": {"input": "$qty", "alpha": 0.3}},
            "der": {"$derivative": {"input": "$qty"}, "window": {"documents": [-1, 0]}},
            "run": {"$integral": {"input": "$qty"}, "window": {"documents": ["unbounded", "current"]}},
            "near": {"$integral": {"input": "$qty"}, "window": {"range": [-14, 0]}},
            "covP": {"$covariancePop": ["$_id", "$qty"]},
            "covS": {"$covarianceSamp": ["$_id", "$qty"], "window": {"documents": [-2, 0]}},
        }}}],
    )
    .await;
    assert_eq!(out.len(), 90);
    for cust in 0..7 {
        let ids: Vec<f64> = (0..90)
            .filter(|i| i % 7 == cust)
            .map(|i| i as f64)
            .collect();
        let qty: Vec<f64> = (0..90)
            .filter(|i| i % 7 == cust)
            .map(|i| ((i * 13) % 17) as f64)
            .collect();
        let docs: Vec<&Document> = out
            .iter()
            .filter(|d| d.get_i32("cust").unwrap() == cust)
            .collect();
        assert_eq!(docs.len(), ids.len());
        let cov = |xs: &[f64], ys: &[f64], sample: bool| -> f64 {
            let n = xs.len() as f64;
            let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
            let s: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
            s / if sample { n - 1.0 } else { n }
        };
        let trapezoids = |lo: usize, hi: usize| -> f64 {
            (lo + 1..=hi)
                .map(|k| (qty[k - 1] + qty[k]) * (ids[k] - ids[k - 1]) / 2.0)
                .sum()
        };
        let pop_all = cov(&ids, &qty, false);
        let (mut ema, mut ema_a) = (qty[0], qty[0]);
        for (k, d) in docs.iter().enumerate() {
            assert_eq!(d.get_i32("_id").unwrap() as f64, ids[k]);
            if k > 0 {
                ema = qty[k] * 0.5 + ema * 0.5; // N = 3: alpha = 2 / 4
                ema_a = qty[k] * 0.3 + ema_a * 0.7;
            }
            assert!(near(d.get("ema"), ema), "{d}");
            assert!(near(d.get("emaA"), ema_a), "{d}");
            if k == 0 {
                assert_eq!(d.get("der"), Some(&Bson::Null), "{d}");
                assert_eq!(d.get("run"), Some(&Bson::Int32(0)), "{d}");
            } else {
                let slope = (qty[k] - qty[k - 1]) / (ids[k] - ids[k - 1]);
                assert!(near(d.get("der"), slope), "{d}");
                assert!(near(d.get("run"), trapezoids(0, k)), "{d}");
            }
            // Ids of one customer are 7 apart: within 14 below are the two before.
            let lo = k.saturating_sub(2);
            if lo == k {
                assert_eq!(d.get("near"), Some(&Bson::Int32(0)), "{d}");
            } else {
                assert!(near(d.get("near"), trapezoids(lo, k)), "{d}");
            }
            assert!(near(d.get("covP"), pop_all), "{d}");
            if k == 0 {
                assert_eq!(d.get("covS"), Some(&Bson::Null), "{d}");
            } else {
                let want = cov(&ids[lo..=k], &qty[lo..=k], true);
                assert!(near(d.get("covS"), want), "{d} {want}");
            }
        }
    }
    // Per day: each day's total quantity, its change per day and its running integral in
    // quantity-hours.
    let out = same_on_both(
        &cl,
        &[
            doc! {"$group": {"_id": "$day", "q": {"$sum": "$qty"}}},
            doc! {"$setWindowFields": {"sortBy": {"_id": 1}, "output": {
                "perDay": {"$derivative": {"input": "$q", "unit": "day"}, "window": {"documents": [-1, 0]}},
                "hours": {"$integral": {"input": "$q", "unit": "hour"}, "window": {"documents": ["unbounded", "current"]}},
            }}},
            doc! {"$sort": {"_id": 1}},
        ],
    )
    .await;
    let mut totals = [0f64; 10];
    for i in 0..90 {
        totals[i % 10] += ((i * 13) % 17) as f64;
    }
    assert_eq!(out.len(), 10);
    let mut hours = 0.0;
    for (k, d) in out.iter().enumerate() {
        if k == 0 {
            assert_eq!(d.get("perDay"), Some(&Bson::Null), "{d}");
            assert_eq!(d.get("hours"), Some(&Bson::Double(0.0)), "{d}");
            continue;
        }
        hours += (totals[k - 1] + totals[k]) * 24.0 / 2.0;
        assert!(near(d.get("perDay"), totals[k] - totals[k - 1]), "{d}");
        assert!(near(d.get("hours"), hours), "{d}");
    }
    // A decimal input gives decimal results, null until the first number.
    let out = same_on_both(
        &cl,
        &[
            doc! {"$match": {"cust": 1}},
            doc! {"$set": {"dq": {"$cond": [{"$lt": ["$_id", 10]}, null, {"$toDecimal": "$qty"}]}}},
            doc! {"$setWindowFields": {"sortBy": {"_id": 1}, "output": {
                "ema": {"$expMovingAvg": {"input": "$dq", "alpha": 0.5}},
                "cov": {"$covariancePop": ["$_id", "$dq"], "window": {"documents": ["unbounded", "current"]}},
            }}},
        ],
    )
    .await;
    for d in &out {
        let before = d.get_i32("_id").unwrap() < 10;
        for f in ["ema", "cov"] {
            match d.get(f) {
                Some(Bson::Null) => assert!(before, "{d}"),
                Some(Bson::Decimal128(_)) if f == "ema" => assert!(!before, "{d}"),
                Some(Bson::Double(v)) if f == "cov" => assert!(*v == 0.0, "one pair: {d}"),
                Some(Bson::Decimal128(_)) => assert!(!before, "{d}"),
                other => panic!("{f}: {other:?} in {d}"),
            }
        }
    }
    // mongod's codes for malformed specifications and for values the functions cannot use.
    let stage = |sort: Option<Document>, f: Document| {
        let mut s = doc! {"output": {"x": f}};
        if let Some(sort) = sort {
            s.insert("sortBy", sort);
        }
        doc! {"$setWindowFields": s}
    };
    let by_id = || Some(doc! {"_id": 1});
    let by_day = || Some(doc! {"day": 1, "_id": 1});
    let w = || doc! {"documents": [-1, 0]};
    for (st, code) in [
        (
            stage(None, doc! {"$expMovingAvg": {"input": "$qty", "N": 3}}),
            9,
        ),
        (
            stage(
                by_id(),
                doc! {"$expMovingAvg": {"input": "$qty", "N": 3}, "window": w()},
            ),
            9,
        ),
        (
            stage(
                by_id(),
                doc! {"$expMovingAvg": {"input": "$qty", "N": 3, "alpha": 0.5}},
            ),
            9,
        ),
        (
            stage(by_id(), doc! {"$expMovingAvg": {"input": "$qty", "N": 0}}),
            9,
        ),
        (
            stage(
                by_id(),
                doc! {"$expMovingAvg": {"input": "$qty", "alpha": 1.5}},
            ),
            9,
        ),
        (stage(by_id(), doc! {"$derivative": {"input": "$qty"}}), 9),
        (
            stage(None, doc! {"$derivative": {"input": "$qty"}, "window": w()}),
            9,
        ),
        (stage(by_day(), doc! {"$integral": {"input": "$qty"}}), 9),
        (
            stage(
                by_id(),
                doc! {"$integral": {"input": "$qty", "unit": "month"}},
            ),
            5490710,
        ),
        (
            stage(
                by_id(),
                doc! {"$derivative": {"input": "$qty", "unit": "hour"}, "window": w()},
            ),
            5624900,
        ),
        (
            stage(
                Some(doc! {"day": 1}),
                doc! {"$derivative": {"input": "$qty"}, "window": w()},
            ),
            5624901,
        ),
        (
            stage(by_id(), doc! {"$integral": {"input": "$tags"}}),
            5423900,
        ),
        (
            stage(
                by_id(),
                doc! {"$integral": {"input": "$qty", "unit": "hour"}},
            ),
            5423901,
        ),
        (
            stage(Some(doc! {"day": 1}), doc! {"$integral": {"input": "$qty"}}),
            5423902,
        ),
    ] {
        assert_eq!(
            failure_code(&cl, std::slice::from_ref(&st)).await,
            code,
            "{st}"
        );
    }
}

/// `$dateToString` in an Olson zone (`Europe/Paris`, read from the system's time zone database)
/// through the router: in the shards' part of the pipeline and in the router's own stage after
/// a `$group`, with the summer and winter offsets, the same on a sharded collection as on one
/// shard.
#[tokio::test]
async fn olson_time_zones_through_the_router() {
    let (_c, cl) = setup().await;
    let db = cl.database("shop");
    let when = |s: &str| bson::DateTime::parse_rfc3339_str(s).unwrap();
    let docs = vec![
        doc! {"_id": 1000, "when": when("2024-07-01T10:00:00Z")},
        doc! {"_id": 1001, "when": when("2024-01-15T10:00:00Z")},
        doc! {"_id": 1002, "when": when("2024-03-31T01:00:00Z")},
    ];
    for coll in ["orders", "orders_plain"] {
        db.collection::<Document>(coll)
            .insert_many(docs.clone())
            .await
            .unwrap();
    }
    let paris = |field: &str| {
        doc! {"$dateToString": {"date": field, "format": "%Y-%m-%d %H:%M %z", "timezone": "Europe/Paris"}}
    };
    let per_doc = vec![
        doc! {"$match": {"_id": {"$gte": 1000}}},
        doc! {"$project": {"local": paris("$when")}},
        doc! {"$sort": {"_id": 1}},
    ];
    let want = vec![
        doc! {"_id": 1000, "local": "2024-07-01 12:00 +0200"},
        doc! {"_id": 1001, "local": "2024-01-15 11:00 +0100"},
        doc! {"_id": 1002, "local": "2024-03-31 03:00 +0200"},
    ];
    for coll in ["orders", "orders_plain"] {
        assert_eq!(run(&cl, coll, &per_doc).await, want, "{coll}");
    }
    let merged = vec![
        doc! {"$match": {"_id": {"$gte": 1000}}},
        doc! {"$group": {"_id": null, "first": {"$min": "$when"}, "last": {"$max": "$when"}}},
        doc! {"$project": {"_id": 0, "first": paris("$first"), "last": paris("$last"),
        "hour": {"$hour": {"date": "$last", "timezone": "Europe/Paris"}}}},
    ];
    let want = vec![
        doc! {"first": "2024-01-15 11:00 +0100", "last": "2024-07-01 12:00 +0200", "hour": 12},
    ];
    for coll in ["orders", "orders_plain"] {
        assert_eq!(run(&cl, coll, &merged).await, want, "{coll}");
    }
    assert_eq!(
        failure_code(
            &cl,
            &[doc! {"$project": {"x": {"$dateToString": {"date": "$day", "timezone": "../etc/passwd"}}}}]
        )
        .await,
        40485
    );
}

/// A router over 3 shards with `shop.orders` sharded (hashed, its documents spread over the
/// shards) and `shop.customers` unsharded, and one embedded shard alone holding the same
/// documents (the oracle); both with the view `tier1` of the customers whose tier is 1 and the
/// view `with_orders` of each customer with its orders (a `$lookup` of the sharded orders).
async fn unsharded_with_sharded_foreign() -> (
    TestCluster,
    mongodb::Client,
    sluice::embedded::EmbeddedShard,
    mongodb::Client,
) {
    let c = TestCluster::start(3, &[("shop.orders", doc! {"_id": "hashed"})]).await;
    let cl = common::driver(c.addr(), "").await;
    let oracle = sluice::embedded::EmbeddedShard::start("127.0.0.1:0", Default::default())
        .await
        .unwrap();
    let one = common::direct(oracle.local_addr()).await;
    let orders: Vec<Document> = (0..90)
        .map(|i| doc! {"_id": i, "cust": i % 7, "qty": (i * 13) % 17})
        .collect();
    let customers: Vec<Document> = (0..7)
        .map(|i| doc! {"_id": i, "name": format!("c{i}"), "tier": i % 2})
        .collect();
    for client in [&cl, &one] {
        let db = client.database("shop");
        db.collection::<Document>("orders")
            .insert_many(orders.clone())
            .await
            .unwrap();
        db.collection::<Document>("customers")
            .insert_many(customers.clone())
            .await
            .unwrap();
        db.run_command(
            doc! {"create": "tier1", "viewOn": "customers", "pipeline": [{"$match": {"tier": 1}}]},
        )
        .await
        .unwrap();
        db.run_command(doc! {"create": "with_orders", "viewOn": "customers", "pipeline": [
            {"$lookup": {"from": "orders", "localField": "_id", "foreignField": "cust", "as": "o"}},
            {"$project": {"name": 1, "n": {"$size": "$o"}, "q": {"$sum": "$o.qty"}}},
        ]})
        .await
        .unwrap();
    }
    // Every shard holds part of the orders, so no one shard can answer alone.
    for s in &c.shards {
        let n = s.service().count_documents("shop", "orders");
        assert!(n > 0 && n < 90, "{} holds {n} orders", s.service().name());
    }
    (c, cl, oracle, one)
}

/// An aggregation on an unsharded collection (or a view of one) whose `$lookup`,
/// `$graphLookup` or `$unionWith` (at the top, inside `$facet`, in a sub-pipeline) reads a
/// sharded collection sees every shard's documents of it, as through mongos: the same results
/// as one shard holding everything, `$out` included.
#[tokio::test]
async fn unsharded_pipelines_reading_a_sharded_collection_match_one_shard() {
    let (c, cl, _oracle, one) = unsharded_with_sharded_foreign().await;
    let by_cust = doc! {"$lookup": {"from": "orders", "localField": "_id", "foreignField": "cust", "as": "o"}};
    let summary = doc! {"$project": {"n": {"$size": "$o"}, "q": {"$sum": "$o.qty"}, "ids": {"$sortArray": {"input": "$o._id", "sortBy": 1}}}};
    let mut cases: Vec<(&str, Vec<Document>)> = vec![
        // localField/foreignField, after a stage the primary shard runs.
        (
            "customers",
            vec![
                doc! {"$match": {"_id": {"$lt": 6}}},
                by_cust.clone(),
                summary.clone(),
                doc! {"$sort": {"_id": 1}},
            ],
        ),
        // pipeline and let.
        (
            "customers",
            vec![
                doc! {"$lookup": {"from": "orders", "let": {"c": "$_id"}, "pipeline": [
                    {"$match": {"$expr": {"$and": [{"$eq": ["$cust", "$$c"]}, {"$gt": ["$qty", 4]}]}}},
                    {"$group": {"_id": null, "q": {"$sum": "$qty"}, "n": {"$sum": 1}}},
                ], "as": "t"}},
                doc! {"$sort": {"_id": 1}},
            ],
        ),
        // $unionWith, with a sub-pipeline.
        (
            "customers",
            vec![
                doc! {"$project": {"name": 1}},
                doc! {"$unionWith": {"coll": "orders", "pipeline": [{"$match": {"qty": {"$gt": 8}}}, {"$project": {"qty": 1}}]}},
                doc! {"$sort": {"qty": 1, "_id": 1}},
            ],
        ),
        (
            "customers",
            vec![doc! {"$unionWith": "orders"}, doc! {"$count": "n"}],
        ),
        // $graphLookup: the orders of each customer, then the orders whose customer is one of
        // those orders' ids.
        (
            "customers",
            vec![
                doc! {"$graphLookup": {"from": "orders", "startWith": "$_id", "connectFromField": "_id", "connectToField": "cust", "as": "o", "maxDepth": 1, "depthField": "d"}},
                doc! {"$project": {"n": {"$size": "$o"}, "deep": {"$size": {"$filter": {"input": "$o", "cond": {"$eq": ["$$this.d", 1]}}}}, "ids": {"$sortArray": {"input": "$o._id", "sortBy": 1}}}},
                doc! {"$sort": {"_id": 1}},
            ],
        ),
        // Inside $facet, and inside a $lookup's sub-pipeline of an unsharded collection.
        (
            "customers",
            vec![doc! {"$facet": {
                "per": [by_cust.clone(), summary.clone(), {"$sort": {"_id": 1}}],
                "all": [{"$lookup": {"from": "customers", "pipeline": [{"$unionWith": "orders"}, {"$count": "n"}], "as": "u"}}, {"$limit": 1}, {"$project": {"u": 1, "_id": 0}}],
            }}],
        ),
        // A view of the unsharded collection.
        (
            "tier1",
            vec![by_cust.clone(), summary.clone(), doc! {"$sort": {"_id": 1}}],
        ),
    ];
    cases.push((
        "with_orders",
        vec![
            doc! {"$match": {"n": {"$gt": 12}}},
            doc! {"$sort": {"q": -1, "_id": 1}},
        ],
    ));
    for (coll, pipeline) in &cases {
        let got = run(&cl, coll, pipeline).await;
        let want = run(&one, coll, pipeline).await;
        assert!(!want.is_empty(), "{coll} {pipeline:?}");
        assert_eq!(got, want, "{coll} {pipeline:?}");
    }
    // `find` and `count` of the view whose own pipeline reads the sharded orders.
    let view_reads = |client: &mongodb::Client| {
        let v = client
            .database("shop")
            .collection::<Document>("with_orders");
        async move {
            let found = common::all(
                v.find(doc! {"q": {"$gt": 90}})
                    .sort(doc! {"_id": -1})
                    .projection(doc! {"q": 1})
                    .await
                    .unwrap(),
            )
            .await;
            (found, v.count_documents(doc! {"n": 13}).await.unwrap())
        }
    };
    let want = view_reads(&one).await;
    assert!(!want.0.is_empty() && want.1 > 0, "{want:?}");
    assert_eq!(view_reads(&cl).await, want);
    // Ending in $out: the target holds what one shard writes.
    let out = vec![
        by_cust.clone(),
        summary.clone(),
        doc! {"$out": "cust_orders"},
    ];
    for client in [&cl, &one] {
        assert!(run(client, "customers", &out).await.is_empty());
    }
    let written = |client: &mongodb::Client| {
        let t = client
            .database("shop")
            .collection::<Document>("cust_orders");
        async move { common::all(t.find(doc! {}).sort(doc! {"_id": 1}).await.unwrap()).await }
    };
    let want = written(&one).await;
    assert_eq!(want.len(), 7);
    assert_eq!(written(&cl).await, want);
    // A pipeline that reads no sharded collection still goes whole to the primary shard: one
    // shard command.
    let before = c.shard_command_total("aggregate");
    let plain = run(
        &cl,
        "customers",
        &[doc! {"$lookup": {"from": "customers", "localField": "_id", "foreignField": "_id", "as": "me"}}],
    )
    .await;
    assert_eq!(plain.len(), 7);
    assert_eq!(c.shard_command_total("aggregate") - before, 1);
    // Results past the first batch come with getMore from the router's cursor.
    let cursor = cl
        .database("shop")
        .collection::<Document>("customers")
        .aggregate(vec![doc! {"$unionWith": "orders"}])
        .batch_size(10)
        .await
        .unwrap();
    assert_eq!(common::all(cursor).await.len(), 97);
    // What the router gathers is bounded by the stage memory limit, with mongod's code.
    c.cluster.set_stage_memory(1_000);
    let e = cl
        .database("shop")
        .collection::<Document>("customers")
        .aggregate(vec![by_cust, doc! {"$sort": {"name": -1}}])
        .await
        .unwrap_err();
    assert_eq!(error_code(&e), 292, "{e}");
}

/// `$sqrt`, `$exp`, `$ln`, `$log10`, `$log` and `$pow` on a decimal give a decimal, computed
/// to 34 digits as mongod's decimal library does (expected values: Python's `decimal` module in
/// the decimal128 context), per document and after the router's `$group`; mongod's codes for
/// bad operands, and its integer `$pow`.
#[tokio::test]
async fn decimal_math_operators_give_decimals() {
    let (_c, cl) = setup().await;
    let db = cl.database("shop");
    let dec = |s: &str| Bson::Decimal128(s.parse::<bson::Decimal128>().unwrap());
    let docs: Vec<Document> = (0..6)
        .map(|i| doc! {"_id": 2000 + i, "v": dec("2"), "w": dec("0.5")})
        .collect();
    for coll in ["orders", "orders_plain"] {
        db.collection::<Document>(coll)
            .insert_many(docs.clone())
            .await
            .unwrap();
    }
    let per_doc = vec![
        doc! {"$match": {"_id": 2000}},
        doc! {"$project": {
            "sqrt": {"$sqrt": "$v"},
            "exp": {"$exp": "$w"},
            "ln": {"$ln": "$v"},
            "log10": {"$log10": "$v"},
            "log2": {"$log": [dec("1024"), "$v"]},
            "log3": {"$log": [dec("8"), 3]},
            "pow": {"$pow": ["$v", 10]},
            "root": {"$pow": ["$v", "$w"]},
            "nan": {"$ln": dec("NaN")},
        }},
    ];
    let want = doc! {
        "_id": 2000,
        "sqrt": dec("1.414213562373095048801688724209698"),
        "exp": dec("1.648721270700128146848650787814164"),
        "ln": dec("0.6931471805599453094172321214581766"),
        "log10": dec("0.3010299956639811952137388947244930"),
        "log2": dec("10"),
        // mongod divides the natural logarithm by a base other than 2 or 10 itself.
        "log3": dec("0.6931471805599453094172321214581767"),
        "pow": dec("1024.000000000000000000000000000000"),
        "root": dec("1.414213562373095048801688724209698"),
        // A decimal NaN is not positive: it takes the double path, as on mongod.
        "nan": f64::NAN,
    };
    for coll in ["orders", "orders_plain"] {
        let got = run(&cl, coll, &per_doc).await;
        assert_eq!(got.len(), 1, "{coll}");
        let mut got = got[0].clone();
        assert!(
            matches!(got.remove("nan"), Some(Bson::Double(f)) if f.is_nan()),
            "{coll}"
        );
        let mut want = want.clone();
        want.remove("nan");
        assert_eq!(got, want, "{coll}");
    }
    // After the router's $group on the sharded collection (the sum of six 2s is 12).
    let merged = vec![
        doc! {"$match": {"_id": {"$gte": 2000}}},
        doc! {"$group": {"_id": null, "s": {"$sum": "$v"}}},
        doc! {"$project": {"_id": 0, "root": {"$sqrt": "$s"}, "e": {"$exp": {"$ln": "$s"}}}},
    ];
    let want = vec![doc! {
        "root": dec("3.464101615137754587054892683011745"),
        "e": dec("12.00000000000000000000000000000000"),
    }];
    for coll in ["orders", "orders_plain"] {
        assert_eq!(run(&cl, coll, &merged).await, want, "{coll}");
    }
    let fails = [
        (doc! {"$sqrt": dec("-1")}, 28714),
        (doc! {"$ln": dec("-1")}, 28766),
        (doc! {"$log10": dec("0")}, 28761),
        (doc! {"$log": ["x", 2]}, 28756),
        (doc! {"$log": [8, "x"]}, 28757),
        (doc! {"$log": [dec("-8"), 2]}, 28758),
        (doc! {"$log": [8, dec("1")]}, 28759),
        (doc! {"$log": [8, 1]}, 28759),
        (doc! {"$pow": ["x", 2]}, 28762),
        (doc! {"$pow": [2, "x"]}, 28763),
        (doc! {"$pow": [dec("0"), -1]}, 28764),
    ];
    for (expr, code) in fails {
        let pipeline = vec![
            doc! {"$match": {"_id": 2000}},
            doc! {"$project": {"x": expr.clone()}},
        ];
        assert_eq!(failure_code(&cl, &pipeline).await, code, "{expr:?}");
    }
    // Integer $pow as mongod multiplies it: a base of -1, 0 or 1 always stays an integer (a
    // negative exponent leaves 1), others only up to exponent 63.
    let ints = vec![
        doc! {"$match": {"_id": 2000}},
        doc! {"$project": {"_id": 0,
        "a": {"$pow": [-1, -3]}, "b": {"$pow": [-1, 9_000_000_001_i64]},
        "c": {"$pow": [2, 62]}, "d": {"$pow": [2, -1]}, "e": {"$pow": [3, 3]}}},
    ];
    let want = vec![doc! {
        "a": 1, "b": -1_i64, "c": 4_611_686_018_427_387_904_i64, "d": 0.5, "e": 27,
    }];
    for coll in ["orders", "orders_plain"] {
        assert_eq!(run(&cl, coll, &ints).await, want, "{coll}");
    }
}
