//! Reads on sharded collections: `find`, `aggregate`, `count`, `distinct`, with router-side
//! cursors (`getMore`, `killCursors`).
//!
//! A filter that pins the shard key goes to the owning shards, any other to every shard owning
//! chunks. `find` sends the sort, `limit + skip` and (when it keeps the sort fields) the
//! projection to each shard, k-way merges the shards' sorted results in MongoDB's order and
//! applies `skip` and `limit`, pulling a shard cursor's next batch only when a `getMore` needs
//! it, so memory is bounded by one batch per shard; `allowPartialResults` skips a shard that
//! cannot be reached.
//! `aggregate` splits the pipeline at its first stage that needs all the data
//! ([`merge::split_pipeline`]): the shard part runs on each shard, the router gathers the shard
//! parts into memory, merges them (sorted merge, `$group` re-grouping) and runs the rest, so an
//! aggregation's result is bounded by what the router can hold. `count` and `distinct` are merged. Results are served
//! through router cursors, reaped after 10 idle minutes together with their shard cursors.

pub mod foreign;
pub mod merge;

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use bson::{doc, Bson, Document};

use crate::backend::limiter::{OpKind, Outcome};
use crate::backend::BackendError;
use crate::cluster::{Cluster, SlotRequest};
use crate::command::{CommandError, CommandRequest};
use crate::engine::query::{Projection, SortSpec};
use crate::routing::{FilterKeys, RoutingSnapshot};
use crate::value::error_codes::ErrorCode;
use crate::value::field::{number_field, truthy};

/// Default first-batch size, as mongod and mongos.
const DEFAULT_BATCH: usize = 101;

fn engine_err(e: crate::engine::EngineError) -> CommandError {
    CommandError::new(e.code, e.message)
}

/// The filter of a pipeline's leading `$match` (empty when it has none): what targets it.
pub(crate) fn leading_match(pipeline: &[Bson]) -> Document {
    pipeline
        .first()
        .and_then(|s| s.as_document())
        .and_then(|s| s.get_document("$match").ok())
        .cloned()
        .unwrap_or_default()
}

/// The shards a filter must be sent to.
pub(crate) fn target_shards(snap: &RoutingSnapshot, filter: &Document) -> Vec<String> {
    match snap.pattern.extract_from_filter(filter) {
        FilterKeys::Keys(keys) => {
            let mut shards: Vec<String> = keys
                .iter()
                .filter_map(|k| snap.shard_for(k).map(|s| s.to_string()))
                .collect();
            shards.sort();
            shards.dedup();
            shards
        }
        FilterKeys::Untargetable => snap.chunks.shards().into_iter().collect(),
    }
}

/// Why a read on one shard failed.
enum ReadFailure {
    /// The shard could not be reached: what `allowPartialResults` may skip.
    Unreachable(CommandError),
    /// No slot was granted in time: the command never reached the shard.
    NotRun(CommandError),
    /// The shard answered with an error.
    Refused(CommandError),
}

impl ReadFailure {
    fn into_error(self) -> CommandError {
        match self {
            ReadFailure::Unreachable(e) | ReadFailure::NotRun(e) | ReadFailure::Refused(e) => e,
        }
    }
}

/// Runs one read command on a shard (`ns` names the collection it reads) once the shard's
/// queue and adaptive limit grant a slot, and returns the shard's `{ok: 1}` reply.
async fn read_on(
    cluster: &Cluster,
    shard: &str,
    ns: &str,
    cmd: &Document,
) -> Result<Document, ReadFailure> {
    let name = cmd.keys().next().map(String::as_str).unwrap_or_default();
    let work = SlotRequest {
        op: OpKind::Read,
        command: name,
        ns,
        operations: 1,
        bytes: 0,
    };
    let permit = cluster.slot(shard, work, None).await.map_err(|e| {
        ReadFailure::NotRun(CommandError::new(
            ErrorCode::ExceededTimeLimit,
            e.to_string(),
        ))
    })?;
    let result = cluster.run_on(shard, cmd).await;
    if let Some(p) = permit {
        p.finish(match &result {
            Ok(_) => Outcome::Completed,
            Err(BackendError::Timeout(_)) => Outcome::TimedOut,
            Err(_) => Outcome::NotCounted,
        });
    }
    let reply = result.map_err(|e| {
        ReadFailure::Unreachable(CommandError::new(e.code(), format!("{e} (shard {shard})")))
    })?;
    if reply.get_f64("ok").ok() != Some(1.0) {
        return Err(ReadFailure::Refused(CommandError::from_shard_reply(
            shard, &reply,
        )));
    }
    Ok(reply)
}

