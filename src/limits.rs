//! The limits MongoDB enforces, in one place, and the iterative measurements that check them.
//!
//! Every limit here is one a client can run into with a single request: how deep a message or
//! a stored document may nest, how many parts a field path may have, how far an update may
//! back-fill an array, how many statements one write may carry, how much memory one stage of
//! an aggregation may hold. The wire codec, the embedded engine and the router read them from
//! here, so the router and the shard refuse the same input with the same code.
//!
//! [`measure`] walks a value with an explicit stack instead of recursion: it is what checks
//! values the engine has just built, which may be deeper than anything a client could send,
//! so it must not be able to overflow a thread's stack itself.

use bson::{Bson, Document};

/// `maxBSONDepth`: the deepest nesting of any document a server accepts on the wire (commands
/// from clients, replies from shards), the top-level document being level 0.
pub const MAX_BSON_DEPTH: usize = 200;

/// The deepest nesting a result the engine builds may have (an aggregation's output
/// document, an updated document before its storage check): mongod's user-storage depth, so a
/// result wrapped in a reply (`cursor.firstBatch`) still fits in [`MAX_BSON_DEPTH`].
pub const MAX_RESULT_DEPTH: usize = 180;

/// Levels of nesting a stored document may have, the top-level document counting as one:
/// MongoDB's documented limit ("no more than 100 levels of nesting"). The embedded shard
/// refuses deeper inserts and updates with Overflow (15).
pub const MAX_STORED_DEPTH: usize = 100;

/// Parts an aggregation field path may have (`FieldPath is too long`, Overflow 15).
pub const MAX_FIELD_PATH_PARTS: usize = MAX_BSON_DEPTH;

/// Parts a query (match expression) path may have (`FieldPath is too long`, 5729100).
pub const MAX_MATCH_PATH_PARTS: usize = MAX_RESULT_DEPTH;

/// Nulls an update may add to an array to reach the index it sets (`$set: {"a.2000": 1}`
/// on a short array): mongod's `kMaxPaddingAllowed` (CannotBackfillArray, 34).
pub const MAX_ARRAY_BACKFILL: usize = 1_500_000;

/// Statements in one write command (`maxWriteBatchSize`; InvalidLength, 16, beyond it).
pub const MAX_WRITE_BATCH_SIZE: usize = 100_000;

/// Bytes one blocking aggregation stage may hold without `allowDiskUse` (mongod's
/// `internalQueryMaxBlockingSortMemoryUsageBytes` and `internalDocumentSourceGroupMaxMemoryBytes`
/// default; QueryExceededMemoryLimitNoDiskUseAllowed, 292, beyond it).
pub const DEFAULT_STAGE_MEMORY_BYTES: usize = 100 * 1024 * 1024;

/// The largest document an engine result may be once encoded: a user document plus the room
/// mongod allows internal documents (`BSONObjMaxInternalSize`; BSONObjectTooLarge, 10334,
/// beyond it).
pub const MAX_INTERNAL_DOCUMENT_SIZE: usize = 16 * 1024 * 1024 + 16 * 1024;

/// The stack each request is handled on: a worker thread of the server's runtime (tokio's
/// default, set explicitly in `main`). Every recursion bounded by the limits above must fit in
/// it; the fuzz targets run their inputs on a thread of this size so that they would see a
/// stack overflow the server would.
pub const WORKER_STACK_BYTES: usize = 2 * 1024 * 1024;

/// Longest database name (`DatabaseName::kMaxDatabaseNameLength`).
pub const MAX_DATABASE_NAME_LEN: usize = 63;

/// Longest `db.collection` namespace (`NamespaceString::MaxNsLen`).
pub const MAX_NAMESPACE_LEN: usize = 255;

/// A name as error messages show it: whole when short, else its first 200 bytes (a name
/// the size of a message must not make the error reply as large).
pub fn shown_name(name: &str) -> String {
    if name.len() <= 200 {
        return name.to_string();
    }
    let mut end = 200;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &name[..end])
}

