//! Cluster DDL on an embedded shard server (`sluice shard --configdb …`), as a MongoDB shard
//! takes part in it (docs/design/config-server.md, §13):
//!
//! - the database's primary shard coordinates `_shardsvrCreateCollection` (shardCollection),
//!   `_shardsvrDropCollection`, `_shardsvrRenameCollection` and `_shardsvrDropDatabase`, which
//!   mongos 8.0 sends it with the
//!   database's version: it creates or drops the collection on the shards (through their
//!   ordinary `create` / `createIndexes` / `drop` / `dropDatabase`), records the change on the
//!   config server, and has every shard reload its metadata
//!   (`_flushRoutingTableCacheUpdates` / `_flushDatabaseCacheUpdates`);
//! - the shard that owns a chunk runs `splitChunk` and `mergeChunks`, committing them on the
//!   config server (`_configsvrCommitChunkSplit`, `_configsvrCommitChunksMerge`) and reloading.
//!
//! A drop or rename of a sharded collection holds the collection's critical section on every
//! shard (`_shardsvrParticipantBlock`, as MongoDB's coordinators send it) from before the
//! change until every shard has forgotten its routing after the commit: a write racing it
//! waits, then meets the new metadata and is answered StaleConfig. A `dropDatabase` holds the
//! database's critical section on every shard the same way.
//!
//! The drop, rename and `dropDatabase` coordinators record each phase before acting on it
//! ([`super::ddl_coordinator`]); a member that becomes primary resumes the ones left
//! unfinished ([`resume`]), and a request for a DDL already recorded joins it.
//!
//! Where it is simpler than MongoDB's coordinators: the `config.*` changes are one embedded
//! command (`_sluiceCommit*`) instead of a transaction on the config server, and the
//! coordinators of `shardCollection` and `movePrimary` are not recorded.

use bson::{doc, oid::ObjectId, Bson, Document};

use crate::command::CommandRequest;
use crate::engine::EngineError;
use crate::routing::chunks::initial_chunks;
use crate::routing::ShardKeyPattern;
use crate::sync::lock;
use crate::value::error_codes::ErrorCode;
use crate::value::field::{number_field, number_value, truthy};

use super::configsvr::object_field;
use super::ddl_coordinator::{
    self, coordinator_id, Begun, Coordinator, DROP_COLLECTION, DROP_DATABASE, RENAME_COLLECTION,
    SET_RESPONSE,
};
use super::filtering::engine_error;
use super::migration::{now_secs, Donor};

/// The commands of this module.
pub const COMMANDS: &[&str] = &[
    "_shardsvrCreateCollection",
    "_shardsvrDropCollection",
    "_shardsvrDropDatabase",
    "_shardsvrRenameCollection",
    "_shardsvrMovePrimary",
    "_shardsvrParticipantBlock",
    "splitChunk",
    "mergeChunks",
];

/// Runs one of [`COMMANDS`] on the shard server `shard`.
pub async fn run(
    shard: Donor,
    req: &CommandRequest,
    body: Document,
) -> Result<Document, EngineError> {
    let name = req.name.as_str();
    let admin_only = matches!(name, "splitChunk" | "mergeChunks" | "_shardsvrMovePrimary");
    if admin_only != (req.db == "admin") {
        return Err(EngineError::new(
            if admin_only {
                ErrorCode::Unauthorized
            } else {
                ErrorCode::InvalidNamespace
            },
            if admin_only {
                format!("{name} may only be run against the admin database.")
            } else {
                format!("{name} is run against the database it changes, not admin")
            },
        ));
    }
    if let Some(v) = body.get("databaseVersion") {
        // `_shardsvrMovePrimary` runs on `admin` and names the database it moves.
        let db = match body.get(name) {
            Some(Bson::String(db)) if name == "_shardsvrMovePrimary" => db.as_str(),
            _ => req.db.as_str(),
        };
        shard
            .filtering
            .check(&shard.name, db, &doc! {"databaseVersion": v.clone()})
            .await?;
    }
    match name {
        "_shardsvrCreateCollection" => create_collection(&shard, &req.db, &body).await,
        "_shardsvrDropCollection" => drop_collection(&shard, &req.db, &body).await,
        "_shardsvrDropDatabase" => drop_database(&shard, &req.db).await,
        "_shardsvrRenameCollection" => rename_collection(&shard, &req.db, &body).await,
        "_shardsvrMovePrimary" => move_primary(&shard, &body).await,
        "_shardsvrParticipantBlock" => participant_block(&shard, &req.db, &body).await,
        "splitChunk" => split_chunk(&shard, &body).await,
        _ => merge_chunks(&shard, &body).await,
    }
}

fn string<'a>(body: &'a Document, command: &str, field: &str) -> Result<&'a str, EngineError> {
    super::configsvr::string_field(body, command, field)
}

/// Every shard of the cluster as `(id, host to connect to)`, sorted by id.
async fn shards(d: &Donor) -> Result<Vec<(String, String)>, EngineError> {
    Ok(shard_entries(d)
        .await?
        .into_iter()
        .map(|(id, host, _)| (id, host))
        .collect())
}

/// Every shard as `(id, host to connect to, draining)`, sorted by id.
async fn shard_entries(d: &Donor) -> Result<Vec<(String, String, bool)>, EngineError> {
    let registry = d
        .filtering
        .cache()
        .await?
        .shards()
        .await
        .map_err(engine_error)?;
    let mut out: Vec<(String, String, bool)> = registry
        .shards()
        .map(|s| (s.id.clone(), s.host.clone(), s.draining))
        .collect();
    out.sort();
    Ok(out)
}

