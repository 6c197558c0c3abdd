//! Chunk migration between embedded shard servers, driven the way a MongoDB cluster drives
//! one (docs/design/config-server.md, §9 and §13):
//!
//! 1. the router sends `_configsvrMoveRange` to the config server, which sends
//!    `_shardsvrMoveRange` to the donor (the shapes of MongoDB's `move_range_request.idl`);
//! 2. the donor opens the migration on the recipient (`_recvChunkStart`), copies the range's
//!    documents into the recipient's **staging area** (invisible to every read until the
//!    commit), then catches up with the writes that kept arriving: each round sends what
//!    changed in the range since the last one (documents changed or added, `_id`s removed);
//! 3. the donor enters its **critical section** on the collection: versioned requests for it
//!    wait, and the donor sends the last changes;
//! 4. the recipient enters its own critical section and moves the staged documents into the
//!    collection (`_recvChunkCommit`);
//! 5. the donor commits on the config server (`_configsvrCommitChunkMigration`: the moved chunk
//!    gets `(max major + 1)|0` on the recipient, one chunk left on the donor `(max major + 1)|1`);
//! 6. the donor deletes its copy of the range and reloads its metadata, the recipient reloads
//!    its own (`_recvChunkReleaseCritSec`), and both leave their critical sections: the
//!    requests that waited are checked against the new versions, so a router on the old ones
//!    gets StaleConfig (13388) and retargets. No acknowledged write is lost or doubled.
//!
//! Where the embedded protocol is simpler than mongod's: the donor pushes the documents
//! (`_sluiceRecvChunkMods`, carrying what mongod's `_migrateClone` / `_transferMods` replies
//! carry) instead of the recipient pulling them; catch-up compares the range with what was
//! sent instead of reading an oplog; the range is deleted before the critical section ends
//! (mongod's `waitForDelete`); retryable-write history and indexes are not carried over.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use bson::{doc, oid::ObjectId, Bson, Document};

use crate::engine::EngineError;
use crate::metadata::configsvr::ShardVersion;
use crate::routing::{ShardKey, ShardKeyPattern};
use crate::sync::lock;
use crate::value::compare::values_equal;
use crate::value::error_codes::ErrorCode;

use super::configsvr::{object_field, string_field};
use super::filtering::Filtering;
use super::store::Catalog;

/// Documents (or `_id`s) per `_sluiceRecvChunkMods` batch.
const BATCH_DOCUMENTS: usize = 1000;
/// Catch-up rounds before the critical section, at most.
const MAX_CATCH_UP_ROUNDS: usize = 10;
/// A catch-up round with at most this many changes is the last before the critical section.
const CATCH_UP_THRESHOLD: usize = 16;
/// `maxChunkSizeBytes` the config server sends (mongod's default chunk size, 128 MB).
const MAX_CHUNK_SIZE_BYTES: i64 = 128 * 1024 * 1024;

/// What one shard (or config server) knows of migrations: its critical sections, the ranges
/// it is receiving, the collections it is moving, and its connections to its peers.
#[derive(Debug, Default)]
pub struct Migrations {
    gate: tokio::sync::RwLock<()>,
    critical: Mutex<HashMap<String, tokio::sync::watch::Sender<()>>>,
    incoming: Mutex<HashMap<String, Incoming>>,
    moving: Mutex<HashSet<String>>,
    /// The critical sections a DDL coordinator asked this shard to hold
    /// (`_shardsvrParticipantBlock`), by namespace, with the reason it gave.
    blocks: Mutex<HashMap<String, (Document, CriticalSection)>>,
    peers: Mutex<HashMap<String, mongodb::Client>>,
    /// How connections to peers prove who this server is.
    security: crate::backend::ShardSecurity,
}

/// A range being received: the staged documents by `_id`.
#[derive(Debug)]
struct Incoming {
    session: String,
    range: Range,
    staged: HashMap<Vec<u8>, Document>,
    applied: bool,
    critical: Option<CriticalSection>,
}

/// `[min, max)` of a collection's shard key (the last chunk also holds `MaxKey` itself).
#[derive(Debug, Clone)]
struct Range {
    ns: String,
    pattern: ShardKeyPattern,
    min: ShardKey,
    max: ShardKey,
}

impl Range {
    fn parse(
        ns: &str,
        pattern: &Document,
        min: &Document,
        max: &Document,
    ) -> Result<Range, EngineError> {
        let pattern = ShardKeyPattern::parse(pattern).map_err(routing_error)?;
        let min = pattern.key_from_document(min).map_err(routing_error)?;
        let max = pattern.key_from_document(max).map_err(routing_error)?;
        Ok(Range {
            ns: ns.to_string(),
            pattern,
            min,
            max,
        })
    }

