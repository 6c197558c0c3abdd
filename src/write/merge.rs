//! Reply merging: child replies in, the client's reply out, no I/O (docs/design/write-path.md
//! section 3).
//!
//! Each child reply is kept as an account: its totals (`n`, `nModified`), which of its
//! statements ran, and the exact result of those whose result the reply tells apart (an insert
//! counts one; an upsert that inserted is listed in `upserted`). The other updates and deletes
//! of one child batch share its totals: a *residual*. A statement may run in several child
//! batches (a broadcast, a `$in` over several shards): each adds its own share, and a shard's
//! error never hides the others' counts, as mongos sums every child reply.
//!
//! The client's counts are the sum of every account, except in an ordered reply cut at its
//! first error k: then only what statements up to k did counts, which needs a residual's
//! members on both sides of k to be told apart; [`Merger::straddlers`] names those before k so
//! the executor can resolve them one by one. Several shards' errors for one statement combine
//! as mongos combines them: one error, or several with the same code, pass through; different
//! codes become 65 MultipleErrorsOccurred with every message and `errInfo.causedBy`.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;

use bson::{doc, Bson, Document, RawBsonRef, RawDocument, RawDocumentBuf};

use super::target::WriteKind;
use crate::value::error_codes::ErrorCode;
use crate::value::field::{number_field, number_raw};
use crate::wire::BsonDoc;

/// What came back for one child batch.
#[derive(Debug, Clone, PartialEq)]
pub enum ChildOutcome {
    /// The shard's reply document (`ok: 1` or `ok: 0`).
    Reply(Document),
    /// The shard's reply as it arrived, read in place by [`Merger::add`] (the routed batch
    /// path, where an owned copy of a reply listing one `upserted` entry per statement would
    /// cost more than the rest of the merge). [`ChildOutcome::into_owned`] makes it a
    /// [`ChildOutcome::Reply`] for any other reader.
    Raw(BsonDoc),
    /// The request failed on the way (network, timeout).
    Failed {
        /// 6 HostUnreachable or 89 NetworkTimeout.
        code: ErrorCode,
        /// What happened.
        message: String,
    },
}

impl ChildOutcome {
    /// The outcome with a reply read in place converted to an owned one.
    pub fn into_owned(self) -> ChildOutcome {
        match self {
            ChildOutcome::Raw(r) => ChildOutcome::Reply(owned_reply(r.raw())),
            other => other,
        }
    }

    /// Whether an ordered child batch stopped here: the request failed, or the reply is not
    /// `ok: 1.0` or lists write errors.
    pub fn stops_ordered(&self) -> bool {
        match self {
            ChildOutcome::Failed { .. } => true,
            ChildOutcome::Reply(r) => {
                r.get_f64("ok").ok() != Some(1.0) || r.contains_key("writeErrors")
            }
            ChildOutcome::Raw(r) => {
                let r = r.raw();
                let [ok, write_errors] = match crate::wire::last_fields(r, ["ok", "writeErrors"]) {
                    Some(found) => found,
                    None => [last(r, "ok"), last(r, "writeErrors")],
                };
                !matches!(ok, Some(RawBsonRef::Double(v)) if v == 1.0) || write_errors.is_some()
            }
        }
    }
}

/// A shard's reply as the write path reads it owned: without the shard's cluster-time and
/// replication gossip (`$clusterTime`, `operationTime`, `opTime`, `electionId`, …), which no
/// reader of a child's reply looks at (the client's reply carries the router's own) and which
/// costs more to convert than the rest of a small reply.
pub(crate) fn owned_reply(reply: &RawDocument) -> Document {
    let mut d = Document::new();
    for (k, v) in reply.iter().flatten() {
        if matches!(
            k.as_str(),
            "$clusterTime"
                | "operationTime"
                | "opTime"
                | "electionId"
                | "$configServerState"
                | "$gleStats"
                | "lastCommittedOpTime"
                | "$topologyTime"
        ) {
            continue;
        }
        if let Ok(v) = Bson::try_from(v) {
            d.insert(k.as_str(), v);
        }
    }
    d
}

/// The value of the last field `key` of `doc` (an owned document keeps the last of a repeated
/// field, so the in-place reader does too).
fn last<'a>(doc: &'a RawDocument, key: &str) -> Option<RawBsonRef<'a>> {
    let mut out = None;
    for (k, v) in doc.iter().flatten() {
        if k.as_str() == key {
            out = Some(v);
        }
    }
    out
}

/// One child batch's statements and outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildResult {
    /// The shard.
    pub shard: String,
    /// Global statement indexes, in child order.
    pub statements: Vec<usize>,
    /// Whether the child batch was ordered.
    pub ordered: bool,
    /// What came back.
    pub outcome: ChildOutcome,
}

#[derive(Debug, Clone, PartialEq)]
enum Stmt {
    /// Not run anywhere yet.
    Pending,
    /// Ran without error on every shard that answered for it so far.
    Done,
    /// Failed on at least one shard: the errors, in the order they came.
    Failed(Vec<Document>),
    /// Hit stale routing: to be retargeted.
    Stale(Document),
}

/// The exact result of one statement in one child batch.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Exact {
    n: i64,
    n_modified: i64,
}

/// One child reply, as counted.
#[derive(Debug, Clone, PartialEq)]
struct Account {
    n: i64,
    n_modified: i64,
    /// Each statement that ran without error (global index), with its exact result when the
    /// reply tells it apart.
    ran: Vec<(usize, Option<Exact>)>,
    /// Upserted statements by global index, each with where its `_id` element (type byte,
    /// `_id\0`, value, as encoded) lies in `ids`.
    upserted: Vec<(usize, Range<usize>)>,
    /// The upserted `_id` elements, back to back.
    ids: Vec<u8>,
}