/// Fails with the shard's error unless the reply is `ok` (or one of the codes `accept`).
fn checked(reply: Result<Document, EngineError>, accept: &[ErrorCode]) -> Result<(), EngineError> {
    match reply {
        Ok(_) => Ok(()),
        Err(e) if accept.contains(&e.code) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Has every shard (this one included) reload what it caches of `ns` (a collection) or of a
/// database; a shard that cannot be told reloads on the next stale request instead.
async fn flush_everywhere(d: &Donor, all: &[(String, String)], command: &str, target: &str) {
    if command == "_flushDatabaseCacheUpdates" {
        d.filtering.flush_database(target);
    } else {
        d.filtering.flush_collection(target);
    }
    for (id, host) in all {
        if *id == d.name {
            continue;
        }
        if let Err(e) = d.migrations.run_on(host, doc! {command: target}).await {
            tracing::warn!(shard = %id, target, error = %e.message,
                "a shard could not be told to reload its metadata");
        }
    }
}

/// The block types of `_shardsvrParticipantBlock` (MongoDB's `CriticalSectionBlockType`):
/// reads and writes wait, or the critical section ends.
const BLOCK_READS_AND_WRITES: &str = "ReadsAndWrites";
const UNBLOCK: &str = "Unblock";

/// `_shardsvrParticipantBlock: <coll>` on the database, `blockType: "ReadsAndWrites" |
/// "Unblock"`, `reason`, `clearFilteringMetadata` (what a MongoDB DDL coordinator sends every
/// shard around a drop or rename of a sharded collection): enters or leaves the collection's
/// critical section on this shard, as a migration's donor does (every request carrying a
/// version for it waits; the running ones finish first). With `clearFilteringMetadata` the
/// shard forgets its routing of the collection before leaving, so the requests that waited
/// are checked against the committed change and answered StaleConfig.
///
/// An embedded extension: `_shardsvrParticipantBlock: 1` (no collection) blocks the whole
/// database, as the embedded `dropDatabase` coordinator asks every shard to.
async fn participant_block(d: &Donor, db: &str, body: &Document) -> Result<Document, EngineError> {
    const CMD: &str = "_shardsvrParticipantBlock";
    let ns = if body.get(CMD).and_then(number_value) == Some(1) {
        crate::limits::check_database_name(db)
            .map_err(|message| EngineError::new(ErrorCode::InvalidNamespace, message))?;
        db.to_string()
    } else {
        let coll = string(body, CMD, CMD)?;
        super::store::check_namespace(db, coll)?;
        format!("{db}.{coll}")
    };
    let block = match body.get("blockType") {
        None => true,
        Some(Bson::String(t)) if t == BLOCK_READS_AND_WRITES => true,
        Some(Bson::String(t)) if t == UNBLOCK => false,
        Some(Bson::String(t)) => {
            return Err(EngineError::new(
                ErrorCode::BadValue,
                format!(
                    "Enumeration value '{t}' for field '{CMD}.blockType' is not a valid value."
                ),
            ))
        }
        Some(other) => {
            return Err(EngineError::new(
                ErrorCode::TypeMismatch,
                format!(
                    "BSON field '{CMD}.blockType' is the wrong type '{}', expected type 'string'",
                    crate::value::field::type_name(other)
                ),
            ))
        }
    };
    let reason = match body.get("reason") {
        None => Document::new(),
        Some(_) => object_field(body, CMD, "reason")?.clone(),
    };
    let clear = body.get("clearFilteringMetadata").is_some_and(truthy);
    participate(d, &ns, block, &reason, clear).await?;
    Ok(Document::new())
}

/// This shard's part of a DDL critical section on `ns` (a collection, or a database by its
/// name): enters it (`block`), or forgets its routing of `ns` when `clear` asks and leaves it.
async fn participate(
    d: &Donor,
    ns: &str,
    block: bool,
    reason: &Document,
    clear: bool,
) -> Result<(), EngineError> {
    if !block && clear {
        if ns.contains('.') {
            d.filtering.flush_collection(ns);
        } else {
            d.filtering.flush_database(ns);
        }
    }
    d.migrations.participant_block(ns, block, reason).await
}

/// What a coordinator blocks on every shard: the namespaces (collections, or a database by
/// its name) whose critical section it holds there.
struct Blocked<'a> {
    d: &'a Donor,
    all: &'a [(String, String)],
    namespaces: Vec<String>,
    reason: Document,
}

impl<'a> Blocked<'a> {
    /// The critical sections of `namespaces` on every shard of `all`, not entered yet.
    fn new(
        d: &'a Donor,
        all: &'a [(String, String)],
        namespaces: &[&str],
        reason: Document,
    ) -> Blocked<'a> {
        Blocked {
            d,
            all,
            namespaces: namespaces.iter().map(|ns| ns.to_string()).collect(),
            reason,
        }
    }

    async fn send(&self, block: bool) -> Result<(), EngineError> {
        for (id, host) in self.all {
            for ns in &self.namespaces {
                self.send_one(id, host, ns, block).await?;
            }
        }
        Ok(())
    }

    /// `_shardsvrParticipantBlock` for `ns` to the shard `id` (run here when it is this one).
    async fn send_one(
        &self,
        id: &str,
        host: &str,
        ns: &str,
        block: bool,
    ) -> Result<(), EngineError> {
        if id == self.d.name {
            return participate(self.d, ns, block, &self.reason, !block).await;
        }
        let (db, target) = match ns.split_once('.') {
            Some((db, coll)) => (db, Bson::String(coll.to_string())),
            None => (ns, Bson::Int32(1)),
        };
        let command = doc! {
            "_shardsvrParticipantBlock": target,
            "blockType": if block { BLOCK_READS_AND_WRITES } else { UNBLOCK },
            "reason": self.reason.clone(),
            "clearFilteringMetadata": !block,
            "writeConcern": {"w": "majority"},
        };
        self.d
            .migrations
            .run_on_db(host, db, command)
            .await
            .map(|_| ())
    }

    /// Has every shard forget its routing of the namespaces and leave their critical
    /// sections: the requests that waited go on against the committed change. A shard that
    /// cannot be reached is asked again a few times, then logged.
    async fn leave(self) {
        const ATTEMPTS: u32 = 5;
        for (id, host) in self.all {
            for ns in &self.namespaces {
                for attempt in 1..=ATTEMPTS {
                    match self.send_one(id, host, ns, false).await {
                        Ok(()) => break,
                        Err(e)
                            if attempt == ATTEMPTS
                                || e.code == ErrorCode::ConflictingOperationInProgress =>
                        {
                            tracing::warn!(shard = %id, ns = %ns, error = %e.message,
                                "a shard could not be told to leave a DDL critical section");
                            break;
                        }
                        Err(_) => {
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        }
                    }
                }
            }
        }
    }
}

fn already_sharded(ns: &str, key: &Bson, unique: bool) -> EngineError {
    EngineError::new(
        ErrorCode(23),
        format!(
            "sharding already enabled for collection {ns} with options {}",
            crate::value::render::render_doc(&doc! {"key": key.clone(), "unique": unique})
        ),
    )
}

