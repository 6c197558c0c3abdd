//! What the drivers' unified CRUD specification tests need of the engine, through the router
//! in front of three shards (one sharded collection, hashed on `_id`, and one unsharded):
//! the `collation` option in every read and write, field names with dots and dollars written
//! through `$setField`, and mongod's refusal of a `$`-prefixed name in `_id`.

mod common;

use bson::{doc, Bson, Document};
use common::{command_code, error_code, TestCluster};

const COLLATION: fn() -> Document = || doc! {"locale": "en_US", "strength": 2};

async fn setup() -> (TestCluster, mongodb::Client) {
    let c = TestCluster::start(3, &[("crud.sharded", doc! {"_id": "hashed"})]).await;
    let cl = common::driver(c.addr(), "").await;
    (c, cl)
}

async fn seed(db: &mongodb::Database, coll: &str) {
    db.collection::<Document>(coll).drop().await.unwrap();
    let docs: Vec<Document> = [
        (1, "ping"),
        (2, "PING"),
        (3, "pINg"),
        (4, "pong"),
        (5, "Pong"),
    ]
    .iter()
    .map(|(i, x)| doc! {"_id": *i, "x": *x})
    .collect();
    db.collection::<Document>(coll)
        .insert_many(docs)
        .await
        .unwrap();
}

async fn ids(db: &mongodb::Database, coll: &str, filter: Document) -> Vec<i32> {
    let r = db
        .run_command(doc! {"find": coll, "filter": filter, "sort": {"_id": 1}})
        .await
        .unwrap();
    r.get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap()
        .iter()
        .map(|d| d.as_document().unwrap().get_i32("_id").unwrap())
        .collect()
}

#[tokio::test]
async fn collation_decides_matching_sorting_and_distinct() {
    let (_c, cl) = setup().await;
    let db = cl.database("crud");
    for coll in ["sharded", "plain"] {
        seed(&db, coll).await;
        // find: matching under the collation, and the router's merge sorts by it.
        let r = db
            .run_command(doc! {"find": coll, "filter": {"x": {"$in": ["PING", "PONG"]}}, "sort": {"x": -1, "_id": 1}, "collation": COLLATION()})
            .await
            .unwrap();
        let got: Vec<i32> = r
            .get_document("cursor")
            .unwrap()
            .get_array("firstBatch")
            .unwrap()
            .iter()
            .map(|d| d.as_document().unwrap().get_i32("_id").unwrap())
            .collect();
        assert_eq!(got, [4, 5, 1, 2, 3], "{coll}");
        let r = db
            .run_command(doc! {"count": coll, "query": {"x": "Ping"}, "collation": COLLATION()})
            .await
            .unwrap();
        assert_eq!(r.get_i32("n").unwrap(), 3, "{coll}");
        let r = db
            .run_command(doc! {"distinct": coll, "key": "x", "query": {}, "collation": COLLATION()})
            .await
            .unwrap();
        assert_eq!(r.get_array("values").unwrap().len(), 2, "{coll}: {r}");
        let r = db
            .run_command(doc! {"aggregate": coll, "pipeline": [{"$match": {"x": "PONG"}}, {"$group": {"_id": "$x", "n": {"$sum": 1}}}], "cursor": {}, "collation": COLLATION()})
            .await
            .unwrap();
        let groups = r
            .get_document("cursor")
            .unwrap()
            .get_array("firstBatch")
            .unwrap();
        assert_eq!(groups.len(), 1, "{coll}: {r}");
        assert_eq!(groups[0].as_document().unwrap().get_i32("n").unwrap(), 2);
        // Without a collation, strings compare byte by byte.
        assert_eq!(ids(&db, coll, doc! {"x": "PING"}).await, [2], "{coll}");

        // Writes: update, delete and findAndModify statements each under their collation.
        let r = db
            .run_command(doc! {"update": coll, "updates": [
                {"q": {"x": "PING"}, "u": {"$set": {"hit": true}}, "multi": true, "collation": COLLATION()},
                {"q": {"x": "PONG"}, "u": {"$set": {"hit": false}}, "multi": true},
            ]})
            .await
            .unwrap();
        assert_eq!(r.get_i32("n").unwrap(), 3, "{coll}: {r}");
        let r = db
            .run_command(doc! {"findAndModify": coll, "query": {"x": "pong"}, "sort": {"x": 1, "_id": -1}, "remove": true, "collation": COLLATION()})
            .await
            .unwrap();
        assert_eq!(
            r.get_document("value").unwrap().get_i32("_id").unwrap(),
            5,
            "{coll}: {r}"
        );
        let r = db
            .run_command(doc! {"delete": coll, "deletes": [{"q": {"x": "ping"}, "limit": 0, "collation": COLLATION()}]})
            .await
            .unwrap();
        assert_eq!(r.get_i32("n").unwrap(), 3, "{coll}: {r}");
        assert_eq!(ids(&db, coll, doc! {}).await, [4], "{coll}");

        let e = db
            .run_command(doc! {"find": coll, "collation": {"locale": "en", "strength": 0}})
            .await
            .unwrap_err();
        assert_eq!(command_code(&e), 2, "{coll}: {e}");
    }
}

