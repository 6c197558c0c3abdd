//! Targeting one write statement: the shards it must go to, its *identity* (the `_id` of the
//! one document it touches, when it pins one) and whether applying it twice leaves the same
//! state (its retry-safety). Pure: a statement and a routing snapshot in, a [`Targeted`] out.
//! The rules are docs/design/write-path.md section 1.

use std::collections::BTreeSet;

use bson::{Bson, Document, RawDocument};

use crate::routing::{FilterKeys, RoutingSnapshot, ShardKey};
use crate::value::error_codes::ErrorCode;

/// The kind of write command, named where the request is parsed (`crate::command`).
pub use crate::command::WriteKind;

/// Where a statement goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// Exactly one shard.
    One(String),
    /// Several shards (`$in` over several chunks, or a broadcast).
    Many(Vec<String>),
    /// A single-document update or delete that no one shard can run on its own (its filter
    /// pins no shard, or it may change a document's shard key): mongos 8.0's write without
    /// shard key. The executor finds one matching document on these shards, then writes it by
    /// its `_id` on the shard that holds it (or inserts the upserted document where its key
    /// belongs). Runs alone, between the statements before and after it.
    Lookup(Vec<String>),
    /// The statement cannot be targeted: it fails with this error.
    Error {
        /// The MongoDB code.
        code: ErrorCode,
        /// The message.
        message: String,
    },
}

/// A targeted statement.
#[derive(Debug, Clone, PartialEq)]
pub struct Targeted {
    /// Where it goes.
    pub target: Target,
    /// The `_id` of the one document it touches, when it pins one (docs/design/write-path.md
    /// section 2).
    pub identity: Option<Bson>,
    /// Whether applying it twice leaves the state applying it once does.
    pub retry_safe: bool,
}

/// Update operators that leave the same state when applied twice.
const IDEMPOTENT_OPERATORS: &[&str] = &[
    "$set",
    "$unset",
    "$setOnInsert",
    "$min",
    "$max",
    "$addToSet",
    "$pull",
    "$pullAll",
];

fn error(code: ErrorCode, message: impl Into<String>) -> Targeted {
    Targeted {
        target: Target::Error {
            code,
            message: message.into(),
        },
        identity: None,
        retry_safe: false,
    }
}

/// The shards owning `keys`; no key at all (an empty `$in`) goes to the shard owning the first
/// chunk, as mongos always targets at least one shard.
fn shards_for_keys(snap: &RoutingSnapshot, keys: &[ShardKey]) -> Vec<String> {
    let shards: BTreeSet<String> = if keys.is_empty() {
        snap.shard_for(&snap.pattern.min_key())
            .map(str::to_string)
            .into_iter()
            .collect()
    } else {
        keys.iter()
            .filter_map(|k| snap.shard_for(k).map(|s| s.to_string()))
            .collect()
    };
    shards.into_iter().collect()
}

fn broadcast(snap: &RoutingSnapshot) -> Vec<String> {
    snap.chunks.shards().into_iter().collect()
}

fn is_operator_doc(d: &Document) -> bool {
    d.keys().next().is_some_and(|k| k.starts_with('$'))
}

/// The value a filter pins `path` to by plain equality (`{p: v}`, `{p: {$eq: v}}`, or either
/// inside a top-level `$and`); arrays and regular expressions pin nothing.
pub fn equality_value<'a>(filter: &'a Document, path: &str) -> Option<&'a Bson> {
    let v = filter.get(path).or_else(|| {
        filter.get("$and").and_then(|a| match a {
            Bson::Array(items) => items
                .iter()
                .filter_map(|i| i.as_document())
                .find_map(|d| d.get(path)),
            _ => None,
        })
    })?;
    let v = match v {
        Bson::Document(d) if is_operator_doc(d) => match d.get("$eq") {
            Some(eq) if d.len() == 1 => eq,
            _ => return None,
        },
        other => other,
    };
    match v {
        Bson::Array(_) | Bson::RegularExpression(_) => None,
        other => Some(other),
    }
}

