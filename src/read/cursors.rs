//! The router's cursors on sharded collections: the registry (ids, owners, idle reaping, the
//! bounds on count and buffered bytes), `getMore` and `killCursors`, and the cursor replies,
//! written straight from the documents' encoded bytes.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use bson::raw::RawDocumentBuf;
use bson::{doc, Bson, Document};
use bytes::Bytes;

use super::shard_io::kill_streams;
use super::stream_merge::Merge;
use crate::cluster::Cluster;
use crate::command::{CommandError, CommandRequest};
use crate::value::error_codes::ErrorCode;
use crate::value::field::number_field;
use crate::wire::Reply;

/// Where a router cursor's documents come from.
#[derive(Debug)]
pub(super) enum Source {
    /// Results computed at the router (aggregations with a router part), encoded.
    Buffered(VecDeque<Bytes>),
    /// Shard cursors merged as the client asks for more.
    Streams(Box<Merge>),
}

impl Source {
    /// Up to `n` more documents; `true` once exhausted.
    async fn next_batch(
        &mut self,
        cluster: &Cluster,
        n: usize,
    ) -> Result<(Vec<Bytes>, bool), CommandError> {
        match self {
            Source::Buffered(docs) => {
                let take = n.min(docs.len());
                let next: Vec<Bytes> = docs.drain(..take).collect();
                Ok((next, docs.is_empty()))
            }
            Source::Streams(m) => m.next_batch(cluster, n).await,
        }
    }
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
        Source::Buffered(docs) => docs.iter().map(Bytes::len).sum(),
        Source::Streams(_) => 0,
    }
}

/// Appends the BSON element header (type byte and key) of `key` to `out`.
fn element(out: &mut Vec<u8>, kind: u8, key: &str) {
    out.push(kind);
    out.extend_from_slice(key.as_bytes());
    out.push(0);
}