    fn contains(&self, d: &Document) -> bool {
        let Ok(raw) = bson::RawDocumentBuf::try_from(d) else {
            return false;
        };
        let Ok(key) = self.pattern.extract_from_document(&raw) else {
            return false;
        };
        key >= self.min && (key < self.max || self.max == self.pattern.max_key())
    }

    fn db_coll(&self) -> (&str, &str) {
        self.ns.split_once('.').unwrap_or((&self.ns, ""))
    }

    /// The range's documents on this shard, in natural order.
    fn documents(&self, catalog: &Catalog) -> Vec<Document> {
        let (db, coll) = self.db_coll();
        catalog
            .collection(db, coll)
            .map(|c| {
                c.iter()
                    .filter(|(_, d)| self.contains(d))
                    .map(|(_, d)| d.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Deletes the range's documents; returns how many.
    fn delete(&self, catalog: &mut Catalog) -> usize {
        let (db, coll) = self.db_coll();
        let Some(c) = catalog.existing_mut(db, coll) else {
            return 0;
        };
        let rids: Vec<_> = c
            .iter()
            .filter(|(_, d)| self.contains(d))
            .map(|(rid, _)| *rid)
            .collect();
        for rid in &rids {
            c.remove(*rid);
        }
        rids.len()
    }
}

fn routing_error(e: crate::routing::RoutingError) -> EngineError {
    EngineError::new(e.code, e.message)
}

/// A collection's critical section on one shard: while it is held, versioned requests for
/// the collection wait; when it is dropped they go on and are checked against the shard's
/// metadata as it is then.
#[derive(Debug)]
pub struct CriticalSection {
    owner: Arc<Migrations>,
    ns: String,
}

impl Drop for CriticalSection {
    fn drop(&mut self) {
        lock(&self.owner.critical).remove(&self.ns);
    }
}

/// The `_id` of a document as a map key.
fn id_key(id: &Bson) -> Vec<u8> {
    bson::RawDocumentBuf::try_from(&doc! {"_id": id.clone()})
        .map(|r| r.into_bytes())
        .unwrap_or_default()
}

fn driver_error(host: &str, e: mongodb::error::Error) -> EngineError {
    match e.kind.as_ref() {
        mongodb::error::ErrorKind::Command(c) => {
            EngineError::new(ErrorCode(c.code), c.message.clone())
        }
        _ => EngineError::new(
            ErrorCode::HostUnreachable,
            format!("error reaching {host}: {e}"),
        ),
    }
}

/// The connection string of a `config.shards` `host`: a replica set's (`"rs/h1:p,h2:p"`)
/// names the set, so commands go to its current primary, as a mongod shard's commands to
/// another shard do; a single server's (`"h:p"`) connects to it directly.
fn peer_uri(host: &str) -> String {
    const OPTIONS: &str = "serverSelectionTimeoutMS=10000&appName=sluice-migration";
    match host.split_once('/') {
        Some((set, hosts)) => format!("mongodb://{hosts}/?replicaSet={set}&{OPTIONS}"),
        None => format!("mongodb://{host}/?directConnection=true&{OPTIONS}"),
    }
}

impl Migrations {
    /// Migrations whose peer connections authenticate with `security`.
    pub fn with_security(security: crate::backend::ShardSecurity) -> Self {
        Migrations {
            security,
            ..Default::default()
        }
    }

    /// Waits while `ns` is in a critical section, then holds the gate that a critical section
    /// is entered through, so none begins while the request runs.
    pub async fn enter(&self, ns: &str) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.enter_all(&[ns]).await
    }

    /// [`Migrations::enter`] for a request on several namespaces (a `bulkWrite`): waits until
    /// none of them is in a critical section, then holds the gate once for all of them.
    pub async fn enter_all(&self, namespaces: &[&str]) -> tokio::sync::RwLockReadGuard<'_, ()> {
        loop {
            let gate = self.gate.read().await;
            let held = {
                let critical = lock(&self.critical);
                namespaces.iter().find_map(|ns| {
                    // A database's critical section (`movePrimary`) holds every namespace in it.
                    let db = ns.split('.').next().unwrap_or(ns);
                    critical
                        .get(*ns)
                        .or_else(|| critical.get(db))
                        .map(|tx| tx.subscribe())
                })
            };
            match held {
                None => return gate,
                Some(mut rx) => {
                    drop(gate);
                    // Ends when the critical section is dropped (its sender with it).
                    let _ = rx.changed().await;
                }
            }
        }
    }

    /// `_shardsvrParticipantBlock` on this shard: enters the critical section of `ns` for a
    /// DDL coordinator (`block`), or leaves it (`!block`). Asking again with the same `reason`
    /// is answered as the first time (a coordinator may resend); a critical section held for
    /// another reason is ConflictingOperationInProgress (117), whether entering or leaving.
    /// Leaving one that is not held succeeds.
    pub async fn participant_block(
        self: &Arc<Self>,
        ns: &str,
        block: bool,
        reason: &Document,
    ) -> Result<(), EngineError> {
        let conflict = |held: &Document| {
            EngineError::new(
                ErrorCode::ConflictingOperationInProgress,
                format!(
                    "{ns} is in a critical section for another operation: {}",
                    crate::value::render::render_doc(held)
                ),
            )
        };
        if !block {
            let mut blocks = lock(&self.blocks);
            match blocks.get(ns) {
                Some((held, _)) if held != reason => return Err(conflict(held)),
                Some(_) => {
                    // Dropping the critical section lets the requests that waited go on.
                    blocks.remove(ns);
                }
                None => {}
            }
            return Ok(());
        }
        if let Some((held, _)) = lock(&self.blocks).get(ns) {
            return if held == reason {
                Ok(())
            } else {
                Err(conflict(held))
            };
        }
        let critical = self.critical_section(ns).await?;
        lock(&self.blocks).insert(ns.to_string(), (reason.clone(), critical));
        Ok(())
    }

    /// Enters the critical section of `ns`, once every request already running on it ended.
    pub async fn critical_section(
        self: &Arc<Self>,
        ns: &str,
    ) -> Result<CriticalSection, EngineError> {
        let _gate = self.gate.write().await;
        let mut held = lock(&self.critical);
        if held.contains_key(ns) {
            return Err(EngineError::new(
                ErrorCode::ConflictingOperationInProgress,
                format!("{ns} is already in a critical section"),
            ));
        }
        held.insert(ns.to_string(), tokio::sync::watch::channel(()).0);
        Ok(CriticalSection {
            owner: self.clone(),
            ns: ns.to_string(),
        })
    }

    /// Runs `command` on the `admin` database of `host` (a peer shard or config server).
    pub async fn run_on(&self, host: &str, command: Document) -> Result<Document, EngineError> {
        self.run_on_db(host, "admin", command).await
    }

    /// Runs `command` on the database `db` of `host`.
    pub async fn run_on_db(
        &self,
        host: &str,
        db: &str,
        command: Document,
    ) -> Result<Document, EngineError> {
        let cached = lock(&self.peers).get(host).cloned();
        let client = match cached {
            Some(c) => c,
            None => {
                let mut options = mongodb::options::ClientOptions::parse(peer_uri(host))
                    .await
                    .map_err(|e| driver_error(host, e))?;
                crate::metadata::configsvr::loader::secure_client_options(
                    &mut options,
                    &self.security,
                );
                let c =
                    mongodb::Client::with_options(options).map_err(|e| driver_error(host, e))?;
                lock(&self.peers).insert(host.to_string(), c.clone());
                c
            }
        };
        client
            .database(db)
            .run_command(command)
            .await
            .map_err(|e| driver_error(host, e))
    }
}

/// What the donor's migration task needs of its shard.
#[derive(Debug, Clone)]
pub struct Donor {
    /// The shard's data.
    pub catalog: Arc<Mutex<Catalog>>,
    /// The shard's migrations.
    pub migrations: Arc<Migrations>,
    /// The shard's filtering metadata.
    pub filtering: Arc<Filtering>,
    /// The shard's id.
    pub name: String,
    /// The replica-set member running it, when the shard is an embedded replica set.
    pub member: Option<super::replset::MemberLink>,
}

/// `_shardsvrMoveRange` on the donor: runs the migration in its own task (a dropped
/// connection cannot stop it halfway) and answers when it ended.
pub async fn move_range(donor: Donor, body: Document) -> Result<Document, EngineError> {
    const CMD: &str = "_shardsvrMoveRange";
    let ns = string_field(&body, CMD, CMD)?.to_string();
    let to = string_field(&body, CMD, "toShard")?.to_string();
    let from = string_field(&body, CMD, "fromShard")?.to_string();
    let min = object_field(&body, CMD, "min")?.clone();
    let max = object_field(&body, CMD, "max")?.clone();
    if from != donor.name {
        return Err(EngineError::new(
            ErrorCode::IllegalOperation,
            format!("this shard is {}, not the donor {from}", donor.name),
        ));
    }
    match tokio::spawn(donate(donor, ns, to, min, max)).await {
        Ok(r) => r,
        Err(e) => Err(EngineError::new(
            ErrorCode::InternalError,
            format!("the migration task failed: {e}"),
        )),
    }
}

async fn donate(
    d: Donor,
    ns: String,
    to: String,
    min: Document,
    max: Document,
) -> Result<Document, EngineError> {
    let cache = d.filtering.cache().await?;
    d.filtering.flush_collection(&ns);
    let info = cache
        .routing_info(&ns)
        .await
        .map_err(super::filtering::engine_error)?;
    let Some(coll) = info.collection else {
        return Err(EngineError::new(
            ErrorCode::NamespaceNotSharded,
            format!("{ns} is not sharded"),
        ));
    };
    let pattern_doc = coll.snapshot.pattern.to_document();
    let range = Range::parse(&ns, &pattern_doc, &min, &max)?;
    let chunk = coll.snapshot.chunks.find(&range.min).cloned();
    let Some(chunk) = chunk.filter(|c| c.min == range.min && c.max == range.max) else {
        return Err(EngineError::new(
            ErrorCode::IllegalOperation,
            format!("no chunk of {ns} has the bounds {min} - {max}"),
        ));
    };
    if chunk.shard != d.name {
        return Err(EngineError::new(
            ErrorCode::IllegalOperation,
            format!(
                "the chunk {min} - {max} of {ns} is owned by {}, not {}",
                chunk.shard, d.name
            ),
        ));
    }
    let from_version = coll.shard_version(&d.name);
    let recipient = cache
        .shard(&to)
        .await
        .map_err(super::filtering::engine_error)?;
    let host = recipient.host.clone();
    let session = ObjectId::new().to_hex();
    d.migrations
        .run_on(
            &host,
            doc! {
                "_recvChunkStart": &ns, "sessionId": &session, "from": &d.name,
                "min": &min, "max": &max, "shardKeyPattern": &pattern_doc,
                "epoch": coll.snapshot.epoch,
            },
        )
        .await?;
    let result = transfer_and_commit(&d, &range, &host, &session, &to, &chunk, from_version).await;
    match result {
        Ok((reply, critical)) => {
            // Committed: the donor's copy goes, both shards reload, the waiters go on.
            range.delete(&mut lock(&d.catalog));
            d.filtering.flush_collection(&ns);
            if let Err(e) = d
                .migrations
                .run_on(
                    &host,
                    doc! {"_recvChunkReleaseCritSec": &ns, "sessionId": &session},
                )
                .await
            {
                tracing::warn!(ns = %ns, recipient = %to, error = %e.message,
                    "the recipient did not leave its critical section after the commit");
            }
            drop(critical);
            Ok(reply)
        }
        Err(e) => {
            d.filtering.flush_collection(&ns);
            if let Err(abort) = d
                .migrations
                .run_on(&host, doc! {"_recvChunkAbort": &ns, "sessionId": &session})
                .await
            {
                tracing::warn!(ns = %ns, recipient = %to, error = %abort.message,
                    "the recipient did not abort the migration");
            }
            Err(e)
        }
    }
}

/// Clone, catch-up, critical section, the recipient's commit and the config server's.
async fn transfer_and_commit(
    d: &Donor,
    range: &Range,
    host: &str,
    session: &str,
    to: &str,
    chunk: &crate::routing::chunks::Chunk,
    from_version: ShardVersion,
) -> Result<(Document, CriticalSection), EngineError> {
    let mut sent: HashMap<Vec<u8>, Document> = HashMap::new();
    for round in 0..MAX_CATCH_UP_ROUNDS {
        let changes = send_changes(d, range, host, session, &mut sent).await?;
        if round > 0 && changes <= CATCH_UP_THRESHOLD {
            break;
        }
    }
    let critical = d.migrations.critical_section(&range.ns).await?;
    send_changes(d, range, host, session, &mut sent).await?;
    d.migrations
        .run_on(
            host,
            doc! {"_recvChunkCommit": &range.ns, "sessionId": session},
        )
        .await?;
    let commit = doc! {
        "_configsvrCommitChunkMigration": &range.ns,
        "fromShard": &d.name,
        "toShard": to,
        "migratedChunk": {
            "min": range.pattern.key_document(&chunk.min),
            "max": range.pattern.key_document(&chunk.max),
            "lastmod": chunk.version.timestamp(),
        },
        "fromShardCollectionVersion": from_version.to_document(),
        "validAfter": Bson::Timestamp(bson::Timestamp { time: now_secs(), increment: 0 }),
    };
    match d.filtering.run_on_config_server(commit).await {
        Ok(reply) => Ok((reply, critical)),
        Err(e) => {
            // The commit's answer was lost or refused: the config server says who owns it.
            let cache = d.filtering.cache().await?;
            d.filtering.flush_collection(&range.ns);
            let owner = cache
                .routing_info(&range.ns)
                .await
                .ok()
                .and_then(|i| i.collection)
                .and_then(|c| c.snapshot.chunks.find(&range.min).map(|c| c.shard.clone()));
            if owner.as_deref() == Some(to) {
                Ok((Document::new(), critical))
            } else {
                Err(e)
            }
        }
    }
}

pub(super) fn now_secs() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or(0)
}

/// Sends the recipient what changed in the range since `sent`; returns how many changes.
async fn send_changes(
    d: &Donor,
    range: &Range,
    host: &str,
    session: &str,
    sent: &mut HashMap<Vec<u8>, Document>,
) -> Result<usize, EngineError> {
    let now = range.documents(&lock(&d.catalog));
    let mut reload = Vec::new();
    let mut present = HashSet::with_capacity(now.len());
    for doc in now {
        let key = id_key(doc.get("_id").unwrap_or(&Bson::Null));
        present.insert(key.clone());
        if sent.get(&key) != Some(&doc) {
            sent.insert(key, doc.clone());
            reload.push(Bson::Document(doc));
        }
    }
    let gone: Vec<Vec<u8>> = sent
        .keys()
        .filter(|k| !present.contains(*k))
        .cloned()
        .collect();
    let mut deleted = Vec::with_capacity(gone.len());
    for k in gone {
        if let Some(d) = sent.remove(&k) {
            deleted.push(doc! {"_id": d.get("_id").cloned().unwrap_or(Bson::Null)});
        }
    }
    let changes = reload.len() + deleted.len();
    let mut reload = reload.into_iter().peekable();
    let mut deleted = deleted.into_iter().map(Bson::Document).peekable();
    while reload.peek().is_some() || deleted.peek().is_some() {
        let r: Vec<Bson> = reload.by_ref().take(BATCH_DOCUMENTS).collect();
        let x: Vec<Bson> = deleted.by_ref().take(BATCH_DOCUMENTS).collect();
        d.migrations
            .run_on(
                host,
                doc! {"_sluiceRecvChunkMods": &range.ns, "sessionId": session, "reload": r, "deleted": x},
            )
            .await?;
    }
    Ok(changes)
}

/// The recipient's side, for a shard whose data is `catalog`.
impl Migrations {
    fn incoming_for<'a>(
        incoming: &'a mut HashMap<String, Incoming>,
        ns: &str,
        session: &str,
    ) -> Result<&'a mut Incoming, EngineError> {
        incoming
            .get_mut(ns)
            .filter(|i| i.session == session)
            .ok_or_else(|| {
                EngineError::new(
                    ErrorCode::IllegalOperation,
                    format!("no migration of {ns} with session {session} is being received"),
                )
            })
    }

    /// `_recvChunkStart`: opens the staging area of a range.
    pub fn recv_start(&self, body: &Document) -> Result<Document, EngineError> {
        const CMD: &str = "_recvChunkStart";
        let ns = string_field(body, CMD, CMD)?;
        let session = string_field(body, CMD, "sessionId")?;
        let range = Range::parse(
            ns,
            object_field(body, CMD, "shardKeyPattern")?,
            object_field(body, CMD, "min")?,
            object_field(body, CMD, "max")?,
        )?;
        let mut incoming = lock(&self.incoming);
        if incoming.contains_key(ns) {
            return Err(EngineError::new(
                ErrorCode::ConflictingOperationInProgress,
                format!("a migration of {ns} is already being received"),
            ));
        }
        incoming.insert(
            ns.to_string(),
            Incoming {
                session: session.to_string(),
                range,
                staged: HashMap::new(),
                applied: false,
                critical: None,
            },
        );
        Ok(doc! {"started": true})
    }

    /// `_sluiceRecvChunkMods`: documents to (re)load and `_id`s deleted, into the staging area.
    pub fn recv_mods(&self, body: &Document) -> Result<Document, EngineError> {
        const CMD: &str = "_sluiceRecvChunkMods";
        let ns = string_field(body, CMD, CMD)?;
        let session = string_field(body, CMD, "sessionId")?;
        let mut incoming = lock(&self.incoming);
        let inc = Self::incoming_for(&mut incoming, ns, session)?;
        for d in body
            .get_array("reload")
            .map(|a| a.as_slice())
            .unwrap_or(&[])
        {
            if let Bson::Document(d) = d {
                let key = id_key(d.get("_id").unwrap_or(&Bson::Null));
                inc.staged.insert(key, d.clone());
            }
        }
        for d in body
            .get_array("deleted")
            .map(|a| a.as_slice())
            .unwrap_or(&[])
        {
            if let Some(id) = d.as_document().and_then(|d| d.get("_id")) {
                inc.staged.remove(&id_key(id));
            }
        }
        Ok(Document::new())
    }

    /// `_recvChunkCommit`: enters the recipient's critical section and moves the staged
    /// documents into the collection (replacing any stray copy of the range an earlier
    /// aborted migration left).
    pub async fn recv_commit(
        self: &Arc<Self>,
        catalog: &Mutex<Catalog>,
        body: &Document,
    ) -> Result<Document, EngineError> {
        const CMD: &str = "_recvChunkCommit";
        let ns = string_field(body, CMD, CMD)?.to_string();
        let session = string_field(body, CMD, "sessionId")?.to_string();
        Self::incoming_for(&mut lock(&self.incoming), &ns, &session)?;
        let critical = self.critical_section(&ns).await?;
        let mut incoming = lock(&self.incoming);
        let inc = Self::incoming_for(&mut incoming, &ns, &session)?;
        let mut catalog = lock(catalog);
        inc.range.delete(&mut catalog);
        let (db, coll) = inc.range.db_coll();
        let (target, _) = catalog.collection_mut(db, coll);
        for d in inc.staged.values() {
            target.insert(&ns, d.clone())?;
        }
        inc.applied = true;
        inc.critical = Some(critical);
        Ok(doc! {"received": inc.staged.len() as i64})
    }

    /// `_recvChunkAbort`: drops the staging area (and the documents a commit applied).
    pub fn recv_abort(
        &self,
        catalog: &Mutex<Catalog>,
        body: &Document,
    ) -> Result<Document, EngineError> {
        const CMD: &str = "_recvChunkAbort";
        let ns = string_field(body, CMD, CMD)?;
        let session = string_field(body, CMD, "sessionId")?;
        let mut incoming = lock(&self.incoming);
        Self::incoming_for(&mut incoming, ns, session)?;
        if let Some(inc) = incoming.remove(ns) {
            if inc.applied {
                inc.range.delete(&mut lock(catalog));
            }
        }
        Ok(Document::new())
    }

    /// `_recvChunkReleaseCritSec`: the commit is on the config server; the recipient reloads
    /// its metadata and leaves its critical section.
    pub async fn recv_release(
        &self,
        filtering: &Filtering,
        body: &Document,
    ) -> Result<Document, EngineError> {
        const CMD: &str = "_recvChunkReleaseCritSec";
        let ns = string_field(body, CMD, CMD)?.to_string();
        let session = string_field(body, CMD, "sessionId")?.to_string();
        Self::incoming_for(&mut lock(&self.incoming), &ns, &session)?;
        filtering.flush_collection(&ns);
        let done = lock(&self.incoming).remove(&ns);
        drop(done);
        Ok(Document::new())
    }
}