/// The `_id` a filter pins by equality (a single value, not `$in`).
fn id_identity(filter: &Document) -> Option<Bson> {
    match equality_value(filter, "_id")? {
        Bson::Null | Bson::Undefined => None,
        other => Some(other.clone()),
    }
}

fn simple_collation(stmt: &Document) -> bool {
    match stmt.get("collation") {
        None => true,
        Some(Bson::Document(c)) => c.is_empty() || c.get_str("locale").ok() == Some("simple"),
        Some(_) => false,
    }
}

/// Targets an insert. `client_id` says whether the client supplied the `_id` (a router-made
/// `_id` is no identity: it would change if the client resent the document).
pub fn target_insert(snap: &RoutingSnapshot, doc: &RawDocument, client_id: bool) -> Targeted {
    match snap.pattern.extract_from_document(doc) {
        Ok(key) => match snap.shard_for(&key) {
            Some(shard) => Targeted {
                target: Target::One(shard.to_string()),
                identity: if client_id {
                    doc.get("_id")
                        .ok()
                        .flatten()
                        .map(crate::routing::shard_key::raw_to_bson)
                } else {
                    None
                },
                retry_safe: true,
            },
            None => error(ErrorCode::InternalError, "no chunk owns this shard key"),
        },
        Err(e) => error(
            e.code,
            format!("Document {} {}", describe_id(doc), e.message),
        ),
    }
}

fn describe_id(doc: &RawDocument) -> String {
    match doc.get("_id").ok().flatten() {
        Some(v) => format!(
            "{{ _id: {} }}",
            crate::value::render::render_value(&crate::routing::shard_key::raw_to_bson(v))
        ),
        None => "{}".to_string(),
    }
}

/// Whether an update document's operators are all idempotent (replacements are).
fn update_is_retry_safe(u: &Bson) -> bool {
    match u {
        Bson::Document(d) => {
            !is_operator_doc(d) || d.keys().all(|k| IDEMPOTENT_OPERATORS.contains(&k.as_str()))
        }
        _ => false, // pipeline updates
    }
}

/// Whether two dotted paths name the same field or one a parent of the other.
fn paths_overlap(a: &str, b: &str) -> bool {
    a == b || is_path_prefix(a, b) || is_path_prefix(b, a)
}

/// Whether `prefix` names a parent of `path` (`a` of `a.b`, not of `ab`).
fn is_path_prefix(prefix: &str, path: &str) -> bool {
    path.len() > prefix.len() && path.starts_with(prefix) && path.as_bytes()[prefix.len()] == b'.'
}

/// Whether an update may give a matched (or upserted) document another shard key value. `_id`
/// is left out: shards refuse any change of it themselves. An operator that writes a key field
/// (`$rename` from or onto one included) may, unless it is a `$set` to the very value the
/// filter pins; a replacement may unless it carries, for every key field, the value the filter
/// pins. Pipelines are evaluated by the shards alone (a mongod shard enforces its key rules).
pub fn update_may_change_key(snap: &RoutingSnapshot, q: &Document, u: &Bson, upsert: bool) -> bool {
    let fields: Vec<&str> = snap
        .pattern
        .fields()
        .iter()
        .map(|f| f.path.as_str())
        .filter(|p| *p != "_id")
        .collect();
    if fields.is_empty() {
        return false;
    }
    let Bson::Document(u) = u else {
        return false;
    };
    if !is_operator_doc(u) {
        return fields.iter().any(|f| {
            let new = crate::engine::path::get(u, f);
            new.is_none() || new != equality_value(q, f)
        });
    }
    for (op, args) in u {
        let Bson::Document(args) = args else { continue };
        if op == "$setOnInsert" && !upsert {
            continue;
        }
        for (path, arg) in args {
            for f in &fields {
                let renamed_onto =
                    op == "$rename" && arg.as_str().is_some_and(|to| paths_overlap(to, f));
                if !paths_overlap(path, f) && !renamed_onto {
                    continue;
                }
                let unchanged = op == "$set" && path == f && equality_value(q, f) == Some(arg);
                if !unchanged {
                    return true;
                }
            }
        }
    }
    false
}

