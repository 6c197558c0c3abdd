//! Single-document writes that no one shard can run alone
//! ([`Target::Lookup`](super::target::Target::Lookup)): mongos 8.0's
//! write without shard key, and any single update that may change a document's shard key.
//! Pure: the executor in `mod.rs` does the I/O, this module decides each step.
//!
//! 1. **Find** one matching document: a `find` with the statement's filter and `limit: 1` on
//!    each targeted shard at once; the first shard (in shard order) that has one wins, so the
//!    choice is deterministic.
//! 2. **Write** it on that shard by its `_id`: the statement with its filter narrowed to
//!    `{$and: [filter, {_id: <id>}]}`, `upsert: false`. A document that changed between the two
//!    steps so that it no longer matches leaves `n: 0`, and the executor starts over from 1 (a
//!    few times), so the statement never touches more than one document.
//! 3. When nothing matches, an upsert's document is built here (the filter's equality fields,
//!    then the update, as a shard would) and inserted on the shard that owns its key.
//!
//! An update that would change the matched document's shard key is checked against the
//! document itself before anything is sent: it needs a filter that pins the full key by
//! equality (else 31025, as a mongod shard answers) and must leave the document on its shard
//! (else 66: moving a document between shards needs a cross-shard transaction, which Sluice's
//! shards do not run).

use bson::{doc, Bson, Document, RawDocument};

use super::target::{equality_value, update_may_change_key, WriteKind};
use crate::engine::update::{ApplyContext, ArrayFilters, Update};
use crate::routing::RoutingSnapshot;
use crate::value::error_codes::ErrorCode;

/// How many times a statement is looked up again when its document changed in between.
pub const MAX_ATTEMPTS: usize = 5;

/// The `find` that looks for one matching document (without `$db` and `shardVersion`).
pub fn find_command(coll: &str, stmt: &Document) -> Document {
    let mut cmd = doc! {
        "find": coll,
        "filter": stmt.get_document("q").cloned().unwrap_or_default(),
        "limit": 1i64,
        "singleBatch": true,
    };
    for k in ["collation", "hint"] {
        if let Some(v) = stmt.get(k) {
            cmd.insert(k, v.clone());
        }
    }
    cmd
}

/// The document a `find` reply holds, if any.
pub fn found(reply: &Document) -> Option<Document> {
    reply
        .get_document("cursor")
        .ok()?
        .get_array("firstBatch")
        .ok()?
        .first()?
        .as_document()
        .cloned()
}

/// What to do once the first step is over.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Nothing matched and nothing is upserted: the statement changed nothing.
    Nothing,
    /// Nothing matched an update that is no upsert: send it to this shard narrowed to match
    /// nothing, so the shard still parses it and answers its errors, as mongos's shards do.
    Validate {
        /// The first targeted shard.
        shard: String,
        /// The statement, matching nothing.
        statement: Document,
    },
    /// Send this statement (narrowed to the found document) to this shard.
    Write {
        /// The shard holding the document.
        shard: String,
        /// The statement to send.
        statement: Document,
    },
    /// Insert an upsert's document on the shard that owns its key.
    Insert {
        /// The owner of the document's key.
        shard: String,
        /// The document, `_id` first.
        document: Document,
    },
    /// The statement fails without being sent.
    Fail {
        /// The MongoDB code.
        code: ErrorCode,
        /// The message.
        message: String,
    },
}

fn fail(code: ErrorCode, message: impl Into<String>) -> Step {
    Step::Fail {
        code,
        message: message.into(),
    }
}

/// The values of the key fields of a document (missing fields as null), as a mongod shard
/// compares an old and a new key.
fn key_values(snap: &RoutingSnapshot, d: &Document) -> Vec<Bson> {
    snap.pattern
        .fields()
        .iter()
        .map(|f| {
            crate::engine::path::get(d, &f.path)
                .cloned()
                .unwrap_or(Bson::Null)
        })
        .collect()
}

