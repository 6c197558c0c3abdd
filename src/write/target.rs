//! Targeting one write statement: the shards it must go to, its *identity* (the `_id` of the
//! one document it touches, when it pins one) and whether applying it twice leaves the same
//! state (its retry-safety). Pure: a statement and a routing snapshot in, a [`Targeted`] out.
//! The rules are WRITE-PATH.md section 1.

use std::collections::BTreeSet;

use bson::{Bson, Document, RawDocument};

use crate::error_codes::ErrorCode;
use crate::routing::{FilterKeys, RoutingSnapshot, ShardKey};

/// The kind of write command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// `insert` (`documents`).
    Insert,
    /// `update` (`updates`).
    Update,
    /// `delete` (`deletes`).
    Delete,
}

impl WriteKind {
    /// The kind of a command name.
    pub fn from_command(name: &str) -> Option<WriteKind> {
        match name {
            "insert" => Some(WriteKind::Insert),
            "update" => Some(WriteKind::Update),
            "delete" => Some(WriteKind::Delete),
            _ => None,
        }
    }

    /// The command name.
    pub fn command(self) -> &'static str {
        match self {
            WriteKind::Insert => "insert",
            WriteKind::Update => "update",
            WriteKind::Delete => "delete",
        }
    }

    /// The field (and document sequence identifier) holding the statements.
    pub fn statements_field(self) -> &'static str {
        match self {
            WriteKind::Insert => "documents",
            WriteKind::Update => "updates",
            WriteKind::Delete => "deletes",
        }
    }
}

/// Where a statement goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// Exactly one shard.
    One(String),
    /// Several shards (`$in` over several chunks, or a broadcast).
    Many(Vec<String>),
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
    /// The `_id` of the one document it touches, when it pins one (see WRITE-PATH.md 2.2).
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

fn shards_for_keys(snap: &RoutingSnapshot, keys: &[ShardKey]) -> Target {
    let shards: BTreeSet<String> = keys
        .iter()
        .filter_map(|k| snap.shard_for(k).map(|s| s.to_string()))
        .collect();
    match shards.len() {
        1 => Target::One(shards.into_iter().next().unwrap_or_default()),
        _ => Target::Many(shards.into_iter().collect()),
    }
}

fn broadcast(snap: &RoutingSnapshot) -> Target {
    Target::Many(snap.chunks.shards().into_iter().collect())
}

/// The `_id` a filter pins by equality (a single value, not `$in`).
fn id_identity(filter: &Document) -> Option<Bson> {
    let v = filter.get("_id").or_else(|| {
        filter.get("$and").and_then(|a| match a {
            Bson::Array(items) => items
                .iter()
                .filter_map(|i| i.as_document())
                .find_map(|d| d.get("_id")),
            _ => None,
        })
    })?;
    match v {
        Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
            match d.get("$eq") {
                Some(eq) if d.len() == 1 => plain_value(eq),
                _ => None,
            }
        }
        other => plain_value(other),
    }
}

fn plain_value(v: &Bson) -> Option<Bson> {
    match v {
        Bson::Array(_) | Bson::RegularExpression(_) | Bson::Null | Bson::Undefined => None,
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
            crate::embedded::render::render_value(&crate::routing::shard_key::raw_to_bson(v))
        ),
        None => "{}".to_string(),
    }
}

/// Whether an update document's operators are all idempotent (replacements are).
fn update_is_retry_safe(u: &Bson) -> bool {
    match u {
        Bson::Document(d) => {
            let ops = d.keys().next().is_some_and(|k| k.starts_with('$'));
            !ops || d.keys().all(|k| IDEMPOTENT_OPERATORS.contains(&k.as_str()))
        }
        _ => false, // pipeline updates
    }
}