/// Checks a database name as mongod does before creating anything: not empty, at most
/// [`MAX_DATABASE_NAME_LEN`] bytes, none of `/\. "$` or NUL. The error is the `errmsg` of
/// InvalidNamespace (73).
pub fn check_database_name(db: &str) -> Result<(), String> {
    let bad = db.is_empty()
        || db.len() > MAX_DATABASE_NAME_LEN
        || db
            .chars()
            .any(|c| matches!(c, '/' | '\\' | '.' | ' ' | '"' | '$' | '\0'));
    if bad {
        return Err(format!("Invalid database name: '{}'", shown_name(db)));
    }
    Ok(())
}

/// Checks `db.coll` as mongod does for a collection a command names: the database name, then a
/// collection name that is not empty, holds no `$` or NUL, does not start with `.`, and a
/// namespace of at most [`MAX_NAMESPACE_LEN`] bytes. The error is the `errmsg` of
/// InvalidNamespace (73).
pub fn check_namespace(db: &str, coll: &str) -> Result<(), String> {
    check_database_name(db)?;
    if coll.is_empty() || coll.contains('\0') || coll.contains('$') || coll.starts_with('.') {
        return Err(format!(
            "Invalid namespace specified '{}.{}'",
            shown_name(db),
            shown_name(coll)
        ));
    }
    if db.len() + 1 + coll.len() > MAX_NAMESPACE_LEN {
        return Err(format!(
            "Fully qualified namespace is too long. Namespace: {}.{} Max: {MAX_NAMESPACE_LEN}",
            shown_name(db),
            shown_name(coll)
        ));
    }
    Ok(())
}

/// The collection part of the namespaces a server gives the cursors of collection-less
/// commands (`db.aggregate`, `listCollections`): drivers name them in `getMore` and
/// `killCursors`, where mongod accepts them although they are no collection's.
pub const COLLECTIONLESS_CURSOR_COLLECTIONS: &[&str] = &["$cmd.aggregate", "$cmd.listCollections"];

/// [`check_namespace`] for the namespace of a cursor, which may also be a collection-less
/// command's ([`COLLECTIONLESS_CURSOR_COLLECTIONS`]).
pub fn check_cursor_namespace(db: &str, coll: &str) -> Result<(), String> {
    if COLLECTIONLESS_CURSOR_COLLECTIONS.contains(&coll) {
        return check_database_name(db);
    }
    check_namespace(db, coll)
}

/// What [`measure`] found: the deepest nesting (a document holding only scalars is level 1)
/// and the encoded size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Measure {
    /// Levels of documents and arrays, the outermost counting as one.
    pub depth: usize,
    /// Bytes of the BSON encoding.
    pub bytes: usize,
}

/// The encoded size and nesting depth of a document, computed without recursion.
pub fn measure(doc: &Document) -> Measure {
    let mut m = Measure { depth: 1, bytes: 5 };
    let mut stack = vec![(Frame::Doc(doc.iter()), 1)];
    walk(&mut m, &mut stack);
    m
}

/// The encoded size and depth of any value: a document or an array counts its own level, a
/// scalar is level 0 and its size is that of its value.
pub fn measure_value(v: &Bson) -> Measure {
    let mut m = Measure::default();
    let mut stack = Vec::new();
    open(v, 0, &mut m, &mut stack);
    walk(&mut m, &mut stack);
    m
}

/// A container being walked: the elements still to visit.
enum Frame<'a> {
    Doc(bson::document::Iter<'a>),
    Arr(std::iter::Enumerate<std::slice::Iter<'a, Bson>>),
}

fn walk<'a>(m: &mut Measure, stack: &mut Vec<(Frame<'a>, usize)>) {
    while let Some((frame, level)) = stack.last_mut() {
        let level = *level;
        let next = match frame {
            Frame::Doc(it) => it.next().map(|(k, v)| (k.len(), v)),
            Frame::Arr(it) => it.next().map(|(i, v)| (decimal_len(i), v)),
        };
        match next {
            Some((key_len, v)) => {
                m.bytes += 1 + key_len + 1;
                open(v, level, m, stack);
            }
            None => {
                stack.pop();
            }
        }
    }
}

