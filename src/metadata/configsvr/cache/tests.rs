use super::*;
use crate::metadata::configsvr::test_support::*;
use crate::metadata::configsvr::version::CollectionGeneration;
use crate::metadata::configsvr::RequestVersions;
use crate::routing::ChunkVersion;
use bson::{doc, oid::ObjectId, Bson, Timestamp, Uuid};
use std::collections::VecDeque;
use tokio::sync::RwLock;

/// A config server in memory: the four collections, a gate that holds reads, scripted failures
/// and a count of every read.
#[derive(Default)]
struct Memory {
    shards: Mutex<Vec<Document>>,
    databases: Mutex<Vec<Document>>,
    collections: Mutex<Vec<Document>>,
    chunks: Mutex<Vec<Document>>,
    gate: RwLock<()>,
    fail_next: Mutex<VecDeque<MetadataError>>,
    /// Chunk sets to answer instead of the stored ones, once each (inconsistent reads).
    chunks_next: Mutex<VecDeque<Vec<Document>>>,
    collection_reads: AtomicU64,
    incremental_reads: AtomicU64,
}

impl Memory {
    async fn pass(&self) -> Result<(), MetadataError> {
        drop(self.gate.read().await);
        match lock(&self.fail_next).pop_front() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl MetadataSource for Memory {
    fn shards(&self) -> BoxFuture<'_, Result<Vec<Document>, MetadataError>> {
        Box::pin(async move {
            self.pass().await?;
            Ok(lock(&self.shards).clone())
        })
    }

    fn database<'a>(
        &'a self,
        db: &'a str,
    ) -> BoxFuture<'a, Result<Option<Document>, MetadataError>> {
        Box::pin(async move {
            self.pass().await?;
            Ok(lock(&self.databases)
                .iter()
                .find(|d| d.get_str("_id").ok() == Some(db))
                .cloned())
        })
    }

    fn collection<'a>(
        &'a self,
        ns: &'a str,
        since: Option<Since>,
    ) -> BoxFuture<'a, Result<Option<CollectionRead>, MetadataError>> {
        Box::pin(async move {
            self.collection_reads.fetch_add(1, Ordering::SeqCst);
            self.pass().await?;
            let Some(coll) = lock(&self.collections)
                .iter()
                .find(|d| d.get_str("_id").ok() == Some(ns))
                .cloned()
            else {
                return Ok(None);
            };
            let same = since.filter(|s| {
                coll.get("lastmodEpoch") == Some(&Bson::ObjectId(s.generation.epoch))
                    && coll.get("timestamp") == Some(&Bson::Timestamp(s.generation.timestamp))
            });
            if same.is_some() {
                self.incremental_reads.fetch_add(1, Ordering::SeqCst);
            }
            if let Some(scripted) = lock(&self.chunks_next).pop_front() {
                return Ok(Some(CollectionRead {
                    collection: coll,
                    chunks: scripted,
                    incremental: same.is_some(),
                }));
            }
            let mut chunks: Vec<Document> = lock(&self.chunks)
                .iter()
                .filter(|c| c.get("uuid") == coll.get("uuid"))
                .filter(|c| {
                    same.is_none_or(|s| {
                        let t = c.get_timestamp("lastmod").unwrap();
                        ChunkVersion::from_timestamp(t) >= s.version
                    })
                })
                .cloned()
                .collect();
            chunks.sort_by_key(|c| {
                let t = c.get_timestamp("lastmod").unwrap();
                (t.time, t.increment)
            });
            Ok(Some(CollectionRead {
                collection: coll,
                chunks,
                incremental: same.is_some(),
            }))
        })
    }
}

const UUID: Uuid = Uuid::from_bytes([8; 16]);
const DB_UUID: Uuid = Uuid::from_bytes([2; 16]);