/// Runs one read command on a shard through its queue, as every shard read does, for readers
/// outside this module (the write path's lookups): the shard's `{ok: 1}` reply or the error.
pub async fn read_one(
    cluster: &Cluster,
    shard: &str,
    ns: &str,
    cmd: &Document,
) -> Result<Document, CommandError> {
    read_on(cluster, shard, ns, cmd)
        .await
        .map_err(ReadFailure::into_error)
}

/// One shard's cursor as the router sees it: what it has buffered and whether more remains.
#[derive(Debug)]
struct ShardStream {
    shard: String,
    cursor_id: i64,
    buffer: VecDeque<Document>,
}

/// Sends a cursor-returning command to each of `shards` at once and keeps each shard's first
/// batch and cursor. With `partial`, a shard that cannot be reached is skipped (and reported).
async fn open_streams(
    cluster: &Cluster,
    snap: &RoutingSnapshot,
    shards: Vec<String>,
    db: &str,
    coll: &str,
    command: &Document,
    partial: bool,
) -> Result<(Vec<ShardStream>, bool), CommandError> {
    let mut futures = Vec::new();
    for shard in shards {
        let mut cmd = command.clone();
        cmd.insert("$db", db);
        if cluster.is_shard_server(&shard) {
            cmd.insert("shardVersion", snap.shard_version(&shard));
        }
        futures.push(async move {
            let reply = read_on(cluster, &shard, &format!("{db}.{coll}"), &cmd).await?;
            let cursor = reply.get_document("cursor").cloned().unwrap_or_default();
            Ok(ShardStream {
                buffer: cursor
                    .get_array("firstBatch")
                    .into_iter()
                    .flatten()
                    .filter_map(|d| d.as_document().cloned())
                    .collect(),
                cursor_id: cursor.get_i64("id").unwrap_or(0),
                shard,
            })
        });
    }
    let mut streams = Vec::new();
    let mut skipped = false;
    let mut failure = None;
    for r in crate::backend::join_all(futures).await {
        match r {
            Ok(s) => streams.push(s),
            Err(ReadFailure::Unreachable(_)) if partial => skipped = true,
            Err(f) => failure = failure.or(Some(f.into_error())),
        }
    }
    if let Some(e) = failure {
        kill_streams(cluster, db, coll, &streams).await;
        return Err(e);
    }
    Ok((streams, skipped))
}

/// Fetches the next batch of a shard cursor into its buffer.
async fn pull(
    cluster: &Cluster,
    db: &str,
    coll: &str,
    stream: &mut ShardStream,
    batch: usize,
) -> Result<(), CommandError> {
    let cmd = doc! {"getMore": stream.cursor_id, "collection": coll, "batchSize": batch.clamp(1, 100_000) as i64, "$db": db};
    let more = match read_on(cluster, &stream.shard, &format!("{db}.{coll}"), &cmd).await {
        Ok(more) => more,
        Err(ReadFailure::Refused(e)) => {
            // The shard answered with an error: its cursor is gone.
            stream.cursor_id = 0;
            return Err(e);
        }
        Err(f) => return Err(f.into_error()),
    };
    let c = more.get_document("cursor").cloned().unwrap_or_default();
    stream.buffer.extend(
        c.get_array("nextBatch")
            .into_iter()
            .flatten()
            .filter_map(|d| d.as_document().cloned()),
    );
    stream.cursor_id = c.get_i64("id").unwrap_or(0);
    Ok(())
}