impl Account {
    /// The totals of the members without an exact result.
    fn residual(&self) -> Exact {
        let exact = self
            .ran
            .iter()
            .filter_map(|(_, e)| *e)
            .fold(Exact::default(), |a, e| Exact {
                n: a.n + e.n,
                n_modified: a.n_modified + e.n_modified,
            });
        Exact {
            n: self.n - exact.n,
            n_modified: self.n_modified - exact.n_modified,
        }
    }

    /// What statements up to `limit` did in this child.
    fn counted_up_to(&self, limit: usize) -> Exact {
        let mut out = Exact::default();
        let mut before = false;
        for (g, e) in &self.ran {
            match e {
                Some(e) if *g <= limit => {
                    out.n += e.n;
                    out.n_modified += e.n_modified;
                }
                Some(_) => {}
                None if *g <= limit => before = true,
                None => {}
            }
        }
        // A residual with members on both sides of the limit that was not resolved (the proof
        // keeps such bulks from being rewritten) is counted when any member counts.
        if before {
            let r = self.residual();
            out.n += r.n;
            out.n_modified += r.n_modified;
        }
        out
    }
}

/// Accumulates child results into the client's reply.
#[derive(Debug, Clone)]
pub struct Merger {
    kind: WriteKind,
    ordered: bool,
    stmts: Vec<Stmt>,
    accounts: Vec<Account>,
    wces: Vec<(String, Document)>,
    n_modified_missing: bool,
    /// Statements applied after the first error that the executor could not undo.
    not_undone: Vec<usize>,
    /// Statements applied after the first error that the executor undid.
    undone: Vec<usize>,
}

/// StaleConfig, StaleEpoch, StaleShardVersion, and StaleDbVersion (which only a child batch
/// sent to a database's primary shard, carrying `databaseVersion`, can meet).
const STALE_CODES: &[i32] = &[13388, 150, 63, 249];

fn error_doc(index: usize, code: ErrorCode, message: &str) -> Document {
    doc! {"index": index as i32, "code": code.0, "errmsg": message}
}

/// One statement's errors from several shards, as mongos combines them.
fn combine(index: usize, errors: &[Document]) -> Document {
    let code = |e: &Document| e.get_i32("code").unwrap_or(0);
    match errors {
        [] => error_doc(index, ErrorCode::InternalError, "no error recorded"),
        [one] => one.clone(),
        [first, rest @ ..] if rest.iter().all(|e| code(e) == code(first)) => first.clone(),
        many => {
            let messages: Vec<&str> = many
                .iter()
                .map(|e| e.get_str("errmsg").unwrap_or(""))
                .collect();
            let caused_by: Vec<Bson> = many.iter().cloned().map(Bson::Document).collect();
            let mut d = error_doc(
                index,
                ErrorCode::MultipleErrorsOccurred,
                &format!("multiple errors for op : {}", messages.join(" :: and :: ")),
            );
            d.insert("errInfo", doc! {"causedBy": caused_by});
            d
        }
    }
}

/// What the merger reads of an `ok: 1` child reply.
struct ReplyParts<'a> {
    n: Option<i64>,
    n_modified: Option<i64>,
    /// Write errors by the child's statement index.
    errors: BTreeMap<usize, Document>,
    /// Upserted `_id` elements (type byte, `_id\0`, value, as encoded) by the child's
    /// statement index.
    upserted: BTreeMap<usize, Cow<'a, [u8]>>,
    wce: Option<Document>,
}

impl<'a> ReplyParts<'a> {
    /// The last `ok`, `n`, `nModified`, `writeErrors`, `upserted` and `writeConcernError` of
    /// a reply's `items`; `None` at an item that does not read.
    fn fields(
        items: impl Iterator<Item = Option<(&'a bson::raw::CStr, RawBsonRef<'a>)>>,
    ) -> Option<[Option<RawBsonRef<'a>>; 6]> {
        let mut found = [None; 6];
        for item in items {
            let (k, v) = item?;
            let slot = match k.as_str() {
                "ok" => 0,
                "n" => 1,
                "nModified" => 2,
                "writeErrors" => 3,
                "upserted" => 4,
                "writeConcernError" => 5,
                _ => continue,
            };
            found[slot] = Some(v);
        }
        Some(found)
    }

    fn from_document(reply: &Document) -> ReplyParts<'a> {
        let mut errors = BTreeMap::new();
        if let Ok(list) = reply.get_array("writeErrors") {
            for e in list.iter().filter_map(|e| e.as_document()) {
                if let Ok(ci) = e.get_i32("index") {
                    errors.insert(ci as usize, e.clone());
                }
            }
        }
        let mut upserted = BTreeMap::new();
        if let Ok(list) = reply.get_array("upserted") {
            for u in list.iter().filter_map(|u| u.as_document()) {
                if let (Ok(ci), Some(id)) = (u.get_i32("index"), u.get("_id")) {
                    if let Some(e) = id_element(id) {
                        upserted.insert(ci as usize, Cow::Owned(e));
                    }
                }
            }
        }
        ReplyParts {
            n: number_field(reply, "n"),
            n_modified: number_field(reply, "nModified"),
            errors,
            upserted,
            wce: reply.get_document("writeConcernError").ok().cloned(),
        }
    }

    /// Reads an `ok: 1` reply in place, as [`ReplyParts::from_document`] reads its owned
    /// copy; `None` for any other reply and for bytes it does not follow.
    fn from_raw(reply: &'a RawDocument) -> Option<ReplyParts<'a>> {
        // The byte walk reads a reply without arrays (every reply without write errors or
        // upserts) as the `bson` crate's iterator does; a reply it does not read is read by
        // that iterator.
        let [ok, n, n_modified, error_list, upserted_list, wce] =
            match Self::fields(crate::wire::elements(reply)) {
                Some(found) => found,
                None => Self::fields(reply.iter().map(Result::ok))?,
            };
        match ok? {
            RawBsonRef::Double(1.0) => {}
            RawBsonRef::Int32(1) => {}
            _ => return None,
        }
        let mut errors = BTreeMap::new();
        if let Some(RawBsonRef::Array(list)) = error_list {
            for e in list {
                if let RawBsonRef::Document(e) = e.ok()? {
                    if let Some(RawBsonRef::Int32(ci)) = last(e, "index") {
                        errors.insert(ci as usize, Document::try_from(e).ok()?);
                    }
                }
            }
        }
        let mut upserted = BTreeMap::new();
        if let Some(RawBsonRef::Array(list)) = upserted_list {
            for u in list {
                let RawBsonRef::Document(u) = u.ok()? else {
                    continue;
                };
                let (mut ci, mut id) = (None, None);
                for e in u.iter_elements() {
                    let e = e.ok()?;
                    match e.key().as_str() {
                        "index" => ci = Some(e.value().ok()?),
                        "_id" => id = Some(element_bytes(u, &e)?),
                        _ => {}
                    }
                }
                if let (Some(RawBsonRef::Int32(ci)), Some(id)) = (ci, id) {
                    upserted.insert(ci as usize, Cow::Borrowed(id));
                }
            }
        }
        let wce = match wce {
            Some(RawBsonRef::Document(w)) => Some(Document::try_from(w).ok()?),
            _ => None,
        };
        Some(ReplyParts {
            n: n.and_then(number_raw),
            n_modified: n_modified.and_then(number_raw),
            errors,
            upserted,
            wce,
        })
    }
}

