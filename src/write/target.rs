//! Targeting one write statement: the shards it must go to, its *identity* (the `_id` of the
//! one document it touches, when it pins one) and whether applying it twice leaves the same
//! state (its retry-safety). Pure: a statement and a routing snapshot in, a [`Targeted`] out.
//! The rules are docs/design/write-path.md section 1.

use std::collections::BTreeSet;

use bson::{Bson, Document, RawBsonRef, RawDocument};

use crate::routing::filter::{paths_overlap, raw_scalar, RawFilter};
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

/// Whether an update document's operators are all idempotent (replacements are). A path
/// through the positional `$` is not: the element it names is the first the filter matches,
/// which the write itself may change (`{arr: 1}`, `$set: {"arr.$": 9}` on `[1, 1]` gives
/// `[9, 1]` once and `[9, 9]` twice).
fn update_is_retry_safe(u: &Bson) -> bool {
    match u {
        Bson::Document(d) => {
            !is_operator_doc(d)
                || d.iter().all(|(op, args)| {
                    IDEMPOTENT_OPERATORS.contains(&op.as_str())
                        && !matches!(args, Bson::Document(a) if a.keys().any(|p| is_positional(p)))
                })
        }
        _ => false, // pipeline updates
    }
}

/// Whether an update path goes through the positional `$` (not `$[]` or `$[<id>]`).
fn is_positional(path: &str) -> bool {
    path.split('.').any(|part| part == "$")
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

/// Targets an update statement as [`target_update`] does, read in place: the statement's own
/// bytes when their shape allows ([`target_update_raw`]), an owned copy otherwise.
pub fn target_update_bytes(snap: &RoutingSnapshot, stmt: &RawDocument) -> Targeted {
    target_update_raw(snap, stmt).unwrap_or_else(|| match Document::try_from(stmt) {
        Ok(d) => target_update(snap, &d),
        Err(e) => error(ErrorCode::InvalidBSON, e.to_string()),
    })
}

/// Targets a delete statement as [`target_delete`] does, read in place when its shape allows.
pub fn target_delete_bytes(snap: &RoutingSnapshot, stmt: &RawDocument) -> Targeted {
    target_delete_raw(snap, stmt).unwrap_or_else(|| match Document::try_from(stmt) {
        Ok(d) => target_delete(snap, &d),
        Err(e) => error(ErrorCode::InvalidBSON, e.to_string()),
    })
}

/// The fields of an update or delete statement that targeting reads, read in place.
struct RawStatement<'a> {
    q: &'a RawDocument,
    u: Option<&'a RawDocument>,
    multi: bool,
    upsert: bool,
    limit: Option<i64>,
}

/// A value's truthiness as [`crate::value::field::truthy`] decides it; documents and arrays
/// are true without being copied.
fn raw_truthy(v: RawBsonRef<'_>) -> Option<bool> {
    match v {
        RawBsonRef::Document(_) | RawBsonRef::Array(_) => Some(true),
        other => Bson::try_from(other)
            .ok()
            .map(|b| crate::value::field::truthy(&b)),
    }
}

/// Reads a statement's `q`, `u`, `multi`, `upsert` and `limit`. `None` (the owned path
/// decides) when a field appears twice (an owned copy keeps the last), when it has a
/// `collation`, or when `q` or `u` is not a document (pipeline updates).
fn raw_statement(stmt: &RawDocument) -> Option<RawStatement<'_>> {
    let mut q = None;
    let mut u = None;
    let mut multi = None;
    let mut upsert = None;
    let mut limit = None;
    for item in stmt {
        let (k, v) = item.ok()?;
        let slot = match k.as_str() {
            "q" => &mut q,
            "u" => &mut u,
            "multi" => &mut multi,
            "upsert" => &mut upsert,
            "limit" => &mut limit,
            "collation" => return None,
            _ => continue,
        };
        if slot.replace(v).is_some() {
            return None;
        }
    }
    let RawBsonRef::Document(q) = q? else {
        return None;
    };
    let u = match u {
        Some(RawBsonRef::Document(u)) => Some(u),
        Some(_) => return None,
        None => None,
    };
    let limit = match limit {
        Some(RawBsonRef::Int32(i)) => Some(i64::from(i)),
        Some(RawBsonRef::Int64(i)) => Some(i),
        Some(RawBsonRef::Double(d)) => crate::value::field::number_value(&Bson::Double(d)),
        _ => None,
    };
    Some(RawStatement {
        q,
        u,
        multi: multi.map_or(Some(false), raw_truthy)?,
        upsert: upsert.map_or(Some(false), raw_truthy)?,
        limit,
    })
}