/// The config server's side.
impl Migrations {
    /// `_configsvrMoveRange` (from a router): finds the chunk and its donor in `config.*` and
    /// has the donor move it (`_shardsvrMoveRange`); one migration per collection at a time.
    pub async fn configsvr_move_range(
        &self,
        catalog: &Mutex<Catalog>,
        body: &Document,
    ) -> Result<Document, EngineError> {
        const CMD: &str = "_configsvrMoveRange";
        let ns = string_field(body, CMD, CMD)?.to_string();
        let to = string_field(body, CMD, "toShard")?.to_string();
        let min = object_field(body, CMD, "min")?.clone();
        let max = match body.get("max") {
            None => None,
            Some(_) => Some(object_field(body, CMD, "max")?.clone()),
        };
        let wait_for_delete = body
            .get("waitForDelete")
            .is_some_and(crate::value::field::truthy);
        let (epoch, chunk, donor_host) = {
            let catalog = lock(catalog);
            let docs = |coll: &str| -> Vec<Document> {
                catalog
                    .collection("config", coll)
                    .map(|c| c.iter().map(|(_, d)| d.clone()).collect())
                    .unwrap_or_default()
            };
            let Some(entry) = docs("collections")
                .into_iter()
                .find(|d| d.get_str("_id").ok() == Some(ns.as_str()))
            else {
                return Err(EngineError::new(
                    ErrorCode::NamespaceNotSharded,
                    format!("{ns} is not sharded"),
                ));
            };
            let uuid = entry.get("uuid").cloned().unwrap_or(Bson::Null);
            let epoch = entry.get("lastmodEpoch").cloned().unwrap_or(Bson::Null);
            let chunk = docs("chunks").into_iter().find(|c| {
                c.get("uuid").is_some_and(|u| values_equal(u, &uuid))
                    && c.get("min")
                        .is_some_and(|m| values_equal(m, &Bson::Document(min.clone())))
                    && max.as_ref().is_none_or(|x| {
                        c.get("max")
                            .is_some_and(|m| values_equal(m, &Bson::Document(x.clone())))
                    })
            });
            let Some(chunk) = chunk else {
                return Err(EngineError::new(
                    ErrorCode::InvalidOptions,
                    format!(
                        "no chunk of {ns} has the bounds given ({min}); the embedded config server moves whole chunks only"
                    ),
                ));
            };
            let shards = docs("shards");
            if !shards
                .iter()
                .any(|s| s.get_str("_id").ok() == Some(to.as_str()))
            {
                return Err(EngineError::new(
                    ErrorCode::ShardNotFound,
                    format!("Shard {to} not found"),
                ));
            }
            let from = chunk.get_str("shard").unwrap_or_default().to_string();
            let donor_host = shards
                .iter()
                .find(|s| s.get_str("_id").ok() == Some(from.as_str()))
                .and_then(|s| s.get_str("host").ok())
                .map(str::to_string)
                .ok_or_else(|| {
                    EngineError::new(ErrorCode::ShardNotFound, format!("Shard {from} not found"))
                })?;
            (epoch, chunk, donor_host)
        };
        let from = chunk.get_str("shard").unwrap_or_default().to_string();
        if from == to {
            return Ok(Document::new());
        }
        if !lock(&self.moving).insert(ns.clone()) {
            return Err(EngineError::new(
                ErrorCode::ConflictingOperationInProgress,
                format!("a migration of {ns} is already in progress"),
            ));
        }
        let result = self
            .run_on(
                &donor_host,
                doc! {
                    "_shardsvrMoveRange": &ns,
                    "toShard": &to,
                    "min": chunk.get("min").cloned().unwrap_or(Bson::Null),
                    "max": chunk.get("max").cloned().unwrap_or(Bson::Null),
                    "waitForDelete": wait_for_delete,
                    "epoch": epoch,
                    "fromShard": &from,
                    "maxChunkSizeBytes": MAX_CHUNK_SIZE_BYTES,
                    "forceJumbo": 0,
                    "secondaryThrottle": false,
                    "writeConcern": {"w": "majority"},
                },
            )
            .await;
        lock(&self.moving).remove(&ns);
        result.map(|_| Document::new())
    }
}

