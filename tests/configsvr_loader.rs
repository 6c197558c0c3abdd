//! The config-server loader through the stock driver, against an embedded shard that plays the
//! config server: it holds `config.*` documents as a 6.0+ config server writes them, the loader
//! reads them with majority read concern, and the catalog cache follows a migration, a
//! resharding of the collection through "another router" and a malformed document — without
//! ever writing to `config.*`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, oid::ObjectId, Bson, Document, Uuid};
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::ClientOptions;
use sluice::backend::topology::Printer;
use sluice::embedded::EmbeddedShard;
use sluice::metadata::configsvr::{
    CatalogCache, ConfigDb, ConfigServerSource, RefreshPolicy, ShardVersion, StaleError,
};
use sluice::routing::ShardKey;
use sluice::value::error_codes::ErrorCode;
use sluice::value::field::type_name;
use sluice::value::render::{render_doc, render_value};

use common::ts;

const PRINTER: Printer = Printer {
    document: render_doc,
    value: render_value,
    type_name,
};

/// The embedded config server and a plain driver client to write its documents with.
struct ConfigServer {
    shard: EmbeddedShard,
    writer: mongodb::Client,
    configdb: ConfigDb,
}

impl ConfigServer {
    async fn start() -> ConfigServer {
        let (shard, writer) = common::config_server("configRS").await;
        let addr = shard.local_addr();
        let configdb = ConfigDb::parse(&format!("configRS/{addr}")).unwrap();
        ConfigServer {
            shard,
            writer,
            configdb,
        }
    }

    fn coll(&self, name: &str) -> mongodb::Collection<Document> {
        self.writer.database("config").collection(name)
    }

    async fn insert(&self, name: &str, docs: Vec<Document>) {
        self.coll(name).insert_many(docs).await.unwrap();
    }
}

/// The commands the loader's client sent, by name, with their bodies.
type Log = Arc<Mutex<Vec<(String, Document)>>>;

async fn source(cfg: &ConfigServer) -> (ConfigServerSource, Log) {
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let mut options = ClientOptions::parse(cfg.configdb.uri()).await.unwrap();
    options.server_selection_timeout = Some(Duration::from_secs(5));
    let sink = log.clone();
    options.command_event_handler = Some(EventHandler::callback(move |e: CommandEvent| {
        if let CommandEvent::Started(s) = e {
            sink.lock()
                .unwrap()
                .push((s.command_name.clone(), s.command.clone()));
        }
    }));
    (ConfigServerSource::with_options(options).unwrap(), log)
}

const UUID: Uuid = Uuid::from_bytes([4; 16]);

fn chunk(min: Bson, max: Bson, shard: &str, major: u32, minor: u32) -> Document {
    common::chunk(UUID, min, max, shard, major, minor)
}

/// `app.c` sharded on `{x: 1}`: (-inf, 0) on shard0, [0, +inf) on shard1.
async fn populate(cfg: &ConfigServer, epoch: ObjectId) {
    cfg.insert(
        "shards",
        vec![
            doc! {"_id": "shard0", "host": "shard0/127.0.0.1:40000", "state": 1, "topologyTime": ts(1, 1)},
            doc! {"_id": "shard1", "host": "shard1/127.0.0.1:40001", "state": 1, "topologyTime": ts(1, 1)},
        ],
    )
    .await;
    cfg.insert(
        "databases",
        vec![doc! {"_id": "app", "primary": "shard0", "version": {"uuid": Uuid::from_bytes([1; 16]), "timestamp": ts(10, 1), "lastMod": 1}}],
    )
    .await;
    cfg.insert(
        "collections",
        vec![doc! {
            "_id": "app.c", "lastmodEpoch": epoch, "lastmod": bson::DateTime::now(),
            "timestamp": ts(100, 1), "uuid": UUID, "key": {"x": 1}, "unique": false, "noBalance": false,
        }],
    )
    .await;
    cfg.insert(
        "chunks",
        vec![
            chunk(Bson::MinKey, Bson::Int64(0), "shard0", 1, 0),
            chunk(Bson::Int64(0), Bson::MaxKey, "shard1", 1, 1),
        ],
    )
    .await;
}

