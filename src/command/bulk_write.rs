//! The 8.0 `bulkWrite` command, parsed once for every server: its namespaces (`nsInfo`), its
//! operations (`ops`, each read as the statement an `insert`, `update` or `delete` command
//! would carry, so the servers run them with the code those commands use), its options, and
//! the shape of its reply: one item per operation (`{ok, idx, code?, errmsg?, n, nModified?,
//! upserted?}`) behind a cursor on `admin.$cmd.bulkWrite`, with the summary counters
//! `nErrors`, `nInserted`, `nMatched`, `nModified`, `nUpserted`, `nDeleted` (mongod 8.0's
//! `BulkWriteCommandReply`).

use bson::{doc, Bson, Document, RawDocument};
use bytes::Bytes;

use super::{CommandError, CommandRequest, WriteKind};
use crate::limits::MAX_WRITE_BATCH_SIZE;
use crate::value::error_codes::ErrorCode;
use crate::value::field::{number_field, truthy};

/// The namespace of the cursor a `bulkWrite` reply carries.
pub const CURSOR_NS: &str = "admin.$cmd.bulkWrite";

/// One operation of a `bulkWrite`.
#[derive(Debug, Clone)]
pub struct BulkOp {
    /// Its index into `nsInfo`.
    pub ns: usize,
    /// insert, update or delete.
    pub kind: WriteKind,
    /// What an `insert` (the document), `update` (`{q, u, multi, upsert, …}`) or `delete`
    /// (`{q, limit, …}`) command would carry for it.
    pub statement: Document,
    /// The operation as the client sent it.
    pub raw: Bytes,
}

impl BulkOp {
    /// Whether it may touch several documents (`multi: true`).
    pub fn multi(&self) -> bool {
        match self.kind {
            WriteKind::Insert => false,
            WriteKind::Update => self.statement.get("multi").is_some_and(truthy),
            WriteKind::Delete => number_field(&self.statement, "limit") == Some(0),
        }
    }
}

/// A parsed `bulkWrite` request.
#[derive(Debug, Clone)]
pub struct BulkRequest {
    /// The `nsInfo` entries as sent.
    pub ns_info: Vec<Document>,
    /// Each entry's namespace, `db.coll`.
    pub namespaces: Vec<String>,
    /// The operations, in order.
    pub ops: Vec<BulkOp>,
    /// `ordered` (default true).
    pub ordered: bool,
    /// `errorsOnly` (default false).
    pub errors_only: bool,
    /// The command without `ops` and `nsInfo`.
    pub options: Document,
}

impl BulkRequest {
    /// The statement id of operation `i`: `stmtIds[i]`, else `stmtId + i`, else `i`.
    pub fn stmt_id(&self, i: usize) -> i32 {
        stmt_id(&self.options, i)
    }

    /// The database and collection of operation `i`.
    pub fn names(&self, i: usize) -> (&str, &str) {
        let ns = &self.namespaces[self.ops[i].ns];
        ns.split_once('.').unwrap_or((ns.as_str(), ""))
    }
}

/// The statement id of operation `i` of a `bulkWrite` whose options are `options`.
pub fn stmt_id(options: &Document, i: usize) -> i32 {
    if let Ok(ids) = options.get_array("stmtIds") {
        if let Some(v) = ids.get(i) {
            return match v {
                Bson::Int32(x) => *x,
                Bson::Int64(x) => *x as i32,
                Bson::Double(x) => *x as i32,
                _ => i as i32,
            };
        }
    }
    let first = number_field(options, "stmtId").unwrap_or(0) as i32;
    first.wrapping_add(i as i32)
}

fn unknown(field: &str) -> CommandError {
    CommandError::new(
        ErrorCode(40415),
        format!("BSON field 'bulkWrite.ops.{field}' is an unknown field."),
    )
}

fn missing(field: &str) -> CommandError {
    CommandError::new(
        ErrorCode(40414),
        format!("BSON field 'bulkWrite.ops.{field}' is missing but a required field"),
    )
}