fn chunk(min: Bson, max: Bson, shard: &str, major: u32, minor: u32) -> Document {
    chunk_doc(UUID, doc! {"x": min}, doc! {"x": max}, shard, major, minor)
}

/// `app.c` sharded on `{x: 1}` over s0 and s1 (generation `epoch`), `app` primary on s0.
fn cluster(epoch: ObjectId) -> Arc<Memory> {
    let m = Memory::default();
    *lock(&m.shards) = vec![shard_doc("s0", "rs0/h0:1"), shard_doc("s1", "rs1/h1:1")];
    *lock(&m.databases) = vec![database_doc("app", "s0", DB_UUID, 1)];
    *lock(&m.collections) = vec![collection_doc(
        "app.c",
        epoch,
        ts(100, 1),
        UUID,
        doc! {"x": 1},
    )];
    *lock(&m.chunks) = vec![
        chunk(Bson::MinKey, Bson::Int64(0), "s0", 1, 0),
        chunk(Bson::Int64(0), Bson::MaxKey, "s1", 1, 1),
    ];
    Arc::new(m)
}

fn cache(m: &Arc<Memory>) -> CatalogCache {
    CatalogCache::with_policy(
        m.clone(),
        PRINTER,
        RefreshPolicy {
            attempts: 3,
            backoff: Duration::from_millis(1),
            rounds: 3,
        },
    )
}

/// Moves `[0, MaxKey)` to `to` as the config server commits a migration.
fn migrate(m: &Memory, to: &str, major: u32) {
    let mut chunks = lock(&m.chunks);
    chunks[1].insert("shard", to);
    chunks[1].insert(
        "lastmod",
        Timestamp {
            time: major,
            increment: 0,
        },
    );
    chunks[0].insert(
        "lastmod",
        Timestamp {
            time: major,
            increment: 1,
        },
    );
}

fn key(v: i64) -> crate::routing::ShardKey {
    crate::routing::ShardKey(vec![Bson::Int64(v)])
}

fn sv(epoch: ObjectId, major: u32, minor: u32) -> ShardVersion {
    ShardVersion {
        generation: CollectionGeneration {
            epoch,
            timestamp: ts(100, 1),
        },
        placement: ChunkVersion { major, minor },
    }
}

#[tokio::test]
async fn loads_on_first_use_and_then_serves_from_memory() {
    let e = ObjectId::new();
    let m = cluster(e);
    let c = cache(&m);
    let info = c.routing_info("app.c").await.unwrap();
    let coll = info.collection.clone().unwrap();
    assert_eq!(coll.snapshot.shard_for(&key(5)), Some("s1"));
    assert_eq!(info.db.primary(), Some("s0"));
    let again = c.routing_info("app.c").await.unwrap();
    assert!(Arc::ptr_eq(&coll, again.collection.as_ref().unwrap()));
    let s = c.stats();
    assert_eq!(
        (s.collection_reads, s.full, s.database_reads, s.shard_reads),
        (1, 1, 1, 1)
    );
    assert_eq!(c.cached_version("app.c"), Some(sv(e, 1, 1)));
    // Versions for each shard.
    assert_eq!(
        info.versions_for("s0").unwrap().shard_version,
        Some(sv(e, 1, 0))
    );
    assert_eq!(info.versions_for("s1").unwrap().database_version, None);
    let mut cmd = doc! {"insert": "c", "shardVersion": "client junk"};
    info.versions_for("s1").unwrap().apply_to(&mut cmd);
    assert_eq!(
        cmd.get_document("shardVersion").unwrap(),
        &sv(e, 1, 1).to_document()
    );
}