/// Kills the shard cursors of streams that still have one.
async fn kill_streams(cluster: &Cluster, db: &str, coll: &str, streams: &[ShardStream]) {
    let futures = streams
        .iter()
        .filter(|s| s.cursor_id != 0)
        .map(|s| async move {
            let _ = cluster
                .run_on(
                    &s.shard,
                    &doc! {"killCursors": coll, "cursors": [s.cursor_id], "$db": db},
                )
                .await;
        });
    crate::backend::join_all(futures).await;
}

/// Every document of each stream (aggregations whose router part needs all of them), at most
/// `limit` bytes of them together: past it the aggregation fails with 292 and the shard
/// cursors still open are killed, so one aggregation cannot make the router hold more.
async fn drain(
    cluster: &Cluster,
    db: &str,
    coll: &str,
    streams: Vec<ShardStream>,
    limit: usize,
) -> Result<Vec<Vec<Document>>, CommandError> {
    let held = std::sync::atomic::AtomicUsize::new(0);
    let count = |docs: &[Document]| -> Result<(), CommandError> {
        let bytes: usize = docs.iter().map(|d| crate::limits::measure(d).bytes).sum();
        let total = held.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed) + bytes;
        if total > limit {
            return Err(CommandError::new(
                ErrorCode::QueryExceededMemoryLimitNoDiskUseAllowed,
                format!("Exceeded memory limit of {limit} bytes gathering the shards' results at the router"),
            ));
        }
        Ok(())
    };
    let futures = streams.into_iter().map(|mut s| {
        let count = &count;
        async move {
            let result = async {
                count(s.buffer.make_contiguous())?;
                while s.cursor_id != 0 {
                    let before = s.buffer.len();
                    pull(cluster, db, coll, &mut s, 10_000).await?;
                    count(&s.buffer.make_contiguous()[before..])?;
                }
                Ok::<_, CommandError>(())
            }
            .await;
            match result {
                Ok(()) => Ok(s.buffer.into_iter().collect::<Vec<_>>()),
                Err(e) => {
                    kill_streams(cluster, db, coll, std::slice::from_ref(&s)).await;
                    Err(e)
                }
            }
        }
    });
    crate::backend::join_all(futures)
        .await
        .into_iter()
        .collect()
}

/// A router cursor's merge over shard cursors, pulled as needed.
#[derive(Debug)]
struct Merge {
    db: String,
    coll: String,
    streams: Vec<ShardStream>,
    sort: SortSpec,
    skip: usize,
    limit: Option<usize>,
    served: usize,
    projection: Option<Projection>,
}

impl Merge {
    /// Up to `n` more documents, in MongoDB's order when sorted; `true` once exhausted.
    async fn next_batch(
        &mut self,
        cluster: &Cluster,
        n: usize,
    ) -> Result<(Vec<Document>, bool), CommandError> {
        let mut out = Vec::new();
        loop {
            if self.limit.is_some_and(|l| self.served >= l) {
                return Ok((out, true));
            }
            if out.len() >= n {
                return Ok((out, false));
            }
            // Every stream that still has documents must show its head before one is chosen.
            let needs_refill = |s: &ShardStream| s.buffer.is_empty() && s.cursor_id != 0;
            if self.streams.iter().any(needs_refill) {
                let want = n.saturating_sub(out.len()).max(1) + self.skip;
                let (db, coll) = (&self.db, &self.coll);
                let refills = self
                    .streams
                    .iter_mut()
                    .filter(|s| needs_refill(s))
                    .map(|s| pull(cluster, db, coll, s, want));
                for r in crate::backend::join_all(refills).await {
                    r?;
                }
            }
            self.streams
                .retain(|s| !s.buffer.is_empty() || s.cursor_id != 0);
            if self.streams.is_empty() {
                return Ok((out, true));
            }
            let pick = if self.sort.is_empty() {
                0
            } else {
                let mut best = 0;
                for i in 1..self.streams.len() {
                    if let (Some(a), Some(b)) = (
                        self.streams[i].buffer.front(),
                        self.streams[best].buffer.front(),
                    ) {
                        if self.sort.compare(a, b) == std::cmp::Ordering::Less {
                            best = i;
                        }
                    }
                }
                best
            };
            let Some(doc) = self.streams[pick].buffer.pop_front() else {
                continue;
            };
            if self.skip > 0 {
                self.skip -= 1;
                continue;
            }
            self.served += 1;
            out.push(match &self.projection {
                Some(p) => p.apply(&doc),
                None => doc,
            });
        }
    }
}