/// `_shardsvrCreateCollection: <coll>` on the database (`shardKey`, `unique`,
/// `numInitialChunks`): shards the collection with MongoDB's initial chunks. An empty
/// collection gets the pre-split of [`initial_chunks`] (a hashed prefix: `numInitialChunks`,
/// two per shard by default, spread over the shards; otherwise one chunk on the primary); a
/// collection with documents gets one chunk on this shard (the primary, where they are), as
/// MongoDB does. The collection and its shard key index are created on every shard that gets
/// a chunk; `config.chunks` then `config.collections` are written on the config server; every
/// shard reloads. Sharding again with the same key and `unique` answers as the first time.
async fn create_collection(d: &Donor, db: &str, body: &Document) -> Result<Document, EngineError> {
    const CMD: &str = "_shardsvrCreateCollection";
    let coll = string(body, CMD, CMD)?;
    let ns = format!("{db}.{coll}");
    super::store::check_namespace(db, coll)?;
    let key = object_field(body, CMD, "shardKey")?;
    let pattern = ShardKeyPattern::parse(key).map_err(|e| EngineError::new(e.code, e.message))?;
    let unique = body.get("unique").is_some_and(truthy);
    let num_initial = number_field(body, "numInitialChunks")
        .filter(|n| *n > 0)
        .map(|n| n as u32);
    let cache = d.filtering.cache().await?;
    d.filtering.flush_collection(&ns);
    let info = cache.routing_info(&ns).await.map_err(engine_error)?;
    if let Some(existing) = info.collection {
        let same = existing.snapshot.pattern.to_document() == pattern.to_document()
            && existing.snapshot.unique == unique;
        if same {
            return Ok(doc! {"collectionsharded": &ns, "collectionUUID": existing.snapshot.uuid});
        }
        return Err(already_sharded(
            &ns,
            &Bson::Document(existing.snapshot.pattern.to_document()),
            existing.snapshot.unique,
        ));
    }
    let entries = shard_entries(d).await?;
    // A shard being removed gets no new chunk (unless every shard is).
    let mut ids: Vec<String> = entries
        .iter()
        .filter(|(_, _, draining)| !draining)
        .map(|(id, _, _)| id.clone())
        .collect();
    if ids.is_empty() {
        ids = entries.iter().map(|(id, _, _)| id.clone()).collect();
    }
    let all: Vec<(String, String)> = entries
        .into_iter()
        .map(|(id, host, _)| (id, host))
        .collect();
    let holds_documents = lock(&d.catalog)
        .collection(db, coll)
        .is_some_and(|c| !c.is_empty());
    let chunks = if holds_documents {
        vec![crate::routing::Chunk {
            id: ObjectId::new(),
            min: pattern.min_key(),
            max: pattern.max_key(),
            shard: d.name.clone(),
            version: crate::routing::ChunkVersion { major: 1, minor: 0 },
        }]
    } else {
        initial_chunks(&pattern, &ids, &d.name, num_initial)
    };
    let mut owners: Vec<&str> = chunks.iter().map(|c| c.shard.as_str()).collect();
    owners.push(&d.name);
    owners.sort_unstable();
    owners.dedup();
    for owner in owners {
        let Some((_, host)) = all.iter().find(|(id, _)| id == owner) else {
            return Err(EngineError::new(
                ErrorCode::ShardNotFound,
                format!("Shard {owner} not found"),
            ));
        };
        checked(
            d.migrations
                .run_on_db(host, db, doc! {"create": coll})
                .await,
            &[ErrorCode::NamespaceExists],
        )?;
        if pattern.to_document() != doc! {"_id": 1} {
            let mut index = doc! {"key": pattern.to_document(), "name": pattern.index_name()};
            if unique {
                index.insert("unique", true);
            }
            checked(
                d.migrations
                    .run_on_db(host, db, doc! {"createIndexes": coll, "indexes": [index]})
                    .await,
                &[],
            )?;
        }
    }
    let epoch = ObjectId::new();
    let timestamp = bson::Timestamp {
        time: now_secs(),
        increment: 1,
    };
    let uuid = bson::Uuid::new();
    let entry = doc! {
        "_id": &ns,
        "lastmodEpoch": epoch,
        "lastmod": bson::DateTime::now(),
        "timestamp": timestamp,
        "uuid": uuid,
        "key": pattern.to_document(),
        "unique": unique,
        "noBalance": false,
    };
    let chunk_docs: Vec<Bson> = chunks
        .iter()
        .map(|c| Bson::Document(c.config_document(uuid, &pattern, timestamp)))
        .collect();
    let reply = d
        .filtering
        .run_on_config_server(doc! {
            "_sluiceCommitShardCollection": &ns,
            "collection": entry,
            "chunks": chunk_docs
        })
        .await?;
    flush_everywhere(d, &all, "_flushRoutingTableCacheUpdates", &ns).await;
    if let Ok(existing) = reply.get_document("existing") {
        // Sharded meanwhile by another request: the same as the first time, or refused.
        let key = existing.get("key").cloned().unwrap_or(Bson::Null);
        let other_unique = existing.get_bool("unique").unwrap_or(false);
        if key == Bson::Document(pattern.to_document()) && other_unique == unique {
            let uuid = existing.get("uuid").cloned().unwrap_or(Bson::Null);
            return Ok(doc! {"collectionsharded": &ns, "collectionUUID": uuid});
        }
        return Err(already_sharded(&ns, &key, other_unique));
    }
    Ok(doc! {"collectionsharded": &ns, "collectionUUID": uuid})
}

/// `_shardsvrDropCollection: <coll>` on the database: a sharded collection leaves
/// `config.*` and then every shard; an unsharded one is dropped here (the primary). Every
/// shard reloads. Dropping a collection that does not exist succeeds, as in MongoDB 7.0+.
async fn drop_collection(d: &Donor, db: &str, body: &Document) -> Result<Document, EngineError> {
    const CMD: &str = "_shardsvrDropCollection";
    let coll = string(body, CMD, CMD)?;
    let ns = format!("{db}.{coll}");
    super::store::check_namespace(db, coll)?;
    // A drop already under way (resumed by this primary, or sent before and retried) is
    // joined: its outcome is this request's.
    let id = coordinator_id(DROP_COLLECTION, &ns);
    if ddl_coordinator::recorded(&d.catalog, &id).is_some() {
        ddl_coordinator::join(d, &id).await?;
        return Ok(doc! {"ns": &ns});
    }
    let cache = d.filtering.cache().await?;
    d.filtering.flush_collection(&ns);
    let tracked = cache
        .routing_info(&ns)
        .await
        .map_err(engine_error)?
        .collection
        .is_some();
    let all = shards(d).await?;
    if !tracked {
        let host = all.iter().find(|(id, _)| *id == d.name).map(|(_, h)| h);
        if let Some(host) = host {
            checked(
                d.migrations.run_on_db(host, db, doc! {"drop": coll}).await,
                &[ErrorCode::NamespaceNotFound],
            )?;
        }
        flush_everywhere(d, &all, "_flushRoutingTableCacheUpdates", &ns).await;
        return Ok(doc! {"ns": &ns});
    }
    match Coordinator::begin(d, DROP_COLLECTION, &ns, Document::new())? {
        Begun::New(c) => run_drop_collection(d, c).await,
        Begun::Existing(_) => {
            ddl_coordinator::join(d, &coordinator_id(DROP_COLLECTION, &ns)).await?;
            Ok(doc! {"ns": &ns})
        }
    }
}