/// The shard an upsert's new document belongs to, when the router can tell without building it
/// (`None` when it cannot, e.g. when the shard would generate its `_id`): the filter's
/// equality fields seed an operator update; a replacement brings its own fields and the
/// filter's `_id`. Only asked when no operator writes a key field.
fn upsert_owner(snap: &RoutingSnapshot, q: &Document, u: &Bson) -> Option<String> {
    let Bson::Document(u) = u else { return None };
    let fields = snap.pattern.fields();
    let mut seed = Document::new();
    if is_operator_doc(u) {
        for (path, v) in crate::engine::matcher::equality_fields(q) {
            if fields.iter().any(|f| paths_overlap(&path, &f.path)) {
                crate::engine::path::set(&mut seed, &path, v).ok()?;
            }
        }
    } else {
        for f in fields {
            let top = f.path.split('.').next().unwrap_or_default();
            match u.get(top) {
                Some(v) => {
                    seed.insert(top, v.clone());
                }
                None if top == "_id" => {
                    seed.insert("_id", equality_value(q, "_id")?.clone());
                }
                None => {}
            }
        }
    }
    if fields.iter().any(|f| f.path == "_id") && !seed.contains_key("_id") {
        return None;
    }
    let bytes = seed.to_vec().ok()?;
    let key = snap
        .pattern
        .extract_from_document(RawDocument::from_bytes(&bytes).ok()?)
        .ok()?;
    snap.shard_for(&key).map(str::to_string)
}

fn filter_of(stmt: &Document) -> &Document {
    static EMPTY: std::sync::OnceLock<Document> = std::sync::OnceLock::new();
    stmt.get_document("q")
        .unwrap_or_else(|_| EMPTY.get_or_init(Document::new))
}

/// The shards a filter's shard key pins (`None`: it pins no key, every shard may hold a match).
fn key_shards(snap: &RoutingSnapshot, stmt: &Document, q: &Document) -> Option<Vec<String>> {
    if !simple_collation(stmt) {
        return None;
    }
    match snap.pattern.extract_from_filter(q) {
        FilterKeys::Keys(keys) => Some(shards_for_keys(snap, &keys)),
        FilterKeys::Untargetable => None,
    }
}

/// Where a single-document update or delete goes (docs/design/write-path.md section 1, as mongos
/// 8.0): the one shard its filter pins; every targeted shard when it pins an `_id` (each shard
/// holds at most one such document); otherwise a lookup (`direct` false: it may change the key, or
/// an upsert's new document may belong elsewhere).
fn single_target(
    snap: &RoutingSnapshot,
    shards: Option<Vec<String>>,
    identity: &Option<Bson>,
    direct: bool,
) -> Target {
    match shards {
        Some(s) if s.len() == 1 && direct => Target::One(s.into_iter().next().unwrap_or_default()),
        Some(s) if identity.is_some() && direct => Target::Many(s),
        None if identity.is_some() && direct => Target::Many(broadcast(snap)),
        Some(s) => Target::Lookup(s),
        None => Target::Lookup(broadcast(snap)),
    }
}

