//! Update forms and find projections applications use, through the router with the stock Rust
//! driver, on a sharded collection and on an unsharded copy (one embedded shard, the oracle):
//! positional `$`, `$[]`, `$[<id>]` with `arrayFilters`, pipeline-style updates, `$push` with
//! `$each`/`$sort`/`$slice`/`$position`, `updateOne` with `sort`, and the `$slice`,
//! `$elemMatch` and positional projections.

mod common;

use bson::{doc, Bson, Document};
use common::{error_code, TestCluster};
use mongodb::options::{FindOneOptions, UpdateOptions};

fn students() -> Vec<Document> {
    (0..12)
        .map(|i| {
            doc! {
                "_id": i,
                "grades": [i % 5 * 20, 90 - i, 75, (i * 7) % 100],
                "items": [{"k": "a", "q": i}, {"k": "b", "q": 10 - i}, {"k": "c", "q": 5}],
                "score": i * 3,
            }
        })
        .collect()
}

#[tokio::test]
async fn updates_match_one_shard() {
    let c = TestCluster::start(3, &[("school.s", doc! {"_id": "hashed"})]).await;
    let cl = common::driver(c.addr(), "").await;
    let db = cl.database("school");
    for coll in ["s", "plain"] {
        let col = db.collection::<Document>(coll);
        col.insert_many(students()).await.unwrap();
        // Positional $: the first grade of 75 becomes 76.
        col.update_many(doc! {"grades": 75}, doc! {"$inc": {"grades.$": 1}})
            .await
            .unwrap();
        // $[]: every item's q doubled.
        col.update_many(doc! {}, doc! {"$mul": {"items.$[].q": 2}})
            .await
            .unwrap();
        // $[<id>] with arrayFilters: grades at or above 80 capped at 80.
        col.update_many(doc! {}, doc! {"$set": {"grades.$[g]": 80}})
            .with_options(
                UpdateOptions::builder()
                    .array_filters(vec![doc! {"g": {"$gte": 80}}])
                    .build(),
            )
            .await
            .unwrap();
        col.update_many(
            doc! {"_id": {"$lt": 6}},
            doc! {"$set": {"items.$[it].flag": true}},
        )
        .with_options(
            UpdateOptions::builder()
                .array_filters(vec![doc! {"it.k": "b", "it.q": {"$gt": 10}}])
                .build(),
        )
        .await
        .unwrap();
        // Pipeline-style update using the document's own fields and $$NOW.
        col.update_many(
            doc! {"score": {"$gte": 15}},
            vec![
                doc! {"$set": {"total": {"$sum": "$grades"}, "at": "$$NOW"}},
                doc! {"$unset": "score"},
            ],
        )
        .await
        .unwrap();
        // $push with modifiers.
        col.update_many(
            doc! {},
            doc! {"$push": {"grades": {"$each": [55, 101], "$sort": -1, "$slice": 3}}},
        )
        .await
        .unwrap();
        col.update_one(
            doc! {"_id": 3},
            doc! {"$push": {"items": {"$each": [{"k": "z", "q": -1}], "$position": 0, "$sort": {"q": 1}}}},
        )
        .await
        .unwrap();
    }
    let strip = |mut d: Document| {
        d.remove("at");
        d
    };
    for i in 0..12 {
        let a = db
            .collection::<Document>("s")
            .find_one(doc! {"_id": i})
            .await
            .unwrap()
            .unwrap();
        let b = db
            .collection::<Document>("plain")
            .find_one(doc! {"_id": i})
            .await
            .unwrap()
            .unwrap();
        assert_eq!(strip(a.clone()), strip(b), "_id {i}");
        if i == 0 {
            // grades [0, 90, 75, 0] → [0, 80, 76, 0] → push 55, 101, sort desc, first 3.
            assert_eq!(
                a.get_array("grades").unwrap(),
                &vec![Bson::Int32(101), Bson::Int32(80), Bson::Int32(76)]
            );
            let items = a.get_array("items").unwrap();
            assert_eq!(items[1].as_document().unwrap().get_i32("q").unwrap(), 20);
            assert!(items[1].as_document().unwrap().get_bool("flag").unwrap());
        }
        if i >= 5 {
            assert!(
                a.contains_key("total") && a.contains_key("at") && !a.contains_key("score"),
                "{a}"
            );
        }
    }
    // Errors mongod gives.
    let col = db.collection::<Document>("plain");
    let e = col
        .update_one(doc! {"_id": 1}, doc! {"$set": {"grades.$[nope]": 1}})
        .await
        .unwrap_err();
    assert_eq!(error_code(&e), 2, "{e}");
    let e = col
        .update_one(doc! {"_id": 1}, doc! {"$set": {"grades.$[g]": 1}})
        .with_options(
            UpdateOptions::builder()
                .array_filters(vec![doc! {"g": 1}, doc! {"h": 2}])
                .build(),
        )
        .await
        .unwrap_err();
    assert_eq!(error_code(&e), 9, "{e}");
    let e = col
        .update_one(doc! {"_id": 1}, doc! {"$set": {"grades.$": 1}})
        .await
        .unwrap_err();
    assert_eq!(error_code(&e), 2, "{e}");
    let e = col
        .update_one(doc! {"_id": 1}, vec![doc! {"$group": {"_id": 1}}])
        .await
        .unwrap_err();
    assert_eq!(error_code(&e), 72, "{e}");
}