fn wrong_type(field: &str, v: &Bson, expected: &str) -> CommandError {
    CommandError::new(
        ErrorCode::TypeMismatch,
        format!(
            "BSON field 'bulkWrite.ops.{field}' is the wrong type '{}', expected type '{expected}'",
            crate::value::field::type_name(v)
        ),
    )
}

fn object(op: &Document, field: &str) -> Result<Document, CommandError> {
    match op.get(field) {
        Some(Bson::Document(d)) => Ok(d.clone()),
        Some(other) => Err(wrong_type(field, other, "object")),
        None => Err(missing(field)),
    }
}

fn boolean(op: &Document, field: &str) -> Result<bool, CommandError> {
    match op.get(field) {
        None => Ok(false),
        Some(v @ (Bson::Boolean(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_))) => {
            Ok(truthy(v))
        }
        Some(other) => Err(wrong_type(field, other, "bool")),
    }
}

/// One operation in its command statement form.
fn parse_op(raw: Bytes, namespaces: usize) -> Result<BulkOp, CommandError> {
    let op = Document::from_reader(&raw[..])
        .map_err(|e| CommandError::new(ErrorCode::InvalidBSON, e.to_string()))?;
    let Some((first, index)) = op.iter().next() else {
        return Err(CommandError::new(
            ErrorCode::FailedToParse,
            "BulkWrite ops entry is empty: it must name one of insert, update or delete",
        ));
    };
    let kind = match first.as_str() {
        "insert" => WriteKind::Insert,
        "update" => WriteKind::Update,
        "delete" => WriteKind::Delete,
        other => {
            return Err(CommandError::new(
                ErrorCode::FailedToParse,
                format!(
                    "Unrecognized bulkWrite op type: '{other}', expected insert, update or delete"
                ),
            ))
        }
    };
    let ns = match index {
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) => number_field(&op, first).unwrap_or(-1),
        other => return Err(wrong_type(first, other, "int")),
    };
    if ns < 0 || ns as usize >= namespaces {
        return Err(CommandError::new(
            ErrorCode::BadValue,
            format!(
                "BulkWrite ops entry {} has an invalid nsInfo index.",
                crate::value::render::render_doc(&op)
            ),
        ));
    }
    let allowed: &[&str] = match kind {
        WriteKind::Insert => &["insert", "document"],
        WriteKind::Update => &[
            "update",
            "filter",
            "updateMods",
            "multi",
            "upsert",
            "arrayFilters",
            "hint",
            "collation",
            "sort",
            "constants",
        ],
        WriteKind::Delete => &["delete", "filter", "multi", "hint", "collation"],
    };
    if let Some(k) = op.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(unknown(k));
    }
    let statement = match kind {
        WriteKind::Insert => object(&op, "document")?,
        WriteKind::Update => {
            let mut s = doc! {"q": object(&op, "filter")?};
            match op.get("updateMods") {
                Some(u @ (Bson::Document(_) | Bson::Array(_))) => s.insert("u", u.clone()),
                Some(other) => return Err(wrong_type("updateMods", other, "object")),
                None => return Err(missing("updateMods")),
            };
            s.insert("multi", boolean(&op, "multi")?);
            s.insert("upsert", boolean(&op, "upsert")?);
            for (from, to) in [
                ("arrayFilters", "arrayFilters"),
                ("hint", "hint"),
                ("collation", "collation"),
                ("sort", "sort"),
                ("constants", "c"),
            ] {
                if let Some(v) = op.get(from) {
                    s.insert(to, v.clone());
                }
            }
            s
        }
        WriteKind::Delete => {
            let mut s = doc! {
                "q": object(&op, "filter")?,
                "limit": if boolean(&op, "multi")? { 0 } else { 1 },
            };
            for f in ["hint", "collation"] {
                if let Some(v) = op.get(f) {
                    s.insert(f, v.clone());
                }
            }
            s
        }
    };
    Ok(BulkOp {
        ns: ns as usize,
        kind,
        statement,
        raw,
    })
}