/// The phases of a drop coordinator, in order (MongoDB's `DropCollectionCoordinatorPhase`
/// values; `freezeCollection` is not used: the critical section holds migrations off too).
const DROP_PHASES: &[&str] = &[
    "unset",
    "enterCriticalSection",
    "dropCollection",
    "releaseCriticalSection",
];

/// Whether a coordinator that reached `phase` still has `step` to do (`phase` is the one it
/// recorded last: that one is done again, as it may have been cut short).
fn to_do(phases: &[&str], phase: &str, step: &str) -> bool {
    let at = |p: &str| phases.iter().position(|x| *x == p).unwrap_or(0);
    at(phase) <= at(step)
}

/// The namespace a coordinator's document names.
fn coordinator_namespace(c: &Coordinator) -> String {
    c.document()
        .get_document("_id")
        .and_then(|id| id.get_str("namespace"))
        .unwrap_or_default()
        .to_string()
}

/// A drop of a sharded collection, from the phase its coordinator recorded: every shard holds
/// the collection's critical section from before the commit until each has dropped its copy
/// and forgotten the routing, so a write racing the drop waits, then is answered StaleConfig,
/// instead of landing in a copy about to be dropped or orphaned. Each phase is recorded
/// before it is acted on, and each is harmless to run again (entering a critical section for
/// the same reason, removing what is already removed, dropping what is already dropped), so
/// a primary elected halfway runs the recorded phase again and goes on.
async fn run_drop_collection(d: &Donor, mut c: Coordinator) -> Result<Document, EngineError> {
    let ns = coordinator_namespace(&c);
    let (db, coll) = ns.split_once('.').unwrap_or((&ns, ""));
    let start = c.phase().to_string();
    let all = match shards(d).await {
        Ok(all) => all,
        Err(e) => return Err(abandon(c, e)),
    };
    let reason = doc! {"command": "dropCollection", "ns": &ns};
    let blocked = Blocked::new(d, &all, &[&ns], reason);
    if to_do(DROP_PHASES, &start, "enterCriticalSection") {
        c.enter("enterCriticalSection")?;
        if let Err(e) = blocked.send(true).await {
            return Err(give_up(c, blocked, "releaseCriticalSection", e).await);
        }
    }
    let mut dropped = Ok(());
    if to_do(DROP_PHASES, &start, "dropCollection") {
        c.enter("dropCollection")?;
        dropped = async {
            d.filtering
                .run_on_config_server(doc! {"_sluiceCommitDropCollection": &ns})
                .await?;
            for (_, host) in &all {
                checked(
                    d.migrations.run_on_db(host, db, doc! {"drop": coll}).await,
                    &[ErrorCode::NamespaceNotFound],
                )?;
            }
            Ok::<_, EngineError>(())
        }
        .await;
    }
    c.enter("releaseCriticalSection")?;
    blocked.leave().await;
    c.finish();
    dropped?;
    Ok(doc! {"ns": &ns})
}

/// A first phase that failed (the critical section not entered everywhere): the coordinator
/// records `release`, every shard leaves the critical section, and the coordinator gives up
/// with `e` (a coordinator that cannot even record that is left for the next primary).
async fn give_up(
    mut c: Coordinator,
    blocked: Blocked<'_>,
    release: &str,
    e: EngineError,
) -> EngineError {
    if c.enter(release).is_err() {
        return e;
    }
    blocked.leave().await;
    abandon(c, e)
}

/// A coordinator that failed before changing anything: its document goes, and `e` is the
/// answer.
fn abandon(c: Coordinator, e: EngineError) -> EngineError {
    if !ddl_coordinator::interrupted(&e) {
        c.finish();
    }
    e
}

/// Resumes a coordinator recorded by an earlier primary (see [`ddl_coordinator`]).
pub fn resume(
    d: Donor,
    c: Coordinator,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        let operation = c
            .document()
            .get_document("_id")
            .and_then(|id| id.get_str("operationType"))
            .unwrap_or_default()
            .to_string();
        let result = match operation.as_str() {
            DROP_COLLECTION => run_drop_collection(&d, c).await,
            RENAME_COLLECTION => run_rename_collection(&d, c).await,
            DROP_DATABASE => run_drop_database(&d, c).await,
            other => Err(EngineError::new(
                ErrorCode::BadValue,
                format!("unknown DDL coordinator {other}"),
            )),
        };
        match result {
            Ok(reply) => tracing::info!(operation, reply = %reply, "resumed DDL coordinator done"),
            Err(e) => {
                tracing::warn!(operation, error = %e.message, "resumed DDL coordinator failed")
            }
        }
    })
}

