//! The per-shard queue through the router: a write that cannot get an execution slot before
//! its deadline fails with ExceededTimeLimit, labelled RetryableWriteError when retryable, and
//! nothing is applied.

mod common;

use std::time::Duration;

use bson::{doc, Bson};
use common::{Raw, TestCluster};
use sluice::config::{BatchingConfig, Config};

#[tokio::test]
async fn a_full_shard_makes_waiting_writes_time_out_cleanly() {
    let config = Config {
        batching: BatchingConfig {
            max_in_flight: 1,
            min_in_flight: 1,
            queue_timeout_ms: 100,
            max_wait_us: 0,
            ..BatchingConfig::default()
        },
        ..Config::default()
    };
    let c = TestCluster::start_with(1, &[("demo.items", doc! {"_id": "hashed"})], config).await;
    // The shard holds every insert for 600 ms.
    let mut direct = Raw::connect(c.shards[0].local_addr()).await;
    direct
        .command(&doc! {"configureFailPoint": "failCommand", "mode": "alwaysOn", "data": {"failCommands": ["insert"], "blockConnection": true, "blockTimeMS": 600}, "$db": "admin"})
        .await;
    let addr = c.addr();
    let first = tokio::spawn(async move {
        let mut raw = Raw::connect(addr).await;
        raw.command(&doc! {"insert": "items", "documents": [{"_id": 1}], "$db": "demo"})
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut raw = Raw::connect(addr).await;
    let lsid = doc! {"id": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![9; 16] })};
    let r = raw
        .command(&doc! {"insert": "items", "documents": [{"_id": 2}], "lsid": lsid, "txnNumber": 1i64, "$db": "demo"})
        .await;
    assert_eq!(r.get_f64("ok").unwrap(), 0.0, "{r}");
    assert_eq!(r.get_i32("code").unwrap(), 262);
    assert_eq!(
        r.get_array("errorLabels").unwrap(),
        &vec![Bson::String("RetryableWriteError".into())]
    );
    // Without a session it is the same error, without the label.
    let r = raw
        .command(&doc! {"insert": "items", "documents": [{"_id": 3}], "$db": "demo"})
        .await;
    assert_eq!(r.get_i32("code").unwrap(), 262);
    assert!(!r.contains_key("errorLabels"));
    let first = first.await.unwrap();
    assert_eq!(first.get_i32("n").unwrap(), 1);
    direct
        .command(&doc! {"configureFailPoint": "failCommand", "mode": "off", "$db": "admin"})
        .await;
    assert_eq!(
        c.count_on_shards("demo", "items"),
        1,
        "only the admitted write was applied"
    );
    c.stop().await;
}