/// Where a router cursor's documents come from.
#[derive(Debug)]
enum Source {
    /// Results computed at the router (aggregations with a router part).
    Buffered(VecDeque<Document>),
    /// Shard cursors merged as the client asks for more.
    Streams(Box<Merge>),
}

/// A cursor the router serves.
#[derive(Debug)]
struct RouterCursor {
    ns: String,
    source: Source,
    owner: i64,
    last_used: std::time::Instant,
}

/// Most cursors the router keeps open; one more first reaps idle cursors, then closes the
/// least recently used.
pub const MAX_ROUTER_CURSORS: usize = 10_000;

/// Bytes of results the router's cursors may buffer together (aggregations computed at the
/// router); past it the least recently used buffered cursors are closed.
pub const MAX_BUFFERED_CURSOR_BYTES: usize = 1024 * 1024 * 1024;

/// The router's open cursors on sharded collections.
#[derive(Debug)]
pub struct RouterCursors {
    cursors: Mutex<HashMap<i64, RouterCursor>>,
    idle_timeout: Mutex<std::time::Duration>,
}

impl Default for RouterCursors {
    fn default() -> Self {
        RouterCursors {
            cursors: Mutex::new(HashMap::new()),
            idle_timeout: Mutex::new(std::time::Duration::from_secs(600)),
        }
    }
}

/// Bytes a cursor's buffered documents take (0 for cursors streaming from shards, whose
/// buffers are one batch per shard).
fn buffered_bytes(c: &RouterCursor) -> usize {
    match &c.source {
        Source::Buffered(docs) => docs.iter().map(|d| crate::limits::measure(d).bytes).sum(),
        Source::Streams(_) => 0,
    }
}

impl RouterCursors {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, RouterCursor>> {
        self.cursors.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes how long an unused cursor lives (10 minutes by default).
    pub fn set_idle_timeout(&self, t: std::time::Duration) {
        *self.idle_timeout.lock().unwrap_or_else(|p| p.into_inner()) = t;
    }

    /// Open cursors.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no cursor is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes every cursor `owner` (a client connection) opened, with their shard cursors.
    pub async fn close_owner(&self, cluster: &Cluster, owner: i64) {
        let gone: Vec<RouterCursor> = {
            let mut cursors = self.lock();
            let ids: Vec<i64> = cursors
                .iter()
                .filter(|(_, c)| c.owner == owner)
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter()
                .filter_map(|id| cursors.remove(&id))
                .collect()
        };
        close_all(cluster, gone).await;
    }

    /// Makes room for a new cursor holding `bytes` of buffered results: reaps idle cursors,
    /// then closes the least recently used until both the count and the buffered bytes fit.
    async fn make_room(&self, cluster: &Cluster, bytes: usize) {
        self.reap(cluster).await;
        let evicted: Vec<RouterCursor> = {
            let mut cursors = self.lock();
            let mut held: usize = cursors.values().map(buffered_bytes).sum();
            let mut evicted = Vec::new();
            while !cursors.is_empty()
                && (cursors.len() >= MAX_ROUTER_CURSORS
                    || (bytes > 0 && held + bytes > MAX_BUFFERED_CURSOR_BYTES))
            {
                let oldest = cursors
                    .iter()
                    .filter(|(_, c)| cursors.len() >= MAX_ROUTER_CURSORS || buffered_bytes(c) > 0)
                    .min_by_key(|(_, c)| c.last_used)
                    .map(|(id, _)| *id);
                let Some(c) = oldest.and_then(|id| cursors.remove(&id)) else {
                    break;
                };
                held = held.saturating_sub(buffered_bytes(&c));
                evicted.push(c);
            }
            evicted
        };
        if !evicted.is_empty() {
            tracing::info!(
                closed = evicted.len(),
                "router cursor table full: closed the least recently used cursors"
            );
        }
        close_all(cluster, evicted).await;
    }

