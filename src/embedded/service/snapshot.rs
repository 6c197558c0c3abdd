//! Snapshot reads outside transactions (`readConcern: {level: "snapshot"}` on `find`,
//! `aggregate` and `distinct`, MongoDB 5.0+): the read sees the data as of one cluster time,
//! the reply says which (`atClusterTime`), and later reads that name that time see the same
//! data whatever was written since.
//!
//! mongod reads an older version from its storage engine's history. The embedded shard keeps
//! no versions; it keeps a short **history of copies**: a snapshot read without
//! `atClusterTime` copies the catalog and files the copy under the time it hands out; a read
//! with `atClusterTime` finds the copy that holds for that time. A copy holds from its time
//! until the next write completes (`valid_until`); while nothing has been written since the
//! newest copy, a new read reuses it. A time newer than the last write is served by a copy of
//! the data now. A time no copy covers is older than the history: SnapshotTooOld (239), as
//! mongod answers past `minSnapshotHistoryWindowInSeconds`. At most [`MAX_COPIES`] copies are
//! kept, none older than [`HISTORY_WINDOW`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::{Bson, Document, RawDocument, Timestamp};

use super::lock;
use crate::embedded::store::Catalog;
use crate::engine::EngineError;
use crate::value::error_codes::ErrorCode;

/// How long a copy is kept: mongod's default `minSnapshotHistoryWindowInSeconds`.
pub const HISTORY_WINDOW: Duration = Duration::from_secs(300);

/// The most copies kept at once (each is a copy of the whole data set).
pub const MAX_COPIES: usize = 16;

/// Commands that read with snapshot read concern outside a transaction.
const SNAPSHOT_READS: &[&str] = &["find", "aggregate", "distinct"];

/// Commands that change nothing: they do not end the validity of a copy.
const NON_WRITING: &[&str] = &[
    "find",
    "count",
    "distinct",
    "getMore",
    "killCursors",
    "listCollections",
    "listIndexes",
    "listDatabases",
    "collStats",
    "dbStats",
    "dataSize",
    "explain",
    "hello",
    "isMaster",
    "ismaster",
    "ping",
    "buildInfo",
    "buildinfo",
    "serverStatus",
    "getParameter",
    "getLog",
    "whatsmyuri",
    "connectionStatus",
    "getCmdLineOpts",
    "replSetGetStatus",
    "saslStart",
    "saslContinue",
    "endSessions",
];

#[derive(Debug)]
struct Copy {
    at: Timestamp,
    taken: Instant,
    view: Arc<Mutex<Catalog>>,
    /// When the first write after the copy completed: the copy holds for times before it.
    valid_until: Option<Timestamp>,
}

/// The copies a data set keeps for snapshot reads, shared by the members of an embedded
/// replica set as the data is.
#[derive(Debug, Default)]
pub struct SnapshotHistory {
    copies: VecDeque<Copy>,
    /// When the latest write completed.
    last_write: Option<Timestamp>,
}

fn key(t: Timestamp) -> (u32, u32) {
    (t.time, t.increment)
}

impl SnapshotHistory {
    /// Records that a command that may have written completed at `at`.
    pub fn wrote(&mut self, at: Timestamp) {
        self.last_write = Some(match self.last_write {
            Some(t) if key(t) > key(at) => t,
            _ => at,
        });
        for c in self.copies.iter_mut().filter(|c| c.valid_until.is_none()) {
            c.valid_until = Some(at);
        }
    }

    fn expire(&mut self) {
        let now = Instant::now();
        self.copies
            .retain(|c| now.duration_since(c.taken) < HISTORY_WINDOW);
        while self.copies.len() > MAX_COPIES {
            self.copies.pop_front();
        }
    }