#[tokio::test]
async fn projections_and_update_sort() {
    let c = TestCluster::start(3, &[("school.s", doc! {"_id": "hashed"})]).await;
    let cl = common::driver(c.addr(), "").await;
    let db = cl.database("school");
    for coll in ["s", "plain"] {
        let col = db.collection::<Document>(coll);
        col.insert_many(students()).await.unwrap();
        let one = |filter: Document, projection: Document| {
            let col = col.clone();
            async move {
                col.find_one(filter)
                    .with_options(FindOneOptions::builder().projection(projection).build())
                    .await
                    .unwrap()
                    .unwrap()
            }
        };
        let d = one(doc! {"_id": 2}, doc! {"grades": {"$slice": 2}}).await;
        assert_eq!(
            d.get_array("grades").unwrap(),
            &vec![Bson::Int32(40), Bson::Int32(88)],
            "{coll}"
        );
        assert!(
            d.contains_key("items"),
            "$slice alone keeps the other fields"
        );
        let d = one(
            doc! {"_id": 2},
            doc! {"grades": {"$slice": [-2, 1]}, "_id": 0, "score": 1},
        )
        .await;
        assert_eq!(d, doc! {"grades": [75], "score": 6});
        let d = one(
            doc! {"_id": 2},
            doc! {"items": {"$elemMatch": {"q": {"$gte": 5}}}},
        )
        .await;
        assert_eq!(d, doc! {"_id": 2, "items": [{"k": "b", "q": 8}]});
        let d = one(doc! {"_id": 2, "items.k": "c"}, doc! {"items.$": 1}).await;
        assert_eq!(d, doc! {"_id": 2, "items": [{"k": "c", "q": 5}]});
        let d = one(
            doc! {"_id": 2},
            doc! {"twice": {"$multiply": ["$score", 2]}, "_id": 0},
        )
        .await;
        assert_eq!(d, doc! {"twice": 12});
        // updateOne with sort: the highest score among the even ids.
        col.update_one(
            doc! {"_id": {"$in": [0, 2, 4, 6]}},
            doc! {"$set": {"top": true}},
        )
        .sort(doc! {"score": -1})
        .await
        .unwrap();
        let top = col.find_one(doc! {"top": true}).await.unwrap().unwrap();
        assert_eq!(top.get_i32("_id").unwrap(), 6, "{coll}");
    }
}

