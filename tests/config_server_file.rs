//! The embedded config server's metadata file: a config server started with a
//! `metadata_path` writes its `config.*` documents there after every change, and one started
//! again on the same file holds the same databases, collections, chunks (with their versions)
//! and shards, so routers route as before: by the same chunk owners, and with versions that
//! carry on from the persisted ones.

mod common;

use common::{all, direct};

use bson::{doc, Bson, Document};
use sluice::config::Config;
use sluice::embedded::{EmbeddedShard, ShardOptions};

/// A fresh directory for one test's files.
fn temp_dir(name: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("sluice-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn router_config() -> Config {
    Config {
        listen: "127.0.0.1:0".into(),
        ..Config::default()
    }
}

/// Every document of `config.<name>` on the config server, sorted by `_id`'s text.
async fn config_docs(config_server: std::net::SocketAddr, name: &str) -> Vec<Document> {
    let mut docs = all(direct(config_server)
        .await
        .database("config")
        .collection::<Document>(name)
        .find(doc! {})
        .await
        .unwrap())
    .await;
    docs.sort_by_key(|d| d.get("_id").map(|v| v.to_string()).unwrap_or_default());
    docs
}

/// What routing depends on, read from the config server.
async fn metadata(config_server: std::net::SocketAddr) -> Vec<Vec<Document>> {
    let mut out = Vec::new();
    for name in ["shards", "databases", "collections", "chunks", "version"] {
        out.push(config_docs(config_server, name).await);
    }
    out
}

/// `(min, max, shard, lastmod)` of `demo.items`' chunks on the config server, by `min`.
async fn chunks(config_server: std::net::SocketAddr) -> Vec<(Bson, Bson, String, bson::Timestamp)> {
    let entry = config_docs(config_server, "collections")
        .await
        .into_iter()
        .find(|d| d.get_str("_id").ok() == Some("demo.items"))
        .expect("demo.items is sharded");
    let uuid = entry.get("uuid").cloned().unwrap();
    let mut out: Vec<_> = config_docs(config_server, "chunks")
        .await
        .into_iter()
        .filter(|c| c.get("uuid") == Some(&uuid))
        .map(|c| {
            (
                c.get_document("min").unwrap().get("_id").cloned().unwrap(),
                c.get_document("max").unwrap().get("_id").cloned().unwrap(),
                c.get_str("shard").unwrap().to_string(),
                c.get_timestamp("lastmod").unwrap(),
            )
        })
        .collect();
    out.sort_by_key(|c| match &c.0 {
        Bson::MinKey => i64::MIN,
        Bson::Int64(v) => *v,
        _ => i64::MAX,
    });
    out
}

/// The shard owning `_id: id` by hashed-key chunks.
fn owner(chunks: &[(Bson, Bson, String, bson::Timestamp)], id: i64) -> String {
    let h = sluice::routing::hash64(&Bson::Int64(id));
    chunks
        .iter()
        .find(|(lo, hi, _, _)| {
            let above = match lo {
                Bson::MinKey => true,
                Bson::Int64(v) => *v <= h,
                _ => false,
            };
            let below = match hi {
                Bson::MaxKey => true,
                Bson::Int64(v) => h < *v,
                _ => false,
            };
            above && below
        })
        .map(|c| c.2.clone())
        .expect("a chunk owns every hash")
}

/// Every `_id` of `demo.items` through `client`, sorted.
async fn ids(client: &mongodb::Client) -> Vec<i64> {
    let mut ids: Vec<i64> = all(client
        .database("demo")
        .collection::<Document>("items")
        .find(doc! {})
        .await
        .unwrap())
    .await
    .iter()
    .map(|d| d.get_i64("_id").unwrap())
    .collect();
    ids.sort_unstable();
    ids
}

/// Each document of `demo.items` is on the shard its chunk names, and on no other.
fn assert_placed(cluster: &sluice::demo::DemoCluster, n: i64) {
    let chunks_now = chunks_in_process(cluster);
    let mut seen = std::collections::HashMap::new();
    for s in &cluster.shards {
        for d in s.service().documents("demo", "items") {
            let id = d.get_i64("_id").unwrap();
            assert!(seen.insert(id, ()).is_none(), "{id} is on two shards");
            assert_eq!(
                owner(&chunks_now, id),
                s.service().name(),
                "{id} is on the shard owning its chunk"
            );
        }
    }
    assert_eq!(seen.len() as i64, n);
}

/// The chunks as the config server's catalog holds them, read in process.
fn chunks_in_process(
    cluster: &sluice::demo::DemoCluster,
) -> Vec<(Bson, Bson, String, bson::Timestamp)> {
    let svc = cluster.config_server.service();
    let uuid = svc
        .documents("config", "collections")
        .into_iter()
        .find(|d| d.get_str("_id").ok() == Some("demo.items"))
        .and_then(|d| d.get("uuid").cloned())
        .unwrap();
    svc.documents("config", "chunks")
        .into_iter()
        .filter(|c| c.get("uuid") == Some(&uuid))
        .map(|c| {
            (
                c.get_document("min").unwrap().get("_id").cloned().unwrap(),
                c.get_document("max").unwrap().get("_id").cloned().unwrap(),
                c.get_str("shard").unwrap().to_string(),
                c.get_timestamp("lastmod").unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_restarted_config_server_keeps_the_cluster_metadata_of_its_file() {
    let dir = temp_dir("config-file");
    let path = dir.join("config.bson");
    let collections: Config =
        toml::from_str("[[collections]]\nns = \"demo.items\"\nkey = '{\"_id\": \"hashed\"}'\n")
            .unwrap();
    let mut cluster = sluice::demo::DemoCluster::start(
        2,
        ShardOptions {
            metadata_path: Some(path.clone()),
            ..ShardOptions::for_tests()
        },
        vec![router_config()],
        vec!["sluice".into()],
        &collections.collections,
    )
    .await
    .expect("the cluster starts");
    assert!(path.exists(), "the config server wrote its file");
    let a = common::driver(cluster.routers[0].0.local_addr(), "").await;
    let items = a.database("demo").collection::<Document>("items");
    let n = 300i64;
    items
        .insert_many((0..n).map(|i| doc! {"_id": i}))
        .await
        .unwrap();
    // Versions past the initial ones: a split and a migration through the router.
    let before_split = chunks(cluster.config_server.local_addr()).await;
    let (lo, hi) = match (&before_split[0].0, &before_split[0].1) {
        (Bson::MinKey, Bson::Int64(hi)) => (i64::MIN, *hi),
        other => panic!("the first chunk starts at MinKey: {other:?}"),
    };
    let middle = lo / 2 + hi / 2;
    a.database("admin")
        .run_command(doc! {"split": "demo.items", "middle": {"_id": middle}})
        .await
        .unwrap();
    let first_owner = before_split[0].2.clone();
    let other = if first_owner == "shard0" {
        "shard1"
    } else {
        "shard0"
    };
    a.database("admin")
        .run_command(doc! {
            "moveChunk": "demo.items",
            "bounds": [{"_id": Bson::MinKey}, {"_id": middle}],
            "to": other,
        })
        .await
        .unwrap();
    let persisted = metadata(cluster.config_server.local_addr()).await;
    let routed = chunks(cluster.config_server.local_addr()).await;
    assert_eq!(
        routed.len(),
        5,
        "four chunks, one of them split: {routed:?}"
    );
    assert_eq!(routed[0].2, other, "the moved chunk: {routed:?}");
    let top = routed.iter().map(|c| c.3.time).max().unwrap();
    assert!(
        top >= 2,
        "the migration gave a new major version: {routed:?}"
    );
    assert_placed(&cluster, n);

    // The config server stops and starts again on the same address and file.
    cluster = cluster
        .restart_config_server()
        .await
        .expect("the config server starts again");
    assert_eq!(
        metadata(cluster.config_server.local_addr()).await,
        persisted,
        "config.shards, databases, collections, chunks and version as they were"
    );
    assert!(
        std::fs::read_dir(&dir).unwrap().count() == 1,
        "no temporary file is left beside the metadata file"
    );

    // A router that never saw the cluster routes by the persisted chunks.
    let argv = vec!["sluice".to_string()];
    cluster.start_router(router_config(), argv).await.unwrap();
    let b = common::driver(cluster.routers[1].0.local_addr(), "").await;
    assert_eq!(ids(&b).await, (0..n).collect::<Vec<_>>());
    for id in [0i64, 17, 123, 299] {
        let d = b
            .database("demo")
            .collection::<Document>("items")
            .find_one(doc! {"_id": id})
            .await
            .unwrap();
        assert!(
            d.is_some(),
            "{id} is found by its shard key through the new router"
        );
    }
    // The first router, after forgetting its cache, too.
    a.database("admin")
        .run_command(doc! {"flushRouterConfig": 1})
        .await
        .unwrap();
    assert_eq!(ids(&a).await, (0..n).collect::<Vec<_>>());

    // Versions carry on from the persisted ones: the next migration takes the next major.
    b.database("admin")
        .run_command(doc! {
            "moveChunk": "demo.items",
            "bounds": [{"_id": Bson::MinKey}, {"_id": middle}],
            "to": &first_owner,
        })
        .await
        .unwrap();
    let after = chunks(cluster.config_server.local_addr()).await;
    assert_eq!(after[0].2, first_owner);
    assert_eq!(after[0].3.time, top + 1, "{after:?}");
    items
        .insert_many((n..n + 50).map(|i| doc! {"_id": i}))
        .await
        .unwrap();
    assert_eq!(ids(&a).await, (0..n + 50).collect::<Vec<_>>());
    assert_eq!(ids(&b).await, (0..n + 50).collect::<Vec<_>>());
    assert_placed(&cluster, n + 50);
    cluster.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_metadata_file_that_does_not_parse_stops_the_config_server_naming_it() {
    let dir = temp_dir("config-file-bad");
    let path = dir.join("config.bson");
    std::fs::write(&path, b"not bson at all").unwrap();
    let e = EmbeddedShard::start(
        "127.0.0.1:0",
        ShardOptions {
            set_name: "configRS".into(),
            config_server: true,
            metadata_path: Some(path.clone()),
            ..ShardOptions::for_tests()
        },
    )
    .await
    .expect_err("a damaged file is refused");
    assert!(
        e.to_string().contains(&path.display().to_string()),
        "the error names the file: {e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
