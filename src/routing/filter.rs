//! A filter read in place for targeting: the scalar each shard key field equals, and the
//! `_id`'s, from the filter's bytes, without an owned copy. The write path targets update and
//! delete statements by it and the read path a `find`; any filter it does not read is left to
//! [`crate::routing::ShardKeyPattern::extract_from_filter`] on an owned copy, which decides.

use bson::{Bson, RawBsonRef, RawDocument};

use super::{RoutingSnapshot, ShardKeyPattern};

/// Whether two dotted paths name the same field or one a parent of the other.
pub fn paths_overlap(a: &str, b: &str) -> bool {
    a == b || is_path_prefix(a, b) || is_path_prefix(b, a)
}

/// Whether `prefix` names a parent of `path` (`a` of `a.b`, not of `ab`).
fn is_path_prefix(prefix: &str, path: &str) -> bool {
    path.len() > prefix.len() && path.starts_with(prefix) && path.as_bytes()[prefix.len()] == b'.'
}

/// A value that hashes and compares alike read in place or owned: not a document, array,
/// regular expression, code with scope or old-style binary.
pub fn raw_scalar(v: RawBsonRef<'_>) -> Option<RawBsonRef<'_>> {
    match v {
        RawBsonRef::Document(_)
        | RawBsonRef::Array(_)
        | RawBsonRef::RegularExpression(_)
        | RawBsonRef::JavaScriptCodeWithScope(_) => None,
        RawBsonRef::Binary(b) if b.subtype == bson::spec::BinarySubtype::BinaryOld => None,
        other => Some(other),
    }
}

/// The scalar a filter value pins by equality (`v` or `{$eq: v}`); `None` for anything else.
fn raw_equality(v: RawBsonRef<'_>) -> Option<RawBsonRef<'_>> {
    match v {
        RawBsonRef::Document(d) => {
            let mut items = d.iter();
            let (op, eq) = items.next()?.ok()?;
            if op.as_str() != "$eq" || items.next().is_some() {
                return None;
            }
            raw_scalar(eq)
        }
        other => raw_scalar(other),
    }
}

/// Key patterns of up to this many fields are targeted in place.
const MAX_RAW_KEY_FIELDS: usize = 4;

/// No chunk of the snapshot owns the key a filter pins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoOwner;

/// What a filter pins, read in place: the scalar each key field equals and the `_id`'s.
#[derive(Debug)]
pub struct RawFilter<'a> {
    /// The scalar each key field (in the pattern's order) equals, where the filter names it.
    pub key: [Option<RawBsonRef<'a>>; MAX_RAW_KEY_FIELDS],
    /// The scalar `_id` equals, where the filter names it.
    pub id: Option<RawBsonRef<'a>>,
}

impl<'a> RawFilter<'a> {
    /// Reads a filter whose top level holds no operator (`$and`, `$expr`, …) and whose key
    /// fields and `_id`, where present, are each named once with a scalar by plain equality,
    /// and which names no other path over or under a key field; `None` for any other filter
    /// (the owned path decides).
    pub fn read(pattern: &ShardKeyPattern, q: &'a RawDocument) -> Option<Self> {
        let fields = pattern.fields();
        if fields.len() > MAX_RAW_KEY_FIELDS {
            return None;
        }
        let mut out = RawFilter {
            key: [None; MAX_RAW_KEY_FIELDS],
            id: None,
        };
        for item in q {
            let (k, v) = item.ok()?;
            let k = k.as_str();
            if k.starts_with('$') {
                return None;
            }
            if k == "_id" && out.id.replace(raw_equality(v)?).is_some() {
                return None;
            }
            for (slot, f) in out.key.iter_mut().zip(fields) {
                if k == f.path {
                    if slot.replace(raw_equality(v)?).is_some() {
                        return None;
                    }
                } else if paths_overlap(k, &f.path) {
                    return None;
                }
            }
        }
        Some(out)
    }

    /// The shard owning the key the filter pins (`None`: it pins no full key). `Err` when no
    /// chunk owns it (the owned path decides).
    pub fn shard<'s>(&self, snap: &'s RoutingSnapshot) -> Result<Option<&'s str>, NoOwner> {
        let n = snap.pattern.fields().len();
        if self.key[..n].iter().any(Option::is_none) {
            return Ok(None);
        }
        let key = snap
            .pattern
            .key_of_raw_scalars(self.key[..n].iter().flatten().copied());
        snap.shard_for(&key).map(Some).ok_or(NoOwner)
    }

    /// The `_id` the filter pins (`None` for a null or undefined one, which pins no single
    /// document).
    pub fn identity(&self) -> Option<Bson> {
        match self.id? {
            RawBsonRef::Null | RawBsonRef::Undefined => None,
            v => Some(super::shard_key::raw_to_bson(v)),
        }
    }
}