/// `_configsvrCommitChunkMigration` (from the donor): the moved chunk goes to the recipient at
/// `(max major + 1)|0`, one chunk the donor keeps to `(max major + 1)|1`; replies with the
/// donor's new placement version.
pub fn commit_chunk_migration(
    catalog: &Mutex<Catalog>,
    body: &Document,
    now: bson::Timestamp,
) -> Result<Document, EngineError> {
    const CMD: &str = "_configsvrCommitChunkMigration";
    let ns = string_field(body, CMD, CMD)?;
    let from = string_field(body, CMD, "fromShard")?;
    let to = string_field(body, CMD, "toShard")?;
    let moved = object_field(body, CMD, "migratedChunk")?;
    let min = moved.get("min").cloned().unwrap_or(Bson::Null);
    let max = moved.get("max").cloned().unwrap_or(Bson::Null);
    let from_version = object_field(body, CMD, "fromShardCollectionVersion")?;
    let mut catalog = lock(catalog);
    let entry = catalog
        .collection("config", "collections")
        .and_then(|c| {
            c.iter()
                .map(|(_, d)| d)
                .find(|d| d.get_str("_id").ok() == Some(ns))
                .cloned()
        })
        .ok_or_else(|| {
            EngineError::new(ErrorCode::NamespaceNotFound, format!("{ns} is not tracked"))
        })?;
    let epoch = entry.get("lastmodEpoch").cloned().unwrap_or(Bson::Null);
    let timestamp = entry.get("timestamp").cloned().unwrap_or(Bson::Null);
    if !from_version
        .get("e")
        .is_some_and(|e| values_equal(e, &epoch))
    {
        return Err(EngineError::new(
            ErrorCode::StaleEpoch,
            format!("{ns} was dropped or recreated while its chunk was moving"),
        ));
    }
    let uuid = entry.get("uuid").cloned().unwrap_or(Bson::Null);
    let chunks = catalog.existing_mut("config", "chunks").ok_or_else(|| {
        EngineError::new(ErrorCode::NamespaceNotFound, format!("{ns} has no chunks"))
    })?;
    let mine: Vec<_> = chunks
        .iter()
        .filter(|(_, d)| d.get("uuid").is_some_and(|u| values_equal(u, &uuid)))
        .map(|(rid, d)| (*rid, d.clone()))
        .collect();
    let major = mine
        .iter()
        .filter_map(|(_, d)| d.get_timestamp("lastmod").ok())
        .map(|t| t.time)
        .max()
        .unwrap_or(0);
    let Some((rid, chunk)) = mine.iter().find(|(_, d)| {
        d.get("min").is_some_and(|m| values_equal(m, &min))
            && d.get("max").is_some_and(|m| values_equal(m, &max))
    }) else {
        return Err(EngineError::new(
            ErrorCode::ConflictingOperationInProgress,
            format!("the chunk being moved of {ns} is no longer in config.chunks"),
        ));
    };
    if chunk.get_str("shard").ok() != Some(from) {
        return Err(EngineError::new(
            ErrorCode::ConflictingOperationInProgress,
            format!("the chunk being moved of {ns} is no longer on {from}"),
        ));
    }
    let moved_version = bson::Timestamp {
        time: major + 1,
        increment: 0,
    };
    let mut updated = chunk.clone();
    let mut history = vec![Bson::Document(doc! {"validAfter": now, "shard": to})];
    if let Ok(h) = chunk.get_array("history") {
        history.extend(h.iter().cloned());
    }
    updated.insert("shard", to);
    updated.insert("lastmod", moved_version);
    updated.insert("onCurrentShardSince", now);
    updated.insert("history", history);
    chunks.replace("config.chunks", *rid, updated)?;
    // The donor's highest chunk, if it keeps one, carries its new placement version.
    let control = mine
        .iter()
        .filter(|(r, d)| *r != *rid && d.get_str("shard").ok() == Some(from))
        .max_by_key(|(_, d)| {
            d.get_timestamp("lastmod")
                .map(|t| (t.time, t.increment))
                .unwrap_or((0, 0))
        });
    let donor_version = match control {
        Some((crid, c)) => {
            let v = bson::Timestamp {
                time: major + 1,
                increment: 1,
            };
            let mut c = c.clone();
            c.insert("lastmod", v);
            chunks.replace("config.chunks", *crid, c)?;
            v
        }
        None => bson::Timestamp {
            time: 0,
            increment: 0,
        },
    };
    Ok(doc! {"shardVersion": {"e": epoch, "t": timestamp, "v": donor_version}})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a request on `namespaces` is let through within 50 ms.
    async fn enters(m: &Migrations, namespaces: &[&str]) -> bool {
        tokio::time::timeout(
            std::time::Duration::from_millis(50),
            m.enter_all(namespaces),
        )
        .await
        .is_ok()
    }

    #[tokio::test]
    async fn a_participant_block_holds_its_namespace_until_released_for_the_same_reason() {
        let m = Arc::new(Migrations::default());
        let rename = doc! {"command": "rename", "from": "d.c", "to": "d.t"};
        let other = doc! {"command": "dropCollection", "ns": "d.c"};
        m.participant_block("d.c", true, &rename).await.unwrap();
        assert!(enters(&m, &["d.x"]).await, "another collection goes on");
        assert!(
            !enters(&m, &["d.x", "d.c"]).await,
            "a bulkWrite naming it waits"
        );
        // The same reason again is answered as the first time; another is refused.
        m.participant_block("d.c", true, &rename).await.unwrap();
        for block in [true, false] {
            let e = m.participant_block("d.c", block, &other).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::ConflictingOperationInProgress);
        }
        let waiter = {
            let m = m.clone();
            tokio::spawn(async move {
                drop(m.enter_all(&["d.c"]).await);
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "a request on it waits");
        m.participant_block("d.c", false, &rename).await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("released")
            .unwrap();
        // Leaving what is not held succeeds (a coordinator resends).
        m.participant_block("d.c", false, &rename).await.unwrap();
        assert!(enters(&m, &["d.c"]).await);
    }

    #[tokio::test]
    async fn a_database_block_holds_every_collection_of_the_database() {
        let m = Arc::new(Migrations::default());
        let reason = doc! {"command": "dropDatabase", "db": "d"};
        m.participant_block("d", true, &reason).await.unwrap();
        assert!(!enters(&m, &["d.c"]).await);
        assert!(!enters(&m, &["e.c", "d.z"]).await);
        assert!(enters(&m, &["e.c"]).await, "another database goes on");
        m.participant_block("d", false, &reason).await.unwrap();
        assert!(enters(&m, &["d.c"]).await);
    }
}