#[tokio::test]
async fn untracked_collections_go_to_the_primary_with_both_versions() {
    let m = cluster(ObjectId::new());
    let c = cache(&m);
    let info = c.routing_info("app.plain").await.unwrap();
    assert!(info.collection.is_none());
    assert_eq!(
        c.cached_version("app.plain"),
        Some(ShardVersion::unsharded())
    );
    let v = info.versions_for("s0").unwrap();
    assert_eq!(v.shard_version, Some(ShardVersion::unsharded()));
    let dbv = v.database_version.unwrap();
    assert_eq!((dbv.uuid, dbv.last_mod), (DB_UUID, 1));
    let mut cmd = doc! {"find": "plain"};
    v.apply_to(&mut cmd);
    assert_eq!(
        cmd,
        doc! {"find": "plain", "shardVersion": ShardVersion::unsharded().to_document(), "databaseVersion": dbv.to_document()}
    );
    let mut raw = bson::RawDocumentBuf::try_from(&doc! {"find": "plain"}).unwrap();
    v.append_to(&mut raw).unwrap();
    assert_eq!(Document::try_from(raw.as_ref()).unwrap(), cmd);
    assert_eq!(
        info.versions_for("s1").unwrap_err().code,
        ErrorCode::InternalError
    );

    // admin and config are fixed: never versioned, no config.databases read.
    let reads = c.stats().database_reads;
    let admin = c.routing_info("admin.system.users").await.unwrap();
    assert_eq!(
        admin.versions_for("config").unwrap(),
        RequestVersions::default()
    );
    assert_eq!(c.stats().database_reads, reads);

    let e = c.routing_info("nope.c").await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NamespaceNotFound);
    assert_eq!(e.message, "database nope not found");
    assert_eq!(
        c.routing_info("nodot").await.unwrap_err().code,
        ErrorCode::InvalidNamespace
    );
}

#[tokio::test]
async fn stale_errors_refresh_only_when_the_shard_is_ahead() {
    let e = ObjectId::new();
    let m = cluster(e);
    let c = cache(&m);
    c.routing_info("app.c").await.unwrap();
    migrate(&m, "s0", 2);
    // A wanted version the cache already has: no read.
    c.on_stale_collection("app.c", Some(sv(e, 1, 1)));
    let info = c.routing_info("app.c").await.unwrap();
    assert_eq!(
        info.collection.unwrap().snapshot.shard_for(&key(5)),
        Some("s1")
    );
    assert_eq!(c.stats().collection_reads, 1);
    // The donor wants 2|1: an incremental refresh follows the migration.
    c.on_stale_collection("app.c", Some(sv(e, 2, 1)));
    let info = c.routing_info("app.c").await.unwrap();
    assert_eq!(
        info.collection
            .as_ref()
            .unwrap()
            .snapshot
            .shard_for(&key(5)),
        Some("s0")
    );
    let s = c.stats();
    assert_eq!((s.collection_reads, s.incremental, s.full), (2, 1, 1));
    assert_eq!(m.incremental_reads.load(Ordering::SeqCst), 1);
    // No wanted version: forced, and nothing changed.
    c.on_stale_collection("app.c", None);
    let again = c.routing_info("app.c").await.unwrap();
    assert!(Arc::ptr_eq(
        info.collection.as_ref().unwrap(),
        again.collection.as_ref().unwrap()
    ));
    assert_eq!(c.stats().unchanged, 1);
    // A stale error about a namespace never loaded does nothing now; the first use loads it.
    c.on_stale_collection("app.other", None);
    assert_eq!(c.cached_version("app.other"), None);
}