    /// The copy for a read at `at` (given by the client) or, without it, at `now`; with the
    /// time the read is at.
    fn copy_for(
        &mut self,
        at: Option<Timestamp>,
        now: Timestamp,
        catalog: &Mutex<Catalog>,
    ) -> Result<(Arc<Mutex<Catalog>>, Timestamp), EngineError> {
        self.expire();
        match at {
            None => {
                if let Some(c) = self.copies.back() {
                    if c.valid_until.is_none() {
                        return Ok((c.view.clone(), c.at));
                    }
                }
                Ok((self.file(now, catalog), now))
            }
            Some(t) => {
                if let Some(c) =
                    self.copies.iter().rev().find(|c| {
                        key(c.at) <= key(t) && c.valid_until.is_none_or(|u| key(t) < key(u))
                    })
                {
                    return Ok((c.view.clone(), t));
                }
                if self.last_write.is_none_or(|w| key(t) >= key(w)) {
                    return Ok((self.file(t, catalog), t));
                }
                Err(EngineError::new(
                    ErrorCode::SnapshotTooOld,
                    format!(
                        "Read timestamp Timestamp({}, {}) is older than the oldest available timestamp.",
                        t.time, t.increment
                    ),
                ))
            }
        }
    }

    fn file(&mut self, at: Timestamp, catalog: &Mutex<Catalog>) -> Arc<Mutex<Catalog>> {
        let view = Arc::new(Mutex::new(lock(catalog).clone()));
        self.copies.push_back(Copy {
            at,
            taken: Instant::now(),
            view: view.clone(),
            valid_until: None,
        });
        self.expire();
        view
    }

    /// Copies kept now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.copies.len()
    }
}

/// Whether command `name` with `body` may have changed data (it ends the copies' validity).
pub fn may_write(name: &str, body: &RawDocument) -> bool {
    if name == "aggregate" {
        return writes_output(body);
    }
    !NON_WRITING.contains(&name)
}

/// An aggregation that ends in `$out` or `$merge` (read in place: every command on the shard
/// asks).
fn writes_output(body: &RawDocument) -> bool {
    let Ok(stages) = body.get_array("pipeline") else {
        return false;
    };
    stages.into_iter().flatten().any(|s| {
        s.as_document().is_some_and(|d| {
            matches!(d.get("$out"), Ok(Some(_))) || matches!(d.get("$merge"), Ok(Some(_)))
        })
    })
}

/// What a command outside a transaction asks of snapshot reads: `None` when its read concern
/// is not `snapshot`; the `atClusterTime` it names otherwise. Commands that cannot read at a
/// snapshot outside a transaction are refused as mongod refuses them.
pub fn snapshot_request(
    name: &str,
    body: &Document,
    raw: &RawDocument,
) -> Result<Option<Option<Timestamp>>, EngineError> {
    let Some(Bson::Document(rc)) = body.get("readConcern") else {
        return Ok(None);
    };
    if !matches!(rc.get("level"), Some(Bson::String(l)) if l == "snapshot") {
        return Ok(None);
    }
    if !SNAPSHOT_READS.contains(&name) || writes_output(raw) {
        return Err(EngineError::new(
            ErrorCode::InvalidOptions,
            format!("{name} does not support read concern snapshot outside a multi-document transaction"),
        ));
    }
    match rc.get("atClusterTime") {
        None => Ok(Some(None)),
        Some(Bson::Timestamp(t)) if t.time != 0 || t.increment != 0 => Ok(Some(Some(*t))),
        Some(Bson::Timestamp(_)) => Err(EngineError::new(
            ErrorCode::InvalidOptions,
            "readConcern atClusterTime value must not be null",
        )),
        Some(_) => Err(EngineError::new(
            ErrorCode::TypeMismatch,
            "BSON field 'atClusterTime' is the wrong type, expected type 'timestamp'",
        )),
    }
}