/// Parses and checks a `bulkWrite` as mongod does before running anything: on `admin`, 1 to 100,000
/// operations, not both `stmtId` and `stmtIds`, one statement id per operation, valid
/// namespaces, and every operation naming an `nsInfo` entry.
pub fn parse(req: &CommandRequest) -> Result<BulkRequest, CommandError> {
    req.require_admin()?;
    let options = req.options_document();
    let raw_ops = req.statement_bytes("ops")?;
    let raw_ns = req.statement_bytes("nsInfo")?;
    if raw_ops.is_empty() || raw_ops.len() > MAX_WRITE_BATCH_SIZE {
        return Err(CommandError::new(
            ErrorCode::InvalidLength,
            format!(
                "Write batch sizes must be between 1 and {MAX_WRITE_BATCH_SIZE}. Got {} operations.",
                raw_ops.len()
            ),
        ));
    }
    if options.contains_key("stmtId") && options.contains_key("stmtIds") {
        return Err(CommandError::new(
            ErrorCode::InvalidOptions,
            "May not specify both stmtId and stmtIds in bulkWrite command.",
        ));
    }
    if let Ok(ids) = options.get_array("stmtIds") {
        if ids.len() != raw_ops.len() {
            return Err(CommandError::new(
                ErrorCode::InvalidLength,
                format!(
                    "Number of statement ids must match the number of batch entries. Got {} statement ids but {} operations.",
                    ids.len(),
                    raw_ops.len()
                ),
            ));
        }
    }
    let mut ns_info = Vec::with_capacity(raw_ns.len());
    let mut namespaces = Vec::with_capacity(raw_ns.len());
    for raw in &raw_ns {
        let entry = RawDocument::from_bytes(&raw[..])
            .ok()
            .and_then(|r| Document::try_from(r).ok())
            .ok_or_else(|| CommandError::new(ErrorCode::InvalidBSON, "invalid nsInfo entry"))?;
        let ns = match entry.get("ns") {
            Some(Bson::String(s)) => s.clone(),
            Some(other) => {
                return Err(CommandError::new(
                    ErrorCode::TypeMismatch,
                    format!(
                        "BSON field 'bulkWrite.nsInfo.ns' is the wrong type '{}', expected type 'string'",
                        crate::value::field::type_name(other)
                    ),
                ))
            }
            None => {
                return Err(CommandError::new(
                    ErrorCode(40414),
                    "BSON field 'bulkWrite.nsInfo.ns' is missing but a required field",
                ))
            }
        };
        let valid = ns
            .split_once('.')
            .is_some_and(|(db, coll)| crate::limits::check_namespace(db, coll).is_ok());
        if !valid {
            return Err(CommandError::new(
                ErrorCode::InvalidNamespace,
                format!("Invalid namespace specified for bulkWrite: '{ns}'"),
            ));
        }
        ns_info.push(entry);
        namespaces.push(ns);
    }
    let ops = raw_ops
        .into_iter()
        .map(|raw| parse_op(raw, namespaces.len()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(BulkRequest {
        ns_info,
        namespaces,
        ordered: options.get("ordered").map(truthy).unwrap_or(true),
        errors_only: options.get("errorsOnly").is_some_and(truthy),
        ops,
        options,
    })
}

/// The reply item of an operation that succeeded: `n` documents inserted, matched or deleted;
/// for an update its `nModified` and the `_id` it upserted.
pub fn ok_item(idx: usize, n: i64, n_modified: Option<i64>, upserted: Option<Bson>) -> Document {
    let mut d = doc! {"ok": 1.0, "idx": idx as i32, "n": n as i32};
    if let Some(m) = n_modified {
        d.insert("nModified", m as i32);
    }
    if let Some(id) = upserted {
        d.insert("upserted", doc! {"_id": id});
    }
    d
}

/// The reply item of an operation that failed with `error` (a write error, `{index?, code,
/// errmsg, …extra}`): its extra fields (`keyPattern`, `errInfo`, …) are kept; an update's item
/// says `nModified: 0`.
pub fn error_item(idx: usize, kind: WriteKind, error: &Document) -> Document {
    let mut d = doc! {
        "ok": 0.0,
        "idx": idx as i32,
        "code": error.get_i32("code").unwrap_or(ErrorCode::InternalError.0),
        "errmsg": error.get_str("errmsg").unwrap_or(""),
    };
    for (k, v) in error {
        if !matches!(k.as_str(), "index" | "code" | "errmsg" | "ok" | "idx" | "n") {
            d.insert(k.clone(), v.clone());
        }
    }
    d.insert("n", 0);
    if kind == WriteKind::Update {
        d.insert("nModified", 0);
    }
    d
}

/// The summary counters of a `bulkWrite` reply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Operations that failed.
    pub n_errors: i64,
    /// Documents inserted.
    pub n_inserted: i64,
    /// Documents matched by updates that did not upsert.
    pub n_matched: i64,
    /// Documents updates changed.
    pub n_modified: i64,
    /// Documents upserted.
    pub n_upserted: i64,
    /// Documents deleted.
    pub n_deleted: i64,
}

impl Summary {
    /// Counts one operation's reply item.
    pub fn count(&mut self, kind: WriteKind, item: &Document) {
        if item.get_f64("ok").ok() != Some(1.0) {
            self.n_errors += 1;
            return;
        }
        let n = number_field(item, "n").unwrap_or(0);
        match kind {
            WriteKind::Insert => self.n_inserted += n,
            WriteKind::Update => {
                self.n_modified += number_field(item, "nModified").unwrap_or(0);
                if item.contains_key("upserted") {
                    self.n_upserted += 1;
                } else {
                    self.n_matched += n;
                }
            }
            WriteKind::Delete => self.n_deleted += n,
        }
    }

    /// The reply (without `ok`): every item, or only the errors under `errors_only`, in the
    /// cursor's first batch.
    pub fn reply(&self, items: Vec<Document>, errors_only: bool) -> Document {
        let batch: Vec<Bson> = items
            .into_iter()
            .filter(|i| !errors_only || i.get_f64("ok").ok() != Some(1.0))
            .map(Bson::Document)
            .collect();
        doc! {
            "cursor": {"id": 0i64, "firstBatch": batch, "ns": CURSOR_NS},
            "nErrors": self.n_errors as i32,
            "nInserted": self.n_inserted as i32,
            "nMatched": self.n_matched as i32,
            "nModified": self.n_modified as i32,
            "nUpserted": self.n_upserted as i32,
            "nDeleted": self.n_deleted as i32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_have_mongods_shape() {
        let ok = ok_item(2, 1, Some(0), Some(Bson::Int32(7)));
        assert_eq!(
            ok,
            doc! {"ok": 1.0, "idx": 2, "n": 1, "nModified": 0, "upserted": {"_id": 7}}
        );
        let e = error_item(
            3,
            WriteKind::Update,
            &doc! {"index": 0, "code": 11000, "errmsg": "dup", "keyValue": {"_id": 1}},
        );
        assert_eq!(
            e,
            doc! {"ok": 0.0, "idx": 3, "code": 11000, "errmsg": "dup", "keyValue": {"_id": 1}, "n": 0, "nModified": 0}
        );
        let mut s = Summary::default();
        s.count(WriteKind::Update, &ok);
        s.count(WriteKind::Update, &e);
        s.count(WriteKind::Insert, &ok_item(0, 1, None, None));
        s.count(WriteKind::Delete, &ok_item(1, 2, None, None));
        assert_eq!(
            s,
            Summary {
                n_errors: 1,
                n_inserted: 1,
                n_matched: 0,
                n_modified: 0,
                n_upserted: 1,
                n_deleted: 2
            }
        );
        let r = s.reply(vec![ok.clone(), e.clone()], true);
        assert_eq!(
            r.get_document("cursor")
                .unwrap()
                .get_array("firstBatch")
                .unwrap(),
            &vec![Bson::Document(e)]
        );
    }

    #[test]
    fn statement_ids() {
        assert_eq!(stmt_id(&doc! {"stmtIds": [5, 9]}, 1), 9);
        assert_eq!(stmt_id(&doc! {"stmtId": 4}, 2), 6);
        assert_eq!(stmt_id(&doc! {}, 3), 3);
    }
}