/// The bytes of element `e` of `doc`: type byte, key, value.
fn element_bytes<'a>(doc: &'a RawDocument, e: &bson::raw::RawElement<'a>) -> Option<&'a [u8]> {
    let bytes = doc.as_bytes();
    let key = e.key().as_str();
    // The key is read from the document's own bytes, right after the type byte.
    let key_at = (key.as_ptr() as usize).checked_sub(bytes.as_ptr() as usize)?;
    bytes.get(key_at.checked_sub(1)?..key_at + key.len() + 1 + e.size())
}

/// `_id: id` encoded as an element (type byte, `_id\0`, value).
fn id_element(id: &Bson) -> Option<Vec<u8>> {
    let d = RawDocumentBuf::try_from(&doc! {"_id": id.clone()}).ok()?;
    let bytes = d.as_bytes();
    bytes.get(4..bytes.len() - 1).map(<[u8]>::to_vec)
}

/// The value of an `_id` element written by [`id_element`] or copied from a reply.
fn id_value(element: &[u8]) -> Bson {
    let mut d = Vec::with_capacity(element.len() + 5);
    d.extend_from_slice(&((element.len() + 5) as i32).to_le_bytes());
    d.extend_from_slice(element);
    d.push(0);
    RawDocument::from_bytes(&d)
        .ok()
        .and_then(|d| d.iter().next()?.ok())
        .and_then(|(_, v)| Bson::try_from(v).ok())
        .unwrap_or(Bson::Null)
}

impl Merger {
    /// A merger for `n` statements of a `kind` command.
    pub fn new(kind: WriteKind, ordered: bool, n: usize) -> Merger {
        Merger {
            kind,
            ordered,
            stmts: vec![Stmt::Pending; n],
            accounts: Vec::new(),
            wces: Vec::new(),
            n_modified_missing: false,
            not_undone: Vec::new(),
            undone: Vec::new(),
        }
    }

    /// Records a targeting error for statement `i`.
    pub fn fail(&mut self, i: usize, code: ErrorCode, message: &str) {
        self.mark_error(i, error_doc(i, code, message));
    }

    fn mark_ran(&mut self, i: usize) {
        if let Some(s) = self.stmts.get_mut(i) {
            if matches!(s, Stmt::Pending | Stmt::Stale(_)) {
                *s = Stmt::Done;
            }
        }
    }

    fn mark_error(&mut self, i: usize, mut err: Document) {
        err.insert("index", i as i32);
        let stale = err.get_i32("code").is_ok_and(|c| STALE_CODES.contains(&c));
        if let Some(s) = self.stmts.get_mut(i) {
            match s {
                Stmt::Failed(errors) if !stale => errors.push(err),
                Stmt::Failed(_) => {}
                _ if stale => *s = Stmt::Stale(err),
                _ => *s = Stmt::Failed(vec![err]),
            }
        }
    }

    /// Adds one child's result.
    pub fn add(&mut self, child: &ChildResult) {
        let reply = match &child.outcome {
            ChildOutcome::Failed { code, message } => {
                self.fail_child(child, *code, message, None);
                return;
            }
            ChildOutcome::Raw(raw) => {
                // An `ok: 1` reply is read in place; anything else (a failed batch, bytes
                // the reader does not follow) goes through the owned document.
                match ReplyParts::from_raw(raw.raw()) {
                    Some(parts) => self.add_parts(child, parts),
                    None => self.add_owned(child, &owned_reply(raw.raw())),
                }
                return;
            }
            ChildOutcome::Reply(r) => r,
        };
        self.add_owned(child, reply);
    }

    fn add_owned(&mut self, child: &ChildResult, reply: &Document) {
        if reply.get_f64("ok").ok() != Some(1.0) && reply.get_i32("ok").ok() != Some(1) {
            let code = ErrorCode(
                reply
                    .get_i32("code")
                    .unwrap_or(ErrorCode::OperationFailed.0),
            );
            let message = reply.get_str("errmsg").unwrap_or("child batch failed");
            self.fail_child(child, code, message, Some(reply));
            return;
        }
        self.add_parts(child, ReplyParts::from_document(reply));
    }

