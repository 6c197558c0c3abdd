//! Reply merging: child replies in, the client's reply out, no I/O (WRITE-PATH.md section 4).
//!
//! Each statement ends in a state: done (with its exact `n`, `nModified` and upserted `_id`),
//! failed (its write error, index remapped to the client's), stale (to be retargeted), or
//! pending (not executed). A child reply gives exact per-statement results for inserts and
//! upserts, but only totals for the other updates and deletes of one child batch: those
//! statements form a *residual* group whose totals are shared by its members. Totals are
//! enough unless an ordered reply must count only the statements before the first error and a
//! group has members on both sides of it; [`Merger::straddlers`] names them so the executor
//! can resolve them one by one.

use std::collections::BTreeMap;

use bson::{doc, Bson, Document};

use super::target::WriteKind;
use crate::error_codes::ErrorCode;

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
    Pending,
    Done {
        n: i64,
        n_modified: i64,
        upserted: Option<Bson>,
    },
    Residual(usize),
    Failed(Document),
    Stale(Document),
}

#[derive(Debug, Clone, PartialEq)]
struct Residual {
    n: i64,
    n_modified: i64,
    members: Vec<usize>,
}

/// Accumulates child results into the client's reply.
#[derive(Debug, Clone)]
pub struct Merger {
    kind: WriteKind,
    ordered: bool,
    stmts: Vec<Stmt>,
    residuals: Vec<Residual>,
    wces: Vec<(String, Document)>,
    n_modified_missing: bool,
}

const STALE_CODES: &[i32] = &[13388, 150, 63];

fn error_doc(index: usize, code: ErrorCode, message: &str) -> Document {
    doc! {"index": index as i32, "code": code.0, "errmsg": message}
}

impl Merger {
    /// A merger for `n` statements of a `kind` command.
    pub fn new(kind: WriteKind, ordered: bool, n: usize) -> Merger {
        Merger {
            kind,
            ordered,
            stmts: vec![Stmt::Pending; n],
            residuals: Vec::new(),
            wces: Vec::new(),
            n_modified_missing: false,
        }
    }

    /// Records a targeting error for statement `i`.
    pub fn fail(&mut self, i: usize, code: ErrorCode, message: &str) {
        if let Some(s) = self.stmts.get_mut(i) {
            *s = Stmt::Failed(error_doc(i, code, message));
        }
    }

    fn mark_done(&mut self, i: usize, n: i64, n_modified: i64, upserted: Option<Bson>) {
        match self.stmts.get_mut(i) {
            Some(Stmt::Done {
                n: pn,
                n_modified: pm,
                upserted: pu,
            }) => {
                *pn += n;
                *pm += n_modified;
                if pu.is_none() {
                    *pu = upserted;
                }
            }
            Some(s @ (Stmt::Pending | Stmt::Stale(_))) => {
                *s = Stmt::Done {
                    n,
                    n_modified,
                    upserted,
                }
            }
            _ => {}
        }
    }

