//! What existing applications send at start-up and in migrations, through the router with the
//! stock Rust driver: `create` of an existing collection (48, which ODMs ignore), `collMod`,
//! `validate`, `dataSize` and `renameCollection` on sharded and unsharded collections.

mod common;

use bson::{doc, Document};
use common::{error_code, TestCluster};

async fn setup() -> (TestCluster, mongodb::Client) {
    let c = TestCluster::start(3, &[("app.users", doc! {"_id": "hashed"})]).await;
    let cl = common::driver(c.addr(), "").await;
    for coll in ["users", "plain"] {
        let docs: Vec<Document> = (0..60).map(|i| doc! {"_id": i, "n": i}).collect();
        cl.database("app")
            .collection::<Document>(coll)
            .insert_many(docs)
            .await
            .unwrap();
    }
    (c, cl)
}

#[tokio::test]
async fn create_of_an_existing_collection_is_namespace_exists() {
    let (_c, cl) = setup().await;
    let db = cl.database("app");
    for coll in ["users", "plain"] {
        let e = db.create_collection(coll).await.unwrap_err();
        assert_eq!(error_code(&e), 48, "{coll}: {e}");
        assert!(
            e.to_string()
                .contains(&format!("app.{coll} already exists")),
            "{e}"
        );
    }
    db.create_collection("fresh").await.unwrap();
}

#[tokio::test]
async fn coll_mod_validate_and_data_size_on_a_sharded_collection() {
    let (_c, cl) = setup().await;
    let db = cl.database("app");
    for coll in ["users", "plain"] {
        let r = db
            .run_command(doc! {"collMod": coll, "validator": {"n": {"$gte": 0}}})
            .await
            .unwrap();
        assert_eq!(r.get_f64("ok").unwrap(), 1.0);
        let e = db
            .run_command(doc! {"collMod": coll, "bogus": 1})
            .await
            .unwrap_err();
        assert_eq!(error_code(&e), 40415);
    }
    let e = db
        .run_command(doc! {"collMod": "missing", "validator": {}})
        .await
        .unwrap_err();
    assert_eq!(error_code(&e), 26);

    let r = db.run_command(doc! {"validate": "users"}).await.unwrap();
    assert!(r.get_bool("valid").unwrap(), "{r}");
    let raw = r.get_document("raw").unwrap();
    assert_eq!(raw.len(), 3, "every shard owning chunks answers: {r}");
    let nrecords: i64 = raw
        .values()
        .map(|v| v.as_document().unwrap().get_i64("nrecords").unwrap())
        .sum();
    assert_eq!(nrecords, 60);
    let r = db.run_command(doc! {"validate": "plain"}).await.unwrap();
    assert_eq!(r.get_i64("nrecords").unwrap(), 60);
    let e = db
        .run_command(doc! {"validate": "missing"})
        .await
        .unwrap_err();
    assert_eq!(error_code(&e), 26);

    for coll in ["users", "plain"] {
        let r = db
            .run_command(doc! {"dataSize": format!("app.{coll}")})
            .await
            .unwrap();
        assert_eq!(r.get_i64("numObjects").unwrap(), 60, "{coll}: {r}");
        assert!(r.get_i64("size").unwrap() > 60 * 10);
    }
}

#[tokio::test]
async fn rename_collection_sharded_and_unsharded() {
    let (c, cl) = setup().await;
    let admin = cl.database("admin");
    let db = cl.database("app");
    admin
        .run_command(doc! {"renameCollection": "app.plain", "to": "app.plain2"})
        .await
        .unwrap();
    assert_eq!(
        db.collection::<Document>("plain2")
            .count_documents(doc! {})
            .await
            .unwrap(),
        60
    );
    let e = admin
        .run_command(doc! {"renameCollection": "app.nothing", "to": "app.x"})
        .await
        .unwrap_err();
    assert_eq!(error_code(&e), 26);
    let e = admin
        .run_command(doc! {"renameCollection": "app.users", "to": "other.users"})
        .await
        .unwrap_err();
    assert_eq!(error_code(&e), 125);
    let e = admin
        .run_command(doc! {"renameCollection": "app.users", "to": "app.plain2"})
        .await
        .unwrap_err();
    assert_eq!(error_code(&e), 48);

    admin
        .run_command(doc! {"renameCollection": "app.users", "to": "app.people"})
        .await
        .unwrap();
    let people = db.collection::<Document>("people");
    assert_eq!(people.count_documents(doc! {}).await.unwrap(), 60);
    assert_eq!(c.count_on_shards("app", "people"), 60);
    assert_eq!(c.count_on_shards("app", "users"), 0);
    // Still sharded under its new name: a point read targets one shard.
    let r = cl
        .database("config")
        .collection::<Document>("collections")
        .find_one(doc! {"_id": "app.people"})
        .await
        .unwrap();
    assert!(r.is_some(), "the metadata follows the rename");
    let one = people.find_one(doc! {"_id": 7}).await.unwrap().unwrap();
    assert_eq!(one.get_i32("n").unwrap(), 7);
}

/// `convertToCapped`, `compact` and `reIndex` as mongos answers them: `convertToCapped` of a
/// sharded collection is refused (20) and an unsharded one goes to the primary shard;
/// `compact` is refused through mongos (115); mongos has no `reIndex` (59, since 4.2).
#[tokio::test]
async fn convert_to_capped_compact_and_reindex_as_mongos() {
    let (_c, cl) = setup().await;
    let db = cl.database("app");
    let e = db
        .run_command(doc! {"convertToCapped": "users", "size": 4096})
        .await
        .unwrap_err();
    assert_eq!(error_code(&e), 20, "{e}");
    assert!(
        e.to_string()
            .contains("You can't convertToCapped a sharded collection"),
        "{e}"
    );
    let e = db
        .run_command(doc! {"convertToCapped": "plain", "size": 4096})
        .await
        .unwrap_err();
    assert_ne!(
        error_code(&e),
        20,
        "the primary shard answers for an unsharded collection: {e}"
    );
    for coll in ["users", "plain"] {
        let e = db.run_command(doc! {"compact": coll}).await.unwrap_err();
        assert_eq!(error_code(&e), 115, "{coll}: {e}");
        assert!(
            e.to_string().contains("compact not allowed through mongos"),
            "{e}"
        );
        let e = db.run_command(doc! {"reIndex": coll}).await.unwrap_err();
        assert_eq!(error_code(&e), 59, "{coll}: {e}");
    }
}