/// The copy a snapshot read runs on and the time it reads at; `now` is the server's cluster
/// time, used when the read names none.
pub fn view_for(
    history: &Mutex<SnapshotHistory>,
    at: Option<Timestamp>,
    now: Timestamp,
    catalog: &Mutex<Catalog>,
) -> Result<(Arc<Mutex<Catalog>>, Timestamp), EngineError> {
    lock(history).copy_for(at, now, catalog)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn raw(d: &Document) -> bson::RawDocumentBuf {
        bson::RawDocumentBuf::try_from(d).unwrap()
    }

    fn ts(i: u32) -> Timestamp {
        Timestamp {
            time: 100,
            increment: i,
        }
    }

    fn catalog_with(n: i32) -> Mutex<Catalog> {
        let mut c = Catalog::default();
        let (coll, _) = c.collection_mut("db", "c");
        coll.insert("db.c", doc! {"_id": n}).unwrap();
        Mutex::new(c)
    }

    fn ids(view: &Arc<Mutex<Catalog>>) -> Vec<Bson> {
        lock(view)
            .collection("db", "c")
            .map(|c| {
                c.iter()
                    .map(|(_, d)| d.get("_id").cloned().unwrap())
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn a_named_time_reads_the_copy_that_holds_for_it() {
        let h = Mutex::new(SnapshotHistory::default());
        let cat = catalog_with(1);
        let (v, at) = view_for(&h, None, ts(5), &cat).unwrap();
        assert_eq!(at, ts(5));
        assert_eq!(ids(&v), vec![Bson::Int32(1)]);
        // A later write: the copy holds before it, not after.
        lock(&cat)
            .collection_mut("db", "c")
            .0
            .insert("db.c", doc! {"_id": 2})
            .unwrap();
        lock(&h).wrote(ts(8));
        let (v, _) = view_for(&h, Some(ts(5)), ts(9), &cat).unwrap();
        assert_eq!(ids(&v), vec![Bson::Int32(1)]);
        let (v, _) = view_for(&h, Some(ts(7)), ts(9), &cat).unwrap();
        assert_eq!(ids(&v), vec![Bson::Int32(1)], "no write between 5 and 7");
        // At or after the write: the data now.
        let (v, _) = view_for(&h, Some(ts(8)), ts(9), &cat).unwrap();
        assert_eq!(ids(&v).len(), 2);
        // Before any copy: too old.
        let e = view_for(&h, Some(ts(3)), ts(9), &cat).unwrap_err();
        assert_eq!(e.code, ErrorCode::SnapshotTooOld);
    }

    #[test]
    fn reads_without_writes_between_share_one_copy_and_the_history_is_bounded() {
        let h = Mutex::new(SnapshotHistory::default());
        let cat = catalog_with(1);
        let (a, at_a) = view_for(&h, None, ts(5), &cat).unwrap();
        let (b, at_b) = view_for(&h, None, ts(6), &cat).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(at_a, at_b);
        for i in 0..(MAX_COPIES as u32 * 2) {
            lock(&h).wrote(ts(10 + 2 * i));
            view_for(&h, None, ts(11 + 2 * i), &cat).unwrap();
        }
        assert_eq!(lock(&h).len(), MAX_COPIES);
    }

    #[test]
    fn only_find_aggregate_and_distinct_read_at_a_snapshot() {
        let rc = doc! {"readConcern": {"level": "snapshot"}};
        assert_eq!(
            snapshot_request("find", &rc, &raw(&rc)).unwrap(),
            Some(None)
        );
        for name in [
            "findAndModify",
            "insert",
            "listCollections",
            "listIndexes",
            "count",
        ] {
            let e = snapshot_request(name, &rc, &raw(&rc)).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidOptions, "{name}");
        }
        let out = doc! {"readConcern": {"level": "snapshot"}, "pipeline": [{"$out": "x"}]};
        assert!(snapshot_request("aggregate", &out, &raw(&out)).is_err());
        let local = doc! {"readConcern": {"level": "local"}};
        assert_eq!(
            snapshot_request("insert", &local, &raw(&local)).unwrap(),
            None
        );
        let bad = doc! {"readConcern": {"level": "snapshot", "atClusterTime": 5}};
        assert_eq!(
            snapshot_request("find", &bad, &raw(&bad)).unwrap_err().code,
            ErrorCode::TypeMismatch
        );
        assert!(may_write("insert", &raw(&doc! {})));
        assert!(!may_write("find", &raw(&doc! {})));
        assert!(!may_write("aggregate", &raw(&doc! {"pipeline": []})));
        assert!(may_write(
            "aggregate",
            &raw(&doc! {"pipeline": [{"$merge": "x"}]})
        ));
    }
}