/// The shard owning a document's key, or the error a key with an array gets.
fn owner(snap: &RoutingSnapshot, d: &Document) -> Result<String, Step> {
    let bytes = d
        .to_vec()
        .map_err(|e| fail(ErrorCode::BadValue, e.to_string()))?;
    let raw =
        RawDocument::from_bytes(&bytes).map_err(|e| fail(ErrorCode::BadValue, e.to_string()))?;
    let key = snap
        .pattern
        .extract_from_document(raw)
        .map_err(|e| fail(e.code, e.message))?;
    snap.shard_for(&key)
        .map(str::to_string)
        .ok_or_else(|| fail(ErrorCode::InternalError, "no chunk owns this shard key"))
}

/// Decides the next step of statement `stmt` (an update or delete, validated) given the first
/// step's result: the shard and document found, if any (`first`: the first targeted shard).
pub fn decide(
    snap: &RoutingSnapshot,
    kind: WriteKind,
    stmt: &Document,
    first: Option<&str>,
    hit: Option<(String, Document)>,
) -> Step {
    let q = stmt.get_document("q").cloned().unwrap_or_default();
    let upsert = stmt.get("upsert").is_some_and(crate::value::field::truthy);
    let Some((shard, doc)) = hit else {
        if kind != WriteKind::Update {
            return Step::Nothing;
        }
        if !upsert {
            let Some(shard) = first.map(str::to_string) else {
                return Step::Nothing;
            };
            let mut statement = stmt.clone();
            statement.insert("q", doc! {"$and": [q, {"_id": {"$in": []}}]});
            statement.insert("multi", false);
            return Step::Validate { shard, statement };
        }
        let u = stmt.get("u").unwrap_or(&Bson::Null);
        // Built as the shard builds it: with the statement's `arrayFilters`, checked first.
        let document = match Update::parse(u).and_then(|upd| {
            let filters = ArrayFilters::of_statement(stmt.get("arrayFilters"), &upd, u)?;
            let ctx = ApplyContext {
                array_filters: Some(&filters),
                ..ApplyContext::default()
            };
            crate::engine::update::upsert_document_in(&q, &upd, &ctx)
        }) {
            Ok(d) => d,
            Err(e) => return fail(e.code, e.message),
        };
        return match owner(snap, &document) {
            Ok(shard) => Step::Insert { shard, document },
            Err(step) => step,
        };
    };
    let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
    let mut statement = stmt.clone();
    statement.insert("q", doc! {"$and": [q.clone(), {"_id": id}]});
    match kind {
        WriteKind::Update => {
            statement.insert("upsert", false);
            statement.insert("multi", false);
            let u = stmt.get("u").unwrap_or(&Bson::Null);
            if update_may_change_key(snap, &q, u, false) {
                let filters = stmt.get("arrayFilters");
                if let Some(step) = key_change(snap, &q, u, filters, &shard, &doc) {
                    return step;
                }
            }
        }
        _ => {
            statement.insert("limit", 1);
        }
    }
    Step::Write { shard, statement }
}

/// The refusal of an update that changes `doc`'s shard key where a mongod shard (31025) or the
/// router (66, the document would move) refuses it; `None` when it may go ahead. The update is
/// applied as the shard applies it: with the statement's query (for a positional `$`) and its
/// `arrayFilters`. An update the router cannot evaluate goes ahead: the shard answers with its
/// own error.
fn key_change(
    snap: &RoutingSnapshot,
    q: &Document,
    u: &Bson,
    array_filters: Option<&Bson>,
    shard: &str,
    doc: &Document,
) -> Option<Step> {
    let mut new = doc.clone();
    let update = Update::parse(u).ok()?;
    let query = crate::engine::matcher::Matcher::parse(q).ok()?;
    // `arrayFilters` the shard would refuse (unused, malformed) are left out here: the key
    // change is still checked first, as before.
    let filters = ArrayFilters::of_statement(array_filters, &update, u).unwrap_or_default();
    let ctx = ApplyContext {
        query: Some(&query),
        array_filters: Some(&filters),
        ..ApplyContext::default()
    };
    update.apply_in(&mut new, false, &ctx).ok()?;
    if key_values(snap, doc) == key_values(snap, &new) {
        return None;
    }
    let full_key = snap
        .pattern
        .fields()
        .iter()
        .all(|f| equality_value(q, &f.path).is_some());
    if !full_key {
        return Some(fail(
            ErrorCode::ShardKeyUpdateWithoutFullKey,
            "Shard key update is not allowed without specifying the full shard key in the query",
        ));
    }
    match owner(snap, &new) {
        Ok(to) if to == shard => None,
        Ok(to) => Some(fail(
            ErrorCode::ImmutableField,
            format!(
                "After applying the update, the document would move from shard {shard} to shard {to}: changing a document's shard key value across shards is not supported"
            ),
        )),
        Err(step) => Some(step),
    }
}