/// `_shardsvrRenameCollection: "<db>.<from>", to: "<db>.<to>", dropTarget?` on the source's
/// database (what mongos 5.0+ sends the primary shard for any `renameCollection`): a sharded
/// source is renamed on every shard (the target dropped first where `dropTarget` allows it),
/// recorded under its new name on the config server, and every shard reloads both names. An
/// unsharded source is renamed here, on the primary. Replies `{collectionVersion}` of the
/// renamed collection, as MongoDB's coordinator does.
async fn rename_collection(d: &Donor, db: &str, body: &Document) -> Result<Document, EngineError> {
    const CMD: &str = "_shardsvrRenameCollection";
    let from = string(body, CMD, CMD)?.to_string();
    let to = string(body, CMD, "to")?.to_string();
    let drop_target = body.get("dropTarget").is_some_and(truthy);
    let (Some((from_db, _)), Some((to_db, to_coll))) = (from.split_once('.'), to.split_once('.'))
    else {
        return Err(EngineError::new(
            ErrorCode::InvalidNamespace,
            format!("Invalid namespace: {from} or {to}"),
        ));
    };
    if from_db != db {
        return Err(EngineError::new(
            ErrorCode::InvalidNamespace,
            format!("{CMD} is run against the source's database, {from_db}"),
        ));
    }
    super::store::check_namespace(to_db, to_coll)?;
    if from == to {
        return Err(EngineError::new(
            ErrorCode::IllegalOperation,
            "Can't rename a collection to itself",
        ));
    }
    // A rename of the same source already under way (resumed by this primary, or sent before
    // and retried) is joined; one that finished with this target while the source is gone
    // answers its recorded response. The record is read before the routing, so that a rename
    // it shows finished has committed before the source's routing is read below (read first,
    // the routing could predate a commit that finished meanwhile, and the request sent again
    // would meet both names sharded: NamespaceExists).
    let id = coordinator_id(RENAME_COLLECTION, &from);
    let recorded = ddl_coordinator::recorded(&d.catalog, &id);
    let cache = d.filtering.cache().await?;
    d.filtering.flush_collection(&from);
    d.filtering.flush_collection(&to);
    let source = cache
        .routing_info(&from)
        .await
        .map_err(engine_error)?
        .collection
        .is_some();
    let target = cache
        .routing_info(&to)
        .await
        .map_err(engine_error)?
        .collection
        .is_some();
    let source_here = lock(&d.catalog)
        .collection(db, &from[db.len() + 1..])
        .is_some();
    if let Some(recorded) = recorded {
        if let Some(reply) = rename_recorded(d, &recorded, &to, source || source_here).await? {
            return Ok(reply);
        }
    }
    let all = shards(d).await?;
    let mut rename = doc! {"renameCollection": &from, "to": &to};
    if drop_target {
        rename.insert("dropTarget", true);
    }
    if !source {
        // An unsharded collection lives on the primary: renamed here, as mongod does.
        let host = all
            .iter()
            .find(|(id, _)| *id == d.name)
            .map(|(_, h)| h.clone())
            .ok_or_else(|| {
                EngineError::new(ErrorCode::ShardNotFound, "this shard is not listed")
            })?;
        if target {
            return Err(EngineError::new(
                ErrorCode::CommandNotSupported,
                "renaming an unsharded collection onto a sharded one is not supported",
            ));
        }
        d.migrations.run_on(&host, rename).await?;
        return Ok(doc! {"collectionVersion": unsharded_version()});
    }
    if from_db != to_db {
        return Err(EngineError::new(
            ErrorCode::CommandFailed,
            "Source and destination collections must be on the same database.",
        ));
    }
    if target && !drop_target {
        return Err(EngineError::new(
            ErrorCode::NamespaceExists,
            "target namespace exists",
        ));
    }
    // An unsharded target (on the primary) blocks the rename unless it may be dropped.
    if !target && !drop_target {
        let exists = lock(&d.catalog).collection(to_db, to_coll).is_some();
        if exists {
            return Err(EngineError::new(
                ErrorCode::NamespaceExists,
                "target namespace exists",
            ));
        }
    }
    let fields = doc! {"to": &to, "dropTarget": drop_target};
    let c = match Coordinator::begin(d, RENAME_COLLECTION, &from, fields.clone())? {
        Begun::New(c) => c,
        Begun::Existing(recorded) => match rename_recorded(d, &recorded, &to, true).await? {
            Some(reply) => return Ok(reply),
            None => match Coordinator::replace_finished(d, &recorded, fields)? {
                Begun::New(c) => c,
                Begun::Existing(_) => return Err(rename_conflict(&from)),
            },
        },
    };
    run_rename_collection(d, c).await
}

fn rename_conflict(from: &str) -> EngineError {
    EngineError::new(
        ErrorCode::ConflictingOperationInProgress,
        format!("another rename of {from} is in progress"),
    )
}

/// What a rename request answers when a rename coordinator of its source is recorded: one
/// running to the same target is joined (its response is this request's); one that finished
/// with this target answers its response while the source is gone (the request is the same
/// one sent again), and `None` (a new rename) once the source exists again; one to another
/// target is ConflictingOperationInProgress (117) while it runs.
async fn rename_recorded(
    d: &Donor,
    recorded: &Document,
    to: &str,
    source_exists: bool,
) -> Result<Option<Document>, EngineError> {
    let same_target = recorded.get_str("to").ok() == Some(to);
    let finished = recorded.get_str("phase").ok() == Some(SET_RESPONSE);
    if finished {
        return Ok((same_target && !source_exists).then(|| {
            recorded
                .get_document("response")
                .cloned()
                .unwrap_or_default()
        }));
    }
    if !same_target {
        return Err(rename_conflict(
            &coordinator_namespace_of(recorded).unwrap_or_default(),
        ));
    }
    let id = recorded.get_document("_id").cloned().unwrap_or_default();
    Ok(Some(
        ddl_coordinator::join(d, &id)
            .await?
            .and_then(|done| done.get_document("response").ok().cloned())
            .unwrap_or_default(),
    ))
}

fn coordinator_namespace_of(recorded: &Document) -> Option<String> {
    recorded
        .get_document("_id")
        .and_then(|id| id.get_str("namespace"))
        .ok()
        .map(str::to_string)
}

/// The phases of a rename coordinator, in order (values of MongoDB's
/// `RenameCollectionCoordinatorPhase`; here `blockCRUDAndRename` enters the critical sections
/// and drops the target, `renameParticipants` renames on every shard and commits, so that
/// running either again cannot drop a collection already renamed onto the target).
const RENAME_PHASES: &[&str] = &[
    "unset",
    "blockCRUDAndRename",
    "renameParticipants",
    "unblockCRUD",
    SET_RESPONSE,
];

