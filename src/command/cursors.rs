//! Cursors over results a server computed whole: the first batch goes out with the reply, the
//! rest waits here for `getMore` until it is read, killed, reaped when idle, or evicted when
//! too many are open. The embedded shard serves its `find` and `aggregate` cursors from it, the
//! router's static metadata store its `config` reads; both answer `getMore` and `killCursors`
//! alike through it.
//!
//! What a cursor has not returned yet is kept encoded, the documents back to back in one
//! buffer, not as owned documents: a `Document` takes several times its BSON size on the heap
//! (a map, a key string and a value per field), so unread cursors would otherwise hold most of
//! a server's memory. A `getMore` decodes only the documents of its batch.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};

use super::CommandError;
use crate::sync::lock;
use crate::value::error_codes::ErrorCode;
use crate::wire::MAX_BSON_OBJECT_SIZE;

/// How long a cursor may sit unread before it is dropped (mongod's `cursorTimeoutMillis`
/// default, 10 minutes).
pub const CURSOR_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// Most cursors one server keeps open; opening one more first reaps idle cursors, then drops
/// the least recently used one.
pub const MAX_OPEN_CURSORS: usize = 10_000;

/// One open cursor.
#[derive(Debug)]
struct Cursor {
    /// `db.coll` it reads.
    ns: String,
    /// Documents not yet returned.
    remaining: Encoded,
    /// When it was opened or last read.
    last_used: Instant,
}

/// A server's open cursors over computed results.
#[derive(Debug)]
pub struct DocumentCursors {
    cursors: Mutex<HashMap<i64, Cursor>>,
    /// How long a cursor may sit unread (what a full table evicts first).
    idle_timeout: Duration,
}

impl Default for DocumentCursors {
    fn default() -> Self {
        DocumentCursors::with_idle_timeout(CURSOR_IDLE_TIMEOUT)
    }
}

impl DocumentCursors {
    /// An empty table whose cursors time out after `idle_timeout` unread.
    pub fn with_idle_timeout(idle_timeout: Duration) -> Self {
        DocumentCursors {
            cursors: Mutex::new(HashMap::new()),
            idle_timeout,
        }
    }

    /// The reply to a command whose result is `docs`: a first batch of at most `batch`
    /// documents (and 16 MiB), the rest kept as a cursor unless `single_batch`.
    pub fn first_batch(
        &self,
        ns: String,
        docs: Vec<Document>,
        batch: usize,
        single_batch: bool,
    ) -> Document {
        let mut docs = docs.into_iter().peekable();
        let out = first_documents(&mut docs, batch);
        let id = if docs.peek().is_none() || single_batch {
            0i64
        } else {
            let mut cursors = lock(&self.cursors);
            let id = crate::value::field::new_cursor_id(|id| cursors.contains_key(&id));
            if cursors.len() >= MAX_OPEN_CURSORS {
                cursors.retain(|_, c| c.last_used.elapsed() < self.idle_timeout);
            }
            if cursors.len() >= MAX_OPEN_CURSORS {
                let oldest = cursors
                    .iter()
                    .min_by_key(|(_, c)| c.last_used)
                    .map(|(id, _)| *id);
                if let Some(oldest) = oldest {
                    cursors.remove(&oldest);
                }
            }
            cursors.insert(
                id,
                Cursor {
                    ns: ns.clone(),
                    remaining: Encoded::new(docs),
                    last_used: Instant::now(),
                },
            );
            id
        };
        doc! {"cursor": {"firstBatch": out, "id": id, "ns": ns}}
    }