fn key(v: i64) -> ShardKey {
    ShardKey(vec![Bson::Int64(v)])
}

fn policy() -> RefreshPolicy {
    RefreshPolicy {
        attempts: 3,
        backoff: Duration::from_millis(5),
        rounds: 3,
    }
}

#[tokio::test]
async fn loads_and_follows_a_migration_with_majority_reads_only() {
    let cfg = ConfigServer::start().await;
    let epoch = ObjectId::new();
    populate(&cfg, epoch).await;
    let (src, log) = source(&cfg).await;
    let cache = CatalogCache::with_policy(Arc::new(src), PRINTER, policy());

    let info = cache.routing_info("app.c").await.unwrap();
    let routing = info.collection.clone().expect("app.c is tracked");
    assert_eq!(routing.snapshot.shard_for(&key(-1)), Some("shard0"));
    assert_eq!(routing.snapshot.shard_for(&key(1)), Some("shard1"));
    assert_eq!(
        info.versions_for("shard1")
            .unwrap()
            .shard_version
            .unwrap()
            .to_document(),
        doc! {"e": epoch, "t": ts(100, 1), "v": ts(1, 1)}
    );
    let shard = cache.shard("shard1").await.unwrap();
    assert_eq!(shard.seeds.set_name.as_deref(), Some("shard1"));
    let plain = cache.routing_info("app.plain").await.unwrap();
    assert!(plain.collection.is_none());
    assert_eq!(
        plain.versions_for("shard0").unwrap().shard_version,
        Some(ShardVersion::unsharded())
    );

    // A migration committed by the config server: [0, +inf) to shard0 at 2|0, shard0's other
    // chunk bumped to 2|1. The donor's StaleConfig names the version it wants.
    let chunks = cfg.coll("chunks");
    chunks
        .update_one(
            doc! {"min": {"x": 0i64}},
            doc! {"$set": {"shard": "shard0", "lastmod": ts(2, 0)}},
        )
        .await
        .unwrap();
    chunks
        .update_one(
            doc! {"min": {"x": Bson::MinKey}},
            doc! {"$set": {"lastmod": ts(2, 1)}},
        )
        .await
        .unwrap();
    let wanted = ShardVersion::from_bson(
        &Bson::Document(doc! {"e": epoch, "t": ts(100, 1), "v": ts(2, 1)}),
        &PRINTER,
    )
    .unwrap();
    let reply = doc! {"ok": 0, "code": 13388, "codeName": "StaleConfig", "errmsg": "stale",
    "ns": "app.c", "vReceived": {"e": epoch, "t": ts(100, 1), "v": ts(1, 1)},
    "vWanted": wanted.to_document(), "shardId": "shard1"};
    for stale in StaleError::from_reply(&reply, &PRINTER) {
        for a in stale.actions("app.c") {
            cache.apply(&a);
        }
    }
    let after = cache.routing_info("app.c").await.unwrap();
    let moved = after.collection.unwrap();
    assert_eq!(moved.snapshot.shard_for(&key(1)), Some("shard0"));
    assert_eq!(moved.version(), wanted);
    let stats = cache.stats();
    assert_eq!((stats.full, stats.incremental), (1, 1), "{stats:?}");

    // What went over the wire: reads of config.* only, all majority, and the incremental read
    // asked for the chunks since the cached version.
    let log = log.lock().unwrap().clone();
    let finds: Vec<&Document> = log
        .iter()
        .filter(|(n, _)| n == "find")
        .map(|(_, d)| d)
        .collect();
    assert!(finds.len() >= 6, "{log:?}");
    for f in &finds {
        assert_eq!(f.get_str("$db").unwrap(), "config");
        assert_eq!(
            f.get_document("readConcern")
                .unwrap()
                .get_str("level")
                .unwrap(),
            "majority",
            "{f}"
        );
    }
    let incremental = finds
        .iter()
        .filter(|f| f.get_str("find").unwrap() == "chunks")
        .nth(1)
        .expect("a second chunks read");
    assert_eq!(
        incremental.get_document("filter").unwrap(),
        &doc! {"uuid": UUID, "lastmod": {"$gte": ts(1, 1)}}
    );
    assert_eq!(
        incremental.get_document("sort").unwrap(),
        &doc! {"lastmod": 1}
    );
    for (name, body) in &log {
        assert!(
            matches!(
                name.as_str(),
                "find" | "getMore" | "killCursors" | "endSessions"
            ),
            "the loader sent {name}: {body}"
        );
    }
    cfg.shard.shutdown().await;
}