/// A rename of a sharded collection, from the phase its coordinator recorded (see
/// [`run_drop_collection`] for how phases are recorded and run again). Both names' critical
/// sections are held on every shard from before the first local rename until each shard has
/// forgotten its routing of both after the commit: a write racing the rename waits, then is
/// answered StaleConfig, instead of landing under the old name on a shard that already
/// renamed its copy. The response is kept with the coordinator's document
/// ([`SET_RESPONSE`]).
async fn run_rename_collection(d: &Donor, mut c: Coordinator) -> Result<Document, EngineError> {
    let from = coordinator_namespace(&c);
    let to = c.document().get_str("to").unwrap_or_default().to_string();
    let drop_target = c.document().get_bool("dropTarget").unwrap_or(false);
    let (to_db, to_coll) = to.split_once('.').unwrap_or((&to, ""));
    let start = c.phase().to_string();
    let all = match shards(d).await {
        Ok(all) => all,
        Err(e) => return Err(abandon(c, e)),
    };
    let reason = doc! {"command": "rename", "from": &from, "to": &to};
    let blocked = Blocked::new(d, &all, &[&from, &to], reason);
    if to_do(RENAME_PHASES, &start, "blockCRUDAndRename") {
        c.enter("blockCRUDAndRename")?;
        let blocked_and_dropped = async {
            blocked.send(true).await?;
            if drop_target {
                for (_, host) in &all {
                    checked(
                        d.migrations
                            .run_on_db(host, to_db, doc! {"drop": to_coll})
                            .await,
                        &[ErrorCode::NamespaceNotFound],
                    )?;
                }
            }
            Ok::<_, EngineError>(())
        }
        .await;
        if let Err(e) = blocked_and_dropped {
            return Err(give_up(c, blocked, "unblockCRUD", e).await);
        }
    }
    let mut renamed = Ok(None);
    if to_do(RENAME_PHASES, &start, "renameParticipants") {
        c.enter("renameParticipants")?;
        renamed = async {
            for (_, host) in &all {
                checked(
                    d.migrations
                        .run_on(host, doc! {"renameCollection": &from, "to": &to})
                        .await,
                    &[ErrorCode::NamespaceNotFound],
                )?;
            }
            let committed = d
                .filtering
                .run_on_config_server(doc! {
                    "_sluiceCommitRenameCollection": &from,
                    "to": &to,
                    "dropTarget": drop_target,
                })
                .await;
            match committed {
                Ok(reply) => Ok(Some(reply)),
                // Committed by an earlier primary of this shard.
                Err(e) if e.code == ErrorCode::NamespaceNotSharded => Ok(None),
                Err(e) => Err(e),
            }
        }
        .await;
    }
    c.enter("unblockCRUD")?;
    blocked.leave().await;
    let committed = match renamed {
        Ok(Some(reply)) => reply,
        Ok(None) => {
            // The commit happened before: its generation is the target's.
            d.filtering.flush_collection(&to);
            let info = d.filtering.cache().await?.routing_info(&to).await;
            match info.ok().and_then(|i| i.collection) {
                Some(coll) => doc! {
                    "epoch": coll.snapshot.epoch,
                    "timestamp": coll.snapshot.timestamp,
                },
                None => Document::new(),
            }
        }
        Err(e) => {
            c.finish();
            return Err(e);
        }
    };
    let response = doc! {"collectionVersion": {
        "e": committed.get("epoch").cloned().unwrap_or(Bson::Null),
        "t": committed.get("timestamp").cloned().unwrap_or(Bson::Null),
        "v": bson::Timestamp { time: 0, increment: 0 },
    }};
    c.finish_with(response.clone())?;
    Ok(response)
}

/// The version MongoDB gives an unsharded collection (`ShardVersion::UNSHARDED`).
fn unsharded_version() -> Document {
    let zero = bson::Timestamp {
        time: 0,
        increment: 0,
    };
    doc! {"e": ObjectId::from_bytes([0; 12]), "t": zero, "v": zero}
}

/// `_shardsvrDropDatabase: 1` on the database: its sharded collections and its entry leave
/// `config.*`, then the database is dropped on every shard, and every shard reloads.
async fn drop_database(d: &Donor, db: &str) -> Result<Document, EngineError> {
    if matches!(db, "admin" | "config" | "local") {
        return Err(EngineError::new(
            ErrorCode::IllegalOperation,
            format!("Cannot drop the {db} database"),
        ));
    }
    match Coordinator::begin(d, DROP_DATABASE, db, Document::new())? {
        Begun::New(c) => run_drop_database(d, c).await,
        Begun::Existing(_) => {
            ddl_coordinator::join(d, &coordinator_id(DROP_DATABASE, db)).await?;
            Ok(doc! {"dropped": db})
        }
    }
}

/// The phases of a `dropDatabase` coordinator, in order. MongoDB's records `drop` only (and
/// drops each sharded collection with a drop coordinator of its own); the embedded one holds
/// the database's critical section on every shard, so it records entering and leaving it too.
const DROP_DATABASE_PHASES: &[&str] = &[
    "unset",
    "enterCriticalSection",
    "drop",
    "releaseCriticalSection",
];

/// A `dropDatabase`, from the phase its coordinator recorded (see [`run_drop_collection`]):
/// the database's critical section on every shard (every request carrying a version for any
/// of its collections waits) from before the commit until each shard has dropped it and
/// forgotten its routing, so a racing write is answered StaleConfig or StaleDbVersion instead
/// of landing in a copy about to be dropped or orphaned. The sharded collections the commit
/// removed are recorded with the coordinator, so a primary that takes over still has every
/// shard forget them.
async fn run_drop_database(d: &Donor, mut c: Coordinator) -> Result<Document, EngineError> {
    let db = coordinator_namespace(&c);
    let start = c.phase().to_string();
    let all = match shards(d).await {
        Ok(all) => all,
        Err(e) => return Err(abandon(c, e)),
    };
    let reason = doc! {"command": "dropDatabase", "db": &db};
    let blocked = Blocked::new(d, &all, &[&db], reason);
    if to_do(DROP_DATABASE_PHASES, &start, "enterCriticalSection") {
        c.enter("enterCriticalSection")?;
        if let Err(e) = blocked.send(true).await {
            return Err(give_up(c, blocked, "releaseCriticalSection", e).await);
        }
    }
    let mut dropped = Ok(());
    if to_do(DROP_DATABASE_PHASES, &start, "drop") {
        c.enter("drop")?;
        dropped = async {
            let reply = d
                .filtering
                .run_on_config_server(doc! {"_sluiceCommitDropDatabase": &db})
                .await?;
            let removed = reply.get_array("collections").cloned().unwrap_or_default();
            if !removed.is_empty() {
                c.record("collections", Bson::Array(removed))?;
            }
            for (_, host) in &all {
                checked(
                    d.migrations
                        .run_on_db(host, &db, doc! {"dropDatabase": 1})
                        .await,
                    &[],
                )?;
            }
            Ok::<_, EngineError>(())
        }
        .await;
        if dropped.is_ok() {
            let collections = c.document().get_array("collections").cloned();
            for ns in collections
                .unwrap_or_default()
                .iter()
                .filter_map(Bson::as_str)
            {
                flush_everywhere(d, &all, "_flushRoutingTableCacheUpdates", ns).await;
            }
        }
    }
    // Leaving has every shard forget the database's routing first.
    c.enter("releaseCriticalSection")?;
    blocked.leave().await;
    c.finish();
    dropped?;
    Ok(doc! {"dropped": &db})
}