    /// `getMore` on database `db`.
    pub fn get_more(&self, db: &str, body: &Document) -> Result<Document, CommandError> {
        let id = match body.get("getMore") {
            Some(Bson::Int64(i)) => *i,
            _ => {
                return Err(CommandError::new(
                    ErrorCode::TypeMismatch,
                    "BSON field 'getMore.getMore' is the wrong type, expected type 'long'",
                ))
            }
        };
        let coll = body.get_str("collection").map_err(|_| {
            CommandError::new(
                ErrorCode(40414),
                "BSON field 'getMore.collection' is missing but a required field",
            )
        })?;
        let ns = format!("{db}.{coll}");
        let batch = crate::engine::reads::count_argument(body, "batchSize")?.unwrap_or(usize::MAX);
        let mut cursors = lock(&self.cursors);
        let Some(cursor) = cursors.get_mut(&id) else {
            return Err(CommandError::new(
                ErrorCode::CursorNotFound,
                format!("cursor id {id} not found"),
            ));
        };
        if cursor.ns != ns {
            return Err(CommandError::new(
                ErrorCode::Unauthorized,
                format!("Requested getMore on namespace '{ns}', but cursor belongs to a different namespace {}", cursor.ns),
            ));
        }
        let out = match cursor.remaining.take_batch(batch.max(1)) {
            Ok(out) => out,
            Err(e) => {
                cursors.remove(&id);
                return Err(e);
            }
        };
        cursor.last_used = Instant::now();
        let next_id = if cursor.remaining.is_empty() {
            cursors.remove(&id);
            0i64
        } else {
            id
        };
        Ok(doc! {"cursor": {"nextBatch": out, "id": next_id, "ns": ns}})
    }

    /// `killCursors` (its collection already checked by the caller).
    pub fn kill(&self, body: &Document) -> Result<Document, CommandError> {
        let Ok(ids) = body.get_array("cursors") else {
            return Err(CommandError::new(
                ErrorCode(40414),
                "BSON field 'killCursors.cursors' is missing but a required field",
            ));
        };
        let mut killed = Vec::new();
        let mut not_found = Vec::new();
        let mut cursors = lock(&self.cursors);
        for id in ids {
            let Bson::Int64(id) = id else {
                return Err(CommandError::new(
                    ErrorCode::TypeMismatch,
                    "BSON field 'killCursors.cursors' must hold longs",
                ));
            };
            if cursors.remove(id).is_some() {
                killed.push(*id);
            } else {
                not_found.push(*id);
            }
        }
        Ok(
            doc! {"cursorsKilled": killed, "cursorsNotFound": not_found, "cursorsAlive": [], "cursorsUnknown": []},
        )
    }

    /// Drops cursors unread for longer than the idle timeout (a server's idle monitor calls it).
    pub fn reap_idle(&self) {
        let timeout = self.idle_timeout;
        lock(&self.cursors).retain(|_, c| c.last_used.elapsed() < timeout);
    }

    /// Drops every cursor on `ns` (its collection was dropped).
    pub fn drop_namespace(&self, ns: &str) {
        lock(&self.cursors).retain(|_, c| c.ns != ns);
    }

    /// Cursors open.
    pub fn len(&self) -> usize {
        lock(&self.cursors).len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes the open cursors hold for the documents they have not returned yet.
    pub fn buffered_bytes(&self) -> usize {
        lock(&self.cursors)
            .values()
            .map(|c| c.remaining.held())
            .sum()
    }
}

/// The first batch: at most `batch` documents, and no more than fit in one reply (at least
/// one), taken from the front of `docs`.
fn first_documents(
    docs: &mut std::iter::Peekable<std::vec::IntoIter<Document>>,
    batch: usize,
) -> Vec<Bson> {
    let mut out = Vec::new();
    let mut bytes = 0usize;
    while out.len() < batch {
        let Some(d) = docs.peek() else { break };
        let size = d.to_vec().map(|v| v.len()).unwrap_or(0);
        if !out.is_empty() && bytes + size > MAX_BSON_OBJECT_SIZE {
            break;
        }
        bytes += size;
        if let Some(d) = docs.next() {
            out.push(Bson::Document(d));
        }
    }
    out
}

/// Documents encoded back to back (each BSON document begins with its length), read from the
/// front.
#[derive(Debug, Default)]
struct Encoded {
    bytes: Vec<u8>,
    /// Where the next unread document starts.
    read: usize,
    /// Why the document after the encoded ones could not be encoded: the batch that reaches it
    /// fails as a reply holding it would have failed to encode.
    failed: Option<String>,
}

impl Encoded {
    /// Encodes `docs`, dropping each document once it is encoded.
    fn new(docs: impl Iterator<Item = Document>) -> Encoded {
        let mut e = Encoded::default();
        for d in docs {
            if let Err(err) = d.to_writer(&mut e.bytes) {
                e.failed = Some(format!("cannot encode the reply: {err}"));
                break;
            }
        }
        e.bytes.shrink_to_fit();
        e
    }