/// `findAndModify` whose query does not pin the shard key (mongos 8.0's write without shard
/// key): the document the one-shard oracle picks (by `sort`) is the one modified through the
/// router, upserts by `_id` insert where the new document's key belongs, and a document on
/// no shard leaves `value: null`. Sharded on `sk`, so a query on `_id` or `score` names none.
#[tokio::test]
async fn find_and_modify_without_shard_key() {
    let c = TestCluster::start(3, &[("school.k", doc! {"sk": "hashed"})]).await;
    let cl = common::driver(c.addr(), "").await;
    let db = cl.database("school");
    let mut results = Vec::new();
    for coll in ["k", "plain"] {
        let col = db.collection::<Document>(coll);
        let docs: Vec<Document> = students()
            .into_iter()
            .map(|mut d| {
                let id = d.get_i32("_id").unwrap();
                d.insert("sk", id * 13 % 7);
                d
            })
            .collect();
        col.insert_many(docs).await.unwrap();
        let mut got = Vec::new();
        for (query, update, sort) in [
            (doc! {"_id": 4}, doc! {"$inc": {"score": 100}}, None),
            (
                doc! {"score": {"$gte": 9}},
                doc! {"$set": {"first": true}},
                Some(doc! {"score": 1}),
            ),
            (
                doc! {"score": {"$lt": 30}},
                doc! {"$set": {"last": true}},
                Some(doc! {"score": -1, "_id": 1}),
            ),
            (doc! {"_id": 99}, doc! {"$set": {"x": 1}}, None),
        ] {
            let mut cmd =
                doc! {"findAndModify": coll, "query": query, "update": update, "new": true};
            if let Some(s) = sort {
                cmd.insert("sort", s);
            }
            let r = db.run_command(cmd.clone()).await.unwrap();
            got.push((
                r.get("value").cloned(),
                r.get_document("lastErrorObject").unwrap().get("n").cloned(),
            ));
        }
        // Removal with a sort, then an upsert by _id whose $set carries the shard key.
        let r = db
            .run_command(doc! {"findAndModify": coll, "query": {"score": {"$lt": 20}}, "sort": {"score": -1}, "remove": true})
            .await
            .unwrap();
        got.push((r.get("value").cloned(), None));
        let r = db
            .run_command(doc! {"findAndModify": coll, "query": {"_id": 500}, "update": {"$set": {"sk": 3, "v": 1}}, "upsert": true, "new": true})
            .await
            .unwrap();
        got.push((
            r.get("value").cloned(),
            r.get_document("lastErrorObject")
                .unwrap()
                .get("upserted")
                .cloned(),
        ));
        let all = common::all(col.find(doc! {}).sort(doc! {"_id": 1}).await.unwrap()).await;
        results.push((got, all));
    }
    let (sharded, plain) = (&results[0], &results[1]);
    assert_eq!(sharded, plain);
    let got = &sharded.0;
    assert_eq!(
        got[0]
            .0
            .as_ref()
            .unwrap()
            .as_document()
            .unwrap()
            .get_i32("score")
            .unwrap(),
        112
    );
    assert_eq!(
        got[1]
            .0
            .as_ref()
            .unwrap()
            .as_document()
            .unwrap()
            .get_i32("_id")
            .unwrap(),
        3
    );
    assert_eq!(
        got[2]
            .0
            .as_ref()
            .unwrap()
            .as_document()
            .unwrap()
            .get_i32("_id")
            .unwrap(),
        9
    );
    assert_eq!(got[3], (Some(Bson::Null), Some(Bson::Int32(0))));
    assert_eq!(
        got[4]
            .0
            .as_ref()
            .unwrap()
            .as_document()
            .unwrap()
            .get_i32("_id")
            .unwrap(),
        6
    );
    assert_eq!(got[5].1, Some(Bson::Int32(500)));
    assert_eq!(sharded.1.len(), 12);
}

/// `$bit` as mongod applies it (and/or/xor in order, an int stays an int until a long takes
/// part, a missing field starts from int 0), the same through the router on a sharded
/// collection as on the one-shard oracle, and mongod's errors (2) for bad arguments and
/// non-integral fields.
#[tokio::test]
async fn bit_updates_match_one_shard() {
    let c = TestCluster::start(3, &[("school.b", doc! {"_id": "hashed"})]).await;
    let cl = common::driver(c.addr(), "").await;
    let db = cl.database("school");
    let mut all = Vec::new();
    for coll in ["b", "plain_b"] {
        let col = db.collection::<Document>(coll);
        col.insert_many(vec![
            doc! {"_id": 1, "a": 12, "l": 12i64},
            doc! {"_id": 2, "a": 5},
            doc! {"_id": 3, "s": "x"},
        ])
        .await
        .unwrap();
        col.update_many(
            doc! {"_id": {"$in": [1, 2]}},
            doc! {"$bit": {"a": {"and": 10, "or": 1}}},
        )
        .await
        .unwrap();
        col.update_one(doc! {"_id": 1}, doc! {"$bit": {"l": {"xor": 5}}})
            .await
            .unwrap();
        col.update_one(doc! {"_id": 1}, doc! {"$bit": {"a": {"or": 16i64}}})
            .await
            .unwrap();
        col.update_one(doc! {"_id": 2}, doc! {"$bit": {"m": {"or": 6}}})
            .await
            .unwrap();
        for (u, id, message) in [
            (doc! {"$bit": {"a": 5}}, 1, "The $bit modifier is not compatible with a int. You must pass in an embedded document: {$bit: {field: {and/or/xor: #}}"),
            (doc! {"$bit": {"a": {"not": 1}}}, 1, "The $bit modifier only supports 'and', 'or', and 'xor', not 'not' which is an unknown operator: {not: 1}"),
            (doc! {"$bit": {"a": {"and": 1.5}}}, 1, "The $bit modifier field must be an Integer(32/64 bit); a 'double' is not supported here: {and: 1.5}"),
            (doc! {"$bit": {"a": {}}}, 1, "You must pass in at least one bitwise operation. The format is: {$bit: {field: {and/or/xor: #}}"),
            (doc! {"$bit": {"s": {"and": 1}}}, 3, "Cannot apply $bit to a value of non-integral type._id: 3 has the field s of non-integral type string"),
        ] {
            let e = col.update_one(doc! {"_id": id}, u.clone()).await.unwrap_err();
            assert_eq!(error_code(&e), 2, "{coll} {u}: {e}");
            assert!(e.to_string().contains(message), "{coll} {u}: {e}");
        }
        all.push(common::all(col.find(doc! {}).sort(doc! {"_id": 1}).await.unwrap()).await);
    }
    assert_eq!(all[0], all[1]);
    assert_eq!(
        all[0],
        vec![
            doc! {"_id": 1, "a": 25i64, "l": 9i64},
            doc! {"_id": 2, "a": 1, "m": 6},
            doc! {"_id": 3, "s": "x"},
        ]
    );
}

