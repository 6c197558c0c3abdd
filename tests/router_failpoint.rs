//! The router's own `failCommand` fail point, as mongos implements it on itself when started
//! with test commands enabled: set with `configureFailPoint` on `admin`, never forwarded to a
//! shard, and acting on the router's replies (error codes with the labels drivers retry on,
//! `writeConcernError`, closed connections, blocked commands); plus `killAllSessions` and
//! `getParameter`'s `enableTestCommands`.

mod common;

use std::time::{Duration, Instant};

use bson::{doc, Document};
use common::{error_code, TestCluster};
use sluice::config::Config;

async fn cluster() -> (TestCluster, mongodb::Client) {
    let config = Config {
        enable_test_commands: true,
        ..Config::default()
    };
    let c = TestCluster::start_with(2, &[("app.s", doc! {"_id": "hashed"})], config).await;
    let cl = common::driver(c.addr(), "&retryWrites=true").await;
    (c, cl)
}

#[tokio::test]
async fn fail_command_on_the_router() {
    let (c, cl) = cluster().await;
    let admin = cl.database("admin");
    let coll = cl.database("app").collection::<Document>("s");
    let p = admin
        .run_command(doc! {"getParameter": 1, "enableTestCommands": 1})
        .await
        .unwrap();
    assert!(p.get_bool("enableTestCommands").unwrap());

    let e = cl
        .database("app")
        .run_command(doc! {"configureFailPoint": "failCommand", "mode": "off"})
        .await
        .unwrap_err();
    assert_eq!(error_code(&e), 13);

    // A retryable error once: the driver retries and the insert happens exactly once.
    let r = admin
        .run_command(doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["insert"], "errorCode": 262}})
        .await
        .unwrap();
    assert_eq!(r.get_i32("count").unwrap(), 0);
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    assert_eq!(c.count_on_shards("app", "s"), 1);
    assert_eq!(
        c.shard_command_total("configureFailPoint"),
        0,
        "never forwarded"
    );

    // The raw reply: code, message and RetryableWriteError for a retryable write.
    let mut raw = common::Raw::connect(c.addr()).await;
    raw.command(&doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["insert"], "errorCode": 11600}, "$db": "admin"}).await;
    let lsid =
        doc! {"id": bson::Binary {subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16]}};
    let r = raw
        .command(&doc! {"insert": "s", "documents": [{"_id": 2}], "lsid": lsid.clone(), "txnNumber": 1i64, "$db": "app"})
        .await;
    assert_eq!(r.get_i32("code").unwrap(), 11600, "{r}");
    assert_eq!(
        r.get_str("errmsg").unwrap(),
        "Failing command via 'failCommand' failpoint"
    );
    assert_eq!(
        r.get_array("errorLabels").unwrap()[0].as_str(),
        Some("RetryableWriteError")
    );
    assert!(r.contains_key("$clusterTime"));

    // writeConcernError: the write happens, the reply carries the error and its label.
    raw.command(&doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["insert"], "writeConcernError": {"code": 91, "errmsg": "Replication is being shut down"}}, "$db": "admin"}).await;
    let r = raw
        .command(&doc! {"insert": "s", "documents": [{"_id": 3}], "lsid": lsid, "txnNumber": 2i64, "$db": "app"})
        .await;
    assert_eq!(r.get_i32("n").unwrap(), 1, "{r}");
    assert_eq!(
        r.get_document("writeConcernError")
            .unwrap()
            .get_i32("code")
            .unwrap(),
        91
    );
    assert_eq!(
        r.get_array("errorLabels").unwrap()[0].as_str(),
        Some("RetryableWriteError")
    );

    // alwaysOn with explicit labels, then off (count 1).
    raw.command(&doc! {"configureFailPoint": "failCommand", "mode": "alwaysOn", "data": {"failCommands": ["find"], "errorCode": 2, "errorLabels": ["Custom"]}, "$db": "admin"}).await;
    for _ in 0..2 {
        let r = raw.command(&doc! {"find": "s", "$db": "app"}).await;
        assert_eq!(r.get_i32("code").unwrap(), 2);
        assert_eq!(
            r.get_array("errorLabels").unwrap()[0].as_str(),
            Some("Custom")
        );
    }
    let r = raw
        .command(&doc! {"configureFailPoint": "failCommand", "mode": "off", "$db": "admin"})
        .await;
    assert_eq!(r.get_i32("count").unwrap(), 1);
    let r = raw.command(&doc! {"find": "s", "$db": "app"}).await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0);

    // closeConnection and blockConnection.
    raw.command(&doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["ping"], "closeConnection": true}, "$db": "admin"}).await;
    raw.send_msg(&doc! {"ping": 1, "$db": "admin"}, 0).await;
    assert!(raw.is_closed().await);
    let mut raw = common::Raw::connect(c.addr()).await;
    raw.command(&doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["ping"], "blockConnection": true, "blockTimeMS": 300}, "$db": "admin"}).await;
    let t = Instant::now();
    let r = raw.command(&doc! {"ping": 1, "$db": "admin"}).await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0);
    assert!(t.elapsed() >= Duration::from_millis(300));

    let r = admin
        .run_command(doc! {"killAllSessions": []})
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok").unwrap(), 1.0);
}
