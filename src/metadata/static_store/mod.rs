//! The static metadata store: the cluster's metadata held by the router itself, filled from
//! `--config` or by `sluice demo` and changed by the router's own sharding administration. It
//! keeps the documents MongoDB 5.0+ keeps in its config database (`config.version`,
//! `config.shards`, `config.databases`, `config.collections`, `config.chunks`, `config.mongos`)
//! and answers clients' reads of the `config` database (mongosh's `sh.status()`,
//! `db.getSiblingDB("config").chunks.find()`) with the document engine's query code
//! ([`reads`]), as any collection is queried.
//!
//! With a `metadata_path`, every change is persisted atomically (temporary file, fsync,
//! rename, fsync of the directory) as one BSON document, so a restarted router routes exactly
//! as before.
//!
//! It is one [`MetadataSource`]; the config server is the other.

mod reads;

pub use reads::CONFIG_READS;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

use bson::{doc, oid::ObjectId, Bson, Document, Timestamp};

use super::error::MetadataError;
use super::source::{BoxFuture, CollectionRead, MetadataSource, Since};
use crate::command::cursors::DocumentCursors;
use crate::routing::chunks::{Chunk, ChunkMap, ChunkVersion};
use crate::routing::{RoutingError, RoutingSnapshot, ShardInfo, ShardKeyPattern};
use crate::value::error_codes::ErrorCode;

/// The config collections persisted and served.
const COLLECTIONS: &[&str] = &["version", "shards", "databases", "collections", "chunks"];

/// One collection of the config database.
#[derive(Debug)]
struct ConfigCollection {
    /// Its UUID (`listCollections`' `info.uuid`).
    uuid: bson::Uuid,
    /// Its documents, in insertion order.
    docs: Vec<Document>,
}

/// The config database: collection name → collection (present once written, even if empty).
type ConfigDatabase = BTreeMap<String, ConfigCollection>;

/// The static metadata store.
pub struct StaticStore {
    path: Option<PathBuf>,
    /// The documents; readers share it, every change replaces whole collections.
    config: RwLock<ConfigDatabase>,
    /// The shards that understand `shardVersion`.
    shard_servers: Mutex<BTreeSet<String>>,
    /// Each shard's address as configured (a seed list for a replica set), which the
    /// `config.shards` host form does not always tell apart from a single server.
    shard_addrs: Mutex<std::collections::BTreeMap<String, String>>,
    /// Serialises read-modify-write changes (and their persisting).
    write: Mutex<()>,
    /// Cursors of clients' reads of the config database.
    cursors: DocumentCursors,
    /// A `--configdb` router's mirror of what its catalog cache read: databases are never
    /// created here (the config server creates them).
    mirror: bool,
}

impl std::fmt::Debug for StaticStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticStore")
            .field("path", &self.path)
            .finish()
    }
}

fn internal(e: impl std::fmt::Display) -> RoutingError {
    RoutingError::new(ErrorCode::InternalError, e.to_string())
}

impl StaticStore {
    /// A store, loaded from `path` when that file exists.
    pub fn open(path: Option<PathBuf>) -> Result<StaticStore, RoutingError> {
        let store = StaticStore {
            path,
            config: RwLock::new(BTreeMap::new()),
            shard_servers: Mutex::new(BTreeSet::new()),
            shard_addrs: Mutex::new(Default::default()),
            write: Mutex::new(()),
            cursors: DocumentCursors::default(),
            mirror: false,
        };
        let loaded = match &store.path {
            Some(p) if p.exists() => {
                store.load(p)?;
                true
            }
            _ => false,
        };
        if !loaded {
            store.put(
                "version",
                vec![doc! {"_id": 1, "clusterId": ObjectId::new()}],
            )?;
        }
        Ok(store)
    }