#[tokio::test]
async fn set_field_writes_dotted_and_dollar_prefixed_names() {
    let (_c, cl) = setup().await;
    let db = cl.database("crud");
    for coll in ["sharded", "plain"] {
        let col = db.collection::<Document>(coll);
        col.drop().await.unwrap();
        col.insert_one(doc! {"_id": 1, "foo": {}}).await.unwrap();
        col.update_one(
            doc! {"_id": 1},
            vec![doc! {"$replaceWith": {"$setField": {"field": {"$literal": "$a"}, "value": 1, "input": "$$ROOT"}}}],
        )
        .await
        .unwrap();
        col.update_one(
            doc! {"_id": 1},
            vec![doc! {"$set": {"foo": {"$setField": {"field": {"$literal": "a.b"}, "value": 2, "input": "$foo"}}}}],
        )
        .await
        .unwrap();
        let stored = col.find_one(doc! {"_id": 1}).await.unwrap().unwrap();
        assert_eq!(
            stored,
            doc! {"_id": 1, "foo": {"a.b": 2}, "$a": 1},
            "{coll}"
        );
        // $getField reads the names back; $unsetField removes one.
        let r = db
            .run_command(doc! {"aggregate": coll, "pipeline": [
                {"$project": {"_id": 0, "a": {"$getField": {"$literal": "$a"}}, "ab": {"$getField": {"field": "a.b", "input": "$foo"}}}},
            ], "cursor": {}})
            .await
            .unwrap();
        let first = r
            .get_document("cursor")
            .unwrap()
            .get_array("firstBatch")
            .unwrap()[0]
            .clone();
        assert_eq!(first, Bson::Document(doc! {"a": 1, "ab": 2}), "{coll}");
        col.update_one(
            doc! {"_id": 1},
            vec![doc! {"$replaceWith": {"$unsetField": {"field": {"$literal": "$a"}, "input": "$$ROOT"}}}],
        )
        .await
        .unwrap();
        let stored = col.find_one(doc! {"_id": 1}).await.unwrap().unwrap();
        assert_eq!(stored, doc! {"_id": 1, "foo": {"a.b": 2}}, "{coll}");
        // A field path where a constant name is required: mongod's 4161108.
        let e = col
            .update_one(
                doc! {"_id": 1},
                vec![doc! {"$replaceWith": {"$setField": {"field": "$a", "value": 1, "input": "$$ROOT"}}}],
            )
            .await
            .unwrap_err();
        assert_eq!(error_code(&e), 4161108, "{coll}: {e}");
    }
}

#[tokio::test]
async fn dollar_prefixed_names_in_id_are_refused() {
    let (_c, cl) = setup().await;
    let db = cl.database("crud");
    for coll in ["sharded", "plain"] {
        let col = db.collection::<Document>(coll);
        let e = col.insert_one(doc! {"_id": {"$a": 1}}).await.unwrap_err();
        assert_eq!(error_code(&e), 52, "{coll}: {e}");
        col.insert_one(doc! {"_id": {"a": 1}, "$b": 1})
            .await
            .unwrap();
        assert_eq!(
            col.count_documents(doc! {"_id": {"a": 1}}).await.unwrap(),
            1,
            "{coll}"
        );
    }
}

#[tokio::test]
async fn list_local_sessions_lists_the_routers_sessions() {
    let (_c, cl) = setup().await;
    let admin = cl.database("admin");
    let mut session = cl.start_session().await.unwrap();
    let id = match session.id().get("id") {
        Some(Bson::Binary(b)) => b.bytes.clone(),
        other => panic!("{other:?}"),
    };
    cl.database("crud")
        .run_command(doc! {"ping": 1})
        .session(&mut session)
        .await
        .unwrap();
    let r = admin
        .run_command(doc! {"aggregate": 1, "pipeline": [
            {"$listLocalSessions": {}},
            {"$project": {"_id": 1, "lastUse": 1}},
        ], "cursor": {}})
        .await
        .unwrap();
    let listed = r
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap();
    let ids: Vec<Vec<u8>> = listed
        .iter()
        .map(|d| {
            let key = d.as_document().unwrap().get_document("_id").unwrap();
            assert_eq!(key.get_binary_generic("uid").unwrap().len(), 32, "{key}");
            match key.get("id") {
                Some(Bson::Binary(b)) => b.bytes.clone(),
                other => panic!("{other:?}"),
            }
        })
        .collect();
    assert!(ids.contains(&id), "{listed:?}");
    // Any database's {aggregate: 1}; not a collection's.
    let r = cl
        .database("crud")
        .run_command(doc! {"aggregate": 1, "pipeline": [{"$listLocalSessions": {"allUsers": true}}, {"$count": "n"}], "cursor": {}})
        .await
        .unwrap();
    let n = r
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap()[0]
        .as_document()
        .unwrap()
        .get_i32("n")
        .unwrap();
    assert!(n >= 1);
    let e = cl
        .database("crud")
        .run_command(
            doc! {"aggregate": "plain", "pipeline": [{"$listLocalSessions": {}}], "cursor": {}},
        )
        .await
        .unwrap_err();
    assert_eq!(command_code(&e), 73, "{e}");
    let e = admin
        .run_command(
            doc! {"aggregate": 1, "pipeline": [{"$listLocalSessions": {"x": 1}}], "cursor": {}},
        )
        .await
        .unwrap_err();
    assert_eq!(command_code(&e), 40415, "{e}");
}

#[tokio::test]
async fn output_stages_refuse_a_linearizable_read() {
    let (_c, cl) = setup().await;
    let db = cl.database("crud");
    for coll in ["sharded", "plain"] {
        seed(&db, coll).await;
        for stage in [doc! {"$out": "copy"}, doc! {"$merge": {"into": "sharded"}}] {
            let e = db
                .run_command(doc! {"aggregate": coll, "pipeline": [{"$match": {"_id": {"$gt": 1}}}, stage.clone()], "cursor": {}, "readConcern": {"level": "linearizable"}})
                .await
                .unwrap_err();
            assert_eq!(command_code(&e), 72, "{coll} {stage}: {e}");
        }
    }
    let copies = db
        .collection::<Document>("copy")
        .count_documents(doc! {})
        .await
        .unwrap();
    assert_eq!(copies, 0);
}