    fn mark_error(&mut self, i: usize, mut err: Document) {
        err.insert("index", i as i32);
        let stale = err.get_i32("code").is_ok_and(|c| STALE_CODES.contains(&c));
        if let Some(s) = self.stmts.get_mut(i) {
            match s {
                Stmt::Failed(_) => {}
                _ if stale => *s = Stmt::Stale(err),
                _ => *s = Stmt::Failed(err),
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
        let executed = |ci: usize| match (child.ordered, first_error) {
            (true, Some(fe)) => ci < fe,
            _ => !errors.contains_key(&ci),
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
        let total_n = crate::command::number_field(reply, "n").unwrap_or(0);
        let total_mod = match crate::command::number_field(reply, "nModified") {
            Some(m) => m,
            None => {
                if self.kind == WriteKind::Update {
                    self.n_modified_missing = true;
                }
                0
            }
        };
        let mut rest: Vec<usize> = Vec::new();
        for (ci, &g) in child.statements.iter().enumerate() {
            if !executed(ci) {
                continue;
            }
            match self.kind {
                WriteKind::Insert => self.mark_done(g, 1, 0, None),
                WriteKind::Update if upserted.contains_key(&ci) => {
                    self.mark_done(g, 1, 0, upserted.get(&ci).cloned())
                }
                _ => rest.push(g),
            }
        }
        if self.kind == WriteKind::Insert {
            return;
        }
        let rest_n = total_n - upserted.len() as i64;
        match rest.len() {
            0 => {}
            1 => self.mark_done(rest[0], rest_n, total_mod, None),
            _ => {
                let id = self.residuals.len();
                for &g in &rest {
                    if let Some(s) = self.stmts.get_mut(g) {
                        *s = Stmt::Residual(id);
                    }
                }
                self.residuals.push(Residual {
                    n: rest_n,
                    n_modified: total_mod,
                    members: rest,
                });
            }
        }
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

    /// Fails every stale statement with NoProgressMade (82), as mongos does after 5 rounds.
    pub fn give_up_stale(&mut self, ns: &str) {
        for (i, s) in self.stmts.iter_mut().enumerate() {
            if matches!(s, Stmt::Stale(_)) {
                *s = Stmt::Failed(error_doc(
                    i,
                    ErrorCode::NoProgressMade,
                    &format!(
                        "no progress was made executing batch write op in {ns} after 5 rounds"
                    ),
                ));
            }
        }
    }

    /// Number of finished statements (done or failed): progress between rounds.
    pub fn finished(&self) -> usize {
        self.stmts
            .iter()
            .filter(|s| matches!(s, Stmt::Done { .. } | Stmt::Failed(_) | Stmt::Residual(_)))
            .count()
    }

    /// Members before the first error of residual groups that also have members after it: their
    /// exact results are needed for an ordered reply.
    pub fn straddlers(&self) -> Vec<usize> {
        let Some(e) = self.first_error().filter(|_| self.ordered) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for r in &self.residuals {
            let before: Vec<usize> = r.members.iter().copied().filter(|m| *m < e).collect();
            if !before.is_empty() && before.len() < r.members.len() {
                out.extend(before);
            }
        }
        out.sort_unstable();
        out
    }

    /// Records the exact result of a residual member (obtained by resending it alone).
    pub fn resolve(&mut self, i: usize, n: i64, n_modified: i64, upserted: Option<Bson>) {
        let Some(Stmt::Residual(id)) = self.stmts.get(i).cloned() else {
            return;
        };
        if let Some(r) = self.residuals.get_mut(id) {
            r.members.retain(|m| *m != i);
            r.n -= n;
            r.n_modified -= n_modified;
        }
        self.stmts[i] = Stmt::Done {
            n,
            n_modified,
            upserted,
        };
    }

    /// Whether no statement was applied (every one failed or never ran).
    pub fn nothing_applied(&self) -> bool {
        !self
            .stmts
            .iter()
            .any(|s| matches!(s, Stmt::Done { .. } | Stmt::Residual(_)))
    }

    /// Statements after the first error that were applied anyway (rewritten bulks only).
    pub fn applied_after_error(&self) -> Vec<usize> {
        let Some(e) = self.first_error() else {
            return Vec::new();
        };
        self.stmts
            .iter()
            .enumerate()
            .filter(|(i, s)| *i > e && matches!(s, Stmt::Done { .. } | Stmt::Residual(_)))
            .map(|(i, _)| i)
            .collect()
    }

    /// The client's reply (without `ok` and cluster time).
    pub fn reply(&self) -> Document {
        let limit = if self.ordered {
            self.first_error()
        } else {
            None
        };
        let counts = |i: usize| limit.is_none_or(|e| i < e);
        let (mut n, mut n_modified) = (0i64, 0i64);
        let mut upserted = Vec::new();
        for (i, s) in self.stmts.iter().enumerate() {
            if let Stmt::Done {
                n: sn,
                n_modified: sm,
                upserted: su,
            } = s
            {
                if counts(i) {
                    n += sn;
                    n_modified += sm;
                    if let Some(id) = su {
                        upserted.push(Bson::Document(doc! {"index": i as i32, "_id": id.clone()}));
                    }
                }
            }
        }
        for r in &self.residuals {
            // A group whose members straddle the first error and were not resolved (only a
            // non-retryable bulk under the "always" policy) is counted when any member counts.
            if r.members.iter().any(|m| counts(*m)) {
                n += r.n;
                n_modified += r.n_modified;
            }
        }
        let errors: Vec<Bson> = match limit {
            Some(e) => match &self.stmts[e] {
                Stmt::Failed(d) => vec![Bson::Document(d.clone())],
                _ => Vec::new(),
            },
            None => self
                .stmts
                .iter()
                .filter_map(|s| match s {
                    Stmt::Failed(d) => Some(Bson::Document(d.clone())),
                    _ => None,
                })
                .collect(),
        };
        let mut out = doc! {"n": count(n)};
        if self.kind == WriteKind::Update && !self.n_modified_missing {
            out.insert("nModified", count(n_modified));
        }
        if !upserted.is_empty() {
            out.insert("upserted", upserted);
        }
        let all_failed = errors.len() == self.stmts.len();
        if !errors.is_empty() {
            out.insert("writeErrors", errors.clone());
        }
        let report_wce = errors.is_empty() || (!self.ordered && !all_failed);
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

/// One write concern error: same code, message suffixed with the shard; several: code 64 with
/// every message joined.
pub fn merge_write_concern_errors(wces: &[(String, Document)]) -> Option<Document> {
    match wces {
        [] => None,
        [(shard, w)] => {
            let mut d = w.clone();
            let msg = format!("{} at {shard}", w.get_str("errmsg").unwrap_or(""));
            d.insert("errmsg", msg);
            Some(d)
        }
        many => {
            let joined: Vec<String> = many
                .iter()
                .map(|(s, w)| format!("{} at {s}", w.get_str("errmsg").unwrap_or("")))
                .collect();
            Some(doc! {
                "code": ErrorCode::WriteConcernTimeout.0,
                "codeName": ErrorCode::WriteConcernTimeout.name(),
                "errmsg": format!("multiple errors reported : {}", joined.join(" :: and :: ")),
            })
        }
    }
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
        m.resolve(0, 1, 0, None);
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
        assert_eq!(m.take_unfinished(), vec![0, 2]);
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
        assert_eq!(one.get_str("errmsg").unwrap(), "timeout at s1");
        let two = merge_write_concern_errors(&[
            ("s1".into(), doc! {"code": 64, "errmsg": "a"}),
            ("s2".into(), doc! {"code": 100, "errmsg": "b"}),
        ])
        .unwrap();
        assert_eq!(two.get_i32("code").unwrap(), 64);
        assert_eq!(
            two.get_str("errmsg").unwrap(),
            "multiple errors reported : a at s1 :: and :: b at s2"
        );
    }
}