/// Targets an update statement (`{q, u, multi, upsert, collation}`).
pub fn target_update(snap: &RoutingSnapshot, stmt: &Document) -> Targeted {
    let q = filter_of(stmt);
    let u = stmt.get("u").unwrap_or(&Bson::Null);
    let multi = stmt.get("multi").is_some_and(crate::value::field::truthy);
    let upsert = stmt.get("upsert").is_some_and(crate::value::field::truthy);
    let retry_safe = update_is_retry_safe(u);
    let shards = key_shards(snap, stmt, q);
    let may_change_key = update_may_change_key(snap, q, u, upsert);
    if multi {
        if upsert && !matches!(&shards, Some(s) if s.len() == 1 && single_key(snap, q)) {
            return error(
                ErrorCode::ShardKeyNotFound,
                "Failed to target upsert by query :: could not extract exact shard key",
            );
        }
        // (A multi-document replacement is refused by the shards themselves.)
        if may_change_key && matches!(u, Bson::Document(d) if is_operator_doc(d)) {
            return error(
                ErrorCode::InvalidOptions,
                "Multi-update operations are not allowed when updating the shard key field.",
            );
        }
        return Targeted {
            target: Target::Many(shards.unwrap_or_else(|| broadcast(snap))),
            identity: None,
            retry_safe,
        };
    }
    let identity = id_identity(q);
    let direct = !may_change_key
        && (!upsert
            || matches!(&shards, Some(s) if s.len() == 1 && upsert_owner(snap, q, u).as_ref() == s.first()));
    // An upsert goes straight to a shard only when that shard owns the document it would
    // insert; pinned only by `_id` on several shards it is looked up (it could insert on each).
    let target = single_target(snap, shards, &identity, direct);
    let identity = match target {
        Target::One(_) => identity,
        _ => None,
    };
    Targeted {
        target,
        identity,
        retry_safe,
    }
}

/// Whether a filter pins exactly one full shard key value by equality (what a multi-document
/// upsert needs).
fn single_key(snap: &RoutingSnapshot, q: &Document) -> bool {
    snap.pattern
        .fields()
        .iter()
        .all(|f| equality_value(q, &f.path).is_some())
}

/// Targets a delete statement (`{q, limit, collation}`).
pub fn target_delete(snap: &RoutingSnapshot, stmt: &Document) -> Targeted {
    let q = filter_of(stmt);
    let multi = crate::value::field::number_field(stmt, "limit").unwrap_or(0) == 0;
    let shards = key_shards(snap, stmt, q);
    if multi {
        return Targeted {
            target: Target::Many(shards.unwrap_or_else(|| broadcast(snap))),
            identity: None,
            retry_safe: false,
        };
    }
    let identity = id_identity(q);
    let target = single_target(snap, shards, &identity, true);
    let identity = match target {
        Target::One(_) => identity,
        _ => None,
    };
    // A delete pinned to one document is retry-safe; a multi-document delete is not part of
    // any proof (it has no identity).
    let retry_safe = identity.is_some();
    Targeted {
        target,
        identity,
        retry_safe,
    }
}