/// Writes the length of the document or array that starts at `start` and ends the buffer.
fn close(out: &mut Vec<u8>, start: usize) {
    out.push(0);
    let len = (out.len() - start) as i32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// `{cursor: {<batch>: [docs…], id, ns[, partialResultsReturned: true]}}`, written in one
/// buffer from the documents' encoded bytes (no document is decoded or re-encoded).
pub(super) fn cursor_reply(
    batch: &str,
    docs: &[Bytes],
    id: i64,
    ns: &str,
    partial: bool,
) -> RawDocumentBuf {
    let payload: usize = docs.iter().map(|d| d.len() + 8).sum();
    let mut out = Vec::with_capacity(payload + ns.len() + 96);
    out.extend_from_slice(&[0; 4]);
    element(&mut out, 0x03, "cursor");
    let cursor = out.len();
    out.extend_from_slice(&[0; 4]);
    element(&mut out, 0x04, batch);
    let array = out.len();
    out.extend_from_slice(&[0; 4]);
    let mut index = String::new();
    for (i, d) in docs.iter().enumerate() {
        index.clear();
        {
            use std::fmt::Write as _;
            let _ = write!(index, "{i}");
        }
        element(&mut out, 0x03, &index);
        out.extend_from_slice(d);
    }
    close(&mut out, array);
    element(&mut out, 0x12, "id");
    out.extend_from_slice(&id.to_le_bytes());
    element(&mut out, 0x02, "ns");
    out.extend_from_slice(&((ns.len() + 1) as i32).to_le_bytes());
    out.extend_from_slice(ns.as_bytes());
    out.push(0);
    if partial {
        element(&mut out, 0x08, "partialResultsReturned");
        out.push(1);
    }
    close(&mut out, cursor);
    close(&mut out, 0);
    // The layout above is valid BSON by construction (keys without NUL: `ns` is a checked
    // namespace, the batch name and indexes are ours); the check is on the header only.
    RawDocumentBuf::from_bytes(out).unwrap_or_default()
}

/// How a cursor's first batch is served.
#[derive(Debug, Clone, Copy)]
pub(super) struct FirstBatch {
    /// Most documents in it.
    pub(super) size: usize,
    /// No cursor is kept after it (`singleBatch`, a negative `limit`).
    pub(super) single: bool,
    /// Some shard could not be reached and was skipped (`partialResultsReturned`).
    pub(super) partial: bool,
}

impl RouterCursors {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, RouterCursor>> {
        self.cursors.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a `getMore` or `killCursors` names a cursor of the router's (a read of a view on
    /// a sharded collection opens one under a namespace the router does not shard).
    pub fn names_own_cursor(&self, name: &str, body: &Document) -> bool {
        let cursors = self.lock();
        match name {
            "getMore" => {
                matches!(body.get("getMore"), Some(Bson::Int64(id)) if cursors.contains_key(id))
            }
            "killCursors" => body.get_array("cursors").is_ok_and(|ids| {
                ids.iter()
                    .any(|id| matches!(id, Bson::Int64(id) if cursors.contains_key(id)))
            }),
            _ => false,
        }
    }

    /// Files cursor `id` under another namespace: a read of a view runs on the view's source,
    /// and its cursor is the view's for the client's `getMore`.
    pub fn set_namespace(&self, id: i64, ns: &str) {
        if let Some(c) = self.lock().get_mut(&id) {
            c.ns = ns.to_string();
        }
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
            if cursors.is_empty() {
                return;
            }
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

    /// Serves the first batch of `source` and keeps the rest as a cursor unless
    /// `first.single`.
    pub(super) async fn open(
        &self,
        cluster: &Cluster,
        ns: String,
        mut source: Source,
        first: FirstBatch,
        owner: i64,
    ) -> Result<Reply, CommandError> {
        let FirstBatch {
            size,
            single,
            partial,
        } = first;
        let (first, exhausted) = source.next_batch(cluster, size).await?;
        let id = if exhausted || single {
            if let Source::Streams(m) = &source {
                kill_streams(cluster, &m.db, &m.coll, &m.streams).await;
            }
            0i64
        } else {
            let bytes = match &source {
                Source::Buffered(docs) => docs.iter().map(Bytes::len).sum(),
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
        Ok(Reply::Raw(cursor_reply(
            "firstBatch",
            &first,
            id,
            &ns,
            partial,
        )))
    }

    /// `getMore` on a router cursor; a cursor belongs to the connection that opened it.
    pub async fn get_more(
        &self,
        cluster: &Cluster,
        req: &CommandRequest,
        body: &Document,
        owner: i64,
    ) -> Result<Reply, CommandError> {
        let Some(Bson::Int64(id)) = body.get("getMore").cloned() else {
            return Err(CommandError::new(
                ErrorCode::TypeMismatch,
                "BSON field 'getMore.getMore' is the wrong type, expected type 'long'",
            ));
        };
        let ns = format!("{}.{}", req.db, body.get_str("collection").unwrap_or(""));
        let batch = number_field(body, "batchSize")
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
        let (next, exhausted) = cursor
            .source
            .next_batch(cluster, batch.min(100_000))
            .await?;
        let next_id = if exhausted {
            0
        } else {
            cursor.last_used = std::time::Instant::now();
            self.lock().insert(id, cursor);
            id
        };
        Ok(Reply::Raw(cursor_reply(
            "nextBatch",
            &next,
            next_id,
            &ns,
            false,
        )))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_replies_are_the_documents_they_would_encode() {
        let docs: Vec<Bytes> = (0..12)
            .map(|i| {
                Bytes::from(
                    doc! {"_id": i, "s": "x".repeat(i as usize)}
                        .to_vec()
                        .expect("encodes"),
                )
            })
            .collect();
        for partial in [false, true] {
            let raw = cursor_reply("firstBatch", &docs, 42, "db.c", partial);
            let decoded = Document::try_from(raw.as_ref()).expect("valid BSON");
            let batch: Vec<Bson> = (0..12)
                .map(|i| Bson::Document(doc! {"_id": i, "s": "x".repeat(i as usize)}))
                .collect();
            let mut cursor = doc! {"firstBatch": batch, "id": 42i64, "ns": "db.c"};
            if partial {
                cursor.insert("partialResultsReturned", true);
            }
            assert_eq!(decoded, doc! {"cursor": cursor});
            assert_eq!(
                raw.as_bytes(),
                &doc! {"cursor": decoded.get_document("cursor").expect("cursor").clone()}
                    .to_vec()
                    .expect("encodes")[..]
            );
        }
        let empty = cursor_reply("nextBatch", &[], 0, "a.b", false);
        assert_eq!(
            Document::try_from(empty.as_ref()).expect("valid"),
            doc! {"cursor": {"nextBatch": [], "id": 0i64, "ns": "a.b"}}
        );
    }
}