#[tokio::test]
async fn a_new_generation_is_loaded_fully() {
    let e = ObjectId::new();
    let m = cluster(e);
    let c = cache(&m);
    c.routing_info("app.c").await.unwrap();
    // Dropped and recreated through another router: new epoch, timestamp, uuid and chunks.
    let e2 = ObjectId::new();
    let u2 = Uuid::from_bytes([9; 16]);
    *lock(&m.collections) = vec![collection_doc("app.c", e2, ts(200, 1), u2, doc! {"x": 1})];
    lock(&m.chunks).push(chunk_doc(
        u2,
        doc! {"x": Bson::MinKey},
        doc! {"x": Bson::MaxKey},
        "s1",
        1,
        0,
    ));
    let wanted = ShardVersion {
        generation: CollectionGeneration {
            epoch: e2,
            timestamp: ts(200, 1),
        },
        placement: ChunkVersion { major: 1, minor: 0 },
    };
    let stale = crate::metadata::configsvr::StaleError::from_reply(
        &doc! {"ok": 0, "code": 13388, "errmsg": "stale", "ns": "app.c", "vReceived": sv(e, 1, 1).to_document(), "vWanted": wanted.to_document(), "shardId": "s1"},
        &PRINTER,
    );
    for a in stale[0].actions("app.c") {
        c.apply(&a);
    }
    let info = c.routing_info("app.c").await.unwrap();
    let coll = info.collection.unwrap();
    assert_eq!(coll.entry.uuid, u2);
    assert_eq!(coll.snapshot.chunks.len(), 1);
    assert_eq!(c.cached_version("app.c"), Some(wanted));
    let s = c.stats();
    assert_eq!((s.full, s.incremental), (2, 0));
    // Then dropped: untracked.
    lock(&m.collections).clear();
    c.on_stale_collection("app.c", Some(ShardVersion::unsharded()));
    assert!(c.routing_info("app.c").await.unwrap().collection.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_wait_for_one_refresh() {
    let e = ObjectId::new();
    let m = cluster(e);
    let c = cache(&m);
    c.routing_info("app.c").await.unwrap();
    migrate(&m, "s0", 2);
    let hold = m.gate.write().await;
    c.on_stale_collection("app.c", Some(sv(e, 2, 1)));
    let mut waiters = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let c = c.clone();
        waiters.spawn(async move { c.routing_info("app.c").await });
    }
    // Let every waiter reach the slot while the read is held.
    while c.stats().joined < 199 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    drop(hold);
    let mut n = 0;
    while let Some(r) = waiters.join_next().await {
        let info = r.unwrap().unwrap();
        assert_eq!(
            info.collection.unwrap().snapshot.shard_for(&key(5)),
            Some("s0")
        );
        n += 1;
    }
    assert_eq!(n, 200);
    let s = c.stats();
    assert_eq!(
        s.collection_reads, 2,
        "one initial load and one refresh for 200 requests"
    );
    assert_eq!(s.joined, 199);
}

#[tokio::test]
async fn a_demand_during_a_refresh_is_met_before_publishing() {
    let e = ObjectId::new();
    let m = cluster(e);
    let c = cache(&m);
    c.routing_info("app.c").await.unwrap();
    let hold = m.gate.write().await;
    c.on_stale_collection("app.c", None);
    let first = {
        let c = c.clone();
        tokio::spawn(async move { c.routing_info("app.c").await })
    };
    while m.collection_reads.load(Ordering::SeqCst) < 2 {
        tokio::task::yield_now().await;
    }
    // The read is under way (it has not seen the catalog yet): a migration commits and its
    // stale error arrives.
    migrate(&m, "s0", 2);
    c.on_stale_collection("app.c", None);
    drop(hold);
    let info = first.await.unwrap().unwrap();
    // The first read already saw the migration (the gate held it before reading), the second
    // (for the later demand) found nothing new; the waiter got the routing after both.
    assert_eq!(
        info.collection.unwrap().snapshot.shard_for(&key(5)),
        Some("s0")
    );
    assert_eq!(m.collection_reads.load(Ordering::SeqCst), 3);
    assert_eq!(c.stats().unchanged, 1);
}

#[tokio::test]
async fn a_failed_refresh_keeps_the_old_routing() {
    let e = ObjectId::new();
    let m = cluster(e);
    let c = cache(&m);
    c.routing_info("app.c").await.unwrap();
    migrate(&m, "s0", 2);
    for _ in 0..3 {
        lock(&m.fail_next).push_back(MetadataError::new(
            ErrorCode::HostUnreachable,
            "config server down",
        ));
    }
    c.on_stale_collection("app.c", Some(sv(e, 2, 1)));
    let err = c.routing_info("app.c").await.unwrap_err();
    assert_eq!(err.code, ErrorCode::HostUnreachable);
    assert_eq!(
        c.cached_version("app.c"),
        Some(sv(e, 1, 1)),
        "old routing kept"
    );
    assert_eq!(c.stats().failed, 1);
    // The demand stays: the next request refreshes and succeeds.
    let info = c.routing_info("app.c").await.unwrap();
    assert_eq!(
        info.collection.unwrap().snapshot.shard_for(&key(5)),
        Some("s0")
    );
}

#[tokio::test]
async fn transient_and_inconsistent_reads_are_read_again() {
    let e = ObjectId::new();
    let m = cluster(e);
    let c = cache(&m);
    lock(&m.fail_next).push_back(MetadataError::new(
        ErrorCode::NotWritablePrimary,
        "stepped down",
    ));
    c.routing_info("app.c").await.unwrap();
    // The first read (of the database) failed and was read again.
    assert_eq!(
        (c.stats().database_reads, c.stats().collection_reads),
        (2, 1)
    );
    // An incremental read that leaves a gap: read again, fully.
    migrate(&m, "s0", 2);
    lock(&m.chunks_next).push_back(vec![chunk(Bson::Int64(7), Bson::MaxKey, "s0", 2, 0)]);
    c.on_stale_collection("app.c", Some(sv(e, 2, 1)));
    let info = c.routing_info("app.c").await.unwrap();
    assert_eq!(
        info.collection.unwrap().snapshot.shard_for(&key(5)),
        Some("s0")
    );
    let s = c.stats();
    assert_eq!((s.collection_reads, s.full, s.incremental), (3, 2, 0));
    // A malformed document is not transient: one read, then the error.
    lock(&m.chunks)[0].remove("shard");
    c.flush_collection("app.c");
    let err = c.routing_info("app.c").await.unwrap_err();
    assert_eq!(err.code, ErrorCode::NoSuchKey);
    assert!(
        err.message.contains("in config.chunks of collection app.c"),
        "{}",
        err.message
    );
    assert_eq!(c.stats().collection_reads, 4);
}

#[tokio::test]
async fn a_bad_document_fails_only_what_depends_on_it() {
    let e = ObjectId::new();
    let m = cluster(e);
    lock(&m.collections).push(doc! {"_id": "app.broken", "key": {"x": 1}});
    lock(&m.shards).push(doc! {"_id": "s9"});
    let c = cache(&m);
    let err = c.routing_info("app.broken").await.unwrap_err();
    assert_eq!(err.code, ErrorCode::IdlMissingField);
    assert!(
        err.message
            .contains("config.collections document _id: \"app.broken\""),
        "{}",
        err.message
    );
    assert!(c.routing_info("app.c").await.is_ok());
    assert!(c.routing_info("app.plain").await.is_ok());
    // The malformed shard is reported when something names it.
    let err = c.shard("s9").await.unwrap_err();
    assert_eq!(err.code, ErrorCode::NoSuchKey);
    assert!(c.shard("s1").await.is_ok());
}

#[tokio::test]
async fn unknown_shards_reload_the_shard_list_once() {
    let e = ObjectId::new();
    let m = cluster(e);
    let c = cache(&m);
    c.routing_info("app.c").await.unwrap();
    assert_eq!(c.stats().shard_reads, 1);
    // A shard added through another router receives the chunk.
    lock(&m.shards).push(shard_doc("s2", "rs2/h2:1"));
    migrate(&m, "s2", 2);
    c.on_stale_collection("app.c", None);
    let info = c.routing_info("app.c").await.unwrap();
    assert_eq!(
        info.collection.unwrap().snapshot.shard_for(&key(5)),
        Some("s2")
    );
    assert_eq!(c.stats().shard_reads, 2);
    assert_eq!(
        c.shard("s2").await.unwrap().seeds.set_name.as_deref(),
        Some("rs2")
    );
    // A shard that does not exist.
    migrate(&m, "s7", 3);
    c.on_stale_collection("app.c", None);
    let err = c.routing_info("app.c").await.unwrap_err();
    assert_eq!(err.code, ErrorCode::ShardNotFound);
    assert_eq!(
        err.message,
        "Collection app.c references shard which does not exist :: caused by :: Shard s7 not found"
    );
    // A database whose primary does not exist.
    lock(&m.databases).push(database_doc("lost", "s8", DB_UUID, 1));
    let err = c.routing_info("lost.c").await.unwrap_err();
    assert_eq!(err.code, ErrorCode::ShardNotFound);
    assert!(err
        .message
        .starts_with("The primary shard for database lost does not exist"));
}

#[tokio::test]
async fn database_versions_and_flushes() {
    let e = ObjectId::new();
    let m = cluster(e);
    let c = cache(&m);
    c.routing_info("app.plain").await.unwrap();
    // movePrimary: lastMod 2 on s1.
    *lock(&m.databases) = vec![database_doc("app", "s1", DB_UUID, 2)];
    let stale = crate::metadata::configsvr::StaleError::from_reply(
        &doc! {"ok": 0, "code": 249, "errmsg": "stale db", "db": "app",
        "vReceived": {"uuid": DB_UUID, "timestamp": ts(10, 1), "lastMod": 1},
        "vWanted": {"uuid": DB_UUID, "timestamp": ts(10, 1), "lastMod": 2}},
        &PRINTER,
    );
    c.apply(&stale[0].actions("app.plain")[0]);
    let info = c.routing_info("app.plain").await.unwrap();
    assert_eq!(info.db.primary(), Some("s1"));
    assert_eq!(
        info.versions_for("s1")
            .unwrap()
            .database_version
            .unwrap()
            .last_mod,
        2
    );
    let reads = c.stats().database_reads;
    // An older wanted version does nothing.
    c.on_stale_database("app", info.db.version());
    c.routing_info("app.plain").await.unwrap();
    assert_eq!(c.stats().database_reads, reads);

    // flushRouterConfig forms.
    let coll_reads = c.stats().collection_reads;
    c.flush_collection("app.plain");
    c.routing_info("app.plain").await.unwrap();
    assert_eq!(c.stats().collection_reads, coll_reads + 1);
    c.flush_database("app");
    c.routing_info("app.plain").await.unwrap();
    assert_eq!(c.stats().database_reads, reads + 1);
    assert_eq!(c.stats().collection_reads, coll_reads + 2);
    let shard_reads = c.stats().shard_reads;
    c.flush_all();
    c.routing_info("app.plain").await.unwrap();
    assert_eq!(c.stats().database_reads, reads + 2);
    assert_eq!(c.stats().shard_reads, shard_reads + 1);
    // dropDatabase: the database is gone, its collections are forgotten.
    lock(&m.databases).clear();
    c.on_stale_database("app", None);
    assert_eq!(
        c.routing_info("app.plain").await.unwrap_err().code,
        ErrorCode::NamespaceNotFound
    );
    assert_eq!(c.cached_version("app.plain"), None);
}

#[tokio::test]
async fn a_cancelled_request_does_not_strand_the_others() {
    let e = ObjectId::new();
    let m = cluster(e);
    let c = cache(&m);
    let hold = m.gate.write().await;
    let first = tokio::time::timeout(Duration::from_millis(20), c.routing_info("app.plain")).await;
    assert!(first.is_err(), "held by the gate");
    let second = {
        let c = c.clone();
        tokio::spawn(async move { c.routing_info("app.plain").await })
    };
    drop(hold);
    assert!(second.await.unwrap().is_ok());
}