    /// Drops cursors unused for longer than the idle timeout and kills their shard cursors.
    pub async fn reap(&self, cluster: &Cluster) {
        let timeout = *self.idle_timeout.lock().unwrap_or_else(|p| p.into_inner());
        let expired: Vec<RouterCursor> = {
            let mut cursors = self.lock();
            let ids: Vec<i64> = cursors
                .iter()
                .filter(|(_, c)| c.last_used.elapsed() >= timeout)
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter()
                .filter_map(|id| cursors.remove(&id))
                .collect()
        };
        close_all(cluster, expired).await;
    }

    /// Serves the first batch of `source` and keeps the rest as a cursor unless `single`.
    async fn open(
        &self,
        cluster: &Cluster,
        ns: String,
        mut source: Source,
        batch: usize,
        single: bool,
        owner: i64,
    ) -> Result<Document, CommandError> {
        let (first, exhausted) = match &mut source {
            Source::Buffered(docs) => {
                let take = batch.min(docs.len());
                let first: Vec<Document> = docs.drain(..take).collect();
                let done = docs.is_empty();
                (first, done)
            }
            Source::Streams(m) => m.next_batch(cluster, batch).await?,
        };
        let first: Vec<Bson> = first.into_iter().map(Bson::Document).collect();
        let id = if exhausted || single {
            if let Source::Streams(m) = &source {
                kill_streams(cluster, &m.db, &m.coll, &m.streams).await;
            }
            0i64
        } else {
            let bytes = match &source {
                Source::Buffered(docs) => {
                    docs.iter().map(|d| crate::limits::measure(d).bytes).sum()
                }
                Source::Streams(_) => 0,
            };
            self.make_room(cluster, bytes).await;
            let mut cursors = self.lock();
            let id = crate::value::field::new_cursor_id(|id| cursors.contains_key(&id));
            cursors.insert(
                id,
                RouterCursor {
                    ns: ns.clone(),
                    source,
                    owner,
                    last_used: std::time::Instant::now(),
                },
            );
            id
        };
        Ok(doc! {"cursor": {"firstBatch": first, "id": id, "ns": ns}})
    }

    /// `getMore` on a router cursor; a cursor belongs to the connection that opened it.
    pub async fn get_more(
        &self,
        cluster: &Cluster,
        req: &CommandRequest,
        owner: i64,
    ) -> Result<Document, CommandError> {
        let body = req.body_document();
        let Some(Bson::Int64(id)) = body.get("getMore").cloned() else {
            return Err(CommandError::new(
                ErrorCode::TypeMismatch,
                "BSON field 'getMore.getMore' is the wrong type, expected type 'long'",
            ));
        };
        let ns = format!("{}.{}", req.db, body.get_str("collection").unwrap_or(""));
        let batch = number_field(&body, "batchSize")
            .filter(|b| *b > 0)
            .map(|b| b as usize)
            .unwrap_or(usize::MAX);
        self.reap(cluster).await;
        let mut cursor = {
            let mut cursors = self.lock();
            match cursors.get(&id) {
                Some(c) if c.owner == owner => {
                    if c.ns != ns {
                        return Err(CommandError::new(
                            ErrorCode::Unauthorized,
                            format!("Requested getMore on namespace '{ns}', but cursor belongs to a different namespace {}", c.ns),
                        ));
                    }
                }
                _ => {
                    return Err(CommandError::new(
                        ErrorCode::CursorNotFound,
                        format!("cursor id {id} not found"),
                    ));
                }
            }
            match cursors.remove(&id) {
                Some(c) => c,
                None => {
                    return Err(CommandError::new(
                        ErrorCode::CursorNotFound,
                        format!("cursor id {id} not found"),
                    ))
                }
            }
        };
        let (next, exhausted) = match &mut cursor.source {
            Source::Buffered(docs) => {
                let take = batch.min(docs.len());
                let next: Vec<Document> = docs.drain(..take).collect();
                let done = docs.is_empty();
                (next, done)
            }
            Source::Streams(m) => m.next_batch(cluster, batch.min(100_000)).await?,
        };
        let next_id = if exhausted {
            0
        } else {
            cursor.last_used = std::time::Instant::now();
            self.lock().insert(id, cursor);
            id
        };
        let next: Vec<Bson> = next.into_iter().map(Bson::Document).collect();
        Ok(doc! {"cursor": {"nextBatch": next, "id": next_id, "ns": ns}})
    }