    /// The mirror a `--configdb` router keeps of the database entries and shards its catalog
    /// cache read (in memory only; [`StaticStore::ensure_database`] refuses to create one).
    pub fn mirror() -> StaticStore {
        StaticStore {
            path: None,
            config: RwLock::new(BTreeMap::new()),
            shard_servers: Mutex::new(BTreeSet::new()),
            shard_addrs: Mutex::new(Default::default()),
            write: Mutex::new(()),
            cursors: DocumentCursors::default(),
            mirror: true,
        }
    }

    /// Replaces (or, with `None`, removes) the mirrored `config.databases` entry of `db`.
    pub fn mirror_database(&self, db: &str, entry: Option<Document>) {
        let _w = crate::sync::lock(&self.write);
        let mut all = self.docs("databases");
        let at = all.iter().position(|d| d.get_str("_id").ok() == Some(db));
        match (at, entry) {
            (Some(i), Some(e)) if all[i] == e => return,
            (Some(i), Some(e)) => all[i] = e,
            (None, Some(e)) => all.push(e),
            (Some(i), None) => {
                all.remove(i);
            }
            (None, None) => return,
        }
        let _ = self.put("databases", all);
    }

    /// Whether this is a `--configdb` router's mirror.
    pub fn is_mirror(&self) -> bool {
        self.mirror
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, ConfigDatabase> {
        self.config.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Every document of `config.<coll>`, in insertion order.
    pub fn documents(&self, coll: &str) -> Vec<Document> {
        self.read()
            .get(coll)
            .map(|c| c.docs.clone())
            .unwrap_or_default()
    }

    fn docs(&self, coll: &str) -> Vec<Document> {
        self.documents(coll)
    }

    /// The first document of `config.<coll>` whose `_id` is `id`.
    fn by_id(&self, coll: &str, id: &str) -> Option<Document> {
        self.read()
            .get(coll)?
            .docs
            .iter()
            .find(|d| d.get_str("_id").ok() == Some(id))
            .cloned()
    }

    /// Replaces the documents of `config.<coll>` (creating the collection).
    fn put(&self, coll: &str, docs: Vec<Document>) -> Result<(), RoutingError> {
        let mut config = self.config.write().unwrap_or_else(|p| p.into_inner());
        config
            .entry(coll.to_string())
            .or_insert_with(|| ConfigCollection {
                uuid: bson::Uuid::new(),
                docs: Vec::new(),
            })
            .docs = docs;
        Ok(())
    }

    fn load(&self, path: &Path) -> Result<(), RoutingError> {
        let bytes = std::fs::read(path)
            .map_err(|e| internal(format!("cannot read metadata file {}: {e}", path.display())))?;
        let root = Document::from_reader(&bytes[..]).map_err(|e| {
            internal(format!(
                "metadata file {} is not valid BSON: {e}",
                path.display()
            ))
        })?;
        for coll in COLLECTIONS {
            let docs = root
                .get_document("config")
                .ok()
                .and_then(|c| c.get_array(*coll).ok())
                .map(|a| a.iter().filter_map(|v| v.as_document().cloned()).collect())
                .unwrap_or_default();
            self.put(coll, docs)?;
        }
        let servers: BTreeSet<String> = root
            .get_array("shardServers")
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(|s| s.to_string()))
                    .collect()
            })
            .unwrap_or_default();
        *crate::sync::lock(&self.shard_servers) = servers;
        Ok(())
    }

    /// Writes the metadata atomically, if the store has a path.
    pub fn persist(&self) -> Result<(), RoutingError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let mut config = Document::new();
        for coll in COLLECTIONS {
            config.insert(
                *coll,
                self.docs(coll)
                    .into_iter()
                    .map(Bson::Document)
                    .collect::<Vec<_>>(),
            );
        }
        let servers: Vec<Bson> = crate::sync::lock(&self.shard_servers)
            .iter()
            .map(|x| Bson::String(x.clone()))
            .collect();
        let root = doc! {"format": 1, "config": config, "shardServers": servers};
        let bytes = root.to_vec().map_err(internal)?;
        write_atomically(path, &bytes).map_err(|e| {
            internal(format!(
                "cannot persist metadata to {}: {e}",
                path.display()
            ))
        })
    }

    /// The shards, sorted by id.
    pub fn shards(&self) -> Vec<ShardInfo> {
        let servers = crate::sync::lock(&self.shard_servers).clone();
        let addrs = crate::sync::lock(&self.shard_addrs).clone();
        let mut out: Vec<ShardInfo> = self
            .docs("shards")
            .iter()
            .filter_map(|d| {
                let id = d.get_str("_id").ok()?.to_string();
                let host = d.get_str("host").ok()?;
                let addr = match addrs.get(&id) {
                    Some(a) => a.clone(),
                    None => addr_of_host(&id, host),
                };
                Some(ShardInfo {
                    shard_server: servers.contains(&id),
                    id,
                    addr,
                })
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Registers the cluster's shards. With persisted metadata, the list must match it
    /// exactly: a router must not route persisted chunks to different servers.
    pub fn set_shards(&self, shards: &[ShardInfo]) -> Result<(), RoutingError> {
        let _w = crate::sync::lock(&self.write);
        let existing = self.shards();
        // A mirror's shard list follows the config server's (shards are added there).
        if !existing.is_empty() && !self.is_mirror() {
            let hosts = self.docs("shards");
            let same = existing.len() == shards.len()
                && existing.iter().all(|e| {
                    shards.iter().any(|s| {
                        s.id == e.id
                            && hosts.iter().any(|d| {
                                d.get_str("_id").ok() == Some(s.id.as_str())
                                    && d.get_str("host").ok()
                                        == Some(host_of(&s.id, &s.addr).as_str())
                            })
                    })
                });
            if !same {
                let show = |l: &[ShardInfo]| {
                    l.iter()
                        .map(|s| format!("{}={}", s.id, s.addr))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                return Err(RoutingError::new(
                    ErrorCode::InvalidOptions,
                    format!(
                        "the configured shards [{}] contradict the persisted metadata [{}]; restore the previous shard list or remove the metadata file",
                        show(shards),
                        show(&existing)
                    ),
                ));
            }
        } else {
            let now = Timestamp {
                time: now_secs(),
                increment: 1,
            };
            let docs = shards
                .iter()
                .map(|s| doc! {"_id": &s.id, "host": host_of(&s.id, &s.addr), "state": 1, "topologyTime": now})
                .collect();
            self.put("shards", docs)?;
        }
        *crate::sync::lock(&self.shard_addrs) = shards
            .iter()
            .map(|s| (s.id.clone(), s.addr.clone()))
            .collect();
        *crate::sync::lock(&self.shard_servers) = shards
            .iter()
            .filter(|s| s.shard_server)
            .map(|s| s.id.clone())
            .collect();
        self.persist()
    }

    /// `config.databases` entry of `db`.
    pub fn database(&self, db: &str) -> Option<Document> {
        self.by_id("databases", db)
    }

    /// The database's entry, created with `primary` (or the first shard) when missing.
    pub fn ensure_database(
        &self,
        db: &str,
        primary: Option<&str>,
    ) -> Result<Document, RoutingError> {
        let _w = crate::sync::lock(&self.write);
        if let Some(d) = self.database(db) {
            return Ok(d);
        }
        if self.mirror {
            return Err(RoutingError::new(
                ErrorCode::NamespaceNotFound,
                format!("database {db} not found"),
            ));
        }
        crate::limits::check_database_name(db)
            .map_err(|m| RoutingError::new(ErrorCode::InvalidNamespace, m))?;
        // Two databases whose names differ only in case cannot coexist (the reserved ones
        // included): mongod's DatabaseDifferCase.
        let existing = self
            .docs("databases")
            .into_iter()
            .filter_map(|d| d.get_str("_id").ok().map(str::to_string))
            .chain(["admin", "config", "local"].map(String::from));
        for name in existing {
            if name.eq_ignore_ascii_case(db) && name != db {
                return Err(RoutingError::new(
                    ErrorCode::DatabaseDifferCase,
                    format!("db already exists with different case already have: [{name}] trying to create [{db}]"),
                ));
            }
        }
        let primary = match primary {
            Some(p) => {
                if !self.shards().iter().any(|s| s.id == p) {
                    return Err(RoutingError::new(
                        ErrorCode::ShardNotFound,
                        format!("Shard {p} not found"),
                    ));
                }
                p.to_string()
            }
            None => self.shards().first().map(|s| s.id.clone()).ok_or_else(|| {
                RoutingError::new(ErrorCode::ShardNotFound, "the cluster has no shards")
            })?,
        };
        let entry = doc! {
            "_id": db,
            "primary": primary,
            "version": {"uuid": bson::Uuid::new(), "timestamp": Timestamp { time: now_secs(), increment: 1 }, "lastMod": 1},
        };
        let mut all = self.docs("databases");
        all.push(entry.clone());
        self.put("databases", all)?;
        self.persist()?;
        Ok(entry)
    }

    /// `config.collections` entry of `ns`.
    pub fn collection(&self, ns: &str) -> Option<Document> {
        self.by_id("collections", ns)
    }

    /// Records a newly sharded collection and its chunks.
    pub fn add_sharded_collection(
        &self,
        ns: &str,
        pattern: &ShardKeyPattern,
        unique: bool,
        chunks: &[Chunk],
    ) -> Result<RoutingSnapshot, RoutingError> {
        let _w = crate::sync::lock(&self.write);
        if self.collection(ns).is_some() {
            return Err(RoutingError::new(
                ErrorCode(23),
                format!("sharding already enabled for collection {ns}"),
            ));
        }
        let epoch = ObjectId::new();
        let timestamp = Timestamp {
            time: now_secs(),
            increment: 1,
        };
        let uuid = bson::Uuid::new();
        let entry = doc! {
            "_id": ns,
            "lastmodEpoch": epoch,
            "lastmod": bson::DateTime::now(),
            "timestamp": timestamp,
            "uuid": uuid,
            "key": pattern.to_document(),
            "unique": unique,
            "noBalance": false,
        };
        let mut colls = self.docs("collections");
        colls.push(entry);
        let mut all_chunks = self.docs("chunks");
        for c in chunks {
            all_chunks.push(c.config_document(uuid, pattern, timestamp));
        }
        self.put("collections", colls)?;
        self.put("chunks", all_chunks)?;
        self.persist()?;
        self.load_collection(ns)?
            .ok_or_else(|| internal(format!("{ns} vanished while being sharded")))
    }

    /// Forgets a sharded collection (after it was dropped on every shard).
    pub fn drop_collection(&self, ns: &str) -> Result<(), RoutingError> {
        let _w = crate::sync::lock(&self.write);
        let Some(entry) = self.collection(ns) else {
            return Ok(());
        };
        let uuid = entry.get("uuid").cloned();
        let colls: Vec<Document> = self
            .docs("collections")
            .into_iter()
            .filter(|d| d.get_str("_id").ok() != Some(ns))
            .collect();
        let chunks: Vec<Document> = self
            .docs("chunks")
            .into_iter()
            .filter(|d| d.get("uuid") != uuid.as_ref())
            .collect();
        self.put("collections", colls)?;
        self.put("chunks", chunks)?;
        self.persist()
    }

    /// Renames a sharded collection's `config.collections` entry (its chunks follow by UUID),
    /// after every shard renamed it.
    pub fn rename_collection(&self, from: &str, to: &str) -> Result<(), RoutingError> {
        let _w = crate::sync::lock(&self.write);
        let colls: Vec<Document> = self
            .docs("collections")
            .into_iter()
            .map(|mut d| {
                if d.get_str("_id").ok() == Some(from) {
                    d.insert("_id", to);
                    d.insert("lastmod", bson::DateTime::now());
                }
                d
            })
            .collect();
        self.put("collections", colls)?;
        self.persist()
    }

    /// Forgets a database and its sharded collections (after `dropDatabase`); returns the
    /// namespaces that were sharded.
    pub fn drop_database(&self, db: &str) -> Result<Vec<String>, RoutingError> {
        let prefix = format!("{db}.");
        let sharded: Vec<String> = self
            .docs("collections")
            .into_iter()
            .filter_map(|d| d.get_str("_id").ok().map(|s| s.to_string()))
            .filter(|ns| ns.starts_with(&prefix))
            .collect();
        for ns in &sharded {
            self.drop_collection(ns)?;
        }
        let _w = crate::sync::lock(&self.write);
        let dbs: Vec<Document> = self
            .docs("databases")
            .into_iter()
            .filter(|d| d.get_str("_id").ok() != Some(db))
            .collect();
        self.put("databases", dbs)?;
        self.persist()?;
        Ok(sharded)
    }

    /// Refreshes `config.mongos` with this router's entry (read by `sh.status()`).
    pub fn touch_mongos(&self, name: &str, up_secs: i64) {
        let d = doc! {
            "_id": name,
            "advisoryHostFQDNs": [],
            "mongoVersion": crate::command::server_info::MONGODB_VERSION,
            "ping": bson::DateTime::now(),
            "up": up_secs,
            "waiting": true,
        };
        let _ = self.put("mongos", vec![d]);
    }
}

impl StaticStore {
    /// The routing state of `ns`, or `None` if it is not sharded (what the routing table
    /// loads).
    pub fn load_collection(&self, ns: &str) -> Result<Option<RoutingSnapshot>, RoutingError> {
        let Some(c) = self.collection(ns) else {
            return Ok(None);
        };
        let bad = |what: &str| {
            internal(format!(
                "config.collections entry of {ns} has no valid {what}"
            ))
        };
        let key = c.get_document("key").map_err(|_| bad("key"))?;
        let pattern = ShardKeyPattern::parse(key)?;
        let epoch = c
            .get_object_id("lastmodEpoch")
            .map_err(|_| bad("lastmodEpoch"))?;
        let timestamp = c.get_timestamp("timestamp").map_err(|_| bad("timestamp"))?;
        let uuid = match c.get("uuid") {
            Some(Bson::Binary(b)) => {
                bson::Uuid::from_bytes(b.bytes.as_slice().try_into().map_err(|_| bad("uuid"))?)
            }
            _ => return Err(bad("uuid")),
        };
        let unique = c.get_bool("unique").unwrap_or(false);
        let mut chunks = Vec::new();
        for d in self.docs("chunks") {
            let same = match d.get("uuid") {
                Some(Bson::Binary(b)) => b.bytes.as_slice() == uuid.bytes().as_slice(),
                _ => false,
            };
            if !same {
                continue;
            }
            chunks.push(Chunk {
                id: d.get_object_id("_id").unwrap_or_else(|_| ObjectId::new()),
                min: pattern
                    .key_from_document(d.get_document("min").map_err(|_| bad("chunk min"))?)?,
                max: pattern
                    .key_from_document(d.get_document("max").map_err(|_| bad("chunk max"))?)?,
                shard: d
                    .get_str("shard")
                    .map_err(|_| bad("chunk shard"))?
                    .to_string(),
                version: ChunkVersion::from_timestamp(
                    d.get_timestamp("lastmod")
                        .map_err(|_| bad("chunk lastmod"))?,
                ),
            });
        }
        let chunks = ChunkMap::new(&pattern, chunks)?;
        Ok(Some(RoutingSnapshot {
            ns: ns.to_string(),
            pattern,
            unique,
            epoch,
            timestamp,
            uuid,
            chunks,
        }))
    }
}

impl MetadataSource for StaticStore {
    fn shards(&self) -> BoxFuture<'_, Result<Vec<Document>, MetadataError>> {
        Box::pin(async move { Ok(self.documents("shards")) })
    }

    fn database<'a>(
        &'a self,
        db: &'a str,
    ) -> BoxFuture<'a, Result<Option<Document>, MetadataError>> {
        Box::pin(async move { Ok(StaticStore::database(self, db)) })
    }

    /// Always every chunk (`incremental: false`): the store holds them all in memory.
    fn collection<'a>(
        &'a self,
        ns: &'a str,
        _since: Option<Since>,
    ) -> BoxFuture<'a, Result<Option<CollectionRead>, MetadataError>> {
        Box::pin(async move {
            let Some(collection) = StaticStore::collection(self, ns) else {
                return Ok(None);
            };
            let uuid = collection.get("uuid").cloned();
            let mut chunks: Vec<Document> = self
                .documents("chunks")
                .into_iter()
                .filter(|d| d.get("uuid") == uuid.as_ref())
                .collect();
            chunks.sort_by_key(|d| {
                d.get_timestamp("lastmod")
                    .map(|t| (t.time, t.increment))
                    .unwrap_or_default()
            });
            Ok(Some(CollectionRead {
                collection,
                chunks,
                incremental: false,
            }))
        })
    }
}