/// The update-shaped reply (`n`, `nModified`, `upserted`) of an upsert's insert reply.
pub fn upsert_reply(insert_reply: &Document, id: &Bson) -> Document {
    let mut out = insert_reply.clone();
    let inserted = crate::value::field::number_field(insert_reply, "n").unwrap_or(0) > 0;
    out.insert("nModified", 0);
    if inserted {
        out.insert(
            "upserted",
            vec![Bson::Document(doc! {"index": 0, "_id": id.clone()})],
        );
    }
    out
}

/// The reply of a statement that failed without being sent.
pub fn failed_reply(kind: WriteKind, code: ErrorCode, message: &str) -> Document {
    let mut out = doc! {"n": 0};
    if kind == WriteKind::Update {
        out.insert("nModified", 0);
    }
    out.insert(
        "writeErrors",
        vec![Bson::Document(
            doc! {"index": 0, "code": code.0, "errmsg": message},
        )],
    );
    out.insert("ok", 1.0);
    out
}

/// The reply of a statement that changed nothing.
pub fn nothing_reply(kind: WriteKind) -> Document {
    let mut out = doc! {"n": 0};
    if kind == WriteKind::Update {
        out.insert("nModified", 0);
    }
    out.insert("ok", 1.0);
    out
}

/// Whether a phase-two reply says the document no longer matched (and the lookup should start
/// over): nothing matched, no error, and not a retryable write's recorded answer.
pub fn went_away(reply: &Document) -> bool {
    reply.get_f64("ok").ok() == Some(1.0)
        && !reply.contains_key("writeErrors")
        && !reply.contains_key("retriedStmtIds")
        && crate::value::field::number_field(reply, "n") == Some(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::ShardKeyPattern;

    fn snap(key: Document) -> RoutingSnapshot {
        RoutingSnapshot::initial("d.c", ShardKeyPattern::parse(&key).unwrap(), 3).unwrap()
    }

    #[test]
    fn a_found_document_is_written_by_its_id() {
        let s = snap(doc! {"_id": "hashed"});
        let stmt = doc! {"q": {"tag": "t"}, "u": {"$set": {"a": 1}}, "upsert": true};
        let step = decide(
            &s,
            WriteKind::Update,
            &stmt,
            Some("shard0"),
            Some(("shard1".into(), doc! {"_id": 3, "tag": "t"})),
        );
        assert_eq!(
            step,
            Step::Write {
                shard: "shard1".into(),
                statement: doc! {"q": {"$and": [{"tag": "t"}, {"_id": 3}]}, "u": {"$set": {"a": 1}}, "upsert": false, "multi": false},
            }
        );
        let del = decide(
            &s,
            WriteKind::Delete,
            &doc! {"q": {"tag": "t"}, "limit": 1},
            Some("shard0"),
            Some(("shard0".into(), doc! {"_id": 1})),
        );
        assert!(
            matches!(del, Step::Write { statement, .. } if statement.get_i32("limit").ok() == Some(1))
        );
        assert_eq!(
            decide(
                &s,
                WriteKind::Delete,
                &doc! {"q": {"tag": "t"}, "limit": 1},
                Some("shard0"),
                None
            ),
            Step::Nothing
        );
        // An update that matches nothing is still sent, matching nothing, for its errors.
        let none = decide(
            &s,
            WriteKind::Update,
            &doc! {"q": {"tag": "t"}, "u": {"$inc": {"a": 1}}},
            Some("shard2"),
            None,
        );
        assert_eq!(
            none,
            Step::Validate {
                shard: "shard2".into(),
                statement: doc! {"q": {"$and": [{"tag": "t"}, {"_id": {"$in": []}}]}, "u": {"$inc": {"a": 1}}, "multi": false},
            }
        );
    }

    #[test]
    fn an_upsert_is_inserted_where_its_key_belongs() {
        let s = snap(doc! {"_id": "hashed"});
        let stmt =
            doc! {"q": {"_id": {"$in": [1, 2]}, "x": 5}, "u": {"$set": {"a": 1}}, "upsert": true};
        match decide(&s, WriteKind::Update, &stmt, Some("shard0"), None) {
            Step::Insert { shard, document } => {
                assert!(matches!(document.get("_id"), Some(Bson::ObjectId(_))));
                assert_eq!(document.get_i32("x").unwrap(), 5);
                assert_eq!(owner(&s, &document).unwrap(), shard);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_upsert_document_uses_and_checks_the_array_filters() {
        let s = snap(doc! {"_id": "hashed"});
        let upsert = |u: Document, filters: Bson| {
            let stmt = doc! {"q": {"_id": 3}, "u": u, "upsert": true, "arrayFilters": filters};
            decide(&s, WriteKind::Update, &stmt, Some("shard0"), None)
        };
        let unused = upsert(doc! {"$push": {"arr": 1}}, bson::bson!([{"e": 1}]));
        assert!(
            matches!(
                unused,
                Step::Fail {
                    code: ErrorCode::FailedToParse,
                    ..
                }
            ),
            "an unused filter is refused before anything is inserted: {unused:?}"
        );
        match upsert(doc! {"$push": {"arr": 1}}, Bson::Null) {
            Step::Insert { document, .. } => assert_eq!(document, doc! {"_id": 3, "arr": [1]}),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn key_changes_are_checked_against_the_document() {
        let s = snap(doc! {"k": "hashed"});
        let home = owner(&s, &doc! {"k": 1}).unwrap();
        let away = (2..100)
            .find(|v| owner(&s, &doc! {"k": *v}).unwrap() != home)
            .unwrap();
        let near = (2..100)
            .find(|v| owner(&s, &doc! {"k": *v}).unwrap() == home)
            .unwrap();
        let doc = doc! {"_id": 1, "k": 1, "a": near};
        let run = |q: Document, u: Document| {
            decide(
                &s,
                WriteKind::Update,
                &doc! {"q": q, "u": u},
                Some(home.as_str()),
                Some((home.clone(), doc.clone())),
            )
        };
        let moved = run(doc! {"k": 1, "_id": 1}, doc! {"$set": {"k": away}});
        assert!(matches!(
            moved,
            Step::Fail {
                code: ErrorCode::ImmutableField,
                ..
            }
        ));
        let renamed = run(doc! {"k": 1, "_id": 1}, doc! {"$rename": {"a": "k"}});
        assert!(matches!(renamed, Step::Write { .. }), "stays on its shard");
        let keyless = run(doc! {"_id": 1}, doc! {"$set": {"k": near}});
        assert!(matches!(
            keyless,
            Step::Fail {
                code: ErrorCode::ShardKeyUpdateWithoutFullKey,
                ..
            }
        ));
        let same = run(doc! {"_id": 1}, doc! {"$set": {"k": 1}});
        assert!(
            matches!(same, Step::Write { .. }),
            "the key does not change"
        );
        // A positional `$` beside the key change is applied with the statement's query, as the
        // shard applies it (without it the update did not apply here and went ahead unchecked).
        let with_array = doc! {"_id": 1, "k": 1, "arr": [0]};
        let positional = decide(
            &s,
            WriteKind::Update,
            &doc! {"q": {"arr": 0}, "u": {"$set": {"arr.$": 7, "k": near}}},
            Some(home.as_str()),
            Some((home.clone(), with_array.clone())),
        );
        assert!(
            matches!(
                positional,
                Step::Fail {
                    code: ErrorCode::ShardKeyUpdateWithoutFullKey,
                    ..
                }
            ),
            "{positional:?}"
        );
        let filtered = decide(
            &s,
            WriteKind::Update,
            &doc! {"q": {"_id": 1}, "u": {"$set": {"arr.$[e]": 7, "k": near}},
            "arrayFilters": [{"e": 0}]},
            Some(home.as_str()),
            Some((home.clone(), with_array)),
        );
        assert!(
            matches!(
                filtered,
                Step::Fail {
                    code: ErrorCode::ShardKeyUpdateWithoutFullKey,
                    ..
                }
            ),
            "{filtered:?}"
        );
    }
}