    fn is_empty(&self) -> bool {
        self.read >= self.bytes.len() && self.failed.is_none()
    }

    /// Heap bytes held.
    fn held(&self) -> usize {
        self.bytes.capacity()
    }

    /// The length of the next unread document, if there is one.
    fn next_len(&self) -> Option<usize> {
        let head = self.bytes.get(self.read..self.read + 4)?;
        let len = i32::from_le_bytes(head.try_into().ok()?);
        usize::try_from(len).ok()
    }

    /// Takes the next batch: at most `batch` documents, and no more than fit in one reply (at
    /// least one).
    fn take_batch(&mut self, batch: usize) -> Result<Vec<Bson>, CommandError> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        while out.len() < batch {
            let Some(size) = self.next_len() else {
                if let Some(failed) = self.failed.take() {
                    return Err(CommandError::new(ErrorCode::InternalError, failed));
                }
                break;
            };
            if !out.is_empty() && bytes + size > MAX_BSON_OBJECT_SIZE {
                break;
            }
            let doc = self
                .bytes
                .get(self.read..self.read + size)
                .and_then(|b| bson::RawDocument::from_bytes(b).ok())
                .and_then(|raw| Document::try_from(raw).ok())
                .ok_or_else(|| {
                    CommandError::new(
                        ErrorCode::InternalError,
                        "a cursor's buffered document could not be decoded",
                    )
                })?;
            bytes += size;
            self.read += size;
            out.push(Bson::Document(doc));
        }
        // Give back what has been read once it is most of the buffer.
        if self.read * 2 >= self.bytes.len() {
            self.bytes.drain(..self.read);
            self.bytes.shrink_to_fit();
            self.read = 0;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_then_exhausts_then_forgets() {
        let cursors = DocumentCursors::default();
        let docs: Vec<Document> = (0..5).map(|i| doc! {"_id": i}).collect();
        let first = cursors.first_batch("d.c".into(), docs, 2, false);
        let c = first.get_document("cursor").unwrap();
        assert_eq!(c.get_array("firstBatch").unwrap().len(), 2);
        let id = c.get_i64("id").unwrap();
        assert_ne!(id, 0);
        let wrong = cursors
            .get_more("d", &doc! {"getMore": id, "collection": "x"})
            .unwrap_err();
        assert_eq!(wrong.code, ErrorCode::Unauthorized);
        let next = cursors
            .get_more("d", &doc! {"getMore": id, "collection": "c"})
            .unwrap();
        let c = next.get_document("cursor").unwrap();
        assert_eq!(c.get_array("nextBatch").unwrap().len(), 3);
        assert_eq!(c.get_i64("id").unwrap(), 0);
        assert!(cursors.is_empty());
        let gone = cursors
            .get_more("d", &doc! {"getMore": id, "collection": "c"})
            .unwrap_err();
        assert_eq!(gone.code, ErrorCode::CursorNotFound);
    }

    #[test]
    fn single_batch_keeps_no_cursor_and_kill_reports() {
        let cursors = DocumentCursors::default();
        let docs: Vec<Document> = (0..5).map(|i| doc! {"_id": i}).collect();
        let r = cursors.first_batch("d.c".into(), docs.clone(), 2, true);
        assert_eq!(r.get_document("cursor").unwrap().get_i64("id").unwrap(), 0);
        let r = cursors.first_batch("d.c".into(), docs, 2, false);
        let id = r.get_document("cursor").unwrap().get_i64("id").unwrap();
        let k = cursors.kill(&doc! {"cursors": [id, 7i64]}).unwrap();
        assert_eq!(
            k.get_array("cursorsKilled").unwrap(),
            &vec![Bson::Int64(id)]
        );
        assert_eq!(
            k.get_array("cursorsNotFound").unwrap(),
            &vec![Bson::Int64(7)]
        );
    }

    fn encoded_len(docs: &[Document]) -> usize {
        docs.iter().map(|d| d.to_vec().unwrap().len()).sum()
    }

    #[test]
    fn unread_documents_are_held_encoded() {
        let cursors = DocumentCursors::default();
        let docs: Vec<Document> = (0..1000)
            .map(|i| doc! {"_id": i, "name": format!("n{i}"), "tags": ["a", "b"], "sub": {"x": i}})
            .collect();
        let first = cursors.first_batch("d.c".into(), docs.clone(), 101, false);
        let c = first.get_document("cursor").unwrap();
        assert_eq!(c.get_array("firstBatch").unwrap().len(), 101);
        let id = c.get_i64("id").unwrap();
        assert_eq!(cursors.buffered_bytes(), encoded_len(&docs[101..]));
        let next = cursors
            .get_more(
                "d",
                &doc! {"getMore": id, "collection": "c", "batchSize": 600},
            )
            .unwrap();
        let batch = next
            .get_document("cursor")
            .unwrap()
            .get_array("nextBatch")
            .unwrap();
        let expected: Vec<Bson> = docs[101..701].iter().cloned().map(Bson::Document).collect();
        assert_eq!(batch, &expected);
        // What was read is given back once it is most of the buffer.
        assert_eq!(cursors.buffered_bytes(), encoded_len(&docs[701..]));
        let last = cursors
            .get_more("d", &doc! {"getMore": id, "collection": "c"})
            .unwrap();
        let c = last.get_document("cursor").unwrap();
        assert_eq!(c.get_array("nextBatch").unwrap().len(), 299);
        assert_eq!(c.get_i64("id").unwrap(), 0);
        assert_eq!(cursors.buffered_bytes(), 0);
    }

    #[test]
    fn a_get_more_batch_stops_before_16_mib() {
        let cursors = DocumentCursors::default();
        let big = "x".repeat(5 * 1024 * 1024);
        let docs: Vec<Document> = (0..8).map(|i| doc! {"_id": i, "s": big.clone()}).collect();
        let first = cursors.first_batch("d.c".into(), docs, usize::MAX, false);
        let c = first.get_document("cursor").unwrap();
        assert_eq!(c.get_array("firstBatch").unwrap().len(), 3);
        let id = c.get_i64("id").unwrap();
        let next = cursors
            .get_more("d", &doc! {"getMore": id, "collection": "c"})
            .unwrap();
        let c = next.get_document("cursor").unwrap();
        let batch = c.get_array("nextBatch").unwrap();
        assert_eq!(batch.len(), 3);
        assert_eq!(batch[0].as_document().unwrap().get_i32("_id").unwrap(), 3);
        assert_eq!(c.get_i64("id").unwrap(), id);
        let rest = cursors
            .get_more(
                "d",
                &doc! {"getMore": id, "collection": "c", "batchSize": 1},
            )
            .unwrap();
        let c = rest.get_document("cursor").unwrap();
        assert_eq!(c.get_array("nextBatch").unwrap().len(), 1);
        assert_eq!(c.get_i64("id").unwrap(), id);
    }

    #[test]
    fn a_document_that_cannot_be_encoded_fails_the_batch_that_reaches_it() {
        let cursors = DocumentCursors::default();
        let mut bad = Document::new();
        bad.insert("a\0b", 1);
        let docs = vec![doc! {"_id": 0}, doc! {"_id": 1}, bad];
        let first = cursors.first_batch("d.c".into(), docs, 1, false);
        let id = first.get_document("cursor").unwrap().get_i64("id").unwrap();
        let next = cursors
            .get_more(
                "d",
                &doc! {"getMore": id, "collection": "c", "batchSize": 1},
            )
            .unwrap();
        assert_eq!(
            next.get_document("cursor").unwrap().get_i64("id").unwrap(),
            id
        );
        let failed = cursors
            .get_more("d", &doc! {"getMore": id, "collection": "c"})
            .unwrap_err();
        assert_eq!(failed.code, ErrorCode::InternalError);
        assert!(cursors.is_empty());
    }
}