/// Decimal arithmetic through the router on a sharded collection and on the unsharded copy:
/// `$inc`/`$mul` with decimals in the embedded shards, `$add` and `$sum`/`$avg` (split per
/// shard and summed again at the router) in decimal128, exact where doubles are not.
#[tokio::test]
async fn decimal_arithmetic_is_exact_on_a_sharded_collection() {
    let c = TestCluster::start(3, &[("ledger.d", doc! {"_id": "hashed"})]).await;
    let cl = common::driver(c.addr(), "").await;
    let db = cl.database("ledger");
    let dec = |s: &str| Bson::Decimal128(s.parse().unwrap());
    let docs: Vec<Document> = (0..20)
        .map(|i| doc! {"_id": i, "p": dec("0.1"), "q": i, "big": i64::MAX, "k": i % 2})
        .collect();
    let mut results = Vec::new();
    for coll in ["d", "plain"] {
        let col = db.collection::<Document>(coll);
        col.insert_many(docs.clone()).await.unwrap();
        col.update_many(doc! {}, doc! {"$inc": {"p": dec("0.2")}})
            .await
            .unwrap();
        col.update_many(doc! {}, doc! {"$inc": {"q": dec("1.10")}})
            .await
            .unwrap();
        col.update_many(doc! {}, doc! {"$mul": {"big": dec("1.0")}})
            .await
            .unwrap();
        let mut found = Vec::new();
        for i in 0..20 {
            found.push(col.find_one(doc! {"_id": i}).await.unwrap().unwrap());
        }
        let mut cursor = col
            .aggregate(vec![
                doc! {"$group": {
                    "_id": "$k",
                    "s": {"$sum": "$p"},
                    "a": {"$avg": "$p"},
                    "t": {"$sum": {"$add": ["$p", "$q", "$big", dec("0.5")]}},
                }},
                doc! {"$sort": {"_id": 1}},
            ])
            .await
            .unwrap();
        let mut groups = Vec::new();
        while cursor.advance().await.unwrap() {
            groups.push(cursor.deserialize_current().unwrap());
        }
        results.push((found, groups));
    }
    assert_eq!(results[0], results[1]);
    let (found, groups) = &results[0];
    // 0.1 + 0.2 is exactly 0.3; 7 + 1.10 keeps the decimal's digits; long.MAX × 1.0 every digit.
    assert_eq!(found[7].get("p"), Some(&dec("0.3")), "{}", found[7]);
    assert_eq!(found[7].get("q"), Some(&dec("8.10")), "{}", found[7]);
    assert_eq!(
        found[7].get("big"),
        Some(&dec("9223372036854775807.0")),
        "{}",
        found[7]
    );
    // Ten documents per group: Σp = 3.0, mean 0.3; Σ(p + q + big + 0.5) with q = i + 1.10
    // (the expected sum computed with Python's `decimal`).
    assert_eq!(groups[0].get("s"), Some(&dec("3.0")), "{}", groups[0]);
    assert_eq!(groups[0].get("a"), Some(&dec("0.3")), "{}", groups[0]);
    assert_eq!(
        groups[0].get("t"),
        Some(&dec("92233720368547758179.00")),
        "{}",
        groups[0]
    );
}