    /// `killCursors` on router cursors (their shard cursors are killed too).
    pub async fn kill(&self, cluster: &Cluster, req: &CommandRequest, owner: i64) -> Document {
        let body = req.body_document();
        let mut killed = Vec::new();
        let mut not_found = Vec::new();
        let mut gone = Vec::new();
        {
            let mut cursors = self.lock();
            for id in body.get_array("cursors").into_iter().flatten() {
                if let Bson::Int64(id) = id {
                    if cursors.get(id).is_some_and(|c| c.owner == owner) {
                        if let Some(c) = cursors.remove(id) {
                            gone.push(c);
                        }
                        killed.push(*id);
                    } else {
                        not_found.push(*id);
                    }
                }
            }
        }
        for c in gone {
            if let Source::Streams(m) = c.source {
                kill_streams(cluster, &m.db, &m.coll, &m.streams).await;
            }
        }
        doc! {"cursorsKilled": killed, "cursorsNotFound": not_found, "cursorsAlive": [], "cursorsUnknown": []}
    }
}

/// Closes cursors: kills the shard cursors of those that stream from shards.
async fn close_all(cluster: &Cluster, cursors: Vec<RouterCursor>) {
    for c in cursors {
        if let Source::Streams(m) = c.source {
            kill_streams(cluster, &m.db, &m.coll, &m.streams).await;
        }
    }
}

/// Runs a plain command (`count`, `distinct`) on each targeted shard.
async fn on_each(
    cluster: &Cluster,
    snap: &RoutingSnapshot,
    shards: Vec<String>,
    db: &str,
    command: &Document,
) -> Result<Vec<Document>, CommandError> {
    let mut out = Vec::new();
    let futures: Vec<_> = shards
        .into_iter()
        .map(|shard| {
            let mut cmd = command.clone();
            cmd.insert("$db", db);
            if cluster.is_shard_server(&shard) {
                cmd.insert("shardVersion", snap.shard_version(&shard));
            }
            let ns = format!(
                "{db}.{}",
                command
                    .values()
                    .next()
                    .and_then(Bson::as_str)
                    .unwrap_or_default()
            );
            async move {
                read_on(cluster, &shard, &ns, &cmd)
                    .await
                    .map_err(ReadFailure::into_error)
            }
        })
        .collect();
    for r in crate::backend::join_all(futures).await {
        out.push(r?);
    }
    Ok(out)
}

fn doc_field(body: &Document, field: &str, cmd: &str) -> Result<Document, CommandError> {
    match body.get(field) {
        None | Some(Bson::Null) => Ok(Document::new()),
        Some(Bson::Document(d)) => Ok(d.clone()),
        Some(_) => Err(CommandError::new(
            ErrorCode::TypeMismatch,
            format!("BSON field '{cmd}.{field}' is the wrong type, expected type 'object'"),
        )),
    }
}

/// Serves a read on a sharded collection; `None` if the command is not a read the router
/// handles.
pub async fn read(
    cluster: &Cluster,
    cursors: &RouterCursors,
    primaries: &dyn foreign::Primaries,
    snap: &RoutingSnapshot,
    req: &CommandRequest,
    owner: i64,
) -> Option<Result<Document, CommandError>> {
    let body = req.body_document();
    let coll = body.get_str(&req.name).unwrap_or("").to_string();
    let db = req.db.clone();
    let ns = format!("{db}.{coll}");
    cursors.reap(cluster).await;
    Some(match req.name.as_str() {
        "find" => async {
            let filter = doc_field(&body, "filter", "find")?;
            let sort_doc = doc_field(&body, "sort", "find")?;
            let sort = SortSpec::parse(&sort_doc).map_err(engine_err)?;
            let projection_doc = doc_field(&body, "projection", "find")?;
            let projection = Projection::parse(&projection_doc).map_err(engine_err)?;
            let skip = number_field(&body, "skip").unwrap_or(0).max(0) as usize;
            let mut single = body.get("singleBatch").is_some_and(truthy);
            let limit = match number_field(&body, "limit") {
                Some(l) if l < 0 => {
                    single = true;
                    Some(l.unsigned_abs() as usize)
                }
                Some(0) | None => None,
                Some(l) => Some(l as usize),
            };
            let partial = body.get("allowPartialResults").is_some_and(truthy);
            // The projection goes to the shards when the router does not need the fields it
            // drops to sort.
            let push_projection = projection.is_some()
                && sort_doc.keys().all(|k| {
                    let p = Projection::parse(&projection_doc).ok().flatten();
                    p.is_some_and(|p| p.apply(&doc! {k.clone(): 1}).contains_key(k.as_str()))
                });
            let batch = number_field(&body, "batchSize").map(|b| b.max(0) as usize).unwrap_or(DEFAULT_BATCH);
            let first = if single { limit.unwrap_or(usize::MAX) } else { batch };
            // Each shard's first batch covers what the router's first batch may need.
            let shard_batch = first.min(100_000).saturating_add(skip).clamp(1, 100_000) as i64;
            let mut shard_cmd = doc! {"find": &coll, "filter": filter.clone(), "batchSize": shard_batch};
            if !sort_doc.is_empty() {
                shard_cmd.insert("sort", sort_doc.clone());
            }
            if let Some(l) = limit {
                shard_cmd.insert("limit", i64::try_from(l.saturating_add(skip)).unwrap_or(i64::MAX));
            }
            if push_projection {
                shard_cmd.insert("projection", projection_doc.clone());
            }
            for k in ["collation", "hint", "maxTimeMS", "comment", "readConcern", "let"] {
                if let Some(v) = body.get(k) {
                    shard_cmd.insert(k, v.clone());
                }
            }
            let (streams, skipped) = open_streams(cluster, snap, target_shards(snap, &filter), &db, &coll, &shard_cmd, partial).await?;
            let merge = Merge {
                db: db.clone(),
                coll: coll.clone(),
                streams,
                sort,
                skip,
                limit,
                served: 0,
                projection: if push_projection { None } else { projection },
            };
            let mut reply = cursors
                .open(cluster, ns.clone(), Source::Streams(Box::new(merge)), first, single, owner)
                .await?;
            if skipped {
                if let Ok(c) = reply.get_document_mut("cursor") {
                    c.insert("partialResultsReturned", true);
                }
            }
            Ok(reply)
        }
        .await,
        "aggregate" => async {
            let pipeline = body.get_array("pipeline").cloned().map_err(|_| {
                CommandError::new(ErrorCode::TypeMismatch, "'pipeline' option must be specified as an array")
            })?;
            if body.get("cursor").is_none() && !body.get("explain").is_some_and(truthy) {
                return Err(CommandError::new(ErrorCode::FailedToParse, "The 'cursor' option is required, except for aggregate with the explain argument"));
            }
            let (stages, output) = crate::engine::output::split_output(&pipeline, &db).map_err(engine_err)?;
            let split = merge::split_pipeline(stages);
            let filter = leading_match(stages);
            let mut shard_cmd = doc! {"aggregate": &coll, "pipeline": split.shard_part.clone(), "cursor": {"batchSize": 10_000}};
            if let Some(l) = body.get("let") {
                shard_cmd.insert("let", l.clone());
            }
            let (streams, _) = open_streams(cluster, snap, target_shards(snap, &filter), &db, &coll, &shard_cmd, false).await?;
            let stage_memory = cluster.stage_memory();
            let streams = drain(cluster, &db, &coll, streams, stage_memory).await?;
            let merged = match &split.merge_sort {
                Some(sort) => merge::k_way_merge(&SortSpec::parse(sort).map_err(engine_err)?, streams),
                None => streams.into_iter().flatten().collect(),
            };
            let options = crate::engine::aggregate::AggregateOptions::for_request(stage_memory, &body);
            let mut prefetched = foreign::Prefetched::default();
            for c in foreign::foreign_collections(&split.router_part) {
                let docs = foreign::fetch(cluster, primaries, &db, &c, stage_memory).await?;
                prefetched.0.insert((db.clone(), c), docs);
            }
            let vars = match body.get_document("let") {
                Ok(l) => crate::engine::aggregate::Variables::new().with_let(l, &Document::new()).map_err(engine_err)?,
                Err(_) => crate::engine::aggregate::Variables::new(),
            };
            let env = crate::engine::aggregate::Env { db: db.clone(), vars, namespaces: Some(&prefetched) };
            let out = crate::engine::aggregate::run_in(&split.router_part, merged, &options, &env).map_err(engine_err)?;
            let out = match (&output, pipeline.last()) {
                (Some(o), Some(stage)) => {
                    let (tdb, tcoll) = o.target();
                    let is_merge = matches!(o, crate::engine::output::OutputStage::Merge(_));
                    foreign::write_output(cluster, primaries, tdb, tcoll, is_merge, stage, out).await?;
                    Vec::new()
                }
                _ => out,
            };
            let batch = body
                .get_document("cursor")
                .ok()
                .and_then(|c| number_field(c, "batchSize"))
                .map(|b| b.max(0) as usize)
                .unwrap_or(DEFAULT_BATCH);
            cursors
                .open(cluster, ns.clone(), Source::Buffered(out.into()), batch, false, owner)
                .await
        }
        .await,
        "count" => async {
            let query = doc_field(&body, "query", "count")?;
            let skip = number_field(&body, "skip").unwrap_or(0).max(0);
            let limit = number_field(&body, "limit")
                .filter(|l| *l != 0)
                .map(|l| l.checked_abs().unwrap_or(i64::MAX));
            let mut cmd = doc! {"count": &coll, "query": query.clone()};
            if let Some(l) = limit {
                cmd.insert("limit", l.saturating_add(skip));
            }
            let replies = on_each(cluster, snap, target_shards(snap, &query), &db, &cmd).await?;
            let total: i64 = replies
                .iter()
                .map(|r| number_field(r, "n").unwrap_or(0))
                .fold(0i64, i64::saturating_add);
            let mut n = total.saturating_sub(skip).max(0);
            if let Some(l) = limit {
                n = n.min(l);
            }
            Ok(doc! {"n": i32::try_from(n).map(Bson::Int32).unwrap_or(Bson::Int64(n))})
        }
        .await,
        "distinct" => async {
            let key = body
                .get_str("key")
                .map_err(|_| CommandError::new(ErrorCode(40414), "BSON field 'distinct.key' is missing but a required field"))?
                .to_string();
            let query = doc_field(&body, "query", "distinct")?;
            let cmd = doc! {"distinct": &coll, "key": &key, "query": query.clone()};
            let replies = on_each(cluster, snap, target_shards(snap, &query), &db, &cmd).await?;
            let mut values: std::collections::BTreeSet<crate::value::compare::OrdBson> = Default::default();
            for r in &replies {
                for v in r.get_array("values").into_iter().flatten() {
                    values.insert(crate::value::compare::OrdBson(v.clone()));
                }
            }
            let values: Vec<Bson> = values.into_iter().map(|v| v.0).collect();
            Ok(doc! {"values": values})
        }
        .await,
        _ => return None,
    })
}
