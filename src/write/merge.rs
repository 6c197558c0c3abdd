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

use std::collections::BTreeMap;

use bson::{doc, Bson, Document};

use super::target::WriteKind;
use crate::value::error_codes::ErrorCode;

/// What came back for one child batch.
#[derive(Debug, Clone, PartialEq)]
pub enum ChildOutcome {
    /// The shard's reply document (`ok: 1` or `ok: 0`).
    Reply(Document),
    /// The request failed on the way (network, timeout).
    Failed {
        /// 6 HostUnreachable or 89 NetworkTimeout.
        code: ErrorCode,
        /// What happened.
        message: String,
    },
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
    /// Upserted `_id`s by global index.
    upserted: Vec<(usize, Bson)>,
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
            ChildOutcome::Reply(r) => r,
        };
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
        if let Ok(wce) = reply.get_document("writeConcernError") {
            self.wces.push((child.shard.clone(), wce.clone()));
        }
        let mut errors: BTreeMap<usize, Document> = BTreeMap::new();
        if let Ok(list) = reply.get_array("writeErrors") {
            for e in list.iter().filter_map(|e| e.as_document()) {
                if let Ok(ci) = e.get_i32("index") {
                    errors.insert(ci as usize, e.clone());
                }
            }
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
        let mut upserted: BTreeMap<usize, Bson> = BTreeMap::new();
        if let Ok(list) = reply.get_array("upserted") {
            for u in list.iter().filter_map(|u| u.as_document()) {
                if let (Ok(ci), Some(id)) = (u.get_i32("index"), u.get("_id")) {
                    upserted.insert(ci as usize, id.clone());
                }
            }
        }
        let n = crate::value::field::number_field(reply, "n").unwrap_or(0);
        let n_modified = match crate::value::field::number_field(reply, "nModified") {
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
        };
        for (ci, &g) in child.statements.iter().enumerate() {
            if !executed(ci) {
                continue;
            }
            self.mark_ran(g);
            let exact = match self.kind {
                WriteKind::Insert => Some(Exact {
                    n: 1,
                    n_modified: 0,
                }),
                _ => upserted.contains_key(&ci).then_some(Exact {
                    n: 1,
                    n_modified: 0,
                }),
            };
            if let Some(id) = upserted.get(&ci) {
                account.upserted.push((g, id.clone()));
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

    /// The client's reply (without `ok` and cluster time).
    pub fn reply(&self) -> Document {
        let limit = if self.ordered {
            self.first_error()
        } else {
            None
        };
        let (mut n, mut n_modified) = (0i64, 0i64);
        let mut upserted: Vec<(usize, Bson)> = Vec::new();
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
                    .cloned(),
            );
        }
        upserted.sort_by_key(|(g, _)| *g);
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
        let mut out = doc! {"n": count(n)};
        if self.kind == WriteKind::Update && !self.n_modified_missing {
            out.insert("nModified", count(n_modified));
        }
        if !upserted.is_empty() {
            let list: Vec<Bson> = upserted
                .into_iter()
                .map(|(g, id)| Bson::Document(doc! {"index": g as i32, "_id": id}))
                .collect();
            out.insert("upserted", list);
        }
        let all_failed = errors.len() == self.stmts.len();
        let report_wce = errors.is_empty() || (!self.ordered && !all_failed);
        if !errors.is_empty() {
            out.insert("writeErrors", std::mem::take(&mut errors));
        }
        if report_wce {
            if let Some(wce) = merge_write_concern_errors(&self.wces) {
                out.insert("writeConcernError", wce);
            }
        }
        out
    }
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