/// [`single_target`] for at most one targeted shard.
fn single_target_raw(
    snap: &RoutingSnapshot,
    shard: Option<&str>,
    identity: &Option<Bson>,
    direct: bool,
) -> Target {
    match shard {
        Some(s) if direct => Target::One(s.to_string()),
        None if identity.is_some() && direct => Target::Many(broadcast(snap)),
        Some(s) => Target::Lookup(vec![s.to_string()]),
        None => Target::Lookup(broadcast(snap)),
    }
}

/// [`target_update`] on the statement's bytes, without an owned copy and hashing the key once;
/// `None` for a shape it leaves to the owned path: a collation, a pipeline update, a filter
/// [`RawFilter::read`] does not read, an update that writes a key field other than `_id`, a
/// replacement under a key other than `{_id}` alone, a key path with a numeric part.
pub fn target_update_raw(snap: &RoutingSnapshot, stmt: &RawDocument) -> Option<Targeted> {
    let st = raw_statement(stmt)?;
    let u = st.u?;
    let filter = RawFilter::read(&snap.pattern, st.q)?;
    let fields = snap.pattern.fields();
    let key_beyond_id = fields.iter().any(|f| f.path != "_id");
    // One pass over the update: whether it is an operator update (its first field says), whether
    // its operators are all idempotent, and whether it may change the key
    // (`update_may_change_key`): any operator path on or over a key field other than `_id` is
    // left to the owned path, so past this loop it cannot.
    let mut operator = false;
    let mut retry_safe = true;
    for (n, item) in u.iter().enumerate() {
        let (op, args) = item.ok()?;
        let op = op.as_str();
        if n == 0 {
            operator = op.starts_with('$');
        }
        if !operator {
            break;
        }
        retry_safe &= IDEMPOTENT_OPERATORS.contains(&op);
        if retry_safe {
            if let RawBsonRef::Document(args) = args {
                for arg in args {
                    retry_safe &= !is_positional(arg.ok()?.0.as_str());
                }
            }
        }
        if !key_beyond_id || (op == "$setOnInsert" && !st.upsert) {
            continue;
        }
        let RawBsonRef::Document(args) = args else {
            continue;
        };
        for arg in args {
            let (path, arg) = arg.ok()?;
            let onto = match arg {
                RawBsonRef::String(to) if op == "$rename" => Some(to),
                _ => None,
            };
            let touches = |f: &crate::routing::shard_key::KeyField| {
                f.path != "_id"
                    && (paths_overlap(path.as_str(), &f.path)
                        || onto.is_some_and(|to| paths_overlap(to, &f.path)))
            };
            if fields.iter().any(touches) {
                return None;
            }
        }
    }
    // A replacement (`{}` too) is retry-safe; it keeps the key only under `{_id}` alone.
    if !operator && key_beyond_id {
        return None;
    }
    let shard = filter.shard(snap).ok()?;
    if st.multi {
        // A multi-document upsert needs one full key by equality: a pinned key is one.
        if st.upsert && shard.is_none() {
            return Some(error(
                ErrorCode::ShardKeyNotFound,
                "Failed to target upsert by query :: could not extract exact shard key",
            ));
        }
        return Some(Targeted {
            target: Target::Many(match shard {
                Some(s) => vec![s.to_string()],
                None => broadcast(snap),
            }),
            identity: None,
            retry_safe,
        });
    }
    let direct = match shard {
        _ if !st.upsert => true,
        None => false,
        Some(s) => upsert_owner_raw(snap, &filter, u, operator, s)? == Some(s),
    };
    let identity = filter.identity();
    let target = single_target_raw(snap, shard, &identity, direct);
    let identity = match target {
        Target::One(_) => identity,
        _ => None,
    };
    Some(Targeted {
        target,
        identity,
        retry_safe,
    })
}