    /// Adds an `ok: 1` child reply's account.
    fn add_parts(&mut self, child: &ChildResult, parts: ReplyParts<'_>) {
        let ReplyParts {
            n,
            n_modified,
            errors,
            upserted,
            wce,
        } = parts;
        if let Some(wce) = wce {
            self.wces.push((child.shard.clone(), wce));
        }
        let first_error = errors.keys().next().copied();
        // A shard stops a batch at stale routing even when it is unordered.
        let first_stale = errors
            .iter()
            .find(|(_, e)| e.get_i32("code").is_ok_and(|c| STALE_CODES.contains(&c)))
            .map(|(ci, _)| *ci);
        let executed = |ci: usize| {
            let stop = if child.ordered {
                first_error
            } else {
                first_stale
            };
            stop.is_none_or(|s| ci < s) && !errors.contains_key(&ci)
        };
        for (ci, e) in &errors {
            if let Some(&g) = child.statements.get(*ci) {
                self.mark_error(g, e.clone());
            }
        }
        let n = n.unwrap_or(0);
        let n_modified = match n_modified {
            Some(m) => m,
            None => {
                if self.kind == WriteKind::Update {
                    self.n_modified_missing = true;
                }
                0
            }
        };
        let mut account = Account {
            n,
            n_modified,
            ran: Vec::new(),
            upserted: Vec::new(),
            ids: Vec::new(),
        };
        for (ci, &g) in child.statements.iter().enumerate() {
            if !executed(ci) {
                continue;
            }
            self.mark_ran(g);
            let id = upserted.get(&ci);
            let exact = match self.kind {
                WriteKind::Insert => Some(Exact {
                    n: 1,
                    n_modified: 0,
                }),
                _ => id.is_some().then_some(Exact {
                    n: 1,
                    n_modified: 0,
                }),
            };
            if let Some(id) = id {
                let start = account.ids.len();
                account.ids.extend_from_slice(id);
                account.upserted.push((g, start..account.ids.len()));
            }
            account.ran.push((g, exact));
        }
        // A child batch of one statement tells its result exactly.
        if let [(_, e @ None)] = account.ran.as_mut_slice() {
            *e = Some(Exact { n, n_modified });
        }
        self.accounts.push(account);
    }

    fn fail_child(
        &mut self,
        child: &ChildResult,
        code: ErrorCode,
        message: &str,
        reply: Option<&Document>,
    ) {
        let targets: Vec<usize> = if child.ordered {
            child.statements.first().copied().into_iter().collect()
        } else {
            child.statements.clone()
        };
        for g in targets {
            let mut e = error_doc(g, code, message);
            if let Some(r) = reply {
                for k in ["ns", "vReceived", "vWanted", "shardId", "errInfo"] {
                    if let Some(v) = r.get(k) {
                        e.insert(k, v.clone());
                    }
                }
            }
            self.mark_error(g, e);
        }
    }

    /// The lowest failed statement.
    pub fn first_error(&self) -> Option<usize> {
        self.stmts.iter().position(|s| matches!(s, Stmt::Failed(_)))
    }

    /// Whether a statement hit a stale routing error.
    pub fn has_stale(&self) -> bool {
        self.stmts.iter().any(|s| matches!(s, Stmt::Stale(_)))
    }

    /// The stale errors statements hit (as the shards sent them), for the routing refresh.
    pub fn stale_errors(&self) -> Vec<Document> {
        self.stmts
            .iter()
            .filter_map(|s| match s {
                Stmt::Stale(e) => Some(e.clone()),
                _ => None,
            })
            .collect()
    }