/// Targets an update statement (`{q, u, multi, upsert, collation}`).
pub fn target_update(snap: &RoutingSnapshot, stmt: &Document) -> Targeted {
    let no_filter = Document::new();
    let q = stmt.get_document("q").unwrap_or(&no_filter);
    let u = stmt.get("u").unwrap_or(&Bson::Null);
    let multi = stmt.get("multi").is_some_and(crate::command::truthy);
    let upsert = stmt.get("upsert").is_some_and(crate::command::truthy);
    let identity = if multi { None } else { id_identity(q) };
    let retry_safe = update_is_retry_safe(u);
    let keys = if simple_collation(stmt) {
        snap.pattern.extract_from_filter(q)
    } else {
        FilterKeys::Untargetable
    };
    let target = match keys {
        FilterKeys::Keys(keys) => {
            let t = shards_for_keys(snap, &keys);
            if let (Target::One(shard), Bson::Document(repl)) = (&t, u) {
                if !repl.keys().next().is_some_and(|k| k.starts_with('$')) {
                    if let Some(e) = replacement_moves(snap, shard, q, repl) {
                        return e;
                    }
                }
            }
            if let Bson::Document(ops) = u {
                if let Some(e) = modifies_shard_key(snap, ops) {
                    return e;
                }
            }
            t
        }
        FilterKeys::Untargetable => {
            if upsert {
                return error(
                    ErrorCode::ShardKeyNotFound,
                    "Failed to target upsert by query :: could not extract exact shard key: An upsert on a sharded collection must contain the shard key and have the simple collation",
                );
            }
            if multi || identity.is_some() {
                broadcast(snap)
            } else {
                return single_without_key(snap, stmt, "update");
            }
        }
    };
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

/// mongos's refusal of a single-document update or delete (`kind`) whose filter pins neither
/// the shard key nor an `_id`: it could not say which document to change.
fn single_without_key(snap: &RoutingSnapshot, stmt: &Document, kind: &str) -> Targeted {
    let request = if kind == "update" { "Update" } else { "Delete" };
    error(
        ErrorCode::InvalidOptions,
        format!(
            "A single {kind} on a sharded collection must contain an exact match on _id (and have the collection default collation) or contain the shard key (and have the simple collation). {request} request: {}, shard key pattern: {}",
            crate::embedded::render::render_doc(stmt),
            crate::embedded::render::render_doc(&snap.pattern.to_document())
        ),
    )
}

/// An error if a replacement document would carry the document to another shard.
fn replacement_moves(
    snap: &RoutingSnapshot,
    shard: &str,
    q: &Document,
    repl: &Document,
) -> Option<Targeted> {
    let mut full = repl.clone();
    if !full.contains_key("_id") {
        if let Some(id) = id_identity(q) {
            full.insert("_id", id);
        }
    }
    let bytes = full.to_vec().ok()?;
    let raw = RawDocument::from_bytes(&bytes).ok()?;
    match snap.pattern.extract_from_document(raw) {
        Ok(key) => match snap.shard_for(&key) {
            Some(new_shard) if new_shard != shard => Some(error(
                ErrorCode::ImmutableField,
                format!(
                    "After applying the update, the document would move from shard {shard} to shard {new_shard}: changing a document's shard key value across shards is not supported"
                ),
            )),
            _ => None,
        },
        Err(e) => Some(error(e.code, e.message)),
    }
}

/// An error if update operators touch a shard key field.
fn modifies_shard_key(snap: &RoutingSnapshot, ops: &Document) -> Option<Targeted> {
    if !ops.keys().next().is_some_and(|k| k.starts_with('$')) {
        return None;
    }
    for (_, args) in ops {
        let Bson::Document(args) = args else { continue };
        for path in args.keys() {
            for f in snap.pattern.fields() {
                let hit = path == &f.path
                    || is_path_prefix(&f.path, path)
                    || is_path_prefix(path, &f.path);
                if hit {
                    return Some(error(
                        ErrorCode::ImmutableField,
                        format!("Performing an update on the path '{path}' would modify the shard key field '{}'", f.path),
                    ));
                }
            }
        }
    }
    None
}

/// Whether `prefix` names a parent of `path` (`a` of `a.b`, not of `ab`).
fn is_path_prefix(prefix: &str, path: &str) -> bool {
    path.len() > prefix.len() && path.starts_with(prefix) && path.as_bytes()[prefix.len()] == b'.'
}

/// Targets a delete statement (`{q, limit, collation}`).
pub fn target_delete(snap: &RoutingSnapshot, stmt: &Document) -> Targeted {
    let no_filter = Document::new();
    let q = stmt.get_document("q").unwrap_or(&no_filter);
    let multi = crate::command::number_field(stmt, "limit").unwrap_or(0) == 0;
    let identity = if multi { None } else { id_identity(q) };
    let keys = if simple_collation(stmt) {
        snap.pattern.extract_from_filter(q)
    } else {
        FilterKeys::Untargetable
    };
    let target = match keys {
        FilterKeys::Keys(keys) => shards_for_keys(snap, &keys),
        FilterKeys::Untargetable => {
            if multi || identity.is_some() {
                broadcast(snap)
            } else {
                return single_without_key(snap, stmt, "delete");
            }
        }
    };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::ShardKeyPattern;
    use bson::{doc, rawdoc};

    fn snap(key: Document) -> RoutingSnapshot {
        RoutingSnapshot::initial("d.c", ShardKeyPattern::parse(&key).unwrap(), 3).unwrap()
    }

    #[test]
    fn operators_on_the_shard_key_or_its_parents_or_children_are_refused() {
        let s = snap(doc! {"a.b": "hashed"});
        let refused = |u: Document| {
            let t = target_update(&s, &doc! {"q": {"a.b": 1}, "u": u});
            matches!(t.target, Target::Error { .. })
        };
        assert!(refused(doc! {"$set": {"a.b": 2}}));
        assert!(refused(doc! {"$set": {"a": {"b": 2}}}));
        assert!(refused(doc! {"$unset": {"a.b.c": 1}}));
        assert!(!refused(doc! {"$set": {"ab": 2}}));
        assert!(!refused(doc! {"$set": {"a.bc": 2}}));
        assert!(!refused(doc! {"$inc": {"n": 1}}));
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
        assert!(matches!(
            neither.target,
            Target::Error {
                code: ErrorCode::InvalidOptions,
                ..
            }
        ));
        let upsert = target_update(
            &s,
            &doc! {"q": {"_id": 1}, "u": {"$set": {"a": 1}}, "upsert": true},
        );
        assert!(matches!(
            upsert.target,
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
        let pipeline = target_update(&s, &doc! {"q": {"sk": 1}, "u": [{"$set": {"a": 1}}]});
        assert!(!pipeline.retry_safe);
        let touches_key = target_update(&s, &doc! {"q": {"sk": 1}, "u": {"$set": {"sk": 2}}});
        assert!(matches!(
            touches_key.target,
            Target::Error {
                code: ErrorCode::ImmutableField,
                ..
            }
        ));
        let collated = target_update(
            &s,
            &doc! {"q": {"sk": "a"}, "u": {"$set": {"a": 1}}, "multi": true, "collation": {"locale": "fr"}},
        );
        assert!(matches!(collated.target, Target::Many(_)));
    }

    #[test]
    fn replacements_must_stay_on_their_shard() {
        let s = snap(doc! {"_id": "hashed"});
        let ok = target_update(&s, &doc! {"q": {"_id": 7}, "u": {"v": 1}, "upsert": true});
        assert!(matches!(ok.target, Target::One(_)));
        assert_eq!(ok.identity, Some(Bson::Int32(7)));
        assert!(ok.retry_safe);
        let s = snap(doc! {"sk": "hashed"});
        // Find a value whose hash lands on another shard than sk: 1.
        let home = match target_update(&s, &doc! {"q": {"sk": 1}, "u": {"sk": 1}}).target {
            Target::One(shard) => shard,
            other => panic!("{other:?}"),
        };
        let other = (2..100)
            .find(
                |v| match target_insert(&s, &rawdoc! {"sk": *v}, true).target {
                    Target::One(shard) => shard != home,
                    _ => false,
                },
            )
            .unwrap();
        let moved = target_update(&s, &doc! {"q": {"sk": 1}, "u": {"sk": other}});
        assert!(matches!(
            moved.target,
            Target::Error {
                code: ErrorCode::ImmutableField,
                ..
            }
        ));
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
        let bad = target_delete(&s, &doc! {"q": {"x": 1}, "limit": 1});
        assert!(matches!(
            bad.target,
            Target::Error {
                code: ErrorCode::InvalidOptions,
                ..
            }
        ));
    }
}