#[tokio::test]
async fn a_collection_sharded_again_elsewhere_is_reloaded_fully() {
    let cfg = ConfigServer::start().await;
    let epoch = ObjectId::new();
    populate(&cfg, epoch).await;
    let (src, _log) = source(&cfg).await;
    let cache = CatalogCache::with_policy(Arc::new(src), PRINTER, policy());
    cache.routing_info("app.c").await.unwrap();

    // Dropped and sharded again through another router: a new generation and one chunk.
    let (epoch2, uuid2) = (ObjectId::new(), Uuid::from_bytes([6; 16]));
    cfg.coll("chunks").delete_many(doc! {}).await.unwrap();
    cfg.coll("collections")
        .update_one(
            doc! {"_id": "app.c"},
            doc! {"$set": {"lastmodEpoch": epoch2, "timestamp": ts(200, 1), "uuid": uuid2, "key": {"y": 1}}},
        )
        .await
        .unwrap();
    cfg.insert(
        "chunks",
        vec![doc! {"_id": ObjectId::new(), "uuid": uuid2, "min": {"y": Bson::MinKey}, "max": {"y": Bson::MaxKey}, "shard": "shard1", "lastmod": ts(1, 0)}],
    )
    .await;
    cache.on_stale_collection("app.c", None);
    let info = cache.routing_info("app.c").await.unwrap();
    let c = info.collection.unwrap();
    assert_eq!(c.entry.generation.epoch, epoch2);
    assert_eq!(c.snapshot.chunks.len(), 1);
    assert_eq!(c.snapshot.pattern.fields()[0].path, "y");
    assert_eq!(cache.stats().full, 2);

    // A malformed chunk: the collection's commands fail naming the document, others work.
    cfg.coll("chunks")
        .update_one(doc! {"uuid": uuid2}, doc! {"$unset": {"shard": ""}})
        .await
        .unwrap();
    cache.flush_collection("app.c");
    let err = cache.routing_info("app.c").await.unwrap_err();
    assert_eq!(err.code, ErrorCode::NoSuchKey);
    assert!(
        err.message.contains(
            "in config.chunks of collection app.c :: caused by :: The field 'shard' is missing"
        ),
        "{}",
        err.message
    );
    assert!(cache.routing_info("app.other").await.is_ok());
    cfg.shard.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_config_server_is_host_unreachable() {
    // A port nothing listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let configdb = ConfigDb::parse(&format!("configRS/127.0.0.1:{port}")).unwrap();
    let mut options = ClientOptions::parse(configdb.uri()).await.unwrap();
    options.server_selection_timeout = Some(Duration::from_millis(300));
    let cache = CatalogCache::with_policy(
        Arc::new(ConfigServerSource::with_options(options).unwrap()),
        PRINTER,
        policy(),
    );
    let err = cache.routing_info("app.c").await.unwrap_err();
    assert_eq!(err.code, ErrorCode::HostUnreachable);
    assert!(
        err.message.starts_with(&format!(
            "unable to reach the config server configRS/127.0.0.1:{port}"
        )),
        "{}",
        err.message
    );
    // connect() builds the client without contacting anything.
    assert!(ConfigServerSource::connect(&configdb).await.is_ok());
}
