//! Cluster administration through `--configdb` routers, as mongos answers it, through the
//! stock driver: `removeShard` (started, ongoing with what remains, completed; the shard's
//! chunks moved away by the config server, the databases it is primary of listed under
//! `dbsToMove`), the routers' own entries in `config.mongos`, and `split` by `find` and by
//! `bounds` at the median key the owning shard finds.

mod common;

use common::{all, direct};

use bson::{doc, Bson, Document};
use sluice::config::Config;
use sluice::embedded::ShardOptions;

async fn cluster(
    shards: usize,
    routers: Vec<Config>,
    collections: &str,
) -> sluice::demo::DemoCluster {
    let collections: Config = toml::from_str(collections).unwrap();
    sluice::demo::DemoCluster::start(
        shards,
        ShardOptions::for_tests(),
        routers,
        vec!["sluice".into()],
        &collections.collections,
    )
    .await
    .expect("the embedded cluster starts")
}

fn router_config() -> Config {
    Config {
        listen: "127.0.0.1:0".into(),
        ..Config::default()
    }
}

async fn client(c: &sluice::demo::DemoCluster, i: usize) -> mongodb::Client {
    common::driver(c.routers[i].0.local_addr(), "").await
}

async fn admin(client: &mongodb::Client, command: Document) -> mongodb::error::Result<Document> {
    client.database("admin").run_command(command).await
}