/// [`upsert_owner`] for a filter that pins the full key (owned by `pinned`) by scalars:
/// `Some(owner)`, or `None` when the owned path must decide.
fn upsert_owner_raw<'s>(
    snap: &'s RoutingSnapshot,
    filter: &RawFilter<'_>,
    u: &RawDocument,
    operator: bool,
    pinned: &'s str,
) -> Option<Option<&'s str>> {
    let fields = snap.pattern.fields();
    // The new document is seeded with the key fields' paths: paths over one another or with a
    // numeric part (which may build arrays) are left to the owned path.
    let plain = fields.iter().enumerate().all(|(i, f)| {
        !f.path
            .split('.')
            .any(|p| p.bytes().all(|b| b.is_ascii_digit()))
            && fields[..i].iter().all(|g| !paths_overlap(&g.path, &f.path))
    });
    if !plain {
        return None;
    }
    if operator {
        // Seeded with exactly the values the filter pins: the key the filter pins.
        return Some(Some(pinned));
    }
    // A replacement (only under `{_id}` alone here): its own `_id`, else the filter's.
    let mut own = None;
    for item in u {
        let (k, v) = item.ok()?;
        if k.as_str() == "_id" && own.replace(v).is_some() {
            return None;
        }
    }
    match own {
        None => Some(Some(pinned)),
        Some(v) if Some(v) == filter.id => Some(Some(pinned)),
        Some(v) => {
            let key = snap.pattern.key_of_raw_scalars([raw_scalar(v)?]);
            Some(snap.shard_for(&key))
        }
    }
}