/// Documents per `insert` when a collection is cloned to a new primary shard.
const CLONE_BATCH: usize = 1000;
/// Bytes of documents per `insert` of a clone (a message stays far below 48 MB).
const CLONE_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// `_shardsvrMovePrimary: db, to` (what mongos's `movePrimary` sends the database's primary
/// shard, on `admin`): in the database's critical section (every versioned request on it
/// waits), the database's unsharded collections and views are cloned to `to` (with their
/// options, indexes and documents), the new primary is committed on the config server
/// (`_sluiceCommitMovePrimary`, the next database version), the clones' sources are dropped
/// here, and every shard reloads the database; the requests that waited meet the new version
/// and are answered StaleDbVersion, so their routers retarget them to the new primary. Moving
/// to the current primary does nothing; an unknown shard is ShardNotFound (70); a collection
/// that already exists on `to` is NamespaceExists (48), nothing moved.
async fn move_primary(d: &Donor, body: &Document) -> Result<Document, EngineError> {
    const CMD: &str = "_shardsvrMovePrimary";
    let db = string(body, CMD, CMD)?.to_string();
    let to = string(body, CMD, "to")?.to_string();
    if matches!(db.as_str(), "admin" | "config" | "local") {
        return Err(EngineError::new(
            ErrorCode::InvalidOptions,
            format!("Can't move primary for {db} database"),
        ));
    }
    let all = shards(d).await?;
    let Some((_, to_host)) = all.iter().find(|(id, _)| *id == to) else {
        return Err(EngineError::new(
            ErrorCode::ShardNotFound,
            format!("Requested primary shard {to} does not exist"),
        ));
    };
    if to == d.name {
        return Ok(Document::new());
    }
    let _critical = d.migrations.critical_section(&db).await?;
    let names: Vec<String> = lock(&d.catalog)
        .dbs
        .get(&db)
        .map(|colls| colls.keys().cloned().collect())
        .unwrap_or_default();
    let mut moved = Vec::new();
    for coll in names {
        if !d.filtering.is_sharded(&format!("{db}.{coll}")).await? {
            moved.push(coll);
        }
    }
    // Nothing is cloned while any of them exists on the recipient.
    for coll in &moved {
        let exists = d
            .migrations
            .run_on_db(
                to_host,
                &db,
                doc! {"listCollections": 1, "filter": {"name": coll}, "nameOnly": true},
            )
            .await?;
        let found = exists
            .get_document("cursor")
            .and_then(|c| c.get_array("firstBatch"))
            .is_ok_and(|b| !b.is_empty());
        if found {
            return Err(EngineError::new(
                ErrorCode::NamespaceExists,
                format!("{db}.{coll} already exists on the shard {to}"),
            ));
        }
    }
    let cloned = async {
        for coll in &moved {
            clone_collection(d, &db, coll, to_host).await?;
        }
        d.filtering
            .run_on_config_server(doc! {"_sluiceCommitMovePrimary": &db, "to": &to})
            .await
    };
    let reply = match cloned.await {
        Ok(reply) => reply,
        Err(e) => {
            // Not committed: this shard stays the primary, and the recipient drops what it got.
            for coll in &moved {
                let dropped = d
                    .migrations
                    .run_on_db(to_host, &db, doc! {"drop": coll})
                    .await;
                if let Err(drop_error) = dropped {
                    tracing::warn!(db = %db, coll = %coll, error = %drop_error.message,
                        "a partial clone of movePrimary could not be dropped");
                }
            }
            return Err(e);
        }
    };
    {
        let mut catalog = lock(&d.catalog);
        if let Some(colls) = catalog.dbs.get_mut(&db) {
            for coll in &moved {
                colls.remove(coll);
            }
        }
    }
    flush_everywhere(d, &all, "_flushDatabaseCacheUpdates", &db).await;
    Ok(reply)
}

/// Options of `create` a clone carries: a view's definition, a capped collection's size, a
/// validator, a default collation.
const CLONED_OPTIONS: &[&str] = &[
    "viewOn",
    "pipeline",
    "collation",
    "capped",
    "size",
    "max",
    "validator",
    "validationLevel",
    "validationAction",
];

/// Clones `db.coll` from this shard to `to_host`: the collection with its options (a view is
/// only its definition), its indexes other than `_id_`, then its documents in ordered batches.
async fn clone_collection(
    d: &Donor,
    db: &str,
    coll: &str,
    to_host: &str,
) -> Result<(), EngineError> {
    let (create, indexes, docs) = {
        let catalog = lock(&d.catalog);
        match catalog.collection(db, coll) {
            Some(c) => (
                {
                    let mut create = doc! {"create": coll};
                    for k in CLONED_OPTIONS {
                        if let Some(v) = c.options.get(*k) {
                            create.insert(*k, v.clone());
                        }
                    }
                    create
                },
                c.indexes()
                    .iter()
                    .filter(|i| i.name != "_id_")
                    .map(|i| {
                        let mut spec = i.spec.clone();
                        spec.remove("v");
                        Bson::Document(spec)
                    })
                    .collect::<Vec<Bson>>(),
                c.iter()
                    .map(|(_, doc)| doc.clone())
                    .collect::<Vec<Document>>(),
            ),
            None => return Ok(()),
        }
    };
    let is_view = create.contains_key("viewOn");
    d.migrations.run_on_db(to_host, db, create).await?;
    if is_view {
        return Ok(());
    }
    if !indexes.is_empty() {
        d.migrations
            .run_on_db(
                to_host,
                db,
                doc! {"createIndexes": coll, "indexes": indexes},
            )
            .await?;
    }
    let mut batch: Vec<Document> = Vec::new();
    let mut bytes = 0usize;
    let mut docs = docs.into_iter().peekable();
    while let Some(doc) = docs.next() {
        bytes += bson::RawDocumentBuf::try_from(&doc).map_or(0, |b| b.as_bytes().len());
        batch.push(doc);
        if batch.len() >= CLONE_BATCH || bytes >= CLONE_BATCH_BYTES || docs.peek().is_none() {
            let documents = std::mem::take(&mut batch);
            d.migrations
                .run_on_db(
                    to_host,
                    db,
                    doc! {"insert": coll, "documents": documents, "ordered": true},
                )
                .await?;
            bytes = 0;
        }
    }
    Ok(())
}

