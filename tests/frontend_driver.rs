//! The stock Rust driver connects to the router and sees a mongos.

mod common;

use bson::doc;
use common::{driver, start_router};

#[tokio::test]
async fn driver_sees_a_mongos() {
    let router = start_router().await;
    let client = driver(router.local_addr(), "").await;
    let admin = client.database("admin");

    let hello = admin.run_command(doc! {"hello": 1}).await.unwrap();
    assert_eq!(hello.get_str("msg").unwrap(), "isdbgrid");
    assert!(hello.get_bool("isWritablePrimary").unwrap());
    assert_eq!(hello.get_i32("maxWireVersion").unwrap(), 25);
    assert_eq!(
        hello.get_i32("maxBsonObjectSize").unwrap(),
        16 * 1024 * 1024
    );
    assert_eq!(hello.get_i32("maxMessageSizeBytes").unwrap(), 48_000_000);
    assert_eq!(hello.get_i32("maxWriteBatchSize").unwrap(), 100_000);
    assert_eq!(hello.get_i32("logicalSessionTimeoutMinutes").unwrap(), 30);
    assert!(hello.get_document("topologyVersion").is_ok());
    assert!(hello.get_datetime("localTime").is_ok());
    assert!(hello.get("connectionId").is_some());

    let is_master = admin.run_command(doc! {"isMaster": 1}).await.unwrap();
    assert!(is_master.get_bool("ismaster").unwrap());
    assert!(!is_master.contains_key("isWritablePrimary"));

    let ping = admin.run_command(doc! {"ping": 1}).await.unwrap();
    assert_eq!(ping.get_f64("ok").unwrap(), 1.0);
    assert!(ping.get_document("$clusterTime").is_ok());
    assert!(ping.get_timestamp("operationTime").is_ok());

    let info = admin.run_command(doc! {"buildInfo": 1}).await.unwrap();
    assert_eq!(info.get_str("version").unwrap(), "8.0.4");
    assert_eq!(
        info.get_document("sluice")
            .unwrap()
            .get_str("version")
            .unwrap(),
        env!("CARGO_PKG_VERSION")
    );

    let err = admin
        .run_command(doc! {"noSuchThing": 1})
        .await
        .unwrap_err();
    match *err.kind {
        mongodb::error::ErrorKind::Command(ref e) => {
            assert_eq!(e.code, 59);
            assert_eq!(e.code_name, "CommandNotFound");
            assert_eq!(e.message, "no such command: 'noSuchThing'");
        }
        ref other => panic!("unexpected error {other:?}"),
    }
    router.shutdown().await;
}

#[tokio::test]
async fn driver_negotiates_each_compressor() {
    let router = start_router().await;
    for name in ["snappy", "zlib", "zstd"] {
        let client = driver(router.local_addr(), &format!("&compressors={name}")).await;
        let admin = client.database("admin");
        let status = admin.run_command(doc! {"serverStatus": 1}).await.unwrap();
        let before = counters(&status, name);
        for _ in 0..3 {
            admin.run_command(doc! {"ping": 1}).await.unwrap();
        }
        let status = admin.run_command(doc! {"serverStatus": 1}).await.unwrap();
        let after = counters(&status, name);
        assert!(
            after.0 > before.0 && after.1 > before.1,
            "{name}: compressed traffic must flow both ways ({before:?} -> {after:?})"
        );
        client.shutdown().await;
    }
    router.shutdown().await;
}

/// (decompressor bytesIn, compressor bytesOut) for one compressor.
fn counters(status: &bson::Document, name: &str) -> (i64, i64) {
    let c = status
        .get_document("network")
        .and_then(|n| n.get_document("compression"))
        .and_then(|c| c.get_document(name))
        .unwrap();
    (
        c.get_document("decompressor")
            .unwrap()
            .get_i64("bytesIn")
            .unwrap(),
        c.get_document("compressor")
            .unwrap()
            .get_i64("bytesOut")
            .unwrap(),
    )
}

#[tokio::test]
async fn server_status_and_startup_commands() {
    let router = start_router().await;
    let client = driver(router.local_addr(), "").await;
    let admin = client.database("admin");
    let status = admin.run_command(doc! {"serverStatus": 1}).await.unwrap();
    assert_eq!(status.get_str("process").unwrap(), "mongos");
    assert!(
        status
            .get_document("connections")
            .unwrap()
            .get_i32("current")
            .unwrap()
            >= 1
    );
    assert!(
        status
            .get_document("opcounters")
            .unwrap()
            .get_i64("command")
            .unwrap()
            >= 1
    );
    assert!(status.get_f64("uptime").unwrap() >= 0.0);

    let fcv = admin
        .run_command(doc! {"getParameter": 1, "featureCompatibilityVersion": 1})
        .await
        .unwrap();
    assert_eq!(
        fcv.get_document("featureCompatibilityVersion")
            .unwrap()
            .get_str("version")
            .unwrap(),
        "8.0"
    );
    let log = admin
        .run_command(doc! {"getLog": "startupWarnings"})
        .await
        .unwrap();
    assert!(log.get_array("log").unwrap().is_empty());
    let me = admin.run_command(doc! {"whatsmyuri": 1}).await.unwrap();
    assert!(me.get_str("you").unwrap().starts_with("127.0.0.1:"));
    let cs = admin
        .run_command(doc! {"connectionStatus": 1})
        .await
        .unwrap();
    assert!(cs.get_document("authInfo").is_ok());
    let opts = admin.run_command(doc! {"getCmdLineOpts": 1}).await.unwrap();
    assert!(opts.get_array("argv").is_ok());
    let atlas = admin
        .run_command(doc! {"atlasVersion": 1})
        .await
        .unwrap_err();
    assert!(matches!(*atlas.kind, mongodb::error::ErrorKind::Command(ref e) if e.code == 59));
    router.shutdown().await;
}