/// Targets a statement on an unsharded collection: it goes to `shard` (the database's primary),
/// with the identity and retry-safety the same statement has on a sharded collection, so an
/// ordered `bulkWrite` mixing both can be proven as a whole. `insert_id` is, for an insert, the
/// `_id` the client supplied.
pub fn target_unsharded(
    kind: WriteKind,
    stmt: &Document,
    insert_id: Option<&Bson>,
    shard: &str,
) -> Targeted {
    let (identity, retry_safe) = match kind {
        WriteKind::Insert => (insert_id.cloned(), true),
        WriteKind::Update => {
            let multi = stmt.get("multi").is_some_and(crate::value::field::truthy);
            let u = stmt.get("u").unwrap_or(&Bson::Null);
            let identity = if multi {
                None
            } else {
                id_identity(filter_of(stmt))
            };
            (identity, update_is_retry_safe(u))
        }
        WriteKind::Delete => {
            let single = crate::value::field::number_field(stmt, "limit").unwrap_or(0) == 1;
            let identity = if single {
                id_identity(filter_of(stmt))
            } else {
                None
            };
            let safe = identity.is_some();
            (identity, safe)
        }
    };
    Targeted {
        target: Target::One(shard.to_string()),
        identity,
        retry_safe,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::ShardKeyPattern;
    use bson::{doc, rawdoc};

    fn snap(key: Document) -> RoutingSnapshot {
        RoutingSnapshot::initial("d.c", ShardKeyPattern::parse(&key).unwrap(), 3).unwrap()
    }

    fn is_lookup(t: &Targeted) -> bool {
        matches!(t.target, Target::Lookup(_))
    }

    #[test]
    fn writes_that_may_change_the_shard_key_are_looked_up_or_refused() {
        let s = snap(doc! {"a.b": "hashed"});
        let single = |u: Document| target_update(&s, &doc! {"q": {"a.b": 1}, "u": u});
        assert!(is_lookup(&single(doc! {"$set": {"a.b": 2}})));
        assert!(is_lookup(&single(doc! {"$set": {"a": {"b": 2}}})));
        assert!(is_lookup(&single(doc! {"$unset": {"a.b.c": 1}})));
        assert!(is_lookup(&single(doc! {"$rename": {"x": "a.b"}})));
        assert!(is_lookup(&single(doc! {"$inc": {"a.b": 1}})));
        assert!(
            is_lookup(&single(doc! {"x": 1})),
            "a replacement without the key"
        );
        for unchanged in [
            doc! {"$set": {"ab": 2}},
            doc! {"$set": {"a.bc": 2}},
            doc! {"$inc": {"n": 1}},
            doc! {"$set": {"a.b": 1}},
            doc! {"$setOnInsert": {"a.b": 3}},
            doc! {"a": {"b": 1}, "x": 2},
        ] {
            assert!(
                matches!(single(unchanged.clone()).target, Target::One(_)),
                "{unchanged}"
            );
        }
        let multi = target_update(
            &s,
            &doc! {"q": {"x": 1}, "u": {"$set": {"a.b": 2}}, "multi": true},
        );
        assert!(matches!(
            multi.target,
            Target::Error {
                code: ErrorCode::InvalidOptions,
                ..
            }
        ));
        // `_id` is the shards' to protect.
        let s = snap(doc! {"_id": "hashed"});
        let t = target_update(&s, &doc! {"q": {"_id": 1}, "u": {"$set": {"_id": 1}}});
        assert!(matches!(t.target, Target::One(_)));
    }

    #[test]
    fn inserts_go_to_the_owner_of_their_hash() {
        let s = snap(doc! {"_id": "hashed"});
        let t = target_insert(&s, &rawdoc! {"_id": 1}, true);
        assert!(matches!(t.target, Target::One(_)));
        assert_eq!(t.identity, Some(Bson::Int32(1)));
        assert!(t.retry_safe);
        let generated = target_insert(&s, &rawdoc! {"_id": 1}, false);
        assert_eq!(generated.identity, None);
        let arr = target_insert(&s, &rawdoc! {"_id": [1]}, true);
        assert!(matches!(
            arr.target,
            Target::Error {
                code: ErrorCode::ShardKeyNotFound,
                ..
            }
        ));
    }

    #[test]
    fn updates_follow_the_table() {
        let s = snap(doc! {"sk": "hashed"});
        let one = target_update(&s, &doc! {"q": {"sk": 5}, "u": {"$set": {"a": 1}}});
        assert!(matches!(one.target, Target::One(_)));
        assert_eq!(
            one.identity, None,
            "a non-unique shard key value pins no document"
        );
        assert!(one.retry_safe);
        let by_id = target_update(
            &s,
            &doc! {"q": {"sk": 5, "_id": 9}, "u": {"$inc": {"a": 1}}},
        );
        assert_eq!(by_id.identity, Some(Bson::Int32(9)));
        assert!(!by_id.retry_safe, "$inc is not idempotent");
        let multi = target_update(
            &s,
            &doc! {"q": {"x": 1}, "u": {"$set": {"a": 1}}, "multi": true},
        );
        assert_eq!(
            multi.target,
            Target::Many(vec!["shard0".into(), "shard1".into(), "shard2".into()])
        );
        let id_only = target_update(&s, &doc! {"q": {"_id": 3}, "u": {"$set": {"a": 1}}});
        assert!(matches!(id_only.target, Target::Many(_)));
        assert_eq!(
            id_only.identity, None,
            "broadcast statements have no identity"
        );
        let neither = target_update(&s, &doc! {"q": {"x": 1}, "u": {"$set": {"a": 1}}});
        assert!(is_lookup(&neither), "mongos 8.0: a write without shard key");
        let upsert_by_id = target_update(
            &s,
            &doc! {"q": {"_id": 1}, "u": {"$set": {"a": 1}}, "upsert": true},
        );
        assert!(is_lookup(&upsert_by_id));
        let upsert_by_key = target_update(
            &s,
            &doc! {"q": {"sk": 1}, "u": {"$set": {"a": 1}}, "upsert": true},
        );
        assert!(matches!(upsert_by_key.target, Target::One(_)));
        let multi_upsert = target_update(
            &s,
            &doc! {"q": {"sk": {"$in": [1, 2]}}, "u": {"$set": {"a": 1}}, "upsert": true, "multi": true},
        );
        assert!(matches!(
            multi_upsert.target,
            Target::Error {
                code: ErrorCode::ShardKeyNotFound,
                ..
            }
        ));
        let in_many = target_update(
            &s,
            &doc! {"q": {"sk": {"$in": [1, 2, 3, 4, 5, 6, 7, 8]}}, "u": {"$set": {"a": 1}}, "multi": true},
        );
        assert!(matches!(in_many.target, Target::Many(_)));
        let in_single = target_update(
            &s,
            &doc! {"q": {"sk": {"$in": [1, 2, 3, 4, 5, 6, 7, 8]}}, "u": {"$set": {"a": 1}}},
        );
        assert!(is_lookup(&in_single), "one document, several shards");
        let pipeline = target_update(&s, &doc! {"q": {"sk": 1}, "u": [{"$set": {"a": 1}}]});
        assert!(!pipeline.retry_safe);
        let collated = target_update(
            &s,
            &doc! {"q": {"sk": "a"}, "u": {"$set": {"a": 1}}, "multi": true, "collation": {"locale": "fr"}},
        );
        assert!(matches!(collated.target, Target::Many(_)));
        let nothing = target_update(
            &s,
            &doc! {"q": {"sk": {"$in": []}}, "u": {"$set": {"a": 1}}, "multi": true},
        );
        assert_eq!(
            nothing.target,
            Target::Many(vec!["shard0".into()]),
            "the first chunk's shard"
        );
    }

    #[test]
    fn upserts_go_straight_only_where_their_document_belongs() {
        let s = snap(doc! {"_id": "hashed"});
        let ok = target_update(&s, &doc! {"q": {"_id": 7}, "u": {"v": 1}, "upsert": true});
        assert!(matches!(ok.target, Target::One(_)));
        assert_eq!(ok.identity, Some(Bson::Int32(7)));
        assert!(ok.retry_safe);
        let generated = target_update(
            &s,
            &doc! {"q": {"_id": {"$in": []}}, "u": {"$set": {"v": 1}}, "upsert": true},
        );
        assert!(is_lookup(&generated), "the new _id is not the filter's");
        let s = snap(doc! {"sk": "hashed"});
        let keeps = target_update(
            &s,
            &doc! {"q": {"sk": 1}, "u": {"sk": 1, "v": 2}, "upsert": true},
        );
        assert!(matches!(keeps.target, Target::One(_)));
        let moves = target_update(&s, &doc! {"q": {"sk": 1}, "u": {"sk": 2}, "upsert": true});
        assert!(is_lookup(&moves));
    }

    #[test]
    fn deletes() {
        let s = snap(doc! {"_id": "hashed"});
        let one = target_delete(&s, &doc! {"q": {"_id": 4}, "limit": 1});
        assert!(matches!(one.target, Target::One(_)));
        assert_eq!(one.identity, Some(Bson::Int32(4)));
        assert!(one.retry_safe);
        let many = target_delete(&s, &doc! {"q": {"x": 1}, "limit": 0});
        assert!(matches!(many.target, Target::Many(_)));
        let single = target_delete(&s, &doc! {"q": {"x": 1}, "limit": 1});
        assert!(is_lookup(&single));
        let in_ids = target_delete(
            &s,
            &doc! {"q": {"_id": {"$in": (0..10).collect::<Vec<i32>>()}}, "limit": 1},
        );
        assert!(is_lookup(&in_ids));
    }
}