/// `splitChunk {splitChunk: ns, from, keyPattern, epoch, timestamp, min, max, splitKeys}` (what
/// mongos sends the shard that owns the chunk): committed on the config server as
/// `_configsvrCommitChunkSplit`, then this shard reloads the collection.
async fn split_chunk(d: &Donor, body: &Document) -> Result<Document, EngineError> {
    const CMD: &str = "splitChunk";
    let ns = string(body, CMD, CMD)?;
    let from = string(body, CMD, "from")?;
    if from != d.name {
        return Err(EngineError::new(
            ErrorCode::IllegalOperation,
            format!("this shard is {}, not {from}", d.name),
        ));
    }
    let min = object_field(body, CMD, "min")?;
    let max = object_field(body, CMD, "max")?;
    let Some(Bson::Array(keys)) = body.get("splitKeys") else {
        return Err(EngineError::new(
            ErrorCode(40414),
            format!("BSON field '{CMD}.splitKeys' is missing but a required field"),
        ));
    };
    let mut commit = doc! {"_configsvrCommitChunkSplit": ns};
    if let Some(e) = body.get("epoch") {
        commit.insert("collEpoch", e.clone());
    }
    if let Some(t) = body.get("timestamp") {
        commit.insert("collTimestamp", t.clone());
    }
    commit.insert("min", min.clone());
    commit.insert("max", max.clone());
    commit.insert("splitPoints", keys.clone());
    commit.insert("shard", &d.name);
    let result = d.filtering.run_on_config_server(commit).await;
    d.filtering.flush_collection(ns);
    let reply = result?;
    Ok(doc! {"shardVersion": reply.get("shardVersion").cloned().unwrap_or(Bson::Null)})
}

/// `mergeChunks {mergeChunks: ns, bounds: [min, max], shardName, epoch, timestamp}` (what
/// mongos sends the shard that owns the first chunk): committed on the config server as
/// `_configsvrCommitChunksMerge`, then this shard reloads the collection.
async fn merge_chunks(d: &Donor, body: &Document) -> Result<Document, EngineError> {
    const CMD: &str = "mergeChunks";
    let ns = string(body, CMD, CMD)?;
    if let Ok(name) = body.get_str("shardName") {
        if name != d.name {
            return Err(EngineError::new(
                ErrorCode::IllegalOperation,
                format!("this shard is {}, not {name}", d.name),
            ));
        }
    }
    let (min, max) = match body.get("bounds") {
        Some(Bson::Array(b)) => match b.as_slice() {
            [Bson::Document(lo), Bson::Document(hi)] => (lo.clone(), hi.clone()),
            _ => {
                return Err(EngineError::new(
                    ErrorCode::InvalidOptions,
                    "only a min and max bound may be specified",
                ))
            }
        },
        _ => {
            return Err(EngineError::new(
                ErrorCode(40414),
                format!("BSON field '{CMD}.bounds' is missing but a required field"),
            ))
        }
    };
    let cache = d.filtering.cache().await?;
    d.filtering.flush_collection(ns);
    let info = cache.routing_info(ns).await.map_err(engine_error)?;
    let Some(coll) = info.collection else {
        return Err(EngineError::new(
            ErrorCode::NamespaceNotSharded,
            format!("{ns} is not sharded"),
        ));
    };
    if let Some(e) = body.get("epoch") {
        if *e != Bson::ObjectId(coll.snapshot.epoch) {
            return Err(EngineError::new(
                ErrorCode::StaleEpoch,
                format!("{ns} was dropped or sharded again"),
            ));
        }
    }
    let result = d
        .filtering
        .run_on_config_server(doc! {
            "_configsvrCommitChunksMerge": ns,
            "collUUID": coll.snapshot.uuid,
            "chunkRange": {"min": min, "max": max},
            "shard": &d.name,
            "validAfter": bson::Timestamp { time: now_secs(), increment: 0 }
        })
        .await;
    d.filtering.flush_collection(ns);
    let reply = result?;
    Ok(doc! {"shardVersion": reply.get("shardVersion").cloned().unwrap_or(Bson::Null)})
}

/// `_shardsvrAddShard: 1, shardIdentity: {shardName, clusterId, configsvrConnectionString}` on
/// `admin` (what MongoDB 8.0's config server sends a shard that `addShard` adds): the shard
/// records its identity as mongod does, `admin.system.version {_id: "shardIdentity",
/// shardName, clusterId, configsvrConnectionString}`. The same identity again answers as the
/// first time; another name or cluster is IllegalOperation (20), nothing changed.
pub fn add_shard_identity(
    catalog: &std::sync::Mutex<super::store::Catalog>,
    body: &Document,
) -> Result<Document, EngineError> {
    const STRUCT: &str = "ShardIdentity";
    let Some(identity) = body.get("shardIdentity") else {
        return Err(EngineError::new(
            ErrorCode(40414),
            "BSON field '_shardsvrAddShard.shardIdentity' is missing but a required field",
        ));
    };
    let Bson::Document(identity) = identity else {
        return Err(EngineError::new(
            ErrorCode::TypeMismatch,
            format!(
                "BSON field '_shardsvrAddShard.shardIdentity' is the wrong type '{}', expected type 'object'",
                crate::value::field::type_name(identity)
            ),
        ));
    };
    let field = |name: &str, want: &str| -> Result<Bson, EngineError> {
        let value = identity.get(name).ok_or_else(|| {
            EngineError::new(
                ErrorCode(40414),
                format!("BSON field '{STRUCT}.{name}' is missing but a required field"),
            )
        })?;
        let type_name = crate::value::field::type_name(value);
        if type_name != want {
            return Err(EngineError::new(
                ErrorCode::TypeMismatch,
                format!(
                    "BSON field '{STRUCT}.{name}' is the wrong type '{type_name}', expected type '{want}'"
                ),
            ));
        }
        Ok(value.clone())
    };
    let shard_name = field("shardName", "string")?;
    let cluster_id = field("clusterId", "objectId")?;
    let config = field("configsvrConnectionString", "string")?;
    let recorded = doc! {
        "_id": "shardIdentity",
        "shardName": shard_name,
        "clusterId": cluster_id,
        "configsvrConnectionString": config,
    };
    let mut catalog = lock(catalog);
    let (versions, _) = catalog.collection_mut("admin", "system.version");
    if let Some((_, existing)) = versions.by_id(&Bson::String("shardIdentity".into())) {
        let same = |k: &str| existing.get(k) == recorded.get(k);
        if same("shardName") && same("clusterId") {
            return Ok(Document::new());
        }
        return Err(EngineError::new(
            ErrorCode::IllegalOperation,
            format!(
                "this shard already belongs to a cluster as {}; it cannot be added as {}",
                crate::value::render::render_doc(existing),
                crate::value::render::render_doc(&recorded)
            ),
        ));
    }
    versions.insert("admin.system.version", recorded)?;
    Ok(Document::new())
}