/// Every `_id` of `db.coll` through `client`, sorted.
async fn ids(client: &mongodb::Client, db: &str, coll: &str) -> Vec<i64> {
    let mut ids: Vec<i64> = all(client
        .database(db)
        .collection::<Document>(coll)
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

/// The shard ids `listShards` names through `client`.
async fn listed(client: &mongodb::Client) -> Vec<String> {
    let reply = admin(client, doc! {"listShards": 1}).await.unwrap();
    let mut ids: Vec<String> = reply
        .get_array("shards")
        .unwrap()
        .iter()
        .filter_map(|s| s.as_document()?.get_str("_id").ok().map(str::to_string))
        .collect();
    ids.sort();
    ids
}

/// Calls `removeShard` until it answers `completed` (or `deadline` passes), checking that the
/// counts it reports never grow; returns every reply.
async fn remove_until_completed(client: &mongodb::Client, shard: &str) -> Vec<Document> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut replies = Vec::new();
    let mut last_chunks = i64::MAX;
    loop {
        let r = admin(client, doc! {"removeShard": shard}).await.unwrap();
        replies.push(r.clone());
        match r.get_str("state").unwrap() {
            "completed" => {
                assert_eq!(r.get_str("shard").unwrap(), shard);
                assert_eq!(
                    r.get_str("msg").unwrap(),
                    "removeshard completed successfully"
                );
                return replies;
            }
            "ongoing" => {
                let chunks = r
                    .get_document("remaining")
                    .unwrap()
                    .get_i64("chunks")
                    .unwrap();
                assert!(
                    chunks <= last_chunks,
                    "the remaining chunks never grow: {replies:?}"
                );
                last_chunks = chunks;
            }
            other => panic!("unexpected state {other}: {r}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not drained: {replies:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

const ITEMS: &str = "[[collections]]\nns = \"demo.items\"\nkey = '{\"_id\": \"hashed\"}'\n";

#[tokio::test]
async fn remove_shard_drains_the_shard_and_takes_it_out_of_the_cluster() {
    let c = cluster(3, vec![router_config(), router_config()], ITEMS).await;
    let a = client(&c, 0).await;
    let b = client(&c, 1).await;
    let n = 600i64;
    a.database("demo")
        .collection::<Document>("items")
        .insert_many((0..n).map(|i| doc! {"_id": i}))
        .await
        .unwrap();
    // An unsharded collection lives on the database's primary shard.
    a.database("demo")
        .collection::<Document>("plain")
        .insert_many((0..10i64).map(|i| doc! {"_id": i}))
        .await
        .unwrap();
    let config = direct(c.config_server.local_addr())
        .await
        .database("config");
    let primary = config
        .collection::<Document>("databases")
        .find_one(doc! {"_id": "demo"})
        .await
        .unwrap()
        .unwrap()
        .get_str("primary")
        .unwrap()
        .to_string();
    let mut shard_ids = listed(&a).await;
    assert_eq!(shard_ids.len(), 3);
    shard_ids.retain(|s| *s != primary);
    let victim = shard_ids[0].clone();

    // Bad forms, as mongos answers them.
    let e = admin(&a, doc! {"removeShard": 1}).await.unwrap_err();
    assert_eq!(common::command_code(&e), 14, "{e}");
    let e = admin(&a, doc! {"removeShard": "nope"}).await.unwrap_err();
    assert_eq!(common::command_code(&e), 70, "ShardNotFound: {e}");

    let started = admin(&a, doc! {"removeShard": &victim}).await.unwrap();
    assert_eq!(started.get_str("state").unwrap(), "started", "{started}");
    assert_eq!(
        started.get_str("msg").unwrap(),
        "draining started successfully"
    );
    assert_eq!(started.get_str("shard").unwrap(), victim);
    assert!(
        started.get_array("dbsToMove").unwrap().is_empty(),
        "{started}"
    );
    let shard_doc = config
        .collection::<Document>("shards")
        .find_one(doc! {"_id": &victim})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        shard_doc.get_bool("draining").ok(),
        Some(true),
        "{shard_doc}"
    );
    // The next call reports what is left (two chunks do not move within one round trip).
    let ongoing = admin(&b, doc! {"removeShard": &victim}).await.unwrap();
    assert_eq!(ongoing.get_str("state").unwrap(), "ongoing", "{ongoing}");
    assert_eq!(ongoing.get_str("msg").unwrap(), "draining ongoing");
    let remaining = ongoing.get_document("remaining").unwrap();
    assert!(
        (1..=2).contains(&remaining.get_i64("chunks").unwrap()),
        "{ongoing}"
    );
    assert_eq!(remaining.get_i64("dbs").unwrap(), 0);
    assert_eq!(remaining.get_i64("jumboChunks").unwrap(), 0);
    // Reads and writes go on while it drains.
    assert_eq!(ids(&b, "demo", "items").await, (0..n).collect::<Vec<_>>());
    remove_until_completed(&a, &victim).await;

    assert!(!listed(&a).await.contains(&victim));
    assert!(!listed(&b).await.contains(&victim));
    assert_eq!(
        config
            .collection::<Document>("shards")
            .count_documents(doc! {})
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        config
            .collection::<Document>("chunks")
            .count_documents(doc! {"shard": &victim})
            .await
            .unwrap(),
        0
    );
    let gone = c
        .shards
        .iter()
        .find(|s| s.service().name() == victim)
        .unwrap();
    assert!(
        gone.service().documents("demo", "items").is_empty(),
        "the drained shard holds no document"
    );
    assert_eq!(ids(&a, "demo", "items").await, (0..n).collect::<Vec<_>>());
    assert_eq!(ids(&b, "demo", "items").await, (0..n).collect::<Vec<_>>());
    for id in [0i64, 7, 311, 599] {
        assert!(b
            .database("demo")
            .collection::<Document>("items")
            .find_one(doc! {"_id": id})
            .await
            .unwrap()
            .is_some());
    }
    let e = admin(&a, doc! {"removeShard": &victim}).await.unwrap_err();
    assert_eq!(
        common::command_code(&e),
        70,
        "a removed shard is not found: {e}"
    );

    // The primary shard: its chunks move, its database stays until it is moved (or dropped).
    let r = admin(&b, doc! {"removeShard": &primary}).await.unwrap();
    assert_eq!(r.get_str("state").unwrap(), "started");
    assert_eq!(
        r.get_array("dbsToMove").unwrap(),
        &vec![Bson::String("demo".into())]
    );
    assert_eq!(
        r.get_str("note").unwrap(),
        "you need to drop or movePrimary these databases"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let waiting = loop {
        let r = admin(&b, doc! {"removeShard": &primary}).await.unwrap();
        assert_eq!(r.get_str("state").unwrap(), "ongoing", "{r}");
        let remaining = r.get_document("remaining").unwrap();
        assert_eq!(remaining.get_i64("dbs").unwrap(), 1);
        if remaining.get_i64("chunks").unwrap() == 0 {
            break r;
        }
        assert!(std::time::Instant::now() < deadline, "not drained: {r}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(
        waiting.get_array("dbsToMove").unwrap(),
        &vec![Bson::String("demo".into())]
    );
    assert_eq!(ids(&a, "demo", "items").await, (0..n).collect::<Vec<_>>());
    assert_eq!(ids(&b, "demo", "plain").await, (0..10).collect::<Vec<_>>());
    // movePrimary to the shard that stays: the removal completes, nothing is lost.
    let staying: Vec<String> = listed(&a)
        .await
        .into_iter()
        .filter(|s| *s != primary)
        .collect();
    assert_eq!(staying.len(), 1);
    admin(&a, doc! {"movePrimary": "demo", "to": &staying[0]})
        .await
        .unwrap();
    let done = remove_until_completed(&b, &primary).await;
    assert_eq!(done.len(), 1, "completed once the database moved: {done:?}");
    assert_eq!(ids(&a, "demo", "items").await, (0..n).collect::<Vec<_>>());
    assert_eq!(ids(&b, "demo", "plain").await, (0..10).collect::<Vec<_>>());
    let last = listed(&a).await;
    assert_eq!(last, staying);
    let e = admin(&a, doc! {"removeShard": &last[0]}).await.unwrap_err();
    assert_eq!(common::command_code(&e), 20, "the last shard stays: {e}");
    // What is left still routes.
    a.database("demo2")
        .collection::<Document>("x")
        .insert_one(doc! {"_id": 1i64})
        .await
        .unwrap();
    assert_eq!(ids(&b, "demo2", "x").await, vec![1]);
    c.shutdown().await;
}

#[tokio::test]
async fn routers_register_in_config_mongos_and_refresh_their_ping() {
    let fast = || Config {
        uptime_report_interval_ms: 200,
        ..router_config()
    };
    let mut c = cluster(1, vec![fast(), fast()], "").await;
    let addrs: Vec<_> = c.routers.iter().map(|(r, _)| r.local_addr()).collect();
    let names: Vec<String> = addrs
        .iter()
        .map(|a| sluice::router::uptime::instance_id(*a))
        .collect();
    assert!(
        names[0].ends_with(&format!(":{}", addrs[0].port())),
        "{names:?}"
    );
    let mongos = direct(c.config_server.local_addr())
        .await
        .database("config")
        .collection::<Document>("mongos");
    let entry = |name: String| {
        let mongos = mongos.clone();
        async move { mongos.find_one(doc! {"_id": name}).await.unwrap() }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while mongos.count_documents(doc! {}).await.unwrap() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the routers registered"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let first = entry(names[0].clone()).await.unwrap();
    assert!(first.get_datetime("ping").is_ok(), "{first}");
    assert!(first.get_datetime("created").is_ok(), "{first}");
    assert!(first.get_i64("up").is_ok(), "{first}");
    assert!(first.get_bool("waiting").unwrap());
    assert_eq!(first.get_str("mongoVersion").unwrap(), "8.0.4");
    // Read through a router too, as sh.status() does.
    let through = client(&c, 0).await;
    let seen = all(through
        .database("config")
        .collection::<Document>("mongos")
        .find(doc! {})
        .await
        .unwrap())
    .await;
    assert_eq!(seen.len(), 2);
    // The ping moves on while the router runs.
    let ping = *first.get_datetime("ping").unwrap();
    loop {
        let now = entry(names[0].clone()).await.unwrap();
        if *now.get_datetime("ping").unwrap() > ping {
            assert_eq!(
                now.get_datetime("created").unwrap(),
                first.get_datetime("created").unwrap()
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the ping was refreshed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // A stopped router's ping stays where it was.
    let (stopped, _) = c.routers.pop().unwrap();
    stopped.shutdown().await;
    let before = *entry(names[1].clone())
        .await
        .unwrap()
        .get_datetime("ping")
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    let after = *entry(names[1].clone())
        .await
        .unwrap()
        .get_datetime("ping")
        .unwrap();
    assert_eq!(before, after, "no report after shutdown");
    c.shutdown().await;
}

const RANGED: &str = "[[collections]]\nns = \"demo.ranged\"\nkey = '{\"x\": 1}'\n\n[[collections]]\nns = \"demo.items\"\nkey = '{\"_id\": \"hashed\"}'\n";

/// `(min x, max x, shard, lastmod)` of `ns`'s chunks on the config server, by `min`.
async fn chunk_list(
    c: &sluice::demo::DemoCluster,
    ns: &str,
    field: &str,
) -> Vec<(Bson, Bson, bson::Timestamp)> {
    let config = direct(c.config_server.local_addr())
        .await
        .database("config");
    let entry = config
        .collection::<Document>("collections")
        .find_one(doc! {"_id": ns})
        .await
        .unwrap()
        .unwrap();
    let mut out: Vec<_> = all(config
        .collection::<Document>("chunks")
        .find(doc! {"uuid": entry.get("uuid").cloned().unwrap()})
        .sort(doc! {"min": 1})
        .await
        .unwrap())
    .await
    .into_iter()
    .map(|d| {
        (
            d.get_document("min").unwrap().get(field).cloned().unwrap(),
            d.get_document("max").unwrap().get(field).cloned().unwrap(),
            d.get_timestamp("lastmod").unwrap(),
        )
    })
    .collect();
    out.sort_by(|x, y| sluice::value::compare::compare(&x.0, &y.0));
    out
}

#[tokio::test]
async fn split_by_find_and_by_bounds_at_the_median_key() {
    let c = cluster(2, vec![router_config()], RANGED).await;
    let a = client(&c, 0).await;
    let ranged = a.database("demo").collection::<Document>("ranged");
    ranged
        .insert_many((0..100i64).map(|i| doc! {"_id": i, "x": i}))
        .await
        .unwrap();
    assert_eq!(chunk_list(&c, "demo.ranged", "x").await.len(), 1);

    // find: the chunk holding {x: 10}, at its median key.
    admin(&a, doc! {"split": "demo.ranged", "find": {"x": 10i64}})
        .await
        .unwrap();
    let after_find = chunk_list(&c, "demo.ranged", "x").await;
    let bounds: Vec<(Bson, Bson)> = after_find
        .iter()
        .map(|c| (c.0.clone(), c.1.clone()))
        .collect();
    assert_eq!(
        bounds,
        vec![
            (Bson::MinKey, Bson::Int64(50)),
            (Bson::Int64(50), Bson::MaxKey)
        ],
        "split at the median of 0..100"
    );
    // bounds: exactly [50, MaxKey), at the median of 50..100.
    admin(
        &a,
        doc! {"split": "demo.ranged", "bounds": [{"x": 50i64}, {"x": Bson::MaxKey}]},
    )
    .await
    .unwrap();
    let after_bounds = chunk_list(&c, "demo.ranged", "x").await;
    let bounds: Vec<(Bson, Bson)> = after_bounds
        .iter()
        .map(|c| (c.0.clone(), c.1.clone()))
        .collect();
    assert_eq!(
        bounds,
        vec![
            (Bson::MinKey, Bson::Int64(50)),
            (Bson::Int64(50), Bson::Int64(75)),
            (Bson::Int64(75), Bson::MaxKey)
        ]
    );
    let top_before = after_find.iter().map(|c| c.2).max().unwrap();
    let top_after = after_bounds.iter().map(|c| c.2).max().unwrap();
    assert_eq!(
        top_after.time, top_before.time,
        "a split keeps the major version"
    );
    assert!(
        top_after.increment > top_before.increment,
        "and raises the minor"
    );
    // Every document is still found, by its key and by a scan.
    for x in [0i64, 49, 50, 74, 75, 99] {
        assert!(
            ranged.find_one(doc! {"x": x}).await.unwrap().is_some(),
            "{x}"
        );
    }
    assert_eq!(ranged.count_documents(doc! {}).await.unwrap(), 100);

    // A hashed key: find names the document, the split point is a hashed value inside its chunk.
    let items = a.database("demo").collection::<Document>("items");
    items
        .insert_many((0..200i64).map(|i| doc! {"_id": i}))
        .await
        .unwrap();
    let before = chunk_list(&c, "demo.items", "_id").await;
    admin(&a, doc! {"split": "demo.items", "find": {"_id": 5i64}})
        .await
        .unwrap();
    let after = chunk_list(&c, "demo.items", "_id").await;
    assert_eq!(after.len(), before.len() + 1);
    let h = sluice::routing::hash64(&Bson::Int64(5));
    let inside = |lo: &Bson, hi: &Bson, v: i64| {
        sluice::value::compare::compare(lo, &Bson::Int64(v)).is_le()
            && sluice::value::compare::compare(&Bson::Int64(v), hi).is_lt()
    };
    let old = before.iter().find(|c| inside(&c.0, &c.1, h)).unwrap();
    let new_points: Vec<&Bson> = after
        .iter()
        .map(|c| &c.0)
        .filter(|m| !before.iter().any(|b| &b.0 == *m))
        .collect();
    assert_eq!(new_points.len(), 1);
    let Bson::Int64(point) = new_points[0] else {
        panic!("a hashed split point: {new_points:?}")
    };
    assert!(
        inside(&old.0, &old.1, *point),
        "the split point lies in the chunk that held 5"
    );
    assert_eq!(items.count_documents(doc! {}).await.unwrap(), 200);

    // Bad forms, with mongos's messages.
    let message = |e: mongodb::error::Error| match *e.kind {
        mongodb::error::ErrorKind::Command(ref c) => (c.code, c.message.clone()),
        ref other => panic!("not a command error: {other:?}"),
    };
    let cases: Vec<(Document, i32, &str)> = vec![
        (
            doc! {"split": "demo.ranged"},
            72,
            "need to specify find/bounds or middle",
        ),
        (
            doc! {"split": "demo.ranged", "find": {"x": 1i64}, "bounds": [{"x": 50i64}, {"x": 75i64}]},
            72,
            "cannot specify bounds and find at the same time",
        ),
        (
            doc! {"split": "demo.ranged", "find": {"x": 1i64}, "middle": {"x": 20i64}},
            72,
            "cannot specify find and middle together",
        ),
        (
            doc! {"split": "demo.ranged", "bounds": [{"x": 50i64}, {"x": 75i64}], "middle": {"x": 60i64}},
            72,
            "cannot specify bounds and middle together",
        ),
        (
            doc! {"split": "demo.ranged", "bounds": [{"x": 50i64}]},
            72,
            "upper bound not specified",
        ),
        (
            doc! {"split": "demo.ranged", "find": 1},
            72,
            "wrong type for 'find' field",
        ),
        (
            doc! {"split": "demo.ranged", "find": {"y": 1}},
            72,
            "no shard key found in chunk query",
        ),
        (
            doc! {"split": "demo.ranged", "bounds": [{"x": 50i64}, {"x": 60i64}]},
            72,
            "no chunk found with the shard key bounds",
        ),
        (
            doc! {"split": "demo.ranged", "bounds": [{"y": 50i64}, {"x": 60i64}]},
            72,
            "are not valid for shard key pattern",
        ),
        (
            doc! {"split": "demo.ranged", "middle": {"x": 50i64}},
            72,
            "is a boundary key of existing chunk",
        ),
    ];
    for (command, code, text) in cases {
        let e = admin(&a, command.clone()).await.unwrap_err();
        let (got, msg) = message(e);
        assert_eq!(got, code, "{command}: {msg}");
        assert!(msg.contains(text), "{command}: {msg}");
    }
    // An empty chunk has no median.
    ranged
        .delete_many(doc! {"x": {"$gte": 75i64}})
        .await
        .unwrap();
    let e = admin(
        &a,
        doc! {"split": "demo.ranged", "bounds": [{"x": 75i64}, {"x": Bson::MaxKey}]},
    )
    .await
    .unwrap_err();
    let (code, msg) = message(e);
    assert_eq!(code, 106, "CannotSplit: {msg}");
    // An unsharded collection.
    a.database("demo")
        .collection::<Document>("loose")
        .insert_one(doc! {"x": 1})
        .await
        .unwrap();
    let e = admin(&a, doc! {"split": "demo.loose", "find": {"x": 1}})
        .await
        .unwrap_err();
    assert_eq!(common::command_code(&e), 118, "{e}");
    c.shutdown().await;
}

/// The chunks of the collection `ns` names on the config server, as `(min, shard)`, and its uuid.
async fn chunks_of(
    c: &sluice::demo::DemoCluster,
    ns: &str,
) -> Option<(Bson, Vec<(String, String)>)> {
    let config = direct(c.config_server.local_addr())
        .await
        .database("config");
    let entry = config
        .collection::<Document>("collections")
        .find_one(doc! {"_id": ns})
        .await
        .unwrap()?;
    let uuid = entry.get("uuid").cloned().unwrap();
    let mut chunks: Vec<(String, String)> = all(config
        .collection::<Document>("chunks")
        .find(doc! {"uuid": uuid.clone()})
        .await
        .unwrap())
    .await
    .iter()
    .map(|d| {
        (
            d.get_document("min").unwrap().to_string(),
            d.get_str("shard").unwrap().to_string(),
        )
    })
    .collect();
    chunks.sort();
    Some((uuid, chunks))
}

#[tokio::test]
async fn a_sharded_collection_renamed_through_one_router_is_found_under_its_new_name_by_both() {
    let c = cluster(2, vec![router_config(), router_config()], ITEMS).await;
    let a = client(&c, 0).await;
    let b = client(&c, 1).await;
    let n = 300i64;
    a.database("demo")
        .collection::<Document>("items")
        .insert_many((0..n).map(|i| doc! {"_id": i}))
        .await
        .unwrap();
    // Router B routes the old name first, so its cache holds it.
    assert_eq!(ids(&b, "demo", "items").await, (0..n).collect::<Vec<_>>());
    assert!(ids(&b, "demo", "moved").await.is_empty());
    let (uuid, chunks) = chunks_of(&c, "demo.items").await.unwrap();

    admin(
        &a,
        doc! {"renameCollection": "demo.items", "to": "demo.moved"},
    )
    .await
    .unwrap();
    assert!(
        chunks_of(&c, "demo.items").await.is_none(),
        "the old name is gone"
    );
    let (new_uuid, new_chunks) = chunks_of(&c, "demo.moved").await.unwrap();
    assert_eq!(new_uuid, uuid, "the same collection");
    assert_eq!(
        new_chunks, chunks,
        "with the same chunks on the same shards"
    );
    assert_eq!(ids(&a, "demo", "moved").await, (0..n).collect::<Vec<_>>());
    assert_eq!(
        ids(&b, "demo", "moved").await,
        (0..n).collect::<Vec<_>>(),
        "B follows"
    );
    assert!(ids(&b, "demo", "items").await.is_empty());
    let moved = b.database("demo").collection::<Document>("moved");
    for id in [0i64, 42, 299] {
        assert!(
            moved.find_one(doc! {"_id": id}).await.unwrap().is_some(),
            "{id} by key"
        );
    }
    moved
        .insert_many((n..n + 50).map(|i| doc! {"_id": i}))
        .await
        .unwrap();
    assert_eq!(
        ids(&a, "demo", "moved").await,
        (0..n + 50).collect::<Vec<_>>()
    );
    let under_old: usize = c
        .shards
        .iter()
        .map(|s| s.service().documents("demo", "items").len())
        .sum();
    assert_eq!(under_old, 0, "nothing left under the old name");

    // An existing target needs dropTarget; another database is refused.
    a.database("demo")
        .collection::<Document>("plain")
        .insert_one(doc! {"_id": -1i64})
        .await
        .unwrap();
    let e = admin(
        &a,
        doc! {"renameCollection": "demo.moved", "to": "demo.plain"},
    )
    .await
    .unwrap_err();
    assert_eq!(common::command_code(&e), 48, "{e}");
    let e = admin(
        &b,
        doc! {"renameCollection": "demo.moved", "to": "other.moved"},
    )
    .await
    .unwrap_err();
    assert_eq!(common::command_code(&e), 125, "{e}");
    admin(
        &b,
        doc! {"renameCollection": "demo.moved", "to": "demo.plain", "dropTarget": true},
    )
    .await
    .unwrap();
    assert_eq!(
        ids(&a, "demo", "plain").await,
        (0..n + 50).collect::<Vec<_>>(),
        "the target's own document is gone"
    );
    assert_eq!(chunks_of(&c, "demo.plain").await.unwrap().0, uuid);
    c.shutdown().await;
}

const STALE: &str = "[[collections]]\nns = \"demo.items\"\nkey = '{\"_id\": \"hashed\"}'\n\
[[collections]]\nns = \"demo.upd\"\nkey = '{\"_id\": \"hashed\"}'\n\
[[collections]]\nns = \"demo.del\"\nkey = '{\"_id\": \"hashed\"}'\n\
[[collections]]\nns = \"demo.rd\"\nkey = '{\"_id\": \"hashed\"}'\n\
[[collections]]\nns = \"demo.bw\"\nkey = '{\"_id\": \"hashed\"}'\n\
[[collections]]\nns = \"demo.fam\"\nkey = '{\"_id\": \"hashed\"}'\n";

/// The shard id `config.databases` names as `db`'s primary.
async fn primary_of(c: &sluice::demo::DemoCluster, db: &str) -> usize {
    let config = direct(c.config_server.local_addr())
        .await
        .database("config");
    let d = config
        .collection::<Document>("databases")
        .find_one(doc! {"_id": db})
        .await
        .unwrap()
        .unwrap();
    let primary = d.get_str("primary").unwrap();
    primary.trim_start_matches("shard").parse().unwrap()
}

/// The sorted `_id`s of `db.coll` each shard holds itself.
fn ids_per_shard(c: &sluice::demo::DemoCluster, db: &str, coll: &str) -> Vec<Vec<i64>> {
    let single = c.shards.iter().map(|s| s.service().documents(db, coll));
    single
        .chain(c.sets.iter().map(|s| s.documents(db, coll)))
        .map(|docs| {
            let mut v: Vec<i64> = docs.iter().map(|d| d.get_i64("_id").unwrap()).collect();
            v.sort_unstable();
            v
        })
        .collect()
}

/// `(index, code)` of every write error of a write command's reply.
fn write_errors(reply: &Document) -> Vec<(i32, i32)> {
    reply
        .get_array("writeErrors")
        .map(|a| {
            a.iter()
                .map(|e| {
                    let e = e.as_document().unwrap();
                    (e.get_i32("index").unwrap(), e.get_i32("code").unwrap())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Expects `shards` to hold `want` on the primary shard `p` and nothing elsewhere.
fn only_on_primary(c: &sluice::demo::DemoCluster, coll: &str, p: usize, want: &[i64]) {
    for (i, ids) in ids_per_shard(c, "demo", coll).into_iter().enumerate() {
        if i == p {
            assert_eq!(ids, want, "demo.{coll} on the primary shard{i}");
        } else {
            assert!(ids.is_empty(), "demo.{coll} on shard{i}: {ids:?}");
        }
    }
}

/// A router that still holds a collection's sharded routing after another router dropped it
/// learns from the shards' StaleConfig that the collection is gone, finds it unsharded on the
/// config server and sends its inserts, updates and deletes to the database's primary shard,
/// as mongos does: an insert creates the collection there, unsharded. The counts, the write
/// errors' indexes and a retryable write's resend are the client's, and every document lands
/// once. `bulkWrite`, `findAndModify` and reads, too, answer as a fresh router's.
#[tokio::test]
async fn a_stale_router_sends_writes_to_a_collection_dropped_elsewhere_to_the_primary_shard() {
    let c = cluster(2, vec![router_config(), router_config()], STALE).await;
    let a = client(&c, 0).await;
    let b = client(&c, 1).await;
    let p = primary_of(&c, "demo").await;
    let demo_a = a.database("demo");
    let demo_b = b.database("demo");
    // Router A routes every collection by its chunks first, so its cache holds them sharded.
    for coll in ["items", "upd", "del", "rd", "bw", "fam"] {
        demo_a
            .collection::<Document>(coll)
            .insert_many((0..40i64).map(|i| doc! {"_id": i}))
            .await
            .unwrap();
        let per_shard = ids_per_shard(&c, "demo", coll);
        assert!(
            per_shard.iter().all(|ids| !ids.is_empty()),
            "demo.{coll} sharded over both shards"
        );
        demo_b.collection::<Document>(coll).drop().await.unwrap();
        assert!(chunks_of(&c, &format!("demo.{coll}")).await.is_none());
    }

    // Raw write commands through router A from a client of their own, whose sessions have
    // seen no other transaction number.
    let raw_a = client(&c, 0).await.database("demo");

    // insert, unordered, retryable, a duplicate `_id` at index 2.
    let mut session = raw_a.client().start_session().await.unwrap();
    let txn = common::next_txn_number();
    let insert = doc! {
        "insert": "items",
        "documents": [{"_id": 1000i64}, {"_id": 1001i64}, {"_id": 1000i64}, {"_id": 1002i64}],
        "ordered": false,
        "txnNumber": txn,
    };
    let reply = raw_a
        .run_command(insert.clone())
        .session(&mut session)
        .await
        .unwrap();
    assert_eq!(reply.get_i32("n").unwrap(), 3, "{reply}");
    assert_eq!(write_errors(&reply), vec![(2, 11000)], "{reply}");
    // The same statements again with the same transaction number: the recorded results.
    let again = raw_a
        .run_command(insert)
        .session(&mut session)
        .await
        .unwrap();
    assert_eq!(again.get_i32("n").unwrap(), 3, "{again}");
    assert_eq!(write_errors(&again), vec![(2, 11000)], "{again}");
    only_on_primary(&c, "items", p, &[1000, 1001, 1002]);
    assert!(chunks_of(&c, "demo.items").await.is_none(), "unsharded");
    assert_eq!(ids(&a, "demo", "items").await, vec![1000, 1001, 1002]);
    assert_eq!(ids(&b, "demo", "items").await, vec![1000, 1001, 1002]);

    // update: router B recreates the collection unsharded, router A (stale) updates it.
    demo_b
        .collection::<Document>("upd")
        .insert_many((0..10i64).map(|i| doc! {"_id": i}))
        .await
        .unwrap();
    let reply = raw_a
        .run_command(doc! {
            "update": "upd",
            "updates": [
                {"q": {}, "u": {"$set": {"seen": true}}, "multi": true},
                {"q": {"_id": 50i64}, "u": {"$set": {"seen": true}}, "upsert": true},
            ],
            "txnNumber": common::next_txn_number(),
        })
        .await
        .unwrap();
    assert_eq!(reply.get_i32("n").unwrap(), 11, "{reply}");
    assert_eq!(reply.get_i32("nModified").unwrap(), 10, "{reply}");
    assert!(write_errors(&reply).is_empty(), "{reply}");
    let upserted = reply.get_array("upserted").unwrap();
    assert_eq!(
        upserted[0].as_document().unwrap(),
        &doc! {"index": 1, "_id": 50i64}
    );
    let mut want: Vec<i64> = (0..10).collect();
    want.push(50);
    only_on_primary(&c, "upd", p, &want);
    let seen = demo_b
        .collection::<Document>("upd")
        .count_documents(doc! {"seen": true})
        .await
        .unwrap();
    assert_eq!(seen, 11);

    // delete, ordered: one document by `_id`, then every one from 3 on.
    demo_b
        .collection::<Document>("del")
        .insert_many((0..6i64).map(|i| doc! {"_id": i}))
        .await
        .unwrap();
    let reply = raw_a
        .run_command(doc! {
            "delete": "del",
            "deletes": [{"q": {"_id": 1i64}, "limit": 1}, {"q": {"_id": {"$gte": 3i64}}, "limit": 0}],
        })
        .await
        .unwrap();
    assert_eq!(reply.get_i32("n").unwrap(), 4, "{reply}");
    assert!(write_errors(&reply).is_empty(), "{reply}");
    only_on_primary(&c, "del", p, &[0, 2]);
    assert_eq!(ids(&a, "demo", "del").await, vec![0, 2]);

    // bulkWrite (MongoDB 8.0), ordered: an insert and an update of what it inserted.
    let reply = admin(
        &a,
        doc! {
            "bulkWrite": 1,
            "ops": [
                {"insert": 0, "document": {"_id": 7i64}},
                {"update": 0, "filter": {"_id": 7i64}, "updateMods": {"$set": {"seen": true}}},
            ],
            "nsInfo": [{"ns": "demo.bw"}],
        },
    )
    .await
    .unwrap();
    assert_eq!(reply.get_i32("nErrors").unwrap(), 0, "{reply}");
    assert_eq!(reply.get_i32("nInserted").unwrap(), 1, "{reply}");
    assert_eq!(reply.get_i32("nModified").unwrap(), 1, "{reply}");
    only_on_primary(&c, "bw", p, &[7]);
    assert!(chunks_of(&c, "demo.bw").await.is_none(), "unsharded");

    // findAndModify, an upsert: the new document on the primary shard.
    let before = demo_a
        .collection::<Document>("fam")
        .find_one_and_update(doc! {"_id": 9i64}, doc! {"$set": {"seen": true}})
        .upsert(true)
        .await
        .unwrap();
    assert!(before.is_none());
    only_on_primary(&c, "fam", p, &[9]);

    // find: router A, stale, answers what router B does.
    demo_b
        .collection::<Document>("rd")
        .insert_many((0..5i64).map(|i| doc! {"_id": i}))
        .await
        .unwrap();
    assert_eq!(ids(&a, "demo", "rd").await, (0..5).collect::<Vec<_>>());
    assert_eq!(ids(&b, "demo", "rd").await, (0..5).collect::<Vec<_>>());
    c.shutdown().await;
}

/// A router that cached a collection sharded, and its new name unsharded, before another
/// router renamed it: a write under the old name goes to the primary shard (a new, unsharded
/// collection there, an ordered bulk cut at its first error as a fresh router cuts it), and a
/// write under the new name follows the shard's StaleConfig to the collection's chunks.
#[tokio::test]
async fn a_stale_router_writes_under_both_names_of_a_collection_renamed_elsewhere() {
    let c = cluster(
        2,
        vec![router_config(), router_config()],
        "[[collections]]\nns = \"demo.ren\"\nkey = '{\"_id\": \"hashed\"}'\n",
    )
    .await;
    let a = client(&c, 0).await;
    let b = client(&c, 1).await;
    let p = primary_of(&c, "demo").await;
    a.database("demo")
        .collection::<Document>("ren")
        .insert_many((0..40i64).map(|i| doc! {"_id": i}))
        .await
        .unwrap();
    assert!(ids(&a, "demo", "moved").await.is_empty());
    admin(
        &b,
        doc! {"renameCollection": "demo.ren", "to": "demo.moved"},
    )
    .await
    .unwrap();

    // The old name, ordered, retryable, a duplicate `_id` at index 2: the first two land on
    // the primary shard, the rest is not applied.
    let raw_a = client(&c, 0).await.database("demo");
    let reply = raw_a
        .run_command(doc! {
            "insert": "ren",
            "documents": [{"_id": 1000i64}, {"_id": 1001i64}, {"_id": 1000i64}, {"_id": 1002i64}],
            "ordered": true,
            "txnNumber": common::next_txn_number(),
        })
        .await
        .unwrap();
    assert_eq!(reply.get_i32("n").unwrap(), 2, "{reply}");
    assert_eq!(write_errors(&reply), vec![(2, 11000)], "{reply}");
    only_on_primary(&c, "ren", p, &[1000, 1001]);
    assert!(chunks_of(&c, "demo.ren").await.is_none(), "unsharded");
    assert_eq!(ids(&a, "demo", "ren").await, vec![1000, 1001]);
    assert_eq!(ids(&b, "demo", "ren").await, vec![1000, 1001]);

    // The new name: sharded, by the chunks the collection kept.
    a.database("demo")
        .collection::<Document>("moved")
        .insert_many((40..80i64).map(|i| doc! {"_id": i}))
        .await
        .unwrap();
    assert!(chunks_of(&c, "demo.moved").await.is_some());
    let per_shard = ids_per_shard(&c, "demo", "moved");
    assert_eq!(
        per_shard.iter().map(Vec::len).sum::<usize>(),
        80,
        "{per_shard:?}"
    );
    assert!(
        per_shard.iter().all(|ids| ids.iter().any(|i| *i >= 40)),
        "new documents on both shards: {per_shard:?}"
    );
    assert_eq!(ids(&a, "demo", "moved").await, (0..80).collect::<Vec<_>>());
    assert_eq!(ids(&b, "demo", "moved").await, (0..80).collect::<Vec<_>>());
    c.shutdown().await;
}

/// `movePrimary` through router A: the database's unsharded collections (documents and
/// indexes) move to the new primary shard and leave the old one, the sharded ones stay where
/// their chunks are, `config.databases` names the new primary; router B, which cached the old
/// primary, follows through StaleDbVersion for reads and writes.
#[tokio::test]
async fn move_primary_moves_the_unsharded_collections_and_both_routers_follow() {
    let c = cluster(2, vec![router_config(), router_config()], ITEMS).await;
    let a = client(&c, 0).await;
    let b = client(&c, 1).await;
    let p = primary_of(&c, "demo").await;
    let other = 1 - p;
    let plain = a.database("demo").collection::<Document>("plain");
    plain
        .insert_many((0..100i64).map(|i| doc! {"_id": i, "x": i}))
        .await
        .unwrap();
    plain
        .create_index(
            mongodb::IndexModel::builder()
                .keys(doc! {"x": 1})
                .options(
                    mongodb::options::IndexOptions::builder()
                        .unique(true)
                        .build(),
                )
                .build(),
        )
        .await
        .unwrap();
    a.database("demo")
        .collection::<Document>("items")
        .insert_many((0..50i64).map(|i| doc! {"_id": i}))
        .await
        .unwrap();
    a.database("demo")
        .create_collection("small")
        .view_on("plain".to_string())
        .pipeline(vec![doc! {"$match": {"x": {"$lt": 10i64}}}])
        .await
        .unwrap();
    // Router B routes the database by its old primary first.
    assert_eq!(ids(&b, "demo", "plain").await, (0..100).collect::<Vec<_>>());
    assert_eq!(ids(&b, "demo", "small").await, (0..10).collect::<Vec<_>>());
    let items_before = ids_per_shard(&c, "demo", "items");

    // Errors first: an unknown shard, a database other than admin, a missing `to`.
    let e = admin(&a, doc! {"movePrimary": "demo", "to": "nowhere"})
        .await
        .unwrap_err();
    assert_eq!(common::command_code(&e), 70, "{e}");
    let e = a
        .database("demo")
        .run_command(doc! {"movePrimary": "demo", "to": "shard0"})
        .await
        .unwrap_err();
    assert_eq!(common::command_code(&e), 13, "{e}");
    let e = admin(&a, doc! {"movePrimary": "demo"}).await.unwrap_err();
    assert_eq!(common::command_code(&e), 40414, "{e}");
    // To the current primary: nothing to do.
    admin(&a, doc! {"movePrimary": "demo", "to": format!("shard{p}")})
        .await
        .unwrap();
    assert_eq!(primary_of(&c, "demo").await, p);
    // A collection the new primary already holds: NamespaceExists, nothing moved.
    a.database("demo")
        .collection::<Document>("clash")
        .insert_one(doc! {"_id": 1i64})
        .await
        .unwrap();
    let on_other = direct(c.shards[other].local_addr()).await;
    on_other
        .database("demo")
        .collection::<Document>("clash")
        .insert_one(doc! {"_id": 2i64})
        .await
        .unwrap();
    let e = admin(
        &a,
        doc! {"movePrimary": "demo", "to": format!("shard{other}")},
    )
    .await
    .unwrap_err();
    assert_eq!(common::command_code(&e), 48, "{e}");
    assert_eq!(primary_of(&c, "demo").await, p);
    only_on_primary(&c, "plain", p, &(0..100).collect::<Vec<_>>());
    on_other
        .database("demo")
        .collection::<Document>("clash")
        .drop()
        .await
        .unwrap();

    // A writer through router B inserts while the primary moves: each acknowledged insert
    // ends on the new primary, once.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let coll = client(&c, 1)
            .await
            .database("demo")
            .collection::<Document>("plain");
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            let mut id = 1000i64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                coll.insert_one(doc! {"_id": id, "x": id}).await.unwrap();
                acknowledged.push(id);
                id += 1;
            }
            acknowledged
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    admin(
        &a,
        doc! {"movePrimary": "demo", "to": format!("shard{other}")},
    )
    .await
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let acknowledged = writer.await.unwrap();
    assert!(acknowledged.len() > 5, "{acknowledged:?}");
    assert_eq!(primary_of(&c, "demo").await, other);
    let mut want: Vec<i64> = (0..100).collect();
    want.extend(&acknowledged);
    only_on_primary(&c, "plain", other, &want);
    b.database("demo")
        .collection::<Document>("plain")
        .delete_many(doc! {"_id": {"$gte": 1000i64}})
        .await
        .unwrap();
    only_on_primary(&c, "plain", other, &(0..100).collect::<Vec<_>>());
    only_on_primary(&c, "clash", other, &[1]);
    // The view moved with its definition.
    assert_eq!(ids(&b, "demo", "small").await, (0..10).collect::<Vec<_>>());
    let on_p = direct(c.shards[p].local_addr()).await;
    let left = on_p.database("demo").list_collection_names().await.unwrap();
    assert!(
        !left.iter().any(|n| n == "small" || n == "plain"),
        "{left:?}"
    );
    assert_eq!(
        ids_per_shard(&c, "demo", "items"),
        items_before,
        "the sharded collection stays"
    );

    // B, stale, reads and writes the unsharded collection on the new primary.
    assert_eq!(ids(&b, "demo", "plain").await, (0..100).collect::<Vec<_>>());
    b.database("demo")
        .collection::<Document>("plain")
        .insert_many((100..110i64).map(|i| doc! {"_id": i, "x": i}))
        .await
        .unwrap();
    only_on_primary(&c, "plain", other, &(0..110).collect::<Vec<_>>());
    assert_eq!(ids(&a, "demo", "plain").await, (0..110).collect::<Vec<_>>());
    // The unique index moved with it.
    let e = plain
        .insert_one(doc! {"_id": 500i64, "x": 5i64})
        .await
        .unwrap_err();
    assert_eq!(common::error_code(&e), 11000, "{e}");
    c.shutdown().await;
}

/// Inserts of `_id`s `range` into `demo.plain` (unsharded) and `demo.items` (sharded),
/// alternating, as the driver's `Client::bulk_write` models.
fn plain_and_items(range: std::ops::Range<i64>) -> Vec<mongodb::options::WriteModel> {
    use mongodb::options::InsertOneModel;
    range
        .flat_map(|i| {
            ["plain", "items"].map(|coll| {
                InsertOneModel::builder()
                    .namespace(mongodb::Namespace::new("demo", coll))
                    .document(doc! {"_id": i})
                    .build()
                    .into()
            })
        })
        .collect()
}

/// A client `bulkWrite` (MongoDB 8.0, the stock driver's `Client::bulk_write`) whose child
/// reaches a database's primary shard carries, for the unsharded namespace, the UNSHARDED
/// `shardVersion` and the database's `databaseVersion` in its `nsInfo`, as mongos sends it. A
/// router that cached the old primary before `movePrimary` through another router is refused
/// by the old primary (StaleDbVersion), refreshes and writes on the new primary: nothing lands
/// on the old one, where the other router would never read it.
#[tokio::test]
async fn a_bulk_write_on_an_unsharded_namespace_carries_the_database_version() {
    let c = cluster(2, vec![router_config(), router_config()], ITEMS).await;
    let a = client(&c, 0).await;
    let b = client(&c, 1).await;
    let p = primary_of(&c, "demo").await;
    let other = 1 - p;
    // Router B learns the database's primary and versions with a first bulkWrite.
    let r = b.bulk_write(plain_and_items(0..10)).await.unwrap();
    assert_eq!(r.inserted_count, 20);
    only_on_primary(&c, "plain", p, &(0..10).collect::<Vec<_>>());

    admin(
        &a,
        doc! {"movePrimary": "demo", "to": format!("shard{other}")},
    )
    .await
    .unwrap();
    assert_eq!(primary_of(&c, "demo").await, other);
    only_on_primary(&c, "plain", other, &(0..10).collect::<Vec<_>>());

    // Router B, stale, writes both namespaces again, ordered and then unordered.
    let r = b.bulk_write(plain_and_items(10..20)).await.unwrap();
    assert_eq!(r.inserted_count, 20);
    let r = b
        .bulk_write(plain_and_items(20..30))
        .ordered(false)
        .await
        .unwrap();
    assert_eq!(r.inserted_count, 20);
    only_on_primary(&c, "plain", other, &(0..30).collect::<Vec<_>>());
    assert_eq!(ids(&a, "demo", "plain").await, (0..30).collect::<Vec<_>>());
    assert_eq!(ids(&a, "demo", "items").await, (0..30).collect::<Vec<_>>());
    let per_shard = ids_per_shard(&c, "demo", "items");
    assert_eq!(
        per_shard.iter().map(Vec::len).sum::<usize>(),
        30,
        "{per_shard:?}"
    );
    c.shutdown().await;
}

/// Inserts `{_id: writer * 1_000_000 + i}` for i = 0, 1, … into `db.coll` through `client`,
/// one at a time, until `stop`; the `_id`s acknowledged, in order (every insert must succeed).
fn insert_until(
    client: mongodb::Client,
    (db, coll): (&'static str, &'static str),
    writer: i64,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Vec<i64>> {
    tokio::spawn(async move {
        let coll = client.database(db).collection::<Document>(coll);
        let mut acked = Vec::new();
        let mut id = writer * 1_000_000;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            coll.insert_one(doc! {"_id": id})
                .await
                .unwrap_or_else(|e| panic!("insert of {id} failed: {e}"));
            acked.push(id);
            id += 1;
        }
        acked
    })
}

/// After a DDL raced by writers: each writer's acknowledged inserts (in the order they were
/// acknowledged) are absent up to some point and all present from it on, nothing but
/// acknowledged inserts is left, and the writers ran both before and after the DDL.
fn assert_acknowledged_suffixes_survived(acked: &[Vec<i64>], left: &[i64], round: &str) {
    let survived: std::collections::HashSet<i64> = left.iter().copied().collect();
    let (mut dropped, mut kept) = (0, 0);
    for (w, ids) in acked.iter().enumerate() {
        let cut = ids.iter().take_while(|i| !survived.contains(i)).count();
        let lost: Vec<i64> = ids[cut..]
            .iter()
            .filter(|i| !survived.contains(i))
            .copied()
            .collect();
        assert!(
            lost.is_empty(),
            "{round}: writer {w}'s acknowledged {lost:?} lost after {} survived",
            ids[cut]
        );
        dropped += cut;
        kept += ids.len() - cut;
    }
    assert_eq!(left.len(), kept, "{round}: only acknowledged inserts");
    assert!(
        dropped > 0 && kept > 0,
        "{round}: the writers ran before ({dropped}) and after ({kept}) the drop"
    );
}

/// Writers inserting one document at a time through router B into `db.coll` while `ddl`
/// runs on the database `on` through router A (after the writers have run a while, and
/// they go on a while after it): the `_id`s each writer was acknowledged, in order.
async fn writes_racing(
    c: &sluice::demo::DemoCluster,
    ns: (&'static str, &'static str),
    on: &str,
    ddl: Document,
) -> Vec<Vec<i64>> {
    const WRITERS: i64 = 8;
    let a = client(c, 0).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 1..=WRITERS {
        writers.push(insert_until(client(c, 1).await, ns, w, stop.clone()));
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let began = std::time::Instant::now();
    a.database(on)
        .run_command(ddl.clone())
        .await
        .unwrap_or_else(|e| panic!("{ddl} through router A: {e}"));
    // docs/design/config-server.md records these (`-- --nocapture` prints them).
    println!("{ddl} under {WRITERS} writers took {:?}", began.elapsed());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acked = Vec::new();
    for w in writers {
        acked.push(w.await.unwrap());
    }
    acked
}

/// Rounds of each race test, one sharded collection each.
const ROUNDS: [&str; 5] = ["race0", "race1", "race2", "race3", "race4"];

/// The cluster of the race tests: two shards, two routers, the [`ROUNDS`] collections sharded
/// on `{_id: "hashed"}`.
async fn race_cluster() -> sluice::demo::DemoCluster {
    let collections: String = ROUNDS
        .iter()
        .map(|c| format!("[[collections]]\nns = \"demo.{c}\"\nkey = '{{\"_id\": \"hashed\"}}'\n"))
        .collect();
    cluster(2, vec![router_config(), router_config()], &collections).await
}

/// A sharded collection renamed through router A while eight writers insert into it under its
/// old name through router B: each shard holds the collection's critical section across the
/// rename, so a racing insert either lands before it (and is renamed with the collection) or
/// waits, is answered StaleConfig and goes, as router B's refreshed routing says, to a new
/// unsharded collection under the old name on the primary shard. Afterwards every
/// acknowledged insert is found exactly once: each writer's first ones under the new name,
/// the rest under the old, and nothing under the old name on the other shard, where no
/// router would read it. Five rounds; without the critical section a write landing on a
/// shard that had already renamed its copy is lost (the test fails).
#[tokio::test]
async fn inserts_racing_a_rename_of_a_sharded_collection_are_all_found_under_one_name() {
    let c = race_cluster().await;
    let a = client(&c, 0).await;
    let b = client(&c, 1).await;
    let p = primary_of(&c, "demo").await;
    for from in ROUNDS {
        let to: &str = &format!("re{from}");
        let seed: Vec<i64> = (0..100).collect();
        a.database("demo")
            .collection::<Document>(from)
            .insert_many(seed.iter().map(|i| doc! {"_id": i}))
            .await
            .unwrap();
        // Router B routes the old name by its chunks.
        assert_eq!(ids(&b, "demo", from).await, seed);
        let acked = writes_racing(
            &c,
            ("demo", from),
            "admin",
            doc! {"renameCollection": format!("demo.{from}"), "to": format!("demo.{to}")},
        )
        .await;
        let under_new = ids(&a, "demo", to).await;
        let under_old = ids(&a, "demo", from).await;
        assert_eq!(ids(&b, "demo", to).await, under_new, "B reads as A");
        assert!(chunks_of(&c, &format!("demo.{to}")).await.is_some());
        assert!(chunks_of(&c, &format!("demo.{from}")).await.is_none());
        // Whatever is under the old name is on the primary shard only.
        for (i, held) in ids_per_shard(&c, "demo", from).into_iter().enumerate() {
            if i == p {
                assert_eq!(held, under_old, "demo.{from} on the primary shard{i}");
            } else {
                assert!(held.is_empty(), "demo.{from} left on shard{i}: {held:?}");
            }
        }
        let new: std::collections::HashSet<i64> = under_new.iter().copied().collect();
        let old: std::collections::HashSet<i64> = under_old.iter().copied().collect();
        assert!(seed.iter().all(|i| new.contains(i)), "the seed was renamed");
        let mut total = seed.len();
        let (mut before, mut after) = (0, 0);
        for (w, ids) in acked.iter().enumerate() {
            total += ids.len();
            // A prefix of the writer's inserts under the new name, the rest under the old.
            let cut = ids.iter().take_while(|i| new.contains(i)).count();
            for id in &ids[cut..] {
                assert!(
                    old.contains(id),
                    "round {from}: writer {w}'s acknowledged {id} is under neither name \
                     (under the new one: {cut} of {}; under the old: {})",
                    ids.len(),
                    ids[cut..].iter().filter(|i| old.contains(i)).count()
                );
            }
            before += cut;
            after += ids.len() - cut;
        }
        assert_eq!(
            under_new.len() + under_old.len(),
            total,
            "round {from}: nothing found twice or unacknowledged"
        );
        assert!(
            before > 0 && after > 0,
            "round {from}: the writers ran before ({before}) and after ({after}) the rename"
        );
    }
    c.shutdown().await;
}

/// A sharded collection dropped through router A while eight writers insert into it through
/// router B: each shard holds the collection's critical section from before the drop's
/// commit until it has dropped its copy, so a racing insert either lands before the drop
/// (and is dropped with the collection) or waits, is answered StaleConfig and creates the
/// collection again, unsharded, on the primary shard. Afterwards the collection is untracked,
/// held by the primary shard only, and holds exactly each writer's inserts from some point
/// on (none lost after a later one survived, none orphaned on the other shard). Five rounds;
/// without the critical section an insert landing on a shard between the commit and its
/// local drop is lost while the writer's next ones survive (the test fails).
#[tokio::test]
async fn inserts_racing_a_drop_of_a_sharded_collection_recreate_it_on_the_primary() {
    let c = race_cluster().await;
    let a = client(&c, 0).await;
    let b = client(&c, 1).await;
    let p = primary_of(&c, "demo").await;
    for coll in ROUNDS {
        a.database("demo")
            .collection::<Document>(coll)
            .insert_many((0..100i64).map(|i| doc! {"_id": i}))
            .await
            .unwrap();
        assert_eq!(ids(&b, "demo", coll).await.len(), 100);
        let acked = writes_racing(&c, ("demo", coll), "demo", doc! {"drop": coll}).await;
        let left = ids(&a, "demo", coll).await;
        assert_eq!(ids(&b, "demo", coll).await, left, "B reads as A");
        assert!(
            chunks_of(&c, &format!("demo.{coll}")).await.is_none(),
            "untracked"
        );
        for (i, held) in ids_per_shard(&c, "demo", coll).into_iter().enumerate() {
            if i == p {
                assert_eq!(held, left, "demo.{coll} on the primary shard{i}");
            } else {
                assert!(
                    held.is_empty(),
                    "demo.{coll} orphaned on shard{i}: {held:?}"
                );
            }
        }
        assert_acknowledged_suffixes_survived(&acked, &left, &format!("round {coll}"));
    }
    c.shutdown().await;
}

/// A database dropped through router A while eight writers insert into its sharded
/// collection through router B: every shard holds the database's critical section from before
/// the commit until it has dropped the database and forgotten its routing, so a racing insert
/// either lands before the drop (and is dropped with it) or waits, is answered StaleConfig and
/// creates the database and the collection again, unsharded, on the new primary shard.
/// Afterwards each writer's inserts from some point on are found, none earlier, and no shard
/// holds a document the routers do not read. Five rounds.
#[tokio::test]
async fn inserts_racing_a_drop_database_recreate_it_consistently() {
    let c = cluster(
        2,
        vec![router_config(), router_config()],
        "[[collections]]\nns = \"gone.c\"\nkey = '{\"_id\": \"hashed\"}'\n",
    )
    .await;
    let a = client(&c, 0).await;
    let b = client(&c, 1).await;
    for round in 0..5 {
        if round > 0 {
            // Sharded again for the next round (the last round's inserts made it unsharded).
            a.database("gone").drop().await.unwrap();
            admin(
                &a,
                doc! {"shardCollection": "gone.c", "key": {"_id": "hashed"}},
            )
            .await
            .unwrap();
        }
        a.database("gone")
            .collection::<Document>("c")
            .insert_many((0..100i64).map(|i| doc! {"_id": i}))
            .await
            .unwrap();
        assert_eq!(ids(&b, "gone", "c").await.len(), 100);
        let acked = writes_racing(&c, ("gone", "c"), "gone", doc! {"dropDatabase": 1}).await;
        let left = ids(&a, "gone", "c").await;
        assert_eq!(ids(&b, "gone", "c").await, left, "B reads as A");
        assert!(chunks_of(&c, "gone.c").await.is_none(), "untracked");
        let held: usize = ids_per_shard(&c, "gone", "c").iter().map(Vec::len).sum();
        assert_eq!(
            held,
            left.len(),
            "round {round}: nothing orphaned on a shard"
        );
        assert_acknowledged_suffixes_survived(&acked, &left, &format!("round {round}"));
    }
    c.shutdown().await;
}

/// The cluster of the coordinator step-down tests: two shards, each a replica set of three
/// embedded members, two routers, `demo.c` sharded on `{_id: "hashed"}` holding `_id` 0..100.
async fn replica_set_cluster() -> sluice::demo::DemoCluster {
    let collections: Config =
        toml::from_str("[[collections]]\nns = \"demo.c\"\nkey = '{\"_id\": \"hashed\"}'\n")
            .unwrap();
    let c = sluice::demo::DemoCluster::start_with_members(
        2,
        3,
        ShardOptions::for_tests(),
        vec![router_config(), router_config()],
        vec!["sluice".into()],
        &collections.collections,
    )
    .await
    .expect("the embedded cluster starts");
    client(&c, 0)
        .await
        .database("demo")
        .collection::<Document>("c")
        .insert_many((0..100i64).map(|i| doc! {"_id": i}))
        .await
        .unwrap();
    c
}

/// Runs `ddl` on the database `on` through router A while four writers insert into `demo.c`
/// through router B, with the primary shard's primary stepping down right after its
/// coordinator recorded `phase`: the DDL must still answer (the router sends it again to the
/// new primary, which resumed the coordinator), and the writers must go on (no shard is left
/// in the critical section). Returns the `_id`s each writer was acknowledged, and the primary
/// shard's index.
async fn ddl_across_a_step_down(
    c: &sluice::demo::DemoCluster,
    phase: &str,
    on: &str,
    ddl: Document,
) -> (Vec<Vec<i64>>, usize) {
    ddl_across_a_primary_change(c, phase, on, ddl, false).await
}

/// [`ddl_across_a_step_down`], the primary killed instead (`kill`): stopped right after the
/// phase, then its listener and connections closed.
async fn ddl_across_a_primary_change(
    c: &sluice::demo::DemoCluster,
    phase: &str,
    on: &str,
    ddl: Document,
    kill: bool,
) -> (Vec<Vec<i64>>, usize) {
    const WRITERS: i64 = 4;
    let limit = std::time::Duration::from_secs(20);
    let p = primary_of(c, "demo").await;
    let set = &c.sets[p];
    let old_primary = set.primary().unwrap();
    if kill {
        set.stop_after_ddl_phase(phase);
    } else {
        set.step_down_after_ddl_phase(phase);
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 1..=WRITERS {
        writers.push(insert_until(
            client(c, 1).await,
            ("demo", "c"),
            w,
            stop.clone(),
        ));
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let a = client(c, 0).await;
    let database = a.database(on);
    let sent = database.run_command(ddl.clone());
    let killer = async {
        if kill {
            while set.role(old_primary) != Some(sluice::embedded::MemberRole::Stopped) {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            set.stop(old_primary).await;
        }
    };
    let (answered, ()) = tokio::join!(tokio::time::timeout(limit, sent), killer);
    answered
        .unwrap_or_else(|_| panic!("{ddl} did not finish after the primary changed"))
        .unwrap_or_else(|e| panic!("{ddl} through router A: {e}"));
    let new_primary = set.primary();
    assert!(
        new_primary.is_some() && new_primary != Some(old_primary),
        "the primary shard's primary stepped down after {phase} (now {new_primary:?})"
    );
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acked = Vec::new();
    for w in writers {
        let ids = tokio::time::timeout(limit, w)
            .await
            .expect("a writer is stuck: a shard stayed in the critical section")
            .unwrap();
        acked.push(ids);
    }
    // Nothing left to resume, and a fresh write through each router goes through.
    for set in &c.sets {
        let left: Vec<Document> = set
            .documents("config", "system.sharding_ddl_coordinators")
            .into_iter()
            .filter(|d| d.get_str("phase").ok() != Some("setResponse"))
            .collect();
        assert!(left.is_empty(), "unfinished coordinators: {left:?}");
    }
    for (i, id) in [(0, -1i64), (1, -2)] {
        let coll = client(c, i)
            .await
            .database("demo")
            .collection::<Document>("probe");
        tokio::time::timeout(limit, coll.insert_one(doc! {"_id": id}))
            .await
            .expect("a write after the DDL is stuck")
            .unwrap();
    }
    (acked, p)
}

/// A drop of a sharded collection whose primary shard's primary steps down right after the
/// coordinator recorded `dropCollection` (every shard in the critical section, nothing
/// dropped): the new primary resumes the coordinator from its document in
/// `config.system.sharding_ddl_coordinators`, drops the collection everywhere and releases
/// the shards; router A's `drop`, sent again to the new primary, answers. Afterwards the
/// collection is untracked, held by the primary shard only, with each writer's acknowledged
/// inserts from some point on. Without the resume the other shard stays in the critical
/// section and the test fails (the writers and the `drop` hang).
#[tokio::test]
async fn a_drop_whose_primary_steps_down_midway_is_finished_by_the_next_primary() {
    drop_across_a_primary_change(false).await;
}

/// As above, the primary shard's primary killed (stopped, its connections closed) right
/// after the coordinator recorded `dropCollection`.
#[tokio::test]
async fn a_drop_whose_primary_is_killed_midway_is_finished_by_the_next_primary() {
    drop_across_a_primary_change(true).await;
}

async fn drop_across_a_primary_change(kill: bool) {
    let c = replica_set_cluster().await;
    let (acked, p) =
        ddl_across_a_primary_change(&c, "dropCollection", "demo", doc! {"drop": "c"}, kill).await;
    assert!(chunks_of(&c, "demo.c").await.is_none(), "untracked");
    let left = ids(&client(&c, 0).await, "demo", "c").await;
    assert_eq!(
        ids(&client(&c, 1).await, "demo", "c").await,
        left,
        "B reads as A"
    );
    for (i, held) in ids_per_shard(&c, "demo", "c").into_iter().enumerate() {
        if i == p {
            assert_eq!(held, left, "demo.c on the primary shard{i}");
        } else {
            assert!(held.is_empty(), "demo.c orphaned on shard{i}: {held:?}");
        }
    }
    assert_acknowledged_suffixes_survived(&acked, &left, "drop");
    c.shutdown().await;
}

/// A rename of a sharded collection whose primary shard's primary steps down right after the
/// coordinator recorded `renameParticipants` (both names in the critical section on every
/// shard, nothing renamed yet): the new primary resumes it, renames on every shard, commits
/// and releases; router A's `renameCollection`, sent again, gets the recorded response.
/// Afterwards every acknowledged insert is found exactly once: the seed and each writer's
/// first inserts under the new name, the rest under the old name on the primary shard only.
/// Without the resume the shards stay in the critical section and the test fails.
#[tokio::test]
async fn a_rename_whose_primary_steps_down_midway_is_finished_by_the_next_primary() {
    let c = replica_set_cluster().await;
    let (acked, p) = ddl_across_a_step_down(
        &c,
        "renameParticipants",
        "admin",
        doc! {"renameCollection": "demo.c", "to": "demo.renamed"},
    )
    .await;
    assert!(chunks_of(&c, "demo.renamed").await.is_some());
    assert!(chunks_of(&c, "demo.c").await.is_none());
    let a = client(&c, 0).await;
    let under_new = ids(&a, "demo", "renamed").await;
    let under_old = ids(&a, "demo", "c").await;
    assert_eq!(
        ids(&client(&c, 1).await, "demo", "renamed").await,
        under_new
    );
    for (i, held) in ids_per_shard(&c, "demo", "c").into_iter().enumerate() {
        if i == p {
            assert_eq!(held, under_old, "demo.c on the primary shard{i}");
        } else {
            assert!(held.is_empty(), "demo.c left on shard{i}: {held:?}");
        }
    }
    let new: std::collections::HashSet<i64> = under_new.iter().copied().collect();
    let old: std::collections::HashSet<i64> = under_old.iter().copied().collect();
    assert!((0..100).all(|i| new.contains(&i)), "the seed was renamed");
    let mut total = 100;
    for (w, ids) in acked.iter().enumerate() {
        total += ids.len();
        let cut = ids.iter().take_while(|i| new.contains(i)).count();
        for id in &ids[cut..] {
            assert!(
                old.contains(id),
                "writer {w}'s acknowledged {id} is under neither name"
            );
        }
    }
    assert_eq!(
        under_new.len() + under_old.len(),
        total,
        "each insert found once"
    );
    c.shutdown().await;
}

/// A `dropDatabase` whose primary shard's primary steps down right after the coordinator
/// recorded `drop` (every shard in the database's critical section, nothing dropped): the new
/// primary resumes it, drops the database everywhere and releases the shards; router A's
/// `dropDatabase`, sent again, answers. Afterwards the database's collection is untracked and
/// holds each writer's acknowledged inserts from some point on, on one shard only. Without the
/// resume the shards stay in the critical section and the test fails.
#[tokio::test]
async fn a_drop_database_whose_primary_steps_down_midway_is_finished_by_the_next_primary() {
    let c = replica_set_cluster().await;
    let (acked, _) = ddl_across_a_step_down(&c, "drop", "demo", doc! {"dropDatabase": 1}).await;
    assert!(chunks_of(&c, "demo.c").await.is_none(), "untracked");
    let left = ids(&client(&c, 0).await, "demo", "c").await;
    assert_eq!(
        ids(&client(&c, 1).await, "demo", "c").await,
        left,
        "B reads as A"
    );
    let p = primary_of(&c, "demo").await;
    for (i, held) in ids_per_shard(&c, "demo", "c").into_iter().enumerate() {
        if i == p {
            assert_eq!(held, left, "demo.c on the primary shard{i}");
        } else {
            assert!(held.is_empty(), "demo.c orphaned on shard{i}: {held:?}");
        }
    }
    assert_acknowledged_suffixes_survived(&acked, &left, "dropDatabase");
    c.shutdown().await;
}

/// `addShard` gives the shard its identity before the cluster lists it, as MongoDB 8.0's config
/// server does (`_shardsvrAddShard {shardIdentity: {shardName, clusterId,
/// configsvrConnectionString}}`): each shard holds `admin.system.version {_id:
/// "shardIdentity"}` naming it, the cluster's id from `config.version` and the config server.
/// The same identity again is accepted; another name is IllegalOperation (20) and changes
/// nothing; a missing or mistyped identity is refused as mongod's IDL parser refuses it.
#[tokio::test]
async fn add_shard_gives_each_shard_its_identity() {
    let c = cluster(2, vec![router_config()], "").await;
    let config = direct(c.config_server.local_addr())
        .await
        .database("config");
    let cluster_id = config
        .collection::<Document>("version")
        .find_one(doc! {})
        .await
        .unwrap()
        .unwrap()
        .get_object_id("clusterId")
        .unwrap();
    for (i, shard) in c.shards.iter().enumerate() {
        let admin = direct(shard.local_addr()).await.database("admin");
        let identity = admin
            .collection::<Document>("system.version")
            .find_one(doc! {"_id": "shardIdentity"})
            .await
            .unwrap()
            .expect("the shard holds its identity");
        assert_eq!(
            identity,
            doc! {
                "_id": "shardIdentity",
                "shardName": format!("shard{i}"),
                "clusterId": cluster_id,
                "configsvrConnectionString": c.configdb(),
            }
        );
        let again = doc! {
            "_shardsvrAddShard": 1,
            "shardIdentity": {
                "shardName": format!("shard{i}"),
                "clusterId": cluster_id,
                "configsvrConnectionString": c.configdb(),
            },
        };
        admin.run_command(again).await.unwrap();
        let other = doc! {
            "_shardsvrAddShard": 1,
            "shardIdentity": {
                "shardName": "elsewhere",
                "clusterId": cluster_id,
                "configsvrConnectionString": c.configdb(),
            },
        };
        let e = admin.run_command(other).await.unwrap_err();
        assert_eq!(common::command_code(&e), 20, "{e}");
        let e = admin
            .run_command(doc! {"_shardsvrAddShard": 1})
            .await
            .unwrap_err();
        assert_eq!(common::command_code(&e), 40414, "{e}");
        let e = admin
            .run_command(doc! {"_shardsvrAddShard": 1, "shardIdentity": {
            "shardName": 7, "clusterId": cluster_id, "configsvrConnectionString": "x"}})
            .await
            .unwrap_err();
        assert_eq!(common::command_code(&e), 14, "{e}");
        let kept = admin
            .collection::<Document>("system.version")
            .find_one(doc! {"_id": "shardIdentity"})
            .await
            .unwrap()
            .unwrap();
        assert_eq!(kept, identity, "a refused identity changes nothing");
    }
    c.shutdown().await;
}