/// Counts a value met at `level`: scalars are added whole, containers are pushed to be walked.
fn open<'a>(v: &'a Bson, level: usize, m: &mut Measure, stack: &mut Vec<(Frame<'a>, usize)>) {
    let frame = match v {
        Bson::Document(d) => Frame::Doc(d.iter()),
        Bson::Array(items) => Frame::Arr(items.iter().enumerate()),
        Bson::JavaScriptCodeWithScope(c) => {
            // Total length, then the code string, then the scope document.
            m.bytes += 4 + 4 + c.code.len() + 1;
            Frame::Doc(c.scope.iter())
        }
        other => {
            m.bytes += scalar_size(other);
            return;
        }
    };
    m.bytes += 5;
    m.depth = m.depth.max(level + 1);
    stack.push((frame, level + 1));
}

/// Bytes of the value part of a scalar element.
fn scalar_size(v: &Bson) -> usize {
    match v {
        Bson::Double(_) | Bson::Int64(_) | Bson::DateTime(_) | Bson::Timestamp(_) => 8,
        Bson::Int32(_) => 4,
        Bson::String(s) | Bson::JavaScriptCode(s) | Bson::Symbol(s) => 4 + s.len() + 1,
        Bson::Boolean(_) => 1,
        Bson::Null | Bson::Undefined | Bson::MinKey | Bson::MaxKey => 0,
        Bson::ObjectId(_) => 12,
        Bson::Decimal128(_) => 16,
        Bson::Binary(b) => {
            4 + 1
                + b.bytes.len()
                + if b.subtype == bson::spec::BinarySubtype::BinaryOld {
                    4
                } else {
                    0
                }
        }
        Bson::RegularExpression(r) => r.pattern.as_str().len() + 1 + r.options.as_str().len() + 1,
        Bson::DbPointer(_) => 4 + 1 + 12 + 64,
        Bson::Document(_) | Bson::Array(_) | Bson::JavaScriptCodeWithScope(_) => 5,
    }
}

fn decimal_len(mut n: usize) -> usize {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn nested(levels: usize) -> Document {
        let mut d = doc! {"x": 1};
        for _ in 1..levels {
            d = doc! {"a": d};
        }
        d
    }

    #[test]
    fn measures_size_like_the_encoder() {
        for d in [
            doc! {},
            doc! {"a": 1, "b": "xyz", "c": [1, 2.5, {"d": null}], "e": {"f": [[1], []]}},
            doc! {"bin": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![1, 2, 3] }, "o": bson::oid::ObjectId::new(), "t": bson::Timestamp { time: 1, increment: 2 }},
            nested(50),
        ] {
            assert_eq!(measure(&d).bytes, d.to_vec().unwrap().len(), "{d}");
        }
    }

    #[test]
    fn names_are_checked_like_mongod() {
        assert!(check_database_name("demo").is_ok());
        for bad in ["", "bad.name", "a/b", "$x", "a b", "a\0b", &"d".repeat(64)] {
            assert!(check_database_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_namespace("d", "bad.name").is_ok());
        assert!(check_namespace("d", "$x").is_err());
        let huge = "c".repeat(1 << 20);
        let e = check_namespace("d", &huge).unwrap_err();
        assert!(
            e.starts_with("Fully qualified namespace is too long"),
            "{e}"
        );
        assert!(e.len() < 400, "the message does not repeat a 1 MiB name");
    }

    #[test]
    fn measures_depth_without_recursion() {
        assert_eq!(measure(&doc! {}).depth, 1);
        assert_eq!(measure(&doc! {"a": {"b": 1}}).depth, 2);
        assert_eq!(measure(&doc! {"a": [[1]]}).depth, 3);
        assert_eq!(measure(&nested(150)).depth, 150);
        assert_eq!(
            measure_value(&Bson::Array(vec![Bson::Array(vec![])])).depth,
            2
        );
    }
}