/// [`target_delete`] on the statement's bytes; `None` for a shape it leaves to the owned path
/// (a collation, a filter [`RawFilter::read`] does not read).
pub fn target_delete_raw(snap: &RoutingSnapshot, stmt: &RawDocument) -> Option<Targeted> {
    let st = raw_statement(stmt)?;
    let filter = RawFilter::read(&snap.pattern, st.q)?;
    let shard = filter.shard(snap).ok()?;
    if st.limit.unwrap_or(0) == 0 {
        return Some(Targeted {
            target: Target::Many(match shard {
                Some(s) => vec![s.to_string()],
                None => broadcast(snap),
            }),
            identity: None,
            retry_safe: false,
        });
    }
    let identity = filter.identity();
    let target = single_target_raw(snap, shard, &identity, true);
    let identity = match target {
        Target::One(_) => identity,
        _ => None,
    };
    let retry_safe = identity.is_some();
    Some(Targeted {
        target,
        identity,
        retry_safe,
    })
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
        let positional = doc! {"q": {"sk": 1, "arr": 1}, "u": {"$set": {"arr.$": 9}}};
        assert!(
            !target_update(&s, &positional).retry_safe,
            "the first match moves"
        );
        let filtered = doc! {"q": {"sk": 1}, "u": {"$set": {"arr.$[e]": 9, "arr.$[]": 1}}};
        assert!(target_update(&s, &filtered).retry_safe);
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

    /// Encodes a statement field by field, so that a field may appear twice (an owned copy
    /// keeps the last occurrence; the raw path must leave such statements to it).
    fn raw_fields(fields: &[(&str, Bson)]) -> bson::RawDocumentBuf {
        let mut out = bson::RawDocumentBuf::new();
        for (k, v) in fields {
            let name = bson::raw::CString::try_from(*k).unwrap();
            out.append(name, bson::RawBson::try_from(v.clone()).unwrap());
        }
        out
    }

    /// Targets `stmt` both ways and checks they agree; returns whether the raw path decided
    /// (rather than leaving it to the owned copy).
    fn agree(s: &RoutingSnapshot, kind: WriteKind, stmt: &RawDocument) -> bool {
        let owned = Document::try_from(stmt).unwrap();
        let (want, got, raw) = match kind {
            WriteKind::Update => (
                target_update(s, &owned),
                target_update_bytes(s, stmt),
                target_update_raw(s, stmt),
            ),
            _ => (
                target_delete(s, &owned),
                target_delete_bytes(s, stmt),
                target_delete_raw(s, stmt),
            ),
        };
        assert_eq!(got, want, "{kind:?} {owned} on {:?}", s.pattern);
        if let Some(raw) = &raw {
            assert_eq!(raw, &want, "raw path: {kind:?} {owned} on {:?}", s.pattern);
        }
        raw.is_some()
    }

    fn upd(d: Document) -> bson::RawDocumentBuf {
        bson::RawDocumentBuf::try_from(&d).unwrap()
    }

    #[test]
    fn raw_targeting_equals_owned_targeting() {
        let patterns = [
            doc! {"_id": "hashed"},
            doc! {"_id": 1},
            doc! {"sk": "hashed"},
            doc! {"a.b": "hashed"},
            doc! {"region": 1, "_id": "hashed"},
            doc! {"a": 1},
        ];
        let filters = [
            doc! {},
            doc! {"_id": 7},
            doc! {"_id": 7_i64},
            doc! {"_id": "x-7"},
            doc! {"_id": {"$eq": 7}},
            doc! {"_id": {"$eq": 7, "$ne": 8}},
            doc! {"_id": {"$eq": [7]}},
            doc! {"_id": {"$eq": {"$in": [1, 2]}}},
            doc! {"_id": [1, 2]},
            doc! {"_id": {"$in": [1, 2]}},
            doc! {"_id": {"$in": []}},
            doc! {"_id": {"$gt": 1}},
            doc! {"_id": null},
            doc! {"_id": {"p": 1, "s": 2}},
            doc! {"_id": {"p": [1]}},
            doc! {"_id": bson::Regex { pattern: "^a".try_into().unwrap(), options: "".try_into().unwrap() }},
            doc! {"sk": 1},
            doc! {"sk": 1, "_id": 9},
            doc! {"sk": {"$eq": "a"}, "x": 2},
            doc! {"sk": [1]},
            doc! {"sk": {"$in": [1, 2, 3, 4, 5, 6, 7, 8]}},
            doc! {"a.b": 1},
            doc! {"a.b": {"$eq": 2.5}},
            doc! {"a": {"b": 1}},
            doc! {"a.b": 1, "a": {"b": 2}},
            doc! {"a.b.c": 1},
            doc! {"a": 3},
            doc! {"a": 3, "region": "eu", "_id": 1},
            doc! {"region": "eu", "_id": {"$eq": 2}},
            doc! {"region": "eu"},
            doc! {"_id.x": 1, "_id": 1},
            doc! {"x": 1},
            doc! {"$and": [{"_id": 1}, {"x": 1}]},
            doc! {"_id": 1, "$expr": {"$eq": ["$x", 1]}},
            doc! {"_id": bson::Bson::Undefined, "sk": bson::Bson::MinKey},
        ];
        let updates = [
            doc! {"$set": {"v": 1}},
            doc! {"$inc": {"v": 1}},
            doc! {"$set": {"v": 1}, "$setOnInsert": {"w": 2}},
            doc! {"$set": {"sk": 2}},
            doc! {"$set": {"sk": 1}},
            doc! {"$set": {"a.b": 2}},
            doc! {"$set": {"a": {"b": 2}}},
            doc! {"$set": {"a.bc": 2}},
            doc! {"$unset": {"a.b.c": 1}},
            doc! {"$rename": {"x": "sk"}},
            doc! {"$rename": {"x": "y"}},
            doc! {"$setOnInsert": {"sk": 3, "region": "us"}},
            doc! {"$set": {"_id": 7}},
            doc! {"$set": 5},
            doc! {"v": 1},
            doc! {"_id": 7, "v": 1},
            doc! {"_id": 7_i64},
            doc! {"_id": 8},
            doc! {"_id": [7]},
            doc! {"_id": {"p": 1, "s": 2}},
            doc! {"sk": 1, "v": 2},
            doc! {"sk": 2},
            doc! {"a": {"b": 1}, "region": "eu", "_id": 1},
            doc! {},
        ];
        let flags = [
            doc! {},
            doc! {"upsert": true},
            doc! {"multi": true},
            doc! {"multi": true, "upsert": true},
            doc! {"upsert": 1, "multi": 0.0},
            doc! {"upsert": null, "multi": "yes"},
        ];
        let mut raw = 0;
        let mut total = 0;
        for key in &patterns {
            let s = snap(key.clone());
            for q in &filters {
                for u in &updates {
                    for f in &flags {
                        let mut stmt = doc! {"q": q.clone(), "u": u.clone()};
                        stmt.extend(f.clone());
                        total += 1;
                        raw += usize::from(agree(&s, WriteKind::Update, &upd(stmt)));
                    }
                }
                for limit in [
                    Bson::Int32(1),
                    Bson::Int64(0),
                    Bson::Double(1.0),
                    Bson::Null,
                ] {
                    let stmt = doc! {"q": q.clone(), "limit": limit};
                    total += 1;
                    raw += usize::from(agree(&s, WriteKind::Delete, &upd(stmt)));
                }
            }
        }
        // Many of these shapes are there to fall back (about 40 % are decided in place); all
        // agree, and a raw path that gave up on everything would fail here.
        assert!(raw * 3 > total, "{raw} of {total} decided in place");
    }

    #[test]
    fn common_shapes_are_targeted_in_place_and_the_rest_fall_back() {
        let s = snap(doc! {"_id": "hashed"});
        let in_place = [
            doc! {"q": {"_id": 7}, "u": {"$set": {"v": 1}}, "upsert": true},
            doc! {"q": {"_id": {"$eq": "x"}}, "u": {"v": 1}, "upsert": true},
            doc! {"q": {"_id": 7}, "u": {"_id": 8}, "upsert": true},
            doc! {"q": {"x": 1}, "u": {"$set": {"v": 1}}, "multi": true},
            doc! {"q": {"_id": 7, "x": 1}, "u": {"$inc": {"v": 1}}},
        ];
        for stmt in in_place {
            assert!(agree(&s, WriteKind::Update, &upd(stmt.clone())), "{stmt}");
        }
        let key_in_filter = target_update_raw(
            &s,
            &upd(doc! {"q": {"_id": 7}, "u": {"$set": {"v": 1}}, "upsert": true}),
        )
        .unwrap();
        assert!(matches!(key_in_filter.target, Target::One(_)));
        assert_eq!(key_in_filter.identity, Some(Bson::Int32(7)));
        assert!(key_in_filter.retry_safe);
        let elsewhere = target_update_raw(
            &s,
            &upd(doc! {"q": {"_id": 7}, "u": {"_id": 8}, "upsert": true}),
        )
        .unwrap();
        let (seven, eight) = (
            target_insert(&s, &rawdoc! {"_id": 7}, true).target,
            target_insert(&s, &rawdoc! {"_id": 8}, true).target,
        );
        assert_eq!(
            matches!(elsewhere.target, Target::One(_)),
            seven == eight,
            "a replacement's own _id decides where it is inserted"
        );
        let fall_back = [
            doc! {"q": {"_id": 7}, "u": {"$set": {"v": 1}}, "collation": {"locale": "simple"}},
            doc! {"q": {"_id": 7}, "u": [{"$set": {"v": 1}}]},
            doc! {"q": {"$expr": {"$eq": ["$_id", 7]}}, "u": {"$set": {"v": 1}}},
            doc! {"q": {"_id": {"$in": [7, 8]}}, "u": {"$set": {"v": 1}}},
            doc! {"q": {"_id": {"p": 1}}, "u": {"$set": {"v": 1}}},
        ];
        for stmt in fall_back {
            assert!(!agree(&s, WriteKind::Update, &upd(stmt.clone())), "{stmt}");
        }
        let s = snap(doc! {"sk": "hashed"});
        for stmt in [
            doc! {"q": {"sk": 1}, "u": {"sk": 1, "v": 2}, "upsert": true},
            doc! {"q": {"sk": 1}, "u": {"$set": {"sk": 1}}},
        ] {
            assert!(!agree(&s, WriteKind::Update, &upd(stmt.clone())), "{stmt}");
        }
    }

    #[test]
    fn repeated_fields_are_left_to_the_owned_copy() {
        for key in [doc! {"_id": "hashed"}, doc! {"sk": "hashed"}] {
            let s = snap(key);
            let q = |v: i32| Bson::Document(doc! {"_id": v, "sk": v});
            let set = Bson::Document(doc! {"$set": {"v": 1}});
            for fields in [
                vec![("q", q(1)), ("u", set.clone()), ("q", q(2))],
                vec![
                    ("q", q(1)),
                    ("u", set.clone()),
                    ("upsert", Bson::Boolean(true)),
                    ("upsert", Bson::Boolean(false)),
                ],
                vec![
                    ("q", q(1)),
                    ("u", set.clone()),
                    ("multi", Bson::Boolean(false)),
                    ("multi", Bson::Boolean(true)),
                ],
                vec![
                    ("q", q(1)),
                    ("u", Bson::Document(doc! {"sk": 3})),
                    ("u", set.clone()),
                    ("upsert", Bson::Boolean(true)),
                ],
            ] {
                let stmt = raw_fields(&fields);
                assert!(!agree(&s, WriteKind::Update, &stmt), "{fields:?}");
            }
            let fields = [
                ("q", q(1)),
                ("limit", Bson::Int32(0)),
                ("limit", Bson::Int32(1)),
            ];
            assert!(
                !agree(&s, WriteKind::Delete, &raw_fields(&fields)),
                "{fields:?}"
            );
            // The same key named twice in the filter, or the `_id` twice in a replacement.
            let filter = raw_fields(&[
                ("_id", Bson::Int32(1)),
                ("sk", Bson::Int32(1)),
                ("_id", Bson::Int32(2)),
                ("sk", Bson::Int32(2)),
            ]);
            let replacement = raw_fields(&[("_id", Bson::Int32(1)), ("_id", Bson::Int32(3))]);
            let mut stmt = bson::RawDocumentBuf::new();
            stmt.append(bson::raw::cstr!("q"), filter.clone());
            stmt.append(bson::raw::cstr!("u"), upd(doc! {"$set": {"v": 1}}));
            stmt.append(bson::raw::cstr!("upsert"), true);
            assert!(!agree(&s, WriteKind::Update, &stmt));
            let mut stmt = bson::RawDocumentBuf::new();
            stmt.append(bson::raw::cstr!("q"), upd(doc! {"_id": 1, "sk": 1}));
            stmt.append(bson::raw::cstr!("u"), replacement);
            stmt.append(bson::raw::cstr!("upsert"), true);
            agree(&s, WriteKind::Update, &stmt);
        }
    }
}