    /// Statements not finished (pending or stale), in order; stale ones become pending.
    pub fn take_unfinished(&mut self) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, s) in self.stmts.iter_mut().enumerate() {
            match s {
                Stmt::Stale(_) => {
                    *s = Stmt::Pending;
                    out.push(i);
                }
                Stmt::Pending => out.push(i),
                _ => {}
            }
        }
        out
    }

    /// Fails every statement still stale or waiting behind one with NoProgressMade (82), as
    /// mongos does after 5 rounds.
    pub fn give_up_stale(&mut self, ns: &str) {
        for (i, s) in self.stmts.iter_mut().enumerate() {
            if matches!(s, Stmt::Stale(_) | Stmt::Pending) {
                *s = Stmt::Failed(vec![error_doc(
                    i,
                    ErrorCode::NoProgressMade,
                    &format!(
                        "no progress was made executing batch write op in {ns} after 5 rounds"
                    ),
                )]);
            }
        }
    }

    /// Number of finished statements (done or failed): progress between rounds.
    pub fn finished(&self) -> usize {
        self.stmts
            .iter()
            .filter(|s| matches!(s, Stmt::Done | Stmt::Failed(_)))
            .count()
    }

    /// Statements before the first error whose result a child reply only totals together with
    /// statements after it: their exact results are needed for an ordered reply.
    pub fn straddlers(&self) -> Vec<usize> {
        let Some(e) = self.first_error().filter(|_| self.ordered) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for a in &self.accounts {
            let residual: Vec<usize> = a
                .ran
                .iter()
                .filter(|(_, x)| x.is_none())
                .map(|(g, _)| *g)
                .collect();
            if residual.iter().any(|g| *g > e) {
                out.extend(residual.into_iter().filter(|g| *g < e));
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Records the exact result of statement `i` (obtained by resending it alone under its
    /// statement id).
    pub fn resolve(&mut self, i: usize, n: i64, n_modified: i64) {
        for a in &mut self.accounts {
            for (g, e) in &mut a.ran {
                if *g == i && e.is_none() {
                    *e = Some(Exact { n, n_modified });
                    return;
                }
            }
        }
    }

    /// Whether no statement was applied (every one failed or never ran).
    pub fn nothing_applied(&self) -> bool {
        self.accounts.iter().all(|a| a.ran.is_empty())
    }

    /// Statements after the first error that ran anyway (rewritten bulks only), minus those
    /// undone since.
    pub fn applied_after_error(&self) -> Vec<usize> {
        let Some(e) = self.first_error() else {
            return Vec::new();
        };
        let mut out: Vec<usize> = self
            .accounts
            .iter()
            .flat_map(|a| a.ran.iter().map(|(g, _)| *g))
            .filter(|g| *g > e && !self.undone.contains(g))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Records which statements applied after the first error were undone (`undone`) and which
    /// could not be (`not_undone`, reported in the first error's `errInfo.appliedAfterError`).
    pub fn note_undo(&mut self, undone: &[usize], not_undone: &[usize]) {
        self.undone.extend_from_slice(undone);
        self.not_undone.extend_from_slice(not_undone);
        self.not_undone.sort_unstable();
        self.not_undone.dedup();
    }

    /// What the client's reply says, in its order.
    fn parts(&self) -> ClientParts<'_> {
        let limit = if self.ordered {
            self.first_error()
        } else {
            None
        };
        let (mut n, mut n_modified) = (0i64, 0i64);
        let mut upserted: Vec<(usize, &[u8])> = Vec::new();
        for a in &self.accounts {
            match limit {
                None => {
                    n += a.n;
                    n_modified += a.n_modified;
                }
                Some(e) => {
                    let c = a.counted_up_to(e);
                    n += c.n;
                    n_modified += c.n_modified;
                }
            }
            upserted.extend(
                a.upserted
                    .iter()
                    .filter(|(g, _)| limit.is_none_or(|e| *g <= e))
                    .filter_map(|(g, r)| Some((*g, a.ids.get(r.clone())?))),
            );
        }
        upserted.sort_by_key(|(g, _)| *g);
        let errors = self.write_errors();
        let all_failed = errors.len() == self.stmts.len();
        let report_wce = errors.is_empty() || (!self.ordered && !all_failed);
        ClientParts {
            n,
            n_modified: (self.kind == WriteKind::Update && !self.n_modified_missing)
                .then_some(n_modified),
            upserted,
            errors,
            wce: if report_wce {
                merge_write_concern_errors(&self.wces)
            } else {
                None
            },
        }
    }

    /// The client's `writeErrors`: every failed statement's error, or in an ordered reply the
    /// first one's.
    pub fn write_errors(&self) -> Vec<Bson> {
        let limit = if self.ordered {
            self.first_error()
        } else {
            None
        };
        let failed = |i: usize, s: &Stmt| match s {
            Stmt::Failed(errors) => Some(Bson::Document(combine(i, errors))),
            _ => None,
        };
        let mut errors: Vec<Bson> = match limit {
            Some(e) => failed(e, &self.stmts[e]).into_iter().collect(),
            None => self
                .stmts
                .iter()
                .enumerate()
                .filter_map(|(i, s)| failed(i, s))
                .collect(),
        };
        if !self.not_undone.is_empty() {
            if let Some(Bson::Document(first)) = errors.first_mut() {
                let mut info = first.get_document("errInfo").cloned().unwrap_or_default();
                info.insert(
                    "appliedAfterError",
                    self.not_undone
                        .iter()
                        .map(|i| *i as i32)
                        .collect::<Vec<i32>>(),
                );
                first.insert("errInfo", info);
            }
        }
        errors
    }

    /// The client's reply (without `ok` and cluster time).
    pub fn reply(&self) -> Document {
        let p = self.parts();
        let mut out = doc! {"n": count(p.n)};
        if let Some(m) = p.n_modified {
            out.insert("nModified", count(m));
        }
        if !p.upserted.is_empty() {
            let list: Vec<Bson> = p
                .upserted
                .into_iter()
                .map(|(g, id)| Bson::Document(doc! {"index": g as i32, "_id": id_value(id)}))
                .collect();
            out.insert("upserted", list);
        }
        if !p.errors.is_empty() {
            out.insert("writeErrors", p.errors);
        }
        if let Some(wce) = p.wce {
            out.insert("writeConcernError", wce);
        }
        out
    }

    /// [`Merger::reply`] written straight as bytes, the same bytes its encoding gives: the
    /// `upserted` entries are written from the `_id` elements the child replies carried, with
    /// no document built per statement. `None` if the write errors or the write concern error
    /// cannot be encoded.
    pub fn reply_raw(&self) -> Option<RawDocumentBuf> {
        let p = self.parts();
        let mut out: Vec<u8> = Vec::with_capacity(
            64 + p
                .upserted
                .iter()
                .map(|(_, id)| id.len() + 24)
                .sum::<usize>(),
        );
        out.extend_from_slice(&[0; 4]);
        put_count(&mut out, b"n\0", p.n);
        if let Some(m) = p.n_modified {
            put_count(&mut out, b"nModified\0", m);
        }
        if !p.upserted.is_empty() {
            out.push(0x04);
            out.extend_from_slice(b"upserted\0");
            let list_at = out.len();
            out.extend_from_slice(&[0; 4]);
            let mut key = [0u8; 20];
            for (i, (g, id)) in p.upserted.iter().enumerate() {
                out.push(0x03);
                out.extend_from_slice(array_key(&mut key, i));
                out.push(0);
                // {index: Int32, _id: …}: length, index element, the `_id` element, end.
                let len = 4 + 1 + 6 + 4 + id.len() + 1;
                out.extend_from_slice(&(len as i32).to_le_bytes());
                out.push(0x10);
                out.extend_from_slice(b"index\0");
                out.extend_from_slice(&(*g as i32).to_le_bytes());
                out.extend_from_slice(id);
                out.push(0);
            }
            out.push(0);
            let list_len = (out.len() - list_at) as i32;
            out[list_at..list_at + 4].copy_from_slice(&list_len.to_le_bytes());
        }
        if !p.errors.is_empty() || p.wce.is_some() {
            let mut tail = Document::new();
            if !p.errors.is_empty() {
                tail.insert("writeErrors", p.errors);
            }
            if let Some(wce) = p.wce {
                tail.insert("writeConcernError", wce);
            }
            let tail = RawDocumentBuf::try_from(&tail).ok()?;
            let bytes = tail.as_bytes();
            out.extend_from_slice(bytes.get(4..bytes.len() - 1)?);
        }
        out.push(0);
        let len = i32::try_from(out.len()).ok()?;
        out[..4].copy_from_slice(&len.to_le_bytes());
        RawDocumentBuf::from_bytes(out).ok()
    }
}

/// What the client's reply says: [`Merger::reply`] and [`Merger::reply_raw`] write it.
struct ClientParts<'a> {
    n: i64,
    /// Present for an update whose child replies all had it.
    n_modified: Option<i64>,
    /// Upserted statements (global index) with their `_id` elements, in statement order.
    upserted: Vec<(usize, &'a [u8])>,
    errors: Vec<Bson>,
    wce: Option<Document>,
}

/// Writes `name: n` as mongod counts it: Int32 when it fits, else Int64 (see [`count`]).
fn put_count(out: &mut Vec<u8>, name: &[u8], n: i64) {
    match i32::try_from(n) {
        Ok(v) => {
            out.push(0x10);
            out.extend_from_slice(name);
            out.extend_from_slice(&v.to_le_bytes());
        }
        Err(_) => {
            out.push(0x12);
            out.extend_from_slice(name);
            out.extend_from_slice(&n.to_le_bytes());
        }
    }
}

/// The decimal digits of array index `i`, written into `buf`.
fn array_key(buf: &mut [u8; 20], mut i: usize) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (i % 10) as u8;
        i /= 10;
        if i == 0 {
            break;
        }
    }
    &buf[at..]
}

fn count(n: i64) -> Bson {
    i32::try_from(n).map(Bson::Int32).unwrap_or(Bson::Int64(n))
}

/// The client's `writeConcernError` from the child batches' ones, each with its shard, in the
/// order they arrived, merged as mongos 8.0 merges them (the replica-set core's
/// [`merge_write_concern_errors`](crate::backend::topology::write_concern::merge_write_concern_errors):
/// one keeps its code, with `"<CodeName>: <errmsg>; Error details: <errInfo> at <shard>"`;
/// several are 64, `"Multiple errors reported :: … :: and :: …"`).
pub fn merge_write_concern_errors(wces: &[(String, Document)]) -> Option<Document> {
    use crate::backend::topology::write_concern::{self, ShardWriteConcernError};
    let errors: Vec<ShardWriteConcernError> = wces
        .iter()
        .filter_map(|(shard, w)| ShardWriteConcernError::from_document(shard, w))
        .collect();
    write_concern::merge_write_concern_errors(&errors, &crate::backend::shard::PRINTER)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn child(shard: &str, stmts: &[usize], ordered: bool, reply: Document) -> ChildResult {
        ChildResult {
            shard: shard.into(),
            statements: stmts.to_vec(),
            ordered,
            outcome: ChildOutcome::Reply(reply),
        }
    }

    #[test]
    fn remaps_indexes_and_counts_before_the_first_error() {
        let mut m = Merger::new(WriteKind::Insert, true, 6);
        m.add(&child("A", &[0, 2, 4], true, doc! {"n": 3, "ok": 1.0}));
        m.add(&child(
            "B",
            &[1, 3, 5],
            true,
            doc! {"n": 1, "writeErrors": [{"index": 1, "code": 11000, "errmsg": "dup"}], "ok": 1.0},
        ));
        let r = m.reply();
        assert_eq!(
            r.get_i32("n").unwrap(),
            3,
            "statements 0, 1, 2 precede the error at 3"
        );
        let errs = r.get_array("writeErrors").unwrap();
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].as_document().unwrap().get_i32("index").unwrap(), 3);
        assert_eq!(m.applied_after_error(), vec![4]);
        assert_eq!(m.take_unfinished(), vec![5]);
    }

    #[test]
    fn unordered_counts_everything() {
        let mut m = Merger::new(WriteKind::Insert, false, 4);
        m.add(&child(
            "A",
            &[0, 2],
            false,
            doc! {"n": 1, "writeErrors": [{"index": 0, "code": 11000, "errmsg": "dup"}], "ok": 1.0},
        ));
        m.add(&child(
            "B",
            &[1, 3],
            false,
            doc! {"n": 1, "writeErrors": [{"index": 1, "code": 11000, "errmsg": "dup"}], "ok": 1.0},
        ));
        let r = m.reply();
        assert_eq!(r.get_i32("n").unwrap(), 2);
        let idx: Vec<i32> = r
            .get_array("writeErrors")
            .unwrap()
            .iter()
            .map(|e| e.as_document().unwrap().get_i32("index").unwrap())
            .collect();
        assert_eq!(idx, vec![0, 3]);
    }

    #[test]
    fn updates_upserts_and_residuals() {
        let mut m = Merger::new(WriteKind::Update, true, 5);
        // A: statements 0, 2, 4 — 2 was upserted, 0 and 4 matched (one modified).
        m.add(&child(
            "A",
            &[0, 2, 4],
            true,
            doc! {"n": 3, "nModified": 1, "upserted": [{"index": 1, "_id": 7}], "ok": 1.0},
        ));
        m.add(&child(
            "B",
            &[1, 3],
            true,
            doc! {"n": 2, "nModified": 2, "ok": 1.0},
        ));
        let r = m.reply();
        assert_eq!(r.get_i32("n").unwrap(), 5);
        assert_eq!(r.get_i32("nModified").unwrap(), 3);
        let up = r.get_array("upserted").unwrap()[0]
            .as_document()
            .unwrap()
            .clone();
        assert_eq!(up, doc! {"index": 2, "_id": 7});

        // Now B fails at statement 3: A's residual {0, 4} straddles it.
        let mut m = Merger::new(WriteKind::Update, true, 5);
        m.add(&child(
            "A",
            &[0, 2, 4],
            true,
            doc! {"n": 3, "nModified": 1, "upserted": [{"index": 1, "_id": 7}], "ok": 1.0},
        ));
        m.add(&child("B", &[1, 3], true, doc! {"n": 1, "nModified": 1, "writeErrors": [{"index": 1, "code": 66, "errmsg": "x"}], "ok": 1.0}));
        assert_eq!(m.straddlers(), vec![0]);
        m.resolve(0, 1, 0);
        assert!(m.straddlers().is_empty());
        let r = m.reply();
        // 0 (n 1, mod 0) + 1 (n 1, mod 1) + 2 (upsert) precede the error at 3.
        assert_eq!(r.get_i32("n").unwrap(), 3);
        assert_eq!(r.get_i32("nModified").unwrap(), 1);
        assert_eq!(m.applied_after_error(), vec![4]);
    }

    #[test]
    fn failed_children_and_stale_routing() {
        let mut m = Merger::new(WriteKind::Delete, true, 4);
        m.add(&ChildResult {
            shard: "A".into(),
            statements: vec![0, 1],
            ordered: true,
            outcome: ChildOutcome::Failed {
                code: ErrorCode::HostUnreachable,
                message: "gone".into(),
            },
        });
        let r = m.reply();
        let e = r.get_array("writeErrors").unwrap()[0]
            .as_document()
            .unwrap()
            .clone();
        assert_eq!(e.get_i32("index").unwrap(), 0);
        assert_eq!(e.get_i32("code").unwrap(), 6);

        let mut m = Merger::new(WriteKind::Insert, false, 3);
        m.add(&child("A", &[0, 1], false, doc! {"n": 0, "writeErrors": [{"index": 0, "code": 13388, "errmsg": "stale"}], "ok": 1.0}));
        assert!(m.has_stale());
        assert_eq!(
            m.take_unfinished(),
            vec![0, 1, 2],
            "a shard stops even an unordered batch at stale routing: 1 never ran"
        );
        m.add(&child("A", &[0], false, doc! {"n": 0, "writeErrors": [{"index": 0, "code": 13388, "errmsg": "stale"}], "ok": 1.0}));
        m.give_up_stale("d.c");
        let r = m.reply();
        let e = r.get_array("writeErrors").unwrap()[0]
            .as_document()
            .unwrap()
            .clone();
        assert_eq!(e.get_i32("code").unwrap(), 82);
    }

    /// Each child reply (with the shard's gossip appended, as it arrives) merged twice: read in
    /// place, and through the owned document the merger read before. Asserts the two client
    /// replies are the same bytes, and returns the in-place merger.
    fn merged_both_ways(
        kind: WriteKind,
        ordered: bool,
        n: usize,
        children: &[(&str, &[usize], RawDocumentBuf)],
    ) -> Merger {
        let mut owned = Merger::new(kind, ordered, n);
        let mut in_place = Merger::new(kind, ordered, n);
        for (shard, stmts, reply) in children {
            let mut reply = reply.clone();
            reply.append(
                bson::raw::cstr!("$clusterTime"),
                raw(doc! {"clusterTime": bson::Timestamp { time: 9, increment: 1 }}),
            );
            reply.append(
                bson::raw::cstr!("operationTime"),
                bson::Timestamp {
                    time: 9,
                    increment: 1,
                },
            );
            let with = |outcome| ChildResult {
                shard: shard.to_string(),
                statements: stmts.to_vec(),
                ordered,
                outcome,
            };
            owned.add(&with(ChildOutcome::Reply(owned_reply(&reply))));
            in_place.add(&with(ChildOutcome::Raw(BsonDoc::from_encoded(
                reply.into_bytes(),
            ))));
        }
        let expected = RawDocumentBuf::try_from(&owned.reply()).expect("encodes");
        assert_eq!(owned.reply(), in_place.reply());
        let raw = in_place.reply_raw().expect("encodes");
        assert_eq!(
            raw.as_bytes(),
            expected.as_bytes(),
            "in place: {:?}\nowned: {:?}",
            Document::try_from(raw.as_ref()),
            owned.reply()
        );
        assert_eq!(
            owned.reply_raw().expect("encodes").as_bytes(),
            expected.as_bytes()
        );
        in_place
    }

    fn raw(d: Document) -> RawDocumentBuf {
        RawDocumentBuf::try_from(&d).expect("encodes")
    }

    #[test]
    fn replies_read_in_place_merge_to_the_bytes_of_the_owned_merge() {
        use bson::spec::BinarySubtype;
        use bson::{oid::ObjectId, Binary, Decimal128};
        let oid = ObjectId::from_bytes([7; 12]);
        let uuid = Binary {
            subtype: BinarySubtype::Uuid,
            bytes: vec![3; 16],
        };
        // Upserted `_id`s of several types, remapped to the client's statement order.
        let m = merged_both_ways(
            WriteKind::Update,
            true,
            8,
            &[
                (
                    "A",
                    &[0, 2, 4, 6],
                    raw(doc! {"n": 4, "nModified": 1, "upserted": [
                        {"index": 0, "_id": oid},
                        {"index": 1, "_id": "s"},
                        {"index": 3, "_id": {"a": 1, "b": [1, 2.5]}},
                    ], "ok": 1.0}),
                ),
                (
                    "B",
                    &[1, 3, 5, 7],
                    raw(doc! {"n": 4, "nModified": 0, "upserted": [
                        {"_id": 5i64, "index": 0},
                        {"index": 1, "_id": uuid.clone()},
                        {"index": 2, "_id": 2.5},
                        {"index": 3, "_id": Decimal128::from_bytes([1; 16])},
                    ], "ok": 1}),
                ),
            ],
        );
        let r = m.reply();
        let up: Vec<Document> = r
            .get_array("upserted")
            .unwrap()
            .iter()
            .map(|u| u.as_document().unwrap().clone())
            .collect();
        assert_eq!(up.len(), 7);
        assert_eq!(up[0], doc! {"index": 0, "_id": oid});
        assert_eq!(up[1], doc! {"index": 1, "_id": 5i64});
        assert_eq!(up[2], doc! {"index": 2, "_id": "s"});
        assert_eq!(up[3], doc! {"index": 3, "_id": uuid});
        assert_eq!(up[4], doc! {"index": 5, "_id": 2.5});
        assert_eq!(up[5], doc! {"index": 6, "_id": {"a": 1, "b": [1, 2.5]}});
        assert_eq!(r.get_i32("n").unwrap(), 8);
        assert_eq!(r.get_i32("nModified").unwrap(), 1);

        // More than ten entries (two-digit array keys), one child.
        let upserted: Vec<Document> = (0..12).map(|i| doc! {"index": i, "_id": i * 10}).collect();
        let stmts: Vec<usize> = (0..12).collect();
        merged_both_ways(
            WriteKind::Update,
            false,
            12,
            &[(
                "A",
                &stmts,
                raw(doc! {"n": 12, "nModified": 0, "upserted": upserted, "ok": 1.0}),
            )],
        );
    }

    #[test]
    fn replies_with_errors_merge_in_place_as_owned() {
        // Ordered: B's error at statement 3 cuts the reply; A's upsert of 4 is not listed.
        let m = merged_both_ways(
            WriteKind::Update,
            true,
            6,
            &[
                (
                    "A",
                    &[0, 2, 4],
                    raw(doc! {"n": 3, "nModified": 1, "upserted": [
                        {"index": 1, "_id": 7}, {"index": 2, "_id": "late"},
                    ], "ok": 1.0}),
                ),
                (
                    "B",
                    &[1, 3, 5],
                    raw(
                        doc! {"n": 1, "nModified": 1, "upserted": [], "writeErrors": [
                            {"index": 1, "code": 11000, "errmsg": "dup", "errInfo": {"k": 1}},
                        ], "ok": 1.0},
                    ),
                ),
            ],
        );
        let r = m.reply();
        assert_eq!(
            r.get_array("upserted").unwrap().len(),
            1,
            "only statement 2's upsert precedes the error"
        );
        assert_eq!(r.get_array("writeErrors").unwrap().len(), 1);

        // Unordered: errors on both shards, a write concern error, a stale error, nModified
        // missing from one reply, a count past Int32.
        merged_both_ways(
            WriteKind::Update,
            false,
            6,
            &[
                (
                    "A",
                    &[0, 2, 4],
                    raw(
                        doc! {"n": 3_000_000_000i64, "upserted": [{"index": 2, "_id": 1}],
                        "writeErrors": [{"index": 0, "code": 66, "errmsg": "immutable"}],
                        "writeConcernError": {"code": 64, "errmsg": "timeout"}, "ok": 1.0},
                    ),
                ),
                (
                    "B",
                    &[1, 3, 5],
                    raw(doc! {"n": 1.0, "nModified": 1, "writeErrors": [
                        {"index": 1, "code": 11000, "errmsg": "dup"},
                        {"index": 2, "code": 13388, "errmsg": "stale"},
                    ], "ok": 1.0}),
                ),
            ],
        );

        // A failed batch (ok: 0) and deletes with a write concern error only.
        merged_both_ways(
            WriteKind::Delete,
            false,
            4,
            &[
                (
                    "A",
                    &[0, 2],
                    raw(
                        doc! {"ok": 0.0, "code": 50, "errmsg": "too slow", "codeName": "MaxTimeMSExpired"},
                    ),
                ),
                (
                    "B",
                    &[1, 3],
                    raw(
                        doc! {"n": 2, "writeConcernError": {"code": 91, "errmsg": "down"}, "ok": 1.0},
                    ),
                ),
            ],
        );
    }

    #[test]
    fn a_repeated_field_reads_in_place_as_the_owned_document_reads_it() {
        // An owned document keeps the last of a repeated field; so does the in-place reader.
        let mut reply = raw(doc! {"n": 5, "nModified": 0});
        reply.append(bson::raw::cstr!("n"), 2);
        let mut entry = raw(doc! {"index": 5, "_id": "first"});
        entry.append(bson::raw::cstr!("index"), 1);
        entry.append(bson::raw::cstr!("_id"), "second");
        let mut list = bson::RawArrayBuf::new();
        list.push(entry);
        reply.append(bson::raw::cstr!("upserted"), list);
        reply.append(bson::raw::cstr!("ok"), 1.0);
        let m = merged_both_ways(WriteKind::Update, true, 2, &[("A", &[0, 1], reply)]);
        let r = m.reply();
        assert_eq!(r.get_i32("n").unwrap(), 2);
        assert_eq!(
            r.get_array("upserted").unwrap()[0],
            Bson::Document(doc! {"index": 1, "_id": "second"})
        );
    }

    #[test]
    fn write_concern_errors_merge() {
        let one =
            merge_write_concern_errors(&[("s1".into(), doc! {"code": 64, "errmsg": "timeout"})])
                .unwrap();
        assert_eq!(
            one.get_str("errmsg").unwrap(),
            "WriteConcernTimeout: timeout; Error details: <none> at s1"
        );
        let two = merge_write_concern_errors(&[
            ("s1".into(), doc! {"code": 91, "errmsg": "a"}),
            ("s2".into(), doc! {"code": 100, "errmsg": "b"}),
        ])
        .unwrap();
        assert_eq!(two.get_i32("code").unwrap(), 64);
        assert_eq!(
            two.get_str("errmsg").unwrap(),
            "Multiple errors reported :: ShutdownInProgress: a; Error details: <none> at s1 \
             :: and :: UnsatisfiableWriteConcern: b; Error details: <none> at s2"
        );
    }
}