fn now_secs() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or(0)
}

/// Writes `bytes` to `path` so that a crash leaves either the old or the new file: a
/// temporary file beside it, fsync, rename over, fsync of the directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// The `config.shards` host of shard `id` at `addr`: a replica set's seed list as it is
/// (`rs0/h1:p,h2:p`), a single server as `<id>/<host:port>` (the form mongos shows).
fn host_of(id: &str, addr: &str) -> String {
    if addr.contains('/') {
        addr.to_string()
    } else {
        format!("{id}/{addr}")
    }
}

/// The address a `config.shards` host stands for, when the configuration does not say: the
/// single server of `<id>/<host:port>`, or the seed list itself.
fn addr_of_host(id: &str, host: &str) -> String {
    match host.split_once('/') {
        Some((set, rest)) if set == id && !rest.contains(',') => rest.to_string(),
        Some(_) => host.to_string(),
        None => host.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::chunks::initial_chunks;

    fn shards() -> Vec<ShardInfo> {
        (0..3)
            .map(|i| ShardInfo {
                id: format!("shard{i}"),
                addr: format!("127.0.0.1:{}", 40000 + i),
                shard_server: true,
            })
            .collect()
    }

    #[test]
    fn persists_and_reloads_the_same_routing() {
        let dir = std::env::temp_dir().join(format!("sluice-meta-{}", ObjectId::new()));
        let path = dir.join("metadata.bson");
        let store = StaticStore::open(Some(path.clone())).unwrap();
        store.set_shards(&shards()).unwrap();
        store.ensure_database("demo", None).unwrap();
        let pattern = ShardKeyPattern::parse(&doc! {"_id": "hashed"}).unwrap();
        let ids: Vec<String> = shards().into_iter().map(|s| s.id).collect();
        let chunks = initial_chunks(&pattern, &ids, "shard0", None);
        let snap = store
            .add_sharded_collection("demo.c", &pattern, false, &chunks)
            .unwrap();
        assert_eq!(snap.chunks.len(), 6);
        assert!(store
            .add_sharded_collection("demo.c", &pattern, false, &chunks)
            .is_err());

        let again = StaticStore::open(Some(path.clone())).unwrap();
        assert_eq!(again.shards(), shards());
        let reloaded = again.load_collection("demo.c").unwrap().unwrap();
        assert_eq!(reloaded, snap);
        assert_eq!(
            again.database("demo").unwrap().get_str("primary").unwrap(),
            "shard0"
        );
        // A different shard list is refused.
        let mut moved = shards();
        moved[1].addr = "127.0.0.1:1".into();
        let e = again.set_shards(&moved).unwrap_err();
        assert!(e.message.contains("contradict"), "{}", e.message);
        assert!(again.set_shards(&shards()).is_ok());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn unsharded_collections_have_no_snapshot() {
        let store = StaticStore::open(None).unwrap();
        assert_eq!(store.load_collection("a.b").unwrap(), None);
        assert!(store.ensure_database("x", None).is_err(), "no shards yet");
    }
}
